//! `gpuledger demo`: the whole pipeline on this machine. The simulated fleet's four nodes
//! (8 × H100 carved into 56 MIG instances, a mixed H100, an H200 and an A100 node) each run an
//! exporter that ships every 5 s to an aggregator writing an embedded DuckDB ledger file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use gpuledger_aggregator::analytics::Settings;
use gpuledger_aggregator::analytics::showback::{self, GroupBy};
use gpuledger_aggregator::auth::Tokens;
use gpuledger_aggregator::store::Retention;
use gpuledger_aggregator::{Config, Limits};
use gpuledger_exporter::daemon::{self, ExporterConfig, SourceChoice};
use gpuledger_exporter::ship::ShipConfig;
use gpuledger_exporter::source::sim::Fleet;

/// Flags of `gpuledger demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address of the first exporter's /metrics (the benchmark node); the other nodes' exporters
    /// take the next ports.
    #[arg(long, default_value = "127.0.0.1:9835")]
    listen: SocketAddr,
    /// Address of the aggregator.
    #[arg(long, default_value = "127.0.0.1:9836")]
    aggregator_listen: SocketAddr,
    /// The ledger file (kept between runs; the demo adds to it).
    #[arg(long, default_value = "gpuledger-demo.duckdb")]
    db: PathBuf,
}

/// Runs until Ctrl-C.
pub fn run(args: Args) -> anyhow::Result<()> {
    // A fresh admin token per run, printed for the curl lines below.
    let token = format!("demo-{}", uuid::Uuid::now_v7().simple());
    let fleet = Fleet::builtin();
    let nodes: Vec<String> = fleet.nodes.iter().map(|n| n.name.clone()).collect();
    let spool = std::env::temp_dir().join(format!("gpuledger-demo-spool-{}", std::process::id()));
    let aggregator = Config {
        db: args.db.clone(),
        listen: args.aggregator_listen,
        tokens: Tokens::default().with_admin(&token)?,
        retention: Retention::default(),
        retention_interval: Duration::from_secs(600),
        limits: Limits::default(),
        analytics: demo_settings(),
        reclaim: Default::default(),
        ui: Default::default(),
    };
    eprintln!(
        "gpuledger demo: {} simulated nodes ({}) ship to an aggregator writing {}.",
        nodes.len(),
        nodes.join(", "),
        args.db.display()
    );
    eprintln!(
        "  exporter metrics: curl -s http://{}/metrics | grep gpuledger_instance_sm_active",
        args.listen
    );
    eprintln!(
        "  aggregator:       curl -s http://{}/metrics | grep gpuledger_aggregator_ingest",
        args.aggregator_listen
    );
    eprintln!("  admin token:      {token}");
    eprintln!(
        "  showback:         curl -s -H 'Authorization: Bearer {token}' 'http://{}/api/v1/showback?group_by=workload'",
        args.aggregator_listen
    );
    eprintln!(
        "  fragmentation:    curl -s -H 'Authorization: Bearer {token}' http://{}/api/v1/fragmentation",
        args.aggregator_listen
    );
    eprintln!("  stop with Ctrl-C: the ledger's per-tenant totals are printed then.");
    let rt = super::runtime()?;
    let spool_dir = spool.clone();
    rt.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (agg_stop_tx, agg_stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let agg = tokio::spawn(gpuledger_aggregator::run(aggregator, stopped(agg_stop_rx)));
        // Let the aggregator open the ledger and listen before the exporters' first shipment.
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(args.aggregator_listen)
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut exporters = Vec::new();
        for (i, node) in nodes.into_iter().enumerate() {
            let listen = SocketAddr::new(args.listen.ip(), args.listen.port() + 2 * i as u16);
            let config = ExporterConfig {
                source: SourceChoice::Sim { fleet: None },
                listen,
                node: node.clone(),
                ship: Some(ShipConfig {
                    aggregator: format!("http://{}", args.aggregator_listen),
                    token: token.clone(),
                    node: node.clone(),
                    spool_dir: spool_dir.join(&node),
                    spool_max_bytes: 64 << 20,
                    interval: Duration::from_secs(5),
                    max_batch_samples: 50_000,
                    wait_when_full: false,
                    request_timeout: Duration::from_secs(30),
                }),
                attribution_map: None,
                proc_path: "/proc".into(),
                slurm: None,
                kubelet: None,
                drain_timeout: Duration::from_secs(3),
            };
            exporters.push(tokio::spawn(daemon::run(config, stopped(stop_rx.clone()))));
        }
        super::shutdown_signal().await;
        eprintln!(
            "gpuledger demo: stopping; the exporters send what they hold, then the ledger closes."
        );
        let _ = stop_tx.send(true);
        for e in exporters {
            e.await.context("an exporter task")??;
        }
        let _ = agg_stop_tx.send(true);
        agg.await.context("the aggregator task")??;
        anyhow::Ok(())
    })?;
    let _ = std::fs::remove_dir_all(&spool);
    // What the ledger now says: the showback finance would read, over everything recorded.
    let (conn, _) = gpuledger_aggregator::store::open(&args.db)?;
    // From the first second recorded to the last, so that coverage reflects the demo's own run.
    let edge = |sql: &str| -> anyhow::Result<Option<(i64, u64)>> {
        let mut stmt = conn.prepare(sql)?;
        let mut rows = stmt.query([])?;
        Ok(match rows.next()? {
            Some(r) => Some((r.get(0)?, r.get(1)?)),
            None => None,
        })
    };
    let first = edge(
        "SELECT bucket, bit_or(seconds_mask) FROM rollup_1m
         WHERE bucket = (SELECT min(bucket) FROM rollup_1m) GROUP BY bucket",
    )?;
    let last = edge(
        "SELECT bucket, bit_or(seconds_mask) FROM rollup_1m
         WHERE bucket = (SELECT max(bucket) FROM rollup_1m) GROUP BY bucket",
    )?;
    let (Some((b0, m0)), Some((b1, m1))) = (first, last) else {
        eprintln!("The ledger is empty: nothing was shipped before the demo stopped.");
        return Ok(());
    };
    let from = b0 + i64::from(m0.trailing_zeros());
    let to = b1 + 64 - i64::from(m1.leading_zeros());
    let settings = demo_settings();
    let s = showback::showback(&conn, from, to, GroupBy::Tenant, None, i64::MIN, &settings)?;
    eprintln!(
        "\n{:<16} {:>16} {:>16} {:>10} {:>12}",
        "tenant", "allocated GPU-s", "used GPU-s", "efficiency", "cost (USD)"
    );
    for r in &s.rows {
        let f = &r.figures;
        eprintln!(
            "{:<16} {:>16.1} {:>16.1} {:>9.1}% {:>12.2}",
            r.key[0].as_deref().unwrap_or("-"),
            f.allocated_gpu_seconds,
            f.used_gpu_seconds,
            100.0 * f.efficiency.unwrap_or(0.0),
            f.cost
        );
    }
    let t = &s.totals;
    eprintln!(
        "fleet: {:.1} GPU-s observed ({} GPUs, coverage {:.1}%), {:.1} unallocated, {:.1} stranded by MIG fragmentation",
        t.capacity_gpu_seconds,
        t.gpus,
        100.0 * t.coverage,
        t.unallocated_gpu_seconds,
        t.stranded_gpu_seconds
    );
    Ok(())
}

/// Illustrative list prices per GPU-hour, so that the demo's showback has costs.
fn demo_settings() -> Settings {
    Settings {
        prices: gpuledger_aggregator::analytics::prices::PriceBook {
            entries: [
                ("A100-80GB", 1.79),
                ("H100-80GB", 2.49),
                ("H200-141GB", 3.39),
            ]
            .into_iter()
            .map(|(m, p)| gpuledger_aggregator::analytics::prices::Price {
                gpu_model: m.to_owned(),
                mig_profile: None,
                per_hour: p,
                from: None,
            })
            .collect(),
            ..Default::default()
        },
        ..Settings::default()
    }
}
