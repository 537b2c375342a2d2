//! The aggregator over real HTTP on loopback with a real DuckDB file: authentication, errors that
//! name the field, exactly-once storage, and an exporter feeding it.

use std::time::Duration;

use crate::common::{ADMIN_TOKEN, Aggregator, Exporter, eventually, open_ledger, token_file};
use gpuledger_schema::wire::{Batch, Format, MSGPACK_CONTENT_TYPE as MSGPACK};
use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};

const NODE_TOKEN: &str = "node-n1-token-abcdef0123";
const SHARED_TOKEN: &str = "shared-token-abcdef012345";

fn tokens(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        format!("# test tokens\nnode:n1 {NODE_TOKEN}\nnode:* {SHARED_TOKEN}\n"),
    )
    .unwrap();
    path
}

fn sample(node: &str, gi: u32, t: i64, sm: f64) -> Sample {
    Sample {
        timestamp: t,
        instance: Instance {
            node: node.into(),
            gpu_uuid: format!("GPU-{node}"),
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
            mig_profile: Some("1g.10gb".into()),
            gpu_instance_id: Some(gi),
            placement_start: Some(gi),
            placement_size: Some(1),
        },
        attribution: Attribution {
            tenant: Some("research".into()),
            workload: Some("research/job-1".into()),
            slo_class: Some(SloClass::Batch),
            owner: None,
            owner_ref: None,
        },
        counters: Counters {
            sm_active: Some(sm),
            fb_used_bytes: Some(1 << 30),
            fb_total_bytes: Some(10 << 30),
            ..Counters::default()
        },
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn batch(node: &str, from: i64, seconds: i64) -> Batch {
    let samples: Vec<Sample> = (from..from + seconds)
        .flat_map(|t| (0..7).map(move |gi| sample(node, gi, t, 0.25)))
        .collect();
    Batch::from_samples(node, &samples)
}

async fn post_raw(
    a: &Aggregator,
    token: Option<&str>,
    body: Vec<u8>,
    gzip: bool,
) -> (u16, serde_json::Value) {
    post_as(a, token, body, gzip, "application/json").await
}

async fn post_as(
    a: &Aggregator,
    token: Option<&str>,
    body: Vec<u8>,
    gzip: bool,
    content_type: &str,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/api/v1/ingest", a.url()))
        .header("content-type", content_type)
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if gzip {
        req = req.header("content-encoding", "gzip");
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

fn field(v: &serde_json::Value) -> &str {
    v["error"]["field"].as_str().unwrap_or("<none>")
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_a_4xx_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens(dir.path());
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--max-body-bytes",
            "200000",
        ],
    )
    .await;
    let good = batch("n1", now() - 60, 10);

    let (status, body) = post_raw(&a, None, good.encode(), true).await;
    assert_eq!((status, field(&body)), (401, "authorization"));
    let (status, _) = post_raw(&a, Some("not-a-known-token-at-all"), good.encode(), true).await;
    assert_eq!(status, 401);

    // A node token is good for its own node only.
    let other = batch("n2", now() - 60, 10);
    let (status, body) = post_raw(&a, Some(NODE_TOKEN), other.encode(), true).await;
    assert_eq!((status, field(&body)), (403, "node"), "{body}");
    assert_eq!(a.ingest(SHARED_TOKEN, &other).await.0, 200);
    assert_eq!(
        a.ingest(ADMIN_TOKEN, &batch("n3", now() - 60, 1)).await.0,
        200
    );

    let mut json: serde_json::Value = serde_json::to_value(&good).unwrap();
    json["series"][0]["sm_active"][1] = serde_json::json!(1.5);
    let (status, body) = post_raw(
        &a,
        Some(NODE_TOKEN),
        serde_json::to_vec(&json).unwrap(),
        false,
    )
    .await;
    assert_eq!(
        (status, field(&body)),
        (400, "series[0].sm_active[1]"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("outside 0–1")
    );

    let mut json: serde_json::Value = serde_json::to_value(&good).unwrap();
    json["v"] = serde_json::json!(99);
    let (status, body) = post_raw(
        &a,
        Some(NODE_TOKEN),
        serde_json::to_vec(&json).unwrap(),
        false,
    )
    .await;
    assert_eq!((status, field(&body)), (400, "v"));

    let mut json: serde_json::Value = serde_json::to_value(&good).unwrap();
    json["series"][0]["fb_used_bytes"][0] = serde_json::json!(-5);
    let (status, body) = post_raw(
        &a,
        Some(NODE_TOKEN),
        serde_json::to_vec(&json).unwrap(),
        false,
    )
    .await;
    assert_eq!(
        (status, field(&body)),
        (400, "series[0].fb_used_bytes[0]"),
        "{body}"
    );

    let future = batch("n1", now() + 3600, 1);
    let (status, body) = a.ingest(NODE_TOKEN, &future).await;
    assert_eq!((status, field(&body)), (400, "series[0].t[0]"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("future")
    );

    let ancient = batch("n1", 1_000_000_000, 1);
    let (status, body) = a.ingest(NODE_TOKEN, &ancient).await;
    assert_eq!((status, field(&body)), (400, "series[0].t[0]"), "{body}");

    let (status, body) = post_raw(&a, Some(NODE_TOKEN), b"{not json".to_vec(), false).await;
    assert_eq!((status, field(&body)), (400, "body"));
    let (status, body) = post_raw(&a, Some(NODE_TOKEN), b"not gzip".to_vec(), true).await;
    assert_eq!((status, field(&body)), (400, "body"));

    let (status, body) = post_raw(&a, Some(NODE_TOKEN), vec![b' '; 300_000], false).await;
    assert_eq!((status, field(&body)), (413, "body"));

    // MessagePack names the field as JSON does; a media type that is neither is a 415.
    let mut json: serde_json::Value = serde_json::to_value(&good).unwrap();
    json["series"][0]["sm_active"][1] = serde_json::json!(1.5);
    let packed = rmp_serde::to_vec_named(&json).unwrap();
    let (status, body) = post_as(&a, Some(NODE_TOKEN), packed, false, MSGPACK).await;
    assert_eq!(
        (status, field(&body)),
        (400, "series[0].sm_active[1]"),
        "{body}"
    );
    let (status, body) = post_as(&a, Some(NODE_TOKEN), good.encode(), true, "text/csv").await;
    assert_eq!((status, field(&body)), (415, "content-type"), "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(MSGPACK),
        "{body}"
    );

    // Each refusal is counted by reason.
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"unauthorized\"}")
            .await,
        Some(2.0)
    );
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"forbidden\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"too_large\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_rejected_total{reason=\"invalid\"}")
            .await,
        Some(9.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_or_second_sent_twice_is_stored_once_in_any_order() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens(dir.path());
    let db = dir.path().join("ledger.duckdb");
    let a = Aggregator::start(&db, 0, &["--token-file", tokens.to_str().unwrap()]).await;
    let t = now() - 600;
    let first = batch("n1", t, 60);
    let (status, body) = a.ingest(NODE_TOKEN, &first).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stored"], 420);
    // The same batch again (a lost acknowledgement), even in the other encoding: acknowledged,
    // nothing stored.
    let (status, body) = post_as(
        &a,
        Some(NODE_TOKEN),
        first.encode_as(Format::MessagePack),
        true,
        MSGPACK,
    )
    .await;
    assert_eq!(
        (
            status,
            body["duplicate_batch"].as_bool(),
            body["stored"].as_u64()
        ),
        (200, Some(true), Some(0))
    );
    // A new batch id overlapping the second half (in MessagePack), sent before a batch for
    // earlier seconds.
    let overlap = batch("n1", t + 30, 60);
    let packed = overlap.encode_as(Format::MessagePack);
    let (_, body) = post_as(&a, Some(NODE_TOKEN), packed, true, MSGPACK).await;
    assert_eq!(
        (body["stored"].as_u64(), body["duplicate_samples"].as_u64()),
        (Some(210), Some(210))
    );
    let earlier = batch("n1", t - 30, 40);
    let (_, body) = a.ingest(NODE_TOKEN, &earlier).await;
    assert_eq!(body["stored"].as_u64(), Some(210));
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_samples_total").await,
        Some(840.0)
    );
    assert_eq!(
        a.value("gpuledger_aggregator_ingest_duplicate_batches_total")
            .await,
        Some(1.0)
    );
    assert!(a.value("gpuledger_aggregator_store_bytes").await.unwrap() > 0.0);
    assert!(a.terminate().success());

    let conn = open_ledger(&db);
    let (rows, distinct, min, max): (i64, i64, i64, i64) = conn
        .query_row(
            "SELECT count(*), count(DISTINCT (instance_id, ts)), min(ts), max(ts) FROM samples_raw",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!((rows, distinct, min, max), (840, 840, t - 30, t + 89));
    let rolled: i64 = conn
        .query_row("SELECT sum(samples)::BIGINT FROM rollup_1h", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(rolled, 840);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sim_exporter_feeding_the_aggregator_stores_exactly_what_it_sent() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens(dir.path());
    let db = dir.path().join("ledger.duckdb");
    let a = Aggregator::start(&db, 0, &["--token-file", tokens.to_str().unwrap()]).await;
    let token = token_file(dir.path(), SHARED_TOKEN);
    let url = a.url();
    let spool = dir.path().join("spool");
    let exporter = Exporter::start(&[
        "--source",
        "sim",
        "--node",
        "gpu-h100-01",
        "--aggregator",
        &url,
        "--ship-interval",
        "1s",
        "--token-file",
        token.to_str().unwrap(),
        "--spool-dir",
        spool.to_str().unwrap(),
    ])
    .await;
    eventually("five batches stored", Duration::from_secs(30), async || {
        (a.value("gpuledger_aggregator_ingest_batches_total").await >= Some(5.0)).then_some(())
    })
    .await;
    let exporter_port = exporter.port;
    let _ = exporter_port;
    assert!(
        exporter.terminate().success(),
        "the exporter drains on SIGTERM"
    );
    let shipped = a
        .value("gpuledger_aggregator_ingest_samples_total")
        .await
        .unwrap();
    assert!(a.terminate().success());

    let conn = open_ledger(&db);
    let (rows, seconds, instances): (i64, i64, i64) = conn
        .query_row(
            "SELECT count(*), count(DISTINCT ts), count(DISTINCT instance_id) FROM samples_raw",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(rows as f64, shipped);
    assert_eq!(instances, 56);
    assert_eq!(
        rows,
        seconds * 56,
        "every second complete with its 56 instances"
    );
    // The stored values are the simulator's, second for second.
    let sim = gpuledger_exporter::source::sim::Simulator::new(
        gpuledger_exporter::source::sim::Fleet::builtin(),
    );
    let mut stmt = conn
        .prepare(
            "SELECT r.ts, i.gpu_uuid, i.gpu_instance_id, h.tenant, r.sm_active, r.fb_used_bytes
             FROM samples_raw r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)",
        )
        .unwrap();
    let stored: Vec<(i64, String, i32, Option<String>, Option<f64>, Option<u64>)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (ts, uuid, gi, tenant, sm, fb) in stored {
        let second = sim.second(Some("gpu-h100-01"), ts);
        let r = second
            .readings
            .iter()
            .find(|r| {
                r.instance.gpu_uuid == uuid
                    && r.instance.gpu_instance_id.map_or(-1, |g| g as i32) == gi
            })
            .expect("a simulated instance");
        assert_eq!(
            (tenant, sm, fb),
            (
                r.attribution.tenant.clone(),
                r.counters.sm_active,
                r.counters.fb_used_bytes
            ),
            "{uuid}/{gi} at {ts}"
        );
    }
}
