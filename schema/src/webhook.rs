//! The reclaim webhooks: the events the aggregator sends (`schema/WEBHOOK.md`, JSON Schema in
//! `schema/webhook.schema.json`) and their signatures, per the Standard Webhooks specification.
//!
//! Key decision: an event's id is derived from its episode and its type ([`event_id`]), never
//! drawn at random, so a decision recomputed after late data, a retry or a restart carries the
//! same `webhook-id`, and a receiver that remembers the ids it acted on acts once.
//!
//! Signing: `webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, where
//! the key is the base64 part of a `whsec_…` secret; during a rotation one header carries a
//! signature per secret, space-separated, and a receiver accepts any of them.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The header with the event id.
pub const HEADER_ID: &str = "webhook-id";
/// The header with the attempt's Unix time in seconds.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// The header with the signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";
/// The prefix of a secret in the specification's form.
pub const SECRET_PREFIX: &str = "whsec_";
/// How far a webhook's timestamp may be from the receiver's clock (the specification's default).
pub const DEFAULT_TOLERANCE_SECS: i64 = 5 * 60;

/// What happened to an episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventType {
    /// An idle-hoarding episode was found (a notice to its owner).
    #[serde(rename = "hoarding.detected")]
    HoardingDetected,
    /// The policy asks the scheduler to take the allocation back.
    #[serde(rename = "reclaim.requested")]
    ReclaimRequested,
    /// A requested reclaim is withdrawn: activity resumed, or the allocation ended before the
    /// request was delivered.
    #[serde(rename = "reclaim.cancelled")]
    ReclaimCancelled,
    /// The episode ended (activity resumed or the allocation was released).
    #[serde(rename = "hoarding.resolved")]
    HoardingResolved,
    /// A tenant's month-end forecast went over its monthly budget (once per tenant and month).
    #[serde(rename = "budget.forecast_exceeded")]
    BudgetForecastExceeded,
    /// A tenant's spend this month reached its monthly budget (once per tenant and month).
    #[serde(rename = "budget.exceeded")]
    BudgetExceeded,
}

impl EventType {
    /// Every type: an episode's, in the order it can go through them, then a budget's.
    pub const ALL: [EventType; 6] = [
        EventType::HoardingDetected,
        EventType::ReclaimRequested,
        EventType::ReclaimCancelled,
        EventType::HoardingResolved,
        EventType::BudgetForecastExceeded,
        EventType::BudgetExceeded,
    ];

    /// Whether it is about a tenant's budget (its body is a [`BudgetEvent`]); otherwise about an
    /// idle-hoarding episode (an [`Event`]).
    pub fn is_budget(self) -> bool {
        matches!(
            self,
            EventType::BudgetForecastExceeded | EventType::BudgetExceeded
        )
    }

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::HoardingDetected => "hoarding.detected",
            EventType::ReclaimRequested => "reclaim.requested",
            EventType::ReclaimCancelled => "reclaim.cancelled",
            EventType::HoardingResolved => "hoarding.resolved",
            EventType::BudgetForecastExceeded => "budget.forecast_exceeded",
            EventType::BudgetExceeded => "budget.exceeded",
        }
    }

    /// The type named `s`.
    pub fn parse(s: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// What the policy does with a class's idle episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Tell the owner; never ask for the allocation back.
    Notify,
    /// Tell the owner, then ask for it back once idle long enough and after the notice period.
    Reclaim,
}

impl Action {
    /// The name in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Notify => "notify",
            Action::Reclaim => "reclaim",
        }
    }
}

/// The policy that applied to an episode, as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyData {
    /// The SLO class whose rule applied (`unclassified` when the holder has none).
    pub class: String,
    /// The action of that rule.
    pub action: Action,
    /// Idle seconds before a reclaim is requested (`null` for notify).
    pub after_seconds: Option<i64>,
    /// Seconds between the first delivered notice and the reclaim (`null` for notify).
    pub notice_seconds: Option<i64>,
    /// Which rule: `default`, `class`, or `override:<n>` (the n-th `[[reclaim.overrides]]`).
    pub rule: String,
    /// Why this event was sent, in a sentence.
    pub reason: String,
}

/// One episode as the events carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeData {
    /// The episode's stable id (see [`episode_id`]).
    pub episode_id: String,
    /// Tenant.
    pub tenant: Option<String>,
    /// Workload: `namespace/pod` (Kubernetes), the job id (Slurm), or what the static map says.
    pub workload: Option<String>,
    /// Node.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// GPU model.
    pub gpu_model: String,
    /// MIG profile (`null`: a whole GPU).
    pub mig_profile: Option<String>,
    /// GPU instance id (`null`: a whole GPU).
    pub gpu_instance_id: Option<i32>,
    /// SLO class of the holder.
    pub slo_class: Option<String>,
    /// Size in GPU-equivalents.
    pub gpu_equivalents: f64,
    /// The first idle second (RFC 3339).
    pub idle_since: String,
    /// The end of the episode (RFC 3339), `null` while open.
    pub ended_at: Option<String>,
    /// Seconds idle, to the last second the GPU reported.
    pub idle_seconds: i64,
    /// Mean SM activity (0–1) over the measured seconds of the episode.
    pub mean_sm_active: Option<f64>,
    /// Allocated − used GPU-seconds over the episode.
    pub idle_gpu_seconds: f64,
    /// Their cost at the price book's price.
    pub idle_cost: f64,
    /// The price book's currency.
    pub currency: String,
    /// The policy applied.
    pub policy: PolicyData,
    /// True when the aggregator runs with `dry_run`: the receiver must not act.
    pub dry_run: bool,
    /// The signed link at which a person keeps the workload for a while (`hoarding.detected`
    /// and `reclaim.requested` only, when the aggregator can make links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_url: Option<String>,
    /// Who holds it, as far as the ledger knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerData>,
}

/// Who holds an episode's GPU, as far as the ledger knows: read from the workload's name, what
/// the exporter's attribution sent (`owner`, `owner_ref`) and the tenant's
/// `[billing.tenants."NAME"]` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OwnerData {
    /// The pod's namespace (a `namespace/pod` workload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The pod's name (a `namespace/pod` workload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The Slurm job id (a numeric workload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// Who the workload runs for: the pod's owner label or annotation, or the Slurm job's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// What the workload belongs to, `Kind/name`: the pod's controller (`Job/train`) or the
    /// Slurm job's account (`Account/vision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_ref: Option<String>,
    /// The tenant's team.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The tenant's contact: a chat channel or a mail address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contact: Option<String>,
}

impl OwnerData {
    /// In a few words, for a message (`pod lab/nb-1, team vision, #ml-gpu`).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let of = self
            .owner_ref
            .as_ref()
            .map_or(String::new(), |r| format!(" of {r}"));
        match (&self.namespace, &self.name, &self.job_id) {
            (Some(ns), Some(n), _) => parts.push(format!("pod {ns}/{n}{of}")),
            (_, _, Some(j)) => parts.push(format!("job {j}{of}")),
            _ => parts.extend(self.owner_ref.clone()),
        }
        if let Some(o) = &self.owner {
            parts.push(format!("owner {o}"));
        }
        if let Some(t) = &self.team {
            parts.push(format!("team {t}"));
        }
        if let Some(c) = &self.contact {
            parts.push(c.clone());
        }
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(", ")
        }
    }
}

/// A tenant's month against its budget, as a `budget.*` event carries it (the figures of
/// `GET /api/v1/budgets` when the event was decided).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetData {
    /// `bud_` + 24 hex: a hash of tenant and month, the same for both of the month's events.
    pub notice_id: String,
    /// The tenant.
    pub tenant: String,
    /// The calendar month, `YYYY-MM`.
    pub month: String,
    /// The monthly budget.
    pub budget: f64,
    /// Spent so far this month (the bill's total).
    pub spent: f64,
    /// The month-end forecast.
    pub forecast: f64,
    /// spent / budget.
    pub spent_ratio: f64,
    /// forecast / budget.
    pub forecast_ratio: f64,
    /// The date (`YYYY-MM-DD`) the forecast reaches the budget, if it does this month.
    pub forecast_exceeds_on: Option<String>,
    /// The price book's currency.
    pub currency: String,
    /// How tenants are charged (`allocation` or `usage`).
    pub cost_mode: String,
}

/// A `budget.*` webhook body: `{"type", "timestamp", "data"}` like [`Event`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetEvent {
    /// `budget.forecast_exceeded` or `budget.exceeded`.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When it was decided (RFC 3339).
    pub timestamp: String,
    /// The tenant's month.
    pub data: BudgetData,
}

/// The id of a tenant's month (the `notice_id` of its budget events; their event ids come from it
/// through [`event_id`]).
pub fn budget_notice_id(tenant: &str, month: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"budget");
    h.update([0x1f]);
    h.update(tenant.as_bytes());
    h.update([0x1f]);
    h.update(month.as_bytes());
    format!("bud_{}", &hex(&h.finalize())[..24])
}

/// One webhook body: `{"type", "timestamp", "data"}` per Standard Webhooks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The event type.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When the decision was taken (RFC 3339).
    pub timestamp: String,
    /// The episode.
    pub data: EpisodeData,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An episode's stable id: a hash of what identifies it — the GPU slice, the holder and the first
/// idle second — so every recomputation of the same run names it the same way.
pub fn episode_id(
    gpu_uuid: &str,
    gpu_instance_id: Option<i32>,
    tenant: Option<&str>,
    workload: Option<&str>,
    started_at: i64,
) -> String {
    let mut h = Sha256::new();
    for part in [
        gpu_uuid,
        &gpu_instance_id.map_or_else(|| "-".into(), |g| g.to_string()),
        tenant.unwrap_or("\u{0}"),
        workload.unwrap_or("\u{0}"),
        &started_at.to_string(),
    ] {
        h.update(part.as_bytes());
        h.update([0x1f]);
    }
    format!("ep_{}", &hex(&h.finalize())[..24])
}

/// The id of the `kind` event of an episode: the same for every recomputation and every retry.
pub fn event_id(episode_id: &str, kind: EventType) -> String {
    let mut h = Sha256::new();
    h.update(episode_id.as_bytes());
    h.update([0x1f]);
    h.update(kind.as_str().as_bytes());
    format!("msg_{}", &hex(&h.finalize())[..32])
}

/// A signing key.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// A secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Not `whsec_` followed by base64.
    #[error("a webhook secret is whsec_ followed by base64 (the Standard Webhooks form)")]
    Form,
    /// Too short to be a key.
    #[error("a webhook secret must hold at least 24 bytes (it holds {0})")]
    Short(usize),
}

impl Secret {
    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let b64 = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::Form)?;
        let key = B64.decode(b64).map_err(|_| SecretError::Form)?;
        if key.len() < 24 {
            return Err(SecretError::Short(key.len()));
        }
        Ok(Secret(key))
    }

    /// The secret of `key` in the `whsec_` form.
    pub fn encode(key: &[u8]) -> String {
        format!("{SECRET_PREFIX}{}", B64.encode(key))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// `v1,<base64 signature>` of one attempt.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let sig = self.mac(id, timestamp, body).finalize().into_bytes();
        format!("v1,{}", B64.encode(sig))
    }
}

/// The `webhook-signature` header for an attempt: one signature per secret, space-separated.
pub fn signature_header(secrets: &[Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a webhook was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A header is missing or unreadable.
    #[error("the {0} header is missing or not text")]
    MissingHeader(&'static str),
    /// The timestamp is not a number.
    #[error("webhook-timestamp {0:?} is not Unix seconds")]
    BadTimestamp(String),
    /// The timestamp is too far from now (a replay, or a clock off).
    #[error("webhook-timestamp is {0} s from this receiver's clock; at most {1} s is accepted")]
    Stale(i64, i64),
    /// No signature matches any secret.
    #[error("no signature in webhook-signature matches a configured secret")]
    NoMatch,
}

/// Checks one delivery: `headers` looks a header up by name. Accepts when the timestamp is within
/// `tolerance` seconds of `now` and any `v1` signature matches any secret (compared in constant
/// time).
pub fn verify<'a>(
    secrets: &[Secret],
    header: impl Fn(&str) -> Option<&'a str>,
    body: &[u8],
    now: i64,
    tolerance: i64,
) -> Result<(), VerifyError> {
    use subtle::ConstantTimeEq;
    let id = header(HEADER_ID).ok_or(VerifyError::MissingHeader(HEADER_ID))?;
    let ts_text = header(HEADER_TIMESTAMP).ok_or(VerifyError::MissingHeader(HEADER_TIMESTAMP))?;
    let sigs = header(HEADER_SIGNATURE).ok_or(VerifyError::MissingHeader(HEADER_SIGNATURE))?;
    let ts: i64 = ts_text
        .trim()
        .parse()
        .map_err(|_| VerifyError::BadTimestamp(ts_text.to_owned()))?;
    let skew = now.saturating_sub(ts).saturating_abs();
    if skew > tolerance {
        return Err(VerifyError::Stale(skew, tolerance));
    }
    for secret in secrets {
        let expected = secret.mac(id, ts, body).finalize().into_bytes();
        for sig in sigs.split_whitespace() {
            let Some(b64) = sig.strip_prefix("v1,") else {
                continue;
            };
            if let Ok(given) = B64.decode(b64)
                && given.len() == expected.len()
                && bool::from(given.ct_eq(&expected))
            {
                return Ok(());
            }
        }
    }
    Err(VerifyError::NoMatch)
}

/// The time as RFC 3339 (UTC, seconds).
pub fn rfc3339(t: i64) -> String {
    chrono::DateTime::from_timestamp(t, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn secret() -> Secret {
        Secret::parse(&Secret::encode(KEY)).unwrap()
    }

    #[test]
    fn an_owner_reads_as_words_for_a_pod_a_slurm_job_and_a_bare_reference() {
        let slurm = OwnerData {
            job_id: Some("4242".into()),
            owner: Some("alice".into()),
            owner_ref: Some("Account/vision".into()),
            ..OwnerData::default()
        };
        assert_eq!(slurm.describe(), "job 4242 of Account/vision, owner alice");
        let pod = OwnerData {
            namespace: Some("lab".into()),
            name: Some("train-0".into()),
            owner_ref: Some("Job/train".into()),
            contact: Some("#ml".into()),
            ..OwnerData::default()
        };
        assert_eq!(pod.describe(), "pod lab/train-0 of Job/train, #ml");
        let bare = OwnerData {
            owner_ref: Some("Job/train".into()),
            ..OwnerData::default()
        };
        assert_eq!(bare.describe(), "Job/train");
        assert_eq!(OwnerData::default().describe(), "-");
    }

    /// The signature an independent implementation (the `standardwebhooks` crate) makes and
    /// checks agrees with ours both ways.
    #[test]
    fn signatures_agree_with_the_standard_webhooks_reference() {
        let wh = standardwebhooks::Webhook::new(&Secret::encode(KEY)).unwrap();
        let body = br#"{"type":"reclaim.requested","timestamp":"2026-01-01T00:00:00Z","data":{}}"#;
        let now = chrono::Utc::now().timestamp();
        let ours = secret().sign("msg_1", now, body);
        let theirs = wh.sign("msg_1", now, body).unwrap();
        assert_eq!(ours, theirs);
        let mut headers = http_headers("msg_1", now, &ours);
        wh.verify(body, &headers)
            .expect("the reference accepts ours");
        // Rotation: the old secret's signature first, the new one's second.
        let old = Secret(b"an-old-key-that-is-long-enough".to_vec());
        let both = signature_header(&[old, secret()], "msg_1", now, body);
        headers = http_headers("msg_1", now, &both);
        wh.verify(body, &headers)
            .expect("the reference accepts a rotation header");
        let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
        verify(&[secret()], get, body, now, DEFAULT_TOLERANCE_SECS).unwrap();
    }

    fn http_headers(id: &str, ts: i64, sig: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(HEADER_ID, id.parse().unwrap());
        h.insert(HEADER_TIMESTAMP, ts.to_string().parse().unwrap());
        h.insert(HEADER_SIGNATURE, sig.parse().unwrap());
        h
    }

    #[test]
    fn a_changed_body_a_wrong_key_or_an_old_timestamp_is_refused() {
        let body = b"{}";
        let now = 1_800_000_000;
        let sig = secret().sign("msg_1", now, body);
        let hdr = |id: &'static str, ts: String, sig: String| {
            move |h: &str| -> Option<String> {
                match h {
                    HEADER_ID => Some(id.to_owned()),
                    HEADER_TIMESTAMP => Some(ts.clone()),
                    HEADER_SIGNATURE => Some(sig.clone()),
                    _ => None,
                }
            }
        };
        let check = |h: &dyn Fn(&str) -> Option<String>, body: &[u8], now: i64| {
            let id = h(HEADER_ID);
            let ts = h(HEADER_TIMESTAMP);
            let sg = h(HEADER_SIGNATURE);
            let get = |n: &str| match n {
                HEADER_ID => id.as_deref(),
                HEADER_TIMESTAMP => ts.as_deref(),
                HEADER_SIGNATURE => sg.as_deref(),
                _ => None,
            };
            verify(&[secret()], get, body, now, 300)
        };
        let good = hdr("msg_1", now.to_string(), sig.clone());
        assert_eq!(check(&good, body, now), Ok(()));
        assert_eq!(check(&good, b"{ }", now), Err(VerifyError::NoMatch));
        assert_eq!(
            check(&hdr("msg_2", now.to_string(), sig.clone()), body, now),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            check(&good, body, now + 301),
            Err(VerifyError::Stale(301, 300))
        );
        let other = Secret(b"another-key-another-key-!".to_vec()).sign("msg_1", now, body);
        assert_eq!(
            check(&hdr("msg_1", now.to_string(), other), body, now),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            check(&hdr("msg_1", "soon".into(), sig), body, now),
            Err(VerifyError::BadTimestamp("soon".into()))
        );
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        let a = episode_id("GPU-1", Some(3), Some("t"), Some("ns/p"), 100);
        assert_eq!(
            a,
            episode_id("GPU-1", Some(3), Some("t"), Some("ns/p"), 100)
        );
        assert_ne!(a, episode_id("GPU-1", None, Some("t"), Some("ns/p"), 100));
        assert_ne!(
            a,
            episode_id("GPU-1", Some(3), Some("t"), Some("ns/p"), 160)
        );
        let ids: std::collections::HashSet<_> =
            EventType::ALL.iter().map(|&t| event_id(&a, t)).collect();
        assert_eq!(ids.len(), EventType::ALL.len());
        let month = budget_notice_id("t", "2026-11");
        assert_eq!(month, budget_notice_id("t", "2026-11"));
        assert_ne!(month, budget_notice_id("t", "2026-12"));
        assert_ne!(month, budget_notice_id("u", "2026-11"));
        assert!(month.starts_with("bud_") && month.len() == 28);
    }

    #[test]
    fn secrets_must_be_whsec_base64_of_enough_bytes() {
        assert_eq!(Secret::parse("abc").unwrap_err(), SecretError::Form);
        assert_eq!(Secret::parse("whsec_!!").unwrap_err(), SecretError::Form);
        assert_eq!(
            Secret::parse(&Secret::encode(b"short")).unwrap_err(),
            SecretError::Short(5)
        );
    }

    #[test]
    fn event_types_round_trip_their_wire_names() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
            assert_eq!(
                serde_json::to_string(&t).unwrap(),
                format!("\"{}\"", t.as_str())
            );
        }
    }
}
