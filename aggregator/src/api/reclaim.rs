//! The reclaim API (docs/reclaim.md):
//!
//! - `GET /api/v1/reclaims?from=&to=&limit=`: every decision and its reason (viewer, admin, or a
//!   `tenant:` token for its own);
//! - `GET /api/v1/exemptions?limit=&after=` (paged by id), `POST /api/v1/exemptions` (admin, or a
//!   `tenant:` token for its own workloads: the "keep it 4 more hours" answer to a notice; at most
//!   `max_exemptions_per_tenant` in force), `DELETE /api/v1/exemptions/{id}`;
//! - admin: `GET /api/v1/webhooks/deliveries?state=&endpoint=&event_id=`,
//!   `POST /api/v1/webhooks/replay`, `POST /api/v1/webhooks/endpoints/{name}/enable`;
//! - `POST /api/v1/alertmanager` (admin): Alertmanager's webhook;
//! - `POST /api/v1/keep-links` (admin): a keep link for a followed episode (docs/reclaim.md,
//!   "Keep links").

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::extract::{self, Admin, Caller, Query, Reader, Time};
use super::{AppState, time_param};
use crate::auth::Role;
use crate::error::ApiError;
use crate::reclaim::alertmanager::{self, IntakeReport, WebhookMessage};
use gpuledger_ledger::reclaim::records::{
    self, Decision, Delivery, Exemption, NewExemption, Replay,
};

/// Parses a JSON body, naming the field at fault.
async fn read<T: Send + 'static>(
    app: &AppState,
    f: impl FnOnce(&duckdb::Connection) -> duckdb::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    tokio::task::spawn_blocking(move || f(&conn))
        .await
        .map_err(|e| ApiError::internal(&e))?
        .map_err(|e| ApiError::internal(&e))
}

async fn write<T: Send + 'static>(
    app: &AppState,
    f: impl FnOnce(&duckdb::Transaction<'_>) -> duckdb::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    app.writer
        .apply_with(f)
        .await
        .map_err(|e| ApiError::unavailable(format!("the ledger cannot be written: {e}"), 5))
}

/// The most rows one answer of these lists has: at a few hundred bytes a row, under 1 MB.
const MAX_ROWS: i64 = 2000;

fn limit(limit: Option<i64>) -> Result<i64, ApiError> {
    match limit {
        None => Ok(1000),
        Some(n) if (1..=MAX_ROWS).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(
            "limit",
            format!("{n} is not 1 to {MAX_ROWS}"),
        )),
    }
}

/// The query of `GET /api/v1/reclaims`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimsQuery {
    /// Decisions at or after this (default: all).
    pub from: Option<Time>,
    /// Decisions before this.
    pub to: Option<Time>,
    /// At most this many (1 to 2000, default 1000).
    pub limit: Option<i64>,
}

/// A query that takes no parameters.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// The query of `GET /api/v1/exemptions`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExemptionsQuery {
    /// At most this many (1 to 2000, default 1000).
    pub limit: Option<i64>,
    /// The page after this exemption id: the previous answer's `next`.
    pub after: Option<String>,
}

/// The query of `GET /api/v1/webhooks/deliveries`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    /// Only rows in this state.
    pub state: Option<String>,
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Only this event.
    pub event_id: Option<String>,
    /// At most this many (1 to 2000, default 1000).
    pub limit: Option<i64>,
}

/// The answer of `GET /api/v1/reclaims`.
#[derive(Debug, serde::Serialize)]
pub struct Reclaims {
    /// Whether the aggregator runs in dry-run.
    pub dry_run: bool,
    /// The decisions, newest first.
    pub decisions: Vec<Decision>,
}

/// `GET /api/v1/reclaims`.
pub async fn reclaims(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<ReclaimsQuery>,
) -> Result<Json<Reclaims>, ApiError> {
    let tenant = reader.scope;
    let from = q.from.map_or(0, |t| t.0);
    let to = q.to.map_or(i64::MAX, |t| t.0);
    let limit = limit(q.limit)?;
    let decisions = read(&app, move |c| {
        records::decisions(c, from, to, tenant.as_deref(), limit)
    })
    .await?;
    Ok(Json(Reclaims {
        dry_run: app.config.reclaim.dry_run,
        decisions,
    }))
}

/// The answer of `GET /api/v1/exemptions`.
#[derive(Debug, serde::Serialize)]
pub struct Exemptions {
    /// Exemptions in force, in the order they were made.
    pub exemptions: Vec<Exemption>,
    /// Where the next page starts (`?after=`); absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// `GET /api/v1/exemptions`: those in force (a `tenant:` token sees its own), a page at a time.
pub async fn list_exemptions(
    State(app): State<AppState>,
    reader: Reader,
    Query(q): Query<ExemptionsQuery>,
) -> Result<Json<Exemptions>, ApiError> {
    let tenant = reader.scope;
    let now = chrono::Utc::now().timestamp();
    let limit = limit(q.limit)?;
    let after = q.after;
    let mut exemptions = read(&app, move |c| {
        records::exemptions(c, now, tenant.as_deref(), after.as_deref(), limit + 1)
    })
    .await?;
    let next = if exemptions.len() as i64 > limit {
        exemptions.truncate(limit as usize);
        exemptions.last().map(|e| e.exemption_id.clone())
    } else {
        None
    };
    Ok(Json(Exemptions { exemptions, next }))
}

/// Longest snooze: a week (a permanent exemption belongs in the config file).
const MAX_SNOOZE_SECS: u64 = 7 * 86400;

/// `POST /api/v1/exemptions`: keep a workload for a while.
pub async fn create_exemption(
    State(app): State<AppState>,
    Caller(role): Caller,
    extract::Json(req): extract::Json<NewExemption>,
) -> Result<(StatusCode, Json<Exemption>), ApiError> {
    let e = add_exemption(&app, &role, req, "snoozed through the API").await?;
    Ok((StatusCode::CREATED, Json(e)))
}

/// Checks a snooze against the role (an admin names any tenant; a `tenant:` role only its own)
/// and the limits (at most a week; a workload of 1 to 512 bytes), stores it and logs it; 4xx
/// naming the field otherwise. `POST /api/v1/exemptions` and the Hoarding page's snooze form.
pub async fn add_exemption(
    app: &AppState,
    role: &Role,
    req: NewExemption,
    default_reason: &str,
) -> Result<Exemption, ApiError> {
    // Who may, for which tenant, and how the exemption records its author.
    let (tenant, created_by) = match (role, req.tenant) {
        (Role::Admin, t) => (t, "admin".to_owned()),
        (Role::Tenant(own), None) => (Some(own.clone()), format!("tenant:{own}")),
        (Role::Tenant(own), Some(t)) if *own == t => (Some(t), format!("tenant:{own}")),
        (Role::Tenant(_), Some(_)) => {
            return Err(ApiError::forbidden(
                "tenant",
                "a tenant: token can only exempt its own tenant's workloads",
            ));
        }
        _ => {
            return Err(ApiError::forbidden(
                "authorization",
                "this needs an admin token or the tenant's own token",
            ));
        }
    };
    let span = humantime::parse_duration(&req.duration).map_err(|e| {
        ApiError::bad_request(
            "duration",
            format!("{:?} is not a duration: {e}", req.duration),
        )
    })?;
    if span.is_zero() || span.as_secs() > MAX_SNOOZE_SECS {
        return Err(ApiError::bad_request(
            "duration",
            format!(
                "must be more than 0 s and at most {MAX_SNOOZE_SECS} s (a week); use reclaim.exemptions in the config for longer"
            ),
        ));
    }
    if let Some(w) = &req.workload
        && (w.is_empty() || w.len() > gpuledger_schema::sample::MAX_NAME_BYTES)
    {
        return Err(ApiError::bad_request("workload", "must be 1 to 512 bytes"));
    }
    if let Some(r) = &req.reason
        && r.len() > records::MAX_REASON_BYTES
    {
        return Err(ApiError::bad_request(
            "reason",
            format!(
                "{} bytes is longer than the {} a reason may have",
                r.len(),
                records::MAX_REASON_BYTES
            ),
        ));
    }
    let now = chrono::Utc::now().timestamp();
    let e = Exemption {
        exemption_id: format!("exm_{}", uuid::Uuid::now_v7().simple()),
        tenant,
        workload: req.workload,
        until: now + span.as_secs() as i64,
        reason: req.reason.unwrap_or_else(|| default_reason.into()),
        created_by,
        created_at: now,
    };
    let stored = e.clone();
    let most = app.config.limits.max_exemptions_per_tenant as u64;
    let in_force = write(app, move |tx| {
        let n = records::exemptions_in_force(tx, now, stored.tenant.as_deref())?;
        if n < most {
            records::insert_exemption(tx, &stored)?;
        }
        Ok(n)
    })
    .await?;
    if in_force >= most {
        return Err(ApiError::unprocessable(
            "tenant",
            format!(
                "{} already has {in_force} exemptions in force, the most it may have \
                 (--max-exemptions-per-tenant); end one (DELETE /api/v1/exemptions/{{id}}) or wait \
                 for one to lapse",
                e.tenant
                    .as_deref()
                    .map_or("every tenant".to_owned(), |t| format!("tenant {t:?}"))
            ),
        ));
    }
    tracing::info!(
        exemption = e.exemption_id,
        tenant = e.tenant.as_deref().unwrap_or("*"),
        workload = e.workload.as_deref().unwrap_or("*"),
        until = e.until,
        by = e.created_by,
        "A reclaim exemption was added."
    );
    Ok(e)
}

/// `DELETE /api/v1/exemptions/{id}`: ends it now (admin, or the tenant's own token).
pub async fn delete_exemption(
    State(app): State<AppState>,
    Caller(role): Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let scope = match &role {
        Role::Admin => None,
        Role::Tenant(t) => Some(t.clone()),
        _ => {
            return Err(ApiError::forbidden(
                "authorization",
                "this needs an admin or tenant: token",
            ));
        }
    };
    let now = chrono::Utc::now().timestamp();
    let n = write(&app, move |tx| {
        records::end_exemption(tx, &id, scope.as_deref(), now)
    })
    .await?;
    if n == 0 {
        return Err(ApiError::status(
            StatusCode::NOT_FOUND,
            "no exemption in force with that id",
        ));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The answer of `GET /api/v1/webhooks/deliveries`.
#[derive(Debug, serde::Serialize)]
pub struct Deliveries {
    /// Endpoints a 410 disabled.
    pub disabled_endpoints: Vec<String>,
    /// The rows, newest first.
    pub deliveries: Vec<Delivery>,
}

/// `GET /api/v1/webhooks/deliveries` (admin).
pub async fn deliveries(
    State(app): State<AppState>,
    _: Admin,
    Query(q): Query<DeliveriesQuery>,
) -> Result<Json<Deliveries>, ApiError> {
    let state = q.state;
    if let Some(s) = &state
        && !records::DELIVERY_STATES.contains(&s.as_str())
    {
        return Err(ApiError::bad_request(
            "state",
            format!("{s:?} is not one of {:?}", records::DELIVERY_STATES),
        ));
    }
    let (endpoint, event_id) = (q.endpoint, q.event_id);
    let limit = limit(q.limit)?;
    let (deliveries, disabled_endpoints) = read(&app, move |c| {
        let rows = records::deliveries(
            c,
            state.as_deref(),
            endpoint.as_deref(),
            event_id.as_deref(),
            limit,
        )?;
        let mut stmt = c.prepare_cached("SELECT endpoint FROM webhook_endpoints ORDER BY 1")?;
        let off = stmt
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        Ok((rows, off))
    })
    .await?;
    Ok(Json(Deliveries {
        disabled_endpoints,
        deliveries,
    }))
}

/// The answer of a replay or an enable.
#[derive(Debug, Default, serde::Serialize)]
pub struct Requeued {
    /// Rows put back to pending.
    pub requeued: usize,
}

/// `POST /api/v1/webhooks/replay` (admin): sends matching events again, under their own ids.
pub async fn replay(
    State(app): State<AppState>,
    _: Admin,
    bytes: axum::body::Bytes,
) -> Result<Json<Requeued>, ApiError> {
    let req: Replay = if bytes.is_empty() {
        crate::error::json_body(b"{}")?
    } else {
        crate::error::json_body(&bytes)?
    };
    let from = time_param("from", req.from.as_deref())?.unwrap_or(0);
    let to = time_param("to", req.to.as_deref())?.unwrap_or(i64::MAX);
    let mut states = req.states;
    if states.is_empty() {
        states = vec!["failed".into(), "disabled".into()];
    }
    for (i, s) in states.iter().enumerate() {
        if !["delivered", "failed", "disabled"].contains(&s.as_str()) {
            return Err(ApiError::bad_request(
                format!("states[{i}]"),
                format!(
                    "{s:?} is not one of delivered, failed, disabled (a cancelled event is never sent again)"
                ),
            ));
        }
    }
    let now = chrono::Utc::now().timestamp();
    let (event_id, endpoint) = (req.event_id, req.endpoint);
    let requeued = write(&app, move |tx| {
        records::requeue(
            tx,
            event_id.as_deref(),
            from,
            to,
            endpoint.as_deref(),
            &states,
            now,
        )
    })
    .await?;
    app.deliveries.wake();
    Ok(Json(Requeued { requeued }))
}

/// `POST /api/v1/webhooks/endpoints/{name}/enable` (admin): undoes a 410's disabling.
pub async fn enable_endpoint(
    State(app): State<AppState>,
    _: Admin,
    Path(name): Path<String>,
) -> Result<Json<Requeued>, ApiError> {
    if !app.config.reclaim.endpoints.iter().any(|e| e.name == name) {
        return Err(ApiError::status(
            StatusCode::NOT_FOUND,
            "no endpoint is configured with that name",
        ));
    }
    let now = chrono::Utc::now().timestamp();
    let requeued = write(&app, move |tx| records::enable_endpoint(tx, &name, now)).await?;
    app.deliveries.wake();
    Ok(Json(Requeued { requeued }))
}

/// `POST /api/v1/alertmanager` (admin token in Alertmanager's `http_config.authorization`).
pub async fn alertmanager_webhook(
    State(app): State<AppState>,
    _: Admin,
    extract::Json(msg): extract::Json<WebhookMessage>,
) -> Result<Json<IntakeReport>, ApiError> {
    if msg.version != "4" {
        return Err(ApiError::bad_request(
            "version",
            format!(
                "{:?}: only Alertmanager's webhook payload version 4 is understood",
                msg.version
            ),
        ));
    }
    let (ids, report) = alertmanager::confirmed(&msg);
    let now = chrono::Utc::now().timestamp();
    if !ids.is_empty() {
        write(&app, move |tx| alertmanager::store(tx, &ids, now)).await?;
    }
    Ok(Json(report))
}

/// `POST /api/v1/keep-links`'s body.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepLinkRequest {
    /// A followed episode (`ep_…`).
    pub episode_id: String,
}

/// `POST /api/v1/keep-links`'s answer.
#[derive(Debug, serde::Serialize)]
pub struct KeepLink {
    /// The link.
    pub keep_url: String,
    /// When it expires (Unix seconds).
    pub expires_at: i64,
}

/// `POST /api/v1/keep-links` (admin): a keep link for an open episode, as a notice carries it
/// (for a person told some other way, and for the demo).
pub async fn create_keep_link(
    State(app): State<AppState>,
    _: Admin,
    extract::Json(req): extract::Json<KeepLinkRequest>,
) -> Result<(StatusCode, Json<KeepLink>), ApiError> {
    let id = req.episode_id.clone();
    let row = read(&app, move |c| {
        let mut stmt = c.prepare(
            "SELECT tenant, workload FROM reclaim_episodes
             WHERE episode_id = ? AND state <> 'resolved'",
        )?;
        let mut rows = stmt.query_map([&id], |r| {
            Ok((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, Option<String>>(1)?,
            ))
        })?;
        rows.next().transpose()
    })
    .await?;
    let Some((tenant, workload)) = row else {
        return Err(ApiError::unprocessable(
            "episode_id",
            "no open episode has this id (GET /api/v1/reclaims lists them)",
        ));
    };
    if !gpuledger_ledger::reclaim::pass::keepable(tenant.as_deref(), workload.as_deref()) {
        return Err(ApiError::unprocessable(
            "episode_id",
            "its tenant or workload is unknown, or a glob: a link could not name it alone",
        ));
    }
    let links = &app.config.reclaim.links;
    let now = chrono::Utc::now().timestamp();
    let keep_url = links
        .url(&req.episode_id, now)
        .ok_or_else(|| ApiError::bad_request("episode_id", "not an episode id (ep_ and 24 hex)"))?;
    Ok((
        StatusCode::CREATED,
        Json(KeepLink {
            keep_url,
            expires_at: now + links.ttl.as_secs() as i64,
        }),
    ))
}

/// `POST /api/v1/keep-links/rotate`'s body.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateRequest {
    /// Refuse every link signed so far at once (a leak), rather than when it would expire.
    #[serde(default)]
    pub revoke: bool,
}

/// `POST /api/v1/keep-links/rotate`'s answer.
#[derive(Debug, serde::Serialize)]
pub struct Rotated {
    /// The key that signs from now.
    pub key_id: u32,
    /// Until when the previous key still verifies the links it signed (Unix seconds).
    pub previous_valid_until: i64,
}

/// `POST /api/v1/keep-links/rotate` (admin): a new key signs keep links from now; the previous
/// one verifies until its links would expire anyway (`link_ttl`), or not at all with
/// `{"revoke": true}`.
pub async fn rotate_keep_links(
    State(app): State<AppState>,
    _: Admin,
    extract::Json(req): extract::Json<RotateRequest>,
) -> Result<Json<Rotated>, ApiError> {
    let now = chrono::Utc::now().timestamp();
    let links = &app.config.reclaim.links;
    let retire_at = if req.revoke {
        now
    } else {
        now + links.ttl.as_secs() as i64
    };
    let mut secret = vec![0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| ApiError::internal(&e))?;
    let keys = write(&app, move |tx| {
        gpuledger_ledger::reclaim::links::rotate(tx, now, retire_at, secret)?;
        gpuledger_ledger::reclaim::links::keys(tx, now)
    })
    .await?;
    let key_id = keys.first().map_or(0, |k| k.id);
    links.keys.set(keys);
    tracing::info!(
        key_id,
        revoke = req.revoke,
        "The keep-link key was rotated."
    );
    Ok(Json(Rotated {
        key_id,
        previous_valid_until: retire_at,
    }))
}
