//! `gpuledger export`: the ledger as Hive-partitioned Parquet (`<dir>/<table>/date=YYYY-MM-DD/`),
//! the way past one machine: each cluster's aggregator exports into one shared directory and
//! DuckDB, Trino or Spark query all of them at once
//! (`read_parquet('<dir>/rollup_1h/*/*.parquet', hive_partitioning = true)`).
//!
//! Rows are denormalised (node, GPU, profile, tenant, … inline, no ids) and carry a `cluster`
//! column. Key decision: an export covers whole UTC days, and each (table, day, cluster) is one
//! file, `<table>/date=<day>/<cluster>.parquet`, written beside its final name and renamed into
//! place. So exporting a range again replaces those days' files instead of adding to them (the
//! combined month never counts a row twice), several clusters share a directory without touching
//! each other's files, and a reader never sees half a file. A day's rows only grow (late data)
//! until retention deletes them, so an earlier file holding more rows than the ledger now has
//! for that day (raw samples past their 48 h, say) is kept: re-exporting never shrinks the
//! archive.
//!
//! It runs on any connection to the ledger: `gpuledger export --db` opens the file read-only (no
//! aggregator may have it open), and `POST /api/v1/export` runs the same code inside a running
//! aggregator on a reader connection (`gpuledger export --aggregator`).
use std::path::{Path, PathBuf};

use duckdb::{AccessMode, Config, Connection};

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// The ledger file (opened read-only).
    pub db: PathBuf,
    /// The output directory.
    pub dir: PathBuf,
    /// Start of the range, Unix seconds (inclusive).
    pub from: i64,
    /// End of the range, Unix seconds (exclusive).
    pub to: i64,
    /// Also export the raw 1 s samples still in the raw window.
    pub raw: bool,
    /// The cluster name written into every row and file name: letters, digits, `-`, `_`, `.`.
    pub cluster: String,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A bad option.
    #[error("{field}: {message}")]
    Option {
        /// The option.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// DuckDB failed.
    #[error("{0}")]
    Db(#[from] duckdb::Error),
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExportReport {
    /// The range exported, widened to whole UTC days (Unix seconds, `to` exclusive).
    pub from: i64,
    /// End of that range.
    pub to: i64,
    /// (table, rows written).
    pub tables: Vec<(String, u64)>,
    /// Files written (each replaced any earlier export's file for its table, day and cluster).
    pub files: u64,
    /// (table, day) files kept from an earlier export because the ledger now holds fewer of that
    /// day's rows than they do.
    pub kept: Vec<(String, String)>,
}

const DIMENSIONS: &str = "i.node, i.gpu_uuid, i.gpu_model, i.mig_profile,
    CASE WHEN i.gpu_instance_id < 0 THEN NULL ELSE i.gpu_instance_id END AS gpu_instance_id,
    i.placement_start, i.placement_size, i.gpu_equivalents, h.tenant, h.workload, h.slo_class";

/// The unsigned 64-bit columns of each exported table, written as signed 64-bit (every value
/// fits: a minute's mask uses 60 bits, an hour's byte sums stay far below 2⁶³), so that engines
/// without unsigned integers (Spark, Trino) read them as `bigint`, not `decimal(20,0)`.
fn signed(table: &str) -> &'static [&'static str] {
    match table {
        "rollup_1m" => &[
            "seconds_mask",
            "fb_used_bytes_sum",
            "fb_used_bytes_max",
            "fb_total_bytes_max",
            "nvlink_tx_bytes_sum",
            "nvlink_rx_bytes_sum",
        ],
        "rollup_1h" => &[
            "fb_used_bytes_sum",
            "fb_used_bytes_max",
            "fb_total_bytes_max",
            "nvlink_tx_bytes_sum",
            "nvlink_rx_bytes_sum",
        ],
        "samples_raw" => &[
            "fb_used_bytes",
            "fb_total_bytes",
            "nvlink_tx_bytes",
            "nvlink_rx_bytes",
        ],
        _ => &[],
    }
}

/// `REPLACE (CAST(c AS BIGINT) AS c, …)` for `table`'s unsigned columns, or nothing.
fn as_signed(table: &str, prefix: &str) -> String {
    let casts: Vec<String> = signed(table)
        .iter()
        .map(|c| format!("CAST({prefix}{c} AS BIGINT) AS {c}"))
        .collect();
    if casts.is_empty() {
        String::new()
    } else {
        format!(" REPLACE ({})", casts.join(", "))
    }
}

/// (table, the SELECT); its parameters are cluster, from, to, in that order. Instants are
/// written as timestamps with time zone (Parquet `isAdjustedToUTC`), so every engine reads the
/// same UTC instant whatever its session's zone; the `date` partition is the UTC day.
fn selects(raw: bool) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for table in ["rollup_1h", "rollup_1m"] {
        let replace = as_signed(table, "r.");
        out.push((
            table,
            format!(
                "SELECT CAST(? AS VARCHAR) AS cluster, CAST(epoch_ms(r.bucket * 1000) AS DATE) AS date,
                        to_timestamp(r.bucket) AS bucket_start, {DIMENSIONS},
                        r.* EXCLUDE (bucket, instance_id, holder_id){replace}
                 FROM {table} r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
                 WHERE r.bucket >= ? AND r.bucket < ?"
            ),
        ));
    }
    out.push((
        "rollup_tenant_1h",
        "SELECT CAST(? AS VARCHAR) AS cluster, CAST(epoch_ms(bucket * 1000) AS DATE) AS date,
                to_timestamp(bucket) AS bucket_start, * EXCLUDE (bucket)
         FROM rollup_tenant_1h WHERE bucket >= ? AND bucket < ?"
            .to_owned(),
    ));
    // Capacity: the seconds each GPU was observed, per hour (showback's capacity and coverage).
    out.push((
        "rollup_gpu_1h",
        "SELECT CAST(? AS VARCHAR) AS cluster, CAST(epoch_ms(bucket * 1000) AS DATE) AS date,
                to_timestamp(bucket) AS bucket_start, * EXCLUDE (bucket)
         FROM rollup_gpu_1h WHERE bucket >= ? AND bucket < ?"
            .to_owned(),
    ));
    if raw {
        let replace = as_signed("samples_raw", "r.");
        out.push((
            "samples_raw",
            format!(
                "SELECT CAST(? AS VARCHAR) AS cluster, CAST(epoch_ms(r.ts * 1000) AS DATE) AS date,
                        to_timestamp(r.ts) AS ts, {DIMENSIONS},
                        r.* EXCLUDE (ts, instance_id, holder_id){replace}
                 FROM samples_raw r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
                 WHERE r.ts >= ? AND r.ts < ?"
            ),
        ));
    }
    out
}

/// Rewrites `file`, an earlier export kept because it holds more rows than the ledger now does,
/// in today's column types when it was written in the first ones (instants without time zone,
/// unsigned byte counts): one table mixing both cannot be read by Spark. Answers whether it did.
fn upgrade_kept(
    conn: &Connection,
    table: &str,
    file: &Path,
    partial: &Path,
) -> Result<bool, ExportError> {
    let time = if table == "samples_raw" {
        "ts"
    } else {
        "bucket_start"
    };
    let typ: String = conn.query_row(
        &format!(
            "SELECT typeof({time}) FROM read_parquet({}) LIMIT 1",
            path_literal(file)?
        ),
        [],
        |r| r.get(0),
    )?;
    if typ != "TIMESTAMP" {
        return Ok(false);
    }
    // The old instants were UTC wall-clock times: their epoch is the instant (no time zone
    // conversion, which would need ICU).
    let mut replace: Vec<String> = vec![format!("to_timestamp(epoch({time})) AS {time}")];
    replace.extend(
        signed(table)
            .iter()
            .map(|c| format!("CAST({c} AS BIGINT) AS {c}")),
    );
    conn.execute_batch(&format!(
        "COPY (SELECT * REPLACE ({}) FROM read_parquet({})) TO {} (FORMAT parquet)",
        replace.join(", "),
        path_literal(file)?,
        path_literal(partial)?
    ))?;
    std::fs::rename(partial, file).map_err(|e| ExportError::Option {
        field: "parquet",
        message: format!("cannot rename into {}: {e}", file.display()),
    })?;
    Ok(true)
}

/// A path as an SQL string literal. COPY takes its target only as a literal, so this is the one
/// place a string reaches SQL unbound: quotes are doubled and NUL refused.
fn path_literal(p: &Path) -> Result<String, ExportError> {
    let s = p.to_str().ok_or(ExportError::Option {
        field: "parquet",
        message: "the directory name is not UTF-8".into(),
    })?;
    if s.contains('\0') {
        return Err(ExportError::Option {
            field: "parquet",
            message: "the directory name contains NUL".into(),
        });
    }
    Ok(format!("'{}'", s.replace('\'', "''")))
}

/// Runs an export of the ledger file `opts.db`, opened read-only.
pub fn export(opts: &ExportOptions) -> Result<ExportReport, ExportError> {
    if !opts.db.exists() {
        return Err(ExportError::Option {
            field: "db",
            message: format!("{} does not exist", opts.db.display()),
        });
    }
    let conn = Connection::open_with_flags(
        &opts.db,
        Config::default().access_mode(AccessMode::ReadOnly)?,
    )?;
    export_with(&conn, opts)
}

/// The longest cluster name: it is a file name (`<cluster>.parquet`), and file systems take 255
/// bytes at most.
pub const MAX_CLUSTER_BYTES: usize = 64;

/// Checks the options that do not depend on the ledger.
pub fn check(opts: &ExportOptions) -> Result<(), ExportError> {
    if opts.cluster.len() > MAX_CLUSTER_BYTES {
        return Err(ExportError::Option {
            field: "cluster",
            message: format!(
                "is {} bytes long; at most {MAX_CLUSTER_BYTES} (it names every file)",
                opts.cluster.len()
            ),
        });
    }
    if opts.cluster.is_empty()
        || !opts
            .cluster
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(ExportError::Option {
            field: "cluster",
            message: format!(
                "{:?} must be letters, digits, '-', '_' or '.'",
                opts.cluster
            ),
        });
    }
    if opts.from >= opts.to {
        return Err(ExportError::Option {
            field: "from",
            message: "must be before to".into(),
        });
    }
    if opts.to - opts.from > 3660 * 86_400 {
        return Err(ExportError::Option {
            field: "to",
            message: "the range is longer than ten years".into(),
        });
    }
    Ok(())
}

/// Runs an export on `conn`, a connection to the ledger (`opts.db` is not used).
pub fn export_with(conn: &Connection, opts: &ExportOptions) -> Result<ExportReport, ExportError> {
    check(opts)?;
    std::fs::create_dir_all(&opts.dir).map_err(|e| ExportError::Option {
        field: "parquet",
        message: format!("cannot create {}: {e}", opts.dir.display()),
    })?;
    let from = opts.from.div_euclid(86_400) * 86_400;
    let to = (opts.to + 86_399).div_euclid(86_400) * 86_400;
    let mut report = ExportReport {
        from,
        to,
        ..ExportReport::default()
    };
    for (table, select) in selects(opts.raw) {
        let mut rows = 0u64;
        let mut day = from;
        while day < to {
            let date = chrono::DateTime::from_timestamp(day, 0)
                .map(|d| d.format("%Y-%m-%d").to_string())
                .unwrap_or_default();
            let partition = opts.dir.join(table).join(format!("date={date}"));
            let file = partition.join(format!("{}.parquet", opts.cluster));
            conn.execute_batch("DROP TABLE IF EXISTS temp.export_rows")?;
            conn.execute(
                &format!("CREATE TEMP TABLE export_rows AS {select}"),
                duckdb::params![opts.cluster, day, day + 86_400],
            )?;
            let n: i64 =
                conn.query_row("SELECT count(*) FROM temp.export_rows", [], |r| r.get(0))?;
            // Rows of a day only grow (late data) until retention deletes them: an earlier file
            // with more rows than the ledger now holds is kept.
            let earlier: i64 = if file.exists() {
                conn.query_row(
                    &format!(
                        "SELECT count(*) FROM read_parquet({})",
                        path_literal(&file)?
                    ),
                    [],
                    |r| r.get(0),
                )?
            } else {
                0
            };
            if earlier > n {
                let partial = partition.join(format!(".{}.parquet.partial", opts.cluster));
                upgrade_kept(conn, table, &file, &partial)?;
                report.kept.push((table.to_owned(), date));
            } else if n > 0 {
                std::fs::create_dir_all(&partition).map_err(|e| ExportError::Option {
                    field: "parquet",
                    message: format!("cannot create {}: {e}", partition.display()),
                })?;
                let partial = partition.join(format!(".{}.parquet.partial", opts.cluster));
                conn.execute_batch(&format!(
                    "COPY (SELECT * EXCLUDE (date) FROM temp.export_rows) TO {} (FORMAT parquet)",
                    path_literal(&partial)?
                ))?;
                std::fs::rename(&partial, &file).map_err(|e| ExportError::Option {
                    field: "parquet",
                    message: format!("cannot rename into {}: {e}", file.display()),
                })?;
                rows += n as u64;
                report.files += 1;
            }
            day += 86_400;
        }
        conn.execute_batch("DROP TABLE IF EXISTS temp.export_rows")?;
        report.tables.push((table.to_owned(), rows));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A day kept from an export of the first column types (instants without time zone, unsigned
    /// byte counts) is rewritten in today's, with the same rows and instants: one table mixing
    /// both is unreadable to Spark.
    #[test]
    fn a_kept_file_of_the_old_types_is_rewritten_in_the_new_ones() {
        let (conn, _) = crate::store::open(Path::new(":memory:")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("rollup_1h").join("date=1970-01-02");
        std::fs::create_dir_all(&part).unwrap();
        let old = part.join("east.parquet");
        conn.execute_batch(&format!(
            "COPY (SELECT 'east' AS cluster, TIMESTAMP '1970-01-02 05:00:00' AS bucket_start,
                          3600 AS samples, 7::UBIGINT AS fb_used_bytes_sum,
                          5::UBIGINT AS fb_used_bytes_max, 9::UBIGINT AS fb_total_bytes_max,
                          1::UBIGINT AS nvlink_tx_bytes_sum, 2::UBIGINT AS nvlink_rx_bytes_sum)
             TO {} (FORMAT parquet)",
            path_literal(&old).unwrap()
        ))
        .unwrap();
        let report = export_with(
            &conn,
            &ExportOptions {
                db: PathBuf::new(),
                dir: dir.path().to_owned(),
                from: 86_400,
                to: 2 * 86_400,
                raw: false,
                cluster: "east".into(),
            },
        )
        .unwrap();
        assert_eq!(
            report.kept,
            [("rollup_1h".to_owned(), "1970-01-02".to_owned())]
        );
        let (t, same, bytes, n): (String, bool, String, i64) = conn
            .query_row(
                &format!(
                    "SELECT typeof(bucket_start), bucket_start = to_timestamp(86400 + 5 * 3600),
                            typeof(fb_used_bytes_max), count(*) OVER ()
                     FROM read_parquet({})",
                    path_literal(&old).unwrap()
                ),
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(t, "TIMESTAMP WITH TIME ZONE");
        assert!(same, "the same UTC instant");
        assert_eq!(bytes, "BIGINT");
        assert_eq!(n, 1);
    }
}
