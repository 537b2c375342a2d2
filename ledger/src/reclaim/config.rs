//! The reclaim settings: the aggregator config file's `[reclaim]`, `[[webhooks]]`, `[[notify]]`
//! and `[alertmanager]` tables (the key names are the contract of issue #12 and docs/reclaim.md, "The
//! policy"). Declared once, here, with their checks: the binary only deserializes and calls
//! [`ReclaimFile::resolve`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use gpuledger_schema::SloClass;
use gpuledger_schema::webhook::{Action, Secret};
use serde::Deserialize;

pub use gpuledger_schema::options::Span;

/// `[reclaim.classes.<class>]` and `[[reclaim.overrides]]`: what to do with idle episodes.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// notify | reclaim.
    pub action: Option<Action>,
    /// Idle time since the episode's start before a reclaim is requested.
    pub after: Option<Span>,
    /// Least time between the first delivered notice and the reclaim.
    pub notice: Option<Span>,
}

/// `[[reclaim.overrides]]`: a rule for some tenants or workloads (first match wins).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OverrideFile {
    /// The tenant it applies to (any when absent).
    pub tenant: Option<String>,
    /// A glob (`*`, `?`) over the workload (any when absent).
    pub workload: Option<String>,
    /// The SLO class it applies to (any when absent).
    pub class: Option<String>,
    /// The rule.
    #[serde(flatten)]
    pub rule: RuleFile,
}

/// `[[reclaim.exemptions]]`: workloads never reclaimed, always or in weekly windows (UTC).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExemptionFile {
    /// Tenant (any when absent).
    pub tenant: Option<String>,
    /// Glob over the workload (any when absent).
    pub workload: Option<String>,
    /// Days of the week (`mon` … `sun`); every day when absent.
    #[serde(default)]
    pub days: Vec<String>,
    /// Start of the daily window, `HH:MM` UTC (default `00:00`).
    pub from: Option<String>,
    /// End of the daily window, `HH:MM` UTC, exclusive (default `24:00`).
    pub to: Option<String>,
    /// Why, shown with each decision it causes.
    pub reason: Option<String>,
}

/// `[reclaim]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReclaimFile {
    /// Decide and deliver, but every event says `dry_run = true`.
    pub dry_run: Option<bool>,
    /// Never act on an episode whose GPU has not reported within this (default 2m).
    pub max_staleness: Option<Span>,
    /// Reclaims requested per pass at most (default 10).
    pub max_per_pass: Option<usize>,
    /// Reclaims requested per tenant per hour at most (default 5).
    pub max_per_tenant_per_hour: Option<usize>,
    /// Only reclaim episodes whose alert reached `POST /api/v1/alertmanager` within this long
    /// (so a silence in Alertmanager keeps the workload); off when absent.
    pub alertmanager_confirmation: Option<Span>,
    /// Per-class rules: `latency_critical`, `interactive`, `batch`, `unclassified`.
    #[serde(default)]
    pub classes: BTreeMap<String, RuleFile>,
    /// Per-tenant or per-workload rules, first match first.
    #[serde(default)]
    pub overrides: Vec<OverrideFile>,
    /// Exemptions.
    #[serde(default)]
    pub exemptions: Vec<ExemptionFile>,
    /// The aggregator's URL as the readers of a notice reach it; keep links start with it
    /// (default: `http://` and the listen address).
    pub public_url: Option<String>,
    /// How long a keep link works at most (default [`DEFAULT_LINK_TTL`]); it stops earlier when
    /// its episode ends.
    pub link_ttl: Option<Span>,
    /// The buttons of a keep link (default [`DEFAULT_KEEP_DURATIONS`]), each at most `max_keep`.
    pub keep_durations: Option<Vec<String>>,
    /// The longest one keep through a link may be (default [`DEFAULT_MAX_KEEP`], at most 7 days).
    pub max_keep: Option<Span>,
    /// The most kept through links per episode, in all (default [`DEFAULT_MAX_KEEP_PER_EPISODE`]);
    /// past it only an admin can exempt the workload.
    pub max_keep_per_episode: Option<Span>,
}

/// `[[webhooks]]`: one receiver.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookFile {
    /// Its name in metrics, logs and the API (default: the URL's host and port).
    pub name: Option<String>,
    /// Where events are POSTed.
    pub url: String,
    /// The signing secret, `whsec_…`.
    pub secret: Option<String>,
    /// Several secrets: every one signs each attempt (rotation).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// A file holding one secret per line.
    pub secret_file: Option<PathBuf>,
    /// How long one attempt may take (default 10s).
    pub timeout: Option<Span>,
    /// Give up on an event this long after it was created (default 3 days); it is then
    /// `failed` and can be retried from the admin API.
    pub max_age: Option<Span>,
    /// Only these event types (all when absent).
    #[serde(default)]
    pub events: Vec<String>,
}

/// `[[notify]]`: a chat channel's incoming webhook, sent a short message per event.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NotifyFile {
    /// Its name in metrics, logs and the API (required: the URL's path is a secret).
    pub name: Option<String>,
    /// `slack` (Slack, Mattermost, Rocket.Chat) or `teams` (a Teams Workflows webhook).
    pub kind: String,
    /// The incoming webhook's URL.
    pub url: Option<String>,
    /// A file holding the URL (so it can stay out of the config file).
    pub url_file: Option<PathBuf>,
    /// Only these tenants' events (all when absent, unless `channel` is set).
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Also the events of every tenant whose `contact` is this (`[billing.tenants."NAME"]`).
    pub channel: Option<String>,
    /// Only these event types (default [`DEFAULT_NOTIFY_EVENTS`]).
    #[serde(default)]
    pub events: Vec<String>,
    /// How long one attempt may take (default 10s).
    pub timeout: Option<Span>,
    /// Give up on a message this long after it was created (default 3 days).
    pub max_age: Option<Span>,
}

/// `[alertmanager]`: push open episodes to Alertmanager.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerFile {
    /// Alertmanager's base URL (`http://alertmanager:9093`).
    pub url: String,
    /// How often open episodes are re-sent (default 1m).
    pub interval: Option<Span>,
    /// A file holding a bearer token for Alertmanager, if it wants one.
    pub token_file: Option<PathBuf>,
}

/// A resolved rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// What to do.
    pub action: Action,
    /// Idle time before a reclaim.
    pub after: Duration,
    /// Notice period.
    pub notice: Duration,
}

/// A resolved override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Tenant, or any.
    pub tenant: Option<String>,
    /// Workload glob, or any.
    pub workload: Option<String>,
    /// Class name, or any.
    pub class: Option<String>,
    /// The rule (unset keys taken from the class's rule).
    pub rule: RuleFile,
}

/// A resolved configured exemption.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Tenant, or any.
    pub tenant: Option<String>,
    /// Workload glob, or any.
    pub workload: Option<String>,
    /// Days (0 = Monday); all when empty.
    pub days: Vec<u32>,
    /// Minute of the day it starts.
    pub from_minute: u32,
    /// Minute of the day it ends (exclusive; 1440 = midnight).
    pub to_minute: u32,
    /// Why.
    pub reason: String,
}

/// What an endpoint is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointKind {
    /// Signed events (`schema/WEBHOOK.md`), for a scheduler bridge.
    Webhook,
    /// A Slack incoming-webhook message (Block Kit; Mattermost and Rocket.Chat read its `text`).
    Slack,
    /// A Microsoft Teams Workflows message (an Adaptive Card).
    Teams,
}

impl EndpointKind {
    /// The name in config, and in the outbox's `channel` column.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointKind::Webhook => "webhook",
            EndpointKind::Slack => "slack",
            EndpointKind::Teams => "teams",
        }
    }
}

/// A resolved webhook or chat endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Name (metrics label, outbox key).
    pub name: String,
    /// URL.
    pub url: String,
    /// Signing secrets (none for chat).
    pub secrets: Vec<Secret>,
    /// Per-attempt timeout.
    pub timeout: Duration,
    /// When to give up.
    pub max_age: Duration,
    /// Event types it gets (all when empty).
    pub events: Vec<gpuledger_schema::webhook::EventType>,
    /// What it is sent.
    pub kind: EndpointKind,
    /// Only these tenants (all when empty and no channel).
    pub tenants: Vec<String>,
    /// Also the tenants whose contact is this.
    pub channel: Option<String>,
}

impl Endpoint {
    /// Whether it takes an event of `kind` about `tenant`, whose contact is `contact`.
    pub fn takes(
        &self,
        kind: gpuledger_schema::webhook::EventType,
        tenant: Option<&str>,
        contact: Option<&str>,
    ) -> bool {
        let typed = self.events.is_empty() || self.events.contains(&kind);
        let routed = (self.tenants.is_empty() && self.channel.is_none())
            || tenant.is_some_and(|t| self.tenants.iter().any(|x| x == t))
            || (self.channel.is_some() && self.channel.as_deref() == contact);
        typed && routed
    }
}

/// The keys that sign keep links, shared by every copy of the settings (a pass works on a clone;
/// a rotation replaces the keys for all of them). The first key signs; every key verifies.
#[derive(Clone, Default)]
pub struct KeyRing(Arc<RwLock<Vec<gpuledger_schema::keep::Key>>>);

impl std::fmt::Debug for KeyRing {
    /// Never prints a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyRing({} keys)", self.keys().len())
    }
}

impl KeyRing {
    /// Every key, the signing one first.
    pub fn keys(&self) -> Vec<gpuledger_schema::keep::Key> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The key that signs new links, if any.
    pub fn signing(&self) -> Option<gpuledger_schema::keep::Key> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .first()
            .cloned()
    }

    /// Replaces the keys (the signing one first).
    pub fn set(&self, keys: Vec<gpuledger_schema::keep::Key>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = keys;
    }
}

/// Keep links: where they point, what they offer and the keys that sign them.
#[derive(Debug, Clone)]
pub struct Links {
    /// The aggregator's public URL, without a trailing `/` (`None`: no links are made).
    pub public_url: Option<String>,
    /// How long a link works at most.
    pub ttl: Duration,
    /// The buttons: (as configured, e.g. `4h`; its length).
    pub durations: Vec<(String, Duration)>,
    /// Longest single keep.
    pub max_keep: Duration,
    /// Most kept through links per episode.
    pub max_per_episode: Duration,
    /// The signing keys (loaded from the ledger when the service opens it).
    pub keys: KeyRing,
}

impl Links {
    /// The keep link of `episode_id`, issued at `now`, when links can be made.
    pub fn url(&self, episode_id: &str, now: i64) -> Option<String> {
        let base = self.public_url.as_deref()?;
        let key = self.keys.signing()?;
        let token =
            gpuledger_schema::keep::sign(&key, episode_id, now + self.ttl.as_secs() as i64)?;
        Some(format!("{base}/keep/{token}"))
    }
}

/// Alertmanager push settings.
#[derive(Debug, Clone)]
pub struct Alertmanager {
    /// Base URL.
    pub url: String,
    /// Re-send interval.
    pub interval: Duration,
    /// Bearer token.
    pub token: Option<String>,
}

/// Everything about reclaim, resolved and checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Dry run.
    pub dry_run: bool,
    /// Staleness bound.
    pub max_staleness: Duration,
    /// Blast radius per pass.
    pub max_per_pass: usize,
    /// Blast radius per tenant per hour.
    pub max_per_tenant_per_hour: usize,
    /// Alertmanager as the gate.
    pub alertmanager_confirmation: Option<Duration>,
    /// Rule per class name (`latency_critical`, `interactive`, `batch`, `unclassified`).
    pub classes: BTreeMap<String, Rule>,
    /// Overrides.
    pub overrides: Vec<Override>,
    /// Configured exemptions.
    pub exemptions: Vec<Window>,
    /// Webhook receivers.
    pub endpoints: Vec<Endpoint>,
    /// Alertmanager push.
    pub alertmanager: Option<Alertmanager>,
    /// Keep links.
    pub links: Links,
}

/// The class name of holders without one.
pub const UNCLASSIFIED: &str = "unclassified";

/// The default notice period.
pub const DEFAULT_NOTICE: Duration = Duration::from_secs(15 * 60);
/// The default idle time before a reclaim.
pub const DEFAULT_AFTER: Duration = Duration::from_secs(3600);
/// How long a keep link works at most, by default.
pub const DEFAULT_LINK_TTL: Duration = Duration::from_secs(7 * 86400);
/// A keep link's buttons, by default.
pub const DEFAULT_KEEP_DURATIONS: [&str; 3] = ["4h", "8h", "24h"];
/// The longest single keep through a link, by default.
pub const DEFAULT_MAX_KEEP: Duration = Duration::from_secs(86400);
/// The most kept through links per episode, by default.
pub const DEFAULT_MAX_KEEP_PER_EPISODE: Duration = Duration::from_secs(72 * 3600);
/// The longest keep `max_keep` may allow (a longer one belongs in `[[reclaim.exemptions]]`).
pub const MOST_MAX_KEEP: Duration = Duration::from_secs(7 * 86400);
/// The events a `[[notify]]` channel gets when it names none: what a person can act on.
pub const DEFAULT_NOTIFY_EVENTS: [&str; 5] = [
    "hoarding.detected",
    "reclaim.requested",
    "reclaim.cancelled",
    "budget.forecast_exceeded",
    "budget.exceeded",
];

impl Default for Settings {
    /// A fresh install: every class notify-only, so nothing is ever evicted until an operator
    /// opts a class in.
    fn default() -> Self {
        let notify = Rule {
            action: Action::Notify,
            after: DEFAULT_AFTER,
            notice: DEFAULT_NOTICE,
        };
        Settings {
            dry_run: false,
            max_staleness: Duration::from_secs(120),
            max_per_pass: 10,
            max_per_tenant_per_hour: 5,
            alertmanager_confirmation: None,
            classes: SloClass::ALL
                .iter()
                .map(|c| c.as_str())
                .chain([UNCLASSIFIED])
                .map(|c| (c.to_owned(), notify))
                .collect(),
            overrides: Vec::new(),
            exemptions: Vec::new(),
            endpoints: Vec::new(),
            alertmanager: None,
            links: Links {
                public_url: None,
                ttl: DEFAULT_LINK_TTL,
                durations: DEFAULT_KEEP_DURATIONS
                    .iter()
                    .map(|d| {
                        let span = humantime::parse_duration(d).expect("the defaults parse");
                        ((*d).to_owned(), span)
                    })
                    .collect(),
                max_keep: DEFAULT_MAX_KEEP,
                max_per_episode: DEFAULT_MAX_KEEP_PER_EPISODE,
                keys: KeyRing::default(),
            },
        }
    }
}

/// A reclaim setting that cannot be used; names the key.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct ConfigError {
    /// The key, as written in the config file (`reclaim.classes.batch.after`).
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

fn err(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        problem: problem.into(),
    }
}

fn class_known(key: &str, class: &str) -> Result<(), ConfigError> {
    if class == UNCLASSIFIED || SloClass::ALL.iter().any(|c| c.as_str() == class) {
        Ok(())
    } else {
        Err(err(
            key,
            format!(
                "{class:?} is not an SLO class (latency_critical, interactive, batch, {UNCLASSIFIED})"
            ),
        ))
    }
}

fn minute_of_day(key: &str, text: &str) -> Result<u32, ConfigError> {
    let bad = || err(key, format!("{text:?} is not HH:MM (00:00 to 24:00)"));
    let (h, m) = text.split_once(':').ok_or_else(bad)?;
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if m >= 60 || h > 24 || (h == 24 && m != 0) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

impl ReclaimFile {
    /// Checks every key and resolves the defaults; `webhooks`, `notify` and `alertmanager` are
    /// the config file's other tables. Keys are checked in this order, so the first bad one is
    /// the one named: the limits, the keep links, the classes, the overrides, the exemptions, the
    /// webhooks and chat channels, Alertmanager.
    pub fn resolve(
        self,
        webhooks: Vec<WebhookFile>,
        notify: Vec<NotifyFile>,
        alertmanager: Option<AlertmanagerFile>,
    ) -> Result<Settings, ConfigError> {
        let mut s = Settings::default();
        self.limits(&mut s)?;
        self.links(&mut s.links)?;
        for (class, rule) in self.classes {
            class_known(&format!("reclaim.classes.{class}"), &class)?;
            let rule = rule.resolve(&class, s.classes[&class]);
            s.classes.insert(class, rule);
        }
        s.overrides = (self.overrides.into_iter().enumerate())
            .map(|(i, o)| o.resolve(i))
            .collect::<Result<_, _>>()?;
        s.exemptions = (self.exemptions.into_iter().enumerate())
            .map(|(i, e)| e.resolve(i))
            .collect::<Result<_, _>>()?;
        s.endpoints = endpoints(webhooks, notify)?;
        if let Some(a) = alertmanager {
            s.alertmanager = Some(a.resolve()?);
        }
        Ok(s)
    }

    /// The dry-run switch, the staleness bound, the two caps and the Alertmanager gate.
    fn limits(&self, s: &mut Settings) -> Result<(), ConfigError> {
        s.dry_run = self.dry_run.unwrap_or(s.dry_run);
        if let Some(Span(d)) = self.max_staleness {
            if d.is_zero() {
                return Err(err("reclaim.max_staleness", "must be more than 0s"));
            }
            s.max_staleness = d;
        }
        for (key, v, slot) in [
            (
                "reclaim.max_per_pass",
                self.max_per_pass,
                &mut s.max_per_pass,
            ),
            (
                "reclaim.max_per_tenant_per_hour",
                self.max_per_tenant_per_hour,
                &mut s.max_per_tenant_per_hour,
            ),
        ] {
            if let Some(n) = v {
                if n == 0 {
                    return Err(err(
                        key,
                        "must be at least 1 (use action = \"notify\" to never reclaim)",
                    ));
                }
                *slot = n;
            }
        }
        s.alertmanager_confirmation = self.alertmanager_confirmation.map(|d| d.0);
        Ok(())
    }
}

impl ReclaimFile {
    /// The keep links' keys: each duration at most `max_keep`, `max_keep` at most a week and at
    /// most `max_keep_per_episode`, `public_url` an http(s) URL without a query.
    fn links(&self, l: &mut Links) -> Result<(), ConfigError> {
        let positive = |key: &str, v: Option<Span>, slot: &mut Duration| match v {
            Some(Span(d)) if d.is_zero() => Err(err(key, "must be more than 0s")),
            Some(Span(d)) => {
                *slot = d;
                Ok(())
            }
            None => Ok(()),
        };
        positive("reclaim.link_ttl", self.link_ttl, &mut l.ttl)?;
        positive("reclaim.max_keep", self.max_keep, &mut l.max_keep)?;
        positive(
            "reclaim.max_keep_per_episode",
            self.max_keep_per_episode,
            &mut l.max_per_episode,
        )?;
        if l.max_keep > MOST_MAX_KEEP {
            return Err(err(
                "reclaim.max_keep",
                "must be at most 7d; a longer exemption belongs in [[reclaim.exemptions]]",
            ));
        }
        if l.max_per_episode < l.max_keep {
            return Err(err(
                "reclaim.max_keep_per_episode",
                "must be at least max_keep",
            ));
        }
        if let Some(ds) = &self.keep_durations {
            if ds.is_empty() {
                return Err(err("reclaim.keep_durations", "names no duration"));
            }
            l.durations = Vec::new();
            for (i, d) in ds.iter().enumerate() {
                let key = format!("reclaim.keep_durations[{i}]");
                let span = humantime::parse_duration(d)
                    .map_err(|e| err(&key, format!("{d:?} is not a duration: {e}")))?;
                if span.is_zero() {
                    return Err(err(key, "must be more than 0s"));
                }
                if l.durations.iter().any(|(t, _)| t == d) {
                    return Err(err(key, format!("{d} is listed twice")));
                }
                l.durations.push((d.clone(), span));
            }
        }
        if let Some((i, (d, _))) =
            (l.durations.iter().enumerate()).find(|(_, (_, s))| *s > l.max_keep)
        {
            return Err(err(
                format!("reclaim.keep_durations[{i}]"),
                format!("{d} is over max_keep"),
            ));
        }
        if let Some(u) = &self.public_url {
            l.public_url = Some(public_url(u)?);
        }
        Ok(())
    }
}

/// `reclaim.public_url` checked (http or https, no query or fragment), without a trailing `/`.
pub fn public_url(text: &str) -> Result<String, ConfigError> {
    let key = "reclaim.public_url";
    let url = url::Url::parse(text).map_err(|e| err(key, format!("{text:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(err(key, "must be http or https"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(err(key, "must have no query or fragment"));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

impl RuleFile {
    /// `reclaim.classes.<class>`: what it sets, over the class's default rule `base`.
    fn resolve(self, class: &str, base: Rule) -> Rule {
        let action = self.action.unwrap_or(base.action);
        if action == Action::Reclaim && class == SloClass::LatencyCritical.as_str() {
            tracing::warn!(
                "reclaim.classes.latency_critical has action = \"reclaim\": latency-critical work will be reclaimed when idle"
            );
        }
        Rule {
            action,
            after: self.after.map_or(base.after, |d| d.0),
            notice: self.notice.map_or(base.notice, |d| d.0),
        }
    }
}

impl OverrideFile {
    /// `reclaim.overrides[i]`.
    fn resolve(self, i: usize) -> Result<Override, ConfigError> {
        if let Some(c) = &self.class {
            class_known(&format!("reclaim.overrides[{i}].class"), c)?;
        }
        if self.tenant.is_none() && self.workload.is_none() && self.class.is_none() {
            return Err(err(
                format!("reclaim.overrides[{i}]"),
                "names no tenant, workload or class; set the class's rule instead",
            ));
        }
        Ok(Override {
            tenant: self.tenant,
            workload: self.workload,
            class: self.class,
            rule: self.rule,
        })
    }
}

impl ExemptionFile {
    /// `reclaim.exemptions[i]`: its days and its window within them.
    fn resolve(self, i: usize) -> Result<Window, ConfigError> {
        let key = format!("reclaim.exemptions[{i}]");
        let mut days = Vec::new();
        for d in &self.days {
            let n = DAYS
                .iter()
                .position(|x| x.eq_ignore_ascii_case(d))
                .ok_or_else(|| {
                    err(
                        format!("{key}.days"),
                        format!("{d:?} is not one of {DAYS:?}"),
                    )
                })?;
            days.push(n as u32);
        }
        let from_minute = minute_of_day(
            &format!("{key}.from"),
            self.from.as_deref().unwrap_or("00:00"),
        )?;
        let to_minute = minute_of_day(&format!("{key}.to"), self.to.as_deref().unwrap_or("24:00"))?;
        if from_minute >= to_minute {
            return Err(err(format!("{key}.to"), "must be after from"));
        }
        Ok(Window {
            tenant: self.tenant,
            workload: self.workload,
            days,
            from_minute,
            to_minute,
            reason: self
                .reason
                .unwrap_or_else(|| format!("configured exemption {i}")),
        })
    }
}

/// `[[webhooks]]` and `[[notify]]`: each receiver, and no two of one name.
fn endpoints(
    webhooks: Vec<WebhookFile>,
    notify: Vec<NotifyFile>,
) -> Result<Vec<Endpoint>, ConfigError> {
    let mut endpoints = (webhooks.into_iter().enumerate())
        .map(|(i, w)| w.resolve(i))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, n) in notify.into_iter().enumerate() {
        endpoints.push(n.resolve(i)?);
    }
    let mut names: Vec<&str> = endpoints.iter().map(|e| e.name.as_str()).collect();
    names.sort();
    if let Some(d) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(
            "webhooks",
            format!("two endpoints are named {:?}; give each a name", d[0]),
        ));
    }
    Ok(endpoints)
}

impl WebhookFile {
    fn resolve(self, i: usize) -> Result<Endpoint, ConfigError> {
        let key = format!("webhooks[{i}]");
        let url = url::Url::parse(&self.url).map_err(|e| {
            err(
                format!("{key}.url"),
                format!("{:?} is not a URL: {e}", self.url),
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(err(format!("{key}.url"), "must be http or https"));
        }
        let mut texts: Vec<(String, String)> = Vec::new();
        if let Some(s) = self.secret {
            texts.push((format!("{key}.secret"), s));
        }
        for (j, s) in self.secrets.into_iter().enumerate() {
            texts.push((format!("{key}.secrets[{j}]"), s));
        }
        if let Some(path) = &self.secret_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                err(
                    format!("{key}.secret_file"),
                    format!("{}: {e}", path.display()),
                )
            })?;
            for (j, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                texts.push((
                    format!("{key}.secret_file line {}", j + 1),
                    line.trim().to_owned(),
                ));
            }
        }
        if texts.is_empty() {
            return Err(err(
                format!("{key}.secret"),
                "every webhook is signed: set secret, secrets or secret_file (whsec_…)",
            ));
        }
        let secrets = texts
            .into_iter()
            .map(|(k, t)| Secret::parse(&t).map_err(|e| err(k, e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut events = Vec::new();
        for e in &self.events {
            events.push(
                gpuledger_schema::webhook::EventType::parse(e).ok_or_else(|| {
                    err(
                        format!("{key}.events"),
                        format!("{e:?} is not an event type"),
                    )
                })?,
            );
        }
        let name = self.name.unwrap_or_else(|| {
            format!(
                "{}:{}",
                url.host_str().unwrap_or("?"),
                url.port_or_known_default().unwrap_or(0)
            )
        });
        Ok(Endpoint {
            name,
            url: self.url,
            secrets,
            timeout: self.timeout.map_or(Duration::from_secs(10), |d| d.0),
            max_age: self.max_age.map_or(Duration::from_secs(3 * 86400), |d| d.0),
            events,
            kind: EndpointKind::Webhook,
            tenants: Vec::new(),
            channel: None,
        })
    }
}

fn event_types(
    key: &str,
    names: &[String],
) -> Result<Vec<gpuledger_schema::webhook::EventType>, ConfigError> {
    names
        .iter()
        .map(|e| {
            gpuledger_schema::webhook::EventType::parse(e)
                .ok_or_else(|| err(key, format!("{e:?} is not an event type")))
        })
        .collect()
}

impl NotifyFile {
    fn resolve(self, i: usize) -> Result<Endpoint, ConfigError> {
        let key = format!("notify[{i}]");
        let name = self.name.ok_or_else(|| {
            err(
                format!("{key}.name"),
                "a chat endpoint needs a name (its URL is a secret, never shown)",
            )
        })?;
        let kind = match self.kind.as_str() {
            "slack" => EndpointKind::Slack,
            "teams" => EndpointKind::Teams,
            k => {
                return Err(err(
                    format!("{key}.kind"),
                    format!("{k:?} is not slack or teams"),
                ));
            }
        };
        let url = match (self.url, &self.url_file) {
            (Some(u), None) => u,
            (None, Some(p)) => std::fs::read_to_string(p)
                .map_err(|e| err(format!("{key}.url_file"), format!("{}: {e}", p.display())))?
                .trim()
                .to_owned(),
            _ => {
                return Err(err(
                    format!("{key}.url"),
                    "set url or url_file, one of them",
                ));
            }
        };
        // The URL is a secret: the error never repeats it.
        match url::Url::parse(&url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => return Err(err(format!("{key}.url"), "must be an http or https URL")),
        }
        let events = if self.events.is_empty() {
            let names: Vec<String> = DEFAULT_NOTIFY_EVENTS.iter().map(|e| (*e).into()).collect();
            event_types(&format!("{key}.events"), &names)?
        } else {
            event_types(&format!("{key}.events"), &self.events)?
        };
        Ok(Endpoint {
            name,
            url,
            secrets: Vec::new(),
            timeout: self.timeout.map_or(Duration::from_secs(10), |d| d.0),
            max_age: self.max_age.map_or(Duration::from_secs(3 * 86400), |d| d.0),
            events,
            kind,
            tenants: self.tenants,
            channel: self.channel,
        })
    }
}

impl AlertmanagerFile {
    fn resolve(self) -> Result<Alertmanager, ConfigError> {
        url::Url::parse(&self.url).map_err(|e| {
            err(
                "alertmanager.url",
                format!("{:?} is not a URL: {e}", self.url),
            )
        })?;
        let token = match &self.token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| err("alertmanager.token_file", format!("{}: {e}", p.display())))?
                    .trim()
                    .to_owned(),
            ),
            None => None,
        };
        Ok(Alertmanager {
            url: self.url.trim_end_matches('/').to_owned(),
            interval: self.interval.map_or(Duration::from_secs(60), |d| d.0),
            token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Settings, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct F {
            #[serde(default)]
            reclaim: ReclaimFile,
            #[serde(default)]
            webhooks: Vec<WebhookFile>,
            #[serde(default)]
            notify: Vec<NotifyFile>,
            alertmanager: Option<AlertmanagerFile>,
        }
        let f: F = toml::from_str(text).map_err(|e| e.to_string())?;
        f.reclaim
            .resolve(f.webhooks, f.notify, f.alertmanager)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_fresh_install_never_reclaims() {
        let s = parse("").unwrap();
        assert!(s.classes.values().all(|r| r.action == Action::Notify));
        assert_eq!(s.classes.len(), 4);
    }

    #[test]
    fn the_keep_link_defaults_are_the_constants() {
        let l = parse("").unwrap().links;
        assert_eq!(l.ttl, DEFAULT_LINK_TTL);
        assert_eq!(l.max_keep, DEFAULT_MAX_KEEP);
        assert_eq!(l.max_per_episode, DEFAULT_MAX_KEEP_PER_EPISODE);
        let texts: Vec<&str> = l.durations.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(texts, DEFAULT_KEEP_DURATIONS);
        assert_eq!(
            l.public_url, None,
            "filled from the listen address by the service"
        );
    }

    #[test]
    fn keep_link_and_notify_errors_name_the_key() {
        for (text, key) in [
            (
                "[reclaim]\nkeep_durations = [\"4h\", \"48h\"]",
                "reclaim.keep_durations[1]",
            ),
            (
                "[reclaim]\nkeep_durations = [\"soon\"]",
                "reclaim.keep_durations[0]",
            ),
            ("[reclaim]\nmax_keep = \"8d\"", "reclaim.max_keep"),
            (
                "[reclaim]\nmax_keep_per_episode = \"1h\"",
                "reclaim.max_keep_per_episode",
            ),
            ("[reclaim]\npublic_url = \"ftp://x\"", "reclaim.public_url"),
            (
                "[reclaim]\npublic_url = \"http://x/?a=1\"",
                "reclaim.public_url",
            ),
            (
                "[[notify]]\nkind = \"slack\"\nurl = \"http://x\"",
                "notify[0].name",
            ),
            (
                "[[notify]]\nname = \"c\"\nkind = \"irc\"\nurl = \"http://x\"",
                "notify[0].kind",
            ),
            (
                "[[notify]]\nname = \"c\"\nkind = \"slack\"",
                "notify[0].url",
            ),
            (
                "[[notify]]\nname = \"c\"\nkind = \"slack\"\nurl = \"http://x\"\nevents = [\"x\"]",
                "notify[0].events",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(key), "{text}: {e}");
        }
        let e = parse("[reclaim]\nkeep_durations = [\"4h\", \"48h\"]").unwrap_err();
        assert!(e.ends_with("48h is over max_keep"), "{e}");
        let s = parse("[reclaim]\npublic_url = \"https://gpu.example/ledger/\"").unwrap();
        assert_eq!(
            s.links.public_url.as_deref(),
            Some("https://gpu.example/ledger")
        );
    }

    #[test]
    fn a_chat_channel_takes_its_tenants_and_its_contacts_events() {
        let s = parse(
            "[[notify]]\nname = \"ml\"\nkind = \"slack\"\nurl = \"http://x\"\ntenants = [\"ml\"]\nchannel = \"#gpu\"",
        )
        .unwrap();
        let ep = &s.endpoints[0];
        use gpuledger_schema::webhook::EventType as T;
        assert_eq!(ep.kind, EndpointKind::Slack);
        assert!(ep.secrets.is_empty());
        assert!(ep.takes(T::HoardingDetected, Some("ml"), None));
        assert!(ep.takes(T::ReclaimRequested, Some("cv"), Some("#gpu")));
        assert!(!ep.takes(T::ReclaimRequested, Some("cv"), Some("#other")));
        assert!(
            !ep.takes(T::HoardingResolved, Some("ml"), None),
            "not a default event"
        );
    }

    #[test]
    fn the_issue_example_parses() {
        let secret = Secret::encode(b"0123456789abcdef01234567");
        let s = parse(&format!(
            r#"
            [reclaim]
            dry_run = false
            max_staleness = "2m"
            [reclaim.classes.latency_critical]
            action = "notify"
            [reclaim.classes.interactive]
            action = "reclaim"
            after = "1h"
            notice = "15m"
            [reclaim.classes.batch]
            action = "reclaim"
            after = "30m"
            [[webhooks]]
            url = "https://scheduler-bridge.example/hooks/gpuledger"
            secret = "{secret}"
            "#
        ))
        .unwrap();
        assert_eq!(s.classes["interactive"].action, Action::Reclaim);
        assert_eq!(s.classes["batch"].after, Duration::from_secs(1800));
        assert_eq!(s.classes["batch"].notice, DEFAULT_NOTICE);
        assert_eq!(s.classes["latency_critical"].action, Action::Notify);
        assert_eq!(s.endpoints[0].name, "scheduler-bridge.example:443");
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            (
                "[reclaim.classes.gold]\naction = \"reclaim\"",
                "reclaim.classes.gold",
            ),
            ("[reclaim]\nmax_per_pass = 0", "reclaim.max_per_pass"),
            ("[[webhooks]]\nurl = \"http://x\"", "webhooks[0].secret"),
            (
                "[[webhooks]]\nurl = \"http://x\"\nsecret = \"nope\"",
                "webhooks[0].secret",
            ),
            (
                "[[reclaim.exemptions]]\ndays = [\"funday\"]",
                "reclaim.exemptions[0].days",
            ),
            (
                "[[reclaim.exemptions]]\nfrom = \"25:00\"",
                "reclaim.exemptions[0].from",
            ),
            (
                "[[reclaim.overrides]]\naction = \"reclaim\"",
                "reclaim.overrides[0]",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(key), "{text}: {e}");
        }
        let secret = Secret::encode(b"0123456789abcdef01234567");
        let hook = format!("[[webhooks]]\nurl = \"http://x:1/a\"\nsecret = \"{secret}\"\n");
        for (text, key) in [
            (
                "[reclaim]\nmax_staleness = \"0s\"".to_owned(),
                "reclaim.max_staleness",
            ),
            (
                "[[reclaim.exemptions]]\nfrom = \"10:00\"\nto = \"09:00\"".into(),
                "reclaim.exemptions[0].to",
            ),
            (
                "[[reclaim.overrides]]\nclass = \"gold\"".into(),
                "reclaim.overrides[0].class",
            ),
            (hook.replace("/a", "/b") + &hook, "webhooks"),
        ] {
            let e = parse(&text).unwrap_err();
            assert!(e.starts_with(key), "{text}: {e}");
        }
        let e = parse("[reclaim.classes.batch]\naction = \"evict\"").unwrap_err();
        assert!(e.contains("evict"), "{e}");
        let e = parse("[reclaim.classes.batch]\nafter = \"soon\"").unwrap_err();
        assert!(e.contains("soon"), "{e}");
    }
}
