//! Every route of the aggregator, grouped by who calls it.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use tower::ServiceBuilder;
use tower::limit::ConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::api::{self, AppState, fragmentation, hoarding, ingest, shares, showback};

/// Largest body of a request to any route but ingest (they take none, or a small JSON).
pub const MAX_OTHER_BODY_BYTES: usize = 64 << 10;

/// The router with its limits. Ingest admits requests itself ([`api::admission`]: fair slots per
/// token, a body deadline), so it gets only the request timeout; every other route gets a
/// concurrency cap, a small body limit and the timeout (408).
pub fn router(state: AppState) -> Router {
    let limits = &state.config.limits;
    let timeout = || TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, limits.request_timeout);
    let exporters = Router::new()
        .route(gpuledger_schema::wire::INGEST_PATH, post(ingest::ingest))
        .layer(
            ServiceBuilder::new()
                // The ingest handler enforces its own body limit and deadline with JSON errors.
                .layer(DefaultBodyLimit::disable())
                .layer(timeout()),
        );
    Router::new()
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
                .layer(DefaultBodyLimit::max(MAX_OTHER_BODY_BYTES))
                .layer(ConcurrencyLimitLayer::new(limits.concurrency))
                .layer(timeout()),
        )
        // Exporters
        .merge(exporters)
        .with_state(state)
}
