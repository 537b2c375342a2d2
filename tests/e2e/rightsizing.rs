//! Rightsizing (`GET /api/v1/rightsizing`, its CSV, the Rightsizing page's source) on a trace
//! built for its definitions (`schema/ANALYTICS.md`, "Rightsizing"). Three days ago, from 08:00
//! to 10:00 UTC, on H100s priced 7.00 a GPU-hour until 09:00 and 14.00 after (so a slice-hour
//! costs 1.00, then 2.00):
//! - `a/notebook` holds a `7g.80gb` at 2 % SM and 3 GiB: a `1g.10gb` fits; it saves 6 × 1 h at
//!   the first price + 12 × 1 h at the second = 18.00.
//! - `a/infer-lc` (latency_critical, percentile 0.999 by class) and `b/infer-batch` (batch, the
//!   default 0.95) each hold a whole GPU at 25 % for 119 minutes and 60 % for one, 20 GiB: the
//!   0.999 percentile is the busy minute (4.2 slices × 1.2: a 7g, no smaller than the whole GPU),
//!   the 0.95 one is 1.75 slices × 1.2 = 2.1: a `3g.40gb`, saving 4 + 8 = 12.00.
//! - `b/hot` holds a `1g.10gb` at 97 %: saturated. `b/short` holds one for 30 minutes:
//!   insufficient data. `c/multi` holds two `3g.40gb` at 10 % and 5 GiB: a `1g.10gb` each,
//!   2 instances, 4 held hours, saving 2 × (2 + 4) = 12.00. `c/a100` holds an A100 slice, which
//!   has no per-instance SM activity: insufficient data (and saturated by its memory alone). `c/t4` holds a Tesla T4, a model the MIG
//!   tables do not have: unknown model.

use crate::common::{ADMIN_TOKEN, Aggregator, eventually};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};
use serde_json::Value;

const DAY: i64 = 86_400;
const GIB: u64 = 1 << 30;
const TENANT_A: &str = "tenant-a-token-0123456789";

fn instance(gpu: &str, model: &str, profile: Option<(&str, u32, u32, u32)>) -> Instance {
    Instance {
        node: "n1".into(),
        gpu_uuid: gpu.into(),
        gpu_model: model.into(),
        mig_profile: profile.map(|p| p.0.into()),
        gpu_instance_id: profile.map(|p| p.1),
        placement_start: profile.map(|p| p.2),
        placement_size: profile.map(|p| p.3),
    }
}

const H100: &str = "NVIDIA H100 80GB HBM3";

fn held(tenant: &str, workload: &str, class: SloClass) -> Attribution {
    Attribution {
        tenant: Some(tenant.into()),
        workload: Some(format!("{tenant}/{workload}")),
        slo_class: Some(class),
        owner: None,
        owner_ref: None,
    }
}

fn sample(t: i64, i: &Instance, a: &Attribution, sm: Option<f64>, fb: u64) -> Sample {
    Sample {
        timestamp: t,
        instance: i.clone(),
        attribution: a.clone(),
        counters: Counters {
            sm_active: sm,
            fb_used_bytes: Some(fb),
            ..Counters::default()
        },
    }
}

/// The trace: `[t0 + 8 h, t0 + 10 h)`.
fn trace(t0: i64) -> Vec<Sample> {
    let start = t0 + 8 * 3600;
    let nb = instance("GPU-N", H100, Some(("7g.80gb", 0, 0, 8)));
    let w1 = instance("GPU-W1", H100, None);
    let w2 = instance("GPU-W2", H100, None);
    let hot = instance("GPU-S", H100, Some(("1g.10gb", 7, 0, 1)));
    let short = instance("GPU-S", H100, Some(("1g.10gb", 8, 1, 1)));
    let m1 = instance("GPU-M", H100, Some(("3g.40gb", 1, 0, 4)));
    let m2 = instance("GPU-M", H100, Some(("3g.40gb", 2, 4, 4)));
    let a100 = instance(
        "GPU-A100",
        "NVIDIA A100-SXM4-80GB",
        Some(("1g.10gb", 7, 0, 1)),
    );
    let t4 = instance("GPU-T4", "Tesla T4", None);
    let mut out = Vec::new();
    for t in start..start + 7200 {
        let minute = (t - start) / 60;
        let spiky = if minute == 30 { 0.6 } else { 0.25 };
        out.push(sample(
            t,
            &nb,
            &held("a", "notebook", SloClass::Interactive),
            Some(0.02),
            3 * GIB,
        ));
        out.push(sample(
            t,
            &w1,
            &held("a", "infer-lc", SloClass::LatencyCritical),
            Some(spiky),
            20 * GIB,
        ));
        out.push(sample(
            t,
            &w2,
            &held("b", "infer-batch", SloClass::Batch),
            Some(spiky),
            20 * GIB,
        ));
        out.push(sample(
            t,
            &hot,
            &held("b", "hot", SloClass::Batch),
            Some(0.97),
            2 * GIB,
        ));
        if t < start + 1800 {
            out.push(sample(
                t,
                &short,
                &held("b", "short", SloClass::Batch),
                Some(0.01),
                GIB,
            ));
        }
        for m in [&m1, &m2] {
            out.push(sample(
                t,
                m,
                &held("c", "multi", SloClass::Batch),
                Some(0.1),
                5 * GIB,
            ));
        }
        out.push(sample(
            t,
            &a100,
            &held("c", "a100", SloClass::Batch),
            None,
            GIB * 97 / 10,
        ));
        out.push(sample(
            t,
            &t4,
            &held("c", "t4", SloClass::Batch),
            Some(0.1),
            GIB,
        ));
    }
    out
}

async fn get(a: &Aggregator, token: &str, path: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", a.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn row<'a>(v: &'a Value, workload: &str) -> &'a Value {
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["workload"] == workload)
        .unwrap_or_else(|| panic!("no row for {workload}: {v}"))
}

/// An aggregator fed the trace, evaluated; the day it starts.
async fn fed(dir: &std::path::Path) -> (Aggregator, i64) {
    let day = (chrono::Utc::now().timestamp().div_euclid(DAY) - 3) * DAY;
    let change = chrono::DateTime::from_timestamp(day + 9 * 3600, 0)
        .unwrap()
        .to_rfc3339();
    let config = dir.join("aggregator.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[price_book]]
gpu_model = "H100-80GB"
per_gpu_hour = 7.0
[[price_book]]
gpu_model = "H100-80GB"
per_gpu_hour = 14.0
from = "{change}"
[rightsizing.classes.latency_critical]
percentile = 0.999
"#
        ),
    )
    .unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("tenant:a {TENANT_A}\n")).unwrap();
    let a = Aggregator::start(
        &dir.join("ledger.duckdb"),
        0,
        &[
            "--config",
            config.to_str().unwrap(),
            "--token-file",
            tokens.to_str().unwrap(),
        ],
    )
    .await;
    for chunk in trace(day).chunks(20_000) {
        let (status, body) = a
            .ingest(ADMIN_TOKEN, &Batch::from_samples("n1", chunk))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);
    (a, day)
}

#[tokio::test(flavor = "multi_thread")]
async fn rightsizing_answers_its_definitions_on_a_trace_built_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let (a, day) = fed(dir.path()).await;
    let path = format!("/api/v1/rightsizing?from={day}&to={}", day + DAY);
    let (status, body) = get(&a, ADMIN_TOKEN, &path).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let gib = GIB as f64;

    let nb = row(&v, "a/notebook");
    assert_eq!(nb["mig_profile"], "7g.80gb");
    assert_eq!(nb["instances"], 1);
    assert_eq!(nb["held_hours"], 2.0);
    assert_eq!(nb["measured_minutes"], 120);
    assert!(
        (nb["compute_p"].as_f64().unwrap() - 0.14).abs() < 1e-9,
        "{nb}"
    );
    assert!((nb["compute_max"].as_f64().unwrap() - 0.14).abs() < 1e-9);
    assert_eq!(nb["memory_peak_bytes"].as_u64(), Some(3 * GIB));
    assert_eq!(nb["needed_bytes"].as_f64(), Some((3.0 * gib * 1.2).ceil()));
    assert_eq!(nb["recommended_profile"], "1g.10gb");
    assert_eq!(nb["reason"], "smaller_profile_fits");
    assert_eq!(nb["recommendation"], true);
    assert_eq!(nb["savings"], 18.0);
    // 18.00 over one day: 540.00 per 30 days.
    assert_eq!(nb["savings_per_month"], 540.0);

    let lc = row(&v, "a/infer-lc");
    assert_eq!(lc["mig_profile"], "whole");
    assert_eq!(lc["percentile"], 0.999);
    assert!(
        (lc["compute_p"].as_f64().unwrap() - 4.2).abs() < 1e-9,
        "{lc}"
    );
    assert_eq!(lc["recommended_profile"], "7g.80gb");
    assert_eq!(lc["reason"], "fits_current");
    assert_eq!(lc["savings"], 0.0);

    let batch = row(&v, "b/infer-batch");
    assert_eq!(batch["percentile"], 0.95);
    assert!((batch["compute_p"].as_f64().unwrap() - 1.75).abs() < 1e-9);
    assert!((batch["needed_slices"].as_f64().unwrap() - 2.1).abs() < 1e-9);
    assert_eq!(batch["recommended_profile"], "3g.40gb");
    assert_eq!(batch["reason"], "smaller_profile_fits");
    assert_eq!(batch["savings"], 12.0);

    let hot = row(&v, "b/hot");
    assert_eq!(hot["saturated"], true);
    assert_eq!(hot["reason"], "saturated");
    assert_eq!(hot["savings"], 0.0);

    let short = row(&v, "b/short");
    assert_eq!(short["measured_minutes"], 30);
    assert_eq!(short["reason"], "insufficient_data");

    let multi = row(&v, "c/multi");
    assert_eq!(multi["instances"], 2);
    assert_eq!(multi["held_hours"], 4.0);
    assert_eq!(multi["recommended_profile"], "1g.10gb");
    assert_eq!(multi["savings"], 12.0);

    let a100 = row(&v, "c/a100");
    assert_eq!(a100["measured_minutes"], 0);
    assert_eq!(a100["reason"], "insufficient_data");
    assert!(a100["compute_p"].is_null());
    // No SM readings, but 9.7 of its 10 GiB used: saturated by memory alone.
    assert_eq!(a100["saturated"], true);
    assert_eq!(row(&v, "c/t4")["reason"], "unknown_model");

    assert_eq!(v["totals"]["rows"], 8);
    assert_eq!(v["totals"]["recommendations"], 3);
    assert_eq!(v["totals"]["saturated"], 2);
    assert_eq!(v["totals"]["savings"], 42.0);
    // The greatest savings first.
    assert_eq!(v["rows"][0]["workload"], "a/notebook");

    // The same range asked again (its day cached now) answers the same.
    let (_, again) = get(&a, ADMIN_TOKEN, &path).await;
    assert_eq!(serde_json::from_str::<Value>(&again).unwrap(), v);

    // A range cut inside the hours (minutes, hours): the notebook from 08:30 holds 1.5 h, half an
    // hour at the first price and an hour at the second: 3 + 12 = 15.00.
    let cut = format!(
        "/api/v1/rightsizing?from={}&to={}",
        day + 8 * 3600 + 1800,
        day + 10 * 3600
    );
    let (_, body) = get(&a, ADMIN_TOKEN, &cut).await;
    let c: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(row(&c, "a/notebook")["held_hours"], 1.5);
    assert_eq!(row(&c, "a/notebook")["savings"], 15.0);

    // The CSV is the same value.
    let (status, csv) = get(
        &a,
        ADMIN_TOKEN,
        &path.replace("/rightsizing?", "/rightsizing.csv?"),
    )
    .await;
    assert_eq!(status, 200);
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let nb_line: Vec<&str> = lines
        .find(|l| l.contains("a/notebook"))
        .unwrap()
        .split(',')
        .collect();
    assert_eq!(nb_line[col("recommended_profile")], "1g.10gb");
    assert_eq!(nb_line[col("savings")], "18.00");
    assert_eq!(csv.lines().count(), 9, "a header and eight rows: {csv}");

    // Filters, and a tenant token's own rows only.
    let (_, body) = get(&a, ADMIN_TOKEN, &format!("{path}&gpu_model=A100-80GB")).await;
    let f: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(f["totals"]["rows"], 1, "{f}");
    let (status, body) = get(&a, TENANT_A, &path).await;
    assert_eq!(status, 200, "{body}");
    let own: Value = serde_json::from_str(&body).unwrap();
    let tenants: Vec<&str> = own["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, ["a", "a"], "{body}");
    let (status, body) = get(&a, TENANT_A, &format!("{path}&tenant=b")).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("\"tenant\""), "{body}");

    // Paged: the totals count every row, the page lists `limit` from `offset`.
    let (_, body) = get(&a, ADMIN_TOKEN, &format!("{path}&limit=2")).await;
    let p1: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(p1["rows"].as_array().unwrap().len(), 2);
    assert_eq!(p1["next_offset"], 2);
    assert_eq!(p1["totals"], v["totals"]);
    let (_, body) = get(&a, ADMIN_TOKEN, &format!("{path}&limit=2&offset=2")).await;
    let p2: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(p2["rows"][0], v["rows"][2]);
    let (_, body) = get(&a, ADMIN_TOKEN, &format!("{path}&offset=6")).await;
    let last: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(last["rows"].as_array().unwrap().len(), 2);
    assert!(last["next_offset"].is_null());
    let (_, body) = get(
        &a,
        ADMIN_TOKEN,
        &format!("{path}&reason=smaller_profile_fits"),
    )
    .await;
    let recs: Value = serde_json::from_str(&body).unwrap();
    let workloads: Vec<&str> = recs["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(workloads, ["a/notebook", "b/infer-batch", "c/multi"]);
    let (status, body) = get(&a, ADMIN_TOKEN, &format!("{path}&limit=0")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"limit\""), "{body}");

    // The gauge carries each tenant's savings of this month so far: the API's, for the month.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let (_, body) = get(
        &a,
        ADMIN_TOKEN,
        &format!("/api/v1/rightsizing?month={month}&reason=smaller_profile_fits&limit=5000"),
    )
    .await;
    let m: Value = serde_json::from_str(&body).unwrap();
    let of_a: f64 = m["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["tenant"] == "a")
        .map(|r| r["savings"].as_f64().unwrap())
        .sum();
    // Computed beside the evaluations: an evaluation publishes the one before's result.
    let gauge = || async {
        assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);
        let metrics = a.metrics_as(ADMIN_TOKEN).await;
        metrics
            .lines()
            .find(|l| l.starts_with("gpuledger_tenant_rightsizing_savings{tenant=\"a\"}"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
    };
    if of_a > 0.0 {
        let got = eventually(
            "the month's savings on /metrics",
            std::time::Duration::from_secs(30),
            async || gauge().await.filter(|v| *v == of_a),
        )
        .await;
        assert_eq!(got, of_a);
    } else {
        let gauge = gauge().await;
        // The trace's day is in last month (the first days of a month): no series.
        assert_eq!(gauge, None);
    }

    // Bad input names the parameter.
    let (status, body) = get(&a, ADMIN_TOKEN, &format!("{path}&percentile=0.5")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("percentile"), "{body}");
    let (status, body) = get(
        &a,
        ADMIN_TOKEN,
        &format!("/api/v1/rightsizing?from={}&to={}", day + 1, day + DAY),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"from\""), "{body}");

    // Late data for the cached day changes the answer: a busy minute at 07:00 (no holder change).
    let nb_i = instance("GPU-N", H100, Some(("7g.80gb", 0, 0, 8)));
    let late: Vec<Sample> = (day + 7 * 3600..day + 7 * 3600 + 60)
        .map(|t| {
            sample(
                t,
                &nb_i,
                &held("a", "notebook", SloClass::Interactive),
                Some(0.99),
                3 * GIB,
            )
        })
        .collect();
    let (status, body) = a
        .ingest(ADMIN_TOKEN, &Batch::from_samples("n1", &late))
        .await;
    assert_eq!(status, 200, "{body}");
    let max = eventually(
        "the late minute in the answer",
        std::time::Duration::from_secs(30),
        async || {
            let (_, body) = get(&a, ADMIN_TOKEN, &path).await;
            let v: Value = serde_json::from_str(&body).unwrap();
            let r = row(&v, "a/notebook").clone();
            (r["measured_minutes"] == 121).then_some(r)
        },
    )
    .await;
    assert!((max["compute_max"].as_f64().unwrap() - 0.99 * 7.0).abs() < 1e-9);
    assert!((max["compute_p"].as_f64().unwrap() - 0.14).abs() < 1e-9);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rightsizing_setting_out_of_range_is_refused_naming_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aggregator.toml");
    std::fs::write(&config, "[rightsizing]\ncompute_headroom = -0.5\n").unwrap();
    let out = crate::common::gpuledger()
        .args([
            "aggregator",
            "--config",
            config.to_str().unwrap(),
            "--db",
            dir.path().join("l.duckdb").to_str().unwrap(),
        ])
        .env("GPULEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rightsizing.compute_headroom"), "{err}");
    std::fs::write(&config, "[rightsizing]\nheadroom = 0.5\n").unwrap();
    let out = crate::common::gpuledger()
        .args(["aggregator", "--config", config.to_str().unwrap()])
        .env("GPULEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("headroom"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rightsizing_page_in_chromium_shows_the_json_and_csv_recommendation() {
    let dir = tempfile::tempdir().unwrap();
    let (a, day) = fed(dir.path()).await;
    let q = format!("from={day}&to={}", day + DAY);
    let (_, body) = get(&a, ADMIN_TOKEN, &format!("/api/v1/rightsizing?{q}")).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let (_, csv) = get(
        &a,
        ADMIN_TOKEN,
        &format!("/rightsizing?{q}&format=csv&table=rightsizing"),
    )
    .await;
    let mut r = csv::Reader::from_reader(csv.as_bytes());
    let headers = r.headers().unwrap().clone();
    let at = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let first = r.records().next().unwrap().unwrap();

    let app = format!("http://localhost:{}", a.port);
    let browser = crate::common::browser::Browser::start().await;
    browser
        .sign_in(&app, ADMIN_TOKEN, &format!("/rightsizing?{q}"))
        .await;
    let workloads = browser.column("rightsizing", "workload").await;
    let profiles = browser.column("rightsizing", "recommended_profile").await;
    let savings = browser.column("rightsizing", "savings").await;
    browser.screenshot("rightsizing").await;
    // The greatest saving first, the same on the page, in the JSON and in the CSV.
    assert_eq!(workloads[0], "a/notebook");
    assert_eq!(v["rows"][0]["workload"], "a/notebook");
    assert_eq!(&first[at("workload")], "a/notebook");
    assert_eq!(profiles[0], "1g.10gb");
    assert_eq!(v["rows"][0]["recommended_profile"], "1g.10gb");
    assert_eq!(&first[at("recommended_profile")], "1g.10gb");
    assert_eq!(savings[0], "18.00");
    assert_eq!(
        format!("{:.2}", v["rows"][0]["savings"].as_f64().unwrap()),
        "18.00"
    );
    assert_eq!(&first[at("savings")], "18.00");
    assert_eq!(workloads.len(), 8);
    let kpi = browser
        .js("return document.querySelector('.kpi .value').dataset.value")
        .await;
    assert_eq!(kpi, "42.00", "the potential savings");

    // A tenant's page has its own rows only, the notebook first.
    browser.go(&format!("{app}/tenants/a?{q}")).await;
    let own = browser.column("rightsizing", "tenant").await;
    assert_eq!(own, ["a", "a"]);
    assert_eq!(
        browser.column("rightsizing", "workload").await[0],
        "a/notebook"
    );
}
