//! The period a page or export covers: `month=YYYY-MM`, or `from` and `to` (RFC 3339 or Unix
//! seconds); the current UTC month by default.

use chrono::{Datelike, TimeZone, Utc};

use crate::api::extract::{Month, Time, range};
use crate::error::ApiError;

/// A period, with what the pages need to show it and move to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// Start.
    pub from: i64,
    /// End (exclusive).
    pub to: i64,
    /// As shown (`November 2026`).
    pub label: String,
    /// Its query (`month=2026-11`).
    pub query: String,
    /// The previous period's query.
    pub prev: String,
    /// The next period's query.
    pub next: String,
}

fn month_start(year: i32, month: u32) -> Option<i64> {
    Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0)
        .single()
        .map(|t| t.timestamp())
}

fn shift(year: i32, month: u32, by: i32) -> (i32, u32) {
    let m = year * 12 + month as i32 - 1 + by;
    (m.div_euclid(12), m.rem_euclid(12) as u32 + 1)
}

fn month(year: i32, month: u32) -> Option<Period> {
    let from = month_start(year, month)?;
    let (ny, nm) = shift(year, month, 1);
    let (py, pm) = shift(year, month, -1);
    Some(Period {
        from,
        to: month_start(ny, nm)?,
        label: Utc
            .timestamp_opt(from, 0)
            .single()?
            .format("%B %Y")
            .to_string(),
        query: format!("month={year:04}-{month:02}"),
        prev: format!("month={py:04}-{pm:02}"),
        next: format!("month={ny:04}-{nm:02}"),
    })
}

/// The period of a query's `month`, or `from`/`to` ([`range`]); without either, the UTC month
/// of `now`. `max_secs` bounds a range.
pub fn period(
    m: Option<Month>,
    from: Option<Time>,
    to: Option<Time>,
    now: i64,
    max_secs: i64,
) -> Result<Period, ApiError> {
    if m.is_some() {
        let (from, _) = range(m, from, to, max_secs)?;
        let t = Utc.timestamp_opt(from, 0).single().unwrap_or_default();
        return month(t.year(), t.month())
            .ok_or_else(|| ApiError::bad_request("month", "not a month"));
    }
    if from.is_some() || to.is_some() {
        let (from, to) = range(None, from, to, max_secs)?;
        let fmt = |t: i64| {
            Utc.timestamp_opt(t, 0)
                .single()
                .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default()
        };
        let span = to - from;
        return Ok(Period {
            from,
            to,
            label: format!("{} – {}", fmt(from), fmt(to)),
            query: format!("from={}&to={}", fmt(from), fmt(to)),
            prev: format!("from={}&to={}", fmt(from - span), fmt(from)),
            next: format!("from={}&to={}", fmt(to), fmt(to + span)),
        });
    }
    let t = Utc.timestamp_opt(now, 0).single().unwrap_or_default();
    month(t.year(), t.month()).ok_or_else(|| ApiError::bad_request("month", "no current month"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::extract::parse_query;

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Q {
        month: Option<Month>,
        from: Option<Time>,
        to: Option<Time>,
    }

    fn period_of(query: &str, now: i64) -> Result<Period, ApiError> {
        let q: Q = parse_query(query)?;
        period(q.month, q.from, q.to, now, i64::MAX)
    }

    #[test]
    fn months_ranges_and_the_default() {
        let p = period_of("month=2026-12", 0).unwrap();
        assert_eq!((p.from, p.to), (1_796_083_200, 1_798_761_600));
        assert_eq!(
            (p.label.as_str(), p.prev.as_str(), p.next.as_str()),
            ("December 2026", "month=2026-11", "month=2027-01")
        );
        let now = 1_795_000_000; // 2026-11-18
        assert_eq!(period_of("", now).unwrap().query, "month=2026-11");
        for bad in ["2026-13", "2026-1", "26-11", "x"] {
            let e = period_of(&format!("month={bad}"), now).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("month"), "{bad}");
        }
        let e = period_of("month=2026-11&from=0", now).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("month"));
        let p = period_of("from=2026-11-01T00:00:00Z&to=2026-11-02T00:00:00Z", now).unwrap();
        assert_eq!(p.next, "from=2026-11-02T00:00:00Z&to=2026-11-03T00:00:00Z");
    }
}
