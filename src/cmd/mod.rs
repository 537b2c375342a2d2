//! The subcommands.

mod aggregator;
mod demo;
mod exporter;
mod reclaimer;
#[cfg(test)]
mod reference;
mod simulate;

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

/// The subcommands whose every option can come from `GPULEDGER_<COMMAND>_<FLAG>`.
const ENV_COMMANDS: [&str; 4] = ["exporter", "aggregator", "reclaimer", "demo"];

impl Cli {
    /// The command line, with `GPULEDGER_<COMMAND>_<FLAG>` as the environment variable of every
    /// option of [`ENV_COMMANDS`] that does not name one itself (options shared by several
    /// subcommands, such as `--otlp-endpoint`, are declared once and named here per command),
    /// and each option's default in its help, from the role's own list of them.
    pub fn command_with_env() -> clap::Command {
        use gpuledger_otel::process::{with_defaults, with_env};
        let mut command = <Cli as clap::CommandFactory>::command();
        for name in ENV_COMMANDS {
            let defaults = match name {
                "exporter" => gpuledger_exporter::options::shown_defaults(),
                "aggregator" => gpuledger_aggregator::options::shown_defaults(),
                "demo" => gpuledger_otel::options::shown_defaults(),
                _ => Vec::new(),
            };
            command =
                command.mut_subcommand(name, |sub| with_defaults(with_env(sub, name), &defaults));
        }
        command
    }

    /// Parses the process's arguments and environment (see [`Cli::command_with_env`]).
    pub fn parse_with_env() -> Result<Cli, clap::Error> {
        let matches = Self::command_with_env().try_get_matches()?;
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
    }
}

/// Runs the chosen subcommand. The aggregator sets up logging itself, once its configuration
/// says whether spans also go over OTLP.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    // Before any thread starts: the processes that hold a ledger for long.
    if matches!(cli.command, Command::Aggregator(_) | Command::Demo(_)) {
        gpuledger_ledger::memory::tune_allocator();
    }
    if !matches!(cli.command, Command::Aggregator(_)) {
        gpuledger_otel::init_logging(None);
    }
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

pub use gpuledger_otel::process::shutdown_signal;

/// A multi-threaded runtime for the services.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(gpuledger_otel::process::runtime()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults once: no doc comment states a default; each role's list puts it in the help
    /// (`with_defaults`), from the constant its `resolve()` fills in.
    #[test]
    fn no_default_is_written_into_a_doc_comment() {
        let declared = <Cli as clap::CommandFactory>::command();
        for sub in declared.get_subcommands() {
            for arg in sub.get_arguments() {
                for help in [arg.get_help(), arg.get_long_help()].into_iter().flatten() {
                    assert!(
                        !help.to_string().contains("[default"),
                        "{} --{}: {help}",
                        sub.get_name(),
                        arg.get_id()
                    );
                }
            }
        }
    }

    #[test]
    fn every_option_of_the_services_has_its_environment_variable() {
        let command = Cli::command_with_env();
        let mut seen = 0;
        for name in ENV_COMMANDS {
            let sub = command.find_subcommand(name).unwrap();
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if !arg.get_action().takes_values() {
                    continue;
                }
                let want = gpuledger_otel::process::env_var(name, long);
                assert_eq!(
                    arg.get_env().and_then(|e| e.to_str()),
                    Some(want.as_str()),
                    "{name} --{long}"
                );
                seen += 1;
            }
        }
        assert!(seen > 60, "{seen} options");
        let aggregator = command.find_subcommand("aggregator").unwrap();
        assert!(
            aggregator
                .get_arguments()
                .any(|a| a.get_env().and_then(|e| e.to_str())
                    == Some("GPULEDGER_AGGREGATOR_OTLP_ENDPOINT"))
        );
    }
}
