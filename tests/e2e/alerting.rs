//! Alert delivery end to end with the real Debian `prometheus` and `prometheus-alertmanager`:
//! Prometheus scrapes a running aggregator fed a trace with a known hoarder, evaluates the rules
//! in alerts/, and Alertmanager delivers the idle-hoarding alert to a webhook receiver here. The
//! idle latency-critical replica in the same trace (idle for 2 h, under the 24 h bar for its
//! class) must not be delivered.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{ADMIN_TOKEN, Aggregator, free_port, require_tool};
use axum::Json;
use axum::extract::State;
use gpuledger_schema::wire::Batch;
use serde_json::Value;
use tokio::sync::mpsc;

/// The webhook receiver (what a reclaimer or a ticketing bridge would be): every POSTed
/// Alertmanager payload goes to the channel.
async fn receiver() -> (u16, mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new()
        .route(
            "/alerts",
            axum::routing::post(
                |State(tx): State<mpsc::UnboundedSender<Value>>, Json(v): Json<Value>| async move {
                    let _ = tx.send(v);
                    "ok"
                },
            ),
        )
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, rx)
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_and_alertmanager_deliver_the_idle_hoarding_alert() {
    require_tool("prometheus");
    require_tool("prometheus-alertmanager");
    let dir = tempfile::tempdir().unwrap();

    // The aggregator, fed two hours of the known trace ending about now, so that the ledger is
    // current and only the hoarding rules have anything to say.
    let aggregator = Aggregator::start(&dir.path().join("ledger.duckdb"), 0, &[]).await;
    let now = chrono::Utc::now().timestamp();
    let t0 = now - now.rem_euclid(60) - 7200;
    for chunk in common::traces::known_trace(t0).chunks(5_000) {
        let (status, body) = aggregator
            .ingest(ADMIN_TOKEN, &Batch::from_samples("n1", chunk))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(aggregator.evaluate(ADMIN_TOKEN).await.0, 200);

    let (hook_port, mut payloads) = receiver().await;
    let am_port = free_port();
    let am_config = dir.path().join("alertmanager.yml");
    std::fs::write(
        &am_config,
        format!(
            "route:\n  receiver: test\n  group_by: [alertname, tenant, workload]\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: test\n    webhook_configs:\n      - url: http://127.0.0.1:{hook_port}/alerts\n"
        ),
    )
    .unwrap();
    let _alertmanager = common::Killed(
        Command::new("prometheus-alertmanager")
            .arg(format!("--config.file={}", am_config.display()))
            .arg(format!(
                "--storage.path={}",
                dir.path().join("am").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{am_port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("alertmanager starts"),
    );

    let alerts = common::root().join("alerts");
    let prom_port = free_port();
    let prom_config = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}/*.rules.yml\nalerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\nscrape_configs:\n  - job_name: gpuledger-aggregator\n    authorization:\n      credentials: '{ADMIN_TOKEN}'\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            alerts.display(),
            aggregator.port
        ),
    )
    .unwrap();
    let _prometheus = common::Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", prom_config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );

    let deadline = Instant::now() + Duration::from_secs(90);
    let mut delivered: Vec<Value> = Vec::new();
    let hoarding = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no idle-hoarding alert was delivered; got {delivered:?}"
        );
        let Ok(Some(payload)) = tokio::time::timeout(left, payloads.recv()).await else {
            panic!("no idle-hoarding alert was delivered; got {delivered:?}");
        };
        let found = payload["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["labels"]["alertname"] == "GpuledgerIdleHoarding")
            .cloned();
        delivered.push(payload);
        if let Some(a) = found {
            break a;
        }
    };
    assert_eq!(hoarding["status"], "firing");
    let labels = &hoarding["labels"];
    assert_eq!(labels["tenant"], "team-a");
    assert_eq!(labels["workload"], "team-a/notebook-1");
    assert_eq!(labels["gpu"], "GPU-A");
    assert_eq!(labels["gpu_instance"], "7");
    assert_eq!(labels["slo_class"], "interactive");
    assert_eq!(labels["severity"], "ticket");
    assert_eq!(
        hoarding["annotations"]["runbook_url"],
        "alerts/RUNBOOK.md#gpuledgeridlehoarding"
    );
    let summary = hoarding["annotations"]["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("team-a/team-a/notebook-1 has held n1 GPU GPU-A instance 7 idle for"),
        "{summary}"
    );
    // Give Alertmanager a few more group intervals: the idle latency-critical replica (2 h idle)
    // must not be delivered as hoarding.
    tokio::time::sleep(Duration::from_secs(3)).await;
    while let Ok(p) = payloads.try_recv() {
        delivered.push(p);
    }
    for p in &delivered {
        for a in p["alerts"].as_array().into_iter().flatten() {
            assert_ne!(a["labels"]["workload"], "team-c/infer-0", "{a}");
        }
    }
}
