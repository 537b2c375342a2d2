//! Who is reading a page: a bearer token (scripts), a signed-in session cookie (people), or a
//! trusted reverse proxy's header (single sign-on in front of gpuledger).
//!
//! Key decisions:
//! - A session is a random 256-bit id in a `Secure; HttpOnly; SameSite=Strict` cookie, mapped
//!   in memory to the role of the token it was exchanged for; the token itself is never stored
//!   in the browser. A restart signs everyone out (they sign in again), which is the price of
//!   keeping no credential on disk.
//! - Every form carries the session's CSRF token, and a POST whose `Origin` is not this host is
//!   refused: SameSite=Strict alone is not relied on.
//! - The proxy header is trusted only when configured, and maps user names to roles in config.

use cookie::{Cookie, SameSite};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header;
use base64::Engine;

use crate::auth::{Role, Tokens};
use crate::error::ApiError;

/// The session cookie's name.
pub const COOKIE: &str = "gpuledger_session";

/// The UI's settings (`[ui]` in the aggregator's config).
#[derive(Debug, Clone)]
pub struct UiSettings {
    /// How long a session lasts after sign-in.
    pub session_ttl: Duration,
    /// Mark the cookie `Secure` (default; switch off only behind nothing, on plain HTTP that is
    /// not loopback).
    pub cookie_secure: bool,
    /// A header set by a trusted reverse proxy naming the signed-in user, and each user's role.
    pub proxy: Option<ProxyAuth>,
}

impl Default for UiSettings {
    fn default() -> Self {
        UiSettings {
            session_ttl: Duration::from_secs(12 * 3600),
            cookie_secure: true,
            proxy: None,
        }
    }
}

/// Sign-in by a trusted proxy's header.
#[derive(Debug, Clone)]
pub struct ProxyAuth {
    /// The header (`X-Forwarded-User`, `X-Auth-Request-Email`, …).
    pub header: String,
    /// User → role.
    pub users: HashMap<String, Role>,
}

/// The `[ui]` table of the config file.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UiFile {
    /// `12h`.
    pub session_ttl: Option<String>,
    /// `true` (default).
    pub cookie_secure: Option<bool>,
    /// The trusted proxy's user header.
    pub proxy_user_header: Option<String>,
    /// User → scope (`finance`, `viewer`, `admin`, `tenant:NAME`).
    #[serde(default)]
    pub proxy_users: HashMap<String, String>,
}

impl UiFile {
    /// Checks and resolves it; errors name the key.
    pub fn resolve(self) -> Result<UiSettings, String> {
        let d = UiSettings::default();
        let session_ttl = match self.session_ttl {
            Some(s) => humantime::parse_duration(&s)
                .map_err(|e| format!("ui.session_ttl: {s:?} is not a duration: {e}"))?,
            None => d.session_ttl,
        };
        let proxy = match self.proxy_user_header {
            None if !self.proxy_users.is_empty() => {
                return Err("ui.proxy_users needs ui.proxy_user_header".into());
            }
            None => None,
            Some(h) => {
                axum::http::HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| format!("ui.proxy_user_header: {h:?} is not a header name"))?;
                let mut users = HashMap::new();
                for (user, scope) in self.proxy_users {
                    let role = match scope.as_str() {
                        "admin" => Role::Admin,
                        "viewer" | "finance" => Role::Viewer,
                        s => match s.strip_prefix("tenant:") {
                            Some(t) if !t.is_empty() => Role::Tenant(t.to_owned()),
                            _ => {
                                return Err(format!(
                                    "ui.proxy_users.{user:?}: {scope:?} is not admin, finance, viewer or tenant:NAME"
                                ));
                            }
                        },
                    };
                    users.insert(user, role);
                }
                Some(ProxyAuth { header: h, users })
            }
        };
        Ok(UiSettings {
            session_ttl,
            cookie_secure: self.cookie_secure.unwrap_or(d.cookie_secure),
            proxy,
        })
    }
}

#[derive(Debug, Clone)]
struct Session {
    role: Role,
    csrf: String,
    expires: Instant,
}

/// The signed-in sessions.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

/// 256 random bits from the operating system, URL-safe base64; an error (no entropy source)
/// refuses the sign-in rather than issuing a guessable id.
fn random_id() -> Result<String, getrandom::Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf))
}

/// Who a request is, for the pages.
#[derive(Debug, Clone)]
pub struct Reader {
    /// The role.
    pub role: Role,
    /// The session's CSRF token (cookie sessions only).
    pub csrf: Option<String>,
}

impl Reader {
    /// How the role is shown.
    pub fn label(&self) -> String {
        match &self.role {
            Role::Admin => "admin".into(),
            Role::Viewer => "finance / viewer".into(),
            Role::Tenant(t) => format!("tenant:{t}"),
            Role::Node(n) => format!("node:{n}"),
            Role::AnyNode => "node:*".into(),
        }
    }
}

impl Sessions {
    /// Starts a session for `role`; returns its id and CSRF token.
    pub fn create(&self, role: Role, ttl: Duration) -> Result<(String, String), getrandom::Error> {
        let (id, csrf) = (random_id()?, random_id()?);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        map.retain(|_, s| s.expires > now);
        map.insert(
            id.clone(),
            Session {
                role,
                csrf: csrf.clone(),
                expires: now + ttl,
            },
        );
        Ok((id, csrf))
    }

    fn get(&self, id: &str) -> Option<Session> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(id).filter(|s| s.expires > Instant::now()).cloned()
    }

    /// Ends a session.
    pub fn remove(&self, id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

/// The session id in the request's cookies.
pub fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE)
        .map(|c| c.value().to_owned())
}

/// The session cookie with `value`, for `max_age`.
fn cookie(value: &str, max_age: Duration, settings: &UiSettings) -> String {
    Cookie::build((COOKIE, value))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(settings.cookie_secure)
        .max_age(cookie::time::Duration::seconds(
            i64::try_from(max_age.as_secs()).unwrap_or(i64::MAX),
        ))
        .build()
        .to_string()
}

/// The `Set-Cookie` value for a new session.
pub fn set_cookie(id: &str, settings: &UiSettings) -> String {
    cookie(id, settings.session_ttl, settings)
}

/// The `Set-Cookie` value that ends a session.
pub fn clear_cookie(settings: &UiSettings) -> String {
    cookie("", Duration::ZERO, settings)
}

/// Who the request is: a bearer token first, then the session cookie, then the trusted proxy's
/// header. `Ok(None)`: nobody (the pages then ask to sign in); a bearer token that is wrong is a
/// 401, never a fall-back to the cookie.
pub fn reader(
    headers: &HeaderMap,
    tokens: &Tokens,
    sessions: &Sessions,
    settings: &UiSettings,
) -> Result<Option<Reader>, ApiError> {
    if headers.contains_key(header::AUTHORIZATION) {
        let role = tokens.authenticate(headers)?;
        role.read_scope()?;
        return Ok(Some(Reader { role, csrf: None }));
    }
    if let Some(s) = session_id(headers).and_then(|id| sessions.get(&id)) {
        return Ok(Some(Reader {
            role: s.role,
            csrf: Some(s.csrf),
        }));
    }
    if let Some(p) = &settings.proxy
        && let Some(user) = headers.get(p.header.as_str()).and_then(|v| v.to_str().ok())
    {
        return match p.users.get(user.trim()) {
            Some(role) => Ok(Some(Reader {
                role: role.clone(),
                csrf: None,
            })),
            None => Err(ApiError::forbidden(
                p.header.clone(),
                format!("{user:?} has no role in ui.proxy_users"),
            )),
        };
    }
    Ok(None)
}

/// Refuses a form POST that came from another site: its `Origin` (or, without one, its
/// `Sec-Fetch-Site`) must be this host.
pub fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let origin_host = origin.split_once("://").map(|(_, h)| h);
        if origin_host.is_some() && origin_host == host {
            return Ok(());
        }
        return Err(ApiError::forbidden(
            "origin",
            "a form posted from another site is refused",
        ));
    }
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some("cross-site") | Some("same-site") => Err(ApiError::forbidden(
            "sec-fetch-site",
            "a form posted from another site is refused",
        )),
        _ => Ok(()),
    }
}

/// Checks a form's CSRF token against the session's, in constant time.
pub fn check_csrf(reader: &Reader, sent: &str) -> Result<(), ApiError> {
    use subtle::ConstantTimeEq;
    match &reader.csrf {
        Some(c) if bool::from(c.as_bytes().ct_eq(sent.as_bytes())) => Ok(()),
        _ => Err(ApiError::forbidden(
            "csrf",
            "the form's CSRF token is wrong",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_random_and_expire() {
        let s = Sessions::default();
        let (a, _) = s.create(Role::Viewer, Duration::from_secs(60)).unwrap();
        let (b, _) = s.create(Role::Viewer, Duration::ZERO).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert!(s.get(&a).is_some());
        assert!(s.get(&b).is_none());
        s.remove(&a);
        assert!(s.get(&a).is_none());
    }

    #[test]
    fn cross_site_posts_are_refused() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:9836".parse().unwrap());
        h.insert(header::ORIGIN, "http://127.0.0.1:9836".parse().unwrap());
        assert!(same_origin(&h).is_ok());
        h.insert(header::ORIGIN, "https://evil.example".parse().unwrap());
        assert_eq!(
            same_origin(&h).unwrap_err().field.as_deref(),
            Some("origin")
        );
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(same_origin(&h).is_err());
    }

    #[test]
    fn proxy_users_need_a_known_scope() {
        let f = UiFile {
            proxy_user_header: Some("X-Forwarded-User".into()),
            proxy_users: [("ann".to_owned(), "boss".to_owned())]
                .into_iter()
                .collect(),
            ..UiFile::default()
        };
        assert!(f.resolve().unwrap_err().contains("ui.proxy_users.\"ann\""));
    }
}
