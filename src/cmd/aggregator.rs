//! `gpuledger aggregator`, `gpuledger import` and `gpuledger export`: the central ledger and the
//! tools that fill it from traces and take it elsewhere as Parquet.

use std::path::PathBuf;

use anyhow::Context;
use gpuledger_aggregator::Limits;
use gpuledger_aggregator::options::AggregatorOptions;
use gpuledger_client::ingest::{IngestClient, IngestConfig, Sink};
use gpuledger_ledger::export::{self, ExportOptions};
use gpuledger_ledger::import::{self, ImportOptions};
use gpuledger_ledger::store::Retention;

/// Flags of `gpuledger aggregator`. Every flag can also be set in `--config FILE` (TOML, the
/// flag's long name with `_` for `-`) and as `GPULEDGER_AGGREGATOR_<FLAG>`; a flag on the command
/// line wins, then the environment, then the file.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    options: AggregatorOptions,
    /// TOML file with any of these flags, and the tables only a file holds (prices, reclaim,
    /// webhooks, billing, …; deploy/config/aggregator.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Check the flags, the config file, the token file and the webhook secrets, print a summary
    /// and exit (0: the aggregator would start with them).
    #[arg(long)]
    check_config: bool,
}

/// Runs the aggregator until SIGINT/SIGTERM.
pub fn run(args: Args) -> anyhow::Result<()> {
    let check = args.check_config;
    let options = args.options.over_file(args.config.as_deref())?;
    // Logging (and the span export) before the rest is checked: the checks warn (a token file
    // others can read, a reclaim rule on latency-critical work), and --check-config shows it.
    let traces = match options.otlp.clone().resolve()? {
        Some(otlp) if !check => {
            let listen = options
                .listen
                .unwrap_or(gpuledger_aggregator::options::DEFAULT_LISTEN);
            Some(gpuledger_otel::Traces::start(
                &otlp,
                &gpuledger_otel::Service::aggregator(listen),
            )?)
        }
        _ => None,
    };
    gpuledger_otel::init_logging(traces.as_ref());
    let config = options.resolve()?;
    if check {
        let r = &config.reclaim;
        println!(
            "gpuledger aggregator: the configuration is valid: ledger {}, listen {}, reclaim {} ({}), {} webhook endpoint(s){}{}",
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
            gpuledger_otel::summary(config.otlp.as_ref()),
        );
        return Ok(());
    }
    if let Some(dir) = config.db.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let served =
        super::runtime()?.block_on(gpuledger_aggregator::run(config, super::shutdown_signal()));
    if let Some(traces) = traces {
        traces.shutdown();
    }
    served?;
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
/// Attempts per batch when importing through a running aggregator: with the back-off's waits
/// (1, 2, 4, 8, 15 s…) a batch is given about a minute before the import stops.
const IMPORT_TRIES: usize = 8;

pub fn import(args: ImportArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let target = match (args.db, args.aggregator) {
        (Some(db), _) => import::Target::Ledger(db),
        (None, Some(url)) => {
            let path = args.token_file.context("--token-file")?;
            let token = std::fs::read_to_string(&path)
                .with_context(|| format!("--token-file {}", path.display()))?;
            let client = IngestClient::new(&IngestConfig {
                aggregator: url,
                token: token.trim().to_owned(),
                timeout: std::time::Duration::from_secs(60),
                user_agent: concat!("gpuledger-import/", env!("CARGO_PKG_VERSION")).into(),
            })?;
            import::Target::Aggregator(Box::new(Sink::new(client, IMPORT_TRIES)))
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
    /// Cluster name written into every row and file name (without it: the ledger file's stem).
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
