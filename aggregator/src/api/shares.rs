//! `GET /api/v1/shares?from=&to=&group_by=instance|workload|tenant`: what each owner used of
//! shared instances (time-sliced and MPS GPUs) over whole UTC hours, from the exporters'
//! per-process view. It sits beside the ledger: showback charges an instance to its holder; this
//! says how the holders and co-users of a shared instance actually used it, so finance can split
//! that charge by use. Definitions: `schema/ANALYTICS.md` ("Shares of shared instances (`GET
//! /api/v1/shares`)").

use axum::Json;
use axum::extract::State;
use gpuledger_ledger::analytics::shares::{self, GroupBy, SharesView};

use super::AppState;
use super::extract::{Query, Reader, Time};
use crate::error::ApiError;

/// The query of `GET /api/v1/shares`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharesQuery {
    /// Start, on a whole UTC hour (default: 24 h before `to`).
    pub from: Option<Time>,
    /// End, on a whole UTC hour (default: the current hour's start).
    pub to: Option<Time>,
    /// The grouping (default `instance`).
    #[serde(default)]
    pub group_by: GroupBy,
}

fn whole_hour(name: &'static str, t: i64) -> Result<i64, ApiError> {
    if t.rem_euclid(3600) != 0 {
        return Err(ApiError::bad_request(
            name,
            format!("{t} is not on a whole UTC hour: shares are kept per hour"),
        ));
    }
    Ok(t)
}

/// The handler.
/// `GET /api/v1/shares`.
pub async fn shares(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<SharesQuery>,
) -> Result<Json<SharesView>, ApiError> {
    let tenant = reader.scope;
    let by = q.group_by;
    let now = chrono::Utc::now().timestamp();
    let to = match q.to {
        Some(t) => whole_hour("to", t.0)?,
        None => now - now.rem_euclid(3600),
    };
    let from = match q.from {
        Some(f) => whole_hour("from", f.0)?,
        None => to - 24 * 3600,
    };
    if from >= to {
        return Err(ApiError::bad_request(
            "from",
            format!("from ({from}) must be before to ({to})"),
        ));
    }
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let view =
        tokio::task::spawn_blocking(move || shares::shares(&conn, from, to, by, tenant.as_deref()))
            .await
            .map_err(|e| ApiError::internal(&e))?
            .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(view))
}
