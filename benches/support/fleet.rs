//! What the aggregator benchmarks share: a synthetic fleet's batches, a real `gpuledger
//! aggregator` process on loopback, and its resident memory.
//!
//! The fleet stands in for real exporters: `nodes` nodes × 8 GPUs × 7 `1g.10gb` instances, each
//! second's counters drawn from a fixed xorshift sequence, batched per node as an exporter
//! batches (`batch_seconds` of one node per batch).

// Each benchmark uses part of this module.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, GpuSample, Instance, Sample, SloClass};

/// The admin token the benchmarks' aggregators accept.
pub const TOKEN: &str = "bench-admin-token-0123456789";

/// Instances per node: 8 GPUs × 7 `1g.10gb` slices.
pub const INSTANCES_PER_NODE: usize = 56;

/// The name of node `node`.
pub fn node_name(node: usize) -> String {
    format!("bench-{node:04}")
}

/// One node's batches: seconds `t0..t0 + seconds`, `batch_seconds` per batch, counters drawn
/// from `seed` (the same seed gives the same values).
pub fn node_batches(
    node: usize,
    seconds: i64,
    batch_seconds: i64,
    t0: i64,
    seed: u64,
) -> Vec<Batch> {
    node_batches_with(node, seconds, batch_seconds, t0, seed, false)
}

/// [`node_batches`], and with `energy` each GPU's joules for each second in the batch's `gpus`
/// (75 to 700 J, as an H100's board between idle and its limit), as an exporter with the energy
/// collector sends them.
pub fn node_batches_with(
    node: usize,
    seconds: i64,
    batch_seconds: i64,
    t0: i64,
    seed: u64,
    energy: bool,
) -> Vec<Batch> {
    let mut x: u64 = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let name = node_name(node);
    let mut out = Vec::new();
    let mut start = t0;
    while start < t0 + seconds {
        let mut samples = Vec::new();
        let mut gpus = Vec::new();
        for t in start..(start + batch_seconds).min(t0 + seconds) {
            for gpu in 0..8u32 {
                if energy {
                    gpus.push(GpuSample {
                        timestamp: t,
                        node: name.clone(),
                        gpu_uuid: format!("GPU-{node:04}-{gpu}"),
                        gpu_model: "NVIDIA H100 80GB HBM3".into(),
                        energy_joules: Some(75.0 + (rnd() % 625_000) as f64 / 1000.0),
                    });
                }
                for gi in 0..7u32 {
                    let sm = (rnd() % 1000) as f64 / 1000.0;
                    samples.push(Sample {
                        timestamp: t,
                        instance: Instance {
                            node: name.clone(),
                            gpu_uuid: format!("GPU-{node:04}-{gpu}"),
                            gpu_model: "NVIDIA H100 80GB HBM3".into(),
                            mig_profile: Some("1g.10gb".into()),
                            gpu_instance_id: Some(gi + 7),
                            placement_start: Some(gi),
                            placement_size: Some(1),
                        },
                        attribution: Attribution {
                            tenant: Some(format!("tenant-{}", (node * 8 + gpu as usize) % 40)),
                            workload: Some(format!("wl-{node}-{gpu}-{gi}")),
                            slo_class: Some(SloClass::Batch),
                            owner: None,
                            owner_ref: None,
                        },
                        counters: Counters {
                            sm_active: Some(sm),
                            sm_occupancy: Some(sm / 2.0),
                            tensor_active: Some(sm / 3.0),
                            dram_active: Some(sm / 4.0),
                            fb_used_bytes: Some(rnd() % 10_000_000_000),
                            fb_total_bytes: Some(10_737_418_240),
                            nvlink_tx_bytes: None,
                            nvlink_rx_bytes: None,
                        },
                    });
                }
            }
        }
        out.push(Batch::from_samples(&name, &samples).with_gpus(&gpus));
        start += batch_seconds;
    }
    out
}

/// Every node's batches, node by node (see [`node_batches`]).
pub fn batches(nodes: usize, seconds: i64, batch_seconds: i64, t0: i64) -> Vec<Batch> {
    (0..nodes)
        .flat_map(|node| {
            node_batches(
                node,
                seconds,
                batch_seconds,
                t0,
                88172645463325252 + node as u64,
            )
        })
        .collect()
}

/// The most resident memory `pid` has had (`VmHWM`), KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

/// A `gpuledger aggregator` child process; killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    /// Stops the process with SIGTERM (a clean stop: every queued batch written, the WAL
    /// checkpointed into the file) and waits for it.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `gpuledger` binary the benchmarks start: `GPULEDGER_BIN` when set (a release build's,
/// measured from a harness the test build compiled), else the one built with this benchmark.
pub fn binary() -> std::path::PathBuf {
    std::env::var_os("GPULEDGER_BIN")
        .map_or_else(|| env!("CARGO_BIN_EXE_gpuledger").into(), Into::into)
}

/// Starts the aggregator of [`binary`] on `db` with `args` added, on a free loopback port, and
/// waits until it accepts connections.
pub fn start_aggregator(db: &Path, args: &[&str]) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(binary())
        .args(["aggregator", "--db"])
        .arg(db)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .env("GPULEDGER_ADMIN_TOKEN", TOKEN)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the aggregator did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Server { child, port }
}

/// The `p`-quantile (0–1) of `v` (sorted here), nearest rank.
pub fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// One closed hour of `instances` instances' raw rows, written with SQL in the order live ingest
/// appends them (5 s of every instance, then the next 5 s), counters that change slowly as real
/// ones do.
pub fn live_order_hour(conn: &duckdb::Connection, hour: i64, instances: i64) {
    for part in (0..3600).step_by(300) {
        conn.execute(
            "INSERT INTO samples_raw
             SELECT ?1 + b5 * 5 + s, i + 1, i % 97 + 1,
                    round(((i * 37 + (b5 * 5 + s) // 60) % 100) / 100.0 + ((b5 * 5 + s) % 7) / 1000.0, 4),
                    round(((i * 11 + (b5 * 5 + s) // 60) % 100) / 250.0, 4), 0.05, 0.1,
                    ((i % 8 + 1) * 1073741824)::UBIGINT, 10737418240::UBIGINT, NULL, NULL
             FROM range(?2, ?3) r(b5), range(5) q(s), range(?4) k(i)
             ORDER BY b5, i, s",
            duckdb::params![hour, part / 5, (part + 300) / 5, instances],
        )
        .unwrap();
    }
}
