//! Keep-link tokens: the signed part of a notice's `keep_url` (`/keep/{token}`, docs/reclaim.md,
//! "Keep links").
//!
//! `token = "1.{kid}.{ep24}.{exp}.{sig}"`, where `ep24` is the 24 hex digits of the episode id,
//! `exp` the Unix second it expires and `sig` the unpadded base64url HMAC-SHA256, under key `kid`,
//! of `"gpuledger-keep\x1f1.{kid}.{ep24}.{exp}"`.
//!
//! Key decision: the token signs the episode id and nothing else. The id is itself a hash of the
//! GPU slice, the tenant, the workload and the first idle second
//! ([`crate::webhook::episode_id`]), so a valid token names exactly one episode of one workload,
//! is checked without reading the ledger, and whatever it keeps is read from the ledger's row of
//! that episode, never from the request.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The token format's version, its first field.
const VERSION: &str = "1";
/// What every signature starts with, so no other HMAC under the same key can pass as one.
const DOMAIN: &[u8] = b"gpuledger-keep\x1f";
/// Longest text a token may be (checked before anything is parsed).
pub const MAX_TOKEN_BYTES: usize = 128;

/// One signing key of the ring.
#[derive(Clone)]
pub struct Key {
    /// Its number (the token's `kid`).
    pub id: u32,
    /// The HMAC key.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Key {
    /// Never prints the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({}, …)", self.id)
    }
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The episode (`ep_` + 24 hex).
    pub episode_id: String,
    /// When it expires (Unix seconds).
    pub exp: i64,
    /// The key that signed it.
    pub kid: u32,
}

/// Why a token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeepError {
    /// Not a token of this form.
    #[error("not a keep-link token")]
    Malformed,
    /// Signed by a key this aggregator does not hold (another aggregator's, or a revoked key).
    #[error("signed by a key this aggregator does not hold")]
    UnknownKey,
    /// The signature does not match (the token was altered).
    #[error("the signature does not match")]
    BadSignature,
    /// A real token past its expiry.
    #[error("expired")]
    Expired,
}

fn mac(key: &Key, signed: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&key.secret).expect("HMAC takes any key length");
    mac.update(DOMAIN);
    mac.update(signed.as_bytes());
    mac
}

/// The 24 hex digits of an episode id `ep_…`, if it is one.
fn ep24(episode_id: &str) -> Option<&str> {
    let hex = episode_id.strip_prefix("ep_")?;
    (hex.len() == 24 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

/// The token for `episode_id` (an `ep_…` id), signed with `key`, expiring at `exp`; `None` when
/// the id is not an episode id.
pub fn sign(key: &Key, episode_id: &str, exp: i64) -> Option<String> {
    let ep = ep24(episode_id)?;
    let signed = format!("{VERSION}.{}.{ep}.{exp}", key.id);
    let sig = B64URL.encode(mac(key, &signed).finalize().into_bytes());
    Some(format!("{signed}.{sig}"))
}

/// Checks `token` against the keys of `ring` as of `now`. The signature is checked before the
/// expiry, so only a token this aggregator signed can be told it expired.
pub fn verify(ring: &[Key], token: &str, now: i64) -> Result<Claims, KeepError> {
    use subtle::ConstantTimeEq;
    if token.len() > MAX_TOKEN_BYTES {
        return Err(KeepError::Malformed);
    }
    let parts: Vec<&str> = token.split('.').collect();
    let [version, kid, ep, exp, sig] = parts[..] else {
        return Err(KeepError::Malformed);
    };
    let digits = |s: &str, most: usize| {
        !s.is_empty() && s.len() <= most && s.bytes().all(|b| b.is_ascii_digit())
    };
    if version != VERSION || !digits(kid, 9) || !digits(exp, 12) || sig.len() != 43 {
        return Err(KeepError::Malformed);
    }
    let episode_id = format!("ep_{ep}");
    if ep24(&episode_id).is_none() {
        return Err(KeepError::Malformed);
    }
    let given = B64URL.decode(sig).map_err(|_| KeepError::Malformed)?;
    let kid: u32 = kid.parse().map_err(|_| KeepError::Malformed)?;
    let exp: i64 = exp.parse().map_err(|_| KeepError::Malformed)?;
    let key = ring
        .iter()
        .find(|k| k.id == kid)
        .ok_or(KeepError::UnknownKey)?;
    let signed = &token[..token.len() - sig.len() - 1];
    let expected = mac(key, signed).finalize().into_bytes();
    if !bool::from(given.ct_eq(&expected)) {
        return Err(KeepError::BadSignature);
    }
    if now >= exp {
        return Err(KeepError::Expired);
    }
    Ok(Claims {
        episode_id,
        exp,
        kid,
    })
}

/// A MAC of `parts` under `key`, for short-lived values the keep page hands out and takes back
/// (its form token), unpadded base64url; `domain` keeps it apart from the tokens.
pub fn tag(key: &Key, domain: &str, parts: &[&str]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(&key.secret).expect("HMAC takes any key length");
    mac.update(domain.as_bytes());
    for p in parts {
        mac.update(b"\x1f");
        mac.update(p.as_bytes());
    }
    B64URL.encode(mac.finalize().into_bytes())
}

/// Whether `given` is [`tag`]`(key, domain, parts)`, compared in constant time.
pub fn tag_matches(key: &Key, domain: &str, parts: &[&str], given: &str) -> bool {
    use subtle::ConstantTimeEq;
    let expected = tag(key, domain, parts);
    expected.len() == given.len() && bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EP: &str = "ep_0123456789abcdef01234567";

    fn key(id: u32, byte: u8) -> Key {
        Key {
            id,
            secret: vec![byte; 32],
        }
    }

    #[test]
    fn a_signed_token_verifies_to_its_episode_until_it_expires() {
        let k = key(1, 7);
        let t = sign(&k, EP, 1000).unwrap();
        assert!(t.len() < 100, "{t}");
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        );
        let c = verify(std::slice::from_ref(&k), &t, 999).unwrap();
        assert_eq!((c.episode_id.as_str(), c.exp, c.kid), (EP, 1000, 1));
        assert_eq!(verify(&[k], &t, 1000), Err(KeepError::Expired));
    }

    #[test]
    fn every_altered_part_is_refused() {
        let k = key(1, 7);
        let t = sign(&k, EP, 1000).unwrap();
        let other = sign(&k, "ep_ffffffffffffffffffffffff", 1000).unwrap();
        let parts: Vec<&str> = t.split('.').collect();
        let swap = |i: usize, v: &str| {
            let mut p = parts.clone();
            p[i] = v;
            p.join(".")
        };
        let ring = [k];
        // another episode's id under this token's signature
        let other_ep = other.split('.').nth(2).unwrap();
        assert_eq!(
            verify(&ring, &swap(2, other_ep), 0),
            Err(KeepError::BadSignature)
        );
        // a later expiry
        assert_eq!(
            verify(&ring, &swap(3, "2000"), 0),
            Err(KeepError::BadSignature)
        );
        // one character of the signature
        let mut sig = parts[4].to_owned();
        let c = if sig.starts_with('A') { "B" } else { "A" };
        sig.replace_range(0..1, c);
        assert_eq!(
            verify(&ring, &swap(4, &sig), 0),
            Err(KeepError::BadSignature)
        );
        // a key the ring lacks
        assert_eq!(verify(&ring, &swap(1, "2"), 0), Err(KeepError::UnknownKey));
        for bad in [
            "",
            "garbage",
            "1.1.x.1.y",
            &swap(0, "2"),
            &format!("{t}.x"),
            &t[..t.len() - 1],
        ] {
            assert_eq!(verify(&ring, bad, 0), Err(KeepError::Malformed), "{bad}");
        }
        assert_eq!(sign(&ring[0], "not-an-episode", 1), None);
    }

    #[test]
    fn another_key_of_the_same_id_does_not_verify() {
        let t = sign(&key(1, 7), EP, 1000).unwrap();
        assert_eq!(verify(&[key(1, 8)], &t, 0), Err(KeepError::BadSignature));
        // a ring with the old key beside the new one (a rotation) still verifies it
        assert!(verify(&[key(2, 8), key(1, 7)], &t, 0).is_ok());
    }

    #[test]
    fn an_expired_token_with_a_bad_signature_is_forbidden_not_gone() {
        let t = sign(&key(1, 7), EP, 10).unwrap();
        assert_eq!(verify(&[key(1, 8)], &t, 100), Err(KeepError::BadSignature));
    }

    #[test]
    fn tags_are_bound_to_their_parts_and_key() {
        let k = key(1, 7);
        let t = tag(&k, "keep-form", &["a", "1"]);
        assert!(tag_matches(&k, "keep-form", &["a", "1"], &t));
        assert!(!tag_matches(&k, "keep-form", &["a", "2"], &t));
        assert!(!tag_matches(&k, "other", &["a", "1"], &t));
        assert!(!tag_matches(&key(1, 8), "keep-form", &["a", "1"], &t));
    }
}
