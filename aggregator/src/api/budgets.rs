//! `GET /api/v1/budgets?month=YYYY-MM&at=&mode=&idle=`: each tenant with a monthly budget, what
//! it has spent of the month up to `at` (default now, clamped into the month), its run rate and
//! the month-end forecast. A `tenant:` token sees its own line. Definitions:
//! `schema/ANALYTICS.md`, "Budgets".

use axum::Json;
use axum::extract::State;
use gpuledger_ledger::analytics::budgets::{self, Budgets};
use gpuledger_ledger::analytics::prices::{CostMode, IdleSharing};

use super::AppState;
use super::extract::{Month, Query, Reader, Time};
use super::showback::showback_error;
use crate::error::ApiError;

/// The query of `GET /api/v1/budgets`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsQuery {
    /// The month (default: the current UTC month).
    pub month: Option<Month>,
    /// Spend is counted up to this instant (default: now; clamped into the month).
    pub at: Option<Time>,
    /// allocation or usage (default: the configured one), as on the bill.
    pub mode: Option<CostMode>,
    /// overhead or share (default: the configured one), as on the bill.
    pub idle: Option<IdleSharing>,
}

/// The current UTC month's `[start, next start)` at `now`.
pub fn month_of(now: i64) -> (i64, i64) {
    let day = chrono::DateTime::from_timestamp(now, 0).unwrap_or_default();
    super::params::month(&day.format("%Y-%m").to_string()).unwrap_or((now, now + 1))
}

/// `GET /api/v1/budgets`.
pub async fn budgets(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<BudgetsQuery>,
) -> Result<Json<Budgets>, ApiError> {
    let now = chrono::Utc::now().timestamp();
    let (from, to) = q.month.map_or_else(|| month_of(now), |Month(a, b)| (a, b));
    let at = q.at.map_or(now, |t| t.0);
    let billing = &app.config.analytics.billing;
    let (mode, idle) = (
        q.mode.unwrap_or(billing.cost_mode),
        q.idle.unwrap_or(billing.idle),
    );
    let tenant = reader.scope;
    let settings = app.config.analytics.clone();
    let raw_from = now - app.config.retention.raw_secs;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let v = tokio::task::spawn_blocking(move || {
        budgets::forecast(
            &conn,
            (from, to),
            at,
            &settings,
            raw_from,
            mode,
            idle,
            tenant.as_deref(),
        )
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(showback_error)?;
    Ok(Json(v))
}
