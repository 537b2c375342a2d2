//! Where samples come from: one small trait, [`Source`], and three implementations.
//!
//! - [`nvml`]: the real GPUs, through NVML (libnvidia-ml loaded at run time).
//! - [`sim`]: a deterministic simulated fleet.
//! - [`replay`]: a recorded trace CSV (`schema/TRACE.md`).
//!
//! [`SOURCES`] is the one table of sources; it drives `--source` and the help text. The daemon
//! wraps every `collect` call and exports its duration and success per collector.

pub mod nvml;
pub mod replay;
pub mod sim;

use std::time::Duration;

use gpuledger_schema::{Attribution, Counters, Instance};

/// One instance as a source saw it during one second.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The instance.
    pub instance: Instance,
    /// The MIG device UUID (`MIG-…`), when the source knows it; attribution maps key on it.
    pub mig_uuid: Option<String>,
    /// The GPU's NVML index, when the source knows it (NVML). Schedulers name devices by index
    /// (GKE `nvidia0`, Slurm `SLURM_JOB_GPUS`); without it the index is the GPU's position
    /// among the second's readings, which a GPU with no readings that second would shift.
    pub gpu_index: Option<u32>,
    /// Who holds it, as far as the source knows (sim and replay know; NVML does not).
    pub attribution: Attribution,
    /// Its counters.
    pub counters: Counters,
}

/// A physical GPU's own readings (not per instance).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// NVML product name.
    pub gpu_model: String,
    /// Board power draw in watts, when measured.
    pub power_watts: Option<f64>,
    /// Joules the GPU used since its previous reading, assigned to this second; `None` when not
    /// known (the first read of a counter, a failed read).
    pub energy_joules: Option<f64>,
    /// Where `energy_joules` comes from.
    pub energy_source: Option<EnergySource>,
}

/// Where a GPU's energy reading comes from (`gpuledger_gpu_energy_source` on `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EnergySource {
    /// NVML's total-energy counter: the difference between consecutive reads.
    Counter,
    /// Board power × the interval, where the counter is not supported (or went backwards).
    Power,
    /// A recorded trace's `gpu_energy_joules`.
    Trace,
    /// The simulator's power model.
    Model,
}

impl EnergySource {
    /// Every source, in a fixed order.
    pub const ALL: [EnergySource; 4] = [
        EnergySource::Counter,
        EnergySource::Power,
        EnergySource::Trace,
        EnergySource::Model,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            EnergySource::Counter => "counter",
            EnergySource::Power => "power",
            EnergySource::Trace => "trace",
            EnergySource::Model => "model",
        }
    }
}

/// One process on a GPU during one second, as the driver reports it: the raw material of the
/// per-process view of shared GPUs ([`crate::attribution::shares`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessReading {
    /// The GPU the process runs on.
    pub gpu_uuid: String,
    /// The MIG GPU instance it runs in; `None` on a whole GPU.
    pub gpu_instance_id: Option<u32>,
    /// Process id in the exporter's PID namespace: the driver translates PIDs and leaves out
    /// processes outside it, so a containerised exporter needs the host's (`hostPID`).
    pub pid: u32,
    /// Framebuffer bytes the process holds; `None` where the driver cannot tell.
    pub used_memory_bytes: Option<u64>,
    /// The process's SM utilisation over the second (NVML per-process utilisation / 100), 0–1;
    /// `None` where the driver does not provide it (MIG instances, drivers without it).
    pub sm_util: Option<f64>,
    /// Whether the driver lists it as an MPS client: the MPS server runs its kernels.
    pub mps_client: bool,
}

/// How one collector inside a source fared.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectorOutcome {
    /// The collector's name (a fixed, bounded set per source).
    pub collector: &'static str,
    /// Time it took.
    pub duration: Duration,
    /// Whether it succeeded. "No data" (no MIG on a GPU) is success.
    pub success: bool,
}

/// Everything a source saw in one second.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Second {
    /// The second covered, Unix seconds: `[timestamp, timestamp + 1)`.
    pub timestamp: i64,
    /// One reading per instance.
    pub readings: Vec<Reading>,
    /// One reading per physical GPU.
    pub gpus: Vec<GpuReading>,
    /// Sub-collectors the source ran, beyond the source as a whole.
    pub collectors: Vec<CollectorOutcome>,
    /// The processes on the GPUs (NVML only; empty for sources that do not see processes).
    pub processes: Vec<ProcessReading>,
}

impl Second {
    /// The GPUs' energy readings of this second, for shipping.
    pub fn gpu_samples(&self) -> Vec<gpuledger_schema::GpuSample> {
        self.gpus
            .iter()
            .filter(|g| g.energy_joules.is_some())
            .map(|g| gpuledger_schema::GpuSample {
                timestamp: self.timestamp,
                node: g.node.clone(),
                gpu_uuid: g.gpu_uuid.clone(),
                gpu_model: g.gpu_model.clone(),
                energy_joules: g.energy_joules,
            })
            .collect()
    }

    /// The readings as samples of this second, for shipping or a trace.
    pub fn into_samples(self) -> Vec<gpuledger_schema::Sample> {
        let timestamp = self.timestamp;
        self.readings
            .into_iter()
            .map(|r| gpuledger_schema::Sample {
                timestamp,
                instance: r.instance,
                attribution: r.attribution,
                counters: r.counters,
            })
            .collect()
    }
}

/// A source failed for this second; the daemon counts it and tries again next second.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The driver or library failed.
    #[error("{0}")]
    Driver(String),
    /// A recorded source's file is unusable.
    #[error(transparent)]
    Trace(#[from] gpuledger_schema::trace::TraceError),
    /// Other I/O.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A place samples come from.
pub trait Source: Send {
    /// The source's name, used as the `collector` label.
    fn name(&self) -> &'static str;

    /// The readings for one second. Live sources (NVML, sim) measure the second ending at
    /// `now` (Unix seconds) and return it as `now - 1`; recorded sources (replay) ignore `now` and
    /// return their next second. `Ok(None)`: the source is exhausted.
    fn collect(&mut self, now: i64) -> Result<Option<Second>, SourceError>;

    /// Whether the source plays back recorded time: it may be paced, and it must wait (not drop)
    /// when the spool is full.
    fn is_recorded(&self) -> bool {
        false
    }
}

/// A `--source` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceKind {
    /// The name on the command line.
    pub name: &'static str,
    /// One line for `--help`.
    pub help: &'static str,
}

/// Every source, in the order `--help` lists them.
pub const SOURCES: &[SourceKind] = &[
    SourceKind {
        name: "nvml",
        help: "the GPUs of this machine, through NVML (needs the NVIDIA driver)",
    },
    SourceKind {
        name: "sim",
        help: "a deterministic simulated node (see --fleet)",
    },
    SourceKind {
        name: "replay",
        help: "a recorded trace CSV (see --replay-file, --speed)",
    },
];
