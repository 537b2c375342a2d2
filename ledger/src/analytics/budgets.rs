//! Each tenant's month against its budget, with a forecast of the month's end
//! (`GET /api/v1/budgets`; definitions: `schema/ANALYTICS.md`, "Budgets").
//!
//! Key decision: spend is the bill's own `total` (the same cost mode, overhead treatment and price
//! book as the Tenants page), so a budget line and the bill cannot disagree; the forecast is that
//! spend plus a run rate × the days left, the run rate being the last whole UTC days' spend (at
//! most seven, of this month), so one busy hour today does not swing it.

use serde::Serialize;

use super::bill::{self, Money};
use super::prices::{CostMode, IdleSharing};
use super::showback::ShowbackError;

const DAY: i64 = 86_400;

/// The days of spend the run rate averages, at most.
pub const RUN_RATE_DAYS: i64 = 7;

/// One tenant's month.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetLine {
    /// The tenant.
    pub tenant: String,
    /// Its budget for the month (`[billing.tenants.<name>] monthly_budget`).
    pub budget: Money,
    /// What the bill charges it for `[month start, at)`.
    pub spent: Money,
    /// Its spend per day: over the whole UTC days of the month before `at`'s day (at most
    /// seven); with none, `spent` over the days elapsed.
    pub run_rate_per_day: Money,
    /// The days the run rate averages (0: from `spent`).
    pub run_rate_days: i64,
    /// `spent` + `run_rate_per_day` × the days left in the month after `at`.
    pub forecast: Money,
    /// spent / budget.
    pub spent_ratio: f64,
    /// forecast / budget.
    pub forecast_ratio: f64,
    /// The UTC date (`YYYY-MM-DD`) the forecast line reaches the budget, when it does within
    /// the month: `at`'s date when `spent` already has.
    pub forecast_exceeds_on: Option<String>,
}

/// `GET /api/v1/budgets`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budgets {
    /// The month's first second.
    pub from: i64,
    /// The next month's first second.
    pub to: i64,
    /// The instant spend is counted to, within the month.
    pub at: i64,
    /// The currency.
    pub currency: String,
    /// How tenants are charged (as on the bill).
    pub cost_mode: CostMode,
    /// Where the overhead goes (as on the bill).
    pub idle: IdleSharing,
    /// One line per tenant with a monthly budget, by tenant.
    pub lines: Vec<BudgetLine>,
}

/// One tenant's own cost per UTC day of `[from, until)` (at most the month `[from, to)`), summed
/// from the month's start: the bars of a tenant page's budget chart. Its cost in `mode` (held or
/// used GPU-seconds at the price book's prices), before any shared overhead or shared-GPU
/// transfer, so the last bar can be below the bill's `total` when overhead is shared.
pub fn cumulative_cost(
    conn: &duckdb::Connection,
    (from, to): (i64, i64),
    until: i64,
    settings: &super::Settings,
    raw_from: i64,
    mode: CostMode,
    tenant: &str,
) -> Result<Vec<(i64, f64)>, ShowbackError> {
    use super::showback::{self, GroupBy};
    let until = until.clamp(from, to);
    let mut out = Vec::new();
    let mut total = 0.0;
    let mut day = from;
    while day < until {
        // Whole days; the last one cut at the minute (a piece finer than a minute needs raw
        // samples the page does not).
        let end = (day + DAY).min(until.div_euclid(60) * 60).max(day);
        if end > day {
            let s = showback::showback(
                conn,
                day,
                end,
                GroupBy::Tenant,
                Some(tenant),
                raw_from,
                settings,
            )?;
            total += s
                .rows
                .iter()
                .map(|r| match mode {
                    CostMode::Allocation => r.figures.cost,
                    CostMode::Usage => r.figures.cost - r.figures.idle_cost,
                })
                .sum::<f64>();
        }
        out.push((day, total));
        day += DAY;
    }
    Ok(out)
}

/// The forecast of one tenant from its figures (the arithmetic of [`BudgetLine`]).
pub fn line(
    tenant: &str,
    budget: Money,
    spent: Money,
    (window_spend, window_days): (Money, i64),
    (from, at, to): (i64, i64, i64),
) -> BudgetLine {
    let rate = if window_days > 0 {
        window_spend.0 as f64 / 100.0 / window_days as f64
    } else if at > from {
        spent.0 as f64 / 100.0 / ((at - from) as f64 / DAY as f64)
    } else {
        0.0
    };
    let spent_f = spent.0 as f64 / 100.0;
    let left_days = (to - at) as f64 / DAY as f64;
    let forecast = Money::round(spent_f + rate * left_days);
    let ratio = |m: Money| {
        if budget.0 > 0 {
            m.0 as f64 / budget.0 as f64
        } else {
            f64::INFINITY
        }
    };
    let exceeds_at = if spent >= budget {
        Some(at)
    } else if forecast > budget && rate > 0.0 {
        let days = (budget.0 - spent.0) as f64 / 100.0 / rate;
        Some((at + (days * DAY as f64).ceil() as i64).min(to - 1))
    } else {
        None
    };
    BudgetLine {
        tenant: tenant.to_owned(),
        budget,
        spent,
        run_rate_per_day: Money::round(rate),
        run_rate_days: window_days,
        forecast,
        spent_ratio: ratio(spent),
        forecast_ratio: ratio(forecast),
        forecast_exceeds_on: exceeds_at.map(|t| {
            chrono::DateTime::from_timestamp(t, 0)
                .map(|d| d.format("%Y-%m-%d").to_string())
                .unwrap_or_default()
        }),
    }
}

/// Every budgeted tenant's month `[from, to)` as of `at` (clamped into it); `tenant` keeps one
/// tenant's line only (a `tenant:` reader).
#[allow(clippy::too_many_arguments)]
pub fn forecast(
    conn: &duckdb::Connection,
    (from, to): (i64, i64),
    at: i64,
    settings: &super::Settings,
    raw_from: i64,
    mode: CostMode,
    idle: IdleSharing,
    tenant: Option<&str>,
) -> Result<Budgets, ShowbackError> {
    let at = at.clamp(from, to);
    let mut budgeted: Vec<(&String, f64)> = settings
        .billing
        .tenants
        .iter()
        .filter_map(|(t, info)| Some((t, info.monthly_budget?)))
        .filter(|(t, _)| tenant.is_none_or(|own| own == t.as_str()))
        .collect();
    budgeted.sort_by(|a, b| a.0.cmp(b.0));
    let empty = Budgets {
        from,
        to,
        at,
        currency: settings.prices.currency.clone(),
        cost_mode: mode,
        idle,
        lines: Vec::new(),
    };
    if budgeted.is_empty() {
        // Nothing to price: no bill is computed.
        return Ok(empty);
    }
    let totals = |a: i64, b: i64| -> Result<Vec<(String, Money)>, ShowbackError> {
        if a >= b {
            return Ok(Vec::new());
        }
        let bill = bill::compute(conn, a, b, settings, raw_from, mode, idle, None)?;
        Ok(bill
            .lines
            .into_iter()
            .map(|l| (l.tenant, l.total))
            .collect())
    };
    let of = |v: &[(String, Money)], t: &str| {
        v.iter()
            .find(|(name, _)| name == t)
            .map_or(Money::default(), |(_, m)| *m)
    };
    let spent = totals(from, at)?;
    let day = at - at.rem_euclid(DAY);
    let window_days = ((day - from) / DAY).clamp(0, RUN_RATE_DAYS);
    let window = totals(day - window_days * DAY, day)?;
    let lines = budgeted
        .into_iter()
        .map(|(t, monthly)| {
            line(
                t,
                Money::round(monthly),
                of(&spent, t),
                (of(&window, t), window_days),
                (from, at, to),
            )
        })
        .collect();
    Ok(Budgets { lines, ..empty })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// November 2026: 30 days from 2026-11-01T00:00:00Z.
    const NOV: (i64, i64) = (1_793_491_200, 1_793_491_200 + 30 * DAY);

    #[test]
    fn the_forecast_runs_the_last_whole_days_rate_to_the_month_end() {
        let (from, to) = NOV;
        // The 11th at noon: ten whole days before it, so the last seven count.
        let at = from + 10 * DAY + DAY / 2;
        let l = line(
            "a",
            Money(300_000),
            Money(120_000),
            (Money(70_000), 7),
            (from, at, to),
        );
        assert_eq!(l.run_rate_per_day, Money(10_000));
        // 1,200 + 100 a day × 19.5 days left.
        assert_eq!(l.forecast, Money(315_000));
        assert!((l.spent_ratio - 0.4).abs() < 1e-12);
        assert!((l.forecast_ratio - 1.05).abs() < 1e-12);
        // 1,800 left at 100 a day: 18 days after the 11th at noon.
        assert_eq!(l.forecast_exceeds_on.as_deref(), Some("2026-11-29"));
    }

    #[test]
    fn without_a_whole_day_the_rate_is_the_spend_so_far() {
        let (from, to) = NOV;
        let at = from + DAY / 4;
        let l = line(
            "a",
            Money(300_000),
            Money(2_000),
            (Money(0), 0),
            (from, at, to),
        );
        // 20.00 in a quarter of a day: 80 a day, and 20 + 80 × 29.75 by the month's end.
        assert_eq!(l.run_rate_per_day, Money(8_000));
        assert_eq!(l.forecast, Money(240_000));
        assert_eq!(l.forecast_exceeds_on, None, "2,400 stays under 3,000");
    }

    #[test]
    fn a_budget_already_spent_is_exceeded_today() {
        let (from, to) = NOV;
        let at = from + 20 * DAY;
        let l = line("a", Money(100), Money(150), (Money(70), 7), (from, at, to));
        assert_eq!(l.forecast_exceeds_on.as_deref(), Some("2026-11-21"));
        assert!(l.spent_ratio > 1.0);
        let idle = line("b", Money(100), Money(0), (Money(0), 7), (from, at, to));
        assert_eq!(idle.run_rate_per_day, Money(0));
        assert_eq!((idle.forecast, idle.forecast_exceeds_on), (Money(0), None));
    }
}
