//! `GET /api/v1/fragmentation?at=` (or `?from=&to=`): per GPU free slots, the largest placeable
//! profile and stranded capacity, per-node, per-model and fleet totals, and re-geometry advice.
//! Filtered by `node`, `model` and (at an instant) `tenant`; the GPUs come a page at a time
//! (`limit`, `after` = the previous answer's `next`). Fleet data: not for `tenant:` tokens.
//! Definitions: `schema/ANALYTICS.md`.

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
    /// Only this node's GPUs.
    pub node: Option<String>,
    /// Only this model's GPUs (its key, `H100-80GB`, or the name NVML reports).
    pub model: Option<String>,
    /// Only GPUs with an instance this tenant holds (an instant only).
    pub tenant: Option<String>,
    /// GPUs on the page (default 100, at most 250).
    pub limit: Option<usize>,
    /// The page after this cursor: the previous answer's `next`.
    pub after: Option<String>,
}

impl FragmentationQuery {
    /// The filter and the page asked for; a 400 naming the parameter otherwise.
    fn selection(&mut self) -> Result<(fleet::GpuFilter, fleet::GpuPage), ApiError> {
        let limit = match self.limit {
            None => fleet::DEFAULT_PAGE_GPUS,
            Some(n) if (1..=fleet::MAX_PAGE_GPUS).contains(&n) => n,
            Some(n) => {
                return Err(ApiError::bad_request(
                    "limit",
                    format!("{n} is not 1 to {}", fleet::MAX_PAGE_GPUS),
                ));
            }
        };
        let after = match self.after.take() {
            None => None,
            Some(c) => Some(fleet::decode_cursor(&c).ok_or_else(|| {
                ApiError::bad_request("after", "not a cursor this API gave (an answer's next)")
            })?),
        };
        Ok((
            fleet::GpuFilter {
                node: self.node.take(),
                model: self.model.take(),
                tenant: self.tenant.take(),
            },
            fleet::GpuPage { after, limit },
        ))
    }
}

/// `GET /api/v1/fragmentation`.
pub async fn fragmentation(
    State(app): State<AppState>,
    reader: Reader,
    Query(mut q): Query<FragmentationQuery>,
) -> Result<Response, ApiError> {
    if reader.scope.is_some() {
        return Err(ApiError::forbidden(
            "authorization",
            "fragmentation is fleet data; a tenant: token cannot read it",
        ));
    }
    let (filter, page) = q.selection()?;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    if q.from.is_some() || q.to.is_some() || q.month.is_some() {
        if q.at.is_some() {
            return Err(ApiError::bad_request(
                "at",
                "give either at, or from and to",
            ));
        }
        if filter.tenant.is_some() {
            return Err(ApiError::bad_request(
                "tenant",
                "a tenant filters GPUs at an instant (at), not over a range",
            ));
        }
        let (from, to) = range(q.month, q.from, q.to, app.config.retention.rollup_secs)?;
        let v = tokio::task::spawn_blocking(move || {
            fleet::over_range(&conn, from, to, &settings, &filter, &page)
        })
        .await
        .map_err(|e| ApiError::internal(&e))?
        .map_err(|e| ApiError::internal(&e))?;
        return Ok(Json(v).into_response());
    }
    let at = q.at.map_or_else(|| chrono::Utc::now().timestamp(), |t| t.0);
    let v = tokio::task::spawn_blocking(move || {
        fleet::at_instant(&conn, at, fleet::MAX_AGE_SECS, &settings, &filter, &page)
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(v).into_response())
}
