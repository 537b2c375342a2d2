//! Shares of shared instances (time-sliced and MPS GPUs): what each owner used over whole UTC
//! hours, from the exporters' per-process view (`GET /api/v1/shares`), and what the bill moves
//! between tenants because of it ([`transfers`]). Definitions: `schema/ANALYTICS.md` ("Shares of
//! shared instances (`GET /api/v1/shares`)", "Money").

use std::collections::BTreeMap;

use duckdb::Connection;
use serde::Serialize;

use super::Settings;
use super::prices::CostMode;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// Per owner and instance (the default).
    #[default]
    Instance,
    /// Per tenant and workload.
    Workload,
    /// Per tenant.
    Tenant,
}

/// One owner's use over the range.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    /// Seconds the owner had a share (processes, or a held replica running nothing).
    pub share_seconds: i64,
    /// Σ processes over those seconds.
    pub process_seconds: i64,
    /// Mean framebuffer bytes over the seconds memory was known.
    pub mean_memory_used_bytes: Option<f64>,
    /// Framebuffer GiB-hours (Σ bytes × seconds / 2³⁰ / 3600).
    pub memory_gib_hours: f64,
    /// The owner's part of the instances' SM activity × their size, over attributable seconds.
    pub used_gpu_seconds: f64,
    /// Seconds whose SM split was attributable.
    pub sm_attributable_seconds: i64,
    /// Seconds whose SM split was not (MIG, MPS server, no GPM, no per-process figures).
    pub sm_unattributable_seconds: i64,
    /// Seconds whose memory was known (for the mean).
    #[serde(skip)]
    pub memory_samples: i64,
    /// Σ bytes × seconds (for the mean and the GiB-hours).
    #[serde(skip)]
    pub memory_byte_seconds: f64,
}

impl Figures {
    /// Adds another part of the same owner's use.
    pub fn add(&mut self, o: &Figures) {
        self.share_seconds += o.share_seconds;
        self.process_seconds += o.process_seconds;
        self.memory_samples += o.memory_samples;
        self.memory_byte_seconds += o.memory_byte_seconds;
        self.used_gpu_seconds += o.used_gpu_seconds;
        self.sm_attributable_seconds += o.sm_attributable_seconds;
        self.sm_unattributable_seconds += o.sm_unattributable_seconds;
        self.finish();
    }

    /// Fills in the derived figures.
    pub fn finish(&mut self) {
        self.mean_memory_used_bytes = (self.memory_samples > 0)
            .then(|| self.memory_byte_seconds / self.memory_samples as f64);
        self.memory_gib_hours = self.memory_byte_seconds / (1u64 << 30) as f64 / 3600.0;
    }
}

/// A row's key columns, by grouping.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(untagged)]
pub enum ShareKey {
    /// `group_by=instance`.
    Instance {
        /// Owner's tenant (null: processes whose owner could not be named).
        tenant: Option<String>,
        /// Owner's workload.
        workload: Option<String>,
        /// Node.
        node: String,
        /// GPU.
        gpu_uuid: String,
        /// Model.
        gpu_model: String,
        /// MIG profile, if any.
        mig_profile: Option<String>,
        /// GPU instance id (null for a whole GPU).
        gpu_instance_id: Option<i32>,
    },
    /// `group_by=workload`.
    Workload {
        /// Tenant.
        tenant: Option<String>,
        /// Workload.
        workload: Option<String>,
    },
    /// `group_by=tenant`.
    Tenant {
        /// Tenant.
        tenant: Option<String>,
    },
}

/// One row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShareRow {
    /// The key columns.
    #[serde(flatten)]
    pub key: ShareKey,
    /// The figures.
    #[serde(flatten)]
    pub figures: Figures,
}

/// The answer of `GET /api/v1/shares`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SharesView {
    /// Range start (a whole hour).
    pub from: i64,
    /// Range end (a whole hour).
    pub to: i64,
    /// The grouping.
    pub group_by: GroupBy,
    /// The rows, by key.
    pub rows: Vec<ShareRow>,
}

/// Each owner's use of shared instances over the whole hours `[from, to)`; `tenant`: only that
/// tenant's rows (bound in the query).
pub fn shares(
    conn: &Connection,
    from: i64,
    to: i64,
    by: GroupBy,
    tenant: Option<&str>,
) -> duckdb::Result<SharesView> {
    let mut stmt = conn.prepare_cached(SHARES)?;
    let mut grouped: BTreeMap<ShareKey, Figures> = BTreeMap::new();
    let mut query = stmt.query(duckdb::params![from, to, tenant, tenant])?;
    while let Some(r) = query.next()? {
        let (tenant, workload): (Option<String>, Option<String>) = (r.get(0)?, r.get(1)?);
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
        let key = match by {
            GroupBy::Instance => ShareKey::Instance {
                tenant,
                workload,
                node: r.get(2)?,
                gpu_uuid: r.get(3)?,
                gpu_model: r.get(4)?,
                mig_profile: r.get(5)?,
                // The ledger stores a whole GPU's instance id as -1.
                gpu_instance_id: r.get::<_, Option<i32>>(6)?.filter(|g| *g >= 0),
            },
            GroupBy::Workload => ShareKey::Workload { tenant, workload },
            GroupBy::Tenant => ShareKey::Tenant { tenant },
        };
        grouped.entry(key).or_default().add(&f);
    }
    Ok(SharesView {
        from,
        to,
        group_by: by,
        rows: grouped
            .into_iter()
            .map(|(key, figures)| ShareRow { key, figures })
            .collect(),
    })
}

/// Part of a shared instance's charge that moves from the tenant holding it in the ledger to a
/// tenant that measurably used it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    /// The holder's tenant (charged in the ledger).
    pub from: String,
    /// The co-user's tenant.
    pub to: String,
    /// The amount, in the currency (not rounded).
    pub amount: f64,
}

/// Per instance-hour of a shared instance: the ledger's holders with what they are charged
/// (allocated samples, Σ SM activity) and the share owners with their weights.
const SHARED_HOURS: &str = "
WITH s AS (
    SELECT r.bucket, r.instance_id, h.tenant AS owner, sum(r.sm_active_sum) AS sm,
           sum(r.process_seconds)::DOUBLE AS ps, sum(r.seconds)::DOUBLE AS secs
    FROM rollup_share_1h r JOIN holders h USING (holder_id)
    WHERE r.bucket >= ? AND r.bucket < ?
    GROUP BY ALL),
l AS (
    SELECT r.bucket, r.instance_id, h.tenant AS holder, sum(r.samples)::DOUBLE AS samples,
           sum(r.sm_active_sum) AS sm_sum
    FROM rollup_1h r JOIN holders h USING (holder_id)
    WHERE r.bucket >= ? AND r.bucket < ? AND h.tenant IS NOT NULL
      AND (r.bucket, r.instance_id) IN (SELECT bucket, instance_id FROM s)
    GROUP BY ALL)
SELECT l.bucket, l.instance_id, i.gpu_model, i.mig_profile, i.gpu_equivalents, l.holder,
       l.samples, l.sm_sum, s.owner, s.sm, s.ps, s.secs
FROM l JOIN s USING (bucket, instance_id) JOIN instances i USING (instance_id)
ORDER BY l.bucket, l.instance_id, l.holder, s.owner NULLS LAST";

/// What the bill moves between tenants for shared instances over the whole hours inside
/// `[from, to)`: each holder's charge for an instance-hour (its allocated, or in usage mode its
/// used, GPU-seconds × price) is split among the instance's owners in that hour by their
/// measured SM activity; by process-seconds when no SM split was measured; by share seconds
/// when no process ran. An owner that could not be named keeps its part with the holder.
pub fn transfers(
    conn: &Connection,
    from: i64,
    to: i64,
    mode: CostMode,
    settings: &Settings,
) -> duckdb::Result<Vec<Transfer>> {
    let (h0, h1) = (
        from + (3600 - from.rem_euclid(3600)) % 3600,
        to - to.rem_euclid(3600),
    );
    if h0 >= h1 {
        return Ok(Vec::new());
    }
    type Owner = (Option<String>, f64, f64, f64);
    // (bucket, instance) → (model, profile, size, holders: holder → (samples, sm_sum), owners)
    type Hour = (
        String,
        Option<String>,
        f64,
        BTreeMap<String, (f64, f64)>,
        BTreeMap<Option<String>, Owner>,
    );
    let mut hours: BTreeMap<(i64, i32), Hour> = BTreeMap::new();
    let mut stmt = conn.prepare_cached(SHARED_HOURS)?;
    let mut rows = stmt.query(duckdb::params![h0, h1, h0, h1])?;
    while let Some(r) = rows.next()? {
        let e = hours
            .entry((r.get(0)?, r.get(1)?))
            .or_insert_with(Default::default);
        e.0 = r.get(2)?;
        e.1 = r.get(3)?;
        e.2 = r.get(4)?;
        let holder: String = r.get(5)?;
        e.3.insert(holder, (r.get(6)?, r.get(7)?));
        let owner: Option<String> = r.get(8)?;
        e.4.insert(owner.clone(), (owner, r.get(9)?, r.get(10)?, r.get(11)?));
    }
    let mut out: BTreeMap<(String, String), f64> = BTreeMap::new();
    for ((bucket, _), (model, profile, size, holders, owners)) in hours {
        let owners: Vec<&Owner> = owners.values().collect();
        let pick = |f: fn(&Owner) -> f64| -> Option<Vec<f64>> {
            let w: Vec<f64> = owners.iter().map(|o| f(o).max(0.0)).collect();
            (w.iter().sum::<f64>() > 0.0).then_some(w)
        };
        let Some(weights) = pick(|o| o.1)
            .or_else(|| pick(|o| o.2))
            .or_else(|| pick(|o| o.3))
        else {
            continue;
        };
        let total: f64 = weights.iter().sum();
        let price = settings
            .prices
            .per_gpu_second(&model, profile.as_deref(), bucket);
        for (holder, (samples, sm_sum)) in &holders {
            let charge = match mode {
                CostMode::Allocation => samples * size * price,
                CostMode::Usage => sm_sum * size * price,
            };
            for (o, w) in owners.iter().zip(&weights) {
                if let Some(to) = &o.0
                    && to != holder
                    && *w > 0.0
                {
                    *out.entry((holder.clone(), to.clone())).or_default() += charge * w / total;
                }
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|((from, to), amount)| Transfer { from, to, amount })
        .collect())
}
