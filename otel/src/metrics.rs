//! The metrics push: every family of the OpenMetrics text that `/metrics` serves becomes one
//! OpenTelemetry asynchronous instrument, exported every interval by the SDK's periodic reader
//! through `opentelemetry-otlp` (OTLP/HTTP, protobuf, cumulative temporality).
//!
//! The mapping (docs/otlp.md, "OpenTelemetry (OTLP)"):
//!
//! | OpenMetrics family | OTLP metric |
//! | --- | --- |
//! | gauge `x` | gauge `x` |
//! | counter `x` (sample `x_total`) | monotonic cumulative sum `x` (no `_total`, as OTLP names go) |
//! | info `x` (sample `x_info`) | gauge `x_info`, value 1 |
//! | histogram `x` | monotonic cumulative sums `x_count`, `x_sum` and `x_bucket` (with `le`) |
//!
//! Labels become attributes of the same names and values. The unit is the family's `# UNIT`
//! in UCUM (`bytes` → `By`, `seconds` → `s`, `ratios` → `1`, …; one UCUM lacks as an annotation,
//! `{gpu_equivalents}`), and empty for a family without one. Histograms travel
//! as their three Prometheus series because the OpenTelemetry API has no asynchronous histogram;
//! nothing of them is lost.
//!
//! `prometheus-client` writes no `# TYPE` line for a labelled family that has no series yet, so
//! the instruments cannot all be made at start: a discovery thread renders every half interval
//! (between 1 s and 30 s) and makes the instruments of families it has not seen. A family's
//! first series is pushed from the collection after it was discovered. One rendering serves
//! every callback of one collection: a callback re-renders only when the text it holds is older
//! than [`FRESH`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuledger_schema::exposition::{self, Family, Kind};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{AsyncInstrument, MeterProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Stream};

use crate::{Error, OtlpConfig, Service};

/// Renders the OpenMetrics text to push: what `/metrics` would answer now.
pub type Source = Arc<dyn Fn() -> String + Send + Sync>;

/// How long one rendering is reused across the callbacks of a collection.
pub const FRESH: Duration = Duration::from_millis(500);

/// Series per instrument before the SDK folds the rest into one series marked
/// `otel.metric.overflow`: the larger of this and four times the family's series when its
/// instrument is made. The SDK reserves a hash table of that size per instrument up front (its
/// RSS grows with the limit), so the limit follows the family instead of being set once for all.
pub const MIN_CARDINALITY_LIMIT: usize = 10_000;

/// Each instrument's series limit, looked up by the view when the instrument is made.
type Limits = Arc<Mutex<std::collections::HashMap<String, usize>>>;

/// A running push; [`MetricsPush::shutdown`] pushes once more and stops it.
pub struct MetricsPush {
    provider: SdkMeterProvider,
    stop: std::sync::mpsc::Sender<()>,
    discovery: Option<std::thread::JoinHandle<()>>,
}

struct Snapshot {
    source: Source,
    last: Mutex<Option<(Instant, Arc<Vec<Family>>)>>,
}

impl Snapshot {
    fn families(&self) -> Arc<Vec<Family>> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, families)) = last.as_ref()
            && at.elapsed() < FRESH
        {
            return families.clone();
        }
        let families = Arc::new(read(&(self.source)()));
        *last = Some((Instant::now(), families.clone()));
        families
    }
}

fn read(text: &str) -> Vec<Family> {
    match exposition::parse(text) {
        Ok(f) => f,
        Err(e) => {
            // Our own rendering failed to parse: a bug, and this push carries nothing.
            tracing::error!(error = %e, "Cannot read the metrics for the OTLP push; nothing is pushed this time.");
            Vec::new()
        }
    }
}

/// The UCUM unit OTLP expects for an OpenMetrics unit; a unit UCUM does not know (such as
/// `gpu_equivalents`) becomes an annotation, `{gpu_equivalents}`, as OpenTelemetry's semantic
/// conventions write counted things.
pub fn ucum(unit: &str) -> String {
    match unit {
        "bytes" => "By",
        "seconds" => "s",
        "ratios" | "ratio" => "1",
        "amperes" => "A",
        "volts" => "V",
        "watts" => "W",
        "joules" => "J",
        "celsius" => "Cel",
        "grams" => "g",
        "meters" => "m",
        other => return format!("{{{other}}}"),
    }
    .to_owned()
}

/// One OTLP metric made from a family: its name, the sample name it reads, and whether it is a
/// monotonic sum (else a gauge).
struct Instrument {
    name: String,
    sample: String,
    sum: bool,
}

fn instruments(family: &Family) -> Vec<Instrument> {
    let one = |suffix: &str, name: &str, sum: bool| Instrument {
        name: name.to_owned(),
        sample: format!("{}{suffix}", family.name),
        sum,
    };
    match family.kind {
        Kind::Gauge => vec![one("", &family.name, false)],
        Kind::Counter => vec![one("_total", &family.name, true)],
        Kind::Info => vec![one("_info", &format!("{}_info", family.name), false)],
        Kind::Histogram => ["_count", "_sum", "_bucket"]
            .into_iter()
            .map(|s| one(s, &format!("{}{s}", family.name), true))
            .collect(),
        Kind::Other => Vec::new(),
    }
}

fn observe(snapshot: &Snapshot, family: &str, sample: &str, out: &dyn AsyncInstrument<f64>) {
    let families = snapshot.families();
    let Some(f) = families.iter().find(|f| f.name == family) else {
        return;
    };
    for s in f.samples.iter().filter(|s| s.name == sample) {
        let attributes: Vec<KeyValue> = s
            .labels
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        out.observe(s.value, &attributes);
    }
}

/// Makes the instruments of the families `known` does not hold yet.
fn register_new(
    meter: &opentelemetry::metrics::Meter,
    snapshot: &Arc<Snapshot>,
    limits: &Limits,
    known: &mut std::collections::HashSet<String>,
) {
    // A rendering of its own: the cache belongs to the collections, so that every callback of
    // one collection reads the same rendering.
    for family in read(&(snapshot.source)()).iter() {
        if !known.insert(family.name.clone()) {
            continue;
        }
        let unit = family.unit.as_deref().map(ucum).unwrap_or_default();
        for i in instruments(family) {
            let series = family.samples.iter().filter(|s| s.name == i.sample).count();
            limits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(i.name.clone(), MIN_CARDINALITY_LIMIT.max(4 * series));
            let (snap, fam, sample) = (snapshot.clone(), family.name.clone(), i.sample);
            let callback = move |o: &dyn AsyncInstrument<f64>| observe(&snap, &fam, &sample, o);
            if i.sum {
                meter
                    .f64_observable_counter(i.name)
                    .with_description(family.help.clone())
                    .with_unit(unit.clone())
                    .with_callback(callback)
                    .build();
            } else {
                meter
                    .f64_observable_gauge(i.name)
                    .with_description(family.help.clone())
                    .with_unit(unit.clone())
                    .with_callback(callback)
                    .build();
            }
        }
    }
}

impl MetricsPush {
    /// Starts pushing what `source` renders to `config.endpoint` + `/v1/metrics` every
    /// `config.interval`, as `service`.
    pub fn start(config: &OtlpConfig, service: &Service, source: Source) -> Result<Self, Error> {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(config.signal_url("metrics"))
            .with_timeout(config.timeout)
            .with_headers(config.headers_map())
            .build()
            .map_err(|e| Error::Build(e.to_string()))?;
        let limits = Limits::default();
        let reader = PeriodicReader::builder(exporter)
            .with_interval(config.interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(service.resource())
            .with_reader(reader)
            .with_view({
                let limits = limits.clone();
                move |i: &opentelemetry_sdk::metrics::Instrument| {
                    let limit = limits
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(i.name())
                        .copied()
                        .unwrap_or(MIN_CARDINALITY_LIMIT);
                    Stream::builder().with_cardinality_limit(limit).build().ok()
                }
            })
            .build();
        let meter = provider.meter("gpuledger");
        let snapshot = Arc::new(Snapshot {
            source,
            last: Mutex::new(None),
        });
        let mut known = std::collections::HashSet::new();
        register_new(&meter, &snapshot, &limits, &mut known);
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let every = (config.interval / 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
        let discovery = std::thread::Builder::new()
            .name("otlp-discovery".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(every)
                {
                    register_new(&meter, &snapshot, &limits, &mut known);
                }
            })
            .map_err(|e| Error::Build(format!("cannot start the discovery thread: {e}")))?;
        tracing::info!(
            endpoint = %config.endpoint,
            interval = ?config.interval,
            "Pushing metrics over OTLP/HTTP."
        );
        Ok(MetricsPush {
            provider,
            stop,
            discovery: Some(discovery),
        })
    }

    /// Pushes once more and stops.
    pub fn shutdown(mut self) {
        let _ = self.stop.send(());
        if let Some(d) = self.discovery.take() {
            let _ = d.join();
        }
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "The last OTLP metrics push failed.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_kind_maps_to_its_instruments() {
        let text = "# TYPE c counter\nc_total 1\n# TYPE g gauge\ng 2\n# TYPE i info\ni_info 1\n\
                    # TYPE h histogram\nh_sum 1\nh_count 1\nh_bucket{le=\"+Inf\"} 1\n# EOF\n";
        let got: Vec<(String, String, bool)> = read(text)
            .iter()
            .flat_map(instruments)
            .map(|i| (i.name, i.sample, i.sum))
            .collect();
        let want = [
            ("c", "c_total", true),
            ("g", "g", false),
            ("i_info", "i_info", false),
            ("h_count", "h_count", true),
            ("h_sum", "h_sum", true),
            ("h_bucket", "h_bucket", true),
        ];
        assert_eq!(
            got,
            want.map(|(a, b, c)| (a.to_owned(), b.to_owned(), c))
                .to_vec()
        );
        assert_eq!(ucum("bytes"), "By");
        assert_eq!(ucum("ratios"), "1");
        assert_eq!(ucum("gpu_equivalents"), "{gpu_equivalents}");
    }

    #[test]
    fn one_rendering_serves_a_whole_collection() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = calls.clone();
        let snapshot = Snapshot {
            source: Arc::new(move || {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                "# TYPE g gauge\ng 2\n# EOF\n".to_owned()
            }),
            last: Mutex::new(None),
        };
        for _ in 0..5 {
            assert_eq!(snapshot.families()[0].samples[0].value, 2.0);
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
