//! `gpuledger import`: backfill trace CSVs (`schema/TRACE.md`) into a ledger through the same
//! writer, deduplication and rollups as live ingest.
//!
//! All or nothing per run: every file is read and checked in full first (the sample rules, time
//! order is not required, and the same time window as ingest), and one bad row stops the run
//! before anything is written, naming `file:line:column`. Importing the same file twice stores
//! nothing the second time.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpuledger_schema::Sample;
use gpuledger_schema::trace::{TraceError, TraceReader};
use gpuledger_schema::wire::Batch;

use crate::store::{self, Retention, StoreError, Writer};

/// Samples per batch handed to the writer.
const CHUNK: usize = 50_000;

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Files read.
    pub files: usize,
    /// Samples read.
    pub samples: u64,
    /// Samples stored.
    pub stored: u64,
    /// Samples the ledger held already.
    pub duplicates: u64,
}

impl ImportReport {
    /// Counts one batch's outcome, and advances the progress bar.
    fn add(&mut self, samples: u64, stored: u64, duplicates: u64, bar: &indicatif::ProgressBar) {
        self.samples += samples;
        self.stored += stored;
        self.duplicates += duplicates;
        bar.inc(samples);
    }
}

/// Why an import stopped.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A file is invalid; nothing was imported.
    #[error("{0} (nothing was imported)")]
    Trace(#[from] TraceError),
    /// The ledger failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where an import goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// A ledger file, written here through its own writer (no aggregator may have it open).
    Ledger(PathBuf),
    /// A running aggregator, through `POST /api/v1/ingest` (as exporters send): its writer
    /// deduplicates the samples like any batch, so the ledger need not stop. The files are all
    /// checked before the first batch is sent; a run cut short part-way is completed by running
    /// it again (what was stored is not stored twice).
    Aggregator {
        /// Its base URL.
        url: String,
        /// A token that may ingest every node in the files (`admin` or `node:*`).
        token: String,
    },
}

/// Options of an import.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Where the samples go.
    pub target: Target,
    /// The traces.
    pub files: Vec<PathBuf>,
    /// The ledger's retention (older samples are refused, as at ingest).
    pub retention: Retention,
    /// Allowed clock skew for samples in the future, seconds.
    pub max_future_skew_secs: i64,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
}

fn check_file(path: &Path, oldest: i64, newest: i64) -> Result<u64, TraceError> {
    let mut reader = TraceReader::open(path)?;
    let mut n = 0;
    while let Some(sample) = reader.next_sample() {
        let t = sample?.timestamp;
        if t < oldest {
            return Err(reader.error_at(
                "timestamp",
                format!(
                    "{t} is older than the ledger's rollup retention (oldest accepted: {oldest})"
                ),
            ));
        }
        if t > newest {
            return Err(reader.error_at(
                "timestamp",
                format!("{t} is in the future (newest accepted: {newest})"),
            ));
        }
        n += 1;
    }
    Ok(n)
}

/// Runs an import.
pub async fn import(opts: ImportOptions) -> Result<ImportReport, ImportError> {
    let now = chrono::Utc::now().timestamp();
    let (oldest, newest) = (
        now - opts.retention.rollup_secs,
        now + opts.max_future_skew_secs,
    );
    let mut total = 0;
    for f in &opts.files {
        total += tokio::task::block_in_place(|| check_file(f, oldest, newest))?;
    }
    let (writer, thread) = match &opts.target {
        Target::Ledger(db) => {
            let (conn, _) = tokio::task::block_in_place(|| store::open(db))?;
            let (writer, thread) = Writer::spawn(conn, 4 * CHUNK, Arc::new(()))?;
            (Some(writer), Some(thread))
        }
        Target::Aggregator { .. } => (None, None),
    };
    let client = reqwest::Client::new();
    let bar = if opts.progress {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} samples ({per_sec}, {eta} left)",
        )
        .expect("a valid template"),
    );
    let raw_cutoff = now - opts.retention.raw_secs;
    let mut report = ImportReport {
        files: opts.files.len(),
        ..ImportReport::default()
    };
    let mut pending = Vec::new();
    // The first and last second read.
    let mut span: Option<(i64, i64)> = None;
    for f in &opts.files {
        let mut reader = TraceReader::open(f)?;
        let mut chunk: Vec<Sample> = Vec::with_capacity(CHUNK);
        loop {
            let next = tokio::task::block_in_place(|| reader.next_sample());
            let end = next.is_none();
            if let Some(s) = next {
                let s = s?;
                span = Some(span.map_or((s.timestamp, s.timestamp), |(a, b)| {
                    (a.min(s.timestamp), b.max(s.timestamp))
                }));
                chunk.push(s);
            }
            if chunk.len() == CHUNK || (end && !chunk.is_empty()) {
                let batch = Batch::from_samples(&chunk[0].instance.node, &chunk);
                let n = chunk.len();
                chunk.clear();
                match (&writer, &opts.target) {
                    (None, Target::Aggregator { url, token }) => {
                        let o = post(&client, url, token, &batch).await?;
                        report.add(o.samples, o.stored, o.duplicate_samples, &bar);
                    }
                    (Some(writer), _) => {
                        let reservation = writer
                            .reserve(n)
                            .await
                            .map_err(|e| StoreError::Io(e.to_string()))?;
                        let w = writer.clone();
                        pending.push(tokio::spawn(async move {
                            w.ingest(batch, raw_cutoff, reservation).await
                        }));
                    }
                    (None, Target::Ledger(_)) => unreachable!("a ledger target has a writer"),
                }
                // Results are collected in order as they complete; the queue bounds memory.
                while pending.first().is_some_and(|h| h.is_finished()) {
                    let o = pending
                        .remove(0)
                        .await
                        .map_err(|e| StoreError::Io(e.to_string()))??;
                    report.add(o.samples, o.stored, o.duplicate_samples, &bar);
                }
            }
            if end {
                break;
            }
        }
    }
    for h in pending {
        let o = h.await.map_err(|e| StoreError::Io(e.to_string()))??;
        report.add(o.samples, o.stored, o.duplicate_samples, &bar);
    }
    bar.finish_and_clear();
    // The imported seconds' raw rows in instance order, as the aggregator leaves a closed hour.
    if let (Some(writer), Some((first, last))) = (&writer, span) {
        writer.compact_raw(first.max(raw_cutoff), last + 1).await?;
    }
    drop(writer);
    if let Some(thread) = thread {
        tokio::task::block_in_place(|| {
            let _ = thread.join();
        });
    }
    Ok(report)
}

/// What the aggregator says of a batch (`api::ingest::IngestResponse`'s counts).
#[derive(Debug, serde::Deserialize)]
struct Posted {
    samples: u64,
    stored: u64,
    duplicate_samples: u64,
}

/// Sends one batch to a running aggregator, as an exporter does (gzip JSON, its batch id), and
/// retries what the aggregator asks to be retried (408, 429, 503, or no answer) with jittered
/// back-off, honouring `Retry-After`.
async fn post(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    batch: &Batch,
) -> Result<Posted, ImportError> {
    use backon::{ExponentialBuilder, Retryable};
    let body = batch.encode();
    let url = format!(
        "{}{}",
        url.trim_end_matches('/'),
        gpuledger_schema::wire::INGEST_PATH
    );
    let attempt = || async {
        let r = client
            .post(&url)
            .bearer_auth(token)
            .header(
                reqwest::header::CONTENT_TYPE,
                gpuledger_schema::wire::CONTENT_TYPE,
            )
            .header(reqwest::header::CONTENT_ENCODING, "gzip")
            .header("x-gpuledger-batch-id", batch.batch_id.to_string())
            .body(body.clone())
            .send()
            .await
            .map_err(|e| (true, format!("{url}: {}", e.without_url())))?;
        let status = r.status();
        let after = r
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        let text = r.text().await.unwrap_or_default();
        if status.is_success() {
            return serde_json::from_str::<Posted>(&text)
                .map_err(|e| (false, format!("the aggregator's answer: {e}: {text}")));
        }
        let retry = matches!(status.as_u16(), 408 | 429 | 503);
        if retry && let Some(secs) = after {
            tokio::time::sleep(std::time::Duration::from_secs(secs.min(30))).await;
        }
        Err((retry, format!("the aggregator answered {status}: {text}")))
    };
    attempt
        .retry(
            ExponentialBuilder::default()
                .with_jitter()
                .with_max_times(8)
                .with_max_delay(std::time::Duration::from_secs(15)),
        )
        .sleep(tokio::time::sleep)
        .when(|(retry, _)| *retry)
        .await
        .map_err(|(_, message)| ImportError::Store(StoreError::Io(message)))
}
