//! The keep links of the notices (docs/reclaim.md, "Keep links"): `GET /keep/{token}` shows one
//! episode and changes nothing (chat clients and mail scanners open links on their own);
//! `POST /keep/{token}` keeps its workload from reclaim for one of the configured durations.
//!
//! Key decision: the token is the only credential, and it names an episode, never a tenant or a
//! workload: what is shown and kept is read from the ledger's row of that episode, so a token for
//! one episode can never show or keep another. The POST's CSRF guard has no session to lean on:
//! same origin, plus a form token the page hands out (a MAC of the token's signature and the
//! minute, for an hour). Tokens and their URLs are never logged nor used as a metric label, and
//! these handlers are not traced.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use gpuledger_ledger::reclaim::chat::{keep_label, span_text};
use gpuledger_ledger::reclaim::links::{self, KeepOutcome};
use gpuledger_ledger::reclaim::records::Exemption;
use gpuledger_schema::keep::{self, KeepError};
use gpuledger_schema::webhook::{self, EpisodeData};
use gpuledger_web::{Keep, KeepButton, KeepRefused};

use crate::api::AppState;
use crate::api::extract::Query;
use crate::error::{ApiError, Form};
use crate::telemetry::KeepOutcomeLabels;

/// The form token's domain (kept apart from the link tokens).
const FORM_DOMAIN: &str = "keep-form";
/// How long a page's form token is accepted, in minutes.
const FORM_MINUTES: i64 = 60;

/// The query of `GET /keep/{token}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepQuery {
    /// The duration a chat button asked for: only marked on the page, never kept by a GET.
    pub d: Option<String>,
}

/// The keep form.
#[derive(serde::Deserialize)]
pub struct KeepForm {
    duration: String,
    form: String,
    t: String,
}

/// A keep-link answer that is not the page: 403 or 410 with a page saying why, or the one JSON
/// error shape for a bad field.
pub enum Refusal {
    /// Not a link of this aggregator, or altered (403).
    Forbidden(&'static str),
    /// Expired, or its episode ended (410).
    Gone(String),
    /// Any other error.
    Api(ApiError),
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        Refusal::Api(e)
    }
}

fn private(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Not `no-referrer`: with it a browser posts the page's form with `Origin: null`, which the
    // same-origin check refuses. `same-origin` still keeps the token's URL from other sites.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert("x-robots-tag", HeaderValue::from_static("noindex"));
    r
}

impl Refusal {
    fn respond(self, app: &AppState) -> Response {
        let (status, title, why, outcome) = match self {
            Refusal::Api(e) => return private(e.into_response()),
            Refusal::Forbidden(why) => (
                StatusCode::FORBIDDEN,
                "This link is not valid",
                why.to_owned(),
                "forbidden",
            ),
            Refusal::Gone(why) => (StatusCode::GONE, "This link has ended", why, "gone"),
        };
        count(app, outcome);
        let page = KeepRefused {
            title: title.into(),
            why,
        };
        match page.render() {
            Ok(h) => private((status, Html(h)).into_response()),
            Err(e) => ApiError::internal(&e).into_response(),
        }
    }
}

fn count(app: &AppState, outcome: &'static str) {
    app.metrics
        .keep_requests
        .get_or_create(&KeepOutcomeLabels { outcome })
        .inc();
}

fn rfc(t: i64) -> String {
    webhook::rfc3339(t).replace('T', " ").replace('Z', " UTC")
}

/// Checks the token: its claims, or why it is refused. Neither answer says which check failed
/// beyond altered-or-foreign versus expired.
fn verify(app: &AppState, token: &str, now: i64) -> Result<keep::Claims, Refusal> {
    let ring = app.config.reclaim.links.keys.keys();
    match keep::verify(&ring, token, now) {
        Ok(c) => Ok(c),
        Err(KeepError::Expired) => {
            let exp = token
                .split('.')
                .nth(3)
                .and_then(|e| e.parse::<i64>().ok())
                .unwrap_or(now);
            Err(Refusal::Gone(format!(
                "This link expired on {}. A newer notice carries a new link.",
                rfc(exp)
            )))
        }
        Err(_) => Err(Refusal::Forbidden(
            "This link is not valid: it was altered, or it is not from this gpuledger.",
        )),
    }
}

/// The episode as the ledger holds it.
struct Stored {
    tenant: Option<String>,
    workload: Option<String>,
    state: String,
    started_at: i64,
    notified_at: Option<i64>,
    requested_at: Option<i64>,
    ended_at: Option<i64>,
    data: EpisodeData,
    /// Whether a scheduler webhook got the reclaim request.
    request_delivered: bool,
    kept_seconds: i64,
    kept_until: Option<i64>,
}

async fn stored(app: &AppState, episode_id: String, now: i64) -> Result<Option<Stored>, ApiError> {
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let analytics = app.config.analytics.clone();
    tokio::task::spawn_blocking(move || -> duckdb::Result<Option<Stored>> {
        let row = conn.query_row(
            "SELECT tenant, workload, state, started_at, notified_at, requested_at, closed_at, data
             FROM reclaim_episodes WHERE episode_id = ?",
            [&episode_id],
            |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<i64>>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                    r.get::<_, Option<i64>>(6)?,
                    r.get::<_, String>(7)?,
                ))
            },
        );
        let (tenant, workload, state, started_at, notified_at, requested_at, ended_at, data) =
            match row {
                Ok(r) => r,
                Err(duckdb::Error::QueryReturnedNoRows) => return Ok(None),
                Err(e) => return Err(e),
            };
        let Ok(mut data) = serde_json::from_str::<EpisodeData>(&data) else {
            return Ok(None);
        };
        // Fresh figures when the analytics still report the episode.
        let fresh = gpuledger_ledger::analytics::episodes(
            &conn,
            gpuledger_ledger::analytics::EpisodeState::All,
            started_at,
            i64::MAX,
            tenant.as_deref(),
            &analytics,
        )?
        .into_iter()
        .find(|e| gpuledger_ledger::reclaim::pass::id_of(e) == episode_id);
        let mut ended_at = ended_at;
        if let Some(e) = fresh {
            data.idle_seconds = e.last_second + 1 - e.started_at;
            data.idle_cost = e.cost;
            ended_at = ended_at.or(e.ended_at);
        }
        let request_delivered: bool = conn.query_row(
            "SELECT count(*) > 0 FROM webhook_outbox
             WHERE episode_id = ? AND event_type = 'reclaim.requested' AND state = 'delivered'
               AND coalesce(channel, 'webhook') = 'webhook'",
            [&episode_id],
            |r| r.get(0),
        )?;
        let kept_seconds = links::kept_seconds(&conn, &episode_id)?;
        let kept_until = match (&tenant, &workload) {
            (Some(t), Some(w)) => links::kept_until(&conn, now, t, w)?,
            _ => None,
        };
        Ok(Some(Stored {
            tenant,
            workload,
            state,
            started_at,
            notified_at,
            requested_at,
            ended_at,
            data,
            request_delivered,
            kept_seconds,
            kept_until,
        }))
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| ApiError::internal(&e))
}

/// The episode of a valid token, unless it ended (410) or cannot be kept by a link (403).
async fn episode(app: &AppState, claims: &keep::Claims, now: i64) -> Result<Stored, Refusal> {
    let Some(s) = stored(app, claims.episode_id.clone(), now).await? else {
        return Err(Refusal::Gone(
            "This episode is no longer followed: the GPU is in use again or was released.".into(),
        ));
    };
    if s.state == "resolved" || s.ended_at.is_some() {
        return Err(Refusal::Gone(format!(
            "This episode ended at {}: the GPU is in use again or was released, so there is nothing to keep.",
            rfc(s.ended_at.unwrap_or(now))
        )));
    }
    if !gpuledger_ledger::reclaim::pass::keepable(s.tenant.as_deref(), s.workload.as_deref()) {
        return Err(Refusal::Forbidden(
            "This episode's workload cannot be kept through a link.",
        ));
    }
    Ok(s)
}

/// When the reclaim comes, in words.
fn deadline(s: &Stored, now: i64) -> String {
    let p = &s.data.policy;
    if let Some(until) = s.kept_until {
        return format!("not before {} (kept)", rfc(until));
    }
    match (s.state.as_str(), p.after_seconds, p.notice_seconds) {
        ("requested", _, _) if s.request_delivered => format!(
            "already sent to the scheduler at {}; keeping now cannot stop it",
            rfc(s.requested_at.unwrap_or(now))
        ),
        ("requested", _, _) => {
            "requested, not yet delivered to the scheduler: keeping now withdraws the request"
                .into()
        }
        (_, Some(after), Some(notice)) => {
            let told = s.notified_at.unwrap_or(now);
            format!(
                "not before {}",
                rfc((s.started_at + after).max(told + notice))
            )
        }
        _ => "not reclaimed (notify only)".into(),
    }
}

fn page(
    app: &AppState,
    token: &str,
    s: &Stored,
    highlight: Option<&str>,
    message: Option<String>,
    now: i64,
) -> Result<Keep, ApiError> {
    let links = &app.config.reclaim.links;
    let bound = links.max_per_episode.as_secs() as i64;
    let left = bound - s.kept_seconds;
    let key = links
        .keys
        .signing()
        .ok_or_else(|| ApiError::unavailable("keep links have no signing key", 5))?;
    let sig = token.rsplit('.').next().unwrap_or_default();
    let minute = (now / 60).to_string();
    let d = &s.data;
    Ok(Keep {
        workload: s.workload.clone().unwrap_or_default(),
        tenant: s.tenant.clone().unwrap_or_default(),
        owner: d.owner.as_ref().map(|o| o.describe()),
        node: d.node.clone(),
        gpu: match &d.mig_profile {
            Some(p) => format!("{} {p}", d.gpu_model),
            None => d.gpu_model.clone(),
        },
        idle_for: span_text(d.idle_seconds),
        idle_cost: format!("{:.2} {}", d.idle_cost, d.currency),
        deadline: deadline(s, now),
        kept_until: s.kept_until.map(rfc),
        used: span_text(s.kept_seconds),
        bound: span_text(bound),
        buttons: (links.durations.iter())
            .filter(|(_, span)| span.as_secs() as i64 <= left)
            .map(|(t, _)| KeepButton {
                value: t.clone(),
                label: keep_label(t),
                highlighted: highlight == Some(t.as_str()),
            })
            .collect(),
        action: format!("/keep/{token}"),
        form: keep::tag(&key, FORM_DOMAIN, &[sig, &minute]),
        form_t: minute,
        message,
    })
}

fn render(p: &Keep, status: StatusCode) -> Response {
    match p.render() {
        Ok(h) => private((status, Html(h)).into_response()),
        Err(e) => ApiError::internal(&e).into_response(),
    }
}

/// `GET /keep/{token}` (and HEAD): the episode, its cost and deadline, and the keep buttons.
/// Changes nothing.
pub async fn keep_page(
    State(app): State<AppState>,
    Path(token): Path<String>,
    Query(q): Query<KeepQuery>,
) -> Response {
    let now = chrono::Utc::now().timestamp();
    let shown = async {
        let claims = verify(&app, &token, now)?;
        let s = episode(&app, &claims, now).await?;
        Ok::<_, Refusal>(page(&app, &token, &s, q.d.as_deref(), None, now)?)
    }
    .await;
    match shown {
        Ok(p) => {
            count(&app, "shown");
            render(&p, StatusCode::OK)
        }
        Err(r) => r.respond(&app),
    }
}

/// `POST /keep/{token}`: keeps the episode's workload for the posted duration (an exemption made
/// `by = "link"`), within the per-episode bound; then a reclaim pass runs, so a pending request is
/// withdrawn at once.
pub async fn keep(
    State(app): State<AppState>,
    Path(token): Path<String>,
    headers: HeaderMap,
    Form(f): Form<KeepForm>,
) -> Response {
    let now = chrono::Utc::now().timestamp();
    match keep_inner(&app, &token, &headers, f, now).await {
        Ok(r) => r,
        Err(r) => r.respond(&app),
    }
}

async fn keep_inner(
    app: &AppState,
    token: &str,
    headers: &HeaderMap,
    f: KeepForm,
    now: i64,
) -> Result<Response, Refusal> {
    let claims = verify(app, token, now)?;
    if crate::auth::session::same_origin(headers).is_err() {
        return Err(Refusal::Forbidden(
            "This form was posted from another site; open the link and press a button there.",
        ));
    }
    let sig = token.rsplit('.').next().unwrap_or_default();
    let fresh =
        f.t.parse::<i64>()
            .is_ok_and(|t| (0..=FORM_MINUTES).contains(&(now / 60 - t)));
    let ring = app.config.reclaim.links.keys.keys();
    if !fresh
        || !ring
            .iter()
            .any(|k| keep::tag_matches(k, FORM_DOMAIN, &[sig, &f.t], &f.form))
    {
        return Err(Refusal::Forbidden(
            "This form is stale or was not issued by this page; open the link again and press a button there.",
        ));
    }
    let links = &app.config.reclaim.links;
    let Some((text, span)) = links
        .durations
        .iter()
        .find(|(t, _)| *t == f.duration)
        .cloned()
    else {
        let offered: Vec<&str> = links.durations.iter().map(|(t, _)| t.as_str()).collect();
        return Err(ApiError::bad_request(
            "duration",
            format!("{:?} is not offered; one of {offered:?}", f.duration),
        )
        .into());
    };
    let s = episode(app, &claims, now).await?;
    let secs = span.as_secs() as i64;
    let e = Exemption {
        exemption_id: format!("exm_{}", uuid::Uuid::now_v7().simple()),
        tenant: s.tenant.clone(),
        workload: s.workload.clone(),
        until: now + secs,
        reason: format!("kept {text} through the notice link"),
        created_by: "link".into(),
        created_at: now,
    };
    let (stored, episode_id) = (e.clone(), claims.episode_id.clone());
    let bound = links.max_per_episode.as_secs() as i64;
    let most = app.config.limits.max_exemptions_per_tenant as u64;
    let outcome = app
        .writer
        .apply_with(move |tx| links::keep(tx, &stored, &episode_id, secs, bound, most))
        .await
        .map_err(|e| ApiError::unavailable(format!("the ledger cannot be written: {e}"), 5))?;
    let message = match outcome {
        KeepOutcome::Kept => {
            tracing::info!(
                exemption = e.exemption_id,
                episode_id = claims.episode_id,
                tenant = e.tenant.as_deref().unwrap_or("*"),
                workload = e.workload.as_deref().unwrap_or("*"),
                until = e.until,
                by = "link",
                "A reclaim exemption was added through a keep link."
            );
            count(app, "kept");
            // The withdrawal of a pending request should not wait for the next evaluation.
            let app = app.clone();
            tokio::spawn(async move {
                if let Err(e) = app.evaluate().await {
                    tracing::warn!(error = %e, "The evaluation after a keep failed; the next one withdraws what it must.");
                }
            });
            return Ok(private(
                Redirect::to(&format!("/keep/{token}")).into_response(),
            ));
        }
        KeepOutcome::EpisodeBound { used } => format!(
            "Not kept: {} of the {} an episode may be kept through links are used, and {text} more would pass it. An admin can exempt it (POST /api/v1/exemptions, or the Hoarding page).",
            span_text(used),
            span_text(bound)
        ),
        KeepOutcome::TenantBound { n } => format!(
            "Not kept: the tenant has {n} exemptions in force, the most it may have. An admin can end one or exempt this workload."
        ),
    };
    count(app, "bound");
    let s = episode(app, &claims, now).await?;
    let p = page(app, token, &s, None, Some(message), now)?;
    Ok(render(&p, StatusCode::CONFLICT))
}
