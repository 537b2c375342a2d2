//! The exporter's command line, the same for `gpuledger-exporter` and `gpuledger exporter`: its
//! options are declared, layered and checked in [`crate::options`]; this only runs the daemon.

use std::path::PathBuf;

use crate::daemon;
use crate::options::{ExporterOptions, sources_help};

/// Flags of the exporter. Every flag can also be set in `--config FILE` (TOML, the flag's long
/// name with `_` for `-`) and as `GPULEDGER_EXPORTER_<FLAG>`; a flag on the command line wins,
/// then the environment, then the file.
#[derive(Debug, clap::Args)]
#[command(after_help = sources_help())]
pub struct Args {
    #[command(flatten)]
    options: ExporterOptions,
    /// TOML file with any of these flags.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Runs the exporter until SIGTERM/SIGINT (or, with --once, until the trace is shipped). Sets up
/// logging.
pub fn run(args: Args) -> anyhow::Result<()> {
    let config = args.options.over_file(args.config.as_deref())?.resolve()?;
    gpuledger_otel::init_logging(None);
    gpuledger_otel::process::runtime()?.block_on(daemon::run(
        config,
        gpuledger_otel::process::shutdown_signal(),
    ))?;
    Ok(())
}
