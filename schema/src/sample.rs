//! One GPU instance, one second: [`Sample`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The service class of the workload holding an instance; drives reclaim policy and alerting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SloClass {
    /// Online inference: idle capacity is headroom, reclaimed last.
    LatencyCritical,
    /// Notebooks and shells: idle capacity is the usual hoarding suspect.
    Interactive,
    /// Training and batch jobs.
    Batch,
}

impl SloClass {
    /// Every class, in a fixed order.
    pub const ALL: [SloClass; 3] = [
        SloClass::LatencyCritical,
        SloClass::Interactive,
        SloClass::Batch,
    ];

    /// The name used in CSV, JSON and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            SloClass::LatencyCritical => "latency_critical",
            SloClass::Interactive => "interactive",
            SloClass::Batch => "batch",
        }
    }
}

impl fmt::Display for SloClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a string that names no [`SloClass`].
#[derive(Debug, thiserror::Error)]
#[error("unknown SLO class {0:?} (expected latency_critical, interactive or batch)")]
pub struct UnknownSloClass(pub String);

impl FromStr for SloClass {
    type Err = UnknownSloClass;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SloClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownSloClass(s.to_owned()))
    }
}

/// Which physical GPU and which slice of it: the identity of a series.
///
/// A whole GPU (no MIG) has `mig_profile`, `gpu_instance_id` and the placement all `None`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Instance {
    /// Kubernetes node name or host name.
    pub node: String,
    /// The physical GPU's UUID as NVML reports it (`GPU-…`).
    pub gpu_uuid: String,
    /// The GPU's product name as NVML reports it (`NVIDIA H100 80GB HBM3`).
    pub gpu_model: String,
    /// MIG profile name (`3g.40gb`); `None` for a whole GPU.
    pub mig_profile: Option<String>,
    /// MIG GPU instance id on its parent GPU; `None` for a whole GPU.
    pub gpu_instance_id: Option<u32>,
    /// First memory slice the instance occupies (NVML placement start).
    pub placement_start: Option<u32>,
    /// Number of memory slices the instance occupies (NVML placement size).
    pub placement_size: Option<u32>,
}

impl Instance {
    /// Compute slices out of seven: `3g.40gb` is 3, a whole GPU is 7. `None` for a profile name
    /// that does not start with `<n>g.`.
    pub fn compute_slices(&self) -> Option<u32> {
        match &self.mig_profile {
            None => Some(crate::mig::SLICES_PER_GPU),
            Some(p) => crate::mig::compute_slices_of(p),
        }
    }

    /// The instance's size in GPU-equivalents: compute slices / 7, a whole GPU is 1.
    pub fn gpu_equivalents(&self) -> Option<f64> {
        crate::mig::gpu_equivalents_of(self.mig_profile.as_deref())
    }
}

/// Who held an instance during a second. All `None` = not allocated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Attribution {
    /// The tenant charged for the instance (team, account, namespace owner).
    pub tenant: Option<String>,
    /// The workload holding it: a pod `namespace/name` or a Slurm job id.
    pub workload: Option<String>,
    /// The workload's service class.
    pub slo_class: Option<SloClass>,
    /// Who the workload runs for, where the attribution knows: the pod's owner label or
    /// annotation (the exporter's `--kube-owner-label` / `--kube-owner-annotation`), or the Slurm
    /// job's user. Carried to the notices; not part of what is charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// What the workload belongs to, as `Kind/name`: the pod's owner reference (`Job/train`,
    /// `StatefulSet/notebooks`) or the Slurm job's account (`Account/vision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_ref: Option<String>,
}

impl Attribution {
    /// Whether anyone holds the instance.
    pub fn is_allocated(&self) -> bool {
        self.tenant.is_some()
    }
}

/// The counters of one instance over one second. `None` means "not measured" (an unsupported
/// counter, a collector that failed), never zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// Fraction of time at least one warp was resident on an SM, averaged over the instance's SMs
    /// (DCGM SM_ACTIVE, NVML GPM SM_UTIL / 100). 0–1.
    pub sm_active: Option<f64>,
    /// Resident warps over the SMs' maximum (DCGM SM_OCCUPANCY, GPM SM_OCCUPANCY / 100). 0–1.
    pub sm_occupancy: Option<f64>,
    /// Fraction of cycles any tensor pipe was active (GPM ANY_TENSOR_UTIL / 100). 0–1.
    pub tensor_active: Option<f64>,
    /// Fraction of cycles the DRAM interface was busy (GPM DRAM_BW_UTIL / 100). 0–1.
    pub dram_active: Option<f64>,
    /// Framebuffer (HBM) bytes in use at the end of the second.
    pub fb_used_bytes: Option<u64>,
    /// Framebuffer (HBM) bytes of the instance.
    pub fb_total_bytes: Option<u64>,
    /// NVLink bytes transmitted during the second (whole GPUs only: MIG instances do no NVLink P2P).
    pub nvlink_tx_bytes: Option<u64>,
    /// NVLink bytes received during the second.
    pub nvlink_rx_bytes: Option<u64>,
}

/// Most HBM one instance can have: 16 TiB. The largest GPU shipping has 288 GB; the bound sits
/// far above any planned part and far below the point where an hour's sum of one instance's
/// bytes (3,600 × the bound) could overflow the ledger's 64-bit sums.
pub const MAX_FB_BYTES: u64 = 16 << 40;

/// Most NVLink bytes one GPU can move in one direction in one second: 8 TB. NVLink 5 carries
/// 0.9 TB/s each way per GPU, NVLink 6 is announced at 1.8 TB/s; a second read late (2–3 s of
/// traffic) still fits. Like [`MAX_FB_BYTES`], it keeps every hour's sum inside 64 bits.
pub const MAX_NVLINK_BYTES_PER_SECOND: u64 = 8_000_000_000_000;

/// Longest name (node, GPU UUID, model, MIG profile, tenant, workload), in bytes. A Kubernetes
/// pod's `namespace/name` is at most 317; nothing legitimate comes near.
pub const MAX_NAME_BYTES: usize = 512;

/// Whether `name` may travel as a tenant, workload or owner: not empty, at most
/// [`MAX_NAME_BYTES`], no control characters, no whitespace at either end (what
/// [`Sample::validate`] requires of them). What an attributor reads from outside (a pod
/// annotation) is checked with this before it is sent, so that one odd value cannot get every
/// batch of its node refused.
pub fn is_wire_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && !name.chars().any(char::is_control)
        && name.trim() == name
}

/// Largest MIG GPU instance id or placement value accepted. NVML's ids are below 16 and
/// placements are in eighths of the memory; the bound keeps them clear of the ledger's "whole
/// GPU" marker (−1) and of 32-bit overflow.
pub const MAX_MIG_ID: u32 = 1023;

impl Counters {
    /// Checks the rules of one second's counters: ratios within 0–1, used ≤ total memory, byte
    /// counts within what hardware can hold or move ([`MAX_FB_BYTES`],
    /// [`MAX_NVLINK_BYTES_PER_SECOND`]).
    pub fn validate(&self) -> Result<(), InvalidField> {
        for (field, v, max, what) in [
            (
                "fb_used_bytes",
                self.fb_used_bytes,
                MAX_FB_BYTES,
                "bytes of HBM",
            ),
            (
                "fb_total_bytes",
                self.fb_total_bytes,
                MAX_FB_BYTES,
                "bytes of HBM",
            ),
            (
                "nvlink_tx_bytes",
                self.nvlink_tx_bytes,
                MAX_NVLINK_BYTES_PER_SECOND,
                "NVLink bytes in one second",
            ),
            (
                "nvlink_rx_bytes",
                self.nvlink_rx_bytes,
                MAX_NVLINK_BYTES_PER_SECOND,
                "NVLink bytes in one second",
            ),
        ] {
            if let Some(v) = v
                && v > max
            {
                return Err(InvalidField {
                    field,
                    problem: format!("{v} is more {what} than any GPU has (at most {max})"),
                });
            }
        }
        for (field, v) in [
            ("sm_active", self.sm_active),
            ("sm_occupancy", self.sm_occupancy),
            ("tensor_active", self.tensor_active),
            ("dram_active", self.dram_active),
        ] {
            if let Some(v) = v
                && !(0.0..=1.0).contains(&v)
            {
                return Err(InvalidField {
                    field,
                    problem: format!("{v} is outside 0–1"),
                });
            }
        }
        if let (Some(used), Some(total)) = (self.fb_used_bytes, self.fb_total_bytes)
            && used > total
        {
            return Err(InvalidField {
                field: "fb_used_bytes",
                problem: format!("{used} exceeds fb_total_bytes {total}"),
            });
        }
        Ok(())
    }
}

/// One instance, one second: the unit of gpuledger.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The second the sample covers, as Unix seconds (UTC): `[timestamp, timestamp + 1)`.
    pub timestamp: i64,
    /// The instance sampled.
    pub instance: Instance,
    /// Who held it.
    pub attribution: Attribution,
    /// What it did.
    pub counters: Counters,
}

/// One owner's use of a shared instance during one second (the exporter's per-process view of
/// time-sliced and MPS GPUs). It does not change who the ledger charges for the instance.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareSample {
    /// The second, Unix seconds (UTC).
    pub timestamp: i64,
    /// The shared instance.
    pub instance: Instance,
    /// The owner of the processes; no tenant = they could not be named.
    pub attribution: Attribution,
    /// The owner's compute processes on the instance (0: a holder that runs nothing).
    pub processes: u32,
    /// Framebuffer bytes the processes hold.
    pub memory_used_bytes: Option<u64>,
    /// The owner's part of the instance's SM activity, 0–1; `None` = not attributable.
    pub sm_active: Option<f64>,
}

/// One physical GPU's energy during one second (a wire batch's `gpus`, a trace's
/// `gpu_energy_joules`).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    /// The second, Unix seconds (UTC).
    pub timestamp: i64,
    /// Node name.
    pub node: String,
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// NVML product name.
    pub gpu_model: String,
    /// Joules the GPU used in the second; `None` = not measured.
    pub energy_joules: Option<f64>,
}

/// Most energy one GPU can use in one second, joules: 100 kJ, over a hundred times any board's
/// power limit, so a second read late still fits, and far below what could overflow a sum.
pub const MAX_GPU_JOULES_PER_SECOND: f64 = 100_000.0;

/// A field of a sample that breaks the rules every representation shares.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidField {
    /// The field's name as the CSV column and the wire JSON name it.
    pub field: &'static str,
    /// What is wrong, as a sentence fragment.
    pub problem: String,
}

impl Sample {
    /// Checks the rules every representation shares: ratios within 0–1, used ≤ total memory,
    /// a MIG instance has its instance id, names are not empty.
    pub fn validate(&self) -> Result<(), InvalidField> {
        let bad = |field, problem: String| Err(InvalidField { field, problem });
        for (field, name) in [
            ("node", &self.instance.node),
            ("gpu_uuid", &self.instance.gpu_uuid),
            ("gpu_model", &self.instance.gpu_model),
        ] {
            if name.is_empty() {
                return bad(field, "must not be empty".into());
            }
        }
        for (field, name) in [
            ("node", Some(&self.instance.node)),
            ("gpu_uuid", Some(&self.instance.gpu_uuid)),
            ("gpu_model", Some(&self.instance.gpu_model)),
            ("mig_profile", self.instance.mig_profile.as_ref()),
            ("tenant", self.attribution.tenant.as_ref()),
            ("workload", self.attribution.workload.as_ref()),
            ("owner", self.attribution.owner.as_ref()),
            ("owner_ref", self.attribution.owner_ref.as_ref()),
        ] {
            if let Some(name) = name
                && name.len() > MAX_NAME_BYTES
            {
                return bad(
                    field,
                    format!("is {} bytes long; at most {MAX_NAME_BYTES}", name.len()),
                );
            }
        }
        for (field, name) in [
            ("node", Some(&self.instance.node)),
            ("gpu_uuid", Some(&self.instance.gpu_uuid)),
            ("tenant", self.attribution.tenant.as_ref()),
            ("workload", self.attribution.workload.as_ref()),
            ("owner", self.attribution.owner.as_ref()),
            ("owner_ref", self.attribution.owner_ref.as_ref()),
        ] {
            if let Some(name) = name {
                if name.chars().any(char::is_control) {
                    return bad(field, "must not hold control characters".into());
                }
                if name.trim() != name || name.is_empty() {
                    return bad(
                        field,
                        "must not be empty or begin or end with whitespace".into(),
                    );
                }
            }
        }
        for (field, v) in [
            ("gpu_instance_id", self.instance.gpu_instance_id),
            ("placement_start", self.instance.placement_start),
            ("placement_size", self.instance.placement_size),
        ] {
            if let Some(v) = v
                && v > MAX_MIG_ID
            {
                return bad(
                    field,
                    format!("{v} is not a MIG value (at most {MAX_MIG_ID})"),
                );
            }
        }
        self.counters.validate()?;
        if let Some(profile) = &self.instance.mig_profile {
            if crate::mig::compute_slices_of(profile).is_none() {
                return bad(
                    "mig_profile",
                    format!("{profile:?} is not a MIG profile name like 3g.40gb"),
                );
            }
            if self.instance.gpu_instance_id.is_none() {
                return bad("gpu_instance_id", "is required for a MIG instance".into());
            }
            // On a model the MIG tables know, the placement must be one the profile can have.
            if let (Some(p), Some(start), Some(size)) = (
                crate::mig::model(&self.instance.gpu_model).and_then(|m| m.profile(profile)),
                self.instance.placement_start,
                self.instance.placement_size,
            ) {
                if size != p.size {
                    return bad(
                        "placement_size",
                        format!("{size}: a {} instance covers {} slots", p.name, p.size),
                    );
                }
                if !p.can_start_at(start) {
                    return bad(
                        "placement_start",
                        format!(
                            "{start}: a {} instance starts at one of {:?}",
                            p.name, p.starts
                        ),
                    );
                }
            }
        } else if self.instance.gpu_instance_id.is_some() || self.instance.placement_start.is_some()
        {
            return bad(
                "mig_profile",
                "is required when gpu_instance_id or a placement is given".into(),
            );
        }
        if self.instance.placement_start.is_some() != self.instance.placement_size.is_some() {
            return bad(
                "placement_size",
                "placement_start and placement_size go together".into(),
            );
        }
        if self.attribution.tenant.is_none()
            && (self.attribution.workload.is_some() || self.attribution.slo_class.is_some())
        {
            return bad(
                "tenant",
                "is required when a workload or SLO class is given".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an attributor may send as an owner is exactly what validation accepts.
    #[test]
    fn a_wire_name_is_what_validation_accepts() {
        let long = "a".repeat(MAX_NAME_BYTES + 1);
        for (name, ok) in [
            ("alice", true),
            ("team vision", true),
            ("", false),
            (" alice", false),
            ("alice\n", false),
            ("line\nbreak", false),
            (long.as_str(), false),
        ] {
            assert_eq!(is_wire_name(name), ok, "{name:?}");
            let mut s = whole_gpu();
            s.attribution.owner = Some(name.into());
            assert_eq!(s.validate().is_ok(), ok, "{name:?}");
        }
    }

    fn whole_gpu() -> Sample {
        Sample {
            timestamp: 1_700_000_000,
            instance: Instance {
                node: "n1".into(),
                gpu_uuid: "GPU-1".into(),
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                mig_profile: None,
                gpu_instance_id: None,
                placement_start: None,
                placement_size: None,
            },
            attribution: Attribution::default(),
            counters: Counters {
                sm_active: Some(0.5),
                ..Counters::default()
            },
        }
    }

    #[test]
    fn gpu_equivalents_follow_compute_slices() {
        let mut s = whole_gpu();
        assert_eq!(s.instance.gpu_equivalents(), Some(1.0));
        s.instance.mig_profile = Some("3g.40gb".into());
        assert_eq!(s.instance.gpu_equivalents(), Some(3.0 / 7.0));
    }

    #[test]
    fn validation_names_the_field() {
        let mut s = whole_gpu();
        s.counters.sm_active = Some(1.5);
        assert_eq!(s.validate().unwrap_err().field, "sm_active");
        let mut s = whole_gpu();
        s.counters.fb_used_bytes = Some(2);
        s.counters.fb_total_bytes = Some(1);
        assert_eq!(s.validate().unwrap_err().field, "fb_used_bytes");
        let mut s = whole_gpu();
        s.attribution.workload = Some("ns/pod".into());
        assert_eq!(s.validate().unwrap_err().field, "tenant");
        let mut s = whole_gpu();
        s.instance.mig_profile = Some("3g.40gb".into());
        assert_eq!(s.validate().unwrap_err().field, "gpu_instance_id");
        assert!(whole_gpu().validate().is_ok());
    }

    /// Regression: byte counters near 2^64 passed validation, then overflowed the ledger's sums
    /// (an hour could never be stored, so the node's ingest stalled behind it).
    #[test]
    fn byte_counters_beyond_any_gpu_are_refused() {
        let mut s = whole_gpu();
        s.counters.nvlink_tx_bytes = Some(u64::MAX);
        assert_eq!(s.validate().unwrap_err().field, "nvlink_tx_bytes");
        let mut s = whole_gpu();
        s.counters.fb_used_bytes = Some(u64::MAX);
        s.counters.fb_total_bytes = Some(u64::MAX);
        assert_eq!(s.validate().unwrap_err().field, "fb_used_bytes");
        let mut s = whole_gpu();
        s.counters.fb_total_bytes = Some(MAX_FB_BYTES + 1);
        assert_eq!(s.validate().unwrap_err().field, "fb_total_bytes");
        let mut s = whole_gpu();
        s.counters.fb_total_bytes = Some(MAX_FB_BYTES);
        s.counters.nvlink_rx_bytes = Some(MAX_NVLINK_BYTES_PER_SECOND);
        assert!(s.validate().is_ok(), "the bounds themselves are accepted");
        // An hour of the largest values still fits the ledger's 64-bit sums.
        assert!(MAX_NVLINK_BYTES_PER_SECOND.checked_mul(3600).is_some());
        assert!(MAX_FB_BYTES.checked_mul(3600).is_some());
    }

    /// Regression: gpu_instance_id 4294967295 was stored as −1, the "whole GPU" marker.
    #[test]
    fn gpu_instance_id_4294967295_is_refused_not_stored_as_a_whole_gpu() {
        let mut s = whole_gpu();
        s.instance.mig_profile = Some("1g.10gb".into());
        s.instance.gpu_instance_id = Some(u32::MAX);
        assert_eq!(s.validate().unwrap_err().field, "gpu_instance_id");
        let mut s = whole_gpu();
        s.attribution.tenant = Some("t".repeat(MAX_NAME_BYTES + 1));
        assert_eq!(s.validate().unwrap_err().field, "tenant");
    }

    #[test]
    fn slo_class_round_trips() {
        for c in SloClass::ALL {
            assert_eq!(c.as_str().parse::<SloClass>().unwrap(), c);
        }
        assert!("gold".parse::<SloClass>().is_err());
    }

    /// Regression: a `3g.40gb` instance with `placement_start` 1 or `placement_size` 1 was
    /// stored, though the MIG tables say it starts at 0 or 4 and covers 4 slots.
    #[test]
    fn a_mig_placement_off_the_profile_table_is_refused() {
        let mut s = whole_gpu();
        s.instance.gpu_model = "NVIDIA H100 80GB HBM3".into();
        s.instance.mig_profile = Some("3g.40gb".into());
        s.instance.gpu_instance_id = Some(2);
        s.instance.placement_start = Some(4);
        s.instance.placement_size = Some(4);
        assert_eq!(s.validate(), Ok(()));
        s.instance.placement_start = Some(1);
        assert_eq!(s.validate().unwrap_err().field, "placement_start");
        s.instance.placement_start = Some(0);
        s.instance.placement_size = Some(1);
        assert_eq!(s.validate().unwrap_err().field, "placement_size");
        // A model the tables do not know keeps whatever placement NVML reported.
        s.instance.gpu_model = "Some Future GPU".into();
        assert_eq!(s.validate(), Ok(()));
    }

    /// Regression: whitespace or NUL as a `gpu_uuid` (and around names) was accepted.
    #[test]
    fn whitespace_or_control_characters_in_names_are_refused() {
        for (field, value) in [
            ("gpu_uuid", " "),
            ("gpu_uuid", "GPU-1\0"),
            ("node", " n1"),
            ("node", "n1\n"),
            ("tenant", "team-a "),
            ("workload", "job\t7"),
        ] {
            let mut s = whole_gpu();
            s.attribution.tenant = Some("t".into());
            match field {
                "gpu_uuid" => s.instance.gpu_uuid = value.into(),
                "node" => s.instance.node = value.into(),
                "tenant" => s.attribution.tenant = Some(value.into()),
                _ => s.attribution.workload = Some(value.into()),
            }
            assert_eq!(s.validate().unwrap_err().field, field, "{value:?}");
        }
    }
}
