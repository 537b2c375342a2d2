//! `gpuledger demo`: the whole pipeline on this machine, with a month of history. The simulated
//! fleet's four nodes (8 × H100 carved into 56 MIG instances, a mixed H100, an H200 and an A100
//! node) each run an exporter that ships every 5 s over HTTP to an aggregator writing an embedded
//! DuckDB ledger under `--data`. Before the aggregator says it is ready, the 30 days before the
//! start are laid into the ledger (see `history`), so the showback pages open on a month of bills.

mod history;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use gpuledger_aggregator::options::AggregatorOptions;
use gpuledger_exporter::daemon;
use gpuledger_exporter::options::ExporterOptions;
use gpuledger_exporter::source::sim::{Fleet, Simulator};
use gpuledger_ledger::analytics::showback::{self, GroupBy};

/// Flags of `gpuledger demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the ledger (`ledger.duckdb`) and the exporters' spools live. Kept between runs: a
    /// second run reuses the month and fills the gap since the last one.
    #[arg(long, default_value = "gpuledger-demo")]
    data: PathBuf,
    /// Address of the aggregator: the showback pages, the API and /metrics.
    #[arg(long, default_value = "127.0.0.1:9836")]
    listen: SocketAddr,
    /// Address of the first exporter's /metrics; the other nodes' exporters take every second
    /// port after it.
    #[arg(long, default_value = "127.0.0.1:9835")]
    exporter_listen: SocketAddr,
    /// How much history the ledger holds before it is ready.
    #[arg(long, default_value = "30d")]
    history: humantime::Duration,
    /// The newest part of that history, laid down second by second as the exporters would have
    /// sent it (raw samples); the older part is written per minute.
    #[arg(long, default_value = "15m")]
    history_seconds: humantime::Duration,
    /// Also push the aggregator's and every exporter's metrics to an OTLP collector, as the
    /// services' own `--otlp-*` flags do (metrics only: the demo exports no traces).
    #[command(flatten)]
    otlp: gpuledger_otel::OtlpOptions,
    /// Also send a chat message per idle notebook, in Slack's form, to this incoming-webhook URL
    /// (a `[[notify]] kind = "slack"` endpoint; a receiver in one line: docs/reclaim.md, "Chat
    /// messages").
    #[arg(long)]
    chat_url: Option<String>,
}

/// Runs until Ctrl-C.
pub fn run(args: Args) -> anyhow::Result<()> {
    let began = std::time::Instant::now();
    // GPULEDGER_ADMIN_TOKEN fixes the admin token; otherwise a fresh one per run.
    let token = match std::env::var("GPULEDGER_ADMIN_TOKEN") {
        Ok(t) => t,
        Err(_) => format!("demo-{}", uuid::Uuid::now_v7().simple()),
    };
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("cannot create --data {}", args.data.display()))?;
    let db = args.data.join("ledger.duckdb");
    let spool_dir = args.data.join("spool");
    let fleet = Fleet::builtin();
    let nodes: Vec<String> = fleet.nodes.iter().map(|n| n.name.clone()).collect();
    // The services are configured the way an operator's files configure them, through the
    // options' own checks: the token in a file of the data directory that only its owner reads.
    // GPULEDGER_ADMIN_TOKEN, when set, is read by the options themselves.
    let tokens = match std::env::var_os("GPULEDGER_ADMIN_TOKEN") {
        Some(_) => None,
        None => Some(private_file(
            &args.data.join("tokens"),
            &format!("admin {token}\n"),
        )?),
    };
    let token_file = private_file(&args.data.join("admin-token"), &format!("{token}\n"))?;
    let aggregator = AggregatorOptions {
        db: Some(db.clone()),
        listen: Some(args.listen),
        token_file: tokens,
        export_dir: Some(args.data.join("export")),
        prices: demo_prices(),
        billing: demo_billing(),
        otlp: args.otlp.clone(),
        notify: (args.chat_url.iter())
            .map(|url| gpuledger_ledger::reclaim::config::NotifyFile {
                name: Some("demo-chat".into()),
                kind: "slack".into(),
                url: Some(url.clone()),
                ..Default::default()
            })
            .collect(),
        ..AggregatorOptions::default()
    }
    .resolve()?;
    let retention = aggregator.retention;
    let settings = aggregator.analytics.clone();
    let now = chrono::Utc::now().timestamp();
    let plan = history::Plan {
        from: now - args.history.as_secs() as i64,
        seconds_from: now - args.history_seconds.as_secs() as i64,
        to: now,
        raw_cutoff: now - retention.raw_secs,
    };
    let base = format!("http://{}", args.listen);
    print_welcome(&nodes, &db, &base, &token, args.exporter_listen);
    let sim = Simulator::new(fleet);
    let prepare: gpuledger_aggregator::Prepare = Box::new(move |startup| {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let report = history::prepare(startup, sim, plan).await?;
            eprintln!(
                "gpuledger demo: history from {} laid down in {:.1} s: {} minute rows ({:.0} instance-hours) and {} one-second samples; evaluating the analytics.",
                chrono::DateTime::from_timestamp(report.from, 0).unwrap_or_default(),
                started.elapsed().as_secs_f64(),
                report.minute_rows,
                report.minute_seconds as f64 / 3600.0,
                report.samples
            );
            Ok(())
        })
    });
    let exporters = Exporters {
        first_listen: args.exporter_listen,
        aggregator: base.clone(),
        token_file,
        spool_dir,
        otlp: args.otlp.clone(),
    };
    // The runtime lives until the totals are printed, as it did before `serve` was split out.
    let rt = super::runtime()?;
    rt.block_on(serve(
        aggregator,
        prepare,
        args.listen,
        nodes,
        exporters,
        (began, token.clone()),
    ))?;
    print_totals(&db, &settings)
}

/// What the demo runs, and the commands to look at it.
fn print_welcome(
    nodes: &[String],
    db: &Path,
    base: &str,
    token: &str,
    exporter_listen: SocketAddr,
) {
    eprintln!(
        "gpuledger demo: {} simulated nodes ({}) ship to an aggregator writing {}.",
        nodes.len(),
        nodes.join(", "),
        db.display()
    );
    eprintln!("  showback pages:   {base}/   (sign in with the admin token)");
    eprintln!("  admin token:      {token}");
    eprintln!(
        "  API:              curl -s -H 'Authorization: Bearer {token}' '{base}/api/v1/showback?group_by=tenant'"
    );
    eprintln!(
        "  bill (JSON):      curl -s -H 'Authorization: Bearer {token}' '{base}/api/v1/bill'"
    );
    eprintln!(
        "  rightsizing:      {base}/rightsizing   (workloads that fit a smaller MIG profile, and the savings)"
    );
    eprintln!(
        "  budgets:          {base}/tenants   (two tenants are forecast over their monthly budget)"
    );
    eprintln!(
        "  energy:           curl -s -H 'Authorization: Bearer {token}' '{base}/api/v1/energy?group_by=tenant'   (measured kWh per tenant since the demo started; the history before it has none)"
    );
    eprintln!(
        "  ledger metrics:   curl -s -H 'Authorization: Bearer {token}' {base}/metrics | grep gpuledger_tenant"
    );
    eprintln!(
        "  exporter metrics: curl -s http://{}/metrics | grep gpuledger_instance_sm_active",
        exporter_listen
    );
    eprintln!(
        "  ready when:       curl -s {base}/readyz   says ready (the month is laid down first)"
    );
    eprintln!("  stop with Ctrl-C: the ledger's per-tenant totals are printed then.");
}

/// What each simulated node's exporter is given.
struct Exporters {
    /// The first exporter's /metrics; the others take every second port after it.
    first_listen: SocketAddr,
    aggregator: String,
    token_file: PathBuf,
    spool_dir: PathBuf,
    otlp: gpuledger_otel::OtlpOptions,
}

/// Runs the aggregator and one exporter per node until Ctrl-C, then stops the exporters (they
/// send what they hold) before the aggregator closes the ledger.
async fn serve(
    aggregator: gpuledger_aggregator::config::Config,
    prepare: gpuledger_aggregator::Prepare,
    listen: SocketAddr,
    nodes: Vec<String>,
    ex: Exporters,
    (began, token): (std::time::Instant, String),
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (agg_stop_tx, agg_stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let agg = tokio::spawn(gpuledger_aggregator::run_with(
        aggregator,
        stopped(agg_stop_rx),
        Some(prepare),
    ));
    // Let the aggregator open the ledger and listen before the exporters' first shipment.
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(listen).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready = tokio::spawn(announce_ready(ex.aggregator.clone(), token, began));
    let mut exporters = Vec::new();
    for (i, node) in nodes.into_iter().enumerate() {
        let listen = SocketAddr::new(ex.first_listen.ip(), ex.first_listen.port() + 2 * i as u16);
        let mut config = ExporterOptions {
            source: Some("sim".into()),
            listen: Some(listen),
            node: Some(node.clone()),
            aggregator: Some(ex.aggregator.clone()),
            token_file: Some(ex.token_file.clone()),
            spool_dir: Some(ex.spool_dir.join(&node)),
            spool_max_bytes: Some(64 << 20),
            ship_interval: Some(Duration::from_secs(5)),
            otlp: ex.otlp.clone(),
            ..ExporterOptions::default()
        }
        .resolve()?;
        // Ctrl-C should not wait the daemon's full drain time for a local aggregator.
        config.drain_timeout = Duration::from_secs(3);
        exporters.push(tokio::spawn(daemon::run(config, stopped(stop_rx.clone()))));
    }
    super::shutdown_signal().await;
    ready.abort();
    eprintln!(
        "gpuledger demo: stopping; the exporters send what they hold, then the ledger closes."
    );
    let _ = stop_tx.send(true);
    for e in exporters {
        e.await.context("an exporter task")??;
    }
    let _ = agg_stop_tx.send(true);
    agg.await.context("the aggregator task")??;
    Ok(())
}

/// What the ledger now says: the showback finance would read, over everything recorded.
fn print_totals(db: &Path, settings: &gpuledger_ledger::analytics::Settings) -> anyhow::Result<()> {
    let (conn, _) = gpuledger_ledger::store::open(db)?;
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
    let s = showback::showback(&conn, from, to, GroupBy::Tenant, None, i64::MIN, settings)?;
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

/// Prints one line once `/readyz` first answers 200, then the keep link of an idle notebook.
async fn announce_ready(base: String, token: String, started: std::time::Instant) {
    let Ok(client) = reqwest::Client::builder().build() else {
        return;
    };
    loop {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await
            && r.status().is_success()
        {
            eprintln!(
                "gpuledger demo: ready after {:.1} s: open {base}/",
                started.elapsed().as_secs_f64()
            );
            match keep_link(&client, &base, &token).await {
                Some((workload, url)) => eprintln!(
                    "gpuledger demo: the notebook {workload} is idle; its owner's keep link (no sign-in): {url}"
                ),
                None => eprintln!(
                    "gpuledger demo: no idle notebook is followed yet, so no keep link to show."
                ),
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The keep link of an open idle-notebook episode, as its notice would carry it: (workload, URL).
async fn keep_link(client: &reqwest::Client, base: &str, token: &str) -> Option<(String, String)> {
    let decisions: serde_json::Value = client
        .get(format!("{base}/api/v1/reclaims?limit=2000"))
        .bearer_auth(token)
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    for d in decisions["decisions"].as_array()? {
        let (Some(workload), Some(episode)) = (d["workload"].as_str(), d["episode_id"].as_str())
        else {
            continue;
        };
        if !workload.contains("/jupyter-") || d["decision"] != "notify" {
            continue;
        }
        let r = client
            .post(format!("{base}/api/v1/keep-links"))
            .bearer_auth(token)
            .json(&serde_json::json!({ "episode_id": episode }))
            .send()
            .await
            .ok()?;
        if r.status().is_success() {
            let link: serde_json::Value = r.json().await.ok()?;
            return Some((workload.to_owned(), link["keep_url"].as_str()?.to_owned()));
        }
    }
    None
}

/// Illustrative list prices per GPU-hour of every model the simulated fleet runs, so that the
/// demo's showback has costs (an operator's `[prices]` table).
fn demo_prices() -> std::collections::HashMap<String, f64> {
    [
        ("A100-40GB", 1.29),
        ("A100-80GB", 1.79),
        ("H100-80GB", 2.49),
        ("H200-141GB", 3.39),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_owned(), p))
    .collect()
}

/// The simulated tenants' teams, orgs and monthly budgets (an operator's `[billing.tenants]`),
/// so that the Tenants page has its org and team sub-totals and its budgets with a forecast:
/// two of the four are set to run over at the simulated fleet's pace.
fn demo_billing() -> gpuledger_ledger::analytics::bill::BillingSettings {
    use gpuledger_ledger::analytics::bill::{BillingSettings, TenantInfo};
    let tenants = [
        ("search", "retrieval", "products", 12_000.0),
        ("ads", "ranking", "products", 8_000.0),
        ("research", "foundation-models", "research", 9_000.0),
        ("data-science", "analytics", "research", 6_000.0),
    ]
    .into_iter()
    .map(|(tenant, team, org, budget)| {
        (
            tenant.to_owned(),
            TenantInfo {
                team: Some(team.to_owned()),
                org: Some(org.to_owned()),
                monthly_budget: Some(budget),
                contact: None,
            },
        )
    })
    .collect();
    BillingSettings {
        tenants,
        ..BillingSettings::default()
    }
}

/// Writes `text` to `path`, readable by its owner only (the token files' required mode).
fn private_file(path: &std::path::Path, text: &str) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.to_owned())
}
