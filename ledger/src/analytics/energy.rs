//! Measured energy and carbon per tenant, workload, node or GPU model over whole minutes
//! (definitions: `schema/ANALYTICS.md`, "Energy and carbon").
//!
//! Key decision: the writer split every GPU-second once, as it was stored
//! (`store/writer/energy.rs`), so a report only adds sums: the range is cut into day, hour and
//! minute pieces (as showback's), and each piece again at every change of carbon intensity,
//! and each piece reads the rollup of its width. The fleet's energy is the GPUs' own sums, and
//! `unallocated` is the fleet's minus the rows': the rows and `unallocated` add up to the GPUs'
//! measured energy exactly.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use duckdb::{Connection, params};
use serde::{Deserialize, Serialize};

use super::showback::{Level, pieces};

/// Joules in a kilowatt-hour.
pub const JOULES_PER_KWH: f64 = 3.6e6;

/// `[energy]` in the aggregator's config.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The fleet's carbon intensity, grams of CO₂e per kWh; without it (and without a matching
    /// `carbon_intensity` entry) `co2e_kg` is not reported.
    pub grams_co2e_per_kwh: Option<f64>,
    /// Changes of carbon intensity from an instant on, for every node or the nodes matching a
    /// glob; a period is split at each change, like a price.
    pub carbon_intensity: Vec<CarbonPeriod>,
    /// A price per kWh: reports get an `energy_cost` column. Not added to the GPU bill.
    pub price_per_kwh: Option<f64>,
    /// Per GPU model (its key such as `H100-80GB`, or the NVML name): the split's idle floor.
    pub models: HashMap<String, ModelSettings>,
}

/// `[energy.models."H100-80GB"]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// Board power with nothing running, watts: the idle floor of the split.
    pub idle_watts: f64,
}

/// `[[energy.carbon_intensity]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CarbonPeriod {
    /// From this instant on (RFC 3339).
    pub from: DateTime<Utc>,
    /// Grams of CO₂e per kWh.
    pub grams_per_kwh: f64,
    /// Only the nodes matching this glob (`*`, `?`); an entry with `nodes` wins over one
    /// without for the nodes it matches.
    #[serde(default)]
    pub nodes: Option<String>,
}

impl Settings {
    /// Checks every value; the error names its key.
    pub fn check(&self) -> Result<(), String> {
        let non_negative = |key: String, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{key} = {v} must be a number ≥ 0"))
            }
        };
        if let Some(g) = self.grams_co2e_per_kwh {
            non_negative("energy.grams_co2e_per_kwh".into(), g)?;
        }
        if let Some(p) = self.price_per_kwh {
            non_negative("energy.price_per_kwh".into(), p)?;
        }
        for (i, c) in self.carbon_intensity.iter().enumerate() {
            non_negative(
                format!("energy.carbon_intensity[{i}].grams_per_kwh"),
                c.grams_per_kwh,
            )?;
        }
        for (model, m) in &self.models {
            non_negative(format!("energy.models.{model:?}.idle_watts"), m.idle_watts)?;
        }
        Ok(())
    }

    /// The configured idle floors, as the ledger keeps them (`energy_idle_watts`).
    pub fn idle_watts(&self) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = self
            .models
            .iter()
            .map(|(k, m)| (k.clone(), m.idle_watts))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The carbon intensity of `node` at `t`, g/kWh.
    fn grams_per_kwh(&self, node: &str, t: i64) -> Option<f64> {
        let in_force = |c: &&CarbonPeriod| c.from.timestamp() <= t;
        let latest = |cs: Vec<&CarbonPeriod>| {
            cs.into_iter()
                .max_by_key(|c| c.from)
                .map(|c| c.grams_per_kwh)
        };
        let matching: Vec<&CarbonPeriod> = self
            .carbon_intensity
            .iter()
            .filter(in_force)
            .filter(|c| {
                c.nodes
                    .as_deref()
                    .is_some_and(|g| wildmatch::WildMatch::new(g).matches(node))
            })
            .collect();
        latest(matching)
            .or_else(|| {
                latest(
                    self.carbon_intensity
                        .iter()
                        .filter(in_force)
                        .filter(|c| c.nodes.is_none())
                        .collect(),
                )
            })
            .or(self.grams_co2e_per_kwh)
    }

    /// The instants in `(from, to)` where an intensity changes.
    fn changes(&self, from: i64, to: i64) -> BTreeSet<i64> {
        self.carbon_intensity
            .iter()
            .map(|c| c.from.timestamp())
            .filter(|&t| t > from && t < to)
            .collect()
    }
}

/// What a report is grouped by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// The tenant (the default).
    #[default]
    Tenant,
    /// Tenant and workload.
    Workload,
    /// The node.
    Node,
    /// The GPU model.
    GpuModel,
}

impl GroupBy {
    /// SQL for the two key columns over `instances i` and `holders h` (constants: no input
    /// reaches them).
    fn keys(self) -> (&'static str, &'static str) {
        match self {
            GroupBy::Tenant => ("h.tenant", "NULL"),
            GroupBy::Workload => ("h.tenant", "h.workload"),
            GroupBy::Node => ("i.node", "NULL"),
            GroupBy::GpuModel => ("i.gpu_model", "NULL"),
        }
    }
}

/// One row of a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Row {
    /// The tenant (grouped by tenant or workload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The workload (grouped by workload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// The node (grouped by node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The GPU model (grouped by GPU model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Measured energy, kWh: idle + active.
    pub energy_kwh: f64,
    /// Its part of the GPUs' idle floors.
    pub idle_energy_kwh: f64,
    /// Its part of the energy above the floors.
    pub active_energy_kwh: f64,
    /// kg CO₂e at each node's intensity (`None`: no intensity configured).
    pub co2e_kg: Option<f64>,
    /// `energy_kwh × price_per_kwh`, when a price is configured.
    pub energy_cost: Option<f64>,
}

/// The fleet's figures (not shown to a tenant-scoped reader).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    /// The GPUs' measured energy: Σ rows + `unallocated_energy_kwh`.
    pub energy_kwh: f64,
    /// Energy of slices no tenant held (unheld instances, slices without an instance).
    pub unallocated_energy_kwh: f64,
    /// GPU-seconds with instance samples and no energy reading.
    pub unmeasured_energy_seconds: i64,
    /// The fleet's kg CO₂e.
    pub co2e_kg: Option<f64>,
    /// The fleet's energy cost.
    pub energy_cost: Option<f64>,
}

/// A report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Energy {
    /// Start of the range (Unix seconds, a whole minute).
    pub from: i64,
    /// End of the range (exclusive).
    pub to: i64,
    /// What the rows are grouped by.
    pub group_by: GroupBy,
    /// Rows listed, largest energy first.
    pub rows: Vec<Row>,
    /// Rows in all.
    pub total_rows: usize,
    /// The offset of the next page, when there is one.
    pub next_offset: Option<usize>,
    /// The fleet's figures; `None` for a tenant-scoped reader.
    pub totals: Option<Totals>,
}

impl Energy {
    /// `limit` rows from `offset`.
    pub fn page(mut self, offset: usize, limit: usize) -> Energy {
        let end = offset.saturating_add(limit).min(self.rows.len());
        self.next_offset = (end < self.rows.len()).then_some(end);
        self.rows = self.rows.drain(..).skip(offset).take(limit).collect();
        self
    }
}

/// Sums of one group on one node over one piece, joules.
#[derive(Default, Clone, Copy)]
struct Joules {
    idle: f64,
    active: f64,
}

/// The report over `[from, to)` (whole minutes), grouped by `by`; `tenant`: that tenant's rows
/// only, and no fleet figures.
pub fn energy(
    conn: &Connection,
    (from, to): (i64, i64),
    by: GroupBy,
    tenant: Option<&str>,
    settings: &Settings,
) -> duckdb::Result<Energy> {
    let mut cuts: Vec<i64> = vec![from];
    cuts.extend(settings.changes(from, to));
    cuts.push(to);
    // (key1, key2) → node → joules; and per piece start the node sums for carbon.
    let mut groups: HashMap<(Option<String>, Option<String>), HashMap<String, (Joules, f64)>> =
        HashMap::new();
    let (mut fleet_j, mut fleet_co2, mut unmeasured) = (0.0, 0.0, 0i64);
    let mut any_intensity = false;
    let (k1, k2) = by.keys();
    for w in cuts.windows(2) {
        for (level, a, b) in pieces(w[0], w[1]) {
            let suffix = match level {
                Level::Day => "1d",
                Level::Hour => "1h",
                Level::Minute => "1m",
                Level::Raw => continue,
            };
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {k1}, {k2}, i.node, sum(e.idle_j), sum(e.active_j)
                 FROM energy_{suffix} e JOIN instances i USING (instance_id)
                 JOIN holders h USING (holder_id)
                 WHERE e.bucket >= ? AND e.bucket < ? AND h.tenant IS NOT NULL
                   AND (?::VARCHAR IS NULL OR h.tenant = ?)
                 GROUP BY ALL"
            ))?;
            let mut rows = stmt.query(params![a, b, tenant, tenant])?;
            while let Some(r) = rows.next()? {
                let key = (
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, Option<String>>(1)?,
                );
                let node: String = r.get(2)?;
                let (idle, active): (f64, f64) = (r.get(3)?, r.get(4)?);
                let g = settings.grams_per_kwh(&node, a);
                any_intensity |= g.is_some();
                let entry = groups.entry(key).or_default().entry(node).or_default();
                entry.0.idle += idle;
                entry.0.active += active;
                entry.1 += (idle + active) / JOULES_PER_KWH * g.unwrap_or(0.0) / 1000.0;
            }
            if tenant.is_some() {
                continue;
            }
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT node, sum(energy_j) FROM energy_gpu_{suffix}
                 WHERE bucket >= ? AND bucket < ? GROUP BY node"
            ))?;
            let mut rows = stmt.query(params![a, b])?;
            while let Some(r) = rows.next()? {
                let (node, j): (String, f64) = (r.get(0)?, r.get(1)?);
                let g = settings.grams_per_kwh(&node, a);
                any_intensity |= g.is_some();
                fleet_j += j;
                fleet_co2 += j / JOULES_PER_KWH * g.unwrap_or(0.0) / 1000.0;
            }
            unmeasured += unmeasured_seconds(conn, level, a, b)?;
        }
    }
    let price = settings.price_per_kwh;
    let mut rows: Vec<Row> = groups
        .into_iter()
        .map(|((a, b), nodes)| {
            let (idle, active, co2) = nodes.values().fold((0.0, 0.0, 0.0), |acc, (j, c)| {
                (acc.0 + j.idle, acc.1 + j.active, acc.2 + c)
            });
            let kwh = (idle + active) / JOULES_PER_KWH;
            let mut row = Row {
                energy_kwh: kwh,
                idle_energy_kwh: idle / JOULES_PER_KWH,
                active_energy_kwh: active / JOULES_PER_KWH,
                co2e_kg: any_intensity.then_some(co2),
                energy_cost: price.map(|p| kwh * p),
                ..Row::default()
            };
            match by {
                GroupBy::Tenant => row.tenant = a,
                GroupBy::Workload => (row.tenant, row.workload) = (a, b),
                GroupBy::Node => row.node = a,
                GroupBy::GpuModel => row.gpu_model = a,
            }
            row
        })
        .collect();
    rows.sort_by(|a, b| {
        b.energy_kwh.total_cmp(&a.energy_kwh).then_with(|| {
            (&a.tenant, &a.workload, &a.node, &a.gpu_model).cmp(&(
                &b.tenant,
                &b.workload,
                &b.node,
                &b.gpu_model,
            ))
        })
    });
    let totals = tenant.is_none().then(|| {
        let fleet = fleet_j / JOULES_PER_KWH;
        let held: f64 = rows.iter().map(|r| r.energy_kwh).sum();
        Totals {
            energy_kwh: fleet,
            unallocated_energy_kwh: (fleet - held).max(0.0),
            unmeasured_energy_seconds: unmeasured,
            co2e_kg: any_intensity.then_some(fleet_co2),
            energy_cost: price.map(|p| fleet * p),
        }
    });
    Ok(Energy {
        from,
        to,
        group_by: by,
        total_rows: rows.len(),
        rows,
        next_offset: None,
        totals,
    })
}

/// GPU-seconds of `[a, b)` with instance samples and no stored energy.
fn unmeasured_seconds(conn: &Connection, level: Level, a: i64, b: i64) -> duckdb::Result<i64> {
    let sql = match level {
        Level::Hour | Level::Day => {
            "SELECT coalesce(sum(greatest(0, o.observed_seconds - coalesce(e.observed_seconds, 0))), 0)::BIGINT
             FROM rollup_gpu_1h o LEFT JOIN energy_gpu_1h e USING (bucket, node, gpu_uuid)
             WHERE o.bucket >= ? AND o.bucket < ?"
        }
        Level::Minute => {
            "SELECT coalesce(sum(greatest(0, bit_count(m.mask) - coalesce(e.observed_seconds, 0))), 0)::BIGINT
             FROM (SELECT r.bucket, i.node, i.gpu_uuid, bit_or(r.seconds_mask) AS mask
                   FROM rollup_1m r JOIN instances i USING (instance_id)
                   WHERE r.bucket >= ? AND r.bucket < ? GROUP BY ALL) m
             LEFT JOIN energy_gpu_1m e USING (bucket, node, gpu_uuid)"
        }
        Level::Raw => return Ok(0),
    };
    conn.prepare_cached(sql)?
        .query_row(params![a, b], |r| r.get(0))
}

/// The fleet's (or one tenant's) energy per UTC day over whole hours of `[from, to)`, kWh, zeros
/// included: the overview's and a tenant page's chart.
pub fn daily_kwh(
    conn: &Connection,
    from: i64,
    to: i64,
    tenant: Option<&str>,
) -> duckdb::Result<Vec<(i64, f64)>> {
    let h0 = from + (3600 - from.rem_euclid(3600)) % 3600;
    let h1 = to - to.rem_euclid(3600);
    let mut days: std::collections::BTreeMap<i64, f64> = std::collections::BTreeMap::new();
    let mut d = from.div_euclid(86400) * 86400;
    while d < to {
        days.insert(d, 0.0);
        d += 86400;
    }
    if h0 < h1 {
        let sql = if tenant.is_none() {
            "SELECT bucket // 86400 * 86400, sum(energy_j) FROM energy_gpu_1h
             WHERE bucket >= ? AND bucket < ? AND ?::VARCHAR IS NULL GROUP BY 1"
        } else {
            "SELECT e.bucket // 86400 * 86400, sum(e.idle_j + e.active_j)
             FROM energy_1h e JOIN holders h USING (holder_id)
             WHERE e.bucket >= ? AND e.bucket < ? AND h.tenant = ? GROUP BY 1"
        };
        let mut stmt = conn.prepare_cached(sql)?;
        let mut rows = stmt.query(params![h0, h1, tenant])?;
        while let Some(r) = rows.next()? {
            let (day, j): (i64, f64) = (r.get(0)?, r.get(1)?);
            *days.entry(day).or_default() += j / JOULES_PER_KWH;
        }
    }
    Ok(days.into_iter().collect())
}
