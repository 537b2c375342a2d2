//! Analytics over the ledger: showback (allocated vs used per tenant), idle hoarding episodes and
//! MIG fragmentation. Every definition is in `schema/ANALYTICS.md`; this module says how they
//! are kept current.
//!
//! Key design decision: derived state is recomputed from the data, never updated from events.
//! `rollup_gpu_1h` counts each GPU-hour's observed seconds and instance-seconds; an hour whose
//! counts differ from those its fragmentation was computed from is *dirty*; the writer notes
//! each GPU-hour it changes in `gpu_hours_changed`, and a pass compares only those, so finding
//! the dirty hours costs what changed, not the ledger's age. Each evaluation pass
//! recomputes the dirty GPU-hours' fragmentation and the hoarding episodes of those GPUs (from
//! the minute rollup), so late, re-sent or backfilled data corrects the results, and a restart
//! loses nothing: the pass simply finds the same dirty hours again. A long episode is continued
//! from the totals stored with it rather than read again from its start
//! ([`hoarding::plan`]), so a pass reads about the last hour and a window of minutes.
//!
//! The reading is done on a reader connection, in a few short transactions (snapshots) per pass,
//! each GPU's facts from one of them ([`compute_pass`] says why and why that is exact); the
//! result is written by the one writer ([`crate::store::Writer::apply`]).

pub mod bill;
pub mod budgets;
pub mod energy;
pub mod facts;
pub mod fleet;
pub mod fragmentation;
pub mod geometry;
pub mod hoarding;
pub mod prices;
pub mod rightsizing;
pub mod shares;
pub mod showback;
pub mod trend;

use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;
use std::time::Duration;

use duckdb::{Connection, OptionalExt, params};

use crate::store::query::Readers;
use crate::store::{StoreError, Writer};
use fragmentation::DemandMix;

/// The analytics' knobs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A minute is idle when its mean SM activity is below this (0–1).
    pub idle_threshold: f64,
    /// How long an idle run lasts before it is a hoarding episode.
    pub window: Duration,
    /// How often the evaluation runs.
    pub interval: Duration,
    /// The price book: per GPU-hour per model, per instance-hour per MIG profile, with the
    /// instants they take effect, and the currency.
    pub prices: prices::PriceBook,
    /// The demand mix per model (profile → weight); models not listed use observed allocations.
    pub demand: HashMap<String, HashMap<String, f64>>,
    /// How far back observed allocations count towards the demand mix.
    pub demand_lookback: Duration,
    /// How bills are made: cost mode, overhead, teams, orgs and budgets.
    pub billing: bill::BillingSettings,
    /// How many instances' facts a pass reads in one snapshot at most, after three short ones
    /// (what is dirty, the demand mix, the dimensions): whole GPUs at a time, so one GPU may
    /// take a snapshot past it.
    pub snapshot_instances: usize,
    /// `[rightsizing]`: the percentile, headrooms and minimum data of the recommendations.
    pub rightsizing: rightsizing::Settings,
    /// `[energy]`: carbon intensity, an optional price per kWh, and the split's idle floors.
    pub energy: energy::Settings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            idle_threshold: 0.05,
            window: Duration::from_secs(30 * 60),
            // Reclaim decides after each evaluation: 15 s keeps detection-to-webhook under 30 s
            // (BENCHMARKS.md, "Reclaim latency"), while a pass takes a small part of the interval
            // early and late in the hour, however long the hoarders have been idle
            // (docs/perf/analytics.md, "The evaluation against the hoarders' history" and
            // "Several fleets at once").
            interval: Duration::from_secs(15),
            prices: prices::PriceBook::default(),
            demand: HashMap::new(),
            demand_lookback: Duration::from_secs(7 * 86400),
            billing: bill::BillingSettings::default(),
            // Short snapshots, so that none holds back the WAL for long (docs/perf/analytics.md,
            // "The evaluation read in short snapshots").
            snapshot_instances: 20_000,
            rightsizing: rightsizing::Settings::default(),
            energy: energy::Settings::default(),
        }
    }
}

impl Settings {
    /// The detection window in seconds.
    pub fn window_secs(&self) -> i64 {
        self.window.as_secs() as i64
    }
}

/// The demand mix as of `at`: configured, or allocations observed over the lookback before it.
pub fn demand_mix(conn: &Connection, settings: &Settings, at: i64) -> duckdb::Result<DemandMix> {
    let lookback = settings.demand_lookback.as_secs() as i64;
    DemandMix::observed(conn, at - lookback, at + 3600, &settings.demand)
}

/// What one evaluation did; also the answer of `POST /api/v1/analytics/evaluate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PassReport {
    /// GPU-hours whose fragmentation was recomputed.
    pub gpu_hours: usize,
    /// GPUs whose hoarding episodes were recomputed.
    pub gpus: usize,
    /// Episodes stored for them.
    pub episodes: usize,
    /// Snapshots the passes read in (see [`Settings::snapshot_instances`]).
    pub snapshots: usize,
}

/// GPU-hours handled per pass at most: bounds the memory of a first pass over a long history
/// (the next pass takes the next ones, oldest first).
const HOURS_PER_PASS: usize = 50_000;

/// Runs evaluation passes until no GPU-hour that had changed when the first pass began is dirty
/// (at most `max_passes`). Changes that arrive meanwhile are left to the next evaluation: under
/// a live fleet's ingest every pass finds newly changed hours, and an evaluation that chased
/// them ran pass after pass, holding a core and delaying the metrics and reclaim after it
/// (docs/perf/analytics.md, "Several fleets at once").
pub async fn evaluate(
    readers: &Readers,
    writer: &Writer,
    settings: &Settings,
    max_passes: usize,
) -> Result<PassReport, StoreError> {
    let mut total = PassReport::default();
    // The newest note the first pass's snapshot saw; the later passes look no further.
    let mut until = None;
    for _ in 0..max_passes {
        let conn = readers.connect()?;
        let s = settings.clone();
        let computed = tokio::task::spawn_blocking(move || compute_pass(&conn, &s, until))
            .await
            .map_err(|e| StoreError::Io(format!("the analytics task failed: {e}")))?
            .map_err(StoreError::from_db)?;
        let Some(Pass {
            hours,
            recomputed,
            through,
            snapshots,
        }) = computed
        else {
            break;
        };
        until = until.or(through);
        total.gpu_hours += hours.len();
        total.gpus += recomputed.scans.len();
        total.episodes += recomputed.episodes.len();
        total.snapshots += snapshots;
        writer
            .apply(Box::new(move |tx| {
                fragmentation::store(tx, &hours, through)?;
                hoarding::store(tx, &recomputed)
            }))
            .await?;
    }
    Ok(total)
}

/// What a pass computed, the newest `gpu_hours_changed` note its first snapshot saw, and how
/// many snapshots it read in.
struct Pass {
    hours: Vec<fragmentation::StoredHour>,
    recomputed: hoarding::Recomputed,
    through: Option<i64>,
    snapshots: usize,
}

/// A dirty GPU-hour: (hour, gpu, observed_seconds, instance_seconds) as `rollup_gpu_1h` held them.
type Dirty = (i64, fragmentation::GpuKey, i64, i64);

/// One pass: the oldest dirty GPU-hours (up to a day of them) among those noted up to `until`
/// (every note the first snapshot holds when `None`), their fragmentation, and the hoarding
/// episodes of their GPUs. `None` when nothing is dirty.
///
/// The pass reads in several short snapshots, not one: which hours are dirty and their counts in
/// the first, the demand mix (as of the end of those hours) in the second, the dimensions in the
/// third, then the facts of at most [`Settings::snapshot_instances`] instances in each of the
/// next ones, whole GPUs at a time. DuckDB checkpoints no WAL while a snapshot older than a
/// committed update is open, and the writer's folds update the rollups every few seconds; a
/// single snapshot over four 10,000-GPU fleets stays open for seconds, and the WAL it holds back
/// is checkpointed later in one stall (docs/perf/analytics.md, "The evaluation read in short
/// snapshots").
///
/// Why that is exact: each GPU's results come from one snapshot, at least as new as the first,
/// from all its instances there ([`facts::Selection`]: those the dimensions knew, and any
/// written since) with the dimensions its facts name ([`facts::Dims::load_newer`]). So the
/// counts stored with an hour are never newer than the facts it was computed from, and what was
/// committed after the first snapshot keeps its note (the first snapshot's newest note bounds
/// what [`fragmentation::store`] clears): the next pass finds that hour again.
fn compute_pass(
    conn: &Connection,
    settings: &Settings,
    until: Option<i64>,
) -> duckdb::Result<Option<Pass>> {
    let Some((through, dirty)) = in_snapshot(conn, |c| dirty_hours(c, until))? else {
        return Ok(None);
    };
    let last = dirty.iter().map(|d| d.0).max().unwrap_or(i64::MIN) + 3600;
    let demand = in_snapshot(conn, |c| demand_mix(c, settings, last))?;
    let mut dims = in_snapshot(conn, facts::Dims::load)?;
    let newest = dims.newest_instance().unwrap_or(i32::MIN);
    let chunks = chunks(&dims, dirty, settings.snapshot_instances);
    let mut pass = Pass {
        hours: Vec::new(),
        recomputed: hoarding::Recomputed::default(),
        through,
        snapshots: 3 + chunks.len(),
    };
    for chunk in chunks {
        in_snapshot(conn, |c| {
            dims.load_newer(c)?;
            compute_chunk(c, &dims, &demand, settings, chunk, newest, &mut pass)
        })?;
    }
    Ok(Some(pass))
}

/// Runs `read` inside one read transaction: one snapshot of the ledger.
fn in_snapshot<T>(
    conn: &Connection,
    read: impl FnOnce(&Connection) -> duckdb::Result<T>,
) -> duckdb::Result<T> {
    conn.execute_batch("BEGIN TRANSACTION")?;
    let result = read(conn);
    conn.execute_batch("COMMIT")?;
    result
}

/// A pass's first snapshot: the newest note, and the dirty hours among the notes up to `until`
/// (or that newest one), up to a day of them, oldest first. `None` when nothing is dirty.
fn dirty_hours(
    conn: &Connection,
    until: Option<i64>,
) -> duckdb::Result<Option<(Option<i64>, Vec<Dirty>)>> {
    let through = fragmentation::changed_through(conn)?;
    let Some(until) = until.or(through) else {
        return Ok(None);
    };
    let mut dirty = fragmentation::dirty_hours(conn, HOURS_PER_PASS, until)?;
    let Some(first) = dirty.first().map(|d| d.0) else {
        return Ok(None);
    };
    // A day at a time, oldest first: hoarding runs carry over from one pass to the next.
    dirty.retain(|d| d.0 < first + 86400);
    Ok(Some((through, dirty)))
}

/// The dirty hours of some GPUs, and a range of instance ids that holds every instance of them.
struct Chunk {
    ids: RangeInclusive<i32>,
    dirty: Vec<Dirty>,
}

/// Splits the dirty hours into chunks of whole GPUs (by UUID, as the queries join them) of about
/// `per_chunk` instances, each GPU's instances in `dims` within its chunk's id range. The writer
/// numbers a node's instances together as it first meets them, so GPUs taken in the order of
/// their lowest instance id give chunks whose ranges barely overlap, and DuckDB skips the row
/// groups outside them (the queries keep the chunk's GPUs' rows by a join, so a GPU whose ids
/// are far apart costs time, not exactness). GPUs with no instance in `dims` go in a chunk of
/// their own with an empty range: only instances written since can have facts for them.
fn chunks(dims: &facts::Dims, dirty: Vec<Dirty>, per_chunk: usize) -> Vec<Chunk> {
    // Each GPU's (lowest id, highest id, instances).
    let mut span: HashMap<&str, (i32, i32, usize)> = HashMap::new();
    for (id, i) in dims.instances.iter() {
        let s = span
            .entry(dims.gpus[i.gpu].gpu_uuid.as_str())
            .or_insert((id, id, 0));
        *s = (s.0.min(id), s.1.max(id), s.2 + 1);
    }
    let (mut placed, unplaced): (Vec<_>, Vec<_>) = dirty
        .into_iter()
        .map(|d| (span.get(d.1.gpu_uuid.as_str()).copied(), d))
        .partition(|(s, _)| s.is_some());
    placed.sort_by(|(a, x), (b, y)| (a, &x.1.gpu_uuid, x.0).cmp(&(b, &y.1.gpu_uuid, y.0)));
    let mut out: Vec<Chunk> = Vec::new();
    let mut instances = 0;
    let mut last_gpu: Option<String> = None;
    for (s, d) in placed {
        let (lo, hi, n) = s.expect("partitioned");
        if last_gpu.as_deref() != Some(d.1.gpu_uuid.as_str()) {
            if instances >= per_chunk || out.is_empty() {
                out.push(Chunk {
                    ids: lo..=hi,
                    dirty: Vec::new(),
                });
                instances = 0;
            }
            instances += n;
            last_gpu = Some(d.1.gpu_uuid.clone());
        }
        let c = out.last_mut().expect("pushed");
        c.ids = lo.min(*c.ids.start())..=hi.max(*c.ids.end());
        c.dirty.push(d);
    }
    if !unplaced.is_empty() {
        out.push(Chunk {
            ids: 1..=0,
            dirty: unplaced.into_iter().map(|(_, d)| d).collect(),
        });
    }
    out
}

/// One chunk of a pass, in its own snapshot: the fragmentation of its dirty hours and the
/// hoarding episodes of their GPUs, added to `pass`. `newest`: the newest instance id the pass's
/// dimensions held when the chunks were made; the GPUs' instances written since have ids past it.
fn compute_chunk(
    conn: &Connection,
    dims: &facts::Dims,
    demand: &DemandMix,
    settings: &Settings,
    chunk: Chunk,
    newest: i32,
    pass: &mut Pass,
) -> duckdb::Result<()> {
    let selection = facts::Selection {
        range: chunk.ids,
        newest,
    };
    // Each GPU once (it may have several dirty hours): the join would repeat its rows.
    let uuids: HashSet<&str> = chunk.dirty.iter().map(|d| d.1.gpu_uuid.as_str()).collect();
    facts::choose_gpus(conn, uuids)?;
    let first = chunk.dirty.iter().map(|d| d.0).min().unwrap_or(0);
    let last = chunk.dirty.iter().map(|d| d.0).max().unwrap_or(first) + 3600;
    let wanted: HashSet<(i64, &fragmentation::GpuKey)> =
        chunk.dirty.iter().map(|d| (d.0, &d.1)).collect();
    let mut computed: HashMap<(i64, fragmentation::GpuKey), fragmentation::GpuHour> =
        fragmentation::over_gpus(conn, dims, first, last, demand, Some(&selection))?
            .into_iter()
            .filter(|h| wanted.contains(&(h.bucket, &h.gpu)))
            .map(|h| ((h.bucket, h.gpu.clone()), h))
            .collect();
    let mut gpus: HashMap<String, i64> = HashMap::new();
    for (bucket, gpu, observed, instance) in chunk.dirty {
        let g = gpus.entry(gpu.gpu_uuid.clone()).or_insert(bucket);
        *g = (*g).min(bucket);
        let hour = computed
            .remove(&(bucket, gpu.clone()))
            .unwrap_or(fragmentation::GpuHour {
                bucket,
                gpu,
                observed_seconds: 0,
                free_slice_seconds: 0.0,
                stranded_slice_seconds: 0.0,
            });
        pass.hours.push(fragmentation::StoredHour {
            hour,
            observed_seconds: observed,
            instance_seconds: instance,
        });
    }
    let r = hoarding::recompute(conn, dims, &gpus, settings, &selection)?;
    pass.recomputed.scans.extend(r.scans);
    pass.recomputed.episodes.extend(r.episodes);
    Ok(())
}

/// The figures `/metrics` shows, as of the newest complete minute.
#[derive(Debug, Clone, Default)]
pub struct Current {
    /// The newest second observed in the ledger.
    pub newest: Option<i64>,
    /// The minute they describe.
    pub minute: Option<i64>,
    /// (tenant, slo_class) → (allocated, used) GPU-equivalents over that minute.
    pub tenants: Vec<((String, String), (f64, f64))>,
    /// Open hoarding episodes.
    pub episodes: Vec<OpenEpisode>,
    /// node → (capacity, free, stranded) GPU-equivalents at the newest observed second.
    pub nodes: Vec<(String, (f64, f64, f64))>,
    /// Budgeted tenant → (spent, forecast) of this month's budget ([`budgets::forecast`]); filled
    /// by whoever prices the month (the aggregator's evaluation), empty from [`current`].
    pub budgets: Vec<(String, (f64, f64))>,
    /// Tenant → what its rightsizing recommendations would have saved this month so far
    /// ([`rightsizing::rightsizing`]); filled by the aggregator's evaluation like `budgets`.
    pub savings: Vec<(String, f64)>,
    /// Tenant → (joules, grams CO₂e when an intensity is configured) of its slices this UTC
    /// month so far ([`energy::energy`]); filled by the aggregator's evaluation like `budgets`.
    pub energy: Vec<(String, (f64, Option<f64>))>,
}

/// An open episode, for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenEpisode {
    /// Labels: tenant, workload, node, gpu, gpu_instance, slo_class.
    pub labels: [String; 6],
    /// Seconds since the run started (to its last held second).
    pub idle_seconds: i64,
    /// Its size.
    pub gpu_equivalents: f64,
}

/// Reads [`Current`].
pub fn current(conn: &Connection, settings: &Settings) -> duckdb::Result<Current> {
    // The newest observed second: the small GPU rollup says which hour, the minute masks which
    // second.
    let newest: Option<(i64, u64)> = conn
        .query_row(
            "SELECT bucket, bit_or(seconds_mask) FROM rollup_1m
             WHERE bucket >= (SELECT max(bucket) FROM rollup_gpu_1h)
             GROUP BY bucket ORDER BY bucket DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let mut out = Current::default();
    let Some((bucket, mask)) = newest else {
        return Ok(out);
    };
    let newest = bucket + 63 - i64::from(mask.leading_zeros());
    // The newest complete minute.
    let minute = (newest + 1).div_euclid(60) * 60 - 60;
    out.newest = Some(newest);
    out.minute = Some(minute);
    let mut stmt = conn.prepare_cached(
        "SELECT h.tenant, coalesce(h.slo_class, ''),
                sum(bit_count(r.seconds_mask) * i.gpu_equivalents) / 60,
                sum(r.sm_active_sum * i.gpu_equivalents) / 60
         FROM rollup_1m r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
         WHERE r.bucket = ? AND h.tenant IS NOT NULL
         GROUP BY ALL ORDER BY ALL",
    )?;
    out.tenants = stmt
        .query_map([minute], |r| {
            Ok(((r.get(0)?, r.get(1)?), (r.get(2)?, r.get(3)?)))
        })?
        .collect::<Result<_, _>>()?;
    let mut stmt = conn.prepare_cached(
        "SELECT h.tenant, coalesce(h.workload, ''), i.node, i.gpu_uuid,
                CASE WHEN i.gpu_instance_id < 0 THEN '' ELSE i.gpu_instance_id::VARCHAR END,
                coalesce(h.slo_class, ''), e.last_second + 1 - e.started_at, e.gpu_equivalents
         FROM hoarding_episodes e JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
              LEFT JOIN holder_owners o USING (holder_id)
         WHERE e.ended_at IS NULL ORDER BY ALL",
    )?;
    out.episodes = stmt
        .query_map([], |r| {
            Ok(OpenEpisode {
                labels: [
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ],
                idle_seconds: r.get(6)?,
                gpu_equivalents: r.get(7)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    let demand = demand_mix(conn, settings, newest)?;
    let dims = facts::Dims::load(conn)?;
    let mut nodes: std::collections::BTreeMap<String, (f64, f64, f64)> = Default::default();
    for g in fragmentation::at(conn, &dims, newest, 120, &demand, &mut |_, _| false)? {
        let n = nodes.entry(g.gpu.node.clone()).or_default();
        let slices = f64::from(gpuledger_schema::mig::SLICES_PER_GPU);
        n.0 += 1.0;
        n.1 += f64::from(g.fragmentation.free_slices) / slices;
        n.2 += g.fragmentation.stranded_slices / slices;
    }
    out.nodes = nodes.into_iter().collect();
    Ok(out)
}

/// The hoarding episodes stored, for the API: `state` open/closed/all, overlapping `[from, to)`
/// (an open episode overlaps every range after its start).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EpisodeRow {
    /// Tenant.
    pub tenant: Option<String>,
    /// Workload.
    pub workload: Option<String>,
    /// Node.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// GPU instance id (null: whole GPU).
    pub gpu_instance_id: Option<i32>,
    /// MIG profile (null: whole GPU).
    pub mig_profile: Option<String>,
    /// GPU model.
    pub gpu_model: String,
    /// SLO class.
    pub slo_class: Option<String>,
    /// The run's first held second.
    pub started_at: i64,
    /// started_at + window.
    pub detected_at: i64,
    /// End, or null while open.
    pub ended_at: Option<i64>,
    /// Its last held second so far.
    pub last_second: i64,
    /// Mean SM activity over the measured seconds of the run.
    pub mean_sm_active: Option<f64>,
    /// Size in GPU-equivalents.
    pub gpu_equivalents: f64,
    /// Allocated − used GPU-seconds over the run.
    pub idle_gpu_seconds: f64,
    /// idle × price.
    pub cost: f64,
    /// Whether it ended because its holder became active again (not because the allocation
    /// ended).
    pub resumed: bool,
    /// Who the workload runs for, as its exporter last sent it (a pod's owner label or
    /// annotation, a Slurm job's user).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// What it belongs to, `Kind/name` (`Job/train`, `Account/vision`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_ref: Option<String>,
}

/// The answer of `GET /api/v1/hoarding`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HoardingView {
    /// The idle threshold in force.
    pub idle_threshold: f64,
    /// The detection window in seconds.
    pub window_seconds: i64,
    /// The prices' currency.
    pub currency: String,
    /// The episodes (a page of them).
    pub episodes: Vec<EpisodeRow>,
    /// The cursor of the next page (`after=`); absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Which episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodeState {
    /// ended_at is null (the default).
    #[default]
    Open,
    /// ended_at is set.
    Closed,
    /// Both.
    All,
}

/// Reads stored episodes: all of them (the reclaim pass, Alertmanager), in the order of
/// [`episodes_page`].
pub fn episodes(
    conn: &Connection,
    state: EpisodeState,
    from: i64,
    to: i64,
    tenant: Option<&str>,
    settings: &Settings,
) -> duckdb::Result<Vec<EpisodeRow>> {
    let rows = episode_rows(conn, state, from, to, tenant, settings, None, i64::MAX)?;
    Ok(rows.into_iter().map(|(row, _)| row).collect())
}

/// An episode's place in the lists: its start, then its instance and holder (the table's key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpisodeCursor {
    started_at: i64,
    instance_id: i32,
    holder_id: i32,
}

impl EpisodeCursor {
    /// As text for a URL: `started_at.instance_id.holder_id`.
    pub fn encode(&self) -> String {
        format!(
            "{}.{}.{}",
            self.started_at, self.instance_id, self.holder_id
        )
    }

    /// A cursor from [`EpisodeCursor::encode`]; `None` for anything else.
    pub fn decode(text: &str) -> Option<EpisodeCursor> {
        let mut parts = text.split('.');
        let cursor = EpisodeCursor {
            started_at: parts.next()?.parse().ok()?,
            instance_id: parts.next()?.parse().ok()?,
            holder_id: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(cursor)
    }
}

/// One page of [`episodes`]: at most `limit` after `after`, and the cursor of the next page
/// when there is one. Pages follow the episodes' start, so an episode detected while someone
/// pages lands on the page its start sorts into.
#[allow(clippy::too_many_arguments)]
pub fn episodes_page(
    conn: &Connection,
    state: EpisodeState,
    from: i64,
    to: i64,
    tenant: Option<&str>,
    settings: &Settings,
    after: Option<EpisodeCursor>,
    limit: usize,
) -> duckdb::Result<(Vec<EpisodeRow>, Option<EpisodeCursor>)> {
    let mut rows = episode_rows(
        conn,
        state,
        from,
        to,
        tenant,
        settings,
        after,
        i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1),
    )?;
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|(_, c)| *c)
    } else {
        None
    };
    Ok((rows.into_iter().map(|(row, _)| row).collect(), next))
}

/// The episodes of a state (`'open'`, `'closed'`, `'all'`, bound twice) overlapping `[from, to)`
/// (bound as `to`, `from`) of a tenant (bound twice; null: all): the one selection every episode
/// list and sum reads, so that a list and its totals cannot disagree.
macro_rules! episodes_where {
    () => {
        "
         FROM hoarding_episodes e JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
              LEFT JOIN holder_owners o USING (holder_id)
         WHERE (? = 'all' OR (? = 'open') = (e.ended_at IS NULL))
           AND e.started_at < ? AND coalesce(e.ended_at, 9223372036854775807) > ?
           AND (? IS NULL OR h.tenant = ?)"
    };
}

/// Every episode [`episodes`] would give, one at a time without holding them: its tenant,
/// workload, idle GPU-seconds and idle cost (priced as [`EpisodeRow::cost`]).
fn each_episode(
    conn: &Connection,
    state: EpisodeState,
    (from, to): (i64, i64),
    tenant: Option<&str>,
    settings: &Settings,
    mut f: impl FnMut(Option<String>, Option<String>, f64, f64),
) -> duckdb::Result<()> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT h.tenant, h.workload, i.gpu_model, i.mig_profile, e.started_at,
                    e.idle_gpu_seconds",
        episodes_where!()
    ))?;
    let state = state.as_str();
    let mut rows = stmt.query(params![state, state, to, from, tenant, tenant])?;
    while let Some(r) = rows.next()? {
        let model: String = r.get(2)?;
        let profile: Option<String> = r.get(3)?;
        let idle: f64 = r.get(5)?;
        let price = settings
            .prices
            .per_gpu_second(&model, profile.as_deref(), r.get(4)?);
        f(r.get(0)?, r.get(1)?, idle, idle * price);
    }
    Ok(())
}

/// How many episodes [`episodes`] would give, and their idle cost, without holding them.
pub fn episode_totals(
    conn: &Connection,
    state: EpisodeState,
    from: i64,
    to: i64,
    tenant: Option<&str>,
    settings: &Settings,
) -> duckdb::Result<(u64, f64)> {
    let (mut count, mut cost) = (0u64, 0.0);
    each_episode(conn, state, (from, to), tenant, settings, |_, _, _, c| {
        count += 1;
        cost += c;
    })?;
    Ok((count, cost))
}

/// A tenant's workload's episodes, summed (the Hoarding page's summary).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EpisodeGroup {
    /// Tenant.
    pub tenant: Option<String>,
    /// Workload.
    pub workload: Option<String>,
    /// Its episodes.
    pub episodes: u64,
    /// Σ idle GPU-seconds.
    pub idle_gpu_seconds: f64,
    /// Σ their idle cost (each priced as [`EpisodeRow::cost`]).
    pub cost: f64,
}

/// The episodes [`episodes`] would give, summed per tenant and workload, the costliest first:
/// at most `limit` groups, and how many there are in all.
pub fn episode_groups(
    conn: &Connection,
    state: EpisodeState,
    range: (i64, i64),
    tenant: Option<&str>,
    settings: &Settings,
    limit: usize,
) -> duckdb::Result<(Vec<EpisodeGroup>, usize)> {
    let mut groups: HashMap<(Option<String>, Option<String>), EpisodeGroup> = HashMap::new();
    each_episode(conn, state, range, tenant, settings, |t, w, idle, cost| {
        let g = groups
            .entry((t, w))
            .or_insert_with_key(|(t, w)| EpisodeGroup {
                tenant: t.clone(),
                workload: w.clone(),
                episodes: 0,
                idle_gpu_seconds: 0.0,
                cost: 0.0,
            });
        g.episodes += 1;
        g.idle_gpu_seconds += idle;
        g.cost += cost;
    })?;
    let all = groups.len();
    let mut groups: Vec<EpisodeGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| {
        b.cost
            .total_cmp(&a.cost)
            .then_with(|| (&a.tenant, &a.workload).cmp(&(&b.tenant, &b.workload)))
    });
    groups.truncate(limit);
    Ok((groups, all))
}

impl EpisodeState {
    fn as_str(self) -> &'static str {
        match self {
            EpisodeState::Open => "open",
            EpisodeState::Closed => "closed",
            EpisodeState::All => "all",
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn episode_rows(
    conn: &Connection,
    state: EpisodeState,
    from: i64,
    to: i64,
    tenant: Option<&str>,
    settings: &Settings,
    after: Option<EpisodeCursor>,
    limit: i64,
) -> duckdb::Result<Vec<(EpisodeRow, EpisodeCursor)>> {
    let mut stmt = conn.prepare_cached(concat!(
        "SELECT h.tenant, h.workload, i.node, i.gpu_uuid, i.gpu_instance_id, i.mig_profile,
                i.gpu_model, h.slo_class, e.started_at, e.detected_at, e.ended_at, e.last_second,
                CASE WHEN e.sm_active_samples > 0 THEN e.sm_active_sum / e.sm_active_samples END,
                e.gpu_equivalents, e.idle_gpu_seconds, coalesce(e.resumed, false),
                e.instance_id, e.holder_id, o.owner, o.owner_ref",
        episodes_where!(),
        "
           AND (?::BIGINT IS NULL OR e.started_at > ?
                OR (e.started_at = ? AND (e.instance_id > ?
                    OR (e.instance_id = ? AND e.holder_id > ?))))
         ORDER BY e.started_at, e.instance_id, e.holder_id
         LIMIT ?",
    ))?;
    let state = state.as_str();
    let (s, i, h) = match after {
        Some(c) => (Some(c.started_at), Some(c.instance_id), Some(c.holder_id)),
        None => (None, None, None),
    };
    let rows = stmt.query_map(
        params![
            state, state, to, from, tenant, tenant, s, s, s, i, i, h, limit
        ],
        |r| {
            let gpu_model: String = r.get(6)?;
            let idle: f64 = r.get(14)?;
            let gi: i32 = r.get(4)?;
            let mig_profile: Option<String> = r.get(5)?;
            let started_at: i64 = r.get(8)?;
            let cursor = EpisodeCursor {
                started_at,
                instance_id: r.get(16)?,
                holder_id: r.get(17)?,
            };
            Ok((
                EpisodeRow {
                    tenant: r.get(0)?,
                    workload: r.get(1)?,
                    node: r.get(2)?,
                    gpu_uuid: r.get(3)?,
                    gpu_instance_id: (gi >= 0).then_some(gi),
                    slo_class: r.get(7)?,
                    detected_at: r.get(9)?,
                    ended_at: r.get(10)?,
                    last_second: r.get(11)?,
                    mean_sm_active: r.get(12)?,
                    gpu_equivalents: r.get(13)?,
                    idle_gpu_seconds: idle,
                    // Priced as at the episode's start (a price change during an episode is rare).
                    cost: idle
                        * settings.prices.per_gpu_second(
                            &gpu_model,
                            mig_profile.as_deref(),
                            started_at,
                        ),
                    resumed: r.get(15)?,
                    owner: r.get(18)?,
                    owner_ref: r.get(19)?,
                    gpu_model,
                    mig_profile,
                    started_at,
                },
                cursor,
            ))
        },
    )?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::query::Readers;

    fn gpu(uuid: &str) -> fragmentation::GpuKey {
        fragmentation::GpuKey {
            node: "n".into(),
            gpu_uuid: uuid.into(),
            gpu_model: "H100-80GB".into(),
        }
    }

    /// GPU A has instances 1-3 and 9 (a geometry changed later), B 4-6, C 7-8; D has none.
    fn dims() -> facts::Dims {
        let mut d = facts::Dims::default();
        d.gpus = ["A", "B", "C"].map(gpu).to_vec();
        for (id, g) in [
            (1, 0),
            (2, 0),
            (3, 0),
            (4, 1),
            (5, 1),
            (6, 1),
            (7, 2),
            (8, 2),
            (9, 0),
        ] {
            d.instances.insert(
                id,
                facts::InstanceDim {
                    gpu: g,
                    gpu_instance_id: id,
                    mig_profile: None,
                    placement_start: None,
                    gpu_equivalents: 1.0,
                    model: None,
                },
            );
        }
        d
    }

    /// `minutes` minutes from `t0` of GPU-A's MIG instances `gis` (1g.10gb each, in slots
    /// gi − 1), held by one tenant and busy.
    async fn write(writer: &crate::store::Writer, t0: i64, minutes: i64, gis: &[u32]) {
        use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};
        let mut samples = Vec::new();
        for t in t0..t0 + minutes * 60 {
            for &gi in gis {
                samples.push(Sample {
                    timestamp: t,
                    instance: Instance {
                        node: "n".into(),
                        gpu_uuid: "GPU-A".into(),
                        gpu_model: "NVIDIA H100 80GB HBM3".into(),
                        mig_profile: Some("1g.10gb".into()),
                        gpu_instance_id: Some(gi),
                        placement_start: Some(gi - 1),
                        placement_size: Some(1),
                    },
                    attribution: Attribution {
                        tenant: Some("t".into()),
                        workload: Some("w".into()),
                        slo_class: Some(SloClass::Batch),
                        owner: None,
                        owner_ref: None,
                    },
                    counters: Counters {
                        sm_active: Some(0.5),
                        ..Counters::default()
                    },
                });
            }
        }
        let b = gpuledger_schema::wire::Batch::from_samples("n", &samples);
        let r = writer.try_reserve(b.sample_count()).unwrap();
        writer.ingest(b, i64::MIN, r).await.unwrap();
    }

    /// A GPU given a new instance after a pass read its dimensions: the pass's snapshot of the
    /// GPU's facts reads the new instance's rows too (its id is past the range the chunk was
    /// given), so the hour's fragmentation is that of all the GPU's instances in that snapshot.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_chunk_reads_the_instances_written_after_the_dimensions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.duckdb");
        let (conn, _) = crate::store::open(&path).unwrap();
        let readers = Readers::new(&conn, Some(path)).unwrap();
        let (writer, _thread) =
            crate::store::Writer::spawn(conn, 1_000_000, std::sync::Arc::new(())).unwrap();
        let t0 = 1_767_225_600; // an hour's start
        write(&writer, t0, 10, &[1, 2]).await;
        let reader = readers.connect().unwrap();
        let settings = Settings::default();
        let (through, dirty) = dirty_hours(&reader, None).unwrap().unwrap();
        let demand = demand_mix(&reader, &settings, t0 + 3600).unwrap();
        let mut dims = facts::Dims::load(&reader).unwrap();
        let newest = dims.newest_instance().unwrap();
        // The GPU is reconfigured: a third instance, with an id past the chunk's range.
        write(&writer, t0 + 600, 10, &[1, 2, 3]).await;
        let mut pass = Pass {
            hours: Vec::new(),
            recomputed: hoarding::Recomputed::default(),
            through,
            snapshots: 0,
        };
        for chunk in chunks(&dims, dirty, 20_000) {
            assert_eq!(chunk.ids, 1..=2);
            in_snapshot(&reader, |c| {
                dims.load_newer(c)?;
                compute_chunk(c, &dims, &demand, &settings, chunk, newest, &mut pass)
            })
            .unwrap();
        }
        let all = facts::Dims::load(&reader).unwrap();
        let direct = fragmentation::over_range(&reader, &all, t0, t0 + 3600, &demand).unwrap();
        let [stored] = &pass.hours[..] else {
            panic!("one GPU-hour: {:?}", pass.hours.len());
        };
        assert_eq!(stored.hour, direct[0]);
        // 10 minutes with 5 slices free, 10 with 4.
        assert_eq!(stored.hour.free_slice_seconds, 600.0 * 5.0 + 600.0 * 4.0);
    }

    fn dirty(hour: i64, uuid: &str) -> Dirty {
        (hour, gpu(uuid), 60, 60)
    }

    /// Every GPU's instances are within its chunk's range, whole GPUs go together in the order
    /// of their lowest id, and a GPU without instances gets an empty range.
    #[test]
    fn chunks_hold_whole_gpus_and_every_instance_of_them() {
        let all = || {
            vec![
                dirty(0, "C"),
                dirty(3600, "A"),
                dirty(0, "A"),
                dirty(0, "B"),
                dirty(0, "D"),
            ]
        };
        let described = |per: usize| {
            chunks(&dims(), all(), per)
                .into_iter()
                .map(|c| {
                    let gpus: Vec<String> = c
                        .dirty
                        .iter()
                        .map(|d| format!("{}@{}", d.1.gpu_uuid, d.0))
                        .collect();
                    (c.ids, gpus.join(" "))
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            described(1),
            [
                (1..=9, "A@0 A@3600".to_owned()),
                (4..=6, "B@0".to_owned()),
                (7..=8, "C@0".to_owned()),
                (1..=0, "D@0".to_owned()),
            ]
        );
        // A has 4 instances: B joins it under 5, C starts the next chunk.
        assert_eq!(
            described(5),
            [
                (1..=9, "A@0 A@3600 B@0".to_owned()),
                (7..=8, "C@0".to_owned()),
                (1..=0, "D@0".to_owned()),
            ]
        );
        assert_eq!(
            described(usize::MAX),
            [
                (1..=9, "A@0 A@3600 B@0 C@0".to_owned()),
                (1..=0, "D@0".to_owned()),
            ]
        );
    }
}
