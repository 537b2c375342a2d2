//! Idle hoarding: runs of idle minutes of one allocation (instance + holder), and the episodes
//! they become once they last the detection window. Definitions: `schema/ANALYTICS.md`.
//!
//! [`runs`] is the definition, a pure function over one allocation's minute rows; the rest reads
//! those rows for the GPUs whose data changed and replaces their episodes.
//!
//! Key decision: a pass does not read a long episode's history again. Each stored episode keeps
//! its run's totals before a point ([`Base`]), and the next pass continues the run from there
//! ([`plan`], [`runs_from`]) with the same additions in the same order, so its sums are equal to
//! the bit to a scan of the whole run. Otherwise one allocation idle for a week would make every
//! 15 s pass read a week of its GPU's minutes, and of every GPU's, since the read is one scan
//! from the earliest start (docs/perf/analytics.md, "The evaluation against the hoarders'
//! history").

use std::collections::HashMap;
use std::sync::Arc;

use duckdb::arrow::array::{ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array};
use duckdb::{Connection, params};
use rustc_hash::FxHashMap;

use crate::store::append_columns;

use super::Settings;
use super::facts::{Dims, Selection, for_each_minute_fact};

/// One UTC minute of one allocation, from `rollup_1m`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinuteRow {
    /// The minute's first second.
    pub bucket: i64,
    /// The seconds of the minute the allocation held (bit s = second s).
    pub mask: u64,
    /// Seconds whose SM activity was measured.
    pub sm_samples: i64,
    /// Σ SM activity over them.
    pub sm_sum: f64,
}

impl MinuteRow {
    fn first_second(&self) -> i64 {
        self.bucket + i64::from(self.mask.trailing_zeros())
    }
    fn last_second(&self) -> i64 {
        self.bucket + 63 - i64::from(self.mask.leading_zeros())
    }
    /// Idle: the mean SM activity over the measured held seconds is below the threshold. A
    /// minute with nothing measured is not idle: no evidence, no accusation.
    fn is_idle(&self, threshold: f64) -> bool {
        self.sm_samples > 0 && self.sm_sum / (self.sm_samples as f64) < threshold
    }
}

/// A run of consecutive idle minutes of one allocation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Run {
    /// The first held second of its first minute.
    pub started_at: i64,
    /// The first second of the first non-idle minute, or the second after the allocation's last
    /// sample; `None` while neither has happened.
    pub ended_at: Option<i64>,
    /// Its last held second so far.
    pub last_second: i64,
    /// Seconds held during the run.
    pub held_seconds: i64,
    /// Measured seconds and Σ SM activity during the run.
    pub sm_samples: i64,
    /// Σ SM activity.
    pub sm_sum: f64,
    /// Whether it ended because the holder became active again (false: the allocation ended,
    /// or it has not ended).
    pub resumed: bool,
}

impl Run {
    /// How long the run has lasted: to its end, or to its last held second so far.
    pub fn duration(&self) -> i64 {
        self.ended_at.unwrap_or(self.last_second + 1) - self.started_at
    }
}

/// A run's totals over its minutes before a point: what a later pass continues the run from
/// instead of reading those minutes again (stored with the episode, migration 0008).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Base {
    /// The point, a minute's first second: the totals are over the run's minutes before it.
    pub through: i64,
    /// Seconds held.
    pub held_seconds: i64,
    /// Measured seconds.
    pub sm_samples: i64,
    /// Σ SM activity.
    pub sm_sum: f64,
    /// The run's last held second before `through`.
    pub last_second: i64,
}

impl Base {
    fn of(run: &Run, through: i64) -> Base {
        Base {
            through,
            held_seconds: run.held_seconds,
            sm_samples: run.sm_samples,
            sm_sum: run.sm_sum,
            last_second: run.last_second,
        }
    }

    /// The run that started at `started_at`, as it stood at `through`: [`runs_from`] continues
    /// it with the minutes from `through` on and gives what [`runs`] over all of them gives.
    pub fn seed(&self, started_at: i64) -> Run {
        Run {
            started_at,
            ended_at: None,
            last_second: self.last_second,
            held_seconds: self.held_seconds,
            sm_samples: self.sm_samples,
            sm_sum: self.sm_sum,
            resumed: false,
        }
    }
}

/// The idle runs of one allocation. `rows` are its minutes in order; `gpu_newest` is the newest
/// second its GPU was observed (under any holder): if that is after the allocation's last held
/// second, the allocation has ended.
pub fn runs(rows: &[MinuteRow], threshold: f64, gpu_newest: i64) -> Vec<Run> {
    runs_from(rows, threshold, gpu_newest, None, i64::MAX)
        .into_iter()
        .map(|(run, _)| run)
        .collect()
}

/// [`runs`], continuing `seed` (the run the allocation was in before `rows`, from
/// [`Base::seed`]; every row is at or after its `through`), and with each run's [`Base`] at
/// `base_at` (a minute's first second; `None` for a run that starts at or after it). The sums
/// add the same minutes in the same order as [`runs`] over all the minutes, so they are equal to
/// the bit.
pub fn runs_from(
    rows: &[MinuteRow],
    threshold: f64,
    gpu_newest: i64,
    seed: Option<Run>,
    base_at: i64,
) -> Vec<(Run, Option<Base>)> {
    let mut out = Vec::new();
    // The last minute held so far, as (its first second, its last held second).
    let mut previous: Option<(i64, i64)> =
        seed.map(|r| (r.last_second.div_euclid(60) * 60, r.last_second));
    let mut current: Option<Run> = seed;
    // Once a minute at or after `base_at` came: the base of the run open then, if any.
    let mut crossed: Option<Option<Base>> = None;
    let close = |run: Run, crossed: Option<Option<Base>>, out: &mut Vec<(Run, Option<Base>)>| {
        let base = if run.started_at >= base_at {
            None
        } else {
            crossed.unwrap_or_else(|| Some(Base::of(&run, base_at)))
        };
        out.push((run, base));
    };
    for row in rows.iter().filter(|r| r.mask != 0) {
        if crossed.is_none() && row.bucket >= base_at {
            crossed = Some(current.as_ref().map(|r| Base::of(r, base_at)));
        }
        if let Some((bucket, last)) = previous
            && row.bucket != bucket + 60
            && let Some(mut run) = current.take()
        {
            // A minute the allocation did not hold at all: the allocation ended after p.
            run.ended_at = Some(last + 1);
            close(run, crossed, &mut out);
        }
        if row.is_idle(threshold) {
            let run = current.get_or_insert(Run {
                started_at: row.first_second(),
                ended_at: None,
                last_second: row.last_second(),
                held_seconds: 0,
                sm_samples: 0,
                sm_sum: 0.0,
                resumed: false,
            });
            run.last_second = row.last_second();
            run.held_seconds += i64::from(row.mask.count_ones());
            run.sm_samples += row.sm_samples;
            run.sm_sum += row.sm_sum;
        } else if let Some(mut run) = current.take() {
            run.ended_at = Some(row.bucket);
            run.resumed = true;
            close(run, crossed, &mut out);
        }
        previous = Some((row.bucket, row.last_second()));
    }
    if let Some(mut run) = current {
        if let Some((_, last)) = previous
            && gpu_newest > last
        {
            run.ended_at = Some(last + 1);
        }
        close(run, crossed, &mut out);
    }
    out
}

/// A stored episode (one row of `hoarding_episodes`).
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// The instance.
    pub instance_id: i32,
    /// The holder.
    pub holder_id: i32,
    /// The run.
    pub run: Run,
    /// started_at + window.
    pub detected_at: i64,
    /// The instance's size.
    pub gpu_equivalents: f64,
    /// The run's totals before the pass's base point, for the next pass to continue from.
    pub base: Option<Base>,
}

impl Episode {
    /// Allocated − used GPU-seconds during the run.
    pub fn idle_gpu_seconds(&self) -> f64 {
        (self.run.held_seconds as f64 - self.run.sm_sum) * self.gpu_equivalents
    }
}

/// Episodes recomputed for a set of GPUs: replace every episode of their instances that is open or
/// ended at or after the GPU's scan start (every such episode started there or later, or is
/// continued from its base there: [`plan`]).
#[derive(Debug, Default)]
pub struct Recomputed {
    /// (gpu_uuid, first bucket rescanned).
    pub scans: Vec<(String, i64)>,
    /// The episodes found from there on.
    pub episodes: Vec<Episode>,
}

/// A stored episode as a pass reads it back to plan a rescan.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEpisode {
    /// The instance.
    pub instance_id: i32,
    /// The holder.
    pub holder_id: i32,
    /// The run's first held second.
    pub started_at: i64,
    /// Its end; `None` while open.
    pub ended_at: Option<i64>,
    /// Its totals before a point, when stored with them.
    pub base: Option<Base>,
}

/// Where one GPU's rescan starts, and the runs it continues there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// The first minute read.
    pub from: i64,
    /// (instance, holder) → the run it was in at `from`, to continue.
    pub seeds: HashMap<(i32, i32), Run>,
}

/// Plans the rescan of one GPU whose data changed at `reach` or later, as far as any run that is
/// not an episode yet can tell (a window and two minutes before the earliest changed hour).
/// `stored` are the GPU's episodes that are open or ended at or after `reach` (and any earlier
/// one that ended at or after the plan's `from`: the caller fetches again when `from` is
/// earlier than what it fetched).
///
/// An episode that reaches back past `reach` is a run the rescan must see whole. When every such
/// episode was stored with its totals at one point at or before `reach`, the rescan starts there
/// and continues them; otherwise it starts at the earliest of their starts (and again, until no
/// episode reaches past the start). Nothing before the start changed, so the runs found from it,
/// continued or whole, are what a scan of all of the GPU's history finds.
pub fn plan(reach: i64, stored: &[StoredEpisode]) -> Plan {
    let touching = |from: i64| {
        stored
            .iter()
            .filter(move |e| e.ended_at.is_none_or(|end| end >= from))
    };
    let crossing = |from: i64| touching(from).filter(move |e| e.started_at < from);
    let Some(first) = crossing(reach).next() else {
        return Plan {
            from: reach,
            seeds: HashMap::new(),
        };
    };
    if let Some(through) = first.base.map(|b| b.through)
        && through <= reach
        && crossing(through).all(|e| e.base.is_some_and(|b| b.through == through))
    {
        let seeds = crossing(through)
            .filter_map(|e| {
                let b = e.base?;
                Some(((e.instance_id, e.holder_id), b.seed(e.started_at)))
            })
            .collect();
        return Plan {
            from: through,
            seeds,
        };
    }
    let mut from = reach;
    while let Some(start) = crossing(from).map(|e| e.started_at).min() {
        from = start.div_euclid(60) * 60;
    }
    Plan {
        from,
        seeds: HashMap::new(),
    }
}

/// The stored episodes that are open or ended at or after `from`, per GPU UUID.
fn stored_episodes(
    conn: &Connection,
    from: i64,
    ids: &Selection,
) -> duckdb::Result<HashMap<String, Vec<StoredEpisode>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT i.gpu_uuid, e.instance_id, e.holder_id, e.started_at, e.ended_at,
                e.base_through, e.base_held_seconds, e.base_sm_active_samples,
                e.base_sm_active_sum, e.base_last_second
         FROM hoarding_episodes e JOIN instances i USING (instance_id)
         WHERE (e.ended_at IS NULL OR e.ended_at >= ?)
           AND (e.instance_id BETWEEN ? AND ? OR e.instance_id > ?)",
    )?;
    let range = (ids.range.start(), ids.range.end());
    let rows = stmt.query_map(params![from, range.0, range.1, ids.newest], |r| {
        let through: Option<i64> = r.get(5)?;
        let base = match through {
            Some(through) => Some(Base {
                through,
                held_seconds: r.get(6)?,
                sm_samples: r.get(7)?,
                sm_sum: r.get(8)?,
                last_second: r.get(9)?,
            }),
            None => None,
        };
        Ok((
            r.get::<_, String>(0)?,
            StoredEpisode {
                instance_id: r.get(1)?,
                holder_id: r.get(2)?,
                started_at: r.get(3)?,
                ended_at: r.get(4)?,
                base,
            },
        ))
    })?;
    let mut out: HashMap<String, Vec<StoredEpisode>> = HashMap::new();
    for row in rows {
        let (gpu, e) = row?;
        out.entry(gpu).or_default().push(e);
    }
    Ok(out)
}

/// Recomputes the episodes of the GPUs in `dirty` (gpu_uuid → earliest changed hour), on a
/// connection inside a read transaction, among the instances of `ids`, which must hold every
/// instance of those GPUs (an evaluation pass reads its GPUs a few at a time,
/// [`crate::analytics`]).
pub fn recompute(
    conn: &Connection,
    dims: &Dims,
    dirty: &HashMap<String, i64>,
    settings: &Settings,
    ids: &Selection,
) -> duckdb::Result<Recomputed> {
    if dirty.is_empty() {
        return Ok(Recomputed::default());
    }
    let window = settings.window_secs();
    // A run that reaches a changed hour and is not an episode yet started less than a window
    // before it; two minutes spare.
    let reach = |hour: i64| (hour - window - 120).div_euclid(60) * 60;
    // Where this pass takes its episodes' totals: as far on as the next pass can start, should
    // its earliest change be in the newest hour the ledger holds.
    let newest_hour: Option<i64> =
        conn.query_row("SELECT max(bucket) FROM rollup_gpu_1h", [], |r| r.get(0))?;
    let base_point = newest_hour.map_or(i64::MAX, reach);
    let plans = plans(conn, dirty, reach, ids)?;
    let (mut allocations, newest) = scan_minutes(conn, dims, &plans, ids)?;
    // A continued run whose allocation held nothing since still ends (or stays open) here.
    let mut seeds: HashMap<(i32, i32), Run> = HashMap::new();
    for p in plans.values() {
        seeds.extend(p.seeds.iter().map(|(&k, &run)| (k, run)));
    }
    for &(iid, hid) in seeds.keys() {
        if let Some(inst) = dims.instance(iid) {
            allocations
                .entry((iid, hid))
                .or_insert_with(|| (inst.gpu_equivalents, Vec::new()));
        }
    }
    let mut episodes = Vec::new();
    for ((iid, hid), (size, mut minutes)) in allocations {
        minutes.sort_by_key(|m| m.bucket);
        let inst = dims.instance(iid);
        let gpu_newest = inst.map_or(i64::MIN, |i| newest[i.gpu]);
        let from = inst
            .and_then(|i| plans.get(&dims.gpus[i.gpu].gpu_uuid))
            .map_or(i64::MIN, |p| p.from);
        let seed = seeds.get(&(iid, hid)).copied();
        for (run, base) in runs_from(
            &minutes,
            settings.idle_threshold,
            gpu_newest,
            seed,
            base_point.max(from),
        ) {
            if run.duration() >= window {
                episodes.push(Episode {
                    instance_id: iid,
                    holder_id: hid,
                    detected_at: run.started_at + window,
                    run,
                    gpu_equivalents: size,
                    base,
                });
            }
        }
    }
    Ok(Recomputed {
        scans: plans
            .into_iter()
            .map(|(g, p)| (g.clone(), p.from))
            .collect(),
        episodes,
    })
}

/// Each dirty GPU's plan: from where its minutes are scanned again, and the runs it continues.
/// The episodes each plan needs are fetched again while a plan starts before what was fetched
/// (a continued run's point is usually an hour before the earliest change).
fn plans<'a>(
    conn: &Connection,
    dirty: &'a HashMap<String, i64>,
    reach: impl Fn(i64) -> i64,
    ids: &Selection,
) -> duckdb::Result<HashMap<&'a String, Plan>> {
    let mut fetched = dirty.values().map(|&h| reach(h)).min().unwrap_or(0) - 3600;
    loop {
        let stored = stored_episodes(conn, fetched, ids)?;
        let plans: HashMap<&String, Plan> = dirty
            .iter()
            .map(|(g, &h)| {
                let none = Vec::new();
                (g, plan(reach(h), stored.get(g).unwrap_or(&none)))
            })
            .collect();
        let from = plans.values().map(|p| p.from).min().unwrap_or(fetched);
        if from >= fetched {
            return Ok(plans);
        }
        fetched = from;
    }
}

/// An allocation's size and minutes, by (instance, holder).
type Allocations = FxHashMap<(i32, i32), (f64, Vec<MinuteRow>)>;

/// The minutes of the planned GPUs from each plan's start: the allocated ones by (instance,
/// holder), and the newest second each GPU was seen in (by GPU index; `i64::MIN` for none).
fn scan_minutes(
    conn: &Connection,
    dims: &Dims,
    plans: &HashMap<&String, Plan>,
    ids: &Selection,
) -> duckdb::Result<(Allocations, Vec<i64>)> {
    conn.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS hoarding_scan (gpu_uuid VARCHAR, from_bucket BIGINT);
         DELETE FROM hoarding_scan;",
    )?;
    {
        let mut app = conn.appender("hoarding_scan")?;
        for (g, p) in plans {
            app.append_row(params![g, p.from])?;
        }
        app.flush()?;
    }
    let from = plans.values().map(|p| p.from).min().unwrap_or(0);
    let mut allocations = Allocations::default();
    let mut newest = vec![i64::MIN; dims.gpus.len()];
    for_each_minute_fact(
        conn,
        "SELECT r.bucket, r.instance_id, r.holder_id, r.seconds_mask, r.sm_active_samples, r.sm_active_sum
         FROM rollup_1m r
         JOIN instances i USING (instance_id)
         JOIN temp.hoarding_scan s ON s.gpu_uuid = i.gpu_uuid
         WHERE r.bucket >= ? AND r.bucket >= s.from_bucket
           AND (r.instance_id BETWEEN ? AND ? OR r.instance_id > ?)",
        params![from, ids.range.start(), ids.range.end(), ids.newest],
        |f| {
            let Some(inst) = dims.instance(f.instance_id) else {
                return;
            };
            let minute = MinuteRow {
                bucket: f.bucket,
                mask: f.mask,
                sm_samples: f.sm_samples,
                sm_sum: f.sm_sum,
            };
            if minute.mask != 0 {
                newest[inst.gpu] = newest[inst.gpu].max(minute.last_second());
            }
            if dims.is_allocated(f.holder_id) {
                allocations
                    .entry((f.instance_id, f.holder_id))
                    .or_insert_with(|| (inst.gpu_equivalents, Vec::new()))
                    .1
                    .push(minute);
            }
        },
    )?;
    Ok((allocations, newest))
}

/// Replaces the recomputed GPUs' episodes, in the writer's transaction.
pub fn store(tx: &duckdb::Transaction<'_>, r: &Recomputed) -> duckdb::Result<()> {
    if r.scans.is_empty() {
        return Ok(());
    }
    tx.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS hoarding_rescanned (gpu_uuid VARCHAR, from_bucket BIGINT);
         DELETE FROM hoarding_rescanned;",
    )?;
    {
        let mut app = tx.appender("hoarding_rescanned")?;
        for (g, s) in &r.scans {
            app.append_row(params![g, s])?;
        }
        app.flush()?;
    }
    tx.execute_batch(
        "DELETE FROM hoarding_episodes WHERE rowid IN (
             SELECT e.rowid FROM hoarding_episodes e
             JOIN instances i USING (instance_id)
             JOIN temp.hoarding_rescanned s ON s.gpu_uuid = i.gpu_uuid
             WHERE e.ended_at IS NULL OR e.ended_at >= s.from_bucket)",
    )?;
    let e = &r.episodes;
    let i32s = |f: fn(&Episode) -> i32| Arc::new(Int32Array::from_iter_values(e.iter().map(f)));
    let i64s = |f: fn(&Episode) -> i64| Arc::new(Int64Array::from_iter_values(e.iter().map(f)));
    let f64s = |f: fn(&Episode) -> f64| Arc::new(Float64Array::from_iter_values(e.iter().map(f)));
    let or_null_i64 =
        |f: fn(&Episode) -> Option<i64>| Arc::new(Int64Array::from_iter(e.iter().map(f)));
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("instance_id", i32s(|e| e.instance_id)),
        ("holder_id", i32s(|e| e.holder_id)),
        ("started_at", i64s(|e| e.run.started_at)),
        ("detected_at", i64s(|e| e.detected_at)),
        ("ended_at", or_null_i64(|e| e.run.ended_at)),
        ("last_second", i64s(|e| e.run.last_second)),
        ("held_seconds", i64s(|e| e.run.held_seconds)),
        ("sm_active_samples", i64s(|e| e.run.sm_samples)),
        ("sm_active_sum", f64s(|e| e.run.sm_sum)),
        ("gpu_equivalents", f64s(|e| e.gpu_equivalents)),
        ("idle_gpu_seconds", f64s(Episode::idle_gpu_seconds)),
        (
            "resumed",
            Arc::new(BooleanArray::from_iter(
                e.iter().map(|e| Some(e.run.resumed)),
            )),
        ),
        ("base_through", or_null_i64(|e| e.base.map(|b| b.through))),
        (
            "base_held_seconds",
            or_null_i64(|e| e.base.map(|b| b.held_seconds)),
        ),
        (
            "base_sm_active_samples",
            or_null_i64(|e| e.base.map(|b| b.sm_samples)),
        ),
        (
            "base_sm_active_sum",
            Arc::new(Float64Array::from_iter(
                e.iter().map(|e| e.base.map(|b| b.sm_sum)),
            )),
        ),
        (
            "base_last_second",
            or_null_i64(|e| e.base.map(|b| b.last_second)),
        ),
    ];
    append_columns(tx, "hoarding_episodes", columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

    /// `n` whole minutes from minute `start` at SM activity `sm`.
    fn minutes(start: i64, n: i64, sm: f64) -> Vec<MinuteRow> {
        (start..start + n)
            .map(|m| MinuteRow {
                bucket: T0 + m * 60,
                mask: (1u64 << 60) - 1,
                sm_samples: 60,
                sm_sum: sm * 60.0,
            })
            .collect()
    }

    #[test]
    fn a_blip_inside_a_minute_does_not_break_an_idle_run() {
        let mut rows = minutes(0, 40, 0.0);
        // One second at 100 % in minute 10: its mean is 1/60 < 0.05.
        rows[10].sm_sum = 1.0;
        let r = runs(&rows, 0.05, T0 + 40 * 60 - 1);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].started_at, T0);
        assert_eq!(r[0].ended_at, None);
        assert_eq!(r[0].duration(), 40 * 60);
        assert_eq!(r[0].held_seconds, 2400);
    }

    #[test]
    fn a_busy_minute_ends_the_run_at_its_first_second() {
        let mut rows = minutes(0, 10, 0.0);
        rows.extend(minutes(10, 1, 0.5));
        rows.extend(minutes(11, 5, 0.01));
        let r = runs(&rows, 0.05, T0 + 16 * 60 - 1);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].started_at, r[0].ended_at), (T0, Some(T0 + 600)));
        assert!(r[0].resumed, "a busy minute is activity resuming");
        assert_eq!((r[1].started_at, r[1].ended_at), (T0 + 660, None));
    }

    #[test]
    fn a_run_starts_at_the_first_held_second_and_ends_after_the_last() {
        let mut rows = minutes(0, 3, 0.0);
        rows[0].mask = !((1u64 << 20) - 1) & ((1u64 << 60) - 1); // held from second 20
        rows[2].mask = (1u64 << 30) - 1; // released after second 29
        rows[2].sm_samples = 30;
        // The GPU went on being observed (someone else holds the slice now).
        let r = runs(&rows, 0.05, T0 + 200);
        assert_eq!(r[0].started_at, T0 + 20);
        assert_eq!(r[0].ended_at, Some(T0 + 120 + 30));
        assert_eq!(r[0].held_seconds, 40 + 60 + 30);
        // Without later data on the GPU the run is still open.
        assert_eq!(runs(&rows, 0.05, T0 + 149)[0].ended_at, None);
    }

    #[test]
    fn a_minute_not_held_at_all_ends_the_run() {
        let mut rows = minutes(0, 5, 0.0);
        rows.extend(minutes(7, 5, 0.0));
        let r = runs(&rows, 0.05, T0 + 12 * 60);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].ended_at, Some(T0 + 300));
        assert!(!r[0].resumed, "a gap is the allocation ending");
        assert_eq!(r[1].started_at, T0 + 420);
    }

    /// A small deterministic generator for the property tests below.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Random minutes of one allocation: idle, busy and unmeasured ones, partly held ones and
    /// gaps, over about `n` minutes.
    fn random_minutes(rng: &mut Rng, n: i64) -> Vec<MinuteRow> {
        let mut rows = Vec::new();
        let mut m = 0;
        while m < n {
            m += if rng.below(12) == 0 {
                2 + rng.below(5) as i64
            } else {
                1
            };
            let mask = match rng.below(10) {
                0 => (1u64 << (1 + rng.below(59))) - 1,
                1 => !((1u64 << rng.below(59)) - 1) & ((1u64 << 60) - 1),
                _ => (1u64 << 60) - 1,
            };
            let held = i64::from(mask.count_ones());
            let sm_samples = if rng.below(15) == 0 { 0 } else { held };
            let mean = match rng.below(6) {
                0 => 0.5,
                _ => rng.below(400) as f64 / 10_000.0 + 0.001,
            };
            rows.push(MinuteRow {
                bucket: T0 + m * 60,
                mask,
                sm_samples,
                sm_sum: mean * sm_samples as f64,
            });
        }
        rows
    }

    #[test]
    fn continuing_runs_from_their_base_gives_what_reading_every_minute_gives() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..2_000 {
            let n = 20 + rng.below(200) as i64;
            let rows = random_minutes(&mut rng, n);
            let last = rows.last().map_or(T0, |r| r.last_second());
            let newest = last + rng.below(3) as i64 * 60;
            let span = (last - T0) / 60 + 1;
            let point = T0 + rng.below(span as u64) as i64 * 60;
            let later = point + rng.below(span as u64) as i64 * 60;
            let whole = runs_from(&rows, 0.05, newest, None, point);
            assert_eq!(
                whole.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
                runs(&rows, 0.05, newest),
                "case {case}: the base point does not change the runs"
            );
            // The next pass: the runs that reach the point, continued from their bases there.
            let seed = whole
                .iter()
                .filter(|(r, _)| r.started_at < point && r.ended_at.is_none_or(|e| e >= point))
                .map(|(r, b)| {
                    b.expect("a run across the point has a base")
                        .seed(r.started_at)
                })
                .next();
            let after: Vec<MinuteRow> =
                rows.iter().copied().filter(|r| r.bucket >= point).collect();
            let continued = runs_from(&after, 0.05, newest, seed, later);
            let expected: Vec<(Run, Option<Base>)> = runs_from(&rows, 0.05, newest, None, later)
                .into_iter()
                .filter(|(r, _)| r.ended_at.is_none_or(|e| e >= point))
                .collect();
            assert_eq!(
                continued, expected,
                "case {case}: point {point}, later {later}"
            );
        }
    }

    fn stored(
        iid: i32,
        started_at: i64,
        ended_at: Option<i64>,
        base: Option<i64>,
    ) -> StoredEpisode {
        StoredEpisode {
            instance_id: iid,
            holder_id: iid,
            started_at,
            ended_at,
            base: base.map(|through| Base {
                through,
                held_seconds: 600,
                sm_samples: 600,
                sm_sum: 1.5,
                last_second: through - 1,
            }),
        }
    }

    #[test]
    fn a_rescan_continues_long_episodes_from_their_base_or_reads_them_whole() {
        let reach = T0 + 10 * 3600;
        // Nothing reaches back past the point: start there.
        let p = plan(reach, &[stored(1, reach + 60, None, None)]);
        assert_eq!((p.from, p.seeds.len()), (reach, 0));
        // A week-long open episode stored with its totals an hour earlier: continue it there.
        let base = reach - 3600;
        let p = plan(reach, &[stored(1, T0 - 7 * 86400, None, Some(base))]);
        assert_eq!(p.from, base);
        assert_eq!(p.seeds[&(1, 1)].started_at, T0 - 7 * 86400);
        assert_eq!(p.seeds[&(1, 1)].held_seconds, 600);
        // Without totals (stored before migration 0008), or totals at a later point than the
        // change: read it whole, from its start's minute.
        for b in [None, Some(reach + 60)] {
            let p = plan(reach, &[stored(1, T0 + 30, None, b)]);
            assert_eq!((p.from, p.seeds.len()), (T0, 0));
        }
        // Two episodes of the GPU with different points: read from the earlier start, and again
        // from the start of an episode that reaches past that.
        let p = plan(
            reach,
            &[
                stored(1, T0 + 5 * 3600, None, Some(base)),
                stored(2, T0 + 2 * 3600, Some(reach - 60), Some(reach - 7200)),
                stored(3, T0 + 3600, Some(T0 + 3 * 3600), None),
            ],
        );
        assert_eq!((p.from, p.seeds.len()), (T0 + 3600, 0));
    }

    #[test]
    fn unmeasured_minutes_are_not_idle() {
        let mut rows = minutes(0, 3, 0.0);
        rows[1].sm_samples = 0;
        rows[1].sm_sum = 0.0;
        let r = runs(&rows, 0.05, T0);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].ended_at, Some(T0 + 60));
    }

    /// The Arrow path stores every column in `hoarding_episodes`' order, NULLs where a run is
    /// open or has no base. Each value differs from the others, so a column out of place fails.
    #[test]
    fn stored_episodes_read_back_column_by_column() {
        let (conn, _) = crate::store::open(std::path::Path::new(":memory:")).unwrap();
        let run = |n: i64| Run {
            started_at: T0 + n,
            ended_at: (n % 2 == 0).then_some(T0 + 10 * n),
            last_second: T0 + 7 * n,
            held_seconds: 11 * n,
            sm_samples: 13 * n,
            sm_sum: 0.25 * n as f64,
            resumed: n % 2 == 0,
        };
        let episodes: Vec<Episode> = (1..=3)
            .map(|n| Episode {
                instance_id: n as i32,
                holder_id: 100 + n as i32,
                run: run(n),
                detected_at: T0 + 3 * n,
                gpu_equivalents: 1.0 / 7.0 * n as f64,
                base: (n != 2).then(|| Base {
                    through: T0 + 5 * n,
                    held_seconds: 17 * n,
                    sm_samples: 19 * n,
                    sm_sum: 0.5 * n as f64,
                    last_second: T0 + 23 * n,
                }),
            })
            .collect();
        let tx = conn.unchecked_transaction().unwrap();
        let r = Recomputed {
            scans: vec![("GPU-a".into(), T0)],
            episodes: episodes.clone(),
        };
        store(&tx, &r).unwrap();
        tx.commit().unwrap();
        let mut stmt = conn
            .prepare("SELECT * FROM hoarding_episodes ORDER BY instance_id")
            .unwrap();
        let back: Vec<(Episode, f64)> = stmt
            .query_map([], |r| {
                let through: Option<i64> = r.get(12)?;
                let e = Episode {
                    instance_id: r.get(0)?,
                    holder_id: r.get(1)?,
                    run: Run {
                        started_at: r.get(2)?,
                        ended_at: r.get(4)?,
                        last_second: r.get(5)?,
                        held_seconds: r.get(6)?,
                        sm_samples: r.get(7)?,
                        sm_sum: r.get(8)?,
                        resumed: r.get(11)?,
                    },
                    detected_at: r.get(3)?,
                    gpu_equivalents: r.get(9)?,
                    base: match through {
                        None => None,
                        Some(through) => Some(Base {
                            through,
                            held_seconds: r.get(13)?,
                            sm_samples: r.get(14)?,
                            sm_sum: r.get(15)?,
                            last_second: r.get(16)?,
                        }),
                    },
                };
                Ok((e, r.get(10)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back.len(), 3);
        for ((e, idle), want) in back.iter().zip(&episodes) {
            assert_eq!(e, want);
            assert_eq!(*idle, want.idle_gpu_seconds());
        }
    }
}
