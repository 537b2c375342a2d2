//! Against Slurm's own daemons: munged, slurmctld and slurmd of Debian's `slurm-wlm` and `munge`
//! packages, started on loopback by `tests/slurm/cluster.sh` (a one-node cluster whose two GPUs
//! are declared as generic resources; the GPUs themselves are the simulator's, as everywhere in
//! CI). slurmd runs the project's prolog and epilog for real; `sbatch`, `scancel` and `scontrol`
//! are the real clients. What the stand-ins of `slurm.rs` and `reclaimer.rs` still cover, and why:
//! MIG devices named by UUID and the per-process split by cgroup (this cluster has neither MIG nor
//! cgroup process tracking), and a controller that fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{
    ADMIN_TOKEN, Aggregator, Exporter, eventually, free_port, require_tool, root, token_file,
};
use serde_json::Value;

/// A running cluster; stopped (jobs cancelled, daemons gone) when dropped.
struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts a cluster whose node has `gpus` GPUs.
    fn start(gpus: u32) -> Cluster {
        for tool in ["munged", "slurmctld", "slurmd", "sbatch", "scontrol"] {
            require_tool(tool);
        }
        let uid = Command::new("id").arg("-u").output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&uid.stdout).trim(),
            "0",
            "the real Slurm daemons run as root here (tests/slurm/cluster.sh)"
        );
        let dir = tempfile::tempdir().unwrap();
        // slurmctld's port and slurmd's, the next one: two free ports in a row.
        let port = loop {
            let p = free_port();
            if std::net::TcpListener::bind(("0.0.0.0", p + 1)).is_ok() {
                break p;
            }
        };
        let out = Command::new("bash")
            .arg(root().join("tests/slurm/cluster.sh"))
            .arg("start")
            .arg(dir.path())
            .env("GPULEDGER_SLURM_GPUS", gpus.to_string())
            .env("GPULEDGER_SLURM_PORT", port.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tests/slurm/cluster.sh start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn jobs(&self) -> PathBuf {
        self.path().join("jobs")
    }

    /// A Slurm client command against this cluster.
    fn client(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", self.path().join("slurm.conf"))
            .current_dir(self.path());
        c
    }

    /// `sbatch --gres=gpu:1 --account=ACCOUNT --wrap SCRIPT`: the job id.
    fn submit(&self, account: &str, script: &str) -> String {
        let out = self
            .client("sbatch")
            .args([
                "--parsable",
                "--gres=gpu:1",
                "--account",
                account,
                "--wrap",
                script,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `scontrol show job -o ID`, one line of `Key=Value` fields.
    fn show(&self, job: &str) -> String {
        let out = self
            .client("scontrol")
            .args(["show", "job", "-o", job])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A field of `scontrol show job`.
    fn field(&self, job: &str, name: &str) -> Option<String> {
        self.show(job)
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=")).map(str::to_owned))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(root().join("tests/slurm/cluster.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `HH:MM:SS` (or `D-HH:MM:SS`) in seconds.
fn run_seconds(s: &str) -> i64 {
    let (days, hms) = s
        .split_once('-')
        .map_or((0, s), |(d, r)| (d.parse().unwrap(), r));
    let parts: Vec<i64> = hms.split(':').map(|p| p.parse().unwrap()).collect();
    days * 86_400 + parts.iter().fold(0, |acc, p| acc * 60 + p)
}

#[tokio::test(flavor = "multi_thread")]
async fn real_slurm_jobs_are_charged_to_their_account_while_they_run() {
    let cluster = Cluster::start(2);
    let dir = tempfile::tempdir().unwrap();
    let a = Aggregator::start(&dir.path().join("ledger.duckdb"), 0, &[]).await;
    let token = token_file(dir.path(), ADMIN_TOKEN);
    // The simulator's whole-GPU node: its GPUs 0 and 1 are Slurm's gres indices 0 and 1.
    let exporter = Exporter::start(&[
        "--source",
        "sim",
        "--node",
        "gpu-h200-01",
        "--slurm-job-dir",
        cluster.jobs().to_str().unwrap(),
        "--aggregator",
        &a.url(),
        "--token-file",
        token.to_str().unwrap(),
        "--spool-dir",
        dir.path().join("spool").to_str().unwrap(),
        "--ship-interval",
        "1s",
    ])
    .await;
    let from = chrono::Utc::now().timestamp();

    // Two jobs at once, one per GPU; the real slurmd runs the prolog, which writes the map.
    let physics = cluster.submit("physics", "sleep 12");
    let chem = cluster.submit("chem", "sleep 120");
    for job in [&physics, &chem] {
        let file = cluster.jobs().join(format!("job-{job}"));
        eventually(
            "the prolog's job record",
            Duration::from_secs(60),
            async || file.exists().then_some(()),
        )
        .await;
    }
    let gpus: Vec<String> = ["0", "1"]
        .iter()
        .map(|i| std::fs::read_to_string(cluster.jobs().join(i)).unwrap())
        .collect();
    let accounts: Vec<&str> = gpus
        .iter()
        .map(|g| g.lines().find_map(|l| l.strip_prefix("account=")).unwrap())
        .collect();
    let mut sorted = accounts.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["chem", "physics"], "one GPU each: {gpus:?}");

    // The exporter charges each GPU to its job's account, the workload being the job id.
    let labelled = eventually(
        "both jobs on /metrics",
        Duration::from_secs(20),
        async || {
            let text = exporter.metrics("text/plain").await;
            let lines: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("gpuledger_instance_fb_total_bytes{"))
                .filter(|l| l.contains("tenant=\"physics\"") || l.contains("tenant=\"chem\""))
                .map(str::to_owned)
                .collect();
            (lines.len() == 2).then_some(lines)
        },
    )
    .await;
    assert!(
        labelled
            .iter()
            .any(|l| l.contains("tenant=\"physics\"")
                && l.contains(&format!("workload=\"{physics}\""))),
        "{labelled:?}"
    );

    // One job is cancelled: the real epilog runs and its GPU is nobody's; the other goes on.
    let out = cluster.client("scancel").arg(&chem).output().unwrap();
    assert!(out.status.success());
    let chem_file = cluster.jobs().join(format!("job-{chem}"));
    eventually(
        "the cancelled job's epilog",
        Duration::from_secs(30),
        async || (!chem_file.exists()).then_some(()),
    )
    .await;
    eventually(
        "chem gone from /metrics",
        Duration::from_secs(20),
        async || {
            let text = exporter.metrics("text/plain").await;
            (!text.contains("tenant=\"chem\"") && text.contains("tenant=\"physics\"")).then_some(())
        },
    )
    .await;

    // The other ends on its own: the map is empty again.
    let physics_file = cluster.jobs().join(format!("job-{physics}"));
    eventually(
        "the finished job's epilog",
        Duration::from_secs(60),
        async || (!physics_file.exists()).then_some(()),
    )
    .await;
    let left: Vec<_> = std::fs::read_dir(cluster.jobs())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "the map after both jobs: {left:?}");

    // The ledger charges the account for the job's run time on one whole GPU. The exporter reads
    // the map once a second and the prolog and epilog bracket the job's run, so the two may
    // differ by a second or two at its edges.
    let run = run_seconds(&cluster.field(&physics, "RunTime").unwrap());
    assert!((11..=20).contains(&run), "sleep 12 ran {run} s");
    let to = chrono::Utc::now().timestamp() + 1;
    let showback = eventually(
        "the job's seconds in the ledger",
        Duration::from_secs(30),
        async || {
            let v: Value = reqwest::Client::new()
                .get(format!("{}/api/v1/showback?from={from}&to={to}", a.url()))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let row = v["rows"]
                .as_array()?
                .iter()
                .find(|r| r["tenant"] == "physics")?
                .clone();
            let held = row["allocated_gpu_seconds"].as_f64()?;
            ((held - run as f64).abs() <= 2.0).then_some(row)
        },
    )
    .await;
    assert!(showback["allocated_gpu_seconds"].as_f64().unwrap() > 10.0);
}

/// A signed `reclaim.requested` for `job`, from the reference implementation.
async fn reclaim(url: &str, id: &str, job: &str) -> (u16, Value) {
    let body = crate::common::receiver::episode_event("reclaim.requested", job, false);
    let (status, v, _) = crate::common::receiver::send_signed(url, id, &body, None).await;
    (status, v)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reclaimer_requeues_a_running_job_on_a_real_slurmctld_and_leaves_an_ended_one() {
    let cluster = Cluster::start(4);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("reclaimer.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nsecret = \"{}\"\nstate_file = \"{}\"\n[slurm]\n",
            crate::common::receiver::secret(),
            dir.path().join("acted.log").display()
        ),
    )
    .unwrap();
    // The default commands: `scontrol show job -o` then `scontrol requeue`, the real client.
    let mut child = tokio::process::Command::new(crate::common::bin_path("gpuledger"))
        .args(["reclaimer", "--config", config.to_str().unwrap()])
        .env("SLURM_CONF", cluster.path().join("slurm.conf"))
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    eventually("the reclaimer", Duration::from_secs(20), async || {
        reqwest::get(format!("{url}/healthz"))
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;

    // A running job is requeued: Slurm counts a restart and runs its prolog again.
    let job = cluster.submit("physics", "sleep 300");
    let record = cluster.jobs().join(format!("job-{job}"));
    eventually("the job's prolog", Duration::from_secs(60), async || {
        record.exists().then_some(())
    })
    .await;
    let (status, v) = reclaim(&url, "msg_real_1", &job).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        cluster.field(&job, "Restarts").as_deref(),
        Some("1"),
        "{}",
        cluster.show(&job)
    );
    // The same webhook-id again: acted on already, nothing more.
    let (status, v) = reclaim(&url, "msg_real_1", &job).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["outcome"], "already_acted", "{v}");
    assert_eq!(cluster.field(&job, "Restarts").as_deref(), Some("1"));

    // A job that has ended is answered without error and left ended (`scontrol requeue` alone
    // would run it again).
    let short = cluster.submit("physics", "true");
    eventually("the short job's end", Duration::from_secs(60), async || {
        (cluster.field(&short, "JobState").as_deref() == Some("COMPLETED")).then_some(())
    })
    .await;
    let (status, v) = reclaim(&url, "msg_real_2", &short).await;
    assert_eq!(status, 200, "{v}");
    assert!(v.to_string().contains("has ended"), "{v}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        cluster.field(&short, "JobState").as_deref(),
        Some("COMPLETED")
    );
    assert_eq!(cluster.field(&short, "Restarts").as_deref(), Some("0"));

    // A job whose name imitates an ended one is read by its state, and requeued.
    let named = {
        let out = cluster
            .client("sbatch")
            .args([
                "--parsable",
                "--gres=gpu:1",
                "--account",
                "physics",
                "--job-name",
                "x JobState=COMPLETED QOS=high",
                "--wrap",
                "sleep 300",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let record = cluster.jobs().join(format!("job-{named}"));
    eventually(
        "the named job's prolog",
        Duration::from_secs(60),
        async || record.exists().then_some(()),
    )
    .await;
    // The prolog read the QoS field itself, not the name's imitation (no accounting here: none).
    let map = std::fs::read_to_string(&record).unwrap();
    assert!(map.contains("qos=\n"), "{map}");
    let (status, v) = reclaim(&url, "msg_real_3", &named).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(cluster.field(&named, "Restarts").as_deref(), Some("1"));

    // An interactive allocation Slurm will not requeue: a 422 (cannot act here), not a retry.
    let out = cluster
        .client("salloc")
        .args(["--no-shell", "--gres=gpu:1", "--account", "physics"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    let alloc = said
        .split("Granted job allocation ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("salloc: {said}"))
        .to_owned();
    let (status, v) = reclaim(&url, "msg_real_4", &alloc).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(
        cluster.field(&alloc, "JobState").as_deref(),
        Some("RUNNING")
    );
    let _ = child.kill().await;
}
