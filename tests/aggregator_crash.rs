//! kill -9 of the aggregator during sustained ingest, then a restart: DuckDB replays its WAL, the
//! exporter re-sends what was not acknowledged, and every instance ends with exactly its samples.
//! Run three times, killing at a different point each time.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{ADMIN_TOKEN, Aggregator, eventually, open_ledger, simulate, token_file};

const NODE: &str = "gpu-h100-01";
const MINUTES: i64 = 20;

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_sustained_ingest_loses_and_doubles_nothing() {
    for (round, kill_after) in [15_000.0, 30_000.0, 45_000.0].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("trace.csv");
        // Recent enough for the raw window: the check below covers raw rows and rollups.
        let start = (chrono::Utc::now().timestamp() / 60 - 2 * MINUTES) * 60;
        simulate(&trace, NODE, &start.to_string(), &format!("{MINUTES}m"));
        let db = dir.path().join("ledger.duckdb");
        let mut a = Aggregator::start(&db, 0, &[]).await;
        let token = token_file(dir.path(), ADMIN_TOKEN);
        let mut exporter = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpuledger"))
            .args([
                "exporter", "--source", "replay", "--speed", "max", "--once", "--node", NODE,
            ])
            .args([
                "--listen",
                "127.0.0.1:0",
                "--ship-interval",
                "2s",
                "--aggregator",
                &a.url(),
            ])
            .arg("--token-file")
            .arg(&token)
            .arg("--spool-dir")
            .arg(dir.path().join("spool"))
            .arg("--replay-file")
            .arg(&trace)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        eventually("ingest under way", Duration::from_secs(60), async || {
            (a.value("gpuledger_aggregator_ingest_samples_total").await >= Some(kill_after))
                .then_some(())
        })
        .await;
        a.crash_and_restart().await;
        let status = tokio::time::timeout(Duration::from_secs(120), exporter.wait())
            .await
            .expect("the exporter finishes the trace after the restart")
            .unwrap();
        assert!(status.success(), "round {round}: exporter {status}");
        assert!(a.terminate().success());

        let conn = open_ledger(&db);
        let mut stmt = conn
            .prepare(
                "SELECT count(*), count(DISTINCT ts), min(ts), max(ts) FROM samples_raw GROUP BY instance_id",
            )
            .unwrap();
        let per_instance: Vec<(i64, i64, i64, i64)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(per_instance.len(), 56, "round {round}");
        for row in per_instance {
            assert_eq!(
                row,
                (MINUTES * 60, MINUTES * 60, start, start + MINUTES * 60 - 1),
                "round {round}"
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
        let total = 56 * MINUTES * 60;
        assert_eq!(
            (minute, hour, tenant, mask),
            (total, total, total, total),
            "round {round}"
        );
    }
}
