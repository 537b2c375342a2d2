//! `gpuledger-exporter`: the node daemon alone, for every GPU node (no ledger, no DuckDB). The
//! same as `gpuledger exporter`.

use std::process::ExitCode;

/// Sample every MIG instance (or whole GPU) each second, attribute it, serve /metrics and ship
/// batches to the aggregator.
#[derive(Debug, clap::Parser)]
#[command(name = "gpuledger-exporter", version, about)]
struct Cli {
    #[command(flatten)]
    args: gpuledger_exporter::cli::Args,
}

fn main() -> ExitCode {
    let cli: Cli = match gpuledger_otel::process::parse(
        "exporter",
        &gpuledger_exporter::options::shown_defaults(),
    ) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match gpuledger_exporter::cli::run(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuledger-exporter: {e:#}");
            ExitCode::FAILURE
        }
    }
}
