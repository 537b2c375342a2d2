//! The aggregator's settings and their defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::auth::Tokens;
use gpuledger_ledger::store::Retention;
use gpuledger_schema::wire::TimeWindow;

/// Every explicit limit of the service; what happens at each is documented on the field.
///
/// What ingest can cost in memory follows from these, whatever clients send (docs/aggregator.md,
/// "Memory bound"): bodies being read ≤ `ingest_slots` × `max_body_bytes`; bodies being decoded ≤
/// `decode_slots` × (`batch.max_decoded_bytes()` + 32 bytes × `batch.max_values()`); batches
/// waiting for the writer ≤ `queue_samples` samples; plus DuckDB's `duckdb_memory_limit`.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body read, as sent (gzip); larger → 413, refused from its
    /// `Content-Length` before any of it is read.
    pub max_body_bytes: usize,
    /// What one batch may hold; the decoded size and the JSON values a body may have follow from
    /// it (`schema/WIRE.md`). More → 413.
    pub batch: gpuledger_schema::wire::Limits,
    /// Samples accepted but not yet written; past it ingest answers 503 with Retry-After and the
    /// exporter keeps the batch in its spool. Bounds the aggregator's memory.
    pub queue_samples: usize,
    /// How far in the future a sample may be (clock skew); later → 400.
    pub max_future_skew: Duration,
    /// DuckDB's own memory limit (its syntax: `"1GB"`); DuckDB spills to disk past it.
    pub duckdb_memory_limit: String,
    /// Most read requests (APIs, `/metrics`, probes) served at once; more wait.
    pub concurrency: usize,
    /// How long one request may take before 408.
    pub request_timeout: Duration,
    /// Ingest requests being read and decoded at once. A batch that has its place in the writer
    /// queue gives its slot back while it waits for the commit (`queue_samples` bounds those).
    pub ingest_slots: usize,
    /// Of those, the most one token may hold; past it → 429 with Retry-After, so that one
    /// token (a leaked one, or a slow client) cannot take every slot.
    pub ingest_slots_per_token: usize,
    /// How long an ingest request waits for a free slot before 503 with Retry-After.
    pub ingest_slot_wait: Duration,
    /// The whole body must have arrived this long after the request was admitted; later → 408
    /// (the exporter retries). A client trickling its body holds a slot at most this long.
    pub body_read_timeout: Duration,
    /// Bodies inflated and parsed at once (CPU-bound work; also bounds its memory).
    pub decode_slots: usize,
    /// Distinct instances (MIG slices or whole GPUs) one node may have reported within the raw
    /// window; a batch that would add more → 422, counted. A node has a few dozen.
    pub max_instances_per_node: usize,
    /// Distinct instances the whole ledger may have, whatever the nodes; past it → 422, counted
    /// the same way. Bounds what a `node:*` token can add, and every page listing instances.
    pub max_instances: usize,
    /// Exemptions in force one tenant may have made through the API (and those made for every
    /// tenant, counted together); one more → 422 naming `tenant`. Bounds the list and the policy
    /// pass that reads it.
    pub max_exemptions_per_tenant: usize,
}

/// The ledger file when `--db` is not given.
pub const DEFAULT_DB: &str = "/var/lib/gpuledger/ledger.duckdb";
/// How long raw 1 s samples are kept when `--raw-retention` is not given.
pub const DEFAULT_RAW_RETENTION: Duration = Duration::from_secs(48 * 3600);
/// How long the rollups are kept when `--rollup-retention` is not given: a year and a month,
/// so that last year's same month can be billed again.
pub const DEFAULT_ROLLUP_RETENTION: Duration = Duration::from_secs(400 * 86_400);
/// How often retention runs when `--retention-interval` is not given.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(600);

/// The fleet's instance bound when `max_instances` is not given: 20,000 GPUs, each carved into
/// its seven smallest MIG slices, with room for as many again re-carved within the raw window.
pub const DEFAULT_MAX_INSTANCES: usize = 280_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            batch: gpuledger_schema::wire::Limits::default(),
            queue_samples: 2_000_000,
            max_future_skew: Duration::from_secs(300),
            duckdb_memory_limit: "1GB".into(),
            concurrency: 64,
            request_timeout: Duration::from_secs(60),
            ingest_slots: 64,
            ingest_slots_per_token: 16,
            ingest_slot_wait: Duration::from_secs(2),
            body_read_timeout: Duration::from_secs(10),
            decode_slots: std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
            max_instances_per_node: 256,
            max_instances: DEFAULT_MAX_INSTANCES,
            max_exemptions_per_tenant: 100,
        }
    }
}

/// How the aggregator runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The DuckDB ledger file (`:memory:` only for tests).
    pub db: PathBuf,
    /// Address of the API, `/metrics` and the probes.
    pub listen: SocketAddr,
    /// The listener's connection bound and header read timeout.
    pub http: gpuledger_otel::serve::Listening,
    /// Who may call.
    pub tokens: Tokens,
    /// How long raw samples and rollups are kept.
    pub retention: Retention,
    /// How often retention runs.
    pub retention_interval: Duration,
    /// The limits.
    pub limits: Limits,
    /// Hoarding, fragmentation and showback settings.
    pub analytics: gpuledger_ledger::analytics::Settings,
    /// The reclaim policy, its webhooks and Alertmanager.
    pub reclaim: gpuledger_ledger::reclaim::Settings,
    /// The pages' sign-in.
    pub ui: crate::auth::session::UiSettings,
    /// Where `POST /api/v1/export` writes Parquet; `None`: the endpoint is off.
    pub export_dir: Option<PathBuf>,
    /// Also push the metrics (operational and ledger families) over OTLP/HTTP; the traces go
    /// where the binary's logging set-up sends them (docs/otlp.md, "OpenTelemetry (OTLP)").
    pub otlp: Option<gpuledger_otel::OtlpConfig>,
}

impl Config {
    /// The time window a batch must fall in, as of `now`.
    pub fn window(&self, now: i64) -> TimeWindow {
        TimeWindow {
            newest: now.saturating_add(self.limits.max_future_skew.as_secs() as i64),
            oldest: now.saturating_sub(self.retention.rollup_secs),
        }
    }
}
