//! Idle hoarding: runs of idle minutes of one allocation (instance + holder), and the episodes
//! they become once they last the detection window. Definitions: `schema/ANALYTICS.md`.
//!
//! [`runs`] is the definition, a pure function over one allocation's minute rows; the rest reads
//! those rows for the GPUs whose data changed and replaces their episodes.

use std::collections::HashMap;

use duckdb::{Connection, params};

use super::Settings;
use super::facts::{Dims, minute_facts};

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

/// The idle runs of one allocation. `rows` are its minutes in order; `gpu_newest` is the newest
/// second its GPU was observed (under any holder): if that is after the allocation's last held
/// second, the allocation has ended.
pub fn runs(rows: &[MinuteRow], threshold: f64, gpu_newest: i64) -> Vec<Run> {
    let mut out = Vec::new();
    let mut current: Option<Run> = None;
    let mut previous: Option<&MinuteRow> = None;
    for row in rows.iter().filter(|r| r.mask != 0) {
        if let Some(p) = previous
            && row.bucket != p.bucket + 60
            && let Some(mut run) = current.take()
        {
            // A minute the allocation did not hold at all: the allocation ended after p.
            run.ended_at = Some(p.last_second() + 1);
            out.push(run);
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
            out.push(run);
        }
        previous = Some(row);
    }
    if let Some(mut run) = current {
        if let Some(p) = previous
            && gpu_newest > p.last_second()
        {
            run.ended_at = Some(p.last_second() + 1);
        }
        out.push(run);
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
}

impl Episode {
    /// Allocated − used GPU-seconds during the run.
    pub fn idle_gpu_seconds(&self) -> f64 {
        (self.run.held_seconds as f64 - self.run.sm_sum) * self.gpu_equivalents
    }
}

/// Episodes recomputed for a set of GPUs: replace every episode of their instances that started
/// at or after the GPU's scan start.
#[derive(Debug, Default)]
pub struct Recomputed {
    /// (gpu_uuid, first bucket rescanned).
    pub scans: Vec<(String, i64)>,
    /// The episodes found from there on.
    pub episodes: Vec<Episode>,
}

/// Recomputes the episodes of the GPUs in `dirty` (gpu_uuid → earliest changed hour), on a
/// connection inside a read transaction.
pub fn recompute(
    conn: &Connection,
    dims: &Dims,
    dirty: &HashMap<String, i64>,
    settings: &Settings,
) -> duckdb::Result<Recomputed> {
    if dirty.is_empty() {
        return Ok(Recomputed::default());
    }
    let window = settings.window_secs();
    // A run that reaches a changed hour and started more than a window (and a margin) before it
    // is an episode already: its stored start says where to rescan from.
    let margin = |hour: i64| hour - window - 3600;
    let oldest = dirty.values().map(|&h| margin(h)).min().unwrap_or(0);
    let mut scan: HashMap<String, i64> =
        dirty.iter().map(|(g, &h)| (g.clone(), margin(h))).collect();
    {
        let mut stmt = conn.prepare_cached(
            "SELECT i.gpu_uuid, e.started_at, e.ended_at FROM hoarding_episodes e
             JOIN instances i USING (instance_id)
             WHERE e.ended_at IS NULL OR e.ended_at >= ?",
        )?;
        let rows = stmt.query_map([oldest], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Option<i64>>(2)?,
            ))
        })?;
        for row in rows {
            let (gpu, started, ended) = row?;
            if let Some(&h) = dirty.get(&gpu)
                && ended.is_none_or(|e| e >= margin(h))
            {
                let s = scan
                    .get_mut(&gpu)
                    .expect("every dirty GPU has a scan start");
                *s = (*s).min(started);
            }
        }
    }
    for s in scan.values_mut() {
        *s = s.div_euclid(60) * 60;
    }
    conn.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS hoarding_scan (gpu_uuid VARCHAR, from_bucket BIGINT);
         DELETE FROM hoarding_scan;",
    )?;
    {
        let mut app = conn.appender("hoarding_scan")?;
        for (g, s) in &scan {
            app.append_row(params![g, s])?;
        }
        app.flush()?;
    }
    let from = scan.values().copied().min().unwrap_or(0);
    let facts = minute_facts(
        conn,
        "SELECT r.bucket, r.instance_id, r.holder_id, r.seconds_mask, r.sm_active_samples, r.sm_active_sum
         FROM rollup_1m r
         JOIN instances i USING (instance_id)
         JOIN temp.hoarding_scan s ON s.gpu_uuid = i.gpu_uuid
         WHERE r.bucket >= ? AND r.bucket >= s.from_bucket",
        [from],
    )?;
    // (instance, holder) → (size, minutes); the newest second per GPU.
    let mut allocations: HashMap<(i32, i32), (f64, Vec<MinuteRow>)> = HashMap::new();
    let mut newest: HashMap<usize, i64> = HashMap::new();
    for f in facts {
        let Some(inst) = dims.instance(f.instance_id) else {
            continue;
        };
        let minute = MinuteRow {
            bucket: f.bucket,
            mask: f.mask,
            sm_samples: f.sm_samples,
            sm_sum: f.sm_sum,
        };
        if minute.mask != 0 {
            let n = newest.entry(inst.gpu).or_insert(i64::MIN);
            *n = (*n).max(minute.last_second());
        }
        if dims.is_allocated(f.holder_id) {
            allocations
                .entry((f.instance_id, f.holder_id))
                .or_insert_with(|| (inst.gpu_equivalents, Vec::new()))
                .1
                .push(minute);
        }
    }
    let mut episodes = Vec::new();
    for ((iid, hid), (size, mut minutes)) in allocations {
        minutes.sort_by_key(|m| m.bucket);
        let gpu_newest = dims
            .instance(iid)
            .and_then(|i| newest.get(&i.gpu))
            .copied()
            .unwrap_or(i64::MIN);
        for run in runs(&minutes, settings.idle_threshold, gpu_newest) {
            if run.duration() >= window {
                episodes.push(Episode {
                    instance_id: iid,
                    holder_id: hid,
                    detected_at: run.started_at + window,
                    run,
                    gpu_equivalents: size,
                });
            }
        }
    }
    Ok(Recomputed {
        scans: scan.into_iter().collect(),
        episodes,
    })
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
             WHERE e.started_at >= s.from_bucket)",
    )?;
    let mut app = tx.appender("hoarding_episodes")?;
    for e in &r.episodes {
        app.append_row(params![
            e.instance_id,
            e.holder_id,
            e.run.started_at,
            e.detected_at,
            e.run.ended_at,
            e.run.last_second,
            e.run.held_seconds,
            e.run.sm_samples,
            e.run.sm_sum,
            e.gpu_equivalents,
            e.idle_gpu_seconds(),
            e.run.resumed
        ])?;
    }
    app.flush()
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

    #[test]
    fn unmeasured_minutes_are_not_idle() {
        let mut rows = minutes(0, 3, 0.0);
        rows[1].sm_samples = 0;
        rows[1].sm_sum = 0.0;
        let r = runs(&rows, 0.05, T0);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].ended_at, Some(T0 + 60));
    }
}
