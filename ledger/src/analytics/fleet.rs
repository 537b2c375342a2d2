//! The fleet's MIG layouts and fragmentation as served: every GPU's instances and free slots at
//! an instant with re-geometry advice ([`at_instant`]), or free and stranded capacity summed
//! over a range ([`over_range`]). `GET /api/v1/fragmentation` serialises these values and the
//! Fleet page draws them, so the two cannot disagree. Definitions: `schema/ANALYTICS.md`
//! ("Fragmentation (`GET /api/v1/fragmentation`)").
//!
//! Key decision: an answer stays bounded however large the fleet. Totals (the fleet, each model)
//! cover every GPU the [`GpuFilter`] keeps; the GPUs themselves, their nodes' totals and their
//! advice come a [`GpuPage`] at a time, in [`GpuKey`] order, each page naming the cursor of the
//! next. The order is the GPUs' names, so a cursor stays valid while the fleet changes: a GPU
//! that appears later is on the page its name sorts into.

use std::collections::BTreeMap;

use duckdb::Connection;
use gpuledger_schema::mig::SLICES_PER_GPU;
use serde::Serialize;

use super::fragmentation::{self, DemandMix, GpuHour, GpuKey, InstanceNow};
use super::{Settings, facts};

/// How far back an instant looks for a GPU's latest observed second.
pub const MAX_AGE_SECS: i64 = 120;

/// GPUs on a page when the caller does not say.
pub const DEFAULT_PAGE_GPUS: usize = 100;
/// The most GPUs a page may have: with seven instances and advice each, under 1 MB of JSON.
pub const MAX_PAGE_GPUS: usize = 250;

/// Which GPUs an answer covers: all of them, or those of one node, one model (its key, such as
/// `H100-80GB`, or the name NVML reports), or with an instance one tenant holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFilter {
    /// Only this node.
    pub node: Option<String>,
    /// Only this model.
    pub model: Option<String>,
    /// Only GPUs with an instance this tenant holds (an instant only).
    pub tenant: Option<String>,
}

impl GpuFilter {
    fn keeps_gpu(&self, gpu: &GpuKey) -> bool {
        self.node.as_ref().is_none_or(|n| *n == gpu.node)
            && self.model.as_ref().is_none_or(|m| {
                *m == gpu.gpu_model
                    || gpuledger_schema::mig::model(&gpu.gpu_model).is_some_and(|k| k.key == m)
            })
    }

    fn keeps(&self, gpu: &GpuKey, instances: &[InstanceNow]) -> bool {
        self.keeps_gpu(gpu)
            && self.tenant.as_ref().is_none_or(|t| {
                instances
                    .iter()
                    .any(|i| i.tenant.as_deref() == Some(t.as_str()))
            })
    }
}

/// One page of GPUs: those after the cursor `after`, at most `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPage {
    /// The previous page's last GPU.
    pub after: Option<GpuKey>,
    /// GPUs on the page.
    pub limit: usize,
}

impl Default for GpuPage {
    fn default() -> Self {
        GpuPage {
            after: None,
            limit: DEFAULT_PAGE_GPUS,
        }
    }
}

impl GpuPage {
    fn past_cursor(&self, gpu: &GpuKey) -> bool {
        self.after.as_ref().is_none_or(|a| gpu > a)
    }
}

/// A GPU as a page cursor: its node, UUID and model, hex-encoded (opaque to the caller, safe in
/// a URL); `None` from [`decode_cursor`] when the text is not one.
pub fn encode_cursor(node: &str, gpu_uuid: &str, gpu_model: &str) -> String {
    let text = format!("{node}\n{gpu_uuid}\n{gpu_model}");
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The GPU a cursor from [`encode_cursor`] names.
pub fn decode_cursor(cursor: &str) -> Option<GpuKey> {
    if cursor.len() % 2 != 0 || cursor.len() > 4096 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(cursor.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.split('\n');
    let key = GpuKey {
        node: parts.next()?.to_owned(),
        gpu_uuid: parts.next()?.to_owned(),
        gpu_model: parts.next()?.to_owned(),
    };
    parts.next().is_none().then_some(key)
}

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

/// A model's totals at an instant.
#[derive(Debug, Clone, Serialize)]
pub struct ModelAt {
    /// The model as reported.
    pub gpu_model: String,
    /// GPUs observed.
    pub gpus: u64,
    /// Free capacity in GPUs.
    pub free_gpu_equivalents: f64,
    /// Stranded capacity in GPUs.
    pub stranded_gpu_equivalents: f64,
}

/// `GET /api/v1/fragmentation?at=`.
#[derive(Debug, Clone, Serialize)]
pub struct FragmentationAt {
    /// The instant.
    pub at: i64,
    /// This page of the GPUs the filter keeps, observed within the look-back before the instant.
    pub gpus: Vec<GpuAt>,
    /// The totals of the nodes on this page (over all of each node's GPUs the filter keeps).
    pub nodes: Vec<NodeAt>,
    /// Per model, over every GPU the filter keeps.
    pub models: Vec<ModelAt>,
    /// Over every GPU the filter keeps.
    pub fleet: FleetAt,
    /// The demand mix used.
    pub demand: DemandView,
    /// Re-geometry advice for the GPUs on this page.
    pub advice: Vec<AdviceView>,
    /// The cursor of the next page (`after=`); absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The layouts, fragmentation and advice at `at`: each GPU's latest second observed within
/// `max_age` seconds before it ([`MAX_AGE_SECS`] for "now"); the GPUs `filter` keeps, one `page`
/// of them.
pub fn at_instant(
    conn: &Connection,
    at: i64,
    max_age: i64,
    settings: &Settings,
    filter: &GpuFilter,
    page: &GpuPage,
) -> duckdb::Result<FragmentationAt> {
    let demand = super::demand_mix(conn, settings, at)?;
    let dims = facts::Dims::load(conn)?;
    // Advice only for the page's GPUs: they come in key order, so the first `limit` the filter
    // keeps past the cursor are the page.
    let mut advised = 0;
    let mut advise = |gpu: &GpuKey, instances: &[InstanceNow]| {
        let on_page = advised < page.limit && page.past_cursor(gpu) && filter.keeps(gpu, instances);
        advised += usize::from(on_page);
        on_page
    };
    let found = fragmentation::at(conn, &dims, at, max_age, &demand, &mut advise)?;
    let mut nodes: BTreeMap<String, NodeAt> = BTreeMap::new();
    let mut models: BTreeMap<String, ModelAt> = BTreeMap::new();
    let mut gpus = Vec::new();
    let mut advice = Vec::new();
    let mut more = false;
    for g in found {
        if !filter.keeps(&g.gpu, &g.instances) {
            continue;
        }
        let f = &g.fragmentation;
        let (free, stranded) = (ge(f64::from(f.free_slices)), ge(f.stranded_slices));
        let n = nodes.entry(g.gpu.node.clone()).or_insert_with(|| NodeAt {
            node: g.gpu.node.clone(),
            gpus: 0,
            free_gpu_equivalents: 0.0,
            stranded_gpu_equivalents: 0.0,
        });
        n.gpus += 1;
        n.free_gpu_equivalents += free;
        n.stranded_gpu_equivalents += stranded;
        let m = models
            .entry(g.gpu.gpu_model.clone())
            .or_insert_with(|| ModelAt {
                gpu_model: g.gpu.gpu_model.clone(),
                gpus: 0,
                free_gpu_equivalents: 0.0,
                stranded_gpu_equivalents: 0.0,
            });
        m.gpus += 1;
        m.free_gpu_equivalents += free;
        m.stranded_gpu_equivalents += stranded;
        if !page.past_cursor(&g.gpu) {
            continue;
        }
        if gpus.len() == page.limit {
            more = true;
            continue;
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
                stranded_gpu_equivalents_before: stranded,
                stranded_gpu_equivalents_after: ge(a.stranded_slices_after),
            });
        }
        gpus.push(GpuAt {
            node: g.gpu.node,
            gpu_uuid: g.gpu.gpu_uuid,
            gpu_model: g.gpu.gpu_model,
            observed_at: g.observed_at,
            free_slots: f.free_slots.clone(),
            free_gpu_equivalents: free,
            largest_placeable_profile: f.largest_placeable_profile,
            stranded_gpu_equivalents: stranded,
            instances: g.instances,
        });
    }
    let (count, free, stranded) = models.values().fold((0u64, 0.0, 0.0), |a, m| {
        (
            a.0 + m.gpus,
            a.1 + m.free_gpu_equivalents,
            a.2 + m.stranded_gpu_equivalents,
        )
    });
    let next = gpus
        .last()
        .filter(|_| more)
        .map(|g| encode_cursor(&g.node, &g.gpu_uuid, &g.gpu_model));
    let names: Vec<String> = models.keys().cloned().collect();
    let on_page: Vec<NodeAt> = {
        let mut seen: Vec<&str> = gpus.iter().map(|g| g.node.as_str()).collect();
        seen.dedup();
        seen.iter().filter_map(|n| nodes.get(*n).cloned()).collect()
    };
    Ok(FragmentationAt {
        at,
        gpus,
        nodes: on_page,
        models: models.into_values().collect(),
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
        demand: demand_view(&demand, &names),
        advice,
        next,
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

/// A node, a model, or the fleet, over a range.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CapacityOverRange {
    /// The node (absent for a model and the fleet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The model as reported (absent for a node and the fleet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
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
    /// This page of the GPUs the filter keeps.
    pub gpus: Vec<GpuOverRange>,
    /// The totals of the nodes on this page (over all of each node's GPUs the filter keeps).
    pub nodes: Vec<CapacityOverRange>,
    /// Per model, over every GPU the filter keeps.
    pub models: Vec<CapacityOverRange>,
    /// Over every GPU the filter keeps.
    pub fleet: CapacityOverRange,
    /// The demand mix used.
    pub demand: DemandView,
    /// The cursor of the next page (`after=`); absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Free and stranded capacity per GPU over `[from, to)`: whole hours from `fragmentation_1h`,
/// the edges second by second. Each hour is priced at its own start. The GPUs `filter` keeps
/// (its node and model: a tenant holds no GPU over a range), one `page` of them.
pub fn over_range(
    conn: &Connection,
    from: i64,
    to: i64,
    settings: &Settings,
    filter: &GpuFilter,
    page: &GpuPage,
) -> duckdb::Result<FragmentationOverRange> {
    let (h0, h1) = (
        from + (3600 - from.rem_euclid(3600)) % 3600,
        to - to.rem_euclid(3600),
    );
    // (observed, free slice-s, stranded slice-s, stranded cost)
    let mut per_gpu: BTreeMap<GpuKey, (i64, f64, f64, f64)> = BTreeMap::new();
    let mut add = |h: GpuHour| {
        if !filter.keeps_gpu(&h.gpu) {
            return;
        }
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
    let mut fleet = CapacityOverRange::default();
    let mut nodes: BTreeMap<String, CapacityOverRange> = BTreeMap::new();
    let mut models: BTreeMap<String, CapacityOverRange> = BTreeMap::new();
    let mut gpus: Vec<GpuOverRange> = Vec::new();
    let mut more = false;
    for (g, (observed, free, stranded, cost)) in per_gpu {
        let on_page = page.past_cursor(&g);
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
        models
            .entry(row.gpu_model.clone())
            .or_insert_with(|| CapacityOverRange {
                gpu_model: Some(row.gpu_model.clone()),
                ..CapacityOverRange::default()
            })
            .add(&row);
        if on_page {
            if gpus.len() == page.limit {
                more = true;
            } else {
                gpus.push(row);
            }
        }
    }
    let next = gpus
        .last()
        .filter(|_| more)
        .map(|g| encode_cursor(&g.node, &g.gpu_uuid, &g.gpu_model));
    let names: Vec<String> = models.keys().cloned().collect();
    let mut seen: Vec<&str> = gpus.iter().map(|g| g.node.as_str()).collect();
    seen.dedup();
    let on_page = seen.iter().filter_map(|n| nodes.get(*n).cloned()).collect();
    Ok(FragmentationOverRange {
        from,
        to,
        currency: settings.prices.currency.clone(),
        gpus,
        nodes: on_page,
        models: models.into_values().collect(),
        fleet,
        demand: demand_view(&demand, &names),
        next,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_names_its_gpu_and_nothing_else_is_one() {
        let gpu = GpuKey {
            node: "node a/1".into(),
            gpu_uuid: "GPU-ü".into(),
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
        };
        let c = encode_cursor(&gpu.node, &gpu.gpu_uuid, &gpu.gpu_model);
        assert!(c.bytes().all(|b| b.is_ascii_hexdigit()), "{c}");
        assert_eq!(decode_cursor(&c), Some(gpu));
        for junk in ["", "z", "6e6f6465", "abc", "ff0a0a", &"00".repeat(3000)] {
            assert_eq!(decode_cursor(junk), None, "{junk}");
        }
    }

    #[test]
    fn a_model_filter_takes_the_key_or_the_reported_name() {
        let gpu = GpuKey {
            node: "n".into(),
            gpu_uuid: "GPU-1".into(),
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
        };
        for model in ["H100-80GB", "NVIDIA H100 80GB HBM3"] {
            let f = GpuFilter {
                model: Some(model.into()),
                ..GpuFilter::default()
            };
            assert!(f.keeps_gpu(&gpu), "{model}");
        }
        let other = GpuFilter {
            model: Some("A100-80GB".into()),
            ..GpuFilter::default()
        };
        assert!(!other.keeps_gpu(&gpu));
    }
}
