//! Who holds each instance. The device is allocated whether or not a process runs on it, so
//! attribution comes from the scheduler's allocation: a static map ([`static_map`]), the
//! kubelet's pod-resources API ([`kubelet`]) or Slurm's per-device job map ([`slurm`]). Sources
//! that know their tenant (sim, replay) bring it along; an attributor overrides it for the
//! instances it maps. Several workloads sharing one instance (time-slicing, MPS) are told apart
//! per process by [`shares`].
//!
//! Every attributor refreshes once a second before it is applied; its duration and success are
//! exported like a collector's (`collector="attribution_<name>"`). A failing attributor keeps
//! its last good state, so a hiccup does not unlabel the fleet.

pub mod kubelet;
pub mod shares;
pub mod slurm;
pub mod static_map;

pub use kubelet::{KubeletAttributor, KubeletConfig};
pub use slurm::SlurmJobMap;
pub use static_map::{MapError, StaticMap};

use crate::source::Reading;

/// How many devices an attributor's scheduler names, as of its last `apply`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounts {
    /// Devices assigned to workloads.
    pub assigned: u64,
    /// Devices the scheduler can hand out, where it says (the kubelet's
    /// `GetAllocatableResources`; 0 from a kubelet without it).
    pub allocatable: Option<u64>,
    /// Assigned or allocatable devices that match no instance on this node: their holders are
    /// not charged.
    pub unmatched: u64,
}

/// A way of telling who holds an instance.
pub trait Attributor: Send {
    /// Short name for metrics and logs (`static`, `slurm`).
    fn name(&self) -> &'static str;
    /// The `collector` label of its refresh's duration and success (`attribution_static`):
    /// stated by each attributor, so that a new one cannot report under another's label.
    fn collector(&self) -> &'static str;
    /// Re-reads the allocations; an error leaves the previous state in place.
    fn refresh(&mut self) -> Result<(), String>;
    /// Sets the attribution of every reading it maps.
    fn apply(&self, readings: &mut [Reading]);
    /// How many devices the attributor's scheduler knows, for `/metrics`; `None` when it does
    /// not count them.
    fn device_counts(&self) -> Option<DeviceCounts> {
        None
    }
    /// Every live workload holding each reading's device, index-aligned with `readings` (empty
    /// when this attributor does not say): several pods on one time-sliced device all hold it,
    /// though the ledger charges one ([`shares`] gives the others their zero).
    fn holders(&self, readings: &[Reading]) -> Vec<Vec<gpuledger_schema::Attribution>> {
        let _ = readings;
        Vec::new()
    }
    /// Names the owner of a process ([`shares`]): `None` when this attributor does not know it.
    fn owner_attribution(&self, owner: &shares::Owner) -> Option<gpuledger_schema::Attribution> {
        let _ = owner;
        None
    }
}

/// NVML index of each GPU in `readings`: the index the source gives, else the GPU's position
/// (sources list GPUs in NVML enumeration order).
pub fn gpu_indices(readings: &[Reading]) -> std::collections::HashMap<String, u32> {
    let mut indices = std::collections::HashMap::new();
    for r in readings {
        let next = indices.len() as u32;
        indices
            .entry(r.instance.gpu_uuid.clone())
            .or_insert(r.gpu_index.unwrap_or(next));
    }
    indices
}
