//! The OTLP push settings of `exporter` and `aggregator`, declared once ([`OtlpOptions`]): each
//! is a flag (`--otlp-endpoint`, …) and a key of the config file's `[otlp]` table, layered by
//! `gpuledger_schema::options`; [`OtlpOptions::resolve`] checks them into an [`OtlpConfig`].

use std::time::Duration;

use gpuledger_schema::options::{duration, pair, pairs};
use serde::{Deserialize, Serialize};

use crate::{DEFAULT_INTERVAL, DEFAULT_TIMEOUT, Error, OtlpConfig};

/// Where to push metrics (and the aggregator's traces) over OTLP/HTTP.
#[derive(Debug, Default, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpOptions {
    /// Push the metrics (the aggregator: and its traces) to this OTLP/HTTP collector, given as
    /// its base URL (http://otel-collector:4318); /v1/metrics and /v1/traces are appended.
    #[arg(long = "otlp-endpoint", value_name = "URL")]
    pub endpoint: Option<String>,
    /// A header for every OTLP request, as NAME=VALUE; repeatable (config file: the
    /// `[otlp.headers]` table).
    #[arg(long = "otlp-header", value_name = "NAME=VALUE", value_parser = pair::<String>)]
    #[serde(with = "pairs")]
    pub headers: Vec<(String, String)>,
    /// How often the metrics are pushed.
    #[arg(long = "otlp-interval", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub interval: Option<Duration>,
    /// Time limit of one OTLP request, at most the interval.
    #[arg(long = "otlp-timeout", value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub timeout: Option<Duration>,
}

/// The defaults of the OTLP options, as the help shows them
/// ([`crate::process::with_defaults`]).
pub fn shown_defaults() -> Vec<(&'static str, String)> {
    use crate::process::shown_duration;
    vec![
        ("interval", shown_duration(DEFAULT_INTERVAL)),
        (
            "timeout",
            format!(
                "{}, or the interval when shorter",
                shown_duration(DEFAULT_TIMEOUT)
            ),
        ),
    ]
}

impl OtlpOptions {
    /// The checked settings; `None` when no endpoint is set. Settings without an endpoint are an
    /// error: they would silently do nothing.
    pub fn resolve(self) -> Result<Option<OtlpConfig>, Error> {
        let Some(endpoint) = self.endpoint else {
            if !self.headers.is_empty() || self.interval.is_some() || self.timeout.is_some() {
                return Err(Error::Config {
                    key: "endpoint",
                    reason: "otlp_header, otlp_interval and otlp_timeout need an endpoint".into(),
                });
            }
            return Ok(None);
        };
        let interval = self.interval.unwrap_or(DEFAULT_INTERVAL);
        Ok(Some(OtlpConfig::new(
            endpoint,
            self.headers.into_iter().collect(),
            interval,
            // A short interval shortens the default time limit with it.
            self.timeout.unwrap_or(DEFAULT_TIMEOUT.min(interval)),
        )?))
    }
}

/// For `--check-config`: where the push goes, or nothing.
pub fn summary(otlp: Option<&OtlpConfig>) -> String {
    otlp.map(|o| {
        format!(
            ", OTLP push to {} every {}",
            o.endpoint,
            humantime::format_duration(o.interval)
        )
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_bad_settings_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("otlp.toml");
        std::fs::write(
            &file,
            "endpoint = \"http://collector:4318\"\ninterval = \"15s\"\n[headers]\nx-api-key = \"a\"\nx-scope = \"b\"\n",
        )
        .unwrap();
        let flags = OtlpOptions {
            headers: vec![("x-api-key".into(), "c".into())],
            timeout: Some(Duration::from_secs(2)),
            ..OtlpOptions::default()
        };
        let c = gpuledger_schema::options::layered(&flags, Some(&file))
            .unwrap()
            .resolve()
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318");
        assert_eq!(c.interval, Duration::from_secs(15));
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert_eq!(
            c.headers.clone().into_iter().collect::<Vec<_>>(),
            [
                ("x-api-key".into(), "c".into()),
                ("x-scope".into(), "b".into())
            ]
        );
        assert!(OtlpOptions::default().resolve().unwrap().is_none());
        let e = OtlpOptions {
            interval: Some(Duration::from_secs(5)),
            ..OtlpOptions::default()
        }
        .resolve()
        .unwrap_err();
        assert!(e.to_string().starts_with("otlp_endpoint"), "{e}");
        assert_eq!(
            summary(Some(&c)),
            ", OTLP push to http://collector:4318 every 15s"
        );
    }
}
