//! `POST /api/v1/ingest`: an exporter's batch (`schema/WIRE.md`) into the ledger.
//!
//! Order of checks, cheapest first, so that nothing is read or parsed for a caller that may not
//! ingest: the token (401) and that its role may ingest at all (403); a declared
//! `Content-Length` over the limit (413); a `Content-Type` that is neither JSON nor MessagePack
//! (415; none at all is JSON); a fair slot ([`super::admission`]: 429 or 503 with
//! Retry-After); the body, which must arrive within `body_read_timeout` (408) and the size limit
//! (413); a decode slot, then gzip and JSON or MessagePack within the batch limits (413) and the sample rules
//! (400 naming the field); the token's node for every series and share (403); the time window
//! for every series and share (400); room in the writer queue (503 with Retry-After: the exporter
//! keeps the batch and retries), where the request gives its slot back. A batch the store refuses whatever is retried (a per-node limit,
//! values it cannot hold) is 422. A batch is acknowledged (200) only once it is committed.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use gpuledger_schema::wire::{self, Batch, Format, WireError};

use super::AppState;
use crate::auth::{Role, TokenId};
use crate::error::ApiError;
use crate::telemetry::{IngestRejected, RejectReason};
use gpuledger_ledger::store::{IngestOutcome, QueueError, Reservation, StoreError};

/// Bodies up to this size whose document (inflated, for gzip) is at most
/// [`INLINE_DOCUMENT_BYTES`] are decoded on the request's own task; the others on a blocking
/// thread. A live exporter's 5 s body is ~8 KiB (~35 KiB of JSON inflated) and decodes in ~0.1
/// ms, less than a hand-off to the blocking pool and back costs, and the batch is then allocated
/// on the threads that later free it.
const INLINE_DECODE_BYTES: usize = 32 << 10;

/// The most document a body decoded on the request's task may have: a small body that inflates
/// far (a gzip bomb) goes to a blocking thread once its trailer or its inflating says it is
/// larger, so it holds a worker thread for at most this much inflating, not for the batch's
/// whole decoded-size limit (17.1 MB by default).
const INLINE_DOCUMENT_BYTES: usize = 256 << 10;

pub use gpuledger_schema::wire::IngestResponse;

pub use gpuledger_schema::wire::TimeWindow;

/// The request's declared body length, when it declares one.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Why a request is refused: the reason it is counted under, and the answer.
struct Refusal {
    reason: RejectReason,
    error: ApiError,
}

impl Refusal {
    fn new(reason: RejectReason, error: ApiError) -> Refusal {
        Refusal { reason, error }
    }

    /// Logs and counts the refusal ([`IngestRejected`]) and gives the answer.
    fn emit(self, app: &AppState, node: Option<&str>) -> ApiError {
        IngestRejected {
            reason: self.reason,
            node,
            message: &self.error.message,
        }
        .emit(&app.metrics);
        self.error
    }
}

/// The handler: the steps below, in the order of the module's list.
#[tracing::instrument(
    name = "ingest",
    skip_all,
    fields(node, batch_id, samples, stored, duplicate_samples)
)]
pub async fn ingest(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<IngestResponse>, ApiError> {
    let (token, role) = authorize(&app, &headers).map_err(|r| r.emit(&app, None))?;
    let format = body_format(&app, &headers).map_err(|r| r.emit(&app, None))?;
    let slot = app.admission.enter(token).await.map_err(|refused| {
        let error = refused.into_error(app.admission.per_token());
        Refusal::new(RejectReason::Throttled, error).emit(&app, None)
    })?;
    let bytes = read_body(&app, body)
        .await
        .map_err(|r| r.emit(&app, None))?;
    let batch = decode(&app, &headers, bytes, format)
        .await?
        .map_err(|e| match e {
            WireError::TooLarge(m) => Refusal::new(RejectReason::TooLarge, ApiError::too_large(m)),
            e => Refusal::new(
                RejectReason::Invalid,
                ApiError::bad_request(e.field().to_owned(), e.to_string()),
            ),
        })
        .map_err(|r| r.emit(&app, None))?;
    let span = tracing::Span::current();
    span.record("node", batch.node.as_str());
    span.record("batch_id", tracing::field::display(batch.batch_id));
    let node = Some(batch.node.as_str());
    let now = chrono::Utc::now().timestamp();
    check_batch(&app, &role, &batch, now).map_err(|r| r.emit(&app, node))?;
    let reservation = reserve(&app, &batch).map_err(|r| r.emit(&app, node))?;
    // The batch now waits in the writer queue, which bounds it: the slot goes back, so that the
    // requests waiting for one commit are not limited to the slots and the writer's groups grow
    // with the senders.
    drop(slot);
    app.metrics
        .queue_samples
        .set(app.writer.queued_samples() as i64);
    let batch_id = batch.batch_id;
    let node_name = batch.node.clone();
    let outcome = write(&app, batch, now, reservation)
        .await
        .map_err(|r| r.emit(&app, Some(&node_name)))?;
    count(&app, &outcome);
    span.record("samples", outcome.samples);
    span.record("stored", outcome.stored);
    span.record("duplicate_samples", outcome.duplicate_samples);
    Ok(Json(IngestResponse {
        batch_id,
        samples: outcome.samples,
        stored: outcome.stored,
        duplicate_samples: outcome.duplicate_samples,
        duplicate_batch: outcome.duplicate_batch,
    }))
}

/// The caller's token (401), and that its role may ingest at all (403).
fn authorize(app: &AppState, headers: &HeaderMap) -> Result<(TokenId, Role), Refusal> {
    let (token, role) = app
        .tokens
        .identify(headers)
        .map_err(|e| Refusal::new(RejectReason::Unauthorized, e))?;
    if !role.may_ingest() {
        return Err(Refusal::new(
            RejectReason::Forbidden,
            ApiError::forbidden(
                "authorization",
                "this token cannot ingest; use a node:NAME, node:* or admin token",
            ),
        ));
    }
    Ok((token, role))
}

fn body_too_large(app: &AppState) -> Refusal {
    Refusal::new(
        RejectReason::TooLarge,
        ApiError::too_large(format!(
            "the body is over {} bytes (--max-body-bytes)",
            app.config.limits.max_body_bytes
        )),
    )
}

/// A declared `Content-Length` within the limit (413), and the body's format from its
/// `Content-Type` (415).
fn body_format(app: &AppState, headers: &HeaderMap) -> Result<Format, Refusal> {
    if declared_length(headers).is_some_and(|n| n > app.config.limits.max_body_bytes as u64) {
        return Err(body_too_large(app));
    }
    let format = match headers.get(header::CONTENT_TYPE).map(|v| v.to_str()) {
        None => Format::of_content_type(None),
        Some(Ok(v)) => Format::of_content_type(Some(v)),
        Some(Err(_)) => None,
    };
    format.ok_or_else(|| {
        Refusal::new(
            RejectReason::Invalid,
            ApiError::unsupported_media_type(format!(
                "a batch is {} or {} (schema/WIRE.md)",
                wire::CONTENT_TYPE,
                wire::MSGPACK_CONTENT_TYPE
            )),
        )
    })
}

/// The body, within the size limit (413) and the read timeout (408).
async fn read_body(app: &AppState, body: Body) -> Result<Bytes, Refusal> {
    let limits = &app.config.limits;
    match tokio::time::timeout(
        limits.body_read_timeout,
        axum::body::to_bytes(body, limits.max_body_bytes),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(body_too_large(app)),
        Err(_) => Err(Refusal::new(
            RejectReason::Timeout,
            ApiError::timeout(format!(
                "the body did not arrive within {} s",
                limits.body_read_timeout.as_secs_f64()
            )),
        )),
    }
}

/// The batch, decoded in a decode slot: on the request's task when the body is small
/// ([`INLINE_DECODE_BYTES`]), else on a blocking thread. The inner error is the body's (413 or
/// 400 naming the field); the outer one is ours (500), and not counted as a refusal.
async fn decode(
    app: &AppState,
    headers: &HeaderMap,
    bytes: Bytes,
    format: Format,
) -> Result<Result<Batch, WireError>, ApiError> {
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let limits = app.config.limits.batch;
    let decoding = app.admission.decode_slot().await;
    if bytes.len() <= INLINE_DECODE_BYTES {
        // A panic in decoding is a bug: answered 500, as from a blocking thread, and not a
        // connection dropped with the request's task.
        let inline = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Batch::decode_within(&bytes, gzip, format, &limits, INLINE_DOCUMENT_BYTES)
        }))
        .map_err(|_| ApiError::internal(&"decoding a body panicked"))?;
        if let Some(batch) = inline {
            return Ok(batch);
        }
    }
    tokio::task::spawn_blocking(move || {
        let _decoding = decoding;
        Batch::decode_as(&bytes, gzip, format, &limits)
    })
    .await
    .map_err(|e| ApiError::internal(&e))
}

/// The token's node for every series and share (403), and the time window for every second
/// (400).
fn check_batch(app: &AppState, role: &Role, batch: &Batch, now: i64) -> Result<(), Refusal> {
    let forbidden = |field: String, node: &str| {
        Refusal::new(
            RejectReason::Forbidden,
            ApiError::forbidden(field, format!("this token is not valid for node {node:?}")),
        )
    };
    if !role.may_ingest_for(&batch.node) {
        return Err(forbidden("node".into(), &batch.node));
    }
    if let Some((list, i, s)) = batch
        .entries()
        .find(|(_, _, s)| !role.may_ingest_for(&s.node))
    {
        return Err(forbidden(format!("{list}[{i}].node"), &s.node));
    }
    app.config
        .window(now)
        .check(batch)
        .map_err(|(field, message)| {
            Refusal::new(RejectReason::Invalid, ApiError::bad_request(field, message))
        })
}

/// Room in the writer queue: 503 with Retry-After while it is full (the exporter keeps the batch
/// and retries), 413 for a batch larger than the whole queue.
fn reserve(app: &AppState, batch: &Batch) -> Result<Reservation, Refusal> {
    app.writer.try_reserve(batch.weight()).map_err(|e| match e {
        QueueError::TooLarge { .. } => {
            Refusal::new(RejectReason::TooLarge, ApiError::too_large(e.to_string()))
        }
        QueueError::Full { .. } | QueueError::Stopped => Refusal::new(
            RejectReason::Overloaded,
            ApiError::unavailable(e.to_string(), 1),
        ),
    })
}

/// Writes the batch and waits for its commit: 422 for a batch the store refuses whatever is
/// retried, 503 when the store failed (the exporter retries).
async fn write(
    app: &AppState,
    batch: Batch,
    now: i64,
    reservation: Reservation,
) -> Result<IngestOutcome, Refusal> {
    let batch_id = batch.batch_id;
    let raw_cutoff = now.saturating_sub(app.config.retention.raw_secs);
    app.writer
        .ingest(batch, raw_cutoff, reservation)
        .await
        .map_err(|e| match e {
            StoreError::Rejected { field, message } => Refusal::new(
                RejectReason::Unstorable,
                ApiError::unprocessable(field, message),
            ),
            StoreError::WriterStopped => Refusal::new(
                RejectReason::StoreError,
                ApiError::unavailable(e.to_string(), 5),
            ),
            e => {
                // Logged once, here; the exporter keeps the batch and retries.
                tracing::error!(error = %e, batch_id = %batch_id, "A batch could not be written; the exporter will retry it.");
                Refusal::new(
                    RejectReason::StoreError,
                    ApiError::unavailable("the ledger could not write this batch; retry", 5),
                )
            }
        })
}

/// Counts a written batch and its samples.
fn count(app: &AppState, outcome: &IngestOutcome) {
    let m = &app.metrics;
    m.queue_samples.set(app.writer.queued_samples() as i64);
    if outcome.duplicate_batch {
        m.duplicate_batches.inc();
    } else {
        m.batches.inc();
    }
    m.samples.inc_by(outcome.stored);
    m.duplicate_samples.inc_by(outcome.duplicate_samples);
}
