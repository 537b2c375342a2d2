//! Replay: a valid trace ships exactly its rows (the HTTP backfill path); a malformed one is
//! refused with file:line:column and nothing of it is shipped.

use std::time::Duration;

use crate::common::fake_aggregator::FakeAggregator;
use crate::common::{gpuledger, token_file};
use gpuledger_schema::Sample;
use gpuledger_schema::trace::TraceReader;

fn simulate(path: &std::path::Path) {
    let status = gpuledger()
        .args([
            "simulate",
            "--seed",
            "7",
            "--duration",
            "2m",
            "--start",
            "2026-01-01T00:00:00Z",
            "--node",
            "gpu-h100-02",
            "--out",
        ])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// `gpuledger exporter` replaying `trace` as fast as `url` takes it, exiting once it is shipped.
fn replay_once(
    dir: &std::path::Path,
    trace: &std::path::Path,
    url: &str,
    token: &std::path::Path,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpuledger"));
    cmd.args([
        "exporter",
        "--source",
        "replay",
        "--speed",
        "max",
        "--once",
        "--node",
        "gpu-h100-02",
        "--listen",
        "127.0.0.1:0",
    ])
    .args(["--aggregator", url, "--token-file"])
    .arg(token)
    .arg("--spool-dir")
    .arg(dir.join("spool"))
    .arg("--replay-file")
    .arg(trace)
    .kill_on_drop(true);
    cmd
}

fn sorted(mut samples: Vec<Sample>) -> Vec<Sample> {
    samples.sort_by(|a, b| (a.timestamp, &a.instance).cmp(&(b.timestamp, &b.instance)));
    samples
}

/// Regression: `--once` used to exit after the first acknowledged batch (the sender saw an empty
/// spool before the last batch was sealed), shipping 288 of 1,920 rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_valid_trace_replays_to_exactly_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    simulate(&trace);
    let token = token_file(dir.path(), "t");
    let fake = FakeAggregator::start(0, "t").await;
    let url = fake.url();
    let mut child = replay_once(dir.path(), &trace, &url, &token)
        .spawn()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("--once exits")
        .unwrap();
    assert!(status.success());

    let expected: Vec<Sample> = TraceReader::open(&trace)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(expected.len(), 120 * 16);
    let shipped: Vec<Sample> = fake
        .deliveries()
        .into_iter()
        .filter(|d| !d.duplicate)
        .flat_map(|d| d.samples)
        .collect();
    let (shipped, expected) = (sorted(shipped), sorted(expected));
    assert_eq!(shipped.len(), expected.len());
    for (got, want) in shipped.iter().zip(&expected) {
        assert_eq!(got, want);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_trace_is_refused_with_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    simulate(&trace);
    // Break the sm_active (12th column) of the 1,000th line.
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut fields: Vec<String> = lines[999].split(',').map(str::to_owned).collect();
    fields[11] = "1.7".into();
    lines[999] = fields.join(",");
    std::fs::write(&trace, lines.join("\n") + "\n").unwrap();

    let token = token_file(dir.path(), "t");
    let fake = FakeAggregator::start(0, "t").await;
    let out = replay_once(dir.path(), &trace, &fake.url(), &token)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:1000:12: sm_active: 1.7 is outside 0–1",
            trace.display()
        )),
        "{stderr}"
    );
    assert!(
        fake.deliveries().is_empty(),
        "nothing of a bad file is shipped"
    );
}

#[test]
fn the_same_seed_writes_the_same_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
    simulate(&a);
    simulate(&b);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}
