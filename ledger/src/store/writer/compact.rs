//! Raw rows rewritten in instance order once their hour is over.
//!
//! Live ingest appends a group's few seconds of every node together, so neighbouring raw rows
//! belong to different instances, and DuckDB's per-vector compression (ALP for the ratios,
//! bit-packing, RLE) finds little to share: one instance's counters change slowly from second to
//! second, thousands of instances' do not. The same rows one instance after another take far less
//! space (docs/perf/storage.md, "Row order matters"). So each hour's raw rows are
//! rewritten ordered by (instance, second) once it is closed: by the aggregator's [`Compactor`], on
//! a connection of its own beside the writer (ingest does not wait for it), and by an import on
//! the writer's thread, in order with its batches. A rewrite goes in slices of at most
//! [`SLICE_ROWS`] rows (ranges of instance ids), each slice in a transaction of its own: the
//! slice's rows are inserted again in order, then the old copies (row ids up to the table's
//! largest before the insert) are deleted. A checkpoint after each hour frees the old row groups'
//! blocks, which the next hour's rewrite reuses (with one checkpoint at the end, an import's old
//! blocks would stay free inside a file grown by them).
//!
//! **Optimistic writes.** DuckDB's optimistic writes put an insert's full row groups on disk at
//! once, and leave every insert's last blocks part-filled: an hour at a time, those tails add
//! noticeably to the raw rows' bytes (docs/perf/storage.md, "A streamed import rewrites each hour
//! on the way"). So an import's rewrite turns them off: the
//! slice's rows wait in DuckDB's buffer pool until the commit (within its memory limit), and the
//! hour's checkpoint packs them. The
//! [`Compactor`] keeps them on. Beside a busy writer its commits cannot checkpoint, so an hour's
//! rows held back for the hour's checkpoint made that checkpoint, which runs on the writer, hold
//! every batch back for seconds; and a live hour's slices are large, so
//! their part-filled tails cost little (docs/perf/storage.md, "The hourly rewrite beside the
//! writer").
//!
//! Nothing reads raw rows to deduplicate (the minute masks in `rollup_1m` are the record), so the
//! rewrite changes no answer and is safe to repeat; rows that arrive for an hour after it was
//! rewritten are appended as they come.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use duckdb::{Connection, Transaction, params};

use super::{Writer, WriterThread};
use crate::store::StoreError;

/// Most raw rows rewritten in one transaction (DuckDB sorts them within its memory limit).
pub(super) const SLICE_ROWS: i64 = 4_000_000;

/// How long the [`Compactor`] waits after each slice, leaving the cores to the writer and the
/// requests: a full slice keeps DuckDB's threads busy, and on 2 cores a fleet's batches wait
/// meanwhile (docs/perf/storage.md, "The hourly rewrite beside the writer").
pub(super) const SLICE_PAUSE: Duration = Duration::from_secs(1);

impl WriterThread {
    /// Rewrites the raw rows of the hours from the one holding `from` up to (not including)
    /// `to`, ordered by instance and second, on the writer's own connection (an import's
    /// rewrites must come in order with its batches); answers the rows rewritten.
    pub(super) fn compact_raw(&mut self, from: i64, to: i64) -> Result<u64, StoreError> {
        without_optimistic_writes(&mut self.conn, |conn| {
            let mut rewritten = 0;
            for hour in hours(from, to) {
                let n = rewrite_hour(
                    conn,
                    hour,
                    SLICE_ROWS,
                    Duration::ZERO,
                    &AtomicBool::new(false),
                )?
                .rows;
                if n > 0 {
                    // Frees the old copies' blocks now, so that the next hour's rewrite reuses
                    // them instead of growing the file by a copy of every hour.
                    super::compacting_checkpoint(conn).map_err(StoreError::from_db)?;
                }
                rewritten += n;
            }
            Ok(rewritten)
        })
    }
}

/// Rewrites closed hours beside the writer, on a connection of its own, so that ingest never
/// waits for a rewrite.
///
/// On the writer's thread, one hour of a 10,000-GPU fleet (70,000 instances, 252 M raw rows)
/// held back every batch for over a minute on 2 cores (docs/perf/storage.md, "The hourly rewrite
/// beside the writer"). DuckDB lets the two work at once: a slice only appends rows and deletes
/// rows of a closed hour, and the writer only appends raw rows, so no row is changed by both (a
/// conflict would roll the slice back, and the next run redo it). Each slice reads one snapshot, so
/// a batch the writer commits meanwhile (a late one, for the same hour) is neither copied nor
/// deleted by it. The checkpoint that frees an hour's old copies needs no other write transaction
/// open, so the writer runs it between its groups ([`Writer::compacting_checkpoint`]).
///
/// A slice keeps DuckDB's threads busy, and on few cores the writer and the requests wait for
/// them; so the compactor pauses [`SLICE_PAUSE`] after each slice. For a full fleet's hour that
/// adds one pause per slice to the rewrite, well inside the hour until the next one.
///
/// A stop ([`Compactor::stop`]) ends the rewrite after the slice in progress: the process need
/// not wait for the rest of the hour, whose rows stay as they are.
#[derive(Clone)]
pub struct Compactor {
    conn: Arc<Mutex<Connection>>,
    slice_rows: i64,
    pause: Duration,
    stopping: Arc<AtomicBool>,
}

impl Compactor {
    /// A compactor on a new connection to `conn`'s database (take it before the writer takes
    /// `conn`).
    pub fn new(conn: &Connection) -> Result<Compactor, StoreError> {
        Ok(Compactor {
            conn: Arc::new(Mutex::new(conn.try_clone().map_err(StoreError::from_db)?)),
            slice_rows: SLICE_ROWS,
            pause: SLICE_PAUSE,
            stopping: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Ends a rewrite in progress after its current slice, and any later one before it starts.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// At most `rows` raw rows per slice, and no pause between slices (tests make many slices of
    /// few rows).
    pub fn with_slice_rows(mut self, rows: i64) -> Compactor {
        self.slice_rows = rows.max(1);
        self.pause = Duration::ZERO;
        self
    }

    /// Rewrites the raw rows of the hours from the one holding `from` up to (not including)
    /// `to` in instance order, an hour at a time, each hour's slices on a blocking thread, then
    /// asks `writer` for the checkpoint that frees the hour's old copies; resolves to the rows
    /// rewritten. Each hour rewritten to its end is recorded in `raw_compacted`
    /// ([`Compactor::compacted_until`]); an hour a stop cut short is not, and the rest are not
    /// started.
    pub async fn compact(&self, writer: &Writer, from: i64, to: i64) -> Result<u64, StoreError> {
        let mut rewritten = 0;
        for hour in hours(from, to) {
            let (conn, slice_rows, pause) = (self.conn.clone(), self.slice_rows, self.pause);
            let stopping = self.stopping.clone();
            let this_hour = tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
                let done = rewrite_hour(&mut conn, hour, slice_rows, pause, &stopping)?;
                if done.whole {
                    record_compacted(&mut conn, hour.1)?;
                }
                Ok::<_, StoreError>(done)
            })
            .await
            .map_err(|e| StoreError::Io(format!("the compaction task failed: {e}")))??;
            if this_hour.rows > 0 {
                writer.compacting_checkpoint().await?;
                // What DuckDB freed of the slices' sorts and writes, and of the checkpoint, stays
                // resident otherwise.
                tokio::task::spawn_blocking(crate::memory::release_free_memory)
                    .await
                    .map_err(|e| StoreError::Io(format!("the compaction task failed: {e}")))?;
            }
            rewritten += this_hour.rows;
            if !this_hour.whole {
                break;
            }
        }
        Ok(rewritten)
    }

    /// Where the last rewrite ended, as recorded in `raw_compacted`: every hour ending at or
    /// before it is done (or, in a ledger an older build wrote, was left as it came). `None`
    /// when nothing is recorded: a new ledger, or one that only `gpuledger import` wrote (it
    /// rewrites its own hours).
    pub fn compacted_until(&self) -> Result<Option<i64>, StoreError> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        read_record(&conn).map_err(StoreError::from_db)
    }
}

/// Where `raw_compacted` says the rewrite ended; `None` on a ledger with no record.
fn read_record(conn: &Connection) -> duckdb::Result<Option<i64>> {
    conn.query_row("SELECT max(until_ts) FROM raw_compacted", [], |r| r.get(0))
}

/// Replaces the record with `until` (one row), in the caller's transaction.
fn write_record(tx: &Connection, until: i64) -> duckdb::Result<()> {
    tx.execute("DELETE FROM raw_compacted", [])?;
    tx.execute("INSERT INTO raw_compacted VALUES (?)", params![until])?;
    Ok(())
}

/// Records in `raw_compacted` that the hours up to `until` are rewritten.
fn record_compacted(conn: &mut Connection, until: i64) -> Result<(), StoreError> {
    let db = StoreError::from_db;
    let tx = conn.transaction().map_err(db)?;
    write_record(&tx, until).map_err(db)?;
    tx.commit().map_err(db)
}

/// Records that the hours `[from, until)` are in instance order (an import wrote or rewrote them
/// so), when the record then still means what it says, that every hour before it is: it moves
/// only forward, and only when no raw row lies between where it stood (nowhere, on a new ledger)
/// and `from`, in hours the import did not touch, which may hold rows in arrival order. Without
/// it the aggregator's first start rewrote an imported raw window once more. The record
/// afterwards.
pub(super) fn extend_record(tx: &Connection, from: i64, until: i64) -> duckdb::Result<Option<i64>> {
    let stood = read_record(tx)?;
    if stood.is_some_and(|r| r >= until) || until <= from {
        return Ok(stood);
    }
    let in_gap: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM samples_raw WHERE ts >= ? AND ts < ?)",
        params![stood.unwrap_or(i64::MIN), from],
        |r| r.get(0),
    )?;
    if in_gap {
        return Ok(stood);
    }
    write_record(tx, until)?;
    Ok(Some(until))
}

/// What [`rewrite_hour`] did.
struct HourRewritten {
    /// The raw rows rewritten.
    rows: u64,
    /// Every slice was rewritten (a stop did not cut the hour short).
    whole: bool,
}

/// The hours from the one holding `from` up to (not including) `to`, as `[start, end)` with the
/// last one cut at `to`.
fn hours(from: i64, to: i64) -> impl Iterator<Item = (i64, i64)> {
    let first = from - from.rem_euclid(3600);
    (first..to)
        .step_by(3600)
        .map(move |hour| (hour, (hour + 3600).min(to)))
}

/// Rewrites the hour `[hour, end)` slice by slice on `conn`, waiting `pause` after each slice.
/// Once `stopping` is set no further slice starts.
fn rewrite_hour(
    conn: &mut Connection,
    (hour, end): (i64, i64),
    slice_rows: i64,
    pause: Duration,
    stopping: &AtomicBool,
) -> Result<HourRewritten, StoreError> {
    let db = StoreError::from_db;
    let mut done = HourRewritten {
        rows: 0,
        whole: true,
    };
    for (lo, hi) in slices(conn, hour, end, slice_rows).map_err(db)? {
        if stopping.load(Ordering::SeqCst) {
            done.whole = false;
            break;
        }
        let tx = conn.transaction().map_err(db)?;
        done.rows += rewrite_slice(&tx, hour, end, lo, hi)?;
        tx.commit().map_err(db)?;
        std::thread::sleep(pause);
    }
    Ok(done)
}

/// Runs `f` with DuckDB's optimistic writes off (database-wide), and restores the setting found.
fn without_optimistic_writes<T>(
    conn: &mut Connection,
    f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let db = StoreError::from_db;
    let before: bool = conn
        .query_row(
            "SELECT current_setting('enable_optimistic_write')",
            [],
            |r| r.get(0),
        )
        .map_err(db)?;
    conn.execute_batch("SET enable_optimistic_write = false")
        .map_err(db)?;
    let result = f(conn);
    let restored = conn
        .execute_batch(&format!("SET enable_optimistic_write = {before}"))
        .map_err(db);
    let value = result?;
    restored?;
    Ok(value)
}

/// Ranges of instance ids whose raw rows in `[from, to)` number at most `slice_rows` (or one
/// instance's, if it alone has more).
fn slices(
    conn: &Connection,
    from: i64,
    to: i64,
    slice_rows: i64,
) -> duckdb::Result<Vec<(i32, i32)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT instance_id, count(*) FROM samples_raw WHERE ts >= ? AND ts < ? GROUP BY 1 ORDER BY 1",
    )?;
    let counts = stmt
        .query_map(params![from, to], |r| {
            Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<duckdb::Result<Vec<_>>>()?;
    let mut slices: Vec<(i32, i32)> = Vec::new();
    let mut rows = 0;
    for (id, n) in counts {
        match slices.last_mut() {
            Some(last) if rows + n <= slice_rows => {
                last.1 = id;
                rows += n;
            }
            _ => {
                slices.push((id, id));
                rows = n;
            }
        }
    }
    Ok(slices)
}

/// One slice, inside `tx`: its rows again in order, then the old copies deleted (the rows the
/// transaction sees up to the table's largest row id before the insert). If the two counts
/// differ it fails, and the caller's transaction, dropped, rolls back.
fn rewrite_slice(
    tx: &Transaction<'_>,
    from: i64,
    to: i64,
    lo: i32,
    hi: i32,
) -> Result<u64, StoreError> {
    let db = StoreError::from_db;
    let newest_old: Option<i64> = tx
        .query_row("SELECT max(rowid) FROM samples_raw", [], |r| r.get(0))
        .map_err(db)?;
    let Some(newest_old) = newest_old else {
        return Ok(0);
    };
    let inserted = tx
        .execute(
            "INSERT INTO samples_raw SELECT * FROM samples_raw
             WHERE ts >= ?1 AND ts < ?2 AND instance_id BETWEEN ?3 AND ?4
             ORDER BY instance_id, ts",
            params![from, to, lo, hi],
        )
        .map_err(db)?;
    let deleted = tx
        .execute(
            "DELETE FROM samples_raw
             WHERE ts >= ?1 AND ts < ?2 AND instance_id BETWEEN ?3 AND ?4 AND rowid <= ?5",
            params![from, to, lo, hi, newest_old],
        )
        .map_err(db)?;
    if inserted != deleted {
        return Err(StoreError::Io(format!(
            "compacting raw rows copied {inserted} rows but would delete {deleted}; nothing was changed"
        )));
    }
    Ok(inserted as u64)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpuledger_schema::wire::Batch;
    use gpuledger_schema::{Attribution, Counters, Instance, Sample};

    use crate::store::{self, Writer};

    /// `instances` whole GPUs on node `n1`, seconds `from..to`, shipped as live 5 s batches: each
    /// batch holds every instance's five seconds, so the raw rows interleave the instances.
    fn live_batches(instances: u32, from: i64, to: i64) -> Vec<Batch> {
        node_batches("n1", instances, from, to)
    }

    /// [`live_batches`] of node `node`.
    fn node_batches(node: &'static str, instances: u32, from: i64, to: i64) -> Vec<Batch> {
        (from..to)
            .step_by(5)
            .map(|start| {
                let samples: Vec<Sample> = (start..start + 5)
                    .flat_map(|t| {
                        (0..instances).map(move |i| Sample {
                            timestamp: t,
                            instance: Instance {
                                node: node.into(),
                                gpu_uuid: format!("GPU-{i}"),
                                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                                mig_profile: None,
                                gpu_instance_id: None,
                                placement_start: None,
                                placement_size: None,
                            },
                            attribution: Attribution::default(),
                            counters: Counters {
                                sm_active: Some(f64::from(i) / 10.0 + (t % 7) as f64 / 100.0),
                                fb_used_bytes: Some(1 << 30),
                                ..Counters::default()
                            },
                        })
                    })
                    .collect();
                Batch::from_samples(node, &samples)
            })
            .collect()
    }

    type Rows = Vec<(i32, i64, f64)>;

    /// The raw rows in storage order, and their count and sum per instance (order-free).
    fn raw(path: &std::path::Path) -> (Rows, Vec<(i32, i64, f64)>) {
        let conn = duckdb::Connection::open(path).unwrap();
        let read = |sql: &str| -> Rows {
            let mut stmt = conn.prepare(sql).unwrap();
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        (
            read("SELECT instance_id, ts, sm_active FROM samples_raw ORDER BY rowid"),
            read(
                "SELECT instance_id, count(*), sum(sm_active) FROM samples_raw GROUP BY 1 ORDER BY 1",
            ),
        )
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_closed_hour_is_rewritten_in_instance_order_and_nothing_else_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.duckdb");
        let hour = (chrono::Utc::now().timestamp() / 3600 - 3) * 3600;
        let ingest = |batches: Vec<Batch>| {
            let (conn, _) = store::open(&path).unwrap();
            let (writer, thread) = Writer::spawn(conn, 1_000_000, Arc::new(())).unwrap();
            async move {
                let mut stored = 0;
                for b in batches {
                    let r = writer.try_reserve(b.sample_count()).unwrap();
                    stored += writer.ingest(b, 0, r).await.unwrap().stored;
                }
                (writer, thread, stored)
            }
        };
        // The hour and the first minute of the next one, three instances interleaved.
        let (writer, thread, stored) = ingest(live_batches(3, hour, hour + 3660)).await;
        assert_eq!(stored, 3 * 3660);
        let rewritten = writer.compact_raw(hour + 1800, hour + 3600).await.unwrap();
        drop(writer);
        thread.join().unwrap();
        let (after, totals) = raw(&path);
        assert_eq!(
            rewritten,
            3 * 3600,
            "the whole hour holding `from`, not the next one"
        );
        assert_eq!(after.len(), 3 * 3660);
        // The next hour's minute stays as it came (each 5 s batch's instances one after another);
        // the hour is one instance after another, each in second order.
        let (hour_rows, next): (Rows, Rows) = after.iter().partition(|r| r.1 < hour + 3600);
        let mut sorted = hour_rows.clone();
        sorted.sort_by_key(|r| (r.0, r.1));
        assert_eq!(hour_rows, sorted, "rewritten in (instance, second) order");
        let mut next_sorted = next.clone();
        next_sorted.sort_by_key(|r| (r.0, r.1));
        assert_ne!(next, next_sorted, "the next hour was not touched");
        assert_eq!(
            totals.iter().map(|t| t.1).collect::<Vec<_>>(),
            vec![3660; 3],
            "every row kept once"
        );

        // Re-sending the hour stores nothing (the minute masks are the record), and a second
        // compaction of the same hour keeps the rows as they are.
        let (writer, thread, stored) = ingest(live_batches(3, hour, hour + 60)).await;
        assert_eq!(stored, 0);
        assert_eq!(
            writer.compact_raw(hour, hour + 3600).await.unwrap(),
            3 * 3600
        );
        drop(writer);
        thread.join().unwrap();
        let (again, totals_again) = raw(&path);
        assert_eq!(totals_again, totals);
        assert_eq!(
            again
                .iter()
                .filter(|r| r.1 < hour + 3600)
                .collect::<Vec<_>>(),
            hour_rows.iter().collect::<Vec<_>>()
        );
    }

    /// The rewrite beside the writer: a slice held open on the compactor's connection does not
    /// hold back the writer's commits, not even a late batch for the hour being rewritten; the
    /// slice then commits without a conflict, and every row is there once.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_open_slice_holds_back_no_batch_and_both_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.duckdb");
        let hour = (chrono::Utc::now().timestamp() / 3600 - 3) * 3600;
        let (conn, _) = store::open(&path).unwrap();
        let compactor = super::Compactor::new(&conn).unwrap();
        let (writer, thread) = Writer::spawn(conn, 1_000_000, Arc::new(())).unwrap();
        let ingest = |batches: Vec<Batch>| {
            let writer = writer.clone();
            async move {
                let mut stored = 0;
                for b in batches {
                    let r = writer.try_reserve(b.sample_count()).unwrap();
                    stored += writer.ingest(b, 0, r).await.unwrap().stored;
                }
                stored
            }
        };
        assert_eq!(ingest(live_batches(3, hour, hour + 3600)).await, 3 * 3600);

        let held = compactor.conn.clone();
        let (opened_tx, opened) = std::sync::mpsc::channel();
        let (commit_tx, commit) = std::sync::mpsc::channel::<()>();
        let slice = std::thread::spawn(move || {
            let mut conn = held.lock().unwrap();
            let tx = conn.transaction().unwrap();
            let n = super::rewrite_slice(&tx, hour, hour + 3600, 0, i32::MAX).unwrap();
            opened_tx.send(n).unwrap();
            commit.recv().unwrap();
            tx.commit().unwrap();
        });
        assert_eq!(opened.recv().unwrap(), 3 * 3600);
        // Late, for the same hour, and current: both stored while the slice is open.
        let late = node_batches("n2", 2, hour + 600, hour + 900);
        let now = chrono::Utc::now().timestamp();
        let current = node_batches("n3", 2, now - 60, now - 30);
        let stored = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            ingest(late.into_iter().chain(current).collect()),
        )
        .await
        .expect("the writer commits while a slice is open");
        assert_eq!(stored, 2 * 300 + 2 * 30);
        commit_tx.send(()).unwrap();
        slice.join().unwrap();
        writer.compacting_checkpoint().await.unwrap();
        drop(writer);
        thread.join().unwrap();

        let (after, totals) = raw(&path);
        assert_eq!(
            after.len(),
            3 * 3600 + 2 * 300 + 2 * 30,
            "no row lost or doubled"
        );
        let mut counts: Vec<i64> = totals.iter().map(|t| t.1).collect();
        counts.sort_unstable();
        assert_eq!(counts, vec![30, 30, 300, 300, 3600, 3600, 3600]);
        // The slice's rows, one instance after another, follow the rows committed beside it.
        let ids: Vec<i32> = after.iter().rev().take(3 * 3600).map(|r| r.0).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(ids, sorted, "the rewritten hour is in instance order");
    }

    /// An import's hours are recorded as in order only where the record then holds: forward,
    /// and with no untouched raw row between where it stood and the import's first hour.
    #[test]
    fn an_import_moves_the_record_only_over_hours_it_wrote() {
        let (conn, _) = store::open(std::path::Path::new(":memory:")).unwrap();
        let h = 1_800_000_000 / 3600 * 3600;
        let record = |from, until| super::extend_record(&conn, from, until).unwrap();
        // A new ledger with no raw row before the import's hours.
        assert_eq!(record(h, h + 7200), Some(h + 7200));
        assert_eq!(record(h, h + 3600), Some(h + 7200), "never backwards");
        // A raw row in an hour between the record and the import's first: left to the aggregator.
        conn.execute(
            "INSERT INTO samples_raw (ts, instance_id, holder_id) VALUES (?, 1, 0)",
            [h + 7200 + 10],
        )
        .unwrap();
        assert_eq!(record(h + 3 * 3600, h + 5 * 3600), Some(h + 7200));
        // The same import starting at that hour covers it.
        assert_eq!(record(h + 7200, h + 5 * 3600), Some(h + 5 * 3600));
        assert_eq!(
            record(h + 9 * 3600, h + 9 * 3600),
            Some(h + 5 * 3600),
            "no hour"
        );
        let on_file: Vec<i64> = conn
            .prepare("SELECT until_ts FROM raw_compacted")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(on_file, vec![h + 5 * 3600], "one row");
    }

    /// Where the rewrite ended is in the ledger, so a restart resumes there: a new ledger has no
    /// record, an hour a stop cut short is not recorded, and a compactor on the reopened file
    /// reads the last hour done.
    #[tokio::test(flavor = "multi_thread")]
    async fn where_the_rewrite_ended_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.duckdb");
        let hour = (chrono::Utc::now().timestamp() / 3600 - 4) * 3600;
        let (conn, _) = store::open(&path).unwrap();
        // One instance a slice, so that a stop can cut an hour short.
        let compactor = super::Compactor::new(&conn).unwrap().with_slice_rows(3600);
        let stopped = super::Compactor::new(&conn).unwrap().with_slice_rows(3600);
        assert_eq!(compactor.compacted_until().unwrap(), None);
        let (writer, thread) = Writer::spawn(conn, 1_000_000, Arc::new(())).unwrap();
        for b in live_batches(2, hour, hour + 7200) {
            let r = writer.try_reserve(b.sample_count()).unwrap();
            writer.ingest(b, 0, r).await.unwrap();
        }
        stopped.stop();
        assert_eq!(
            stopped.compact(&writer, hour, hour + 7200).await.unwrap(),
            0
        );
        assert_eq!(
            compactor.compacted_until().unwrap(),
            None,
            "a stop records nothing"
        );
        assert_eq!(
            compactor.compact(&writer, hour, hour + 3600).await.unwrap(),
            2 * 3600
        );
        assert_eq!(compactor.compacted_until().unwrap(), Some(hour + 3600));
        drop((writer, compactor, stopped));
        thread.join().unwrap();

        let (conn, _) = store::open(&path).unwrap();
        let compactor = super::Compactor::new(&conn).unwrap();
        assert_eq!(
            compactor.compacted_until().unwrap(),
            Some(hour + 3600),
            "read again after a restart"
        );
        let (writer, thread) = Writer::spawn(conn, 1_000_000, Arc::new(())).unwrap();
        assert_eq!(
            compactor
                .compact(&writer, hour + 3600, hour + 7200)
                .await
                .unwrap(),
            2 * 3600
        );
        assert_eq!(compactor.compacted_until().unwrap(), Some(hour + 7200));
        drop(writer);
        thread.join().unwrap();
    }

    /// [`Compactor::compact`] while batches keep arriving, late ones for the hours it rewrites
    /// among them: every row once, every rewritten hour's rows in instance order, and the
    /// answers (the rollups) as they were.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_compactor_rewrites_hours_while_the_writer_takes_batches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.duckdb");
        let hour = (chrono::Utc::now().timestamp() / 3600 - 4) * 3600;
        let (conn, _) = store::open(&path).unwrap();
        // One instance a slice: many transactions, each beside the writer's.
        let compactor = super::Compactor::new(&conn).unwrap().with_slice_rows(3600);
        let stopped = super::Compactor::new(&conn).unwrap();
        let (writer, thread) = Writer::spawn(conn, 1_000_000, Arc::new(())).unwrap();
        let ingest = |batches: Vec<Batch>| {
            let writer = writer.clone();
            async move {
                // All in flight at once, so that the writer takes them in groups.
                let mut pending = Vec::new();
                for b in batches {
                    let r = writer.reserve(b.sample_count()).await.unwrap();
                    let w = writer.clone();
                    pending.push(tokio::spawn(async move { w.ingest(b, 0, r).await }));
                }
                let mut stored = 0;
                for p in pending {
                    stored += p.await.unwrap().unwrap().stored;
                }
                stored
            }
        };
        assert_eq!(ingest(live_batches(4, hour, hour + 7200)).await, 4 * 7200);
        let minutes = |path: &std::path::Path| -> i64 {
            let conn = duckdb::Connection::open(path).unwrap();
            conn.query_row("SELECT sum(samples)::BIGINT FROM rollup_1m", [], |r| {
                r.get(0)
            })
            .unwrap()
        };
        // A stopped compactor starts no slice.
        stopped.stop();
        assert_eq!(
            stopped.compact(&writer, hour, hour + 7200).await.unwrap(),
            0
        );
        let late = tokio::spawn(ingest(node_batches("n2", 3, hour + 1000, hour + 6000)));
        let rewritten = compactor.compact(&writer, hour, hour + 7200).await.unwrap();
        assert_eq!(late.await.unwrap(), 3 * 5000);
        assert!(rewritten >= 4 * 7200, "{rewritten}");
        drop(writer);
        thread.join().unwrap();

        let (after, totals) = raw(&path);
        assert_eq!(after.len(), 4 * 7200 + 3 * 5000, "no row lost or doubled");
        assert_eq!(totals.len(), 7);
        assert_eq!(
            minutes(&path),
            4 * 7200 + 3 * 5000,
            "the rollups as ingested"
        );
        // n1's instances (ids 1-4, seen first) end in one run per instance and hour.
        let mut runs = 0;
        let mut last = None;
        for r in after.iter().filter(|r| r.0 <= 4) {
            let key = (r.0, r.1.div_euclid(3600));
            if last != Some(key) {
                runs += 1;
                last = Some(key);
            }
        }
        assert_eq!(runs, 8, "one run per instance and hour");
    }
}
