//! Bearer tokens: who may call what.
//!
//! The token file has one token per line, `<scope> <token>`, `#` starts a comment:
//!
//! ```text
//! node:gpu-h100-01  4c1f…   # ingest for that node only
//! node:*            9a0e…   # ingest for any node (a shared exporter token)
//! viewer            51b0…   # every read API (showback, hoarding, fragmentation), all tenants
//! tenant:team-a     c3d9…   # the read APIs, limited to team-a's own rows
//! admin             77d2…   # ingest for any node, every read API, and admin actions
//! ```
//!
//! A `tenant:` viewer sees only rows of its tenant; fleet-wide figures (capacity, unallocated,
//! stranded, other tenants' hoarding, per-GPU fragmentation) are withheld from it.
//!
//! `GPULEDGER_ADMIN_TOKEN` in the environment adds one `admin` token. Tokens are compared in
//! constant time, and every configured token is compared on every request, so the time taken
//! says nothing about which one matched.

use std::path::Path;

use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::api::error::ApiError;

/// The shortest token accepted: 16 characters (a guessable token is no authentication).
pub const MIN_TOKEN_LEN: usize = 16;

/// What a token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Ingest for this node only.
    Node(String),
    /// Ingest for any node.
    AnyNode,
    /// Read every tenant's data.
    Viewer,
    /// Read one tenant's own data.
    Tenant(String),
    /// Everything.
    Admin,
}

impl Role {
    /// Whether this role may ingest samples of `node`.
    pub fn may_ingest_for(&self, node: &str) -> bool {
        match self {
            Role::Node(n) => n == node,
            Role::AnyNode | Role::Admin => true,
            Role::Viewer | Role::Tenant(_) => false,
        }
    }

    /// What this role may read: `Ok(None)` every tenant, `Ok(Some(t))` only tenant `t`; node
    /// tokens read nothing (403).
    pub fn read_scope(&self) -> Result<Option<&str>, ApiError> {
        match self {
            Role::Admin | Role::Viewer => Ok(None),
            Role::Tenant(t) => Ok(Some(t)),
            Role::Node(_) | Role::AnyNode => Err(ApiError::forbidden(
                "authorization",
                "an exporter (node) token cannot read; use a viewer, tenant: or admin token",
            )),
        }
    }

    /// Whether this role may take admin actions.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Role::Admin => Ok(()),
            _ => Err(ApiError::forbidden(
                "authorization",
                "this needs an admin token",
            )),
        }
    }
}

/// The configured tokens.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<(Vec<u8>, Role)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a token.
        f.debug_struct("Tokens")
            .field("count", &self.entries.len())
            .finish()
    }
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file cannot be read.
    #[error("token file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is wrong.
    #[error("token file {path}:{line}: {problem}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// `GPULEDGER_ADMIN_TOKEN` is too short.
    #[error("GPULEDGER_ADMIN_TOKEN must be at least {MIN_TOKEN_LEN} characters")]
    ShortAdminToken,
}

impl Tokens {
    /// Reads a token file.
    pub fn from_file(path: &Path) -> Result<Tokens, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Tokens::parse(&path.display().to_string(), &text)
    }

    /// Parses the token file format; `name` is used in errors.
    pub fn parse(name: &str, text: &str) -> Result<Tokens, TokenError> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |problem: String| TokenError::Line {
                path: name.to_owned(),
                line: i + 1,
                problem,
            };
            let mut parts = line.split_whitespace();
            let (Some(scope), Some(token), None) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("expected `<scope> <token>`".into()));
            };
            let role = match scope {
                "admin" => Role::Admin,
                "node:*" => Role::AnyNode,
                "viewer" => Role::Viewer,
                s => match (s.strip_prefix("node:"), s.strip_prefix("tenant:")) {
                    (Some(n), _) if !n.is_empty() => Role::Node(n.to_owned()),
                    (_, Some(t)) if !t.is_empty() => Role::Tenant(t.to_owned()),
                    _ => {
                        return Err(bad(format!(
                            "unknown scope {scope:?} (expected node:NAME, node:*, viewer, tenant:NAME or admin)"
                        )));
                    }
                },
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(bad(format!(
                    "the token is shorter than {MIN_TOKEN_LEN} characters"
                )));
            }
            entries.push((token.as_bytes().to_vec(), role));
        }
        Ok(Tokens { entries })
    }

    /// Adds an admin token (from `GPULEDGER_ADMIN_TOKEN`).
    pub fn with_admin(mut self, token: &str) -> Result<Tokens, TokenError> {
        if token.len() < MIN_TOKEN_LEN {
            return Err(TokenError::ShortAdminToken);
        }
        self.entries.push((token.as_bytes().to_vec(), Role::Admin));
        Ok(self)
    }

    /// Whether any token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The role of the request's bearer token: 401 when there is none or it is unknown.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Role, ApiError> {
        let value = headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| ApiError::unauthorized("no Authorization header"))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| ApiError::unauthorized("expected `Authorization: Bearer <token>`"))?;
        let mut found: Option<&Role> = None;
        for (known, role) in &self.entries {
            if bool::from(known.as_slice().ct_eq(token.as_bytes())) && found.is_none() {
                found = Some(role);
            }
        }
        found
            .cloned()
            .ok_or_else(|| ApiError::unauthorized("unknown token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(t: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", format!("Bearer {t}").parse().unwrap());
        h
    }

    #[test]
    fn scopes_map_to_roles() {
        let t = Tokens::parse(
            "tokens",
            "# comment\nnode:n1 aaaaaaaaaaaaaaaa\nnode:* bbbbbbbbbbbbbbbb # shared\n\nadmin cccccccccccccccc\n",
        )
        .unwrap();
        assert_eq!(
            t.authenticate(&bearer("aaaaaaaaaaaaaaaa")).unwrap(),
            Role::Node("n1".into())
        );
        assert_eq!(
            t.authenticate(&bearer("bbbbbbbbbbbbbbbb")).unwrap(),
            Role::AnyNode
        );
        assert_eq!(
            t.authenticate(&bearer("cccccccccccccccc")).unwrap(),
            Role::Admin
        );
        assert_eq!(
            t.authenticate(&bearer("dddddddddddddddd"))
                .unwrap_err()
                .status
                .as_u16(),
            401
        );
        assert_eq!(
            t.authenticate(&HeaderMap::new())
                .unwrap_err()
                .status
                .as_u16(),
            401
        );
        assert!(Role::Node("n1".into()).may_ingest_for("n1"));
        assert!(!Role::Viewer.may_ingest_for("n1"));
        assert!(!Role::Tenant("a".into()).may_ingest_for("n1"));
        assert_eq!(Role::Tenant("a".into()).read_scope().unwrap(), Some("a"));
        assert_eq!(Role::Viewer.read_scope().unwrap(), None);
        assert!(Role::AnyNode.read_scope().is_err());
        assert!(!Role::Node("n1".into()).may_ingest_for("n2"));
    }

    #[test]
    fn bad_lines_are_named() {
        let e = Tokens::parse("t", "node:n1 short").unwrap_err().to_string();
        assert_eq!(e, "token file t:1: the token is shorter than 16 characters");
        let e = Tokens::parse("t", "\nreader xxxxxxxxxxxxxxxxxxxx")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("token file t:2: unknown scope \"reader\""),
            "{e}"
        );
        let e = Tokens::parse("t", "tenant: xxxxxxxxxxxxxxxxxxxx").unwrap_err();
        assert!(e.to_string().contains("unknown scope"), "{e}");
        let e = Tokens::parse("t", "admin").unwrap_err().to_string();
        assert!(e.contains("expected `<scope> <token>`"), "{e}");
        assert!(Tokens::default().with_admin("short").is_err());
    }
}
