//! Bearer tokens: who may call what.
//!
//! The token file has one token per line, `<scope> <token>`, `#` starts a comment:
//!
//! ```text
//! node:gpu-h100-01  4c1f…   # ingest for that node only
//! node:*            9a0e…   # ingest for any node (a shared exporter token)
//! viewer            51b0…   # every read API (showback, hoarding, fragmentation), all tenants
//! finance           e8a4…   # the same as viewer: the pages, CSV and JSON of every tenant
//! tenant:team-a     c3d9…   # the read APIs, limited to team-a's own rows
//! admin             77d2…   # ingest for any node, every read API, and admin actions
//! ```
//!
//! A `tenant:` viewer sees only rows of its tenant; fleet-wide figures (capacity, unallocated,
//! stranded, other tenants' hoarding, per-GPU fragmentation) are withheld from it.
//!
//! `GPULEDGER_ADMIN_TOKEN` in the environment adds one `admin` token. Tokens are kept as their
//! SHA-256 digests, and a request's token is found by its digest: the time a look-up takes
//! depends on the digest of what was presented, which says nothing usable about a configured
//! token, and not on how many are configured. (A fleet has one token per node. Comparing every
//! configured token in constant time on every request is a visible share of the aggregator's CPU
//! at 1,250 nodes, docs/perf/ingest.md, "The request path's CPU: token look-up, and allocators".)

pub mod session;

use std::path::Path;

use std::collections::HashMap;

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

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
    /// Whether this role may ingest at all (checked before a body is read).
    pub fn may_ingest(&self) -> bool {
        matches!(self, Role::Node(_) | Role::AnyNode | Role::Admin)
    }

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
    /// (role, where it was configured: `file:line` or the variable's name), by [`TokenId`].
    entries: Vec<(Role, String)>,
    /// Each token's SHA-256 digest, to its index in `entries`.
    by_digest: HashMap<[u8; 32], usize>,
}

/// A token's SHA-256 digest.
fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Which configured token a request used: an index, stable for the process's life, for limits
/// kept per token (never the token itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenId(pub usize);

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
    /// One token configured twice: which scope it has would depend on the order.
    #[error("{second}: this token is already configured at {first}; each token must appear once")]
    Duplicate {
        /// Where it appeared first.
        first: String,
        /// Where it appeared again.
        second: String,
    },
}

impl Tokens {
    /// Reads a token file. A file that others than its owner and group may read or write is
    /// loaded with a warning naming the problem.
    pub fn from_file(path: &Path) -> Result<Tokens, TokenError> {
        let read = |source| TokenError::Read {
            path: path.display().to_string(),
            source,
        };
        let text = std::fs::read_to_string(path).map_err(read)?;
        if let Some(problem) = loose_permissions(&std::fs::metadata(path).map_err(read)?) {
            tracing::warn!(
                path = %path.display(),
                "The token file is {problem}; anyone on this machine can {}. Run `chmod 600` on it.",
                if problem.contains("writable") { "add a token" } else { "read the tokens" }
            );
        }
        Tokens::parse(&path.display().to_string(), &text)
    }

    /// Parses the token file format; `name` is used in errors.
    pub fn parse(name: &str, text: &str) -> Result<Tokens, TokenError> {
        let mut tokens = Tokens::default();
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
                // `finance` is another name for the same read-only, every-tenant role.
                "viewer" | "finance" => Role::Viewer,
                s => match (s.strip_prefix("node:"), s.strip_prefix("tenant:")) {
                    (Some(n), _) if !n.is_empty() => Role::Node(n.to_owned()),
                    (_, Some(t)) if !t.is_empty() => Role::Tenant(t.to_owned()),
                    _ => {
                        return Err(bad(format!(
                            "unknown scope {scope:?} (expected node:NAME, node:*, viewer, finance, tenant:NAME or admin)"
                        )));
                    }
                },
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(bad(format!(
                    "the token is shorter than {MIN_TOKEN_LEN} characters"
                )));
            }
            tokens.add(token, role, format!("{name}:{}", i + 1))?;
        }
        Ok(tokens)
    }

    fn add(&mut self, token: &str, role: Role, at: String) -> Result<(), TokenError> {
        match self.by_digest.entry(digest(token)) {
            std::collections::hash_map::Entry::Occupied(known) => Err(TokenError::Duplicate {
                first: self.entries[*known.get()].1.clone(),
                second: at,
            }),
            std::collections::hash_map::Entry::Vacant(place) => {
                place.insert(self.entries.len());
                self.entries.push((role, at));
                Ok(())
            }
        }
    }

    /// Adds an admin token (from `GPULEDGER_ADMIN_TOKEN`).
    pub fn with_admin(mut self, token: &str) -> Result<Tokens, TokenError> {
        if token.len() < MIN_TOKEN_LEN {
            return Err(TokenError::ShortAdminToken);
        }
        self.add(token, Role::Admin, "GPULEDGER_ADMIN_TOKEN".into())?;
        Ok(self)
    }

    /// Whether any token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The role of the request's bearer token: 401 when there is none or it is unknown.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Role, ApiError> {
        self.identify(headers).map(|(_, role)| role)
    }

    /// The token a request used and its role: 401 when there is none or it is unknown. The
    /// scheme is matched without regard to case (RFC 9110 §11.1).
    pub fn identify(&self, headers: &HeaderMap) -> Result<(TokenId, Role), ApiError> {
        let value = headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| ApiError::unauthorized("no Authorization header"))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| ApiError::unauthorized("expected `Authorization: Bearer <token>`"))?;
        self.by_digest
            .get(&digest(token))
            .map(|&i| (TokenId(i), self.entries[i].0.clone()))
            .ok_or_else(|| ApiError::unauthorized("unknown token"))
    }
}

/// What is wrong with a token file's permissions, if anything: readable or writable by others.
fn loose_permissions(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode();
    match (mode & 0o002 != 0, mode & 0o004 != 0) {
        (true, _) => Some("world-writable"),
        (false, true) => Some("world-readable"),
        (false, false) => None,
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
    fn each_of_many_node_tokens_is_its_own_and_near_misses_are_refused() {
        let text: String = (0..2000)
            .map(|n| format!("node:gpu-{n:04} node-token-{n:04}-0123456789\n"))
            .collect();
        let t = Tokens::parse("tokens", &text).unwrap();
        for n in [0, 1, 999, 1999] {
            let (id, role) = t
                .identify(&bearer(&format!("node-token-{n:04}-0123456789")))
                .unwrap();
            assert_eq!(id, TokenId(n));
            assert_eq!(role, Role::Node(format!("gpu-{n:04}")));
        }
        for near in [
            "node-token-0001-012345678",
            "node-token-0001-01234567890",
            "node-token-0001-0123456788",
            "NODE-TOKEN-0001-0123456789",
        ] {
            assert_eq!(t.identify(&bearer(near)).unwrap_err().status.as_u16(), 401);
        }
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

    /// Regression: the same token listed twice with different scopes was accepted and the first
    /// line won silently.
    #[test]
    fn the_same_token_twice_is_an_error_naming_both_lines() {
        let e = Tokens::parse(
            "tokens",
            "admin xxxxxxxxxxxxxxxxxxxx\n# a comment\ntenant:a xxxxxxxxxxxxxxxxxxxx\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "tokens:3: this token is already configured at tokens:1; each token must appear once"
        );
        let t = Tokens::parse("tokens", "tenant:a xxxxxxxxxxxxxxxxxxxx\n").unwrap();
        let e = t
            .with_admin("xxxxxxxxxxxxxxxxxxxx")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("GPULEDGER_ADMIN_TOKEN: "), "{e}");
    }

    /// Regression: `Authorization: bearer …` got 401; the scheme is case-insensitive.
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let t = Tokens::parse("t", "viewer xxxxxxxxxxxxxxxxxxxx").unwrap();
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            let mut h = HeaderMap::new();
            let value = format!("{scheme} xxxxxxxxxxxxxxxxxxxx");
            h.insert("authorization", value.parse().unwrap());
            assert_eq!(t.authenticate(&h).unwrap(), Role::Viewer, "{scheme}");
        }
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            "Basic xxxxxxxxxxxxxxxxxxxx".parse().unwrap(),
        );
        assert_eq!(t.authenticate(&h).unwrap_err().status.as_u16(), 401);
    }

    /// Regression: a world-readable or world-writable token file loaded without a warning.
    #[test]
    fn loose_token_file_permissions_are_named() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "viewer xxxxxxxxxxxxxxxxxxxx\n").unwrap();
        for (mode, expected) in [
            (0o600, None),
            (0o640, None),
            (0o644, Some("world-readable")),
            (0o666, Some("world-writable")),
            (0o602, Some("world-writable")),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(loose_permissions(&meta), expected, "{mode:o}");
        }
        assert!(Tokens::from_file(&path).is_ok(), "a warning, not an error");
    }
}
