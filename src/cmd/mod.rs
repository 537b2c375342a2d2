//! The subcommands.

mod demo;
mod exporter;
mod simulate;

use clap::{Parser, Subcommand};

/// Who holds which GPU slice, how much of it they use, what it costs, and what to reclaim.
#[derive(Debug, Parser)]
#[command(name = "gpuledger", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node exporter: sample every MIG instance each second, serve /metrics, ship batches.
    Exporter(Box<exporter::Args>),
    /// Write a trace CSV from the deterministic fleet simulator.
    Simulate(simulate::Args),
    /// Run a simulated node end to end on this machine and show where to look.
    Demo(demo::Args),
}

/// Runs the chosen subcommand.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Exporter(args) => exporter::run(*args),
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
