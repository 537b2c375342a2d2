//! Reclaim: turning an idle-hoarding episode into a GPU handed back, safely (README, "Reclaim";
//! events and signatures: `schema/WEBHOOK.md`).
//!
//! After every analytics evaluation a pass ([`pass`]) runs the per-class policy ([`policy`]) over
//! the open episodes and commits each decision, the episode's new state and the event's outbox
//! rows in one writer transaction; the delivery loop ([`delivery`]) sends the outbox, signed,
//! at least once. Alertmanager can be kept informed ([`alertmanager`]) and can gate reclaims.
//!
//! Key decision: safety comes from the data, not from timers. Nothing is sent about a GPU that
//! has not reported within `max_staleness` of the wall clock (backfills, replays and dead nodes
//! never lead to a reclaim); a reclaim needs the notice to have been *delivered* `notice` ago;
//! event ids are derived from the episode, so a decision retaken after a crash or late data is the
//! same event to a receiver.

pub mod alertmanager;
pub mod config;
pub mod delivery;
pub mod pass;
pub mod policy;
pub mod records;

pub use config::Settings;

use crate::store::StoreError;
use crate::store::Writer;
use crate::store::query::Readers;
use crate::telemetry::{AggregatorMetrics, DecisionLabels};

/// Runs one reclaim pass as of `now` and commits it. Call under the analytics lock, after an
/// evaluation, so the episodes it reads are current.
pub async fn run_pass(
    readers: &Readers,
    writer: &Writer,
    analytics: &crate::analytics::Settings,
    settings: &Settings,
    metrics: &AggregatorMetrics,
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
    for (kind, n) in &report.events {
        metrics
            .reclaim_decisions
            .get_or_create(&DecisionLabels {
                decision: "event".into(),
                reason: kind.clone(),
            })
            .inc_by(*n as u64);
    }
    for (hold, n) in &report.holds {
        metrics
            .reclaim_decisions
            .get_or_create(&DecisionLabels {
                decision: "hold".into(),
                reason: hold.clone(),
            })
            .inc_by(*n as u64);
    }
    metrics.reclaim_deferred.inc_by(report.deferred as u64);
    metrics.reclaim_last_pass.set(now);
    Ok(report)
}
