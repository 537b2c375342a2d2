//! kill -9 of the aggregator, again and again, during sustained ingest from several exporters,
//! each time followed by a restart: DuckDB replays its WAL, the exporters re-send what was not
//! acknowledged, and every instance of every node ends with exactly its samples — none lost, none
//! doubled — in the raw rows and in every rollup.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{ADMIN_TOKEN, Aggregator, eventually, open_ledger, simulate, token_file};

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
        simulate(&trace, node, &start.to_string(), &format!("{MINUTES}m"));
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
}
