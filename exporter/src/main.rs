//! `gpuledger-exporter`: the node daemon alone, for every GPU node (no ledger, no DuckDB). The
//! same as `gpuledger exporter`.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

/// Sample every MIG instance (or whole GPU) each second, attribute it, serve /metrics and ship
/// batches to the aggregator.
#[derive(Debug, clap::Parser)]
#[command(name = "gpuledger-exporter", version, about)]
struct Cli {
    #[command(flatten)]
    args: gpuledger_exporter::cli::Args,
}

fn main() -> ExitCode {
    let command = gpuledger_otel::process::with_env(Cli::command(), "exporter");
    let cli = match command
        .clone()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => return gpuledger_otel::process::report_parse_error(&e, [&command]),
    };
    match gpuledger_exporter::cli::run(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuledger-exporter: {e:#}");
            ExitCode::FAILURE
        }
    }
}
