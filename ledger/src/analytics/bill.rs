//! The bill: what each tenant is charged for a period, in whole cents, and the platform's
//! overhead, such that Σ tenants + overhead = the fleet's cost to the cent. Definitions:
//! `schema/ANALYTICS.md` ("Money: the price book and the bill (`GET /api/v1/bill`, the Tenants
//! page)").
//!
//! Key decisions:
//! - The fleet's cost is its observed capacity at the price book's prices. A tenant is charged
//!   for what it held (`allocation`, the default) or what it used (`usage`); the rest — capacity
//!   nobody held (unallocated, stranded among it) and, in usage mode, the holders' idle — is
//!   platform overhead, or is shared out to the tenants in proportion to their charges
//!   (OpenCost's share-idle).
//! - Rounding is done once, on the whole bill: the fleet's cost is rounded to the cent, then the
//!   cents are apportioned by largest remainder (Hamilton's method) among the lines, so the lines
//!   always sum to the total; a shared overhead is apportioned the same way.
//! - A bill is always computed over the whole fleet and a tenant-scoped reader is given only its
//!   own line: its figures are then the same ones finance sees, cent for cent.

use std::collections::{BTreeMap, HashMap};

use serde::{Serialize, Serializer};

use super::prices::{CostMode, IdleSharing};
use super::shares::Transfer;
use super::showback::{Figures, Showback, ShowbackError};

/// An amount in cents; serialised as a decimal number of the currency (`12.34`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Money(pub i64);

impl Money {
    /// Rounded to the nearest cent.
    pub fn round(amount: f64) -> Money {
        Money((amount * 100.0).round() as i64)
    }
}

impl std::fmt::Display for Money {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let c = self.0.unsigned_abs();
        write!(f, "{sign}{}.{:02}", c / 100, c % 100)
    }
}

impl Serialize for Money {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0 as f64 / 100.0)
    }
}

impl std::ops::Add for Money {
    type Output = Money;
    fn add(self, o: Money) -> Money {
        Money(self.0 + o.0)
    }
}

impl std::iter::Sum for Money {
    fn sum<I: Iterator<Item = Money>>(iter: I) -> Money {
        Money(iter.map(|m| m.0).sum())
    }
}

/// Splits `total` cents among `targets` (exact amounts, in currency units) by largest remainder:
/// each gets the floor of its target in cents, then the cents left go one each to the largest
/// fractional remainders (ties to the earlier). The parts sum to `total` exactly.
pub fn apportion(total: Money, targets: &[f64]) -> Vec<Money> {
    let cents: Vec<f64> = targets.iter().map(|t| t * 100.0).collect();
    let mut out: Vec<i64> = cents.iter().map(|c| c.floor() as i64).collect();
    let left = total.0 - out.iter().sum::<i64>();
    let mut order: Vec<usize> = (0..cents.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (cents[a] - cents[a].floor(), cents[b] - cents[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    if !order.is_empty() {
        // |left| is at most the number of parts when the targets sum to the total; any more (a
        // degenerate input) is spread round-robin so the sum still holds.
        let step = left.signum();
        for k in 0..left.unsigned_abs() as usize {
            let i = if step > 0 {
                order[k % order.len()]
            } else {
                order[order.len() - 1 - k % order.len()]
            };
            out[i] += step;
        }
    }
    out.into_iter().map(Money).collect()
}

/// Where a tenant sits in the organisation, and its budget (`[billing.tenants.<name>]`).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantInfo {
    /// Its team.
    pub team: Option<String>,
    /// The team's organisation.
    pub org: Option<String>,
    /// Its budget per calendar month, in the price book's currency.
    pub monthly_budget: Option<f64>,
    /// Who to tell about its idle GPUs: a chat channel (`#team-a-gpu`, matched by a
    /// `[[notify]]` endpoint's `channel`) or a mail address (shown only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contact: Option<String>,
}

/// How bills are made (`[billing]` in the aggregator's config).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BillingSettings {
    /// The default cost mode.
    #[serde(default)]
    pub cost_mode: CostMode,
    /// The default overhead treatment.
    #[serde(default)]
    pub idle: IdleSharing,
    /// Team, org and budget per tenant.
    #[serde(default)]
    pub tenants: HashMap<String, TenantInfo>,
}

/// One tenant's line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BillLine {
    /// The tenant.
    pub tenant: String,
    /// Its team (config).
    pub team: Option<String>,
    /// Its organisation (config).
    pub org: Option<String>,
    /// GPU-hours held.
    pub allocated_gpu_hours: f64,
    /// GPU-hours used.
    pub used_gpu_hours: f64,
    /// allocated − used.
    pub idle_gpu_hours: f64,
    /// used / allocated.
    pub efficiency: Option<f64>,
    /// What it is charged for GPUs: its own allocations (held or used, by the cost mode), plus
    /// its part of shared instances other tenants hold, minus the parts of its shared instances
    /// that other tenants used.
    pub cost: Money,
    /// Of `cost`, what shared instances moved to it (+) or from it (−), rounded on its own.
    pub shared_gpu_transfer: Money,
    /// What its idle GPU-hours cost (shown in both modes).
    pub idle_cost: Money,
    /// Its part of the overhead (share mode; 0 otherwise).
    pub shared_overhead: Money,
    /// cost + shared_overhead: what it pays.
    pub total: Money,
    /// Its budget for the period (the monthly budget pro rata).
    pub budget: Option<Money>,
    /// total / budget.
    pub budget_used: Option<f64>,
}

/// The platform's part. In cents: `unallocated_cost + holders_idle_cost = before_sharing`,
/// `before_sharing − shared_out = total`, and Σ tenants' totals + `total` = the fleet's cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Overhead {
    /// GPU-hours of capacity nobody held.
    pub unallocated_gpu_hours: f64,
    /// Of those, GPU-hours the demand mix cannot use (stranded by the MIG layout).
    pub stranded_gpu_hours: f64,
    /// What the capacity nobody held cost: `before_sharing − holders_idle_cost`.
    pub unallocated_cost: Money,
    /// What the stranded part of it cost (rounded on its own; part of `unallocated_cost`).
    pub stranded_cost: Money,
    /// In usage mode, what the holders' idle cost (0 in allocation mode).
    pub holders_idle_cost: Money,
    /// Fleet cost − Σ tenants' cost: the overhead before any is shared out.
    pub before_sharing: Money,
    /// What was shared out to the tenants (`idle = "share"`; 0 otherwise).
    pub shared_out: Money,
    /// The overhead line of the bill: `before_sharing − shared_out`.
    pub total: Money,
}

/// A sub-total along the org → team → tenant hierarchy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rollup {
    /// The organisation (null: tenants with none configured).
    pub org: Option<String>,
    /// The team; null on an organisation's own sub-total.
    pub team: Option<String>,
    /// Tenants in it.
    pub tenants: usize,
    /// GPU-hours held.
    pub allocated_gpu_hours: f64,
    /// GPU-hours used.
    pub used_gpu_hours: f64,
    /// Σ total.
    pub total: Money,
    /// Σ budgets of the tenants that have one.
    pub budget: Option<Money>,
}

/// The bill for a period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bill {
    /// Period start.
    pub from: i64,
    /// Period end.
    pub to: i64,
    /// The currency.
    pub currency: String,
    /// How tenants were charged.
    pub cost_mode: CostMode,
    /// Where the overhead went.
    pub idle: IdleSharing,
    /// One line per tenant, by tenant.
    pub lines: Vec<BillLine>,
    /// Sub-totals per team and per org (viewers only).
    pub rollups: Vec<Rollup>,
    /// The platform's part (viewers only).
    pub overhead: Option<Overhead>,
    /// GPU-hours of capacity observed (viewers only).
    pub capacity_gpu_hours: Option<f64>,
    /// The fleet's cost: Σ lines' total + overhead's total (viewers only).
    pub fleet_cost: Option<Money>,
}

fn hours(s: f64) -> f64 {
    s / 3600.0
}

/// The budget for `[from, to)`: the monthly budget pro rata to the length of `from`'s month.
fn budget_for(monthly: f64, from: i64, to: i64) -> Money {
    use chrono::{Datelike, TimeZone};
    let t = chrono::Utc
        .timestamp_opt(from, 0)
        .single()
        .unwrap_or_default();
    let start = chrono::Utc
        .with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or_default();
    let next = if t.month() == 12 {
        chrono::Utc.with_ymd_and_hms(t.year() + 1, 1, 1, 0, 0, 0)
    } else {
        chrono::Utc.with_ymd_and_hms(t.year(), t.month() + 1, 1, 0, 0, 0)
    }
    .single()
    .unwrap_or_default();
    let month = (next - start).num_seconds().max(1) as f64;
    Money::round(monthly * (to - from) as f64 / month)
}

/// The fleet's bill for `[from, to)` read from the ledger (showback by tenant, the shared
/// instances' transfers, then [`bill`]), cut to `tenant`'s line when one is given: what every
/// page, CSV and JSON answer about a bill renders. `raw_from` is the oldest raw second kept.
#[allow(clippy::too_many_arguments)]
pub fn compute(
    conn: &duckdb::Connection,
    from: i64,
    to: i64,
    settings: &super::Settings,
    raw_from: i64,
    mode: CostMode,
    idle: IdleSharing,
    tenant: Option<&str>,
) -> Result<Bill, ShowbackError> {
    let s = super::showback::showback(
        conn,
        from,
        to,
        super::showback::GroupBy::Tenant,
        None,
        raw_from,
        settings,
    )?;
    let moved = super::shares::transfers(conn, from, to, mode, settings)?;
    let b = bill(
        &s,
        &moved,
        from,
        to,
        settings.prices.currency.clone(),
        mode,
        idle,
        &settings.billing,
    );
    Ok(match tenant {
        Some(t) => b.for_tenant(t),
        None => b,
    })
}

/// Makes the bill from a fleet-wide showback grouped by tenant and the shared instances' transfers
/// ([`super::shares::transfers`], computed for the same mode).
#[allow(clippy::too_many_arguments)]
pub fn bill(
    s: &Showback,
    transfers: &[Transfer],
    from: i64,
    to: i64,
    currency: String,
    cost_mode: CostMode,
    idle: IdleSharing,
    billing: &BillingSettings,
) -> Bill {
    let t = &s.totals;
    let fleet_exact = t.cost + t.unallocated_cost;
    // Every tenant that holds GPUs, or used a shared one another tenant holds.
    let mut tenants: BTreeMap<String, (Figures, f64)> = s
        .rows
        .iter()
        .map(|r| {
            let t = r.key.first().cloned().flatten().unwrap_or_default();
            (t, (r.figures.clone(), 0.0))
        })
        .collect();
    for t in transfers {
        tenants.entry(t.from.clone()).or_default().1 -= t.amount;
        tenants.entry(t.to.clone()).or_default().1 += t.amount;
    }
    let charges: Vec<f64> = tenants
        .values()
        .map(|(f, moved)| {
            moved
                + match cost_mode {
                    CostMode::Allocation => f.cost,
                    CostMode::Usage => f.cost - f.idle_cost,
                }
        })
        .collect();
    let overhead_exact = fleet_exact - charges.iter().sum::<f64>();
    let fleet_cost = Money::round(fleet_exact);
    let mut targets = charges.clone();
    targets.push(overhead_exact);
    let mut cents = apportion(fleet_cost, &targets);
    let overhead_cents = cents.pop().unwrap_or_default();
    let shared = match idle {
        IdleSharing::Share if charges.iter().sum::<f64>() > 0.0 => {
            let sum: f64 = charges.iter().sum();
            let weights: Vec<f64> = charges
                .iter()
                .map(|c| overhead_cents.0 as f64 / 100.0 * c / sum)
                .collect();
            apportion(overhead_cents, &weights)
        }
        _ => vec![Money(0); charges.len()],
    };
    let lines: Vec<BillLine> = tenants
        .into_iter()
        .zip(cents.iter().zip(&shared))
        .map(|((tenant, (f, moved)), (&cost, &share))| {
            let info = billing.tenants.get(&tenant).cloned().unwrap_or_default();
            let total = cost + share;
            let budget = info.monthly_budget.map(|m| budget_for(m, from, to));
            BillLine {
                team: info.team,
                org: info.org,
                allocated_gpu_hours: hours(f.allocated_gpu_seconds),
                used_gpu_hours: hours(f.used_gpu_seconds),
                idle_gpu_hours: hours(f.idle_gpu_seconds),
                efficiency: f.efficiency,
                cost,
                shared_gpu_transfer: Money::round(moved),
                idle_cost: Money::round(f.idle_cost),
                shared_overhead: share,
                total,
                budget_used: budget
                    .filter(|b| b.0 > 0)
                    .map(|b| total.0 as f64 / b.0 as f64),
                budget,
                tenant,
            }
        })
        .collect();
    let shared_total: Money = shared.iter().copied().sum();
    let holders_idle_cost = match cost_mode {
        CostMode::Allocation => Money(0),
        CostMode::Usage => Money::round(t.idle_cost),
    };
    let overhead = Overhead {
        unallocated_gpu_hours: hours(t.unallocated_gpu_seconds),
        stranded_gpu_hours: hours(t.stranded_gpu_seconds),
        unallocated_cost: Money(overhead_cents.0 - holders_idle_cost.0),
        stranded_cost: Money::round(t.stranded_cost),
        holders_idle_cost,
        before_sharing: overhead_cents,
        shared_out: shared_total,
        total: Money(overhead_cents.0 - shared_total.0),
    };
    Bill {
        from,
        to,
        currency,
        cost_mode,
        idle,
        rollups: rollups(&lines),
        lines,
        overhead: Some(overhead),
        capacity_gpu_hours: Some(hours(t.capacity_gpu_seconds)),
        fleet_cost: Some(fleet_cost),
    }
}

fn rollups(lines: &[BillLine]) -> Vec<Rollup> {
    let mut by: BTreeMap<(Option<String>, Option<String>), Rollup> = BTreeMap::new();
    for l in lines {
        // A tenant counts in its team's sub-total and in its organisation's.
        let mut keys = vec![(l.org.clone(), None)];
        if l.team.is_some() {
            keys.push((l.org.clone(), l.team.clone()));
        }
        for (org, team) in keys {
            let r = by
                .entry((org.clone(), team.clone()))
                .or_insert_with(|| Rollup {
                    org,
                    team,
                    tenants: 0,
                    allocated_gpu_hours: 0.0,
                    used_gpu_hours: 0.0,
                    total: Money(0),
                    budget: None,
                });
            r.tenants += 1;
            r.allocated_gpu_hours += l.allocated_gpu_hours;
            r.used_gpu_hours += l.used_gpu_hours;
            r.total = r.total + l.total;
            if let Some(b) = l.budget {
                r.budget = Some(r.budget.unwrap_or_default() + b);
            }
        }
    }
    by.into_values().collect()
}

impl Bill {
    /// What a `tenant:` reader may see: its own line, no fleet figures, no other tenant.
    pub fn for_tenant(mut self, tenant: &str) -> Bill {
        self.lines.retain(|l| l.tenant == tenant);
        self.rollups.clear();
        self.overhead = None;
        self.capacity_gpu_hours = None;
        self.fleet_cost = None;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apportioned_cents_always_sum_to_the_total() {
        assert_eq!(
            apportion(Money(100), &[1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]),
            [Money(34), Money(33), Money(33)]
        );
        assert_eq!(apportion(Money(-5), &[0.02, -0.07]), [Money(2), Money(-7)]);
        // Thousands of awkward amounts: the parts always sum to the rounded total.
        let mut x = 0.123_456_7_f64;
        for n in 1..200 {
            let targets: Vec<f64> = (0..n)
                .map(|i| {
                    x = (x * 9_301.0 + 49_297.0 + i as f64) % 233_280.0;
                    x / 977.0 - 40.0
                })
                .collect();
            let total = Money::round(targets.iter().sum());
            let parts = apportion(total, &targets);
            assert_eq!(parts.iter().copied().sum::<Money>(), total, "{n}");
            for (p, t) in parts.iter().zip(&targets) {
                assert!((p.0 as f64 - t * 100.0).abs() < 1.0 + 1e-6, "{p:?} for {t}");
            }
        }
    }

    #[test]
    fn money_prints_as_a_decimal() {
        assert_eq!(Money(123_456).to_string(), "1234.56");
        assert_eq!(Money(-7).to_string(), "-0.07");
        assert_eq!(serde_json::to_string(&Money(1005)).unwrap(), "10.05");
    }

    #[test]
    fn a_full_month_budget_is_the_monthly_budget() {
        // November 2026: 30 days.
        let from = 1_793_491_200;
        assert_eq!(budget_for(3000.0, from, from + 30 * 86400), Money(300_000));
        assert_eq!(budget_for(3000.0, from, from + 86400), Money(10_000));
    }
}
