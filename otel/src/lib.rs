//! OpenTelemetry for gpuledger: its metrics, and the aggregator's traces, pushed over OTLP/HTTP
//! (protobuf) to any collector, with `opentelemetry-otlp`.
//!
//! Key design decision: `/metrics` stays the one source of truth. The push does not keep a
//! second set of instruments beside the `prometheus-client` families; each family becomes one
//! OpenTelemetry asynchronous instrument whose callback reads the very text `/metrics` serves
//! ([`metrics`]), so a scrape and a push taken at the same moment carry the same names, labels
//! and values. How a family maps (names, units, types) is in [`metrics`]; docs/otlp.md,
//! "OpenTelemetry (OTLP)" is the operator's view.
//!
//! The crate also holds what every role's process shares beside its telemetry: [`process`]
//! (environment variables, signals, the runtime) and [`serve`] (the HTTP listener, with its
//! header read timeout and connection bound).
#![warn(missing_docs)]

pub mod metrics;
pub mod options;
pub mod process;
pub mod serve;
pub mod traces;

use std::collections::BTreeMap;
use std::time::Duration;

pub use metrics::MetricsPush;
pub use options::{OtlpOptions, summary};
pub use traces::Traces;

/// Where and how often to push. The collector's base URL gets the standard OTLP/HTTP paths
/// (`/v1/metrics`, `/v1/traces`), as `OTEL_EXPORTER_OTLP_ENDPOINT` would.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// Base URL of the collector's OTLP/HTTP receiver, e.g. `http://otel-collector:4318`.
    pub endpoint: String,
    /// Headers sent with every request (an API key, a tenant id).
    pub headers: BTreeMap<String, String>,
    /// How often metrics are pushed.
    pub interval: Duration,
    /// Time limit of one request.
    pub timeout: Duration,
}

/// Default push interval: the OpenTelemetry SDK's own default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Default request time limit: the OTLP exporter's own default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A setting that cannot work; the message names the setting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad endpoint, header, interval or timeout.
    #[error("otlp_{key}: {reason}")]
    Config {
        /// The setting (`endpoint`, `header`, `interval`, `timeout`).
        key: &'static str,
        /// Why it cannot work.
        reason: String,
    },
    /// The OTLP exporter refused to build.
    #[error("OTLP exporter: {0}")]
    Build(String),
}

fn config_error(key: &'static str, reason: impl Into<String>) -> Error {
    Error::Config {
        key,
        reason: reason.into(),
    }
}

impl OtlpConfig {
    /// Checks every setting: an `http://` or `https://` endpoint without query or fragment,
    /// header names and values HTTP allows, an interval of at least one second and a timeout
    /// shorter than the interval.
    pub fn new(
        endpoint: String,
        headers: BTreeMap<String, String>,
        interval: Duration,
        timeout: Duration,
    ) -> Result<OtlpConfig, Error> {
        let rest = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"))
            .ok_or_else(|| {
                config_error("endpoint", format!("{endpoint:?} is not an http(s) URL"))
            })?;
        if rest.is_empty() || rest.contains(['?', '#', ' ']) {
            return Err(config_error(
                "endpoint",
                format!("{endpoint:?}: give the collector's base URL (no query, no fragment)"),
            ));
        }
        for (name, value) in &headers {
            let name_ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !name_ok {
                return Err(config_error(
                    "header",
                    format!("{name:?} is not an HTTP header name"),
                ));
            }
            if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                return Err(config_error(
                    "header",
                    format!("the value of {name:?} has a control character"),
                ));
            }
        }
        if interval < Duration::from_secs(1) {
            return Err(config_error("interval", "must be at least 1s"));
        }
        if timeout.is_zero() || timeout > interval {
            return Err(config_error(
                "timeout",
                "must be above zero and at most the interval",
            ));
        }
        Ok(OtlpConfig {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            headers,
            interval,
            timeout,
        })
    }

    fn signal_url(&self, signal: &str) -> String {
        format!("{}/v1/{signal}", self.endpoint)
    }

    fn headers_map(&self) -> std::collections::HashMap<String, String> {
        self.headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Who is pushing: the OpenTelemetry resource on every metric and span.
#[derive(Debug, Clone)]
pub struct Service {
    /// `service.name`: `gpuledger-exporter` or `gpuledger-aggregator`.
    pub name: &'static str,
    /// `service.instance.id`: the node name of an exporter; host name and port of an aggregator.
    pub instance: String,
}

impl Service {
    /// An exporter: its instance is the node.
    pub fn exporter(node: &str) -> Service {
        Service {
            name: "gpuledger-exporter",
            instance: node.to_owned(),
        }
    }

    /// An aggregator: its instance is this host's name and the port it listens on (the listen
    /// address alone is usually `0.0.0.0:9836` on every cluster, and two aggregators pushing to
    /// one collector must not look like one).
    pub fn aggregator(listen: std::net::SocketAddr) -> Service {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| listen.ip().to_string());
        Service {
            name: "gpuledger-aggregator",
            instance: format!("{host}:{}", listen.port()),
        }
    }

    fn resource(&self) -> opentelemetry_sdk::Resource {
        use opentelemetry::KeyValue;
        opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(self.name)
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("service.instance.id", self.instance.clone()),
            ])
            .build()
    }
}

/// Installs the process's log output (standard error, `RUST_LOG`, default `info`) and, when
/// given, the layer that turns `tracing` spans into OpenTelemetry spans for `traces`. The two
/// are filtered apart: spans at INFO and above are exported whatever `RUST_LOG` says, so quiet
/// logs do not mean missing traces.
pub fn init_logging(traces: Option<&Traces>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    // The SDK's and its HTTP client's own events stay out of the spans: exporting them would
    // feed the exporter with itself. A target matches by prefix, so "opentelemetry" covers
    // opentelemetry_sdk, opentelemetry-otlp and opentelemetry-http.
    let off = tracing_subscriber::filter::LevelFilter::OFF;
    let spans = tracing_subscriber::filter::Targets::new()
        .with_default(tracing::Level::INFO)
        .with_target("opentelemetry", off)
        .with_target("reqwest", off)
        .with_target("hyper", off);
    let otel = traces.map(|t| {
        tracing_opentelemetry::layer()
            .with_tracer(t.tracer())
            .with_filter(spans)
    });
    // A second call (tests run several services in one process) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(endpoint: &str, header: (&str, &str), interval: u64) -> Result<OtlpConfig, Error> {
        OtlpConfig::new(
            endpoint.into(),
            [(header.0.to_owned(), header.1.to_owned())].into(),
            Duration::from_secs(interval),
            Duration::from_secs(1),
        )
    }

    #[test]
    fn settings_are_checked_and_errors_name_them() {
        let ok = cfg("http://collector:4318/", ("x-api-key", "k"), 15).unwrap();
        assert_eq!(ok.signal_url("metrics"), "http://collector:4318/v1/metrics");
        for (c, key) in [
            (cfg("collector:4318", ("a", "b"), 15), "otlp_endpoint"),
            (cfg("http://c:4318/?x=1", ("a", "b"), 15), "otlp_endpoint"),
            (cfg("http://c:4318", ("bad name", "b"), 15), "otlp_header"),
            (cfg("http://c:4318", ("a", "b\nc"), 15), "otlp_header"),
            (cfg("http://c:4318", ("a", "b"), 0), "otlp_interval"),
        ] {
            let e = c.unwrap_err().to_string();
            assert!(e.starts_with(key), "{e}");
        }
    }
}
