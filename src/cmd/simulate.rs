//! `gpuledger simulate`: write a trace CSV from the fleet simulator.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use gpuledger_exporter::source::sim::{Fleet, Simulator};
use gpuledger_schema::trace::{self, TraceWriter};

/// Flags of `gpuledger simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Seed (without it: the fleet's).
    #[arg(long)]
    seed: Option<u64>,
    /// Length of the trace (1h, 30m, 2d).
    #[arg(long, default_value = "1h")]
    duration: humantime::Duration,
    /// First second: RFC 3339 or Unix seconds (without it: the start of the current hour minus
    /// --duration).
    #[arg(long)]
    start: Option<String>,
    /// Fleet file (without it: the built-in fleet).
    #[arg(long)]
    fleet: Option<PathBuf>,
    /// Only this node.
    #[arg(long)]
    node: Option<String>,
    /// Write each GPU's energy in each second (`gpu_energy_joules`, the simulator's power model)
    /// on its rows. A GPU-second's energy is split among the rows of its batch, so an import
    /// keeps a GPU's seconds together rather than each instance's whole series in one run.
    #[arg(long)]
    pub energy: bool,
    /// Output CSV ("-" for standard output).
    #[arg(long)]
    out: PathBuf,
}

/// Writes the trace.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut fleet = match &args.fleet {
        Some(path) => Fleet::load(path)?,
        None => Fleet::builtin(),
    };
    if let Some(seed) = args.seed {
        fleet.seed = seed;
    }
    if let Some(node) = &args.node {
        anyhow::ensure!(fleet.node(node).is_some(), "the fleet has no node {node:?}");
    }
    let duration = args.duration.as_secs() as i64;
    let start = match &args.start {
        Some(s) => trace::parse_timestamp(s)
            .map_err(anyhow::Error::msg)
            .context("--start")?,
        None => chrono::Utc::now().timestamp() / 3600 * 3600 - duration,
    };
    let sim = Simulator::new(fleet);
    let out: Box<dyn Write> = if args.out.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            File::create(&args.out)
                .with_context(|| format!("cannot create {}", args.out.display()))?,
        )
    };
    let mut w = TraceWriter::new(BufWriter::with_capacity(1 << 20, out))?;
    let mut rows = 0u64;
    for t in start..start + duration {
        let second = sim.second(args.node.as_deref(), t);
        // Each row carries its GPU's energy in the second (the simulator's power model).
        let energy: std::collections::HashMap<String, Option<f64>> = second
            .gpus
            .iter()
            .map(|g| (g.gpu_uuid.clone(), g.energy_joules))
            .collect();
        for sample in second.into_samples() {
            let e = energy
                .get(&sample.instance.gpu_uuid)
                .copied()
                .flatten()
                .filter(|_| args.energy);
            w.write_with_energy(&sample, e)?;
            rows += 1;
        }
    }
    w.finish()?.flush()?;
    tracing::info!(rows, from = %trace::format_timestamp(start), to = %trace::format_timestamp(start + duration), "Trace written.");
    Ok(())
}
