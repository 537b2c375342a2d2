//! Running the service: open the ledger, start the writer and retention, serve HTTP until told to
//! stop, then let the writer finish what it accepted.

use std::future::Future;
use std::sync::Arc;

use crate::api::{App, AppState};
use crate::config::Config;
use crate::telemetry::{AggregatorMetrics, TableLabels};
use gpuledger_ledger::store::query::Readers;
use gpuledger_ledger::store::{self, Writer};
use gpuledger_schema::exposition;

/// Why the service could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The ledger could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving HTTP: {0}")]
    Serve(std::io::Error),
    /// The OTLP push could not start.
    #[error(transparent)]
    Otlp(#[from] gpuledger_otel::Error),
    /// DuckDB invalidated the ledger's database (a checkpoint that failed half-way, say): nothing
    /// can be read or written until the process opens the file again.
    #[error(
        "DuckDB invalidated the ledger's database; a restart opens it again, and its write-ahead log brings back every committed batch: {0}"
    )]
    LedgerInvalidated(String),
}

/// Runs the aggregator until `shutdown` resolves. Every batch acknowledged before then is
/// committed; the writer finishes the queue before this returns.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    run_with(config, shutdown, None).await
}

/// What a [`Prepare`] step gets: the writer, the readers, and a line for `/readyz`.
pub struct Startup {
    /// The one writer.
    pub writer: Writer,
    /// Reader connections.
    pub readers: Readers,
    app: AppState,
}

impl Startup {
    /// Says what is being prepared; `/readyz` answers 503 with it until the step is done.
    pub fn progress(&self, what: impl Into<String>) {
        *self.app.preparing.lock().unwrap_or_else(|e| e.into_inner()) = Some(what.into());
    }
}

/// Work done once the ledger is open and the service listens, before it calls itself ready.
pub type Prepare = Box<
    dyn FnOnce(
            Startup,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>> + Send>,
        > + Send,
>;

/// [`run`], with a step that must finish before `/readyz` answers 200: the service serves (ingest
/// included: exporters need not wait), but says it is not ready yet. When the step is done, the
/// analytics evaluate what it wrote, and then the service is ready. If it fails, `/readyz` keeps
/// answering 503 naming the error.
pub async fn run_with(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    prepare: Option<Prepare>,
) -> Result<(), ServeError> {
    // The address first: a port taken by another process is reported before the ledger file is
    // created or opened (and no ledger is left behind by a start that could never serve).
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: config.listen,
            source,
        })?;
    let http = config.http;
    let mut config = config;
    if config.reclaim.links.public_url.is_none() {
        let bound = listener.local_addr().unwrap_or(config.listen);
        config.reclaim.links.public_url = Some(default_public_url(bound));
    }
    let (state, thread, compactor) = open(config, prepare.is_some())?;
    let otlp = start_otlp(&state)?;
    let background = spawn_background(&state, &compactor, prepare)?;
    // A ledger DuckDB has invalidated ends the service, so that its supervisor restarts it: until
    // the file is opened again every statement fails, and `/healthz` would keep it running.
    let (invalid_tx, invalid) = tokio::sync::watch::channel(None);
    let watchdog = tokio::spawn(watch_validity(state.readers.clone(), invalid_tx));
    let mut until_invalid = invalid.clone();
    let served = gpuledger_otel::serve::serve(
        listener,
        crate::router::router(state.clone()),
        http,
        async move {
            tokio::select! {
                () = shutdown => {}
                _ = until_invalid.wait_for(Option::is_some) => {}
            }
        },
    )
    .await;
    watchdog.abort();
    // A rewrite in progress ends after its slice (its blocking thread is not aborted with the
    // loop that started it).
    compactor.stop();
    for task in background {
        task.abort();
    }
    if let Some(push) = otlp {
        // Its last export blocks on HTTP and its callbacks hold the state: before the writer ends.
        tokio::task::block_in_place(|| push.shutdown());
    }
    drop(state);
    // The writer thread ends once every handle is gone and its queue is written.
    tokio::task::block_in_place(|| {
        let _ = thread.join();
    });
    served.map_err(ServeError::Serve)?;
    match invalid.borrow().clone() {
        Some(why) => Err(ServeError::LedgerInvalidated(why)),
        None => Ok(()),
    }
}

/// Opens the ledger and starts its writer: the service's state, the writer's thread, and the
/// compactor that rewrites closed hours beside it on a connection of its own.
fn open(
    config: Config,
    preparing: bool,
) -> Result<(AppState, std::thread::JoinHandle<()>, store::Compactor), ServeError> {
    let path = config.db.clone();
    let (conn, found) = tokio::task::block_in_place(|| {
        store::open_with(&path, Some(config.limits.duckdb_memory_limit.as_str()))
    })?;
    tracing::info!(db = %path.display(), schema_version_found = found, "Opened the ledger.");
    // The keep links' keys, before the writer takes the connection: a fresh ledger gets one.
    let keys = tokio::task::block_in_place(|| {
        gpuledger_ledger::reclaim::links::load_or_create(
            &conn,
            chrono::Utc::now().timestamp(),
            fresh_secret,
        )
    })
    .map_err(store::StoreError::from_db)?;
    config.reclaim.links.keys.set(keys);
    let readers = Readers::new(
        &conn,
        (path.as_os_str() != ":memory:").then(|| path.clone()),
    )?;
    let metrics = Arc::new(AggregatorMetrics::new());
    let compactor = store::Compactor::new(&conn)?;
    // The split's idle floors as configured now: the writer reads them when it starts.
    store::set_idle_watts(&conn, &config.analytics.energy.idle_watts())
        .map_err(store::StoreError::from_db)?;
    let (writer, thread) = Writer::spawn_limited(
        conn,
        config.limits.queue_samples,
        gpuledger_ledger::store::writer::InstanceBounds {
            per_node: config.limits.max_instances_per_node,
            fleet: config.limits.max_instances,
        },
        metrics.clone(),
    )?;
    tracing::info!(listen = %config.listen, "The aggregator is listening.");
    let admission = crate::api::admission::Admission::new(&config.limits);
    let lanes = crate::reclaim::delivery::Lanes::new(config.reclaim.endpoints.len());
    let state = AppState(Arc::new(App {
        tokens: config.tokens.clone(),
        config,
        writer,
        readers,
        metrics,
        analytics_lock: tokio::sync::Mutex::new(()),
        admission,
        readiness: tokio::sync::Mutex::new(None),
        deliveries: lanes,
        sessions: crate::auth::session::Sessions::default(),
        preparing: std::sync::Mutex::new(preparing.then(|| "starting".to_owned())),
        demand: Default::default(),
        month_savings: Default::default(),
    }));
    Ok((state, thread, compactor))
}

/// 32 random bytes: a new keep-link key.
fn fresh_secret() -> Vec<u8> {
    let mut key = vec![0u8; 32];
    getrandom::fill(&mut key).expect("the operating system provides random bytes");
    key
}

/// `reclaim.public_url` when unset: `http://` and the bound address, or the host's name when it
/// listens on every address (a reader cannot reach `0.0.0.0`).
fn default_public_url(bound: std::net::SocketAddr) -> String {
    if bound.ip().is_unspecified() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        tracing::warn!(
            host,
            "reclaim.public_url is not set and the aggregator listens on every address: keep links name this host; set reclaim.public_url to the URL readers reach."
        );
        format!("http://{host}:{}", bound.port())
    } else {
        format!("http://{bound}")
    }
}

/// The OTLP push, when configured.
fn start_otlp(state: &AppState) -> Result<Option<gpuledger_otel::MetricsPush>, ServeError> {
    let Some(otlp) = &state.config.otlp else {
        return Ok(None);
    };
    let app = state.clone();
    let service = gpuledger_otel::Service::aggregator(state.config.listen);
    // The first rendering (it names the instruments) reads the ledger: not on a worker.
    let push = tokio::task::block_in_place(|| {
        gpuledger_otel::MetricsPush::start(
            otlp,
            &service,
            Arc::new(move || app.render_metrics(Some(&None), exposition::Format::OpenMetrics)),
        )
    })?;
    Ok(Some(push))
}

/// Starts the service's loops (the startup step, retention and the rewrite, analytics, webhook
/// deliveries, Alertmanager's silences), answering them in the order they are stopped.
fn spawn_background(
    state: &AppState,
    compactor: &store::Compactor,
    prepare: Option<Prepare>,
) -> Result<Vec<tokio::task::AbortHandle>, ServeError> {
    let prepared =
        prepare.map(|prepare| tokio::spawn(prepare_then_evaluate(state.clone(), prepare)));
    let retention = tokio::spawn(retention_loop(state.clone(), compactor.clone()));
    let analytics = tokio::spawn(analytics_loop(state.clone()));
    let client = reqwest::Client::builder()
        .user_agent(concat!("gpuledger/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ServeError::Serve(std::io::Error::other(e)))?;
    // One lane per endpoint: a chat service that hangs or throttles never delays a webhook.
    let deliveries: Vec<_> = (state.config.reclaim.endpoints.iter().enumerate())
        .map(|(i, endpoint)| {
            use crate::reclaim::delivery::{CHAT_IN_FLIGHT, Deliverer, IN_FLIGHT};
            let chat = endpoint.kind != gpuledger_ledger::reclaim::config::EndpointKind::Webhook;
            tokio::spawn(
                Deliverer {
                    endpoints: Arc::new(vec![endpoint.clone()]),
                    readers: state.readers.clone(),
                    writer: state.writer.clone(),
                    metrics: state.metrics.clone(),
                    wake: state.deliveries.lane(i),
                    client: client.clone(),
                    in_flight: if chat { CHAT_IN_FLIGHT } else { IN_FLIGHT },
                }
                .run(),
            )
        })
        .collect();
    let alerts = state
        .config
        .reclaim
        .alertmanager
        .clone()
        .map(|am| tokio::spawn(alertmanager_loop(state.clone(), am, client)));
    let mut tasks = vec![retention.abort_handle(), analytics.abort_handle()];
    tasks.extend(prepared.map(|p| p.abort_handle()));
    tasks.extend(deliveries.iter().map(|d| d.abort_handle()));
    tasks.extend(alerts.map(|a| a.abort_handle()));
    Ok(tasks)
}

/// How often the service asks whether DuckDB has invalidated the ledger.
const VALIDITY_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Sends DuckDB's error once it has invalidated the ledger's database (after a fatal error on any
/// connection, every statement on every connection fails), asked every [`VALIDITY_CHECK`] on a
/// reader connection.
async fn watch_validity(readers: Readers, invalid: tokio::sync::watch::Sender<Option<String>>) {
    let mut tick = tokio::time::interval(VALIDITY_CHECK);
    loop {
        tick.tick().await;
        let readers = readers.clone();
        let asked = tokio::task::spawn_blocking(move || {
            let conn = readers.connect()?;
            conn.execute_batch("SELECT 1")
                .map_err(store::StoreError::from_db)
        })
        .await;
        if let Ok(Err(store::StoreError::Query(e))) = asked
            && store::Failure::of(&e) == store::Failure::Fatal
        {
            tracing::error!(error = %e, "DuckDB has invalidated the ledger's database; the aggregator stops so that a restart opens it again.");
            let _ = invalid.send(Some(e.to_string()));
            return;
        }
    }
}

async fn prepare_then_evaluate(app: AppState, prepare: Prepare) {
    let startup = Startup {
        writer: app.writer.clone(),
        readers: app.readers.clone(),
        app: app.clone(),
    };
    let set = |what: Option<String>| {
        *app.preparing.lock().unwrap_or_else(|e| e.into_inner()) = what;
    };
    if let Err(e) = prepare(startup).await {
        tracing::error!(error = %e, "Preparing the ledger failed; the service stays unready.");
        set(Some(format!("failed: {e}")));
        return;
    }
    set(Some(
        "evaluating the analytics over what was prepared".into(),
    ));
    match app.evaluate().await {
        Ok(_) => set(None),
        Err(e) => {
            tracing::error!(error = %e, "The analytics over the prepared ledger failed.");
            set(Some(format!("the analytics failed: {e}")));
        }
    }
}

/// Evaluates hoarding and fragmentation at start and then every interval. A failure is logged
/// and retried at the next tick; nothing is lost, the dirty hours stay dirty.
async fn analytics_loop(app: AppState) {
    let mut tick = tokio::time::interval(app.config.analytics.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match app.evaluate().await {
            Ok(r) if r.analytics.gpu_hours > 0 || !r.reclaim.events.is_empty() => tracing::debug!(
                gpu_hours = r.analytics.gpu_hours,
                gpus = r.analytics.gpus,
                episodes = r.analytics.episodes,
                events = ?r.reclaim.events,
                "Analytics and reclaim evaluated."
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %e,
                "The analytics evaluation failed; it is retried at the next tick."
            ),
        }
    }
}

/// Pushes the open episodes to Alertmanager every interval (see `reclaim::alertmanager`).
async fn alertmanager_loop(
    app: AppState,
    am: gpuledger_ledger::reclaim::config::Alertmanager,
    client: reqwest::Client,
) {
    let mut tick = tokio::time::interval(am.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = chrono::Utc::now().timestamp();
        let Ok(conn) = app.readers.connect() else {
            continue;
        };
        let (a, s, m) = (
            app.config.analytics.clone(),
            app.config.reclaim.clone(),
            am.clone(),
        );
        let alerts = tokio::task::spawn_blocking(move || {
            crate::reclaim::alertmanager::alerts(&conn, &a, &s, &m, now)
        })
        .await;
        match alerts {
            Ok(Ok(alerts)) => {
                if let Err(e) = crate::reclaim::alertmanager::push(&client, &am, &alerts).await {
                    tracing::warn!(error = %e, "Pushing hoarding alerts to Alertmanager failed; retried next interval.");
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "Reading the episodes for Alertmanager failed.")
            }
            Err(e) => tracing::warn!(error = %e, "The Alertmanager task failed."),
        }
    }
}

/// The hours the retention tick rewrites at `now` (`[from, to)`, whole hours), or `None` when
/// none is due: from where the ledger's record says the last rewrite ended (`done`; `None`, a
/// new ledger: its whole raw window), up to the last hour that ended
/// [`store::COMPACT_AFTER`] ago. An
/// hour that retention has begun to delete is left to it (the two would delete the same rows).
fn compaction_due(now: i64, done: Option<i64>, raw_secs: i64) -> Option<(i64, i64)> {
    let hour = |t: i64| t - t.rem_euclid(3600);
    let closed = hour(now - store::COMPACT_AFTER);
    let from = done.unwrap_or(i64::MIN).max(hour(now - raw_secs) + 3600);
    (closed > from).then_some((from, closed))
}

async fn retention_loop(app: AppState, compactor: store::Compactor) {
    let mut tick = tokio::time::interval(app.config.retention_interval);
    // Where the rewrite stopped before this start: the hours that closed since are rewritten
    // too (a restart left them in arrival order before migration 0011).
    let reading = compactor.clone();
    let read = tokio::task::spawn_blocking(move || reading.compacted_until())
        .await
        .map_err(|e| store::StoreError::Io(format!("the task failed: {e}")))
        .and_then(|read| read);
    let mut done = read.unwrap_or_else(|e| {
        tracing::error!(error = %e, "Reading where the raw rewrite stopped failed; hours before this start are left as they are.");
        let now = chrono::Utc::now().timestamp();
        Some(now - now.rem_euclid(3600))
    });
    app.metrics.raw_rewritten_until.set(done.unwrap_or(0));
    loop {
        tick.tick().await;
        let now = chrono::Utc::now().timestamp();
        if let Some((from, closed)) = compaction_due(now, done, app.config.retention.raw_secs) {
            match compactor.compact(&app.writer, from, closed).await {
                Ok(rows) => {
                    done = Some(closed);
                    app.metrics.raw_rewritten.inc_by(rows);
                    app.metrics.raw_rewritten_until.set(closed);
                    tracing::info!(
                        rows,
                        until = closed,
                        "Raw rows rewritten in instance order."
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "Compacting raw rows failed; retried at the next run.")
                }
            }
        }
        match app.writer.apply_retention(now, app.config.retention).await {
            Ok(report) => {
                for (table, n) in report.deleted {
                    app.metrics
                        .retention_deleted
                        .get_or_create(&TableLabels {
                            table: table.to_owned(),
                        })
                        .inc_by(n);
                    if n > 0 {
                        tracing::info!(table, rows = n, "Retention deleted expired rows.");
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "Retention failed; expired rows stay until the next run.")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::compaction_due;
    use gpuledger_ledger::store::COMPACT_AFTER;

    const H: i64 = 3600;

    #[test]
    fn the_rewrite_resumes_where_the_ledger_says_it_stopped() {
        let raw = 48 * H;
        let now = 1_000 * H + 20 * 60;
        // Steady state: the hour that ended 20 minutes ago is due, once.
        assert_eq!(
            compaction_due(now, Some(999 * H), raw),
            Some((999 * H, 1_000 * H))
        );
        assert_eq!(compaction_due(now, Some(1_000 * H), raw), None);
        // Not before it has been over for COMPACT_AFTER.
        assert_eq!(
            compaction_due(1_000 * H + COMPACT_AFTER - 1, Some(999 * H), raw),
            None
        );
        // After a restart five hours on, the hours that closed meanwhile.
        assert_eq!(
            compaction_due(now, Some(995 * H), raw),
            Some((995 * H, 1_000 * H))
        );
        // A new ledger: its raw window, less the hour retention has begun to delete; and a
        // record older than the window gives the same.
        let window = Some((1_000 * H - raw + H, 1_000 * H));
        assert_eq!(compaction_due(now, None, raw), window);
        assert_eq!(compaction_due(now, Some(10 * H), raw), window);
    }

    /// A ledger DuckDB has invalidated ends the service with an error, so that its supervisor
    /// restarts it (systemd's `Restart=always`, a Kubernetes container): until the file is
    /// opened again every statement fails, and `/healthz` alone would keep it running. What was
    /// committed before is there when the file is opened again.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_service_exits_when_duckdb_invalidates_the_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.duckdb");
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "node:n1 n1-token-0123456789abcdef\n").unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = listener.local_addr().unwrap();
        drop(listener);
        let config = crate::options::AggregatorOptions {
            db: Some(db.clone()),
            listen: Some(listen),
            token_file: Some(tokens),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        // A committed table, then DuckDB's own switch for a checkpoint that fails half-way, and a
        // checkpoint.
        let invalidate: super::Prepare = Box::new(|startup| {
            Box::pin(async move {
                startup
                    .writer
                    .apply(Box::new(|tx| {
                        tx.execute_batch(
                            "CREATE TABLE committed AS SELECT 42 AS x; SET debug_checkpoint_abort = 'before_header'",
                        )
                    }))
                    .await?;
                startup.writer.compacting_checkpoint().await?;
                Ok(())
            })
        });
        let served = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            super::run_with(config, std::future::pending(), Some(invalidate)),
        )
        .await
        .expect("the service ends without being told to");
        match served {
            Err(super::ServeError::LedgerInvalidated(why)) => {
                assert!(why.contains("invalidated"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let (conn, _) = gpuledger_ledger::store::open(&db).unwrap();
        let x: i32 = conn
            .query_row("SELECT x FROM committed", [], |r| r.get(0))
            .unwrap();
        assert_eq!(x, 42);
    }
}
