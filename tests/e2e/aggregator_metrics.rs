//! The aggregator's own /metrics, from a running aggregator that ingested and refused batches:
//! promtool-clean in the classic format, accepted by a strict OpenMetrics parser, and kept in step
//! with docs/metrics.md's table.

use crate::common;

use std::collections::BTreeSet;

use crate::common::{ADMIN_TOKEN, Aggregator};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};

async fn fed_aggregator(dir: &std::path::Path) -> Aggregator {
    // A webhook receiver nobody listens on: the reclaim and webhook families have series (the
    // episode's notice waits in the outbox, retried).
    let cfg = dir.join("aggregator.toml");
    std::fs::write(
        &cfg,
        format!(
            "[billing.tenants.team-a]\nmonthly_budget = 1000\n\
             [[webhooks]]\nname = \"bridge\"\nurl = \"http://127.0.0.1:{}/hook\"\nsecret = \"{}\"\n",
            common::free_port(),
            common::receiver::secret()
        ),
    )
    .unwrap();
    let a = Aggregator::start(
        &dir.join("ledger.duckdb"),
        0,
        &["--hoarding-window", "1m", "--config", cfg.to_str().unwrap()],
    )
    .await;
    // Three idle minutes of a held GPU: a hoarding episode under a one-minute window.
    let now = chrono::Utc::now().timestamp();
    let t = now - now.rem_euclid(60) - 240;
    let samples: Vec<Sample> = (t..t + 180)
        .map(|ts| Sample {
            timestamp: ts,
            instance: Instance {
                node: "n1".into(),
                gpu_uuid: "GPU-1".into(),
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                mig_profile: None,
                gpu_instance_id: None,
                placement_start: None,
                placement_size: None,
            },
            attribution: Attribution {
                tenant: Some("t1".into()),
                workload: Some("t1/w".into()),
                slo_class: Some(SloClass::Batch),
                owner: None,
                owner_ref: None,
            },
            counters: Counters {
                sm_active: Some(0.0),
                ..Counters::default()
            },
        })
        .collect();
    let batch = Batch::from_samples("n1", &samples);
    assert_eq!(a.ingest(ADMIN_TOKEN, &batch).await.0, 200);
    assert_eq!(a.ingest(ADMIN_TOKEN, &batch).await.0, 200);
    assert_eq!(a.ingest("wrong-token-wrong-token", &batch).await.0, 401);
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);
    a
}

#[tokio::test(flavor = "multi_thread")]
async fn the_aggregator_metrics_are_clean_for_promtool_and_openmetrics_and_match_the_readme() {
    common::require_tool("promtool");
    let dir = tempfile::tempdir().unwrap();
    let a = fed_aggregator(dir.path()).await;
    let classic = a.metrics_accepting(ADMIN_TOKEN, "text/plain").await;
    let openmetrics = a
        .metrics_accepting(ADMIN_TOKEN, "application/openmetrics-text; version=1.0.0")
        .await;

    common::assert_promtool_clean(&classic);
    common::assert_openmetrics_valid(&openmetrics);

    // The values say what happened.
    for (line, want) in [
        ("gpuledger_aggregator_ingest_samples_total", 180.0),
        ("gpuledger_aggregator_ingest_batches_total", 1.0),
        ("gpuledger_aggregator_ingest_duplicate_batches_total", 1.0),
        (
            "gpuledger_aggregator_ingest_rejected_total{reason=\"unauthorized\"}",
            1.0,
        ),
        (
            "gpuledger_aggregator_store_rows{table=\"samples_raw\"}",
            180.0,
        ),
        // Two commits: the batch, and its re-send (a transaction that only finds the id stored).
        (
            "gpuledger_aggregator_writer_commit_duration_seconds_count",
            2.0,
        ),
        (
            "gpuledger_hoarding_episode_idle_duration_seconds{tenant=\"t1\",workload=\"t1/w\",node=\"n1\",gpu=\"GPU-1\",gpu_instance=\"\",slo_class=\"batch\"}",
            180.0,
        ),
        (
            "gpuledger_fragmentation_capacity_gpu_equivalents{node=\"n1\"}",
            1.0,
        ),
    ] {
        assert_eq!(a.value_as(ADMIN_TOKEN, line).await, Some(want), "{line}");
    }

    let exported: BTreeSet<String> = classic
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();
    let doc = std::fs::read_to_string(common::root().join("docs/metrics.md")).unwrap();
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| {
            ["aggregator_", "tenant_", "hoarding_", "fragmentation_"]
                .iter()
                .find_map(|p| Some((*p, l.strip_prefix("| `gpuledger_")?.strip_prefix(p)?)))
        })
        .map(|(p, l)| format!("gpuledger_{p}{}", l.split('`').next().unwrap()))
        .collect();
    assert_eq!(
        documented, exported,
        "docs/metrics.md's aggregator metric table and /metrics differ"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn probes_answer() {
    let dir = tempfile::tempdir().unwrap();
    let a = Aggregator::start(&dir.path().join("ledger.duckdb"), 0, &[]).await;
    for path in ["/healthz", "/readyz"] {
        let r = reqwest::get(format!("{}{path}", a.url())).await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
}
