//! The values query parameters and bodies name, read one way everywhere (the typed extractors of
//! [`super::extract`] use them): times are RFC 3339 or Unix seconds from 1970 to 9999, a month is
//! `YYYY-MM`, a range is the current month to date by default, and every difference is checked,
//! so no query value can overflow into a wrong answer.

use chrono::TimeZone;

use crate::error::ApiError;

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

/// Reads a time: RFC 3339 or Unix seconds, from 1970 to the year 9999; why not otherwise.
pub fn parse_time(v: &str) -> Result<i64, String> {
    let t = gpuledger_schema::trace::parse_timestamp(v)
        .map_err(|e| format!("{v:?} is not a time (RFC 3339 or Unix seconds): {e}"))?;
    if !(0..=LATEST_TIME).contains(&t) {
        return Err(format!("{v:?} is outside 1970-01-01 to 9999-12-31"));
    }
    Ok(t)
}

/// A time parameter or body field ([`parse_time`]); a 400 naming it otherwise.
pub fn time_param(name: &'static str, value: Option<&str>) -> Result<Option<i64>, ApiError> {
    value
        .map(|v| parse_time(v).map_err(|e| ApiError::bad_request(name, e)))
        .transpose()
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

    /// `[from, to)` from the two texts, `to` read first (as the handlers do).
    fn range_params(
        from: Option<&str>,
        to: Option<&str>,
        max: i64,
    ) -> Result<(i64, i64), ApiError> {
        let to = time_param("to", to)?;
        range_of(time_param("from", from)?, to, max)
    }

    #[test]
    fn months_are_read_for_years_1970_to_9998() {
        assert_eq!(month("2026-02"), Some((1_769_904_000, 1_772_323_200)));
        for bad in ["2026-2", "2026-13", "1969-12", "9999-01", "x"] {
            assert_eq!(month(bad), None, "{bad}");
        }
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
