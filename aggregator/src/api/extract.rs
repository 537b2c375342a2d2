//! Typed request input: a handler's signature says what it needs, and every refusal is the one
//! JSON error shape naming the field.
//!
//! - [`Query<T>`]: the query string as `T`, a struct with one field per parameter (its
//!   declaration is the parameter's only declaration). A parameter `T` does not have, or one
//!   given twice, is a 400 naming it; a value that does not parse is a 400 naming its parameter.
//! - [`Admin`], [`Reader`]: the bearer token's role, checked before the handler runs (401 without
//!   a known token, 403 when the role may not do this).
//! - [`Json<T>`]: a JSON body as `T`, a 400 naming the field's path in the body.
//!
//! Key decision: the parameter names are read from `T`'s own serde declaration (the fields it
//! asks its deserializer for), so the list of known parameters cannot drift from the reads.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

use super::AppState;
use crate::auth::Role;
use crate::error::ApiError;

/// The query string as `T` (module doc).
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parse_query(parts.uri.query().unwrap_or_default()).map(Query)
    }
}

/// Reads a query string as `T` (module doc).
pub fn parse_query<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    let known = fields_of::<T>();
    let mut seen: Vec<String> = Vec::new();
    for (name, _) in url::form_urlencoded::parse(query.as_bytes()) {
        if !known.contains(&name.as_ref()) {
            return Err(ApiError::bad_request(
                name.into_owned(),
                format!(
                    "unknown parameter; this endpoint takes {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        if seen.iter().any(|s| *s == name) {
            return Err(ApiError::bad_request(
                name.into_owned(),
                "given more than once",
            ));
        }
        seen.push(name.into_owned());
    }
    let de = serde_urlencoded::Deserializer::new(url::form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "query".to_owned()
        } else {
            path
        };
        ApiError::bad_request(field, e.into_inner().to_string())
    })
}

/// The field names a struct asks its deserializer for: its parameters.
pub fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// A deserializer that only notes which fields a struct asks for.
struct Probe<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only a struct's fields are probed"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("probed"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// A request with a token whose role may read: every tenant (`scope` none) or one.
#[derive(Debug, Clone)]
pub struct Reader {
    /// The token's role.
    pub role: Role,
    /// `Some(tenant)` for a `tenant:` token: what it may see.
    pub scope: Option<String>,
}

impl FromRequestParts<AppState> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let role = app.tokens.authenticate(&parts.headers)?;
        let scope = role.read_scope()?.map(str::to_owned);
        Ok(Reader { role, scope })
    }
}

/// A request with an admin token.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        app.tokens.authenticate(&parts.headers)?.require_admin()?;
        Ok(Admin)
    }
}

/// A request with any known token, whatever its role (the handler decides).
#[derive(Debug, Clone)]
pub struct Caller(pub Role);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        Ok(Caller(app.tokens.authenticate(&parts.headers)?))
    }
}

/// A JSON request body as `T`: a 400 naming the field (its path in the body) otherwise, and
/// the body limits' 413 in the same shape.
#[derive(Debug, Clone)]
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> axum::extract::FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let bytes = <axum::body::Bytes as axum::extract::FromRequest<S>>::from_request(req, state)
            .await
            .map_err(|r| ApiError::status(r.status(), r.body_text()))?;
        crate::error::json_body(&bytes).map(Json)
    }
}

/// A time parameter: RFC 3339 or Unix seconds, from 1970 to the year 9999.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Time(pub i64);

impl<'de> serde::Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        super::params::parse_time(&v)
            .map(Time)
            .map_err(de::Error::custom)
    }
}

/// A calendar month parameter, `YYYY-MM` (years 1970–9998): its `[start, next month's start)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Month(pub i64, pub i64);

impl<'de> serde::Deserialize<'de> for Month {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        super::params::month(&v)
            .map(|(a, b)| Month(a, b))
            .ok_or_else(|| de::Error::custom(format!("{v:?} is not YYYY-MM")))
    }
}

/// A page's `limit` parameter: `default` when absent, else 1 to `max`; a 400 naming `limit`.
pub fn page_limit(given: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    let limit = given.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::bad_request(
            "limit",
            format!("must be 1 to {max}"),
        ))
    }
}

/// The range parameters most read endpoints take: `month=YYYY-MM`, or `from`/`to` (`to`
/// defaults to now, `from` to the start of `to`'s UTC month). Declared in each query struct
/// (serde cannot flatten into a struct that refuses unknown fields) and read here once.
pub fn range(
    month: Option<Month>,
    from: Option<Time>,
    to: Option<Time>,
    max_secs: i64,
) -> Result<(i64, i64), ApiError> {
    match month {
        Some(_) if from.is_some() || to.is_some() => Err(ApiError::bad_request(
            "month",
            "give either month, or from and to",
        )),
        Some(Month(a, b)) => Ok((a, b)),
        None => super::params::range_of(from.map(|t| t.0), to.map(|t| t.0), max_secs),
    }
}

/// `[from, to)` where both ends are optional (unbounded); `from` must be before `to`.
pub fn open_range(from: Option<Time>, to: Option<Time>) -> Result<(i64, i64), ApiError> {
    let from = from.map_or(i64::MIN, |t| t.0);
    let to = to.map_or(i64::MAX, |t| t.0);
    if from >= to {
        return Err(ApiError::bad_request("from", "from must be before to"));
    }
    Ok((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Q {
        from: Option<Time>,
        month: Option<Month>,
        limit: Option<u32>,
        group_by: Option<By>,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(rename_all = "snake_case")]
    enum By {
        Tenant,
        Workload,
    }

    fn field(q: &str) -> String {
        let e = parse_query::<Q>(q).unwrap_err();
        assert_eq!(e.status.as_u16(), 400, "{q}: {}", e.message);
        e.field.unwrap().into_owned()
    }

    #[test]
    fn an_unknown_parameter_is_a_400_naming_it() {
        assert_eq!(field("from=0&bogus=1"), "bogus");
        let e = parse_query::<Q>("zz=1").unwrap_err();
        assert!(
            e.message.contains("from, month, limit, group_by"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_bad_value_is_a_400_naming_its_parameter() {
        assert_eq!(field("from=yesterday"), "from");
        assert_eq!(field("month=2026-13"), "month");
        assert_eq!(field("limit=-1"), "limit");
        assert_eq!(field("group_by=node"), "group_by");
        assert_eq!(field("limit=1&limit=2"), "limit");
    }

    #[test]
    fn a_good_query_is_read_as_its_struct() {
        let q: Q = parse_query("from=1700000000&group_by=workload&limit=5").unwrap();
        assert_eq!(
            q,
            Q {
                from: Some(Time(1_700_000_000)),
                month: None,
                limit: Some(5),
                group_by: Some(By::Workload),
            }
        );
        assert_eq!(parse_query::<Q>("").unwrap().from, None);
        assert_eq!(fields_of::<Q>(), ["from", "month", "limit", "group_by"]);
    }

    #[test]
    fn month_and_from_together_are_refused() {
        let e = range(Some(Month(0, 10)), Some(Time(1)), None, i64::MAX).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("month"));
    }
}
