//! Shared GPUs without MIG (time-slicing, MPS): who uses how much of an instance, per process.
//!
//! The ledger charges an instance to the workload the scheduler allocated it to; when several
//! workloads share one instance, this view says what each of them uses. It is built each second
//! from the driver's process list (NVML running compute processes, MPS clients included):
//!
//! 1. Each process's owner is read from `<proc>/<pid>/cgroup` ([`owner_from_cgroup`]): a
//!    Kubernetes pod by UID (cgroupfs `pod<uid>` or systemd `kubepods-…-pod<uid>.slice`) or a
//!    Slurm job (`job_<id>`, cgroup v1 and v2). The attributors name the owner
//!    ([`super::Attributor::owner_attribution`]): the kubelet attributor through the API server's
//!    pod UIDs, Slurm through its job map.
//! 2. Processes are grouped by instance and by the owner's attribution into [`Share`]s.
//!
//! What each share says, and how exact it is:
//! - **Memory**: the sum of the framebuffer bytes NVML reports for the share's processes; exact.
//!   Absent when the driver cannot tell for one of them.
//! - **SM activity**: the instance's SM activity split in proportion to NVML's per-process SM
//!   utilisation (`nvmlDeviceGetProcessUtilization`), so the shares of an instance sum to its
//!   activity. When the whole instance is used by one owner, that owner gets all of it, with or
//!   without per-process figures; so does the one owner on an instance whose processes include
//!   the MPS server's listed clients (the driver counts their kernels against the server and
//!   gives the clients no figure), the server's own share being zero. Otherwise, where the
//!   driver gives no per-process utilisation (MIG mode, drivers without it), reports none while
//!   the instance was active, or counts kernels against the MPS server that are not one owner's
//!   listed clients', the split is **not attributable** and left absent: never guessed.
//! - A process whose owner cannot be named (exited, not in a pod or job, a pod UID unknown
//!   without API-server access) is counted in a share with no tenant: unattributed, not dropped.
//! - On a device the scheduler gave to several workloads ([`super::Attributor::holders`]), each
//!   holder without a process has a share of exactly zero: the idle replica holders show. Not
//!   while a process on the device is unnamed, or its MPS server runs kernels and no client of
//!   it is listed (clients in another PID namespace): they may be that holder's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use gpuledger_schema::{Attribution, Instance};

use crate::source::{ProcessReading, Reading};

/// Who runs a process, as its cgroup tells.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A Kubernetes pod, by UID (dashed form, as in `metadata.uid`).
    Pod {
        /// Pod UID.
        uid: String,
    },
    /// A Slurm job.
    SlurmJob {
        /// Job id.
        job_id: String,
    },
    /// The MPS server (`nvidia-cuda-mps-server`), outside any pod or job: it runs its clients'
    /// kernels, so utilisation the driver reports against it belongs to clients it does not name.
    MpsServer,
}

/// Reads the owner from the text of `/proc/<pid>/cgroup` (cgroup v1 or v2). The innermost
/// owner wins: a Slurm job inside a slurmd pod (Slinky, soperator) is the job's.
pub fn owner_from_cgroup(text: &str) -> Option<Owner> {
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .find_map(|path| path.split('/').rev().find_map(owner_from_segment))
}

fn owner_from_segment(segment: &str) -> Option<Owner> {
    if let Some(id) = segment.strip_prefix("job_")
        && !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
    {
        return Some(Owner::SlurmJob {
            job_id: id.to_owned(),
        });
    }
    // cgroupfs: `pod<uid>`; systemd: `kubepods-<qos>-pod<uid with _ for ->.slice`.
    let at = segment.rfind("pod")?;
    if at > 0 && !segment[..at].ends_with('-') {
        return None;
    }
    let uid = segment[at + 3..]
        .trim_end_matches(".slice")
        .replace('_', "-");
    let is_uid = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    is_uid.then(|| Owner::Pod {
        uid: uid.to_ascii_lowercase(),
    })
}

/// The MPS server's program name.
const MPS_SERVER: &str = "nvidia-cuda-mps-server";

/// The kernel keeps a task's name in 15 bytes (`TASK_COMM_LEN` 16, with its NUL), so the MPS
/// server's `/proc/<pid>/comm` reads `nvidia-cuda-mps`: seen on an H100 (docs/perf/gpu.md, "Two
/// Slurm jobs on one GPU: time-sliced and under MPS"). The control daemon
/// (`nvidia-cuda-mps-control`) reads the same, but it holds no GPU context, so it is never in the
/// driver's process list that owners are asked for.
const COMM_LEN: usize = 15;

/// Whether `comm` (the text of `/proc/<pid>/comm`) names the MPS server.
fn is_mps_server(comm: &str) -> bool {
    let comm = comm.trim_end_matches('\n');
    comm == MPS_SERVER || comm == &MPS_SERVER[..COMM_LEN]
}

/// The host's `/proc` (or a fixture tree shaped like it, in tests).
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

impl ProcFs {
    /// `/proc` of the exporter's PID namespace, which must be the host's (`hostPID`).
    pub fn new(root: impl Into<PathBuf>) -> ProcFs {
        ProcFs { root: root.into() }
    }

    /// The owner of `pid`; `None` when the process is gone, invisible, or in no pod or job.
    /// A process in a pod or job is that owner's whatever its name: any process can take the
    /// MPS server's name (`prctl(PR_SET_NAME)`), so the name is believed only outside them, where
    /// the server runs (a system service, or a daemon started by the node's prolog).
    pub fn owner(&self, pid: u32) -> Option<Owner> {
        let dir = self.root.join(pid.to_string());
        let cgroup = std::fs::read_to_string(dir.join("cgroup")).ok();
        if let Some(owner) = cgroup.as_deref().and_then(owner_from_cgroup) {
            return Some(owner);
        }
        if std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| is_mps_server(&c)) {
            return Some(Owner::MpsServer);
        }
        None
    }
}

/// One owner's use of one instance during one second.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// The instance.
    pub instance: Instance,
    /// Who; no tenant = the processes' owner could not be named.
    pub attribution: Attribution,
    /// Processes counted.
    pub processes: u32,
    /// Framebuffer bytes the processes hold; `None` when the driver could not tell for one.
    pub memory_used_bytes: Option<u64>,
    /// The owner's part of the instance's SM activity, 0–1; `None` = not attributable.
    pub sm_active: Option<f64>,
}

#[derive(Default)]
struct Acc {
    processes: u32,
    memory: Option<u64>,
    memory_known: bool,
    sm_util: Option<f64>,
}

/// An instance: its GPU's UUID and MIG instance id.
type Key<'a> = (&'a str, Option<u32>);

/// What one instance's processes showed this second.
struct Seen {
    /// What each owner's processes add up to; an owner that could not be named has no tenant.
    owners: BTreeMap<Attribution, Acc>,
    /// Whether every process has a utilisation the split can use.
    util_known: bool,
    /// A process whose owner could not be named (the MPS server aside), or a busy MPS server
    /// with no client listed (its clients are in another PID namespace): a holder without a
    /// named process may own it, so it is not shown as idle.
    unnamed: bool,
    /// The owners with a process other than the MPS server.
    users: HashSet<Attribution>,
    /// Those of them with a process the driver lists as an MPS client.
    client_owners: HashSet<Attribution>,
    /// Whether the driver saw the MPS server running kernels.
    server_busy: bool,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            owners: BTreeMap::new(),
            util_known: true,
            unnamed: false,
            users: HashSet::new(),
            client_owners: HashSet::new(),
            server_busy: false,
        }
    }
}

impl Seen {
    /// The one user beside the MPS server, when its clients are the ones listed: the server
    /// runs its clients' kernels, so all the activity is that user's.
    fn only_user(&self) -> Option<Attribution> {
        let mut users = self.users.iter();
        match (users.next(), users.next()) {
            (Some(u), None) if self.client_owners.contains(u) => Some(u.clone()),
            _ => None,
        }
    }
}

/// Groups the second's processes into shares per instance and owner. `holders[i]` are the
/// workloads the scheduler gave reading `i` to (empty, or a short slice, where unknown): on a
/// device several of them hold, each holder without a process gets a share of exactly zero, so
/// the idle ones show. `owner_of` reads a PID's owner; `name` turns an owner into an attribution.
pub fn shares(
    readings: &[Reading],
    processes: &[ProcessReading],
    holders: &[Vec<Attribution>],
    owner_of: impl Fn(u32) -> Option<Owner>,
    name: impl Fn(&Owner) -> Option<Attribution>,
) -> Vec<Share> {
    let mut seen = tally(readings, processes, owner_of, name);
    let mut out = Vec::new();
    for (i, reading) in readings.iter().enumerate() {
        let key = (
            reading.instance.gpu_uuid.as_str(),
            reading.instance.gpu_instance_id,
        );
        match seen.get_mut(&key) {
            Some(at) => instance_shares(reading, at, holders.get(i), &mut out),
            None => instance_shares(reading, &mut Seen::default(), holders.get(i), &mut out),
        }
    }
    out
}

/// What the processes on each instance read this second showed.
fn tally<'a>(
    readings: &'a [Reading],
    processes: &'a [ProcessReading],
    owner_of: impl Fn(u32) -> Option<Owner>,
    name: impl Fn(&Owner) -> Option<Attribution>,
) -> HashMap<Key<'a>, Seen> {
    let read: HashSet<Key<'a>> = readings
        .iter()
        .map(|r| (r.instance.gpu_uuid.as_str(), r.instance.gpu_instance_id))
        .collect();
    let mut seen: HashMap<Key<'a>, Seen> = HashMap::new();
    for p in processes {
        let key = (p.gpu_uuid.as_str(), p.gpu_instance_id);
        // A process on an instance not read this second has nothing to be a share of.
        if !read.contains(&key) {
            continue;
        }
        let at = seen.entry(key).or_default();
        let owner = owner_of(p.pid);
        let attribution = owner.as_ref().and_then(&name).unwrap_or_default();
        // Kernels counted against the MPS server are its clients': the split cannot say whose.
        let mps_busy = owner == Some(Owner::MpsServer) && p.sm_util.is_some_and(|u| u > 0.0);
        at.server_busy |= mps_busy;
        if owner != Some(Owner::MpsServer) {
            at.unnamed |= attribution.tenant.is_none();
            at.users.insert(attribution.clone());
            if p.mps_client {
                at.client_owners.insert(attribution.clone());
            }
        }
        let acc = at.owners.entry(attribution).or_insert_with(|| Acc {
            memory_known: true,
            ..Acc::default()
        });
        acc.processes += 1;
        match p.used_memory_bytes {
            Some(b) => acc.memory = Some(acc.memory.unwrap_or(0) + b),
            None => acc.memory_known = false,
        }
        if let Some(u) = p.sm_util {
            acc.sm_util = Some(acc.sm_util.unwrap_or(0.0) + u);
        }
        at.util_known &= p.sm_util.is_some() && !mps_busy;
    }
    // A busy server with no client listed runs kernels of processes the driver did not show
    // (another PID namespace): a holder without a named process may own them.
    for at in seen.values_mut() {
        at.unnamed |= at.server_busy && at.client_owners.is_empty();
    }
    seen
}

/// The shares of one instance: one per owner with a process, and a share of zero for each
/// holder without one.
///
/// The instance's owners are taken from `seen`: a second reading of one instance (none is
/// expected) gets no owners again, while what the processes said of the instance still holds.
fn instance_shares(
    reading: &Reading,
    seen: &mut Seen,
    holders: Option<&Vec<Attribution>>,
    out: &mut Vec<Share>,
) {
    let idle_holders: Vec<&Attribution> = match holders {
        Some(h) if h.len() > 1 && !seen.unnamed => {
            h.iter().filter(|a| !seen.owners.contains_key(*a)).collect()
        }
        _ => Vec::new(),
    };
    let active = reading.counters.sm_active;
    let total: f64 = seen.owners.values().filter_map(|a| a.sm_util).sum();
    let single = seen.owners.len() == 1;
    let only_user = seen.only_user();
    for (attribution, acc) in std::mem::take(&mut seen.owners) {
        let sm_active = match active {
            None => None,
            Some(a) if single => Some(a),
            Some(a) if only_user.is_some() => Some(if only_user.as_ref() == Some(&attribution) {
                a
            } else {
                0.0
            }),
            Some(_) if !seen.util_known => None,
            Some(a) if total > 0.0 => Some(a * acc.sm_util.unwrap_or(0.0) / total),
            Some(a) if a == 0.0 => Some(0.0),
            Some(_) => None,
        };
        out.push(Share {
            instance: reading.instance.clone(),
            attribution,
            processes: acc.processes,
            memory_used_bytes: acc.memory.filter(|_| acc.memory_known),
            sm_active,
        });
    }
    // A holder with no process used nothing: exactly zero, not unknown.
    for attribution in idle_holders {
        out.push(Share {
            instance: reading.instance.clone(),
            attribution: attribution.clone(),
            processes: 0,
            memory_used_bytes: Some(0),
            sm_active: active.map(|_| 0.0),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_schema::Counters;

    const UID: &str = "3e2c9f4a-6b1d-4c8e-9a7f-0123456789ab";

    #[test]
    fn owners_are_read_from_every_cgroup_layout() {
        let pod = || {
            Some(Owner::Pod {
                uid: UID.to_owned(),
            })
        };
        // cgroup v1, cgroupfs driver.
        assert_eq!(
            owner_from_cgroup(&format!(
                "12:memory:/kubepods/burstable/pod{UID}/0f3a\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/0f3a\n"
            )),
            pod()
        );
        // cgroup v2, systemd driver (underscores in the UID).
        let underscored = UID.replace('-', "_");
        assert_eq!(
            owner_from_cgroup(&format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{underscored}.slice/cri-containerd-0f3a.scope\n"
            )),
            pod()
        );
        // Guaranteed QoS pods sit right under kubepods.
        assert_eq!(
            owner_from_cgroup(&format!(
                "0::/kubepods.slice/kubepods-pod{underscored}.slice/cri-containerd-0f3a.scope\n"
            )),
            pod()
        );
        // Slurm, cgroup v1 and v2.
        let job = || {
            Some(Owner::SlurmJob {
                job_id: "4242".into(),
            })
        };
        assert_eq!(
            owner_from_cgroup("4:memory:/slurm/uid_1000/job_4242/step_0/task_0\n"),
            job()
        );
        assert_eq!(
            owner_from_cgroup("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"),
            job()
        );
        // Neither: a system service, a plain Docker container, a truncated UID.
        assert_eq!(owner_from_cgroup("0::/system.slice/sshd.service\n"), None);
        assert_eq!(owner_from_cgroup("0::/docker/0f3a9c\n"), None);
        assert_eq!(owner_from_cgroup("0::/kubepods/pod3e2c9f4a\n"), None);
        assert_eq!(owner_from_cgroup("0::/user.slice/ipod0000/job_x\n"), None);
        // Slurm inside a slurmd pod (Slinky, soperator): the innermost owner, the job, wins.
        assert_eq!(
            owner_from_cgroup(&format!(
                "0::/kubepods.slice/kubepods-pod{underscored}.slice/cri-containerd-1.scope/system.slice/slurmstepd.scope/job_4242/step_0\n"
            )),
            job()
        );
        // Seen from another cgroup namespace, paths climb out with `..` first.
        assert_eq!(
            owner_from_cgroup(&format!(
                "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{underscored}.slice/cri-containerd-0f3a.scope\n"
            )),
            pod()
        );
    }

    #[test]
    fn holders_of_a_shared_device_without_a_process_get_a_share_of_zero() {
        let holder = |w: &str| Attribution {
            tenant: Some("acct1".into()),
            workload: Some(w.into()),
            slo_class: None,
            owner: None,
            owner_ref: None,
        };
        // Job 1 runs on the GPU; "idle" holds a replica of it and runs nothing.
        let got = shares(
            &[whole_gpu(Some(0.5))],
            &[process(10, Some(1 << 30), None)],
            &[vec![holder("1"), holder("idle")]],
            |_| Some(Owner::SlurmJob { job_id: "1".into() }),
            |_| Some(holder("1")),
        );
        let view: Vec<(&str, u32, Option<u64>, Option<f64>)> = got
            .iter()
            .map(|s| {
                (
                    s.attribution.workload.as_deref().unwrap(),
                    s.processes,
                    s.memory_used_bytes,
                    s.sm_active,
                )
            })
            .collect();
        // The one owner with processes has all the activity; the idle holder exactly none.
        assert_eq!(
            view,
            [
                ("1", 1, Some(1 << 30), Some(0.5)),
                ("idle", 0, Some(0), Some(0.0))
            ]
        );
        // An unnamed process on the device may be the other holder's: no zero share then.
        let got = shares(
            &[whole_gpu(Some(0.5))],
            &[process(10, Some(1), None), process(500, Some(1), None)],
            &[vec![holder("1"), holder("idle")]],
            |pid| (pid == 10).then(|| Owner::SlurmJob { job_id: "1".into() }),
            |_| Some(holder("1")),
        );
        assert!(got.iter().all(|s| s.processes > 0), "{got:?}");
        // A device with one holder needs no zero share: the instance series already shows it.
        let got = shares(
            &[whole_gpu(Some(0.0))],
            &[],
            &[vec![holder("idle")]],
            |_| None,
            |_| None,
        );
        assert!(got.is_empty());
    }

    #[test]
    fn the_mps_server_is_told_apart_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, comm, cgroup) in [
            // What the kernel writes: the first 15 bytes of the name.
            (
                7,
                "nvidia-cuda-mps\n",
                "0::/system.slice/nvidia-mps.service\n",
            ),
            (
                8,
                "python\n",
                "0::/system.slice/slurmstepd.scope/job_9/step_0\n",
            ),
            // A job's process that took the server's name is still the job's.
            (
                9,
                "nvidia-cuda-mps\n",
                "0::/system.slice/slurmstepd.scope/job_9/step_0\n",
            ),
        ] {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("comm"), comm).unwrap();
            std::fs::write(d.join("cgroup"), cgroup).unwrap();
        }
        let procfs = ProcFs::new(dir.path());
        assert_eq!(procfs.owner(7), Some(Owner::MpsServer));
        assert_eq!(
            procfs.owner(8),
            Some(Owner::SlurmJob { job_id: "9".into() })
        );
        assert_eq!(
            procfs.owner(9),
            Some(Owner::SlurmJob { job_id: "9".into() }),
            "a name cannot move a job's usage onto the server"
        );
        assert_eq!(procfs.owner(99), None, "a process that exited");
    }

    #[test]
    fn the_mps_server_is_told_apart_by_the_name_the_real_kernel_keeps() {
        // A program named as the server, run here and read through the real /proc: the kernel,
        // not a fixture, decides what `comm` holds. Beside the test binary, which can run
        // programs (a temporary directory may be mounted noexec).
        let here = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir_in(here.parent().unwrap()).unwrap();
        let server = dir.path().join(MPS_SERVER);
        let sleep = ["/bin/sleep", "/usr/bin/sleep"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("a sleep program");
        std::fs::copy(sleep, &server).unwrap();
        // Another test's fork may briefly hold the copy open for writing ("text file busy").
        let mut child = (0..50)
            .find_map(
                |_| match std::process::Command::new(&server).arg("30").spawn() {
                    Ok(c) => Some(c),
                    Err(e) if e.raw_os_error() == Some(26) => {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        None
                    }
                    Err(e) => panic!("cannot run {}: {e}", server.display()),
                },
            )
            .expect("the copy stayed busy");
        // The parent may run on before the kernel renames the child (it closes the child's
        // close-on-exec files, which `spawn` waits for, before it sets the new name).
        let read = || std::fs::read_to_string(format!("/proc/{}/comm", child.id())).unwrap();
        let mut comm = read();
        for _ in 0..200 {
            if comm.starts_with("nvidia") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            comm = read();
        }
        let owner = ProcFs::new("/proc").owner(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(comm, "nvidia-cuda-mps\n", "the kernel keeps 15 bytes");
        // Run inside a pod or a job (a CI runner's), the process is that owner's, by design.
        let ours = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let expected = owner_from_cgroup(&ours).unwrap_or(Owner::MpsServer);
        assert_eq!(owner, Some(expected));
    }

    fn whole_gpu(sm_active: Option<f64>) -> Reading {
        Reading {
            instance: Instance {
                node: "n".into(),
                gpu_uuid: "GPU-1".into(),
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                mig_profile: None,
                gpu_instance_id: None,
                placement_start: None,
                placement_size: None,
            },
            mig_uuid: None,
            gpu_index: None,
            attribution: Attribution::default(),
            counters: Counters {
                sm_active,
                ..Counters::default()
            },
        }
    }

    fn process(pid: u32, memory: Option<u64>, sm_util: Option<f64>) -> ProcessReading {
        ProcessReading {
            gpu_uuid: "GPU-1".into(),
            gpu_instance_id: None,
            pid,
            used_memory_bytes: memory,
            sm_util,
            mps_client: false,
        }
    }

    /// PIDs below 100 belong to job 1, below 200 to job 2, others to nobody.
    fn split(
        readings: &[Reading],
        processes: &[ProcessReading],
    ) -> Vec<(Option<String>, u32, Option<u64>, Option<f64>)> {
        shares(
            readings,
            processes,
            &[],
            |pid| {
                (pid < 200).then(|| Owner::SlurmJob {
                    job_id: if pid < 100 { "1" } else { "2" }.into(),
                })
            },
            |o| match o {
                Owner::SlurmJob { job_id } => Some(Attribution {
                    tenant: Some(format!("acct{job_id}")),
                    workload: Some(job_id.clone()),
                    slo_class: None,
                    owner: None,
                    owner_ref: None,
                }),
                _ => None,
            },
        )
        .into_iter()
        .map(|s| {
            (
                s.attribution.tenant,
                s.processes,
                s.memory_used_bytes,
                s.sm_active,
            )
        })
        .collect()
    }

    #[test]
    fn memory_is_summed_exactly_and_activity_split_by_per_process_utilisation() {
        let got = split(
            &[whole_gpu(Some(0.8))],
            &[
                process(10, Some(1 << 30), Some(0.3)),
                process(11, Some(2 << 30), Some(0.1)),
                process(150, Some(4 << 30), Some(0.4)),
                process(500, Some(1 << 20), Some(0.0)),
            ],
        );
        assert_eq!(
            got,
            vec![
                (None, 1, Some(1 << 20), Some(0.0)),
                (
                    Some("acct1".into()),
                    2,
                    Some(3 << 30),
                    Some(0.8 * 0.4 / 0.8)
                ),
                (
                    Some("acct2".into()),
                    1,
                    Some(4 << 30),
                    Some(0.8 * 0.4 / 0.8)
                ),
            ]
        );
        let sum: f64 = got.iter().filter_map(|g| g.3).sum();
        assert!(
            (sum - 0.8).abs() < 1e-12,
            "shares sum to the instance's activity"
        );
    }

    #[test]
    fn activity_without_per_process_figures_is_not_attributable_unless_one_owner_uses_it() {
        // Two owners, no per-process utilisation (MIG mode, or a driver without it).
        let got = split(
            &[whole_gpu(Some(0.5))],
            &[process(10, Some(1), None), process(150, None, None)],
        );
        assert_eq!(
            got,
            vec![
                (Some("acct1".into()), 1, Some(1), None),
                (Some("acct2".into()), 1, None, None),
            ]
        );
        // One owner: it has all of the instance's activity.
        let got = split(
            &[whole_gpu(Some(0.5))],
            &[process(10, Some(1), None), process(11, Some(2), None)],
        );
        assert_eq!(got, vec![(Some("acct1".into()), 2, Some(3), Some(0.5))]);
        // The driver saw no kernels while the instance was busy: not attributable.
        let got = split(
            &[whole_gpu(Some(0.5))],
            &[
                process(10, Some(1), Some(0.0)),
                process(150, Some(1), Some(0.0)),
            ],
        );
        assert!(got.iter().all(|g| g.3.is_none()));
        // Utilisation reported against the MPS server belongs to clients it does not name.
        let mps = |pid| {
            if pid == 999 {
                Some(Owner::MpsServer)
            } else {
                Some(Owner::SlurmJob {
                    job_id: if pid < 100 { "1" } else { "2" }.into(),
                })
            }
        };
        let named = |o: &Owner| match o {
            Owner::SlurmJob { job_id } => Some(Attribution {
                tenant: Some(format!("acct{job_id}")),
                ..Attribution::default()
            }),
            _ => None,
        };
        let with_server = |server_util| {
            shares(
                &[whole_gpu(Some(0.5))],
                &[
                    process(10, Some(1), Some(0.1)),
                    process(150, Some(1), Some(0.1)),
                    process(999, Some(1), Some(server_util)),
                ],
                &[],
                mps,
                named,
            )
        };
        assert!(with_server(0.3).iter().all(|s| s.sm_active.is_none()));
        let idle_server = with_server(0.0);
        assert_eq!(idle_server[0].attribution.tenant, None, "the server itself");
        assert_eq!(idle_server[0].sm_active, Some(0.0));
        assert!((idle_server[1].sm_active.unwrap() - 0.25).abs() < 1e-12);
        // One job's clients (the driver gives MPS clients no figure of their own) and a busy
        // server: the job used all of it, the server's own share nothing.
        let client = |pid| ProcessReading {
            mps_client: true,
            ..process(pid, Some(1), None)
        };
        let view = |got: Vec<Share>| -> Vec<(Option<String>, u32, Option<f64>)> {
            got.into_iter()
                .map(|s| (s.attribution.tenant, s.processes, s.sm_active))
                .collect()
        };
        let busy_server = process(999, Some(1), Some(0.99));
        let one_job = shares(
            &[whole_gpu(Some(0.5))],
            &[client(10), client(11), busy_server.clone()],
            &[],
            mps,
            named,
        );
        assert_eq!(
            view(one_job),
            vec![(None, 1, Some(0.0)), (Some("acct1".into()), 2, Some(0.5))]
        );
        // The same job with a process that is not the server's client: the server's kernels are
        // of clients the driver did not list, so whose is not known.
        let not_a_client = shares(
            &[whole_gpu(Some(0.5))],
            &[process(10, Some(1), None), busy_server.clone()],
            &[],
            mps,
            named,
        );
        assert!(view(not_a_client).iter().all(|s| s.2.is_none()));
        // Two holders, no process of theirs listed, and a busy server: either may own its
        // unlisted clients, so neither is shown as idle.
        let holders = vec![vec![
            Attribution {
                tenant: Some("acct1".into()),
                ..Attribution::default()
            },
            Attribution {
                tenant: Some("acct2".into()),
                ..Attribution::default()
            },
        ]];
        let unlisted = shares(
            &[whole_gpu(Some(0.5))],
            &[busy_server.clone()],
            &holders,
            mps,
            named,
        );
        assert_eq!(view(unlisted), vec![(None, 1, Some(0.5))]);
        let idle_server = shares(
            &[whole_gpu(Some(0.0))],
            &[process(999, Some(1), Some(0.0))],
            &holders,
            mps,
            named,
        );
        assert_eq!(
            view(idle_server).len(),
            3,
            "an idle server hides no holder: both show as idle"
        );
        // A process on an instance not read this second is no share of anything.
        let mut elsewhere = process(10, Some(1), Some(0.5));
        elsewhere.gpu_uuid = "GPU-2".into();
        assert!(split(&[whole_gpu(Some(0.5))], &[elsewhere]).is_empty());
    }
}
