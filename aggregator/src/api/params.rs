//! Query parameters, read one way by every read endpoint and page: unknown parameters are a 400
//! naming them (a typo is never silently ignored), times are RFC 3339 or Unix seconds from 1970
//! to 9999, a range is `month=YYYY-MM` or `from`/`to` (the current month to date by default),
//! and every difference is checked, so no query value can overflow into a wrong answer.

use std::collections::HashMap;

use chrono::TimeZone;

use crate::error::ApiError;

/// The checked query of one request.
#[derive(Debug, Clone, Default)]
pub struct Params {
    q: HashMap<String, String>,
}

impl Params {
    /// The query, refused with a 400 naming the first parameter not in `known`.
    pub fn checked(q: HashMap<String, String>, known: &[&str]) -> Result<Params, ApiError> {
        let mut unknown: Vec<&String> = q.keys().filter(|k| !known.contains(&k.as_str())).collect();
        unknown.sort();
        match unknown.first() {
            Some(k) => Err(ApiError::bad_request(
                (*k).clone(),
                format!(
                    "unknown parameter; this endpoint takes {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            )),
            None => Ok(Params { q }),
        }
    }

    /// A parameter's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.q.get(name).map(String::as_str)
    }

    /// Whether it was given.
    pub fn has(&self, name: &str) -> bool {
        self.q.contains_key(name)
    }

    /// A time parameter.
    pub fn time(&self, name: &'static str) -> Result<Option<i64>, ApiError> {
        time_param(name, self.get(name))
    }

    /// One of a fixed set of names (`group_by`, `state`, `mode`); `default` when absent.
    pub fn choice<T>(
        &self,
        name: &'static str,
        default: T,
        parse: impl Fn(&str) -> Option<T>,
        names: &str,
    ) -> Result<T, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(s) => parse(s)
                .ok_or_else(|| ApiError::bad_request(name, format!("{s:?} is not one of {names}"))),
        }
    }

    /// `[from, to)`: `month=YYYY-MM`, or `from`/`to` (`to` defaults to now, `from` to the start
    /// of `to`'s UTC month), at most `max_secs` long.
    pub fn range(&self, max_secs: i64) -> Result<(i64, i64), ApiError> {
        match self.get("month") {
            Some(m) => {
                if self.has("from") || self.has("to") {
                    return Err(ApiError::bad_request(
                        "month",
                        "give either month, or from and to",
                    ));
                }
                month(m)
                    .ok_or_else(|| ApiError::bad_request("month", format!("{m:?} is not YYYY-MM")))
            }
            None => range_params(self.get("from"), self.get("to"), max_secs),
        }
    }

    /// `[from, to)` where both ends are optional (unbounded); `from` must be before `to`.
    pub fn open_range(&self) -> Result<(i64, i64), ApiError> {
        let from = self.time("from")?.unwrap_or(i64::MIN);
        let to = self.time("to")?.unwrap_or(i64::MAX);
        if from >= to {
            return Err(ApiError::bad_request("from", "from must be before to"));
        }
        Ok((from, to))
    }
}

/// `YYYY-MM` → the month's `[start, next month's start)`, for years 1970–9998.
pub fn month(s: &str) -> Option<(i64, i64)> {
    let (y, m) = s.split_once('-')?;
    let (y, m) = (y.parse::<i32>().ok()?, m.parse::<u32>().ok()?);
    if s.len() != 7 || !(1970..=9998).contains(&y) || !(1..=12).contains(&m) {
        return None;
    }
    let start = |y: i32, m: u32| {
        chrono::Utc
            .with_ymd_and_hms(y, m, 1, 0, 0, 0)
            .single()
            .map(|t| t.timestamp())
    };
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    Some((start(y, m)?, start(ny, nm)?))
}

/// Latest time a query may name: 9999-12-31T23:59:59Z. With times from 1970 on, every
/// difference and every rounding to a day boundary stays far inside 64 bits.
pub const LATEST_TIME: i64 = 253_402_300_799;

/// Parses a time query parameter: RFC 3339 or Unix seconds, from 1970 to the year 9999; 400
/// naming it otherwise.
pub fn time_param(name: &'static str, value: Option<&str>) -> Result<Option<i64>, ApiError> {
    value
        .map(|v| {
            let t = gpuledger_schema::trace::parse_timestamp(v).map_err(|e| {
                ApiError::bad_request(
                    name,
                    format!("{v:?} is not a time (RFC 3339 or Unix seconds): {e}"),
                )
            })?;
            if !(0..=LATEST_TIME).contains(&t) {
                return Err(ApiError::bad_request(
                    name,
                    format!("{v:?} is outside 1970-01-01 to 9999-12-31"),
                ));
            }
            Ok(t)
        })
        .transpose()
}

/// `[from, to)` from the query: `to` defaults to now, `from` to the start of `to`'s UTC month.
pub fn range_params(
    from: Option<&str>,
    to: Option<&str>,
    max_secs: i64,
) -> Result<(i64, i64), ApiError> {
    range_of(time_param("from", from)?, time_param("to", to)?, max_secs)
}

/// `[from, to)` from parsed times: `to` defaults to now, `from` to the start of `to`'s UTC
/// month; at most `max_secs` long.
pub fn range_of(from: Option<i64>, to: Option<i64>, max_secs: i64) -> Result<(i64, i64), ApiError> {
    use chrono::{Datelike, TimeZone};
    let to = to.unwrap_or_else(|| chrono::Utc::now().timestamp());
    let from = match from {
        Some(f) => f,
        None => {
            let t = chrono::Utc
                .timestamp_opt(to, 0)
                .single()
                .unwrap_or_default();
            chrono::Utc
                .with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
                .single()
                .map_or(to, |m| m.timestamp())
        }
    };
    if from >= to {
        return Err(ApiError::bad_request(
            "from",
            format!("from ({from}) must be before to ({to})"),
        ));
    }
    // Checked although the bounds above make it impossible: an overflow here once turned a
    // huge range into a month-to-date answer.
    match to.checked_sub(from) {
        Some(span) if span <= max_secs => Ok((from, to)),
        span => Err(ApiError::bad_request(
            "from",
            format!(
                "the range is {} s; at most {max_secs} s (the rollup retention) is kept",
                span.map_or_else(|| "more than 2^63".to_owned(), |s| s.to_string())
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kv: &[(&str, &str)], known: &[&str]) -> Result<Params, ApiError> {
        Params::checked(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            known,
        )
    }

    #[test]
    fn one_reading_of_unknowns_months_and_choices() {
        let e = params(&[("zz", "1"), ("bogus", "1")], &["from"]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("bogus"));
        let p = params(&[("month", "2026-02")], &["month", "from", "to"]).unwrap();
        assert_eq!(p.range(i64::MAX).unwrap(), (1_769_904_000, 1_772_323_200));
        let p = params(&[("month", "2026-02"), ("to", "0")], &["month", "to"]).unwrap();
        assert_eq!(
            p.range(i64::MAX).unwrap_err().field.as_deref(),
            Some("month")
        );
        let p = params(&[("month", "2026-2")], &["month"]).unwrap();
        assert_eq!(
            p.range(i64::MAX).unwrap_err().field.as_deref(),
            Some("month")
        );
        let p = params(&[("by", "x")], &["by"]).unwrap();
        let e = p
            .choice("by", 0, |s| (s == "y").then_some(1), "y")
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("by"));
        assert_eq!(p.choice("other", 7, |_| Some(1), "y").unwrap(), 7);
        let p = params(&[("from", "5"), ("to", "5")], &["from", "to"]).unwrap();
        assert_eq!(p.open_range().unwrap_err().field.as_deref(), Some("from"));
    }

    /// Regression: `showback?from=9223372036854775707&to=9223372036854775807` answered
    /// month-to-date totals and `fragmentation?from=i64::MIN&to=i64::MAX` slipped past the
    /// 400-day bound, through `to - from` overflowing.
    #[test]
    fn time_range_arithmetic_cannot_overflow() {
        let max = 400 * 86400;
        for (from, to, field) in [
            ("9223372036854775707", "9223372036854775807", "to"),
            ("-9223372036854775808", "9223372036854775807", "to"),
            ("-9223372036854775808", "1700000000", "from"),
            ("-1", "1700000000", "from"),
            ("0", "253402300800", "to"),
        ] {
            let e = range_params(Some(from), Some(to), max).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.field.as_deref()),
                (400, Some(field)),
                "{from}..{to}: {}",
                e.message
            );
        }
        let e = range_params(Some("0"), Some("253402300799"), max).unwrap_err();
        assert!(e.message.contains("at most"), "{}", e.message);
        assert_eq!(
            range_params(Some("1700000000"), Some("1700003600"), max).unwrap(),
            (1_700_000_000, 1_700_003_600)
        );
    }
}
