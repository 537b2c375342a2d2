//! Slurm attribution: the prolog/epilog in deploy/slurm run with a fake Slurm environment (Slurm
//! itself cannot run here; the environment variables are what slurmd hands a Prolog), are
//! shellcheck-clean, and the exporter charges a MIG slice to the job's account.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::{Exporter, eventually, require_tool};
use gpuledger_exporter::source::sim::{Fleet, Simulator};

fn run_script(script: &str, dir: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new("bash");
    cmd.arg(format!(
        "{}/deploy/slurm/{script}",
        common::root().display()
    ))
    .env_clear()
    .env("PATH", std::env::var("PATH").unwrap())
    .env("GPULEDGER_JOBMAP_DIR", dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{script} must never fail a job: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn the_scripts_are_shellcheck_clean() {
    require_tool("shellcheck");
    let out = Command::new("shellcheck")
        .arg(format!(
            "{}/deploy/slurm/gpuledger-prolog.sh",
            common::root().display()
        ))
        .arg(format!(
            "{}/deploy/slurm/gpuledger-epilog.sh",
            common::root().display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_prolog_maps_every_device_form_and_the_epilog_removes_only_its_job() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("jobs");
    let job = [
        ("SLURM_JOB_ID", "101"),
        ("SLURM_JOB_USER", "alice"),
        ("SLURM_JOB_ACCOUNT", "physics"),
        ("SLURM_JOB_PARTITION", "gpu"),
        ("SLURM_JOB_QOS", "high"),
        ("SLURM_JOB_GPUS", "0,3"),
        (
            "CUDA_VISIBLE_DEVICES",
            "MIG-4f1c2b7e-0000-4000-8000-000000000001, GPU-9a8b7c6d-0000-4000-8000-000000000002,MIG-GPU-x/1/0",
        ),
    ];
    let out = run_script("gpuledger-prolog.sh", &dir, &job);
    assert!(String::from_utf8_lossy(&out.stderr).contains("ignoring the old MIG id form"));
    assert_eq!(
        files(&dir),
        [
            "0",
            "3",
            "GPU-9a8b7c6d-0000-4000-8000-000000000002",
            "MIG-4f1c2b7e-0000-4000-8000-000000000001",
            "job-101"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("MIG-4f1c2b7e-0000-4000-8000-000000000001")).unwrap(),
        "job_id=101\nuser=alice\naccount=physics\npartition=gpu\nqos=high\n"
    );

    // Device 3 is handed to job 102 before job 101's epilog runs.
    run_script(
        "gpuledger-prolog.sh",
        &dir,
        &[
            ("SLURM_JOB_ID", "102"),
            ("SLURM_JOB_ACCOUNT", "chem"),
            ("SLURM_JOB_GPUS", "3"),
        ],
    );
    run_script("gpuledger-epilog.sh", &dir, &[("SLURM_JOB_ID", "101")]);
    assert_eq!(files(&dir), ["3", "job-102"]);
    assert!(
        std::fs::read_to_string(dir.join("3"))
            .unwrap()
            .starts_with("job_id=102\n")
    );

    // A job with no GPU named (a CPU job, or GPU shards the prolog does not see) writes only its
    // job record; outside Slurm the scripts say so and succeed.
    let empty = tmp.path().join("empty");
    run_script("gpuledger-prolog.sh", &empty, &[("SLURM_JOB_ID", "103")]);
    assert_eq!(files(&empty), ["job-103"]);
    let out = run_script("gpuledger-epilog.sh", &dir, &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("SLURM_JOB_ID is not set"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_exporter_charges_a_mig_slice_to_the_jobs_account() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("jobs");
    let sim = Simulator::new(Fleet::builtin());
    let target = sim
        .second(Some("gpu-h100-01"), 0)
        .readings
        .into_iter()
        .nth(9)
        .unwrap();
    let mig_uuid = target.mig_uuid.clone().unwrap();
    run_script(
        "gpuledger-prolog.sh",
        &dir,
        &[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_JOB_USER", "bob"),
            ("SLURM_JOB_ACCOUNT", "physics"),
            ("SLURM_JOB_QOS", "high"),
            ("CUDA_VISIBLE_DEVICES", &mig_uuid),
        ],
    );
    let exporter = Exporter::start(&[
        "--source",
        "sim",
        "--node",
        "gpu-h100-01",
        "--slurm-job-dir",
        dir.to_str().unwrap(),
        "--slurm-qos-class",
        "high=latency_critical",
    ])
    .await;
    let gi = format!(
        "gpu_instance_id=\"{}\"",
        target.instance.gpu_instance_id.unwrap()
    );
    let gpu = format!("gpu_uuid=\"{}\"", target.instance.gpu_uuid);
    let line = eventually(
        "the slice labelled with the job",
        Duration::from_secs(20),
        async || {
            let text = exporter.metrics("text/plain").await;
            text.lines()
                .find(|l| {
                    l.starts_with("gpuledger_instance_fb_total_bytes{")
                        && l.contains(&gi)
                        && l.contains(&gpu)
                })
                .map(str::to_owned)
                .filter(|l| l.contains("tenant=\"physics\""))
        },
    )
    .await;
    assert!(
        line.contains("workload=\"4242\"") && line.contains("slo_class=\"latency_critical\""),
        "{line}"
    );
    assert!(
        exporter
            .metrics("text/plain")
            .await
            .contains("gpuledger_exporter_collector_success{collector=\"attribution_slurm\"} 1")
    );

    // The job ends: the slice is no longer charged to it.
    run_script("gpuledger-epilog.sh", &dir, &[("SLURM_JOB_ID", "4242")]);
    eventually(
        "the job's series gone",
        Duration::from_secs(20),
        async || {
            (!exporter
                .metrics("text/plain")
                .await
                .contains("tenant=\"physics\""))
            .then_some(())
        },
    )
    .await;
}

#[test]
fn jobs_sharing_a_gpu_are_split_per_process_and_named_by_account() {
    use gpuledger_exporter::attribution::Attributor;
    use gpuledger_exporter::attribution::shares::{ProcFs, shares};
    use gpuledger_exporter::attribution::slurm::{SlurmJobMap, TenantField};
    use gpuledger_exporter::source::ProcessReading;

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("jobs");
    // Two jobs on GPU 4 of gpu-h100-02 (GRES shards): the second prolog takes the device file.
    for (job, account) in [("501", "physics"), ("502", "chem")] {
        run_script(
            "gpuledger-prolog.sh",
            &dir,
            &[
                ("SLURM_JOB_ID", job),
                ("SLURM_JOB_ACCOUNT", account),
                ("SLURM_JOB_GPUS", "4"),
            ],
        );
    }
    let mut map = SlurmJobMap::new(&dir, TenantField::Account, Default::default());
    map.refresh().unwrap();
    let sim = Simulator::new(Fleet::builtin());
    let mut readings = sim.second(Some("gpu-h100-02"), 0).readings;
    map.apply(&mut readings);
    let gpu = readings
        .iter_mut()
        .find(|r| r.instance.mig_profile.is_none())
        .unwrap();
    // The ledger charges the device to the job holding its file; the processes say who uses it.
    gpu.counters.sm_active = Some(0.5);
    let uuid = gpu.instance.gpu_uuid.clone();
    assert_eq!(gpu.attribution.tenant.as_deref(), Some("chem"));

    // A fixture of the host's /proc (it stands in for the jobs' processes): cgroup v2 for job
    // 501, v1 for job 502.
    let procfs = tmp.path().join("proc");
    for (pid, cgroup) in [
        (
            11,
            "0::/system.slice/slurmstepd.scope/job_501/step_0/user/task_0\n",
        ),
        (12, "4:memory:/slurm/uid_1000/job_502/step_batch/task_0\n"),
    ] {
        std::fs::create_dir_all(procfs.join(pid.to_string())).unwrap();
        std::fs::write(procfs.join(pid.to_string()).join("cgroup"), cgroup).unwrap();
    }
    let process = |pid, bytes, sm| ProcessReading {
        gpu_uuid: uuid.clone(),
        gpu_instance_id: None,
        pid,
        used_memory_bytes: Some(bytes),
        sm_util: Some(sm),
        mps_client: false,
    };
    let procfs = ProcFs::new(procfs);
    let got = shares(
        &readings,
        &[process(11, 3 << 30, 0.75), process(12, 1 << 30, 0.25)],
        &map.holders(&readings),
        |pid| procfs.owner(pid),
        |o| map.owner_attribution(o),
    );
    let view: Vec<(&str, &str, Option<u64>, Option<f64>)> = got
        .iter()
        .map(|s| {
            (
                s.attribution.tenant.as_deref().unwrap(),
                s.attribution.workload.as_deref().unwrap(),
                s.memory_used_bytes,
                s.sm_active,
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            ("chem", "502", Some(1 << 30), Some(0.125)),
            ("physics", "501", Some(3 << 30), Some(0.375)),
        ]
    );
}
