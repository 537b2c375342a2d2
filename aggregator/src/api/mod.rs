//! The HTTP API: handlers next to their request and response types, one module per resource.
//! The routes are listed in [`crate::router`].

pub mod admission;
pub mod budgets;
pub mod energy;
pub mod export;
pub mod extract;
pub mod fragmentation;
pub mod hoarding;
pub mod ingest;
pub mod params;
pub mod reclaim;
pub mod rightsizing;
pub mod shares;
pub mod showback;

pub use params::{LATEST_TIME, time_param};

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use gpuledger_schema::exposition;

use crate::auth::Tokens;
use crate::config::Config;
use crate::telemetry::{AggregatorMetrics, TableLabels};
use gpuledger_ledger::store::Writer;
use gpuledger_ledger::store::query::{self, Readers};

/// What every handler shares.
pub struct App {
    /// Settings.
    pub config: Config,
    /// Who may call.
    pub tokens: Tokens,
    /// The one writer.
    pub writer: Writer,
    /// Reader connections.
    pub readers: Readers,
    /// Own metrics.
    pub metrics: Arc<AggregatorMetrics>,
    /// One analytics evaluation at a time (the loop and `POST /api/v1/analytics/evaluate`).
    pub analytics_lock: tokio::sync::Mutex<()>,
    /// Ingest slots, per token and in all.
    pub admission: admission::Admission,
    /// The last readiness answer and when it was found.
    pub readiness: tokio::sync::Mutex<Option<(std::time::Instant, Result<(), String>)>>,
    /// Wakes the delivery lanes (one per endpoint) when a pass put events in the outbox.
    pub deliveries: crate::reclaim::delivery::Lanes,
    /// The pages' signed-in sessions.
    pub sessions: crate::auth::session::Sessions,
    /// What the service is preparing before it is ready (`None` once ready): see
    /// [`crate::server::run_with`].
    pub preparing: std::sync::Mutex<Option<String>>,
    /// Rightsizing's per-day and per-hour demand histograms, kept between answers.
    pub demand: Arc<gpuledger_ledger::analytics::rightsizing::DemandCache>,
    /// This month's rightsizing savings per tenant, for `/metrics`, computed beside the
    /// evaluations.
    pub month_savings: MonthSavings,
}

/// This month's rightsizing savings per tenant, computed in a task of its own: the first
/// computation after a start reads the month's minute rows (seconds on a large fleet), which must
/// not hold up an evaluation and the reclaim pass behind it. Each evaluation publishes the last
/// result and starts the next computation unless one is still running.
#[derive(Default)]
pub struct MonthSavings {
    last: Arc<std::sync::Mutex<Vec<(String, f64)>>>,
    running: Arc<std::sync::atomic::AtomicBool>,
}

impl MonthSavings {
    /// The last result; starts a new computation when none runs (a connection that cannot be had
    /// now is logged, and the next evaluation tries again).
    fn refresh(&self, app: &App, raw_from: i64) -> Vec<(String, f64)> {
        use std::sync::atomic::Ordering;
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if self.running.load(Ordering::Acquire) {
            return last;
        }
        let conn = match app.readers.connect() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "Cannot compute this month's rightsizing for /metrics now.");
                return last;
            }
        };
        if self.running.swap(true, Ordering::AcqRel) {
            return last;
        }
        /// Clears the flag however the task ends, a panic included.
        struct Done(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.store(false, std::sync::atomic::Ordering::Release);
            }
        }
        let done = Done(self.running.clone());
        let (demand, settings) = (app.demand.clone(), app.config.analytics.clone());
        let slot = self.last.clone();
        tokio::task::spawn_blocking(move || {
            let _done = done;
            let v = month_savings(&conn, &demand, &settings, raw_from);
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = v;
        });
        last
    }
}

/// What one evaluation did: the analytics, then the reclaim pass over their episodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EvaluateReport {
    /// Recomputed GPU-hours, GPUs and episodes.
    #[serde(flatten)]
    pub analytics: gpuledger_ledger::analytics::PassReport,
    /// The reclaim decisions taken.
    pub reclaim: gpuledger_ledger::reclaim::pass::ReclaimReport,
}

impl App {
    /// Evaluates hoarding and fragmentation for every dirty GPU-hour, refreshes the analytics
    /// metrics, then runs the reclaim pass over the episodes as they now stand.
    #[tracing::instrument(name = "analytics.evaluate", skip_all)]
    pub async fn evaluate(&self) -> Result<EvaluateReport, gpuledger_ledger::store::StoreError> {
        let _one = self.analytics_lock.lock().await;
        let started = std::time::Instant::now();
        let report = gpuledger_ledger::analytics::evaluate(
            &self.readers,
            &self.writer,
            &self.config.analytics,
            10_000,
        )
        .await?;
        let conn = self.readers.connect()?;
        let settings = self.config.analytics.clone();
        let raw_from = chrono::Utc::now().timestamp() - self.config.retention.raw_secs;
        let current = tokio::task::spawn_blocking(move || {
            let mut current = gpuledger_ledger::analytics::current(&conn, &settings)?;
            let month = month_budgets(&conn, &settings, raw_from);
            current.budgets = month.as_ref().map_or_else(Vec::new, |b| {
                b.lines
                    .iter()
                    .map(|l| (l.tenant.clone(), (l.spent_ratio, l.forecast_ratio)))
                    .collect()
            });
            current.energy = month_energy(&conn, &settings.energy);
            Ok::<_, duckdb::Error>((current, month))
        })
        .await
        .map_err(|e| {
            gpuledger_ledger::store::StoreError::Io(format!("the analytics task failed: {e}"))
        })?
        .map_err(gpuledger_ledger::store::StoreError::from_db)?;
        let (mut current, month) = current;
        current.savings = self.month_savings.refresh(self, raw_from);
        self.metrics.set_current(&current);
        // A notice that cannot be queued now is decided again at the next evaluation; the
        // reclaim pass below must not wait for it.
        if let Err(e) = self.queue_budget_notices(month.as_ref()).await {
            tracing::warn!(error = %e, "Cannot queue this month's budget events; the next evaluation retries.");
        }
        if let Some(newest) = current.newest {
            use gpuledger_ledger::store::writer::WriteObserver;
            self.metrics.newest_sample(newest);
        }
        self.metrics
            .analytics_last_success
            .set(chrono::Utc::now().timestamp());
        self.metrics
            .analytics_seconds
            .observe(started.elapsed().as_secs_f64());
        let reclaim = crate::reclaim::run_pass(
            &self.readers,
            &self.writer,
            &self.config.analytics,
            &self.config.reclaim,
            &self.metrics,
            chrono::Utc::now().timestamp(),
        )
        .await?;
        if !reclaim.events.is_empty() {
            self.deliveries.wake();
        }
        Ok(EvaluateReport {
            analytics: report,
            reclaim,
        })
    }
}

impl App {
    /// Puts the `budget.*` events this month's budgets call for into the outbox (each at most
    /// once per tenant and month: `gpuledger_ledger::reclaim::budget_notices`), and wakes the
    /// delivery loop when any was added.
    async fn queue_budget_notices(
        &self,
        month: Option<&gpuledger_ledger::analytics::budgets::Budgets>,
    ) -> Result<(), gpuledger_ledger::store::StoreError> {
        use gpuledger_ledger::reclaim::budget_notices;
        let Some(b) = month else {
            return Ok(());
        };
        let now = chrono::Utc::now().timestamp();
        let notices = budget_notices::plan(
            b,
            &self.config.reclaim.endpoints,
            &self.config.analytics.billing,
            now,
        );
        if notices.is_empty() {
            return Ok(());
        }
        let added = self
            .writer
            .apply_with(move |tx| budget_notices::store(tx, &notices, now))
            .await?;
        if added > 0 {
            self.deliveries.wake();
        }
        Ok(())
    }
}

/// This month's budgets as of now, for `/metrics` and the budget events; none when no tenant
/// has a budget, or when the month cannot be priced now (logged; the next pass retries).
fn month_budgets(
    conn: &duckdb::Connection,
    settings: &gpuledger_ledger::analytics::Settings,
    raw_from: i64,
) -> Option<gpuledger_ledger::analytics::budgets::Budgets> {
    let now = chrono::Utc::now().timestamp();
    match gpuledger_ledger::analytics::budgets::forecast(
        conn,
        budgets::month_of(now),
        now,
        settings,
        raw_from,
        settings.billing.cost_mode,
        settings.billing.idle,
        None,
    ) {
        Ok(b) => Some(b).filter(|b| !b.lines.is_empty()),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot price this month's budgets for /metrics.");
            None
        }
    }
}

/// This month's measured energy (J) and CO₂e (g) so far per tenant, for `/metrics`; none when it
/// cannot be read now (logged; the next pass retries).
fn month_energy(
    conn: &duckdb::Connection,
    settings: &gpuledger_ledger::analytics::energy::Settings,
) -> Vec<(String, (f64, Option<f64>))> {
    use gpuledger_ledger::analytics::energy;
    let now = chrono::Utc::now().timestamp();
    let (from, _) = budgets::month_of(now);
    let to = now.div_euclid(60) * 60;
    if to <= from {
        return Vec::new();
    }
    match energy::energy(conn, (from, to), energy::GroupBy::Tenant, None, settings) {
        Ok(e) => e
            .rows
            .into_iter()
            .filter_map(|r| {
                let joules = r.energy_kwh * energy::JOULES_PER_KWH;
                Some((r.tenant?, (joules, r.co2e_kg.map(|kg| kg * 1000.0))))
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot read this month's energy for /metrics.");
            Vec::new()
        }
    }
}

/// This month's rightsizing savings so far per tenant with any, for `/metrics` (the month to
/// the newest whole minute); none when the month cannot be read now (logged; the next pass
/// retries).
fn month_savings(
    conn: &duckdb::Connection,
    cache: &gpuledger_ledger::analytics::rightsizing::DemandCache,
    settings: &gpuledger_ledger::analytics::Settings,
    raw_from: i64,
) -> Vec<(String, f64)> {
    let now = chrono::Utc::now().timestamp();
    let (from, _) = budgets::month_of(now);
    let to = now.div_euclid(60) * 60;
    if to <= from {
        return Vec::new();
    }
    match gpuledger_ledger::analytics::rightsizing::rightsizing(
        conn,
        cache,
        (from, to),
        settings,
        raw_from,
        Default::default(),
    ) {
        Ok(r) => {
            let mut by: std::collections::BTreeMap<String, i64> = Default::default();
            for row in r.rows.iter().filter(|r| r.recommendation) {
                *by.entry(row.tenant.clone()).or_default() += row.savings.0;
            }
            by.into_iter()
                .map(|(t, cents)| (t, cents as f64 / 100.0))
                .collect()
        }
        Err(e) => {
            tracing::warn!(error = %e, "Cannot compute this month's rightsizing for /metrics.");
            Vec::new()
        }
    }
}

/// `POST /api/v1/analytics/evaluate` (admin): evaluates now instead of at the next tick, and
/// says what it recomputed.
pub async fn evaluate_now(
    State(app): State<AppState>,
    _: extract::Admin,
) -> Result<axum::Json<EvaluateReport>, crate::error::ApiError> {
    let report = app
        .evaluate()
        .await
        .map_err(|e| crate::error::ApiError::internal(&e))?;
    Ok(axum::Json(report))
}

/// The state handlers extract.
#[derive(Clone)]
pub struct AppState(pub Arc<App>);

impl std::ops::Deref for AppState {
    type Target = App;
    fn deref(&self) -> &App {
        &self.0
    }
}

impl App {
    /// The `/metrics` text for `scope` (see [`metrics`]): `None`, the operational families;
    /// `Some(None)`, also every tenant's ledger families; `Some(Some(t))`, also tenant `t`'s own.
    /// Table row counts and the file size are read now. The OTLP push renders `Some(None)`.
    pub fn render_metrics(
        &self,
        scope: Option<&Option<String>>,
        format: exposition::Format,
    ) -> String {
        let m = &self.metrics;
        m.queue_samples.set(self.writer.queued_samples() as i64);
        m.queue_capacity.set(self.writer.capacity() as i64);
        m.database_bytes.set(self.readers.database_bytes() as i64);
        if let Some(bytes) = crate::telemetry::resident_bytes() {
            m.resident_bytes
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        let read = self
            .readers
            .connect()
            .and_then(|c| Ok((query::table_rows(&c)?, query::memory_bytes(&c)?)));
        match read {
            Ok((rows, memory)) => {
                for (table, n) in rows {
                    m.rows.get_or_create(&TableLabels { table }).set(n as i64);
                }
                m.store_memory_bytes
                    .set(i64::try_from(memory).unwrap_or(i64::MAX));
            }
            Err(e) => {
                tracing::warn!(error = %e, "Cannot read table sizes and DuckDB's memory for /metrics.")
            }
        }
        match scope {
            None => exposition::render(&[m.registry()], format),
            Some(tenant) => {
                let ledger = m.ledger_for(tenant.as_deref());
                exposition::render(&[m.registry(), ledger.registry()], format)
            }
        }
    }
}

/// `GET /metrics`: the aggregator's own families, OpenMetrics or classic by `Accept`. Table row
/// counts and file size are read at scrape time.
///
/// Who sees what (docs/metrics.md, "Who sees which metrics"): without a token, the operational
/// families only (ingest, writer, store, analytics runs), which name no tenant; with a `viewer` or
/// `admin` token, also the ledger families (tenants, hoarding episodes, fragmentation); with a
/// `tenant:` token, that tenant's own series of them; a node token sees the operational families.
/// An unknown token is 401, so a mistyped scrape credential fails loudly instead of silently losing
/// series.
pub async fn metrics(
    State(app): State<AppState>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, crate::error::ApiError> {
    let format = exposition::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let scope: Option<Option<String>> = match headers.contains_key(header::AUTHORIZATION) {
        false => None,
        true => match app.tokens.authenticate(&headers)? {
            crate::auth::Role::Node(_) | crate::auth::Role::AnyNode => None,
            role => Some(role.read_scope()?.map(str::to_owned)),
        },
    };
    let body = tokio::task::spawn_blocking(move || app.render_metrics(scope.as_ref(), format))
        .await
        .map_err(|e| crate::error::ApiError::internal(&e))?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, format.content_type())],
        body,
    ))
}

/// `GET /healthz`: the process answers.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness fails below this much free space on the ledger's filesystem. A one-row probe commit
/// can still succeed on a full disk (it fits in the write-ahead log's last block) while every
/// batch fails, so free space is asked directly.
pub const MIN_FREE_BYTES: u64 = 16 << 20;

/// How long a readiness answer is reused: probes from many load balancers (or a flood of them,
/// `/readyz` needs no token) cost one writer commit per this interval at most.
const READINESS_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /readyz`: 200 when the writer runs, its queue has room, the ledger's disk has room
/// ([`MIN_FREE_BYTES`]), the writer can commit (a one-row update through the writer: a read-only
/// or broken file fails it) and the ledger can be read (the newest hours of the tenant rollup,
/// which showback reads); 503 naming what failed otherwise
/// (a load balancer then sends exporters elsewhere, or they spool).
pub async fn readyz(State(app): State<AppState>) -> (StatusCode, String) {
    let preparing = app
        .preparing
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(what) = preparing {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("preparing: {what}\n"),
        );
    }
    if !app.writer.is_running() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the writer has stopped\n".into(),
        );
    }
    if app.writer.queued_samples() >= app.writer.capacity() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the writer queue is full\n".into(),
        );
    }
    let mut cache = app.readiness.lock().await;
    let fresh = cache
        .as_ref()
        .filter(|(at, _)| at.elapsed() < READINESS_TTL)
        .map(|(_, r)| r.clone());
    let result = match fresh {
        Some(r) => r,
        None => {
            let r = check_ready(&app).await;
            *cache = Some((std::time::Instant::now(), r.clone()));
            r
        }
    };
    match result {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

async fn check_ready(app: &AppState) -> Result<(), String> {
    if let Some(free) = app.readers.free_bytes()
        && free < MIN_FREE_BYTES
    {
        return Err(format!(
            "the ledger's disk is full: {free} bytes free, under {MIN_FREE_BYTES}; the writer cannot commit batches"
        ));
    }
    app.writer
        .probe()
        .await
        .map_err(|e| format!("the writer cannot commit: {e}"))?;
    let reader = app.clone();
    tokio::task::spawn_blocking(move || {
        let since = chrono::Utc::now().timestamp() - 2 * 3600;
        reader.readers.connect().and_then(|c| {
            c.query_row(
                "SELECT count(*), sum(gpu_seconds) FROM rollup_tenant_1h WHERE bucket >= ?",
                [since],
                |r| r.get::<_, i64>(0),
            )
            .map_err(gpuledger_ledger::store::StoreError::from_db)
        })
    })
    .await
    .map_err(|e| e.to_string())?
    .map(|_| ())
    .map_err(|e| format!("the ledger cannot be read: {e}"))
}
