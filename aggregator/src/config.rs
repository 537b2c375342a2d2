//! The aggregator's settings and their defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::api::ingest::TimeWindow;
use crate::auth::Tokens;
use crate::store::Retention;

/// Every explicit limit of the service; what happens at each is documented on the field.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body read (compressed as sent); larger → 413.
    pub max_body_bytes: usize,
    /// Largest body after gzip decoding; larger → 413 (a gzip bomb stops here).
    pub max_decoded_bytes: usize,
    /// Samples accepted but not yet written; past it ingest answers 503 with Retry-After and the
    /// exporter keeps the batch in its spool. Bounds the aggregator's memory.
    pub queue_samples: usize,
    /// How far in the future a sample may be (clock skew); later → 400.
    pub max_future_skew: Duration,
    /// DuckDB's own memory limit (its syntax: `"1GB"`); DuckDB spills to disk past it.
    pub duckdb_memory_limit: String,
    /// Most requests served at once; more wait in the accept queue.
    pub concurrency: usize,
    /// How long one request may take before 408.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 << 20,
            max_decoded_bytes: 256 << 20,
            queue_samples: 2_000_000,
            max_future_skew: Duration::from_secs(300),
            duckdb_memory_limit: "1GB".into(),
            concurrency: 64,
            request_timeout: Duration::from_secs(60),
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
    /// Who may call.
    pub tokens: Tokens,
    /// How long raw samples and rollups are kept.
    pub retention: Retention,
    /// How often retention runs.
    pub retention_interval: Duration,
    /// The limits.
    pub limits: Limits,
    /// Hoarding, fragmentation and showback settings.
    pub analytics: crate::analytics::Settings,
}

impl Config {
    /// The time window a batch must fall in, as of `now`.
    pub fn window(&self, now: i64) -> TimeWindow {
        TimeWindow {
            newest: now + self.limits.max_future_skew.as_secs() as i64,
            oldest: now - self.retention.rollup_secs,
        }
    }
}
