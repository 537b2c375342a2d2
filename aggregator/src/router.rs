//! Every route of the aggregator, grouped by who calls it.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use tower::ServiceBuilder;
use tower::limit::ConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::api::{self, AppState, fragmentation, hoarding, ingest, shares, showback};

/// The router with its limits: a concurrency cap and a per-request timeout (408).
pub fn router(state: AppState) -> Router {
    let limits = &state.config.limits;
    Router::new()
        // Exporters
        .route(gpuledger_schema::wire::INGEST_PATH, post(ingest::ingest))
        // Finance, the web UI and scheduler tooling (viewer, tenant: and admin tokens)
        .route("/api/v1/showback", get(showback::showback))
        .route("/api/v1/hoarding", get(hoarding::hoarding))
        .route("/api/v1/fragmentation", get(fragmentation::fragmentation))
        .route("/api/v1/shares", get(shares::shares))
        // Admin
        .route("/api/v1/analytics/evaluate", post(api::evaluate_now))
        // Prometheus
        .route("/metrics", get(api::metrics))
        // Probes (Kubernetes, systemd, load balancers)
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .layer(
            ServiceBuilder::new()
                // The ingest handler enforces its own body limit with a JSON 413.
                .layer(DefaultBodyLimit::disable())
                .layer(ConcurrencyLimitLayer::new(limits.concurrency))
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    limits.request_timeout,
                )),
        )
        .with_state(state)
}
