//! The HTTP API: handlers next to their request and response types, one module per resource.
//! The routes are listed in [`crate::router`].

pub mod error;
pub mod fragmentation;
pub mod hoarding;
pub mod ingest;
pub mod shares;
pub mod showback;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use gpuledger_schema::exposition;

use crate::auth::Tokens;
use crate::config::Config;
use crate::store::Writer;
use crate::store::query::{self, Readers};
use crate::telemetry::{AggregatorMetrics, TableLabels};

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
}

impl App {
    /// Evaluates hoarding and fragmentation for every dirty GPU-hour, then refreshes the
    /// analytics metrics.
    pub async fn evaluate(&self) -> Result<crate::analytics::PassReport, crate::store::StoreError> {
        let _one = self.analytics_lock.lock().await;
        let started = std::time::Instant::now();
        let report =
            crate::analytics::evaluate(&self.readers, &self.writer, &self.config.analytics, 10_000)
                .await?;
        let conn = self.readers.connect()?;
        let settings = self.config.analytics.clone();
        let current =
            tokio::task::spawn_blocking(move || crate::analytics::current(&conn, &settings))
                .await
                .map_err(|e| {
                    crate::store::StoreError::Io(format!("the analytics task failed: {e}"))
                })?
                .map_err(crate::store::StoreError::from_db)?;
        self.metrics.set_current(&current);
        if let Some(newest) = current.newest {
            use crate::store::writer::WriteObserver;
            self.metrics.newest_sample(newest);
        }
        self.metrics
            .analytics_last_success
            .set(chrono::Utc::now().timestamp());
        self.metrics
            .analytics_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(report)
    }
}

/// Parses a time query parameter: RFC 3339 or Unix seconds; 400 naming it otherwise.
pub fn time_param(name: &'static str, value: Option<&str>) -> Result<Option<i64>, error::ApiError> {
    value
        .map(|v| {
            gpuledger_schema::trace::parse_timestamp(v).map_err(|e| {
                error::ApiError::bad_request(
                    name,
                    format!("{v:?} is not a time (RFC 3339 or Unix seconds): {e}"),
                )
            })
        })
        .transpose()
}

/// `[from, to)` from the query: `to` defaults to now, `from` to the start of `to`'s UTC month.
pub fn range_params(
    from: Option<&str>,
    to: Option<&str>,
    max_secs: i64,
) -> Result<(i64, i64), error::ApiError> {
    use chrono::{Datelike, TimeZone};
    let to = time_param("to", to)?.unwrap_or_else(|| chrono::Utc::now().timestamp());
    let from = match time_param("from", from)? {
        Some(f) => f,
        None => {
            let t = chrono::Utc
                .timestamp_opt(to, 0)
                .single()
                .unwrap_or_default();
            chrono::Utc
                .with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
                .single()
                .map_or(to, |m| m.timestamp())
        }
    };
    if from >= to {
        return Err(error::ApiError::bad_request(
            "from",
            format!("from ({from}) must be before to ({to})"),
        ));
    }
    if to - from > max_secs {
        return Err(error::ApiError::bad_request(
            "from",
            format!(
                "the range is {} s; at most {max_secs} s (the rollup retention) is kept",
                to - from
            ),
        ));
    }
    Ok((from, to))
}

/// `POST /api/v1/analytics/evaluate` (admin): evaluates now instead of at the next tick, and
/// says what it recomputed.
pub async fn evaluate_now(
    State(app): State<AppState>,
    headers: HeaderMap,
) -> Result<axum::Json<serde_json::Value>, error::ApiError> {
    app.tokens.authenticate(&headers)?.require_admin()?;
    let r = app
        .evaluate()
        .await
        .map_err(|e| error::ApiError::internal(&e))?;
    Ok(axum::Json(serde_json::json!({
        "gpu_hours": r.gpu_hours,
        "gpus": r.gpus,
        "episodes": r.episodes,
    })))
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

/// `GET /metrics`: the aggregator's own families, OpenMetrics or classic by `Accept`. Table row
/// counts and file size are read at scrape time.
pub async fn metrics(State(app): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    let format = exposition::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let body = tokio::task::spawn_blocking(move || {
        let m = &app.metrics;
        m.queue_samples.set(app.writer.queued_samples() as i64);
        m.queue_capacity.set(app.writer.capacity() as i64);
        m.database_bytes.set(app.readers.database_bytes() as i64);
        match app.readers.connect().and_then(|c| query::table_rows(&c)) {
            Ok(rows) => {
                for (table, n) in rows {
                    m.rows.get_or_create(&TableLabels { table }).set(n as i64);
                }
            }
            Err(e) => tracing::warn!(error = %e, "Cannot read table sizes for /metrics."),
        }
        exposition::render(&[m.registry()], format)
    })
    .await
    .unwrap_or_default();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, format.content_type())],
        body,
    )
}

/// `GET /healthz`: the process answers.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: 200 when the writer runs, the queue has room and the ledger answers a query;
/// 503 otherwise (a load balancer then sends exporters elsewhere or they spool).
pub async fn readyz(State(app): State<AppState>) -> (StatusCode, String) {
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
    let probe = tokio::task::spawn_blocking(move || {
        app.readers.connect().and_then(|c| {
            c.query_row("SELECT 1", [], |r| r.get::<_, i32>(0))
                .map_err(crate::store::StoreError::from_db)
        })
    })
    .await;
    match probe {
        Ok(Ok(_)) => (StatusCode::OK, "ready\n".into()),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the ledger does not answer: {e}\n"),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}
