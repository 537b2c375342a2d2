//! The exporter's HTTP endpoint: `GET /metrics` (OpenMetrics or classic text, by `Accept`) and
//! `GET /healthz`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use gpuledger_schema::exposition;

use crate::metrics::Metrics;

/// The routes, grouped by caller: Prometheus, then probes.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        // Prometheus
        .route("/metrics", get(metrics_handler))
        // Kubernetes / systemd probes
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(metrics)
}

async fn metrics_handler(
    State(metrics): State<Arc<Metrics>>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let format = exposition::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let body = tokio::task::block_in_place(|| metrics.render(format));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, format.content_type())],
        body,
    )
}
