//! `GET /api/v1/showback?from=&to=` (or `month=`) `&group_by=`: allocated, used and idle GPU-seconds and cost per
//! group over `[from, to)`, and the fleet's totals. Definitions: `schema/ANALYTICS.md`.

use axum::Json;
use axum::extract::State;
use gpuledger_ledger::analytics::showback::{self, GroupBy, ShowbackError};

use super::AppState;
use super::extract::{Month, Query, Reader, Time, range};
use crate::error::ApiError;

/// The query of `GET /api/v1/showback` and its CSV.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowbackQuery {
    /// Start of the range (default: the start of `to`'s UTC month).
    pub from: Option<Time>,
    /// End of the range (default: now).
    pub to: Option<Time>,
    /// A calendar month instead of `from`/`to`.
    pub month: Option<Month>,
    /// The grouping (default `tenant`).
    #[serde(default)]
    pub group_by: GroupBy,
    /// Rows to skip (the previous answer's `next_offset`; the JSON only).
    pub offset: Option<usize>,
    /// Rows to list (default 1,000, at most 10,000; the JSON only: the CSV has every row).
    pub limit: Option<usize>,
}

/// Rows an answer lists by default.
pub const DEFAULT_LIMIT: usize = 1_000;
/// Rows an answer lists at most.
pub const MAX_LIMIT: usize = 10_000;

/// `GET /api/v1/showback`.
pub async fn showback(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<ShowbackQuery>,
) -> Result<Json<showback::ShowbackView>, ApiError> {
    let limit = super::extract::page_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let offset = q.offset.unwrap_or(0);
    Ok(Json(view(&app, reader, q).await?.page(offset, limit)))
}

/// `GET /api/v1/showback.csv`: the same rows as RFC 4180 CSV, one per group, with stable column
/// names (the key columns, then the figures as in the JSON).
pub async fn showback_csv(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<ShowbackQuery>,
) -> Result<axum::response::Response, ApiError> {
    let v = view(&app, reader, q).await?;
    let name = format!("gpuledger-showback-{}-{}", v.from, v.to);
    Ok(crate::render::csv_response(
        &crate::render::views::showback(&v, "showback"),
        &name,
    ))
}

async fn view(
    app: &AppState,
    reader: Reader,
    q: ShowbackQuery,
) -> Result<showback::ShowbackView, ApiError> {
    let tenant = reader.scope;
    let by = q.group_by;
    let retention = app.config.retention;
    let (from, to) = range(q.month, q.from, q.to, retention.rollup_secs)?;
    let raw_from = chrono::Utc::now().timestamp() - retention.raw_secs;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    let scope = tenant.clone();
    let result = tokio::task::spawn_blocking(move || {
        showback::showback(&conn, from, to, by, scope.as_deref(), raw_from, &settings)
    })
    .await
    .map_err(|e| ApiError::internal(&e))?;
    let s = result.map_err(showback_error)?;
    Ok(s.view(
        by,
        from,
        to,
        app.config.analytics.prices.currency.clone(),
        tenant.is_some(),
    ))
}

/// A showback's error as an answer: a range edge whose raw seconds are gone is the caller's 400.
pub fn showback_error(e: ShowbackError) -> ApiError {
    match e {
        e @ ShowbackError::RawGone { field, .. } => ApiError::bad_request(field, e.to_string()),
        e => ApiError::internal(&e),
    }
}
