//! When the minute deltas a group staged are folded into the rollups.
//!
//! Every ingest group appends its minute and GPU deltas to the staging tables (`ingest_delta_1m`,
//! `ingest_delta_gpu_1h`) in the transaction that writes its raw rows and batch ids, so a staged
//! delta is as durable as the samples it sums. Folding them (one `MERGE` per rollup) cost more
//! than the rest of a live group (issue 15's profile: 120–190 ms of a 320–440 ms group of 140k
//! samples), and a live exporter's 5 s batch brings one delta row per instance: folding every
//! group merges each (instance, minute) twelve times.
//!
//! So a group folds what is staged only when the writer would otherwise wait: when no batch is
//! queued behind it, which is always the case below saturation and in every sequential client
//! (an acknowledged batch is then in the rollups). While batches keep arriving, the staging grows
//! until it is [`FoldPolicy::max_lag`] old or holds [`FoldPolicy::max_rows`] rows, and one fold
//! then sums every staged row per rollup row first. Exactly-once does not depend on it: the
//! minute masks a group checks are those folded into `rollup_1m` and those staged
//! (`COVERED_MASKS`), and a fold moves rows from the staging to the rollups in one transaction.
//! Before any other job (retention, compaction, analytics writes), at a clean stop and at start
//! (rows a crash left staged) the writer folds too.

use std::time::{Duration, Instant};

/// When staged deltas are folded while batches keep arriving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoldPolicy {
    /// The longest the rollups trail an acknowledged batch while the writer is saturated.
    pub max_lag: Duration,
    /// The most staged rows (minute and GPU deltas) before a fold.
    pub max_rows: usize,
    /// Fold when no batch waits behind the group (off only in tests, to hold rows staged).
    pub(super) when_idle: bool,
}

impl Default for FoldPolicy {
    fn default() -> Self {
        FoldPolicy {
            max_lag: Duration::from_secs(5),
            max_rows: 500_000,
            when_idle: true,
        }
    }
}

/// What is staged and not folded yet.
#[derive(Debug, Default)]
pub(super) struct Staged {
    rows: usize,
    since: Option<Instant>,
}

impl Staged {
    /// `rows` found staged at start.
    pub(super) fn found(rows: usize) -> Staged {
        Staged {
            rows,
            since: (rows > 0).then(Instant::now),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Whether a group that stages `more` rows should fold, `busy` saying whether batches wait
    /// behind it.
    pub(super) fn fold_due(&self, policy: &FoldPolicy, more: usize, busy: bool) -> bool {
        (policy.when_idle && !busy)
            || self.rows + more >= policy.max_rows
            || self.since.is_some_and(|t| t.elapsed() >= policy.max_lag)
    }

    /// A committed group staged `rows` more and did not fold.
    pub(super) fn added(&mut self, rows: usize) {
        if rows > 0 {
            self.rows += rows;
            self.since.get_or_insert_with(Instant::now);
        }
    }

    /// A fold was committed.
    pub(super) fn folded(&mut self) {
        *self = Staged::default();
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::store::writer::compact::tests::live_batches;
    use crate::store::{self, Writer};

    /// The rollups as rows of text (every column), for comparing two ledgers.
    fn rollups(conn: &duckdb::Connection) -> Vec<String> {
        let mut out = Vec::new();
        for table in [
            "rollup_1m",
            "rollup_1h",
            "rollup_alloc_1d",
            "rollup_tenant_1h",
            "rollup_gpu_1h",
            "ingest_delta_1m",
            "ingest_delta_gpu_1h",
        ] {
            // Each row as one text: the table's alias is a struct of its columns.
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT '{table}: ' || t::VARCHAR FROM {table} t ORDER BY 1"
                ))
                .unwrap();
            let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
            out.extend(rows.map(Result::unwrap));
        }
        out
    }

    fn count(conn: &duckdb::Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    async fn ingest(writer: &Writer, batches: Vec<gpuledger_schema::wire::Batch>) -> u64 {
        let mut stored = 0;
        for b in batches {
            let r = writer.try_reserve(b.sample_count()).unwrap();
            stored += writer.ingest(b, 0, r).await.unwrap().stored;
        }
        stored
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn staged_deltas_count_as_held_and_a_crash_leaves_them_for_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.duckdb");
        let minute = (chrono::Utc::now().timestamp() / 60 - 30) * 60;
        let (conn, _) = store::open(&path).unwrap();
        let reader = conn.try_clone().unwrap();
        let held = FoldPolicy {
            max_lag: Duration::from_secs(3600),
            max_rows: usize::MAX,
            when_idle: false,
        };
        let (writer, thread) =
            Writer::spawn_limited(conn, 1_000_000, usize::MAX, held, Arc::new(())).unwrap();
        // Two instances of one node, one minute in twelve 5 s batches: staged, not folded.
        assert_eq!(
            ingest(&writer, live_batches(2, minute, minute + 60)).await,
            120
        );
        assert_eq!(count(&reader, "rollup_1m"), 0);
        assert_eq!(
            count(&reader, "ingest_delta_1m"),
            24,
            "a row per batch and instance"
        );
        // The same seconds under new batch ids: the staged masks hold them already.
        assert_eq!(
            ingest(&writer, live_batches(2, minute, minute + 60)).await,
            0
        );

        // What a crash leaves: the committed files as they are now.
        let crashed = dir.path().join("crashed.duckdb");
        for (from, to) in [
            (&path, &crashed),
            (
                &path.with_extension("duckdb.wal"),
                &crashed.with_extension("duckdb.wal"),
            ),
        ] {
            if from.exists() {
                std::fs::copy(from, to).unwrap();
            }
        }

        writer.fold_rollups().await.unwrap();
        assert_eq!(count(&reader, "ingest_delta_1m"), 0);
        assert_eq!(count(&reader, "ingest_delta_gpu_1h"), 0);
        let (samples, mask): (i64, u64) = reader
            .query_row(
                "SELECT sum(samples), bit_and(seconds_mask) FROM rollup_1m",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((samples, mask), (120, u64::MAX >> 4), "every second once");
        assert_eq!(count(&reader, "rollup_1m"), 2, "one row per instance");
        let folded = rollups(&reader);
        drop((writer, reader));
        thread.join().unwrap();

        // The next start folds what the crash left staged, to the same rollups, and a re-send
        // after it stores nothing.
        let restarted = |p: &Path| {
            let (conn, _) = store::open(p).unwrap();
            let reader = conn.try_clone().unwrap();
            let (writer, thread) = Writer::spawn(conn, 1_000_000, Arc::new(())).unwrap();
            (reader, writer, thread)
        };
        let (reader, writer, thread) = restarted(&crashed);
        assert_eq!(rollups(&reader), folded);
        assert_eq!(
            ingest(&writer, live_batches(2, minute, minute + 60)).await,
            0
        );
        drop(writer);
        thread.join().unwrap();
        assert_eq!(rollups(&reader), folded);
    }

    #[test]
    fn a_group_folds_when_idle_full_or_late() {
        let policy = FoldPolicy {
            max_lag: Duration::from_millis(50),
            max_rows: 100,
            when_idle: true,
        };
        let mut staged = Staged::default();
        assert!(
            staged.fold_due(&policy, 10, false),
            "nothing waits behind it"
        );
        assert!(
            !staged.fold_due(&policy, 10, true),
            "batches wait behind it"
        );
        staged.added(90);
        assert!(staged.fold_due(&policy, 10, true), "100 rows staged");
        assert!(!staged.fold_due(&policy, 9, true));
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            staged.fold_due(&policy, 0, true),
            "the oldest row is 60 ms old"
        );
        staged.folded();
        assert!(staged.is_empty());
        assert!(!staged.fold_due(&policy, 0, true));
        let held = FoldPolicy {
            when_idle: false,
            ..policy
        };
        assert!(!Staged::default().fold_due(&held, 10, false));
        assert!(Staged::found(3).fold_due(&held, 97, false));
    }
}
