//! `GET /api/v1/hoarding?state=open|closed|all&from=&to=`: idle hoarding episodes overlapping
//! `[from, to)` (default: all of them). Definitions: `schema/ANALYTICS.md`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;

use super::error::ApiError;
use super::showback::only_params;
use super::{AppState, time_param};
use crate::analytics::{self, EpisodeState};

/// The handler.
pub async fn hoarding(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<analytics::HoardingView>, ApiError> {
    let role = app.tokens.authenticate(&headers)?;
    let tenant = role.read_scope()?.map(str::to_owned);
    only_params(&q, &["state", "from", "to"])?;
    let state = match q.get("state").map(String::as_str) {
        None | Some("open") => EpisodeState::Open,
        Some("closed") => EpisodeState::Closed,
        Some("all") => EpisodeState::All,
        Some(s) => {
            return Err(ApiError::bad_request(
                "state",
                format!("{s:?} is not one of open, closed, all"),
            ));
        }
    };
    let from = time_param("from", q.get("from").map(String::as_str))?.unwrap_or(i64::MIN);
    let to = time_param("to", q.get("to").map(String::as_str))?.unwrap_or(i64::MAX);
    if from >= to {
        return Err(ApiError::bad_request("from", "from must be before to"));
    }
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    let rows = tokio::task::spawn_blocking(move || {
        analytics::episodes(&conn, state, from, to, tenant.as_deref(), &settings)
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(analytics::HoardingView {
        idle_threshold: app.config.analytics.idle_threshold,
        window_seconds: app.config.analytics.window_secs(),
        currency: app.config.analytics.prices.currency.clone(),
        episodes: rows,
    }))
}
