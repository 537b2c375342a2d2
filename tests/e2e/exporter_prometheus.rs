//! A real Prometheus (Debian's `prometheus`) scrapes a running exporter, and its query API
//! returns the series.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{Exporter, eventually, free_port, require_tool};

async fn query(port: u16, q: &str) -> Option<serde_json::Value> {
    let url = format!("http://127.0.0.1:{port}/api/v1/query");
    let r = reqwest::Client::new()
        .get(url)
        .query(&[("query", q)])
        .send()
        .await
        .ok()?;
    let v: serde_json::Value = r.json().await.ok()?;
    (v["status"] == "success").then_some(v["data"]["result"].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_exporter_and_answers_queries() {
    require_tool("prometheus");
    // gpu-h100-02 of the built-in fleet: 12 MIG instances on 4 GPUs and 4 whole GPUs.
    let exporter = Exporter::start(&["--source", "sim", "--node", "gpu-h100-02"]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpuledger-exporter\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            exporter.port
        ),
    )
    .unwrap();
    let port = free_port();
    let _prometheus = common::Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );

    let count = |q: &'static str| async move {
        query(port, q).await.and_then(|r| {
            r.get(0)
                .and_then(|s| s["value"][1].as_str().map(str::to_owned))
        })
    };
    eventually(
        "16 instance series in Prometheus",
        Duration::from_secs(60),
        async || {
            count("count(gpuledger_instance_sm_active_ratio)")
                .await
                .filter(|v| v == "16")
        },
    )
    .await;
    assert_eq!(
        count("count(gpuledger_instance_nvlink_transmit_bytes_total)")
            .await
            .as_deref(),
        Some("4"),
        "NVLink only on the 4 whole GPUs"
    );
    assert_eq!(
        count("up{job=\"gpuledger-exporter\"}").await.as_deref(),
        Some("1")
    );
    // 8 GPUs, of which one (3g + 3g) leaves a compute slice unpartitioned: 55/7 GPU-equivalents.
    let carved: f64 = count("sum(gpuledger_instance_gpu_equivalents)")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!((carved - 55.0 / 7.0).abs() < 1e-9, "{carved}");

    let series = query(
        port,
        "gpuledger_instance_fb_total_bytes{mig_profile=\"3g.40gb\"}",
    )
    .await
    .unwrap();
    let first = &series[0]["metric"];
    assert_eq!(first["node"], "gpu-h100-02");
    assert_eq!(first["gpu_model"], "NVIDIA H100 80GB HBM3");
    assert_eq!(series[0]["value"][1], (40u64 << 30).to_string());

    // Every query of the Grafana dashboard is valid PromQL for this Prometheus (the template
    // variable as "All"), and the exporter's panels find data.
    for expr in common::dashboard_exprs() {
        let q = expr.replace("$tenant", ".*");
        let r = query(port, &q).await;
        assert!(r.is_some(), "the dashboard query does not run: {q}");
        if q.contains("gpuledger_instance_") {
            assert!(
                !r.unwrap().as_array().unwrap().is_empty(),
                "no data for {q}"
            );
        }
    }
}
