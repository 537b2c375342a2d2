//! Shipping: 1 s samples → sealed batches → on-disk spool → `POST /api/v1/ingest`.
//!
//! Contract (`schema/WIRE.md`): gzip JSON batch, `Authorization: Bearer <token>`, a unique
//! `batch_id` per batch, sent by the one ingest client (`gpuledger_client::ingest`, which also
//! decides which answers are retried). A 2xx acknowledges the batch and it leaves the spool. 408, 429, 5xx and
//! connection failures are retried, oldest batch first, after an exponential back-off (1 s
//! doubling to 15 s) or the server's `Retry-After`, each wait stretched by a random 0–100 %, so
//! that a fleet that lost its aggregator does not come back in lockstep (at most 30 s, or twice
//! the Retry-After); the batch waits on disk meanwhile, across restarts too. 401/403
//! are retried as well (a token fix must not cost data) and logged at ERROR. Any other 4xx means
//! the aggregator will never accept the batch: it moves to `spool/rejected/`, is counted as
//! dropped and logged at ERROR.
//!
//! Bounds: a batch holds at most `max_batch_samples` samples and share seconds together; the spool
//! holds at most `spool_max_bytes`.
//! When it is full, a live source drops the oldest batch (counted, ERROR); a recorded source
//! (replay) waits for room instead, since it can.

mod fallback;
pub mod spool;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuledger_schema::wire::{self, Batch};
use gpuledger_schema::{GpuSample, Sample, ShareSample};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use gpuledger_client::ingest::{Answer, IngestClient, IngestConfig};

use crate::metrics::{Metrics, ReasonLabels};
use fallback::{Body, Fallback, Refusal};
use spool::Spool;

/// Where and how to ship.
#[derive(Debug, Clone)]
pub struct ShipConfig {
    /// Aggregator base URL (`http://aggregator:9836`).
    pub aggregator: String,
    /// Bearer token.
    pub token: String,
    /// The node this exporter speaks for.
    pub node: String,
    /// Spool directory.
    pub spool_dir: PathBuf,
    /// Spool bound in bytes.
    pub spool_max_bytes: u64,
    /// How often the buffer is sealed into a batch.
    pub interval: Duration,
    /// Largest batch, in samples.
    pub max_batch_samples: usize,
    /// Wait for room instead of dropping the oldest batch when the spool is full.
    pub wait_when_full: bool,
    /// Per-request timeout.
    pub request_timeout: Duration,
    /// How new batches are encoded (a spooled body is re-sent as it was encoded).
    pub format: wire::Format,
    /// How long JSON is sent after the aggregator refused MessagePack as unreadable, before
    /// MessagePack is tried again ([`fallback`]).
    pub msgpack_retry: Duration,
}

/// How the sender should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Keep going.
    Running,
    /// Stop once the spool is empty, or at the deadline (what is left stays spooled).
    Drain(Option<Instant>),
}

/// A shipping failure that needs the operator; anything transient is retried instead.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The spool directory is unusable.
    #[error("spool {dir}: {source}")]
    Spool {
        /// The directory.
        dir: String,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// A batch left the spool without being acknowledged. Logged at ERROR: this is data loss.
struct BatchDropped<'a> {
    reason: &'static str,
    entry: &'a spool::Entry,
    detail: String,
}

impl BatchDropped<'_> {
    fn emit(&self, metrics: &Metrics) {
        tracing::error!(
            reason = self.reason,
            batch_id = %self.entry.batch_id,
            samples = self.entry.samples,
            "A batch was dropped without reaching the aggregator: {}.",
            self.detail
        );
        metrics
            .exporter
            .batches_dropped
            .get_or_create(&ReasonLabels {
                reason: self.reason,
            })
            .inc();
    }
}

/// A send failed; counted by reason, logged once per failure streak.
struct ShipFailed {
    reason: &'static str,
    detail: String,
}

impl ShipFailed {
    fn emit(&self, metrics: &Metrics, first_in_streak: bool) {
        if first_in_streak {
            if self.reason == "unauthorized" {
                tracing::error!(
                    reason = self.reason,
                    "The aggregator refused this exporter's token ({}); batches stay spooled until it is fixed.",
                    self.detail
                );
            } else {
                tracing::warn!(
                    reason = self.reason,
                    "Cannot ship to the aggregator ({}); batches wait in the spool and are retried.",
                    self.detail
                );
            }
        }
        metrics
            .exporter
            .ship_failures
            .get_or_create(&ReasonLabels {
                reason: self.reason,
            })
            .inc();
    }
}

fn update_spool_gauges(metrics: &Metrics, spool: &Spool) {
    metrics.exporter.spool_batches.set(spool.len() as i64);
    metrics.exporter.spool_bytes.set(spool.bytes() as i64);
}

/// One second's output for the ledger: its samples and the per-owner shares of shared instances.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shipment {
    /// The samples.
    pub samples: Vec<Sample>,
    /// The shares (empty on nodes without shared GPUs).
    pub shares: Vec<ShareSample>,
    /// The GPUs' energy in the second.
    pub gpus: Vec<GpuSample>,
}

/// Runs the shipper: seals what arrives on `samples` into batches, spools and sends them. Returns
/// when `samples` closes and the sender has finished per `finish`.
pub async fn run(
    config: ShipConfig,
    metrics: Arc<Metrics>,
    mut samples: mpsc::Receiver<Shipment>,
    finish: watch::Receiver<Finish>,
) -> Result<(), ShipError> {
    let spool_err = |source| ShipError::Spool {
        dir: config.spool_dir.display().to_string(),
        source,
    };
    let spool = Spool::open(&config.spool_dir, config.spool_max_bytes).map_err(spool_err)?;
    if !spool.is_empty() {
        tracing::info!(
            batches = spool.len(),
            bytes = spool.bytes(),
            "Resuming with batches a previous run left in the spool."
        );
    }
    update_spool_gauges(&metrics, &spool);
    let spool = Arc::new(Mutex::new(spool));
    let notify = Arc::new(Notify::new());
    let client = IngestClient::new(&IngestConfig {
        aggregator: config.aggregator.clone(),
        token: config.token.clone(),
        timeout: config.request_timeout,
        user_agent: concat!("gpuledger-exporter/", env!("CARGO_PKG_VERSION")).into(),
    })
    .map_err(|e| ShipError::Client(e.to_string()))?;
    // Set once the last batch is sealed: only then may a draining sender stop on an empty spool.
    let sealed_all = Arc::new(AtomicBool::new(false));
    // JSON while the aggregator cannot read MessagePack ([`Outcome::Unread`]).
    let fallback = Arc::new(Fallback::new(
        config.msgpack_retry,
        metrics.exporter.wire_json_fallback.clone(),
    ));
    let format = || fallback.format(config.format);
    let sender = tokio::spawn(send_loop(
        config.clone(),
        client,
        spool.clone(),
        notify.clone(),
        metrics.clone(),
        finish,
        sealed_all.clone(),
        fallback.clone(),
    ));

    let mut buffer: Vec<Sample> = Vec::new();
    // Shares ride with the next batch sealed (they are few: one per owner of a shared instance).
    let mut shares: Vec<ShareSample> = Vec::new();
    // Each GPU-second's energy goes in the batch of that GPU's samples of the second.
    let mut gpus: Vec<GpuSample> = Vec::new();
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            got = samples.recv() => match got {
                Some(s) => {
                    buffer.extend(s.samples);
                    shares.extend(s.shares);
                    gpus.extend(s.gpus);
                    // Samples, share seconds and GPU-seconds count alike against a batch's
                    // size, as the aggregator counts them (schema/WIRE.md, "Limits").
                    let max = config.max_batch_samples.max(1);
                    while buffer.len() + shares.len() + gpus.len() >= max {
                        let these: Vec<ShareSample> = shares.drain(..shares.len().min(max)).collect();
                        let cut = whole_gpu_seconds(&buffer, max.saturating_sub(these.len()).max(1));
                        let rest = buffer.split_off(cut);
                        let sealed = std::mem::replace(&mut buffer, rest);
                        let energy = energy_of(&mut gpus, &sealed);
                        seal(&config, format(), &metrics, &spool, &notify, sealed, these, energy).await.map_err(spool_err)?;
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                if !buffer.is_empty() || !shares.is_empty() || !gpus.is_empty() {
                    seal(&config, format(), &metrics, &spool, &notify, std::mem::take(&mut buffer), std::mem::take(&mut shares), std::mem::take(&mut gpus)).await.map_err(spool_err)?;
                }
            }
        }
    }
    if !buffer.is_empty() || !shares.is_empty() || !gpus.is_empty() {
        seal(
            &config,
            format(),
            &metrics,
            &spool,
            &notify,
            buffer,
            shares,
            gpus,
        )
        .await
        .map_err(spool_err)?;
    }
    sealed_all.store(true, Ordering::Release);
    tracing::debug!("Sealed the last batch; waiting for the sender.");
    notify.notify_one();
    sender.await.expect("the sender does not panic");
    Ok(())
}

/// How many of `buffer`'s first samples fit in `budget` places with the GPU-seconds they bring
/// (each run of one GPU's samples of one second counted once more), cut between such runs: a
/// GPU-second's samples stay in one batch with its energy. At least one run.
fn whole_gpu_seconds(buffer: &[Sample], budget: usize) -> usize {
    fn key(s: &Sample) -> (i64, &str) {
        (s.timestamp, s.instance.gpu_uuid.as_str())
    }
    let (mut used, mut run_start) = (0usize, 0usize);
    for (i, s) in buffer.iter().enumerate() {
        let new_run = i == 0 || key(&buffer[i - 1]) != key(s);
        if new_run {
            run_start = i;
        }
        used += 1 + usize::from(new_run);
        if used > budget {
            return if run_start > 0 { run_start } else { i.max(1) };
        }
    }
    buffer.len()
}

/// Takes out of `gpus` the GPU-seconds of `samples`.
fn energy_of(gpus: &mut Vec<GpuSample>, samples: &[Sample]) -> Vec<GpuSample> {
    let keys: std::collections::HashSet<(i64, &str)> = samples
        .iter()
        .map(|s| (s.timestamp, s.instance.gpu_uuid.as_str()))
        .collect();
    let (taken, kept) = std::mem::take(gpus)
        .into_iter()
        .partition(|g| keys.contains(&(g.timestamp, g.gpu_uuid.as_str())));
    *gpus = kept;
    taken
}

#[allow(clippy::too_many_arguments)]
async fn seal(
    config: &ShipConfig,
    format: wire::Format,
    metrics: &Metrics,
    spool: &Mutex<Spool>,
    notify: &Notify,
    samples: Vec<Sample>,
    shares: Vec<ShareSample>,
    gpus: Vec<GpuSample>,
) -> std::io::Result<()> {
    let batch = Batch::from_samples(&config.node, &samples)
        .with_shares(&shares)
        .with_gpus(&gpus);
    let body = batch.encode_as(format);
    if config.wait_when_full {
        while spool
            .lock()
            .expect("spool lock")
            .would_overflow(body.len() as u64)
        {
            notify.notify_one();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let dropped = tokio::task::block_in_place(|| {
        let mut spool = spool.lock().expect("spool lock");
        let dropped = spool.push(batch.batch_id, samples.len() as u64, &body);
        update_spool_gauges(metrics, &spool);
        dropped
    })?;
    tracing::debug!(batch_id = %batch.batch_id, samples = samples.len(), bytes = body.len(), "Sealed a batch into the spool.");
    for entry in &dropped {
        BatchDropped {
            reason: "spool_full",
            entry,
            detail: format!(
                "the spool reached its bound of {} bytes",
                config.spool_max_bytes
            ),
        }
        .emit(metrics);
    }
    notify.notify_one();
    Ok(())
}

/// What became of one attempt, as the sender acts on it.
enum Outcome {
    Acked,
    Retry {
        reason: &'static str,
        detail: String,
        after: Option<Duration>,
    },
    Rejected(String),
    /// A MessagePack body the aggregator did not read (415, or a 400 blaming the whole body):
    /// an aggregator older than MessagePack bodies, or a damaged body ([`fallback`] tells which).
    Unread(String),
}

impl From<Answer> for Outcome {
    fn from(answer: Answer) -> Outcome {
        match answer {
            Answer::Stored(_) => Outcome::Acked,
            Answer::Retry {
                reason,
                detail,
                after,
            } => Outcome::Retry {
                reason: reason.as_str(),
                detail,
                after,
            },
            Answer::Unread(detail) => Outcome::Unread(detail),
            Answer::Rejected(detail) => Outcome::Rejected(detail),
        }
    }
}

/// The waits between retries of one batch: 1 s doubling to 15 s, each stretched by a random
/// 0–100 % (so 1–2 s, 2–4 s, … 15–30 s).
fn backoff_policy() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(15))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// `wait` stretched by a random 0–100 %: a fleet told `Retry-After: 1` spreads over a second.
fn jittered(wait: Duration) -> Duration {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(wait)
        .with_max_delay(wait)
        .with_jitter()
        .build()
        .next()
        .unwrap_or(wait)
}

/// Longest wait between two attempts, whatever the backoff or a `Retry-After` says.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What the sender keeps between attempts: the spool's oldest batch goes first, and stays
/// until the aggregator acknowledged it (ack after commit) or refused it for good.
struct Sender {
    client: IngestClient,
    spool: Arc<Mutex<Spool>>,
    metrics: Arc<Metrics>,
    fallback: Arc<Fallback>,
    backoff: backon::ExponentialBackoff,
    /// Whether the last attempt failed (a failure streak is logged once).
    failing: bool,
    /// Batches counted in `batches_spooled` (once each, however often they are retried).
    counted_as_spooled: HashSet<u64>,
}

impl Sender {
    /// One attempt at `entry`; `None` when the batch left the spool meanwhile.
    async fn attempt(&self, entry: &spool::Entry, body: Vec<u8>) -> Option<Outcome> {
        let body = match tokio::task::block_in_place(|| self.fallback.body(entry.seq, body)) {
            Body::Send(body) => body,
            Body::Damaged(why) => return Some(Outcome::Rejected(why)),
        };
        match Outcome::from(self.client.post(entry.batch_id, body).await) {
            // Only a MessagePack body is unread: read back from its file (the rare case pays,
            // not every send), it tells whether the body or the aggregator is at fault.
            Outcome::Unread(detail) => {
                // Dropped from a full spool meanwhile: nothing is left to decide.
                let sent = tokio::task::block_in_place(|| std::fs::read(&entry.path)).ok()?;
                Some(
                    match tokio::task::block_in_place(|| self.fallback.refused(entry.seq, &sent)) {
                        Refusal::FallBack => Outcome::Unread(detail),
                        Refusal::Damaged(why) => Outcome::Rejected(format!(
                            "the aggregator refused it ({detail}) and {why}"
                        )),
                    },
                )
            }
            outcome => Some(outcome),
        }
    }

    /// The aggregator stored the batch: out of the spool.
    fn acked(&mut self, entry: &spool::Entry) {
        tokio::task::block_in_place(|| {
            let mut spool = self.spool.lock().expect("spool lock");
            if let Err(e) = spool.ack(entry.seq) {
                tracing::error!(error = %e, "Cannot remove an acknowledged batch from the spool; it will be re-sent and deduplicated by id.");
            }
            update_spool_gauges(&self.metrics, &spool);
        });
        self.metrics.exporter.batches_shipped.inc();
        self.metrics.exporter.samples_shipped.inc_by(entry.samples);
        self.counted_as_spooled.remove(&entry.seq);
        if self.failing {
            tracing::info!("The aggregator accepts batches again.");
        }
        self.failing = false;
        self.backoff = backoff_policy();
    }

    /// The aggregator refused the batch for good: moved aside, counted and logged as dropped.
    fn rejected(&self, entry: &spool::Entry, detail: String) {
        let moved = tokio::task::block_in_place(|| {
            let mut spool = self.spool.lock().expect("spool lock");
            let moved = spool.reject(entry.seq);
            update_spool_gauges(&self.metrics, &spool);
            moved
        });
        ShipFailed {
            reason: "rejected",
            detail: detail.clone(),
        }
        .emit(&self.metrics, true);
        let kept = moved
            .map(|p| format!(", kept at {}", p.display()))
            .unwrap_or_default();
        BatchDropped {
            reason: "rejected",
            entry,
            detail: format!("the aggregator refused it ({detail}){kept}"),
        }
        .emit(&self.metrics);
    }

    /// The batch stays for another attempt: how long to wait for it (the aggregator's
    /// `Retry-After`, jittered, or the backoff's next step).
    fn retry(
        &mut self,
        entry: &spool::Entry,
        reason: &'static str,
        detail: String,
        after: Option<Duration>,
    ) -> Duration {
        ShipFailed { reason, detail }.emit(&self.metrics, !self.failing);
        self.failing = true;
        if self.counted_as_spooled.insert(entry.seq) {
            self.metrics.exporter.batches_spooled.inc();
        }
        match after {
            Some(after) => jittered(after.min(MAX_BACKOFF)),
            None => self.backoff.next().unwrap_or(MAX_BACKOFF),
        }
    }
}

async fn send_loop(
    config: ShipConfig,
    client: IngestClient,
    spool: Arc<Mutex<Spool>>,
    notify: Arc<Notify>,
    metrics: Arc<Metrics>,
    mut finish: watch::Receiver<Finish>,
    sealed_all: Arc<AtomicBool>,
    fallback: Arc<Fallback>,
) {
    let msgpack_retry = config.msgpack_retry;
    let mut sender = Sender {
        client,
        spool: spool.clone(),
        metrics,
        fallback,
        backoff: backoff_policy(),
        failing: false,
        counted_as_spooled: HashSet::new(),
    };
    loop {
        let state = *finish.borrow();
        if let Finish::Drain(Some(deadline)) = state
            && Instant::now() >= deadline
        {
            let left = spool.lock().expect("spool lock").len();
            if left > 0 {
                tracing::info!(
                    batches = left,
                    "Stopping with batches still spooled; they are sent on the next start."
                );
            }
            return;
        }
        let next = tokio::task::block_in_place(|| spool.lock().expect("spool lock").oldest());
        let (entry, body) = match next {
            Ok(Some(next)) => next,
            Ok(None) => {
                if matches!(state, Finish::Drain(_)) && sealed_all.load(Ordering::Acquire) {
                    tracing::debug!("The spool is empty; the sender is done.");
                    return;
                }
                tokio::select! {
                    _ = notify.notified() => {}
                    _ = finish.changed() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "Cannot read the spool; retrying.");
                tokio::time::sleep(MAX_BACKOFF).await;
                continue;
            }
        };
        tracing::debug!(batch_id = %entry.batch_id, "Sending a batch.");
        let Some(outcome) = sender.attempt(&entry, body).await else {
            continue;
        };
        let wait = match outcome {
            Outcome::Unread(detail) => {
                tracing::warn!(
                    batch_id = %entry.batch_id,
                    %detail,
                    retry_s = msgpack_retry.as_secs(),
                    "The aggregator does not read this MessagePack body (older than this exporter?); re-sending it as JSON, and JSON until --msgpack-retry has passed. Set --wire-format json to start that way."
                );
                continue;
            }
            Outcome::Acked => {
                sender.acked(&entry);
                continue;
            }
            Outcome::Rejected(detail) => {
                sender.rejected(&entry, detail);
                continue;
            }
            Outcome::Retry {
                reason,
                detail,
                after,
            } => sender.retry(&entry, reason, detail, after),
        };
        let mut wake = Instant::now() + wait;
        if let Finish::Drain(Some(deadline)) = *finish.borrow() {
            wake = wake.min(deadline);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = finish.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the back-off had no jitter, so after an aggregator outage the whole fleet
    /// retried in lockstep. Exporters started together now spread their retries.
    #[test]
    fn retries_of_a_fleet_are_spread_not_in_lockstep() {
        let fleet: Vec<Vec<Duration>> = (0..100)
            .map(|_| backoff_policy().take(8).collect())
            .collect();
        for waits in &fleet {
            for (k, w) in waits.iter().enumerate() {
                let floor = Duration::from_secs((1u64 << k).min(15));
                assert!(*w >= floor && *w < floor * 2, "retry {k}: {w:?}");
            }
        }
        let first: std::collections::HashSet<u128> =
            fleet.iter().map(|w| w[0].as_millis()).collect();
        assert!(
            first.len() > 50,
            "first retries collide: {} distinct of 100",
            first.len()
        );
        let after = Duration::from_secs(1);
        let told: std::collections::HashSet<u128> =
            (0..100).map(|_| jittered(after).as_millis()).collect();
        assert!(told.len() > 50, "Retry-After is followed in lockstep");
        assert!((0..100).all(|_| (after..after * 2).contains(&jittered(after))));
    }
}
