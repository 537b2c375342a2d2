//! The fleet's MIG layouts and fragmentation as served: every GPU's instances and free slots at
//! an instant with re-geometry advice ([`at_instant`]), or free and stranded capacity summed
//! over a range ([`over_range`]). `GET /api/v1/fragmentation` serialises these values and the
//! Fleet page draws them, so the two cannot disagree. Definitions: `schema/ANALYTICS.md`
//! ("Fragmentation (`GET /api/v1/fragmentation`)").

use std::collections::BTreeMap;

use duckdb::Connection;
use gpuledger_schema::mig::SLICES_PER_GPU;
use serde::Serialize;

use super::fragmentation::{self, DemandMix, GpuHour, GpuKey, InstanceNow};
use super::{Settings, facts};

/// How far back an instant looks for a GPU's latest observed second.
pub const MAX_AGE_SECS: i64 = 120;

fn ge(slices: f64) -> f64 {
    slices / f64::from(SLICES_PER_GPU)
}

/// The demand mix per model key (profile → weight), for the models in the answer.
pub type DemandView = BTreeMap<&'static str, BTreeMap<&'static str, f64>>;

fn demand_view(d: &DemandMix, models: &[String]) -> DemandView {
    models
        .iter()
        .filter_map(|name| gpuledger_schema::mig::model(name))
        .map(|m| (m.key, d.for_model(m).weights().collect()))
        .collect()
}

/// One GPU at an instant.
#[derive(Debug, Clone, Serialize)]
pub struct GpuAt {
    /// Node.
    pub node: String,
    /// UUID.
    pub gpu_uuid: String,
    /// Model as reported.
    pub gpu_model: String,
    /// The second its layout is from.
    pub observed_at: i64,
    /// Placement slots no instance covers.
    pub free_slots: Vec<u32>,
    /// Free capacity in GPUs.
    pub free_gpu_equivalents: f64,
    /// The largest profile a new request could get without re-partitioning.
    pub largest_placeable_profile: Option<&'static str>,
    /// Free capacity the demand mix cannot use, in GPUs.
    pub stranded_gpu_equivalents: f64,
    /// Its instances.
    pub instances: Vec<InstanceNow>,
}

/// A node's totals at an instant.
#[derive(Debug, Clone, Serialize)]
pub struct NodeAt {
    /// Node.
    pub node: String,
    /// GPUs observed.
    pub gpus: u64,
    /// Free capacity in GPUs.
    pub free_gpu_equivalents: f64,
    /// Stranded capacity in GPUs.
    pub stranded_gpu_equivalents: f64,
}

/// The fleet's totals at an instant.
#[derive(Debug, Clone, Serialize)]
pub struct FleetAt {
    /// GPUs observed.
    pub gpus: u64,
    /// Free capacity in GPUs.
    pub free_gpu_equivalents: f64,
    /// Stranded capacity in GPUs.
    pub stranded_gpu_equivalents: f64,
    /// Stranded / GPUs.
    pub stranded_ratio: f64,
}

/// An instance named in advice.
#[derive(Debug, Clone, Serialize)]
pub struct NewInstance {
    /// The profile to create.
    pub mig_profile: &'static str,
    /// Its first slot.
    pub placement_start: u32,
}

/// A better layout for one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct AdviceView {
    /// Node.
    pub node: String,
    /// UUID.
    pub gpu_uuid: String,
    /// Model.
    pub gpu_model: String,
    /// Instances to destroy.
    pub destroy: Vec<InstanceNow>,
    /// Instances to create, unheld.
    pub create: Vec<NewInstance>,
    /// Held instances the change drains.
    pub displaces: Vec<InstanceNow>,
    /// Stranded GPUs now.
    pub stranded_gpu_equivalents_before: f64,
    /// Stranded GPUs after the change.
    pub stranded_gpu_equivalents_after: f64,
}

/// `GET /api/v1/fragmentation?at=`.
#[derive(Debug, Clone, Serialize)]
pub struct FragmentationAt {
    /// The instant.
    pub at: i64,
    /// Every GPU observed within [`MAX_AGE_SECS`] before it.
    pub gpus: Vec<GpuAt>,
    /// Per node.
    pub nodes: Vec<NodeAt>,
    /// The fleet.
    pub fleet: FleetAt,
    /// The demand mix used.
    pub demand: DemandView,
    /// Re-geometry advice.
    pub advice: Vec<AdviceView>,
}

/// The layouts, fragmentation and advice at `at`: each GPU's latest second observed within
/// `max_age` seconds before it ([`MAX_AGE_SECS`] for "now").
pub fn at_instant(
    conn: &Connection,
    at: i64,
    max_age: i64,
    settings: &Settings,
) -> duckdb::Result<FragmentationAt> {
    let demand = super::demand_mix(conn, settings, at)?;
    let dims = facts::Dims::load(conn)?;
    let found = fragmentation::at(conn, &dims, at, max_age, &demand, true)?;
    let mut nodes: BTreeMap<String, NodeAt> = BTreeMap::new();
    let mut models: Vec<String> = Vec::new();
    let mut gpus = Vec::with_capacity(found.len());
    let mut advice = Vec::new();
    for g in found {
        let f = &g.fragmentation;
        let n = nodes.entry(g.gpu.node.clone()).or_insert_with(|| NodeAt {
            node: g.gpu.node.clone(),
            gpus: 0,
            free_gpu_equivalents: 0.0,
            stranded_gpu_equivalents: 0.0,
        });
        n.gpus += 1;
        n.free_gpu_equivalents += ge(f64::from(f.free_slices));
        n.stranded_gpu_equivalents += ge(f.stranded_slices);
        if !models.contains(&g.gpu.gpu_model) {
            models.push(g.gpu.gpu_model.clone());
        }
        if let Some(a) = &g.advice {
            let pick = |ks: &[usize]| ks.iter().map(|&k| g.instances[k].clone()).collect();
            advice.push(AdviceView {
                node: g.gpu.node.clone(),
                gpu_uuid: g.gpu.gpu_uuid.clone(),
                gpu_model: g.gpu.gpu_model.clone(),
                destroy: pick(&a.destroy),
                create: a
                    .create
                    .iter()
                    .map(|&(mig_profile, placement_start)| NewInstance {
                        mig_profile,
                        placement_start,
                    })
                    .collect(),
                displaces: pick(&a.displace),
                stranded_gpu_equivalents_before: ge(f.stranded_slices),
                stranded_gpu_equivalents_after: ge(a.stranded_slices_after),
            });
        }
        gpus.push(GpuAt {
            node: g.gpu.node,
            gpu_uuid: g.gpu.gpu_uuid,
            gpu_model: g.gpu.gpu_model,
            observed_at: g.observed_at,
            free_slots: f.free_slots.clone(),
            free_gpu_equivalents: ge(f64::from(f.free_slices)),
            largest_placeable_profile: f.largest_placeable_profile,
            stranded_gpu_equivalents: ge(f.stranded_slices),
            instances: g.instances,
        });
    }
    let (count, free, stranded) = nodes.values().fold((0u64, 0.0, 0.0), |a, n| {
        (
            a.0 + n.gpus,
            a.1 + n.free_gpu_equivalents,
            a.2 + n.stranded_gpu_equivalents,
        )
    });
    Ok(FragmentationAt {
        at,
        gpus,
        nodes: nodes.into_values().collect(),
        fleet: FleetAt {
            gpus: count,
            free_gpu_equivalents: free,
            stranded_gpu_equivalents: stranded,
            stranded_ratio: if count > 0 {
                stranded / count as f64
            } else {
                0.0
            },
        },
        demand: demand_view(&demand, &models),
        advice,
    })
}

/// The instant a period's layouts are drawn at: its last observed hour's end (or `to`, or now,
/// whichever is first), and how far back from it a GPU's latest second is looked for (that
/// hour and a little), so a past month shows the fleet as it last reported in it. `None`: no
/// GPU reported in the period.
pub fn period_instant(
    conn: &Connection,
    from: i64,
    to: i64,
    now: i64,
) -> duckdb::Result<Option<(i64, i64)>> {
    let newest: Option<i64> = conn.query_row(
        "SELECT max(bucket) FROM rollup_gpu_1h WHERE bucket >= ? AND bucket < ?",
        duckdb::params![from - from.rem_euclid(3600), to],
        |r| r.get(0),
    )?;
    Ok(newest.map(|b| ((b + 3599).min(to - 1).min(now), 3600 + MAX_AGE_SECS)))
}

/// One GPU over a range.
#[derive(Debug, Clone, Serialize)]
pub struct GpuOverRange {
    /// Node.
    pub node: String,
    /// UUID.
    pub gpu_uuid: String,
    /// Model.
    pub gpu_model: String,
    /// Seconds observed.
    pub observed_seconds: i64,
    /// Free GPU-seconds.
    pub free_gpu_seconds: f64,
    /// Stranded GPU-seconds.
    pub stranded_gpu_seconds: f64,
    /// Stranded compute-slice-seconds.
    pub stranded_slice_seconds: f64,
    /// Cost of the stranded capacity.
    pub stranded_cost: f64,
}

/// A node, or the fleet, over a range.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CapacityOverRange {
    /// The node (absent for the fleet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// GPU-seconds observed.
    pub capacity_gpu_seconds: i64,
    /// Free GPU-seconds.
    pub free_gpu_seconds: f64,
    /// Stranded GPU-seconds.
    pub stranded_gpu_seconds: f64,
    /// Their cost.
    pub stranded_cost: f64,
}

impl CapacityOverRange {
    fn add(&mut self, g: &GpuOverRange) {
        self.capacity_gpu_seconds += g.observed_seconds;
        self.free_gpu_seconds += g.free_gpu_seconds;
        self.stranded_gpu_seconds += g.stranded_gpu_seconds;
        self.stranded_cost += g.stranded_cost;
    }
}

/// `GET /api/v1/fragmentation?from=&to=`.
#[derive(Debug, Clone, Serialize)]
pub struct FragmentationOverRange {
    /// Range start.
    pub from: i64,
    /// Range end.
    pub to: i64,
    /// The currency of the costs.
    pub currency: String,
    /// Per GPU.
    pub gpus: Vec<GpuOverRange>,
    /// Per node.
    pub nodes: Vec<CapacityOverRange>,
    /// The fleet.
    pub fleet: CapacityOverRange,
    /// The demand mix used.
    pub demand: DemandView,
}

/// Free and stranded capacity per GPU over `[from, to)`: whole hours from `fragmentation_1h`,
/// the edges second by second. Each hour is priced at its own start.
pub fn over_range(
    conn: &Connection,
    from: i64,
    to: i64,
    settings: &Settings,
) -> duckdb::Result<FragmentationOverRange> {
    let (h0, h1) = (
        from + (3600 - from.rem_euclid(3600)) % 3600,
        to - to.rem_euclid(3600),
    );
    // (observed, free slice-s, stranded slice-s, stranded cost)
    let mut per_gpu: BTreeMap<GpuKey, (i64, f64, f64, f64)> = BTreeMap::new();
    let mut add = |h: GpuHour| {
        let price = settings
            .prices
            .per_gpu_second(&h.gpu.gpu_model, None, h.bucket);
        let e = per_gpu.entry(h.gpu).or_default();
        e.0 += h.observed_seconds;
        e.1 += h.free_slice_seconds;
        e.2 += h.stranded_slice_seconds;
        e.3 += ge(h.stranded_slice_seconds) * price;
    };
    let demand = super::demand_mix(conn, settings, to)?;
    let dims = facts::Dims::load(conn)?;
    let mut edges = vec![(from, to)];
    if h0 < h1 {
        edges = vec![(from, h0), (h1, to)];
        let mut stmt = conn.prepare_cached(
            "SELECT bucket, node, gpu_uuid, gpu_model, sum(observed_seconds)::BIGINT,
                    sum(free_slice_seconds), sum(stranded_slice_seconds)
             FROM fragmentation_1h WHERE bucket >= ? AND bucket < ? GROUP BY ALL",
        )?;
        let rows = stmt.query_map(duckdb::params![h0, h1], |r| {
            Ok(GpuHour {
                bucket: r.get(0)?,
                gpu: GpuKey {
                    node: r.get(1)?,
                    gpu_uuid: r.get(2)?,
                    gpu_model: r.get(3)?,
                },
                observed_seconds: r.get(4)?,
                free_slice_seconds: r.get(5)?,
                stranded_slice_seconds: r.get(6)?,
            })
        })?;
        for row in rows {
            add(row?);
        }
    }
    for (a, b) in edges {
        if a < b {
            fragmentation::over_range(conn, &dims, a, b, &demand)?
                .into_iter()
                .for_each(&mut add);
        }
    }
    let mut models: Vec<String> = Vec::new();
    let mut fleet = CapacityOverRange::default();
    let mut nodes: BTreeMap<String, CapacityOverRange> = BTreeMap::new();
    let gpus: Vec<GpuOverRange> = per_gpu
        .into_iter()
        .map(|(g, (observed, free, stranded, cost))| {
            if !models.contains(&g.gpu_model) {
                models.push(g.gpu_model.clone());
            }
            let row = GpuOverRange {
                node: g.node,
                gpu_uuid: g.gpu_uuid,
                gpu_model: g.gpu_model,
                observed_seconds: observed,
                free_gpu_seconds: ge(free),
                stranded_gpu_seconds: ge(stranded),
                stranded_slice_seconds: stranded,
                stranded_cost: cost,
            };
            fleet.add(&row);
            nodes
                .entry(row.node.clone())
                .or_insert_with(|| CapacityOverRange {
                    node: Some(row.node.clone()),
                    ..CapacityOverRange::default()
                })
                .add(&row);
            row
        })
        .collect();
    Ok(FragmentationOverRange {
        from,
        to,
        currency: settings.prices.currency.clone(),
        gpus,
        nodes: nodes.into_values().collect(),
        fleet,
        demand: demand_view(&demand, &models),
    })
}
