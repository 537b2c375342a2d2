//! The pass: one walk over a group's new samples that decides, second by second, what is stored.
//!
//! This is the exactly-once core (docs/aggregator.md, "Exactly once"). Before it, the writer
//! reads the seconds the ledger holds for the group's instances and minutes: the minute masks of
//! `rollup_1m` plus those of the held folds ([`held`](super::held)). The pass then keeps the first
//! copy of every (instance, second) no mask covers, appends it to the raw columns when it is
//! inside the raw window, sums it into its (instance, holder, minute) delta, and counts its GPU's
//! second as observed if no instance of that GPU had it yet. Whatever it keeps is added to the
//! masks at once, so a second repeated within the group, or by two batches of it, is kept once.
//!
//! A series' seconds come in runs of one minute (and nearly always one hour): the maps are read
//! once per run ([`Run`]) and written back when it ends, not once a second.

use gpuledger_schema::wire::Series;

use duckdb::Connection;

use super::dims::Dims;
use super::held::Held;
use super::raw::RawColumns;
use super::recent::Recent;
use super::rollups::{Map, MinuteDelta, add_gpu_counts, covered_masks, minute_of};
use super::{IngestOutcome, NewBatches, WriteError};

/// What the pass kept of a group.
#[derive(Default)]
pub(super) struct Pass {
    /// The raw rows to append (seconds inside the raw window).
    pub(super) raw: RawColumns,
    /// Per (instance, holder, minute): the sums of the seconds kept.
    pub(super) deltas: Map<(i32, i32, i64), MinuteDelta>,
    /// Per (instance, hour): (GPU seconds first observed, instance-seconds).
    pub(super) gpu_deltas: Map<(i32, i64), (i64, i64)>,
    /// The newest and the oldest second kept.
    pub(super) newest: Option<i64>,
    pub(super) oldest: Option<i64>,
    /// Seconds kept that are older than the raw window: they have no raw row, so the group's
    /// folds cannot be held (a restart could not re-derive them).
    pub(super) rollup_only: usize,
    /// Per (instance, minute) of the group's instances: the seconds covered before the pass and
    /// those it kept, i.e. what is stored once the group commits ([`Recent::stored`]).
    pub(super) masks: Map<(i32, i64), u64>,
}

/// One series' seconds in one minute, while the pass is in it: the instance's covered seconds,
/// its GPU's observed seconds and the minute delta, taken from the group's [`Maps`] at its
/// start and put back at its end.
struct Run {
    bucket: i64,
    seen: u64,
    gpu: u64,
    delta: MinuteDelta,
}

/// What the pass keeps per minute for the group: each instance's covered seconds, each GPU's
/// observed seconds, and the minute deltas per (instance, holder).
struct Maps {
    covered: Map<(i32, i64), u64>,
    gpu_seen: Map<(usize, i64), u64>,
    deltas: Map<(i32, i32, i64), MinuteDelta>,
}

impl Maps {
    /// The minute `bucket` of the series `(instance, holder, GPU slot)`.
    fn take(&mut self, (iid, hid, gpu): (i32, i32, usize), bucket: i64) -> Run {
        Run {
            bucket,
            seen: self.covered.get(&(iid, bucket)).copied().unwrap_or(0),
            gpu: self.gpu_seen.get(&(gpu, bucket)).copied().unwrap_or(0),
            delta: self.deltas.remove(&(iid, hid, bucket)).unwrap_or_default(),
        }
    }

    fn put(&mut self, (iid, hid, gpu): (i32, i32, usize), run: Run) {
        self.covered.insert((iid, run.bucket), run.seen);
        self.gpu_seen.insert((gpu, run.bucket), run.gpu);
        if run.delta.samples > 0 {
            self.deltas.insert((iid, hid, run.bucket), run.delta);
        }
    }
}

/// The seconds the ledger holds (in the minute masks, and held) for the instances of the
/// group's series and of their GPUs (a GPU's observed seconds are the union of its
/// instances'), in the group's minutes: from the writer's [`Recent`] minutes when the group's
/// are among them, else from the ledger.
pub(super) fn covered(
    tx: &Connection,
    dims: &Dims,
    held: &Held,
    recent: &mut Recent,
    group: NewBatches<'_>,
) -> duckdb::Result<Map<(i32, i64), u64>> {
    let (mut lo_t, mut hi_t) = (i64::MAX, i64::MIN);
    let mut instances = Vec::new();
    for (_, batch, ids) in group.iter() {
        for (s, &(iid, _)) in batch.series.iter().zip(&ids.series) {
            if let (Some(&first), Some(&last)) = (s.t.iter().min(), s.t.iter().max()) {
                lo_t = lo_t.min(first);
                hi_t = hi_t.max(last);
                instances.push(iid);
            }
        }
    }
    if lo_t > hi_t {
        return Ok(Map::default());
    }
    let ids = dims.gpu_mates(instances);
    let minutes = (minute_of(lo_t).0, hi_t);
    if let Some(covered) = recent.covered(tx, held, minutes, &ids)? {
        return Ok(covered);
    }
    let (lo_i, hi_i) = (ids[0], ids[ids.len() - 1]);
    let mut covered = covered_masks(tx, minutes.0, minutes.1, lo_i, hi_i)?;
    held.add_masks(&mut covered, minutes, (lo_i, hi_i));
    Ok(covered)
}

/// Walks the series of the group's new batches against the seconds `covered` already; sets each new batch's `stored` in `outcomes`. Seconds before `raw_cutoff` get no raw
/// row.
pub(super) fn pass(
    dims: &Dims,
    covered: Map<(i32, i64), u64>,
    group: NewBatches<'_>,
    raw_cutoff: i64,
    outcomes: &mut [IngestOutcome],
) -> Result<Pass, WriteError> {
    // The raw columns are sized once, for every sample of the group (docs/perf/writer.md, "The
    // writer's own work, and what bounds the live path").
    let samples = group.iter().map(|(_, b, _)| b.sample_count()).sum();
    // So are the pass's maps, for the (series, minute) runs the group can bring: grown by
    // doubling, their rehashing showed in the writer's profile under the live load
    // (docs/perf/writer.md, "The pass's maps sized for the group"). The count is an upper bound (a
    // group of duplicates brings no key), so it is capped: a live group of 1,000 batches is
    // some 70,000 runs.
    let runs: usize = group
        .iter()
        .flat_map(|(_, b, _)| &b.series)
        .map(minutes_spanned)
        .sum::<usize>()
        .min(SIZED_FOR_RUNS);
    let series = group
        .iter()
        .map(|(_, b, _)| b.series.len())
        .sum::<usize>()
        .min(SIZED_FOR_RUNS);
    let mut maps = Maps {
        gpu_seen: dims.gpu_seen(&covered, runs),
        covered,
        deltas: Map::with_capacity_and_hasher(runs, Default::default()),
    };
    // `covered` may be sized already (`Recent` sizes it for every key the pass can add).
    let room = maps.covered.capacity() - maps.covered.len();
    maps.covered.reserve(runs.saturating_sub(room));
    let mut out = Pass {
        raw: RawColumns::with_capacity(samples),
        // Per (instance, hour): a series' seconds are nearly always within one hour.
        gpu_deltas: Map::with_capacity_and_hasher(series, Default::default()),
        ..Pass::default()
    };
    for (i, batch, ids) in group.iter() {
        let mut stored = 0u64;
        for (n, (s, &(iid, hid))) in batch.series.iter().zip(&ids.series).enumerate() {
            let key = (iid, hid, dims.gpu_of[&iid]);
            stored += out.series(&mut maps, key, (n, s), raw_cutoff)?;
        }
        outcomes[i].stored = stored;
    }
    out.deltas = maps.deltas;
    out.masks = maps.covered;
    Ok(out)
}

/// The largest number of (series, minute) runs the pass sizes its maps for.
const SIZED_FOR_RUNS: usize = 1 << 17;

/// How many minutes series `s` has seconds in: one per minute from its first second to its last,
/// exact when its seconds are in time order (as exporters send them), an estimate otherwise; at
/// most its number of seconds.
fn minutes_spanned(s: &Series) -> usize {
    match (s.t.first(), s.t.last()) {
        (Some(&a), Some(&b)) => {
            // Minute numbers, so that no two seconds of i64 can overflow the difference.
            let span = (a.div_euclid(60) - b.div_euclid(60)).unsigned_abs();
            span.saturating_add(1).min(s.t.len() as u64) as usize
        }
        _ => 0,
    }
}

impl Pass {
    /// The pass over series `n`, `s`, of the series `key` = (instance, holder, GPU slot);
    /// answers the seconds it kept.
    fn series(
        &mut self,
        maps: &mut Maps,
        key: (i32, i32, usize),
        (n, s): (usize, &Series),
        raw_cutoff: i64,
    ) -> Result<u64, WriteError> {
        let (iid, hid, _) = key;
        let mut stored = 0;
        let mut run: Option<Run> = None;
        let mut hour = i64::MIN;
        let mut hour_counts = (0i64, 0i64);
        for (j, &ts) in s.t.iter().enumerate() {
            let (bucket, second) = minute_of(ts);
            let bit = 1u64 << second;
            let r = match &mut run {
                Some(r) if r.bucket == bucket => r,
                _ => {
                    if let Some(done) = run.take() {
                        maps.put(key, done);
                    }
                    run.insert(maps.take(key, bucket))
                }
            };
            if r.seen & bit != 0 {
                continue;
            }
            r.seen |= bit;
            stored += 1;
            let this_hour = ts - ts.rem_euclid(3600);
            if this_hour != hour {
                add_gpu_counts(&mut self.gpu_deltas, (iid, hour), hour_counts);
                (hour, hour_counts) = (this_hour, (0, 0));
            }
            hour_counts.1 += 1;
            if r.gpu & bit == 0 {
                r.gpu |= bit;
                hour_counts.0 += 1;
            }
            self.newest = Some(self.newest.map_or(ts, |x| x.max(ts)));
            self.oldest = Some(self.oldest.map_or(ts, |x| x.min(ts)));
            r.delta
                .add(bit, &s.counters(j))
                .map_err(|field| WriteError::Rejected {
                    field: format!("series[{n}].{field}[{j}]"),
                    message: "the minute's sum of this counter leaves 64 bits".into(),
                })?;
            if ts >= raw_cutoff {
                self.raw.push(s, j, iid, hid);
            } else {
                self.rollup_only += 1;
            }
        }
        if let Some(done) = run.take() {
            maps.put(key, done);
        }
        add_gpu_counts(&mut self.gpu_deltas, (iid, hour), hour_counts);
        Ok(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: Vec<i64>) -> Series {
        let instance = gpuledger_schema::Instance {
            node: "n1".into(),
            gpu_uuid: "GPU-1".into(),
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
            mig_profile: None,
            gpu_instance_id: None,
            placement_start: None,
            placement_size: None,
        };
        let mut s = Series::describing(&instance, &Default::default());
        s.t = t;
        s
    }

    #[test]
    fn a_series_spans_the_minutes_from_its_first_second_to_its_last() {
        assert_eq!(minutes_spanned(&at(vec![])), 0);
        assert_eq!(minutes_spanned(&at(vec![120, 121, 122, 123, 124])), 1);
        assert_eq!(minutes_spanned(&at(vec![178, 179, 180, 181])), 2);
        assert_eq!(minutes_spanned(&at((0..300).collect())), 5);
        // Out of order: counted by its ends, whichever way round.
        assert_eq!(minutes_spanned(&at(vec![181, 179])), 2);
        // Two seconds a year apart: two minutes at most, not half a million.
        assert_eq!(minutes_spanned(&at(vec![0, 365 * 86_400])), 2);
        // Before 1970 too.
        assert_eq!(minutes_spanned(&at(vec![-61, -1])), 2);
        // The whole range of i64: no overflow.
        assert_eq!(minutes_spanned(&at(vec![i64::MIN, 0, i64::MAX])), 3);
    }
}
