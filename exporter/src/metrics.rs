//! The exporter's `/metrics`: one series per instance per counter, and the exporter's own health.
//!
//! Names follow `gpuledger_<subsystem>_<name>_<unit>` (see docs/metrics.md, "Exporter metrics",
//! which a test keeps in step with this file). Instance series carry the labels `node`, `gpu_uuid`,
//! `gpu_model`, `mig_profile`, `gpu_instance_id`, `tenant`, `workload`, `slo_class` (empty when not
//! applicable; Prometheus drops empty labels). A series disappears the second its instance, its
//! allocation or its measurement goes away.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use gpuledger_schema::exposition::Format;

use crate::source::{CollectorOutcome, GpuReading, Reading};

type Ratio = Gauge<f64, AtomicU64>;

/// Labels of a per-instance series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// NVML product name.
    pub gpu_model: String,
    /// MIG profile, empty for a whole GPU.
    pub mig_profile: String,
    /// GPU instance id, empty for a whole GPU.
    pub gpu_instance_id: String,
    /// Tenant, empty when unallocated.
    pub tenant: String,
    /// Workload.
    pub workload: String,
    /// SLO class.
    pub slo_class: String,
}

impl InstanceLabels {
    fn of(r: &Reading) -> Self {
        Self::from_parts(&r.instance, &r.attribution)
    }

    fn from_parts(i: &gpuledger_schema::Instance, a: &gpuledger_schema::Attribution) -> Self {
        InstanceLabels {
            node: i.node.clone(),
            gpu_uuid: i.gpu_uuid.clone(),
            gpu_model: i.gpu_model.clone(),
            mig_profile: i.mig_profile.clone().unwrap_or_default(),
            gpu_instance_id: i.gpu_instance_id.map(|g| g.to_string()).unwrap_or_default(),
            tenant: a.tenant.clone().unwrap_or_default(),
            workload: a.workload.clone().unwrap_or_default(),
            slo_class: a.slo_class.map(|c| c.to_string()).unwrap_or_default(),
        }
    }
}

/// Labels of a per-GPU series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// NVML product name.
    pub gpu_model: String,
}

/// Labels of a GPU's energy source: which of counter, power, trace or model.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EnergySourceLabels {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// NVML product name.
    pub gpu_model: String,
    /// `counter`, `power`, `trace` or `model`.
    pub source: String,
}

/// A family whose series are replaced wholesale every second: series not set in a round are
/// removed at its end.
struct Tracked<L, M> {
    family: Family<L, M>,
    present: HashSet<L>,
    seen: HashSet<L>,
}

impl<
    L: Clone + Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    M: Default
        + prometheus_client::metrics::TypedMetric
        + prometheus_client::encoding::EncodeMetric
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
> Tracked<L, M>
{
    fn register(registry: &mut Registry, name: &str, help: &str, unit: Option<Unit>) -> Self {
        let family = Family::<L, M>::default();
        match unit {
            Some(unit) => registry.register_with_unit(name, help, unit, family.clone()),
            None => registry.register(name, help, family.clone()),
        }
        Tracked {
            family,
            present: HashSet::new(),
            seen: HashSet::new(),
        }
    }

    fn with(&mut self, labels: &L, f: impl FnOnce(&M)) {
        f(&self.family.get_or_create(labels));
        self.seen.insert(labels.clone());
    }

    fn end_round(&mut self) {
        for stale in self.present.difference(&self.seen) {
            self.family.remove(stale);
        }
        std::mem::swap(&mut self.present, &mut self.seen);
        self.seen.clear();
    }
}

/// Per-instance and per-GPU series.
pub struct InstanceMetrics {
    registry: Registry,
    sm_active: Tracked<InstanceLabels, Ratio>,
    sm_occupancy: Tracked<InstanceLabels, Ratio>,
    tensor_active: Tracked<InstanceLabels, Ratio>,
    dram_active: Tracked<InstanceLabels, Ratio>,
    fb_used: Tracked<InstanceLabels, Gauge>,
    fb_total: Tracked<InstanceLabels, Gauge>,
    nvlink_tx: Tracked<InstanceLabels, Counter>,
    nvlink_rx: Tracked<InstanceLabels, Counter>,
    gpu_equivalents: Tracked<InstanceLabels, Ratio>,
    power: Tracked<GpuLabels, Ratio>,
    energy: Tracked<GpuLabels, Counter<f64, AtomicU64>>,
    energy_source: Tracked<EnergySourceLabels, Gauge>,
    share_memory: Tracked<InstanceLabels, Gauge>,
    share_sm_active: Tracked<InstanceLabels, Ratio>,
    share_processes: Tracked<InstanceLabels, Gauge>,
}

impl Default for InstanceMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl InstanceMetrics {
    /// Registers every instance family.
    pub fn new() -> Self {
        let mut r = Registry::default();
        let ratio = Some(Unit::Other("ratio".into()));
        let bytes = Some(Unit::Bytes);
        InstanceMetrics {
            sm_active: Tracked::register(
                &mut r,
                "gpuledger_instance_sm_active",
                "Fraction of time at least one warp was resident on an SM during the last second, averaged over the instance's SMs (DCGM SM_ACTIVE, NVML GPM SM_UTIL)",
                ratio.clone(),
            ),
            sm_occupancy: Tracked::register(
                &mut r,
                "gpuledger_instance_sm_occupancy",
                "Resident warps over the SMs' maximum during the last second (GPM SM_OCCUPANCY)",
                ratio.clone(),
            ),
            tensor_active: Tracked::register(
                &mut r,
                "gpuledger_instance_tensor_active",
                "Fraction of cycles any tensor pipe was active during the last second (GPM ANY_TENSOR_UTIL)",
                ratio.clone(),
            ),
            dram_active: Tracked::register(
                &mut r,
                "gpuledger_instance_dram_active",
                "Fraction of cycles the DRAM interface was busy during the last second (GPM DRAM_BW_UTIL)",
                ratio.clone(),
            ),
            fb_used: Tracked::register(
                &mut r,
                "gpuledger_instance_fb_used",
                "Framebuffer (HBM) bytes in use on the instance",
                bytes.clone(),
            ),
            fb_total: Tracked::register(
                &mut r,
                "gpuledger_instance_fb_total",
                "Framebuffer (HBM) bytes of the instance",
                bytes.clone(),
            ),
            nvlink_tx: Tracked::register(
                &mut r,
                "gpuledger_instance_nvlink_transmit",
                "NVLink bytes transmitted by a whole GPU (MIG instances do no NVLink P2P)",
                bytes.clone(),
            ),
            nvlink_rx: Tracked::register(
                &mut r,
                "gpuledger_instance_nvlink_receive",
                "NVLink bytes received by a whole GPU",
                bytes,
            ),
            gpu_equivalents: Tracked::register(
                &mut r,
                "gpuledger_instance_gpu_equivalents",
                "Size of the instance in GPUs: compute slices / 7, a whole GPU is 1",
                None,
            ),
            power: Tracked::register(
                &mut r,
                "gpuledger_gpu_power",
                "Board power draw of the physical GPU",
                Some(Unit::Other("watts".into())),
            ),
            energy: Tracked::register(
                &mut r,
                "gpuledger_gpu_energy",
                "Energy the physical GPU used: NVML's total-energy counter's differences, or board power × interval where it has none (gpuledger_gpu_energy_source says which)",
                Some(Unit::Other("joules".into())),
            ),
            energy_source: Tracked::register(
                &mut r,
                "gpuledger_gpu_energy_source",
                "Where the GPU's energy comes from: 1 for its source (counter, power, trace or model)",
                None,
            ),
            share_memory: Tracked::register(
                &mut r,
                "gpuledger_share_memory_used",
                "Framebuffer bytes the processes of one owner hold on a shared instance (NVML per-process memory, exact); tenant empty when the owner cannot be named",
                Some(Unit::Bytes),
            ),
            share_sm_active: Tracked::register(
                &mut r,
                "gpuledger_share_sm_active",
                "One owner's part of a shared instance's SM activity, split by NVML per-process SM utilisation; absent when not attributable",
                Some(Unit::Other("ratio".into())),
            ),
            share_processes: Tracked::register(
                &mut r,
                "gpuledger_share_processes",
                "Compute processes of one owner on an instance",
                None,
            ),
            registry: r,
        }
    }

    /// Replaces the series with one second's readings.
    pub fn update(&mut self, readings: &[Reading], gpus: &[GpuReading]) {
        for r in readings {
            let l = InstanceLabels::of(r);
            let c = &r.counters;
            for (family, value) in [
                (&mut self.sm_active, c.sm_active),
                (&mut self.sm_occupancy, c.sm_occupancy),
                (&mut self.tensor_active, c.tensor_active),
                (&mut self.dram_active, c.dram_active),
                (&mut self.gpu_equivalents, r.instance.gpu_equivalents()),
            ] {
                if let Some(v) = value {
                    family.with(&l, |g| {
                        g.set(v);
                    });
                }
            }
            for (family, value) in [
                (&mut self.fb_used, c.fb_used_bytes),
                (&mut self.fb_total, c.fb_total_bytes),
            ] {
                if let Some(v) = value {
                    family.with(&l, |g| {
                        g.set(i64::try_from(v).unwrap_or(i64::MAX));
                    });
                }
            }
            for (family, value) in [
                (&mut self.nvlink_tx, c.nvlink_tx_bytes),
                (&mut self.nvlink_rx, c.nvlink_rx_bytes),
            ] {
                if let Some(v) = value {
                    family.with(&l, |counter| {
                        counter.inc_by(v);
                    });
                }
            }
        }
        for g in gpus {
            let l = GpuLabels {
                node: g.node.clone(),
                gpu_uuid: g.gpu_uuid.clone(),
                gpu_model: g.gpu_model.clone(),
            };
            if let Some(w) = g.power_watts {
                self.power.with(&l, |gauge| {
                    gauge.set(w);
                });
            }
            // Touched every second once it exists, so that a second without a reading (a failed
            // read) does not drop the counter and restart it from zero.
            if g.energy_source.is_some() || self.energy.present.contains(&l) {
                self.energy.with(&l, |c| {
                    c.inc_by(g.energy_joules.unwrap_or(0.0));
                });
            }
            if let Some(source) = g.energy_source {
                let s = EnergySourceLabels {
                    node: l.node,
                    gpu_uuid: l.gpu_uuid,
                    gpu_model: l.gpu_model,
                    source: source.as_str().to_owned(),
                };
                self.energy_source.with(&s, |gauge| {
                    gauge.set(1);
                });
            }
        }
        self.sm_active.end_round();
        self.sm_occupancy.end_round();
        self.tensor_active.end_round();
        self.dram_active.end_round();
        self.gpu_equivalents.end_round();
        self.fb_used.end_round();
        self.fb_total.end_round();
        self.nvlink_tx.end_round();
        self.nvlink_rx.end_round();
        self.power.end_round();
        self.energy.end_round();
        self.energy_source.end_round();
    }

    /// Replaces the per-owner share series with one second's shares.
    pub fn update_shares(&mut self, shares: &[crate::attribution::shares::Share]) {
        for s in shares {
            let l = InstanceLabels::from_parts(&s.instance, &s.attribution);
            self.share_processes.with(&l, |g| {
                g.set(i64::from(s.processes));
            });
            if let Some(b) = s.memory_used_bytes {
                self.share_memory.with(&l, |g| {
                    g.set(i64::try_from(b).unwrap_or(i64::MAX));
                });
            }
            if let Some(v) = s.sm_active {
                self.share_sm_active.with(&l, |g| {
                    g.set(v);
                });
            }
        }
        self.share_memory.end_round();
        self.share_sm_active.end_round();
        self.share_processes.end_round();
    }

    /// The registry holding the instance families.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// Labels naming a collector.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CollectorLabels {
    /// Collector name.
    pub collector: String,
}

/// Labels naming a bounded reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// One of a fixed set of reasons.
    pub reason: &'static str,
}

/// The exporter's own health.
pub struct ExporterMetrics {
    registry: Registry,
    collector_duration: Family<CollectorLabels, Ratio>,
    collector_success: Family<CollectorLabels, Gauge>,
    /// Samples produced by the source.
    pub samples_collected: Counter,
    /// Unix second of the newest sample.
    pub last_sample: Gauge,
    /// Batches the aggregator acknowledged.
    pub batches_shipped: Counter,
    /// Samples in acknowledged batches.
    pub samples_shipped: Counter,
    /// Batches that had to wait in the spool because a send failed.
    pub batches_spooled: Counter,
    /// Batches dropped, by reason (`spool_full`, `rejected`).
    pub batches_dropped: Family<ReasonLabels, Counter>,
    /// Failed sends, by reason.
    pub ship_failures: Family<ReasonLabels, Counter>,
    /// Batches waiting in the spool.
    pub spool_batches: Gauge,
    /// Bytes waiting in the spool.
    pub spool_bytes: Gauge,
    /// 1 while batches go as JSON because the aggregator refused MessagePack as unreadable.
    pub wire_json_fallback: Gauge,
    /// Devices the attributors' schedulers name, by attributor and state (`assigned`,
    /// `allocatable`, `unmatched`).
    pub attribution_devices: Family<DeviceLabels, Gauge>,
}

/// Labels of an attributor's device count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// The attributor (`kubelet`, `slurm`).
    pub attributor: &'static str,
    /// One of `assigned`, `allocatable`, `unmatched`.
    pub state: &'static str,
}

impl Default for ExporterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ExporterMetrics {
    /// Registers every own family.
    pub fn new() -> Self {
        let mut r = Registry::default();
        let m = ExporterMetrics {
            collector_duration: Family::default(),
            collector_success: Family::default(),
            samples_collected: Counter::default(),
            last_sample: Gauge::default(),
            batches_shipped: Counter::default(),
            samples_shipped: Counter::default(),
            batches_spooled: Counter::default(),
            batches_dropped: Family::default(),
            ship_failures: Family::default(),
            spool_batches: Gauge::default(),
            spool_bytes: Gauge::default(),
            wire_json_fallback: Gauge::default(),
            attribution_devices: Family::default(),
            registry: Registry::default(),
        };
        r.register(
            "gpuledger_exporter_build",
            "The exporter's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        r.register_with_unit(
            "gpuledger_exporter_collector_duration",
            "Time the collector took in its last run",
            Unit::Seconds,
            m.collector_duration.clone(),
        );
        r.register("gpuledger_exporter_collector_success", "Whether the collector's last run succeeded (1) or failed (0); unsupported counters are not failures", m.collector_success.clone());
        r.register(
            "gpuledger_exporter_samples_collected",
            "Instance-seconds sampled",
            m.samples_collected.clone(),
        );
        r.register_with_unit(
            "gpuledger_exporter_last_sample_timestamp",
            "Unix time of the newest second sampled",
            Unit::Seconds,
            m.last_sample.clone(),
        );
        r.register(
            "gpuledger_exporter_batches_shipped",
            "Batches the aggregator acknowledged",
            m.batches_shipped.clone(),
        );
        r.register(
            "gpuledger_exporter_samples_shipped",
            "Instance-seconds in batches the aggregator acknowledged",
            m.samples_shipped.clone(),
        );
        r.register("gpuledger_exporter_batches_spooled", "Batches that waited in the on-disk spool because the aggregator was unreachable or asked to retry", m.batches_spooled.clone());
        r.register("gpuledger_exporter_batches_dropped", "Batches dropped: spool_full (the oldest batch made room) or rejected (the aggregator refused it as invalid; kept under spool/rejected)", m.batches_dropped.clone());
        r.register("gpuledger_exporter_ship_failures", "Failed batch sends, by reason: unreachable, throttled, timeout, server_error, unauthorized, rejected", m.ship_failures.clone());
        r.register(
            "gpuledger_exporter_spool_batches",
            "Batches waiting in the on-disk spool",
            m.spool_batches.clone(),
        );
        r.register_with_unit(
            "gpuledger_exporter_spool",
            "Bytes waiting in the on-disk spool",
            Unit::Bytes,
            m.spool_bytes.clone(),
        );
        r.register("gpuledger_exporter_wire_json_fallback", "1 while batches are sent as JSON because the aggregator refused a readable MessagePack body (an aggregator older than the exporter); MessagePack is tried again after --msgpack-retry", m.wire_json_fallback.clone());
        r.register("gpuledger_exporter_attribution_devices", "GPU devices an attributor's scheduler names: assigned to workloads, allocatable (kubelet GetAllocatableResources), or unmatched (no instance on this node has that id, so its holder is not charged)", m.attribution_devices.clone());
        ExporterMetrics { registry: r, ..m }
    }

    /// Records an attributor's device counts.
    pub fn record_devices(
        &self,
        attributor: &'static str,
        counts: &crate::attribution::DeviceCounts,
    ) {
        for (state, n) in [
            ("assigned", Some(counts.assigned)),
            ("allocatable", counts.allocatable),
            ("unmatched", Some(counts.unmatched)),
        ] {
            if let Some(n) = n {
                self.attribution_devices
                    .get_or_create(&DeviceLabels { attributor, state })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }

    /// Records one collector run.
    pub fn record_collector(&self, outcome: &CollectorOutcome) {
        let l = CollectorLabels {
            collector: outcome.collector.to_owned(),
        };
        self.collector_duration
            .get_or_create(&l)
            .set(outcome.duration.as_secs_f64());
        self.collector_success
            .get_or_create(&l)
            .set(i64::from(outcome.success));
    }

    /// The registry holding the own families.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

pub use gpuledger_schema::exposition::render;

/// Instance and own metrics, shared by the sampler (writer) and the HTTP server (reader).
pub struct Metrics {
    /// Per-instance series; locked briefly by the sampler each second.
    pub instances: std::sync::Mutex<InstanceMetrics>,
    /// The exporter's own series.
    pub exporter: ExporterMetrics,
}

impl Metrics {
    /// Fresh, empty metrics.
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics {
            instances: std::sync::Mutex::new(InstanceMetrics::new()),
            exporter: ExporterMetrics::new(),
        })
    }

    /// The whole `/metrics` body.
    pub fn render(&self, format: Format) -> String {
        let instances = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        render(&[instances.registry(), self.exporter.registry()], format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_schema::{Attribution, Counters, Instance};

    fn reading(gi: u32, tenant: Option<&str>, sm: Option<f64>) -> Reading {
        Reading {
            instance: Instance {
                node: "n".into(),
                gpu_uuid: "GPU-a".into(),
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                mig_profile: Some("1g.10gb".into()),
                gpu_instance_id: Some(gi),
                placement_start: Some(gi - 7),
                placement_size: Some(1),
            },
            mig_uuid: None,
            gpu_index: None,
            attribution: Attribution {
                tenant: tenant.map(Into::into),
                workload: None,
                slo_class: None,
                owner: None,
                owner_ref: None,
            },
            counters: Counters {
                sm_active: sm,
                ..Counters::default()
            },
        }
    }

    fn sm_series(m: &InstanceMetrics) -> Vec<String> {
        render(&[m.registry()], Format::Classic)
            .lines()
            .filter(|l| l.starts_with("gpuledger_instance_sm_active_ratio{"))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn series_go_away_with_their_instance_allocation_or_measurement() {
        let mut m = InstanceMetrics::new();
        m.update(
            &[
                reading(7, Some("a"), Some(0.5)),
                reading(8, None, Some(0.0)),
            ],
            &[],
        );
        assert_eq!(sm_series(&m).len(), 2);
        // Instance 8 disappears, instance 7 changes tenant.
        m.update(&[reading(7, Some("b"), Some(0.25))], &[]);
        let series = sm_series(&m);
        assert_eq!(series.len(), 1, "{series:?}");
        assert!(
            series[0].contains("tenant=\"b\"") && series[0].ends_with(" 0.25"),
            "{series:?}"
        );
        // The counter stops being measured: its series goes, the instance's others stay.
        m.update(&[reading(7, Some("b"), None)], &[]);
        assert!(sm_series(&m).is_empty());
        assert!(
            render(&[m.registry()], Format::Classic)
                .contains("gpuledger_instance_gpu_equivalents{")
        );
    }
}
