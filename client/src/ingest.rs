//! `POST /api/v1/ingest` (`schema/WIRE.md`): the one client of the aggregator's ingest API.
//!
//! A body is an encoded batch, gzip-compressed, JSON or MessagePack; it goes with its
//! `batch_id` in the [`wire::BATCH_ID_HEADER`] header and the node's bearer token. [`IngestClient::post`]
//! makes one attempt and says what the answer means ([`Answer`]); the exporter's shipper keeps
//! what is to be retried in its spool, and [`Sink`] (what `gpuledger import --aggregator` sends
//! through) retries it a bounded number of times.
//!
//! Which answers are retried is decided here, once: no answer, 408 (the body came too slowly),
//! 429 (too much in flight), 401/403 (a token being fixed must not cost data) and 5xx. A 415, or
//! a 400 blaming the whole body, to a MessagePack body means the aggregator cannot read
//! MessagePack ([`wire::msgpack_unread`]). Any other 4xx is final.

use std::time::Duration;

use gpuledger_schema::wire::{self, Batch, BatchSink, Format, IngestResponse};
use uuid::Uuid;

/// Where and as whom to send.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// The aggregator's base URL (`http://aggregator:9836`).
    pub aggregator: String,
    /// The bearer token (`node:NAME`, `node:*` or admin).
    pub token: String,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Who sends (`gpuledger-exporter/0.1.0`).
    pub user_agent: String,
}

/// Why a batch is to be sent again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// No answer: connection refused, reset, timed out.
    Unreachable,
    /// 429: the aggregator has too much in flight.
    Throttled,
    /// 408: the aggregator gave up waiting for the body (a slow link); the batch is fine.
    Timeout,
    /// 401/403: the token is refused; retried so that fixing it loses nothing.
    Unauthorized,
    /// 5xx.
    ServerError,
}

impl RetryReason {
    /// The reason's name, as the exporter's `reason` label and logs say it.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Unreachable => "unreachable",
            RetryReason::Throttled => "throttled",
            RetryReason::Timeout => "timeout",
            RetryReason::Unauthorized => "unauthorized",
            RetryReason::ServerError => "server_error",
        }
    }
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// 2xx: stored (or held already). The counts, when the body says them.
    Stored(Option<IngestResponse>),
    /// Send it again later.
    Retry {
        /// Why.
        reason: RetryReason,
        /// The answer, in words.
        detail: String,
        /// `Retry-After`, if the aggregator gave one.
        after: Option<Duration>,
    },
    /// A MessagePack body the aggregator cannot read: send it as JSON (module doc).
    Unread(String),
    /// Refused for good (any other 4xx).
    Rejected(String),
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client: {0}")]
pub struct ClientError(String);

/// A client of one aggregator's ingest API.
#[derive(Debug, Clone)]
pub struct IngestClient {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl IngestClient {
    /// A client for `config`.
    pub fn new(config: &IngestConfig) -> Result<IngestClient, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .user_agent(config.user_agent.clone())
            .build()
            .map_err(|e| ClientError(e.to_string()))?;
        Ok(IngestClient {
            http,
            url: format!(
                "{}{}",
                config.aggregator.trim_end_matches('/'),
                wire::INGEST_PATH
            ),
            token: config.token.clone(),
        })
    }

    /// The ingest URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One attempt to store an encoded batch (gzip JSON or MessagePack, as
    /// [`Batch::encode_as`] writes it).
    pub async fn post(&self, batch_id: Uuid, body: Vec<u8>) -> Answer {
        let format = Format::of_body(&body, true);
        let response = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, format.content_type())
            .header(reqwest::header::CONTENT_ENCODING, "gzip")
            .header(wire::BATCH_ID_HEADER, batch_id.to_string())
            .body(body)
            .send()
            .await;
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                return Answer::Retry {
                    reason: RetryReason::Unreachable,
                    detail: e.without_url().to_string(),
                    after: None,
                };
            }
        };
        let status = response.status();
        let after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response.text().await.unwrap_or_default();
        if status.is_success() {
            return Answer::Stored(serde_json::from_str(&text).ok());
        }
        let text: String = text.chars().take(500).collect();
        let detail = format!("HTTP {status}: {text}");
        let retry = |reason, after| Answer::Retry {
            reason,
            detail: detail.clone(),
            after,
        };
        match status.as_u16() {
            429 => retry(RetryReason::Throttled, after),
            408 => retry(RetryReason::Timeout, after),
            401 | 403 => retry(RetryReason::Unauthorized, None),
            500..=599 => retry(RetryReason::ServerError, after),
            code if format == Format::MessagePack && wire::msgpack_unread(code, &text) => {
                Answer::Unread(detail)
            }
            _ => Answer::Rejected(detail),
        }
    }
}

/// The longest wait between two attempts of a [`Sink`], whatever `Retry-After` says.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// Sends whole batches and waits for their answers, for a caller with no spool of its own
/// (`gpuledger import --aggregator`): MessagePack until the aggregator says it cannot read it,
/// then JSON under the same batch ids; what is retryable is retried with jittered back-off (or
/// after `Retry-After`) up to `tries` attempts, but a refused token is not (a person is waiting
/// and must fix it).
#[derive(Debug)]
pub struct Sink {
    client: IngestClient,
    format: Format,
    tries: usize,
}

impl Sink {
    /// Sends through `client`, at most `tries` attempts per batch.
    pub fn new(client: IngestClient, tries: usize) -> Sink {
        Sink {
            client,
            format: Format::MessagePack,
            tries: tries.max(1),
        }
    }

    async fn send(&mut self, batch: &Batch) -> Result<IngestResponse, String> {
        use backon::BackoffBuilder;
        let mut waits = backon::ExponentialBuilder::default()
            .with_jitter()
            .with_max_delay(Duration::from_secs(15))
            .without_max_times()
            .build();
        let mut body = batch.encode_as(self.format);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.client.post(batch.batch_id, body.clone()).await {
                Answer::Stored(Some(counts)) => return Ok(counts),
                Answer::Stored(None) => {
                    return Err(format!(
                        "{}: the answer to batch {} is not an ingest response",
                        self.client.url, batch.batch_id
                    ));
                }
                Answer::Unread(message) if self.format == Format::MessagePack => {
                    tracing::warn!(answer = %message, "The aggregator cannot read MessagePack bodies; sending JSON.");
                    self.format = Format::Json;
                    body = batch.encode_as(self.format);
                    attempt -= 1;
                }
                Answer::Unread(message) | Answer::Rejected(message) => {
                    return Err(format!("the aggregator refused the batch: {message}"));
                }
                Answer::Retry {
                    reason: RetryReason::Unauthorized,
                    detail,
                    ..
                } => return Err(format!("the aggregator refused the token: {detail}")),
                Answer::Retry { detail, after, .. } => {
                    if attempt >= self.tries {
                        return Err(format!(
                            "{}: gave up after {attempt} attempts: {detail}",
                            self.client.url
                        ));
                    }
                    let wait = after
                        .or_else(|| waits.next())
                        .unwrap_or(MAX_WAIT)
                        .min(MAX_WAIT);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

impl BatchSink for Sink {
    fn send_batch<'a>(
        &'a mut self,
        batch: &'a Batch,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<IngestResponse, String>> + Send + 'a>> {
        Box::pin(self.send(batch))
    }
}
