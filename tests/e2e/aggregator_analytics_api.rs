//! The analytics API over real HTTP: a running aggregator fed the known trace answers showback,
//! hoarding and fragmentation; tokens scope what each caller sees; bad parameters get a 400
//! naming them; the analytics metrics are promtool-clean and carry the open episodes.

use crate::common;

use crate::common::{ADMIN_TOKEN, Aggregator};
use gpuledger_schema::wire::Batch;
use serde_json::Value;

const VIEWER: &str = "viewer-token-0123456789";
const TEAM_A: &str = "team-a-token-0123456789";
const NODE: &str = "node-n1-token-0123456789";

async fn get(a: &Aggregator, token: Option<&str>, path: &str) -> (u16, Value) {
    let mut r = reqwest::Client::new().get(format!("{}{path}", a.url()));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn fed(dir: &std::path::Path) -> (Aggregator, i64) {
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!("viewer {VIEWER}\ntenant:team-a {TEAM_A}\nnode:n1 {NODE}\n"),
    )
    .unwrap();
    let a = Aggregator::start(
        &dir.join("ledger.duckdb"),
        0,
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--analytics-interval",
            "1h",
            "--default-price",
            "3.6",
        ],
    )
    .await;
    let now = chrono::Utc::now().timestamp();
    let t0 = now - now.rem_euclid(3600) - 3 * 3600;
    let trace = common::traces::known_trace(t0);
    for chunk in trace.chunks(5_000) {
        let (status, body) = a.ingest(NODE, &Batch::from_samples("n1", chunk)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_eq!(status, 200);
    assert_eq!(report["gpu_hours"], 4, "{report}");
    (a, t0)
}

#[tokio::test(flavor = "multi_thread")]
async fn analytics_over_http_with_scoped_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (a, t0) = fed(dir.path()).await;
    let range = format!("from={t0}&to={}", t0 + 7200);

    // Showback for a viewer: every tenant, fleet totals.
    let (status, v) = get(
        &a,
        Some(VIEWER),
        &format!("/api/v1/showback?{range}&group_by=tenant"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let tenants: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, ["team-a", "team-b", "team-c"]);
    let team_c = &v["rows"][2];
    assert!((team_c["allocated_gpu_seconds"].as_f64().unwrap() - 7200.0 / 7.0).abs() < 1e-6);
    assert!((team_c["cost"].as_f64().unwrap() - 7200.0 / 7.0 * 0.001).abs() < 1e-9);
    assert_eq!(v["totals"]["capacity_gpu_seconds"], 14400.0);
    assert_eq!(v["totals"]["coverage"], 1.0);
    assert_eq!(v["currency"], "USD");

    // A tenant token: its rows only, and no fleet figures.
    let (status, v) = get(
        &a,
        Some(TEAM_A),
        &format!("/api/v1/showback?{range}&group_by=workload"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let workloads: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(workloads, ["team-a/job-x", "team-a/notebook-1"]);
    assert!(v["totals"].get("capacity_gpu_seconds").is_none(), "{v}");

    // Hoarding: the viewer sees both open episodes, team-a only its own.
    let (_, v) = get(&a, Some(VIEWER), "/api/v1/hoarding?state=open").await;
    let open: Vec<&str> = v["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["workload"].as_str().unwrap())
        .collect();
    assert_eq!(open.len(), 2, "{v}");
    assert!(open.contains(&"team-a/notebook-1") && open.contains(&"team-c/infer-0"));
    let (_, v) = get(&a, Some(TEAM_A), "/api/v1/hoarding?state=all").await;
    let mine: Vec<(&str, Value)> = v["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["workload"].as_str().unwrap(), e["ended_at"].clone()))
        .collect();
    assert_eq!(mine.len(), 2, "{v}");
    assert!(mine.contains(&("team-a/job-x", Value::from(t0 + 1817))));
    let e = &v["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["workload"] == "team-a/notebook-1")
        .unwrap()
        .clone();
    assert_eq!(e["detected_at"], t0 + 1800);
    assert_eq!(e["mig_profile"], "1g.10gb");
    assert_eq!(e["gpu_instance_id"], 7);

    // Fragmentation: fleet data for viewers, refused to tenants.
    let (status, v) = get(
        &a,
        Some(VIEWER),
        &format!("/api/v1/fragmentation?at={}", t0 + 7199),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let gpu_a = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gpu_uuid"] == "GPU-A")
        .unwrap();
    assert_eq!(gpu_a["free_slots"], serde_json::json!([1, 3, 5, 7]));
    assert_eq!(gpu_a["largest_placeable_profile"], "1g.10gb");
    assert_eq!(gpu_a["instances"].as_array().unwrap().len(), 4);
    assert_eq!(v["fleet"]["gpus"], 2);
    let (status, v) = get(&a, Some(VIEWER), &format!("/api/v1/fragmentation?{range}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["fleet"]["capacity_gpu_seconds"], 14400);
    assert_eq!(v["nodes"][0]["node"], "n1");
    assert_eq!(v["nodes"][0]["capacity_gpu_seconds"], 14400);
    // GPU-A's checkerboard strands 0.5 of 7 slices for the whole two hours; cost at 3.6/GPU-hour.
    let stranded = v["fleet"]["stranded_gpu_seconds"].as_f64().unwrap();
    assert!((stranded - 0.5 / 7.0 * 7200.0).abs() < 1e-6, "{v}");
    assert!((v["fleet"]["stranded_cost"].as_f64().unwrap() - stranded * 0.001).abs() < 1e-9);
    let (status, _) = get(&a, Some(TEAM_A), "/api/v1/fragmentation").await;
    assert_eq!(status, 403);

    // Metrics: the open episodes as series, tenants' current figures, promtool-clean.
    let body = a.metrics_as(VIEWER).await;
    common::assert_promtool_clean(&body);
    let episode = "gpuledger_hoarding_episode_idle_duration_seconds{tenant=\"team-c\",workload=\"team-c/infer-0\",node=\"n1\",gpu=\"GPU-A\",gpu_instance=\"9\",slo_class=\"latency_critical\"}";
    assert_eq!(a.value_as(VIEWER, episode).await, Some(7200.0), "{body}");
    let idle = a
        .value_as(VIEWER, "gpuledger_tenant_allocated_gpu_equivalents{tenant=\"team-c\",slo_class=\"latency_critical\"}")
        .await
        .unwrap();
    assert!((idle - 1.0 / 7.0).abs() < 1e-9);
    assert_eq!(
        a.value_as(
            VIEWER,
            "gpuledger_fragmentation_capacity_gpu_equivalents{node=\"n1\"}"
        )
        .await,
        Some(2.0)
    );

    // The hoarder gets busy: its episode ends at the busy minute and its series is removed.
    use common::traces::{held, mig, sample};
    let busy: Vec<_> = (t0 + 7200..t0 + 7320)
        .map(|t| {
            sample(
                t,
                &mig("GPU-A", 7, 0),
                held(
                    "team-a",
                    "team-a/notebook-1",
                    gpuledger_schema::SloClass::Interactive,
                ),
                Some(0.9),
            )
        })
        .collect();
    assert_eq!(
        a.ingest(NODE, &Batch::from_samples("n1", &busy)).await.0,
        200
    );
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);
    let body = a.metrics_as(VIEWER).await;
    assert!(
        !body.contains("workload=\"team-a/notebook-1\""),
        "a stale episode series: {body}"
    );
    let (_, v) = get(&a, Some(VIEWER), "/api/v1/hoarding?state=closed").await;
    let ended = |w: &str| {
        v["episodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["workload"] == w)
            .unwrap()["ended_at"]
            .clone()
    };
    assert_eq!(ended("team-a/notebook-1"), t0 + 7200);
    // Only slot 0 reported after t0+7200: the GPU went on being observed without team-c's
    // slice, so that allocation ended too, at the second after its last sample.
    assert_eq!(ended("team-c/infer-0"), t0 + 7200);
    assert!(
        !body.contains("gpuledger_hoarding_episode_idle_duration_seconds{"),
        "{body}"
    );
}

/// Times made relative to the trace's start, and floats rounded, so the snapshot is stable.
fn relative(v: &Value, t0: i64) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    let x = match (k.as_str(), x.as_i64()) {
                        (
                            "from" | "to" | "started_at" | "detected_at" | "ended_at"
                            | "last_second",
                            Some(t),
                        ) => Value::from(format!("t0{:+}", t - t0)),
                        _ => relative(x, t0),
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| relative(x, t0)).collect()),
        Value::Number(n) if n.is_f64() => Value::from((n.as_f64().unwrap() * 1e6).round() / 1e6),
        x => x.clone(),
    }
}

/// The JSON finance and reclaim tooling read, pinned: any change to a field or a figure shows up
/// in review as a snapshot diff.
#[tokio::test(flavor = "multi_thread")]
async fn showback_and_hoarding_json_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let (a, t0) = fed(dir.path()).await;
    let (_, v) = get(
        &a,
        Some(VIEWER),
        &format!(
            "/api/v1/showback?from={t0}&to={}&group_by=workload",
            t0 + 7200
        ),
    )
    .await;
    insta::assert_json_snapshot!("showback_by_workload", relative(&v, t0));
    // Paged: the totals cover every row; `next_offset` leads to the rest, and the pages together
    // are the whole answer.
    let rows = v["rows"].as_array().unwrap().clone();
    let base = format!(
        "/api/v1/showback?from={t0}&to={}&group_by=workload",
        t0 + 7200
    );
    let (_, first) = get(&a, Some(VIEWER), &format!("{base}&limit=2")).await;
    assert_eq!(first["rows"].as_array().unwrap()[..], rows[..2]);
    assert_eq!(first["next_offset"], 2);
    assert_eq!(first["totals"], v["totals"]);
    let (_, rest) = get(&a, Some(VIEWER), &format!("{base}&offset=2&limit=10000")).await;
    assert_eq!(rest["rows"].as_array().unwrap()[..], rows[2..]);
    assert!(rest["next_offset"].is_null());
    let (status, body) = get(&a, Some(VIEWER), &format!("{base}&limit=10001")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("\"limit\""), "{body}");
    let (_, v) = get(&a, Some(VIEWER), "/api/v1/hoarding?state=all").await;
    insta::assert_json_snapshot!("hoarding_all", relative(&v, t0));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_name_the_parameter_and_tokens_are_required() {
    let dir = tempfile::tempdir().unwrap();
    let (a, t0) = fed(dir.path()).await;
    for (token, path, status, field) in [
        (None, "/api/v1/showback".to_owned(), 401, "authorization"),
        (
            Some(NODE),
            "/api/v1/showback".to_owned(),
            403,
            "authorization",
        ),
        (
            Some(VIEWER),
            "/api/v1/showback?group_by=team".to_owned(),
            400,
            "group_by",
        ),
        (
            Some(VIEWER),
            "/api/v1/showback?groupby=tenant".to_owned(),
            400,
            "groupby",
        ),
        (
            Some(VIEWER),
            "/api/v1/showback?from=yesterday".to_owned(),
            400,
            "from",
        ),
        (
            Some(VIEWER),
            format!("/api/v1/showback?from={}&to={t0}", t0 + 60),
            400,
            "from",
        ),
        (
            Some(VIEWER),
            "/api/v1/showback?from=0&to=1".to_owned(),
            400,
            "from",
        ),
        (
            Some(VIEWER),
            "/api/v1/hoarding?state=idle".to_owned(),
            400,
            "state",
        ),
        (
            Some(VIEWER),
            "/api/v1/hoarding?to=soon".to_owned(),
            400,
            "to",
        ),
        (
            Some(VIEWER),
            format!("/api/v1/fragmentation?at={t0}&from={t0}"),
            400,
            "at",
        ),
        (
            Some(VIEWER),
            "/api/v1/fragmentation?at=noon".to_owned(),
            400,
            "at",
        ),
    ] {
        let (got, v) = get(&a, token, &path).await;
        assert_eq!(got, status, "{path}: {v}");
        assert_eq!(v["error"]["field"], field, "{path}: {v}");
    }
    // A range 401 days long is past the rollup retention.
    let (got, v) = get(
        &a,
        Some(VIEWER),
        &format!("/api/v1/showback?from={}&to={t0}", t0 - 401 * 86400),
    )
    .await;
    assert_eq!(
        (got, v["error"]["field"].as_str()),
        (400, Some("from")),
        "{v}"
    );
    // Admin actions need an admin token.
    assert_eq!(a.evaluate(VIEWER).await.0, 403);
    // Raw data covers the edges here: a range cut at odd seconds is answered exactly.
    let (got, v) = get(
        &a,
        Some(VIEWER),
        &format!("/api/v1/showback?from={}&to={}", t0 + 7, t0 + 3607),
    )
    .await;
    assert_eq!(got, 200, "{v}");
    assert_eq!(v["totals"]["capacity_gpu_seconds"], 7200.0);
}
