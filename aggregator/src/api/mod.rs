//! The HTTP API: handlers next to their request and response types, one module per resource.
//! The routes are listed in [`crate::router`].

pub mod error;
pub mod ingest;

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
