//! Rollup folds held back while the writer is behind.
//!
//! A live group's minute deltas number about a fifth of its samples (one per instance and 5 s
//! batch), and folding them into the minute, hour, day, tenant and GPU rollups is one `MERGE` per
//! rollup whose rows are nearly all updates: that cost more than everything else a group does
//! (docs/perf/ingest.md, "Where the time goes now"). So when samples already wait behind a group,
//! the writer commits the group's raw rows and batch ids but keeps its minute and GPU deltas in
//! memory, summed per (instance, holder, minute): twelve 5 s batches of a series become one row.
//! Once it has held for [`HOLD_FOR`] (while [`HOLD_BEHIND`] samples or more wait) or
//! [`HOLD_BRIEFLY`] (while fewer do) or [`HOLD_ROWS`] rows, it hands what it holds to the fold
//! thread ([`folder`](super::folder)) and goes on; the groups written meanwhile hold theirs. A
//! group that finds nothing waiting folds what is held with its own deltas, in its transaction
//! (or, if it began beside a fold in flight, right after it and that fold, before it is
//! answered); so do retention and minute rows before they write, an idle writer, and a writer
//! that stops. So under load the rollups show an acknowledged batch at most [`HOLD_FOR`] and a
//! fold later; otherwise the group that stores a batch also folds it.
//!
//! Exactly-once stays a matter of data. While the writer holds anything or a fold is in flight,
//! `fold_pending.from_ts` (committed with the group that started holding, lowered by any group
//! with older seconds, raised by the first group that holds after a fold landed) is at most the
//! oldest second held or in flight, and a second is in the ledger iff its minute's mask in
//! `rollup_1m` has it or a raw row from `from_ts` on has it. Dedup reads the masks and adds the
//! held ones and those in flight (until the writer knows the fold committed). Only a
//! group whose every stored sample went to `samples_raw` is held. A start (after a crash), or a
//! failed write, re-derives the unfolded seconds from the raw rows the masks lack
//! ([`UNFOLDED_DELTAS`], [`UNFOLDED_GPU`]) and folds them in one transaction ([`recover`]).

use std::time::{Duration, Instant};

use duckdb::{Connection, params};

use super::WriteError;
use super::folder::FoldJob;
use super::rollups::{
    GPU_ROLLUP, Map, MinuteDelta, add_gpu_counts, fold_delta_rows, fold_gpu_deltas,
    fold_minute_deltas, rollup_statements,
};

/// Samples waiting behind a group from which the writer counts as behind, and holds for up to
/// [`HOLD_FOR`]; with fewer waiting it holds for up to [`HOLD_BRIEFLY`]. Holding long pays when
/// the same instances bring several batches before the fold, i.e. when the writer is behind. At
/// a live fleet's own pace each instance sends one batch per 5 s: there a long hold only makes the
/// folds fewer and larger, which raises the paced load's p99 (docs/perf/ingest.md, "Live path:
/// 1,000 senders, 280-sample gzip batches"), and a fold per group, five `MERGE`s for a
/// batch or two, made the writer's fixed cost most of its work.
pub(super) const HOLD_BEHIND: usize = 50_000;

/// Longest the writer holds folds back while it is behind.
pub(super) const HOLD_FOR: Duration = Duration::from_secs(30);

/// Longest the writer holds folds back while it keeps up (some samples wait, fewer than
/// [`HOLD_BEHIND`]): about one fold a second instead of one per group.
pub(super) const HOLD_BRIEFLY: Duration = Duration::from_secs(1);

/// Most (instance, holder, minute) rows held; more are folded at once.
pub(super) const HOLD_ROWS: usize = 250_000;

/// The minute deltas of the raw rows from `$1` on whose second the minute masks lack, in
/// `ingest_delta_1m`'s shape (what the writer's pass would have summed for them).
pub(super) const UNFOLDED_DELTAS: &str = "
INSERT INTO ingest_delta_1m BY NAME
WITH m AS (
    SELECT instance_id, bucket, bit_or(seconds_mask) AS mask FROM rollup_1m
    WHERE bucket >= $1 - $1 % 60 GROUP BY ALL
), u AS (
    SELECT r.*, r.ts - r.ts % 60 AS bucket, 1::UBIGINT << (r.ts % 60)::INTEGER AS bit
    FROM samples_raw r LEFT JOIN m ON m.instance_id = r.instance_id AND m.bucket = r.ts - r.ts % 60
    WHERE r.ts >= $1 AND coalesce(m.mask, 0) & (1::UBIGINT << (r.ts % 60)::INTEGER) = 0
)
SELECT bucket, instance_id, holder_id,
       bit_or(bit) AS seconds_mask,
       count(*)::INTEGER AS samples,
       count(sm_active)::INTEGER AS sm_active_samples,
       coalesce(sum(sm_active), 0) AS sm_active_sum,
       min(sm_active) AS sm_active_min,
       max(sm_active) AS sm_active_max,
       count(sm_occupancy)::INTEGER AS sm_occupancy_samples,
       coalesce(sum(sm_occupancy), 0) AS sm_occupancy_sum,
       count(tensor_active)::INTEGER AS tensor_active_samples,
       coalesce(sum(tensor_active), 0) AS tensor_active_sum,
       count(dram_active)::INTEGER AS dram_active_samples,
       coalesce(sum(dram_active), 0) AS dram_active_sum,
       count(fb_used_bytes)::INTEGER AS fb_used_samples,
       coalesce(sum(fb_used_bytes), 0)::UBIGINT AS fb_used_bytes_sum,
       max(fb_used_bytes) AS fb_used_bytes_max,
       max(fb_total_bytes) AS fb_total_bytes_max,
       coalesce(sum(nvlink_tx_bytes), 0)::UBIGINT AS nvlink_tx_bytes_sum,
       coalesce(sum(nvlink_rx_bytes), 0)::UBIGINT AS nvlink_rx_bytes_sum
FROM u GROUP BY bucket, instance_id, holder_id";

/// The GPU deltas of the same raw rows, in `ingest_delta_gpu_1h`'s shape: each instance's
/// instance-seconds, and per GPU the seconds no instance of it had in the masks (counted once,
/// on the GPU's lowest instance id: the GPU rollup sums per GPU).
pub(super) const UNFOLDED_GPU: &str = "
INSERT INTO ingest_delta_gpu_1h
WITH m AS (
    SELECT instance_id, bucket, bit_or(seconds_mask) AS mask FROM rollup_1m
    WHERE bucket >= $1 - $1 % 60 GROUP BY ALL
), gm AS (
    SELECT i.gpu_uuid, m.bucket, bit_or(m.mask) AS mask
    FROM m JOIN instances i USING (instance_id) GROUP BY ALL
), u AS (
    SELECT r.ts, r.instance_id, i.gpu_uuid, r.ts - r.ts % 60 AS minute,
           1::UBIGINT << (r.ts % 60)::INTEGER AS bit
    FROM samples_raw r JOIN instances i USING (instance_id)
    LEFT JOIN m ON m.instance_id = r.instance_id AND m.bucket = r.ts - r.ts % 60
    WHERE r.ts >= $1 AND coalesce(m.mask, 0) & (1::UBIGINT << (r.ts % 60)::INTEGER) = 0
)
SELECT ts - ts % 3600 AS bucket, instance_id, 0::BIGINT, count(*)::BIGINT FROM u GROUP BY ALL
UNION ALL
SELECT u.ts - u.ts % 3600, min(u.instance_id), count(DISTINCT u.ts)::BIGINT, 0::BIGINT
FROM u LEFT JOIN gm ON gm.gpu_uuid = u.gpu_uuid AND gm.bucket = u.minute
WHERE coalesce(gm.mask, 0) & u.bit = 0
GROUP BY u.ts - u.ts % 3600, u.gpu_uuid";

/// What the writer holds: minute and GPU deltas committed as raw rows but not yet folded, and the
/// masks of a fold in flight on the fold thread ([`folder`](super::folder)).
#[derive(Default)]
pub(super) struct Held {
    deltas: Map<(i32, i32, i64), MinuteDelta>,
    /// Per (instance, minute): the seconds held, under any holder.
    masks: Map<(i32, i64), u64>,
    gpu: Map<(i32, i64), (i64, i64)>,
    /// When the first held group was written.
    since: Option<Instant>,
    /// The oldest second held.
    oldest: Option<i64>,
    /// The fold in flight, handed to the fold thread and not yet known to have committed.
    flight: Option<Flight>,
    /// `fold_pending.from_ts` as the writer's transactions leave it: never newer than the oldest
    /// second held or in flight (it may be older: a fold that landed raises it lazily).
    from_ts: Option<i64>,
}

/// A fold in flight: until it commits, its seconds count as held for dedup.
struct Flight {
    masks: Map<(i32, i64), u64>,
    rows: usize,
    oldest: Option<i64>,
}

impl Held {
    /// Whether nothing is held (a fold may be in flight).
    pub(super) fn is_empty(&self) -> bool {
        self.since.is_none()
    }

    /// Whether nothing is held, nothing is in flight and the ledger records nothing pending.
    pub(super) fn settled(&self) -> bool {
        self.is_empty() && self.flight.is_none() && self.from_ts.is_none()
    }

    /// The (instance, holder, minute) deltas held or in flight.
    pub(super) fn rows(&self) -> usize {
        self.deltas.len() + self.flight.as_ref().map_or(0, |f| f.rows)
    }

    /// Whether what is held has reached [`HOLD_ROWS`]: the writer holds no more than that beside
    /// a fold in flight.
    pub(super) fn full(&self) -> bool {
        self.deltas.len() >= HOLD_ROWS
    }

    /// Whether what is held must be folded now, with `behind` samples waiting behind the group.
    pub(super) fn due(&self, behind: usize) -> bool {
        let limit = if behind >= HOLD_BEHIND {
            HOLD_FOR
        } else {
            HOLD_BRIEFLY
        };
        self.since.is_some_and(|s| s.elapsed() >= limit) || self.full()
    }

    /// ORs the held seconds of instances `lo_i..=hi_i` in the minutes `lo_bucket..=hi_t` into
    /// `covered` (the masks the ledger holds for a group).
    pub(super) fn add_masks(
        &self,
        covered: &mut Map<(i32, i64), u64>,
        (lo_bucket, hi_t): (i64, i64),
        (lo_i, hi_i): (i32, i32),
    ) {
        let flight = self.flight.iter().flat_map(|f| &f.masks);
        for (&(iid, bucket), &mask) in self.masks.iter().chain(flight) {
            if (lo_i..=hi_i).contains(&iid) && (lo_bucket..=hi_t).contains(&bucket) {
                *covered.entry((iid, bucket)).or_insert(0) |= mask;
            }
        }
    }

    /// Holds a group's deltas, whose oldest second is `oldest`, recording it in `tx` if it is
    /// older than what is held. It changes `self` before `tx` commits: if this fails, or the
    /// commit does, the caller must [`recover`].
    pub(super) fn hold(
        &mut self,
        tx: &Connection,
        deltas: Map<(i32, i32, i64), MinuteDelta>,
        gpu: Map<(i32, i64), (i64, i64)>,
        oldest: i64,
    ) -> Result<(), WriteError> {
        self.oldest = Some(self.oldest.map_or(oldest, |o| o.min(oldest)));
        self.record_from_ts(tx)?;
        for ((iid, hid, bucket), d) in deltas {
            *self.masks.entry((iid, bucket)).or_insert(0) |= d.mask;
            merge(self.deltas.entry((iid, hid, bucket)).or_default(), &d)?;
        }
        for (key, counts) in gpu {
            add_gpu_counts(&mut self.gpu, key, counts);
        }
        self.since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Brings `fold_pending.from_ts` in `tx` to the oldest second held or in flight: lowered in
    /// the transaction that holds an older second, raised (or cleared) by the first that holds
    /// anything after a fold landed.
    fn record_from_ts(&mut self, tx: &Connection) -> Result<(), WriteError> {
        let flight = self.flight.as_ref().and_then(|f| f.oldest);
        let wanted = self.oldest.into_iter().chain(flight).min();
        if wanted != self.from_ts {
            tx.execute(
                "UPDATE fold_pending SET from_ts = ? WHERE id = 0",
                params![wanted],
            )?;
            self.from_ts = wanted;
        }
        Ok(())
    }

    /// Takes what is held for the fold thread. Its seconds stay covered for dedup until
    /// [`Held::landed`], and `from_ts` stays as it is.
    pub(super) fn take(&mut self) -> FoldJob {
        debug_assert!(self.flight.is_none(), "one fold at a time");
        self.flight = Some(Flight {
            masks: std::mem::take(&mut self.masks),
            rows: self.deltas.len(),
            oldest: self.oldest.take(),
        });
        self.since = None;
        FoldJob {
            deltas: std::mem::take(&mut self.deltas),
            gpu: std::mem::take(&mut self.gpu),
        }
    }

    /// The fold in flight has committed: its seconds are in the rollups' masks now.
    pub(super) fn landed(&mut self) {
        self.flight = None;
    }

    /// Folds what is held together with a group's deltas in `tx`, and clears the record. `self`
    /// is unchanged: call [`Held::folded`] once `tx` has committed.
    ///
    /// The two sets of minute deltas are folded as one set of rows without merging them into a
    /// map: what is held can be 250,000 rows, and growing the group's map to take them shows in
    /// the writer's profile under the live load (docs/perf/writer.md, "Folding what is held").
    pub(super) fn fold_with(
        &self,
        tx: &Connection,
        deltas: Map<(i32, i32, i64), MinuteDelta>,
        mut gpu: Map<(i32, i64), (i64, i64)>,
    ) -> Result<(), WriteError> {
        debug_assert!(self.flight.is_none(), "no fold beside one in flight");
        if self.from_ts.is_some() {
            tx.execute("UPDATE fold_pending SET from_ts = NULL WHERE id = 0", [])?;
        }
        if self.is_empty() {
            fold_minute_deltas(tx, &deltas)?;
            fold_gpu_deltas(tx, &gpu)?;
            return Ok(());
        }
        // The group's rows, each merged with what is held for the same key; then the held rows
        // the group has no key for.
        let mut group = Vec::with_capacity(deltas.len());
        for (&key, d) in &deltas {
            let mut row = *d;
            if let Some(h) = self.deltas.get(&key) {
                merge(&mut row, h)?;
            }
            group.push((key, row));
        }
        let only_held = self
            .deltas
            .iter()
            .filter(|(key, _)| !deltas.contains_key(*key))
            .map(|(&key, &d)| (key, d));
        let n = group.len() + self.deltas.len();
        fold_delta_rows(tx, n, group.into_iter().chain(only_held))?;
        for (&key, &counts) in &self.gpu {
            add_gpu_counts(&mut gpu, key, counts);
        }
        fold_gpu_deltas(tx, &gpu)?;
        Ok(())
    }

    /// What was held is in the rollups now.
    pub(super) fn folded(&mut self) {
        *self = Held::default();
    }
}

fn merge(into: &mut MinuteDelta, d: &MinuteDelta) -> Result<(), WriteError> {
    into.merge(d).map_err(|field| WriteError::Rejected {
        field: field.into(),
        message: "the minute's sum of this counter leaves 64 bits".into(),
    })
}

/// Folds whatever `fold_pending` says is stored but not folded, in one transaction; answers
/// how many samples that folded (`None`: nothing was pending). After it, nothing is held.
pub(super) fn recover(conn: &mut Connection) -> duckdb::Result<Option<u64>> {
    let from: Option<i64> =
        conn.query_row("SELECT from_ts FROM fold_pending WHERE id = 0", [], |r| {
            r.get(0)
        })?;
    let Some(from) = from else {
        return Ok(None);
    };
    let tx = conn.transaction()?;
    // Both sets of deltas before the fold: it sets the masks they are derived against.
    tx.execute(UNFOLDED_DELTAS, params![from])?;
    let samples: i64 = tx.query_row(
        "SELECT coalesce(sum(samples), 0)::BIGINT FROM ingest_delta_1m",
        [],
        |r| r.get(0),
    )?;
    tx.execute(UNFOLDED_GPU, params![from])?;
    for sql in rollup_statements() {
        tx.execute(sql, [])?;
    }
    tx.execute_batch(GPU_ROLLUP)?;
    tx.execute("UPDATE fold_pending SET from_ts = NULL WHERE id = 0", [])?;
    tx.commit()?;
    Ok(Some(samples.unsigned_abs()))
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use gpuledger_schema::wire::Batch;
    use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};

    use super::super::dims::Dims;
    use super::super::folder::Folder;
    use super::super::{InstanceBounds, WriterThread};
    use super::*;

    /// A writer thread's state on the ledger at `path`, opened as a start opens it (folding what
    /// a stopped writer held), driven here without its loop so that the test says when it holds.
    pub(in super::super) fn writer(path: &std::path::Path) -> WriterThread {
        let (mut conn, _) = crate::store::open(path).unwrap();
        recover(&mut conn).unwrap();
        let folder = Folder::spawn(conn.try_clone().unwrap(), Box::new(|| {})).unwrap();
        WriterThread {
            dims: Dims::load(&conn).unwrap(),
            idle_watts: super::super::energy::IdleWatts::load(&conn).unwrap(),
            folder,
            conn,
            observer: Arc::new(()),
            bounds: InstanceBounds::NONE,
            held: Held::default(),
            recent: Default::default(),
            needs_recovery: false,
            checkpoints: Default::default(),
            last_group: None,
        }
    }

    /// 5 s batches over `[t0, t0 + 150)`: two MIG instances of one GPU (one changes tenant at
    /// `t0 + 70`), a whole GPU with unmeasured seconds. Then the batches of `[t0 + 40, t0 + 60)`
    /// again (a re-send: stores nothing), and one batch mixing new and already stored seconds.
    pub(in super::super) fn batches(t0: i64) -> Vec<Batch> {
        let mig = |gi: u32, start: u32| Instance {
            node: "n1".into(),
            gpu_uuid: "GPU-aaaa".into(),
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
            mig_profile: Some("1g.10gb".into()),
            gpu_instance_id: Some(gi),
            placement_start: Some(start),
            placement_size: Some(1),
        };
        let whole = Instance {
            gpu_uuid: "GPU-bbbb".into(),
            mig_profile: None,
            gpu_instance_id: None,
            placement_start: None,
            placement_size: None,
            ..mig(0, 0)
        };
        let tenant = |t: &str| Attribution {
            tenant: Some(t.into()),
            workload: Some(format!("{t}-job")),
            slo_class: Some(SloClass::Batch),
            owner: None,
            owner_ref: None,
        };
        let seconds = |from: i64, to: i64| -> Vec<Sample> {
            (from..to)
                .flat_map(|t| {
                    let x = ((t * 7919) % 101) as f64 / 100.0;
                    [
                        (mig(1, 0), tenant("a"), Some(x)),
                        (
                            mig(2, 1),
                            tenant(if t < t0 + 70 { "a" } else { "b" }),
                            Some(1.0 - x),
                        ),
                        (
                            whole.clone(),
                            Attribution::default(),
                            (t % 3 != 0).then_some(x / 2.0),
                        ),
                    ]
                    .into_iter()
                    .map(move |(instance, attribution, sm)| Sample {
                        timestamp: t,
                        instance,
                        attribution,
                        counters: Counters {
                            sm_active: sm,
                            fb_used_bytes: Some(1 << 30 | (t as u64 % 17)),
                            nvlink_tx_bytes: Some(t as u64 % 1000),
                            ..Counters::default()
                        },
                    })
                })
                .collect()
        };
        let mut out: Vec<Batch> = (t0..t0 + 150)
            .step_by(5)
            .map(|s| Batch::from_samples("n1", &seconds(s, s + 5)))
            .collect();
        out.extend(
            (t0 + 40..t0 + 60)
                .step_by(5)
                .map(|s| Batch::from_samples("n1", &seconds(s, s + 5))),
        );
        out.push(Batch::from_samples("n1", &seconds(t0 + 145, t0 + 155)));
        out
    }

    /// Every rollup's rows, sorted, as text (ratios rounded: sums may add in another order).
    pub(in super::super) fn rollups(path: &std::path::Path) -> Vec<String> {
        rollups_of(&duckdb::Connection::open(path).unwrap())
    }

    /// [`rollups`] read on `conn` (a clone of a running writer's connection, say).
    pub(in super::super) fn rollups_of(conn: &Connection) -> Vec<String> {
        let mut out = Vec::new();
        for table in [
            "rollup_1m",
            "rollup_1h",
            "rollup_alloc_1d",
            "rollup_tenant_1h",
            "rollup_gpu_1h",
        ] {
            let mut stmt = conn
                .prepare(&format!("SELECT * FROM {table} ORDER BY ALL"))
                .unwrap();
            let rows = stmt
                .query_map([], |r| {
                    let mut row = format!("{table}:");
                    for i in 0..r.as_ref().column_count() {
                        match r.get_ref(i)? {
                            duckdb::types::ValueRef::Double(v) => row += &format!(" {v:.9}"),
                            v => row += &format!(" {v:?}"),
                        }
                    }
                    Ok(row)
                })
                .unwrap();
            out.extend(rows.map(Result::unwrap));
        }
        out.sort();
        out
    }

    pub(in super::super) fn write_all(w: &mut WriterThread, batches: &[Batch], hold: bool) -> u64 {
        batches
            .iter()
            .map(|b| {
                let behind = if hold { usize::MAX } else { 0 };
                w.try_write(&[(b, 0)], &|| behind).unwrap()[0].stored
            })
            .sum()
    }

    #[test]
    fn held_folds_give_the_rollups_direct_ones_give_even_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = (chrono::Utc::now().timestamp() / 3600 - 2) * 3600 + 3540;
        let all = batches(t0);
        let (direct, crashed, folded) = (
            dir.path().join("direct.duckdb"),
            dir.path().join("crashed.duckdb"),
            dir.path().join("folded.duckdb"),
        );

        let mut w = writer(&direct);
        let stored = write_all(&mut w, &all, false);
        assert!(w.held.is_empty());
        drop(w);
        assert_eq!(stored, 3 * 155, "the re-sent seconds are stored once");
        let expected = rollups(&direct);
        assert!(expected.iter().any(|r| r.starts_with("rollup_tenant_1h")));

        // Held throughout: dedup sees the held seconds, and nothing reaches the rollups...
        let mut w = writer(&crashed);
        assert_eq!(write_all(&mut w, &all, true), stored);
        assert!(!w.held.is_empty());
        drop(w); // ...until the process dies: the next start folds what the raw rows hold.
        let early = rollups(&crashed);
        assert!(early.is_empty(), "{early:#?}");
        let (mut conn, _) = crate::store::open(&crashed).unwrap();
        assert_eq!(recover(&mut conn).unwrap(), Some(stored));
        assert_eq!(recover(&mut conn).unwrap(), None, "recovered once");
        drop(conn);
        assert_eq!(rollups(&crashed), expected);

        // Held, then folded with a group (no batch waiting), then the writer is idle.
        let mut w = writer(&folded);
        let (first, rest) = all.split_at(20);
        assert_eq!(
            write_all(&mut w, first, true) + write_all(&mut w, rest, false),
            stored
        );
        assert!(w.held.is_empty());
        drop(w);
        assert_eq!(rollups(&folded), expected);
        let pending: Option<i64> = duckdb::Connection::open(&folded)
            .unwrap()
            .query_row("SELECT from_ts FROM fold_pending", [], |r| r.get(0))
            .unwrap();
        assert_eq!(pending, None);
    }

    /// [`batches`] of two hours ago, written one by one with nothing waiting behind them (each
    /// group folds its own deltas) into a ledger in `dir`: their first second, the batches, the
    /// samples stored and the rollups they leave, which every other way of writing them must
    /// leave too.
    pub(in super::super) fn written_directly(
        dir: &std::path::Path,
    ) -> (i64, Vec<Batch>, u64, Vec<String>) {
        let t0 = (chrono::Utc::now().timestamp() / 3600 - 2) * 3600 + 3540;
        let all = batches(t0);
        let direct = dir.join("direct.duckdb");
        let mut w = writer(&direct);
        let stored = write_all(&mut w, &all, false);
        drop(w);
        (t0, all, stored, rollups(&direct))
    }

    /// The end of a test's writes: the idle fold, then, with the writer gone, the ledger holds
    /// what [`written_directly`] left, with nothing pending.
    fn ends_as_written_directly(
        mut w: WriterThread,
        path: &std::path::Path,
        written: u64,
        (stored, expected): (u64, &[String]),
    ) {
        w.fold_held().unwrap();
        assert_eq!(written, stored);
        drop(w);
        assert_eq!(rollups(path), expected);
        assert_eq!(from_ts(path), None);
    }

    /// Gives `w` a fold thread that commits each fold only once the returned sender has sent
    /// it a message ([`Folder::spawn_gated`]).
    pub(in super::super) fn gate_folds(w: &mut WriterThread) -> std::sync::mpsc::Sender<()> {
        let (open, gate) = std::sync::mpsc::channel();
        w.folder = Folder::spawn_gated(w.conn.try_clone().unwrap(), gate).unwrap();
        open
    }

    pub(in super::super) fn from_ts(path: &std::path::Path) -> Option<i64> {
        duckdb::Connection::open(path)
            .unwrap()
            .query_row("SELECT from_ts FROM fold_pending", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn folds_on_the_fold_thread_give_the_direct_rollups_even_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let (t0, all, stored, expected) = written_directly(dir.path());

        for crash in [false, true] {
            let path = dir.path().join(format!("flight-{crash}.duckdb"));
            let mut w = writer(&path);
            let (first, rest) = all.split_at(20);
            let (rest, last) = rest.split_at(rest.len() - 1);
            // The fold stays uncommitted while the rest is written: the ledger's masks lack its
            // seconds all that time.
            let open = gate_folds(&mut w);
            let before = write_all(&mut w, first, true);
            w.start_fold();
            assert!(w.folder.busy() && w.held.is_empty());
            // While it is in flight every group holds, and dedup counts its seconds (the rest
            // re-sends some): read from the ledger, not the writer's recent minutes.
            w.recent.forget();
            let after = write_all(&mut w, rest, true);
            assert!(
                w.folder.busy() && !w.held.is_empty(),
                "a group begun beside a fold holds"
            );
            let folded: i64 = w
                .conn
                .query_row("SELECT count(*) FROM rollup_1m", [], |r| r.get(0))
                .unwrap();
            assert_eq!(folded, 0, "the fold has not committed");
            open.send(()).unwrap();
            let end = if crash {
                w.settle_fold().unwrap();
                assert_eq!(
                    from_ts(&path),
                    Some(t0),
                    "what landed is pending until it is raised"
                );
                drop(w); // the process dies: the next start folds only what was held.
                let (mut conn, _) = crate::store::open(&path).unwrap();
                assert_eq!(recover(&mut conn).unwrap(), Some(after));
                drop(conn);
                write_all(&mut writer(&path), last, false)
            } else {
                // A group with nothing behind it is answered once all it stored is folded, even
                // if it began beside a fold.
                let end = write_all(&mut w, last, false);
                assert!(!w.folder.busy() && w.held.settled());
                drop(w);
                end
            };
            assert_eq!(before + after + end, stored);
            assert_eq!(from_ts(&path), None);
            assert_eq!(rollups(&path), expected, "crash: {crash}");
        }
    }

    #[test]
    fn a_group_past_the_raw_window_waits_for_the_fold_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let (_, all, stored, expected) = written_directly(dir.path());

        let path = dir.path().join("past.duckdb");
        let mut w = writer(&path);
        let open = gate_folds(&mut w);
        let (first, rest) = all.split_at(20);
        let mut n = write_all(&mut w, first, true);
        w.start_fold();
        assert!(w.folder.busy());
        // The rest arrives older than the raw window (a cutoff past all of it): such a group
        // updates the rollups in its own transaction, which may not begin beside the fold's
        // uncommitted updates ("Conflict on update"), so `write` waits for the fold first.
        let opener = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            open.send(()).unwrap();
        });
        for b in rest {
            n += w.write(&[(b, i64::MAX)], &|| usize::MAX).unwrap()[0].stored;
        }
        opener.join().unwrap();
        assert!(!w.folder.busy());
        ends_as_written_directly(w, &path, n, (stored, &expected));
    }

    #[test]
    fn with_the_fold_thread_gone_the_writer_folds_on_its_own_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (_, all, stored, expected) = written_directly(dir.path());

        let path = dir.path().join("stopped.duckdb");
        let mut w = writer(&path);
        let (first, rest) = all.split_at(10);
        let mut n = write_all(&mut w, first, true);
        // The thread dies (a panic, say) with nothing in flight; the held fold falls due.
        w.folder.stop();
        w.start_fold();
        assert!(w.held.settled(), "folded on the writer's thread");
        assert!(!w.needs_recovery);
        // More held groups (the re-sends among them are found stored), folded the same way, then
        // the idle fold.
        n += write_all(&mut w, &rest[..20], true);
        w.start_fold();
        assert!(w.held.settled());
        n += write_all(&mut w, &rest[20..], true);
        ends_as_written_directly(w, &path, n, (stored, &expected));
    }

    #[test]
    fn a_fold_that_fails_on_the_fold_thread_is_derived_again_from_the_raw_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (_, all, stored, expected) = written_directly(dir.path());

        let path = dir.path().join("failed.duckdb");
        let mut w = writer(&path);
        let (first, rest) = all.split_at(10);
        let mut n = write_all(&mut w, first, false);
        n += write_all(&mut w, &rest[..10], true);
        // Another transaction has changed the minute rows the fold must update: DuckDB refuses
        // the fold's update ("Conflict on update"), and its transaction rolls back.
        let other = w.conn.try_clone().unwrap();
        other
            .execute_batch("BEGIN; UPDATE rollup_1m SET samples = samples")
            .unwrap();
        w.start_fold();
        let result = w.folder.wait();
        assert!(
            result.as_ref().is_some_and(|r| r.result.is_err()),
            "{result:?}"
        );
        other.execute_batch("ROLLBACK").unwrap();
        drop(other);
        w.fold_result(result).unwrap();
        assert!(w.held.settled(), "re-derived and folded at once");
        n += write_all(&mut w, &rest[10..], false);
        ends_as_written_directly(w, &path, n, (stored, &expected));
    }
}
