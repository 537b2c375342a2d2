//! The seconds stored in the last few minutes, kept in the writer's memory for dedup.
//!
//! Dedup reads, for every group, the seconds the ledger holds for the group's instances in the
//! group's minutes ([`pass::covered`](super::pass::covered)). Asked of DuckDB, that is a query per
//! group which DuckDB plans again every time (it keeps no plan for a prepared statement that has
//! parameters and reads a table): a large share of the writer's time at a fleet's own pace
//! (docs/perf/writer.md, "The recent minutes' masks in the writer's memory"). So the writer keeps
//! those seconds itself for the minutes live batches reach.
//!
//! What it keeps is the set of seconds **stored**: the minute masks of `rollup_1m` together with
//! the seconds held back from them ([`held`](super::held); in the ledger, the raw rows from
//! `fold_pending.from_ts` on that no mask has). Folding and recovery move seconds from held to
//! folded and leave that set as it is; only a committed write adds to it. Hence:
//! - a minute is read whole (every instance, folded and held) the first time a group reaches it;
//! - once a group has committed, the masks its pass ended with (what was covered plus what it
//!   kept) are added to the minutes kept; a write that fails adds nothing;
//! - minutes more than [`KEEP`] before the newest one reached are dropped, and a group that
//!   reaches back past them reads the ledger, as every group did before;
//! - whatever else the writer does to raw rows or rollups (minute rows, retention, a rewrite, a
//!   recovery, a failed write) drops every minute ([`Recent::forget`]): they are read again. A
//!   job given by a caller ([`Writer::apply`](super::Writer::apply): the analytics' results,
//!   reclaim's records) writes other tables, and keeps them: after each one, reading every
//!   instance's current minutes again stalled a three-fleet load (docs/perf/writer.md, "The recent
//!   minutes' masks in the writer's memory").

use std::collections::BTreeMap;

use duckdb::Connection;

use super::held::Held;
use super::rollups::{Map, covered_masks, minute_of};

/// How far behind the newest minute reached the writer keeps minutes (seconds). Live batches
/// cover 5 s and arrive within seconds; a re-send after an outage reaches further back and reads
/// the ledger. At 70,000 instances, six minutes kept are about 420,000 entries.
pub(super) const KEEP: i64 = 5 * 60;

/// The seconds stored per instance in each minute kept (see the module's documentation).
#[derive(Default)]
pub(super) struct Recent {
    /// Per minute start: every instance's stored seconds in it (absent: none).
    minutes: BTreeMap<i64, Map<i32, u64>>,
    /// The newest minute start a group reached.
    newest: Option<i64>,
}

impl Recent {
    /// The seconds stored for the instances `ids` in the minutes from `lo_bucket` to `hi_t`,
    /// when those minutes are recent enough to be kept; `None` when the group reaches back past
    /// them (the caller reads the ledger). Reads from `tx` (and `held`) the minutes it lacks.
    pub(super) fn covered(
        &mut self,
        tx: &Connection,
        held: &Held,
        (lo_bucket, hi_t): (i64, i64),
        ids: &[i32],
    ) -> duckdb::Result<Option<Map<(i32, i64), u64>>> {
        let hi_bucket = minute_of(hi_t).0;
        let newest = self.newest.map_or(hi_bucket, |n| n.max(hi_bucket));
        self.newest = Some(newest);
        let floor = newest - KEEP;
        self.minutes = self.minutes.split_off(&floor);
        if lo_bucket < floor {
            return Ok(None);
        }
        let missing: Vec<i64> = (lo_bucket..=hi_bucket)
            .step_by(60)
            .filter(|b| !self.minutes.contains_key(b))
            .collect();
        if let (Some(&first), Some(&last)) = (missing.first(), missing.last()) {
            let whole = (i32::MIN, i32::MAX);
            let mut read = covered_masks(tx, first, last + 59, whole.0, whole.1)?;
            held.add_masks(&mut read, (first, last + 59), whole);
            let mut loaded: BTreeMap<i64, Map<i32, u64>> =
                missing.iter().map(|&m| (m, Map::default())).collect();
            for ((iid, bucket), mask) in read {
                if let Some(m) = loaded.get_mut(&bucket) {
                    m.insert(iid, mask);
                }
            }
            self.minutes.extend(loaded);
        }
        let minutes = self.minutes.range(lo_bucket..=hi_bucket);
        let mut covered =
            Map::with_capacity_and_hasher(ids.len() * minutes.clone().count(), Default::default());
        for (&bucket, masks) in minutes {
            for &iid in ids {
                if let Some(&mask) = masks.get(&iid) {
                    covered.insert((iid, bucket), mask);
                }
            }
        }
        Ok(Some(covered))
    }

    /// Adds the masks of a committed group (per instance and minute start) to the minutes kept.
    pub(super) fn stored(&mut self, masks: &Map<(i32, i64), u64>) {
        for (&(iid, bucket), &mask) in masks {
            if let Some(m) = self.minutes.get_mut(&bucket) {
                *m.entry(iid).or_insert(0) |= mask;
            }
        }
    }

    /// Drops every minute kept: the next group reads its minutes from the ledger again.
    pub(super) fn forget(&mut self) {
        self.minutes.clear();
    }

    /// The minutes kept, for tests to compare with the ledger.
    #[cfg(test)]
    fn kept(&self) -> &BTreeMap<i64, Map<i32, u64>> {
        &self.minutes
    }
}

#[cfg(test)]
mod tests {
    use gpuledger_schema::wire::Batch;
    use gpuledger_schema::{Counters, Sample};

    use super::super::WriterThread;
    use super::super::held::tests::writer;
    use super::super::tests::whole_h100;
    use super::*;

    /// A batch of node `node`'s two instances (one GPU each) over `[from, to)`, with `tx`
    /// NVLink bytes sent each second.
    fn batch(node: &str, from: i64, to: i64, tx: u64) -> Batch {
        let samples: Vec<Sample> = (from..to)
            .flat_map(|t| {
                (0..2).map(move |g| Sample {
                    timestamp: t,
                    instance: whole_h100(node, format!("GPU-{node}-{g}")),
                    attribution: Default::default(),
                    counters: Counters {
                        sm_active: Some(0.5),
                        nvlink_tx_bytes: Some(tx),
                        ..Counters::default()
                    },
                })
            })
            .collect();
        Batch::from_samples(node, &samples)
    }

    /// Every minute kept equals what the ledger and what is held say for it.
    fn assert_kept_is_the_ledger(w: &WriterThread) {
        for (&bucket, kept) in w.recent.kept() {
            let mut want = covered_masks(&w.conn, bucket, bucket + 59, i32::MIN, i32::MAX).unwrap();
            w.held
                .add_masks(&mut want, (bucket, bucket + 59), (i32::MIN, i32::MAX));
            let want: Map<i32, u64> = want.into_iter().map(|((i, _), m)| (i, m)).collect();
            assert_eq!(kept, &want, "minute {bucket}");
        }
    }

    #[test]
    fn the_minutes_kept_are_the_ledger_s_through_holds_folds_failures_and_old_re_sends() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(&dir.path().join("l.duckdb"));
        let t0 = (chrono::Utc::now().timestamp() / 3600 - 2) * 3600;
        let mut expected = 0u64;
        let write = |w: &mut WriterThread, b: &Batch, hold: bool| {
            let behind = if hold { usize::MAX } else { 0 };
            let stored = w.write(&[(b, 0)], &|| behind).map(|o| o[0].stored);
            assert_kept_is_the_ledger(w);
            stored
        };
        // Three nodes send 5 s batches for 10 minutes, holding some groups' folds and folding
        // others; every fourth batch's seconds are sent again at once, as a new batch (another
        // batch id, so that only the masks can tell).
        for (k, s) in (t0..t0 + 600).step_by(5).enumerate() {
            for node in ["a", "b", "c"] {
                let b = batch(node, s, s + 5, 7);
                expected += 10;
                assert_eq!(write(&mut w, &b, k % 3 != 0).unwrap(), 10, "{node} at {s}");
                if k % 4 == 0 {
                    let again = batch(node, s, s + 5, 7);
                    assert_ne!(again.batch_id, b.batch_id);
                    assert_eq!(
                        write(&mut w, &again, false).unwrap(),
                        0,
                        "the re-send of {node} at {s}"
                    );
                }
            }
        }
        assert!(w.recent.kept().len() >= 2, "minutes are kept");
        // A batch overlapping stored seconds with a new one stores only the new seconds.
        assert_eq!(
            write(&mut w, &batch("a", t0 + 595, t0 + 601, 7), true).unwrap(),
            2
        );
        expected += 2;
        // A write the pass refuses adds nothing: its seconds can be stored afterwards.
        let bad = batch("b", t0 + 600, t0 + 605, u64::MAX); // its minute's sum overflows
        assert!(write(&mut w, &bad, true).is_err());
        assert_eq!(
            write(&mut w, &batch("b", t0 + 600, t0 + 605, 7), true).unwrap(),
            10
        );
        expected += 10;
        // A re-send from before the minutes kept reads the ledger, and stores nothing.
        assert_eq!(write(&mut w, &batch("c", t0, t0 + 5, 7), false).unwrap(), 0);
        // After a recovery the minutes are read again, and still agree.
        w.recover().unwrap();
        assert!(w.recent.kept().is_empty());
        assert_eq!(
            write(&mut w, &batch("c", t0 + 590, t0 + 595, 7), true).unwrap(),
            0
        );
        assert!(!w.recent.kept().is_empty());
        w.fold_held().unwrap();
        let in_rollups: i64 = w
            .conn
            .query_row("SELECT sum(samples)::BIGINT FROM rollup_1m", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(in_rollups as u64, expected);
    }
}
