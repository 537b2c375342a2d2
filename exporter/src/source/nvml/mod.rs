//! The real GPUs, through NVML.
//!
//! Per physical GPU and per MIG instance, every second: SM activity, SM occupancy, tensor-pipe and
//! DRAM activity from GPM (NVML's GPU Performance Monitoring, Hopper and newer; SM_UTIL is the
//! quantity DCGM exports as SM_ACTIVE), framebuffer used/total, NVLink bytes (GPM NVLink
//! bandwidth × interval, whole GPUs only: MIG instances do no NVLink P2P), board power, and the
//! MIG geometry (profile, GPU instance id, placement).
//!
//! Where GPM is unsupported (pre-Hopper GPUs, or a driver without it) the activity and NVLink
//! series are left absent; no value is invented. Each of the collectors below reports its
//! own duration and success; "not supported" is success with no data.
//!
//! The `processes` collector lists each GPU's compute processes (MPS clients included) with
//! their memory and, on whole GPUs, their SM utilisation (`nvmlDeviceGetProcessUtilization`,
//! samples of the last second): the input of the per-process view of shared GPUs
//! ([`crate::attribution::shares`]). In MIG mode each MIG device is asked (the parent GPU
//! answers only privileged callers), and NVML has no per-process utilisation there.
//!
//! A failing collector is logged once per failure streak, and once more when it recovers.
//!
//! NVML reference: <https://docs.nvidia.com/deploy/nvml-api/> (GPM: `nvmlGpmSampleGet`,
//! `nvmlGpmMigSampleGet`, `nvmlGpmMetricsGet`; MIG: `nvmlDeviceGetMigDeviceHandleByIndex`,
//! `nvmlDeviceGetGpuInstanceId`, `nvmlGpuInstanceGetInfo`).

pub mod driver;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gpuledger_schema::{Attribution, Counters, Instance};

pub use driver::{DeviceInfo, Driver, DriverError, NvmlDriver};

use super::{CollectorOutcome, GpuReading, ProcessReading, Reading, Second, Source, SourceError};

/// One NVML collector: `--disable-collector` takes its [`name`](Collector::name), and its
/// duration and success are reported under its [`label`](Collector::label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Collector {
    /// MIG geometry: profile, GPU instance id, placement.
    Mig,
    /// Framebuffer used and total bytes.
    Memory,
    /// SM, occupancy, tensor and DRAM activity; NVLink bytes.
    Gpm,
    /// Board power draw.
    Power,
    /// The GPU's energy: NVML's total-energy counter, or power × interval where it has none.
    Energy,
    /// Compute processes (MPS clients included): memory and SM utilisation per process.
    Processes,
}

impl Collector {
    /// Every collector, in the order their outcomes are reported.
    pub const ALL: [Collector; 6] = [
        Collector::Mig,
        Collector::Memory,
        Collector::Gpm,
        Collector::Power,
        Collector::Energy,
        Collector::Processes,
    ];

    /// The name `--disable-collector` takes.
    pub fn name(self) -> &'static str {
        match self {
            Collector::Mig => "mig",
            Collector::Memory => "memory",
            Collector::Gpm => "gpm",
            Collector::Power => "power",
            Collector::Energy => "energy",
            Collector::Processes => "processes",
        }
    }

    /// The `collector` label of its duration and success metrics.
    pub fn label(self) -> &'static str {
        match self {
            Collector::Mig => "nvml_mig",
            Collector::Memory => "nvml_memory",
            Collector::Gpm => "nvml_gpm",
            Collector::Power => "nvml_power",
            Collector::Energy => "nvml_energy",
            Collector::Processes => "nvml_processes",
        }
    }

    /// What it reads.
    pub fn reads(self) -> &'static str {
        match self {
            Collector::Mig => "MIG geometry: profile, GPU instance id, placement",
            Collector::Memory => "framebuffer used and total bytes",
            Collector::Gpm => "SM, occupancy, tensor and DRAM activity; NVLink bytes",
            Collector::Power => "board power draw",
            Collector::Energy => {
                "the GPU's energy: the total-energy counter's difference, or power × interval"
            }
            Collector::Processes => {
                "compute processes (MPS clients included): memory and SM utilisation per process"
            }
        }
    }

    /// The collector `name` names.
    pub fn parse(name: &str) -> Option<Collector> {
        Collector::ALL.into_iter().find(|c| c.name() == name)
    }
}

#[derive(Default)]
struct Tally {
    duration: Duration,
    /// The first failure this second.
    error: Option<String>,
}

impl Tally {
    fn run<T>(&mut self, f: impl FnOnce() -> Result<T, DriverError>) -> Option<T> {
        let started = Instant::now();
        let result = f();
        self.duration += started.elapsed();
        match result {
            Ok(v) => Some(v),
            Err(DriverError::NotSupported) => None,
            Err(DriverError::Failed(e)) => {
                self.error.get_or_insert(e);
                None
            }
        }
    }
}

/// One second's tally per collector.
#[derive(Default)]
struct Tallies([Tally; Collector::ALL.len()]);

impl Tallies {
    fn of(&mut self, c: Collector) -> &mut Tally {
        &mut self.0[c as usize]
    }
}

/// The NVML source over any [`Driver`].
pub struct NvmlSource<D: Driver> {
    driver: D,
    /// Collectors failing as of the last second: each failure streak is logged once.
    failing: BTreeSet<Collector>,
    node: String,
    disabled: BTreeSet<Collector>,
    /// Per GPU UUID (indices can move when the driver reloads): its last energy counter (mJ)
    /// and when any energy reading of it was last taken.
    energy: HashMap<String, EnergyState>,
}

/// What the energy collector remembers of one GPU between seconds.
#[derive(Debug, Clone, Copy, Default)]
struct EnergyState {
    /// The counter at its last successful read, mJ.
    counter_mj: Option<u64>,
    /// When energy was last assigned (a counter delta or power × interval).
    at: Option<Instant>,
}

impl<D: Driver> NvmlSource<D> {
    /// A source for this node's GPUs. `disabled` names collectors ([`Collector::name`]) to skip.
    pub fn new(driver: D, node: &str, disabled: &[String]) -> Result<Self, SourceError> {
        let disabled = disabled
            .iter()
            .map(|name| {
                Collector::parse(name).ok_or_else(|| {
                    let known: Vec<&str> = Collector::ALL.iter().map(|c| c.name()).collect();
                    SourceError::Driver(format!(
                        "unknown collector {name:?} (known: {})",
                        known.join(", ")
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(NvmlSource {
            driver,
            failing: BTreeSet::new(),
            node: node.to_owned(),
            disabled,
            energy: HashMap::new(),
        })
    }

    fn enabled(&self, collector: Collector) -> bool {
        !self.disabled.contains(&collector)
    }

    /// Runs `read` under `collector`'s tally, unless it is disabled.
    /// The GPU's energy since its last reading, and where it comes from:
    /// - the counter's difference when it reads and has not gone back; the first read is a
    ///   baseline only (no energy);
    /// - a counter lower than the last (the driver reloaded) is the new baseline, and that one
    ///   second is power × interval;
    /// - a failed read keeps the baseline, so the next difference covers both seconds;
    /// - a GPU without the counter (before Volta): power × the interval since the last reading.
    fn read_energy(
        &mut self,
        tallies: &mut Tallies,
        gpu: u32,
        uuid: &str,
        watts: Option<f64>,
    ) -> (Option<f64>, Option<super::EnergySource>) {
        use super::EnergySource::{Counter, Power};
        if !self.enabled(Collector::Energy) {
            return (None, None);
        }
        let started = Instant::now();
        let read = self.driver.energy_mj(gpu);
        let tally = tallies.of(Collector::Energy);
        tally.duration += started.elapsed();
        let state = self.energy.entry(uuid.to_owned()).or_default();
        let interval =
            |at: Option<Instant>| at.map_or(1.0, |at| started.duration_since(at).as_secs_f64());
        let power = |at| watts.map(|w| w * interval(at));
        match read {
            Ok(c) => {
                let out = match state.counter_mj {
                    None => (None, Some(Counter)),
                    Some(last) if c >= last => (Some((c - last) as f64 / 1000.0), Some(Counter)),
                    Some(_) => (power(state.at), Some(Power)),
                };
                state.counter_mj = Some(c);
                if out.0.is_some() || state.at.is_none() {
                    state.at = Some(started);
                }
                out
            }
            Err(DriverError::NotSupported) => {
                let out = (power(state.at), Some(Power));
                state.at = Some(started);
                out
            }
            Err(DriverError::Failed(e)) => {
                tally.error.get_or_insert(e);
                (None, None)
            }
        }
    }

    fn read<T>(
        &mut self,
        tallies: &mut Tallies,
        collector: Collector,
        read: impl FnOnce(&mut D) -> Result<T, DriverError>,
    ) -> Option<T> {
        if !self.enabled(collector) {
            return None;
        }
        let driver = &mut self.driver;
        tallies.of(collector).run(|| read(driver))
    }

    /// A MIG-mode GPU's instances, with their processes (NVML has no per-process utilisation in
    /// MIG mode). Without the geometry there is no way to name the instances: `false`, and the
    /// GPU is skipped this second rather than misattributed.
    fn read_mig_gpu(
        &mut self,
        device: &DeviceInfo,
        base: &Instance,
        t: &mut Tallies,
        second: &mut Second,
    ) -> bool {
        let gpu = device.index;
        let Some(instances) = self.read(t, Collector::Mig, |d| d.mig_devices(gpu)) else {
            return false;
        };
        for m in instances {
            let fb = self.read(t, Collector::Memory, |d| d.memory(gpu, Some(m.index)));
            let act = self
                .read(t, Collector::Gpm, |d| {
                    d.activity(gpu, Some(m.gpu_instance_id))
                })
                .flatten();
            if let Some(procs) =
                self.read(t, Collector::Processes, |d| d.processes(gpu, Some(m.index)))
            {
                second
                    .processes
                    .extend(procs.into_iter().map(|p| ProcessReading {
                        gpu_uuid: device.uuid.clone(),
                        gpu_instance_id: Some(m.gpu_instance_id),
                        pid: p.pid,
                        used_memory_bytes: p.used_memory,
                        sm_util: None,
                        mps_client: p.mps_client,
                    }));
            }
            second.readings.push(Reading {
                instance: Instance {
                    mig_profile: Some(m.profile),
                    gpu_instance_id: Some(m.gpu_instance_id),
                    placement_start: m.placement.map(|p| p.0),
                    placement_size: m.placement.map(|p| p.1),
                    ..base.clone()
                },
                mig_uuid: Some(m.uuid),
                gpu_index: Some(gpu),
                attribution: Attribution::default(),
                counters: counters(fb, act),
            });
        }
        true
    }

    /// A whole GPU's counters.
    fn read_whole_gpu(
        &mut self,
        device: &DeviceInfo,
        base: Instance,
        t: &mut Tallies,
        second: &mut Second,
    ) {
        let gpu = device.index;
        let fb = self.read(t, Collector::Memory, |d| d.memory(gpu, None));
        let act = self
            .read(t, Collector::Gpm, |d| d.activity(gpu, None))
            .flatten();
        second.readings.push(Reading {
            instance: base,
            mig_uuid: None,
            gpu_index: Some(gpu),
            attribution: Attribution::default(),
            counters: counters(fb, act),
        });
    }

    /// A whole GPU's processes, with their SM utilisation over the last second.
    fn read_whole_gpu_processes(
        &mut self,
        device: &DeviceInfo,
        t: &mut Tallies,
        second: &mut Second,
    ) {
        let gpu = device.index;
        let Some(procs) = self.read(t, Collector::Processes, |d| d.processes(gpu, None)) else {
            return;
        };
        let sm = if procs.is_empty() {
            None
        } else {
            self.read(t, Collector::Processes, |d| d.process_sm(gpu))
        };
        second
            .processes
            .extend(procs.into_iter().map(|p| ProcessReading {
                gpu_uuid: device.uuid.clone(),
                gpu_instance_id: None,
                pid: p.pid,
                used_memory_bytes: p.used_memory,
                sm_util: sm.as_ref().map(|m| m.get(&p.pid).copied().unwrap_or(0.0)),
                mps_client: p.mps_client,
            }));
    }

    /// Each enabled collector's outcome this second; a failure streak is logged at its start
    /// and its end.
    fn report(&mut self, mut tallies: Tallies, second: &mut Second) {
        for collector in Collector::ALL {
            if !self.enabled(collector) {
                continue;
            }
            let tally = std::mem::take(tallies.of(collector));
            let label = collector.label();
            match (&tally.error, self.failing.contains(&collector)) {
                (Some(e), false) => {
                    tracing::warn!(collector = label, error = %e, "An NVML collector fails; its counters are absent until it recovers.");
                    self.failing.insert(collector);
                }
                (None, true) => {
                    tracing::info!(collector = label, "The NVML collector works again.");
                    self.failing.remove(&collector);
                }
                _ => {}
            }
            second.collectors.push(CollectorOutcome {
                collector: label,
                duration: tally.duration,
                success: tally.error.is_none(),
            });
        }
    }
}

impl<D: Driver> Source for NvmlSource<D> {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn collect(&mut self, now: i64) -> Result<Option<Second>, SourceError> {
        let devices = self
            .driver
            .devices()
            .map_err(|e| SourceError::Driver(format!("cannot list GPUs: {e}")))?;
        let mut tallies = Tallies::default();
        let mut second = Second {
            timestamp: now - 1,
            ..Second::default()
        };
        for device in devices {
            let base = Instance {
                node: self.node.clone(),
                gpu_uuid: device.uuid.clone(),
                gpu_model: device.name.clone(),
                mig_profile: None,
                gpu_instance_id: None,
                placement_start: None,
                placement_size: None,
            };
            if device.mig_enabled {
                if !self.read_mig_gpu(&device, &base, &mut tallies, &mut second) {
                    continue;
                }
            } else {
                self.read_whole_gpu(&device, base, &mut tallies, &mut second);
            }
            let gpu = device.index;
            let watts = self.read(&mut tallies, Collector::Power, |d| d.power_watts(gpu));
            if !device.mig_enabled {
                self.read_whole_gpu_processes(&device, &mut tallies, &mut second);
            }
            let (energy_joules, energy_source) =
                self.read_energy(&mut tallies, gpu, &device.uuid, watts);
            second.gpus.push(GpuReading {
                node: self.node.clone(),
                gpu_uuid: device.uuid,
                gpu_model: device.name,
                power_watts: watts,
                energy_joules,
                energy_source,
            });
        }
        self.report(tallies, &mut second);
        Ok(Some(second))
    }
}

fn counters(fb: Option<driver::Memory>, act: Option<driver::Activity>) -> Counters {
    let act = act.unwrap_or_default();
    Counters {
        sm_active: act.sm_active,
        sm_occupancy: act.sm_occupancy,
        tensor_active: act.tensor_active,
        dram_active: act.dram_active,
        fb_used_bytes: fb.map(|m| m.used.min(m.total)),
        fb_total_bytes: fb.map(|m| m.total),
        nvlink_tx_bytes: act.nvlink_tx_bytes,
        nvlink_rx_bytes: act.nvlink_rx_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::driver::{Activity, DeviceInfo, Memory, MigInfo, Process};
    use super::*;
    use std::collections::HashMap;

    /// Stands in for the GPU: an H100 in MIG mode (3g + 2g + 1g + 1g, one MIG call failing on
    /// request), an A100 without GPM, and a whole H100 with NVLink traffic.
    struct FakeGpus {
        calls: u32,
        fail_memory_of: Option<u32>,
    }

    impl Driver for FakeGpus {
        fn devices(&mut self) -> Result<Vec<DeviceInfo>, DriverError> {
            self.calls += 1;
            Ok(vec![
                DeviceInfo {
                    index: 0,
                    uuid: "GPU-h100-mig".into(),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    mig_enabled: true,
                },
                DeviceInfo {
                    index: 1,
                    uuid: "GPU-a100".into(),
                    name: "NVIDIA A100-SXM4-40GB".into(),
                    mig_enabled: false,
                },
                DeviceInfo {
                    index: 2,
                    uuid: "GPU-h100-whole".into(),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    mig_enabled: false,
                },
            ])
        }
        fn mig_devices(&mut self, gpu: u32) -> Result<Vec<MigInfo>, DriverError> {
            assert_eq!(gpu, 0);
            let m = |index, gi, profile: &str, start, size| MigInfo {
                index,
                uuid: format!("MIG-{gi}"),
                gpu_instance_id: gi,
                profile: profile.into(),
                placement: Some((start, size)),
            };
            Ok(vec![
                m(0, 2, "3g.40gb", 4, 4),
                m(1, 3, "2g.20gb", 0, 2),
                m(2, 9, "1g.10gb", 2, 1),
                m(3, 10, "1g.10gb", 3, 1),
            ])
        }
        fn memory(&mut self, gpu: u32, mig: Option<u32>) -> Result<Memory, DriverError> {
            if self.fail_memory_of == mig && gpu == 0 {
                return Err(DriverError::Failed("GPU is lost".into()));
            }
            Ok(Memory {
                used: 1 << 30,
                total: 10 << 30,
            })
        }
        fn activity(&mut self, gpu: u32, gi: Option<u32>) -> Result<Option<Activity>, DriverError> {
            if gpu == 1 {
                return Err(DriverError::NotSupported);
            }
            if self.calls < 2 {
                return Ok(None);
            }
            Ok(Some(Activity {
                sm_active: Some(0.5),
                sm_occupancy: Some(0.25),
                tensor_active: Some(0.125),
                dram_active: Some(0.0625),
                nvlink_tx_bytes: gi.is_none().then_some(1_000),
                nvlink_rx_bytes: gi.is_none().then_some(2_000),
            }))
        }
        fn power_watts(&mut self, _gpu: u32) -> Result<f64, DriverError> {
            Ok(350.5)
        }
        /// The A100 has no counter; the H100s' counter reads, second by second (the `calls`th
        /// listing): 1000, 1500, 900 (the driver reloaded), a failure, 1400, 2400 mJ.
        fn energy_mj(&mut self, gpu: u32) -> Result<u64, DriverError> {
            if gpu == 1 {
                return Err(DriverError::NotSupported);
            }
            match self.calls {
                1 => Ok(1000),
                2 => Ok(1500),
                3 => Ok(900),
                4 => Err(DriverError::Failed("energy counter unavailable".into())),
                5 => Ok(1400),
                _ => Ok(2400),
            }
        }
        fn processes(&mut self, gpu: u32, mig: Option<u32>) -> Result<Vec<Process>, DriverError> {
            let p = |pid, used_memory| Process {
                pid,
                used_memory,
                mps_client: false,
            };
            Ok(match (gpu, mig) {
                (0, None) => panic!("a MIG-mode GPU's processes are asked of its MIG devices"),
                // MIG device 0 is GPU instance 2.
                (0, Some(0)) => vec![p(30, Some(5 << 30))],
                (2, None) => vec![p(10, Some(1 << 30)), p(20, None)],
                _ => vec![],
            })
        }
        fn process_sm(&mut self, gpu: u32) -> Result<HashMap<u32, f64>, DriverError> {
            assert_eq!(gpu, 2, "asked only of a whole GPU with processes");
            Ok(HashMap::from([(10, 0.25)]))
        }
    }

    fn source(fail_memory_of: Option<u32>, disabled: &[&str]) -> NvmlSource<FakeGpus> {
        let disabled: Vec<String> = disabled.iter().map(|s| s.to_string()).collect();
        NvmlSource::new(
            FakeGpus {
                calls: 0,
                fail_memory_of,
            },
            "node-a",
            &disabled,
        )
        .unwrap()
    }

    #[test]
    fn mig_instances_and_whole_gpus_are_read_with_their_geometry() {
        let mut s = source(None, &[]);
        let first = s.collect(101).unwrap().unwrap();
        assert_eq!(first.timestamp, 100);
        assert_eq!(first.readings.len(), 6);
        assert!(
            first
                .readings
                .iter()
                .all(|r| r.counters.sm_active.is_none()),
            "no GPM interval on the first second"
        );
        let second = s.collect(102).unwrap().unwrap();
        let three_g = &second.readings[0];
        assert_eq!(three_g.instance.mig_profile.as_deref(), Some("3g.40gb"));
        assert_eq!(
            (
                three_g.instance.gpu_instance_id,
                three_g.instance.placement_start,
                three_g.instance.placement_size
            ),
            (Some(2), Some(4), Some(4))
        );
        assert_eq!(three_g.mig_uuid.as_deref(), Some("MIG-2"));
        assert_eq!(three_g.counters.sm_active, Some(0.5));
        assert_eq!(
            three_g.counters.nvlink_tx_bytes, None,
            "MIG instances have no NVLink"
        );
        assert_eq!(three_g.counters.fb_total_bytes, Some(10 << 30));
        let whole = &second.readings[5];
        assert_eq!(whole.instance.mig_profile, None);
        assert_eq!(
            (
                whole.counters.nvlink_tx_bytes,
                whole.counters.nvlink_rx_bytes
            ),
            (Some(1_000), Some(2_000))
        );
        assert_eq!(second.gpus[0].power_watts, Some(350.5));
        assert!(second.collectors.iter().all(|c| c.success));
    }

    #[test]
    fn processes_are_read_with_per_process_utilisation_where_the_driver_has_it() {
        let mut s = source(None, &[]);
        let second = s.collect(2).unwrap().unwrap();
        let procs: Vec<(&str, Option<u32>, u32, Option<u64>, Option<f64>)> = second
            .processes
            .iter()
            .map(|p| {
                (
                    p.gpu_uuid.as_str(),
                    p.gpu_instance_id,
                    p.pid,
                    p.used_memory_bytes,
                    p.sm_util,
                )
            })
            .collect();
        assert_eq!(
            procs,
            [
                // MIG mode: the GPU instance is known, per-process utilisation is not.
                ("GPU-h100-mig", Some(2), 30, Some(5 << 30), None),
                ("GPU-h100-whole", None, 10, Some(1 << 30), Some(0.25)),
                // Absent from the utilisation samples: ran no kernels.
                ("GPU-h100-whole", None, 20, None, Some(0.0)),
            ]
        );
        let mut off = source(None, &["processes"]);
        assert!(off.collect(2).unwrap().unwrap().processes.is_empty());
    }

    /// Regression: GPU indices were positions among the second's readings, so a MIG GPU whose
    /// instances could not be listed shifted every later GPU's index, and devices that schedulers
    /// name by index (GKE `nvidia2`, Slurm `SLURM_JOB_GPUS=2`) were charged to the wrong GPU.
    #[test]
    fn a_gpu_without_readings_does_not_shift_the_indices_of_later_gpus() {
        let mut s = source(None, &["mig"]);
        let second = s.collect(2).unwrap().unwrap();
        let indices = crate::attribution::gpu_indices(&second.readings);
        assert_eq!(indices.get("GPU-h100-mig"), None);
        assert_eq!(indices["GPU-a100"], 1);
        assert_eq!(indices["GPU-h100-whole"], 2);
    }

    #[test]
    fn pre_hopper_gpus_have_no_activity_series_and_that_is_not_a_failure() {
        let mut s = source(None, &[]);
        s.collect(1).unwrap();
        let second = s.collect(2).unwrap().unwrap();
        let a100 = second
            .readings
            .iter()
            .find(|r| r.instance.gpu_uuid == "GPU-a100")
            .unwrap();
        assert_eq!(a100.counters.sm_active, None);
        assert_eq!(a100.counters.fb_used_bytes, Some(1 << 30));
        let gpm = second
            .collectors
            .iter()
            .find(|c| c.collector == "nvml_gpm")
            .unwrap();
        assert!(gpm.success);
    }

    #[test]
    fn a_failing_call_leaves_its_counter_absent_and_marks_its_collector() {
        let mut s = source(Some(1), &[]);
        let second = s.collect(2).unwrap().unwrap();
        assert_eq!(second.readings[1].counters.fb_used_bytes, None);
        assert_eq!(second.readings[0].counters.fb_used_bytes, Some(1 << 30));
        let memory = second
            .collectors
            .iter()
            .find(|c| c.collector == "nvml_memory")
            .unwrap();
        assert!(!memory.success);
    }

    #[test]
    fn disabled_collectors_are_skipped_and_unknown_ones_refused() {
        let mut s = source(None, &["power", "gpm"]);
        s.collect(1).unwrap();
        let second = s.collect(2).unwrap().unwrap();
        assert!(second.gpus.iter().all(|g| g.power_watts.is_none()));
        assert!(
            second
                .readings
                .iter()
                .all(|r| r.counters.sm_active.is_none())
        );
        assert_eq!(second.collectors.len(), 4);
        assert!(
            NvmlSource::new(
                FakeGpus {
                    calls: 0,
                    fail_memory_of: None
                },
                "n",
                &["dcgm".into()]
            )
            .is_err()
        );
    }

    #[test]
    fn energy_is_the_counters_difference_and_survives_a_reload_and_a_failed_read() {
        use crate::source::EnergySource::{Counter, Power};
        let mut src = NvmlSource::new(
            FakeGpus {
                calls: 0,
                fail_memory_of: None,
            },
            "n1",
            &[],
        )
        .unwrap();
        let mut energy = Vec::new();
        for _ in 0..6 {
            let second = src.collect(0).unwrap().unwrap();
            let gpu = |uuid: &str| {
                second
                    .gpus
                    .iter()
                    .find(|g| g.gpu_uuid == uuid)
                    .cloned()
                    .unwrap()
            };
            let (h100, a100) = (gpu("GPU-h100-mig"), gpu("GPU-a100"));
            // Without a counter: power × the interval, every second.
            assert_eq!(a100.energy_source, Some(Power));
            assert!(a100.energy_joules.unwrap() > 0.0);
            energy.push((h100.energy_joules, h100.energy_source));
        }
        assert_eq!(
            energy[0],
            (None, Some(Counter)),
            "the first read is a baseline"
        );
        assert_eq!(energy[1], (Some(0.5), Some(Counter)));
        // The counter went back: one second of power × interval, and a new baseline.
        assert_eq!(energy[2].1, Some(Power));
        assert!(energy[2].0.unwrap() > 0.0 && energy[2].0.unwrap() < 350.5 * 5.0);
        assert_eq!(energy[3], (None, None), "a failed read assigns nothing");
        // The next difference covers the failed second too: 1400 − 900 mJ.
        assert_eq!(energy[4], (Some(0.5), Some(Counter)));
        assert_eq!(energy[5], (Some(1.0), Some(Counter)));
    }

    #[test]
    fn the_energy_collector_can_be_disabled() {
        let mut src = NvmlSource::new(
            FakeGpus {
                calls: 0,
                fail_memory_of: None,
            },
            "n1",
            &["energy".to_owned()],
        )
        .unwrap();
        for _ in 0..3 {
            let second = src.collect(0).unwrap().unwrap();
            assert!(
                second
                    .gpus
                    .iter()
                    .all(|g| g.energy_joules.is_none() && g.energy_source.is_none())
            );
        }
    }
}
