//! `GET /api/v1/hoarding?state=open|closed|all&from=&to=`: idle hoarding episodes overlapping
//! `[from, to)` (default: all of them). Definitions: `schema/ANALYTICS.md`.

use axum::Json;
use axum::extract::State;
use gpuledger_ledger::analytics::{self, EpisodeState};

use super::AppState;
use super::extract::{Query, Reader, Time, open_range};
use crate::error::ApiError;

/// The query of `GET /api/v1/hoarding`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoardingQuery {
    /// open (default), closed or all.
    #[serde(default)]
    pub state: EpisodeState,
    /// Start of the range the episodes overlap (default: unbounded).
    pub from: Option<Time>,
    /// End of the range the episodes overlap (default: unbounded).
    pub to: Option<Time>,
}

/// `GET /api/v1/hoarding`.
pub async fn hoarding(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<HoardingQuery>,
) -> Result<Json<analytics::HoardingView>, ApiError> {
    let tenant = reader.scope;
    let state = q.state;
    let (from, to) = open_range(q.from, q.to)?;
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
