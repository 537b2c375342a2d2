//! `POST /api/v1/ingest`: an exporter's batch (`schema/WIRE.md`) into the ledger.
//!
//! Order of checks, each with its own answer: token (401), body size (413), gzip and JSON and
//! the sample rules (400 naming the field), the token's node (403), the time window (400), room
//! in the writer queue (503 with Retry-After: the exporter keeps the batch and retries). A batch
//! is acknowledged (200) only once it is committed.

use std::io::Read;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use flate2::read::GzDecoder;
use gpuledger_schema::wire::Batch;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use crate::store::{IngestOutcome, QueueError, StoreError};
use crate::telemetry::{IngestRejected, RejectReason};

/// The answer to an accepted batch.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct IngestResponse {
    /// The batch's id.
    pub batch_id: Uuid,
    /// Samples in the batch.
    pub samples: u64,
    /// Samples stored now.
    pub stored: u64,
    /// Samples the ledger held already.
    pub duplicate_samples: u64,
    /// The batch id had been stored before.
    pub duplicate_batch: bool,
}

/// Time rules a batch must meet, as of one moment.
#[derive(Debug, Clone, Copy)]
pub struct TimeWindow {
    /// Newest second accepted (now + the allowed clock skew).
    pub newest: i64,
    /// Oldest second accepted (now − the rollup retention): older data would be deleted at once.
    pub oldest: i64,
}

impl TimeWindow {
    /// Checks every `t` of `batch`; the error names the field as a JSON path.
    pub fn check(&self, batch: &Batch) -> Result<(), (String, String)> {
        for (i, s) in batch.series.iter().enumerate() {
            for (j, &t) in s.t.iter().enumerate() {
                if t > self.newest {
                    return Err((
                        format!("series[{i}].t[{j}]"),
                        format!(
                            "{t} is {} s in the future (more than the allowed clock skew); check the exporter's clock",
                            t - self.newest
                        ),
                    ));
                }
                if t < self.oldest {
                    return Err((
                        format!("series[{i}].t[{j}]"),
                        format!(
                            "{t} is older than the rollup retention (oldest accepted: {})",
                            self.oldest
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Decompresses at most `limit` bytes; `None` when the body inflates past it.
fn inflate(body: &[u8], limit: usize) -> Result<Option<Vec<u8>>, std::io::Error> {
    let mut out = Vec::with_capacity(body.len().saturating_mul(8).min(limit));
    GzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)?;
    Ok((out.len() <= limit).then_some(out))
}

/// The handler.
pub async fn ingest(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<IngestResponse>, ApiError> {
    let reject = |reason: RejectReason, node: Option<&str>, e: ApiError| {
        IngestRejected {
            reason,
            node,
            message: &e.message,
        }
        .emit(&app.metrics);
        e
    };
    let role = app
        .tokens
        .authenticate(&headers)
        .map_err(|e| reject(RejectReason::Unauthorized, None, e))?;
    let limits = &app.config.limits;
    let bytes = axum::body::to_bytes(body, limits.max_body_bytes)
        .await
        .map_err(|_| {
            reject(
                RejectReason::TooLarge,
                None,
                ApiError::too_large(format!(
                    "the body is over {} bytes (or was cut off)",
                    limits.max_body_bytes
                )),
            )
        })?;
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let decoded_limit = limits.max_decoded_bytes;
    let batch = tokio::task::spawn_blocking(move || -> Result<Batch, ApiError> {
        let json = if gzip {
            match inflate(&bytes, decoded_limit) {
                Ok(Some(json)) => json,
                Ok(None) => {
                    return Err(ApiError::too_large(format!(
                        "the body inflates to more than {decoded_limit} bytes"
                    )));
                }
                Err(e) => {
                    return Err(ApiError::bad_request(
                        "body",
                        format!("not valid gzip: {e}"),
                    ));
                }
            }
        } else {
            bytes.to_vec()
        };
        Batch::decode(&json, false)
            .map_err(|e| ApiError::bad_request(e.field().to_owned(), e.to_string()))
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| {
        let reason = if e.status.as_u16() == 413 {
            RejectReason::TooLarge
        } else {
            RejectReason::Invalid
        };
        reject(reason, None, e)
    })?;
    let node = Some(batch.node.as_str());
    if !role.may_ingest_for(&batch.node) {
        return Err(reject(
            RejectReason::Forbidden,
            node,
            ApiError::forbidden(
                "node",
                format!("this token is not valid for node {:?}", batch.node),
            ),
        ));
    }
    if let Some(i) = batch
        .series
        .iter()
        .position(|s| !role.may_ingest_for(&s.node))
    {
        return Err(reject(
            RejectReason::Forbidden,
            node,
            ApiError::forbidden(
                format!("series[{i}].node"),
                format!(
                    "this token is not valid for node {:?}",
                    batch.series[i].node
                ),
            ),
        ));
    }
    let now = chrono::Utc::now().timestamp();
    app.config
        .window(now)
        .check(&batch)
        .map_err(|(field, message)| {
            reject(
                RejectReason::Invalid,
                node,
                ApiError::bad_request(field, message),
            )
        })?;
    let samples = batch.sample_count();
    let reservation = app.writer.try_reserve(samples).map_err(|e| match e {
        QueueError::TooLarge { .. } => reject(
            RejectReason::TooLarge,
            node,
            ApiError::too_large(e.to_string()),
        ),
        QueueError::Full { .. } | QueueError::Stopped => reject(
            RejectReason::Overloaded,
            node,
            ApiError::unavailable(e.to_string(), 1),
        ),
    })?;
    app.metrics
        .queue_samples
        .set(app.writer.queued_samples() as i64);
    let batch_id = batch.batch_id;
    let node_name = batch.node.clone();
    let outcome: IngestOutcome = app
        .writer
        .ingest(batch, now - app.config.retention.raw_secs, reservation)
        .await
        .map_err(|e| {
            let error = match &e {
                StoreError::WriterStopped => ApiError::unavailable(e.to_string(), 5),
                _ => {
                    // Logged once, here; the exporter keeps the batch and retries.
                    tracing::error!(error = %e, batch_id = %batch_id, "A batch could not be written; the exporter will retry it.");
                    ApiError::unavailable("the ledger could not write this batch; retry", 5)
                }
            };
            reject(RejectReason::StoreError, Some(&node_name), error)
        })?;
    let m = &app.metrics;
    m.queue_samples.set(app.writer.queued_samples() as i64);
    if outcome.duplicate_batch {
        m.duplicate_batches.inc();
    } else {
        m.batches.inc();
    }
    m.samples.inc_by(outcome.stored);
    m.duplicate_samples.inc_by(outcome.duplicate_samples);
    Ok(Json(IngestResponse {
        batch_id,
        samples: outcome.samples,
        stored: outcome.stored,
        duplicate_samples: outcome.duplicate_samples,
        duplicate_batch: outcome.duplicate_batch,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inflate_stops_at_the_limit() {
        use flate2::write::GzEncoder;
        use std::io::Write;
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&vec![b'a'; 10_000]).unwrap();
        let body = gz.finish().unwrap();
        assert_eq!(inflate(&body, 10_000).unwrap().unwrap().len(), 10_000);
        assert!(inflate(&body, 9_999).unwrap().is_none());
        assert!(inflate(b"not gzip", 100).is_err());
    }
}
