//! The fleet's month answered by a distributed engine the way the README says to: Apache Spark
//! (PyPI's `pyspark`, local mode, on the machine's Java) reads the Parquet that two clusters'
//! aggregators exported into one directory — one of them exported twice — and answers allocated
//! and used GPU-hours and cost per cluster and tenant. Each must equal that cluster's own showback
//! for the month, hours to 1e-9 and cost to the cent, with nothing counted twice. The query is
//! `tests/spark/month.py`, which docs/multi-cluster.md quotes.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{ADMIN_TOKEN, Aggregator, gpuledger, replay, root, simulate, token_file};
use serde_json::Value;

/// Half-up to the cent, as `tests/spark/month.py` and the bill round.
fn cents(x: f64) -> i64 {
    (x * 100.0 + 0.5 + 1e-9).floor() as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn spark_reads_the_exported_month_as_each_ledgers_showback() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("parquet");
    // Ninety minutes ending an hour ago: whole hours, rolled up by the time the replay ends.
    let start = (chrono::Utc::now().timestamp() / 3600 - 3) * 3600 + 1800;
    let month = chrono::DateTime::from_timestamp(start, 0)
        .unwrap()
        .format("%Y-%m")
        .to_string();
    // A price per model, a MIG profile's own, and an H200 price change on an hour of the data.
    let change = chrono::DateTime::from_timestamp(start + 1800, 0)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let prices = dir.path().join("prices.toml");
    std::fs::write(
        &prices,
        format!(
            r#"
default_price = 0.0
[prices]
"H100-80GB" = 2.49
"H200-141GB" = 3.39
[[price_book]]
gpu_model = "H100-80GB"
mig_profile = "1g.10gb"
per_instance_hour = 0.39
[[price_book]]
gpu_model = "NVIDIA H200"
per_gpu_hour = 3.59
from = "{change}"
"#
        ),
    )
    .unwrap();
    let admin = token_file(dir.path(), ADMIN_TOKEN);
    let range = [
        "--from".to_owned(),
        (start - 3600).to_string(),
        "--to".to_owned(),
        (start + 3 * 3600).to_string(),
    ];
    let mut showbacks: BTreeMap<&str, Value> = BTreeMap::new();
    for (cluster, node, times) in [("east", "gpu-h100-02", 2), ("west", "gpu-h200-01", 1)] {
        let trace = dir.path().join(format!("{node}.csv"));
        simulate(&trace, node, &start.to_string(), "90m");
        let db = dir.path().join(format!("{cluster}.duckdb"));
        let a = Aggregator::start(
            &db,
            0,
            &[
                "--export-dir",
                out.to_str().unwrap(),
                "--config",
                prices.to_str().unwrap(),
            ],
        )
        .await;
        let mut child = replay(dir.path(), &a, node, &trace);
        let status = child.wait();
        let status = tokio::time::timeout(Duration::from_secs(120), status)
            .await
            .unwrap()
            .unwrap();
        assert!(status.success());
        for _ in 0..times {
            let status = gpuledger()
                .args(["export", "--aggregator", &a.url(), "--token-file"])
                .arg(&admin)
                .args(&range)
                .args(["--cluster", cluster])
                .status()
                .unwrap();
            assert!(status.success());
        }
        let v: Value = reqwest::Client::new()
            .get(format!(
                "{}/api/v1/showback?month={month}&group_by=tenant",
                a.url()
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        showbacks.insert(cluster, v);
        assert!(a.terminate().success());
    }

    let run = tokio::process::Command::new("python3")
        .arg(root().join("tests/spark/month.py"))
        .arg(&out)
        .args(["--month", &month, "--timeout", "400", "--prices"])
        .arg(&prices)
        .output();
    let run = tokio::time::timeout(Duration::from_secs(420), run)
        .await
        .expect("Spark answered within its time")
        .unwrap();
    assert!(
        run.status.success(),
        "tests/spark/month.py (pyspark and Java are installed by ./test.sh): {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let got: BTreeMap<(String, String), Value> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                (
                    v["cluster"].as_str().unwrap().to_owned(),
                    v["tenant"].as_str().unwrap().to_owned(),
                ),
                v,
            )
        })
        .collect();
    let mut want = BTreeMap::new();
    for (cluster, v) in &showbacks {
        for r in v["rows"].as_array().unwrap() {
            want.insert(
                (
                    cluster.to_string(),
                    r["tenant"].as_str().unwrap().to_owned(),
                ),
                r.clone(),
            );
        }
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the same clusters and tenants"
    );
    assert!(want.len() >= 4, "{want:?}");
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    for (key, w) in &want {
        let g = &got[key];
        let hours = w["allocated_gpu_seconds"].as_f64().unwrap() / 3600.0;
        let used = w["used_gpu_seconds"].as_f64().unwrap() / 3600.0;
        assert!(
            close(g["allocated_gpu_hours"].as_f64().unwrap(), hours),
            "{key:?}: {g} against {w}"
        );
        assert!(
            close(g["used_gpu_hours"].as_f64().unwrap(), used),
            "{key:?}: {g} against {w}"
        );
        assert_eq!(
            cents(g["cost_exact"].as_f64().unwrap()),
            cents(w["cost"].as_f64().unwrap()),
            "{key:?}: {g} against {w}"
        );
    }
}

/// The query docs/multi-cluster.md shows is the one `tests/spark/month.py` runs.
#[test]
fn the_manual_quotes_the_spark_query_the_test_runs() {
    let doc = std::fs::read_to_string(root().join("docs/multi-cluster.md")).unwrap();
    let block = doc
        .split("<!-- spark-query -->")
        .nth(1)
        .and_then(|rest| rest.split("```sql\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("a ```sql block after <!-- spark-query -->");
    let script = std::fs::read_to_string(root().join("tests/spark/month.py")).unwrap();
    assert!(
        script.contains(block),
        "docs/multi-cluster.md's Spark query is not tests/spark/month.py's:\n{block}"
    );
}
