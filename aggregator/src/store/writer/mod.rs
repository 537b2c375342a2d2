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
//! Memory is bounded by the caller: [`Writer::try_reserve`] hands out queue permits counted in
//! samples, and a job holds its permit until it has been written.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use duckdb::arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, UInt64Array,
};
use duckdb::arrow::datatypes::{DataType, Field, Schema};
use duckdb::{Connection, params};
use gpuledger_schema::wire::{Batch, Series};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::{Failure, StoreError};

mod minutes;

pub use minutes::{MinuteBatch, MinuteRow, MinutesOutcome};

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
    Minutes {
        batch: MinuteBatch,
        reply: oneshot::Sender<Result<MinutesOutcome, StoreError>>,
    },
}

struct IngestJob {
    batch: Batch,
    /// Unix seconds: samples older than this go to the rollups only.
    raw_cutoff: i64,
    reply: oneshot::Sender<Result<IngestOutcome, StoreError>>,
    _permit: OwnedSemaphorePermit,
}

/// Observes each committed group; the aggregator's telemetry implements it.
pub trait WriteObserver: Send + Sync + 'static {
    /// A group of `batches` batches was committed in `seconds`.
    fn committed(&self, batches: usize, seconds: f64);
    /// The newest sample second written so far.
    fn newest_sample(&self, ts: i64);
}

impl WriteObserver for () {
    fn committed(&self, _: usize, _: f64) {}
    fn newest_sample(&self, _: i64) {}
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

impl Writer {
    /// Starts the writer thread on `conn` (already migrated). `queue_samples` bounds the samples
    /// waiting to be written.
    pub fn spawn(
        conn: Connection,
        queue_samples: usize,
        observer: Arc<dyn WriteObserver>,
    ) -> Result<(Writer, std::thread::JoinHandle<()>), StoreError> {
        Writer::spawn_limited(conn, queue_samples, usize::MAX, observer)
    }

    /// [`Writer::spawn`], refusing (as [`StoreError::Rejected`]) a batch that would give one node
    /// more than `max_instances_per_node` instances in the ledger.
    pub fn spawn_limited(
        conn: Connection,
        queue_samples: usize,
        max_instances_per_node: usize,
        observer: Arc<dyn WriteObserver>,
    ) -> Result<(Writer, std::thread::JoinHandle<()>), StoreError> {
        let dims = Dims::load(&conn).map_err(StoreError::from_db)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let capacity = queue_samples.clamp(1, Semaphore::MAX_PERMITS);
        let thread = std::thread::Builder::new()
            .name("gpuledger-writer".into())
            .spawn(move || {
                WriterThread {
                    conn,
                    dims,
                    observer,
                    max_instances_per_node,
                }
                .run(rx)
            })
            .map_err(|e| StoreError::Io(format!("cannot start the writer thread: {e}")))?;
        Ok((
            Writer {
                tx,
                queue: Arc::new(Semaphore::new(capacity)),
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
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Ingest(IngestJob {
                batch,
                raw_cutoff,
                reply,
                _permit: reservation.0,
            }))
            .map_err(|_| StoreError::WriterStopped)?;
        rx.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// Runs `write` in one transaction on the writer's connection, between ingest groups.
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

/// The dimension tables, mirrored in memory so that ids are assigned without a query per series.
struct Dims {
    instances: HashMap<InstanceKey, i32>,
    holders: HashMap<HolderKey, i32>,
    /// Each instance's GPU, as an index into `gpu_members` (GPUs are told apart by UUID).
    gpu_of: HashMap<i32, usize>,
    gpu_slots: HashMap<String, usize>,
    /// The instance ids on each GPU: the GPU's observed seconds are the union of theirs.
    gpu_members: Vec<Vec<i32>>,
    /// Instances per node, for the per-node bound.
    per_node: HashMap<String, usize>,
    next_instance: i32,
    next_holder: i32,
    new_instances: Vec<(i32, InstanceKey)>,
    new_holders: Vec<(i32, HolderKey)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct InstanceKey {
    node: String,
    gpu_uuid: String,
    gpu_instance_id: i32,
    gpu_model: String,
    mig_profile: Option<String>,
    placement_start: Option<i32>,
    placement_size: Option<i32>,
}

type HolderKey = (Option<String>, Option<String>, Option<String>);

impl InstanceKey {
    fn of(s: &Series) -> InstanceKey {
        InstanceKey {
            node: s.node.clone(),
            gpu_uuid: s.gpu_uuid.clone(),
            // Validation bounds ids far below i32::MAX (`MAX_MIG_ID`); saturating keeps an
            // unvalidated id from ever becoming -1, the whole-GPU marker.
            gpu_instance_id: s
                .gpu_instance_id
                .map_or(-1, |g| i32::try_from(g).unwrap_or(i32::MAX)),
            gpu_model: s.gpu_model.clone(),
            mig_profile: s.mig_profile.clone(),
            placement_start: s
                .placement_start
                .map(|v| i32::try_from(v).unwrap_or(i32::MAX)),
            placement_size: s
                .placement_size
                .map(|v| i32::try_from(v).unwrap_or(i32::MAX)),
        }
    }
}

fn holder_key(s: &Series) -> HolderKey {
    (
        s.tenant.clone(),
        s.workload.clone(),
        s.slo_class.map(|c| c.as_str().to_owned()),
    )
}

impl Dims {
    fn load(conn: &Connection) -> duckdb::Result<Dims> {
        let mut instances = HashMap::new();
        let mut stmt = conn.prepare(
            "SELECT instance_id, node, gpu_uuid, gpu_instance_id, gpu_model, mig_profile, placement_start, placement_size FROM instances",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i32>(0)?,
                InstanceKey {
                    node: r.get(1)?,
                    gpu_uuid: r.get(2)?,
                    gpu_instance_id: r.get(3)?,
                    gpu_model: r.get(4)?,
                    mig_profile: r.get(5)?,
                    placement_start: r.get(6)?,
                    placement_size: r.get(7)?,
                },
            ))
        })?;
        let mut gpus = GpuIndex::default();
        let mut per_node: HashMap<String, usize> = HashMap::new();
        for row in rows {
            let (id, key) = row?;
            gpus.add(id, &key.gpu_uuid);
            *per_node.entry(key.node.clone()).or_default() += 1;
            instances.insert(key, id);
        }
        let mut holders = HashMap::new();
        let mut stmt =
            conn.prepare("SELECT holder_id, tenant, workload, slo_class FROM holders")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, i32>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?)))
        })?;
        for row in rows {
            let (id, key) = row?;
            holders.insert(key, id);
        }
        Ok(Dims {
            next_instance: instances.values().copied().max().unwrap_or(0) + 1,
            next_holder: holders.values().copied().max().unwrap_or(0) + 1,
            instances,
            holders,
            gpu_of: gpus.gpu_of,
            gpu_slots: gpus.slots,
            gpu_members: gpus.members,
            per_node,
            new_instances: Vec::new(),
            new_holders: Vec::new(),
        })
    }

    /// The id of `s`'s instance; a new one is assigned in memory and written by [`Dims::flush`].
    /// `None` when a new one would give its node more than `max_per_node` instances.
    fn instance_id(&mut self, s: &Series, max_per_node: usize) -> Option<i32> {
        let key = InstanceKey::of(s);
        if let Some(&id) = self.instances.get(&key) {
            return Some(id);
        }
        let count = self.per_node.entry(key.node.clone()).or_default();
        if *count >= max_per_node {
            return None;
        }
        *count += 1;
        let id = self.next_instance;
        self.next_instance += 1;
        let slot = match self.gpu_slots.get(&key.gpu_uuid) {
            Some(&g) => g,
            None => {
                self.gpu_members.push(Vec::new());
                self.gpu_slots
                    .insert(key.gpu_uuid.clone(), self.gpu_members.len() - 1);
                self.gpu_members.len() - 1
            }
        };
        self.gpu_of.insert(id, slot);
        self.gpu_members[slot].push(id);
        self.new_instances.push((id, key.clone()));
        self.instances.insert(key, id);
        Some(id)
    }

    /// The id of `s`'s holder; a new one is written by [`Dims::flush`].
    fn holder_id(&mut self, s: &Series) -> i32 {
        let key = holder_key(s);
        if let Some(&id) = self.holders.get(&key) {
            return id;
        }
        let id = self.next_holder;
        self.next_holder += 1;
        self.new_holders.push((id, key.clone()));
        self.holders.insert(key, id);
        id
    }

    /// The (instance, holder) ids of every series and every share of the new batches, assigning
    /// new ones; a batch that would give a node more instances than allowed is refused, naming
    /// its first entry that would.
    fn assign_ids(
        &mut self,
        max: usize,
        batches: &[(&Batch, i64)],
        new: &[usize],
    ) -> Result<Vec<BatchIds>, WriteError> {
        let mut ids = Vec::with_capacity(new.len());
        for &i in new {
            let mut these = BatchIds::default();
            for (list, j, s) in batches[i].0.entries() {
                let Some(iid) = self.instance_id(s, max) else {
                    return Err(WriteError::Rejected {
                        field: format!("{list}[{j}]"),
                        message: format!(
                            "node {:?} would have more than {max} GPU instances in the ledger (--max-instances-per-node)",
                            s.node
                        ),
                    });
                };
                let pair = (iid, self.holder_id(s));
                match list {
                    "series" => these.series.push(pair),
                    _ => these.shares.push(pair),
                }
            }
            ids.push(these);
        }
        Ok(ids)
    }

    /// The seconds each GPU was observed in, per minute, given the instances' covered masks.
    fn gpu_seen(&self, covered: &HashMap<(i32, i64), u64>) -> HashMap<(usize, i64), u64> {
        let mut gpu_seen: HashMap<(usize, i64), u64> = HashMap::new();
        for (&(iid, bucket), &mask) in covered {
            if let Some(&g) = self.gpu_of.get(&iid) {
                *gpu_seen.entry((g, bucket)).or_insert(0) |= mask;
            }
        }
        gpu_seen
    }

    /// Appends the ids assigned since the last flush, in the caller's transaction (a fleet's
    /// first batches bring thousands of new instances: one appender, not a statement each). If
    /// that transaction fails, the writer reloads the mirror from the database.
    fn flush(&mut self, conn: &Connection) -> duckdb::Result<()> {
        if !self.new_instances.is_empty() {
            let mut app = conn.appender("instances")?;
            for (id, key) in self.new_instances.drain(..) {
                let size = gpuledger_schema::mig::gpu_equivalents_of(key.mig_profile.as_deref())
                    .unwrap_or(0.0);
                app.append_row(params![
                    id,
                    key.node,
                    key.gpu_uuid,
                    key.gpu_instance_id,
                    key.gpu_model,
                    key.mig_profile,
                    key.placement_start,
                    key.placement_size,
                    size
                ])?;
            }
            app.flush()?;
        }
        if !self.new_holders.is_empty() {
            let mut app = conn.appender("holders")?;
            for (id, key) in self.new_holders.drain(..) {
                app.append_row(params![id, key.0, key.1, key.2])?;
            }
            app.flush()?;
        }
        Ok(())
    }
}

/// The (instance, holder) ids of one batch's entries, in the order of its lists.
#[derive(Default)]
struct BatchIds {
    series: Vec<(i32, i32)>,
    shares: Vec<(i32, i32)>,
}

/// Builds [`Dims`]' GPU index while loading.
#[derive(Default)]
struct GpuIndex {
    gpu_of: HashMap<i32, usize>,
    slots: HashMap<String, usize>,
    members: Vec<Vec<i32>>,
}

impl GpuIndex {
    fn add(&mut self, iid: i32, gpu_uuid: &str) {
        let next = self.members.len();
        let slot = *self.slots.entry(gpu_uuid.to_owned()).or_insert(next);
        if slot == next {
            self.members.push(Vec::new());
        }
        self.members[slot].push(iid);
        self.gpu_of.insert(iid, slot);
    }
}

struct WriterThread {
    conn: Connection,
    dims: Dims,
    observer: Arc<dyn WriteObserver>,
    max_instances_per_node: usize,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Window {
    Raw,
    Rollup,
}

/// What retention deletes: (table, statement, which window's cutoff binds `?`). A rollup bucket
/// goes once all of it is older than the cutoff.
const RETENTION: &[(&str, &str, Window)] = &[
    (
        "samples_raw",
        "DELETE FROM samples_raw WHERE ts < ?",
        Window::Raw,
    ),
    (
        "ingested_batches",
        "DELETE FROM ingested_batches WHERE received_at < ?",
        Window::Raw,
    ),
    (
        "rollup_1m",
        "DELETE FROM rollup_1m WHERE bucket + 60 <= ?",
        Window::Rollup,
    ),
    (
        "rollup_1h",
        "DELETE FROM rollup_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "rollup_tenant_1h",
        "DELETE FROM rollup_tenant_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "rollup_gpu_1h",
        "DELETE FROM rollup_gpu_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "rollup_alloc_1d",
        "DELETE FROM rollup_alloc_1d WHERE bucket + 86400 <= ?",
        Window::Rollup,
    ),
    (
        "fragmentation_1h",
        "DELETE FROM fragmentation_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    (
        "hoarding_episodes",
        "DELETE FROM hoarding_episodes WHERE ended_at <= ?",
        Window::Rollup,
    ),
    (
        "shares_raw",
        "DELETE FROM shares_raw WHERE ts < ?",
        Window::Raw,
    ),
    (
        "rollup_share_1h",
        "DELETE FROM rollup_share_1h WHERE bucket + 3600 <= ?",
        Window::Rollup,
    ),
    // Reclaim (migration 0005): the record of decisions and deliveries is kept as long as the
    // rollups; a finished episode's state as long as its hoarding episode (so it is never
    // noticed twice); the outbox keeps undelivered rows whatever their age.
    (
        "reclaim_decisions",
        "DELETE FROM reclaim_decisions WHERE decided_at <= ?",
        Window::Rollup,
    ),
    (
        "reclaim_episodes",
        "DELETE FROM reclaim_episodes WHERE state = 'resolved' AND closed_at <= ?",
        Window::Rollup,
    ),
    (
        "webhook_outbox",
        "DELETE FROM webhook_outbox WHERE state IN ('delivered', 'cancelled') AND created_at <= ?",
        Window::Rollup,
    ),
    (
        "reclaim_exemptions",
        "DELETE FROM reclaim_exemptions WHERE until <= ?",
        Window::Raw,
    ),
    (
        "alertmanager_confirmations",
        "DELETE FROM alertmanager_confirmations WHERE confirmed_at <= ?",
        Window::Raw,
    ),
];

/// Dimension rows no fact refers to any more, deleted after the facts' retention: (table,
/// statement). Every fact's instance and holder also has an hour row (`rollup_1h`, written in the
/// same transaction as the minute and raw rows, and deleted only after them) or is in one of the
/// longer-kept tables named here, so those are the ones consulted.
const DIMENSION_RETENTION: &[(&str, &str)] = &[
    (
        "instances",
        "DELETE FROM instances WHERE instance_id NOT IN (
            SELECT instance_id FROM rollup_1h UNION SELECT instance_id FROM rollup_alloc_1d
            UNION SELECT instance_id FROM rollup_share_1h UNION SELECT instance_id FROM hoarding_episodes)",
    ),
    (
        "holders",
        "DELETE FROM holders WHERE holder_id <> 0 AND holder_id NOT IN (
            SELECT holder_id FROM rollup_1h UNION SELECT holder_id FROM rollup_alloc_1d
            UNION SELECT holder_id FROM rollup_share_1h UNION SELECT holder_id FROM hoarding_episodes)",
    ),
];

/// How an existing rollup row absorbs a delta row `d`.
const ROLLUP_MERGE: &str = "
    samples = r.samples + d.samples,
    sm_active_samples = r.sm_active_samples + d.sm_active_samples,
    sm_active_sum = r.sm_active_sum + d.sm_active_sum,
    sm_active_min = least(r.sm_active_min, d.sm_active_min),
    sm_active_max = greatest(r.sm_active_max, d.sm_active_max),
    sm_occupancy_samples = r.sm_occupancy_samples + d.sm_occupancy_samples,
    sm_occupancy_sum = r.sm_occupancy_sum + d.sm_occupancy_sum,
    tensor_active_samples = r.tensor_active_samples + d.tensor_active_samples,
    tensor_active_sum = r.tensor_active_sum + d.tensor_active_sum,
    dram_active_samples = r.dram_active_samples + d.dram_active_samples,
    dram_active_sum = r.dram_active_sum + d.dram_active_sum,
    fb_used_samples = r.fb_used_samples + d.fb_used_samples,
    fb_used_bytes_sum = r.fb_used_bytes_sum + d.fb_used_bytes_sum,
    fb_used_bytes_max = greatest(r.fb_used_bytes_max, d.fb_used_bytes_max),
    fb_total_bytes_max = greatest(r.fb_total_bytes_max, d.fb_total_bytes_max),
    nvlink_tx_bytes_sum = r.nvlink_tx_bytes_sum + d.nvlink_tx_bytes_sum,
    nvlink_rx_bytes_sum = r.nvlink_rx_bytes_sum + d.nvlink_rx_bytes_sum";

/// The hour deltas, derived from the minute deltas.
const DELTA_1H: &str = "
    SELECT bucket - bucket % 3600 AS bucket, instance_id, holder_id,
           sum(samples)::INTEGER AS samples,
           sum(sm_active_samples)::INTEGER AS sm_active_samples,
           sum(sm_active_sum) AS sm_active_sum,
           min(sm_active_min) AS sm_active_min,
           max(sm_active_max) AS sm_active_max,
           sum(sm_occupancy_samples)::INTEGER AS sm_occupancy_samples,
           sum(sm_occupancy_sum) AS sm_occupancy_sum,
           sum(tensor_active_samples)::INTEGER AS tensor_active_samples,
           sum(tensor_active_sum) AS tensor_active_sum,
           sum(dram_active_samples)::INTEGER AS dram_active_samples,
           sum(dram_active_sum) AS dram_active_sum,
           sum(fb_used_samples)::INTEGER AS fb_used_samples,
           sum(fb_used_bytes_sum)::UBIGINT AS fb_used_bytes_sum,
           max(fb_used_bytes_max) AS fb_used_bytes_max,
           max(fb_total_bytes_max) AS fb_total_bytes_max,
           sum(nvlink_tx_bytes_sum)::UBIGINT AS nvlink_tx_bytes_sum,
           sum(nvlink_rx_bytes_sum)::UBIGINT AS nvlink_rx_bytes_sum
    FROM ingest_delta_1m GROUP BY ALL";

/// The per-allocation day deltas, derived from the minute deltas.
const DELTA_ALLOC_1D: &str = "
    SELECT bucket - bucket % 86400 AS bucket, instance_id, holder_id,
           sum(samples)::BIGINT AS samples,
           sum(sm_active_samples)::BIGINT AS sm_active_samples,
           sum(sm_active_sum) AS sm_active_sum
    FROM ingest_delta_1m GROUP BY ALL";

/// The tenant deltas, derived from the minute deltas.
const DELTA_TENANT: &str = "
    SELECT d.bucket - d.bucket % 3600 AS bucket, h.tenant, h.slo_class, i.gpu_model,
           sum(d.samples)::BIGINT AS samples,
           sum(d.samples * i.gpu_equivalents) AS gpu_seconds,
           sum(d.sm_active_samples * i.gpu_equivalents) AS sm_measured_gpu_seconds,
           sum(d.sm_active_sum * i.gpu_equivalents) AS used_gpu_seconds
    FROM ingest_delta_1m d JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
    GROUP BY ALL";

/// The statements that fold the group's minute deltas (`ingest_delta_1m`, computed by the writer
/// from the fresh samples) into the three rollups, in order: one MERGE per rollup (update the
/// rows that exist, insert those that do not). Built once from constant parts (no input reaches
/// them). The hour and tenant deltas are derived from the minute deltas, 60 times fewer rows than
/// the samples. Each MERGE matches only target rows inside the group's bucket range, so that it
/// scans only the buckets it can touch.
fn rollup_statements() -> &'static [String] {
    static STATEMENTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    STATEMENTS.get_or_init(|| {
        let range = |width: i64| {
            format!(
                "r.bucket BETWEEN (SELECT min(bucket) - min(bucket) % {width} FROM ingest_delta_1m)
                              AND (SELECT max(bucket) FROM ingest_delta_1m)"
            )
        };
        let same_instance_row =
            "r.bucket = d.bucket AND r.instance_id = d.instance_id AND r.holder_id = d.holder_id";
        vec![
            format!(
                "MERGE INTO rollup_1m AS r USING ingest_delta_1m AS d
                 ON {same_instance_row} AND {}
                 WHEN MATCHED THEN UPDATE SET seconds_mask = r.seconds_mask | d.seconds_mask, {ROLLUP_MERGE}
                 WHEN NOT MATCHED THEN INSERT BY NAME",
                range(60)
            ),
            format!(
                "MERGE INTO rollup_1h AS r USING ({DELTA_1H}) AS d
                 ON {same_instance_row} AND {}
                 WHEN MATCHED THEN UPDATE SET {ROLLUP_MERGE}
                 WHEN NOT MATCHED THEN INSERT BY NAME",
                range(3600)
            ),
            format!(
                "MERGE INTO rollup_alloc_1d AS r USING ({DELTA_ALLOC_1D}) AS d
                 ON {same_instance_row} AND {}
                 WHEN MATCHED THEN UPDATE SET
                    samples = r.samples + d.samples,
                    sm_active_samples = r.sm_active_samples + d.sm_active_samples,
                    sm_active_sum = r.sm_active_sum + d.sm_active_sum
                 WHEN NOT MATCHED THEN INSERT BY NAME",
                range(86400)
            ),
            format!(
                "MERGE INTO rollup_tenant_1h AS r USING ({DELTA_TENANT}) AS d
                 ON r.bucket = d.bucket AND r.tenant IS NOT DISTINCT FROM d.tenant
                    AND r.slo_class IS NOT DISTINCT FROM d.slo_class AND r.gpu_model = d.gpu_model
                    AND {}
                 WHEN MATCHED THEN UPDATE SET
                    samples = r.samples + d.samples,
                    gpu_seconds = r.gpu_seconds + d.gpu_seconds,
                    sm_measured_gpu_seconds = r.sm_measured_gpu_seconds + d.sm_measured_gpu_seconds,
                    used_gpu_seconds = r.used_gpu_seconds + d.used_gpu_seconds
                 WHEN NOT MATCHED THEN INSERT BY NAME",
                range(3600)
            ),
            "DELETE FROM ingest_delta_1m".into(),
        ]
    })
}

/// Folds the group's newly observed GPU-seconds (`ingest_delta_gpu_1h`, per instance that brought
/// them) into the per-GPU hourly capacity rollup.
const GPU_ROLLUP: &str = "
MERGE INTO rollup_gpu_1h AS r USING (
    SELECT d.bucket, i.node, i.gpu_uuid, i.gpu_model, sum(d.observed_seconds)::BIGINT AS observed_seconds,
           sum(d.instance_seconds)::BIGINT AS instance_seconds
    FROM ingest_delta_gpu_1h d JOIN instances i USING (instance_id)
    GROUP BY ALL
) AS d
ON r.bucket = d.bucket AND r.gpu_uuid = d.gpu_uuid AND r.node = d.node AND r.gpu_model = d.gpu_model
   AND r.bucket BETWEEN (SELECT min(bucket) FROM ingest_delta_gpu_1h)
                    AND (SELECT max(bucket) FROM ingest_delta_gpu_1h)
WHEN MATCHED THEN UPDATE SET observed_seconds = r.observed_seconds + d.observed_seconds,
                             instance_seconds = r.instance_seconds + d.instance_seconds
WHEN NOT MATCHED THEN INSERT BY NAME;
DELETE FROM ingest_delta_gpu_1h;";

/// Folds the group's shares (`ingest_shares`) into `shares_raw` and `rollup_share_1h`: a share
/// already stored, or repeated within the group, counts once.
const SHARES_ROLLUP: &str = "
DELETE FROM ingest_shares s USING shares_raw r
WHERE r.ts = s.ts AND r.instance_id = s.instance_id AND r.holder_id = s.holder_id
  AND r.ts BETWEEN (SELECT min(ts) FROM ingest_shares) AND (SELECT max(ts) FROM ingest_shares);
CREATE OR REPLACE TEMP TABLE new_shares AS
    SELECT DISTINCT ON (ts, instance_id, holder_id) * FROM ingest_shares;
INSERT INTO shares_raw SELECT * FROM new_shares;
MERGE INTO rollup_share_1h AS r USING (
    SELECT ts - ts % 3600 AS bucket, instance_id, holder_id,
           count(*)::BIGINT AS seconds,
           sum(processes)::BIGINT AS process_seconds,
           count(memory_used_bytes)::BIGINT AS memory_samples,
           coalesce(sum(memory_used_bytes), 0)::HUGEINT AS memory_byte_seconds,
           count(sm_active)::BIGINT AS sm_active_samples,
           coalesce(sum(sm_active), 0) AS sm_active_sum
    FROM new_shares GROUP BY ALL
) AS d
ON r.bucket = d.bucket AND r.instance_id = d.instance_id AND r.holder_id = d.holder_id
WHEN MATCHED THEN UPDATE SET seconds = r.seconds + d.seconds,
                             process_seconds = r.process_seconds + d.process_seconds,
                             memory_samples = r.memory_samples + d.memory_samples,
                             memory_byte_seconds = r.memory_byte_seconds + d.memory_byte_seconds,
                             sm_active_samples = r.sm_active_samples + d.sm_active_samples,
                             sm_active_sum = r.sm_active_sum + d.sm_active_sum
WHEN NOT MATCHED THEN INSERT BY NAME;
DROP TABLE new_shares;
DELETE FROM ingest_shares;";

/// The seconds of each (instance, minute) already in the ledger, for the instance ids and bucket
/// range of one group.
const COVERED_MASKS: &str = "
SELECT instance_id, bucket, bit_or(seconds_mask)
FROM rollup_1m
WHERE bucket BETWEEN ? AND ? AND instance_id BETWEEN ? AND ?
GROUP BY ALL";

/// Raw rows in `samples_raw`'s column order, built column-wise for the appender's Arrow path.
#[derive(Debug, Default)]
pub struct RawColumns {
    ts: Vec<i64>,
    instance_id: Vec<i32>,
    holder_id: Vec<i32>,
    ratios: [Vec<Option<f64>>; 4],
    bytes: [Vec<Option<u64>>; 4],
}

impl RawColumns {
    /// Adds the `j`th second of `s` as held by `instance_id`/`holder_id`.
    pub fn push(&mut self, s: &Series, j: usize, instance_id: i32, holder_id: i32) {
        fn at<T: Copy>(col: &Option<Vec<Option<T>>>, j: usize) -> Option<T> {
            col.as_ref().and_then(|c| c.get(j).copied().flatten())
        }
        self.ts.push(s.t[j]);
        self.instance_id.push(instance_id);
        self.holder_id.push(holder_id);
        for (out, col) in self.ratios.iter_mut().zip([
            &s.sm_active,
            &s.sm_occupancy,
            &s.tensor_active,
            &s.dram_active,
        ]) {
            out.push(at(col, j));
        }
        for (out, col) in self.bytes.iter_mut().zip([
            &s.fb_used_bytes,
            &s.fb_total_bytes,
            &s.nvlink_tx_bytes,
            &s.nvlink_rx_bytes,
        ]) {
            out.push(at(col, j));
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.ts.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }

    /// The rows as an Arrow record batch.
    pub fn into_record_batch(self) -> duckdb::Result<RecordBatch> {
        let [sm, occ, tensor, dram] = self.ratios;
        let [used, total, tx, rx] = self.bytes;
        let f64s = |name: &str| Field::new(name, DataType::Float64, true);
        let u64s = |name: &str| Field::new(name, DataType::UInt64, true);
        let schema = Schema::new(vec![
            Field::new("ts", DataType::Int64, false),
            Field::new("instance_id", DataType::Int32, false),
            Field::new("holder_id", DataType::Int32, false),
            f64s("sm_active"),
            f64s("sm_occupancy"),
            f64s("tensor_active"),
            f64s("dram_active"),
            u64s("fb_used_bytes"),
            u64s("fb_total_bytes"),
            u64s("nvlink_tx_bytes"),
            u64s("nvlink_rx_bytes"),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(self.ts)),
            Arc::new(Int32Array::from(self.instance_id)),
            Arc::new(Int32Array::from(self.holder_id)),
            Arc::new(Float64Array::from(sm)),
            Arc::new(Float64Array::from(occ)),
            Arc::new(Float64Array::from(tensor)),
            Arc::new(Float64Array::from(dram)),
            Arc::new(UInt64Array::from(used)),
            Arc::new(UInt64Array::from(total)),
            Arc::new(UInt64Array::from(tx)),
            Arc::new(UInt64Array::from(rx)),
        ];
        RecordBatch::try_new(Arc::new(schema), columns)
            .map_err(|e| duckdb::Error::ToSqlConversionFailure(Box::new(e)))
    }
}

/// One (instance, holder, minute) of the group's fresh samples, summed as the rollups keep it.
#[derive(Debug, Default, Clone, Copy)]
struct MinuteDelta {
    mask: u64,
    samples: i32,
    sm: Stat,
    occupancy: Stat,
    tensor: Stat,
    dram: Stat,
    fb_used_samples: i32,
    fb_used_sum: u64,
    fb_used_max: Option<u64>,
    fb_total_max: Option<u64>,
    tx_sum: u64,
    rx_sum: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stat {
    n: i32,
    sum: f64,
    min: Option<f64>,
    max: Option<f64>,
}

impl Stat {
    /// `n` seconds that each read `v`.
    fn add_n(&mut self, v: Option<f64>, n: u32) {
        if let Some(v) = v
            && n > 0
        {
            self.n += n as i32;
            self.sum += v * f64::from(n);
            self.min = Some(self.min.map_or(v, |m| m.min(v)));
            self.max = Some(self.max.map_or(v, |m| m.max(v)));
        }
    }

    fn add(&mut self, v: Option<f64>) {
        if let Some(v) = v {
            self.n += 1;
            self.sum += v;
            self.min = Some(self.min.map_or(v, |m| m.min(v)));
            self.max = Some(self.max.map_or(v, |m| m.max(v)));
        }
    }
}

impl MinuteDelta {
    /// Adds one second. A sum that would leave 64 bits is an error naming the counter (validation
    /// bounds make it impossible; this keeps it so whatever reaches the writer).
    fn add(&mut self, bit: u64, c: &gpuledger_schema::Counters) -> Result<(), &'static str> {
        fn sum(to: &mut u64, v: Option<u64>, field: &'static str) -> Result<(), &'static str> {
            *to = to.checked_add(v.unwrap_or(0)).ok_or(field)?;
            Ok(())
        }
        sum(&mut self.fb_used_sum, c.fb_used_bytes, "fb_used_bytes")?;
        sum(&mut self.tx_sum, c.nvlink_tx_bytes, "nvlink_tx_bytes")?;
        sum(&mut self.rx_sum, c.nvlink_rx_bytes, "nvlink_rx_bytes")?;
        self.mask |= bit;
        self.samples += 1;
        self.sm.add(c.sm_active);
        self.occupancy.add(c.sm_occupancy);
        self.tensor.add(c.tensor_active);
        self.dram.add(c.dram_active);
        if let Some(b) = c.fb_used_bytes {
            self.fb_used_samples += 1;
            self.fb_used_max = Some(self.fb_used_max.map_or(b, |m| m.max(b)));
        }
        if let Some(b) = c.fb_total_bytes {
            self.fb_total_max = Some(self.fb_total_max.map_or(b, |m| m.max(b)));
        }
        Ok(())
    }
}

/// Adds (observed GPU-seconds, instance-seconds) of one instance-hour to the group's GPU deltas.
fn add_gpu_counts(
    deltas: &mut HashMap<(i32, i64), (i64, i64)>,
    key: (i32, i64),
    counts: (i64, i64),
) {
    if counts.1 > 0 {
        let d = deltas.entry(key).or_insert((0, 0));
        d.0 += counts.0;
        d.1 += counts.1;
    }
}

/// The minute of a second, as (bucket start, second within it).
fn minute_of(ts: i64) -> (i64, u32) {
    let bucket = ts.div_euclid(60) * 60;
    (bucket, (ts - bucket) as u32)
}

/// The seconds of each (instance, minute) already in the ledger, for instance ids `lo_i..=hi_i`
/// and the minutes from `lo_bucket` to `hi_t`.
fn covered_masks(
    tx: &Connection,
    lo_bucket: i64,
    hi_t: i64,
    lo_i: i32,
    hi_i: i32,
) -> duckdb::Result<HashMap<(i32, i64), u64>> {
    let mut covered = HashMap::new();
    let mut stmt = tx.prepare_cached(COVERED_MASKS)?;
    let rows = stmt.query_map(params![lo_bucket, hi_t, lo_i, hi_i], |r| {
        Ok((
            (r.get::<_, i32>(0)?, r.get::<_, i64>(1)?),
            r.get::<_, u64>(2)?,
        ))
    })?;
    for row in rows {
        let (key, mask) = row?;
        covered.insert(key, mask);
    }
    Ok(covered)
}

/// Appends the minute deltas (per instance, holder, minute) to `ingest_delta_1m` and folds them
/// into the minute, hour, day and tenant rollups.
fn fold_minute_deltas(
    tx: &Connection,
    deltas: &HashMap<(i32, i32, i64), MinuteDelta>,
) -> duckdb::Result<()> {
    if deltas.is_empty() {
        return Ok(());
    }
    {
        let mut app = tx.appender("ingest_delta_1m")?;
        for ((iid, hid, bucket), d) in deltas {
            app.append_row(params![
                bucket,
                iid,
                hid,
                d.mask,
                d.samples,
                d.sm.n,
                d.sm.sum,
                d.sm.min,
                d.sm.max,
                d.occupancy.n,
                d.occupancy.sum,
                d.tensor.n,
                d.tensor.sum,
                d.dram.n,
                d.dram.sum,
                d.fb_used_samples,
                d.fb_used_sum,
                d.fb_used_max,
                d.fb_total_max,
                d.tx_sum,
                d.rx_sum
            ])?;
        }
        app.flush()?;
    }
    for sql in rollup_statements() {
        tx.execute(sql, [])?;
    }
    Ok(())
}

/// Appends the GPU deltas (per instance that brought them, per hour: observed seconds,
/// instance-seconds) and folds them into `rollup_gpu_1h`.
fn fold_gpu_deltas(
    tx: &Connection,
    gpu_deltas: &HashMap<(i32, i64), (i64, i64)>,
) -> duckdb::Result<()> {
    if gpu_deltas.is_empty() {
        return Ok(());
    }
    {
        let mut app = tx.appender("ingest_delta_gpu_1h")?;
        for (&(iid, bucket), &(observed, instance)) in gpu_deltas {
            app.append_row(params![bucket, iid, observed, instance])?;
        }
        app.flush()?;
    }
    tx.execute_batch(GPU_ROLLUP)
}

impl WriterThread {
    fn run(mut self, mut rx: mpsc::UnboundedReceiver<Job>) {
        let mut pending: Option<Job> = None;
        loop {
            let job = match pending.take() {
                Some(j) => j,
                None => match rx.blocking_recv() {
                    Some(j) => j,
                    None => break,
                },
            };
            match job {
                Job::Retention {
                    now,
                    retention,
                    reply,
                } => {
                    let _ = reply.send(self.retention(now, retention));
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
                    let started = Instant::now();
                    let result = self.write_minutes(&batch);
                    if result.is_ok() {
                        self.observer.committed(1, started.elapsed().as_secs_f64());
                    }
                    let _ = reply.send(result);
                }
                Job::Apply { write, reply } => {
                    let result = self.conn.transaction().and_then(|tx| {
                        write(&tx)?;
                        tx.commit()
                    });
                    let _ = reply.send(result.map_err(StoreError::from_db));
                }
                Job::Ingest(first) => {
                    let mut samples = first.batch.sample_count();
                    let mut group = vec![first];
                    while samples < GROUP_SAMPLES {
                        match rx.try_recv() {
                            Ok(Job::Ingest(j)) => {
                                samples += j.batch.sample_count();
                                group.push(j);
                            }
                            Ok(other) => {
                                pending = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.ingest_group(group);
                }
            }
        }
        tracing::info!("The writer thread stopped: every queued batch was written.");
    }

    fn retention(&mut self, now: i64, r: Retention) -> Result<RetentionReport, StoreError> {
        let raw = now - r.raw_secs;
        let rollup = now - r.rollup_secs;
        let mut report = RetentionReport::default();
        let tx = self.conn.transaction().map_err(StoreError::from_db)?;
        for (table, sql, cutoff) in RETENTION {
            let cutoff = if *cutoff == Window::Raw { raw } else { rollup };
            let n = tx.execute(sql, [cutoff]).map_err(StoreError::from_db)?;
            report.deleted.push((*table, n as u64));
        }
        let mut dimensions_deleted = 0;
        for (table, sql) in DIMENSION_RETENTION {
            let n = tx.execute(sql, []).map_err(StoreError::from_db)?;
            dimensions_deleted += n;
            report.deleted.push((*table, n as u64));
        }
        tx.commit().map_err(StoreError::from_db)?;
        if dimensions_deleted > 0 {
            // The mirror must forget the ids too (and their per-node counts).
            self.reload_dims();
        }
        // Lets DuckDB reuse the freed blocks.
        self.conn
            .execute_batch("CHECKPOINT")
            .map_err(StoreError::from_db)?;
        Ok(report)
    }

    fn ingest_group(&mut self, group: Vec<IngestJob>) {
        let started = Instant::now();
        let batches: Vec<(&Batch, i64)> = group.iter().map(|j| (&j.batch, j.raw_cutoff)).collect();
        match self.write(&batches) {
            Ok(outcomes) => {
                self.observer
                    .committed(group.len(), started.elapsed().as_secs_f64());
                for (job, outcome) in group.into_iter().zip(outcomes) {
                    let _ = job.reply.send(Ok(outcome));
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
                    let result = self.write(&[(&job.batch, job.raw_cutoff)]);
                    if result.is_ok() {
                        self.observer.committed(1, started.elapsed().as_secs_f64());
                    }
                    let _ = job.reply.send(result.map(|mut o| o.remove(0)));
                }
            }
            Err(e) => {
                let _ = group.into_iter().next().map(|j| j.reply.send(Err(e)));
            }
        }
    }

    /// Writes batches in one transaction. On error nothing is written and the in-memory
    /// dimension mirror is reloaded from the database. A single batch that fails on its values
    /// ([`Failure::Data`]) is [`StoreError::Rejected`]: the same bytes would fail the same way
    /// on every retry, so retrying it would only hold back what its node sends next.
    fn write(&mut self, batches: &[(&Batch, i64)]) -> Result<Vec<IngestOutcome>, StoreError> {
        let result = self.try_write(batches);
        if result.is_err() {
            self.reload_dims();
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
            Ok(d) => self.dims = d,
            Err(e) => {
                tracing::error!(error = %e, "Cannot reload the dimension tables after a failed write.")
            }
        }
    }

    fn try_write(&mut self, batches: &[(&Batch, i64)]) -> Result<Vec<IngestOutcome>, WriteError> {
        let tx = self.conn.transaction()?;
        let mut outcomes = Vec::with_capacity(batches.len());
        // Which batches are new: not stored before, not repeated within this group. One query for
        // the whole group (a UUID's text never holds a comma).
        let ids_text = batches
            .iter()
            .map(|(b, _)| b.batch_id.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut stored_before = HashSet::new();
        {
            let mut stmt = tx.prepare_cached(
                "SELECT DISTINCT batch_id::VARCHAR FROM ingested_batches
                 WHERE batch_id IN (SELECT CAST(unnest(string_split(?, ',')) AS UUID))",
            )?;
            let rows = stmt.query_map([&ids_text], |r| r.get::<_, String>(0))?;
            for row in rows {
                stored_before.insert(row?);
            }
        }
        let mut seen = HashSet::new();
        let mut new = Vec::new();
        for (i, (batch, _)) in batches.iter().enumerate() {
            let duplicate =
                stored_before.contains(&batch.batch_id.to_string()) || !seen.insert(batch.batch_id);
            outcomes.push(IngestOutcome {
                samples: batch.sample_count() as u64,
                stored: 0,
                duplicate_samples: if duplicate {
                    batch.sample_count() as u64
                } else {
                    0
                },
                duplicate_batch: duplicate,
            });
            if !duplicate {
                new.push(i);
            }
        }
        if new.is_empty() {
            tx.commit()?;
            return Ok(outcomes);
        }
        let ids = self
            .dims
            .assign_ids(self.max_instances_per_node, batches, &new)?;
        // Shares inside the raw window (older ones could not be told from a re-send).
        let share_cutoff = batches.iter().map(|(_, c)| *c).max().unwrap_or(i64::MIN);
        let mut shares: Vec<(i64, i32, i32, u32, Option<u64>, Option<f64>)> = Vec::new();
        for (k, &i) in new.iter().enumerate() {
            for (s, &(iid, hid)) in batches[i].0.shares.iter().zip(&ids[k].shares) {
                for share in s.shares().filter(|x| x.timestamp >= share_cutoff) {
                    shares.push((
                        share.timestamp,
                        iid,
                        hid,
                        share.processes,
                        share.memory_used_bytes,
                        share.sm_active,
                    ));
                }
            }
        }
        self.dims.flush(&tx)?;
        if !shares.is_empty() {
            {
                let mut app = tx.appender("ingest_shares")?;
                for (ts, iid, hid, processes, memory, sm) in &shares {
                    app.append_row(params![ts, iid, hid, processes, memory, sm])?;
                }
                app.flush()?;
            }
            tx.execute_batch(SHARES_ROLLUP)?;
        }
        // Samples older than the raw window go to the rollups only. Batches of one group may have
        // been admitted with different cutoffs; the latest one is the one in force now.
        let raw_cutoff = batches.iter().map(|(_, c)| *c).max().unwrap_or(i64::MIN);
        // The seconds the ledger holds already, for this group's instances and minutes.
        let (mut lo_t, mut hi_t, mut lo_i, mut hi_i) = (i64::MAX, i64::MIN, i32::MAX, i32::MIN);
        for (k, &i) in new.iter().enumerate() {
            for (s, &(iid, _)) in batches[i].0.series.iter().zip(&ids[k].series) {
                if let (Some(&first), Some(&last)) = (s.t.iter().min(), s.t.iter().max()) {
                    lo_t = lo_t.min(first);
                    hi_t = hi_t.max(last);
                    // Every instance of the GPU: its observed seconds are the union of theirs.
                    for &m in &self.dims.gpu_members[self.dims.gpu_of[&iid]] {
                        lo_i = lo_i.min(m);
                        hi_i = hi_i.max(m);
                    }
                }
            }
        }
        let mut covered = if lo_t <= hi_t {
            covered_masks(&tx, minute_of(lo_t).0, hi_t, lo_i, hi_i)?
        } else {
            HashMap::new()
        };
        let mut gpu_seen = self.dims.gpu_seen(&covered);
        // One pass: keep the first copy of each (instance, second) no mask covers, append it to
        // the raw columns when inside the raw window, sum it into its minute delta, and count the
        // GPU's second as observed if no instance of it had that second yet.
        let mut raw = RawColumns::default();
        let mut deltas: HashMap<(i32, i32, i64), MinuteDelta> = HashMap::new();
        let mut gpu_deltas: HashMap<(i32, i64), (i64, i64)> = HashMap::new();
        let mut newest: Option<i64> = None;
        for (k, &i) in new.iter().enumerate() {
            let mut stored = 0u64;
            for (n, (s, &(iid, hid))) in batches[i].0.series.iter().zip(&ids[k].series).enumerate()
            {
                let gpu_slot = self.dims.gpu_of[&iid];
                // A series' seconds are nearly always in one hour: its GPU counts are summed
                // here and added to the map once per hour, not once per sample.
                let mut hour = i64::MIN;
                let mut hour_counts = (0i64, 0i64);
                for (j, &ts) in s.t.iter().enumerate() {
                    let (bucket, second) = minute_of(ts);
                    let bit = 1u64 << second;
                    let seen = covered.entry((iid, bucket)).or_insert(0);
                    if *seen & bit != 0 {
                        continue;
                    }
                    *seen |= bit;
                    stored += 1;
                    let this_hour = ts - ts.rem_euclid(3600);
                    if this_hour != hour {
                        add_gpu_counts(&mut gpu_deltas, (iid, hour), hour_counts);
                        (hour, hour_counts) = (this_hour, (0, 0));
                    }
                    hour_counts.1 += 1;
                    let gpu = gpu_seen.entry((gpu_slot, bucket)).or_insert(0);
                    if *gpu & bit == 0 {
                        *gpu |= bit;
                        hour_counts.0 += 1;
                    }
                    newest = Some(newest.map_or(ts, |n| n.max(ts)));
                    deltas
                        .entry((iid, hid, bucket))
                        .or_default()
                        .add(bit, &s.counters(j))
                        .map_err(|field| WriteError::Rejected {
                            field: format!("series[{n}].{field}[{j}]"),
                            message: "the minute's sum of this counter leaves 64 bits".into(),
                        })?;
                    if ts >= raw_cutoff {
                        raw.push(s, j, iid, hid);
                    }
                }
                add_gpu_counts(&mut gpu_deltas, (iid, hour), hour_counts);
            }
            outcomes[i].stored = stored;
        }
        if !raw.is_empty() {
            // The Arrow path: one columnar chunk per 2,048 rows instead of a call per value.
            let mut app = tx.appender("samples_raw")?;
            app.append_record_batch(raw.into_record_batch()?)?;
            app.flush()?;
        }
        fold_minute_deltas(&tx, &deltas)?;
        fold_gpu_deltas(&tx, &gpu_deltas)?;
        // The batch ids, in one statement: its text is placeholders only, one row per new batch.
        let now = chrono::Utc::now().timestamp();
        let mut values: Vec<Box<dyn duckdb::ToSql>> = Vec::with_capacity(new.len() * 5);
        for &i in &new {
            let o = &mut outcomes[i];
            o.duplicate_samples = o.samples - o.stored;
            values.push(Box::new(batches[i].0.batch_id.to_string()));
            values.push(Box::new(batches[i].0.node.clone()));
            values.push(Box::new(now));
            values.push(Box::new(o.samples as i64));
            values.push(Box::new(o.stored as i64));
        }
        let rows = vec!["(?::UUID, ?, ?, ?, ?)"; new.len()].join(", ");
        tx.execute(
            &format!("INSERT INTO ingested_batches VALUES {rows}"),
            duckdb::params_from_iter(values),
        )?;
        tx.commit()?;
        if let Some(newest) = newest {
            self.observer.newest_sample(newest);
        }
        Ok(outcomes)
    }
}
