//! Daily figures over a period, for the pages' trend charts: allocated and used GPU-hours per
//! UTC day (from the hourly tenant rollup, for one tenant or all), and for the fleet its
//! capacity and stranded GPU-hours. Whole hours only: a day's figures are the sums of its hours'
//! rollups, so over whole days they equal showback's. Definitions: `schema/ANALYTICS.md`.

use std::collections::BTreeMap;

use duckdb::{Connection, params};

/// One UTC day.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Day {
    /// The day's first second.
    pub day: i64,
    /// GPU-hours held.
    pub allocated_gpu_hours: f64,
    /// GPU-hours used.
    pub used_gpu_hours: f64,
    /// GPU-hours observed (fleet only).
    pub capacity_gpu_hours: Option<f64>,
    /// GPU-hours stranded (fleet only).
    pub stranded_gpu_hours: Option<f64>,
}

const DAY: i64 = 86_400;

/// Every day of `[from, to)` (whole hours of it), zeros included. `tenant`: that tenant's
/// figures and no fleet figures.
pub fn daily(
    conn: &Connection,
    from: i64,
    to: i64,
    tenant: Option<&str>,
) -> duckdb::Result<Vec<Day>> {
    let h0 = from + (3600 - from.rem_euclid(3600)) % 3600;
    let h1 = to - to.rem_euclid(3600);
    let mut days: BTreeMap<i64, Day> = BTreeMap::new();
    let mut d = from.div_euclid(DAY) * DAY;
    while d < to {
        days.insert(
            d,
            Day {
                day: d,
                capacity_gpu_hours: tenant.is_none().then_some(0.0),
                stranded_gpu_hours: tenant.is_none().then_some(0.0),
                ..Day::default()
            },
        );
        d += DAY;
    }
    if h0 >= h1 {
        return Ok(days.into_values().collect());
    }
    let mut stmt = conn.prepare_cached(
        "SELECT bucket // 86400 * 86400, sum(gpu_seconds), sum(used_gpu_seconds)
         FROM rollup_tenant_1h
         WHERE bucket >= ? AND bucket < ? AND tenant IS NOT NULL AND (?::VARCHAR IS NULL OR tenant = ?)
         GROUP BY 1",
    )?;
    let rows = stmt.query_map(params![h0, h1, tenant, tenant], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, f64>(1)?,
            r.get::<_, f64>(2)?,
        ))
    })?;
    for row in rows {
        let (day, allocated, used) = row?;
        if let Some(d) = days.get_mut(&day) {
            d.allocated_gpu_hours += allocated / 3600.0;
            d.used_gpu_hours += used / 3600.0;
        }
    }
    if tenant.is_some() {
        return Ok(days.into_values().collect());
    }
    for (sql, stranded) in [
        (
            "SELECT bucket // 86400 * 86400, sum(observed_seconds)::DOUBLE FROM rollup_gpu_1h
             WHERE bucket >= ? AND bucket < ? GROUP BY 1",
            false,
        ),
        (
            "SELECT bucket // 86400 * 86400, sum(stranded_slice_seconds) / 7.0 FROM fragmentation_1h
             WHERE bucket >= ? AND bucket < ? GROUP BY 1",
            true,
        ),
    ] {
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map(params![h0, h1], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, f64>(1)?))
        })?;
        for row in rows {
            let (day, seconds) = row?;
            if let Some(d) = days.get_mut(&day) {
                let slot = if stranded {
                    &mut d.stranded_gpu_hours
                } else {
                    &mut d.capacity_gpu_hours
                };
                *slot = Some(slot.unwrap_or_default() + seconds / 3600.0);
            }
        }
    }
    Ok(days.into_values().collect())
}
