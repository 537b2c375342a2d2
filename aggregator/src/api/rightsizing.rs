//! `GET /api/v1/rightsizing?from=&to=` (or `month=`) `&tenant=&gpu_model=`, and
//! `/api/v1/rightsizing.csv` from the same value: per tenant, workload, GPU model and MIG profile,
//! the profile its measured demand needs and what moving there saves. A `tenant:` token sees its
//! own rows. Definitions: `schema/ANALYTICS.md`, "Rightsizing".

use axum::Json;
use axum::extract::State;
use gpuledger_ledger::analytics::rightsizing::{self, Filter, Reason, Rightsizing};

use super::AppState;
use super::extract::{Month, Query, Reader, Time, range};
use super::showback::showback_error;
use crate::error::ApiError;

/// The query of `GET /api/v1/rightsizing` and its CSV.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RightsizingQuery {
    /// Start of the range, a whole minute (default: the start of `to`'s UTC month).
    pub from: Option<Time>,
    /// End of the range, a whole minute (default: now, down to the minute).
    pub to: Option<Time>,
    /// A calendar month instead of `from`/`to`.
    pub month: Option<Month>,
    /// Only this tenant's rows (a `tenant:` token gets its own whatever this says).
    pub tenant: Option<String>,
    /// Only this GPU model's rows (its key such as `H100-80GB`, or the NVML name).
    pub gpu_model: Option<String>,
    /// List only the rows of this reason (`smaller_profile_fits` for the recommendations); the
    /// totals still count every row.
    pub reason: Option<Reason>,
    /// Rows to skip (the previous answer's `next_offset`).
    pub offset: Option<usize>,
    /// Rows to list (default 500, at most 5,000; the CSV has every row).
    pub limit: Option<usize>,
}

/// Rows an answer lists by default.
pub const DEFAULT_LIMIT: usize = 500;
/// Rows an answer lists at most.
pub const MAX_LIMIT: usize = 5_000;

/// `GET /api/v1/rightsizing`.
pub async fn rightsizing(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<RightsizingQuery>,
) -> Result<Json<Rightsizing>, ApiError> {
    let limit = super::extract::page_limit(q.limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let (reason, offset) = (q.reason, q.offset.unwrap_or(0));
    let v = compute(&app, reader.scope, q).await?;
    Ok(Json(v.page(reason, offset, limit)))
}

/// `GET /api/v1/rightsizing.csv`: the same rows as RFC 4180 CSV.
pub async fn rightsizing_csv(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<RightsizingQuery>,
) -> Result<axum::response::Response, ApiError> {
    let reason = q.reason;
    let v = compute(&app, reader.scope, q)
        .await?
        .page(reason, 0, usize::MAX);
    let name = format!("gpuledger-rightsizing-{}-{}", v.from, v.to);
    Ok(crate::render::csv_response(
        &crate::render::views::rightsizing(&v, ""),
        &name,
    ))
}

/// The range of a rightsizing question: whole minutes, `to` defaulting to now's minute.
pub fn minutes_range(
    month: Option<Month>,
    from: Option<Time>,
    to: Option<Time>,
    max_secs: i64,
) -> Result<(i64, i64), ApiError> {
    let given_to = to.is_some();
    let (from, mut to) = range(month, from, to, max_secs)?;
    if from.rem_euclid(60) != 0 {
        return Err(ApiError::bad_request("from", "must be a whole minute"));
    }
    if to.rem_euclid(60) != 0 {
        if given_to {
            return Err(ApiError::bad_request("to", "must be a whole minute"));
        }
        // Now's minute; in a month's first minute, that minute (nothing is in it yet).
        to = (to.div_euclid(60) * 60).max(from + 60);
    }
    if from >= to {
        return Err(ApiError::bad_request(
            "from",
            "the range holds no whole minute",
        ));
    }
    Ok((from, to))
}

/// Computes the answer for `scope` (a `tenant:` reader's tenant).
pub async fn compute(
    app: &AppState,
    scope: Option<String>,
    q: RightsizingQuery,
) -> Result<Rightsizing, ApiError> {
    let retention = app.config.retention;
    let (from, to) = minutes_range(q.month, q.from, q.to, retention.rollup_secs)?;
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
    let gpu_model = q.gpu_model.filter(|m| !m.is_empty());
    let raw_from = chrono::Utc::now().timestamp() - retention.raw_secs;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    let state = app.clone();
    tokio::task::spawn_blocking(move || {
        rightsizing::rightsizing(
            &conn,
            &state.demand,
            (from, to),
            &settings,
            raw_from,
            Filter {
                tenant: tenant.as_deref(),
                gpu_model: gpu_model.as_deref(),
            },
        )
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(showback_error)
}
