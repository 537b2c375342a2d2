//! Reclaim end to end: a real aggregator (the binary, a DuckDB file) fed a live trace over HTTP,
//! its policy, its outbox and a webhook receiver on loopback that checks every signature with the
//! `standardwebhooks` crate.

use crate::common;

use crate::common::receiver::{Receiver, secret};
use crate::common::traces::{held, sample, whole};
use crate::common::{ADMIN_TOKEN, Aggregator, eventually};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Sample, SloClass};
use serde_json::Value;
use std::time::Duration;

pub(crate) const NODE: &str = "node-token-0123456789abc";
pub(crate) const TEAM: &str = "tenant-ml-token-0123456789";

/// `n` seconds of `workload` on `uuid` ending at `end` (exclusive), SM activity from `sm(t)`.
fn run(
    node: &str,
    uuid: &str,
    workload: &str,
    class: SloClass,
    from: i64,
    to: i64,
    sm: impl Fn(i64) -> f64,
) -> Vec<Sample> {
    let i = whole(node, uuid);
    (from..to)
        .map(|t| sample(t, &i, held("ml", workload, class), Some(sm(t))))
        .collect()
}

/// The trace of the issue's "done when", ending at `now` (exclusive): an idle latency-critical
/// replica, a notebook idle past `after`, one idle less than `after`, a batch job idle past
/// `after`, a busy job, and a node that stopped reporting 10 minutes ago.
fn trace(now: i64) -> Vec<(String, Vec<Sample>)> {
    let start = now - 45 * 60;
    let mut n1 = Vec::new();
    n1.extend(run(
        "n1",
        "GPU-LC",
        "serve/llm-0",
        SloClass::LatencyCritical,
        start,
        now,
        |_| 0.0,
    ));
    n1.extend(run(
        "n1",
        "GPU-NB1",
        "lab/nb-idle",
        SloClass::Interactive,
        start,
        now,
        |_| 0.0,
    ));
    n1.extend(run(
        "n1",
        "GPU-NB2",
        "lab/nb-recent",
        SloClass::Interactive,
        start,
        now,
        |t| {
            if t < now - 15 * 60 { 0.7 } else { 0.0 }
        },
    ));
    n1.extend(run(
        "n1",
        "GPU-B",
        "4242",
        SloClass::Batch,
        start,
        now,
        |_| 0.01,
    ));
    n1.extend(run(
        "n1",
        "GPU-BUSY",
        "4343",
        SloClass::Batch,
        start,
        now,
        |_| 0.8,
    ));
    // The batch job's exporter names its owner, as the Slurm attribution does: the job's user
    // and account (schema/WIRE.md, `owner` and `owner_ref`).
    for s in n1
        .iter_mut()
        .filter(|s| s.attribution.workload.as_deref() == Some("4242"))
    {
        s.attribution.owner = Some("alice".into());
        s.attribution.owner_ref = Some("Account/physics".into());
    }
    let n2 = run(
        "n2",
        "GPU-DEAD",
        "4444",
        SloClass::Batch,
        start,
        now - 10 * 60,
        |_| 0.0,
    );
    vec![("n1".into(), n1), ("n2".into(), n2)]
}

/// The aggregator config of these tests: `reclaim` adds lines to its `[reclaim]` table, `extra`
/// more tables.
fn config(dir: &std::path::Path, url: &str, reclaim: &str, extra: &str) -> std::path::PathBuf {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("node:* {NODE}\ntenant:ml {TEAM}\n")).unwrap();
    let path = dir.join("aggregator.toml");
    std::fs::write(
        &path,
        format!(
            r#"
token_file = "{}"
hoarding_window = "10m"
analytics_interval = "1h"
default_price = 3.6
[reclaim]
max_staleness = "2m"
{reclaim}
[reclaim.classes.interactive]
action = "reclaim"
after = "30m"
notice = "0s"
[reclaim.classes.batch]
action = "reclaim"
after = "20m"
notice = "0s"
[[webhooks]]
name = "bridge"
url = "{url}"
secret = "{}"
timeout = "2s"
{extra}
"#,
            tokens.display(),
            secret()
        ),
    )
    .unwrap();
    path
}

/// A running aggregator (see [`config`]) fed the trace ending at `now`, and its receiver.
pub(crate) struct Fed {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) rx: Receiver,
    pub(crate) a: Aggregator,
    pub(crate) now: i64,
}

/// An aggregator whose `[reclaim]` gets the `reclaim` lines (and `extra` tables), sending to a
/// receiver that answers `status`, fed the trace ending now.
pub(crate) async fn fed(status: u16, reclaim: &str, extra: &str) -> Fed {
    fed_logged(status, reclaim, extra, false).await
}

/// [`fed`]; with `log`, the aggregator logs at `debug` to `aggregator.log` in the directory.
pub(crate) async fn fed_logged(status: u16, reclaim: &str, extra: &str, log: bool) -> Fed {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(status).await;
    let cfg = config(dir.path(), &rx.url, reclaim, extra);
    let log = log.then(|| dir.path().join("aggregator.log"));
    let a = Aggregator::start_logged(
        &dir.path().join("ledger.duckdb"),
        0,
        &["--config", cfg.to_str().unwrap()],
        log.as_deref(),
    )
    .await;
    let now = chrono::Utc::now().timestamp();
    feed(&a, now).await;
    Fed { dir, rx, a, now }
}

/// Waits until `rx` has accepted `n` distinct events.
pub(crate) async fn wait_events(rx: &Receiver, n: usize, what: &str) {
    eventually(what, Duration::from_secs(30), async || {
        (rx.events().len() >= n).then_some(())
    })
    .await;
}

/// The evaluation `report` decided `n` events of type `kind`.
pub(crate) fn assert_event_count(report: &Value, kind: &str, n: u64) {
    assert_eq!(report["reclaim"]["events"][kind], n, "{report}");
}

/// Evaluates once and waits for the four notices.
pub(crate) async fn notices(a: &Aggregator, rx: &Receiver) {
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "hoarding.detected", 4);
    wait_events(&rx, 4, "the notices").await;
}

async fn feed(a: &Aggregator, now: i64) {
    for (node, samples) in trace(now) {
        for chunk in samples.chunks(20_000) {
            let (status, body) = a.ingest(NODE, &Batch::from_samples(&node, chunk)).await;
            assert_eq!(status, 200, "{body}");
        }
    }
}

pub(crate) async fn get(a: &Aggregator, token: &str, path: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", a.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn post(a: &Aggregator, token: &str, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", a.url()))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<_> = v
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    v.sort();
    v
}

const DETECTED: [(&str, &str); 4] = [
    ("4242", "hoarding.detected"),
    ("lab/nb-idle", "hoarding.detected"),
    ("lab/nb-recent", "hoarding.detected"),
    ("serve/llm-0", "hoarding.detected"),
];

/// Each class gets exactly what its rule says: notify-only / reclaim / notice-only / reclaim /
/// nothing / nothing; every decision is listed with its reason; a tenant sees its own.
#[tokio::test(flavor = "multi_thread")]
async fn each_episode_gets_exactly_what_its_class_rule_says() {
    let Fed {
        dir: _dir,
        rx,
        a,
        now: _,
    } = fed(204, "", "").await;
    let (status, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_eq!(status, 200, "{report}");
    assert_event_count(&report, "hoarding.detected", 4);
    wait_events(&rx, 4, "the notices").await;
    assert_eq!(rx.events(), pairs(&DETECTED));
    // The notices are delivered, the notice period is 0 s: the next pass asks for the two
    // episodes idle past `after` back, and nothing else.
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 2);
    wait_events(&rx, 6, "the requests").await;
    let mut want = DETECTED.to_vec();
    want.extend([
        ("4242", "reclaim.requested"),
        ("lab/nb-idle", "reclaim.requested"),
    ]);
    assert_eq!(rx.events(), pairs(&want));
    // A third pass changes nothing: decisions are idempotent.
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_eq!(
        report["reclaim"]["events"],
        serde_json::json!({}),
        "{report}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(rx.events().len(), 6);
    assert_eq!(rx.refused(), 0);

    // The events carry the episode and the policy.
    let requested = rx
        .received()
        .into_iter()
        .find(|r| r.kind() == "reclaim.requested" && r.workload() == "lab/nb-idle")
        .unwrap();
    let d = &requested.body["data"];
    assert_eq!(d["tenant"], "ml");
    assert_eq!(d["node"], "n1");
    assert_eq!(d["gpu_uuid"], "GPU-NB1");
    assert_eq!(d["slo_class"], "interactive");
    assert_eq!(d["policy"]["action"], "reclaim");
    assert_eq!(d["policy"]["after_seconds"], 1800);
    assert_eq!(d["dry_run"], false);
    assert!(d["idle_seconds"].as_i64().unwrap() >= 45 * 60 - 1, "{d}");
    // 45 idle minutes of a whole GPU at 3.6/h.
    let cost = d["idle_cost"].as_f64().unwrap();
    assert!((cost - 2.7).abs() < 0.01, "{cost}");
    assert_eq!(d["currency"], "USD");
    common::receiver::assert_schema_valid(&rx.received());

    // Every decision is listed with its reason.
    let (status, list) = get(&a, ADMIN_TOKEN, "/api/v1/reclaims").await;
    assert_eq!(status, 200, "{list}");
    let reasons: Vec<(String, String, String)> = list["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["workload"].as_str().unwrap_or("").to_owned(),
                d["decision"].as_str().unwrap().to_owned(),
                d["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for want in [
        ("serve/llm-0", "hold", "notify_only"),
        ("lab/nb-recent", "hold", "waiting_after"),
        ("4444", "hold", "stale"),
        ("lab/nb-idle", "request", "idle_past_after"),
    ] {
        assert!(
            reasons
                .iter()
                .any(|r| (r.0.as_str(), r.1.as_str(), r.2.as_str()) == want),
            "{want:?} in {reasons:?}"
        );
    }
    assert!(
        !reasons.iter().any(|r| r.0 == "4343"),
        "the busy job has no decision"
    );
    // A tenant token sees its own decisions only; a node token none.
    let (status, own) = get(&a, TEAM, "/api/v1/reclaims").await;
    assert_eq!(status, 200);
    assert_eq!(own["decisions"].as_array().unwrap().len(), reasons.len());
    assert_eq!(get(&a, NODE, "/api/v1/reclaims").await.0, 403);
    // The outbox says what was delivered.
    let (status, out) = get(
        &a,
        ADMIN_TOKEN,
        "/api/v1/webhooks/deliveries?state=delivered",
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["deliveries"].as_array().unwrap().len(), 6);
    assert_eq!(get(&a, TEAM, "/api/v1/webhooks/deliveries").await.0, 403);
    let m = a.metrics_as(ADMIN_TOKEN).await;
    assert!(
        m.contains(r#"gpuledger_aggregator_webhook_deliveries_total{endpoint="bridge",outcome="delivered"} 6"#),
        "{m}"
    );
}

/// The "keep it 4 more hours" answer: a tenant snoozes its notebook; the policy holds it as
/// exempt; another tenant's token cannot snooze it; bad bodies get 400s naming the field.
#[tokio::test(flavor = "multi_thread")]
async fn a_snooze_keeps_a_workload_and_is_scoped_to_its_tenant() {
    let Fed {
        dir: _dir,
        rx,
        a,
        now: _,
    } = fed(204, "", "").await;
    let (status, e) = post(
        &a,
        TEAM,
        "/api/v1/exemptions",
        serde_json::json!({"workload": "lab/nb-*", "duration": "4h", "reason": "demo at 3pm"}),
    )
    .await;
    assert_eq!(status, 201, "{e}");
    assert_eq!(e["tenant"], "ml");
    assert_eq!(e["created_by"], "tenant:ml");
    for (body, field) in [
        (
            serde_json::json!({"duration": "4h", "tenant": "other"}),
            "tenant",
        ),
        (serde_json::json!({"duration": "forever"}), "duration"),
        (serde_json::json!({"duration": "30d"}), "duration"),
        (
            serde_json::json!({"duration": "1h", "colour": "red"}),
            "colour",
        ),
        (serde_json::json!({"duration": 5}), "duration"),
    ] {
        let (status, err) = post(&a, TEAM, "/api/v1/exemptions", body.clone()).await;
        assert!(status == 400 || status == 403, "{body}: {status} {err}");
        assert_eq!(err["error"]["field"], field, "{body}: {err}");
    }
    notices(&a, &rx).await;
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    // Only the batch job is reclaimed; both notebooks (lab/nb-*) are exempt.
    assert_event_count(&report, "reclaim.requested", 1);
    assert_eq!(report["reclaim"]["holds"]["exempt"], 2, "{report}");
    let (_, list) = get(&a, TEAM, "/api/v1/reclaims").await;
    let exempt = list["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["reason"] == "exempt" && d["workload"] == "lab/nb-idle")
        .unwrap();
    assert_eq!(exempt["workload"], "lab/nb-idle");
    assert!(
        exempt["detail"].as_str().unwrap().contains("demo at 3pm"),
        "{exempt}"
    );
    // Ending the snooze lets the next pass reclaim it.
    let id = e["exemption_id"].as_str().unwrap();
    let r = reqwest::Client::new()
        .delete(format!("{}/api/v1/exemptions/{id}", a.url()))
        .bearer_auth(TEAM)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 1);
}

/// Regression (issue 48, finding 4): a `tenant:` token posted 1,000 exemptions with 60,000-byte
/// reasons, all 201, and `GET /api/v1/exemptions` grew to 60 MB. Now a reason has at most 1 KiB, a
/// tenant at most `max_exemptions_per_tenant` in force, and the list comes a page at a time.
#[tokio::test(flavor = "multi_thread")]
async fn exemptions_are_bounded_per_tenant_and_listed_a_page_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(204).await;
    let cfg = config(
        dir.path(),
        &rx.url,
        "",
        "[limits]\nmax_exemptions_per_tenant = 5\n",
    );
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &["--config", cfg.to_str().unwrap()],
    )
    .await;
    let snooze = |reason: String| serde_json::json!({"duration": "1h", "reason": reason});
    let (status, err) = post(&a, TEAM, "/api/v1/exemptions", snooze("x".repeat(1025))).await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &"reason".into()),
        "{err}"
    );
    let mut made = Vec::new();
    for i in 0..5 {
        let (status, e) = post(&a, TEAM, "/api/v1/exemptions", snooze("y".repeat(1024))).await;
        assert_eq!(status, 201, "{i}: {e}");
        made.push(e["exemption_id"].as_str().unwrap().to_owned());
    }
    let (status, err) = post(&a, TEAM, "/api/v1/exemptions", snooze("one more".into())).await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (422, &"tenant".into()),
        "{err}"
    );
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-exemptions-per-tenant"),
        "{err}"
    );
    // Another tenant's bound is its own: the admin's exemptions for tenant "other" still go in.
    let (status, e) = post(
        &a,
        ADMIN_TOKEN,
        "/api/v1/exemptions",
        serde_json::json!({"duration": "1h", "tenant": "other"}),
    )
    .await;
    assert_eq!(status, 201, "{e}");
    // Pages of two, in the order they were made, each naming where the next starts.
    let mut listed = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page) = get(&a, TEAM, &format!("/api/v1/exemptions?limit=2{after}")).await;
        assert_eq!(status, 200, "{page}");
        let rows = page["exemptions"].as_array().unwrap();
        assert!(rows.len() <= 2);
        listed.extend(
            rows.iter()
                .map(|e| e["exemption_id"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(listed, made, "the tenant's own, each once, in order");
    let (status, err) = get(&a, TEAM, "/api/v1/exemptions?limit=0").await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &"limit".into()),
        "{err}"
    );
    // Ending one makes room for one more.
    let r = reqwest::Client::new()
        .delete(format!("{}/api/v1/exemptions/{}", a.url(), made[0]))
        .bearer_auth(TEAM)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (status, e) = post(&a, TEAM, "/api/v1/exemptions", snooze("again".into())).await;
    assert_eq!(status, 201, "{e}");
}

/// The receiver answers 503 for a while and the aggregator is killed with SIGKILL and restarted
/// meanwhile: every event arrives once the receiver is back, and a duplicate only ever comes
/// under the same webhook-id with the same body.
#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_outage_and_a_crash_lose_no_event() {
    let Fed {
        dir: _dir,
        rx,
        mut a,
        now: _,
    } = fed(503, "", "").await;
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "hoarding.detected", 4);
    eventually(
        "attempts against the 503",
        Duration::from_secs(20),
        async || (rx.attempts() >= 4).then_some(()),
    )
    .await;
    // While the notices are undelivered, no reclaim is requested.
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_eq!(
        report["reclaim"]["events"],
        serde_json::json!({}),
        "{report}"
    );
    let (_, out) = get(&a, ADMIN_TOKEN, "/api/v1/webhooks/deliveries?state=pending").await;
    let pending = out["deliveries"].as_array().unwrap();
    assert_eq!(pending.len(), 4, "{out}");
    assert!(pending.iter().all(|d| d["last_status"] == 503), "{out}");
    a.crash_and_restart().await;
    rx.answer(204);
    // Back-off after a few failures is some seconds; the restart starts with what is due.
    eventually(
        "every notice after the outage",
        Duration::from_secs(60),
        async || (rx.events().len() >= 4).then_some(()),
    )
    .await;
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 2);
    // A crash right after the decision, before any delivery: the restarted aggregator sends it.
    a.crash_and_restart().await;
    eventually(
        "the requests after a crash",
        Duration::from_secs(30),
        async || (rx.events().len() >= 6).then_some(()),
    )
    .await;
    let mut want = DETECTED.to_vec();
    want.extend([
        ("4242", "reclaim.requested"),
        ("lab/nb-idle", "reclaim.requested"),
    ]);
    assert_eq!(rx.events(), pairs(&want));
    let mut by_id: std::collections::HashMap<String, String> = Default::default();
    for r in rx.received() {
        let first = by_id.entry(r.id.clone()).or_insert(r.raw.clone());
        assert_eq!(
            *first, r.raw,
            "a duplicate carries the same body under the same id"
        );
    }
    // Decisions retaken after the restart did not add events.
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_eq!(
        report["reclaim"]["events"],
        serde_json::json!({}),
        "{report}"
    );
}

/// 410 Gone disables the endpoint (counted and shown); an admin enables it and the events flow.
#[tokio::test(flavor = "multi_thread")]
async fn a_gone_endpoint_is_disabled_until_an_admin_enables_it() {
    let Fed {
        dir: _dir,
        rx,
        a,
        now: _,
    } = fed(410, "", "").await;
    a.evaluate(ADMIN_TOKEN).await;
    let out = eventually(
        "the endpoint disabled",
        Duration::from_secs(20),
        async || {
            let (_, out) = get(&a, ADMIN_TOKEN, "/api/v1/webhooks/deliveries").await;
            (out["disabled_endpoints"] == serde_json::json!(["bridge"])).then_some(out)
        },
    )
    .await;
    let states: Vec<&str> = out["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["state"].as_str().unwrap())
        .collect();
    assert!(states.iter().all(|s| *s == "disabled"), "{states:?}");
    // One round tried the due events at once; after the 410 nothing is tried again.
    let attempts = rx.attempts();
    assert!((1..=4).contains(&attempts), "{attempts}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rx.attempts(), attempts, "a disabled endpoint is not tried");
    eventually("the disabled gauge", Duration::from_secs(10), async || {
        let m = a.metrics_as(ADMIN_TOKEN).await;
        m.contains(r#"gpuledger_aggregator_webhook_endpoint_disabled{endpoint="bridge"} 1"#)
            .then_some(())
    })
    .await;
    rx.answer(204);
    assert_eq!(
        post(
            &a,
            TEAM,
            "/api/v1/webhooks/endpoints/bridge/enable",
            Value::Null
        )
        .await
        .0,
        403
    );
    let (status, r) = post(
        &a,
        ADMIN_TOKEN,
        "/api/v1/webhooks/endpoints/bridge/enable",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["requeued"], 4,
        "enabling puts the disabled rows back: {r}"
    );
    eventually(
        "every notice after enabling",
        Duration::from_secs(20),
        async || (rx.events().len() >= 4).then_some(()),
    )
    .await;
    assert_eq!(rx.events(), pairs(&DETECTED));
    // A replay of delivered events sends them again under their own ids (a receiver that lost
    // its state); a receiver that remembers ids acts once.
    let (status, r) = post(
        &a,
        ADMIN_TOKEN,
        "/api/v1/webhooks/replay",
        serde_json::json!({"states": ["delivered"]}),
    )
    .await;
    assert_eq!((status, r["requeued"].as_i64()), (200, Some(4)), "{r}");
    eventually("the replay", Duration::from_secs(20), async || {
        (rx.received().len() >= 8).then_some(())
    })
    .await;
    assert_eq!(rx.events(), pairs(&DETECTED), "same ids");
    let (status, r) = post(
        &a,
        ADMIN_TOKEN,
        "/api/v1/webhooks/replay",
        serde_json::json!({"states": ["pending"]}),
    )
    .await;
    assert_eq!(
        (status, r["error"]["field"].as_str()),
        (400, Some("states[0]")),
        "{r}"
    );
}

/// Dry run: decided and delivered the same, but every event says so.
#[tokio::test(flavor = "multi_thread")]
async fn dry_run_events_say_dry_run() {
    let Fed {
        dir: _dir, rx, a, ..
    } = fed(204, "dry_run = true", "").await;
    notices(&a, &rx).await;
    assert!(
        rx.received()
            .iter()
            .all(|r| r.body["data"]["dry_run"] == true)
    );
    let (_, list) = get(&a, ADMIN_TOKEN, "/api/v1/reclaims").await;
    assert_eq!(list["dry_run"], true);
}

/// After a reclaim was requested, activity resuming cancels it (then resolves the episode), and
/// a released GPU resolves its episode.
#[tokio::test(flavor = "multi_thread")]
async fn resumed_activity_cancels_and_a_released_gpu_resolves() {
    let Fed {
        dir: _dir,
        rx,
        a,
        now,
    } = fed(204, "", "").await;
    notices(&a, &rx).await;
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 2);
    wait_events(&rx, 6, "the requests").await;
    // The next two minutes: the notebook's user is back; the batch job's GPU is released.
    let (to, next) = (now + 120, now);
    let mut more = run(
        "n1",
        "GPU-NB1",
        "lab/nb-idle",
        SloClass::Interactive,
        next,
        to,
        |_| 0.9,
    );
    let released = whole("n1", "GPU-B");
    more.extend((next..to).map(|t| sample(t, &released, Default::default(), Some(0.0))));
    let (status, body) = a.ingest(NODE, &Batch::from_samples("n1", &more)).await;
    assert_eq!(status, 200, "{body}");
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.cancelled", 1);
    assert_event_count(&report, "hoarding.resolved", 1);
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "hoarding.resolved", 1);
    wait_events(&rx, 9, "the endings").await;
    let mut want = DETECTED.to_vec();
    want.extend([
        ("4242", "reclaim.requested"),
        ("lab/nb-idle", "reclaim.requested"),
        ("lab/nb-idle", "reclaim.cancelled"),
        ("lab/nb-idle", "hoarding.resolved"),
        ("4242", "hoarding.resolved"),
    ]);
    assert_eq!(rx.events(), pairs(&want));
    let cancelled = rx
        .received()
        .into_iter()
        .find(|r| r.kind() == "reclaim.cancelled")
        .unwrap();
    assert!(
        cancelled.body["data"]["policy"]["reason"]
            .as_str()
            .unwrap()
            .contains("activity_resumed"),
        "{}",
        cancelled.raw
    );
    assert!(
        cancelled.body["data"]["ended_at"].is_string(),
        "{}",
        cancelled.raw
    );
}

/// The Alertmanager loop with the real Debian `prometheus-alertmanager`: the aggregator pushes its
/// open episodes to Alertmanager, Alertmanager routes them back to `POST /api/v1/alertmanager`,
/// and with `alertmanager_confirmation` on only those reclaims go ahead — a silence on the batch
/// job keeps it.
#[tokio::test(flavor = "multi_thread")]
async fn an_alertmanager_silence_exempts_an_episode() {
    common::require_tool("prometheus-alertmanager");
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(204).await;
    let am_port = common::free_port();
    let agg_port = common::free_port();
    let am_config = dir.path().join("alertmanager.yml");
    std::fs::write(
        &am_config,
        format!(
            r#"route:
  receiver: gpuledger
  group_by: [episode_id]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1m
receivers:
  - name: gpuledger
    webhook_configs:
      - url: http://127.0.0.1:{agg_port}/api/v1/alertmanager
        http_config:
          authorization:
            credentials: {ADMIN_TOKEN}
"#
        ),
    )
    .unwrap();
    let _am = common::Killed(
        std::process::Command::new("prometheus-alertmanager")
            .arg(format!("--config.file={}", am_config.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("am").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{am_port}"))
            .arg("--cluster.listen-address=")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("alertmanager starts"),
    );
    let am = format!("http://127.0.0.1:{am_port}");
    eventually("alertmanager", Duration::from_secs(30), async || {
        reqwest::get(format!("{am}/-/ready"))
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    // Someone silenced the batch job's alert.
    let now = chrono::Utc::now();
    let r = reqwest::Client::new()
        .post(format!("{am}/api/v2/silences"))
        .json(&serde_json::json!({
            "matchers": [{"name": "workload", "value": "4242", "isRegex": false, "isEqual": true}],
            "startsAt": now.to_rfc3339(),
            "endsAt": (now + chrono::Duration::hours(4)).to_rfc3339(),
            "createdBy": "test",
            "comment": "checkpointing, keep it"
        }))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let extra = format!("[alertmanager]\nurl = \"{am}\"\ninterval = \"1s\"\n");
    let cfg = config(
        dir.path(),
        &rx.url,
        "alertmanager_confirmation = \"10m\"",
        &extra,
    );
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        agg_port,
        &["--config", cfg.to_str().unwrap()],
    )
    .await;
    feed(&a, chrono::Utc::now().timestamp()).await;
    notices(&a, &rx).await;
    // The notebook's alert comes back through Alertmanager; the next passes reclaim it.
    eventually(
        "the notebook's reclaim",
        Duration::from_secs(60),
        async || {
            a.evaluate(ADMIN_TOKEN).await;
            rx.events()
                .contains(&("lab/nb-idle".to_owned(), "reclaim.requested".to_owned()))
                .then_some(())
        },
    )
    .await;
    // Alertmanager holds the pushed alerts, labelled with the episode.
    let alerts: Value = reqwest::get(format!("{am}/api/v2/alerts"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = alerts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["labels"]["workload"].as_str().unwrap())
        .collect();
    for w in ["lab/nb-idle", "4242", "serve/llm-0", "lab/nb-recent"] {
        assert!(names.contains(&w), "{w} in {names:?}");
    }
    assert!(
        !names.contains(&"4444"),
        "the stale node's episode is not pushed: {names:?}"
    );
    // A few more passes: the silenced batch job is never reclaimed, and says why.
    for _ in 0..3 {
        a.evaluate(ADMIN_TOKEN).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert!(
        !rx.events()
            .contains(&("4242".to_owned(), "reclaim.requested".to_owned())),
        "{:?}",
        rx.events()
    );
    let (_, list) = get(&a, ADMIN_TOKEN, "/api/v1/reclaims").await;
    assert!(
        list["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| { d["workload"] == "4242" && d["reason"] == "awaiting_alertmanager" }),
        "{list}"
    );
    // A payload that is not version 4 is refused, naming the field.
    let (status, err) = post(
        &a,
        ADMIN_TOKEN,
        "/api/v1/alertmanager",
        serde_json::json!({"version": "3", "alerts": []}),
    )
    .await;
    assert_eq!(
        (status, err["error"]["field"].as_str()),
        (400, Some("version")),
        "{err}"
    );
}

/// Regression (review): a reclaim request stuck behind a disabled endpoint, then cancelled
/// because the user came back, is never sent when the endpoint is enabled again.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_request_stays_unsent_when_its_endpoint_comes_back() {
    let Fed {
        dir: _dir,
        rx,
        a,
        now,
    } = fed(204, "", "").await;
    notices(&a, &rx).await;
    rx.answer(410);
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 2);
    eventually(
        "the endpoint disabled",
        Duration::from_secs(20),
        async || {
            let (_, out) = get(
                &a,
                ADMIN_TOKEN,
                "/api/v1/webhooks/deliveries?state=disabled",
            )
            .await;
            (out["deliveries"].as_array().unwrap().len() == 2).then_some(())
        },
    )
    .await;
    // The notebook's user is back; the batch job is still idle.
    let more = run(
        "n1",
        "GPU-NB1",
        "lab/nb-idle",
        SloClass::Interactive,
        now,
        now + 120,
        |_| 0.9,
    );
    let (status, body) = a.ingest(NODE, &Batch::from_samples("n1", &more)).await;
    assert_eq!(status, 200, "{body}");
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.cancelled", 1);
    rx.answer(204);
    let (status, r) = post(
        &a,
        ADMIN_TOKEN,
        "/api/v1/webhooks/endpoints/bridge/enable",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{r}");
    eventually(
        "the batch job's request and the cancellation",
        Duration::from_secs(20),
        async || {
            let e = rx.events();
            (e.contains(&("4242".into(), "reclaim.requested".into()))
                && e.contains(&("lab/nb-idle".into(), "reclaim.cancelled".into())))
            .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !rx.events()
            .contains(&("lab/nb-idle".into(), "reclaim.requested".into())),
        "the cancelled request was sent: {:?}",
        rx.events()
    );
    let (_, out) = get(
        &a,
        ADMIN_TOKEN,
        "/api/v1/webhooks/deliveries?state=cancelled",
    )
    .await;
    assert_eq!(out["deliveries"].as_array().unwrap().len(), 1, "{out}");
    // Nor can a replay send it.
    let (_, r) = post(
        &a,
        ADMIN_TOKEN,
        "/api/v1/webhooks/replay",
        serde_json::json!({"states": ["delivered", "failed", "disabled"]}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !rx.events()
            .contains(&("lab/nb-idle".into(), "reclaim.requested".into())),
        "{r}"
    );
}

/// The blast radius: at most `max_per_tenant_per_hour` reclaims per tenant; the rest wait,
/// counted, and say why.
#[tokio::test(flavor = "multi_thread")]
async fn the_blast_radius_bound_defers_and_counts() {
    let Fed {
        dir: _dir, rx, a, ..
    } = fed(204, "max_per_tenant_per_hour = 1", "").await;
    notices(&a, &rx).await;
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 1);
    assert_eq!(report["reclaim"]["deferred"], 1, "{report}");
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_eq!(
        report["reclaim"]["events"],
        serde_json::json!({}),
        "{report}"
    );
    assert_eq!(
        report["reclaim"]["deferred"], 1,
        "the tenant's hour is used up: {report}"
    );
    assert_eq!(
        a.value("gpuledger_aggregator_reclaim_deferred_total").await,
        Some(2.0)
    );
    let (_, list) = get(&a, ADMIN_TOKEN, "/api/v1/reclaims").await;
    let deferred: Vec<&Value> = list["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["reason"] == "deferred")
        .collect();
    assert_eq!(deferred.len(), 1, "a hold is recorded once: {list}");
    assert!(
        deferred[0]["detail"]
            .as_str()
            .unwrap()
            .contains("blast-radius"),
        "{list}"
    );
}

/// A request withdrawn undelivered because a snooze came is made again once the snooze ends,
/// under the same webhook-id, and arrives when the receiver is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_withdrawn_request_is_made_again_after_the_snooze() {
    let Fed {
        dir: _dir, rx, a, ..
    } = fed(204, "", "").await;
    notices(&a, &rx).await;
    rx.answer(503);
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 2);
    let (status, e) = post(
        &a,
        TEAM,
        "/api/v1/exemptions",
        serde_json::json!({"workload": "4242", "duration": "1h"}),
    )
    .await;
    assert_eq!(status, 201, "{e}");
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.cancelled", 1);
    let r = reqwest::Client::new()
        .delete(format!(
            "{}/api/v1/exemptions/{}",
            a.url(),
            e["exemption_id"].as_str().unwrap()
        ))
        .bearer_auth(TEAM)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 1);
    rx.answer(204);
    eventually(
        "both requests and the cancellation",
        Duration::from_secs(60),
        async || {
            let e = rx.events();
            (e.contains(&("4242".into(), "reclaim.requested".into()))
                && e.contains(&("lab/nb-idle".into(), "reclaim.requested".into()))
                && e.contains(&("4242".into(), "reclaim.cancelled".into())))
            .then_some(())
        },
    )
    .await;
    let ids: std::collections::HashSet<String> = rx
        .received()
        .iter()
        .filter(|r| r.kind() == "reclaim.requested" && r.workload() == "4242")
        .map(|r| r.id.clone())
        .collect();
    assert_eq!(ids.len(), 1, "the same webhook-id");
}
