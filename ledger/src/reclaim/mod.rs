//! Reclaim: turning an idle-hoarding episode into a GPU handed back, safely (docs/reclaim.md;
//! events and signatures: `schema/WEBHOOK.md`).
//!
//! After every analytics evaluation a pass ([`pass`]) runs the per-class policy ([`policy`]) over
//! the open episodes and commits each decision, the episode's new state and the event's outbox
//! rows in one writer transaction. Delivering the outbox (HTTP) is the service's part
//! (`gpuledger-aggregator`'s `reclaim::delivery`); [`records`] reads and writes its rows.
//!
//! Key decision: safety comes from the data, not from timers. Nothing is sent about a GPU that
//! has not reported within `max_staleness` of the wall clock (backfills, replays and dead nodes
//! never lead to a reclaim); a reclaim needs the notice to have been *delivered* `notice` ago;
//! event ids are derived from the episode, so a decision retaken after a crash or late data is the
//! same event to a receiver.

pub mod budget_notices;
pub mod chat;
pub mod config;
pub mod links;
pub mod pass;
pub mod policy;
pub mod records;

pub use config::Settings;

use crate::store::StoreError;
use crate::store::Writer;
use crate::store::query::Readers;

/// Runs one reclaim pass as of `now` and commits it; the report says what was decided (the
/// service counts it on `/metrics`). Call under the analytics lock, after an evaluation, so the
/// episodes it reads are current.
pub async fn run_pass(
    readers: &Readers,
    writer: &Writer,
    analytics: &crate::analytics::Settings,
    settings: &Settings,
    now: i64,
) -> Result<pass::ReclaimReport, StoreError> {
    let conn = readers.connect()?;
    let (a, s) = (analytics.clone(), settings.clone());
    let plan = tokio::task::spawn_blocking(move || {
        pass::read(&conn, &a, &s, now).map(|snap| pass::plan(snap, &a, &s, now))
    })
    .await
    .map_err(|e| StoreError::Io(format!("the reclaim task failed: {e}")))?
    .map_err(StoreError::from_db)?;
    let report = plan.report.clone();
    if !plan.is_empty() {
        writer
            .apply(Box::new(move |tx| pass::store(tx, &plan)))
            .await?;
    }
    Ok(report)
}
