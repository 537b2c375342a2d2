//! `GET /api/v1/hoarding?state=open|closed|all&from=&to=&limit=&after=`: idle hoarding episodes
//! overlapping `[from, to)` (default: all of them), in the order they started, a page at a time
//! (`after` = the previous answer's `next`). Definitions: `schema/ANALYTICS.md`.

use axum::Json;
use axum::extract::State;
use gpuledger_ledger::analytics::{self, EpisodeCursor, EpisodeState};

use super::AppState;
use super::extract::{Query, Reader, Time, open_range};
use crate::error::ApiError;

/// Episodes on a page when the caller does not say.
pub const DEFAULT_PAGE_EPISODES: usize = 500;
/// The most a page may have: under 1 MB of JSON.
pub const MAX_PAGE_EPISODES: usize = 2000;

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
    /// Episodes on the page (default 500, at most 2000).
    pub limit: Option<usize>,
    /// The page after this cursor: the previous answer's `next`.
    pub after: Option<String>,
}

/// A page's cursor as given; a 400 naming `after` when it is not one.
pub fn episode_cursor(after: Option<&str>) -> Result<Option<EpisodeCursor>, ApiError> {
    after
        .map(|c| {
            EpisodeCursor::decode(c).ok_or_else(|| {
                ApiError::bad_request("after", "not a cursor this API gave (an answer's next)")
            })
        })
        .transpose()
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
    let limit = match q.limit {
        None => DEFAULT_PAGE_EPISODES,
        Some(n) if (1..=MAX_PAGE_EPISODES).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::bad_request(
                "limit",
                format!("{n} is not 1 to {MAX_PAGE_EPISODES}"),
            ));
        }
    };
    let after = episode_cursor(q.after.as_deref())?;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let settings = app.config.analytics.clone();
    let (rows, next) = tokio::task::spawn_blocking(move || {
        analytics::episodes_page(
            &conn,
            state,
            from,
            to,
            tenant.as_deref(),
            &settings,
            after,
            limit,
        )
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(analytics::HoardingView {
        idle_threshold: app.config.analytics.idle_threshold,
        window_seconds: app.config.analytics.window_secs(),
        currency: app.config.analytics.prices.currency.clone(),
        episodes: rows,
        next: next.map(|c| c.encode()),
    }))
}
