//! `POST /api/v1/export` (admin): `gpuledger export` inside the running aggregator, so that a
//! monthly export does not mean stopping the ledger (the DuckDB file has one process's lock).
//!
//! The export runs on a reader connection (one snapshot) into the directory the operator set with
//! `--export-dir` (`export_dir` in the config file); a request names only the range, whether raw
//! samples go too, and the cluster name, never a path. Without `export_dir` the endpoint answers
//! 409 naming it. See `gpuledger_ledger::export` for the files it writes (whole UTC days, one file per
//! table, day and cluster, replaced by a later export of the same day).

use axum::Json;
use axum::extract::State;

use super::AppState;
use super::extract::Admin;
use super::params::time_param;
use crate::error::ApiError;
use gpuledger_ledger::export::{ExportError, ExportOptions, ExportReport};

/// What a client asks for.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    /// Start of the range (RFC 3339 or Unix seconds), inclusive; widened to its UTC day.
    pub from: String,
    /// End of the range, exclusive; widened to the end of its UTC day.
    pub to: String,
    /// Also export the raw 1 s samples still in the raw window.
    #[serde(default)]
    pub raw: bool,
    /// The cluster name in every row and file name [default: the ledger file's stem].
    pub cluster: Option<String>,
}

/// `POST /api/v1/export`.
pub async fn export(
    State(app): State<AppState>,
    _: Admin,
    super::extract::Json(req): super::extract::Json<ExportRequest>,
) -> Result<Json<ExportReport>, ApiError> {
    let Some(dir) = app.config.export_dir.clone() else {
        return Err(ApiError::status(
            axum::http::StatusCode::CONFLICT,
            "export_dir: this aggregator has no export directory; start it with --export-dir (export_dir in the config file)",
        ));
    };
    let from = time_param("from", Some(&req.from))?.unwrap_or_default();
    let to = time_param("to", Some(&req.to))?.unwrap_or_default();
    let cluster = req.cluster.unwrap_or_else(|| {
        app.config
            .db
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ledger".into())
    });
    let opts = ExportOptions {
        db: app.config.db.clone(),
        dir,
        from,
        to,
        raw: req.raw,
        cluster,
    };
    gpuledger_ledger::export::check(&opts).map_err(|e| match e {
        ExportError::Option { field, message } => ApiError::bad_request(field, message),
        other => ApiError::internal(&other),
    })?;
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let report =
        tokio::task::spawn_blocking(move || gpuledger_ledger::export::export_with(&conn, &opts))
            .await
            .map_err(|e| ApiError::internal(&e))?
            .map_err(|e| match e {
                ExportError::Option { field, message } => ApiError::unprocessable(
                    if field == "parquet" {
                        "export_dir"
                    } else {
                        field
                    },
                    message,
                ),
                other => ApiError::internal(&other),
            })?;
    tracing::info!(
        from = report.from,
        to = report.to,
        files = report.files,
        "Exported the ledger to Parquet."
    );
    Ok(Json(report))
}
