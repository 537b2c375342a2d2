//! Read-side queries. Readers use their own connections ([`Readers`]), never the writer's.

use std::path::PathBuf;
use std::sync::Mutex;

use duckdb::{Connection, params};

use super::StoreError;

/// Hands out reader connections to the ledger the writer owns (clones share one base).
#[derive(Clone)]
pub struct Readers {
    base: std::sync::Arc<Mutex<Connection>>,
    path: Option<PathBuf>,
}

impl Readers {
    /// Readers of the database `conn` is connected to (`path`: its file, `None` in memory).
    pub fn new(conn: &Connection, path: Option<PathBuf>) -> Result<Readers, StoreError> {
        Ok(Readers {
            base: std::sync::Arc::new(Mutex::new(conn.try_clone().map_err(StoreError::from_db)?)),
            path,
        })
    }

    /// A fresh connection for one request.
    pub fn connect(&self) -> Result<Connection, StoreError> {
        self.base
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_clone()
            .map_err(StoreError::from_db)
    }

    /// Bytes free to the aggregator on the ledger's filesystem; `None` for an in-memory ledger or
    /// when the filesystem cannot be asked.
    pub fn free_bytes(&self) -> Option<u64> {
        free_bytes_beside(self.path.as_ref()?)
    }

    /// Bytes on disk: the database file and its write-ahead log.
    pub fn database_bytes(&self) -> u64 {
        let Some(path) = &self.path else { return 0 };
        [path.clone(), wal_of(path)]
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }
}

/// The write-ahead log DuckDB keeps beside the database file `path`.
pub(crate) fn wal_of(path: &std::path::Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push(".wal");
    PathBuf::from(wal)
}

/// Bytes free to the aggregator on the filesystem that holds `path`; `None` when it cannot be
/// asked.
pub(crate) fn free_bytes_beside(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable memory of the size
    // statvfs(3) fills; it is read only after the call reports success.
    let st = unsafe {
        if libc::statvfs(c.as_ptr(), st.as_mut_ptr()) != 0 {
            return None;
        }
        st.assume_init()
    };
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The tables whose row counts the aggregator exports.
pub const COUNTED_TABLES: [&str; 14] = [
    "samples_raw",
    "rollup_1m",
    "rollup_1h",
    "rollup_tenant_1h",
    "rollup_gpu_1h",
    "rollup_alloc_1d",
    "fragmentation_1h",
    "hoarding_episodes",
    "ingested_batches",
    "instances",
    "holders",
    "reclaim_episodes",
    "reclaim_decisions",
    "webhook_outbox",
];

/// Bytes DuckDB's buffer manager holds in memory now (`duckdb_memory()`, summed over its tags):
/// what `--memory-limit` bounds. The rest of the process's resident memory is the aggregator's own.
pub fn memory_bytes(conn: &Connection) -> Result<u64, StoreError> {
    conn.prepare_cached("SELECT coalesce(sum(memory_usage_bytes), 0)::BIGINT FROM duckdb_memory()")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .map(i64::unsigned_abs)
        .map_err(StoreError::from_db)
}

/// Rows per ledger table (DuckDB's own count, kept in its metadata: no scan).
pub fn table_rows(conn: &Connection) -> Result<Vec<(String, u64)>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT table_name, estimated_size FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' ORDER BY table_name",
        )
        .map_err(StoreError::from_db)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(StoreError::from_db)?;
    let mut out = Vec::new();
    for row in rows {
        let (name, n) = row.map_err(StoreError::from_db)?;
        if COUNTED_TABLES.contains(&name.as_str()) {
            out.push((name, n.max(0) as u64));
        }
    }
    Ok(out)
}

/// One tenant's usage over a range, from the hourly tenant rollup.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TenantUsage {
    /// The tenant; `None` for unallocated instances.
    pub tenant: Option<String>,
    /// Instance-seconds sampled.
    pub samples: u64,
    /// Σ GPU-equivalents over those seconds.
    pub allocated_gpu_seconds: f64,
    /// Σ sm_active × GPU-equivalents.
    pub used_gpu_seconds: f64,
}

/// Usage per tenant over the hours in `[from, to)` (Unix seconds, whole hours), read from the
/// hourly tenant rollup: a month for a thousand GPUs reads a few hundred thousand rows, never the
/// raw seconds.
pub fn tenant_usage(conn: &Connection, from: i64, to: i64) -> Result<Vec<TenantUsage>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT tenant, sum(samples)::BIGINT, sum(gpu_seconds), sum(used_gpu_seconds)
             FROM rollup_tenant_1h WHERE bucket >= ? AND bucket < ?
             GROUP BY tenant ORDER BY tenant NULLS LAST",
        )
        .map_err(StoreError::from_db)?;
    let rows = stmt
        .query_map(params![from, to], |r| {
            Ok(TenantUsage {
                tenant: r.get(0)?,
                samples: r.get::<_, i64>(1)? as u64,
                allocated_gpu_seconds: r.get(2)?,
                used_gpu_seconds: r.get(3)?,
            })
        })
        .map_err(StoreError::from_db)?;
    rows.collect::<Result<_, _>>().map_err(StoreError::from_db)
}
