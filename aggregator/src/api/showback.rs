//! `GET /api/v1/showback?from=&to=` (or `month=`) `&group_by=`: allocated, used and idle GPU-seconds and cost per
//! group over `[from, to)`, and the fleet's totals. Definitions: `schema/ANALYTICS.md`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;

use super::AppState;
use crate::error::ApiError;
use super::params::Params;
use gpuledger_ledger::analytics::showback::{self, GroupBy, ShowbackError};

/// `GET /api/v1/showback`.
pub async fn showback(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<showback::ShowbackView>, ApiError> {
    Ok(Json(view(&app, &headers, q).await?))
}

/// `GET /api/v1/showback.csv`: the same rows as RFC 4180 CSV, one per group, with stable column
/// names (the key columns, then the figures as in the JSON).
pub async fn showback_csv(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<axum::response::Response, ApiError> {
    let v = view(&app, &headers, q).await?;
    let name = format!("gpuledger-showback-{}-{}", v.from, v.to);
    Ok(crate::render::csv_response(
        &crate::render::views::showback(&v, "showback"),
        &name,
    ))
}

async fn view(
    app: &AppState,
    headers: &HeaderMap,
    q: HashMap<String, String>,
) -> Result<showback::ShowbackView, ApiError> {
    let role = app.tokens.authenticate(headers)?;
    let tenant = role.read_scope()?.map(str::to_owned);
    let q = Params::checked(q, &["from", "to", "month", "group_by"])?;
    let by = q.choice("group_by", GroupBy::Tenant, GroupBy::parse, GroupBy::NAMES)?;
    let retention = app.config.retention;
    let (from, to) = q.range(retention.rollup_secs)?;
    let raw_from = chrono::Utc::now().timestamp() - retention.raw_secs;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    let scope = tenant.clone();
    let result = tokio::task::spawn_blocking(move || {
        showback::showback(&conn, from, to, by, scope.as_deref(), raw_from, &settings)
    })
    .await
    .map_err(|e| ApiError::internal(&e))?;
    let s = match result {
        Ok(s) => s,
        Err(e @ ShowbackError::RawGone { field, .. }) => {
            return Err(ApiError::bad_request(field, e.to_string()));
        }
        Err(e) => return Err(ApiError::internal(&e)),
    };
    Ok(s.view(
        by,
        from,
        to,
        app.config.analytics.prices.currency.clone(),
        tenant.is_some(),
    ))
}
