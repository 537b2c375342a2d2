//! `gpuledger reclaimer`: the webhook receiver beside a scheduler (README, "Reclaim"). Its keys
//! are declared and checked in `gpuledger_aggregator::reclaimer`.

use std::path::PathBuf;

use gpuledger_aggregator::reclaimer::{self, ReclaimerFile};

/// Flags of `gpuledger reclaimer`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TOML file: listen, path, secret / secrets / secret_file, tolerance, dry_run, state_file,
    /// [kubernetes] (api_server, token_file, ca_file, mode = "evict" | "kueue"), [slurm] (command).
    #[arg(long)]
    config: PathBuf,
    /// Log what would be done, act on nothing (overrides the file's dry_run).
    #[arg(long)]
    dry_run: bool,
    /// Check the file (secrets, token, CA, command), print a summary and exit.
    #[arg(long)]
    check_config: bool,
}

/// Runs until SIGINT or SIGTERM.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut file: ReclaimerFile = super::config_file(Some(&args.config))?;
    if args.dry_run {
        file.dry_run = Some(true);
    }
    let (addr, r) = file.resolve()?;
    if args.check_config {
        println!(
            "gpuledger reclaimer: the configuration is valid: listen {addr}, {}",
            r.summary()
        );
        return Ok(());
    }
    super::runtime()?.block_on(async {
        reclaimer::run(addr, r, super::shutdown_signal())
            .await
            .map_err(|e| anyhow::anyhow!("reclaimer on {addr}: {e}"))
    })
}
