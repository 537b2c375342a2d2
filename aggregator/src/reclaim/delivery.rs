//! Delivering the outbox: every pending row whose time has come is POSTed to its endpoint, signed
//! with every configured secret at the moment of the attempt, and the result written back through
//! the writer. At-least-once: a row is `delivered` only after a 2xx was received *and* that was
//! committed; a crash in between sends it again, under the same `webhook-id`.
//!
//! Back-off: exponential with jitter from 1 s to 10 min (`backon`), or the receiver's
//! `Retry-After` when it asks for longer. 410 Gone disables the endpoint (its pending rows become
//! `disabled`) until an admin enables it again. A row older than the endpoint's `max_age` becomes
//! `failed`; both can be retried or replayed from the admin API (`api/reclaim.rs`).
//!
//! Chat endpoints (`[[notify]]`) get the rendered message, unsigned. A 429 pauses the whole
//! endpoint until its `Retry-After` (chat services limit per webhook, not per message); a chat's
//! 400, 403 or 404 (a bad payload, a removed channel) fails the row at once.
//!
//! Key decision: one delivery lane per endpoint, each with its own loop, in-flight bound and
//! wake-up, so a chat service that hangs or throttles never delays a scheduler's webhooks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use duckdb::{Connection, params};
use gpuledger_schema::webhook;

use crate::telemetry::{AggregatorMetrics, EndpointLabels, EndpointOutcomeLabels};
use gpuledger_ledger::reclaim::config::{Endpoint, EndpointKind};
use gpuledger_ledger::store::query::Readers;
use gpuledger_ledger::store::{StoreError, Writer};

/// Rows attempted per round at most.
const ROUND: usize = 256;
/// Attempts in flight at once to one webhook endpoint.
pub const IN_FLIGHT: usize = 16;
/// Attempts in flight at once to one chat endpoint (Slack takes about one message a second).
pub const CHAT_IN_FLIGHT: usize = 1;

/// Wakes every delivery lane (one per endpoint) when a pass put events in the outbox.
#[derive(Debug, Default)]
pub struct Lanes(Vec<Arc<tokio::sync::Notify>>);

impl Lanes {
    /// One lane per endpoint.
    pub fn new(endpoints: usize) -> Lanes {
        Lanes((0..endpoints).map(|_| Arc::default()).collect())
    }

    /// The wake-up of lane `i`.
    pub fn lane(&self, i: usize) -> Arc<tokio::sync::Notify> {
        self.0[i].clone()
    }

    /// Wakes every lane.
    pub fn wake(&self) {
        for n in &self.0 {
            n.notify_one();
        }
    }
}

/// A due outbox row.
#[derive(Debug, Clone)]
struct Due {
    event_id: String,
    endpoint: String,
    body: String,
    created_at: i64,
    attempts: i32,
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// 2xx.
    Delivered(u16),
    /// Try again at this time.
    Retry {
        /// The HTTP status, if one came.
        status: Option<u16>,
        /// What went wrong.
        error: String,
        /// When to try again (Unix seconds).
        at: i64,
    },
    /// 429: the endpoint asks for a pause; nothing more goes to it before `at`.
    Throttled {
        /// What it said.
        error: String,
        /// When to try again (Unix seconds).
        at: i64,
    },
    /// 410: the endpoint is gone.
    Gone,
    /// Older than the endpoint's max_age.
    Expired {
        /// The last status.
        status: Option<u16>,
        /// The last error.
        error: String,
    },
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered(_) => "delivered",
            Outcome::Retry { .. } => "retry",
            Outcome::Throttled { .. } => "throttled",
            Outcome::Gone => "gone",
            Outcome::Expired { .. } => "failed",
        }
    }
}

/// The delay before attempt `attempts + 1` (`attempts` ≥ 1 made so far): exponential with jitter.
pub fn backoff(attempts: i32) -> Duration {
    let mut delays = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(600))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build();
    delays
        .nth(attempts.saturating_sub(1).max(0) as usize)
        .unwrap_or(Duration::from_secs(600))
}

/// `Retry-After` as seconds (delta-seconds or an HTTP date).
fn retry_after(headers: &reqwest::header::HeaderMap, now: i64) -> Option<i64> {
    let v = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(s) = v.parse::<i64>() {
        return Some(s.clamp(0, 86400));
    }
    let t = chrono::DateTime::parse_from_rfc2822(v).ok()?.timestamp();
    Some((t - now).clamp(0, 86400))
}

/// Sends one event once. Traced as a `webhook.delivery` span (docs/otlp.md, "Traces (aggregator)").
#[tracing::instrument(
    name = "webhook.delivery",
    skip_all,
    fields(endpoint = %endpoint.name, event_id = %event_id, attempt = attempts_before + 1, status)
)]
pub async fn attempt(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    event_id: &str,
    body: &str,
    created_at: i64,
    attempts_before: i32,
) -> Outcome {
    let now = chrono::Utc::now().timestamp();
    let mut request = client
        .post(&endpoint.url)
        .timeout(endpoint.timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    if endpoint.kind == EndpointKind::Webhook {
        let signature =
            webhook::signature_header(&endpoint.secrets, event_id, now, body.as_bytes());
        request = request
            .header(webhook::HEADER_ID, event_id)
            .header(webhook::HEADER_TIMESTAMP, now.to_string())
            .header(webhook::HEADER_SIGNATURE, signature);
    }
    let sent = request.body(body.to_owned()).send().await;
    if let Ok(r) = &sent {
        tracing::Span::current().record("status", r.status().as_u16());
    }
    let chat = endpoint.kind != EndpointKind::Webhook;
    let (status, error, asked) = match sent {
        Ok(r) if r.status().is_success() => return Outcome::Delivered(r.status().as_u16()),
        Ok(r) if r.status() == reqwest::StatusCode::GONE => return Outcome::Gone,
        Ok(r)
            if r.status() == reqwest::StatusCode::TOO_MANY_REQUESTS
                && now - created_at <= endpoint.max_age.as_secs() as i64 =>
        {
            let delay = backoff(attempts_before + 1).as_secs() as i64;
            return Outcome::Throttled {
                error: "answered 429 Too Many Requests".into(),
                at: now + delay.max(retry_after(r.headers(), now).unwrap_or(0)).max(1),
            };
        }
        // A chat service's 400, 403 or 404: a payload it will never take, or a channel removed.
        Ok(r) if chat && matches!(r.status().as_u16(), 400 | 403 | 404) => {
            return Outcome::Expired {
                status: Some(r.status().as_u16()),
                error: format!("answered {}; a chat endpoint does not retry it", r.status()),
            };
        }
        Ok(r) => (
            Some(r.status().as_u16()),
            format!("answered {}", r.status()),
            retry_after(r.headers(), now),
        ),
        Err(e) => (None, without_url(&e), None),
    };
    if now - created_at > endpoint.max_age.as_secs() as i64 {
        return Outcome::Expired { status, error };
    }
    let delay = backoff(attempts_before + 1).as_secs() as i64;
    Outcome::Retry {
        status,
        error,
        at: now + delay.max(asked.unwrap_or(0)).max(1),
    }
}

/// The error without the URL (it may carry credentials in its query).
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let mut source = std::error::Error::source(e);
    let mut detail = String::new();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {detail}")
    }
}

/// The due rows of each configured endpoint (oldest first, at most a round's worth each): rows
/// of an endpoint no longer configured wait, listed by the admin API, without holding up others.
fn due(conn: &Connection, endpoints: &[String], now: i64) -> duckdb::Result<Vec<Due>> {
    let mut stmt = conn.prepare_cached(
        "SELECT event_id, endpoint, body, created_at, attempts FROM webhook_outbox
         WHERE state = 'pending' AND next_attempt_at <= ? AND endpoint = ?
           AND endpoint NOT IN (SELECT endpoint FROM webhook_endpoints)
         ORDER BY created_at, event_id LIMIT ?",
    )?;
    let mut out = Vec::new();
    for e in endpoints {
        let rows = stmt.query_map(params![now, e, ROUND as i64], |r| {
            Ok(Due {
                event_id: r.get(0)?,
                endpoint: r.get(1)?,
                body: r.get(2)?,
                created_at: r.get(3)?,
                attempts: r.get(4)?,
            })
        })?;
        for row in rows {
            out.push(row?);
        }
    }
    Ok(out)
}

/// Pending rows per endpoint and the age of the oldest, for the metrics.
fn backlog(conn: &Connection, now: i64) -> duckdb::Result<Vec<(String, i64, i64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT endpoint, count(*), ? - min(created_at) FROM webhook_outbox
         WHERE state = 'pending' GROUP BY endpoint",
    )?;
    stmt.query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect()
}

fn disabled(conn: &Connection) -> duckdb::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached("SELECT endpoint FROM webhook_endpoints")?;
    stmt.query_map([], |r| r.get(0))?.collect()
}

/// Writes attempt results, in the writer's transaction.
fn store(
    tx: &duckdb::Transaction<'_>,
    results: &[(String, String, i32, Outcome)],
    now: i64,
) -> duckdb::Result<()> {
    for (event_id, endpoint, attempts, outcome) in results {
        let attempts = attempts + 1;
        match outcome {
            Outcome::Delivered(status) => tx.execute(
                "UPDATE webhook_outbox SET state = 'delivered', attempts = ?, delivered_at = ?,
                     last_status = ?, last_error = NULL
                 WHERE event_id = ? AND endpoint = ? AND state = 'pending'",
                params![attempts, now, status, event_id, endpoint],
            )?,
            Outcome::Retry { status, error, at } => tx.execute(
                "UPDATE webhook_outbox SET attempts = ?, next_attempt_at = ?, last_status = ?,
                     last_error = ?
                 WHERE event_id = ? AND endpoint = ? AND state = 'pending'",
                params![attempts, at, status, error, event_id, endpoint],
            )?,
            Outcome::Throttled { error, at } => {
                tx.execute(
                    "UPDATE webhook_outbox SET attempts = ?, last_status = 429, last_error = ?
                     WHERE event_id = ? AND endpoint = ? AND state = 'pending'",
                    params![attempts, error, event_id, endpoint],
                )?;
                // The whole endpoint waits: its limit is per webhook, not per message.
                tx.execute(
                    "UPDATE webhook_outbox SET next_attempt_at = greatest(next_attempt_at, ?)
                     WHERE endpoint = ? AND state = 'pending'",
                    params![at, endpoint],
                )?
            }
            Outcome::Expired { status, error } => tx.execute(
                "UPDATE webhook_outbox SET state = 'failed', attempts = ?, last_status = ?,
                     last_error = ?
                 WHERE event_id = ? AND endpoint = ? AND state = 'pending'",
                params![attempts, status, error, event_id, endpoint],
            )?,
            Outcome::Gone => {
                tx.execute(
                    "UPDATE webhook_outbox SET attempts = ?, last_status = 410,
                         last_error = 'the endpoint answered 410 Gone'
                     WHERE event_id = ? AND endpoint = ?",
                    params![attempts, event_id, endpoint],
                )?;
                tx.execute(
                    "UPDATE webhook_outbox SET state = 'disabled'
                     WHERE endpoint = ? AND state = 'pending'",
                    [endpoint],
                )?;
                tx.execute(
                    "INSERT INTO webhook_endpoints
                     SELECT ?, ?, 'answered 410 Gone'
                     WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE endpoint = ?)",
                    params![endpoint, now, endpoint],
                )?
            }
        };
    }
    Ok(())
}

/// The delivery loop's handles.
#[derive(Clone)]
pub struct Deliverer {
    /// Endpoints by name.
    pub endpoints: Arc<Vec<Endpoint>>,
    /// Reader connections.
    pub readers: Readers,
    /// The writer.
    pub writer: Writer,
    /// Metrics.
    pub metrics: Arc<AggregatorMetrics>,
    /// Woken when new events are in the outbox.
    pub wake: Arc<tokio::sync::Notify>,
    /// The HTTP client.
    pub client: reqwest::Client,
    /// Attempts in flight at once ([`IN_FLIGHT`], [`CHAT_IN_FLIGHT`]).
    pub in_flight: usize,
}

impl Deliverer {
    /// One round: attempts every due row once. Returns how many were attempted.
    pub async fn round(&self) -> Result<usize, StoreError> {
        let now = chrono::Utc::now().timestamp();
        let conn = self.readers.connect()?;
        let names: Vec<String> = self.endpoints.iter().map(|e| e.name.clone()).collect();
        let (rows, backlog, off) = tokio::task::spawn_blocking(move || {
            Ok::<_, duckdb::Error>((
                due(&conn, &names, now)?,
                backlog(&conn, now)?,
                disabled(&conn)?,
            ))
        })
        .await
        .map_err(|e| StoreError::Io(format!("the delivery task failed: {e}")))?
        .map_err(StoreError::from_db)?;
        self.export_backlog(&backlog, &off);
        if rows.is_empty() {
            return Ok(0);
        }
        let gate = Arc::new(tokio::sync::Semaphore::new(self.in_flight.max(1)));
        // Set by a 429: the rest of the round is not attempted (the endpoint pauses).
        let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for row in rows {
            let Some(endpoint) = self
                .endpoints
                .iter()
                .find(|e| e.name == row.endpoint)
                .cloned()
            else {
                // An endpoint no longer configured: its rows wait (listed by the admin API).
                continue;
            };
            let client = self.client.clone();
            let gate = gate.clone();
            let metrics = self.metrics.clone();
            let paused = paused.clone();
            tasks.spawn(async move {
                let _slot = gate.acquire_owned().await;
                if paused.load(std::sync::atomic::Ordering::Acquire) {
                    return None;
                }
                let started = Instant::now();
                let outcome = attempt(
                    &client,
                    &endpoint,
                    &row.event_id,
                    &row.body,
                    row.created_at,
                    row.attempts,
                )
                .await;
                metrics
                    .webhook_attempt_seconds
                    .observe(started.elapsed().as_secs_f64());
                metrics
                    .webhook_deliveries
                    .get_or_create(&EndpointOutcomeLabels {
                        endpoint: endpoint.name.clone(),
                        outcome: outcome.label(),
                    })
                    .inc();
                if matches!(outcome, Outcome::Throttled { .. }) {
                    paused.store(true, std::sync::atomic::Ordering::Release);
                }
                match &outcome {
                    Outcome::Delivered(_) => {}
                    Outcome::Retry { error, at, .. } | Outcome::Throttled { error, at } => tracing::info!(
                        endpoint = endpoint.name,
                        event_id = row.event_id,
                        error,
                        retry_in_seconds = at - chrono::Utc::now().timestamp(),
                        "A webhook delivery failed; it is retried."
                    ),
                    Outcome::Gone => tracing::warn!(
                        endpoint = endpoint.name,
                        "A webhook endpoint answered 410 Gone; it is disabled until an admin enables it."
                    ),
                    Outcome::Expired { error, .. } => tracing::error!(
                        endpoint = endpoint.name,
                        event_id = row.event_id,
                        error,
                        "A webhook event passed the endpoint's max_age undelivered; it is marked failed."
                    ),
                }
                Some((row.event_id, row.endpoint, row.attempts, outcome))
            });
        }
        let results: Vec<_> = tasks.join_all().await.into_iter().flatten().collect();
        let n = results.len();
        let at = chrono::Utc::now().timestamp();
        self.writer
            .apply(Box::new(move |tx| store(tx, &results, at)))
            .await?;
        Ok(n)
    }

    fn export_backlog(&self, backlog: &[(String, i64, i64)], off: &[String]) {
        for e in self.endpoints.iter() {
            let labels = EndpointLabels {
                endpoint: e.name.clone(),
            };
            let (n, age) = backlog
                .iter()
                .find(|(name, _, _)| *name == e.name)
                .map_or((0, 0), |(_, n, a)| (*n, *a));
            self.metrics.webhook_pending.get_or_create(&labels).set(n);
            self.metrics
                .webhook_oldest_pending_age
                .get_or_create(&labels)
                .set(age);
            self.metrics
                .webhook_endpoint_disabled
                .get_or_create(&labels)
                .set(i64::from(off.contains(&e.name)));
        }
    }

    /// Runs rounds forever: at once when woken, else every second.
    pub async fn run(self) {
        // Every endpoint's series exist from the start (a rate over a series that appears with
        // its first failure misses that failure).
        for e in self.endpoints.iter() {
            for outcome in ["delivered", "retry", "throttled", "gone", "failed"] {
                self.metrics
                    .webhook_deliveries
                    .get_or_create(&EndpointOutcomeLabels {
                        endpoint: e.name.clone(),
                        outcome,
                    })
                    .inc_by(0);
            }
        }
        loop {
            match self.round().await {
                Ok(n) if n >= ROUND * self.endpoints.len().max(1) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "A webhook delivery round failed; retried in a second.")
                }
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        for attempts in 1..40 {
            let d = backoff(attempts).as_secs_f64();
            let base = 2f64.powi(attempts - 1).min(600.0);
            assert!(
                d >= base.min(600.0) && d <= (2.0 * base).max(600.0) + 1e-9,
                "{attempts}: {d}"
            );
        }
        let spread: std::collections::HashSet<u128> =
            (0..20).map(|_| backoff(5).as_millis()).collect();
        assert!(spread.len() > 1, "jittered");
    }
}
