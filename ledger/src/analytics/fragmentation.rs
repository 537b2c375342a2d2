//! MIG fragmentation over time and at an instant, from the minute rollup's seconds masks: the
//! exact set of instances present in every second. The per-GPU arithmetic is in
//! [`super::geometry`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use duckdb::arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use duckdb::{Connection, params};
use gpuledger_schema::mig::{self, SLICES_PER_GPU};

pub use super::facts::GpuKey;
use crate::store::append_columns;

use super::facts::{Dims, InstanceDim, MinuteFact, Selection, for_each_minute_fact};
use super::geometry::{self, Demand, Fragmentation, Present};

/// The demand mix per GPU model: configured, or observed allocations.
#[derive(Debug, Clone, Default)]
pub struct DemandMix {
    /// Request counts (or weights) per model name, per profile name.
    pub counts: HashMap<String, HashMap<String, f64>>,
}

impl DemandMix {
    /// How often each profile of `model` is requested (uniform when nothing is known).
    pub fn for_model(&self, model: &'static mig::GpuModel) -> Demand {
        let counts = self
            .counts
            .get(model.key)
            .or_else(|| self.counts.get(model.nvml_name));
        Demand::from_counts(model, counts.unwrap_or(&HashMap::new()))
    }

    /// Distinct allocations (instance + holder) per model and profile over `[from, to)`, from
    /// the rollups ([`observed_allocations`]). A whole-GPU allocation on a MIG-capable model is a
    /// request for its largest profile. Models in `configured` keep their configured mix.
    pub fn observed(
        conn: &Connection,
        from: i64,
        to: i64,
        configured: &HashMap<String, HashMap<String, f64>>,
    ) -> duckdb::Result<DemandMix> {
        let mut counts: HashMap<String, HashMap<String, f64>> = HashMap::new();
        let rows = observed_allocations(conn, from, to)?;
        for (model_name, profile, n) in rows {
            let Some(model) = mig::model(&model_name) else {
                continue;
            };
            let profile = match profile {
                Some(p) => p,
                None => match model.profiles.last() {
                    Some(p) => p.name.to_owned(),
                    None => continue,
                },
            };
            *counts
                .entry(model.key.to_owned())
                .or_default()
                .entry(profile)
                .or_default() += n as f64;
        }
        for (model, mix) in configured {
            let key = mig::model(model).map_or(model.as_str(), |m| m.key);
            counts.insert(key.to_owned(), mix.clone());
        }
        Ok(DemandMix { counts })
    }
}

/// (model, MIG profile, distinct allocations with a tenant) over `[from, to)`: the allocations
/// that have an hour-rollup row in the range. Whole UTC days inside the range are read from the
/// day rollup and only the hours at either end from the hour rollup: both are folded from the
/// same minute deltas, so an allocation has a row in a day iff it has one in an hour of it, and a
/// week's lookback reads about a fifth of the rows (the count is the same while the rollup
/// retention covers the range, as it does by default).
pub fn observed_allocations(
    conn: &Connection,
    from: i64,
    to: i64,
) -> duckdb::Result<Vec<(String, Option<String>, i64)>> {
    let first_day = from + (86_400 - from.rem_euclid(86_400)) % 86_400;
    let last_day = to - to.rem_euclid(86_400);
    // No whole day in the range: hours only.
    let (days_from, days_to) = if first_day < last_day {
        (first_day, last_day)
    } else {
        (to, to)
    };
    let mut stmt = conn.prepare_cached(
        "SELECT i.gpu_model, i.mig_profile, count(DISTINCT (p.instance_id, p.holder_id))
         FROM (SELECT instance_id, holder_id FROM rollup_alloc_1d
               WHERE bucket >= $3 AND bucket < $4
               UNION ALL
               SELECT instance_id, holder_id FROM rollup_1h
               WHERE bucket >= $1 AND bucket < $2 AND (bucket < $3 OR bucket >= $4)) p
         JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
         WHERE h.tenant IS NOT NULL
         GROUP BY ALL",
    )?;
    let rows = stmt.query_map(params![from, to, days_from, days_to], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })?;
    rows.collect()
}

/// The instance of a fact, as the geometry sees it.
fn present(dims: &Dims, f: &MinuteFact) -> Present {
    let allocated = dims.is_allocated(f.holder_id);
    let Some(i) = dims.instance(f.instance_id) else {
        return Present {
            profile: None,
            start: None,
            slices: SLICES_PER_GPU,
            allocated,
        };
    };
    let slices = match &i.mig_profile {
        None => SLICES_PER_GPU,
        Some(p) => mig::compute_slices_of(p).unwrap_or(SLICES_PER_GPU),
    };
    Present {
        profile: i
            .model
            .zip(i.mig_profile.as_deref())
            .and_then(|(m, p)| m.profile(p)),
        start: i.placement_start.and_then(|s| u32::try_from(s).ok()),
        slices,
        allocated,
    }
}

const MINUTE_ROWS: &str = "
SELECT bucket, instance_id, holder_id, seconds_mask, sm_active_samples, sm_active_sum
FROM rollup_1m WHERE bucket >= ? AND bucket < ?";

/// [`MINUTE_ROWS`] of the GPUs in `temp.chosen_gpus`, among the instances of a [`Selection`].
const CHOSEN_MINUTE_ROWS: &str = "
SELECT r.bucket, r.instance_id, r.holder_id, r.seconds_mask, r.sm_active_samples, r.sm_active_sum
FROM rollup_1m r JOIN instances i USING (instance_id)
JOIN temp.chosen_gpus c ON c.gpu_uuid = i.gpu_uuid
WHERE r.bucket >= ? AND r.bucket < ? AND (r.instance_id BETWEEN ? AND ? OR r.instance_id > ?)";

/// The minute rows of each (GPU, minute): `rows` in (GPU index, bucket, instance, holder) order,
/// and each (GPU index, minute bucket)'s range of them, in that order. One vector for them all:
/// a vector per (GPU, minute) would be 570,000 allocations a pass at 10,000 GPUs late in the hour.
struct Minutes {
    rows: Vec<MinuteFact>,
    groups: Vec<((usize, i64), std::ops::Range<usize>)>,
}

impl Minutes {
    /// Each (GPU index, minute bucket) with its rows.
    fn iter(&self) -> impl Iterator<Item = ((usize, i64), &[MinuteFact])> {
        self.groups
            .iter()
            .map(|(key, range)| (*key, &self.rows[range.clone()]))
    }
}

fn minute_rows(
    conn: &Connection,
    dims: &Dims,
    from: i64,
    to: i64,
    chosen: Option<&Selection>,
) -> duckdb::Result<Minutes> {
    let mut facts: Vec<(usize, MinuteFact)> = Vec::new();
    let mut push = |f: MinuteFact| {
        if let Some(i) = dims.instance(f.instance_id) {
            facts.push((i.gpu, f));
        }
    };
    let from = from.div_euclid(60) * 60;
    match chosen {
        None => for_each_minute_fact(conn, MINUTE_ROWS, params![from, to], &mut push)?,
        Some(s) => {
            let p = params![from, to, s.range.start(), s.range.end(), s.newest];
            for_each_minute_fact(conn, CHOSEN_MINUTE_ROWS, p, &mut push)?
        }
    }
    // Placed by GPU (a counting sort: a GPU's rows are a few hundred of the pass's millions),
    // then each GPU's sorted on their own. One sort of all the rows was a seventh of a pass.
    let mut start = vec![0usize; dims.gpus.len() + 1];
    for (g, _) in &facts {
        start[g + 1] += 1;
    }
    for g in 0..dims.gpus.len() {
        start[g + 1] += start[g];
    }
    let mut next = start.clone();
    let mut rows = vec![MinuteFact::default(); facts.len()];
    for (g, f) in facts {
        rows[next[g]] = f;
        next[g] += 1;
    }
    let mut groups = Vec::new();
    for (g, w) in start.windows(2).enumerate() {
        let gpu_rows = &mut rows[w[0]..w[1]];
        gpu_rows.sort_unstable_by_key(|f| (f.bucket, f.instance_id, f.holder_id));
        let mut first = w[0];
        for k in w[0]..w[1] {
            if k + 1 == w[1] || rows[k + 1].bucket != rows[k].bucket {
                groups.push(((g, rows[k].bucket), first..k + 1));
                first = k + 1;
            }
        }
    }
    Ok(Minutes { rows, groups })
}

/// The bits of minute `bucket` that fall in `[from, to)`.
fn range_mask(bucket: i64, from: i64, to: i64) -> u64 {
    let lo = (from - bucket).clamp(0, 60) as u32;
    let hi = (to - bucket).clamp(0, 60) as u32;
    if hi <= lo {
        0
    } else {
        (((1u128 << hi) - 1) as u64) & !((1u64 << lo) - 1)
    }
}

/// One GPU-hour of fragmentation.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuHour {
    /// The hour's first second.
    pub bucket: i64,
    /// The GPU.
    pub gpu: GpuKey,
    /// Seconds observed (in the range asked).
    pub observed_seconds: i64,
    /// Σ free compute slices over those seconds.
    pub free_slice_seconds: f64,
    /// Σ stranded compute slices over those seconds.
    pub stranded_slice_seconds: f64,
}

/// Fragmentation per GPU-hour over `[from, to)`, second by second: each second's geometry is the
/// set of instances whose mask holds it.
pub fn over_range(
    conn: &Connection,
    dims: &Dims,
    from: i64,
    to: i64,
    demand: &DemandMix,
) -> duckdb::Result<Vec<GpuHour>> {
    over_gpus(conn, dims, from, to, demand, None)
}

/// [`over_range`] for every GPU, or (`chosen`) for the GPUs [`super::facts::choose_gpus`] named
/// in this snapshot, read among the instances of a [`Selection`] that holds all of theirs (an
/// evaluation pass reads its GPUs a few at a time, [`crate::analytics`]).
pub fn over_gpus(
    conn: &Connection,
    dims: &Dims,
    from: i64,
    to: i64,
    demand: &DemandMix,
    chosen: Option<&Selection>,
) -> duckdb::Result<Vec<GpuHour>> {
    let minutes = minute_rows(conn, dims, from, to, chosen)?;
    let mut hours: BTreeMap<(i64, usize), GpuHour> = BTreeMap::new();
    let mut demands: HashMap<&'static str, Demand> = HashMap::new();
    let no_mig = Demand::from_counts(&mig::MODELS[0], &HashMap::new());
    // The last whole minute analysed: its GPU, its rows' (instance, holder) and the result. A
    // GPU's geometry and holders usually stay the same minute after minute, and then so does
    // the analysis, too costly to redo for every minute (docs/perf/analytics.md, "The
    // evaluation's per-row work").
    let mut last: Option<(usize, Vec<(i32, i32)>, Fragmentation)> = None;
    for ((g, bucket), rows) in minutes.iter() {
        let gpu = &dims.gpus[g];
        let model = mig::model(&gpu.gpu_model);
        if let Some(m) = model {
            demands.entry(m.key).or_insert_with(|| demand.for_model(m));
        }
        let d = model.map_or(&no_mig, |m| &demands[m.key]);
        let within = range_mask(bucket, from, to);
        let union = rows.iter().fold(0, |m, r| m | r.mask) & within;
        if union == 0 {
            continue;
        }
        // The same set of instances usually spans the whole minute: analyse each set once.
        let mut seen: HashMap<u64, Fragmentation> = HashMap::new();
        let h = hours
            .entry((bucket - bucket.rem_euclid(3600), g))
            .or_insert_with(|| GpuHour {
                bucket: bucket - bucket.rem_euclid(3600),
                gpu: gpu.clone(),
                observed_seconds: 0,
                free_slice_seconds: 0.0,
                stranded_slice_seconds: 0.0,
            });
        // Usually every instance is there for every second: one geometry for the whole minute.
        if rows.iter().all(|r| r.mask & within == union) {
            let same = last.as_ref().is_some_and(|(lg, ids, _)| {
                *lg == g
                    && ids.len() == rows.len()
                    && ids
                        .iter()
                        .zip(rows)
                        .all(|(&(i, h), r)| (i, h) == (r.instance_id, r.holder_id))
            });
            if !same {
                let here: Vec<Present> = rows.iter().map(|r| present(dims, r)).collect();
                let ids = rows.iter().map(|r| (r.instance_id, r.holder_id)).collect();
                last = Some((g, ids, geometry::analyse(model, &here, d)));
            }
            let f = &last.as_ref().expect("analysed").2;
            let n = union.count_ones();
            h.observed_seconds += i64::from(n);
            h.free_slice_seconds += f64::from(f.free_slices * n);
            h.stranded_slice_seconds += f.stranded_slices * f64::from(n);
            continue;
        }
        let mut bits = union;
        while bits != 0 {
            let s = bits.trailing_zeros();
            bits &= bits - 1;
            let analyse = || {
                let here: Vec<Present> = rows
                    .iter()
                    .filter(|r| r.mask & (1 << s) != 0)
                    .map(|r| present(dims, r))
                    .collect();
                geometry::analyse(model, &here, d)
            };
            let computed;
            let f = if rows.len() <= 64 {
                let subset = rows
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.mask & (1 << s) != 0)
                    .fold(0u64, |m, (k, _)| m | (1 << k));
                &*seen.entry(subset).or_insert_with(analyse)
            } else {
                computed = analyse();
                &computed
            };
            h.observed_seconds += 1;
            h.free_slice_seconds += f64::from(f.free_slices);
            h.stranded_slice_seconds += f.stranded_slices;
        }
    }
    Ok(hours.into_values().collect())
}

/// An instance present on a GPU at an instant.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InstanceNow {
    /// NVML's GPU instance id; null for a whole GPU.
    pub gpu_instance_id: Option<i32>,
    /// The MIG profile; null for a whole GPU.
    pub mig_profile: Option<String>,
    /// First placement slot.
    pub placement_start: Option<i32>,
    /// Its holder; null when nobody holds it.
    pub tenant: Option<String>,
    /// Its workload.
    pub workload: Option<String>,
    /// Its SLO class.
    pub slo_class: Option<String>,
}

/// One GPU's geometry and fragmentation at an instant.
#[derive(Debug, Clone)]
pub struct GpuNow {
    /// The GPU.
    pub gpu: GpuKey,
    /// The second its geometry is from: the latest one observed at or before the instant asked.
    pub observed_at: i64,
    /// Its instances then.
    pub instances: Vec<InstanceNow>,
    /// Free slots, largest placeable profile, stranded capacity.
    pub fragmentation: Fragmentation,
    /// A better geometry, if there is one.
    pub advice: Option<geometry::Advice>,
}

/// Every GPU's geometry at `at`: for each GPU, the latest second at or before `at` (and within
/// `max_age` seconds of it) in which it was observed, in [`GpuKey`] order. GPUs not observed
/// then are left out. `advise` says, GPU by GPU in that order, whether to also search for a
/// better geometry: the costly part, so the API does it only for the GPUs of the page it
/// answers, and the metrics not at all.
pub fn at(
    conn: &Connection,
    dims: &Dims,
    at: i64,
    max_age: i64,
    demand: &DemandMix,
    advise: &mut dyn FnMut(&GpuKey, &[InstanceNow]) -> bool,
) -> duckdb::Result<Vec<GpuNow>> {
    let minutes = minute_rows(conn, dims, at - max_age, at + 1, None)?;
    let mut latest: BTreeMap<&GpuKey, (i64, &[MinuteFact])> = BTreeMap::new();
    for ((g, bucket), rows) in minutes.iter() {
        let gpu = &dims.gpus[g];
        let union =
            rows.iter().fold(0, |m, r| m | r.mask) & range_mask(bucket, at - max_age, at + 1);
        if union == 0 {
            continue;
        }
        let second = bucket + 63 - i64::from(union.leading_zeros());
        if latest.get(gpu).is_none_or(|(t, _)| *t < second) {
            latest.insert(gpu, (second, rows));
        }
    }
    let mut out = Vec::with_capacity(latest.len());
    for (gpu, (second, rows)) in latest {
        let bit = 1u64 << (second.rem_euclid(60));
        let model = mig::model(&gpu.gpu_model);
        let d = match model {
            Some(m) => demand.for_model(m),
            None => Demand::from_counts(&mig::MODELS[0], &HashMap::new()),
        };
        let mut here: Vec<(&MinuteFact, Option<&InstanceDim>)> = rows
            .iter()
            .filter(|r| r.mask & bit != 0)
            .map(|r| (r, dims.instance(r.instance_id)))
            .collect();
        here.sort_by_key(|(r, i)| {
            (
                i.and_then(|i| i.placement_start),
                i.map(|i| i.gpu_instance_id),
                r.instance_id,
            )
        });
        let present: Vec<Present> = here.iter().map(|(r, _)| present(dims, r)).collect();
        let fragmentation = geometry::analyse(model, &present, &d);
        let instances: Vec<InstanceNow> = here
            .iter()
            .map(|(r, i)| {
                let h = dims.holders.get(r.holder_id).cloned().unwrap_or_default();
                InstanceNow {
                    gpu_instance_id: i.map(|i| i.gpu_instance_id).filter(|g| *g >= 0),
                    mig_profile: i.and_then(|i| i.mig_profile.clone()),
                    placement_start: i.and_then(|i| i.placement_start),
                    tenant: h.tenant,
                    workload: h.workload,
                    slo_class: h.slo_class,
                }
            })
            .collect();
        let advice = model
            .filter(|_| advise(gpu, &instances))
            .and_then(|m| geometry::advise(m, &present, &d));
        out.push(GpuNow {
            gpu: gpu.clone(),
            observed_at: second,
            instances,
            fragmentation,
            advice,
        });
    }
    Ok(out)
}

/// The GPU-hours whose counts differ from those their fragmentation was computed from (or that
/// have none), oldest first: (hour, gpu, observed_seconds, instance_seconds) as `rollup_gpu_1h`
/// holds them now. Only the hours the writer noted in `gpu_hours_changed` are looked at
/// (migration 0009), so the cost follows what changed, not the ledger's age; and of those, only
/// the notes up to `seq` `until` (an evaluation's passes handle what had changed when it began).
pub fn dirty_hours(
    conn: &Connection,
    limit: usize,
    until: i64,
) -> duckdb::Result<Vec<(i64, GpuKey, i64, i64)>> {
    let mut stmt = conn.prepare_cached(
        "WITH n AS (SELECT * FROM gpu_hours_changed WHERE seq <= ?),
              c AS (SELECT DISTINCT bucket, node, gpu_uuid, gpu_model FROM n),
              span AS (SELECT min(bucket) AS lo, max(bucket) AS hi FROM n)
         SELECT g.bucket, g.node, g.gpu_uuid, g.gpu_model, g.observed_seconds, g.instance_seconds
         FROM c
         JOIN rollup_gpu_1h g
           ON g.bucket = c.bucket AND g.gpu_uuid = c.gpu_uuid AND g.node = c.node
          AND g.gpu_model = c.gpu_model
          AND g.bucket BETWEEN (SELECT lo FROM span) AND (SELECT hi FROM span)
         LEFT JOIN fragmentation_1h f
           ON f.bucket = g.bucket AND f.gpu_uuid = g.gpu_uuid AND f.node = g.node
          AND f.gpu_model = g.gpu_model
          AND f.bucket BETWEEN (SELECT lo FROM span) AND (SELECT hi FROM span)
         WHERE f.bucket IS NULL OR f.observed_seconds <> g.observed_seconds
            OR f.instance_seconds <> g.instance_seconds
         ORDER BY g.bucket, g.gpu_uuid LIMIT ?",
    )?;
    let rows = stmt.query_map([until, limit as i64], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            GpuKey {
                node: r.get(1)?,
                gpu_uuid: r.get(2)?,
                gpu_model: r.get(3)?,
            },
            r.get::<_, i64>(4)?,
            r.get::<_, i64>(5)?,
        ))
    })?;
    rows.collect()
}

/// The newest `gpu_hours_changed.seq` in the caller's snapshot: what a pass that stores hours
/// from that snapshot may clear ([`store`]).
pub fn changed_through(conn: &Connection) -> duckdb::Result<Option<i64>> {
    conn.query_row("SELECT max(seq) FROM gpu_hours_changed", [], |r| r.get(0))
}

/// A recomputed GPU-hour with the capacity numbers it was computed for.
#[derive(Debug, Clone)]
pub struct StoredHour {
    /// The fragmentation.
    pub hour: GpuHour,
    /// `rollup_gpu_1h.observed_seconds` then.
    pub observed_seconds: i64,
    /// `rollup_gpu_1h.instance_seconds` then.
    pub instance_seconds: i64,
}

/// Replaces the recomputed GPU-hours, in the writer's transaction, and clears their notes in
/// `gpu_hours_changed` up to `through` (what the snapshot they were computed from saw: a change
/// committed since keeps its note, so the next pass finds the hour again).
pub fn store(
    tx: &duckdb::Transaction<'_>,
    hours: &[StoredHour],
    through: Option<i64>,
) -> duckdb::Result<()> {
    if hours.is_empty() {
        return Ok(());
    }
    tx.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS fragmentation_new AS SELECT * FROM fragmentation_1h LIMIT 0;
         DELETE FROM fragmentation_new;",
    )?;
    let strings = |f: fn(&StoredHour) -> &str| {
        Arc::new(StringArray::from_iter_values(hours.iter().map(f))) as ArrayRef
    };
    let i64s = |f: fn(&StoredHour) -> i64| {
        Arc::new(Int64Array::from_iter_values(hours.iter().map(f))) as ArrayRef
    };
    let f64s = |f: fn(&StoredHour) -> f64| {
        Arc::new(Float64Array::from_iter_values(hours.iter().map(f))) as ArrayRef
    };
    append_columns(
        tx,
        "fragmentation_new",
        vec![
            ("bucket", i64s(|h| h.hour.bucket)),
            ("node", strings(|h| &h.hour.gpu.node)),
            ("gpu_uuid", strings(|h| &h.hour.gpu.gpu_uuid)),
            ("gpu_model", strings(|h| &h.hour.gpu.gpu_model)),
            ("observed_seconds", i64s(|h| h.observed_seconds)),
            ("instance_seconds", i64s(|h| h.instance_seconds)),
            ("free_slice_seconds", f64s(|h| h.hour.free_slice_seconds)),
            (
                "stranded_slice_seconds",
                f64s(|h| h.hour.stranded_slice_seconds),
            ),
        ],
    )?;
    tx.execute_batch(
        "DELETE FROM fragmentation_1h WHERE rowid IN (
             SELECT f.rowid FROM fragmentation_1h f JOIN temp.fragmentation_new n
               ON f.bucket = n.bucket AND f.gpu_uuid = n.gpu_uuid AND f.node = n.node
              AND f.gpu_model = n.gpu_model
             WHERE f.bucket BETWEEN (SELECT min(bucket) FROM temp.fragmentation_new)
                                AND (SELECT max(bucket) FROM temp.fragmentation_new));
         INSERT INTO fragmentation_1h SELECT * FROM temp.fragmentation_new;",
    )?;
    tx.execute(
        "DELETE FROM gpu_hours_changed c USING temp.fragmentation_new n
         WHERE c.seq <= ? AND c.bucket = n.bucket AND c.gpu_uuid = n.gpu_uuid
           AND c.node = n.node AND c.gpu_model = n.gpu_model",
        [through.unwrap_or(i64::MIN)],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Arrow path stores every column in `fragmentation_1h`'s order; each value differs from
    /// the others of its type, so a column out of place fails.
    #[test]
    fn stored_hours_read_back_column_by_column() {
        let (conn, _) = crate::store::open(std::path::Path::new(":memory:")).unwrap();
        let hours: Vec<StoredHour> = (1..=2)
            .map(|n: i64| StoredHour {
                hour: GpuHour {
                    bucket: 3600 * n,
                    gpu: GpuKey {
                        node: format!("node-{n}"),
                        gpu_uuid: format!("GPU-{n}"),
                        gpu_model: format!("model-{n}"),
                    },
                    observed_seconds: 0,
                    free_slice_seconds: 0.5 * n as f64,
                    stranded_slice_seconds: 0.25 * n as f64,
                },
                observed_seconds: 7 * n,
                instance_seconds: 11 * n,
            })
            .collect();
        let tx = conn.unchecked_transaction().unwrap();
        store(&tx, &hours, None).unwrap();
        tx.commit().unwrap();
        let mut stmt = conn
            .prepare("SELECT * FROM fragmentation_1h ORDER BY bucket")
            .unwrap();
        type Row = (i64, String, String, String, i64, i64, f64, f64);
        let back: Vec<Row> = stmt
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                ))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let want: Vec<Row> = hours
            .iter()
            .map(|h| {
                (
                    h.hour.bucket,
                    h.hour.gpu.node.clone(),
                    h.hour.gpu.gpu_uuid.clone(),
                    h.hour.gpu.gpu_model.clone(),
                    h.observed_seconds,
                    h.instance_seconds,
                    h.hour.free_slice_seconds,
                    h.hour.stranded_slice_seconds,
                )
            })
            .collect();
        assert_eq!(back, want);
    }

    #[test]
    fn range_masks_cut_minutes_at_the_range_edges() {
        assert_eq!(range_mask(0, 0, 60), (1u64 << 60) - 1);
        assert_eq!(range_mask(60, 0, 60), 0);
        assert_eq!(
            range_mask(0, 10, 20),
            ((1u64 << 20) - 1) & !((1u64 << 10) - 1)
        );
        assert_eq!(range_mask(120, 0, 1_000), (1u64 << 60) - 1);
    }
}
