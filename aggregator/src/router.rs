//! Every route of the aggregator, grouped by who calls it.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use tower::ServiceBuilder;
use tower::limit::ConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::api::{self, AppState, fragmentation, hoarding, ingest, reclaim, shares, showback};
use crate::ui;

/// Gives the answers no handler wrote — 404 for an unknown path, 405, the timeout's 408, a body
/// limit's 413 — the one JSON error shape (`crate::error`), so every 4xx and 5xx a client sees says
/// what is wrong the same way. Answers that carry a body already (a handler's JSON error,
/// `/readyz`'s sentence) are left as they are.
async fn json_errors(response: Response) -> Response {
    use axum::body::HttpBody;
    let status = response.status();
    let empty = response.body().size_hint().exact() == Some(0);
    if !(status.is_client_error() || status.is_server_error()) || !empty {
        return response;
    }
    let message = match status {
        StatusCode::NOT_FOUND => {
            "no such path; the routes are listed in docs/aggregator.md, \"Routes\""
        }
        StatusCode::METHOD_NOT_ALLOWED => "this path does not take that method",
        StatusCode::REQUEST_TIMEOUT => "the request took longer than the server allows",
        StatusCode::PAYLOAD_TOO_LARGE => "the body is over this route's limit",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "the body is not of a type this route takes",
        _ => status.canonical_reason().unwrap_or("the request failed"),
    };
    let mut answer = crate::error::ApiError::status(status, message).into_response();
    // Keep what the layer said beside the status (an Allow header on a 405, say).
    for (name, value) in response.headers() {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            answer.headers_mut().entry(name).or_insert(value.clone());
        }
    }
    answer
}

/// Largest body of a request to any route but ingest (they take none, or a small JSON).
pub const MAX_OTHER_BODY_BYTES: usize = 64 << 10;

/// The router with its limits. Ingest admits requests itself ([`api::admission`]: fair slots per
/// token, a body deadline), so it gets only the request timeout; every other route gets a
/// concurrency cap, a small body limit and the timeout (408).
pub fn router(state: AppState) -> Router {
    let limits = &state.config.limits;
    let timeout =
        || TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, limits.request_timeout);
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
        .route("/api/v1/showback.csv", get(showback::showback_csv))
        .route("/api/v1/bill", get(ui::bill_json))
        .route("/api/v1/budgets", get(api::budgets::budgets))
        .route("/api/v1/rightsizing", get(api::rightsizing::rightsizing))
        .route("/api/v1/energy", get(api::energy::energy))
        .route("/api/v1/energy.csv", get(api::energy::energy_csv))
        .route(
            "/api/v1/rightsizing.csv",
            get(api::rightsizing::rightsizing_csv),
        )
        .route("/api/v1/hoarding", get(hoarding::hoarding))
        .route("/api/v1/fragmentation", get(fragmentation::fragmentation))
        .route("/api/v1/shares", get(shares::shares))
        .route("/api/v1/reclaims", get(reclaim::reclaims))
        .route(
            "/api/v1/exemptions",
            get(reclaim::list_exemptions).post(reclaim::create_exemption),
        )
        .route("/api/v1/exemptions/{id}", delete(reclaim::delete_exemption))
        // Parquet for the fleet of clusters, while the ledger runs (admin).
        .route("/api/v1/export", post(api::export::export))
        // The showback pages (sign-in, session cookie or bearer token; `?format=csv&table=`)
        .route("/", get(ui::overview))
        .route("/tenants", get(ui::tenants))
        .route("/tenants/{tenant}", get(ui::tenant))
        .route("/fleet", get(ui::fleet))
        .route("/hoarding", get(ui::hoarding))
        .route("/prices", get(ui::prices))
        .route("/rightsizing", get(ui::rightsizing))
        .route("/signin", get(ui::signin_page).post(ui::signin))
        .route("/signout", post(ui::signout))
        .route("/hoarding/snooze", post(ui::snooze))
        // Keep links from the notices (no sign-in: the signed token is the credential)
        .route(
            "/keep/{token}",
            get(ui::keep::keep_page).post(ui::keep::keep),
        )
        // Admin
        .route("/api/v1/analytics/evaluate", post(api::evaluate_now))
        .route("/api/v1/webhooks/deliveries", get(reclaim::deliveries))
        .route("/api/v1/keep-links", post(reclaim::create_keep_link))
        .route(
            "/api/v1/keep-links/rotate",
            post(reclaim::rotate_keep_links),
        )
        .route("/api/v1/webhooks/replay", post(reclaim::replay))
        .route(
            "/api/v1/webhooks/endpoints/{name}/enable",
            post(reclaim::enable_endpoint),
        )
        // Alertmanager's webhook receiver (an admin token in its http_config)
        .route("/api/v1/alertmanager", post(reclaim::alertmanager_webhook))
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
        .layer(axum::middleware::map_response(json_errors))
        .with_state(state)
}
