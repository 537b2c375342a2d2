//! The per-owner shares of shared instances (a batch's `shares`, migration 0003). Each new
//! batch's share seconds inside the raw window go to `ingest_shares` as Arrow columns, read
//! straight from the share series; then [`SHARES_ROLLUP`] keeps the first of each (second,
//! instance, owner) and folds it into `rollup_share_1h`.
//!
//! The seconds are not read through `Series::shares`, which clones the instance's and the owner's
//! names for every second, nor appended a value at a time: with two owners on every instance
//! that makes the writer's cost per sample several times what it is without shares
//! (docs/perf/writer.md, "Shares on the writer's thread").

use std::sync::Arc;

use duckdb::Connection;
use duckdb::arrow::array::{
    ArrayBuilder, ArrayRef, Float64Builder, Int32Builder, Int64Builder, UInt64Builder,
};
use gpuledger_schema::wire::Series;

use crate::store::append_columns;

use super::NewBatches;
use super::rollups::SHARES_ROLLUP;

/// Appends the new batches' share seconds inside the raw window (older ones could not be told
/// from a re-send) and folds them into the shares rollup.
pub(super) fn write_shares(
    tx: &Connection,
    group: NewBatches<'_>,
    raw_cutoff: i64,
) -> duckdb::Result<()> {
    let seconds: usize = group
        .iter()
        .flat_map(|(_, b, _)| &b.shares)
        .map(|s| s.t.len())
        .sum();
    if seconds == 0 {
        return Ok(());
    }
    let mut columns = ShareColumns::with_capacity(seconds);
    for (_, batch, ids) in group.iter() {
        for (s, &(iid, hid)) in batch.shares.iter().zip(&ids.shares) {
            columns.push_series(s, iid, hid, raw_cutoff);
        }
    }
    if columns.ts.is_empty() {
        return Ok(());
    }
    append_columns(tx, "ingest_shares", columns.finish())?;
    tx.execute_batch(SHARES_ROLLUP)
}

/// Share rows in `ingest_shares`' (`shares_raw`'s) column order.
struct ShareColumns {
    ts: Int64Builder,
    instance_id: Int32Builder,
    holder_id: Int32Builder,
    /// An INTEGER column: the appender takes only the table's own types (a UINTEGER column is
    /// "type mismatch in AppendDataChunk"), and validation keeps counts within it.
    processes: Int32Builder,
    memory_used_bytes: UInt64Builder,
    sm_active: Float64Builder,
}

impl ShareColumns {
    fn with_capacity(rows: usize) -> Self {
        ShareColumns {
            ts: Int64Builder::with_capacity(rows),
            instance_id: Int32Builder::with_capacity(rows),
            holder_id: Int32Builder::with_capacity(rows),
            processes: Int32Builder::with_capacity(rows),
            memory_used_bytes: UInt64Builder::with_capacity(rows),
            sm_active: Float64Builder::with_capacity(rows),
        }
    }

    /// The seconds of `s` from `raw_cutoff` on, owned by `holder_id` on `instance_id`. A second
    /// with no process count (validation requires one in a share) counts 0 processes.
    fn push_series(&mut self, s: &Series, instance_id: i32, holder_id: i32, raw_cutoff: i64) {
        fn at<T: Copy>(col: &Option<Vec<Option<T>>>, j: usize) -> Option<T> {
            col.as_ref().and_then(|c| c.get(j).copied().flatten())
        }
        for (j, &t) in s.t.iter().enumerate() {
            if t < raw_cutoff {
                continue;
            }
            self.ts.append_value(t);
            self.instance_id.append_value(instance_id);
            self.holder_id.append_value(holder_id);
            let processes = s.processes.as_ref().and_then(|p| p.get(j).copied());
            // At most `i32::MAX` once validated (`wire::Series::validate`); a batch that skipped
            // validation saturates here rather than failing its whole group.
            let processes = processes.unwrap_or(0);
            debug_assert!(
                processes <= i32::MAX as u32,
                "a share's processes unvalidated"
            );
            let processes = i32::try_from(processes).unwrap_or(i32::MAX);
            self.processes.append_value(processes);
            self.memory_used_bytes
                .append_option(at(&s.fb_used_bytes, j));
            self.sm_active.append_option(at(&s.sm_active, j));
        }
    }

    fn finish(mut self) -> Vec<(&'static str, ArrayRef)> {
        vec![
            ("ts", Arc::new(self.ts.finish())),
            ("instance_id", Arc::new(self.instance_id.finish())),
            ("holder_id", Arc::new(self.holder_id.finish())),
            ("processes", Arc::new(self.processes.finish())),
            (
                "memory_used_bytes",
                Arc::new(self.memory_used_bytes.finish()),
            ),
            ("sm_active", Arc::new(self.sm_active.finish())),
        ]
    }
}

#[cfg(test)]
mod tests {
    use gpuledger_schema::{Attribution, ShareSample};

    use super::super::tests::whole_h100;
    use super::*;

    fn share(t: i64, processes: u32, memory: Option<u64>, sm: Option<f64>) -> ShareSample {
        ShareSample {
            timestamp: t,
            instance: whole_h100("n1", "GPU-1".into()),
            attribution: Attribution {
                tenant: Some("a".into()),
                ..Default::default()
            },
            processes,
            memory_used_bytes: memory,
            sm_active: sm,
        }
    }

    /// The rows `ingest_shares` holds after `shares` are appended for instance 3, owner 4,
    /// with seconds before `cutoff` left out.
    fn appended(shares: &[ShareSample], cutoff: i64) -> duckdb::Result<Vec<ShareRow>> {
        let (conn, _) = crate::store::open(std::path::Path::new(":memory:")).unwrap();
        let batch = gpuledger_schema::wire::Batch::from_samples("n1", &[]).with_shares(shares);
        let mut columns = ShareColumns::with_capacity(shares.len());
        columns.push_series(&batch.shares[0], 3, 4, cutoff);
        append_columns(&conn, "ingest_shares", columns.finish())?;
        let mut stmt = conn.prepare("SELECT * FROM ingest_shares ORDER BY ts")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?;
        rows.collect()
    }

    type ShareRow = (i64, i32, i32, i32, Option<u64>, Option<f64>);

    #[test]
    fn share_seconds_are_stored_column_by_column_from_the_cutoff_on() {
        let rows = appended(
            &[
                share(99, 9, Some(9), Some(0.9)),
                share(100, 2, Some(1 << 40), None),
                share(101, 0, None, Some(0.25)),
            ],
            100,
        )
        .unwrap();
        assert_eq!(
            rows,
            vec![
                (100, 3, 4, 2, Some(1 << 40), None),
                (101, 3, 4, 0, None, Some(0.25)),
            ]
        );
    }
}
