//! Every option of `gpuledger aggregator`, declared once ([`AggregatorOptions`]): a flag, a key
//! of the `--config` TOML file and, through the binary, `GPULEDGER_AGGREGATOR_<FLAG>`
//! (`gpuledger_schema::options` says how they are layered). Tables that only a file can hold
//! (prices, the price book, demand, reclaim, webhooks, Alertmanager, billing, the pages) are
//! declared here too, as keys without flags. [`AggregatorOptions::resolve`] holds every check
//! and default, so that anything that builds a [`Config`] from options gets the same checks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuledger_schema::options::{self, duration};
use serde::{Deserialize, Serialize};

use crate::auth::Tokens;
use crate::auth::session::UiFile;
use crate::config::{
    Config, DEFAULT_DB, DEFAULT_RAW_RETENTION, DEFAULT_RETENTION_INTERVAL,
    DEFAULT_ROLLUP_RETENTION, Limits,
};
use gpuledger_ledger::analytics::Settings as AnalyticsSettings;
use gpuledger_ledger::analytics::bill::BillingSettings;
use gpuledger_ledger::analytics::energy::Settings as EnergySettings;
use gpuledger_ledger::analytics::prices::{PriceBook, PriceFile};
use gpuledger_ledger::analytics::rightsizing::Settings as RightsizingSettings;
use gpuledger_ledger::reclaim::config::{AlertmanagerFile, NotifyFile, ReclaimFile, WebhookFile};
use gpuledger_ledger::store::Retention;

/// The options of `gpuledger aggregator`. A flag on the command line wins over its environment
/// variable, which wins over the config file (TOML, the flag's long name with `_` for `-`).
#[derive(Debug, Default, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AggregatorOptions {
    /// The DuckDB ledger file, created with its schema on first start.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Address of the API, /metrics and the probes.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Token file: one `<scope> <token>` per line, scope node:NAME, node:*, viewer,
    /// tenant:NAME or admin.
    /// GPULEDGER_ADMIN_TOKEN in the environment adds an admin token.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// How long raw 1 s samples are kept.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub raw_retention: Option<Duration>,
    /// How long the minute, hour and tenant rollups are kept.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub rollup_retention: Option<Duration>,
    /// How often retention runs.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub retention_interval: Option<Duration>,
    /// Largest ingest body in bytes, as sent (gzip).
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Samples accepted but not yet written before ingest answers 503.
    #[arg(long)]
    pub queue_samples: Option<usize>,
    /// How far in the future a sample may be.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub max_future_skew: Option<Duration>,
    /// DuckDB's memory limit, in DuckDB's syntax.
    #[arg(long)]
    pub memory_limit: Option<String>,
    /// A minute of an allocation is idle when its mean SM activity is below this.
    #[arg(long)]
    pub idle_threshold: Option<f64>,
    /// How long an idle run lasts before it is a hoarding episode.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub hoarding_window: Option<Duration>,
    /// How often hoarding and fragmentation are evaluated, then the reclaim policy.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub analytics_interval: Option<Duration>,
    /// Price of a GPU-hour for models without an entry in the config file's [prices].
    #[arg(long)]
    pub default_price: Option<f64>,
    /// Currency the prices are in, shown beside costs.
    #[arg(long)]
    pub currency: Option<String>,
    /// Directory `POST /api/v1/export` (`gpuledger export --aggregator`) writes Parquet into,
    /// while the aggregator runs.
    #[arg(long)]
    pub export_dir: Option<PathBuf>,
    /// Ingest admission and batch limits (config file: the `[limits]` table).
    #[command(flatten)]
    pub limits: LimitOptions,
    /// OTLP push of the metrics and traces (config file: the `[otlp]` table).
    #[command(flatten)]
    pub otlp: gpuledger_otel::OtlpOptions,
    /// The listener's connection bound and header read timeout (config file: the `[http]` table).
    #[command(flatten)]
    pub http: gpuledger_otel::serve::HttpOptions,

    // Keys of the config file only: tables a command line cannot hold.
    /// How far back observed allocations make the MIG demand mix (a key of the file only; its
    /// default is `AnalyticsSettings::default().demand_lookback`, docs/aggregator.md).
    #[arg(skip)]
    #[serde(with = "duration")]
    pub demand_lookback: Option<Duration>,
    /// Price per GPU-hour by model (`"H100-80GB" = 2.49`, or the NVML name).
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub prices: HashMap<String, f64>,
    /// `[[price_book]]`: prices with effective dates and per-MIG-profile prices; declared and
    /// checked in [`gpuledger_ledger::analytics::prices`].
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub price_book: Vec<PriceFile>,
    /// Demand mix per model (`[demand."H100-80GB"]` then `"1g.10gb" = 0.6` …); models not
    /// listed use the allocations observed over `demand_lookback`.
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub demand: HashMap<String, HashMap<String, f64>>,
    /// The reclaim policy (`[reclaim]`, `[reclaim.classes.*]`, `[[reclaim.overrides]]`,
    /// `[[reclaim.exemptions]]`); declared and checked in [`gpuledger_ledger::reclaim::config`].
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub reclaim: ReclaimFile,
    /// `[[webhooks]]`: the receivers of the reclaim events.
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub webhooks: Vec<WebhookFile>,
    /// `[[notify]]`: chat channels sent a short message per event.
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub notify: Vec<NotifyFile>,
    /// `[alertmanager]`: push open episodes to Alertmanager.
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub alertmanager: Option<AlertmanagerFile>,
    /// `[billing]`: cost mode, overhead sharing, and each tenant's team, org and budget;
    /// declared and checked in [`gpuledger_ledger::analytics::bill`].
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub billing: BillingSettings,
    /// `[rightsizing]`: percentile, headrooms, minimum measured hours and per-class percentiles;
    /// declared and checked in [`gpuledger_ledger::analytics::rightsizing`].
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub rightsizing: RightsizingSettings,
    /// `[energy]`: carbon intensity, price per kWh and the split's idle floor per GPU model;
    /// declared and checked in [`gpuledger_ledger::analytics::energy`].
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub energy: EnergySettings,
    /// `[ui]`: the pages' sessions and a trusted proxy's user header; declared and checked in
    /// [`crate::ui::session`].
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub ui: UiFile,
}

/// The ingest limits added with admission control: each is a flag and a key of the config
/// file's `[limits]` table. Defaults: [`Limits`].
#[derive(Debug, Default, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitOptions {
    /// Samples plus share seconds one batch may hold; the decoded size and JSON values a body
    /// may have follow from it (schema/WIRE.md).
    #[arg(long)]
    pub max_batch_samples: Option<usize>,
    /// Instances (MIG slices, whole GPUs) one node may have in the ledger; a batch adding more
    /// gets 422.
    #[arg(long)]
    pub max_instances_per_node: Option<usize>,
    /// Instances the whole ledger may have, whatever the nodes; a batch adding more gets 422.
    #[arg(long)]
    pub max_instances: Option<usize>,
    /// Exemptions in force one tenant may have made through the API; one more gets 422.
    #[arg(long)]
    pub max_exemptions_per_tenant: Option<usize>,
    /// Ingest requests in flight at once.
    #[arg(long)]
    pub ingest_slots: Option<usize>,
    /// Ingest requests one token may have in flight; more get 429.
    #[arg(long)]
    pub ingest_slots_per_token: Option<usize>,
    /// How long an ingest body may take to arrive before 408.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub body_read_timeout: Option<Duration>,
}

/// The defaults of `gpuledger aggregator`'s options, as its help and docs/config.md show them
/// (`gpuledger_otel::process::with_defaults`): each from the constant or `Default` value that
/// [`AggregatorOptions::resolve`] fills in.
pub fn shown_defaults() -> Vec<(&'static str, String)> {
    use gpuledger_otel::process::shown_duration;
    let l = Limits::default();
    let a = AnalyticsSettings::default();
    let mut shown = vec![
        ("db", DEFAULT_DB.to_owned()),
        ("listen", DEFAULT_LISTEN.to_string()),
        ("raw_retention", shown_duration(DEFAULT_RAW_RETENTION)),
        ("rollup_retention", shown_duration(DEFAULT_ROLLUP_RETENTION)),
        (
            "retention_interval",
            shown_duration(DEFAULT_RETENTION_INTERVAL),
        ),
        ("max_body_bytes", l.max_body_bytes.to_string()),
        ("queue_samples", l.queue_samples.to_string()),
        ("max_future_skew", shown_duration(l.max_future_skew)),
        ("memory_limit", l.duckdb_memory_limit.clone()),
        ("idle_threshold", a.idle_threshold.to_string()),
        ("hoarding_window", shown_duration(a.window)),
        ("analytics_interval", shown_duration(a.interval)),
        ("default_price", a.prices.default_per_gpu_hour.to_string()),
        ("currency", a.prices.currency.clone()),
        ("export_dir", "none, the endpoint is off".to_owned()),
        ("max_batch_samples", l.batch.max_samples.to_string()),
        (
            "max_instances_per_node",
            l.max_instances_per_node.to_string(),
        ),
        ("max_instances", l.max_instances.to_string()),
        (
            "max_exemptions_per_tenant",
            l.max_exemptions_per_tenant.to_string(),
        ),
        ("ingest_slots", l.ingest_slots.to_string()),
        (
            "ingest_slots_per_token",
            l.ingest_slots_per_token.to_string(),
        ),
        ("body_read_timeout", shown_duration(l.body_read_timeout)),
    ];
    shown.extend(gpuledger_otel::options::shown_defaults());
    shown.extend(gpuledger_otel::serve::shown_defaults());
    shown
}

/// Where the aggregator listens when `--listen` is not given.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9836);

/// Options that cannot run; the message names the option (flag and file key alike).
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// The config file.
    #[error(transparent)]
    File(#[from] options::OptionsError),
    /// The OTLP settings.
    #[error(transparent)]
    Otlp(#[from] gpuledger_otel::Error),
    /// Any other option.
    #[error("{0}")]
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> OptionsError {
    OptionsError::Invalid(message.into())
}

impl LimitOptions {
    /// Applies the given ones to `limits`, checking each.
    fn apply(self, mut limits: Limits) -> Result<Limits, OptionsError> {
        for (key, v) in [
            ("max_batch_samples", self.max_batch_samples),
            ("max_instances_per_node", self.max_instances_per_node),
            ("max_instances", self.max_instances),
            ("max_exemptions_per_tenant", self.max_exemptions_per_tenant),
            ("ingest_slots", self.ingest_slots),
            ("ingest_slots_per_token", self.ingest_slots_per_token),
        ] {
            if v == Some(0) {
                return Err(invalid(format!("{key} must be at least 1")));
            }
        }
        if let Some(n) = self.max_batch_samples {
            limits.batch.max_samples = n;
        }
        if let Some(n) = self.max_instances_per_node {
            limits.max_instances_per_node = n;
        }
        if let Some(n) = self.max_instances {
            limits.max_instances = n;
        }
        if let Some(n) = self.max_exemptions_per_tenant {
            limits.max_exemptions_per_tenant = n;
        }
        if let Some(n) = self.ingest_slots {
            limits.ingest_slots = n;
        }
        if let Some(n) = self.ingest_slots_per_token {
            limits.ingest_slots_per_token = n;
        }
        if let Some(d) = self.body_read_timeout {
            limits.body_read_timeout = d;
        }
        Ok(limits)
    }
}

/// The token file's tokens, plus `GPULEDGER_ADMIN_TOKEN`; none at all is refused, since ingest
/// is authenticated.
fn tokens(file: Option<PathBuf>) -> Result<Tokens, OptionsError> {
    let mut tokens = match file {
        Some(path) => Tokens::from_file(&path).map_err(|e| invalid(e.to_string()))?,
        None => Tokens::default(),
    };
    if let Ok(admin) = std::env::var("GPULEDGER_ADMIN_TOKEN")
        && !admin.is_empty()
    {
        tokens = tokens
            .with_admin(&admin)
            .map_err(|e| invalid(e.to_string()))?;
    }
    if tokens.is_empty() {
        return Err(invalid(
            "no tokens: pass --token-file (or set GPULEDGER_ADMIN_TOKEN); ingest is authenticated",
        ));
    }
    Ok(tokens)
}

impl AggregatorOptions {
    /// These options (the flags) over the config file at `file`.
    pub fn over_file(&self, file: Option<&Path>) -> Result<AggregatorOptions, OptionsError> {
        Ok(options::layered(self, file)?)
    }

    /// Checks the options and fills in the defaults.
    pub fn resolve(self) -> Result<Config, OptionsError> {
        let defaults = Limits::default();
        let retention = Retention {
            raw_secs: self
                .raw_retention
                .unwrap_or(DEFAULT_RAW_RETENTION)
                .as_secs() as i64,
            rollup_secs: self
                .rollup_retention
                .unwrap_or(DEFAULT_ROLLUP_RETENTION)
                .as_secs() as i64,
        };
        if retention.raw_secs > retention.rollup_secs {
            return Err(invalid(
                "--raw-retention must not be longer than --rollup-retention",
            ));
        }
        let defaults_a = AnalyticsSettings::default();
        let idle_threshold = self.idle_threshold.unwrap_or(defaults_a.idle_threshold);
        if !(0.0..=1.0).contains(&idle_threshold) {
            return Err(invalid(format!(
                "--idle-threshold {idle_threshold} is outside 0–1"
            )));
        }
        let prices = PriceBook::from_config(
            &self.prices,
            &self.price_book,
            self.default_price
                .unwrap_or(defaults_a.prices.default_per_gpu_hour),
            self.currency
                .unwrap_or_else(|| defaults_a.prices.currency.clone()),
        )
        .map_err(|e| invalid(e.to_string()))?;
        for (model, mix) in &self.demand {
            let known = gpuledger_schema::mig::model(model).ok_or_else(|| {
                invalid(format!("demand.{model:?}: not a GPU model gpuledger knows"))
            })?;
            for (profile, w) in mix {
                if known.profile(profile).is_none() {
                    return Err(invalid(format!(
                        "demand.{model:?}.{profile:?}: {} has no such MIG profile",
                        known.key
                    )));
                }
                if !(w.is_finite() && *w >= 0.0) {
                    return Err(invalid(format!(
                        "demand.{model:?}.{profile:?} = {w} is not a weight"
                    )));
                }
            }
        }
        for (tenant, info) in &self.billing.tenants {
            if let Some(b) = info.monthly_budget
                && !(b.is_finite() && b > 0.0)
            {
                return Err(invalid(format!(
                    "billing.tenants.{tenant:?}.monthly_budget = {b} must be a positive amount"
                )));
            }
        }
        let analytics = AnalyticsSettings {
            idle_threshold,
            window: self.hoarding_window.unwrap_or(defaults_a.window),
            interval: self.analytics_interval.unwrap_or(defaults_a.interval),
            prices,
            demand: self.demand,
            billing: self.billing,
            demand_lookback: self.demand_lookback.unwrap_or(defaults_a.demand_lookback),
            snapshot_instances: defaults_a.snapshot_instances,
            rightsizing: self.rightsizing,
            energy: self.energy,
        };
        analytics.rightsizing.check().map_err(invalid)?;
        analytics.energy.check().map_err(invalid)?;
        // Tokens before the reclaim settings: a missing token file is the first thing to fix.
        let tokens = tokens(self.token_file)?;
        let reclaim = self
            .reclaim
            .resolve(self.webhooks, self.notify, self.alertmanager)
            .map_err(|e| invalid(format!("the config file's reclaim settings: {e:#}")))?;
        Ok(Config {
            analytics,
            reclaim,
            ui: self.ui.resolve().map_err(invalid)?,
            export_dir: self.export_dir,
            otlp: self.otlp.resolve()?,
            http: self.http.resolve().map_err(invalid)?,
            db: self.db.unwrap_or_else(|| DEFAULT_DB.into()),
            listen: self.listen.unwrap_or(DEFAULT_LISTEN),
            tokens,
            retention,
            retention_interval: self
                .retention_interval
                .unwrap_or(DEFAULT_RETENTION_INTERVAL),
            limits: self.limits.apply(Limits {
                max_body_bytes: self.max_body_bytes.unwrap_or(defaults.max_body_bytes),
                queue_samples: self.queue_samples.unwrap_or(defaults.queue_samples),
                max_future_skew: self.max_future_skew.unwrap_or(defaults.max_future_skew),
                duckdb_memory_limit: self.memory_limit.unwrap_or(defaults.duckdb_memory_limit),
                ..defaults
            })?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults once: each default the help shows, given back as its flag, resolves to what no
    /// flag resolves to. A default written into a doc comment, or a literal in `resolve()`,
    /// that disagrees with the constant fails here.
    #[test]
    fn the_defaults_shown_are_the_defaults_used() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            options: AggregatorOptions,
        }
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "admin aaaaaaaaaaaaaaaaaaaa\n").unwrap();
        // Described rather than values, or meaningless without an OTLP endpoint.
        let args = gpuledger_otel::process::defaults_as_flags(
            <Cli as clap::CommandFactory>::command(),
            &shown_defaults(),
            &["export_dir", "interval", "timeout"],
        );
        let given = <Cli as clap::Parser>::try_parse_from(&args)
            .unwrap()
            .options;
        let resolve = |o: AggregatorOptions| {
            AggregatorOptions {
                token_file: Some(tokens.clone()),
                ..o
            }
            .resolve()
            .unwrap()
        };
        let (a, b) = (resolve(given), resolve(AggregatorOptions::default()));
        assert_eq!(format!("{:?}", a.limits), format!("{:?}", b.limits));
        assert_eq!(
            (a.db, a.listen, a.http, a.retention_interval),
            (b.db, b.listen, b.http, b.retention_interval)
        );
        assert_eq!(
            (a.retention.raw_secs, a.retention.rollup_secs),
            (b.retention.raw_secs, b.retention.rollup_secs)
        );
        let (x, y) = (&a.analytics, &b.analytics);
        assert_eq!(
            (x.idle_threshold, x.window, x.interval),
            (y.idle_threshold, y.window, y.interval)
        );
        assert_eq!(
            (x.prices.default_per_gpu_hour, &x.prices.currency),
            (y.prices.default_per_gpu_hour, &y.prices.currency)
        );
    }

    fn config_from(toml: &str) -> Result<Config, OptionsError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aggregator.toml");
        std::fs::write(&path, toml).unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "admin aaaaaaaaaaaaaaaaaaaa\n").unwrap();
        AggregatorOptions {
            token_file: Some(tokens),
            ..AggregatorOptions::default()
        }
        .over_file(Some(&path))?
        .resolve()
    }

    /// Regression guard for the config loader over hostile files: seeded mutations of the shipped
    /// example never panic; a refusal says why; an accepted file gives limits the service can run
    /// with. (A seeded loop, not a property-testing crate: see `schema/tests/fuzz.rs` for why.)
    #[test]
    fn the_config_loader_refuses_clearly_or_yields_a_runnable_config() {
        const TOKENS: &[&str] = &[
            "\"",
            "=",
            "[",
            "]",
            "\n",
            "-1",
            "0",
            "1e999",
            "18446744073709551616",
            "\"soon\"",
            "[limits]\n",
            "[prices]\n",
            "max_batch_samples = 0\n",
            "ingest_slots = -3\n",
            "idle_threshold = nan\n",
            "body_read_timeout = \"-1s\"\n",
            "unknown_key = 1\n",
        ];
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        // The example's webhook secret is a systemd credential; here it is a file of ours.
        let secrets = tempfile::tempdir().unwrap();
        let secret = secrets.path().join("webhook-secret");
        std::fs::write(
            &secret,
            "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n",
        )
        .unwrap();
        let seed = std::fs::read_to_string(root.join("deploy/config/aggregator.toml"))
            .unwrap()
            .replace(
                "/run/credentials/gpuledger-aggregator.service/webhook-secret",
                secret.to_str().unwrap(),
            )
            .into_bytes();
        assert!(
            config_from(&String::from_utf8_lossy(&seed)).is_ok(),
            "the unmutated example loads"
        );
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1) as u64) as usize
        };
        let (mut accepted, mut refused) = (0, 0);
        for case in 0..300 {
            let mut text = seed.clone();
            for _ in 0..1 + next(4) {
                let at = next(text.len() + 1);
                let end = (at + next(30)).min(text.len());
                text.splice(at..end, TOKENS[next(TOKENS.len())].bytes());
            }
            let text = String::from_utf8_lossy(&text).into_owned();
            match config_from(&text) {
                Ok(c) => {
                    accepted += 1;
                    let l = &c.limits;
                    assert!(l.batch.max_samples >= 1, "case {case}:\n{text}");
                    assert!(
                        l.ingest_slots >= 1 && l.ingest_slots_per_token >= 1,
                        "case {case}"
                    );
                    assert!(l.max_instances_per_node >= 1, "case {case}");
                    assert!(
                        (0.0..=1.0).contains(&c.analytics.idle_threshold),
                        "case {case}"
                    );
                    assert!(
                        c.retention.raw_secs <= c.retention.rollup_secs,
                        "case {case}"
                    );
                }
                Err(e) => {
                    refused += 1;
                    assert!(!format!("{e:#}").is_empty(), "case {case}");
                }
            }
        }
        assert!(
            accepted > 0 && refused > 0,
            "{accepted} accepted, {refused} refused"
        );
    }

    #[test]
    fn analytics_settings_are_read_and_checked() {
        let c = config_from(
            "idle_threshold = 0.1\nhoarding_window = \"45m\"\ncurrency = \"EUR\"\n[prices]\n\"H100-80GB\" = 2.5\n[demand.\"H100-80GB\"]\n\"1g.10gb\" = 0.7\n\"3g.40gb\" = 0.3\n",
        )
        .unwrap();
        assert_eq!(c.analytics.idle_threshold, 0.1);
        assert_eq!(c.analytics.window.as_secs(), 45 * 60);
        assert_eq!(c.analytics.prices.currency, "EUR");
        assert_eq!(c.analytics.prices.entries[0].per_hour, 2.5);
        assert_eq!(c.analytics.demand["H100-80GB"]["3g.40gb"], 0.3);
        for (toml, says) in [
            ("idle_threshold = 1.5", "outside 0–1"),
            ("[prices]\n\"H100-80GB\" = -1.0", "is not a price"),
            ("[demand.\"B300\"]\n\"1g.10gb\" = 1.0", "not a GPU model"),
            (
                "[demand.\"H100-80GB\"]\n\"5g.50gb\" = 1.0",
                "no such MIG profile",
            ),
            ("hoarding_window = \"soon\"", "hoarding_window"),
            (
                "[limits]\nmax_batch_samples = 0",
                "max_batch_samples must be at least 1",
            ),
            (
                "[limits]\nbody_read_timeout = \"soon\"",
                "body_read_timeout",
            ),
            ("[limits]\nmax_bytes = 3", "unknown field `max_bytes`"),
            (
                "[billing.tenants.a]\nmonthly_budget = 0",
                "billing.tenants.\"a\".monthly_budget = 0 must be a positive amount",
            ),
            (
                "[rightsizing]\npercentile = 0",
                "rightsizing.percentile = 0 is outside (0, 1]",
            ),
        ] {
            let e = format!("{:#}", config_from(toml).unwrap_err());
            assert!(e.contains(says), "{toml}: {e}");
        }
    }
}
