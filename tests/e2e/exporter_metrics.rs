//! The exporter's `/metrics`: a golden snapshot from a fixed-seed simulation, linted by promtool
//! (classic format) and by a strict OpenMetrics parser, and kept in step with docs/metrics.md.

use crate::common;

use std::collections::BTreeSet;

use gpuledger_exporter::attribution::shares::Share;
use gpuledger_exporter::metrics::{InstanceMetrics, Metrics, ReasonLabels, render};
use gpuledger_exporter::source::CollectorOutcome;
use gpuledger_exporter::source::sim::{Fleet, Simulator};
use gpuledger_schema::exposition::Format;
use gpuledger_schema::{Attribution, SloClass};

/// 2026-01-01T00:00:00Z.
const T: i64 = 1_767_225_600;

/// A node with MIG instances and whole GPUs (NVLink), two seconds in.
fn fixture_metrics() -> std::sync::Arc<Metrics> {
    let sim = Simulator::new(Fleet::builtin());
    let metrics = Metrics::new();
    for t in [T - 1, T] {
        let s = sim.second(Some("gpu-h100-02"), t);
        metrics
            .instances
            .lock()
            .unwrap()
            .update(&s.readings, &s.gpus);
    }
    // One owner's share of a time-sliced GPU (the simulator has no processes).
    let s = sim.second(Some("gpu-h100-02"), T);
    let whole = s
        .readings
        .iter()
        .rfind(|r| r.instance.mig_profile.is_none())
        .unwrap();
    metrics.instances.lock().unwrap().update_shares(&[Share {
        instance: whole.instance.clone(),
        attribution: Attribution {
            tenant: Some("vision".into()),
            workload: Some("ml/train-0".into()),
            slo_class: Some(SloClass::Batch),
            owner: None,
            owner_ref: None,
        },
        processes: 2,
        memory_used_bytes: Some(16 << 30),
        sm_active: Some(0.4),
    }]);
    metrics.exporter.record_collector(&CollectorOutcome {
        collector: "sim",
        duration: std::time::Duration::from_millis(1),
        success: true,
    });
    // Labelled families appear once they have a series.
    let _ = metrics
        .exporter
        .batches_dropped
        .get_or_create(&ReasonLabels {
            reason: "spool_full",
        });
    let _ = metrics.exporter.ship_failures.get_or_create(&ReasonLabels {
        reason: "unreachable",
    });
    metrics.exporter.record_devices(
        "kubelet",
        &gpuledger_exporter::attribution::DeviceCounts {
            assigned: 3,
            allocatable: Some(8),
            unmatched: 1,
        },
    );
    metrics
}

/// Family blocks keep their order; the samples inside a family are sorted (the client library
/// keeps them in a hash map).
fn normalized(text: &str) -> String {
    let mut out = Vec::new();
    let mut samples: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            samples.sort_unstable();
            out.append(&mut samples);
            out.push(line);
        } else {
            samples.push(line);
        }
    }
    samples.sort_unstable();
    out.append(&mut samples);
    out.join("\n") + "\n"
}

#[test]
fn golden_instance_metrics_from_a_fixed_seed_simulation() {
    let sim = Simulator::new(Fleet::builtin());
    let mut m = InstanceMetrics::new();
    for t in [T - 1, T] {
        let s = sim.second(Some("gpu-h100-02"), t);
        m.update(&s.readings, &s.gpus);
    }
    insta::assert_snapshot!(
        "instance_metrics_openmetrics",
        normalized(&render(&[m.registry()], Format::OpenMetrics))
    );
}

#[test]
fn classic_exposition_passes_promtool_check_metrics() {
    common::require_tool("promtool");
    let text = fixture_metrics().render(Format::Classic);
    common::assert_promtool_clean(&text);
}

#[test]
fn openmetrics_exposition_passes_a_strict_parser() {
    let text = fixture_metrics().render(Format::OpenMetrics);
    common::assert_openmetrics_valid(&text);
}

#[test]
fn the_readme_metric_reference_lists_exactly_the_exported_families() {
    let text = fixture_metrics().render(Format::Classic);
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();
    let doc = std::fs::read_to_string(common::root().join("docs/metrics.md")).unwrap();
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `gpuledger_"))
        .map(|l| format!("gpuledger_{}", l.split('`').next().unwrap()))
        // The aggregator's families have their own table (tests/e2e/aggregator_metrics.rs).
        .filter(|name| {
            !["aggregator_", "tenant_", "hoarding_", "fragmentation_"]
                .iter()
                .any(|p| name.starts_with(&format!("gpuledger_{p}")))
        })
        .collect();
    assert_eq!(
        documented, exported,
        "docs/metrics.md's metric reference and the exporter's /metrics differ"
    );
}
