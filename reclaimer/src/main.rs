//! `gpuledger-reclaimer`: the reclaimer alone, for the machine beside a scheduler (no ledger,
//! no DuckDB). The same as `gpuledger reclaimer`.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

/// Verify signed reclaim webhooks and evict the pod, deactivate its Kueue Workload, or requeue
/// the Slurm job.
#[derive(Debug, clap::Parser)]
#[command(name = "gpuledger-reclaimer", version, about)]
struct Cli {
    #[command(flatten)]
    args: gpuledger_reclaimer::cli::Args,
}

fn main() -> ExitCode {
    let command = gpuledger_otel::process::with_env(Cli::command(), "reclaimer");
    let cli = match command
        .clone()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => return gpuledger_otel::process::report_parse_error(&e, [&command]),
    };
    gpuledger_otel::init_logging(None);
    match gpuledger_reclaimer::cli::run(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuledger-reclaimer: {e:#}");
            ExitCode::FAILURE
        }
    }
}
