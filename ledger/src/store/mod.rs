//! The DuckDB ledger file: opening it and bringing its schema to [`LATEST`], the one writer
//! ([`writer`]) and the read-side queries ([`query`]).
//!
//! Tables and what they hold: `schema/migrations/0001_ledger.sql`.

pub mod query;
pub mod writer;

use std::path::Path;

use duckdb::arrow::array::{Array, ArrayRef, RecordBatch};
use duckdb::{Config, Connection, params};
use gpuledger_schema::migrations::{LATEST, MIGRATIONS};

pub use writer::{
    Compactor, IngestOutcome, QueueError, Reservation, Retention, RetentionReport, Writer,
    set_idle_watts,
};

/// How long after an hour ends its raw rows are rewritten in instance order: batches an exporter
/// ships late still arrive in it (they are stored either way; later ones stay in arrival order).
pub const COMPACT_AFTER: i64 = 10 * 60;

/// Why the ledger cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// DuckDB refused.
    #[error("database {path}: {source}")]
    Db {
        /// The file (or `:memory:`).
        path: String,
        /// DuckDB's error.
        source: duckdb::Error,
    },
    /// A statement failed after the database was opened.
    #[error("database: {0}")]
    Query(#[source] duckdb::Error),
    /// The writer thread is gone (it panicked or the service is stopping).
    #[error("the writer thread has stopped")]
    WriterStopped,
    /// An operating-system error around the database.
    #[error("{0}")]
    Io(String),
    /// A batch the ledger will not take however often it is sent (a limit of the store, or
    /// values it cannot hold): answered 4xx so that the sender sets it aside instead of
    /// retrying it forever ahead of everything it sends later.
    #[error("{field}: {message}")]
    Rejected {
        /// The JSON path at fault (`series[3]`, or `body`).
        field: String,
        /// Why, as a sentence.
        message: String,
    },
    /// A newer gpuledger wrote this file.
    #[error(
        "database {path} is at schema version {found}, but this gpuledger only knows up to version {LATEST}; run a newer gpuledger (or restore a backup)"
    )]
    TooNew {
        /// The file.
        path: String,
        /// Its version.
        found: u32,
    },
}

impl StoreError {
    /// Wraps a DuckDB error from a statement.
    pub fn from_db(e: duckdb::Error) -> StoreError {
        StoreError::Query(e)
    }
}

/// What a DuckDB failure says about the data that caused it, by the error type DuckDB names at
/// the start of its message (`Out of Range Error: …`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The values could not be stored (overflow, conversion, constraint): the same input fails
    /// the same way every time.
    Data,
    /// The machine or the database (disk, memory, a conflict, an interruption): a retry may do.
    Transient,
    /// DuckDB has invalidated the database (a checkpoint that failed half-way, say): every
    /// statement on any connection fails until the process opens the file again, and then its
    /// write-ahead log brings back everything committed.
    Fatal,
}

/// DuckDB's error types whose cause is the input itself. Every other type is [`Failure::Transient`]:
/// a full disk must be retried, never answered as a bad batch.
const DATA_ERRORS: &[&str] = &[
    "Out of Range Error",
    "Conversion Error",
    "Constraint Error",
    "Invalid Input Error",
    "Mismatch Type Error",
    "Decimal Error",
    "Divide by Zero Error",
];

impl Failure {
    /// Classifies a DuckDB error.
    pub fn of(e: &duckdb::Error) -> Failure {
        let message = match e {
            duckdb::Error::DuckDBFailure(_, Some(m)) => m.as_str(),
            _ => return Failure::Transient,
        };
        if message.starts_with("FATAL Error:") {
            return Failure::Fatal;
        }
        if DATA_ERRORS.iter().any(|t| {
            message
                .strip_prefix(t)
                .is_some_and(|rest| rest.starts_with(':'))
        }) {
            Failure::Data
        } else {
            Failure::Transient
        }
    }
}

/// Appends rows given as columns, in `table`'s column order, through the appender's Arrow path:
/// one columnar chunk per 2,048 rows. A row at a time (`append_row`) is a call into DuckDB's C
/// API per value, too slow for a 70,000-instance pass's results on the writer's thread
/// (docs/perf/analytics.md, "The writer's share of an evaluation").
pub fn append_columns(
    conn: &Connection,
    table: &str,
    columns: Vec<(&str, ArrayRef)>,
) -> duckdb::Result<()> {
    if columns.first().is_none_or(|(_, c)| c.is_empty()) {
        return Ok(());
    }
    let batch = RecordBatch::try_from_iter(columns)
        .map_err(|e| duckdb::Error::ToSqlConversionFailure(Box::new(e)))?;
    let mut app = conn.appender(table)?;
    app.append_record_batch(batch)?;
    app.flush()
}

/// One row per migration applied, inserted once, in the migration's transaction. No primary key:
/// DuckDB gives every index a 256 KiB block of its own (migration 0010).
const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)";

/// The DuckDB storage format a new ledger file is written in. DuckDB's default is compatible
/// with v0.10.2 (tagged `v1.0.0+`), which serializes every column's distinct-count sketch in the
/// old, wide layout, many times the metadata blocks of v1.2's (docs/perf/storage.md, "Metadata in
/// DuckDB v1.2's storage format"). A file keeps the
/// format it was created in; DuckDB 1.2 and later read it.
pub const STORAGE_VERSION: &str = "v1.2.0";

/// Opens (creating) the ledger at `path` (`:memory:` for tests) and applies missing migrations,
/// each in its own transaction. Returns the connection and the schema version found before.
pub fn open(path: &Path) -> Result<(Connection, u32), StoreError> {
    open_with(path, None)
}

/// [`open`] with DuckDB's memory limit (`"1GB"`, DuckDB's syntax) when given.
pub fn open_with(path: &Path, memory_limit: Option<&str>) -> Result<(Connection, u32), StoreError> {
    let name = path.display().to_string();
    let db = |source| StoreError::Db {
        path: name.clone(),
        source,
    };
    let mut config = Config::default()
        .with("storage_compatibility_version", STORAGE_VERSION)
        .map_err(db)?;
    if let Some(limit) = memory_limit {
        config = config.max_memory(limit).map_err(db)?;
    }
    let mut conn = if name == ":memory:" {
        Connection::open_in_memory_with_flags(config)
    } else {
        Connection::open_with_flags(path, config)
    }
    .map_err(db)?;
    // The writer paces DuckDB's checkpoints by its rate (`writer/checkpoints.rs`); a store opens
    // with the threshold for a fleet's own pace.
    writer::set_checkpoint_threshold(&conn, writer::CHECKPOINT_THRESHOLD).map_err(db)?;
    // Row groups are merged only when the writer compacts (`writer/checkpoints.rs`).
    writer::without_merges(&conn).map_err(db)?;
    conn.execute_batch(VERSION_TABLE).map_err(db)?;
    let found: u32 = conn
        .query_row(
            "SELECT coalesce(max(version), 0) FROM schema_version",
            [],
            |r| r.get(0),
        )
        .map_err(db)?;
    if found > LATEST {
        return Err(StoreError::TooNew { path: name, found });
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        let tx = conn.transaction().map_err(db)?;
        tx.execute_batch(m.sql).map_err(db)?;
        tx.execute(
            "INSERT INTO schema_version (version, name) VALUES (?, ?)",
            params![m.version, m.name],
        )
        .map_err(db)?;
        tx.commit().map_err(db)?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "Applied a schema migration."
        );
    }
    Ok((conn, found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_gets_the_schema_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.duckdb");
        let (conn, before) = open(&path).unwrap();
        assert_eq!(before, 0);
        let tables: i64 = conn.query_row("SELECT count(*) FROM information_schema.tables WHERE table_name IN ('samples_raw', 'rollup_1m', 'rollup_1h', 'rollup_tenant_1h', 'ingested_batches')", [], |r| r.get(0)).unwrap();
        assert_eq!(tables, 5);
        drop(conn);
        let (_, before) = open(&path).unwrap();
        assert_eq!(before, LATEST, "reopening applies nothing");
    }

    /// A new ledger file is written in DuckDB v1.2's storage format ([`STORAGE_VERSION`]); one
    /// created in DuckDB's default format keeps that format, its rows and its writes.
    #[test]
    fn a_new_ledger_is_in_the_v1_2_format_and_an_older_file_keeps_its_own() {
        let format = |conn: &Connection| -> String {
            conn.query_row(
                "SELECT tags['storage_version'] FROM duckdb_databases() WHERE database_name = current_database()",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let (conn, _) = open(&dir.path().join("new.duckdb")).unwrap();
        assert_eq!(format(&conn), "v1.2.0+");

        let old = dir.path().join("old.duckdb");
        {
            let conn = Connection::open(&old).unwrap();
            conn.execute_batch("CREATE TABLE kept (x INTEGER); INSERT INTO kept VALUES (1)")
                .unwrap();
            assert_eq!(format(&conn), "v1.0.0+");
        }
        {
            let (conn, before) = open(&old).unwrap();
            assert_eq!(before, 0);
            assert_eq!(format(&conn), "v1.0.0+");
            conn.execute_batch("INSERT INTO kept VALUES (2); CHECKPOINT")
                .unwrap();
        }
        let conn = Connection::open(&old).unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM kept", [], |r| r.get(0))
            .unwrap();
        assert_eq!((format(&conn), n), ("v1.0.0+".to_string(), 2));
    }

    /// Only the dimension tables keep a primary key: every index costs a 256 KiB block. A file
    /// written before migration 0010 (keys on the single-row tables and on `schema_version`)
    /// loses those keys and keeps its rows.
    #[test]
    fn only_the_dimension_tables_keep_a_key_in_new_and_upgraded_files() {
        let keys = |conn: &Connection| -> Vec<String> {
            let mut stmt = conn
                .prepare("SELECT table_name FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY' ORDER BY 1")
                .unwrap();
            stmt.query_map([], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        let dir = tempfile::tempdir().unwrap();
        let (conn, _) = open(&dir.path().join("new.duckdb")).unwrap();
        assert_eq!(keys(&conn), ["holders", "instances"]);

        let old = dir.path().join("old.duckdb");
        {
            let conn = Connection::open(&old).unwrap();
            conn.execute_batch("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)")
                .unwrap();
            for m in MIGRATIONS.iter().filter(|m| m.version < 10) {
                conn.execute_batch(m.sql).unwrap();
                conn.execute(
                    "INSERT INTO schema_version (version, name) VALUES (?, ?)",
                    params![m.version, m.name],
                )
                .unwrap();
            }
            conn.execute_batch(
                "UPDATE writer_probe SET checked_at = 7; UPDATE fold_pending SET from_ts = 9",
            )
            .unwrap();
            assert_eq!(keys(&conn).len(), 5);
        }
        let (conn, before) = open(&old).unwrap();
        assert_eq!(before, 9);
        assert_eq!(keys(&conn), ["holders", "instances"]);
        let kept: (i64, i64, i64) = conn
            .query_row(
                "SELECT (SELECT checked_at FROM writer_probe WHERE id = 0), (SELECT from_ts FROM fold_pending WHERE id = 0), (SELECT count(DISTINCT version) FROM schema_version)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(kept, (7, 9, i64::from(LATEST)));
    }

    /// Migration 0011: a ledger that already holds raw rows records the hour of its newest one
    /// as where the raw rewrite stopped (the hours before were left as they came, and stay so);
    /// an empty one records nothing, so its whole raw window is rewritten.
    #[test]
    fn an_upgraded_ledger_with_raw_rows_leaves_its_earlier_hours_as_they_came() {
        let dir = tempfile::tempdir().unwrap();
        let recorded = |name: &str, raw_rows: &[i64]| -> Vec<i64> {
            let path = dir.path().join(name);
            {
                let conn = Connection::open(&path).unwrap();
                conn.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)")
                    .unwrap();
                for m in MIGRATIONS.iter().filter(|m| m.version <= 10) {
                    conn.execute_batch(m.sql).unwrap();
                    conn.execute(
                        "INSERT INTO schema_version (version, name) VALUES (?, ?)",
                        params![m.version, m.name],
                    )
                    .unwrap();
                }
                for ts in raw_rows {
                    conn.execute(
                        "INSERT INTO samples_raw (ts, instance_id, holder_id) VALUES (?, 1, 1)",
                        params![ts],
                    )
                    .unwrap();
                }
            }
            let (conn, before) = open(&path).unwrap();
            assert_eq!(before, 10);
            let mut stmt = conn.prepare("SELECT until_ts FROM raw_compacted").unwrap();
            stmt.query_map([], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        assert_eq!(recorded("rows.duckdb", &[7_205, 10_799, 3_600]), [7_200]);
        assert_eq!(recorded("empty.duckdb", &[]), Vec::<i64>::new());
    }

    #[test]
    fn an_older_binary_refuses_a_newer_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.duckdb");
        let (conn, _) = open(&path).unwrap();
        conn.execute(
            "INSERT INTO schema_version (version, name) VALUES (?, 'from the future')",
            params![LATEST + 1],
        )
        .unwrap();
        drop(conn);
        let err = open(&path).unwrap_err();
        assert!(
            matches!(err, StoreError::TooNew { found, .. } if found == LATEST + 1),
            "{err}"
        );
        assert!(err.to_string().contains("run a newer gpuledger"), "{err}");
    }
}
