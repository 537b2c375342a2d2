//! Past one machine: two aggregators (one per cluster) each ingest their node, export
//! Hive-partitioned Parquet into one directory (one while it runs, through its API; one from the
//! file), each twice, and DuckDB reading the Parquet files alone gets both clusters' totals back,
//! once. Also `gpuledger import`: all or nothing, and idempotent.

use crate::common;

use std::time::Duration;

use crate::common::fake_aggregator::{FakeAggregator, Mode};
use crate::common::{
    ADMIN_TOKEN, Aggregator, gpuledger, open_ledger, replay, simulate, token_file,
};

fn totals(conn: &duckdb::Connection, from: &str) -> (i64, f64) {
    conn.query_row(
        &format!("SELECT sum(samples)::BIGINT, sum(sm_active_sum) FROM {from}"),
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_clusters_export_parquet_and_query_back_their_combined_totals() {
    let dir = tempfile::tempdir().unwrap();
    // Starts 90 minutes ago, so the hours and (UTC) dates of the export are several.
    let start = (chrono::Utc::now().timestamp() / 3600 - 2) * 3600 + 1800;
    let out = dir.path().join("parquet");
    let range = [
        "--from".to_owned(),
        (start - 86400).to_string(),
        "--to".to_owned(),
        (start + 86400).to_string(),
        "--raw".to_owned(),
    ];
    let admin = token_file(dir.path(), ADMIN_TOKEN);
    let mut ledgers = Vec::new();
    for (cluster, node) in [("east", "gpu-h100-02"), ("west", "gpu-h200-01")] {
        let trace = dir.path().join(format!("{node}.csv"));
        simulate(&trace, node, &start.to_string(), "90m");
        let db = dir.path().join(format!("{cluster}.duckdb"));
        let a = Aggregator::start(&db, 0, &["--export-dir", out.to_str().unwrap()]).await;
        let status = tokio::time::timeout(
            Duration::from_secs(120),
            replay(dir.path(), &a, node, &trace).wait(),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(status.success());
        if cluster == "east" {
            // While the aggregator runs (it holds the file's lock): through its API, twice.
            for _ in 0..2 {
                let status = gpuledger()
                    .args(["export", "--aggregator", &a.url(), "--token-file"])
                    .arg(&admin)
                    .args(&range)
                    .args(["--cluster", cluster])
                    .status()
                    .unwrap();
                assert!(status.success());
            }
            let offline = gpuledger()
                .args(["export", "--db"])
                .arg(&db)
                .arg("--parquet")
                .arg(dir.path().join("elsewhere"))
                .args(&range)
                .output()
                .unwrap();
            assert!(
                !offline.status.success(),
                "the file is locked by the running aggregator"
            );
        }
        assert!(a.terminate().success());
        ledgers.push((cluster, db));
    }
    let mut expected = (0, 0.0);
    let mut per_tenant: Vec<(String, String, f64, f64)> = Vec::new();
    for (cluster, db) in &ledgers {
        let conn = open_ledger(db);
        let mut stmt = conn
            .prepare(
                "SELECT tenant, sum(gpu_seconds) / 3600, sum(used_gpu_seconds) / 3600
                 FROM rollup_tenant_1h WHERE tenant IS NOT NULL GROUP BY ALL ORDER BY ALL",
            )
            .unwrap();
        per_tenant.extend(
            stmt.query_map([], |r| {
                Ok((cluster.to_string(), r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap()
            .map(Result::unwrap),
        );
        drop(stmt);
        let t = totals(&conn, "rollup_1h");
        assert!(t.0 > 0);
        expected = (expected.0 + t.0, expected.1 + t.1);
        drop(conn);
        if *cluster == "west" {
            // From the file, with no aggregator running; twice as well.
            for _ in 0..2 {
                let status = gpuledger()
                    .args(["export", "--db"])
                    .arg(db)
                    .arg("--parquet")
                    .arg(&out)
                    .args(&range)
                    .args(["--cluster", cluster])
                    .status()
                    .unwrap();
                assert!(status.success());
            }
        }
    }
    // A day whose raw samples retention has deleted keeps its earlier file.
    {
        let conn = duckdb::Connection::open(&ledgers[1].1).unwrap();
        conn.execute_batch("DELETE FROM samples_raw").unwrap();
    }
    let again = gpuledger()
        .args(["export", "--db"])
        .arg(&ledgers[1].1)
        .arg("--parquet")
        .arg(&out)
        .args(&range)
        .args(["--cluster", "west"])
        .output()
        .unwrap();
    assert!(again.status.success());
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        said.contains("samples_raw") && said.contains("kept the earlier export's file"),
        "{said}"
    );
    // Each cluster exported the same range twice: one file per table, day and cluster.
    let files = |table: &str| {
        std::fs::read_dir(out.join(table))
            .unwrap()
            .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
            .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
    };
    let rollup_files = files("rollup_1h");
    assert!(
        rollup_files
            .iter()
            .all(|f| f == "east.parquet" || f == "west.parquet"),
        "{rollup_files:?}"
    );
    let conn = duckdb::Connection::open_in_memory().unwrap();
    // docs/multi-cluster.md's fleet query, on these files and days, answers what the ledgers say.
    let doc = std::fs::read_to_string(common::root().join("docs/multi-cluster.md")).unwrap();
    let query = doc
        .split("<!-- fleet-query -->\n```sql\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/multi-cluster.md's fleet query");
    let day = |t: i64| {
        chrono::DateTime::from_timestamp(t.div_euclid(86400) * 86400, 0)
            .unwrap()
            .format("%Y-%m-%d")
            .to_string()
    };
    let query = query
        .replace("/shared/gpuledger", out.to_str().unwrap())
        .replace("2026-11-01", &day(start - 86400))
        .replace("2026-12-01", &day(start + 2 * 86400));
    let mut stmt = conn.prepare(query.trim().trim_end_matches(';')).unwrap();
    let fleet: Vec<(String, String, f64, f64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    drop(stmt);
    assert_eq!(fleet.len(), per_tenant.len(), "{fleet:?}\n{per_tenant:?}");
    for (got, want) in fleet.iter().zip(&per_tenant) {
        assert_eq!((&got.0, &got.1), (&want.0, &want.1));
        assert!(
            (got.2 - want.2).abs() < 1e-9 && (got.3 - want.3).abs() < 1e-9,
            "{got:?} {want:?}"
        );
    }
    let glob = |table: &str| {
        format!(
            "read_parquet('{}/{table}/*/*.parquet', hive_partitioning = true)",
            out.display()
        )
    };
    let got = totals(&conn, &glob("rollup_1h"));
    assert_eq!(got.0, expected.0);
    assert!((got.1 - expected.1).abs() < 1e-6 * expected.1.max(1.0));
    assert_eq!(totals(&conn, &glob("rollup_1m")).0, expected.0);
    let raw: i64 = conn
        .query_row(
            &format!("SELECT count(*) FROM {}", glob("samples_raw")),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(raw, expected.0);
    let clusters: i64 = conn
        .query_row(
            &format!(
                "SELECT count(DISTINCT cluster) FROM {}",
                glob("rollup_tenant_1h")
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(clusters, 2);
    // Capacity travels too: the two clusters' observed GPU-seconds, each GPU-second once.
    let observed: i64 = conn
        .query_row(
            &format!(
                "SELECT sum(observed_seconds)::BIGINT FROM {}",
                glob("rollup_gpu_1h")
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    let distinct_gpu_seconds: i64 = conn
        .query_row(
            &format!(
                "SELECT count(*) FROM (SELECT DISTINCT cluster, gpu_uuid, ts FROM {})",
                glob("samples_raw")
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(observed, distinct_gpu_seconds);
    // Partitions are UTC dates, and each file's rows belong to its partition.
    let misplaced: i64 = conn
        .query_row(
            &format!(
                "SELECT count(*) FROM {} WHERE bucket_start < to_timestamp(epoch(date))
                   OR bucket_start >= to_timestamp(epoch(date) + 86400)",
                glob("rollup_1h")
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(misplaced, 0);
    // Instants carry their time zone and byte counts are signed, so Spark and Trino read them as
    // `timestamp` and `bigint` (not `timestamp_ntz` and `decimal(20,0)`).
    let types: (String, String, String) = conn
        .query_row(
            &format!(
                "SELECT typeof(bucket_start), typeof(fb_used_bytes_max), typeof(nvlink_tx_bytes_sum) FROM {} LIMIT 1",
                glob("rollup_1m")
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        types,
        (
            "TIMESTAMP WITH TIME ZONE".to_owned(),
            "BIGINT".to_owned(),
            "BIGINT".to_owned()
        )
    );
}

/// Writes `text` to `path` with line `k`'s `sm_active` (0-based, the header being line 0) set to
/// 2.5, outside 0–1.
fn with_bad_ratio(text: &str, k: usize, path: &std::path::Path) {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut fields: Vec<String> = lines[k].split(',').map(str::to_owned).collect();
    fields[11] = "2.5".into();
    lines[k] = fields.join(",");
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// `gpuledger import --db DB FILES…`: whether it succeeded, and what it wrote to stderr.
fn import(db: &std::path::Path, files: &[&std::path::Path]) -> (bool, String) {
    let out = gpuledger()
        .arg("import")
        .arg("--db")
        .arg(db)
        .args(files)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The import was refused for `bad`'s line `line` (1-based), and left no ledger behind.
fn assert_refused_at(
    outcome: (bool, String),
    bad: &std::path::Path,
    line: usize,
    db: &std::path::Path,
) {
    let (ok, stderr) = outcome;
    assert!(!ok);
    let expected = format!("{}:{line}:12: sm_active: 2.5 is outside 0–1", bad.display());
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(stderr.contains("nothing was imported"), "{stderr}");
    assert!(!db.exists(), "a refused import leaves no ledger behind");
}

#[test]
fn import_is_all_or_nothing_and_importing_twice_stores_nothing_new() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let start = (chrono::Utc::now().timestamp() / 3600 - 5) * 3600;
    simulate(&trace, "gpu-h100-02", &start.to_string(), "10m");
    let text = std::fs::read_to_string(&trace).unwrap();
    let rows = text.lines().count() as i64 - 1;
    let db = dir.path().join("ledger.duckdb");

    // A bad row in a second file: nothing of either file is imported.
    let bad = dir.path().join("bad.csv");
    with_bad_ratio(&text, 499, &bad);
    assert_refused_at(import(&db, &[&trace, &bad]), &bad, 500, &db);

    let (ok, stderr) = import(&db, &[&trace]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains(&format!("{rows} samples: {rows} stored, 0 already")));
    let (ok, stderr) = import(&db, &[&trace]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains(&format!("{rows} samples: 0 stored, {rows} already")));
    let conn = open_ledger(&db);
    assert_eq!(totals(&conn, "rollup_1h").0, rows);
}

/// Regression: an import wrote its raw rows in file order (every instance's seconds side by
/// side), then rewrote each hour in instance order, which left the old copies as free blocks: a
/// third of a 2 h trace's file (docs/perf/storage.md, "Storage, and the month question, against
/// Prometheus"). A file small enough to keep is now sent in instance order at once: one run of rows
/// per instance, none rewritten.
#[test]
fn a_kept_import_is_written_in_instance_order_with_no_free_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let start = (chrono::Utc::now().timestamp() / 3600 - 5) * 3600;
    simulate(&trace, "gpu-h100-02", &start.to_string(), "2h");
    let db = dir.path().join("ledger.duckdb");
    let (ok, stderr) = import(&db, &[&trace]);
    assert!(ok, "{stderr}");
    let (changes, backwards, instances) = raw_order(&db);
    assert!(instances > 1);
    assert_eq!((changes, backwards), (instances - 1, 0));
    let free: i64 = open_ledger(&db)
        .query_row("SELECT free_blocks FROM pragma_database_size()", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(free, 0, "blocks left free by the import");
    assert_eq!(
        rewritten_until(&db),
        Some(start + 7200),
        "the aggregator's first start need not rewrite the imported hours again"
    );
}

/// Where the ledger records that its raw rows are in instance order (`raw_compacted`).
fn rewritten_until(db: &std::path::Path) -> Option<i64> {
    open_ledger(db)
        .query_row("SELECT max(until_ts) FROM raw_compacted", [], |r| r.get(0))
        .unwrap()
}

/// Regression: a file too large to keep (over a million samples) was written in file order, then
/// each hour rewritten in instance order at the end, so the file grew by every hour's first copy
/// and kept them free: 63 of 126 blocks for this 4 h trace, 165 of 462 for 24 h. Each hour is now
/// rewritten as soon as the file has moved past it, and the next hour reuses its blocks.
#[test]
fn a_streamed_import_rewrites_each_hour_on_the_way() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let start = (chrono::Utc::now().timestamp() / 3600 - 5) * 3600;
    // The whole simulated fleet, 89 instances: 1,281,600 samples in 4 h.
    let status = gpuledger()
        .args(["simulate", "--seed", "7", "--duration", "4h", "--start"])
        .arg(start.to_string())
        .arg("--out")
        .arg(&trace)
        .status()
        .unwrap();
    assert!(status.success());
    let db = dir.path().join("ledger.duckdb");
    let (ok, stderr) = import(&db, &[&trace]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("1281600 samples: 1281600 stored"),
        "{stderr}"
    );
    let (changes, backwards, instances) = raw_order(&db);
    assert!(instances > 1);
    let runs: i64 = open_ledger(&db)
        .query_row(
            "SELECT count(DISTINCT (ts // 3600, instance_id)) FROM samples_raw",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        (changes, backwards),
        (runs - 1, 0),
        "one run per instance and hour"
    );
    let (used, free): (i64, i64) = open_ledger(&db)
        .query_row(
            "SELECT used_blocks, free_blocks FROM pragma_database_size()",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(2 * free < used, "{free} blocks free beside {used} used");
    assert_eq!(rewritten_until(&db), Some(start + 4 * 3600));
}

/// Instance changes, and steps back in time within an instance, in the raw rows' stored order,
/// and the instances.
fn raw_order(db: &std::path::Path) -> (i64, i64, i64) {
    open_ledger(db)
        .query_row(
            "WITH r AS (
                SELECT instance_id, ts, lag(instance_id) OVER (ORDER BY rowid) AS pi,
                       lag(ts) OVER (ORDER BY rowid) AS pt
                FROM samples_raw)
             SELECT count(*) FILTER (WHERE pi <> instance_id),
                    count(*) FILTER (WHERE pi = instance_id AND ts <= pt),
                    count(DISTINCT instance_id)
             FROM r",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
}

/// The aggregator's own hourly rewrite, through the binary: a restart rewrites the hours that
/// closed while it was down. Before migration 0011 each start left every hour before it in arrival
/// order. An hour cannot pass in a test, so the ledger's record is set back to the start of the
/// hour the exporter filled, as an aggregator stopped during that hour would have left it.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_rewrites_the_hours_that_closed_while_it_was_down() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let hour = (chrono::Utc::now().timestamp() / 3600 - 3) * 3600;
    simulate(&trace, "gpu-a100-01", &hour.to_string(), "20m");
    let rows = std::fs::read_to_string(&trace).unwrap().lines().count() as i64 - 1;
    let db = dir.path().join("ledger.duckdb");
    // A new ledger: its first tick rewrites its (empty) raw window, then none runs for an hour.
    let a = Aggregator::start(&db, 0, &["--retention-interval", "1h"]).await;
    let status = tokio::time::timeout(
        Duration::from_secs(120),
        replay(dir.path(), &a, "gpu-a100-01", &trace).wait(),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(status.success());
    assert!(a.terminate().success());
    let (changes, _, instances) = raw_order(&db);
    assert!(changes > instances - 1, "stored in arrival order first");
    let before = totals(&open_ledger(&db), "rollup_1m");
    assert_eq!(before.0, rows);
    {
        let conn = duckdb::Connection::open(&db).unwrap();
        let until: i64 = conn
            .query_row("SELECT until_ts FROM raw_compacted", [], |r| r.get(0))
            .unwrap();
        assert!(until > hour, "the first tick recorded its empty window");
        conn.execute("UPDATE raw_compacted SET until_ts = ?", [hour])
            .unwrap();
    }

    let a = Aggregator::start(&db, 0, &["--retention-interval", "1h"]).await;
    common::eventually(
        "the hour's rows rewritten",
        Duration::from_secs(60),
        async || {
            (a.value("gpuledger_aggregator_raw_rewritten_rows_total")
                .await
                == Some(rows as f64))
            .then_some(())
        },
    )
    .await;
    let until = a
        .value("gpuledger_aggregator_raw_rewritten_until_timestamp_seconds")
        .await
        .unwrap();
    assert!(until >= (hour + 3600) as f64, "{until}");
    assert!(a.terminate().success());
    assert_eq!(
        raw_order(&db),
        (instances - 1, 0, instances),
        "one run per instance, in second order"
    );
    assert_eq!(totals(&open_ledger(&db), "rollup_1m"), before);
    let raw: i64 = open_ledger(&db)
        .query_row("SELECT count(*) FROM samples_raw", [], |r| r.get(0))
        .unwrap();
    assert_eq!(raw, rows, "no row lost or doubled");
}

/// Kept files skip the raw rows' rewrite only while nothing else shares their hours: two halves
/// of one hour, in one import or in two, end in instance order as one file would.
#[test]
fn kept_files_that_share_an_hour_are_rewritten_in_instance_order() {
    let dir = tempfile::tempdir().unwrap();
    let hour = (chrono::Utc::now().timestamp() / 3600 - 5) * 3600;
    let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
    simulate(&a, "gpu-h100-02", &hour.to_string(), "30m");
    simulate(&b, "gpu-h100-02", &(hour + 1800).to_string(), "30m");
    let together = dir.path().join("together.duckdb");
    let (ok, stderr) = import(&together, &[&a, &b]);
    assert!(ok, "{stderr}");
    let apart = dir.path().join("apart.duckdb");
    for f in [&a, &b] {
        let (ok, stderr) = import(&apart, &[f]);
        assert!(ok, "{stderr}");
    }
    for db in [&together, &apart] {
        let (changes, backwards, instances) = raw_order(db);
        assert!(instances > 1);
        assert_eq!((changes, backwards), (instances - 1, 0), "{}", db.display());
    }
}

/// Files of 8 MiB or more are checked in parts, one thread per core (`trace::Parts`): a bad row
/// is named by its line in the whole file, and a good file is stored whole, once.
#[test]
fn a_large_import_is_checked_in_parts_with_the_whole_files_answers() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let start = (chrono::Utc::now().timestamp() / 3600 - 5) * 3600;
    simulate(&trace, "gpu-h100-02", &start.to_string(), "60m");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.len() >= 8 << 20,
        "{} bytes: too small to be cut",
        text.len()
    );
    let lines = text.lines().count();
    let rows = lines as i64 - 1;
    let db = dir.path().join("ledger.duckdb");

    // A bad row near the end, in the last part.
    let bad = dir.path().join("bad.csv");
    with_bad_ratio(&text, lines - 7, &bad);
    assert_refused_at(import(&db, &[&bad]), &bad, lines - 6, &db);

    let (ok, stderr) = import(&db, &[&trace]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!("{rows} samples: {rows} stored, 0 already")),
        "{stderr}"
    );
    let conn = open_ledger(&db);
    assert_eq!(totals(&conn, "rollup_1h").0, rows);
    let raw: (i64, i64) = conn
        .query_row(
            "SELECT count(*), count(DISTINCT (instance_id, ts)) FROM samples_raw",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(raw, (rows, rows), "every row once in the raw rows");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_export_endpoint_is_for_admins_and_needs_an_export_dir() {
    let dir = tempfile::tempdir().unwrap();
    let viewer = "viewer-token-0123456789abc";
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("viewer {viewer}\n")).unwrap();
    let post = |a: &Aggregator, token: &str, body: &str| {
        let (url, token, body) = (a.url(), token.to_owned(), body.to_owned());
        async move {
            let r = reqwest::Client::new()
                .post(format!("{url}/api/v1/export"))
                .bearer_auth(token)
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let ok = r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}"#;
    let off = Aggregator::start(
        &dir.path().join("off.duckdb"),
        0,
        &["--token-file", tokens.to_str().unwrap()],
    )
    .await;
    let (status, body) = post(&off, ADMIN_TOKEN, ok).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("export_dir"), "{body}");
    drop(off);
    let out = dir.path().join("out");
    let on = Aggregator::start(
        &dir.path().join("on.duckdb"),
        0,
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--export-dir",
            out.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(
        post(&on, viewer, ok).await.0,
        403,
        "a viewer cannot write files"
    );
    let (status, body) = post(
        &on,
        ADMIN_TOKEN,
        r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "dir": "/etc"}"#,
    )
    .await;
    assert_eq!(status, 400, "no path in the request: {body}");
    assert!(body.contains("dir"), "{body}");
    let (status, body) = post(
        &on,
        ADMIN_TOKEN,
        r#"{"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"from\""), "{body}");
    let (status, body) = post(&on, ADMIN_TOKEN, ok).await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["from"], 1_767_225_600);
    assert_eq!(report["to"], 1_767_225_600 + 86_400);
    assert_eq!(
        report["files"], 0,
        "an empty ledger writes no file: {report}"
    );
}

/// Regression: `POST /api/v1/export` with a 300-character `cluster` was a 500 (DuckDB could not
/// open a file of that name); it is a 400 naming `cluster`, and nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_name_too_long_for_a_file_is_a_400_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &["--export-dir", out.to_str().unwrap()],
    )
    .await;
    let body = serde_json::json!({
        "from": "2026-01-01T00:00:00Z",
        "to": "2026-01-02T00:00:00Z",
        "cluster": "c".repeat(300),
    });
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/export", a.url()))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (status, v["error"]["field"].as_str()),
        (400, Some("cluster")),
        "{v}"
    );
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
}

/// `gpuledger import --aggregator`: the same all-or-nothing check, then the running aggregator's
/// ingest API; a second run stores nothing new, and the ledger never had to stop.
#[tokio::test(flavor = "multi_thread")]
async fn import_into_a_running_aggregator_is_checked_first_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let start = (chrono::Utc::now().timestamp() / 3600 - 5) * 3600;
    simulate(&trace, "gpu-a100-01", &start.to_string(), "20m");
    let rows = std::fs::read_to_string(&trace).unwrap().lines().count() as i64 - 1;
    let bad = dir.path().join("bad.csv");
    let mut text = std::fs::read_to_string(&trace).unwrap();
    text.push_str("not,a,sample\n");
    std::fs::write(&bad, text).unwrap();
    let db = dir.path().join("ledger.duckdb");
    let a = Aggregator::start(&db, 0, &[]).await;
    let admin = token_file(dir.path(), ADMIN_TOKEN);
    let import = |files: &[&std::path::Path]| {
        let mut c = gpuledger();
        c.args(["import", "--aggregator", &a.url(), "--token-file"])
            .arg(&admin)
            .args(files);
        c.output().unwrap()
    };
    let out = import(&[&trace, &bad]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nothing was imported"), "{stderr}");
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_samples_total")
            .await
            .unwrap_or(0.0),
        0.0,
        "nothing was sent before every file was checked"
    );
    let out = import(&[&trace]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{rows} samples: {rows} stored, 0 already")),
        "{stderr}"
    );
    let out = import(&[&trace]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{rows} samples: 0 stored, {rows} already")),
        "{stderr}"
    );
    assert!(a.terminate().success());
    assert_eq!(totals(&open_ledger(&db), "rollup_1h").0, rows);
}

/// Fake: an aggregator older than MessagePack bodies. `gpuledger import --aggregator` posts
/// MessagePack; refused, it sends that batch again as JSON under the same id, and JSON after it:
/// every sample arrives once and the import succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn import_into_an_aggregator_that_reads_only_json_sends_json() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let start = (chrono::Utc::now().timestamp() / 3600 - 5) * 3600;
    simulate(&trace, "gpu-a100-01", &start.to_string(), "20m");
    let rows = std::fs::read_to_string(&trace).unwrap().lines().count() - 1;
    let fake = FakeAggregator::start(0, ADMIN_TOKEN).await;
    fake.set_mode(Mode::JsonOnly);
    let admin = token_file(dir.path(), ADMIN_TOKEN);
    let out = gpuledger()
        .args(["import", "--aggregator", &fake.url(), "--token-file"])
        .arg(&admin)
        .arg(&trace)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{rows} samples: {rows} stored, 0 already")),
        "{stderr}"
    );
    let refused = fake.refused_msgpack();
    assert_eq!(refused.len(), 1, "{refused:?}");
    let deliveries = fake.deliveries();
    assert_eq!(deliveries[0].batch_id, refused[0]);
    assert!(
        deliveries
            .iter()
            .all(|d| d.format == gpuledger_schema::wire::Format::Json)
    );
    let samples: usize = deliveries.iter().map(|d| d.samples.len()).sum();
    assert_eq!(samples, rows);
    assert!(deliveries.iter().all(|d| !d.duplicate));
}
