//! The subcommands.

mod aggregator;
mod demo;
mod exporter;
mod reclaimer;
mod simulate;

use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Who holds which GPU slice, how much of it they use, what it costs, and what to reclaim.
#[derive(Debug, Parser)]
#[command(name = "gpuledger", version = env!("GPULEDGER_BUILD"), about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node exporter: sample every MIG instance each second, serve /metrics, ship batches.
    Exporter(Box<exporter::Args>),
    /// Run the aggregator: authenticated ingest into the DuckDB ledger, rollups, retention.
    Aggregator(Box<aggregator::Args>),
    /// Run the reclaimer beside a scheduler: verify signed reclaim webhooks and evict the pod,
    /// deactivate its Kueue Workload, or requeue the Slurm job.
    Reclaimer(reclaimer::Args),
    /// Backfill trace CSVs into a ledger file or a running aggregator (every file is checked
    /// before anything is written).
    Import(aggregator::ImportArgs),
    /// Write a ledger's rollups (and raw samples) as Hive-partitioned Parquet, from the file or
    /// through a running aggregator.
    Export(aggregator::ExportArgs),
    /// Write a trace CSV from the deterministic fleet simulator.
    Simulate(simulate::Args),
    /// Run the simulated fleet end to end on this machine, with a month of history: the showback
    /// pages, the API and /metrics, ready in about a minute.
    Demo(demo::Args),
}

/// Runs the chosen subcommand.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Exporter(args) => exporter::run(*args),
        Command::Aggregator(args) => aggregator::run(*args),
        Command::Reclaimer(args) => reclaimer::run(args),
        Command::Import(args) => aggregator::import(args),
        Command::Export(args) => aggregator::export(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Demo(args) => demo::run(args),
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

/// A multi-threaded runtime for the services.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// A duration from the flag, else the config file (humantime text), else `default_secs`.
pub fn duration(
    key: &str,
    flag: Option<humantime::Duration>,
    file: Option<String>,
    default_secs: u64,
) -> anyhow::Result<Duration> {
    Ok(match (flag, file) {
        (Some(d), _) => d.into(),
        (None, Some(s)) => humantime::parse_duration(&s).with_context(|| format!("{key} {s:?}"))?,
        (None, None) => Duration::from_secs(default_secs),
    })
}

/// The `--config` TOML file of a subcommand, or its defaults when none is given.
pub fn config_file<T: serde::de::DeserializeOwned + Default>(
    path: Option<&std::path::Path>,
) -> anyhow::Result<T> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}
