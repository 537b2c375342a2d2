//! Reclaim benchmarks (BENCHMARKS.md, "Reclaim latency"):
//!
//! 1. latency: from the second an idle-hoarding episode becomes detectable in live 1 Hz data to
//!    its `hoarding.detected` webhook's arrival, with the aggregator's default settings (the
//!    detection window shortened to 2 minutes so the run takes 5, which changes nothing else): 60
//!    GPUs on 6 simulated nodes shipping every 5 s like exporters (each node at its own phase),
//!    each GPU allocated to an idle workload at a random second of the first two minutes;
//! 2. the outbox's cost: one reclaim pass that notifies 1,000 episodes (a decision, a state row
//!    and an outbox row each, one transaction), per event, against the analytics evaluation of the
//!    same ledger in the same run; and the bytes each event adds to the ledger.
//!
//! Run with `cargo bench --bench reclaim_latency` (`-- --only outbox` for 2 alone); `cargo test` only
//! builds it.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuledger_aggregator::reclaim;
use gpuledger_ledger::analytics;
use gpuledger_ledger::store::{self, Writer};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};

const TOKEN: &str = "bench-admin-token-0123456789";
const KEY: &[u8] = b"bench-webhook-key-0123456789abcdef";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn now_f() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn gpu(node: usize, g: usize) -> Instance {
    Instance {
        node: format!("bench-{node}"),
        gpu_uuid: format!("GPU-{node}-{g}"),
        gpu_model: "NVIDIA H100 80GB HBM3".into(),
        mig_profile: None,
        gpu_instance_id: None,
        placement_start: None,
        placement_size: None,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn latency() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // The receiver: arrival time per event.
        let arrivals: Arc<Mutex<Vec<(f64, serde_json::Value)>>> = Arc::default();
        let a2 = arrivals.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |body: String| {
                let a = a2.clone();
                async move {
                    a.lock()
                        .unwrap()
                        .push((now_f(), serde_json::from_str(&body).unwrap()));
                    "ok"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hook = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });

        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("aggregator.toml");
        std::fs::write(
            &cfg,
            format!(
                "hoarding_window = \"2m\"\n[[webhooks]]\nurl = \"{hook}\"\nsecret = \"{}\"\n",
                gpuledger_schema::webhook::Secret::encode(KEY)
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let _agg = Killed(
            Command::new(env!("CARGO_BIN_EXE_gpuledger"))
                .args(["aggregator", "--config", cfg.to_str().unwrap()])
                .arg("--db")
                .arg(dir.path().join("ledger.duckdb"))
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .env("GPULEDGER_ADMIN_TOKEN", TOKEN)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        while client.get(format!("{base}/healthz")).send().await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (nodes, per_node) = (6usize, 10usize);
        let start = chrono::Utc::now().timestamp() + 1;
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        // The second each GPU is allocated (idle from then on), and each node's shipping phase.
        let allocated: Vec<Vec<i64>> = (0..nodes)
            .map(|_| (0..per_node).map(|_| start + 5 + rnd(120) as i64).collect())
            .collect();
        let phase: Vec<u64> = (0..nodes).map(|_| rnd(5000)).collect();
        let end = start + 5 + 120 + 120 + 45;
        eprintln!(
            "latency: {} GPUs on {nodes} nodes, allocated idle at random seconds; running {} s",
            nodes * per_node,
            end - start
        );
        let mut senders = Vec::new();
        for node in 0..nodes {
            let (client, base, allocated, phase) =
                (client.clone(), base.clone(), allocated[node].clone(), phase[node]);
            senders.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(phase)).await;
                let mut sent = start - 1;
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    let now = chrono::Utc::now().timestamp();
                    let samples: Vec<Sample> = (sent + 1..now)
                        .flat_map(|t| {
                            allocated.iter().enumerate().map(move |(g, &at)| Sample {
                                timestamp: t,
                                instance: gpu(node, g),
                                attribution: if t >= at {
                                    Attribution {
                                        tenant: Some("bench".into()),
                                        workload: Some(format!("bench/w-{node}-{g}")),
                                        slo_class: Some(SloClass::Interactive),
                                        owner: None,
                                        owner_ref: None,
                                    }
                                } else {
                                    Attribution::default()
                                },
                                counters: Counters {
                                    sm_active: Some(0.0),
                                    ..Counters::default()
                                },
                            })
                        })
                        .collect();
                    sent = now - 1;
                    let r = client
                        .post(format!("{base}/api/v1/ingest"))
                        .bearer_auth(TOKEN)
                        .header("content-encoding", "gzip")
                        .body(Batch::from_samples(&format!("bench-{node}"), &samples).encode())
                        .send()
                        .await
                        .unwrap();
                    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
                    if now >= end {
                        break;
                    }
                }
            }));
        }
        for s in senders {
            s.await.unwrap();
        }
        let got = arrivals.lock().unwrap().clone();
        let mut lat: Vec<f64> = got
            .iter()
            .filter(|(_, b)| b["type"] == "hoarding.detected")
            .map(|(at, b)| {
                let since = chrono::DateTime::parse_from_rfc3339(b["data"]["idle_since"].as_str().unwrap())
                    .unwrap()
                    .timestamp();
                at - (since + 120) as f64
            })
            .collect();
        lat.sort_by(f64::total_cmp);
        assert_eq!(lat.len(), nodes * per_node, "every episode was notified");
        let m = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let metric = |name: &str| {
            m.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        let pass = metric("gpuledger_aggregator_analytics_duration_seconds_sum")
            / metric("gpuledger_aggregator_analytics_duration_seconds_count");
        eprintln!(
            "  detectable → webhook arrival over {} episodes: p50 {:.1} s, p95 {:.1} s, max {:.1} s (min {:.1} s)",
            lat.len(),
            percentile(&lat, 0.5),
            percentile(&lat, 0.95),
            lat[lat.len() - 1],
            lat[0]
        );
        eprintln!(
            "  the same run's evaluation pass (analytics + reclaim) took {:.0} ms on average; default interval 15 s, exporter ship interval 5 s",
            pass * 1000.0
        );
    });
}

fn outbox() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outbox.duckdb");
    let (conn, _) = store::open(&path).unwrap();
    let n = 1000i64;
    let now = chrono::Utc::now().timestamp();
    let t0 = now - now.rem_euclid(3600) - 3600;
    // 1,000 whole GPUs held idle for the last hour and more, up to the last second.
    let minutes = (now - 60 - t0) / 60;
    conn.execute_batch(&format!(
        "INSERT INTO instances SELECT i, 'node-' || (i // 8), 'GPU-' || i, -1, 'NVIDIA H100 80GB HBM3', NULL, NULL, NULL, 1.0 FROM range(1, {n} + 1) t(i);
         INSERT INTO holders SELECT h, 'tenant-' || (h % 40), 'ns/wl-' || h, 'batch' FROM range(1, {n} + 1) t(h);
         INSERT INTO rollup_1m (bucket, instance_id, holder_id, seconds_mask, samples, sm_active_samples, sm_active_sum,
                                sm_occupancy_samples, sm_occupancy_sum, tensor_active_samples, tensor_active_sum,
                                dram_active_samples, dram_active_sum, fb_used_samples, fb_used_bytes_sum,
                                nvlink_tx_bytes_sum, nvlink_rx_bytes_sum)
             SELECT {t0} + 60 * m, i, i, (1::UBIGINT << 60) - 1, 60, 60, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
             FROM range({minutes} + 1) a(m), range(1, {n} + 1) b(i);
         INSERT INTO rollup_gpu_1h SELECT h, 'node-' || (g // 8), 'GPU-' || g, 'NVIDIA H100 80GB HBM3', 3600, 3600
             FROM range(1, {n} + 1) b(g), (VALUES ({t0}), ({t0} + 3600)) v(h);
         INSERT INTO gpu_hours_changed SELECT nextval('gpu_hours_changed_seq'), bucket, node, gpu_uuid, gpu_model FROM rollup_gpu_1h;
         CHECKPOINT;"
    ))
    .unwrap();
    let readers = store::query::Readers::new(&conn, None).unwrap();
    let (writer, _thread) = Writer::spawn(conn, 1_000, Arc::new(())).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let a = analytics::Settings::default();
    let start = Instant::now();
    let report = rt
        .block_on(analytics::evaluate(&readers, &writer, &a, 10))
        .unwrap();
    let eval_ms = start.elapsed().as_secs_f64() * 1000.0;
    let secret = gpuledger_schema::webhook::Secret::encode(KEY);
    let settings = gpuledger_ledger::reclaim::config::ReclaimFile::default()
        .resolve(
            vec![gpuledger_ledger::reclaim::config::WebhookFile {
                url: "http://127.0.0.1:9/hook".into(),
                secret: Some(secret),
                ..Default::default()
            }],
            Vec::new(),
            None,
        )
        .unwrap();
    let metrics = gpuledger_aggregator::telemetry::AggregatorMetrics::new();
    let size = |readers: &store::query::Readers| {
        let c = readers.connect().unwrap();
        c.execute_batch("CHECKPOINT").unwrap();
        std::fs::metadata(&path).unwrap().len()
    };
    let before = size(&readers);
    let start = Instant::now();
    let r = rt
        .block_on(reclaim::run_pass(
            &readers, &writer, &a, &settings, &metrics, now,
        ))
        .unwrap();
    let pass_ms = start.elapsed().as_secs_f64() * 1000.0;
    let events = r.events.get("hoarding.detected").copied().unwrap_or(0);
    assert_eq!(events as i64, n, "{r:?}");
    let after = size(&readers);
    // The next pass records a `notify_only` hold for each (the classes' default rule); the one
    // after has nothing new to record.
    let start = Instant::now();
    rt.block_on(reclaim::run_pass(
        &readers,
        &writer,
        &a,
        &settings,
        &metrics,
        now + 1,
    ))
    .unwrap();
    let hold_ms = start.elapsed().as_secs_f64() * 1000.0;
    let start = Instant::now();
    rt.block_on(reclaim::run_pass(
        &readers,
        &writer,
        &a,
        &settings,
        &metrics,
        now + 2,
    ))
    .unwrap();
    let idle_ms = start.elapsed().as_secs_f64() * 1000.0;
    eprintln!(
        "outbox: {} episodes; baseline: the analytics evaluation of the same ledger: {eval_ms:.0} ms",
        report.episodes
    );
    eprintln!(
        "  reclaim pass deciding {events} notices (decision + state + outbox row each, one transaction): {pass_ms:.0} ms = {:.2}× the baseline, {:.0} µs per event",
        pass_ms / eval_ms,
        pass_ms * 1000.0 / events as f64
    );
    eprintln!(
        "  the next pass, recording a notify_only hold for each: {hold_ms:.0} ms = {:.2}× the baseline",
        hold_ms / eval_ms
    );
    eprintln!(
        "  the pass after, nothing new to decide: {idle_ms:.0} ms = {:.2}× the baseline",
        idle_ms / eval_ms
    );
    eprintln!(
        "  ledger growth: {} bytes for {events} events = {:.0} bytes per event (DuckDB file after CHECKPOINT)",
        after.saturating_sub(before),
        after.saturating_sub(before) as f64 / events as f64
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/reclaim_latency.rs: run with `cargo bench --bench reclaim_latency`");
        return;
    }
    if std::env::args().any(|a| a == "outbox") {
        outbox();
        return;
    }
    outbox();
    latency();
}
