//! `gpuledger export`: the ledger as Hive-partitioned Parquet (`<dir>/<table>/date=YYYY-MM-DD/`),
//! the way past one machine: each cluster's aggregator exports into one shared directory and
//! DuckDB, Trino or Spark query all of them at once
//! (`read_parquet('<dir>/rollup_1h/*/*.parquet', hive_partitioning = true)`).
//!
//! Rows are denormalised (node, GPU, profile, tenant, … inline, no ids) and carry a `cluster`
//! column; file names start with the cluster name and a UUID, so exports of several ledgers, or
//! repeated exports of new ranges, never overwrite each other. Exporting the same range of the
//! same ledger twice does duplicate it: export each range once.

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

/// Rows written per table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// (table, rows).
    pub tables: Vec<(&'static str, u64)>,
}

const DIMENSIONS: &str = "i.node, i.gpu_uuid, i.gpu_model, i.mig_profile,
    CASE WHEN i.gpu_instance_id < 0 THEN NULL ELSE i.gpu_instance_id END AS gpu_instance_id,
    i.placement_start, i.placement_size, i.gpu_equivalents, h.tenant, h.workload, h.slo_class";

/// (table, the SELECT); its parameters are cluster, from, to, in that order.
fn selects(raw: bool) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for table in ["rollup_1h", "rollup_1m"] {
        out.push((
            table,
            format!(
                "SELECT CAST(? AS VARCHAR) AS cluster, CAST(epoch_ms(r.bucket * 1000) AS DATE) AS date,
                        epoch_ms(r.bucket * 1000) AS bucket_start, {DIMENSIONS},
                        r.* EXCLUDE (bucket, instance_id, holder_id)
                 FROM {table} r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
                 WHERE r.bucket >= ? AND r.bucket < ?"
            ),
        ));
    }
    out.push((
        "rollup_tenant_1h",
        "SELECT CAST(? AS VARCHAR) AS cluster, CAST(epoch_ms(bucket * 1000) AS DATE) AS date,
                epoch_ms(bucket * 1000) AS bucket_start, * EXCLUDE (bucket)
         FROM rollup_tenant_1h WHERE bucket >= ? AND bucket < ?"
            .to_owned(),
    ));
    // Capacity: the seconds each GPU was observed, per hour (showback's capacity and coverage).
    out.push((
        "rollup_gpu_1h",
        "SELECT CAST(? AS VARCHAR) AS cluster, CAST(epoch_ms(bucket * 1000) AS DATE) AS date,
                epoch_ms(bucket * 1000) AS bucket_start, * EXCLUDE (bucket)
         FROM rollup_gpu_1h WHERE bucket >= ? AND bucket < ?"
            .to_owned(),
    ));
    if raw {
        out.push((
            "samples_raw",
            format!(
                "SELECT CAST(? AS VARCHAR) AS cluster, CAST(epoch_ms(r.ts * 1000) AS DATE) AS date,
                        epoch_ms(r.ts * 1000) AS ts, {DIMENSIONS},
                        r.* EXCLUDE (ts, instance_id, holder_id)
                 FROM samples_raw r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
                 WHERE r.ts >= ? AND r.ts < ?"
            ),
        ));
    }
    out
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

/// Runs an export.
pub fn export(opts: &ExportOptions) -> Result<ExportReport, ExportError> {
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
            message: "must be before --to".into(),
        });
    }
    if !opts.db.exists() {
        return Err(ExportError::Option {
            field: "db",
            message: format!("{} does not exist", opts.db.display()),
        });
    }
    std::fs::create_dir_all(&opts.dir).map_err(|e| ExportError::Option {
        field: "parquet",
        message: format!("cannot create {}: {e}", opts.dir.display()),
    })?;
    let conn = Connection::open_with_flags(
        &opts.db,
        Config::default().access_mode(AccessMode::ReadOnly)?,
    )?;
    let mut report = ExportReport::default();
    for (table, select) in selects(opts.raw) {
        conn.execute_batch("DROP TABLE IF EXISTS temp.export_rows")?;
        let n = conn.execute(
            &format!("CREATE TEMP TABLE export_rows AS {select}"),
            duckdb::params![opts.cluster, opts.from, opts.to],
        )?;
        let target = path_literal(&opts.dir.join(table))?;
        // The file pattern is built from the checked cluster name only.
        conn.execute_batch(&format!(
            "COPY temp.export_rows TO {target} (FORMAT parquet, PARTITION_BY (date), \
             FILENAME_PATTERN '{}_{{uuid}}', OVERWRITE_OR_IGNORE)",
            opts.cluster
        ))?;
        report.tables.push((table, n as u64));
    }
    Ok(report)
}
