//! `GET /api/v1/shares?from=&to=&group_by=instance|workload|tenant`: what each owner used of
//! shared instances (time-sliced and MPS GPUs) over whole UTC hours, from the exporters'
//! per-process view. It sits beside the ledger: showback charges an instance to its holder; this
//! says how the holders and co-users of a shared instance actually used it, so finance can split
//! that charge by use. Definitions: `schema/ANALYTICS.md` ("Shares of shared instances").

use std::collections::{BTreeMap, HashMap};

use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use serde::Serialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::showback::only_params;
use super::{AppState, time_param};

/// Per owner and shared instance over `[from, to)`; the tenant filter is bound, never spliced.
const SHARES: &str = "
SELECT h.tenant, h.workload, i.node, i.gpu_uuid, i.gpu_model, i.mig_profile, i.gpu_instance_id,
       i.gpu_equivalents,
       sum(r.seconds)::BIGINT, sum(r.process_seconds)::BIGINT, sum(r.memory_samples)::BIGINT,
       sum(r.memory_byte_seconds)::DOUBLE, sum(r.sm_active_samples)::BIGINT,
       sum(r.sm_active_sum)::DOUBLE
FROM rollup_share_1h r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
WHERE r.bucket >= ? AND r.bucket < ? AND (?::VARCHAR IS NULL OR h.tenant = ?)
GROUP BY ALL
ORDER BY h.tenant NULLS LAST, h.workload NULLS LAST, i.node, i.gpu_uuid, i.gpu_instance_id";

/// How rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupBy {
    Instance,
    Workload,
    Tenant,
}

/// One owner's use over the range.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
struct Figures {
    /// Seconds the owner had a share (processes, or a held replica running nothing).
    share_seconds: i64,
    /// Σ processes over those seconds.
    process_seconds: i64,
    /// Mean framebuffer bytes over the seconds memory was known.
    mean_memory_used_bytes: Option<f64>,
    /// Framebuffer GiB-hours (Σ bytes × seconds / 2³⁰ / 3600).
    memory_gib_hours: f64,
    /// The owner's part of the instances' SM activity × their size, over attributable seconds.
    used_gpu_seconds: f64,
    /// Seconds whose SM split was attributable.
    sm_attributable_seconds: i64,
    /// Seconds whose SM split was not (MIG, MPS server, no GPM, no per-process figures).
    sm_unattributable_seconds: i64,
    #[serde(skip)]
    memory_samples: i64,
    #[serde(skip)]
    memory_byte_seconds: f64,
}

impl Figures {
    fn add(&mut self, o: &Figures) {
        self.share_seconds += o.share_seconds;
        self.process_seconds += o.process_seconds;
        self.memory_samples += o.memory_samples;
        self.memory_byte_seconds += o.memory_byte_seconds;
        self.used_gpu_seconds += o.used_gpu_seconds;
        self.sm_attributable_seconds += o.sm_attributable_seconds;
        self.sm_unattributable_seconds += o.sm_unattributable_seconds;
        self.finish();
    }

    fn finish(&mut self) {
        self.mean_memory_used_bytes = (self.memory_samples > 0)
            .then(|| self.memory_byte_seconds / self.memory_samples as f64);
        self.memory_gib_hours = self.memory_byte_seconds / (1u64 << 30) as f64 / 3600.0;
    }
}

fn whole_hour(name: &'static str, t: i64) -> Result<i64, ApiError> {
    if t.rem_euclid(3600) != 0 {
        return Err(ApiError::bad_request(
            name,
            format!("{t} is not on a whole UTC hour: shares are kept per hour"),
        ));
    }
    Ok(t)
}

/// The handler.
pub async fn shares(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let role = app.tokens.authenticate(&headers)?;
    let tenant = role.read_scope()?.map(str::to_owned);
    only_params(&q, &["from", "to", "group_by"])?;
    let by = match q.get("group_by").map(String::as_str) {
        None | Some("instance") => GroupBy::Instance,
        Some("workload") => GroupBy::Workload,
        Some("tenant") => GroupBy::Tenant,
        Some(s) => {
            return Err(ApiError::bad_request(
                "group_by",
                format!("{s:?} is not one of instance, workload, tenant"),
            ));
        }
    };
    let now = chrono::Utc::now().timestamp();
    let to = match time_param("to", q.get("to").map(String::as_str))? {
        Some(t) => whole_hour("to", t)?,
        None => now - now.rem_euclid(3600),
    };
    let from = match time_param("from", q.get("from").map(String::as_str))? {
        Some(f) => whole_hour("from", f)?,
        None => to - 24 * 3600,
    };
    if from >= to {
        return Err(ApiError::bad_request(
            "from",
            format!("from ({from}) must be before to ({to})"),
        ));
    }
    let conn = app.readers.connect().map_err(|e| ApiError::internal(&e))?;
    let scope = tenant.clone();
    let rows = tokio::task::spawn_blocking(move || -> duckdb::Result<Vec<Value>> {
        let mut stmt = conn.prepare(SHARES)?;
        let mut grouped: BTreeMap<Vec<Option<String>>, (Value, Figures)> = BTreeMap::new();
        let mut query = stmt.query(duckdb::params![from, to, scope, scope])?;
        while let Some(r) = query.next()? {
            let (tenant, workload): (Option<String>, Option<String>) = (r.get(0)?, r.get(1)?);
            let (node, gpu_uuid, gpu_model): (String, String, String) =
                (r.get(2)?, r.get(3)?, r.get(4)?);
            let (mig_profile, gpu_instance_id): (Option<String>, Option<i32>) =
                (r.get(5)?, r.get(6)?);
            let size: f64 = r.get(7)?;
            let seconds: i64 = r.get(8)?;
            let sm_samples: i64 = r.get(12)?;
            let mut f = Figures {
                share_seconds: seconds,
                process_seconds: r.get(9)?,
                memory_samples: r.get(10)?,
                memory_byte_seconds: r.get(11)?,
                used_gpu_seconds: r.get::<_, f64>(13)? * size,
                sm_attributable_seconds: sm_samples,
                sm_unattributable_seconds: seconds - sm_samples,
                ..Figures::default()
            };
            f.finish();
            // The ledger stores a whole GPU's instance id as -1.
            let gi = gpu_instance_id.filter(|g| *g >= 0);
            let (key, head) = match by {
                GroupBy::Instance => (
                    vec![
                        tenant.clone(),
                        workload.clone(),
                        Some(node.clone()),
                        Some(gpu_uuid.clone()),
                        gi.map(|g| g.to_string()),
                    ],
                    json!({"tenant": tenant, "workload": workload, "node": node,
                           "gpu_uuid": gpu_uuid, "gpu_model": gpu_model,
                           "mig_profile": mig_profile, "gpu_instance_id": gi}),
                ),
                GroupBy::Workload => (
                    vec![tenant.clone(), workload.clone()],
                    json!({"tenant": tenant, "workload": workload}),
                ),
                GroupBy::Tenant => (vec![tenant.clone()], json!({"tenant": tenant})),
            };
            grouped
                .entry(key)
                .or_insert_with(|| (head, Figures::default()))
                .1
                .add(&f);
        }
        Ok(grouped
            .into_values()
            .map(|(mut head, f)| {
                if let (Value::Object(h), Value::Object(figures)) = (&mut head, json!(f)) {
                    h.extend(figures);
                }
                head
            })
            .collect())
    })
    .await
    .map_err(|e| ApiError::internal(&e))?
    .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(json!({
        "from": from,
        "to": to,
        "group_by": match by {
            GroupBy::Instance => "instance",
            GroupBy::Workload => "workload",
            GroupBy::Tenant => "tenant",
        },
        "rows": rows,
    })))
}
