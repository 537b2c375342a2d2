//! Budgets with a forecast (`GET /api/v1/budgets`, the Tenants page's "Budgets", the budget
//! gauges on `/metrics`), on a trace with known answers: last month, tenant `a` holds one whole
//! H100 for two hours on each of its first ten days, at 3.60 a GPU-hour.

use crate::common::traces::{held, sample, whole};
use crate::common::{ADMIN_TOKEN, Aggregator};
use gpuledger_schema::SloClass;
use gpuledger_schema::wire::Batch;
use serde_json::Value;

const DAY: i64 = 86_400;
const TENANT_A: &str = "tenant-a-token-0123456789";
const TENANT_B: &str = "tenant-b-token-0123456789";

/// Last month's `[start, next start)` and its `YYYY-MM`.
fn last_month() -> ((i64, i64), String) {
    use chrono::Datelike;
    let now = chrono::Utc::now();
    let this = chrono::NaiveDate::from_ymd_opt(now.year(), now.month(), 1).unwrap();
    let last = this.pred_opt().unwrap().with_day(1).unwrap();
    let ts = |d: chrono::NaiveDate| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp();
    ((ts(last), ts(this)), last.format("%Y-%m").to_string())
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

#[tokio::test(flavor = "multi_thread")]
async fn the_forecast_runs_the_last_whole_days_rate_to_the_month_end() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aggregator.toml");
    std::fs::write(
        &config,
        r#"
default_price = 3.6
[billing]
cost_mode = "allocation"
idle = "overhead"
[billing.tenants.a]
monthly_budget = 100
[billing.tenants.b]
monthly_budget = 50
"#,
    )
    .unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("tenant:a {TENANT_A}\ntenant:b {TENANT_B}\n"),
    )
    .unwrap();
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &[
            "--config",
            config.to_str().unwrap(),
            "--token-file",
            tokens.to_str().unwrap(),
        ],
    )
    .await;
    let ((from, to), month) = last_month();
    let gpu = whole("n1", "GPU-A");
    for day in 0..10 {
        let start = from + day * DAY + 8 * 3600;
        let samples: Vec<_> = (start..start + 7200)
            .map(|t| sample(t, &gpu, held("a", "a/train", SloClass::Batch), Some(0.5)))
            .collect();
        for chunk in samples.chunks(20_000) {
            let (status, body) = a
                .ingest(ADMIN_TOKEN, &Batch::from_samples("n1", chunk))
                .await;
            assert_eq!(status, 200, "{body}");
        }
    }
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);

    // The 11th at noon: ten whole days spent (72.00), the last seven at 7.20 a day.
    let at = from + 10 * DAY + DAY / 2;
    let path = format!("/api/v1/budgets?month={month}&at={at}");
    let (status, body) = get(&a, ADMIN_TOKEN, &path).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["from"].as_i64(), v["to"].as_i64(), v["at"].as_i64()),
        (Some(from), Some(to), Some(at))
    );
    let lines = v["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 2, "every budgeted tenant: {body}");
    let line = &lines[0];
    assert_eq!(line["tenant"], "a");
    assert_eq!(line["budget"], 100.0);
    assert_eq!(line["spent"], 72.0);
    assert_eq!(line["run_rate_per_day"], 7.2);
    assert_eq!(line["run_rate_days"], 7);
    let days_left = (to - at) as f64 / DAY as f64;
    let forecast = ((72.0 + 7.2 * days_left) * 100.0_f64).round() / 100.0;
    assert_eq!(line["forecast"].as_f64().unwrap(), forecast);
    assert!((line["spent_ratio"].as_f64().unwrap() - 0.72).abs() < 1e-9);
    // 28.00 left at 7.20 a day: 3.9 days after the 11th at noon, the 15th.
    let on = format!("{month}-15");
    assert_eq!(line["forecast_exceeds_on"].as_str(), Some(on.as_str()));
    let b = &lines[1];
    assert_eq!(
        (b["tenant"].as_str(), b["spent"].as_f64()),
        (Some("b"), Some(0.0))
    );
    assert!(b["forecast_exceeds_on"].is_null());

    // A tenant token sees its own line only; a bad month is a 400 naming it.
    let (_, mine) = get(&a, TENANT_B, &path).await;
    let mine: Value = serde_json::from_str(&mine).unwrap();
    let names: Vec<&str> = mine["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["b"]);
    let (status, err) = get(&a, ADMIN_TOKEN, "/api/v1/budgets?month=2026-13").await;
    assert_eq!(status, 400, "{err}");
    assert!(err.contains("\"month\""), "{err}");

    // Before any whole day: the rate is the spend so far over the time elapsed.
    let early = from + 10 * 3600;
    let (_, body) = get(
        &a,
        ADMIN_TOKEN,
        &format!("/api/v1/budgets?month={month}&at={early}"),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let l = &v["lines"][0];
    assert_eq!(l["run_rate_days"], 0);
    assert_eq!(l["spent"], 7.2);
    assert_eq!(
        l["run_rate_per_day"].as_f64().unwrap(),
        17.28,
        "7.20 in 10 h"
    );

    // /metrics carries this month's ratios (nothing spent yet this month), a tenant its own.
    let all = a.metrics_as(ADMIN_TOKEN).await;
    for tenant in ["a", "b"] {
        for family in ["spent", "forecast"] {
            let series = format!("gpuledger_tenant_budget_{family}_ratio{{tenant=\"{tenant}\"}} ");
            let value = all
                .lines()
                .find_map(|l| l.strip_prefix(&series))
                .unwrap_or_else(|| panic!("{series}:\n{all}"));
            assert_eq!(value.parse::<f64>().unwrap(), 0.0, "{series}");
        }
    }
    let own = a.metrics_as(TENANT_B).await;
    assert!(own.contains("gpuledger_tenant_budget_spent_ratio{tenant=\"b\"}"));
    assert!(!own.contains("tenant=\"a\""), "{own}");

    // The Tenants page of that month shows the budgets (the forecast there is as of now: the
    // month is over, so it is what was spent).
    let (status, html) = get(&a, ADMIN_TOKEN, &format!("/tenants?month={month}")).await;
    assert_eq!(status, 200);
    assert!(html.contains("<table id=\"budgets\">"), "{html}");
    assert!(html.contains("data-value=\"72.00\""), "the month's spend");
}

/// `budget.forecast_exceeded` and `budget.exceeded`: once per tenant and month, signed, through
/// the outbox, to the endpoints that name them only; the events match the published schema.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_over_budget_is_announced_once_per_month_to_the_endpoints_that_ask() {
    use crate::common::receiver::{Receiver, assert_schema_valid, secret};
    let finance = Receiver::start(200).await;
    let bridge = Receiver::start(200).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aggregator.toml");
    std::fs::write(
        &config,
        format!(
            r#"
default_price = 3.6
analytics_interval = "1h"
[billing.tenants.a]
monthly_budget = 0.01
[billing.tenants.b]
monthly_budget = 1000000
[[webhooks]]
name = "finance"
url = "{}"
secret = "{}"
events = ["budget.forecast_exceeded", "budget.exceeded"]
[[webhooks]]
name = "bridge"
url = "{}"
secret = "{}"
"#,
            finance.url,
            secret(),
            bridge.url,
            secret()
        ),
    )
    .unwrap();
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &["--config", config.to_str().unwrap()],
    )
    .await;
    // Ten minutes of this month (at least the seconds since it began) on one whole GPU each.
    let now = chrono::Utc::now().timestamp();
    let (month_start, _) = {
        use chrono::Datelike;
        let d = chrono::Utc::now().date_naive().with_day(1).unwrap();
        (d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp(), ())
    };
    let start = (now - 600).max(month_start);
    let mut samples = Vec::new();
    for t in start..now - 1 {
        samples.push(sample(
            t,
            &whole("n1", "GPU-A"),
            held("a", "a/train", SloClass::Batch),
            Some(0.5),
        ));
        samples.push(sample(
            t,
            &whole("n1", "GPU-B"),
            held("b", "b/train", SloClass::Batch),
            Some(0.5),
        ));
    }
    let (status, body) = a
        .ingest(ADMIN_TOKEN, &Batch::from_samples("n1", &samples))
        .await;
    assert_eq!(status, 200, "{body}");
    for _ in 0..3 {
        assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);
    }
    crate::common::eventually(
        "both budget events at the finance endpoint",
        std::time::Duration::from_secs(30),
        async || {
            let r = finance.received();
            (r.len() >= 2).then_some(r)
        },
    )
    .await;
    // A moment for any duplicate to arrive, then exactly one of each.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let got = finance
        .received()
        .into_iter()
        .filter(|r| r.id.starts_with("msg_"))
        .collect::<Vec<_>>();
    assert!(got.len() >= 2);
    let mut kinds: Vec<&str> = got.iter().map(|r| r.kind()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["budget.exceeded", "budget.forecast_exceeded"],
        "once each"
    );
    for r in &got {
        let d = &r.body["data"];
        assert_eq!(d["tenant"], "a", "tenant b is within its budget");
        assert_eq!(d["budget"], 0.01);
        assert!(d["spent"].as_f64().unwrap() >= 0.01, "{d}");
        assert!(d["notice_id"].as_str().unwrap().starts_with("bud_"));
    }
    assert_schema_valid(&got);
    assert!(
        bridge
            .received()
            .iter()
            .all(|r| !r.kind().starts_with("budget.")),
        "an endpoint that does not name budget events gets none"
    );
}
