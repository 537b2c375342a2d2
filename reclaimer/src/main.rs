//! `gpuledger-reclaimer`: the reclaimer alone, for the machine beside a scheduler (no ledger,
//! no DuckDB). The same as `gpuledger reclaimer`.

use std::process::ExitCode;

/// Verify signed reclaim webhooks and evict the pod, deactivate its Kueue Workload, or requeue
/// the Slurm job.
#[derive(Debug, clap::Parser)]
#[command(name = "gpuledger-reclaimer", version, about)]
struct Cli {
    #[command(flatten)]
    args: gpuledger_reclaimer::cli::Args,
}

fn main() -> ExitCode {
    let cli: Cli = match gpuledger_otel::process::parse("reclaimer", &[]) {
        Ok(cli) => cli,
        Err(code) => return code,
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
