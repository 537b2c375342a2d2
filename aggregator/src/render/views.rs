//! The analytics values as tables: one function per value, used by the pages and by the CSV
//! exports alike (so a page and its CSV are one rendering apart, never two computations).

use gpuledger_web::{Cell, Column, Table};

use gpuledger_ledger::analytics::EpisodeRow;
use gpuledger_ledger::analytics::bill::{Bill, Money};
use gpuledger_ledger::analytics::fleet::{AdviceView, FragmentationAt, ModelAt, NodeAt};
use gpuledger_ledger::analytics::prices::PriceInForce;
use gpuledger_ledger::analytics::showback::ShowbackView;
use gpuledger_ledger::analytics::trend::Day;

/// Everything but RFC 3986's unreserved characters.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A path segment or query value, percent-encoded (a tenant's name in `/tenants/{tenant}`).
pub fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

/// A tenant's name, linking to its page for the same period.
fn tenant_link(name: &str, query: &str) -> Cell {
    Cell::link(
        name.to_owned(),
        format!("/tenants/{}?{query}", segment(name)),
    )
}

fn money(m: Money) -> Cell {
    Cell::money(m.to_string(), m.0)
}

fn opt_money(m: Option<Money>) -> Cell {
    m.map_or(Cell::Empty, money)
}

fn opt_hours(h: Option<f64>) -> Cell {
    h.map_or(Cell::Empty, Cell::hours)
}

/// The bill's lines, one per tenant, with a totals row; `query` is the period's, kept on the
/// tenant links.
pub fn bill_lines(bill: &Bill, query: &str) -> Table {
    let mut t = Table::new(
        "bill",
        vec![
            Column::text("tenant", "Tenant"),
            Column::text("team", "Team"),
            Column::text("org", "Org"),
            Column::number("allocated_gpu_hours", "Allocated GPU-h"),
            Column::number("used_gpu_hours", "Used GPU-h"),
            Column::number("idle_gpu_hours", "Idle GPU-h"),
            Column::number("efficiency", "Efficiency"),
            Column::number("cost", "Cost"),
            Column::number("shared_gpu_transfer", "of which shared GPUs"),
            Column::number("idle_cost", "Idle cost"),
            Column::number("shared_overhead", "Shared overhead"),
            Column::number("total", "Total"),
            Column::number("budget", "Budget"),
            Column::number("budget_used", "Budget used"),
        ],
    );
    let (mut a, mut u, mut i) = (0.0, 0.0, 0.0);
    let (mut cost, mut idle, mut shared, mut total) = (Money(0), Money(0), Money(0), Money(0));
    for l in &bill.lines {
        a += l.allocated_gpu_hours;
        u += l.used_gpu_hours;
        i += l.idle_gpu_hours;
        cost = cost + l.cost;
        idle = idle + l.idle_cost;
        shared = shared + l.shared_overhead;
        total = total + l.total;
        t.rows.push(vec![
            tenant_link(&l.tenant, query),
            Cell::opt_text(l.team.clone()),
            Cell::opt_text(l.org.clone()),
            Cell::hours(l.allocated_gpu_hours),
            Cell::hours(l.used_gpu_hours),
            Cell::hours(l.idle_gpu_hours),
            Cell::ratio(l.efficiency),
            money(l.cost),
            money(l.shared_gpu_transfer),
            money(l.idle_cost),
            money(l.shared_overhead),
            money(l.total),
            opt_money(l.budget),
            Cell::ratio(l.budget_used),
        ]);
    }
    t.footer = Some(vec![
        Cell::text("All tenants"),
        Cell::Empty,
        Cell::Empty,
        Cell::hours(a),
        Cell::hours(u),
        Cell::hours(i),
        Cell::ratio((a > 0.0).then(|| u / a)),
        money(cost),
        Cell::Empty,
        money(idle),
        money(shared),
        money(total),
        Cell::Empty,
        Cell::Empty,
    ]);
    t
}

/// How the bill reconciles: Σ tenants + overhead = fleet cost (viewers only).
pub fn reconciliation(bill: &Bill) -> Option<Table> {
    let (o, fleet) = (bill.overhead.as_ref()?, bill.fleet_cost?);
    let tenants: Money = bill.lines.iter().map(|l| l.total).sum();
    let mut t = Table::new(
        "reconciliation",
        vec![
            Column::text("line", "Line"),
            Column::number("gpu_hours", "GPU-h"),
            Column::number("amount", "Amount"),
        ],
    );
    let allocated: f64 = bill.lines.iter().map(|l| l.allocated_gpu_hours).sum();
    t.rows = vec![
        vec![
            Cell::text("Overhead: capacity nobody held"),
            Cell::hours(o.unallocated_gpu_hours),
            money(o.unallocated_cost),
        ],
        vec![
            Cell::text("    of which stranded by MIG layouts"),
            Cell::hours(o.stranded_gpu_hours),
            money(o.stranded_cost),
        ],
        vec![
            Cell::text("Overhead: holders' idle (usage mode)"),
            Cell::Empty,
            money(o.holders_idle_cost),
        ],
        vec![
            Cell::text("Overhead shared out to tenants"),
            Cell::Empty,
            money(Money(-o.shared_out.0)),
        ],
        vec![
            Cell::text("Platform overhead line"),
            Cell::Empty,
            money(o.total),
        ],
        vec![
            Cell::text("Tenants (Σ totals)"),
            Cell::hours(allocated),
            money(tenants),
        ],
        vec![
            Cell::text("Fleet cost"),
            opt_hours(bill.capacity_gpu_hours),
            money(fleet),
        ],
    ];
    Some(t)
}

/// Sub-totals per org and team.
pub fn rollups(bill: &Bill) -> Table {
    let mut t = Table::new(
        "teams",
        vec![
            Column::text("org", "Org"),
            Column::text("team", "Team"),
            Column::number("tenants", "Tenants"),
            Column::number("allocated_gpu_hours", "Allocated GPU-h"),
            Column::number("used_gpu_hours", "Used GPU-h"),
            Column::number("total", "Total"),
            Column::number("budget", "Budget"),
        ],
    );
    for r in &bill.rollups {
        t.rows.push(vec![
            Cell::text(r.org.clone().unwrap_or_else(|| "(no org)".into())),
            Cell::text(r.team.clone().unwrap_or_else(|| "(all teams)".into())),
            Cell::count(r.tenants as i64),
            Cell::hours(r.allocated_gpu_hours),
            Cell::hours(r.used_gpu_hours),
            money(r.total),
            opt_money(r.budget),
        ]);
    }
    t
}

/// Daily figures.
pub fn trend(days: &[Day], fleet: bool) -> Table {
    let mut cols = vec![
        Column::text("day", "Day"),
        Column::number("allocated_gpu_hours", "Allocated GPU-h"),
        Column::number("used_gpu_hours", "Used GPU-h"),
    ];
    if fleet {
        cols.push(Column::number("capacity_gpu_hours", "Capacity GPU-h"));
        cols.push(Column::number("stranded_gpu_hours", "Stranded GPU-h"));
    }
    let mut t = Table::new("daily", cols);
    for d in days {
        let mut row = vec![
            Cell::text(day_label(d.day)),
            Cell::hours(d.allocated_gpu_hours),
            Cell::hours(d.used_gpu_hours),
        ];
        if fleet {
            row.push(opt_hours(d.capacity_gpu_hours));
            row.push(opt_hours(d.stranded_gpu_hours));
        }
        t.rows.push(row);
    }
    t
}

/// A tenant's own cost summed day by day over the month, beside its budget (the tenant page's
/// budget chart).
pub fn cumulative_cost(days: &[(i64, f64)], budget: f64) -> Table {
    let mut t = Table::new(
        "budget",
        vec![
            Column::text("day", "Day"),
            Column::number("cost_to_date", "Cost to date"),
            Column::number("budget", "Budget"),
        ],
    );
    for &(day, cost) in days {
        let cents = (cost * 100.0).round() as i64;
        t.rows.push(vec![
            Cell::text(day_label(day)),
            money(Money(cents)),
            money(Money((budget * 100.0).round() as i64)),
        ]);
    }
    t
}

/// `2026-11-05`.
pub fn day_label(t: i64) -> String {
    chrono::DateTime::from_timestamp(t, 0)
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

/// The exemptions in force: who made each (`admin`, `tenant:…`, `link`) and until when.
pub fn exemptions(rows: &[gpuledger_ledger::reclaim::records::Exemption]) -> Table {
    let mut t = Table::new(
        "exemptions",
        vec![
            Column::text("tenant", "Tenant"),
            Column::text("workload", "Workload"),
            Column::number("until", "Until"),
            Column::text("reason", "Reason"),
            Column::text("created_by", "By"),
        ],
    );
    for e in rows {
        t.rows.push(vec![
            Cell::opt_text(e.tenant.clone()),
            Cell::opt_text(e.workload.clone()),
            Cell::time(Some(e.until)),
            Cell::text(e.reason.clone()),
            Cell::text(e.created_by.clone()),
        ]);
    }
    t
}

/// Hoarding episodes with their idle cost.
pub fn episodes(rows: &[EpisodeRow], id: &'static str, query: &str) -> Table {
    let mut t = Table::new(
        id,
        vec![
            Column::text("tenant", "Tenant"),
            Column::text("workload", "Workload"),
            Column::text("owner", "Owner"),
            Column::text("slo_class", "Class"),
            Column::text("node", "Node"),
            Column::text("gpu_uuid", "GPU"),
            Column::text("mig_profile", "Profile"),
            Column::number("started_at", "Idle since"),
            Column::number("ended_at", "Ended"),
            Column::number("idle_gpu_hours", "Idle GPU-h"),
            Column::number("mean_sm_active", "Mean SM"),
            Column::number("idle_cost", "Idle cost"),
        ],
    );
    for e in rows {
        t.rows.push(vec![
            match &e.tenant {
                Some(x) => tenant_link(x, query),
                None => Cell::Empty,
            },
            Cell::opt_text(e.workload.clone()),
            // As the exporter's attribution sent it: `alice (Account/physics)`.
            Cell::opt_text(match (&e.owner, &e.owner_ref) {
                (Some(o), Some(r)) => Some(format!("{o} ({r})")),
                (o, r) => o.clone().or_else(|| r.clone()),
            }),
            Cell::opt_text(e.slo_class.clone()),
            Cell::text(e.node.clone()),
            Cell::text(e.gpu_uuid.clone()),
            Cell::opt_text(e.mig_profile.clone()),
            Cell::time(Some(e.started_at)),
            Cell::time(e.ended_at),
            Cell::hours(e.idle_gpu_seconds / 3600.0),
            Cell::ratio(e.mean_sm_active),
            money(Money::round(e.cost)),
        ]);
    }
    t
}

/// How a showback key column is headed on a page (its CSV name stays the API's).
fn key_label(k: &'static str) -> &'static str {
    match k {
        "tenant" => "Tenant",
        "workload" => "Workload",
        "node" => "Node",
        "gpu_model" => "GPU model",
        "mig_profile" => "MIG profile",
        "slo_class" => "SLO class",
        // A new key column is headed by its API name until it is given a label here.
        other => other,
    }
}

/// A showback answer (any grouping): the key columns, then the figures. The CSV of
/// `GET /api/v1/showback.csv`.
pub fn showback(v: &ShowbackView, id: &'static str) -> Table {
    let keys: Vec<&'static str> = v
        .rows
        .first()
        .map(|r| r.key.keys().copied().collect())
        .unwrap_or_else(|| v.group_by.into_iter().collect());
    let mut cols: Vec<Column> = keys.iter().map(|k| Column::text(k, key_label(k))).collect();
    cols.extend([
        Column::number("allocated_gpu_seconds", "Allocated GPU-s"),
        Column::number("used_gpu_seconds", "Used GPU-s"),
        Column::number("idle_gpu_seconds", "Idle GPU-s"),
        Column::number("unmeasured_gpu_seconds", "Unmeasured GPU-s"),
        Column::number("efficiency", "Efficiency"),
        Column::number("cost", "Cost"),
        Column::number("idle_cost", "Idle cost"),
    ]);
    let mut t = Table::new(id, cols);
    let num = |x: f64| Cell::Number {
        value: x.to_string(),
        shown: format!("{x:.0}"),
        key: x,
    };
    for r in &v.rows {
        let f = &r.figures;
        let mut row: Vec<Cell> = keys
            .iter()
            .map(|k| Cell::opt_text(r.key.get(k).cloned().flatten()))
            .collect();
        row.extend([
            num(f.allocated_gpu_seconds),
            num(f.used_gpu_seconds),
            num(f.idle_gpu_seconds),
            num(f.unmeasured_gpu_seconds),
            Cell::ratio(f.efficiency),
            num(f.cost),
            num(f.idle_cost),
        ]);
        t.rows.push(row);
    }
    t
}

/// A showback answer in GPU-hours and money, for the pages.
pub fn breakdown(v: &ShowbackView, id: &'static str) -> Table {
    let keys: Vec<&'static str> = v
        .rows
        .first()
        .map(|r| r.key.keys().copied().collect())
        .unwrap_or_default();
    let mut cols: Vec<Column> = keys.iter().map(|k| Column::text(k, key_label(k))).collect();
    cols.extend([
        Column::number("allocated_gpu_hours", "Allocated GPU-h"),
        Column::number("used_gpu_hours", "Used GPU-h"),
        Column::number("idle_gpu_hours", "Idle GPU-h"),
        Column::number("efficiency", "Efficiency"),
        Column::number("cost", "Cost"),
        Column::number("idle_cost", "Idle cost"),
    ]);
    let mut t = Table::new(id, cols);
    for r in &v.rows {
        let f = &r.figures;
        let mut row: Vec<Cell> = keys
            .iter()
            .map(|k| Cell::opt_text(r.key.get(k).cloned().flatten()))
            .collect();
        row.extend([
            Cell::hours(f.allocated_gpu_seconds / 3600.0),
            Cell::hours(f.used_gpu_seconds / 3600.0),
            Cell::hours(f.idle_gpu_seconds / 3600.0),
            Cell::ratio(f.efficiency),
            money(Money::round(f.cost)),
            money(Money::round(f.idle_cost)),
        ]);
        t.rows.push(row);
    }
    t
}

/// The prices in force.
pub fn prices(rows: &[PriceInForce]) -> Table {
    let mut t = Table::new(
        "prices",
        vec![
            Column::text("gpu_model", "GPU model"),
            Column::text("mig_profile", "MIG profile"),
            Column::number("per_hour", "Price per hour"),
            Column::number("per_gpu_hour", "Per GPU-hour"),
            Column::number("from", "In force from"),
            Column::number("to", "Until"),
        ],
    );
    for p in rows {
        let price = |x: f64| Cell::Number {
            value: x.to_string(),
            shown: format!("{x:.4}"),
            key: x,
        };
        t.rows.push(vec![
            Cell::text(p.gpu_model.clone()),
            Cell::text(p.mig_profile.clone().unwrap_or_else(|| "(per GPU)".into())),
            price(p.per_hour),
            price(p.per_gpu_hour),
            Cell::time(Some(p.from)),
            Cell::time(Some(p.to)),
        ]);
    }
    t
}

/// Reclaim decisions (notices, requests, holds, cancellations), newest first.
pub fn reclaims(rows: &[gpuledger_ledger::reclaim::records::Decision]) -> Table {
    let mut t = Table::new(
        "reclaims",
        vec![
            Column::number("decided_at", "Decided"),
            Column::text("workload", "Workload"),
            Column::text("node", "Node"),
            Column::text("decision", "Decision"),
            Column::text("reason", "Reason"),
            Column::text("detail", "Detail"),
            Column::text("dry_run", "Dry run"),
        ],
    );
    for d in rows {
        t.rows.push(vec![
            Cell::time(Some(d.decided_at)),
            Cell::opt_text(d.workload.clone()),
            Cell::text(d.node.clone()),
            Cell::text(d.decision.clone()),
            Cell::text(d.reason.clone()),
            Cell::text(d.detail.clone()),
            Cell::text(if d.dry_run { "yes" } else { "no" }),
        ]);
    }
    t
}

/// Every GPU's layout at an instant, as a table.
pub fn gpus(f: &FragmentationAt) -> Table {
    let mut t = Table::new(
        "gpus",
        vec![
            Column::text("node", "Node"),
            Column::text("gpu_uuid", "GPU"),
            Column::text("gpu_model", "Model"),
            Column::number("instances", "Instances"),
            Column::text("free_slots", "Free slots"),
            Column::number("free_gpu_equivalents", "Free GPUs"),
            Column::number("stranded_gpu_equivalents", "Stranded GPUs"),
            Column::text("largest_placeable_profile", "Largest placeable"),
        ],
    );
    for g in &f.gpus {
        let slots: Vec<String> = g.free_slots.iter().map(u32::to_string).collect();
        t.rows.push(vec![
            Cell::text(g.node.clone()),
            Cell::text(g.gpu_uuid.clone()),
            Cell::text(g.gpu_model.clone()),
            Cell::count(g.instances.len() as i64),
            Cell::text(slots.join(" ")),
            Cell::hours(g.free_gpu_equivalents),
            Cell::hours(g.stranded_gpu_equivalents),
            Cell::opt_text(g.largest_placeable_profile),
        ]);
    }
    t
}

/// Each budgeted tenant's month: spent, run rate, forecast, and when the forecast reaches the
/// budget; `status` says "over budget" or "forecast over" so the eye finds them.
pub fn budgets(b: &gpuledger_ledger::analytics::budgets::Budgets, query: &str) -> Table {
    let mut t = Table::new(
        "budgets",
        vec![
            Column::text("tenant", "Tenant"),
            Column::number("budget", "Budget"),
            Column::number("spent", "Spent"),
            Column::number("run_rate_per_day", "Per day"),
            Column::number("forecast", "Month-end forecast"),
            Column::number("spent_ratio", "Spent of budget"),
            Column::number("forecast_ratio", "Forecast of budget"),
            Column::text("forecast_exceeds_on", "Reaches the budget on"),
            Column::text("status", "Status"),
        ],
    );
    for l in &b.lines {
        let status = if l.spent_ratio >= 1.0 {
            "over budget"
        } else if l.forecast_ratio > 1.0 {
            "forecast over"
        } else {
            ""
        };
        t.rows.push(vec![
            tenant_link(&l.tenant, query),
            money(l.budget),
            money(l.spent),
            money(l.run_rate_per_day),
            money(l.forecast),
            Cell::ratio(Some(l.spent_ratio)),
            Cell::ratio(Some(l.forecast_ratio)),
            Cell::opt_text(l.forecast_exceeds_on.clone()),
            Cell::text(status),
        ]);
    }
    t
}

/// A number shown with two decimals, exact in the CSV.
fn decimal(v: Option<f64>) -> Cell {
    v.map_or(Cell::Empty, |v| Cell::Number {
        value: v.to_string(),
        shown: format!("{v:.2}"),
        key: v,
    })
}

/// Bytes, shown in GiB, exact in the CSV.
fn gib(b: Option<u64>) -> Cell {
    b.map_or(Cell::Empty, |b| Cell::Number {
        value: b.to_string(),
        shown: format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        key: b as f64,
    })
}

/// Rightsizing's rows, the greatest savings first (`GET /api/v1/rightsizing`, its CSV, the
/// Rightsizing page and a tenant's section). `query` is the period's, kept on the tenant links.
pub fn rightsizing(
    r: &gpuledger_ledger::analytics::rightsizing::Rightsizing,
    query: &str,
) -> Table {
    let mut t = Table::new(
        "rightsizing",
        vec![
            Column::text("tenant", "Tenant"),
            Column::text("workload", "Workload"),
            Column::text("gpu_model", "GPU model"),
            Column::text("mig_profile", "Profile"),
            Column::text("recommended_profile", "Move to"),
            Column::text("reason", "Reason"),
            Column::number("savings", "Savings"),
            Column::number("savings_per_month", "Savings / 30 days"),
            Column::number("held_hours", "Held h"),
            Column::number("compute_p", "Demand at percentile (slices)"),
            Column::number("memory_peak_bytes", "Memory peak"),
            Column::number("instances", "Instances").csv_only(),
            Column::number("measured_minutes", "Measured min").csv_only(),
            Column::number("percentile", "Percentile").csv_only(),
            Column::number("compute_slices", "Slices").csv_only(),
            Column::number("compute_max", "Compute max (slices)").csv_only(),
            Column::number("needed_slices", "Needed slices").csv_only(),
            Column::number("needed_bytes", "Needed memory").csv_only(),
            Column::number("framebuffer_bytes", "Profile memory").csv_only(),
            Column::text("saturated", "Saturated").csv_only(),
            Column::text("slo_class", "SLO class").csv_only(),
        ],
    );
    for row in &r.rows {
        let reason = serde_json::to_value(row.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        t.rows.push(vec![
            tenant_link(&row.tenant, query),
            Cell::opt_text(row.workload.clone()),
            Cell::text(
                gpuledger_schema::mig::model(&row.gpu_model)
                    .map_or(row.gpu_model.as_str(), |m| m.key),
            ),
            Cell::text(row.mig_profile.clone()),
            // The move: a recommendation, or (saturated) the profile that would hold it.
            Cell::opt_text(
                row.recommended_profile
                    .clone()
                    .filter(|_| row.recommendation || row.saturated),
            ),
            Cell::text(reason),
            money(row.savings),
            money(row.savings_per_month),
            Cell::hours(row.held_hours),
            decimal(row.compute_p),
            gib(row.memory_peak_bytes),
            Cell::count(row.instances as i64),
            Cell::count(row.measured_minutes as i64),
            decimal(Some(row.percentile)),
            Cell::count(i64::from(row.compute_slices)),
            decimal(row.compute_max),
            decimal(row.needed_slices),
            gib(row.needed_bytes),
            gib(row.framebuffer_bytes),
            Cell::text(if row.saturated { "yes" } else { "no" }),
            Cell::opt_text(row.slo_class.clone()),
        ]);
    }
    t
}

/// Episodes summed per tenant and workload, the costliest first.
pub fn episode_groups(rows: &[gpuledger_ledger::analytics::EpisodeGroup], query: &str) -> Table {
    let mut t = Table::new(
        "by_workload",
        vec![
            Column::text("tenant", "Tenant"),
            Column::text("workload", "Workload"),
            Column::number("episodes", "Episodes"),
            Column::number("idle_gpu_hours", "Idle GPU-h"),
            Column::number("idle_cost", "Idle cost"),
        ],
    );
    for g in rows {
        t.rows.push(vec![
            match &g.tenant {
                Some(name) => tenant_link(name, query),
                None => Cell::Empty,
            },
            Cell::opt_text(g.workload.clone()),
            Cell::count(g.episodes as i64),
            Cell::hours(g.idle_gpu_seconds / 3600.0),
            money(Money::round(g.cost)),
        ]);
    }
    t
}

/// Free and stranded capacity per model at an instant.
pub fn models(rows: &[ModelAt]) -> Table {
    let mut t = Table::new(
        "models",
        vec![
            Column::text("gpu_model", "Model"),
            Column::number("gpus", "GPUs"),
            Column::number("free_gpu_equivalents", "Free GPUs"),
            Column::number("stranded_gpu_equivalents", "Stranded GPUs"),
        ],
    );
    for m in rows {
        t.rows.push(vec![
            Cell::text(m.gpu_model.clone()),
            Cell::count(m.gpus as i64),
            Cell::hours(m.free_gpu_equivalents),
            Cell::hours(m.stranded_gpu_equivalents),
        ]);
    }
    t
}

/// Free and stranded capacity per node at an instant, each node a link to its own GPUs.
pub fn nodes(rows: &[NodeAt]) -> Table {
    let mut t = Table::new(
        "nodes",
        vec![
            Column::text("node", "Node"),
            Column::number("gpus", "GPUs"),
            Column::number("free_gpu_equivalents", "Free GPUs"),
            Column::number("stranded_gpu_equivalents", "Stranded GPUs"),
        ],
    );
    for n in rows {
        t.rows.push(vec![
            Cell::link(n.node.clone(), format!("/fleet?node={}", segment(&n.node))),
            Cell::count(n.gpus as i64),
            Cell::hours(n.free_gpu_equivalents),
            Cell::hours(n.stranded_gpu_equivalents),
        ]);
    }
    t
}

/// The re-geometry advice.
pub fn advice(rows: &[AdviceView]) -> Table {
    let mut t = Table::new(
        "advice",
        vec![
            Column::text("node", "Node"),
            Column::text("gpu_uuid", "GPU"),
            Column::text("destroy", "Destroy"),
            Column::text("create", "Create"),
            Column::text("displaces", "Drains"),
            Column::number("stranded_before", "Stranded GPUs now"),
            Column::number("stranded_after", "After"),
        ],
    );
    let names = |v: &[gpuledger_ledger::analytics::fragmentation::InstanceNow]| {
        v.iter()
            .map(|i| {
                format!(
                    "{}@{}",
                    i.mig_profile.as_deref().unwrap_or("whole"),
                    i.placement_start.unwrap_or(0)
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    for a in rows {
        t.rows.push(vec![
            Cell::text(a.node.clone()),
            Cell::text(a.gpu_uuid.clone()),
            Cell::text(names(&a.destroy)),
            Cell::text(
                a.create
                    .iter()
                    .map(|c| format!("{}@{}", c.mig_profile, c.placement_start))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            Cell::text(names(&a.displaces)),
            Cell::hours(a.stranded_gpu_equivalents_before),
            Cell::hours(a.stranded_gpu_equivalents_after),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("team-a"), "team-a");
        assert_eq!(segment("<script>/x y"), "%3Cscript%3E%2Fx%20y");
    }
}

/// An energy report: its key columns, kWh (idle and active) and CO₂e, with an energy cost where
/// a price per kWh is configured.
pub fn energy(e: &gpuledger_ledger::analytics::energy::Energy, query: &str) -> Table {
    use gpuledger_ledger::analytics::energy::GroupBy;
    let mut columns = match e.group_by {
        GroupBy::Tenant => vec![Column::text("tenant", "Tenant")],
        GroupBy::Workload => vec![
            Column::text("tenant", "Tenant"),
            Column::text("workload", "Workload"),
        ],
        GroupBy::Node => vec![Column::text("node", "Node")],
        GroupBy::GpuModel => vec![Column::text("gpu_model", "GPU model")],
    };
    columns.extend([
        Column::number("energy_kwh", "Energy kWh"),
        Column::number("idle_energy_kwh", "Idle kWh"),
        Column::number("active_energy_kwh", "Active kWh"),
        Column::number("co2e_kg", "CO₂e kg"),
    ]);
    let priced = e.rows.iter().any(|r| r.energy_cost.is_some());
    if priced {
        columns.push(Column::number("energy_cost", "Energy cost"));
    }
    let mut t = Table::new("energy", columns);
    for r in &e.rows {
        let mut row = match e.group_by {
            GroupBy::Tenant => vec![tenant_link(r.tenant.as_deref().unwrap_or(""), query)],
            GroupBy::Workload => vec![
                tenant_link(r.tenant.as_deref().unwrap_or(""), query),
                Cell::opt_text(r.workload.clone()),
            ],
            GroupBy::Node => vec![Cell::opt_text(r.node.clone())],
            GroupBy::GpuModel => vec![Cell::opt_text(r.gpu_model.clone())],
        };
        row.extend([
            decimal(Some(r.energy_kwh)),
            decimal(Some(r.idle_energy_kwh)),
            decimal(Some(r.active_energy_kwh)),
            decimal(r.co2e_kg),
        ]);
        if priced {
            row.push(decimal(r.energy_cost));
        }
        t.rows.push(row);
    }
    t
}

/// Measured energy per UTC day (the overview's and a tenant page's energy chart).
pub fn daily_energy(days: &[(i64, f64)]) -> Table {
    let mut t = Table::new(
        "daily_energy",
        vec![
            Column::text("day", "Day"),
            Column::number("energy_kwh", "Energy kWh"),
        ],
    );
    for &(day, kwh) in days {
        t.rows
            .push(vec![Cell::text(day_label(day)), decimal(Some(kwh))]);
    }
    t
}
