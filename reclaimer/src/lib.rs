//! `gpuledger-reclaimer` (also `gpuledger reclaimer`): the small receiver that runs beside a
//! scheduler and carries out `reclaim.requested` events (docs/reclaim.md; events:
//! `schema/WEBHOOK.md`). It links no ledger: the aggregator decides, this only verifies and acts.
//!
//! Every request is checked first: the Standard Webhooks signature against the configured
//! secrets and the timestamp within the tolerance (5 min); an unsigned, badly signed or replayed
//! request gets 401 and a log line. A `webhook-id` already acted on is answered 200 without acting
//! again (the ids are kept in an fsynced file, so a restart remembers them).
//!
//! Key decision: the reclaimer keeps no queue. When the scheduler cannot act now — a
//! PodDisruptionBudget answers the eviction with 429, the API server or `scontrol` fails — it
//! answers 503 with `Retry-After`, and the aggregator's durable outbox retries; a
//! `reclaim.cancelled` withdraws the request there. So durability lives in one place.
#![warn(missing_docs)]

pub mod kubernetes;
pub mod slurm;

use std::collections::HashSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use gpuledger_schema::webhook::{self, Event, EventType, Secret};
use serde::{Deserialize, Serialize};

use gpuledger_schema::error::ErrorBody;
use gpuledger_schema::options::Span;

/// `gpuledger reclaimer --config FILE`: the file's keys.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReclaimerFile {
    /// Address to listen on (default `0.0.0.0:9837`).
    pub listen: Option<std::net::SocketAddr>,
    /// The path events are POSTed to (default `/hooks/gpuledger`).
    pub path: Option<String>,
    /// The aggregator's signing secret (`whsec_…`).
    pub secret: Option<String>,
    /// Several secrets (rotation): any one matching is enough.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// A file with one secret per line.
    pub secret_file: Option<PathBuf>,
    /// How far a webhook's timestamp may be from this clock (default 5m).
    pub tolerance: Option<Span>,
    /// Log what would be done, do nothing.
    pub dry_run: Option<bool>,
    /// Where the ids acted on are kept (default `./reclaimer-acted.log`).
    pub state_file: Option<PathBuf>,
    /// Act on Kubernetes pods (`namespace/name` workloads).
    pub kubernetes: Option<kubernetes::KubernetesFile>,
    /// Act on Slurm jobs (numeric workloads).
    pub slurm: Option<slurm::SlurmFile>,
    /// `[http]`: the listener's connection bound and header read timeout.
    #[serde(default)]
    pub http: gpuledger_otel::serve::HttpOptions,
}

/// Where and how the reclaimer listens.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    /// The address.
    pub addr: std::net::SocketAddr,
    /// Its connection bound and header read timeout.
    pub http: gpuledger_otel::serve::Listening,
}

/// The reclaimer, resolved.
pub struct Reclaimer {
    path: String,
    secrets: Vec<Secret>,
    tolerance: i64,
    dry_run: bool,
    acted: Mutex<Acted>,
    /// Ids being acted on now: a retry that arrives meanwhile gets 503 instead of acting twice.
    inflight: Mutex<HashSet<String>>,
    kubernetes: Option<kubernetes::Kubernetes>,
    slurm: Option<slurm::Slurm>,
}

/// The ids acted on, in memory and in an append-only file.
struct Acted {
    ids: HashSet<String>,
    file: std::fs::File,
}

impl Acted {
    fn open(path: &std::path::Path) -> std::io::Result<Acted> {
        let ids = match std::fs::read_to_string(path) {
            Ok(text) => text
                .lines()
                .map(|l| l.trim().to_owned())
                .filter(|l| !l.is_empty())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
            Err(e) => return Err(e),
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Acted { ids, file })
    }

    fn record(&mut self, id: &str) -> std::io::Result<()> {
        writeln!(self.file, "{id}")?;
        self.file.sync_data()?;
        self.ids.insert(id.to_owned());
        Ok(())
    }
}

impl ReclaimerFile {
    /// Checks every key (errors name it) and opens the state file.
    pub fn resolve(self) -> anyhow::Result<(Endpoint, Reclaimer)> {
        use anyhow::Context;
        let mut texts: Vec<(String, String)> = Vec::new();
        if let Some(s) = self.secret {
            texts.push(("secret".into(), s));
        }
        for (i, s) in self.secrets.into_iter().enumerate() {
            texts.push((format!("secrets[{i}]"), s));
        }
        if let Some(p) = &self.secret_file {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("secret_file: {}", p.display()))?;
            for (i, l) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                texts.push((format!("secret_file line {}", i + 1), l.trim().to_owned()));
            }
        }
        anyhow::ensure!(
            !texts.is_empty(),
            "secret: the reclaimer verifies every request; set secret, secrets or secret_file"
        );
        let secrets = texts
            .into_iter()
            .map(|(k, t)| Secret::parse(&t).map_err(|e| anyhow::anyhow!("{k}: {e}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(
            self.kubernetes.is_some() || self.slurm.is_some(),
            "kubernetes / slurm: configure at least one scheduler to act on"
        );
        let state = self
            .state_file
            .unwrap_or_else(|| PathBuf::from("reclaimer-acted.log"));
        let acted =
            Acted::open(&state).with_context(|| format!("state_file: {}", state.display()))?;
        let path = self.path.unwrap_or_else(|| "/hooks/gpuledger".into());
        anyhow::ensure!(path.starts_with('/'), "path: {path:?} must start with /");
        let http = self
            .http
            .resolve()
            .map_err(|e| anyhow::anyhow!("http.{e}"))?;
        Ok((
            Endpoint {
                addr: self
                    .listen
                    .unwrap_or_else(|| "0.0.0.0:9837".parse().expect("a valid address")),
                http,
            },
            Reclaimer {
                path,
                secrets,
                tolerance: self
                    .tolerance
                    .map_or(webhook::DEFAULT_TOLERANCE_SECS, |d| d.0.as_secs() as i64),
                dry_run: self.dry_run.unwrap_or(false),
                acted: Mutex::new(acted),
                inflight: Mutex::new(HashSet::new()),
                kubernetes: self.kubernetes.map(|k| k.resolve()).transpose()?,
                slurm: self.slurm.map(|s| s.resolve()).transpose()?,
            },
        ))
    }
}

/// What the reclaimer did with one request (its JSON answer).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Answer {
    /// What became of the request.
    pub outcome: Outcome,
    /// What was or would be done, in words.
    pub action: String,
}

/// What became of one request, as its answer names it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The action was taken now.
    Acted,
    /// An earlier request with this webhook-id took it; not taken again.
    AlreadyActed,
    /// Dry run: what would be done.
    DryRun,
    /// The event needs no action.
    Ignored,
}

impl Outcome {
    /// A 200 answer with this outcome.
    fn answer(self, action: String) -> Response {
        answer(
            StatusCode::OK,
            &Answer {
                outcome: self,
                action,
            },
        )
    }
}

/// Why an action could not be taken now.
#[derive(Debug)]
pub enum ActError {
    /// Try again later (PDB, API server down, command failed): 503 + Retry-After.
    Later {
        /// Seconds.
        retry_after: u64,
        /// Why.
        message: String,
    },
    /// This workload cannot be acted on here (422): the aggregator keeps retrying until
    /// max_age, so an operator sees it in the deliveries.
    Cannot(String),
}

fn answer(status: StatusCode, body: &impl Serialize) -> Response {
    (status, axum::Json(body)).into_response()
}

/// An error in the one JSON shape (`gpuledger_schema::error`).
fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(ErrorBody::new(None, message))).into_response()
}

/// 503 with `Retry-After`: the aggregator's outbox retries.
fn unavailable(message: &str, retry_after: u64) -> Response {
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, message);
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from(retry_after),
    );
    response
}

/// What a workload names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A pod.
    Pod {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A Slurm job (array tasks as `1234_7`).
    Job(String),
}

impl Target {
    /// Parses a workload: `namespace/name` is a pod, digits (with an optional `_index`) a job.
    pub fn parse(workload: &str) -> Option<Target> {
        // DNS-1123 subdomain: dot-separated labels of [a-z0-9-], each starting and ending
        // alphanumeric (no `..`, no leading dot: nothing that normalises to another API path).
        let dns = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        };
        if let Some((ns, name)) = workload.split_once('/') {
            return (dns(ns) && dns(name)).then(|| Target::Pod {
                namespace: ns.into(),
                name: name.into(),
            });
        }
        let (job, task) = workload.split_once('_').unwrap_or((workload, "0"));
        let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
        (digits(job) && digits(task)).then(|| Target::Job(workload.into()))
    }
}

impl Reclaimer {
    /// One line: the path, what it acts on, dry run or not.
    pub fn summary(&self) -> String {
        format!(
            "path {}, {} secret(s), {}{}{}",
            self.path,
            self.secrets.len(),
            self.kubernetes.as_ref().map_or("", |k| k.mode_name()),
            if self.kubernetes.is_some() && self.slurm.is_some() {
                " and "
            } else {
                ""
            },
            match (&self.slurm, self.dry_run) {
                (Some(_), false) => "Slurm",
                (Some(_), true) => "Slurm, dry run",
                (None, true) => ", dry run",
                (None, false) => "",
            }
        )
    }

    async fn act(&self, event: &Event) -> Result<String, ActError> {
        let workload = event.data.workload.as_deref().unwrap_or("");
        match Target::parse(workload) {
            Some(Target::Pod { namespace, name }) => match &self.kubernetes {
                Some(k) => k.reclaim(&namespace, &name).await,
                None => Err(ActError::Cannot(format!(
                    "{workload:?} is a pod, and no [kubernetes] is configured"
                ))),
            },
            Some(Target::Job(job)) => match &self.slurm {
                Some(s) => s.reclaim(&job).await,
                None => Err(ActError::Cannot(format!(
                    "{workload:?} is a Slurm job, and no [slurm] is configured"
                ))),
            },
            None => Err(ActError::Cannot(format!(
                "workload {workload:?} is neither a pod (namespace/name) nor a Slurm job id"
            ))),
        }
    }

    fn describe(&self, event: &Event) -> String {
        let workload = event.data.workload.as_deref().unwrap_or("");
        match Target::parse(workload) {
            Some(Target::Pod { namespace, name }) => match &self.kubernetes {
                Some(k) => k.describe(&namespace, &name),
                None => format!("nothing: no [kubernetes] for pod {namespace}/{name}"),
            },
            Some(Target::Job(job)) => match &self.slurm {
                Some(s) => s.describe(&job),
                None => format!("nothing: no [slurm] for job {job}"),
            },
            None => format!("nothing: {workload:?} is not a pod or a job"),
        }
    }
}

async fn hook(State(r): State<Arc<Reclaimer>>, headers: HeaderMap, body: Bytes) -> Response {
    let now = chrono::Utc::now().timestamp();
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Err(e) = webhook::verify(&r.secrets, get, &body, now, r.tolerance) {
        tracing::warn!(
            error = %e,
            webhook_id = get(webhook::HEADER_ID).unwrap_or("-"),
            "Refused a webhook: unsigned, badly signed or replayed."
        );
        return error(StatusCode::UNAUTHORIZED, &e.to_string());
    }
    let id = get(webhook::HEADER_ID).unwrap_or_default().to_owned();
    // A budget event (sent here only when this endpoint's `events` names it) has no episode.
    #[derive(serde::Deserialize)]
    struct Kind {
        #[serde(rename = "type")]
        kind: EventType,
    }
    if let Ok(Kind { kind }) = serde_json::from_slice::<Kind>(&body)
        && kind.is_budget()
    {
        tracing::info!(
            webhook_id = id,
            event = kind.as_str(),
            "Noted an event that needs no action."
        );
        return Outcome::Ignored.answer(format!("{} needs no action", kind.as_str()));
    }
    let event: Event = match serde_json::from_slice(&body) {
        Ok(e) => e,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("not a gpuledger event: {e}"),
            );
        }
    };
    if event.kind != EventType::ReclaimRequested {
        tracing::info!(
            webhook_id = id,
            event = event.kind.as_str(),
            workload = event.data.workload.as_deref().unwrap_or("-"),
            "Noted an event that needs no action."
        );
        return Outcome::Ignored.answer(format!("{} needs no action", event.kind.as_str()));
    }
    if r.acted.lock().expect("acted lock").ids.contains(&id) {
        tracing::info!(
            webhook_id = id,
            "Already acted on this webhook-id; not acting again."
        );
        return Outcome::AlreadyActed.answer(r.describe(&event));
    }
    let what = r.describe(&event);
    if r.dry_run || event.data.dry_run {
        tracing::info!(webhook_id = id, action = what, "Dry run: would act.");
        return Outcome::DryRun.answer(what);
    }
    if !r.inflight.lock().expect("inflight lock").insert(id.clone()) {
        return unavailable(
            "this webhook-id is being acted on now; retry for its outcome",
            5,
        );
    }
    // Acted on while this request waited (the first attempt finished and left the in-flight set).
    if r.acted.lock().expect("acted lock").ids.contains(&id) {
        r.inflight.lock().expect("inflight lock").remove(&id);
        return Outcome::AlreadyActed.answer(r.describe(&event));
    }
    let outcome = act_once(&r, &id, &event).await;
    respond(&id, &event, outcome)
}

/// Acts on `event`, which this request holds in the in-flight set under `id`, and records `id`
/// as acted on when it succeeds. It runs to the end even if the sender hangs up (its timeout):
/// the outcome is recorded, so the retry finds it acted on instead of acting again.
async fn act_once(r: &Arc<Reclaimer>, id: &str, event: &Event) -> Result<String, ActError> {
    let task = {
        let (r, id, event) = (r.clone(), id.to_owned(), event.clone());
        tokio::spawn(async move {
            let outcome = r.act(&event).await;
            if outcome.is_ok()
                && let Err(e) = r.acted.lock().expect("acted lock").record(&id)
            {
                tracing::error!(error = %e, "Cannot record the webhook-id acted on; a resend may act again.");
            }
            r.inflight.lock().expect("inflight lock").remove(&id);
            outcome
        })
    };
    match task.await {
        Ok(o) => o,
        Err(e) => Err(ActError::Later {
            retry_after: 30,
            message: format!("the action failed: {e}"),
        }),
    }
}

/// The answer to an action taken or refused, logged.
fn respond(id: &str, event: &Event, outcome: Result<String, ActError>) -> Response {
    match outcome {
        Ok(done) => {
            tracing::info!(
                webhook_id = id,
                tenant = event.data.tenant.as_deref().unwrap_or("-"),
                action = done,
                reason = event.data.policy.reason,
                "Reclaimed."
            );
            Outcome::Acted.answer(done)
        }
        Err(ActError::Later {
            retry_after,
            message,
        }) => {
            tracing::warn!(
                webhook_id = id,
                error = message,
                retry_after,
                "Cannot act now; the aggregator retries."
            );
            unavailable(&message, retry_after)
        }
        Err(ActError::Cannot(message)) => {
            tracing::error!(
                webhook_id = id,
                error = message,
                "Cannot act on this workload."
            );
            error(StatusCode::UNPROCESSABLE_ENTITY, &message)
        }
    }
}

/// The receiver's routes: the hook at its path, `/healthz`.
pub fn router(r: Reclaimer) -> axum::Router {
    let path = r.path.clone();
    axum::Router::new()
        .route(&path, axum::routing::post(hook))
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .layer(axum::extract::DefaultBodyLimit::max(256 << 10))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(60),
        ))
        .with_state(Arc::new(r))
}

/// Serves until `shutdown` resolves.
pub async fn run(
    at: Endpoint,
    r: Reclaimer,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(at.addr).await?;
    tracing::info!(listen = %at.addr, path = r.path, dry_run = r.dry_run, "The reclaimer is listening.");
    gpuledger_otel::serve::serve(listener, router(r), at.http, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_name_pods_or_jobs() {
        assert_eq!(
            Target::parse("ml/nb-0"),
            Some(Target::Pod {
                namespace: "ml".into(),
                name: "nb-0".into()
            })
        );
        assert_eq!(Target::parse("4242"), Some(Target::Job("4242".into())));
        assert_eq!(Target::parse("4242_7"), Some(Target::Job("4242_7".into())));
        for bad in [
            "",
            "ml/",
            "/x",
            "ML/x",
            "a/b/c",
            "42a",
            "4242_",
            "x; rm -rf /",
            "ml/..",
            "../x",
            "ml/.x",
            "ml/-x",
        ] {
            assert_eq!(Target::parse(bad), None, "{bad}");
        }
    }
}

/// The command line of the reclaimer, the same for `gpuledger-reclaimer` and `gpuledger
/// reclaimer`.
pub mod cli {
    use std::path::PathBuf;

    use anyhow::Context;

    use super::ReclaimerFile;

    /// Flags of the reclaimer.
    #[derive(Debug, clap::Args)]
    pub struct Args {
        /// TOML file: listen, path, secret / secrets / secret_file, tolerance, dry_run,
        /// state_file, [kubernetes] (api_server, token_file, ca_file, mode = "evict" | "kueue"),
        /// [slurm] (command), [http] (max_connections, header_read_timeout).
        #[arg(long)]
        pub config: PathBuf,
        /// Log what would be done, act on nothing (overrides the file's dry_run).
        #[arg(long)]
        pub dry_run: bool,
        /// Check the file (secrets, token, CA, command), print a summary and exit.
        #[arg(long)]
        pub check_config: bool,
    }

    /// Runs until SIGINT or SIGTERM (logging must be set up by the caller).
    pub fn run(args: Args) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(&args.config)
            .with_context(|| format!("cannot read config file {}", args.config.display()))?;
        let mut file: ReclaimerFile = toml::from_str(&text)
            .with_context(|| format!("config file {}", args.config.display()))?;
        if args.dry_run {
            file.dry_run = Some(true);
        }
        let (at, r) = file.resolve()?;
        if args.check_config {
            println!(
                "gpuledger reclaimer: the configuration is valid: listen {}, {}",
                at.addr,
                r.summary()
            );
            return Ok(());
        }
        gpuledger_otel::process::runtime()?.block_on(async {
            super::run(at, r, gpuledger_otel::process::shutdown_signal())
                .await
                .map_err(|e| anyhow::anyhow!("reclaimer on {}: {e}", at.addr))
        })
    }
}
