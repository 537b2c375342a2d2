//! The one writer: a thread that owns the DuckDB write connection and turns batches into raw rows
//! and rollups.
//!
//! Async code hands it jobs over a channel. Jobs that arrive together are written together in one
//! transaction (group commit): every batch of the group is appended to `ingest_staging` with
//! DuckDB's appender on its Arrow path (column arrays straight from the wire format's columns;
//! `benches/aggregator.rs` measures it against the row-by-row appender), then a fixed SQL pipeline keeps only the first copy of every
//! (instance, second) that the ledger does not hold yet (`ingest_fresh`), appends it to
//! `samples_raw` (when it is inside the raw window) and folds it into the minute, hour and tenant
//! rollups. The batch ids are recorded in the same transaction, so a batch is stored entirely or
//! not at all, and it is acknowledged only after the commit. If a group fails, its batches are
//! retried one by one so that one bad batch cannot hold back the others.
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

use super::StoreError;

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

/// A unit of work for the writer thread.
enum Job {
    Ingest(IngestJob),
    Retention {
        now: i64,
        retention: Retention,
        reply: oneshot::Sender<Result<RetentionReport, StoreError>>,
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
    next_instance: i32,
    next_holder: i32,
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
            gpu_instance_id: s.gpu_instance_id.map_or(-1, |g| g as i32),
            gpu_model: s.gpu_model.clone(),
            mig_profile: s.mig_profile.clone(),
            placement_start: s.placement_start.map(|v| v as i32),
            placement_size: s.placement_size.map(|v| v as i32),
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
        for row in rows {
            let (id, key) = row?;
            instances.insert(key, id);
        }
        let mut holders = HashMap::new();
        let mut stmt = conn.prepare("SELECT holder_id, tenant, workload, slo_class FROM holders")?;
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
        })
    }

    fn instance_id(&mut self, conn: &Connection, s: &Series) -> duckdb::Result<i32> {
        let key = InstanceKey::of(s);
        if let Some(&id) = self.instances.get(&key) {
            return Ok(id);
        }
        let id = self.next_instance;
        let size = gpuledger_schema::Instance {
            node: String::new(),
            gpu_uuid: String::new(),
            gpu_model: String::new(),
            mig_profile: s.mig_profile.clone(),
            gpu_instance_id: None,
            placement_start: None,
            placement_size: None,
        }
        .gpu_equivalents()
        .unwrap_or(0.0);
        conn.execute(
            "INSERT INTO instances VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            params![
                id,
                key.node,
                key.gpu_uuid,
                key.gpu_instance_id,
                key.gpu_model,
                key.mig_profile,
                key.placement_start,
                key.placement_size,
                size
            ],
        )?;
        self.next_instance += 1;
        self.instances.insert(key, id);
        Ok(id)
    }

    fn holder_id(&mut self, conn: &Connection, s: &Series) -> duckdb::Result<i32> {
        let key = holder_key(s);
        if let Some(&id) = self.holders.get(&key) {
            return Ok(id);
        }
        let id = self.next_holder;
        conn.execute(
            "INSERT INTO holders VALUES (?, ?, ?, ?)",
            params![id, key.0, key.1, key.2],
        )?;
        self.next_holder += 1;
        self.holders.insert(key, id);
        Ok(id)
    }
}

struct WriterThread {
    conn: Connection,
    dims: Dims,
    observer: Arc<dyn WriteObserver>,
}

/// Keeps the first copy of each (instance, second) in the staged group that no committed minute
/// mask covers yet. Parameters: none; the covered range comes from the staging table itself.
const SELECT_FRESH: &str = "
INSERT INTO ingest_fresh
WITH staged AS (
    SELECT * FROM ingest_staging
    QUALIFY row_number() OVER (PARTITION BY instance_id, ts ORDER BY seq) = 1
), covered AS (
    SELECT instance_id, bucket, bit_or(seconds_mask) AS mask
    FROM rollup_1m
    WHERE bucket BETWEEN (SELECT min(ts) - 59 FROM ingest_staging) AND (SELECT max(ts) FROM ingest_staging)
    GROUP BY instance_id, bucket
)
SELECT s.* FROM staged s
LEFT JOIN covered c ON c.instance_id = s.instance_id AND c.bucket = s.ts - s.ts % 60
WHERE c.mask IS NULL OR (c.mask >> CAST(s.ts % 60 AS UBIGINT)) & 1::UBIGINT = 0";

const INSERT_RAW: &str = "
INSERT INTO samples_raw
SELECT ts, instance_id, holder_id, sm_active, sm_occupancy, tensor_active, dram_active,
       fb_used_bytes, fb_total_bytes, nvlink_tx_bytes, nvlink_rx_bytes
FROM ingest_fresh WHERE ts >= ?";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Window {
    Raw,
    Rollup,
}

/// What retention deletes: (table, statement, which window's cutoff binds `?`). A rollup bucket
/// goes once all of it is older than the cutoff.
const RETENTION: &[(&str, &str, Window)] = &[
    ("samples_raw", "DELETE FROM samples_raw WHERE ts < ?", Window::Raw),
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
];

/// The aggregate columns every instance rollup has, computed from `ingest_fresh`.
const ROLLUP_AGGREGATES: &str = "
    count(*)::INTEGER AS samples,
    count(sm_active)::INTEGER AS sm_active_samples,
    coalesce(sum(sm_active), 0) AS sm_active_sum,
    min(sm_active) AS sm_active_min,
    max(sm_active) AS sm_active_max,
    count(sm_occupancy)::INTEGER AS sm_occupancy_samples,
    coalesce(sum(sm_occupancy), 0) AS sm_occupancy_sum,
    count(tensor_active)::INTEGER AS tensor_active_samples,
    coalesce(sum(tensor_active), 0) AS tensor_active_sum,
    count(dram_active)::INTEGER AS dram_active_samples,
    coalesce(sum(dram_active), 0) AS dram_active_sum,
    count(fb_used_bytes)::INTEGER AS fb_used_samples,
    coalesce(sum(fb_used_bytes), 0)::UBIGINT AS fb_used_bytes_sum,
    max(fb_used_bytes) AS fb_used_bytes_max,
    max(fb_total_bytes) AS fb_total_bytes_max,
    coalesce(sum(nvlink_tx_bytes), 0)::UBIGINT AS nvlink_tx_bytes_sum,
    coalesce(sum(nvlink_rx_bytes), 0)::UBIGINT AS nvlink_rx_bytes_sum";

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

/// The statements that fold `ingest_fresh` into the rollups, in order. Built once from constant
/// parts (no input reaches them). The `?` in each are the bucket range of the group, so that the
/// upserts scan only the buckets they can touch.
fn rollup_statements() -> &'static [String] {
    static STATEMENTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    STATEMENTS.get_or_init(|| {
        let mut out = Vec::new();
        for (table, width, mask) in [
            (
                "rollup_1m",
                60,
                "bit_or(1::UBIGINT << CAST(ts % 60 AS UBIGINT)) AS seconds_mask,",
            ),
            ("rollup_1h", 3600, ""),
        ] {
            let delta = format!("delta_{table}");
            out.push(format!(
                "CREATE OR REPLACE TEMP TABLE {delta} AS
                 SELECT ts - ts % {width} AS bucket, instance_id, holder_id, {mask} {ROLLUP_AGGREGATES}
                 FROM ingest_fresh GROUP BY ALL"
            ));
            let mask_merge = if mask.is_empty() {
                ""
            } else {
                "seconds_mask = r.seconds_mask | d.seconds_mask,"
            };
            out.push(format!(
                "UPDATE {table} AS r SET {mask_merge} {ROLLUP_MERGE}
                 FROM {delta} AS d
                 WHERE r.bucket = d.bucket AND r.instance_id = d.instance_id AND r.holder_id = d.holder_id
                   AND r.bucket BETWEEN (SELECT min(bucket) FROM {delta}) AND (SELECT max(bucket) FROM {delta})"
            ));
            out.push(format!(
                "INSERT INTO {table} BY NAME
                 SELECT d.* FROM {delta} AS d
                 WHERE NOT EXISTS (
                     SELECT 1 FROM {table} AS r
                     WHERE r.bucket = d.bucket AND r.instance_id = d.instance_id AND r.holder_id = d.holder_id
                       AND r.bucket BETWEEN (SELECT min(bucket) FROM {delta}) AND (SELECT max(bucket) FROM {delta}))"
            ));
        }
        out.push(
            "CREATE OR REPLACE TEMP TABLE delta_tenant AS
             SELECT f.ts - f.ts % 3600 AS bucket, h.tenant, h.slo_class, i.gpu_model,
                    count(*) AS samples,
                    sum(i.gpu_equivalents) AS gpu_seconds,
                    coalesce(sum(CASE WHEN f.sm_active IS NOT NULL THEN i.gpu_equivalents END), 0) AS sm_measured_gpu_seconds,
                    coalesce(sum(f.sm_active * i.gpu_equivalents), 0) AS used_gpu_seconds
             FROM ingest_fresh f JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
             GROUP BY ALL"
                .into(),
        );
        let same_tenant_row = "r.bucket = d.bucket AND r.tenant IS NOT DISTINCT FROM d.tenant
             AND r.slo_class IS NOT DISTINCT FROM d.slo_class AND r.gpu_model = d.gpu_model
             AND r.bucket BETWEEN (SELECT min(bucket) FROM delta_tenant) AND (SELECT max(bucket) FROM delta_tenant)";
        out.push(format!(
            "UPDATE rollup_tenant_1h AS r SET
                samples = r.samples + d.samples,
                gpu_seconds = r.gpu_seconds + d.gpu_seconds,
                sm_measured_gpu_seconds = r.sm_measured_gpu_seconds + d.sm_measured_gpu_seconds,
                used_gpu_seconds = r.used_gpu_seconds + d.used_gpu_seconds
             FROM delta_tenant AS d WHERE {same_tenant_row}"
        ));
        out.push(format!(
            "INSERT INTO rollup_tenant_1h BY NAME
             SELECT d.* FROM delta_tenant AS d
             WHERE NOT EXISTS (SELECT 1 FROM rollup_tenant_1h AS r WHERE {same_tenant_row})"
        ));
        out
    })
}

/// The samples of `batches[i]` for each `i` in `new` as one Arrow record batch in
/// `ingest_staging`'s column order (`ids[k]`: instance and holder id of each series of the `k`th
/// new batch), and the newest second among them. Public for the benchmark's baseline, which
/// appends the same record batches to a bare table.
pub fn staging_batch(
    batches: &[(&Batch, i64)],
    new: &[usize],
    ids: &[Vec<(i32, i32)>],
) -> duckdb::Result<(RecordBatch, Option<i64>)> {
    let rows: usize = new.iter().map(|&i| batches[i].0.sample_count()).sum();
    let mut ts = Vec::with_capacity(rows);
    let (mut iid, mut hid, mut seq) = (
        Vec::with_capacity(rows),
        Vec::with_capacity(rows),
        Vec::with_capacity(rows),
    );
    let mut ratios: [Vec<Option<f64>>; 4] = std::array::from_fn(|_| Vec::with_capacity(rows));
    let mut bytes: [Vec<Option<u64>>; 4] = std::array::from_fn(|_| Vec::with_capacity(rows));
    for (k, &i) in new.iter().enumerate() {
        for (s, &(instance, holder)) in batches[i].0.series.iter().zip(&ids[k]) {
            let n = s.t.len();
            ts.extend_from_slice(&s.t);
            iid.extend(std::iter::repeat_n(instance, n));
            hid.extend(std::iter::repeat_n(holder, n));
            seq.extend(std::iter::repeat_n(i as i32, n));
            for (out, col) in ratios
                .iter_mut()
                .zip([&s.sm_active, &s.sm_occupancy, &s.tensor_active, &s.dram_active])
            {
                match col {
                    Some(v) => out.extend_from_slice(v),
                    None => out.extend(std::iter::repeat_n(None, n)),
                }
            }
            for (out, col) in bytes.iter_mut().zip([
                &s.fb_used_bytes,
                &s.fb_total_bytes,
                &s.nvlink_tx_bytes,
                &s.nvlink_rx_bytes,
            ]) {
                match col {
                    Some(v) => out.extend_from_slice(v),
                    None => out.extend(std::iter::repeat_n(None, n)),
                }
            }
        }
    }
    let newest = ts.iter().copied().max();
    let [sm, occ, tensor, dram] = ratios;
    let [used, total, tx, rx] = bytes;
    let f64s = |name: &str| Field::new(name, DataType::Float64, true);
    let u64s = |name: &str| Field::new(name, DataType::UInt64, true);
    let schema = Schema::new(vec![
        Field::new("ts", DataType::Int64, false),
        Field::new("instance_id", DataType::Int32, false),
        Field::new("holder_id", DataType::Int32, false),
        Field::new("seq", DataType::Int32, false),
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
        Arc::new(Int64Array::from(ts)),
        Arc::new(Int32Array::from(iid)),
        Arc::new(Int32Array::from(hid)),
        Arc::new(Int32Array::from(seq)),
        Arc::new(Float64Array::from(sm)),
        Arc::new(Float64Array::from(occ)),
        Arc::new(Float64Array::from(tensor)),
        Arc::new(Float64Array::from(dram)),
        Arc::new(UInt64Array::from(used)),
        Arc::new(UInt64Array::from(total)),
        Arc::new(UInt64Array::from(tx)),
        Arc::new(UInt64Array::from(rx)),
    ];
    let batch = RecordBatch::try_new(Arc::new(schema), columns).map_err(|e| {
        duckdb::Error::ToSqlConversionFailure(Box::new(e))
    })?;
    Ok((batch, newest))
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
        tx.commit().map_err(StoreError::from_db)?;
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
                        self.observer
                            .committed(1, started.elapsed().as_secs_f64());
                    }
                    let _ = job.reply.send(result.map(|mut o| o.remove(0)));
                }
            }
            Err(e) => {
                let _ = group
                    .into_iter()
                    .next()
                    .map(|j| j.reply.send(Err(e)));
            }
        }
    }

    /// Writes batches in one transaction. On error nothing is written and the in-memory
    /// dimension mirror is reloaded from the database.
    fn write(&mut self, batches: &[(&Batch, i64)]) -> Result<Vec<IngestOutcome>, StoreError> {
        let result = self.try_write(batches);
        if result.is_err() {
            match Dims::load(&self.conn) {
                Ok(d) => self.dims = d,
                Err(e) => tracing::error!(error = %e, "Cannot reload the dimension tables after a failed write."),
            }
        }
        result.map_err(StoreError::from_db)
    }

    fn try_write(&mut self, batches: &[(&Batch, i64)]) -> duckdb::Result<Vec<IngestOutcome>> {
        let tx = self.conn.transaction()?;
        let mut outcomes = Vec::with_capacity(batches.len());
        let mut seen = HashSet::new();
        // Which batches are new: not stored before, not repeated within this group.
        let mut new = Vec::new();
        {
            let mut stmt =
                tx.prepare_cached("SELECT count(*) FROM ingested_batches WHERE batch_id = ?::UUID")?;
            for (i, (batch, _)) in batches.iter().enumerate() {
                let id = batch.batch_id.to_string();
                let stored_before: i64 = stmt.query_row([&id], |r| r.get(0))?;
                let duplicate = stored_before > 0 || !seen.insert(batch.batch_id);
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
        }
        if new.is_empty() {
            tx.commit()?;
            return Ok(outcomes);
        }
        // Ids first: the appender must not be open while dimension rows are inserted.
        let mut ids: Vec<Vec<(i32, i32)>> = Vec::with_capacity(new.len());
        for &i in &new {
            let mut per_series = Vec::with_capacity(batches[i].0.series.len());
            for s in &batches[i].0.series {
                per_series.push((self.dims.instance_id(&tx, s)?, self.dims.holder_id(&tx, s)?));
            }
            ids.push(per_series);
        }
        let (staged, newest) = staging_batch(batches, &new, &ids)?;
        {
            // The Arrow path: one columnar chunk per 2,048 rows instead of a call per value.
            let mut app = tx.appender("ingest_staging")?;
            app.append_record_batch(staged)?;
            app.flush()?;
        }
        tx.execute(SELECT_FRESH, [])?;
        // Samples older than the raw window go to the rollups only. Batches of one group may have
        // been admitted with different cutoffs; the latest one is the one in force now.
        let raw_cutoff = batches.iter().map(|(_, c)| *c).max().unwrap_or(i64::MIN);
        tx.execute(INSERT_RAW, [raw_cutoff])?;
        for sql in rollup_statements() {
            tx.execute(sql, [])?;
        }
        {
            let mut stmt = tx.prepare_cached("SELECT seq, count(*) FROM ingest_fresh GROUP BY seq")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?)))?;
            for row in rows {
                let (seq, stored) = row?;
                let o = &mut outcomes[seq as usize];
                o.stored = stored as u64;
            }
        }
        let now = chrono::Utc::now().timestamp();
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO ingested_batches VALUES (?::UUID, ?, ?, ?, ?)",
            )?;
            for &i in &new {
                let o = &mut outcomes[i];
                o.duplicate_samples = o.samples - o.stored;
                stmt.execute(params![
                    batches[i].0.batch_id.to_string(),
                    batches[i].0.node,
                    now,
                    o.samples as i64,
                    o.stored as i64
                ])?;
            }
        }
        tx.execute_batch("DELETE FROM ingest_staging; DELETE FROM ingest_fresh;")?;
        tx.commit()?;
        if let Some(newest) = newest {
            self.observer.newest_sample(newest);
        }
        Ok(outcomes)
    }
}
