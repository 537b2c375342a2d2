//! `GET /api/v1/energy?from=&to=` (or `month=`) `&group_by=&tenant=`, and `/api/v1/energy.csv`
//! from the same value: measured GPU energy (kWh, idle and active) and CO₂e per tenant, workload,
//! node or GPU model, with the fleet's totals. A `tenant:` token sees its own rows and no fleet
//! totals. Definitions: `schema/ANALYTICS.md`, "Energy and carbon".

use axum::Json;
use axum::extract::State;
use gpuledger_ledger::analytics::energy::{self, Energy, GroupBy};

use super::AppState;
use super::extract::{Month, Query, Reader, Time};
use super::rightsizing::minutes_range;
use crate::error::ApiError;

/// The query of `GET /api/v1/energy` and its CSV.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnergyQuery {
    /// Start of the range, a whole minute (default: the start of `to`'s UTC month).
    pub from: Option<Time>,
    /// End of the range, a whole minute (default: now, down to the minute).
    pub to: Option<Time>,
    /// A calendar month instead of `from`/`to`.
    pub month: Option<Month>,
    /// `tenant` (the default), `workload`, `node` or `gpu_model`.
    pub group_by: Option<GroupBy>,
    /// Only this tenant's rows, and no fleet totals (a `tenant:` token gets its own whatever
    /// this says).
    pub tenant: Option<String>,
    /// Rows to skip (the previous answer's `next_offset`).
    pub offset: Option<usize>,
    /// Rows to list (default 1,000, at most 10,000; the CSV has every row).
    pub limit: Option<usize>,
}

/// Rows an answer lists by default.
pub const DEFAULT_LIMIT: usize = 1_000;
/// Rows an answer lists at most.
pub const MAX_LIMIT: usize = 10_000;

/// `GET /api/v1/energy`.
pub async fn energy(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<EnergyQuery>,
) -> Result<Json<Energy>, ApiError> {
    let limit = super::extract::page_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let offset = q.offset.unwrap_or(0);
    Ok(Json(
        compute(&app, reader.scope, q).await?.page(offset, limit),
    ))
}

/// `GET /api/v1/energy.csv`: every row as RFC 4180 CSV.
pub async fn energy_csv(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<EnergyQuery>,
) -> Result<axum::response::Response, ApiError> {
    let v = compute(&app, reader.scope, q).await?;
    let name = format!("gpuledger-energy-{}-{}", v.from, v.to);
    Ok(crate::render::csv_response(
        &crate::render::views::energy(&v, ""),
        &name,
    ))
}

/// Computes the answer for `scope` (a `tenant:` reader's tenant).
pub async fn compute(
    app: &AppState,
    scope: Option<String>,
    q: EnergyQuery,
) -> Result<Energy, ApiError> {
    let (from, to) = minutes_range(q.month, q.from, q.to, app.config.retention.rollup_secs)?;
    let tenant = match (scope, q.tenant) {
        (Some(own), Some(asked)) if own != asked => {
            return Err(ApiError::forbidden(
                "tenant",
                "a tenant token reads its own tenant's rows only",
            ));
        }
        (Some(own), _) => Some(own),
        (None, asked) => asked.filter(|t| !t.is_empty()),
    };
    let by = q.group_by.unwrap_or_default();
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.energy.clone();
    tokio::task::spawn_blocking(move || {
        energy::energy(&conn, (from, to), by, tenant.as_deref(), &settings)
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| ApiError::internal(&e))
}
