//! Raw rows rewritten in instance order once their hour is over.
//!
//! Live ingest appends a group's few seconds of every node together, so neighbouring raw rows
//! belong to different instances, and DuckDB's per-vector compression (ALP for the ratios,
//! bit-packing, RLE) finds little to share: one instance's counters change slowly from second to
//! second, thousands of instances' do not. The same rows one instance after another take about a
//! third of the space (BENCHMARKS.md, "Row order matters"). So the writer rewrites each hour's
//! raw rows ordered by (instance, second), between ingest groups, in slices of at most
//! [`SLICE_ROWS`] rows (ranges of instance ids), each slice in a transaction of its own: the
//! slice's rows are inserted again in order, then the old copies (row ids up to the table's
//! largest before the insert) are deleted. A checkpoint after each hour frees the old row groups'
//! blocks, which the next hour's rewrite reuses (with one checkpoint at the end, a day's import
//! left the file a third larger, its old blocks free inside it).
//!
//! The rewrite's inserts skip DuckDB's optimistic writes: those write each insert's full row
//! groups at once, and every insert's last blocks stay part-filled; an hour at a time, that was
//! a sixth of the raw rows' bytes (8.56 against 7.33 B a row for the same rows, BENCHMARKS.md, "A
//! streamed import"). The slice's rows wait in DuckDB's buffer pool until the commit instead
//! (within its memory limit), and the hour's checkpoint packs them.
//!
//! Nothing reads raw rows to deduplicate (the minute masks in `rollup_1m` are the record), so the
//! rewrite changes no answer and is safe to repeat; rows that arrive for an hour after it was
//! rewritten are appended as they come.

use duckdb::params;

use super::WriterThread;
use crate::store::StoreError;

/// Most raw rows rewritten in one transaction (DuckDB sorts them within its memory limit).
pub(super) const SLICE_ROWS: i64 = 4_000_000;

impl WriterThread {
    /// Rewrites the raw rows of the hours from the one holding `from` up to (not including)
    /// `to`, ordered by instance and second; answers the rows rewritten.
    pub(super) fn compact_raw(&mut self, from: i64, to: i64) -> Result<u64, StoreError> {
        // The rewrite's rows go to disk at its checkpoint, packed with the table's other new row
        // groups, not at the insert: DuckDB's optimistic writes flush each insert's row groups
        // on their own, and their last blocks stay part-filled (module doc).
        let before: bool = self
            .conn
            .query_row(
                "SELECT current_setting('enable_optimistic_write')",
                [],
                |r| r.get(0),
            )
            .map_err(StoreError::from_db)?;
        self.conn
            .execute_batch("SET enable_optimistic_write = false")
            .map_err(StoreError::from_db)?;
        let result = self.compact_hours(from, to);
        let restored = self
            .conn
            .execute_batch(&format!("SET enable_optimistic_write = {before}"))
            .map_err(StoreError::from_db);
        let rewritten = result?;
        restored?;
        Ok(rewritten)
    }

    fn compact_hours(&mut self, from: i64, to: i64) -> Result<u64, StoreError> {
        let mut rewritten = 0;
        let mut hour = from - from.rem_euclid(3600);
        while hour < to {
            let end = (hour + 3600).min(to);
            let mut this_hour = 0;
            for (lo, hi) in self.slices(hour, end).map_err(StoreError::from_db)? {
                this_hour += self.rewrite(hour, end, lo, hi)?;
            }
            if this_hour > 0 {
                // Frees the old copies' blocks now, so that the next hour's rewrite reuses them
                // instead of growing the file by a copy of every hour.
                super::compacting_checkpoint(&self.conn).map_err(StoreError::from_db)?;
            }
            rewritten += this_hour;
            hour += 3600;
        }
        Ok(rewritten)
    }

    /// Ranges of instance ids whose raw rows in `[from, to)` number at most [`SLICE_ROWS`]
    /// (or one instance's, if it alone has more).
    fn slices(&self, from: i64, to: i64) -> duckdb::Result<Vec<(i32, i32)>> {
        let mut stmt = self.conn.prepare_cached(
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
                Some(last) if rows + n <= SLICE_ROWS => {
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

    /// One slice, in one transaction: its rows again in order, then the old copies deleted. If
    /// the two counts differ, nothing is committed.
    fn rewrite(&mut self, from: i64, to: i64, lo: i32, hi: i32) -> Result<u64, StoreError> {
        let db = StoreError::from_db;
        let tx = self.conn.transaction().map_err(db)?;
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
            // Dropping the transaction rolls it back.
            return Err(StoreError::Io(format!(
                "compacting raw rows copied {inserted} rows but would delete {deleted}; nothing was changed"
            )));
        }
        tx.commit().map_err(db)?;
        Ok(inserted as u64)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpuledger_schema::wire::Batch;
    use gpuledger_schema::{Attribution, Counters, Instance, Sample};

    use crate::store::{self, Writer};

    /// `instances` whole GPUs on one node, seconds `from..to`, shipped as live 5 s batches: each
    /// batch holds every instance's five seconds, so the raw rows interleave the instances.
    fn live_batches(instances: u32, from: i64, to: i64) -> Vec<Batch> {
        (from..to)
            .step_by(5)
            .map(|start| {
                let samples: Vec<Sample> = (start..start + 5)
                    .flat_map(|t| {
                        (0..instances).map(move |i| Sample {
                            timestamp: t,
                            instance: Instance {
                                node: "n1".into(),
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
                Batch::from_samples("n1", &samples)
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
}
