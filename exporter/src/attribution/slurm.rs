//! Slurm: a per-device job map directory, written by the prolog and removed by the epilog that
//! ship in `deploy/slurm/` (the scheme of jobstats and of dcgm-exporter's HPC job mapping).
//!
//! Each file in the directory is named after a device — a MIG UUID (`MIG-…`), a GPU UUID
//! (`GPU-…`) or an NVML GPU index (`0`) — and holds `key=value` lines: `job_id`, `user`,
//! `account`, `partition`, `qos`. The tenant is one of those fields (`account` by default); the
//! workload is the job id; the SLO class comes from a QoS map (unmapped QoS: `batch`). One more
//! file per job, `job-<id>`, matches no device: it names the job's processes on a GPU it shares
//! with other jobs ([`super::shares`]), whose device file may be another job's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use gpuledger_schema::sample::is_wire_name;
use gpuledger_schema::{Attribution, SloClass};

use super::Attributor;
use crate::source::Reading;

/// Which job field names the tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantField {
    /// The Slurm account (the default: accounts are what sites charge).
    Account,
    /// The user.
    User,
    /// The partition.
    Partition,
    /// The QoS.
    Qos,
}

impl FromStr for TenantField {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "account" => TenantField::Account,
            "user" => TenantField::User,
            "partition" => TenantField::Partition,
            "qos" => TenantField::Qos,
            _ => {
                return Err(format!(
                    "{s:?} is not a Slurm tenant field (account, user, partition or qos)"
                ));
            }
        })
    }
}

/// One device's job, as the prolog wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Slurm job id.
    pub job_id: String,
    /// Fields by name.
    pub fields: BTreeMap<String, String>,
}

/// Parses a job file's `key=value` lines; `job_id` is required.
pub fn parse_job(text: &str) -> Result<Job, String> {
    let mut fields = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: expected key=value", n + 1))?;
        fields.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    let job_id = fields
        .get("job_id")
        .filter(|j| !j.is_empty())
        .cloned()
        .ok_or("no job_id")?;
    Ok(Job { job_id, fields })
}

/// The job map directory and how to read it.
pub struct SlurmJobMap {
    dir: PathBuf,
    tenant: TenantField,
    qos_classes: HashMap<String, SloClass>,
    jobs: HashMap<String, Job>,
    bad_files_logged: std::collections::HashSet<PathBuf>,
    /// Device files naming no instance here, as of the last `apply`, and those already logged.
    unmatched: std::sync::Mutex<(u64, std::collections::HashSet<String>)>,
    assigned: std::sync::atomic::AtomicU64,
}

impl SlurmJobMap {
    /// A map over `dir`.
    pub fn new(
        dir: &Path,
        tenant: TenantField,
        qos_classes: HashMap<String, SloClass>,
    ) -> SlurmJobMap {
        SlurmJobMap {
            dir: dir.to_owned(),
            tenant,
            qos_classes,
            jobs: HashMap::new(),
            bad_files_logged: Default::default(),
            unmatched: Default::default(),
            assigned: Default::default(),
        }
    }

    fn attribution(&self, job: &Job) -> Option<Attribution> {
        let key = match self.tenant {
            TenantField::Account => "account",
            TenantField::User => "user",
            TenantField::Partition => "partition",
            TenantField::Qos => "qos",
        };
        let tenant = job.fields.get(key).filter(|t| !t.is_empty())?.clone();
        let qos = job.fields.get("qos").map(String::as_str).unwrap_or("");
        Some(Attribution {
            tenant: Some(tenant),
            workload: Some(job.job_id.clone()),
            slo_class: Some(
                self.qos_classes
                    .get(qos)
                    .copied()
                    .unwrap_or(SloClass::Batch),
            ),
            owner: job.fields.get("user").filter(|u| is_wire_name(u)).cloned(),
            owner_ref: job
                .fields
                .get("account")
                .filter(|a| !a.is_empty())
                .map(|a| format!("Account/{a}"))
                .filter(|a| is_wire_name(a)),
        })
    }

    /// Devices currently mapped, by file name.
    pub fn jobs(&self) -> &HashMap<String, Job> {
        &self.jobs
    }
}

impl Attributor for SlurmJobMap {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn collector(&self) -> &'static str {
        "attribution_slurm"
    }

    fn refresh(&mut self) -> Result<(), String> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            // No job has run on this node since boot: nothing is allocated.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.jobs.clear();
                return Ok(());
            }
            Err(e) => {
                return Err(format!(
                    "cannot read the Slurm job map {}: {e}",
                    self.dir.display()
                ));
            }
        };
        let mut jobs = HashMap::new();
        for entry in entries {
            let entry = entry.map_err(|e| e.to_string())?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue; // the prolog's temporary files
            }
            let path = entry.path();
            match std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| parse_job(&t))
            {
                Ok(job) => {
                    jobs.insert(name, job);
                }
                Err(e) => {
                    if self.bad_files_logged.insert(path.clone()) {
                        tracing::warn!(file = %path.display(), error = %e, "Ignoring an unreadable Slurm job map file.");
                    }
                }
            }
        }
        self.jobs = jobs;
        Ok(())
    }

    fn owner_attribution(&self, owner: &super::shares::Owner) -> Option<Attribution> {
        let super::shares::Owner::SlurmJob { job_id } = owner else {
            return None;
        };
        let job = self.jobs.values().find(|j| &j.job_id == job_id)?;
        self.attribution(job)
    }

    fn apply(&self, readings: &mut [Reading]) {
        // A whole GPU is matched by UUID or NVML index, a MIG slice by its MIG UUID.
        let gpu_index = super::gpu_indices(readings);
        let mut matched: HashSet<String> = HashSet::new();
        // The jobs charged for a slice of each MIG-mode GPU, by the GPU's UUID and index: the
        // prolog also writes the GPU's index from SLURM_JOB_GPUS, which is then no stray.
        let mut mig_jobs: HashMap<String, HashSet<String>> = HashMap::new();
        for r in readings.iter_mut() {
            let index = gpu_index[&r.instance.gpu_uuid].to_string();
            let names: Vec<&str> = match (&r.mig_uuid, &r.instance.mig_profile) {
                (Some(mig), Some(_)) => vec![mig.as_str()],
                (_, Some(_)) => vec![],
                (_, None) => vec![r.instance.gpu_uuid.as_str(), index.as_str()],
            };
            matched.extend(
                names
                    .iter()
                    .filter(|n| self.jobs.contains_key(**n))
                    .map(|n| n.to_string()),
            );
            let Some(job) = names.iter().find_map(|n| self.jobs.get(*n)) else {
                continue;
            };
            if r.instance.mig_profile.is_some() {
                for gpu in [r.instance.gpu_uuid.clone(), index] {
                    mig_jobs.entry(gpu).or_default().insert(job.job_id.clone());
                }
            }
            if let Some(a) = self.attribution(job) {
                r.attribution = a;
            }
        }
        // `job-<id>` records name processes, not devices.
        let devices: Vec<&String> = self
            .jobs
            .keys()
            .filter(|n| !n.starts_with("job-"))
            .collect();
        let stray = |name: &String| {
            !matched.contains(name)
                && !mig_jobs
                    .get(name)
                    .is_some_and(|jobs| jobs.contains(&self.jobs[name].job_id))
        };
        let mut unmatched = self.unmatched.lock().unwrap_or_else(|e| e.into_inner());
        unmatched.0 = 0;
        for name in devices.iter().filter(|n| stray(n)) {
            unmatched.0 += 1;
            if unmatched.1.insert((*name).clone()) {
                tracing::warn!(device = %name, job = %self.jobs[*name].job_id, "A Slurm job map file names a device that matches no GPU or MIG instance on this node; the job is not charged for it. A MIG slice must be named by its MIG UUID (CUDA_VISIBLE_DEVICES), not only by an index.");
            }
        }
        self.assigned
            .store(devices.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    fn device_counts(&self) -> Option<super::DeviceCounts> {
        Some(super::DeviceCounts {
            assigned: self.assigned.load(std::sync::atomic::Ordering::Relaxed),
            allocatable: None,
            unmatched: self.unmatched.lock().unwrap_or_else(|e| e.into_inner()).0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_schema::{Counters, Instance};

    fn reading(gpu: &str, mig: Option<&str>) -> Reading {
        Reading {
            instance: Instance {
                node: "n".into(),
                gpu_uuid: gpu.into(),
                gpu_model: "m".into(),
                mig_profile: mig.map(|_| "1g.10gb".into()),
                gpu_instance_id: mig.map(|_| 7),
                placement_start: None,
                placement_size: None,
            },
            mig_uuid: mig.map(Into::into),
            gpu_index: None,
            attribution: Attribution::default(),
            counters: Counters::default(),
        }
    }

    #[test]
    fn maps_mig_uuids_gpu_uuids_and_indices_to_the_configured_tenant_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("MIG-aaa"),
            "job_id=41\nuser=alice\naccount=physics\npartition=gpu\nqos=high\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("GPU-bbb"),
            "job_id=42\nuser=bob\naccount=chem\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("2"), "job_id=43\nuser=carol\naccount=bio\n").unwrap();
        std::fs::write(dir.path().join("junk"), "no equals sign\n").unwrap();
        std::fs::write(dir.path().join(".tmp.123"), "job_id=44\naccount=x\n").unwrap();
        let qos = HashMap::from([("high".to_owned(), SloClass::LatencyCritical)]);
        let mut map = SlurmJobMap::new(dir.path(), TenantField::Account, qos);
        map.refresh().unwrap();
        assert_eq!(map.jobs().len(), 3);
        let mut rs = vec![
            reading("GPU-zzz", Some("MIG-aaa")),
            reading("GPU-bbb", None),
            reading("GPU-ccc", None),
            reading("GPU-ddd", None),
        ];
        map.apply(&mut rs);
        assert_eq!(
            rs[0].attribution,
            Attribution {
                tenant: Some("physics".into()),
                workload: Some("41".into()),
                slo_class: Some(SloClass::LatencyCritical),
                owner: Some("alice".into()),
                owner_ref: Some("Account/physics".into()),
            }
        );
        assert_eq!(rs[1].attribution.tenant.as_deref(), Some("chem"));
        assert_eq!(rs[1].attribution.slo_class, Some(SloClass::Batch));
        assert_eq!(
            rs[2].attribution.workload.as_deref(),
            Some("43"),
            "index 2 is the third GPU listed"
        );
        assert_eq!(rs[3].attribution.tenant, None);
        assert_eq!(
            map.device_counts(),
            Some(crate::attribution::DeviceCounts {
                assigned: 3,
                allocatable: None,
                unmatched: 0
            })
        );

        let mut by_user = SlurmJobMap::new(dir.path(), TenantField::User, HashMap::new());
        by_user.refresh().unwrap();
        let mut rs = vec![reading("GPU-zzz", Some("MIG-aaa"))];
        by_user.apply(&mut rs);
        assert_eq!(rs[0].attribution.tenant.as_deref(), Some("alice"));
    }

    #[test]
    fn device_files_that_match_nothing_here_are_counted_and_job_records_are_not_devices() {
        let dir = tempfile::tempdir().unwrap();
        for (name, job) in [
            ("MIG-gone", 1),
            ("0", 2),
            ("job-2", 2),
            ("GPU-bbb", 3),
            // Job 3's GPU by index too (the prolog writes both forms): no stray.
            ("1", 3),
            // Job 4 holds a slice of MIG-mode GPU 0 by MIG UUID, and the prolog also wrote
            // GPU 0's UUID from SLURM_JOB_GPUS: no stray either.
            ("MIG-aaa", 4),
            ("GPU-zzz", 4),
        ] {
            std::fs::write(
                dir.path().join(name),
                format!("job_id={job}\naccount=physics\n"),
            )
            .unwrap();
        }
        let mut map = SlurmJobMap::new(dir.path(), TenantField::Account, HashMap::new());
        map.refresh().unwrap();
        // GPU 0 is in MIG mode: job 2's index names no slice of it, and MIG-gone is not here.
        let mut rs = vec![
            reading("GPU-zzz", Some("MIG-aaa")),
            reading("GPU-bbb", None),
        ];
        map.apply(&mut rs);
        assert_eq!(rs[0].attribution.workload.as_deref(), Some("4"));
        assert_eq!(rs[1].attribution.workload.as_deref(), Some("3"));
        assert_eq!(
            map.device_counts(),
            Some(crate::attribution::DeviceCounts {
                assigned: 6,
                allocatable: None,
                unmatched: 2
            })
        );
    }

    #[test]
    fn a_missing_directory_means_nothing_allocated() {
        let mut map = SlurmJobMap::new(
            Path::new("/nonexistent/gpuledger-jobs"),
            TenantField::Account,
            HashMap::new(),
        );
        assert!(map.refresh().is_ok());
        assert!(map.jobs().is_empty());
        assert!(parse_job("user=x\n").is_err());
    }
}
