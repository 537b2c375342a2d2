//! `gpuledger aggregator`, `gpuledger import` and `gpuledger export`: the central ledger and the
//! tools that fill it from traces and take it elsewhere as Parquet.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use gpuledger_aggregator::analytics::Settings as AnalyticsSettings;
use gpuledger_aggregator::auth::Tokens;
use gpuledger_aggregator::export::{self, ExportOptions};
use gpuledger_aggregator::import::{self, ImportOptions};
use gpuledger_aggregator::reclaim::config::{AlertmanagerFile, ReclaimFile, WebhookFile};
use gpuledger_aggregator::store::Retention;
use gpuledger_aggregator::{Config, Limits};
use serde::Deserialize;

use super::duration;

/// Flags of `gpuledger aggregator`. Every flag can also be set in `--config FILE` (TOML, the
/// flag's long name with `_` for `-`); a flag on the command line wins.
#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// The DuckDB ledger file, created with its schema on first start
    /// [default: /var/lib/gpuledger/ledger.duckdb].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_DB")]
    db: Option<PathBuf>,
    /// Address of the API, /metrics and the probes [default: 0.0.0.0:9836].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_LISTEN")]
    listen: Option<SocketAddr>,
    /// TOML file with any of these flags.
    #[arg(long, env = "GPULEDGER_AGGREGATOR_CONFIG")]
    config: Option<PathBuf>,
    /// Token file: one `<scope> <token>` per line, scope node:NAME, node:*, viewer,
    /// tenant:NAME or admin.
    /// GPULEDGER_ADMIN_TOKEN in the environment adds an admin token.
    #[arg(long, env = "GPULEDGER_AGGREGATOR_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// How long raw 1 s samples are kept [default: 48h].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_RAW_RETENTION")]
    raw_retention: Option<humantime::Duration>,
    /// How long the minute, hour and tenant rollups are kept [default: 400days].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_ROLLUP_RETENTION")]
    rollup_retention: Option<humantime::Duration>,
    /// How often retention runs [default: 10m].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_RETENTION_INTERVAL")]
    retention_interval: Option<humantime::Duration>,
    /// Largest ingest body in bytes, as sent (gzip) [default: 4194304].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// Samples accepted but not yet written before ingest answers 503 [default: 2000000].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_QUEUE_SAMPLES")]
    queue_samples: Option<usize>,
    /// How far in the future a sample may be [default: 5m].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_MAX_FUTURE_SKEW")]
    max_future_skew: Option<humantime::Duration>,
    /// DuckDB's memory limit, in DuckDB's syntax [default: 1GB].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_MEMORY_LIMIT")]
    memory_limit: Option<String>,
    /// A minute of an allocation is idle when its mean SM activity is below this [default: 0.05].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_IDLE_THRESHOLD")]
    idle_threshold: Option<f64>,
    /// How long an idle run lasts before it is a hoarding episode [default: 30m].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_HOARDING_WINDOW")]
    hoarding_window: Option<humantime::Duration>,
    /// How often hoarding and fragmentation are evaluated, then the reclaim policy [default: 15s].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_ANALYTICS_INTERVAL")]
    analytics_interval: Option<humantime::Duration>,
    /// Price of a GPU-hour for models without an entry in the config file's [prices] [default: 0].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_DEFAULT_PRICE")]
    default_price: Option<f64>,
    /// Currency the prices are in, shown beside costs [default: USD].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_CURRENCY")]
    currency: Option<String>,
    /// Directory `POST /api/v1/export` (`gpuledger export --aggregator`) writes Parquet into,
    /// while the aggregator runs [default: none, the endpoint is off].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_EXPORT_DIR")]
    export_dir: Option<PathBuf>,
    /// Ingest admission and batch limits (config file: the `[limits]` table).
    #[command(flatten)]
    limits: LimitFlags,
    /// Check the flags, the config file, the token file and the webhook secrets, print a summary
    /// and exit (0: the aggregator would start with them).
    #[arg(long)]
    check_config: bool,
}

/// The ingest limits added with admission control, declared once: each is a flag and a key of
/// the config file's `[limits]` table (a flag wins). Defaults: `gpuledger_aggregator::Limits`.
#[derive(Debug, Default, Clone, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitFlags {
    /// Samples plus share seconds one batch may hold; the decoded size and JSON values a body
    /// may have follow from it (schema/WIRE.md) [default: 50000].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_MAX_BATCH_SAMPLES")]
    max_batch_samples: Option<usize>,
    /// Instances (MIG slices, whole GPUs) one node may have in the ledger; a batch adding more
    /// gets 422 [default: 256].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_MAX_INSTANCES_PER_NODE")]
    max_instances_per_node: Option<usize>,
    /// Ingest requests in flight at once [default: 64].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_INGEST_SLOTS")]
    ingest_slots: Option<usize>,
    /// Ingest requests one token may have in flight; more get 429 [default: 16].
    #[arg(long, env = "GPULEDGER_AGGREGATOR_INGEST_SLOTS_PER_TOKEN")]
    ingest_slots_per_token: Option<usize>,
    /// How long an ingest body may take to arrive before 408 [default: 10s].
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_opt")]
    body_read_timeout: Option<std::time::Duration>,
}

impl LimitFlags {
    /// These flags over `file`'s.
    fn or(self, file: LimitFlags) -> LimitFlags {
        LimitFlags {
            max_batch_samples: self.max_batch_samples.or(file.max_batch_samples),
            max_instances_per_node: self.max_instances_per_node.or(file.max_instances_per_node),
            ingest_slots: self.ingest_slots.or(file.ingest_slots),
            ingest_slots_per_token: self.ingest_slots_per_token.or(file.ingest_slots_per_token),
            body_read_timeout: self.body_read_timeout.or(file.body_read_timeout),
        }
    }

    /// Applies the given ones to `limits`, checking each.
    fn apply(self, mut limits: Limits) -> anyhow::Result<Limits> {
        for (key, v) in [
            ("max_batch_samples", self.max_batch_samples),
            ("max_instances_per_node", self.max_instances_per_node),
            ("ingest_slots", self.ingest_slots),
            ("ingest_slots_per_token", self.ingest_slots_per_token),
        ] {
            anyhow::ensure!(v != Some(0), "{key} must be at least 1");
        }
        if let Some(n) = self.max_batch_samples {
            limits.batch.max_samples = n;
        }
        if let Some(n) = self.max_instances_per_node {
            limits.max_instances_per_node = n;
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

/// A humantime duration (`"10s"`) in the config file.
mod humantime_opt {
    use serde::Deserialize;

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<std::time::Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    db: Option<PathBuf>,
    listen: Option<SocketAddr>,
    token_file: Option<PathBuf>,
    export_dir: Option<PathBuf>,
    raw_retention: Option<String>,
    rollup_retention: Option<String>,
    retention_interval: Option<String>,
    max_body_bytes: Option<usize>,
    queue_samples: Option<usize>,
    max_future_skew: Option<String>,
    memory_limit: Option<String>,
    idle_threshold: Option<f64>,
    hoarding_window: Option<String>,
    analytics_interval: Option<String>,
    default_price: Option<f64>,
    currency: Option<String>,
    /// Price per GPU-hour by model (`"H100-80GB" = 2.49`, or the NVML name).
    #[serde(default)]
    prices: std::collections::HashMap<String, f64>,
    /// `[[price_book]]`: prices with effective dates and per-MIG-profile prices; declared and
    /// checked in `gpuledger_aggregator::analytics::prices`.
    #[serde(default)]
    price_book: Vec<gpuledger_aggregator::analytics::prices::PriceFile>,
    /// Demand mix per model (`[demand."H100-80GB"]` then `"1g.10gb" = 0.6` …); models not
    /// listed use the allocations observed over `demand_lookback`.
    #[serde(default)]
    demand: std::collections::HashMap<String, std::collections::HashMap<String, f64>>,
    demand_lookback: Option<String>,
    #[serde(default)]
    limits: LimitFlags,
    /// The reclaim policy (`[reclaim]`, `[reclaim.classes.*]`, `[[reclaim.overrides]]`,
    /// `[[reclaim.exemptions]]`); declared and checked in `gpuledger_aggregator::reclaim::config`.
    #[serde(default)]
    reclaim: ReclaimFile,
    /// `[[webhooks]]`: the receivers of the reclaim events.
    #[serde(default)]
    webhooks: Vec<WebhookFile>,
    /// `[alertmanager]`: push open episodes to Alertmanager.
    alertmanager: Option<AlertmanagerFile>,
    /// `[billing]`: cost mode, overhead sharing, and each tenant's team, org and budget;
    /// declared and checked in `gpuledger_aggregator::analytics::bill`.
    #[serde(default)]
    billing: gpuledger_aggregator::analytics::bill::BillingSettings,
    /// `[ui]`: the pages' sessions and a trusted proxy's user header; declared and checked in
    /// `gpuledger_aggregator::ui::session`.
    #[serde(default)]
    ui: gpuledger_aggregator::ui::session::UiFile,
}

fn tokens(file: Option<PathBuf>) -> anyhow::Result<Tokens> {
    let mut tokens = match file {
        Some(path) => Tokens::from_file(&path)?,
        None => Tokens::default(),
    };
    if let Ok(admin) = std::env::var("GPULEDGER_ADMIN_TOKEN")
        && !admin.is_empty()
    {
        tokens = tokens.with_admin(&admin)?;
    }
    anyhow::ensure!(
        !tokens.is_empty(),
        "no tokens: pass --token-file (or set GPULEDGER_ADMIN_TOKEN); ingest is authenticated"
    );
    Ok(tokens)
}

/// The configuration from flags over the config file over defaults.
fn config(args: Args) -> anyhow::Result<Config> {
    let file: FileConfig = super::config_file(args.config.as_deref())?;
    let defaults = Limits::default();
    let retention = Retention {
        raw_secs: duration(
            "raw_retention",
            args.raw_retention,
            file.raw_retention,
            48 * 3600,
        )?
        .as_secs() as i64,
        rollup_secs: duration(
            "rollup_retention",
            args.rollup_retention,
            file.rollup_retention,
            400 * 86400,
        )?
        .as_secs() as i64,
    };
    anyhow::ensure!(
        retention.raw_secs <= retention.rollup_secs,
        "--raw-retention must not be longer than --rollup-retention"
    );
    let defaults_a = AnalyticsSettings::default();
    let idle_threshold = args
        .idle_threshold
        .or(file.idle_threshold)
        .unwrap_or(defaults_a.idle_threshold);
    anyhow::ensure!(
        (0.0..=1.0).contains(&idle_threshold),
        "--idle-threshold {idle_threshold} is outside 0–1"
    );
    let prices = gpuledger_aggregator::analytics::prices::PriceBook::from_config(
        &file.prices,
        &file.price_book,
        args.default_price
            .or(file.default_price)
            .unwrap_or(defaults_a.prices.default_per_gpu_hour),
        args.currency
            .or(file.currency)
            .unwrap_or_else(|| defaults_a.prices.currency.clone()),
    )?;
    for (model, mix) in &file.demand {
        let known = gpuledger_schema::mig::model(model)
            .with_context(|| format!("demand.{model:?}: not a GPU model gpuledger knows"))?;
        for (profile, w) in mix {
            anyhow::ensure!(
                known.profile(profile).is_some(),
                "demand.{model:?}.{profile:?}: {} has no such MIG profile",
                known.key
            );
            anyhow::ensure!(
                w.is_finite() && *w >= 0.0,
                "demand.{model:?}.{profile:?} = {w} is not a weight"
            );
        }
    }
    let analytics = AnalyticsSettings {
        idle_threshold,
        window: duration(
            "hoarding_window",
            args.hoarding_window,
            file.hoarding_window,
            defaults_a.window.as_secs(),
        )?,
        interval: duration(
            "analytics_interval",
            args.analytics_interval,
            file.analytics_interval,
            defaults_a.interval.as_secs(),
        )?,
        prices,
        demand: file.demand,
        billing: file.billing,
        demand_lookback: duration(
            "demand_lookback",
            None,
            file.demand_lookback,
            defaults_a.demand_lookback.as_secs(),
        )?,
    };
    let tokens = tokens(args.token_file.or(file.token_file))?;
    let reclaim = file
        .reclaim
        .resolve(file.webhooks, file.alertmanager)
        .context("the config file's reclaim settings")?;
    Ok(Config {
        analytics,
        reclaim,
        ui: file.ui.resolve().map_err(anyhow::Error::msg)?,
        export_dir: args.export_dir.or(file.export_dir),
        db: args
            .db
            .or(file.db)
            .unwrap_or_else(|| "/var/lib/gpuledger/ledger.duckdb".into()),
        listen: args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| "0.0.0.0:9836".parse().expect("a valid address")),
        tokens,
        retention,
        retention_interval: duration(
            "retention_interval",
            args.retention_interval,
            file.retention_interval,
            600,
        )?,
        limits: args.limits.or(file.limits).apply(Limits {
            max_body_bytes: args
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(defaults.max_body_bytes),
            queue_samples: args
                .queue_samples
                .or(file.queue_samples)
                .unwrap_or(defaults.queue_samples),
            max_future_skew: duration(
                "max_future_skew",
                args.max_future_skew,
                file.max_future_skew,
                defaults.max_future_skew.as_secs(),
            )?,
            duckdb_memory_limit: args
                .memory_limit
                .or(file.memory_limit)
                .unwrap_or(defaults.duckdb_memory_limit),
            ..defaults
        })?,
    })
}

/// Runs the aggregator until SIGINT/SIGTERM.
pub fn run(args: Args) -> anyhow::Result<()> {
    let check = args.check_config;
    let config = config(args)?;
    if check {
        let r = &config.reclaim;
        println!(
            "gpuledger aggregator: the configuration is valid: ledger {}, listen {}, reclaim {} ({}), {} webhook endpoint(s){}",
            config.db.display(),
            config.listen,
            r.classes
                .iter()
                .map(|(c, rule)| format!("{c}={}", rule.action.as_str()))
                .collect::<Vec<_>>()
                .join(" "),
            if r.dry_run { "dry run" } else { "acting" },
            r.endpoints.len(),
            if r.alertmanager.is_some() {
                ", Alertmanager push on"
            } else {
                ""
            },
        );
        return Ok(());
    }
    if let Some(dir) = config.db.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    super::runtime()?.block_on(gpuledger_aggregator::run(config, super::shutdown_signal()))?;
    Ok(())
}

/// Flags of `gpuledger import`.
#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The DuckDB ledger file (created if missing; not while an aggregator has it open: use
    /// --aggregator then).
    #[arg(
        long,
        required_unless_present = "aggregator",
        conflicts_with = "aggregator"
    )]
    db: Option<PathBuf>,
    /// A running aggregator's URL: the samples go through its ingest API, deduplicated like any
    /// batch (needs an `admin` or `node:*` token).
    #[arg(long, requires = "token_file")]
    aggregator: Option<String>,
    /// File holding the token, with --aggregator.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// How long raw samples are kept (older ones go to the rollups only).
    #[arg(long, default_value = "48h")]
    raw_retention: humantime::Duration,
    /// How long rollups are kept (older samples are refused).
    #[arg(long, default_value = "400days")]
    rollup_retention: humantime::Duration,
    /// Trace CSV files (schema/TRACE.md).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// Imports traces.
pub fn import(args: ImportArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let target = match (args.db, args.aggregator) {
        (Some(db), _) => import::Target::Ledger(db),
        (None, Some(url)) => {
            let path = args.token_file.context("--token-file")?;
            let token = std::fs::read_to_string(&path)
                .with_context(|| format!("--token-file {}", path.display()))?;
            import::Target::Aggregator {
                url,
                token: token.trim().to_owned(),
            }
        }
        (None, None) => anyhow::bail!("--db or --aggregator"),
    };
    let opts = ImportOptions {
        target,
        files: args.files,
        retention: Retention {
            raw_secs: args.raw_retention.as_secs() as i64,
            rollup_secs: args.rollup_retention.as_secs() as i64,
        },
        max_future_skew_secs: Limits::default().max_future_skew.as_secs() as i64,
        progress: std::io::stderr().is_terminal(),
    };
    let report = super::runtime()?.block_on(import::import(opts))?;
    eprintln!(
        "gpuledger import: {} file(s), {} samples: {} stored, {} already in the ledger.",
        report.files, report.samples, report.stored, report.duplicates
    );
    Ok(())
}

/// Flags of `gpuledger export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The DuckDB ledger file, opened read-only (not while an aggregator has it open: use
    /// --aggregator then).
    #[arg(
        long,
        required_unless_present = "aggregator",
        conflicts_with = "aggregator"
    )]
    db: Option<PathBuf>,
    /// Output directory: <DIR>/<table>/date=YYYY-MM-DD/<cluster>.parquet (with --db).
    #[arg(
        long,
        required_unless_present = "aggregator",
        conflicts_with = "aggregator"
    )]
    parquet: Option<PathBuf>,
    /// A running aggregator's URL: it exports into its own --export-dir (needs an admin token).
    #[arg(long, requires = "token_file")]
    aggregator: Option<String>,
    /// File holding the admin token, with --aggregator.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Start of the range (RFC 3339 or Unix seconds), inclusive; widened to its UTC day.
    #[arg(long)]
    from: String,
    /// End of the range (RFC 3339 or Unix seconds), exclusive; widened to the end of its UTC day.
    #[arg(long)]
    to: String,
    /// Also export raw 1 s samples (only those still in the raw window exist).
    #[arg(long)]
    raw: bool,
    /// Cluster name written into every row and file name [default: the ledger file's stem].
    #[arg(long)]
    cluster: Option<String>,
}

/// Exports Parquet: from the ledger file, or through a running aggregator.
pub fn export(args: ExportArgs) -> anyhow::Result<()> {
    if let Some(url) = &args.aggregator {
        return export_through(url, &args);
    }
    let time = |flag: &str, s: &str| {
        gpuledger_schema::trace::parse_timestamp(s)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("--{flag} {s:?}"))
    };
    let db = args.db.clone().context("--db")?;
    let cluster = match args.cluster {
        Some(c) => c,
        None => db
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ledger".into()),
    };
    let opts = ExportOptions {
        from: time("from", &args.from)?,
        to: time("to", &args.to)?,
        db,
        dir: args.parquet.context("--parquet")?,
        raw: args.raw,
        cluster,
    };
    print_report(&export::export(&opts)?);
    Ok(())
}

/// `POST /api/v1/export` on a running aggregator.
fn export_through(url: &str, args: &ExportArgs) -> anyhow::Result<()> {
    let path = args.token_file.as_ref().context("--token-file")?;
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("--token-file {}", path.display()))?;
    let body = serde_json::json!({
        "from": args.from,
        "to": args.to,
        "raw": args.raw,
        "cluster": args.cluster,
    });
    let rt = super::runtime()?;
    let report: export::ExportReport = rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{}/api/v1/export", url.trim_end_matches('/')))
            .bearer_auth(token.trim())
            .json(&body)
            .send()
            .await
            .with_context(|| format!("--aggregator {url}"))?;
        let status = r.status();
        let text = r.text().await?;
        anyhow::ensure!(
            status.is_success(),
            "the aggregator answered {status}: {text}"
        );
        serde_json::from_str(&text).context("the aggregator's export report")
    })?;
    print_report(&report);
    Ok(())
}

fn print_report(report: &export::ExportReport) {
    let day = |t: i64| {
        chrono::DateTime::from_timestamp(t, 0)
            .map(|d| d.format("%Y-%m-%d").to_string())
            .unwrap_or_default()
    };
    eprintln!(
        "gpuledger export: the UTC days {} to {} (exclusive), {} files",
        day(report.from),
        day(report.to),
        report.files
    );
    for (table, rows) in &report.tables {
        eprintln!("gpuledger export: {table}: {rows} rows");
    }
    for (table, date) in &report.kept {
        eprintln!(
            "gpuledger export: {table} {date}: kept the earlier export's file (the ledger no longer holds all of that day)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_from(toml: &str) -> anyhow::Result<Config> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("aggregator.toml");
        std::fs::write(&path, toml)?;
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "admin aaaaaaaaaaaaaaaaaaaa\n")?;
        config(Args {
            config: Some(path),
            token_file: Some(tokens),
            ..Args::default()
        })
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
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
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
        ] {
            let e = format!("{:#}", config_from(toml).unwrap_err());
            assert!(e.contains(says), "{toml}: {e}");
        }
    }
}
