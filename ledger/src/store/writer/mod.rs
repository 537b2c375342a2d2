//! The one writer: a thread that owns the DuckDB write connection and turns batches into raw rows
//! and rollups.
//!
//! Async code hands it jobs over a channel. Jobs that arrive together are written together in one
//! transaction (group commit). For the group, the writer reads the minute masks the ledger holds
//! for its instances and minutes, then makes one pass over the samples: it keeps the first copy of
//! every (instance, second) that no mask covers, appends those inside the raw window to
//! `samples_raw` with DuckDB's appender on its Arrow path (column arrays, not a call per value;
//! `benches/aggregator.rs` measures both), and sums them per (instance, holder, minute). The
//! minute sums go to `ingest_delta_1m`, and a fixed SQL pipeline folds them into the minute, hour
//! and tenant rollups. The batch ids are recorded in the same transaction, so a batch is stored
//! entirely or not at all, and it is acknowledged only after the commit. If a group fails, its
//! batches are retried one by one so that one bad batch cannot hold back the others.
//!
//! The parts: `batch_ids` (which batches are stored already, and recording them), `dims` (the
//! dimension mirror and GPU index), `pass` (the masks a group is checked against, and the pass
//! that decides what is stored), `raw` (the Arrow columns of raw rows),
//! `rollups` (the deltas and the SQL that folds them), `minutes` (history as minute rows),
//! `retention` (what is deleted when), `compact` (raw rows rewritten in instance order once their
//! hour is over), `held` (folds held back while batches wait behind a group, and their recovery
//! after a crash), `checkpoints` (how much WAL gathers before DuckDB checkpoints, set by whether
//! the writer keeps up); this file holds the handle, the jobs and the write loop.
//!
//! Memory is bounded by the caller: [`Writer::try_reserve`] hands out queue permits counted in
//! samples, and a job holds its permit until it has been written and its batch, handed back
//! with the answer, freed on the request's thread ([`Written`]).

use std::sync::Arc;
use std::time::Instant;

use duckdb::Connection;
use gpuledger_schema::wire::Batch;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::{Failure, StoreError};

mod batch_ids;
mod checkpoints;
mod compact;
mod dims;
mod energy;
mod folder;
mod held;
mod minutes;
mod pass;
mod raw;
mod recent;
mod retention;
mod rollups;
mod shares;

use checkpoints::Checkpoints;
use checkpoints::compacting_checkpoint;
pub(crate) use checkpoints::{
    STEADY as CHECKPOINT_THRESHOLD, set_threshold as set_checkpoint_threshold, without_merges,
};
pub use compact::Compactor;
use dims::Dims;
pub use energy::set_idle_watts;
pub use minutes::{MinuteBatch, MinuteRow, MinutesOutcome};
pub use raw::RawColumns;
use rollups::Map;
use shares::write_shares;

/// What became of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IngestOutcome {
    /// Samples in the batch.
    pub samples: u64,
    /// Samples stored now: the rest were already in the ledger (or repeated within the batch).
    pub stored: u64,
    /// Samples that were already in the ledger.
    pub duplicate_samples: u64,
    /// The batch id had been stored before; nothing of it was looked at again.
    pub duplicate_batch: bool,
}

/// What retention removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// (table, rows deleted).
    pub deleted: Vec<(&'static str, u64)>,
}

/// How long rows are kept, in seconds before "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Raw 1 s samples (and batch ids).
    pub raw_secs: i64,
    /// Minute, hour and tenant rollups.
    pub rollup_secs: i64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            raw_secs: 48 * 3600,
            rollup_secs: 400 * 86400,
        }
    }
}

/// A write the analytics computed on a reader connection, applied on the writer's (one
/// transaction; what it returns goes back to the caller).
pub type ApplyFn = Box<dyn FnOnce(&duckdb::Transaction<'_>) -> duckdb::Result<()> + Send>;

/// A unit of work for the writer thread.
enum Job {
    Ingest(IngestJob),
    Apply {
        write: ApplyFn,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Retention {
        now: i64,
        retention: Retention,
        reply: oneshot::Sender<Result<RetentionReport, StoreError>>,
    },
    Probe {
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    CompactRaw {
        from: i64,
        to: i64,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    CompactingCheckpoint {
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    Minutes {
        batch: MinuteBatch,
        reply: oneshot::Sender<Result<MinutesOutcome, StoreError>>,
    },
    /// The fold thread has a result ([`folder`]): only wakes the writer, which takes it.
    FoldLanded,
}

struct IngestJob {
    batch: Batch,
    /// Unix seconds: samples older than this go to the rollups only.
    raw_cutoff: i64,
    reply: oneshot::Sender<Written>,
    permit: OwnedSemaphorePermit,
}

impl IngestJob {
    /// Answers the job, handing its batch and queue places back with the answer.
    fn answer(self, result: Result<IngestOutcome, StoreError>) {
        let _ = self.reply.send(Written {
            result,
            _batch: self.batch,
            _permit: self.permit,
        });
    }
}

/// The writer's answer to an ingest job. It brings the batch back, with its places in the queue,
/// so that the request's thread frees it: the request thread allocated it, and freeing a group's
/// batches (hundreds of thousands of small vectors) on the writer thread is a visible part of the
/// one serial stage (docs/perf/writer.md, "The writer's own work, and what bounds the live
/// path"). The places are given back once the batch is freed, so the queue still bounds the
/// batches' memory.
struct Written {
    result: Result<IngestOutcome, StoreError>,
    _batch: Batch,
    _permit: OwnedSemaphorePermit,
}

/// Observes each committed group; the aggregator's telemetry implements it.
pub trait WriteObserver: Send + Sync + 'static {
    /// A group of `batches` batches was committed in `seconds`.
    fn committed(&self, batches: usize, seconds: f64);
    /// The newest sample second written so far.
    fn newest_sample(&self, ts: i64);
    /// The writer holds `rows` (instance, holder, minute) deltas whose samples are stored but
    /// not yet in the rollups ([`held`]).
    fn held(&self, rows: usize);
    /// A start after a crash, or a failed write, folded `samples` stored but not yet folded.
    fn recovered(&self, samples: u64);
    /// The fold thread folded `rows` held deltas into the rollups in `seconds` ([`folder`]).
    fn folded(&self, rows: usize, seconds: f64);
}

impl WriteObserver for () {
    fn committed(&self, _: usize, _: f64) {}
    fn newest_sample(&self, _: i64) {}
    fn held(&self, _: usize) {}
    fn recovered(&self, _: u64) {}
    fn folded(&self, _: usize, _: f64) {}
}

/// How many instances (MIG slices, whole GPUs) the ledger may hold: per node, and in all. A
/// token that may write for any node could otherwise grow the ledger, and every page that lists
/// instances, without limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceBounds {
    /// Instances one node may have.
    pub per_node: usize,
    /// Instances the whole ledger may have.
    pub fleet: usize,
}

impl InstanceBounds {
    /// No bound (tools that write a ledger of their own: import, the benchmarks).
    pub const NONE: InstanceBounds = InstanceBounds {
        per_node: usize::MAX,
        fleet: usize::MAX,
    };
}

/// The handle async code holds; cheap to clone.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::UnboundedSender<Job>,
    queue: Arc<Semaphore>,
    capacity: usize,
}

/// Why a job could not be queued.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    /// More samples than the whole queue holds: this batch can never be taken.
    #[error("the batch holds {samples} samples, more than the writer queue's {capacity}")]
    TooLarge {
        /// Samples in the batch.
        samples: usize,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The queue is full right now; try again later.
    #[error("the writer is behind: {queued} of {capacity} queued samples")]
    Full {
        /// Samples queued.
        queued: usize,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The writer thread is gone.
    #[error("the writer thread has stopped")]
    Stopped,
}

/// A place in the writer's queue, held from admission until the batch is written.
pub struct Reservation(OwnedSemaphorePermit);

/// Most samples written in one transaction; a group stops growing here.
const GROUP_SAMPLES: usize = 1_000_000;

/// While batches trickle in, the shortest time from one group's start to the next. At a fleet's
/// own pace (250 small batches a second) the writer otherwise wrote 58 groups a second of 2
/// batches at the median, and spent nearly all its time on what each group costs whatever its
/// size: the commit, the mask and batch-id look-ups, the folds (docs/perf/writer.md, "At a fleet's
/// own pace, and the backfill"). The writer pauses only when the last group left batches waiting
/// and fewer than
/// [`held::HOLD_BEHIND`] samples wait now: a lone batch, or one sent after the last was
/// acknowledged, is written at once, and a writer that is behind does not wait.
const GATHER: std::time::Duration = std::time::Duration::from_millis(50);

/// How long the writer waits before gathering the next group ([`GATHER`]): `last_group` is when
/// the last one started and whether jobs waited behind it; `queued` is the samples queued now.
fn gather_pause(last_group: Option<(Instant, bool)>, queued: usize) -> std::time::Duration {
    match last_group {
        Some((started, true)) if queued < held::HOLD_BEHIND => {
            GATHER.saturating_sub(started.elapsed())
        }
        _ => std::time::Duration::ZERO,
    }
}

impl Writer {
    /// Starts the writer thread on `conn` (already migrated). `queue_samples` bounds the samples
    /// waiting to be written.
    pub fn spawn(
        conn: Connection,
        queue_samples: usize,
        observer: Arc<dyn WriteObserver>,
    ) -> Result<(Writer, std::thread::JoinHandle<()>), StoreError> {
        Writer::spawn_limited(conn, queue_samples, InstanceBounds::NONE, observer)
    }

    /// [`Writer::spawn`], refusing (as [`StoreError::Rejected`]) a batch that would pass one of
    /// `bounds`: give one node, or the whole ledger, more instances than allowed.
    pub fn spawn_limited(
        mut conn: Connection,
        queue_samples: usize,
        bounds: InstanceBounds,
        observer: Arc<dyn WriteObserver>,
    ) -> Result<(Writer, std::thread::JoinHandle<()>), StoreError> {
        if let Some(samples) = held::recover(&mut conn).map_err(StoreError::from_db)? {
            tracing::warn!(
                samples,
                "Folded into the rollups the samples a stopped writer had stored but not yet folded."
            );
            observer.recovered(samples);
        }
        let dims = Dims::load(&conn).map_err(StoreError::from_db)?;
        let idle_watts = energy::IdleWatts::load(&conn).map_err(StoreError::from_db)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let wake = tx.downgrade();
        let folder = folder::Folder::spawn(
            conn.try_clone().map_err(StoreError::from_db)?,
            Box::new(move || {
                if let Some(tx) = wake.upgrade() {
                    let _ = tx.send(Job::FoldLanded);
                }
            }),
        )
        .map_err(|e| StoreError::Io(format!("cannot start the fold thread: {e}")))?;
        let capacity = queue_samples.clamp(1, Semaphore::MAX_PERMITS);
        let queue = Arc::new(Semaphore::new(capacity));
        let waiting = Waiting {
            queue: queue.clone(),
            capacity,
        };
        let thread = std::thread::Builder::new()
            .name("gpuledger-writer".into())
            .spawn(move || {
                WriterThread {
                    conn,
                    dims,
                    idle_watts,
                    observer,
                    bounds,
                    held: held::Held::default(),
                    folder,
                    recent: recent::Recent::default(),
                    needs_recovery: false,
                    checkpoints: Checkpoints::default(),
                    last_group: None,
                }
                .run(rx, waiting)
            })
            .map_err(|e| StoreError::Io(format!("cannot start the writer thread: {e}")))?;
        Ok((
            Writer {
                tx,
                queue,
                capacity,
            },
            thread,
        ))
    }

    /// Samples waiting to be written.
    pub fn queued_samples(&self) -> usize {
        self.capacity - self.queue.available_permits()
    }

    /// The queue's capacity in samples.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether the writer thread still runs.
    pub fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Takes `samples` places in the queue without waiting.
    pub fn try_reserve(&self, samples: usize) -> Result<Reservation, QueueError> {
        if samples > self.capacity {
            return Err(QueueError::TooLarge {
                samples,
                capacity: self.capacity,
            });
        }
        let n = u32::try_from(samples.max(1)).unwrap_or(u32::MAX);
        match self.queue.clone().try_acquire_many_owned(n) {
            Ok(p) => Ok(Reservation(p)),
            Err(tokio::sync::TryAcquireError::Closed) => Err(QueueError::Stopped),
            Err(tokio::sync::TryAcquireError::NoPermits) => Err(QueueError::Full {
                queued: self.queued_samples(),
                capacity: self.capacity,
            }),
        }
    }

    /// Takes `samples` places in the queue, waiting for room (imports use this: they would
    /// rather wait than fail).
    pub async fn reserve(&self, samples: usize) -> Result<Reservation, QueueError> {
        if samples > self.capacity {
            return Err(QueueError::TooLarge {
                samples,
                capacity: self.capacity,
            });
        }
        let n = u32::try_from(samples.max(1)).unwrap_or(u32::MAX);
        self.queue
            .clone()
            .acquire_many_owned(n)
            .await
            .map(Reservation)
            .map_err(|_| QueueError::Stopped)
    }

    /// Writes `batch` (already validated) and resolves once it is committed. Samples before
    /// `raw_cutoff` (Unix seconds) go to the rollups only.
    pub async fn ingest(
        &self,
        batch: Batch,
        raw_cutoff: i64,
        reservation: Reservation,
    ) -> Result<IngestOutcome, StoreError> {
        self.submit(batch, raw_cutoff, reservation)?.await
    }

    /// Queues `batch` at once, so that batches submitted one after another are written in that
    /// order, and answers the future of its outcome ([`Writer::ingest`] awaits it).
    pub fn submit(
        &self,
        batch: Batch,
        raw_cutoff: i64,
        reservation: Reservation,
    ) -> Result<impl Future<Output = Result<IngestOutcome, StoreError>> + Send + 'static, StoreError>
    {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Ingest(IngestJob {
                batch,
                raw_cutoff,
                reply,
                permit: reservation.0,
            }))
            .map_err(|_| StoreError::WriterStopped)?;
        // The batch and its queue places are dropped where this is awaited: on the request's
        // thread.
        Ok(async move { rx.await.map_err(|_| StoreError::WriterStopped)?.result })
    }

    /// Runs `write` in one transaction on the writer's connection, between ingest groups.
    /// `write` must not change `samples_raw`, `rollup_1m` or `fold_pending`: the writer's dedup
    /// keeps the recent minutes' stored seconds in memory and would not see it ([`recent`]).
    pub async fn apply(&self, write: ApplyFn) -> Result<(), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Apply { write, reply })
            .map_err(|_| StoreError::WriterStopped)?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// [`Writer::apply`] for a write that answers something (rows changed, say): `write`'s value,
    /// once its transaction is committed.
    pub async fn apply_with<T: Send + 'static>(
        &self,
        write: impl FnOnce(&duckdb::Transaction<'_>) -> duckdb::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (value, rx) = oneshot::channel();
        self.apply(Box::new(move |tx| {
            let _ = value.send(write(tx)?);
            Ok(())
        }))
        .await?;
        rx.await.map_err(|_| StoreError::WriterStopped)
    }

    /// Writes minute rows straight into the rollups (see [`MinuteBatch`]) and resolves once they
    /// are committed. The caller bounds its size: it takes no place in the ingest queue.
    pub async fn ingest_minutes(&self, batch: MinuteBatch) -> Result<MinutesOutcome, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Minutes { batch, reply })
            .map_err(|_| StoreError::WriterStopped)?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// Commits a one-row update on the writer's connection, in turn with the ingest groups: `Ok`
    /// means a commit reached the disk just now.
    pub async fn probe(&self) -> Result<(), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Probe { reply })
            .map_err(|_| StoreError::WriterStopped)?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// Rewrites the raw rows of the hours from the one holding `from` up to `to` (Unix seconds)
    /// in instance order, so that they compress ([`compact`](self) says why); resolves to the
    /// rows rewritten. Answers are unchanged by it.
    pub async fn compact_raw(&self, from: i64, to: i64) -> Result<u64, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::CompactRaw { from, to, reply })
            .map_err(|_| StoreError::WriterStopped)?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// Records that the raw rows of the hours `[from, until)` are in instance order (what an
    /// import leaves), so that the aggregator does not rewrite them again; see
    /// [`compact::extend_record`] for when the record moves. Resolves to the record afterwards.
    pub async fn record_in_order(&self, from: i64, until: i64) -> Result<Option<i64>, StoreError> {
        self.apply_with(move |tx| compact::extend_record(tx, from, until))
            .await
    }

    /// A checkpoint that merges row groups and frees the blocks of deleted rows, between groups
    /// (what a [`Compactor`] asks for after each hour it rewrote). One DuckDB refuses is left to
    /// the next, with a warning ([`checkpoints::checkpoint_after_commit`]): the rewrite has
    /// committed, so this only errs when the writer has stopped.
    pub async fn compacting_checkpoint(&self) -> Result<(), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::CompactingCheckpoint { reply })
            .map_err(|_| StoreError::WriterStopped)?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// Deletes what is older than `retention` allows, as of `now` (Unix seconds).
    pub async fn apply_retention(
        &self,
        now: i64,
        retention: Retention,
    ) -> Result<RetentionReport, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Retention {
                now,
                retention,
                reply,
            })
            .map_err(|_| StoreError::WriterStopped)?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }
}

/// A group's new batches (indexes into its batches) with the ids their entries were given: what
/// the steps of a write after id assignment walk.
#[derive(Clone, Copy)]
struct NewBatches<'a> {
    batches: &'a [(&'a Batch, i64)],
    new: &'a [usize],
    ids: &'a [dims::BatchIds],
}

impl<'a> NewBatches<'a> {
    /// Each new batch with its index in the group and its entries' ids.
    fn iter(self) -> impl Iterator<Item = (usize, &'a Batch, &'a dims::BatchIds)> {
        self.new
            .iter()
            .zip(self.ids)
            .map(move |(&i, ids)| (i, self.batches[i].0, ids))
    }
}

/// The writer queue as the writer thread sees it: how many samples wait behind a group.
struct Waiting {
    queue: Arc<Semaphore>,
    capacity: usize,
}

impl Waiting {
    /// Places in the queue taken by `group` (held until its batches are written).
    fn taken_by(group: &[IngestJob]) -> usize {
        group.iter().map(|j| j.permit.num_permits()).sum()
    }

    /// Samples queued besides the `own` places of the group being written.
    fn behind(&self, own: usize) -> usize {
        (self.capacity - self.queue.available_permits()).saturating_sub(own)
    }
}

struct WriterThread {
    /// Where held folds run while batches wait ([`folder`]). Declared first: dropped first, it
    /// lets a fold in flight end before the writer's connection closes.
    folder: folder::Folder,
    conn: Connection,
    dims: Dims,
    /// The energy split's idle floor per GPU model, as the ledger had it at start.
    idle_watts: energy::IdleWatts,
    observer: Arc<dyn WriteObserver>,
    bounds: InstanceBounds,
    /// Deltas stored but not yet folded ([`held`]).
    held: held::Held,
    /// The seconds stored in the last minutes, for dedup ([`recent`]).
    recent: recent::Recent,
    /// What is held may be ahead of the ledger: set while a group's deltas are taken in and not
    /// yet committed, and kept when that write failed and re-deriving what is held from the
    /// ledger failed too. No batch is written until it is re-derived (dedup would miss the held
    /// seconds).
    needs_recovery: bool,
    /// The checkpoint threshold in force ([`checkpoints`]).
    checkpoints: Checkpoints,
    /// When the last ingest group started, and whether batches waited behind it ([`GATHER`]).
    last_group: Option<(Instant, bool)>,
}

/// Why a write failed: DuckDB, or a batch the ledger refuses.
#[derive(Debug)]
enum WriteError {
    Db(duckdb::Error),
    Rejected { field: String, message: String },
}

impl From<duckdb::Error> for WriteError {
    fn from(e: duckdb::Error) -> Self {
        WriteError::Db(e)
    }
}

impl WriterThread {
    fn run(mut self, mut rx: mpsc::UnboundedReceiver<Job>, waiting: Waiting) {
        let mut pending: Option<Job> = None;
        loop {
            if pending.is_none() && rx.is_empty() && !self.folder.busy() && !self.held.settled() {
                // Idle: fold what is held, so that readers see it. (With a fold in flight, its
                // landing wakes the writer.)
                let _ = self.fold_held();
            }
            self.observer.held(self.held.rows());
            let job = match pending.take() {
                Some(j) => j,
                None => match rx.blocking_recv() {
                    Some(j) => j,
                    None => break,
                },
            };
            // Only an ingest group keeps the recent minutes' seconds up to date; a job that
            // writes raw rows or rollups has them read again ([`recent`]). A caller's job
            // ([`Writer::apply`]) writes neither.
            if !matches!(
                job,
                Job::Ingest(_)
                    | Job::Probe { .. }
                    | Job::CompactingCheckpoint { .. }
                    | Job::Apply { .. }
                    | Job::FoldLanded
            ) {
                self.recent.forget();
            }
            match job {
                Job::Retention {
                    now,
                    retention,
                    reply,
                } => {
                    let _ = reply.send(self.retention_job(now, retention));
                }
                Job::CompactRaw { from, to, reply } => {
                    // Its checkpoints are refused while another transaction has changes.
                    let result = self.settle_fold().and_then(|()| self.compact_raw(from, to));
                    let _ = reply.send(result);
                }
                Job::CompactingCheckpoint { reply } => {
                    // A checkpoint is refused while another transaction has changes.
                    let _ = self.settle_fold();
                    checkpoints::checkpoint_after_commit(&self.conn, "an hour's rewrite");
                    let _ = reply.send(Ok(()));
                }
                Job::Probe { reply } => {
                    let result = self.conn.transaction().and_then(|tx| {
                        tx.execute(
                            "UPDATE writer_probe SET checked_at = ? WHERE id = 0",
                            [chrono::Utc::now().timestamp()],
                        )?;
                        tx.commit()
                    });
                    let _ = reply.send(result.map_err(StoreError::from_db));
                }
                Job::Minutes { batch, reply } => {
                    let _ = reply.send(self.minutes_job(&batch));
                }
                Job::Apply { write, reply } => {
                    let result = self.conn.transaction().and_then(|tx| {
                        write(&tx)?;
                        tx.commit()
                    });
                    let _ = reply.send(result.map_err(StoreError::from_db));
                }
                Job::FoldLanded => {
                    let _ = self.fold_landed(false);
                }
                Job::Ingest(first) => {
                    std::thread::sleep(gather_pause(self.last_group, waiting.behind(0)));
                    let mut samples = first.batch.sample_count();
                    let mut group = vec![first];
                    while samples < GROUP_SAMPLES {
                        match rx.try_recv() {
                            Ok(Job::Ingest(j)) => {
                                samples += j.batch.sample_count();
                                group.push(j);
                            }
                            // Taken when the group is written.
                            Ok(Job::FoldLanded) => {}
                            Ok(other) => {
                                pending = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let own = Waiting::taken_by(&group);
                    let behind = || waiting.behind(own);
                    let started = Instant::now();
                    self.ingest_group(group, &behind);
                    self.last_group = Some((started, !rx.is_empty()));
                }
            }
        }
        if let Err(e) = self.fold_held() {
            tracing::error!(error = %e, "Cannot fold the held rollup deltas at stop; the next start folds them.");
        }
        tracing::info!("The writer thread stopped: every queued batch was written.");
    }

    /// Applies retention. Raw rows are what recovers held seconds, and an instance that only
    /// held deltas name has no rollup row to keep it: what is held (and in flight) is folded
    /// before anything is deleted.
    fn retention_job(
        &mut self,
        now: i64,
        retention: Retention,
    ) -> Result<RetentionReport, StoreError> {
        self.fold_held()?;
        self.retention(now, retention)
    }

    /// Writes minute rows. They are checked against the masks in the ledger alone, so what is
    /// held (and in flight) is folded first: else a row over held seconds would be stored twice.
    fn minutes_job(&mut self, batch: &MinuteBatch) -> Result<MinutesOutcome, StoreError> {
        let started = Instant::now();
        self.fold_held()?;
        let outcome = self.write_minutes(batch)?;
        self.observer.committed(1, started.elapsed().as_secs_f64());
        Ok(outcome)
    }

    /// Folds what is held, in a transaction of its own, once the fold in flight has landed.
    fn fold_held(&mut self) -> Result<(), StoreError> {
        self.settle_fold()?;
        if self.held.settled() && !self.needs_recovery {
            return Ok(());
        }
        let result = self
            .conn
            .transaction()
            .map_err(WriteError::from)
            .and_then(|tx| {
                self.held
                    .fold_with(&tx, Map::default(), Map::default())
                    .and_then(|()| Ok(tx.commit()?))
            });
        match result {
            Ok(()) if !self.needs_recovery => {
                self.held.folded();
                Ok(())
            }
            _ => self.recover(),
        }
    }

    /// Waits for the fold in flight; an error is that of the recovery after a failed fold.
    fn settle_fold(&mut self) -> Result<(), StoreError> {
        self.fold_landed(true)
    }

    /// Takes the result of the fold in flight, waiting for it if `wait` ([`Self::fold_result`]).
    fn fold_landed(&mut self, wait: bool) -> Result<(), StoreError> {
        let result = if wait {
            self.folder.wait()
        } else {
            self.folder.poll()
        };
        self.fold_result(result)
    }

    /// Once a fold has landed its seconds are in the rollups' masks; if it failed, what it took
    /// is re-derived from the raw rows ([`Self::recover`]), whose error this is.
    fn fold_result(&mut self, result: Option<folder::Folded>) -> Result<(), StoreError> {
        let Some(folded) = result else {
            return Ok(());
        };
        match folded.result {
            Ok(()) => {
                self.held.landed();
                self.observer.folded(folded.rows, folded.seconds);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "A held fold failed on the fold thread; folding what is stored but not folded from the raw rows.");
                self.recover()
            }
        }
    }

    /// Hands what is held to the fold thread. While a fold is in flight it keeps holding, up to
    /// [`held::HOLD_ROWS`] rows; past them it waits for that fold (the memory bound).
    fn start_fold(&mut self) {
        if self.held.is_empty() || (self.folder.busy() && !self.held.full()) {
            return;
        }
        if self.settle_fold().is_err() || self.held.is_empty() {
            return;
        }
        if self.folder.stopped() {
            // Nothing to hand it to: fold here (an error leaves a recovery behind it).
            let _ = self.fold_held();
            return;
        }
        let job = self.held.take();
        if self.folder.start(job).is_err() {
            // The thread ended since `stopped`: what it took is lost with it, so it is derived
            // again from the raw rows now, before anything folds what is held beside it.
            tracing::error!(
                "The fold thread stopped with a fold handed to it; folding what it took from the raw rows."
            );
            let _ = self.recover();
        }
    }

    /// Re-derives from the ledger what was stored but not folded, and folds it.
    fn recover(&mut self) -> Result<(), StoreError> {
        // What the fold in flight did, or failed to do, is read from the ledger.
        let _ = self.folder.wait();
        self.held.folded();
        self.recent.forget();
        match held::recover(&mut self.conn) {
            Ok(samples) => {
                self.needs_recovery = false;
                self.observer.recovered(samples.unwrap_or(0));
                Ok(())
            }
            Err(e) => {
                self.needs_recovery = true;
                tracing::error!(error = %e, "Cannot fold the samples stored but not yet folded; no batch is written until it can.");
                Err(StoreError::from_db(e))
            }
        }
    }

    fn ingest_group(&mut self, group: Vec<IngestJob>, behind: &dyn Fn() -> usize) {
        // One span per transaction; the ingest requests it commits are their own spans.
        let _span = tracing::info_span!("writer.commit", batches = group.len()).entered();
        let started = Instant::now();
        let batches: Vec<(&Batch, i64)> = group.iter().map(|j| (&j.batch, j.raw_cutoff)).collect();
        match self.write(&batches, behind) {
            Ok(outcomes) => {
                // One span for both: the commit histogram and the writer's share of the time.
                let spent = started.elapsed();
                self.observer.committed(group.len(), spent.as_secs_f64());
                for (job, outcome) in group.into_iter().zip(outcomes) {
                    job.answer(Ok(outcome));
                }
                if let Err(e) = self.checkpoints.wrote(&self.conn, spent) {
                    tracing::warn!(error = %e, "Cannot change DuckDB's checkpoint threshold; the one in force stays.");
                }
            }
            Err(e) if group.len() > 1 => {
                tracing::warn!(
                    batches = group.len(),
                    error = %e,
                    "A group of batches failed to commit; writing them one by one."
                );
                for job in group {
                    let started = Instant::now();
                    let result = self.write(&[(&job.batch, job.raw_cutoff)], behind);
                    if result.is_ok() {
                        self.observer.committed(1, started.elapsed().as_secs_f64());
                    }
                    job.answer(result.map(|mut o| o.remove(0)));
                }
            }
            Err(e) => {
                if let Some(job) = group.into_iter().next() {
                    job.answer(Err(e));
                }
            }
        }
    }

    /// Writes batches in one transaction. On error nothing is written and the in-memory
    /// dimension mirror is reloaded from the database. A single batch that fails on its values
    /// ([`Failure::Data`]) is [`StoreError::Rejected`]: the same bytes would fail the same way
    /// on every retry, so retrying it would only hold back what its node sends next.
    fn write(
        &mut self,
        batches: &[(&Batch, i64)],
        behind: &dyn Fn() -> usize,
    ) -> Result<Vec<IngestOutcome>, StoreError> {
        if self.needs_recovery {
            self.recover()?;
        }
        self.fold_landed(false)?;
        if self.folder.busy() && reaches_past_raw_window(batches) {
            // Such a group folds in its own transaction, which may not begin beside a fold.
            self.settle_fold()?;
        }
        let result = self.try_write(batches, behind);
        if result.is_err() {
            self.recent.forget();
            self.reload_dims();
            // What is held may have taken this group's deltas (only then is `needs_recovery` set):
            // derive it again from the ledger. A write refused before that (a per-node limit, a
            // bad value) leaves what is held as it was, and costs no re-derivation.
            if self.needs_recovery {
                let _ = self.recover();
            }
        }
        result.map_err(|e| match e {
            WriteError::Rejected { field, message } => StoreError::Rejected { field, message },
            WriteError::Db(e) if batches.len() == 1 && Failure::of(&e) == Failure::Data => {
                StoreError::Rejected {
                    field: "body".into(),
                    message: format!("the ledger cannot store this batch's values: {e}"),
                }
            }
            WriteError::Db(e) => StoreError::from_db(e),
        })
    }

    fn reload_dims(&mut self) {
        match Dims::load(&self.conn) {
            Ok(mut d) => {
                // An id is never given out twice in a process, though retention may have deleted
                // the newest: an evaluation pass that read it as one instance or holder tops up
                // its dimensions by id only (`analytics::facts::Dims::load_newer`).
                d.next_instance = d.next_instance.max(self.dims.next_instance);
                d.next_holder = d.next_holder.max(self.dims.next_holder);
                self.dims = d;
            }
            Err(e) => {
                tracing::error!(error = %e, "Cannot reload the dimension tables after a failed write.")
            }
        }
    }

    /// Writes `batches` in one transaction: the batch ids first (a batch stored before is not
    /// looked at again), then the dimensions, the shares, the pass (what is stored) and the raw
    /// rows; it folds the group's minute deltas into the rollups, or holds them while samples
    /// wait ([`held`]), and commits.
    fn try_write(
        &mut self,
        batches: &[(&Batch, i64)],
        behind: &dyn Fn() -> usize,
    ) -> Result<Vec<IngestOutcome>, WriteError> {
        // A transaction begun beside a fold in flight leaves the rollups alone ([`folder`]).
        let fold_free = !self.folder.busy();
        let tx = self.conn.transaction()?;
        let (mut outcomes, new) = batch_ids::new_batches(&tx, batches)?;
        if new.is_empty() {
            tx.commit()?;
            return Ok(outcomes);
        }
        let ids = self.dims.assign_ids(self.bounds, batches, &new)?;
        // Batches of one group may have been admitted with different cutoffs; the latest one is
        // the one in force now. Shares and samples older than it are outside the raw window.
        let raw_cutoff = batches.iter().map(|(_, c)| *c).max().unwrap_or(i64::MIN);
        let group = NewBatches {
            batches,
            new: &new,
            ids: &ids,
        };
        self.dims.flush(&tx)?;
        write_shares(&tx, group, raw_cutoff)?;
        energy::write_energy(&tx, group, &self.idle_watts)?;
        let covered = pass::covered(&tx, &self.dims, &self.held, &mut self.recent, group)?;
        let mut pass = pass::pass(&self.dims, covered, group, raw_cutoff, &mut outcomes)?;
        let masks = std::mem::take(&mut pass.masks);
        if !pass.raw.is_empty() {
            // The Arrow path: one columnar chunk per 2,048 rows instead of a call per value.
            let mut app = tx.appender("samples_raw")?;
            app.append_record_batch(pass.raw.into_record_batch()?)?;
            app.flush()?;
        }
        // Fold the group's deltas with whatever is held when nothing waits behind it; else hold
        // them (see `held`), and hand what is held to the fold thread once it is due.
        let behind = behind();
        debug_assert!(fold_free || pass.rollup_only == 0, "see `write`");
        let folding = pass.rollup_only > 0 || (fold_free && behind == 0);
        if folding {
            self.held.fold_with(&tx, pass.deltas, pass.gpu_deltas)?;
        } else if let Some(oldest) = pass.oldest {
            // From here until the commit, what is held is ahead of the ledger.
            self.needs_recovery = true;
            self.held.hold(&tx, pass.deltas, pass.gpu_deltas, oldest)?;
        }
        for &i in &new {
            let o = &mut outcomes[i];
            o.duplicate_samples = o.samples - o.stored;
        }
        batch_ids::record(&tx, batches, &new, &outcomes)?;
        tx.commit()?;
        self.recent.stored(&masks);
        self.needs_recovery = false;
        if folding {
            self.held.folded();
        } else if behind == 0 {
            // Nothing waits, but a fold was in flight: fold what is held before the group is
            // answered, as when none is.
            if let Err(e) = self.fold_held() {
                tracing::warn!(error = %e, "Cannot fold what is held after a group; the next fold or start does.");
            }
        } else if self.held.due(behind) {
            self.start_fold();
        }
        if let Some(newest) = pass.newest {
            self.observer.newest_sample(newest);
        }
        Ok(outcomes)
    }
}

/// Whether any sample of `batches` is older than the group's raw window (the latest cutoff of
/// its batches): the pass keeps such seconds in the rollups only, folded in the group's own
/// transaction.
fn reaches_past_raw_window(batches: &[(&Batch, i64)]) -> bool {
    let cutoff = batches.iter().map(|(_, c)| *c).max().unwrap_or(i64::MIN);
    batches
        .iter()
        .any(|(b, _)| b.series.iter().any(|s| s.t.iter().any(|&t| t < cutoff)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gpuledger_schema::wire::Series;

    use super::*;

    /// A whole H100 (no MIG) of `node`, for the writer's tests.
    pub(super) fn whole_h100(node: &str, gpu_uuid: String) -> gpuledger_schema::Instance {
        gpuledger_schema::Instance {
            node: node.into(),
            gpu_uuid,
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
            mig_profile: None,
            gpu_instance_id: None,
            placement_start: None,
            placement_size: None,
        }
    }

    /// Retention may delete the newest instance and holder; the writer's reload of its
    /// dimensions then still gives out new ids only (an evaluation pass that read the deleted
    /// ones tops up its dimensions by id).
    #[test]
    fn a_reload_after_deletes_gives_no_id_out_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = held::tests::writer(&dir.path().join("l.duckdb"));
        let t0 = (chrono::Utc::now().timestamp() / 3600 - 2) * 3600;
        for b in held::tests::batches(t0).iter().take(3) {
            w.try_write(&[(b, 0)], &|| 0).unwrap();
        }
        let next = (w.dims.next_instance, w.dims.next_holder);
        assert!(next.0 > 1 && next.1 > 1, "{next:?}");
        w.conn
            .execute_batch(
                "DELETE FROM instances WHERE instance_id = (SELECT max(instance_id) FROM instances);
                 DELETE FROM holders WHERE holder_id = (SELECT max(holder_id) FROM holders);",
            )
            .unwrap();
        w.reload_dims();
        assert_eq!((w.dims.next_instance, w.dims.next_holder), next);
    }

    /// Lets the gated fold in flight commit 200 ms from now, as a slow fold would: call it just
    /// before the job that must wait for that fold.
    fn release_after_200ms(open: std::sync::mpsc::Sender<()>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            open.send(()).unwrap();
        })
    }

    /// `w` with [`held::tests::batches`]' first 20 held and the rest held beside a fold of those
    /// 20 that is in flight, gated: it commits once the returned sender is sent to
    /// ([`release_after_200ms`]). The samples stored, and that sender.
    fn holding_and_folding(
        w: &mut WriterThread,
        all: &[Batch],
    ) -> (u64, std::sync::mpsc::Sender<()>) {
        let open = held::tests::gate_folds(w);
        let (first, rest) = all.split_at(20);
        let mut n = held::tests::write_all(w, first, true);
        w.start_fold();
        assert!(w.folder.busy() && w.held.is_empty());
        n += held::tests::write_all(w, rest, true);
        assert!(!w.held.is_empty());
        (n, open)
    }

    /// Retention deletes the raw rows that a start after a crash would fold held seconds from, and
    /// the instances no rollup row names: it folds what is held and in flight first.
    #[test]
    fn retention_folds_what_is_held_before_it_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let (_, all, stored, expected) = held::tests::written_directly(dir.path());
        let path = dir.path().join("retained.duckdb");
        let mut w = held::tests::writer(&path);
        let (n, open) = holding_and_folding(&mut w, &all);
        assert_eq!(n, stored);
        // A raw window of a minute: every raw row (one to two hours old) goes.
        let now = chrono::Utc::now().timestamp();
        let opener = release_after_200ms(open);
        let report = w
            .retention_job(
                now,
                Retention {
                    raw_secs: 60,
                    ..Retention::default()
                },
            )
            .unwrap();
        opener.join().unwrap();
        assert!(
            report.deleted.contains(&("samples_raw", stored)),
            "{report:?}"
        );
        assert!(report.deleted.contains(&("instances", 0)), "{report:?}");
        assert!(w.held.settled() && !w.folder.busy());
        // The process dies now, folding nothing more: the rollups already hold every sample.
        drop(w);
        let (mut conn, _) = crate::store::open(&path).unwrap();
        assert_eq!(held::recover(&mut conn).unwrap(), None);
        drop(conn);
        assert_eq!(held::tests::rollups(&path), expected);
        assert_eq!(held::tests::from_ts(&path), None);
    }

    /// Minute rows are checked against the ledger's masks: a row over seconds that are held, or
    /// in a fold in flight, is not stored (it would count them twice).
    #[test]
    fn minute_rows_see_the_seconds_held_and_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = (chrono::Utc::now().timestamp() / 3600 - 2) * 3600 + 3540;
        let all = held::tests::batches(t0);
        // The first instance of the batches, described as a minute batch's entry.
        let entry = Series {
            t: Vec::new(),
            ..all[0].series[0].clone()
        };
        let row = |bucket: i64| MinuteRow {
            entry: 0,
            bucket,
            mask: (1 << 60) - 1,
            counters: gpuledger_schema::Counters {
                sm_active: Some(0.5),
                ..Default::default()
            },
        };
        // The first minute of the batches, and a minute none of them reaches.
        let minutes = MinuteBatch {
            entries: vec![entry],
            rows: vec![row(t0), row(t0 + 600)],
        };
        let want = MinutesOutcome {
            stored_rows: 1,
            stored_seconds: 60,
            overlapping: vec![0],
        };

        let direct = dir.path().join("direct.duckdb");
        let mut w = held::tests::writer(&direct);
        let stored = held::tests::write_all(&mut w, &all, false);
        assert_eq!(w.minutes_job(&minutes).unwrap(), want);
        drop(w);
        let expected = held::tests::rollups(&direct);

        let path = dir.path().join("held.duckdb");
        let mut w = held::tests::writer(&path);
        let (n, open) = holding_and_folding(&mut w, &all);
        let opener = release_after_200ms(open);
        assert_eq!(w.minutes_job(&minutes).unwrap(), want);
        opener.join().unwrap();
        assert!(w.held.settled() && !w.folder.busy());
        drop(w);
        assert_eq!(n, stored);
        assert_eq!(held::tests::rollups(&path), expected);
    }

    /// The write loop, as [`Writer::spawn`] runs it, on `w`: the handle, and its thread.
    fn run_loop(w: WriterThread, capacity: usize) -> (Writer, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queue = Arc::new(Semaphore::new(capacity));
        let waiting = Waiting {
            queue: queue.clone(),
            capacity,
        };
        let thread = std::thread::spawn(move || w.run(rx, waiting));
        (
            Writer {
                tx,
                queue,
                capacity,
            },
            thread,
        )
    }

    /// Counts the committed groups that left deltas held: `fold_pending.from_ts` is set when a
    /// group commits holding, and read here on the writer's thread right after the commit, before
    /// the loop can fold.
    struct HeldGroups {
        conn: std::sync::Mutex<Connection>,
        count: std::sync::atomic::AtomicUsize,
    }

    impl WriteObserver for HeldGroups {
        fn committed(&self, _: usize, _: f64) {
            let from: Option<i64> = self
                .conn
                .lock()
                .unwrap()
                .query_row("SELECT from_ts FROM fold_pending", [], |r| r.get(0))
                .unwrap();
            if from.is_some() {
                self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        fn newest_sample(&self, _: i64) {}
        fn held(&self, _: usize) {}
        fn recovered(&self, _: u64) {}
        fn folded(&self, _: usize, _: f64) {}
    }

    /// A writer that finds nothing more to do folds what it holds, so that readers see every
    /// acknowledged batch: without waiting out [`held::HOLD_FOR`], another batch or a stop.
    #[test]
    fn an_idle_writer_folds_what_it_held() {
        let dir = tempfile::tempdir().unwrap();
        let (_, all, stored, expected) = held::tests::written_directly(dir.path());
        let path = dir.path().join("idle.duckdb");
        let mut w = held::tests::writer(&path);
        let reader = w.conn.try_clone().unwrap();
        let held_groups = Arc::new(HeldGroups {
            conn: std::sync::Mutex::new(w.conn.try_clone().unwrap()),
            count: Default::default(),
        });
        w.observer = held_groups.clone();
        let (writer, thread) = run_loop(w, 10_000_000);
        // Places the test keeps: every group finds more than HOLD_BEHIND samples behind it, so
        // it holds its deltas (for up to HOLD_FOR, 30 s).
        let _behind = writer.try_reserve(2 * held::HOLD_BEHIND).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut n = 0;
        for b in &all {
            let places = writer.try_reserve(b.sample_count()).unwrap();
            n += rt
                .block_on(writer.ingest(b.clone(), 0, places))
                .unwrap()
                .stored;
        }
        assert_eq!(n, stored);
        // The premise: the groups held their deltas (else this would test nothing).
        let held = held_groups.count.load(std::sync::atomic::Ordering::SeqCst);
        assert!(held > all.len() / 2, "{held} of {} groups held", all.len());
        let deadline = Instant::now() + Duration::from_secs(10);
        while held::tests::rollups_of(&reader) != expected {
            assert!(
                Instant::now() < deadline,
                "the held deltas were not folded while the writer was idle"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(writer);
        thread.join().unwrap();
        drop(reader);
        assert_eq!(held::tests::from_ts(&path), None);
    }

    #[test]
    fn the_writer_pauses_only_while_batches_trickle_in() {
        let just_now = Some((Instant::now(), true));
        // A first group, or one after a group nothing waited behind, starts at once.
        assert_eq!(gather_pause(None, 280), Duration::ZERO);
        assert_eq!(
            gather_pause(Some((Instant::now(), false)), 280),
            Duration::ZERO
        );
        // Batches waited behind the last group, and few wait now: wait out the rest of GATHER.
        let pause = gather_pause(just_now, 280);
        assert!(pause > Duration::ZERO && pause <= GATHER, "{pause:?}");
        // A writer that is behind does not wait.
        assert_eq!(gather_pause(just_now, held::HOLD_BEHIND), Duration::ZERO);
        // Nor once GATHER has passed since the last group started.
        let long_ago = Instant::now() - GATHER - Duration::from_millis(1);
        assert_eq!(gather_pause(Some((long_ago, true)), 280), Duration::ZERO);
    }
}
