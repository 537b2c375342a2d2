//! How much WAL DuckDB gathers before it checkpoints, set by whether the writer keeps up.
//!
//! DuckDB checkpoints inside the commit that takes the WAL past `checkpoint_threshold`, and that
//! commit's batches, and every batch that arrives meanwhile, wait for it. A checkpoint's cost
//! grows with the WAL it writes out (docs/perf/writer.md, "Checkpoints: the paced p99 and
//! DuckDB's memory"). So:
//! - while the writer keeps up (it spent under [`BUSY_SHARE`] of the last [`WINDOW`] writing
//!   groups, and waited for batches the rest) the threshold is [`STEADY`]: short stalls, often.
//!   At [`BUSY`]'s size a 10,000-GPU fleet's pace (70,000 samples/s) meets fewer, longer stalls,
//!   which set the request p99, and DuckDB holds much more memory until one runs (over ten
//!   minutes its buffer pool grows toward its limit either way);
//! - while it does not (a backfill, a backlog being worked off: the queue never empties) it is
//!   [`BUSY`]: at [`STEADY`] the checkpoints come every fraction of a second, and cost a
//!   100 s-batch backfill much of its throughput and bytes on disk.
//!
//! The judgement is the writer's share of the time, not the samples a second: several fleets at
//! once are still live exporters, each request waiting on the next checkpoint. Judged by rate (busy
//! from 250,000 samples a second), four 10,000-GPU fleets (280,000 samples/s) count as busy
//! although the writer spends only part of its time writing, and the WAL they gather between
//! checkpoints raises their paced p99 (docs/perf/writer.md, "Checkpoints judged by the writer's
//! time, not its rate").
//!
//! The first commit after a busy spell may pay for the WAL gathered during it. Retention
//! checkpoints on its own interval whatever the pace.
//!
//! **Row groups are merged only when the writer compacts.** Each commit that appends a group's raw
//! rows leaves a partial row group behind its full ones, and by default every checkpoint "vacuums":
//! it reads and recompresses runs of adjacent row groups to merge them. Live, that rewrote rows the
//! hourly compaction (`compact.rs`) rewrites again anyway: a large part of the writer's profile
//! under a burst, a checkpoint after it that stalled the next seconds' requests, and the merged
//! groups' old blocks left free inside the file, at the end of an import too (docs/perf/storage.md,
//! "Row groups merged only when the writer compacts"). So the store opens with DuckDB's
//! `max_vacuum_tasks` at 0, and only [`compacting_checkpoint`] (after a compaction, after
//! retention) merges. Rows deleted from a row group that keeps live rows stay in it, invisible,
//! until that checkpoint or until the rest of the group is deleted too (DuckDB drops emptied row
//! groups whatever the setting).

use std::time::{Duration, Instant};

use duckdb::Connection;

/// The WAL DuckDB gathers at a fleet's own pace (what the store opens with).
pub(crate) const STEADY: &str = "32MB";

/// The WAL DuckDB gathers while the writer is busy.
pub(crate) const BUSY: &str = "256MB";

/// Share of a [`WINDOW`] spent writing ingest groups from which the writer counts as busy. A
/// group's time is all of it, from its first statement to its answer, waits for the fold in
/// flight included: the same span `writer_commit_duration_seconds` observes. The threshold sits
/// between what the live bench's throughput phase (1,000 senders back to back) and four fleets'
/// pace keep it at on 2 cores (docs/perf/writer.md, "Checkpoints judged by the writer's time,
/// not its rate").
pub(super) const BUSY_SHARE: f64 = 0.9;

/// How long the writer counts its time before it judges whether it keeps up.
pub(super) const WINDOW: Duration = Duration::from_secs(2);

/// The threshold in force on the writer's database, and the time spent writing toward the next
/// judgement.
pub(super) struct Checkpoints {
    busy: bool,
    since: Instant,
    writing: Duration,
}

impl Default for Checkpoints {
    /// The store opens with [`STEADY`].
    fn default() -> Self {
        Checkpoints {
            busy: false,
            since: Instant::now(),
            writing: Duration::ZERO,
        }
    }
}

impl Checkpoints {
    /// Counts `spent` writing an ingest group just answered; once [`WINDOW`] has passed, sets
    /// the threshold for the share of it spent writing, if that changes it. Outside a
    /// transaction. A failure leaves the threshold as it was (DuckDB keeps its setting).
    pub(super) fn wrote(&mut self, conn: &Connection, spent: Duration) -> duckdb::Result<()> {
        self.wrote_at(conn, spent, Instant::now())
    }

    fn wrote_at(&mut self, conn: &Connection, spent: Duration, now: Instant) -> duckdb::Result<()> {
        self.writing += spent;
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < WINDOW {
            return Ok(());
        }
        let busy = self.writing.as_secs_f64() >= BUSY_SHARE * elapsed.as_secs_f64();
        (self.since, self.writing) = (now, Duration::ZERO);
        if busy != self.busy {
            set_threshold(conn, if busy { BUSY } else { STEADY })?;
            self.busy = busy;
        }
        Ok(())
    }
}

/// Sets DuckDB's checkpoint threshold (database-wide) to `threshold`, in DuckDB's size syntax.
pub(crate) fn set_threshold(conn: &Connection, threshold: &str) -> duckdb::Result<()> {
    conn.execute_batch(&format!("SET checkpoint_threshold = '{threshold}'"))
}

/// Row-group merges a [`compacting_checkpoint`] may run: DuckDB's own default.
const VACUUM_TASKS: u32 = 100;

/// Turns DuckDB's row-group merging off for the checkpoints commits trigger (database-wide; what
/// the store opens with).
pub(crate) fn without_merges(conn: &Connection) -> duckdb::Result<()> {
    conn.execute_batch("SET max_vacuum_tasks = 0")
}

/// [`compacting_checkpoint`] after maintenance that has committed (retention's deletes, an
/// hour's raw rewrite): the checkpoint only frees blocks and merges row groups, so one DuckDB
/// refuses ("other write transactions active": another connection's transaction holds its
/// checkpoint lock, as an UPDATE, a sequence or a catalog change does until it ends) is left to
/// the next, with a warning, rather than reported as the maintenance failing.
///
/// It runs only with room on the ledger's volume ([`room_to_checkpoint`]): DuckDB invalidates a
/// database whose checkpoint runs out of space, and then refuses every write until a restart,
/// where a commit refused on a full disk is only an error and the next one succeeds.
pub(crate) fn checkpoint_after_commit(conn: &Connection, after: &str) {
    if let Err(why) = room_to_checkpoint(conn) {
        tracing::warn!(
            after,
            why,
            "A checkpoint after committed work did not run; the next one frees its blocks."
        );
        return;
    }
    if let Err(e) = compacting_checkpoint(conn) {
        tracing::warn!(error = %e, after, "A checkpoint after committed work did not run; the next one frees its blocks.");
    }
}

/// Free space a maintenance checkpoint wants beyond the write-ahead log it folds into the file.
const CHECKPOINT_HEADROOM: u64 = 16 << 20;

/// `Err` naming the shortfall when the ledger's volume has less free space than its write-ahead
/// log plus [`CHECKPOINT_HEADROOM`] (what a checkpoint writes is at most about what the log
/// holds). An in-memory ledger, or a volume that cannot be asked, has room.
fn room_to_checkpoint(conn: &Connection) -> Result<(), String> {
    let path: String = match conn.query_row(
        "SELECT coalesce(path, '') FROM duckdb_databases() WHERE database_name = current_database()",
        [],
        |r| r.get(0),
    ) {
        Ok(p) => p,
        Err(_) => return Ok(()),
    };
    if path.is_empty() {
        return Ok(());
    }
    let path = std::path::Path::new(&path);
    let Some(free) = crate::store::query::free_bytes_beside(path) else {
        return Ok(());
    };
    let wal = crate::store::query::wal_of(path);
    enough_room(free, std::fs::metadata(wal).map_or(0, |m| m.len()))
}

/// [`room_to_checkpoint`]'s rule, given the bytes free and the write-ahead log's size.
fn enough_room(free: u64, wal: u64) -> Result<(), String> {
    let wanted = wal.saturating_add(CHECKPOINT_HEADROOM);
    if free < wanted {
        return Err(format!(
            "{free} bytes free on the ledger's volume, under the {wanted} a checkpoint wants (its write-ahead log plus {CHECKPOINT_HEADROOM})"
        ));
    }
    Ok(())
}

/// A checkpoint that merges row groups, for the writer's maintenance. Merging is off again
/// afterwards, whether or not the checkpoint succeeded.
pub(crate) fn compacting_checkpoint(conn: &Connection) -> duckdb::Result<()> {
    conn.execute_batch(&format!("SET max_vacuum_tasks = {VACUUM_TASKS}"))?;
    let checkpoint = conn.execute_batch("CHECKPOINT");
    let off = without_merges(conn);
    checkpoint.and(off)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threshold(conn: &Connection) -> String {
        conn.query_row("SELECT current_setting('checkpoint_threshold')", [], |r| {
            r.get(0)
        })
        .unwrap()
    }

    #[test]
    fn a_checkpoint_runs_only_with_its_log_and_some_headroom_free() {
        assert!(enough_room(0, 0).is_err(), "a full volume");
        assert!(enough_room(CHECKPOINT_HEADROOM - 1, 0).is_err());
        assert!(enough_room(CHECKPOINT_HEADROOM, 0).is_ok());
        let e = enough_room(CHECKPOINT_HEADROOM + 100, 101).unwrap_err();
        assert!(e.contains("write-ahead log"), "{e}");
        assert!(enough_room(CHECKPOINT_HEADROOM + 101, 101).is_ok());
        assert!(enough_room(u64::MAX, u64::MAX).is_ok(), "no overflow");
        // A ledger in memory, and one in a directory with room, are checkpointed.
        let (mem, _) = crate::store::open(std::path::Path::new(":memory:")).unwrap();
        assert!(room_to_checkpoint(&mem).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = crate::store::open(&dir.path().join("l.duckdb")).unwrap();
        let free = crate::store::query::free_bytes_beside(&dir.path().join("l.duckdb")).unwrap();
        if free > 1 << 30 {
            assert!(room_to_checkpoint(&file).is_ok(), "{free} bytes free");
        }
    }

    #[test]
    fn the_threshold_follows_the_writers_share_of_the_time_and_the_store_opens_steady() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, _) = crate::store::open(&dir.path().join("l.duckdb")).unwrap();
        let steady = threshold(&conn);
        let mut c = Checkpoints::default();
        let t0 = c.since;
        let busy_part = WINDOW.mul_f64(BUSY_SHARE);
        // Writing all along, but the window has not passed: no judgement yet.
        c.wrote_at(&conn, WINDOW / 2, t0 + WINDOW / 2).unwrap();
        assert!(!c.busy);
        assert_eq!(threshold(&conn), steady);
        c.wrote_at(&conn, busy_part - WINDOW / 2, t0 + WINDOW)
            .unwrap();
        assert!(c.busy, "the window's writing reached BUSY_SHARE");
        let busy = threshold(&conn);
        assert_ne!(busy, steady);
        // Just under the share in the next window (however many samples that took), then a
        // group after an idle spell: steady again.
        let under = busy_part - Duration::from_millis(1);
        c.wrote_at(&conn, under, t0 + 2 * WINDOW).unwrap();
        assert!(!c.busy);
        assert_eq!(threshold(&conn), steady);
        c.wrote_at(&conn, WINDOW, t0 + 60 * WINDOW).unwrap();
        assert!(!c.busy, "one window's writing in thirty windows");
        // A group longer than the window (a backlog being worked off) is busy on its own.
        c.wrote_at(&conn, 2 * WINDOW, t0 + 62 * WINDOW).unwrap();
        assert!(c.busy);
        // DuckDB writes sizes its own way ("30.5 MiB"); what is set is what was asked for.
        let mib = |s: &str| s.split(' ').next().unwrap().parse::<f64>().unwrap();
        assert_eq!(mib(&steady).round(), 31.0, "{steady}");
        assert_eq!(mib(&busy).round(), 244.0, "{busy}");
    }

    fn row_groups(conn: &Connection) -> i64 {
        conn.query_row(
            "SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('t')",
            [],
            |r| r.get(0),
        )
        .unwrap()
    }

    #[test]
    fn only_a_compacting_checkpoint_merges_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, _) = crate::store::open(&dir.path().join("l.duckdb")).unwrap();
        let merges = |conn: &Connection| -> String {
            conn.query_row(
                "SELECT current_setting('max_vacuum_tasks')::VARCHAR",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        assert_eq!(merges(&conn), "0", "the store opens without merges");
        conn.execute_batch("CREATE TABLE t (v BIGINT)").unwrap();
        // Three commits of a row group and a bit: a partial row group behind each full one.
        for i in 0..3 {
            conn.execute_batch(&format!(
                "INSERT INTO t SELECT {i} * 1000000 + range FROM range(130000)"
            ))
            .unwrap();
        }
        conn.execute_batch("CHECKPOINT").unwrap();
        let unmerged = row_groups(&conn);
        assert!(
            unmerged >= 4,
            "{unmerged} row groups for 390,000 rows in three commits"
        );
        // Deletes thin every row group out; a checkpoint commits trigger keeps them apart.
        conn.execute_batch("DELETE FROM t WHERE v % 2 = 0; CHECKPOINT")
            .unwrap();
        assert_eq!(row_groups(&conn), unmerged, "merged without compacting");
        // A checkpoint writes only the tables changed since the last: the maintenance that calls
        // a compacting one has just deleted or rewritten rows.
        conn.execute_batch("DELETE FROM t WHERE v % 3 = 0").unwrap();
        compacting_checkpoint(&conn).unwrap();
        let merged = row_groups(&conn);
        assert!(merged < unmerged, "{merged} row groups, {unmerged} before");
        assert_eq!(merges(&conn), "0", "merging is off again");
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 130_000, "the rows no delete took");
    }
}
