//! `GET /api/v1/hoarding?state=open|closed|all&from=&to=`: idle hoarding episodes overlapping
//! `[from, to)` (default: all of them). Definitions: `schema/ANALYTICS.md`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;

use super::AppState;
use crate::error::ApiError;
use super::params::Params;
use gpuledger_ledger::analytics::{self, EpisodeState};

/// The handler.
pub async fn hoarding(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<analytics::HoardingView>, ApiError> {
    let role = app.tokens.authenticate(&headers)?;
    let tenant = role.read_scope()?.map(str::to_owned);
    let q = Params::checked(q, &["state", "from", "to"])?;
    let state = q.choice(
        "state",
        EpisodeState::Open,
        |s| match s {
            "open" => Some(EpisodeState::Open),
            "closed" => Some(EpisodeState::Closed),
            "all" => Some(EpisodeState::All),
            _ => None,
        },
        "open, closed, all",
    )?;
    let (from, to) = q.open_range()?;
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
