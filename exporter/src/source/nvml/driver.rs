//! The narrow NVML surface the exporter uses ([`Driver`]) and its implementation over
//! `nvml-wrapper` ([`NvmlDriver`]). Tests implement [`Driver`] with a scripted fake that stands in
//! for the GPU.

use std::collections::HashMap;
use std::time::Instant;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper_sys::bindings::{
    nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlReturn_enum_NVML_SUCCESS,
};

/// A physical GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Whether MIG mode is currently on.
    pub mig_enabled: bool,
}

/// A MIG device on a physical GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct MigInfo {
    /// Index among the parent's MIG device handles.
    pub index: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Profile name (`3g.40gb`).
    pub profile: String,
    /// `(start, size)` placement in memory slices, when NVML tells.
    pub placement: Option<(u32, u32)>,
}

/// Framebuffer use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory {
    /// Bytes in use.
    pub used: u64,
    /// Bytes in all.
    pub total: u64,
}

/// GPM activity between the previous sample and now. Each metric is absent when the driver
/// reports it unsupported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Activity {
    /// SM_UTIL / 100.
    pub sm_active: Option<f64>,
    /// SM_OCCUPANCY / 100.
    pub sm_occupancy: Option<f64>,
    /// ANY_TENSOR_UTIL / 100.
    pub tensor_active: Option<f64>,
    /// DRAM_BW_UTIL / 100.
    pub dram_active: Option<f64>,
    /// NVLink bytes sent over the interval (whole GPUs).
    pub nvlink_tx_bytes: Option<u64>,
    /// NVLink bytes received over the interval.
    pub nvlink_rx_bytes: Option<u64>,
}

/// A process using a GPU (NVML's running compute processes, MPS clients included).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Process {
    /// Host PID.
    pub pid: u32,
    /// Framebuffer bytes held, when the driver tells.
    pub used_memory: Option<u64>,
    /// Whether the driver lists it as an MPS client (`nvmlDeviceGetMPSComputeRunningProcesses`).
    pub mps_client: bool,
}

/// What went wrong in a driver call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DriverError {
    /// The device or driver does not support the call: "no data", not a failure.
    #[error("not supported")]
    NotSupported,
    /// Anything else.
    #[error("{0}")]
    Failed(String),
}

impl From<NvmlError> for DriverError {
    fn from(e: NvmlError) -> Self {
        match e {
            NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_) => DriverError::NotSupported,
            other => DriverError::Failed(other.to_string()),
        }
    }
}

/// The NVML calls the exporter needs, one method per collector.
pub trait Driver: Send {
    /// The physical GPUs.
    fn devices(&mut self) -> Result<Vec<DeviceInfo>, DriverError>;
    /// The MIG devices of GPU `gpu` (empty when MIG is off).
    fn mig_devices(&mut self, gpu: u32) -> Result<Vec<MigInfo>, DriverError>;
    /// Framebuffer of GPU `gpu`, or of its MIG device `mig` (an index from [`MigInfo::index`]).
    fn memory(&mut self, gpu: u32, mig: Option<u32>) -> Result<Memory, DriverError>;
    /// GPM activity of GPU `gpu`, or of its GPU instance `gpu_instance_id`, since the previous
    /// call for the same target. `Ok(None)` on the first call (no interval yet).
    fn activity(
        &mut self,
        gpu: u32,
        gpu_instance_id: Option<u32>,
    ) -> Result<Option<Activity>, DriverError>;
    /// Board power in watts.
    fn power_watts(&mut self, gpu: u32) -> Result<f64, DriverError>;
    /// The GPU's total-energy counter: millijoules since the driver loaded
    /// (`nvmlDeviceGetTotalEnergyConsumption`, Volta and newer).
    fn energy_mj(&mut self, gpu: u32) -> Result<u64, DriverError>;
    /// The compute processes on GPU `gpu`, or on its MIG device `mig` (MPS clients included), one
    /// entry per PID. In MIG mode the parent GPU answers only privileged callers, so the exporter
    /// asks each MIG device.
    fn processes(&mut self, gpu: u32, mig: Option<u32>) -> Result<Vec<Process>, DriverError>;
    /// Per-process SM utilisation (0–1) on GPU `gpu` since the previous call; a process absent
    /// from the map ran no kernels. `NotSupported` where the driver cannot tell (MIG mode).
    fn process_sm(&mut self, gpu: u32) -> Result<HashMap<u32, f64>, DriverError>;
}

/// [`Driver`] over the real NVML. The library is loaded at run time, so this compiles and links
/// on machines without the NVIDIA driver; [`NvmlDriver::init`] is where its absence shows.
pub struct NvmlDriver {
    nvml: &'static Nvml,
    previous: HashMap<(u32, Option<u32>), (GpmSample<'static>, Instant)>,
    /// Per GPU, the newest per-process utilisation timestamp seen (µs), so each call reads only
    /// the samples taken since.
    process_seen: HashMap<u32, u64>,
}

const GPM_METRICS: [GpmMetricId; 6] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::NvlinkTotalTxPerSec,
    GpmMetricId::NvlinkTotalRxPerSec,
];

impl NvmlDriver {
    /// Loads libnvidia-ml and initialises NVML.
    pub fn init() -> Result<NvmlDriver, DriverError> {
        let nvml = Nvml::init().map_err(|e| {
            DriverError::Failed(format!("NVML is not available on this machine ({e}); is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?"))
        })?;
        // One NVML handle lives as long as the daemon; leaking it gives the GPM samples, which
        // borrow it, a 'static lifetime instead of a self-referential struct.
        Ok(NvmlDriver {
            nvml: Box::leak(Box::new(nvml)),
            previous: HashMap::new(),
            process_seen: HashMap::new(),
        })
    }

    fn device(&self, gpu: u32) -> Result<nvml_wrapper::Device<'static>, DriverError> {
        Ok(self.nvml.device_by_index(gpu)?)
    }

    /// GPU instance id and placement of a MIG device, through the calls nvml-wrapper does not wrap.
    fn instance_geometry(
        &self,
        parent: &nvml_wrapper::Device<'static>,
        mig: &nvml_wrapper::Device<'static>,
    ) -> Result<(u32, Option<(u32, u32)>), DriverError> {
        let lib = self.nvml.lib();
        let get_id = lib
            .nvmlDeviceGetGpuInstanceId
            .as_ref()
            .map_err(|_| DriverError::NotSupported)?;
        let mut id: u32 = 0;
        // SAFETY: `mig` is a live MIG device handle from this NVML session and `id` outlives the call.
        let rc = unsafe { get_id(mig.handle(), &mut id) };
        if rc != nvmlReturn_enum_NVML_SUCCESS {
            return Err(DriverError::Failed(format!(
                "nvmlDeviceGetGpuInstanceId returned {rc}"
            )));
        }
        let placement = (|| {
            let by_id = lib.nvmlDeviceGetGpuInstanceById.as_ref().ok()?;
            let get_info = lib.nvmlGpuInstanceGetInfo.as_ref().ok()?;
            let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
            // SAFETY: `parent` is a live device handle; `gi` is written by NVML on success only.
            if unsafe { by_id(parent.handle(), id, &mut gi) } != nvmlReturn_enum_NVML_SUCCESS {
                return None;
            }
            // SAFETY: an all-zero nvmlGpuInstanceInfo_t is a valid out-parameter (plain C struct of ints and a pointer).
            let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `gi` was just returned by NVML for this session and `info` outlives the call.
            if unsafe { get_info(gi, &mut info) } != nvmlReturn_enum_NVML_SUCCESS {
                return None;
            }
            Some((info.placement.start, info.placement.size))
        })();
        Ok((id, placement))
    }
}

/// `NVIDIA H100 80GB HBM3 MIG 3g.40gb` → `3g.40gb`.
pub fn profile_from_mig_name(name: &str) -> Option<&str> {
    let profile = name.rsplit_once("MIG ")?.1.trim();
    gpuledger_schema::mig::compute_slices_of(profile).map(|_| profile)
}

/// Runs a list call again when the list grew between nvml-wrapper's count and fill calls (a
/// process started, a sample was taken): `InsufficientSize` then means "ask again", not failure.
fn retry_on_growth<T>(mut call: impl FnMut() -> Result<T, NvmlError>) -> Result<T, NvmlError> {
    for _ in 0..2 {
        match call() {
            Err(NvmlError::InsufficientSize(_)) => continue,
            other => return other,
        }
    }
    call()
}

impl Driver for NvmlDriver {
    fn devices(&mut self) -> Result<Vec<DeviceInfo>, DriverError> {
        let count = self.nvml.device_count()?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let d = self.device(index)?;
            let mig_enabled = match d.mig_mode() {
                Ok(mode) => mode.current == 1,
                Err(NvmlError::NotSupported) => false,
                Err(e) => return Err(e.into()),
            };
            out.push(DeviceInfo {
                index,
                uuid: d.uuid()?,
                name: d.name()?,
                mig_enabled,
            });
        }
        Ok(out)
    }

    fn mig_devices(&mut self, gpu: u32) -> Result<Vec<MigInfo>, DriverError> {
        let parent = self.device(gpu)?;
        let max = match parent.mig_device_count() {
            Ok(n) => n,
            Err(NvmlError::NotSupported) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for index in 0..max {
            let mig = match parent.mig_device_by_index(index) {
                Ok(m) => m,
                // Unused MIG slots answer NotFound.
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(e.into()),
            };
            let name = mig.name()?;
            let profile = profile_from_mig_name(&name)
                .ok_or_else(|| {
                    DriverError::Failed(format!(
                        "cannot read a MIG profile from the device name {name:?}"
                    ))
                })?
                .to_owned();
            let (gpu_instance_id, placement) = self.instance_geometry(&parent, &mig)?;
            out.push(MigInfo {
                index,
                uuid: mig.uuid()?,
                gpu_instance_id,
                profile,
                placement,
            });
        }
        Ok(out)
    }

    fn memory(&mut self, gpu: u32, mig: Option<u32>) -> Result<Memory, DriverError> {
        let d = self.device(gpu)?;
        let d = match mig {
            Some(i) => d.mig_device_by_index(i)?,
            None => d,
        };
        let m = d.memory_info()?;
        Ok(Memory {
            used: m.used,
            total: m.total,
        })
    }

    fn activity(
        &mut self,
        gpu: u32,
        gpu_instance_id: Option<u32>,
    ) -> Result<Option<Activity>, DriverError> {
        let d = self.device(gpu)?;
        let sample = match gpu_instance_id {
            Some(gi) => d.gpm_mig_sample(gi)?,
            None => d.gpm_sample()?,
        };
        let now = Instant::now();
        let Some((previous, then)) = self.previous.insert((gpu, gpu_instance_id), (sample, now))
        else {
            return Ok(None);
        };
        let (current, _) = &self.previous[&(gpu, gpu_instance_id)];
        let results = gpm_metrics_get(self.nvml, &previous, current, &GPM_METRICS)?;
        let seconds = now.duration_since(then).as_secs_f64();
        let value = |i: usize| {
            results
                .get(i)
                .and_then(|r| r.as_ref().ok())
                .map(|m| m.value)
        };
        let ratio = |i: usize| value(i).map(|v| (v / 100.0).clamp(0.0, 1.0));
        // GPM reports NVLink bandwidth in MiB/s over the interval.
        let bytes =
            |i: usize| value(i).map(|v| (v.max(0.0) * 1_048_576.0 * seconds).round() as u64);
        Ok(Some(Activity {
            sm_active: ratio(0),
            sm_occupancy: ratio(1),
            tensor_active: ratio(2),
            dram_active: ratio(3),
            nvlink_tx_bytes: if gpu_instance_id.is_none() {
                bytes(4)
            } else {
                None
            },
            nvlink_rx_bytes: if gpu_instance_id.is_none() {
                bytes(5)
            } else {
                None
            },
        }))
    }

    fn power_watts(&mut self, gpu: u32) -> Result<f64, DriverError> {
        Ok(f64::from(self.device(gpu)?.power_usage()?) / 1000.0)
    }

    fn energy_mj(&mut self, gpu: u32) -> Result<u64, DriverError> {
        Ok(self.device(gpu)?.total_energy_consumption()?)
    }

    fn processes(&mut self, gpu: u32, mig: Option<u32>) -> Result<Vec<Process>, DriverError> {
        let d = self.device(gpu)?;
        let d = match mig {
            Some(i) => d.mig_device_by_index(i)?,
            None => d,
        };
        let mut by_pid: std::collections::BTreeMap<u32, Process> = Default::default();
        // Under MPS the compute list shows the MPS server and the MPS list its clients; a PID
        // in both is one process.
        let mps = match retry_on_growth(|| d.mps_running_compute_processes()) {
            Ok(p) => p,
            Err(NvmlError::NotSupported | NvmlError::FunctionNotFound) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let compute = retry_on_growth(|| d.running_compute_processes())?;
        let listed = compute
            .into_iter()
            .map(|p| (p, false))
            .chain(mps.into_iter().map(|p| (p, true)));
        for (p, mps_client) in listed {
            let used_memory = match p.used_gpu_memory {
                nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
            };
            by_pid
                .entry(p.pid)
                .or_insert(Process {
                    pid: p.pid,
                    used_memory,
                    mps_client,
                })
                .mps_client |= mps_client;
        }
        Ok(by_pid.into_values().collect())
    }

    fn process_sm(&mut self, gpu: u32) -> Result<HashMap<u32, f64>, DriverError> {
        let d = self.device(gpu)?;
        // Samples since the newest one already read, but never older than a second: the view is
        // of the second just sampled, not of everything the driver has buffered.
        let a_second_ago = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as u64)
            .saturating_sub(1_000_000);
        let since = self
            .process_seen
            .get(&gpu)
            .map_or(a_second_ago, |seen| (*seen).max(a_second_ago));
        let samples = match retry_on_growth(|| d.process_utilization_stats(since)) {
            Ok(s) => s,
            // No process ran a kernel since `since`.
            Err(NvmlError::NotFound) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let mut sums: HashMap<u32, (f64, u32)> = HashMap::new();
        for s in &samples {
            let e = sums.entry(s.pid).or_default();
            e.0 += f64::from(s.sm_util.min(100)) / 100.0;
            e.1 += 1;
        }
        if let Some(newest) = samples.iter().map(|s| s.timestamp).max() {
            self.process_seen.insert(gpu, newest);
        }
        Ok(sums
            .into_iter()
            .map(|(pid, (sum, n))| (pid, sum / f64::from(n)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_read_from_mig_device_names() {
        assert_eq!(
            profile_from_mig_name("NVIDIA H100 80GB HBM3 MIG 3g.40gb"),
            Some("3g.40gb")
        );
        assert_eq!(
            profile_from_mig_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb"),
            Some("1g.5gb")
        );
        assert_eq!(profile_from_mig_name("NVIDIA H200"), None);
    }

    #[test]
    fn without_a_driver_init_says_so_in_one_sentence() {
        // CI has no NVIDIA driver; on a GPU machine this test checks nothing.
        if let Err(DriverError::Failed(msg)) = NvmlDriver::init() {
            assert!(
                msg.starts_with("NVML is not available on this machine"),
                "{msg}"
            );
        }
    }
}
