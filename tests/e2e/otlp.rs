//! OpenTelemetry: the exporter and the aggregator push over OTLP/HTTP (protobuf) the same metric
//! families, units, attributes and values that `/metrics` serves, with the configured headers,
//! and the aggregator sends its ingest, writer and analytics spans.
//!
//! The receiver is a real HTTP server on loopback that decodes each request with the published
//! OTLP protobuf definitions (`opentelemetry-proto`), independently of the SDK that encoded it.
//! What it is compared with is `/metrics` read by `gpuledger_schema::exposition::parse`
//! (itself checked against `prometheus-client`'s own encoder in schema's unit tests), with this
//! file's own table of the expected OTLP names and units.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{ADMIN_TOKEN, Aggregator, Exporter, eventually, gpuledger, token_file};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use gpuledger_schema::exposition::{self, Kind};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{AggregationTemporality, metric, number_data_point};
use prost::Message;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0";

/// One request as the receiver got it.
#[derive(Clone)]
struct Received<T> {
    headers: HeaderMap,
    body: T,
}

#[derive(Default)]
struct Inbox {
    metrics: Vec<Received<ExportMetricsServiceRequest>>,
    traces: Vec<Received<ExportTraceServiceRequest>>,
}

/// Where each kind of request is kept.
trait Kept: Message + Default + Clone + Send + 'static {
    fn kept(inbox: &mut Inbox) -> &mut Vec<Received<Self>>;
}

impl Kept for ExportMetricsServiceRequest {
    fn kept(inbox: &mut Inbox) -> &mut Vec<Received<Self>> {
        &mut inbox.metrics
    }
}

impl Kept for ExportTraceServiceRequest {
    fn kept(inbox: &mut Inbox) -> &mut Vec<Received<Self>> {
        &mut inbox.traces
    }
}

/// Decodes one OTLP/HTTP protobuf request and keeps it; answers as a collector does.
async fn receive<T: Kept>(
    State(inbox): State<Arc<Mutex<Inbox>>>,
    headers: HeaderMap,
    body: Bytes,
) -> impl axum::response::IntoResponse {
    let body = T::decode(body).expect("an OTLP protobuf request");
    T::kept(&mut inbox.lock().unwrap()).push(Received { headers, body });
    (
        [("content-type", "application/x-protobuf")],
        Vec::<u8>::new(),
    )
}

/// An OTLP/HTTP receiver on loopback: `POST /v1/metrics` and `POST /v1/traces`, protobuf.
struct Receiver {
    url: String,
    inbox: Arc<Mutex<Inbox>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route(
                "/v1/metrics",
                axum::routing::post(receive::<ExportMetricsServiceRequest>),
            )
            .route(
                "/v1/traces",
                axum::routing::post(receive::<ExportTraceServiceRequest>),
            )
            .with_state(inbox.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { url, inbox }
    }

    /// The flags that push to this receiver every second, with a header it checks.
    fn flags(&self) -> [String; 8] {
        [
            "--otlp-endpoint",
            &self.url,
            "--otlp-interval",
            "1s",
            "--otlp-timeout",
            "1s",
            "--otlp-header",
            "x-test-key=s3cret",
        ]
        .map(str::to_owned)
    }

    fn metric_pushes(&self) -> usize {
        self.inbox.lock().unwrap().metrics.len()
    }

    /// The first metrics push received after `after` pushes had been.
    async fn metrics_push_after(&self, after: usize) -> Received<ExportMetricsServiceRequest> {
        eventually(
            "an OTLP metrics push",
            Duration::from_secs(20),
            async || self.inbox.lock().unwrap().metrics.get(after).cloned(),
        )
        .await
    }
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn attrs(kv: &[KeyValue]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

/// The UCUM unit each OpenMetrics unit must arrive as.
fn expected_unit(unit: Option<&str>) -> &'static str {
    match unit {
        None => "",
        Some("bytes") => "By",
        Some("seconds") => "s",
        Some("ratio" | "ratios") => "1",
        Some("watts") => "W",
        Some("joules") => "J",
        Some("grams") => "g",
        Some("gpu_equivalents") => "{gpu_equivalents}",
        Some(other) => panic!("no expected OTLP unit for the OpenMetrics unit {other:?}"),
    }
}

/// One series: (OTLP metric name, sorted attributes) → value; and per metric name its unit,
/// description and whether it is a monotonic cumulative sum.
type Series = BTreeMap<(String, BTreeMap<String, String>), f64>;
type Shapes = BTreeMap<String, (String, String, bool)>;

/// What `/metrics` says the push must carry.
fn from_scrape(openmetrics: &str) -> (Series, Shapes) {
    let mut series = Series::new();
    let mut shapes = Shapes::new();
    for f in exposition::parse(openmetrics).expect("/metrics parses") {
        let unit = expected_unit(f.unit.as_deref()).to_owned();
        let names: Vec<(String, String, bool)> = match f.kind {
            Kind::Gauge => vec![(f.name.clone(), f.name.clone(), false)],
            Kind::Counter => vec![(f.name.clone(), format!("{}_total", f.name), true)],
            Kind::Info => vec![(
                format!("{}_info", f.name),
                format!("{}_info", f.name),
                false,
            )],
            Kind::Histogram => ["_count", "_sum", "_bucket"]
                .iter()
                .map(|s| (format!("{}{s}", f.name), format!("{}{s}", f.name), true))
                .collect(),
            Kind::Other => panic!("gpuledger serves no family of type Other: {}", f.name),
        };
        for (otlp, sample, sum) in names {
            shapes.insert(otlp.clone(), (unit.clone(), f.help.clone(), sum));
            for s in f.samples.iter().filter(|s| s.name == sample) {
                let labels = s.labels.iter().cloned().collect();
                series.insert((otlp.clone(), labels), s.value);
            }
        }
    }
    (series, shapes)
}

/// What one push carries, and the service that pushed it.
fn from_push(push: &ExportMetricsServiceRequest) -> (Series, Shapes, BTreeMap<String, String>) {
    let mut series = Series::new();
    let mut shapes = Shapes::new();
    assert_eq!(push.resource_metrics.len(), 1);
    let rm = &push.resource_metrics[0];
    let resource = attrs(&rm.resource.as_ref().unwrap().attributes);
    for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
        let (points, sum) = match m.data.as_ref().unwrap() {
            metric::Data::Gauge(g) => (&g.data_points, false),
            metric::Data::Sum(s) => {
                assert!(s.is_monotonic, "{} is a monotonic sum", m.name);
                assert_eq!(
                    s.aggregation_temporality,
                    AggregationTemporality::Cumulative as i32,
                    "{} is cumulative",
                    m.name
                );
                (&s.data_points, true)
            }
            other => panic!("{} arrived as {other:?}", m.name),
        };
        shapes.insert(m.name.clone(), (m.unit.clone(), m.description.clone(), sum));
        for p in points {
            let v = match p.value.unwrap() {
                number_data_point::Value::AsDouble(d) => d,
                number_data_point::Value::AsInt(i) => i as f64,
            };
            let dup = series.insert((m.name.clone(), attrs(&p.attributes)), v);
            assert!(dup.is_none(), "{} has a series twice", m.name);
        }
    }
    (series, shapes, resource)
}

/// Gauges the process reads at each render (its memory), which no two renders share.
const LIVE_READINGS: [&str; 2] = [
    "gpuledger_aggregator_resident_memory_bytes",
    "gpuledger_aggregator_store_memory_bytes",
];

/// Compares a scrape with the push that followed it: every metric with its unit, description
/// and type, and every series with its attributes and value. Returns how the two differ.
fn differences(scrape: &str, push: &ExportMetricsServiceRequest) -> Vec<String> {
    let (want, want_shapes) = from_scrape(scrape);
    let (got, got_shapes, _) = from_push(push);
    let mut diff = Vec::new();
    for (name, shape) in &want_shapes {
        // A family with no series yet has no OTLP metric: the SDK sends no empty metrics.
        let has_series = want.keys().any(|(n, _)| n == name);
        match got_shapes.get(name) {
            Some(g) if g == shape => {}
            Some(g) => diff.push(format!("{name}: pushed as {g:?}, /metrics says {shape:?}")),
            None if has_series => diff.push(format!("{name}: not pushed")),
            None => {}
        }
    }
    for name in got_shapes.keys() {
        if !want_shapes.contains_key(name) {
            diff.push(format!("{name}: pushed but not in /metrics"));
        }
    }
    let keys: BTreeSet<_> = want.keys().chain(got.keys()).collect();
    for k in keys {
        match (want.get(k), got.get(k)) {
            (Some(a), Some(b)) if a == b || (a.is_nan() && b.is_nan()) => {}
            // Read afresh at each render: pushed, but not the value of an earlier scrape.
            (Some(_), Some(b)) if LIVE_READINGS.contains(&k.0.as_str()) && *b > 0.0 => {}
            (a, b) => diff.push(format!("{} {:?}: /metrics {a:?}, push {b:?}", k.0, k.1)),
        }
    }
    diff
}

/// The exporter: a replayed trace, played to its end, leaves every series still, so the push
/// after a scrape must carry exactly what the scrape showed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_pushes_what_metrics_serves() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    common::simulate(&trace, "gpu-h100-02", "2026-01-01T00:00:00Z", "30s");
    let exporter = Exporter::start(
        &[
            "--source",
            "replay",
            "--replay-file",
            trace.to_str().unwrap(),
            "--speed",
            "max",
            "--node",
            "gpu-h100-02",
        ]
        .into_iter()
        .chain(receiver.flags().iter().map(String::as_str))
        .collect::<Vec<_>>(),
    )
    .await;
    // The replay is over when the samples counter stops moving.
    let mut last = -1.0;
    eventually("the replay to end", Duration::from_secs(30), async || {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = exporter
            .value("gpuledger_exporter_samples_collected_total")
            .await?;
        let done = now > 0.0 && now == last;
        last = now;
        done.then_some(())
    })
    .await;
    let scrape = exporter.metrics(OPENMETRICS).await;
    let push = receiver.metrics_push_after(receiver.metric_pushes()).await;
    assert_eq!(
        push.headers.get("x-test-key").map(|v| v.to_str().unwrap()),
        Some("s3cret")
    );
    assert_eq!(
        push.headers.get("content-type").unwrap(),
        "application/x-protobuf"
    );
    let (series, _, resource) = from_push(&push.body);
    assert_eq!(resource["service.name"], "gpuledger-exporter");
    assert_eq!(resource["service.instance.id"], "gpu-h100-02");
    assert!(
        series
            .keys()
            .any(|(n, a)| n == "gpuledger_instance_sm_active_ratio" && a["node"] == "gpu-h100-02"),
        "the instance series are pushed: {:?}\n/metrics:\n{scrape}",
        series.keys().map(|k| &k.0).collect::<BTreeSet<_>>()
    );
    let diff = differences(&scrape, &push.body);
    assert!(
        diff.is_empty(),
        "the push differs from /metrics:\n{}",
        diff.join("\n")
    );
    exporter.terminate();
}

/// The aggregator: after a replay is ingested and the analytics evaluated, nothing moves; the
/// push carries the operational and the ledger families exactly as an admin's scrape shows them,
/// and the spans of that ingest and evaluation arrive with their attributes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregator_pushes_its_metrics_and_traces() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.duckdb");
    let aggregator = Aggregator::start(
        &db,
        0,
        &["--analytics-interval", "1h"]
            .into_iter()
            .chain(receiver.flags().iter().map(String::as_str))
            .collect::<Vec<_>>(),
    )
    .await;
    let trace = dir.path().join("trace.csv");
    let start = (chrono::Utc::now() - chrono::Duration::minutes(10))
        .format("%Y-%m-%dT%H:%M:00Z")
        .to_string();
    common::simulate(&trace, "gpu-h100-02", &start, "3m");
    let token = token_file(dir.path(), ADMIN_TOKEN);
    let shipped = gpuledger()
        .args(["exporter", "--source", "replay", "--speed", "max", "--once"])
        .args(["--node", "gpu-h100-02", "--listen", "127.0.0.1:0"])
        .arg("--replay-file")
        .arg(&trace)
        .args(["--aggregator", &aggregator.url()])
        .arg("--token-file")
        .arg(&token)
        .arg("--spool-dir")
        .arg(dir.path().join("spool"))
        .status()
        .unwrap();
    assert!(shipped.success());
    let (status, _) = aggregator.evaluate(ADMIN_TOKEN).await;
    assert_eq!(status, 200);

    // Retention and the first analytics pass may still be settling: compare until a scrape and
    // the push after it agree (each comparison is exact), for at most 20 pushes.
    let mut diff = Vec::new();
    for _ in 0..20 {
        let seen = receiver.metric_pushes();
        let text = aggregator.metrics_accepting(ADMIN_TOKEN, OPENMETRICS).await;
        let push = receiver.metrics_push_after(seen).await;
        assert_eq!(
            push.headers.get("x-test-key").map(|v| v.to_str().unwrap()),
            Some("s3cret")
        );
        diff = differences(&text, &push.body);
        if diff.is_empty() {
            let (series, _, resource) = from_push(&push.body);
            assert_eq!(resource["service.name"], "gpuledger-aggregator");
            assert!(
                series
                    .keys()
                    .any(|(n, a)| n == "gpuledger_tenant_allocated_gpu_equivalents"
                        && a.contains_key("tenant")),
                "the ledger families are pushed: {:?}",
                series.keys().map(|k| &k.0).collect::<BTreeSet<_>>()
            );
            assert!(
                series[&(
                    "gpuledger_aggregator_ingest_samples".to_owned(),
                    BTreeMap::new()
                )] > 0.0
            );
            break;
        }
    }
    assert!(
        diff.is_empty(),
        "the push differs from /metrics:\n{}",
        diff.join("\n")
    );

    // Spans: every ingest request, each writer commit and the evaluation, with attributes.
    let spans = eventually("the spans", Duration::from_secs(30), async || {
        let inbox = receiver.inbox.lock().unwrap();
        let spans: Vec<(String, BTreeMap<String, String>)> = inbox
            .traces
            .iter()
            .flat_map(|r| &r.body.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| (s.name.clone(), attrs(&s.attributes)))
            .collect();
        let names: BTreeSet<&str> = spans.iter().map(|(n, _)| n.as_str()).collect();
        ["ingest", "writer.commit", "analytics.evaluate"]
            .iter()
            .all(|n| names.contains(n))
            .then_some(spans)
    })
    .await;
    let stored: u64 = spans
        .iter()
        .filter(|(n, _)| n == "ingest")
        .map(|(_, a)| {
            assert_eq!(a["node"], "gpu-h100-02");
            a["stored"].parse::<u64>().unwrap()
        })
        .sum();
    let samples_stored = aggregator
        .value("gpuledger_aggregator_ingest_samples_total")
        .await
        .unwrap();
    assert_eq!(
        stored as f64, samples_stored,
        "the ingest spans add up to what was stored"
    );
    let traces_headers = &receiver.inbox.lock().unwrap().traces[0].headers;
    assert_eq!(
        traces_headers
            .get("x-test-key")
            .map(|v| v.to_str().unwrap()),
        Some("s3cret")
    );
    aggregator.terminate();
}

/// Bad OTLP settings are refused before anything starts, naming the setting.
#[test]
fn bad_otlp_settings_are_named() {
    for (args, key) in [
        (vec!["--otlp-endpoint", "collector:4318"], "otlp_endpoint"),
        (vec!["--otlp-interval", "5s"], "otlp_endpoint"),
        (
            vec![
                "--otlp-endpoint",
                "http://c:4318",
                "--otlp-header",
                "bad name=x",
            ],
            "otlp_header",
        ),
    ] {
        let out = gpuledger()
            .args(["aggregator", "--check-config"])
            .args(&args)
            .env("GPULEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(key),
            "{args:?}: {err}"
        );
    }
    let out = gpuledger()
        .args(["aggregator", "--check-config"])
        .env("GPULEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
        .env(
            "GPULEDGER_AGGREGATOR_OTLP_ENDPOINT",
            "http://collector:4318",
        )
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("OTLP push to http://collector:4318 every 1m"),
        "{said}"
    );
}

/// The `[otlp]` blocks of the example configs, uncommented, are accepted as documented.
#[test]
fn the_example_otlp_blocks_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("admin {ADMIN_TOKEN}\n")).unwrap();
    for name in ["aggregator", "exporter"] {
        let example =
            std::fs::read_to_string(common::root().join(format!("deploy/config/{name}.toml")))
                .unwrap();
        let block = example
            .split_once("# [otlp]\n")
            .unwrap_or_else(|| panic!("{name}.toml has no commented [otlp] block"))
            .1;
        let otlp: String = block
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .map(|l| format!("{l}\n"))
            .collect();
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, format!("[otlp]\n{otlp}")).unwrap();
        let out = match name {
            "aggregator" => gpuledger()
                .args(["aggregator", "--check-config", "--token-file"])
                .arg(&tokens)
                .arg("--config")
                .arg(&config)
                .output()
                .unwrap(),
            // The exporter has no --check-config: with --once and no aggregator it stops at
            // that check, after the config file (and its [otlp] table) was read and resolved.
            _ => gpuledger()
                .args([
                    "exporter",
                    "--source",
                    "replay",
                    "--replay-file",
                    "/nonexistent.csv",
                ])
                .args([
                    "--once",
                    "--node",
                    "n",
                    "--listen",
                    "127.0.0.1:0",
                    "--config",
                ])
                .arg(&config)
                .output()
                .unwrap(),
        };
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        match name {
            "aggregator" => assert!(
                out.status.success()
                    && said.contains("OTLP push to http://otel-collector:4318 every 1m"),
                "{said}"
            ),
            _ => assert!(said.contains("--once needs --aggregator"), "{said}"),
        }
    }
}
