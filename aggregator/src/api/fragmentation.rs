//! `GET /api/v1/fragmentation?at=` (or `?from=&to=`): per GPU free slots, the largest placeable
//! profile and stranded capacity, per-node and fleet totals, and re-geometry advice. Fleet data:
//! not for `tenant:` tokens. Definitions: `schema/ANALYTICS.md`.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use gpuledger_ledger::analytics::fleet;

use super::AppState;
use super::extract::{Month, Query, Reader, Time, range};
use crate::error::ApiError;

/// The query of `GET /api/v1/fragmentation`: an instant (`at`, default now), or a range.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FragmentationQuery {
    /// The instant.
    pub at: Option<Time>,
    /// Start of a range.
    pub from: Option<Time>,
    /// End of a range.
    pub to: Option<Time>,
    /// A calendar month as the range.
    pub month: Option<Month>,
}

/// `GET /api/v1/fragmentation`.
pub async fn fragmentation(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<FragmentationQuery>,
) -> Result<Response, ApiError> {
    if reader.scope.is_some() {
        return Err(ApiError::forbidden(
            "authorization",
            "fragmentation is fleet data; a tenant: token cannot read it",
        ));
    }
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    if q.from.is_some() || q.to.is_some() || q.month.is_some() {
        if q.at.is_some() {
            return Err(ApiError::bad_request(
                "at",
                "give either at, or from and to",
            ));
        }
        let (from, to) = range(q.month, q.from, q.to, app.config.retention.rollup_secs)?;
        let v = tokio::task::spawn_blocking(move || fleet::over_range(&conn, from, to, &settings))
            .await
            .map_err(|e| ApiError::internal(&e))?
            .map_err(|e| ApiError::internal(&e))?;
        return Ok(Json(v).into_response());
    }
    let at = q.at.map_or_else(|| chrono::Utc::now().timestamp(), |t| t.0);
    let v = tokio::task::spawn_blocking(move || {
        fleet::at_instant(&conn, at, fleet::MAX_AGE_SECS, &settings)
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(v).into_response())
}
