//! kill -9 of the aggregator, again and again, during sustained ingest from several exporters,
//! each time followed by a restart: DuckDB replays its WAL, the exporters re-send what was not
//! acknowledged, and every instance of every node ends with exactly its samples — none lost, none
//! doubled — in the raw rows and in every rollup. The second test kills it while the writer
//! holds rollup folds back (batches waiting behind it): the restart folds what the raw rows hold
//! and the masks lack.

use std::process::Stdio;
use std::time::Duration;

use crate::common::{ADMIN_TOKEN, Aggregator, eventually, open_ledger, simulate_with, token_file};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};

/// Three nodes of the built-in fleet: 56 MIG slices, a mixed MIG and whole-GPU node, 8 whole GPUs.
const NODES: [&str; 3] = ["gpu-h100-01", "gpu-h100-02", "gpu-h200-01"];
/// An hour per node, replayed at 60×: a minute of sustained ingest to kill it in.
const MINUTES: i64 = 60;
/// kill -9s in one run.
const KILLS: usize = 10;
/// Samples stored between two kills (each restart's counter starts at 0).
const BETWEEN_KILLS: f64 = 6_000.0;

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_ten_times_during_sustained_ingest_from_three_exporters_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Recent enough for the raw window: the check below covers raw rows and rollups.
    let start = (chrono::Utc::now().timestamp() / 60 - 2 * MINUTES) * 60;
    let db = dir.path().join("ledger.duckdb");
    let mut a = Aggregator::start(&db, 0, &[]).await;
    let token = token_file(dir.path(), ADMIN_TOKEN);
    let mut exporters = Vec::new();
    for node in NODES {
        let trace = dir.path().join(format!("{node}.csv"));
        simulate_with(
            &trace,
            node,
            &start.to_string(),
            &format!("{MINUTES}m"),
            &["--energy"],
        );
        exporters.push(
            tokio::process::Command::new(env!("CARGO_BIN_EXE_gpuledger"))
                .args([
                    "exporter", "--source", "replay", "--speed", "60", "--once", "--node", node,
                ])
                .args([
                    "--listen",
                    "127.0.0.1:0",
                    "--ship-interval",
                    "1s",
                    "--aggregator",
                    &a.url(),
                ])
                .arg("--token-file")
                .arg(&token)
                .arg("--spool-dir")
                .arg(dir.path().join(format!("spool-{node}")))
                .arg("--replay-file")
                .arg(&trace)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap(),
        );
    }
    let mut kills = 0;
    while kills < KILLS {
        let reached = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if a.value("gpuledger_aggregator_ingest_samples_total").await >= Some(BETWEEN_KILLS)
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(reached.is_ok(), "ingest stalled after {kills} kills");
        a.crash_and_restart().await;
        kills += 1;
    }
    for (node, mut exporter) in NODES.into_iter().zip(exporters) {
        let status = tokio::time::timeout(Duration::from_secs(300), exporter.wait())
            .await
            .expect("the exporter finishes its trace after the restarts")
            .unwrap();
        assert!(status.success(), "{node}: exporter {status}");
    }
    eventually("the queue to drain", Duration::from_secs(30), async || {
        (a.value("gpuledger_aggregator_writer_queue_samples").await == Some(0.0)).then_some(())
    })
    .await;
    assert!(a.terminate().success());

    let conn = open_ledger(&db);
    let mut stmt = conn
        .prepare(
            "SELECT i.node, count(*), count(DISTINCT ts), min(ts), max(ts)
             FROM samples_raw JOIN instances i USING (instance_id) GROUP BY instance_id, i.node",
        )
        .unwrap();
    let per_instance: Vec<(String, i64, i64, i64, i64)> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // Every instance each trace holds, from the traces themselves.
    let instances: i64 = NODES
        .iter()
        .map(|node| {
            conn.query_row(
                &format!(
                    "SELECT count(DISTINCT gpu_uuid || '/' || coalesce(CAST(gpu_instance_id AS VARCHAR), '')) FROM read_csv('{}')",
                    dir.path().join(format!("{node}.csv")).display()
                ),
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
        })
        .sum();
    assert!(instances > 56, "{instances}");
    assert_eq!(per_instance.len() as i64, instances);
    for (node, n, distinct, first, last) in per_instance {
        assert_eq!(
            (n, distinct, first, last),
            (MINUTES * 60, MINUTES * 60, start, start + MINUTES * 60 - 1),
            "{node}"
        );
    }
    let (minute, hour, tenant, mask): (i64, i64, i64, i64) = conn
        .query_row(
            "SELECT (SELECT sum(samples) FROM rollup_1m)::BIGINT, (SELECT sum(samples) FROM rollup_1h)::BIGINT,
                    (SELECT sum(samples) FROM rollup_tenant_1h)::BIGINT, (SELECT sum(bit_count(seconds_mask)) FROM rollup_1m)::BIGINT",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    let total = instances * MINUTES * 60;
    assert_eq!((minute, hour, tenant, mask), (total, total, total, total));
    assert_energy_stored_once(&conn, dir.path());
}

/// The traces' energy (each GPU-second once) is the ledger's, in every energy rollup: the kills
/// lost and doubled no joule.
fn assert_energy_stored_once(conn: &duckdb::Connection, dir: &std::path::Path) {
    let files: Vec<String> = NODES
        .iter()
        .map(|node| format!("'{}'", dir.join(format!("{node}.csv")).display()))
        .collect();
    let (joules, seconds): (f64, i64) = conn
        .query_row(
            &format!(
                "SELECT sum(e), count(*) FROM (SELECT DISTINCT gpu_uuid, timestamp, gpu_energy_joules AS e
                 FROM read_csv([{}]) WHERE gpu_energy_joules IS NOT NULL)",
                files.join(", ")
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        seconds > 0 && joules > 0.0,
        "the simulated traces carry energy"
    );
    let (gpu_1m, mask, gpu_1h, gpu_1d): (f64, i64, f64, f64) = conn
        .query_row(
            "SELECT (SELECT sum(energy_j) FROM energy_gpu_1m), (SELECT sum(bit_count(seconds_mask)) FROM energy_gpu_1m)::BIGINT,
                    (SELECT sum(energy_j) FROM energy_gpu_1h), (SELECT sum(energy_j) FROM energy_gpu_1d)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!(mask, seconds, "every GPU-second stored once");
    let close = |a: f64| (a - joules).abs() <= 1e-9 * joules;
    assert!(
        close(gpu_1m) && close(gpu_1h) && close(gpu_1d),
        "{joules} {gpu_1m} {gpu_1h} {gpu_1d}"
    );
    for table in ["energy_1m", "energy_1h", "energy_1d"] {
        let parts: f64 = conn
            .query_row(
                &format!(
                    "SELECT (SELECT sum(idle_j + active_j) FROM {table}) + (SELECT sum(uncovered_j) FROM energy_gpu_1m)"
                ),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(close(parts), "{table}: {parts} != {joules}");
    }
}

/// Nodes of 8 GPUs × 7 MIG slices each, sending live 5 s batches (280 samples) for [`SECONDS`].
const HELD_NODES: usize = 24;
const SECONDS: i64 = 600;
/// Concurrent senders: enough that batches wait behind every group the writer commits.
const SENDERS: usize = 12;
/// kill -9s that must land while the writer holds folds (each checked by the recovery after it).
const HELD_KILLS: usize = 3;

/// Node `n`'s 5 s batch from `t`: its 56 slices, each second, with counters that differ per
/// slice and second (so that a rollup summing the wrong rows cannot match).
fn live_batch(n: usize, t: i64) -> Batch {
    let node = format!("held-{n:02}");
    let samples: Vec<Sample> = (t..t + 5)
        .flat_map(|ts| {
            let node = node.clone();
            (0..56u32).map(move |k| Sample {
                timestamp: ts,
                instance: Instance {
                    node: node.clone(),
                    gpu_uuid: format!("GPU-{node}-{}", k / 7),
                    gpu_model: "NVIDIA H100 80GB HBM3".into(),
                    mig_profile: Some("1g.10gb".into()),
                    gpu_instance_id: Some(k % 7),
                    placement_start: Some(k % 7),
                    placement_size: Some(1),
                },
                attribution: Attribution {
                    tenant: Some(format!("tenant-{}", k % 3)),
                    workload: Some(format!("wl-{n}-{k}")),
                    slo_class: Some(SloClass::Batch),
                    owner: None,
                    owner_ref: None,
                },
                counters: Counters {
                    sm_active: Some(((ts as u64 * 7 + k as u64) % 101) as f64 / 100.0),
                    fb_used_bytes: Some(1 << 30),
                    fb_total_bytes: Some(10 << 30),
                    ..Counters::default()
                },
            })
        })
        .collect();
    Batch::from_samples(&node, &samples)
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_while_the_writer_holds_folds_back_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let start = (chrono::Utc::now().timestamp() / 60 - 20) * 60;
    let db = dir.path().join("ledger.duckdb");
    let mut a = Aggregator::start(&db, 0, &[]).await;
    // As live exporters send: round by round, every node's next 5 s.
    let bodies: Vec<Vec<u8>> = (0..SECONDS / 5)
        .flat_map(|r| (0..HELD_NODES).map(move |n| live_batch(n, start + 5 * r).encode()))
        .collect();
    let bodies = std::sync::Arc::new(bodies);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let url = format!("{}/api/v1/ingest", a.url());
    // Each sender re-sends a batch until it is acknowledged, as the exporter's spool does: a
    // request cut by the kill, refused while it restarts, or answered 503 is sent again.
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (bodies, next, url) = (bodies.clone(), next.clone(), url.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { return };
                    loop {
                        let sent = client
                            .post(&url)
                            .bearer_auth(ADMIN_TOKEN)
                            .header("content-encoding", "gzip")
                            .header("content-type", "application/json")
                            .body(body.clone())
                            .send()
                            .await;
                        match sent {
                            Ok(r) if r.status().is_success() => break,
                            Ok(r) => assert!(
                                [429, 503].contains(&r.status().as_u16()),
                                "{}",
                                r.text().await.unwrap_or_default()
                            ),
                            Err(_) => {}
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect();

    let mut held_kills = 0;
    let mut recovered = 0.0;
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while held_kills < HELD_KILLS {
        assert!(
            std::time::Instant::now() < deadline,
            "only {held_kills} of {HELD_KILLS} kills landed while folds were held"
        );
        assert!(
            next.load(std::sync::atomic::Ordering::Relaxed) < bodies.len(),
            "every batch was sent before {HELD_KILLS} kills landed while folds were held ({held_kills} did)"
        );
        if a.value("gpuledger_aggregator_writer_held_rows").await > Some(0.0) {
            a.crash_and_restart().await;
            // The start folded what the dead writer held, and says how much.
            let now = a
                .value("gpuledger_aggregator_writer_recovered_samples_total")
                .await
                .unwrap();
            if now > 0.0 {
                held_kills += 1;
                recovered += now;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    for s in senders {
        tokio::time::timeout(Duration::from_secs(300), s)
            .await
            .expect("every batch is acknowledged after the restarts")
            .unwrap();
    }
    assert!(a.terminate().success());

    let conn = open_ledger(&db);
    let total = (HELD_NODES * 56) as i64 * SECONDS;
    assert!(recovered > 0.0 && recovered < total as f64, "{recovered}");
    let (rows, distinct, instances): (i64, i64, i64) = conn
        .query_row(
            "SELECT count(*), count(DISTINCT (instance_id, ts)), count(DISTINCT instance_id) FROM samples_raw",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (rows, distinct, instances),
        (total, total, (HELD_NODES * 56) as i64)
    );
    // Every minute rollup row is what its raw rows sum to, and every rollup holds every sample.
    let mismatched: i64 = conn
        .query_row(
            "WITH raw AS (
                 SELECT instance_id, ts - ts % 60 AS bucket, count(*) AS n, sum(sm_active) AS sm,
                        bit_or(1::UBIGINT << (ts % 60)::INTEGER) AS mask
                 FROM samples_raw GROUP BY ALL
             ), m AS (
                 SELECT instance_id, bucket, sum(samples) AS n, sum(sm_active_sum) AS sm,
                        bit_or(seconds_mask) AS mask
                 FROM rollup_1m GROUP BY ALL
             )
             SELECT count(*) FROM raw FULL JOIN m USING (instance_id, bucket)
             WHERE raw.n IS DISTINCT FROM m.n OR raw.mask IS DISTINCT FROM m.mask
                OR abs(raw.sm - m.sm) > 1e-6",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(mismatched, 0);
    let sums: (i64, i64, i64, i64, i64) = conn
        .query_row(
            "SELECT (SELECT sum(samples) FROM rollup_1h)::BIGINT, (SELECT sum(samples) FROM rollup_alloc_1d)::BIGINT,
                    (SELECT sum(samples) FROM rollup_tenant_1h)::BIGINT, (SELECT sum(instance_seconds) FROM rollup_gpu_1h)::BIGINT,
                    (SELECT sum(observed_seconds) FROM rollup_gpu_1h)::BIGINT",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    let gpu_seconds = (HELD_NODES * 8) as i64 * SECONDS;
    assert_eq!(sums, (total, total, total, total, gpu_seconds));
    let pending: Option<i64> = conn
        .query_row("SELECT from_ts FROM fold_pending", [], |r| r.get(0))
        .unwrap();
    assert_eq!(pending, None, "a clean stop folds what is held");
}
