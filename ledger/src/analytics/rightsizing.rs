//! Rightsizing: which workload should move to a smaller MIG profile, and what the move saves
//! (`GET /api/v1/rightsizing`, the Rightsizing page; definitions: `schema/ANALYTICS.md`,
//! "Rightsizing").
//!
//! Key decisions:
//! - Demand is read per minute (a minute's mean SM activity), as the contract says, but kept as a
//!   histogram of 1 % steps (each minute rounded *up*, so demand is never understated): a
//!   percentile over a month of a 1,000-GPU fleet is then a walk over 101 counters per workload,
//!   not a sort of 300 million minutes.
//! - The histograms of whole UTC days and hours are kept in memory ([`DemandCache`]), each with the
//!   fingerprint of the rollup rows it was read from (their sample counts, which every stored
//!   second raises); a day whose fingerprint moved is read again from the minute rollup. So an
//!   answer is exact as of the hour rollups (what showback reads too), and a month costs the
//!   minutes of its partial hours plus a look at 30 fingerprints once the days are cached.
//! - Savings are priced by the bill's own price book, cut at every price change.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use duckdb::{Connection, params};
use gpuledger_schema::mig::{self, SLICES_PER_GPU};
use rustc_hash::FxHashMap;
use serde::Serialize;

use super::bill::Money;
use super::facts::Dims;
use super::showback::ShowbackError;

/// Steps of the demand histogram: SM activity 0 %, 1 %, … 100 %.
pub const BINS: usize = 101;
/// The percentile of minute demand sized for, unless a class says otherwise.
pub const DEFAULT_PERCENTILE: f64 = 0.95;
/// Compute asked on top of the percentile (0.2: 20 % more slices).
pub const DEFAULT_COMPUTE_HEADROOM: f64 = 0.2;
/// Memory asked on top of the peak.
pub const DEFAULT_MEMORY_HEADROOM: f64 = 0.2;
/// Measured hours below which no recommendation is made.
pub const DEFAULT_MIN_MEASURED_HOURS: f64 = 1.0;
/// At or above this share of the current profile's compute or memory, a workload is saturated.
pub const SATURATION: f64 = 0.95;
/// The profile name of a GPU with MIG off.
pub const WHOLE: &str = "whole";

/// `[rightsizing.classes.<slo_class>]`: what a class changes.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSettings {
    /// The percentile for this class's workloads.
    pub percentile: Option<f64>,
}

/// `[rightsizing]` in the aggregator's config.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The percentile of minute demand sized for (0–1].
    pub percentile: f64,
    /// Compute headroom (≥ 0).
    pub compute_headroom: f64,
    /// Memory headroom (≥ 0).
    pub memory_headroom: f64,
    /// Measured hours a row needs before it is recommended anything.
    pub min_measured_hours: f64,
    /// Per SLO class.
    pub classes: HashMap<String, ClassSettings>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            percentile: DEFAULT_PERCENTILE,
            compute_headroom: DEFAULT_COMPUTE_HEADROOM,
            memory_headroom: DEFAULT_MEMORY_HEADROOM,
            min_measured_hours: DEFAULT_MIN_MEASURED_HOURS,
            classes: HashMap::new(),
        }
    }
}

impl Settings {
    /// Checks every value; the error names its key.
    pub fn check(&self) -> Result<(), String> {
        let percentile = |key: &str, p: f64| {
            if p > 0.0 && p <= 1.0 {
                Ok(())
            } else {
                Err(format!("{key} = {p} is outside (0, 1]"))
            }
        };
        percentile("rightsizing.percentile", self.percentile)?;
        for (key, v) in [
            ("rightsizing.compute_headroom", self.compute_headroom),
            ("rightsizing.memory_headroom", self.memory_headroom),
            ("rightsizing.min_measured_hours", self.min_measured_hours),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{key} = {v} must be a number ≥ 0"));
            }
        }
        for (class, c) in &self.classes {
            if let Some(p) = c.percentile {
                percentile(&format!("rightsizing.classes.{class:?}.percentile"), p)?;
            }
        }
        Ok(())
    }

    /// The percentile for a workload of `class`.
    pub fn percentile_of(&self, class: Option<&str>) -> f64 {
        class
            .and_then(|c| self.classes.get(c))
            .and_then(|c| c.percentile)
            .unwrap_or(self.percentile)
    }
}

/// Why a row is (or is not) a recommendation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A smaller profile holds the needed compute and memory.
    SmallerProfileFits,
    /// The current profile is the smallest that does.
    FitsCurrent,
    /// It uses (nearly) all of its compute or memory: it may need a bigger one.
    Saturated,
    /// Fewer measured hours than `min_measured_hours`.
    InsufficientData,
    /// A GPU model (or profile) not in the MIG tables.
    UnknownModel,
}

/// One (tenant, workload, GPU model, profile).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The tenant.
    pub tenant: String,
    /// The workload.
    pub workload: Option<String>,
    /// Its SLO class (the strictest percentile when it ran under several).
    pub slo_class: Option<String>,
    /// The GPU model, as reported.
    pub gpu_model: String,
    /// The MIG profile it held, or `whole`.
    pub mig_profile: String,
    /// Distinct instances it held with that profile.
    pub instances: u64,
    /// Instance-hours held.
    pub held_hours: f64,
    /// Instance-minutes with an SM reading.
    pub measured_minutes: u64,
    /// The percentile used.
    pub percentile: f64,
    /// Compute slices of the current profile (7 for a whole GPU).
    pub compute_slices: u32,
    /// Framebuffer of the current profile, bytes.
    pub framebuffer_bytes: Option<u64>,
    /// The percentile of minute demand, in compute slices.
    pub compute_p: Option<f64>,
    /// The busiest second's demand, in compute slices.
    pub compute_max: Option<f64>,
    /// The most framebuffer used in any held minute, bytes.
    pub memory_peak_bytes: Option<u64>,
    /// compute_p × (1 + compute_headroom).
    pub needed_slices: Option<f64>,
    /// memory_peak × (1 + memory_headroom), bytes.
    pub needed_bytes: Option<u64>,
    /// The smallest profile that holds what is needed (may be the current one).
    pub recommended_profile: Option<String>,
    /// Whether the row recommends a move (the recommended profile is smaller).
    pub recommendation: bool,
    /// Uses ≥ 95 % of its compute or memory.
    pub saturated: bool,
    /// Why.
    pub reason: Reason,
    /// What the move would have saved over the range.
    pub savings: Money,
    /// The same per 30 days.
    pub savings_per_month: Money,
}

/// Every row's sums.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Rows.
    pub rows: u64,
    /// Rows that recommend a move.
    pub recommendations: u64,
    /// Rows that are saturated.
    pub saturated: u64,
    /// Instance-hours of the rows.
    pub held_hours: f64,
    /// Σ savings.
    pub savings: Money,
    /// Σ savings per month.
    pub savings_per_month: Money,
}

/// `GET /api/v1/rightsizing`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rightsizing {
    /// Range start (a whole minute).
    pub from: i64,
    /// Range end (a whole minute).
    pub to: i64,
    /// The currency of the savings.
    pub currency: String,
    /// The settings the rows were computed with.
    pub settings: Settings,
    /// The rows, the greatest savings first (a page of them: [`Rightsizing::page`]).
    pub rows: Vec<Row>,
    /// The sums of every row, whatever the page.
    pub totals: Totals,
    /// Where the next page starts (`offset=`), when there is one.
    pub next_offset: Option<usize>,
}

impl Rightsizing {
    /// The rows of one `reason` (all when `None`), from `offset`, at most `limit` of them; the
    /// totals still cover every row.
    pub fn page(mut self, reason: Option<Reason>, offset: usize, limit: usize) -> Rightsizing {
        if let Some(r) = reason {
            self.rows.retain(|row| row.reason == r);
        }
        let end = offset.saturating_add(limit);
        self.next_offset = (self.rows.len() > end).then_some(end);
        self.rows.truncate(end);
        self.rows.drain(..offset.min(self.rows.len()));
        self
    }
}

/// What to keep.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter<'a> {
    /// One tenant's rows (a `tenant:` reader, or `?tenant=`).
    pub tenant: Option<&'a str>,
    /// One model's (its key, NVML name or the name reported).
    pub gpu_model: Option<&'a str>,
}

/// One allocation's demand over a piece of time.
#[derive(Debug, Clone, Default)]
struct Cell {
    /// (step, minutes), by step.
    hist: Vec<(u8, u32)>,
    sm_max: Option<f64>,
    fb_max: Option<u64>,
    held_seconds: i64,
}

/// (instance_id, holder_id) → its demand.
type Slab = FxHashMap<(i32, i32), Cell>;

/// Rollup sums that change whenever a second is stored in a bucket.
type Fingerprint = (i64, i64, i64);

/// The histograms of whole days and hours, kept between answers. Memory: one [`Cell`] per
/// allocation per cached day (a few steps each), at most [`DemandCache::MAX_DAYS`] days and
/// [`DemandCache::MAX_HOURS`] hours.
#[derive(Debug, Default)]
pub struct DemandCache {
    inner: Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    /// bucket → (fingerprint, slab, last use).
    days: HashMap<i64, (Fingerprint, std::sync::Arc<Slab>, u64)>,
    hours: HashMap<i64, (Fingerprint, std::sync::Arc<Slab>, u64)>,
    clock: u64,
}

impl DemandCache {
    /// Days kept (three months).
    pub const MAX_DAYS: usize = 93;
    /// Hours kept (two days).
    pub const MAX_HOURS: usize = 48;

    /// (days, hours) held now.
    pub fn len(&self) -> (usize, usize) {
        let c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (c.days.len(), c.hours.len())
    }

    /// About how many bytes the kept histograms take (cells, their steps, the maps' slots).
    pub fn bytes(&self) -> usize {
        let c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let slab = |s: &Slab| {
            s.capacity() * (std::mem::size_of::<((i32, i32), Cell)>() + 1)
                + s.values()
                    .map(|c| c.hist.capacity() * std::mem::size_of::<(u8, u32)>())
                    .sum::<usize>()
        };
        c.days
            .values()
            .chain(c.hours.values())
            .map(|(_, s, _)| slab(s))
            .sum()
    }

    fn get(&self, day: bool, bucket: i64, fp: Fingerprint) -> Option<std::sync::Arc<Slab>> {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        c.clock += 1;
        let now = c.clock;
        let map = if day { &mut c.days } else { &mut c.hours };
        match map.get_mut(&bucket) {
            Some((f, slab, used)) if *f == fp => {
                *used = now;
                Some(slab.clone())
            }
            _ => None,
        }
    }

    fn put(&self, day: bool, bucket: i64, fp: Fingerprint, slab: std::sync::Arc<Slab>) {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        c.clock += 1;
        let now = c.clock;
        let (map, max) = if day {
            (&mut c.days, Self::MAX_DAYS)
        } else {
            (&mut c.hours, Self::MAX_HOURS)
        };
        map.insert(bucket, (fp, slab, now));
        while map.len() > max {
            let Some(oldest) = map.iter().min_by_key(|(_, v)| v.2).map(|(k, _)| *k) else {
                break;
            };
            map.remove(&oldest);
        }
    }
}

/// The minute rollup's demand per allocation over `[a, b)` (whole minutes).
fn read_minutes(conn: &Connection, a: i64, b: i64) -> duckdb::Result<Slab> {
    let mut stmt = conn.prepare_cached(
        "SELECT instance_id, holder_id,
                CASE WHEN sm_active_samples > 0
                     THEN least(100, greatest(0, ceil(round(sm_active_sum / sm_active_samples * 100, 6))))::INTEGER
                     ELSE -1 END AS step,
                count(*)::BIGINT, max(sm_active_max), max(fb_used_bytes_max)::BIGINT,
                sum(samples)::BIGINT
         FROM rollup_1m WHERE bucket >= ? AND bucket < ? AND holder_id <> 0
         GROUP BY ALL",
    )?;
    let mut slab = Slab::default();
    let rows = stmt.query_map(params![a, b], |r| {
        Ok((
            r.get::<_, i32>(0)?,
            r.get::<_, i32>(1)?,
            r.get::<_, i32>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, Option<f64>>(4)?,
            r.get::<_, Option<i64>>(5)?,
            r.get::<_, i64>(6)?,
        ))
    })?;
    for row in rows {
        let (iid, hid, step, minutes, sm_max, fb_max, held) = row?;
        let c = slab.entry((iid, hid)).or_default();
        if step >= 0 {
            c.hist.push((step as u8, minutes as u32));
        }
        c.sm_max = max_opt(c.sm_max, sm_max);
        c.fb_max = c.fb_max.max(fb_max.map(|v| v as u64));
        c.held_seconds += held;
    }
    for c in slab.values_mut() {
        c.hist.sort_unstable();
    }
    Ok(slab)
}

/// Seconds held per allocation over `[a, b)` from raw samples (a price change inside a minute).
fn read_raw_held(conn: &Connection, a: i64, b: i64) -> duckdb::Result<Slab> {
    let mut stmt = conn.prepare_cached(
        "SELECT instance_id, holder_id, count(*)::BIGINT FROM samples_raw
         WHERE ts >= ? AND ts < ? AND holder_id <> 0 GROUP BY ALL",
    )?;
    let mut slab = Slab::default();
    for row in stmt.query_map(params![a, b], |r| {
        Ok((
            r.get::<_, i32>(0)?,
            r.get::<_, i32>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })? {
        let (iid, hid, held) = row?;
        slab.entry((iid, hid)).or_default().held_seconds += held;
    }
    Ok(slab)
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The fingerprints of the whole days (`day`) or hours in `[a, b)`.
fn fingerprints(
    conn: &Connection,
    day: bool,
    a: i64,
    b: i64,
) -> duckdb::Result<HashMap<i64, Fingerprint>> {
    let sql = if day {
        "SELECT bucket, sum(samples)::BIGINT, sum(sm_active_samples)::BIGINT, count(*)::BIGINT
         FROM rollup_alloc_1d WHERE bucket >= ? AND bucket < ? GROUP BY bucket"
    } else {
        "SELECT bucket, sum(samples)::BIGINT, sum(sm_active_samples)::BIGINT, count(*)::BIGINT
         FROM rollup_1h WHERE bucket >= ? AND bucket < ? GROUP BY bucket"
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params![a, b], |r| {
        Ok((r.get::<_, i64>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?)))
    })?;
    rows.collect()
}

/// A piece of the range and how to read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// Raw seconds (held time only).
    Raw(i64, i64),
    /// Whole minutes, read each time.
    Minutes(i64, i64),
    /// Whole hours, cached per hour.
    Hours(i64, i64),
    /// Whole days, cached per day.
    Days(i64, i64),
}

/// `[from, to)` cut into raw seconds, minutes, hours and days.
fn pieces(from: i64, to: i64) -> Vec<Piece> {
    let up = |t: i64, w: i64| t.div_euclid(w) * w + if t.rem_euclid(w) == 0 { 0 } else { w };
    let down = |t: i64, w: i64| t.div_euclid(w) * w;
    let (m0, m1) = (up(from, 60), down(to, 60));
    if m0 >= m1 {
        return vec![Piece::Raw(from, to)];
    }
    let (h0, h1) = (up(from, 3600), down(to, 3600));
    let (d0, d1) = (up(from, 86400), down(to, 86400));
    let mut out = vec![Piece::Raw(from, m0)];
    if h0 < h1 {
        out.push(Piece::Minutes(m0, h0));
        if d0 < d1 {
            out.push(Piece::Hours(h0, d0));
            out.push(Piece::Days(d0, d1));
            out.push(Piece::Hours(d1, h1));
        } else {
            out.push(Piece::Hours(h0, h1));
        }
        out.push(Piece::Minutes(h1, m1));
    } else {
        out.push(Piece::Minutes(m0, m1));
    }
    out.push(Piece::Raw(m1, to));
    out.retain(|p| match *p {
        Piece::Raw(a, b) | Piece::Minutes(a, b) | Piece::Hours(a, b) | Piece::Days(a, b) => a < b,
    });
    out
}

/// The slabs that make up `piece`.
fn each_slab(
    conn: &Connection,
    cache: &DemandCache,
    piece: Piece,
    cacheable: bool,
    each: &mut dyn FnMut(&Slab),
) -> duckdb::Result<()> {
    let (day, a, b, width) = match piece {
        Piece::Raw(a, b) => {
            each(&read_raw_held(conn, a, b)?);
            return Ok(());
        }
        Piece::Minutes(a, b) => {
            each(&read_minutes(conn, a, b)?);
            return Ok(());
        }
        Piece::Hours(a, b) => (false, a, b, 3600),
        Piece::Days(a, b) => (true, a, b, 86400),
    };
    let fps = fingerprints(conn, day, a, b)?;
    let mut buckets: Vec<(&i64, &Fingerprint)> = fps.iter().collect();
    buckets.sort_unstable();
    for (&bucket, &fp) in buckets {
        match cache.get(day, bucket, fp) {
            Some(s) => each(&s),
            None => {
                let s = read_minutes(conn, bucket, bucket + width)?;
                each(&s);
                if cacheable {
                    cache.put(day, bucket, fp, std::sync::Arc::new(s));
                }
            }
        }
    }
    Ok(())
}

/// One allocation's sums over the range.
#[derive(Debug, Default)]
struct Alloc {
    held_seconds: i64,
    hist: Vec<u32>,
    sm_max: Option<f64>,
    fb_max: Option<u64>,
}

/// One group's sums.
#[derive(Debug, Default)]
struct Acc {
    instances: HashSet<i32>,
    held_seconds: i64,
    hist: Vec<u64>,
    sm_max: Option<f64>,
    fb_max: Option<u64>,
    slo_class: Option<String>,
    percentile: f64,
    /// Held seconds per price period (by the period's start).
    held_by_period: BTreeMap<i64, i64>,
}

/// Group key: (tenant, workload, gpu_model, profile or `whole`).
type Key = (String, Option<String>, String, String);

/// The nearest-rank percentile `p` of a histogram of `n` values: the step at rank ⌈p·n⌉.
pub fn nearest_rank(hist: &[u64], p: f64) -> Option<usize> {
    let n: u64 = hist.iter().sum();
    if n == 0 {
        return None;
    }
    let rank = ((p * n as f64) - 1e-9).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (step, &count) in hist.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Some(step);
        }
    }
    Some(hist.len() - 1)
}

/// A candidate profile: (name, compute slices, framebuffer bytes).
type Candidate = (String, u32, u64);

/// The smallest profile of `model` holding `slices` and `bytes`: fewest slices, then least
/// framebuffer.
pub fn smallest_fit(model: &mig::GpuModel, slices: f64, bytes: u64) -> Option<Candidate> {
    model
        .profiles
        .iter()
        .filter(|p| f64::from(p.compute_slices) >= slices - 1e-9 && p.fb_bytes >= bytes)
        .min_by_key(|p| (p.compute_slices, p.fb_bytes))
        .map(|p| (p.name.to_owned(), p.compute_slices, p.fb_bytes))
}

/// Computes the rightsizing of `[from, to)` (whole minutes; the caller checks).
pub fn rightsizing(
    conn: &Connection,
    cache: &DemandCache,
    (from, to): (i64, i64),
    settings: &super::Settings,
    raw_from: i64,
    filter: Filter<'_>,
) -> Result<Rightsizing, ShowbackError> {
    let rs = &settings.rightsizing;
    let prices = &settings.prices;
    // A range longer than the cache holds is read through without keeping it: it would push out
    // the days every other answer (and the month's gauge) uses.
    let cacheable = to - from <= DemandCache::MAX_DAYS as i64 * 86_400;
    // Each slab is summed per allocation as it is read, never all kept at once.
    let mut allocations: FxHashMap<(i32, i32), Alloc> = FxHashMap::default();
    let mut fold = |slab: &Slab| {
        for (&id, c) in slab.iter() {
            let a = allocations.entry(id).or_insert_with(|| Alloc {
                hist: vec![0; BINS],
                ..Alloc::default()
            });
            a.held_seconds += c.held_seconds;
            for &(step, n) in &c.hist {
                a.hist[usize::from(step)] += n;
            }
            a.sm_max = max_opt(a.sm_max, c.sm_max);
            a.fb_max = a.fb_max.max(c.fb_max);
        }
    };
    // Held seconds per price period, when the range has more than one.
    let mut by_period: FxHashMap<(i32, i32), Vec<(i64, i64)>> = FxHashMap::default();
    conn.execute_batch("BEGIN TRANSACTION")?;
    let read = (|| -> Result<_, ShowbackError> {
        let dims = Dims::load(conn)?;
        for piece in pieces(from, to) {
            each_slab(conn, cache, piece, cacheable, &mut fold)?;
        }
        let periods = prices.periods(from, to);
        if periods.len() > 1 {
            for (a, b) in periods {
                for piece in pieces(a, b) {
                    if let Piece::Raw(x, y) = piece
                        && x < raw_from
                    {
                        // A price change inside a minute needs that minute's raw seconds.
                        let field = match (x == from, y == to) {
                            (true, _) => "from",
                            (_, true) => "to",
                            _ => "price_book",
                        };
                        return Err(ShowbackError::RawGone { field, raw_from });
                    }
                    each_slab(conn, cache, piece, cacheable, &mut |slab: &Slab| {
                        for (&id, c) in slab.iter() {
                            let v = by_period.entry(id).or_default();
                            match v.last_mut() {
                                Some((s, secs)) if *s == a => *secs += c.held_seconds,
                                _ => v.push((a, c.held_seconds)),
                            }
                        }
                    })?;
                }
            }
        }
        Ok(dims)
    })();
    conn.execute_batch("COMMIT")?;
    let dims = read?;

    let wanted_model = filter.gpu_model.map(|m| mig::model(m).map(|k| k.key));
    let key_of = |iid: i32, hid: i32| -> Option<(Key, Option<&str>)> {
        let h = dims.holders.get(hid)?;
        let tenant = h.tenant.as_deref()?;
        if filter.tenant.is_some_and(|t| t != tenant) {
            return None;
        }
        let i = dims.instances.get(iid)?;
        let model = dims.gpus[i.gpu].gpu_model.as_str();
        if let Some(want) = wanted_model {
            let ok = match (want, filter.gpu_model) {
                (Some(key), _) => mig::model(model).is_some_and(|m| m.key == key),
                (None, Some(name)) => model == name,
                (None, None) => true,
            };
            if !ok {
                return None;
            }
        }
        let profile = i.mig_profile.clone().unwrap_or_else(|| WHOLE.to_owned());
        Some((
            (
                tenant.to_owned(),
                h.workload.clone(),
                model.to_owned(),
                profile,
            ),
            h.slo_class.as_deref(),
        ))
    };
    // Per allocation first (integer keys: a month of a 1,000-GPU fleet is 210,000 day cells,
    // summed above), then each allocation to its group once.
    let mut groups: HashMap<Key, Acc> = HashMap::new();
    for (&(iid, hid), a) in &allocations {
        let Some((key, class)) = key_of(iid, hid) else {
            continue;
        };
        let acc = groups.entry(key).or_insert_with(|| Acc {
            hist: vec![0; BINS],
            ..Acc::default()
        });
        acc.instances.insert(iid);
        acc.held_seconds += a.held_seconds;
        for (sum, &n) in acc.hist.iter_mut().zip(&a.hist) {
            *sum += u64::from(n);
        }
        acc.sm_max = max_opt(acc.sm_max, a.sm_max);
        acc.fb_max = acc.fb_max.max(a.fb_max);
        let p = rs.percentile_of(class);
        if p >= acc.percentile {
            acc.percentile = p;
            acc.slo_class = class.map(str::to_owned);
        }
        match by_period.get(&(iid, hid)) {
            Some(periods) => {
                for &(start, secs) in periods {
                    *acc.held_by_period.entry(start).or_default() += secs;
                }
            }
            None => *acc.held_by_period.entry(from).or_default() += a.held_seconds,
        }
    }

    let mut rows: Vec<Row> = groups
        .into_iter()
        .map(|(key, acc)| row(key, acc, rs, prices, (from, to)))
        .collect();
    rows.sort_by(|a, b| {
        b.savings.cmp(&a.savings).then_with(|| {
            (&a.tenant, &a.workload, &a.gpu_model, &a.mig_profile).cmp(&(
                &b.tenant,
                &b.workload,
                &b.gpu_model,
                &b.mig_profile,
            ))
        })
    });
    let totals = Totals {
        rows: rows.len() as u64,
        recommendations: rows.iter().filter(|r| r.recommendation).count() as u64,
        saturated: rows.iter().filter(|r| r.saturated).count() as u64,
        held_hours: rows.iter().map(|r| r.held_hours).sum(),
        savings: rows.iter().map(|r| r.savings).sum(),
        savings_per_month: rows.iter().map(|r| r.savings_per_month).sum(),
    };
    Ok(Rightsizing {
        from,
        to,
        currency: prices.currency.clone(),
        settings: rs.clone(),
        rows,
        totals,
        next_offset: None,
    })
}

/// One group's row, by the definitions.
fn row(
    (tenant, workload, gpu_model, mig_profile): Key,
    acc: Acc,
    rs: &Settings,
    prices: &super::prices::PriceBook,
    (from, to): (i64, i64),
) -> Row {
    let model = mig::model(&gpu_model);
    let current: Option<(u32, u64)> = model.and_then(|m| {
        if mig_profile == WHOLE {
            Some((SLICES_PER_GPU, m.fb_bytes))
        } else {
            m.profile(&mig_profile)
                .map(|p| (p.compute_slices, p.fb_bytes))
        }
    });
    let slices = current.map_or_else(
        || mig::compute_slices_of(&mig_profile).unwrap_or(SLICES_PER_GPU),
        |c| c.0,
    );
    let measured_minutes: u64 = acc.hist.iter().sum();
    let step = nearest_rank(&acc.hist, acc.percentile);
    let compute_p = step.map(|s| s as f64 / 100.0 * f64::from(slices));
    let compute_max = acc.sm_max.map(|m| m * f64::from(slices));
    let needed_slices = compute_p.map(|c| c * (1.0 + rs.compute_headroom));
    let needed_bytes = compute_p
        .map(|_| (acc.fb_max.unwrap_or(0) as f64 * (1.0 + rs.memory_headroom)).ceil() as u64);
    let fit = match (model, needed_slices, needed_bytes) {
        (Some(m), Some(s), Some(b)) => smallest_fit(m, s, b),
        _ => None,
    };
    // Compute or memory: an instance without SM readings can still be short of memory.
    let saturated = current.is_some_and(|(cs, fb)| {
        compute_p.is_some_and(|c| c >= SATURATION * f64::from(cs))
            || acc
                .fb_max
                .is_some_and(|m| m as f64 >= SATURATION * fb as f64)
    });
    let smaller = match (&fit, current) {
        (Some((_, s, fb)), Some((cs, cfb))) => *s < cs || (*s == cs && *fb < cfb),
        _ => false,
    };
    let enough = measured_minutes as f64 >= rs.min_measured_hours * 60.0 - 1e-9;
    let reason = if current.is_none() {
        Reason::UnknownModel
    } else if !enough || compute_p.is_none() {
        Reason::InsufficientData
    } else if saturated {
        Reason::Saturated
    } else if smaller {
        Reason::SmallerProfileFits
    } else {
        Reason::FitsCurrent
    };
    let recommendation = reason == Reason::SmallerProfileFits;
    let savings_exact: f64 = match (&fit, recommendation) {
        (Some((to_profile, to_slices, _)), true) => acc
            .held_by_period
            .iter()
            .map(|(&start, &seconds)| {
                let per_instance_hour = |profile: &str, s: u32| {
                    let p = (profile != WHOLE).then_some(profile);
                    prices.per_gpu_second(&gpu_model, p, start) * 3600.0 * f64::from(s)
                        / f64::from(SLICES_PER_GPU)
                };
                (per_instance_hour(&mig_profile, slices)
                    - per_instance_hour(to_profile, *to_slices))
                    * seconds as f64
                    / 3600.0
            })
            .sum(),
        _ => 0.0,
    };
    let savings = Money::round(savings_exact);
    let span = (to - from).max(1) as f64;
    Row {
        tenant,
        workload,
        slo_class: acc.slo_class,
        gpu_model,
        mig_profile,
        instances: acc.instances.len() as u64,
        held_hours: acc.held_seconds as f64 / 3600.0,
        measured_minutes,
        percentile: acc.percentile,
        compute_slices: slices,
        framebuffer_bytes: current.map(|c| c.1),
        compute_p,
        compute_max,
        memory_peak_bytes: acc.fb_max,
        needed_slices,
        needed_bytes,
        recommended_profile: fit.map(|f| f.0),
        recommendation,
        saturated,
        reason,
        savings,
        savings_per_month: Money::round(savings_exact * 30.0 * 86400.0 / span),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_takes_the_value_at_rank_ceil_p_n() {
        // 20 values: 19 at step 10, one at step 90. p95 → rank 19 → 10; p = 0.96 → rank 20 → 90.
        let mut h = vec![0u64; BINS];
        h[10] = 19;
        h[90] = 1;
        assert_eq!(nearest_rank(&h, 0.95), Some(10));
        assert_eq!(nearest_rank(&h, 0.96), Some(90));
        assert_eq!(nearest_rank(&h, 1.0), Some(90));
        assert_eq!(nearest_rank(&vec![0; BINS], 0.95), None);
        // 100 values 1..=100: p95 is the 95th.
        let mut h = vec![0u64; BINS];
        for s in 1..=100 {
            h[s] = 1;
        }
        assert_eq!(nearest_rank(&h, 0.95), Some(95));
    }

    #[test]
    fn the_smallest_fit_has_the_fewest_slices_then_the_least_memory() {
        let h100 = mig::model("H100-80GB").unwrap();
        let gib = 1u64 << 30;
        assert_eq!(smallest_fit(h100, 0.5, 5 * gib).unwrap().0, "1g.10gb");
        assert_eq!(smallest_fit(h100, 0.5, 12 * gib).unwrap().0, "1g.20gb");
        assert_eq!(smallest_fit(h100, 1.2, 5 * gib).unwrap().0, "2g.20gb");
        assert_eq!(smallest_fit(h100, 1.0, 0).unwrap().0, "1g.10gb");
        assert_eq!(smallest_fit(h100, 6.9, 0).unwrap().0, "7g.80gb");
        assert!(smallest_fit(h100, 7.5, 0).is_none());
        assert!(smallest_fit(h100, 1.0, 81 * gib).is_none());
    }

    #[test]
    fn ranges_are_cut_into_cacheable_days_and_hours() {
        let d = 86_400;
        assert_eq!(
            pieces(0, 30 * d),
            vec![Piece::Days(0, 30 * d)],
            "a whole month is whole days"
        );
        assert_eq!(
            pieces(d - 120, 2 * d + 3600 + 60),
            vec![
                Piece::Minutes(d - 120, d),
                Piece::Days(d, 2 * d),
                Piece::Hours(2 * d, 2 * d + 3600),
                Piece::Minutes(2 * d + 3600, 2 * d + 3660),
            ]
        );
        assert_eq!(pieces(10, 50), vec![Piece::Raw(10, 50)]);
    }

    #[test]
    fn settings_errors_name_the_key() {
        let mut s = Settings::default();
        assert!(s.check().is_ok());
        s.percentile = 1.5;
        assert!(s.check().unwrap_err().contains("rightsizing.percentile"));
        s = Settings::default();
        s.memory_headroom = -1.0;
        assert!(
            s.check()
                .unwrap_err()
                .contains("rightsizing.memory_headroom")
        );
        s = Settings::default();
        s.classes.insert(
            "latency_critical".into(),
            ClassSettings {
                percentile: Some(0.0),
            },
        );
        assert!(
            s.check()
                .unwrap_err()
                .contains("rightsizing.classes.\"latency_critical\".percentile")
        );
        s.classes.get_mut("latency_critical").unwrap().percentile = Some(0.999);
        assert_eq!(s.percentile_of(Some("latency_critical")), 0.999);
        assert_eq!(s.percentile_of(Some("batch")), DEFAULT_PERCENTILE);
    }
}
