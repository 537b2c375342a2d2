//! The service's side of reclaim (docs/reclaim.md): the decisions are the ledger's
//! (`gpuledger_ledger::reclaim`); here they reach the world. The delivery loop ([`delivery`])
//! sends the outbox, signed, at least once; Alertmanager can be kept informed ([`alertmanager`])
//! and can gate reclaims; [`run_pass`] runs the ledger's pass and counts its decisions.

pub mod alertmanager;
pub mod delivery;

use gpuledger_ledger::analytics;
use gpuledger_ledger::reclaim::{Settings, pass::ReclaimReport};
use gpuledger_ledger::store::query::Readers;
use gpuledger_ledger::store::{StoreError, Writer};

use crate::telemetry::{AggregatorMetrics, DecisionLabels};

/// Runs one reclaim pass as of `now` ([`gpuledger_ledger::reclaim::run_pass`]) and counts what
/// it decided on `/metrics`.
pub async fn run_pass(
    readers: &Readers,
    writer: &Writer,
    analytics: &analytics::Settings,
    settings: &Settings,
    metrics: &AggregatorMetrics,
    now: i64,
) -> Result<ReclaimReport, StoreError> {
    let report =
        gpuledger_ledger::reclaim::run_pass(readers, writer, analytics, settings, now).await?;
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
