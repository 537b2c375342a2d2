//! Retention: what is deleted when, as a table of (table, statement, window), then the dimension
//! rows no fact refers to any more. A rollup bucket goes only once all of it is older than the
//! cutoff, and the minute rollup (whose masks make re-sent samples no-ops) is kept as long as the
//! other rollups.

use super::{Retention, RetentionReport, WriterThread};
use crate::store::StoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Window {
    Raw,
    Rollup,
}

/// What retention deletes: (table, statement, which window's cutoff binds `?`). A rollup bucket
/// goes once all of it is older than the cutoff.
pub(super) const RETENTION: &[(&str, &str, Window)] = &[
    (
        "samples_raw",
        "DELETE FROM samples_raw WHERE ts < ?",
        Window::Raw,
    ),
    (
        "ingested_batches",
        "DELETE FROM ingested_batches WHERE received_at < ?",
        Window::Raw,
    ),
    (
        "rollup_1m",
        "DELETE FROM rollup_1m WHERE bucket + 60 <= ?",
        Window::Rollup,
    ),
    (
        "rollup_1h",
        "DELETE FROM rollup_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "rollup_tenant_1h",
        "DELETE FROM rollup_tenant_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "rollup_gpu_1h",
        "DELETE FROM rollup_gpu_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "gpu_hours_changed",
        "DELETE FROM gpu_hours_changed WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "rollup_alloc_1d",
        "DELETE FROM rollup_alloc_1d WHERE bucket + 86400 <= ?",
        Window::Rollup,
    ),
    (
        "fragmentation_1h",
        "DELETE FROM fragmentation_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "hoarding_episodes",
        "DELETE FROM hoarding_episodes WHERE ended_at <= ?",
        Window::Rollup,
    ),
    (
        "shares_raw",
        "DELETE FROM shares_raw WHERE ts < ?",
        Window::Raw,
    ),
    (
        "rollup_share_1h",
        "DELETE FROM rollup_share_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    // Energy (migration 0012): the minute masks are kept as long as the other rollups, as the
    // samples' are.
    (
        "energy_gpu_1m",
        "DELETE FROM energy_gpu_1m WHERE bucket + 60 <= ?",
        Window::Rollup,
    ),
    (
        "energy_gpu_1h",
        "DELETE FROM energy_gpu_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "energy_gpu_1d",
        "DELETE FROM energy_gpu_1d WHERE bucket + 86400 <= ?",
        Window::Rollup,
    ),
    (
        "energy_1m",
        "DELETE FROM energy_1m WHERE bucket + 60 <= ?",
        Window::Rollup,
    ),
    (
        "energy_1h",
        "DELETE FROM energy_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "energy_1d",
        "DELETE FROM energy_1d WHERE bucket + 86400 <= ?",
        Window::Rollup,
    ),
    // Reclaim (migration 0005): the record of decisions and deliveries is kept as long as the
    // rollups; a finished episode's state as long as its hoarding episode (so it is never
    // noticed twice); the outbox keeps undelivered rows whatever their age.
    (
        "reclaim_decisions",
        "DELETE FROM reclaim_decisions WHERE decided_at <= ?",
        Window::Rollup,
    ),
    (
        "reclaim_episodes",
        "DELETE FROM reclaim_episodes WHERE state = 'resolved' AND closed_at <= ?",
        Window::Rollup,
    ),
    (
        "webhook_outbox",
        "DELETE FROM webhook_outbox WHERE state IN ('delivered', 'cancelled') AND created_at <= ?",
        Window::Rollup,
    ),
    (
        "reclaim_exemptions",
        "DELETE FROM reclaim_exemptions WHERE until <= ?",
        Window::Raw,
    ),
    (
        "reclaim_keeps",
        "DELETE FROM reclaim_keeps WHERE created_at <= ?",
        Window::Rollup,
    ),
    (
        "alertmanager_confirmations",
        "DELETE FROM alertmanager_confirmations WHERE confirmed_at <= ?",
        Window::Raw,
    ),
];

/// Dimension rows no fact refers to any more, deleted after the facts' retention: (table,
/// statement). Every fact's instance and holder also has an hour row (`rollup_1h`, written in the
/// same transaction as the minute and raw rows, and deleted only after them) or is in one of the
/// longer-kept tables named here, so those are the ones consulted.
pub(super) const DIMENSION_RETENTION: &[(&str, &str)] = &[
    (
        "instances",
        "DELETE FROM instances WHERE instance_id NOT IN (
            SELECT instance_id FROM rollup_1h UNION SELECT instance_id FROM rollup_alloc_1d
            UNION SELECT instance_id FROM rollup_share_1h UNION SELECT instance_id FROM hoarding_episodes
            UNION SELECT instance_id FROM energy_1d)",
    ),
    (
        "holders",
        "DELETE FROM holders WHERE holder_id <> 0 AND holder_id NOT IN (
            SELECT holder_id FROM rollup_1h UNION SELECT holder_id FROM rollup_alloc_1d
            UNION SELECT holder_id FROM rollup_share_1h UNION SELECT holder_id FROM hoarding_episodes
            UNION SELECT holder_id FROM energy_1d)",
    ),
    // After `holders`: an owner outlives no holder.
    (
        "holder_owners",
        "DELETE FROM holder_owners WHERE holder_id NOT IN (SELECT holder_id FROM holders)",
    ),
];

impl WriterThread {
    pub(super) fn retention(
        &mut self,
        now: i64,
        r: Retention,
    ) -> Result<RetentionReport, StoreError> {
        let raw = now - r.raw_secs;
        let rollup = now - r.rollup_secs;
        let mut report = RetentionReport::default();
        let tx = self.conn.transaction().map_err(StoreError::from_db)?;
        for (table, sql, cutoff) in RETENTION {
            let cutoff = if *cutoff == Window::Raw { raw } else { rollup };
            let n = tx.execute(sql, [cutoff]).map_err(StoreError::from_db)?;
            report.deleted.push((*table, n as u64));
        }
        let mut dimensions_deleted = 0;
        for (table, sql) in DIMENSION_RETENTION {
            let n = tx.execute(sql, []).map_err(StoreError::from_db)?;
            dimensions_deleted += n;
            report.deleted.push((*table, n as u64));
        }
        tx.commit().map_err(StoreError::from_db)?;
        if dimensions_deleted > 0 {
            // The mirror must forget the ids too (and their per-node counts).
            self.reload_dims();
        }
        // Lets DuckDB reuse the freed blocks, and merges the row groups the deletes thinned.
        super::checkpoints::checkpoint_after_commit(&self.conn, "retention");
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new table that holds facts over time must get a retention rule (or be named here as one
    /// that needs none): otherwise it grows forever.
    #[test]
    fn every_table_of_the_schema_has_a_retention_rule() {
        let conn = crate::store::open(std::path::Path::new(":memory:"))
            .unwrap()
            .0;
        let mut stmt = conn
            .prepare("SELECT table_name FROM duckdb_tables() WHERE NOT temporary ORDER BY 1")
            .unwrap();
        let tables: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        // Kept as they are: the schema's version, the writer's scratch tables (empty once
        // committed), its probe row, its one-row record of held folds, the compactor's one-row
        // record of where it stopped, the configured idle floors of the energy split, the keep
        // links' signing keys (retired by rotation), and the webhook endpoints a 410 switched off (one row per
        // configured endpoint, until an admin enables it again: expiring it would re-enable it).
        const NONE_NEEDED: &[&str] = &[
            "schema_version",
            "ingest_delta_1m",
            "ingest_delta_gpu_1h",
            "ingest_shares",
            "ingest_energy",
            "ingest_energy_gpu",
            "energy_idle_watts",
            "keep_link_keys",
            "writer_probe",
            "fold_pending",
            "raw_compacted",
            "webhook_endpoints",
        ];
        let unruled: Vec<&String> = tables
            .iter()
            .filter(|t| {
                !RETENTION.iter().any(|(table, _, _)| table == t)
                    && !DIMENSION_RETENTION.iter().any(|(table, _)| table == t)
                    && !NONE_NEEDED.contains(&t.as_str())
            })
            .collect();
        assert!(
            unruled.is_empty(),
            "tables without a retention rule: {unruled:?}"
        );
        assert!(tables.len() > 10, "{tables:?}");
    }
}
