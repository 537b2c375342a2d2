//! `GET /api/v1/fragmentation?at=` (or `?from=&to=`): per GPU free slots, the largest placeable
//! profile and stranded capacity, per-node and fleet totals, and re-geometry advice. Fleet data:
//! not for `tenant:` tokens. Definitions: `schema/ANALYTICS.md`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::ApiError;
use super::params::Params;
use gpuledger_ledger::analytics::fleet;

/// The handler.
pub async fn fragmentation(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let role = app.tokens.authenticate(&headers)?;
    if role.read_scope()?.is_some() {
        return Err(ApiError::forbidden(
            "authorization",
            "fragmentation is fleet data; a tenant: token cannot read it",
        ));
    }
    let q = Params::checked(q, &["at", "from", "to", "month"])?;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    if q.has("from") || q.has("to") || q.has("month") {
        if q.has("at") {
            return Err(ApiError::bad_request(
                "at",
                "give either at, or from and to",
            ));
        }
        let (from, to) = q.range(app.config.retention.rollup_secs)?;
        let v = tokio::task::spawn_blocking(move || fleet::over_range(&conn, from, to, &settings))
            .await
            .map_err(|e| ApiError::internal(&e))?
            .map_err(|e| ApiError::internal(&e))?;
        return Ok(Json(v).into_response());
    }
    let at = q
        .time("at")?
        .unwrap_or_else(|| chrono::Utc::now().timestamp());
    let v = tokio::task::spawn_blocking(move || {
        fleet::at_instant(&conn, at, fleet::MAX_AGE_SECS, &settings)
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(v).into_response())
}
