//! `gpuledger demo`: the simulated benchmark node (8 H100s × 7 MIG instances) served on loopback.
//! The aggregator and the showback UI join the demo as they land.

use std::net::SocketAddr;
use std::time::Duration;

use gpuledger_exporter::daemon::{self, ExporterConfig, SourceChoice};

/// Flags of `gpuledger demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address for the exporter's /metrics.
    #[arg(long, default_value = "127.0.0.1:9835")]
    listen: SocketAddr,
    /// Simulated node to serve.
    #[arg(long, default_value = "gpu-h100-01")]
    node: String,
}

/// Runs until Ctrl-C.
pub fn run(args: Args) -> anyhow::Result<()> {
    eprintln!(
        "gpuledger demo: a simulated node ({}) with 8 H100 GPUs carved into 56 MIG instances.",
        args.node
    );
    eprintln!(
        "  metrics:   curl -s http://{}/metrics | grep gpuledger_instance_sm_active",
        args.listen
    );
    eprintln!(
        "  Prometheus (OpenMetrics): curl -s -H 'Accept: application/openmetrics-text' http://{}/metrics",
        args.listen
    );
    eprintln!("  stop with Ctrl-C.");
    let config = ExporterConfig {
        source: SourceChoice::Sim { fleet: None },
        listen: args.listen,
        node: args.node,
        ship: None,
        attribution_map: None,
        slurm: None,
        kubelet: None,
        drain_timeout: Duration::from_secs(1),
    };
    super::runtime()?.block_on(daemon::run(config, super::shutdown_signal()))?;
    Ok(())
}
