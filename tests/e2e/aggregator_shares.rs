//! Shares of shared instances in the ledger, over real HTTP and a real DuckDB file: a batch's
//! `shares` are stored once however often they are re-sent, `GET /api/v1/shares` answers them per
//! owner (scoped by token, 400s naming the field), and the hourly rollup equals the raw rows.

use crate::common;

use crate::common::Aggregator;
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, ShareSample, SloClass};
use serde_json::Value;

const VIEWER: &str = "viewer-token-0123456789";
const VISION: &str = "vision-token-0123456789";
const NODE: &str = "node-n1-token-0123456789";

async fn get(a: &Aggregator, token: &str, path: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", a.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn gpu() -> Instance {
    Instance {
        node: "n1".into(),
        gpu_uuid: "GPU-shared".into(),
        gpu_model: "NVIDIA H100 80GB HBM3".into(),
        mig_profile: None,
        gpu_instance_id: None,
        placement_start: None,
        placement_size: None,
    }
}

fn owner(tenant: &str, workload: &str) -> Attribution {
    Attribution {
        tenant: Some(tenant.into()),
        workload: Some(workload.into()),
        slo_class: Some(SloClass::Batch),
        owner: None,
        owner_ref: None,
    }
}

/// 120 seconds of a time-sliced GPU charged (in the ledger) to ml/train-0, with its shares:
/// train-0 (2 processes, 16 GiB, 0.4 of the SM activity), api-0 (1, 20 GiB, 0.2), a notebook
/// holding a replica and running nothing, and an unnamed process whose split is unattributable.
fn second_batches(t0: i64) -> (Vec<Sample>, Vec<ShareSample>) {
    let mut samples = Vec::new();
    let mut shares = Vec::new();
    for t in t0..t0 + 120 {
        samples.push(Sample {
            timestamp: t,
            instance: gpu(),
            attribution: owner("vision", "ml/train-0"),
            counters: Counters {
                sm_active: Some(0.6),
                fb_used_bytes: Some(37 << 30),
                fb_total_bytes: Some(80 << 30),
                ..Counters::default()
            },
        });
        for (attribution, processes, gib, sm) in [
            (owner("vision", "ml/train-0"), 2, 16, Some(0.4)),
            (owner("serving", "serving/api-0"), 1, 20, Some(0.2)),
            (owner("ml", "ml/notebook-0"), 0, 0, Some(0.0)),
            (Attribution::default(), 1, 1, None),
        ] {
            shares.push(ShareSample {
                timestamp: t,
                instance: gpu(),
                attribution,
                processes,
                memory_used_bytes: Some(gib << 30),
                sm_active: sm,
            });
        }
    }
    (samples, shares)
}

#[tokio::test(flavor = "multi_thread")]
async fn shares_are_stored_once_answered_per_owner_and_scoped() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("viewer {VIEWER}\ntenant:vision {VISION}\nnode:n1 {NODE}\n"),
    )
    .unwrap();
    let db = dir.path().join("ledger.duckdb");
    let a = Aggregator::start(&db, 0, &["--token-file", tokens.to_str().unwrap()]).await;
    let now = chrono::Utc::now().timestamp();
    let t0 = now - now.rem_euclid(3600) - 3600;
    let (samples, shares) = second_batches(t0);
    let batch = Batch::from_samples("n1", &samples).with_shares(&shares);
    for _ in 0..2 {
        let (status, body) = a.ingest(NODE, &batch).await;
        assert_eq!(status, 200, "{body}");
    }
    // The same seconds re-sealed under a new batch id (an exporter that lost its spool index):
    // neither the samples nor the shares count twice.
    let (status, body) = a
        .ingest(
            NODE,
            &Batch::from_samples("n1", &samples).with_shares(&shares),
        )
        .await;
    assert_eq!((status, body["stored"].as_u64()), (200, Some(0)), "{body}");

    let range = format!("from={t0}&to={}", t0 + 3600);
    let (status, body) = get(&a, VIEWER, &format!("/api/v1/shares?{range}")).await;
    assert_eq!(status, 200, "{body}");
    let rows = body["rows"].as_array().unwrap();
    let row = |workload: Option<&str>| {
        rows.iter()
            .find(|r| r["workload"].as_str() == workload)
            .unwrap_or_else(|| panic!("no row for {workload:?} in {body}"))
    };
    let close = |v: &Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;
    let train = row(Some("ml/train-0"));
    assert_eq!(train["share_seconds"], 120);
    assert_eq!(train["process_seconds"], 240);
    assert!(close(&train["used_gpu_seconds"], 0.4 * 120.0), "{train}");
    assert!(
        close(&train["memory_gib_hours"], 16.0 * 120.0 / 3600.0),
        "{train}"
    );
    assert!(close(
        &train["mean_memory_used_bytes"],
        (16u64 << 30) as f64
    ));
    assert_eq!(train["gpu_uuid"], "GPU-shared");
    let api = row(Some("serving/api-0"));
    assert!(close(&api["used_gpu_seconds"], 0.2 * 120.0), "{api}");
    let idle = row(Some("ml/notebook-0"));
    assert_eq!(
        (&idle["process_seconds"], &idle["used_gpu_seconds"]),
        (&Value::from(0), &Value::from(0.0))
    );
    let unnamed = row(None);
    assert_eq!(unnamed["tenant"], Value::Null);
    assert_eq!(unnamed["sm_unattributable_seconds"], 120);
    assert_eq!(unnamed["sm_attributable_seconds"], 0);

    // Per tenant, and scoped: a tenant token sees its own rows only.
    let (_, by_tenant) = get(
        &a,
        VIEWER,
        &format!("/api/v1/shares?{range}&group_by=tenant"),
    )
    .await;
    assert_eq!(
        by_tenant["rows"].as_array().unwrap().len(),
        4,
        "{by_tenant}"
    );
    let (status, own) = get(&a, VISION, &format!("/api/v1/shares?{range}")).await;
    assert_eq!(status, 200);
    let own = own["rows"].as_array().unwrap();
    assert!(own.len() == 1 && own[0]["tenant"] == "vision", "{own:?}");

    // Bad requests name the field; exporters cannot read.
    for (token, query, code, field) in [
        (
            VIEWER,
            format!("from={}&to={}", t0 + 1, t0 + 3600),
            400,
            "from",
        ),
        (VIEWER, format!("{range}&group_by=gpu"), 400, "group_by"),
        (VIEWER, format!("{range}&tenant=x"), 400, "tenant"),
        (NODE, range.clone(), 403, "authorization"),
    ] {
        let (status, body) = get(&a, token, &format!("/api/v1/shares?{query}")).await;
        assert_eq!(status, code, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }

    // The hourly rollup equals the raw rows.
    assert!(a.terminate().success());
    let conn = common::open_ledger(&db);
    let (raw, rolled): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM shares_raw),
                    (SELECT sum(seconds)::BIGINT FROM rollup_share_1h)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((raw, rolled), (480, 480));
    let (raw_sm, rolled_sm): (f64, f64) = conn
        .query_row(
            "SELECT (SELECT sum(sm_active) FROM shares_raw),
                    (SELECT sum(sm_active_sum) FROM rollup_share_1h)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!((raw_sm - rolled_sm).abs() < 1e-9 && (raw_sm - 72.0).abs() < 1e-9);
}

/// The bill splits a time-sliced GPU's charge by the measured shares: the ledger charges the
/// GPU to vision (its holder); serving used a third of the measured SM activity, so a third of
/// the charge moves to serving, and the bill still adds up to the fleet's cost.
#[tokio::test(flavor = "multi_thread")]
async fn the_bill_splits_a_shared_gpu_by_measured_use() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("viewer {VIEWER}\nnode:n1 {NODE}\n")).unwrap();
    let db = dir.path().join("ledger.duckdb");
    let a = Aggregator::start(
        &db,
        0,
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--default-price",
            "3.6",
        ],
    )
    .await;
    let now = chrono::Utc::now().timestamp();
    let t0 = now - now.rem_euclid(3600) - 3600;
    let (samples, shares) = second_batches(t0);
    let (status, body) = a
        .ingest(
            NODE,
            &Batch::from_samples("n1", &samples).with_shares(&shares),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let cents = |v: &Value| (v.as_f64().unwrap() * 100.0).round() as i64;
    // 120 GPU-seconds at 3.6 per GPU-hour: 0.12. SM split: vision 0.4, serving 0.2 (the
    // notebook used none, the unnamed process's split was not measured).
    for (mode, vision, serving, moved) in [("allocation", 8, 4, 4), ("usage", 5, 2, 2)] {
        let (status, bill) = get(
            &a,
            VIEWER,
            &format!("/api/v1/bill?from={t0}&to={}&mode={mode}", t0 + 3600),
        )
        .await;
        assert_eq!(status, 200, "{bill}");
        let line = |t: &str| {
            bill["lines"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["tenant"] == t)
                .unwrap_or_else(|| panic!("no {t} in {bill}"))
                .clone()
        };
        assert_eq!(cents(&line("vision")["cost"]), vision, "{mode}: {bill}");
        assert_eq!(cents(&line("serving")["cost"]), serving, "{mode}: {bill}");
        assert_eq!(
            cents(&line("serving")["shared_gpu_transfer"]),
            moved,
            "{mode}"
        );
        assert_eq!(
            cents(&line("vision")["shared_gpu_transfer"]),
            -moved,
            "{mode}"
        );
        let sum: i64 = bill["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| cents(&l["total"]))
            .sum();
        assert_eq!(
            sum + cents(&bill["overhead"]["total"]),
            cents(&bill["fleet_cost"]),
            "{bill}"
        );
        assert_eq!(cents(&bill["fleet_cost"]), 12);
    }
}
