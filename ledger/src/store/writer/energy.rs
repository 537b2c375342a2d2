//! Measured energy (a batch's `gpus`, migration 0012): each new GPU-second is split among the
//! instance samples of that GPU and second in the same group ([`split_second`]), once, and only
//! the sums are kept, per GPU and per (instance, holder), each per minute, hour and day.
//!
//! Key decision: exactly once by data, as the samples are. `energy_gpu_1m.seconds_mask` holds
//! the GPU-seconds already stored; a second whose bit is set (a re-sent batch, a second batch
//! with the same second) adds nothing. The split needs the second's instance samples, so the
//! wire keeps a GPU's second in the batch of its samples (`schema/WIRE.md`, "Request"): samples
//! of that second in another batch get no energy, which then counts as uncovered (unallocated),
//! never twice.
//!
//! Energy is never held or folded later ([`super::held`]): it is written in the group's own
//! transaction, like the shares.

use std::collections::HashMap;

use duckdb::{Connection, params};
use gpuledger_schema::energy::{Part, Share, split_second};
use gpuledger_schema::wire::Series;

use super::NewBatches;
use super::rollups::Map;

/// The idle floor per GPU model, as configured in the ledger (`energy_idle_watts`), with the
/// documented defaults of the models gpuledger knows.
#[derive(Debug, Clone, Default)]
pub(super) struct IdleWatts(HashMap<String, f64>);

impl IdleWatts {
    /// The configured floors.
    pub(super) fn load(conn: &Connection) -> duckdb::Result<IdleWatts> {
        let mut stmt = conn.prepare("SELECT gpu_model, idle_watts FROM energy_idle_watts")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?)))?;
        Ok(IdleWatts(rows.collect::<duckdb::Result<_>>()?))
    }

    /// The floor of `gpu_model` (an NVML name), in watts.
    fn of(&self, gpu_model: &str) -> f64 {
        let known = gpuledger_schema::mig::model(gpu_model);
        self.0
            .get(gpu_model)
            .or_else(|| known.and_then(|m| self.0.get(m.key).or(self.0.get(m.nvml_name))))
            .copied()
            .or(known.map(|m| m.idle_watts))
            .unwrap_or(0.0)
    }
}

/// Replaces the configured idle floors (the aggregator's `[energy.models]`); the writer reads
/// them when it starts.
pub fn set_idle_watts(conn: &Connection, models: &[(String, f64)]) -> duckdb::Result<()> {
    let tx = conn.unchecked_transaction()?;
    tx.execute("DELETE FROM energy_idle_watts", [])?;
    for (model, watts) in models {
        tx.execute(
            "INSERT INTO energy_idle_watts VALUES (?, ?)",
            params![model, watts],
        )?;
    }
    tx.commit()
}

/// One GPU-minute of the group's new energy.
#[derive(Debug, Default, Clone, Copy)]
struct GpuMinute {
    mask: u64,
    observed: i64,
    energy: f64,
    idle: f64,
    uncovered: f64,
}

/// One (instance, holder, minute) of the group's new energy.
#[derive(Debug, Default, Clone, Copy)]
struct PartMinute {
    seconds: i64,
    idle: f64,
    active: f64,
}

/// Stores the energy of the group's new GPU-seconds, split among the group's samples.
pub(super) fn write_energy(
    tx: &Connection,
    group: NewBatches<'_>,
    idle_watts: &IdleWatts,
) -> duckdb::Result<()> {
    // The group's GPUs, each once, and the minutes its GPU-seconds fall in.
    let mut gpu_index: HashMap<(&str, &str), usize> = HashMap::new();
    let mut gpus: Vec<&Series> = Vec::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for (_, batch, _) in group.iter() {
        for g in &batch.gpus {
            gpu_index
                .entry((g.node.as_str(), g.gpu_uuid.as_str()))
                .or_insert_with(|| {
                    gpus.push(g);
                    gpus.len() - 1
                });
            for &t in &g.t {
                first = first.min(t);
                last = last.max(t);
            }
        }
    }
    if gpus.is_empty() {
        return Ok(());
    }
    let minute = |t: i64| t - t.rem_euclid(60);
    // The seconds of those GPUs already stored.
    let mut minutes: Map<(usize, i64), GpuMinute> = Map::default();
    let mut stored: Map<(usize, i64), u64> = Map::default();
    {
        let mut stmt = tx.prepare(
            "SELECT node, gpu_uuid, bucket, seconds_mask FROM energy_gpu_1m WHERE bucket BETWEEN ? AND ?",
        )?;
        let mut rows = stmt.query(params![minute(first), minute(last)])?;
        while let Some(r) = rows.next()? {
            let (node, uuid): (String, String) = (r.get(0)?, r.get(1)?);
            if let Some(&g) = gpu_index.get(&(node.as_str(), uuid.as_str())) {
                *stored.entry((g, r.get(2)?)).or_insert(0) |= r.get::<_, u64>(3)?;
            }
        }
    }
    // The group's instance samples of those GPUs, per (GPU, second): (instance, holder, part).
    let mut seconds: Map<(usize, i64), Vec<(i32, i32, Part)>> = Map::default();
    for (_, batch, ids) in group.iter() {
        for (s, &(iid, hid)) in batch.series.iter().zip(&ids.series) {
            let Some(&g) = gpu_index.get(&(s.node.as_str(), s.gpu_uuid.as_str())) else {
                continue;
            };
            let slices = s.instance().compute_slices().unwrap_or(0);
            for (j, &t) in s.t.iter().enumerate() {
                let parts = seconds.entry((g, t)).or_default();
                // A sample repeated within the group is one instance's share, taken once.
                if parts.iter().all(|&(i, ..)| i != iid) {
                    let sm_active = s.sm_active.as_ref().and_then(|c| c[j]);
                    parts.push((iid, hid, Part { slices, sm_active }));
                }
            }
        }
    }
    let mut shares: Map<(i32, i32, i64), PartMinute> = Map::default();
    let mut out: Vec<Share> = Vec::new();
    let mut split_parts: Vec<Part> = Vec::new();
    for (_, batch, _) in group.iter() {
        for s in &batch.gpus {
            let g = gpu_index[&(s.node.as_str(), s.gpu_uuid.as_str())];
            let floor = idle_watts.of(&gpus[g].gpu_model);
            for (j, &t) in s.t.iter().enumerate() {
                let Some(e) = s.energy_at(j) else {
                    continue;
                };
                let (bucket, bit) = (minute(t), 1u64 << t.rem_euclid(60));
                let mask = stored.entry((g, bucket)).or_insert(0);
                if *mask & bit != 0 {
                    continue;
                }
                *mask |= bit;
                let parts = seconds.get(&(g, t)).map_or(&[][..], Vec::as_slice);
                split_parts.clear();
                split_parts.extend(parts.iter().map(|&(.., p)| p));
                out.clear();
                out.resize(parts.len(), Share::default());
                let split = split_second(e, floor, &split_parts, &mut out);
                let m = minutes.entry((g, bucket)).or_default();
                m.mask |= bit;
                m.observed += i64::from(!parts.is_empty());
                m.energy += e;
                m.idle += split.idle;
                m.uncovered += split.uncovered;
                for (&(iid, hid, _), share) in parts.iter().zip(&out) {
                    let p = shares.entry((iid, hid, bucket)).or_default();
                    p.seconds += 1;
                    p.idle += share.idle;
                    p.active += share.active;
                }
            }
        }
    }
    if minutes.is_empty() {
        return Ok(());
    }
    {
        let mut app = tx.appender("ingest_energy_gpu")?;
        for (&(g, bucket), m) in &minutes {
            let s = gpus[g];
            app.append_row(params![
                bucket,
                s.node,
                s.gpu_uuid,
                s.gpu_model,
                m.mask,
                m.observed,
                m.energy,
                m.idle,
                m.uncovered
            ])?;
        }
        app.flush()?;
        let mut app = tx.appender("ingest_energy")?;
        for (&(iid, hid, bucket), p) in &shares {
            app.append_row(params![bucket, iid, hid, p.seconds, p.idle, p.active])?;
        }
        app.flush()?;
    }
    static ROLLUP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    tx.execute_batch(ROLLUP.get_or_init(energy_rollup))
}

/// Merges the scratch tables into every energy rollup, then empties them (built once). Each MERGE
/// matches only target rows inside the group's bucket range (as the sample rollups do,
/// [`super::rollups::rollup_statements`]), so that it scans the buckets it can touch, not a
/// table that grows with the fleet's history.
fn energy_rollup() -> String {
    let range = |scratch: &str, width: i64| {
        format!(
            "r.bucket BETWEEN (SELECT min(bucket) - min(bucket) % {width} FROM {scratch})
                          AND (SELECT max(bucket) FROM {scratch})"
        )
    };
    let mut sql = format!(
        "MERGE INTO energy_gpu_1m AS r USING ingest_energy_gpu AS d
         ON r.bucket = d.bucket AND r.node = d.node AND r.gpu_uuid = d.gpu_uuid
            AND {}
         WHEN MATCHED THEN UPDATE SET seconds_mask = r.seconds_mask | d.seconds_mask,
             observed_seconds = r.observed_seconds + d.observed_seconds,
             energy_j = r.energy_j + d.energy_j, idle_j = r.idle_j + d.idle_j,
             uncovered_j = r.uncovered_j + d.uncovered_j
         WHEN NOT MATCHED THEN INSERT BY NAME;
         MERGE INTO energy_1m AS r USING ingest_energy AS d
         ON r.bucket = d.bucket AND r.instance_id = d.instance_id AND r.holder_id = d.holder_id
            AND {}
         WHEN MATCHED THEN UPDATE SET seconds = r.seconds + d.seconds,
             idle_j = r.idle_j + d.idle_j, active_j = r.active_j + d.active_j
         WHEN NOT MATCHED THEN INSERT BY NAME;",
        range("ingest_energy_gpu", 60),
        range("ingest_energy", 60),
    );
    for (table, width) in [("1h", 3600), ("1d", 86400)] {
        sql.push_str(&format!(
            "MERGE INTO energy_gpu_{table} AS r USING (
                 SELECT bucket - bucket % {width} AS bucket, node, gpu_uuid, any_value(gpu_model) AS gpu_model,
                        sum(bit_count(seconds_mask))::BIGINT AS seconds,
                        sum(observed_seconds)::BIGINT AS observed_seconds,
                        sum(energy_j) AS energy_j, sum(idle_j) AS idle_j, sum(uncovered_j) AS uncovered_j
                 FROM ingest_energy_gpu GROUP BY ALL) AS d
             ON r.bucket = d.bucket AND r.node = d.node AND r.gpu_uuid = d.gpu_uuid
                AND {gpu_range}
             WHEN MATCHED THEN UPDATE SET seconds = r.seconds + d.seconds,
                 observed_seconds = r.observed_seconds + d.observed_seconds,
                 energy_j = r.energy_j + d.energy_j, idle_j = r.idle_j + d.idle_j,
                 uncovered_j = r.uncovered_j + d.uncovered_j
             WHEN NOT MATCHED THEN INSERT BY NAME;
             MERGE INTO energy_{table} AS r USING (
                 SELECT bucket - bucket % {width} AS bucket, instance_id, holder_id,
                        sum(seconds)::BIGINT AS seconds, sum(idle_j) AS idle_j, sum(active_j) AS active_j
                 FROM ingest_energy GROUP BY ALL) AS d
             ON r.bucket = d.bucket AND r.instance_id = d.instance_id AND r.holder_id = d.holder_id
                AND {part_range}
             WHEN MATCHED THEN UPDATE SET seconds = r.seconds + d.seconds,
                 idle_j = r.idle_j + d.idle_j, active_j = r.active_j + d.active_j
             WHEN NOT MATCHED THEN INSERT BY NAME;",
            gpu_range = range("ingest_energy_gpu", width),
            part_range = range("ingest_energy", width),
        ));
    }
    sql.push_str("DELETE FROM ingest_energy_gpu; DELETE FROM ingest_energy;");
    sql
}
