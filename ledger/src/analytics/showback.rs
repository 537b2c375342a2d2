//! Showback: allocated, used and idle GPU-seconds and their cost per tenant (or workload, node,
//! GPU model, SLO class) over `[from, to)`, and the fleet's capacity, unallocated and stranded
//! GPU-seconds. Definitions: `schema/ANALYTICS.md`.
//!
//! The range is cut into whole UTC days (per-allocation day rollup, for groupings the hourly
//! tenant rollup cannot answer), whole hours (the hour rollups), whole minutes at its edges (the
//! minute rollup) and single seconds at its very edges (raw samples, which exist only for the
//! raw-retention window). Every piece is exact, so the sum is exact.

use std::collections::BTreeMap;

use duckdb::{Connection, params};

use super::Settings;
use super::fragmentation::{self, DemandMix};

/// What to group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// The tenant (the default).
    #[default]
    Tenant,
    /// Tenant and workload.
    Workload,
    /// The node.
    Node,
    /// The GPU model.
    GpuModel,
    /// The SLO class.
    SloClass,
    /// GPU model and MIG profile.
    MigProfile,
}

impl GroupBy {
    /// The row's key columns, as named in the API.
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            GroupBy::Tenant => &["tenant"],
            GroupBy::Workload => &["tenant", "workload"],
            GroupBy::Node => &["node"],
            GroupBy::GpuModel => &["gpu_model"],
            GroupBy::SloClass => &["slo_class"],
            GroupBy::MigProfile => &["gpu_model", "mig_profile"],
        }
    }

    /// SQL for the two key columns over `instances i` and `holders h` (constants: no input
    /// reaches them).
    fn keys(self) -> (&'static str, &'static str) {
        match self {
            GroupBy::Tenant => ("h.tenant", "NULL"),
            GroupBy::Workload => ("h.tenant", "h.workload"),
            GroupBy::Node => ("i.node", "NULL"),
            GroupBy::GpuModel => ("i.gpu_model", "NULL"),
            GroupBy::SloClass => ("h.slo_class", "NULL"),
            GroupBy::MigProfile => ("i.gpu_model", "i.mig_profile"),
        }
    }

    /// The same over `rollup_tenant_1h`, when it has the columns.
    fn tenant_rollup_keys(self) -> Option<(&'static str, &'static str)> {
        match self {
            GroupBy::Tenant => Some(("tenant", "NULL")),
            GroupBy::GpuModel => Some(("gpu_model", "NULL")),
            GroupBy::SloClass => Some(("slo_class", "NULL")),
            GroupBy::Workload | GroupBy::Node | GroupBy::MigProfile => None,
        }
    }
}

/// One group's figures.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Figures {
    /// Σ size over the group's samples.
    pub allocated_gpu_seconds: f64,
    /// Σ sm_active × size.
    pub used_gpu_seconds: f64,
    /// allocated − used.
    pub idle_gpu_seconds: f64,
    /// Allocated GPU-seconds whose SM activity was not measured (counted as unused).
    pub unmeasured_gpu_seconds: f64,
    /// used / allocated; null when nothing was allocated.
    pub efficiency: Option<f64>,
    /// allocated × price.
    pub cost: f64,
    /// idle × price.
    pub idle_cost: f64,
}

impl Figures {
    fn add(&mut self, allocated: f64, used: f64, measured: f64, price: f64) {
        self.allocated_gpu_seconds += allocated;
        self.used_gpu_seconds += used;
        self.unmeasured_gpu_seconds += allocated - measured;
        self.cost += allocated * price;
        self.idle_cost += (allocated - used) * price;
    }

    fn finish(&mut self) {
        self.idle_gpu_seconds = self.allocated_gpu_seconds - self.used_gpu_seconds;
        self.efficiency = (self.allocated_gpu_seconds > 0.0)
            .then(|| self.used_gpu_seconds / self.allocated_gpu_seconds);
    }
}

/// One row of the answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    /// The key columns (`tenant`, `workload`, …), in [`GroupBy::columns`] order.
    pub key: Vec<Option<String>>,
    /// Its figures.
    pub figures: Figures,
}

/// The fleet's figures over the range.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Totals {
    /// One per GPU per second it was observed.
    pub capacity_gpu_seconds: f64,
    /// Σ over every allocated sample.
    pub allocated_gpu_seconds: f64,
    /// Σ used.
    pub used_gpu_seconds: f64,
    /// allocated − used.
    pub idle_gpu_seconds: f64,
    /// capacity − allocated: unpartitioned slices and instances nobody holds.
    pub unallocated_gpu_seconds: f64,
    /// Free capacity the demand mix cannot use.
    pub stranded_gpu_seconds: f64,
    /// capacity / (GPUs seen in the range × its length): the share of GPU-seconds observed.
    pub coverage: f64,
    /// GPUs observed at least once in the range.
    pub gpus: u64,
    /// Σ cost of the rows.
    pub cost: f64,
    /// Σ idle cost of the rows.
    pub idle_cost: f64,
    /// Cost of the unallocated capacity.
    pub unallocated_cost: f64,
    /// Cost of the stranded capacity.
    pub stranded_cost: f64,
}

/// The answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Showback {
    /// Rows, ordered by key.
    pub rows: Vec<Row>,
    /// Fleet totals (for a tenant-scoped reader: only that tenant's allocated, used and cost).
    pub totals: Totals,
}

/// One row as the API, and later the pages and CSV, render it: the key columns by name, then
/// the figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RowView {
    /// `tenant`, `workload`, … → value.
    #[serde(flatten)]
    pub key: std::collections::BTreeMap<&'static str, Option<String>>,
    /// The figures.
    #[serde(flatten)]
    pub figures: Figures,
}

/// What a tenant-scoped reader sees of the totals: its own figures, no fleet-wide ones.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TenantTotals {
    /// Its allocated GPU-seconds.
    pub allocated_gpu_seconds: f64,
    /// Its used GPU-seconds.
    pub used_gpu_seconds: f64,
    /// allocated − used.
    pub idle_gpu_seconds: f64,
    /// Its cost.
    pub cost: f64,
    /// Its idle cost.
    pub idle_cost: f64,
}

/// The totals a reader may see.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum TotalsView {
    /// Every figure (viewer, admin).
    Fleet(Totals),
    /// The tenant's own (a `tenant:` token).
    Tenant(TenantTotals),
}

/// The answer of `GET /api/v1/showback`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ShowbackView {
    /// Range start.
    pub from: i64,
    /// Range end.
    pub to: i64,
    /// The grouping's last column (`tenant`, `workload`, …).
    pub group_by: Option<&'static str>,
    /// The prices' currency.
    pub currency: String,
    /// The rows (a page of them: [`ShowbackView::page`]).
    pub rows: Vec<RowView>,
    /// The totals of every row, whatever the page.
    pub totals: TotalsView,
    /// Where the next page starts (`offset=`), when there is one.
    pub next_offset: Option<usize>,
}

impl ShowbackView {
    /// The rows from `offset`, at most `limit` of them (a month by workload of a 10,000-GPU
    /// fleet is 70,000 rows); the totals still cover every row.
    pub fn page(mut self, offset: usize, limit: usize) -> ShowbackView {
        let end = offset.saturating_add(limit);
        self.next_offset = (self.rows.len() > end).then_some(end);
        self.rows.truncate(end);
        self.rows.drain(..offset.min(self.rows.len()));
        self
    }
}

impl Showback {
    /// The answer as served over `[from, to)`, grouped `by`; `tenant_scoped` withholds the
    /// fleet-wide totals.
    pub fn view(
        self,
        by: GroupBy,
        from: i64,
        to: i64,
        currency: String,
        tenant_scoped: bool,
    ) -> ShowbackView {
        let rows = self
            .rows
            .into_iter()
            .map(|r| RowView {
                key: by.columns().iter().copied().zip(r.key).collect(),
                figures: r.figures,
            })
            .collect();
        let t = self.totals;
        let totals = if tenant_scoped {
            TotalsView::Tenant(TenantTotals {
                allocated_gpu_seconds: t.allocated_gpu_seconds,
                used_gpu_seconds: t.used_gpu_seconds,
                idle_gpu_seconds: t.idle_gpu_seconds,
                cost: t.cost,
                idle_cost: t.idle_cost,
            })
        } else {
            TotalsView::Fleet(t)
        };
        ShowbackView {
            from,
            to,
            group_by: by.columns().last().copied(),
            currency,
            rows,
            totals,
            next_offset: None,
        }
    }
}

/// Why a showback cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum ShowbackError {
    /// A range edge needs raw samples that retention has removed.
    #[error(
        "{field} is not on a whole minute and raw samples before {raw_from} are gone; round it to the minute"
    )]
    RawGone {
        /// `from` or `to`.
        field: &'static str,
        /// The oldest raw second kept.
        raw_from: i64,
    },
    /// The database failed.
    #[error(transparent)]
    Db(#[from] duckdb::Error),
}

/// A piece of the range and the table that answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Raw,
    Minute,
    Hour,
    Day,
}

/// Cuts `[from, to)` into pieces answerable exactly by each table.
pub(crate) fn pieces(from: i64, to: i64) -> Vec<(Level, i64, i64)> {
    let up = |t: i64, w: i64| t.div_euclid(w) * w + if t.rem_euclid(w) == 0 { 0 } else { w };
    let down = |t: i64, w: i64| t.div_euclid(w) * w;
    let mut out = Vec::new();
    let (m0, m1) = (up(from, 60), down(to, 60));
    if m0 >= m1 {
        out.push((Level::Raw, from, to));
        return out;
    }
    let (h0, h1) = (up(from, 3600), down(to, 3600));
    let (d0, d1) = (up(from, 86400), down(to, 86400));
    out.push((Level::Raw, from, m0));
    if h0 < h1 {
        out.push((Level::Minute, m0, h0));
        if d0 < d1 {
            out.push((Level::Hour, h0, d0));
            out.push((Level::Day, d0, d1));
            out.push((Level::Hour, d1, h1));
        } else {
            out.push((Level::Hour, h0, h1));
        }
        out.push((Level::Minute, h1, m1));
    } else {
        out.push((Level::Minute, m0, m1));
    }
    out.push((Level::Raw, m1, to));
    out.retain(|(_, a, b)| a < b);
    out
}

/// (key1, key2, gpu_model, mig_profile, allocated, used, measured) per group.
type Part = (
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    f64,
    f64,
    f64,
);

/// The query for one piece. `by_profile`: the price book prices MIG profiles, so every part
/// must name its profile (the tenant rollup, which has none, is not used then).
fn group_query(level: Level, by: GroupBy, scoped: bool, by_profile: bool) -> String {
    let tenant_filter = if scoped { "AND h.tenant = ?" } else { "" };
    if matches!(level, Level::Hour | Level::Day)
        && !by_profile
        && let Some((k1, k2)) = by.tenant_rollup_keys()
    {
        let tenant_filter = if scoped { "AND tenant = ?" } else { "" };
        return format!(
            "SELECT {k1}, {k2}, gpu_model, NULL, sum(gpu_seconds), sum(used_gpu_seconds), sum(sm_measured_gpu_seconds)
             FROM rollup_tenant_1h WHERE bucket >= ? AND bucket < ? AND tenant IS NOT NULL {tenant_filter}
             GROUP BY ALL"
        );
    }
    let (k1, k2) = by.keys();
    // Summed per (instance, holder) before the dimensions are joined: a month of hourly
    // rows collapses to one row per allocation first, so the join sees far fewer rows.
    let allocations = |table: &str| {
        format!(
            "SELECT {k1}, {k2}, i.gpu_model, i.mig_profile, sum(r.samples * i.gpu_equivalents),
                    sum(r.sm_sum * i.gpu_equivalents), sum(r.sm_n * i.gpu_equivalents)
             FROM (SELECT instance_id, holder_id, sum(samples) AS samples,
                          sum(sm_active_sum) AS sm_sum, sum(sm_active_samples) AS sm_n
                   FROM {table} WHERE bucket >= ? AND bucket < ? GROUP BY ALL) r
             JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
             WHERE h.tenant IS NOT NULL {tenant_filter}
             GROUP BY ALL"
        )
    };
    match level {
        Level::Raw => format!(
            "SELECT {k1}, {k2}, i.gpu_model, i.mig_profile, sum(i.gpu_equivalents),
                    sum(coalesce(s.sm_active, 0) * i.gpu_equivalents),
                    sum(CASE WHEN s.sm_active IS NULL THEN 0 ELSE i.gpu_equivalents END)
             FROM samples_raw s JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
             WHERE s.ts >= ? AND s.ts < ? AND h.tenant IS NOT NULL {tenant_filter}
             GROUP BY ALL"
        ),
        Level::Minute => allocations("rollup_1m"),
        Level::Hour => allocations("rollup_1h"),
        Level::Day => allocations("rollup_alloc_1d"),
    }
}

/// Capacity per GPU model over a piece: (gpu_model, observed GPU-seconds).
const CAPACITY_RAW: &str = "
SELECT gpu_model, count(*) FROM (
    SELECT DISTINCT s.ts, i.gpu_uuid, i.gpu_model
    FROM samples_raw s JOIN instances i USING (instance_id) WHERE s.ts >= ? AND s.ts < ?)
GROUP BY ALL";
const CAPACITY_MINUTE: &str = "
SELECT gpu_model, sum(bit_count(mask))::BIGINT FROM (
    SELECT i.gpu_model, bit_or(r.seconds_mask) AS mask
    FROM rollup_1m r JOIN instances i USING (instance_id)
    WHERE r.bucket >= ? AND r.bucket < ? GROUP BY r.bucket, i.gpu_uuid, i.gpu_model)
GROUP BY ALL";
const CAPACITY_HOUR: &str = "
SELECT gpu_model, sum(observed_seconds)::BIGINT FROM rollup_gpu_1h
WHERE bucket >= ? AND bucket < ? GROUP BY ALL";

/// Computes the showback. `tenant`: only this tenant's rows, no fleet figures. `raw_from`: the
/// oldest second raw samples are kept for.
pub fn showback(
    conn: &Connection,
    from: i64,
    to: i64,
    by: GroupBy,
    tenant: Option<&str>,
    raw_from: i64,
    settings: &Settings,
) -> Result<Showback, ShowbackError> {
    // Cut at every price change first, so that each piece has one price per model and profile.
    let pieces: Vec<(Level, i64, i64)> = settings
        .prices
        .periods(from, to)
        .into_iter()
        .flat_map(|(a, b)| pieces(a, b))
        .collect();
    for &(level, a, _) in &pieces {
        if level == Level::Raw && a < raw_from {
            let field = if a == from { "from" } else { "to" };
            return Err(ShowbackError::RawGone { field, raw_from });
        }
    }
    let groups = group_figures(conn, &pieces, by, tenant, settings)?;
    let (rows, mut totals) = rows_and_totals(groups, by.columns().len());
    if tenant.is_some() {
        return Ok(Showback { rows, totals });
    }
    // Fleet figures: capacity per model (for its cost), then unallocated = capacity − allocated.
    let (capacity_gpu_seconds, capacity_cost) = capacity(conn, &pieces, settings)?;
    totals.capacity_gpu_seconds = capacity_gpu_seconds;
    totals.unallocated_gpu_seconds = totals.capacity_gpu_seconds - totals.allocated_gpu_seconds;
    totals.unallocated_cost = capacity_cost - totals.cost;
    (totals.stranded_gpu_seconds, totals.stranded_cost) = stranded(conn, &pieces, settings, to)?;
    let mut stmt = conn.prepare_cached(
        "SELECT count(DISTINCT gpu_uuid) FROM rollup_gpu_1h WHERE bucket >= ? AND bucket < ?",
    )?;
    totals.gpus = stmt.query_row(params![from - from.rem_euclid(3600), to], |r| {
        r.get::<_, i64>(0)
    })? as u64;
    let expected = totals.gpus as f64 * (to - from) as f64;
    totals.coverage = if expected > 0.0 {
        totals.capacity_gpu_seconds / expected
    } else {
        0.0
    };
    Ok(Showback { rows, totals })
}

/// Each group's figures over `pieces`, priced per piece (one price per model and profile in a
/// piece).
fn group_figures(
    conn: &Connection,
    pieces: &[(Level, i64, i64)],
    by: GroupBy,
    tenant: Option<&str>,
    settings: &Settings,
) -> Result<BTreeMap<(Option<String>, Option<String>), Figures>, ShowbackError> {
    let by_profile = settings.prices.has_profile_prices();
    let mut groups: BTreeMap<(Option<String>, Option<String>), Figures> = BTreeMap::new();
    for &(level, a, b) in pieces {
        let sql = group_query(level, by, tenant.is_some(), by_profile);
        let mut stmt = conn.prepare_cached(&sql)?;
        let map = |r: &duckdb::Row<'_>| -> duckdb::Result<Part> {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        };
        let parts: Vec<Part> = match tenant {
            Some(t) => stmt
                .query_map(params![a, b, t], map)?
                .collect::<Result<_, _>>()?,
            None => stmt
                .query_map(params![a, b], map)?
                .collect::<Result<_, _>>()?,
        };
        for (k1, k2, model, profile, allocated, used, measured) in parts {
            let price = settings
                .prices
                .per_gpu_second(&model, profile.as_deref(), a);
            groups
                .entry((k1, k2))
                .or_default()
                .add(allocated, used, measured, price);
        }
    }
    Ok(groups)
}

/// The rows, keyed by the first `width` group columns, and the totals of their figures.
fn rows_and_totals(
    groups: BTreeMap<(Option<String>, Option<String>), Figures>,
    width: usize,
) -> (Vec<Row>, Totals) {
    let mut totals = Totals::default();
    let rows: Vec<Row> = groups
        .into_iter()
        .map(|((k1, k2), mut figures)| {
            figures.finish();
            totals.allocated_gpu_seconds += figures.allocated_gpu_seconds;
            totals.used_gpu_seconds += figures.used_gpu_seconds;
            totals.cost += figures.cost;
            totals.idle_cost += figures.idle_cost;
            let key = [k1, k2].into_iter().take(width).collect();
            Row { key, figures }
        })
        .collect();
    totals.idle_gpu_seconds = totals.allocated_gpu_seconds - totals.used_gpu_seconds;
    (rows, totals)
}

/// The fleet's observed GPU-seconds over `pieces`, and their cost at each model's price.
fn capacity(
    conn: &Connection,
    pieces: &[(Level, i64, i64)],
    settings: &Settings,
) -> Result<(f64, f64), ShowbackError> {
    let (mut gpu_seconds, mut cost) = (0.0, 0.0);
    for &(level, a, b) in pieces {
        let sql = match level {
            Level::Raw => CAPACITY_RAW,
            Level::Minute => CAPACITY_MINUTE,
            Level::Hour | Level::Day => CAPACITY_HOUR,
        };
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map(params![a, b], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?;
        for row in rows {
            let (model, seconds) = row?;
            gpu_seconds += seconds as f64;
            cost += seconds as f64 * settings.prices.per_gpu_second(&model, None, a);
        }
    }
    Ok((gpu_seconds, cost))
}

/// Stranded GPU-seconds over `pieces`, and their cost: stored per GPU-hour for whole hours,
/// computed second by second at the edges.
fn stranded(
    conn: &Connection,
    pieces: &[(Level, i64, i64)],
    settings: &Settings,
    to: i64,
) -> Result<(f64, f64), ShowbackError> {
    let (mut stranded_gpu_seconds, mut stranded_cost) = (0.0, 0.0);
    let mut add_stranded = |model: &str, slice_seconds: f64, at: i64| {
        let gpu_seconds = slice_seconds / f64::from(gpuledger_schema::mig::SLICES_PER_GPU);
        stranded_gpu_seconds += gpu_seconds;
        stranded_cost += gpu_seconds * settings.prices.per_gpu_second(model, None, at);
    };
    let mut demand: Option<(DemandMix, super::facts::Dims)> = None;
    for &(level, a, b) in pieces {
        if matches!(level, Level::Hour | Level::Day) {
            let mut stmt = conn.prepare_cached(
                "SELECT gpu_model, sum(stranded_slice_seconds) FROM fragmentation_1h
                 WHERE bucket >= ? AND bucket < ? GROUP BY ALL",
            )?;
            let rows = stmt.query_map(params![a, b], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?))
            })?;
            for row in rows {
                let (model, s) = row?;
                add_stranded(&model, s, a);
            }
        } else {
            let (d, dims) = match &demand {
                Some(d) => d,
                None => demand.insert((
                    super::demand_mix(conn, settings, to)?,
                    super::facts::Dims::load(conn)?,
                )),
            };
            for h in fragmentation::over_range(conn, dims, a, b, d)? {
                add_stranded(&h.gpu.gpu_model, h.stranded_slice_seconds, a);
            }
        }
    }
    Ok((stranded_gpu_seconds, stranded_cost))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_cut_into_exact_pieces() {
        let h = 3600;
        assert_eq!(pieces(0, 2 * h), [(Level::Hour, 0, 2 * h)]);
        assert_eq!(
            pieces(30, 2 * h + 90),
            [
                (Level::Raw, 30, 60),
                (Level::Minute, 60, h),
                (Level::Hour, h, 2 * h),
                (Level::Minute, 2 * h, 2 * h + 60),
                (Level::Raw, 2 * h + 60, 2 * h + 90)
            ]
        );
        assert_eq!(pieces(10, 50), [(Level::Raw, 10, 50)]);
        let d = 86400;
        assert_eq!(
            pieces(d - 2 * h, 3 * d + h + 60),
            [
                (Level::Hour, d - 2 * h, d),
                (Level::Day, d, 3 * d),
                (Level::Hour, 3 * d, 3 * d + h),
                (Level::Minute, 3 * d + h, 3 * d + h + 60)
            ]
        );
        assert_eq!(pieces(60, 180), [(Level::Minute, 60, 180)]);
        // Every piece joins the next.
        for (from, to) in [
            (7, 99_999),
            (3599, 3601),
            (0, 61),
            (59, 7201),
            (5, 9 * 86400 + 7),
        ] {
            let p = pieces(from, to);
            assert_eq!(p.first().unwrap().1, from);
            assert_eq!(p.last().unwrap().2, to);
            assert!(p.windows(2).all(|w| w[0].2 == w[1].1), "{p:?}");
        }
    }
}
