//! `gpuledger exporter`: its options are declared, layered and checked in
//! `gpuledger_exporter::options`; this file only runs the daemon.

use std::path::PathBuf;

use gpuledger_exporter::daemon;
use gpuledger_exporter::options::{ExporterOptions, sources_help};

/// Flags of `gpuledger exporter`. Every flag can also be set in `--config FILE` (TOML, the flag's
/// long name with `_` for `-`) and as `GPULEDGER_EXPORTER_<FLAG>`; a flag on the command line
/// wins, then the environment, then the file.
#[derive(Debug, clap::Args)]
#[command(after_help = sources_help())]
pub struct Args {
    #[command(flatten)]
    options: ExporterOptions,
    /// TOML file with any of these flags.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Runs the exporter until SIGTERM/SIGINT (or, with --once, until the trace is shipped).
pub fn run(args: Args) -> anyhow::Result<()> {
    let config = args.options.over_file(args.config.as_deref())?.resolve()?;
    gpuledger_otel::init_logging(None);
    super::runtime()?.block_on(daemon::run(config, super::shutdown_signal()))?;
    Ok(())
}
