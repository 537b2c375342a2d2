//! Regression tests for the defects an adversarial probe of the aggregator found (issue 11), each
//! against the real binary over HTTP on loopback with a real DuckDB file. Each test's first line
//! says what broke.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::{ADMIN_TOKEN, Aggregator, eventually, open_ledger};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, ShareSample, SloClass};

const N1: &str = "node-n1-token-0123456789";
const N2: &str = "node-n2-token-0123456789";
const SLOW: &str = "node-slow-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";
const TENANT_A: &str = "tenant-a-token-0123456789";
const ANY_NODE: &str = "node-any-token-0123456789";

fn token_file(dir: &std::path::Path) -> String {
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        format!(
            "node:n1 {N1}\nnode:n2 {N2}\nnode:slow {SLOW}\nviewer {VIEWER}\ntenant:a {TENANT_A}\n\
             node:* {ANY_NODE}\n"
        ),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

async fn start(dir: &std::path::Path, extra: &[&str]) -> Aggregator {
    let tokens = token_file(dir);
    let mut args = vec!["--token-file", tokens.as_str()];
    args.extend_from_slice(extra);
    Aggregator::start(&dir.join("ledger.duckdb"), 0, &args).await
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn whole_gpu(node: &str, gpu: &str, tenant: Option<&str>, t: i64, counters: Counters) -> Sample {
    Sample {
        timestamp: t,
        instance: Instance {
            node: node.into(),
            gpu_uuid: gpu.into(),
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
            mig_profile: None,
            gpu_instance_id: None,
            placement_start: None,
            placement_size: None,
        },
        attribution: Attribution {
            tenant: tenant.map(Into::into),
            workload: tenant.map(|t| format!("{t}/job")),
            slo_class: tenant.map(|_| SloClass::Batch),
            owner: None,
            owner_ref: None,
        },
        counters,
    }
}

fn busy(sm: f64) -> Counters {
    Counters {
        sm_active: Some(sm),
        fb_used_bytes: Some(1 << 30),
        fb_total_bytes: Some(80 << 30),
        ..Counters::default()
    }
}

/// Sends `head` (request line and headers, no blank line) and `body`, then reads the status code
/// of the answer, waiting at most `wait`.
fn raw_request(port: u16, head: &str, body: &[u8], wait: Duration) -> (TcpStream, u16) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.write_all(format!("{head}\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .unwrap();
    s.write_all(body).unwrap();
    let status = read_status(&mut s);
    (s, status)
}

fn read_status(s: &mut TcpStream) -> u16 {
    let mut buf = [0u8; 64];
    let mut got = Vec::new();
    while got.len() < 12 {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("no answer: {e}"),
        }
    }
    let line = String::from_utf8_lossy(&got);
    line.get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {line:?}"))
}

async fn get(a: &Aggregator, path: &str, token: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(format!("{}{path}", a.url()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn field(v: &serde_json::Value) -> &str {
    v["error"]["field"].as_str().unwrap_or("<none>")
}

/// Regression (#1): a read-only token's upload was inflated and parsed (1.3 GiB for a 255 KiB
/// gzip body) before its role was checked. Now it is refused before the body is read, and a node
/// token's gzip bomb is refused at the batch's decoded bound.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_token_is_refused_before_its_body_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &[]).await;
    // Headers only: the 1 MiB body never comes. The answer comes anyway.
    for token in [TENANT_A, VIEWER] {
        let head = format!(
            "POST /api/v1/ingest HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Encoding: gzip\r\nContent-Length: 1048576"
        );
        let (_s, status) = raw_request(a.port, &head, b"", Duration::from_secs(20));
        assert_eq!(status, 403, "{token}");
    }
    // A node token's 256 MiB of zeros in ~255 KiB of gzip: 413 naming the bound.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(
        br#"{"v":1,"batch_id":"01a2057d-f974-7779-95df-9092985a68aa","node":"n1","series":[{"t":["#,
    )
    .unwrap();
    let zeros = b"0,".repeat(1 << 20);
    for _ in 0..128 {
        gz.write_all(&zeros).unwrap();
    }
    gz.write_all(b"0]}]}").unwrap();
    let bomb = gz.finish().unwrap();
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/ingest", a.url()))
        .bearer_auth(N1)
        .header("content-encoding", "gzip")
        .body(bomb)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(field(&body), "body");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bytes of JSON"),
        "{body}"
    );
}

/// Regression (#3): `Content-Length: 2^63` was not refused up front, and 64 trickling uploads
/// held every slot for a minute. Now the declared length is refused at once, one token gets at
/// most its share of the slots (429 past it), other nodes' batches still get in, and a trickling
/// body is cut off at the body deadline (408).
#[tokio::test(flavor = "multi_thread")]
async fn slow_uploads_from_one_token_cannot_stop_ingest_for_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(
        dir.path(),
        &[
            "--ingest-slots",
            "6",
            "--ingest-slots-per-token",
            "3",
            "--body-read-timeout",
            "3s",
        ],
    )
    .await;
    let head = |token: &str, len: &str| {
        format!(
            "POST /api/v1/ingest HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Length: {len}"
        )
    };
    let (_s, status) = raw_request(
        a.port,
        &head(SLOW, "9223372036854775808"),
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(status, 413, "a declared length over the limit");
    // Three trickling uploads take the slow token's share.
    let mut slow = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
        s.write_all(format!("{}\r\nHost: x\r\n\r\n{{", head(SLOW, "100000")).as_bytes())
            .unwrap();
        slow.push(s);
    }
    // Give the server a moment to admit them (admission happens before the body is read).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_s, status) = raw_request(a.port, &head(SLOW, "100000"), b"{", Duration::from_secs(20));
    assert_eq!(status, 429, "a fourth upload of the same token");
    // Another node's batch is stored while the slow uploads still hold their slots.
    let t = now() - 120;
    let batch = Batch::from_samples(
        "n1",
        &(t..t + 5)
            .map(|t| whole_gpu("n1", "GPU-1", Some("a"), t, busy(0.5)))
            .collect::<Vec<_>>(),
    );
    let (status, body) = a.ingest(N1, &batch).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stored"], 5);
    // The trickling uploads are cut off at the body deadline.
    for mut s in slow {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(read_status(&mut s), 408);
    }
    assert!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"throttled\"}")
            .await
            .unwrap_or(0.0)
            >= 1.0
    );
    assert!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"timeout\"}")
            .await
            .unwrap_or(0.0)
            >= 3.0
    );
}

/// Regression (#2): byte counters near 2^64 passed validation; summed in the hour rollup they
/// made every re-send 503 forever, wedging the node behind one batch. Now such values are a 400
/// naming the field, and a batch the store cannot sum (a ledger that already holds a huge value)
/// is a 422, so the exporter sets it aside and the node's later batches go through.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_the_store_cannot_sum_is_a_4xx_not_a_503_forever() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = start(dir.path(), &[]).await;
    let hour = now() - now().rem_euclid(3600) - 7200;
    let nvlink = |t: i64, tx: u64| {
        whole_gpu(
            "n1",
            "GPU-1",
            Some("a"),
            t,
            Counters {
                nvlink_tx_bytes: Some(tx),
                ..busy(0.5)
            },
        )
    };
    let huge = Batch::from_samples(
        "n1",
        &[nvlink(hour, u64::MAX), nvlink(hour + 120, u64::MAX)],
    );
    let (status, body) = a.ingest(N1, &huge).await;
    assert_eq!(
        (status, field(&body)),
        (400, "series[0].nvlink_tx_bytes[0]"),
        "{body}"
    );
    let (status, body) = a
        .ingest(
            N1,
            &Batch::from_samples(
                "n1",
                &[whole_gpu(
                    "n1",
                    "GPU-1",
                    None,
                    hour,
                    Counters {
                        fb_used_bytes: Some(u64::MAX),
                        fb_total_bytes: Some(u64::MAX),
                        ..Counters::default()
                    },
                )],
            ),
        )
        .await;
    assert_eq!(
        (status, field(&body)),
        (400, "series[0].fb_used_bytes[0]"),
        "{body}"
    );
    // A ledger that already holds a near-2^64 hour sum (written before the bounds existed).
    let first = Batch::from_samples("n1", &[nvlink(hour, 1000)]);
    assert_eq!(a.ingest(N1, &first).await.0, 200);
    let _ = a.child.kill();
    let _ = a.child.wait();
    {
        let conn = duckdb::Connection::open(&a.db).unwrap();
        conn.execute(
            "UPDATE rollup_1h SET nvlink_tx_bytes_sum = 18446744073709551000",
            [],
        )
        .unwrap();
    }
    a.crash_and_restart().await;
    let next = Batch::from_samples("n1", &[nvlink(hour + 60, 1000)]);
    for _ in 0..2 {
        let (status, body) = a.ingest(N1, &next).await;
        assert_eq!(status, 422, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cannot store"),
            "{body}"
        );
    }
    // The node is not wedged: its next hour is stored.
    let later = Batch::from_samples("n1", &[nvlink(hour + 3600, 1000)]);
    let (status, body) = a.ingest(N1, &later).await;
    assert_eq!((status, body["stored"].as_u64()), (200, Some(1)), "{body}");
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"unstorable\"}")
            .await,
        Some(2.0)
    );
}

/// Regression (#5): `shares` skipped the node, time-window and size checks: a `node:n1` token
/// stored a share for n2, shares dated 2100 were stored, and a shares-only batch counted as 0
/// samples against the queue.
#[tokio::test(flavor = "multi_thread")]
async fn shares_are_checked_like_series() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &["--max-batch-samples", "1000"]).await;
    let t = now() - 60;
    let share = |node: &str, t: i64| ShareSample {
        timestamp: t,
        instance: whole_gpu(node, "GPU-9", None, t, Counters::default()).instance,
        attribution: Attribution {
            tenant: Some("b".into()),
            ..Attribution::default()
        },
        processes: 1,
        memory_used_bytes: Some(1 << 20),
        sm_active: Some(0.1),
    };
    let base = || Batch::from_samples("n1", &[whole_gpu("n1", "GPU-1", Some("a"), t, busy(0.5))]);
    let (status, body) = a.ingest(N1, &base().with_shares(&[share("n2", t)])).await;
    assert_eq!((status, field(&body)), (403, "shares[0].node"), "{body}");
    let year_2100 = 4_102_444_800;
    let (status, body) = a
        .ingest(N1, &base().with_shares(&[share("n1", year_2100)]))
        .await;
    assert_eq!((status, field(&body)), (400, "shares[0].t[0]"), "{body}");
    let many: Vec<ShareSample> = (0..1000).map(|i| share("n1", t - 1000 + i)).collect();
    let (status, body) = a.ingest(N1, &base().with_shares(&many)).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1001 samples, share seconds and GPU-seconds"),
        "{body}"
    );
    // Nothing of the refused batches reached the ledger; a valid one does.
    assert_eq!(
        a.ingest(N1, &base().with_shares(&[share("n1", t)])).await.0,
        200
    );
    assert!(a.terminate().success());
    let conn = open_ledger(&dir.path().join("ledger.duckdb"));
    let (shares, nodes): (i64, i64) = conn
        .query_row(
            "SELECT count(*), count(DISTINCT i.node) FROM shares_raw JOIN instances i USING (instance_id)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((shares, nodes), (1, 1));
}

/// Regression (#6): one node token's batch of 100,000 series added 100,000 instances forever.
/// Now a node has at most `--max-instances-per-node`; a batch past it is a 422 naming the first
/// series over, counted, and stores nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_cannot_add_instances_past_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &["--max-instances-per-node", "8"]).await;
    let t = now() - 60;
    let gpus = |node: &str, n: usize| {
        Batch::from_samples(
            node,
            &(0..n)
                .map(|g| whole_gpu(node, &format!("GPU-{node}-{g}"), None, t, busy(0.0)))
                .collect::<Vec<_>>(),
        )
    };
    let (status, body) = a.ingest(N1, &gpus("n1", 9)).await;
    assert_eq!((status, field(&body)), (422, "series[8]"), "{body}");
    assert_eq!(a.ingest(N1, &gpus("n1", 8)).await.0, 200);
    let (status, _) = a.ingest(N1, &gpus("n1", 9)).await;
    assert_eq!(status, 422, "the ninth instance of n1, later");
    assert_eq!(
        a.ingest(N2, &gpus("n2", 8)).await.0,
        200,
        "other nodes are unaffected"
    );
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"unstorable\"}")
            .await,
        Some(2.0)
    );
    assert_eq!(
        a.value("gpuledger_aggregator_store_rows{table=\"instances\"}")
            .await,
        Some(16.0)
    );
}

/// Regression (issue 48, finding 3): a `node:*` token added 60,000 instances under 240 invented
/// nodes, each within `--max-instances-per-node`, and `/fleet` grew to 177.5 MB. Now the whole
/// ledger has at most `--max-instances`: a batch past it is a 422 naming its first series over,
/// counted as unstorable, and nothing of it is stored.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_star_token_cannot_grow_the_ledger_past_max_instances() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(
        dir.path(),
        &["--max-instances-per-node", "8", "--max-instances", "20"],
    )
    .await;
    let t = now() - 60;
    let gpus = |node: &str, n: usize| {
        Batch::from_samples(
            node,
            &(0..n)
                .map(|g| whole_gpu(node, &format!("GPU-{node}-{g}"), None, t, busy(0.0)))
                .collect::<Vec<_>>(),
        )
    };
    for node in ["invented-1", "invented-2"] {
        assert_eq!(a.ingest(ANY_NODE, &gpus(node, 8)).await.0, 200, "{node}");
    }
    let (status, body) = a.ingest(ANY_NODE, &gpus("invented-3", 8)).await;
    assert_eq!((status, field(&body)), (422, "series[4]"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-instances)"),
        "{body}"
    );
    assert_eq!(
        a.ingest(ANY_NODE, &gpus("invented-3", 4)).await.0,
        200,
        "up to the bound"
    );
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"unstorable\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        a.value("gpuledger_aggregator_store_rows{table=\"instances\"}")
            .await,
        Some(20.0)
    );
}

/// Regression (#4): `/metrics` needed no token and showed every tenant's usage and hoarding
/// episodes. Now the ledger families need a token that may read them, and a tenant token sees
/// only its own series.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_the_ledger_families_only_to_tokens_that_may_read_them() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &["--hoarding-window", "1m"]).await;
    let t = now() - now().rem_euclid(60) - 240;
    let samples: Vec<Sample> = (t..t + 180)
        .flat_map(|t| {
            [
                whole_gpu("n1", "GPU-a", Some("a"), t, busy(0.0)),
                whole_gpu("n1", "GPU-b", Some("b"), t, busy(0.0)),
            ]
        })
        .collect();
    assert_eq!(
        a.ingest(N1, &Batch::from_samples("n1", &samples)).await.0,
        200
    );
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);
    let has = |text: &str, needle: &str| {
        text.lines()
            .any(|l| !l.starts_with('#') && l.contains(needle))
    };
    let (status, anyone) = get(&a, "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(has(&anyone, "gpuledger_aggregator_ingest_samples_total"));
    for private in [
        "gpuledger_tenant_",
        "gpuledger_hoarding_",
        "gpuledger_fragmentation_",
        "tenant=\"",
    ] {
        assert!(!has(&anyone, private), "{private} without a token");
    }
    let (_, node) = get(&a, "/metrics", Some(N1)).await;
    assert!(!has(&node, "tenant=\""), "a node token reads no tenant");
    for token in [VIEWER, ADMIN_TOKEN] {
        let (_, all) = get(&a, "/metrics", Some(token)).await;
        for tenant in ["tenant=\"a\"", "tenant=\"b\""] {
            assert!(
                has(
                    &all,
                    &format!("gpuledger_tenant_allocated_gpu_equivalents{{{tenant}")
                ),
                "{tenant}"
            );
            assert!(
                has(
                    &all,
                    &format!("gpuledger_hoarding_episode_gpu_equivalents{{{tenant}")
                ),
                "{tenant}"
            );
        }
        assert!(has(
            &all,
            "gpuledger_fragmentation_capacity_gpu_equivalents{node=\"n1\"}"
        ));
    }
    let (_, own) = get(&a, "/metrics", Some(TENANT_A)).await;
    assert!(has(
        &own,
        "gpuledger_tenant_allocated_gpu_equivalents{tenant=\"a\""
    ));
    assert!(has(
        &own,
        "gpuledger_hoarding_episode_gpu_equivalents{tenant=\"a\""
    ));
    assert!(!has(&own, "tenant=\"b\""), "tenant a sees b:\n{own}");
    assert!(
        !has(&own, "gpuledger_fragmentation_capacity"),
        "fleet-wide figures are withheld"
    );
    common::assert_openmetrics_valid(&{
        let r = reqwest::Client::new()
            .get(format!("{}/metrics", a.url()))
            .bearer_auth(TENANT_A)
            .header("accept", "application/openmetrics-text; version=1.0.0")
            .send()
            .await
            .unwrap();
        r.text().await.unwrap()
    });
    let (status, _) = get(&a, "/metrics", Some("not-a-token-not-a-token")).await;
    assert_eq!(status, 401, "a mistyped scrape credential fails loudly");
}

/// Regression (#9): `Authorization: bearer …` (lower case) got 401; `gpu_instance_id`
/// 4294967295 was stored as −1, the whole-GPU marker.
#[tokio::test(flavor = "multi_thread")]
async fn small_ones_the_bearer_scheme_and_instance_ids() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &[]).await;
    let r = reqwest::Client::new()
        .get(format!("{}/api/v1/showback", a.url()))
        .header("authorization", format!("bearer {VIEWER}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut s = whole_gpu("n1", "GPU-1", None, now() - 60, busy(0.0));
    s.instance.mig_profile = Some("1g.10gb".into());
    s.instance.gpu_instance_id = Some(u32::MAX);
    let (status, body) = a.ingest(N1, &Batch::from_samples("n1", &[s])).await;
    assert_eq!(
        (status, field(&body)),
        (400, "series[0].gpu_instance_id"),
        "{body}"
    );
}

/// Regression (#9): the listen port was checked only after the ledger file had been created; a
/// token listed twice with different scopes was accepted, the first winning silently.
#[test]
fn start_up_refuses_a_taken_port_before_creating_the_ledger_and_a_duplicated_token() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let db = dir.path().join("new.duckdb");
    let out = common::gpuledger()
        .args(["aggregator", "--db"])
        .arg(&db)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("GPULEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot listen"), "{stderr}");
    assert!(
        !db.exists(),
        "the ledger was created for a start that could not serve"
    );
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("viewer {VIEWER}\n\ntenant:a {VIEWER}\n")).unwrap();
    let out = common::gpuledger()
        .args(["aggregator", "--db"])
        .arg(&db)
        .arg("--token-file")
        .arg(&tokens)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(":3: this token is already configured at") && stderr.contains(":1;"),
        "{stderr}"
    );
}

/// Regression (#8): `/readyz` only ran `SELECT 1`, so it stayed 200 on a full disk while every
/// write failed. Now readiness commits through the writer: on a full disk it is 503 naming the
/// writer, ingest answers 503 with Retry-After (the exporter keeps its batch), and both recover
/// without a restart once there is room.
///
/// The full disk is a 64 MiB tmpfs in a mount namespace of the aggregator's own (`unshare`), the
/// test's stand-in for a volume filling up; it is filled through `/proc/<pid>/root`.
///
/// Retention runs every second here, and checkpoints after it, with a batch in the write-ahead
/// log: a checkpoint that ran out of space made DuckDB invalidate the database, so that nothing
/// recovered without a restart (it once happened by chance at the default interval). Now a
/// checkpoint runs only with room for it.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_fails_on_a_full_disk_and_recovers_without_a_restart() {
    common::require_tool("unshare");
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let mnt = dir.path().join("vol");
    std::fs::create_dir(&mnt).unwrap();
    let port = common::free_port();
    let mut child = std::process::Command::new("unshare")
        .args(["--mount", "--map-root-user", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=64m tmpfs \"$1\" && exec \"$2\" aggregator --db \"$1/ledger.duckdb\" --listen \"$3\" --token-file \"$4\" --retention-interval 1s")
        .arg("sh")
        .arg(&mnt)
        .arg(env!("CARGO_BIN_EXE_gpuledger"))
        .arg(format!("127.0.0.1:{port}"))
        .arg(&tokens)
        .env("GPULEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let ready = || async {
        reqwest::get(format!("{url}/readyz"))
            .await
            .ok()
            .map(|r| r.status().as_u16())
    };
    eventually(
        "the aggregator's /readyz",
        Duration::from_secs(30),
        async || (ready().await == Some(200)).then_some(()),
    )
    .await;
    // A batch in the write-ahead log, so that a checkpoint on the full disk has rows to write.
    let t = now() - 60;
    let earlier = Batch::from_samples(
        "n1",
        &(t - 60..t - 30)
            .map(|t| whole_gpu("n1", "GPU-0", Some("a"), t, busy(0.5)))
            .collect::<Vec<_>>(),
    );
    let post = |batch: &Batch| {
        reqwest::Client::new()
            .post(format!("{url}/api/v1/ingest"))
            .bearer_auth(N1)
            .header("content-encoding", "gzip")
            .body(batch.encode())
            .send()
    };
    assert_eq!(post(&earlier).await.unwrap().status().as_u16(), 200);
    // Fill the volume, as seen from inside the aggregator's mount namespace.
    let filler = std::path::PathBuf::from(format!("/proc/{}/root", child.id()))
        .join(mnt.strip_prefix("/").unwrap())
        .join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 1 << 16];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    let batch = Batch::from_samples(
        "n1",
        &(t..t + 30)
            .flat_map(|t| {
                (0..8).map(move |g| whole_gpu("n1", &format!("GPU-{g}"), Some("a"), t, busy(0.5)))
            })
            .collect::<Vec<_>>(),
    );
    let r = post(&batch).await.unwrap();
    assert_eq!(
        r.status().as_u16(),
        503,
        "a full disk is retried, never a bad batch"
    );
    assert!(r.headers().contains_key("retry-after"));
    let why = eventually("/readyz to fail", Duration::from_secs(30), async || {
        let r = reqwest::get(format!("{url}/readyz")).await.ok()?;
        (r.status().as_u16() == 503).then_some(r.text().await.unwrap())
    })
    .await;
    assert!(why.contains("the writer cannot commit"), "{why}");
    assert!(why.contains("disk is full"), "{why}");
    std::fs::remove_file(&filler).unwrap();
    eventually("/readyz to recover", Duration::from_secs(30), async || {
        (ready().await == Some(200)).then_some(())
    })
    .await;
    let r = post(&batch).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        body["stored"], 240,
        "acknowledged = stored after the recovery"
    );
    let _ = child.kill();
    let _ = child.wait();
}
