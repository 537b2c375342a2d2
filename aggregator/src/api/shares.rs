//! `GET /api/v1/shares?from=&to=&group_by=instance|workload|tenant`: what each owner used of
//! shared instances (time-sliced and MPS GPUs) over whole UTC hours, from the exporters'
//! per-process view. It sits beside the ledger: showback charges an instance to its holder; this
//! says how the holders and co-users of a shared instance actually used it, so finance can split
//! that charge by use. Definitions: `schema/ANALYTICS.md` ("Shares of shared instances").

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;

use super::AppState;
use crate::error::ApiError;
use super::params::Params;
use gpuledger_ledger::analytics::shares::{self, GroupBy, SharesView};

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
pub async fn shares(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<SharesView>, ApiError> {
    let role = app.tokens.authenticate(&headers)?;
    let tenant = role.read_scope()?.map(str::to_owned);
    let q = Params::checked(q, &["from", "to", "group_by"])?;
    let by = q.choice(
        "group_by",
        GroupBy::Instance,
        GroupBy::parse,
        GroupBy::NAMES,
    )?;
    let now = chrono::Utc::now().timestamp();
    let to = match q.time("to")? {
        Some(t) => whole_hour("to", t)?,
        None => now - now.rem_euclid(3600),
    };
    let from = match q.time("from")? {
        Some(f) => whole_hour("from", f)?,
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
