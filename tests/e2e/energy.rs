//! Measured energy per tenant (`GET /api/v1/energy`, its CSV; `schema/ANALYTICS.md`, "Energy
//! and carbon") on a trace built for the split's rules, three days ago from 08:58 to 09:03 UTC
//! (across an hour, so minute and hour pieces both answer):
//! - `GPU-M`, a MIG H100 (idle floor 70 W, the model's default): a `3g.40gb` held by `team-a`
//!   busy at 40–90 %, a `2g.20gb` held by `team-b` at 0 %, a `1g.10gb` nobody holds at 20 %, one
//!   slice with no instance; every 11th second every instance reads 0 % (the active part then
//!   goes by slices), and every 13th second the GPU uses less than its floor.
//! - `GPU-W`, a whole H100 held by `team-a` and then, from 09:00:30 (inside a minute), by
//!   `team-c`; some seconds have no SM reading, and one second has no energy reading at all
//!   (`unmeasured_energy_seconds` = 1).
//! - `GPU-F`, a whole H100 held by `team-b` at a steady 120 J.
//!
//! The config sets the H100's idle floor to 100 W (`[energy.models."NVIDIA H100 80GB HBM3"]`),
//! over the model's default of 70 W.
//!
//! The expected kWh come from a naive per-second evaluation of the rules written here, not from
//! the ledger's code; the report must match it to a relative 1e-9 through `import --db`,
//! `import --aggregator` (HTTP), and an exporter replaying the trace.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::{ADMIN_TOKEN, Aggregator, eventually, gpuledger, replay, token_file};
use gpuledger_schema::trace::TraceWriter;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};
use serde_json::Value;

const DAY: i64 = 86_400;
const H100: &str = "NVIDIA H100 80GB HBM3";
const TENANT_A: &str = "tenant-a-token-0123456789";

fn mig(gpu: &str, profile: &str, id: u32, start: u32, size: u32) -> Instance {
    Instance {
        node: "n1".into(),
        gpu_uuid: gpu.into(),
        gpu_model: H100.into(),
        mig_profile: Some(profile.into()),
        gpu_instance_id: Some(id),
        placement_start: Some(start),
        placement_size: Some(size),
    }
}

fn whole(gpu: &str) -> Instance {
    Instance {
        node: "n1".into(),
        gpu_uuid: gpu.into(),
        gpu_model: H100.into(),
        mig_profile: None,
        gpu_instance_id: None,
        placement_start: None,
        placement_size: None,
    }
}

fn held(tenant: &str, workload: &str) -> Attribution {
    Attribution {
        tenant: Some(tenant.into()),
        workload: Some(format!("{tenant}/{workload}")),
        slo_class: Some(SloClass::Batch),
        owner: None,
        owner_ref: None,
    }
}

/// One GPU-second: its energy and its instances (instance, holder, compute slices, SM).
struct GpuSecond {
    t: i64,
    energy: Option<f64>,
    instances: Vec<(Instance, Attribution, u32, Option<f64>)>,
}

/// The trace, GPU-second by GPU-second.
fn trace(start: i64) -> Vec<GpuSecond> {
    let (a3, b2, u1) = (
        mig("GPU-M", "3g.40gb", 1, 0, 4),
        mig("GPU-M", "2g.20gb", 5, 4, 2),
        mig("GPU-M", "1g.10gb", 13, 6, 1),
    );
    let (w, f) = (whole("GPU-W"), whole("GPU-F"));
    let mut out = Vec::new();
    for t in start..start + 300 {
        let k = t - start;
        let quiet = k % 11 == 0;
        let sm = |v: f64| Some(if quiet { 0.0 } else { v });
        out.push(GpuSecond {
            t,
            energy: Some(if k % 13 == 0 {
                40.0
            } else {
                300.0 + 50.0 * (k % 7) as f64
            }),
            instances: vec![
                (
                    a3.clone(),
                    held("team-a", "train"),
                    3,
                    sm(0.4 + 0.1 * (k % 6) as f64),
                ),
                (b2.clone(), held("team-b", "notebook"), 2, sm(0.0)),
                (u1.clone(), Attribution::default(), 1, sm(0.2)),
            ],
        });
        let holder = if k < 150 {
            held("team-a", "serve")
        } else {
            held("team-c", "serve")
        };
        out.push(GpuSecond {
            t,
            energy: (k != 200).then_some(450.0 + (k % 5) as f64 * 10.0),
            instances: vec![(w.clone(), holder, 7, (k % 4 != 0).then_some(0.3))],
        });
        out.push(GpuSecond {
            t,
            energy: Some(120.0),
            instances: vec![(f.clone(), held("team-b", "batch"), 7, Some(0.5))],
        });
    }
    out
}

/// The idle floor the test configures for every H100.
const FLOOR: f64 = 100.0;

/// Per tenant: (idle J, active J), by the rules, second by second; and the fleet's J.
fn expected(seconds: &[GpuSecond], from: i64, to: i64) -> (BTreeMap<String, (f64, f64)>, f64) {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut fleet = 0.0;
    for s in seconds.iter().filter(|s| s.t >= from && s.t < to) {
        let Some(e) = s.energy else { continue };
        fleet += e;
        let idle = e.min(FLOOR);
        let active = e - idle;
        let slices: u32 = s.instances.iter().map(|i| i.2).sum();
        let d = f64::from(slices.max(7));
        let w: f64 = s
            .instances
            .iter()
            .filter_map(|i| i.3.map(|sm| sm * f64::from(i.2)))
            .sum();
        for (_, a, c, sm) in &s.instances {
            let c = f64::from(*c);
            let my_idle = idle * c / d;
            let my_active = if w > 0.0 {
                active * sm.unwrap_or(0.0) * c / w
            } else {
                active * c / d
            };
            if let Some(t) = &a.tenant {
                let x = out.entry(t.clone()).or_default();
                x.0 += my_idle;
                x.1 += my_active;
            }
        }
    }
    (out, fleet)
}

/// The trace as CSV: each instance-second a row carrying its GPU's energy.
fn write_trace(path: &Path, seconds: &[GpuSecond]) {
    let mut w = TraceWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    for s in seconds {
        for (i, a, _, sm) in &s.instances {
            let sample = Sample {
                timestamp: s.t,
                instance: i.clone(),
                attribution: a.clone(),
                counters: Counters {
                    sm_active: *sm,
                    ..Counters::default()
                },
            };
            w.write_with_energy(&sample, s.energy).unwrap();
        }
    }
    w.finish().unwrap();
}

fn config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("aggregator.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[energy]
grams_co2e_per_kwh = 400.0
price_per_kwh = 0.25
[energy.models."{H100}"]
idle_watts = {FLOOR}
"#
        ),
    )
    .unwrap();
    path
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

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

/// The report over `[from, to)` equals the rules' answer, per tenant and in total.
async fn assert_report(a: &Aggregator, seconds: &[GpuSecond], from: i64, to: i64) {
    let (want, fleet) = expected(seconds, from, to);
    let (status, body) = get(
        a,
        ADMIN_TOKEN,
        &format!("/api/v1/energy?from={from}&to={to}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), want.len(), "{v}");
    let mut held = 0.0;
    for (tenant, (idle, active)) in &want {
        let r = rows
            .iter()
            .find(|r| r["tenant"] == tenant.as_str())
            .unwrap_or_else(|| panic!("no row for {tenant}: {v}"));
        let kwh = (idle + active) / 3.6e6;
        held += kwh;
        for (field, want) in [
            ("energy_kwh", kwh),
            ("idle_energy_kwh", idle / 3.6e6),
            ("active_energy_kwh", active / 3.6e6),
            ("co2e_kg", kwh * 0.4),
            ("energy_cost", kwh * 0.25),
        ] {
            let got = r[field].as_f64().unwrap();
            assert!(
                close(got, want),
                "{tenant} {field}: {got} != {want} ({from}..{to})"
            );
        }
    }
    let totals = &v["totals"];
    let got = totals["energy_kwh"].as_f64().unwrap();
    assert!(
        close(got, fleet / 3.6e6),
        "fleet {got} != {}",
        fleet / 3.6e6
    );
    let unallocated = totals["unallocated_energy_kwh"].as_f64().unwrap();
    assert!(
        close(held + unallocated, got),
        "rows + unallocated = the GPUs' energy: {held} + {unallocated} != {got}"
    );
    let unmeasured = seconds
        .iter()
        .filter(|s| s.t >= from && s.t < to && s.energy.is_none())
        .count() as i64;
    assert_eq!(totals["unmeasured_energy_seconds"], unmeasured, "{totals}");
}

/// Every range the test asks: the whole day (day pieces), the two hours (hour pieces) and
/// minutes across the hour (minute pieces).
async fn assert_reports(a: &Aggregator, seconds: &[GpuSecond], day: i64) {
    let start = day + 8 * 3600 + 58 * 60;
    assert_report(a, seconds, day, day + DAY).await;
    assert_report(a, seconds, day + 8 * 3600, day + 10 * 3600).await;
    assert_report(a, seconds, start + 60, start + 240).await;
}

fn day() -> i64 {
    (chrono::Utc::now().timestamp().div_euclid(DAY) - 3) * DAY
}

#[tokio::test(flavor = "multi_thread")]
async fn each_tenant_gets_the_energy_of_its_slices_by_the_rules_through_import() {
    let dir = tempfile::tempdir().unwrap();
    let day = day();
    let seconds = trace(day + 8 * 3600 + 58 * 60);
    let csv = dir.path().join("trace.csv");
    write_trace(&csv, &seconds);
    let config = config(dir.path());
    let db = dir.path().join("ledger.duckdb");
    // The aggregator writes its floors into the ledger; an import into it splits the same way.
    let a = Aggregator::start(&db, 0, &["--config", config.to_str().unwrap()]).await;
    a.terminate();
    let out = gpuledger()
        .arg("import")
        .arg("--db")
        .arg(&db)
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("tenant:team-a {TENANT_A}\n")).unwrap();
    let a = Aggregator::start(
        &db,
        0,
        &[
            "--config",
            config.to_str().unwrap(),
            "--token-file",
            tokens.to_str().unwrap(),
        ],
    )
    .await;
    assert_reports(&a, &seconds, day).await;

    // Imported twice: nothing more.
    let out = gpuledger()
        .args(["import", "--aggregator", &a.url(), "--token-file"])
        .arg(token_file(dir.path(), ADMIN_TOKEN))
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_reports(&a, &seconds, day).await;

    // A tenant token sees its own row and no fleet totals; another tenant is refused.
    let path = format!("/api/v1/energy?from={day}&to={}", day + DAY);
    let (status, body) = get(&a, TENANT_A, &path).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["rows"][0]["tenant"], "team-a");
    assert!(v["totals"].is_null(), "{v}");
    let (status, body) = get(&a, TENANT_A, &format!("{path}&tenant=team-b")).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("tenant"), "{body}");

    // The CSV is the JSON's rows; by workload, `team-a` has two.
    let (status, csv_body) = get(&a, ADMIN_TOKEN, &path.replace("energy?", "energy.csv?")).await;
    assert_eq!(status, 200);
    let (_, json) = get(&a, ADMIN_TOKEN, &path).await;
    let v: Value = serde_json::from_str(&json).unwrap();
    let mut reader = csv::Reader::from_reader(csv_body.as_bytes());
    let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), v["rows"].as_array().unwrap().len());
    for (rec, row) in records.iter().zip(v["rows"].as_array().unwrap()) {
        assert_eq!(&rec[0], row["tenant"].as_str().unwrap());
        assert_eq!(
            rec[1].parse::<f64>().unwrap(),
            row["energy_kwh"].as_f64().unwrap()
        );
    }
    let (_, body) = get(&a, ADMIN_TOKEN, &format!("{path}&group_by=workload")).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let a_rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["tenant"] == "team-a")
        .count();
    assert_eq!(a_rows, 2, "{v}");
    // Unknown parameters and group-bys are refused, naming them.
    let (status, body) = get(&a, ADMIN_TOKEN, &format!("{path}&group_by=colour")).await;
    assert_eq!(status, 400);
    assert!(body.contains("group_by"), "{body}");
    let (status, body) = get(&a, ADMIN_TOKEN, &format!("{path}&colour=1")).await;
    assert_eq!(status, 400);
    assert!(body.contains("colour"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exporter_replaying_the_trace_ships_the_same_energy() {
    let dir = tempfile::tempdir().unwrap();
    let day = day();
    let seconds = trace(day + 8 * 3600 + 58 * 60);
    let csv = dir.path().join("trace.csv");
    write_trace(&csv, &seconds);
    let config = config(dir.path());
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let mut exporter = replay(dir.path(), &a, "n1", &csv);
    let status = exporter.wait().await.unwrap();
    assert!(status.success());
    let rows = seconds.iter().map(|s| s.instances.len()).sum::<usize>() as f64;
    eventually(
        "the replay is stored",
        std::time::Duration::from_secs(60),
        async || {
            (a.value("gpuledger_aggregator_ingest_samples_total").await == Some(rows)).then_some(())
        },
    )
    .await;
    assert_reports(&a, &seconds, day).await;
}

#[test]
fn rows_of_one_gpu_second_that_disagree_are_refused_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let seconds = trace(day() + 8 * 3600);
    let csv = dir.path().join("trace.csv");
    write_trace(&csv, &seconds[..3]);
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    // Line 3 is GPU-M's second instance row of the first second.
    let mut fields: Vec<String> = lines[2].split(',').map(str::to_owned).collect();
    *fields.last_mut().unwrap() = "41".into();
    lines[2] = fields.join(",");
    std::fs::write(&csv, lines.join("\n") + "\n").unwrap();
    let out = gpuledger()
        .arg("import")
        .arg("--db")
        .arg(dir.path().join("ledger.duckdb"))
        .arg(&csv)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("trace.csv:3:20") && stderr.contains("disagrees with 40 J on line 2"),
        "{stderr}"
    );
}
