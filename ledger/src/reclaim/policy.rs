//! The reclaim policy as a pure function: one episode, what was done about it so far, the
//! clock and the settings in; the next step out ([`decide`]). Everything that reads or writes the
//! ledger is in [`super::pass`]; this module is the definition (docs/reclaim.md, "The policy"),
//! tested alone.
//!
//! An episode goes `seen → notified → requested → resolved`, or `… → cancelled → resolved`;
//! each arrow sends one event ([`EventType`]). Holds send nothing and say why.

use std::time::Duration;

use gpuledger_schema::SloClass;
use gpuledger_schema::webhook::{Action, EventType};

use super::config::{Override, Rule, Settings, UNCLASSIFIED, Window};

/// Where an episode stands (the `state` column of `reclaim_episodes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Known, nothing sent (it was stale when first seen).
    Seen,
    /// `hoarding.detected` sent.
    Notified,
    /// `reclaim.requested` sent.
    Requested,
    /// `reclaim.cancelled` sent; `hoarding.resolved` follows.
    Cancelled,
    /// `hoarding.resolved` sent (or it ended before anything was sent): final.
    Resolved,
}

impl State {
    const NAMES: [(State, &'static str); 5] = [
        (State::Seen, "seen"),
        (State::Notified, "notified"),
        (State::Requested, "requested"),
        (State::Cancelled, "cancelled"),
        (State::Resolved, "resolved"),
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        State::NAMES
            .iter()
            .find(|(s, _)| *s == self)
            .map(|(_, n)| *n)
            .expect("every state is named")
    }

    /// The state stored as `s`.
    pub fn parse(s: &str) -> Option<State> {
        State::NAMES
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(st, _)| *st)
    }

    /// Whether the policy still looks at it.
    pub fn is_open(self) -> bool {
        !matches!(self, State::Resolved)
    }
}

/// Why nothing was sent this time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The GPU has not reported within `max_staleness` of the wall clock.
    Stale,
    /// The rule's action is `notify`.
    NotifyOnly,
    /// An exemption or snooze covers it.
    Exempt,
    /// Idle for less than the rule's `after`.
    WaitingAfter,
    /// The notice was delivered less than `notice` ago.
    WaitingNotice,
    /// The notice has not reached any receiver yet.
    NoticeUndelivered,
    /// The blast-radius bound bit; longer-idle episodes went first.
    Deferred,
    /// `alertmanager_confirmation` is on and no alert for it reached us lately.
    AwaitingAlertmanager,
    /// A reclaim was requested; waiting for the allocation to end.
    Requested,
}

impl Hold {
    /// The stored reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Hold::Stale => "stale",
            Hold::NotifyOnly => "notify_only",
            Hold::Exempt => "exempt",
            Hold::WaitingAfter => "waiting_after",
            Hold::WaitingNotice => "waiting_notice",
            Hold::NoticeUndelivered => "notice_undelivered",
            Hold::Deferred => "deferred",
            Hold::AwaitingAlertmanager => "awaiting_alertmanager",
            Hold::Requested => "requested",
        }
    }
}

/// The episode as the ledger has it now.
#[derive(Debug, Clone, PartialEq)]
pub struct Now {
    /// Tenant.
    pub tenant: Option<String>,
    /// Workload.
    pub workload: Option<String>,
    /// SLO class.
    pub slo_class: Option<String>,
    /// First idle second.
    pub started_at: i64,
    /// Its last held second.
    pub last_second: i64,
    /// End, if it ended.
    pub ended_at: Option<i64>,
    /// Whether it ended because the holder became active again.
    pub resumed: bool,
}

impl Now {
    /// Idle seconds so far.
    pub fn idle_seconds(&self) -> i64 {
        self.last_second + 1 - self.started_at
    }

    /// Whether it ended because the allocation did (not because activity resumed).
    pub fn allocation_ended(&self) -> bool {
        self.ended_at.is_some() && !self.resumed
    }
}

/// What was done about it before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Before {
    /// Its state.
    pub state: State,
    /// When the notice first reached a receiver (or was decided, with no receivers configured).
    pub notice_delivered_at: Option<i64>,
    /// Whether a requested reclaim reached a receiver.
    pub request_delivered: bool,
}

/// What else bears on it.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The exemption covering it now, if any (its reason).
    pub exemption: Option<String>,
    /// Whether its alert reached us through Alertmanager lately.
    pub confirmed: bool,
}

/// The next step.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Send this event; `cause` says why in a word (`detected`, `idle_past_after`,
    /// `activity_resumed`, `allocation_ended`, `not_delivered_before_end`, `no_longer_an_episode`).
    Send(EventType, &'static str),
    /// Send nothing.
    Hold(Hold),
    /// Close silently (ended before anything was sent).
    Close,
}

/// The rule for a holder and which configured rule it is (`class` or `override:<n>`).
pub fn rule_for(
    settings: &Settings,
    tenant: Option<&str>,
    workload: Option<&str>,
    class: Option<&str>,
) -> (String, Rule, String) {
    let class = class.unwrap_or(UNCLASSIFIED).to_owned();
    let base = settings
        .classes
        .get(&class)
        .or_else(|| settings.classes.get(UNCLASSIFIED))
        .copied()
        .expect("the defaults name every class");
    for (i, o) in settings.overrides.iter().enumerate() {
        if matches(o, tenant, workload, &class) {
            // Latency-critical work is reclaimed only by a rule that names its class.
            let action = match o.class {
                None if class == SloClass::LatencyCritical.as_str() => base.action,
                _ => o.rule.action.unwrap_or(base.action),
            };
            let rule = Rule {
                action,
                after: o.rule.after.map_or(base.after, |d| d.0),
                notice: o.rule.notice.map_or(base.notice, |d| d.0),
            };
            return (class, rule, format!("override:{i}"));
        }
    }
    (class, base, "class".into())
}

fn matches(o: &Override, tenant: Option<&str>, workload: Option<&str>, class: &str) -> bool {
    o.tenant.as_deref().is_none_or(|t| Some(t) == tenant)
        && o.class.as_deref().is_none_or(|c| c == class)
        && o.workload.as_deref().is_none_or(|g| glob(g, workload))
}

/// Whether `workload` matches the glob (`*`, `?`); no workload matches only `*`.
pub fn glob(pattern: &str, workload: Option<&str>) -> bool {
    match workload {
        Some(w) => wildmatch::WildMatch::new(pattern).matches(w),
        None => pattern == "*",
    }
}

/// Whether a configured window covers the holder at `t` (Unix seconds, UTC).
pub fn window_covers(w: &Window, tenant: Option<&str>, workload: Option<&str>, t: i64) -> bool {
    if !(w.tenant.as_deref().is_none_or(|x| Some(x) == tenant)
        && w.workload.as_deref().is_none_or(|g| glob(g, workload)))
    {
        return false;
    }
    let day = t.div_euclid(86400);
    // 1970-01-01 was a Thursday (3 with Monday = 0).
    let weekday = (day + 3).rem_euclid(7) as u32;
    let minute = (t.rem_euclid(86400) / 60) as u32;
    (w.days.is_empty() || w.days.contains(&weekday))
        && (w.from_minute..w.to_minute).contains(&minute)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// The next step for one episode. `episode` is `None` when late data removed it (it is no longer
/// an idle run of the window's length); `before` is `None` the first time it is seen.
pub fn decide(
    now: i64,
    settings: &Settings,
    rule: &Rule,
    episode: Option<&Now>,
    before: Option<&Before>,
    context: &Context,
) -> Step {
    let state = before.map(|b| b.state);
    let Some(e) = episode else {
        return match state {
            Some(State::Requested) => {
                Step::Send(EventType::ReclaimCancelled, "no_longer_an_episode")
            }
            Some(State::Notified | State::Cancelled) => {
                Step::Send(EventType::HoardingResolved, "no_longer_an_episode")
            }
            _ => Step::Close,
        };
    };
    if let Some(end) = e.ended_at {
        let _ = end;
        return match (state, before) {
            (Some(State::Requested), Some(b)) if !e.allocation_ended() || !b.request_delivered => {
                Step::Send(
                    EventType::ReclaimCancelled,
                    if e.allocation_ended() {
                        "not_delivered_before_end"
                    } else {
                        "activity_resumed"
                    },
                )
            }
            (Some(State::Notified | State::Requested | State::Cancelled), _) => Step::Send(
                EventType::HoardingResolved,
                if e.allocation_ended() {
                    "allocation_ended"
                } else {
                    "activity_resumed"
                },
            ),
            _ => Step::Close,
        };
    }
    // Open. A request not yet delivered is re-checked every pass: if it would not be made now
    // (the GPU went quiet, a snooze or silence came, the rule changed), it is withdrawn before a
    // receiver that comes back can act on it.
    if let Some(b) = before
        && b.state == State::Requested
        && !b.request_delivered
        && let Some(cause) = withdrawn(now, settings, rule, e, context)
    {
        return Step::Send(EventType::ReclaimCancelled, cause);
    }
    // Nothing is sent about a GPU that has not reported lately: backfilled or replayed history, a
    // node that stopped reporting, or an exporter that is behind.
    if now - (e.last_second + 1) > secs(settings.max_staleness) {
        return Step::Hold(Hold::Stale);
    }
    let b = match before {
        None
        | Some(Before {
            state: State::Seen, ..
        }) => {
            return Step::Send(EventType::HoardingDetected, "detected");
        }
        Some(b) => b,
    };
    // `Cancelled` on an open episode: its request was withdrawn before delivery (stale, snoozed,
    // silenced, rule changed); it is decided afresh, like a notified one.
    if !matches!(b.state, State::Notified | State::Cancelled) {
        return Step::Hold(Hold::Requested);
    }
    if rule.action == Action::Notify {
        return Step::Hold(Hold::NotifyOnly);
    }
    if context.exemption.is_some() {
        return Step::Hold(Hold::Exempt);
    }
    if e.idle_seconds() < secs(rule.after) {
        return Step::Hold(Hold::WaitingAfter);
    }
    let Some(delivered) = b.notice_delivered_at else {
        return Step::Hold(Hold::NoticeUndelivered);
    };
    if now - delivered < secs(rule.notice) {
        return Step::Hold(Hold::WaitingNotice);
    }
    if settings.alertmanager_confirmation.is_some() && !context.confirmed {
        return Step::Hold(Hold::AwaitingAlertmanager);
    }
    Step::Send(EventType::ReclaimRequested, "idle_past_after")
}

/// Why an undelivered request would not be made now, if it would not.
fn withdrawn(
    now: i64,
    settings: &Settings,
    rule: &Rule,
    e: &Now,
    context: &Context,
) -> Option<&'static str> {
    if now - (e.last_second + 1) > secs(settings.max_staleness) {
        Some("stale_before_delivery")
    } else if rule.action == Action::Notify {
        Some("rule_is_notify_only")
    } else if context.exemption.is_some() {
        Some("exempt_before_delivery")
    } else if settings.alertmanager_confirmation.is_some() && !context.confirmed {
        Some("unconfirmed_before_delivery")
    } else {
        None
    }
}

/// The state after a step.
pub fn next_state(before: Option<State>, step: &Step) -> State {
    match step {
        Step::Send(EventType::HoardingDetected, _) => State::Notified,
        Step::Send(EventType::ReclaimRequested, _) => State::Requested,
        Step::Send(EventType::ReclaimCancelled, _) => State::Cancelled,
        Step::Send(EventType::HoardingResolved, _) | Step::Close => State::Resolved,
        Step::Send(EventType::BudgetForecastExceeded | EventType::BudgetExceeded, _) => {
            before.unwrap_or(State::Seen)
        }
        Step::Hold(_) => before.unwrap_or(State::Seen),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reclaim::config::Span;

    const NOW: i64 = 1_800_000_000;

    fn settings() -> Settings {
        let mut s = Settings::default();
        s.classes.insert(
            "batch".into(),
            Rule {
                action: Action::Reclaim,
                after: Duration::from_secs(1800),
                notice: Duration::from_secs(600),
            },
        );
        s
    }

    fn open(idle: i64, last_report_ago: i64) -> Now {
        let last = NOW - last_report_ago - 1;
        Now {
            tenant: Some("t".into()),
            workload: Some("ns/p".into()),
            slo_class: Some("batch".into()),
            started_at: last + 1 - idle,
            last_second: last,
            ended_at: None,
            resumed: false,
        }
    }

    fn notified(at: Option<i64>) -> Before {
        Before {
            state: State::Notified,
            notice_delivered_at: at,
            request_delivered: false,
        }
    }

    fn step(e: Option<&Now>, b: Option<&Before>, ctx: &Context) -> Step {
        let s = settings();
        let rule = rule_for(&s, Some("t"), Some("ns/p"), Some("batch")).1;
        decide(NOW, &s, &rule, e, b, ctx)
    }

    #[test]
    fn an_episode_is_noticed_then_reclaimed_after_the_notice_period() {
        let ctx = Context::default();
        let e = open(3600, 5);
        assert_eq!(
            step(Some(&e), None, &ctx),
            Step::Send(EventType::HoardingDetected, "detected")
        );
        assert_eq!(
            step(Some(&e), Some(&notified(None)), &ctx),
            Step::Hold(Hold::NoticeUndelivered)
        );
        assert_eq!(
            step(Some(&e), Some(&notified(Some(NOW - 599))), &ctx),
            Step::Hold(Hold::WaitingNotice)
        );
        assert_eq!(
            step(Some(&e), Some(&notified(Some(NOW - 600))), &ctx),
            Step::Send(EventType::ReclaimRequested, "idle_past_after")
        );
        let short = open(1799, 5);
        assert_eq!(
            step(Some(&short), Some(&notified(Some(NOW - 9999))), &ctx),
            Step::Hold(Hold::WaitingAfter)
        );
    }

    #[test]
    fn stale_data_never_leads_to_an_event() {
        let ctx = Context::default();
        let e = open(7200, 121);
        assert_eq!(step(Some(&e), None, &ctx), Step::Hold(Hold::Stale));
        assert_eq!(
            step(Some(&e), Some(&notified(Some(NOW - 9999))), &ctx),
            Step::Hold(Hold::Stale)
        );
    }

    #[test]
    fn latency_critical_and_unconfigured_classes_are_notify_only() {
        let s = settings();
        let b = notified(Some(NOW - 9999));
        for class in [Some("latency_critical"), Some("interactive"), None] {
            let mut e = open(7200, 5);
            e.slo_class = class.map(str::to_owned);
            let rule = rule_for(&s, Some("t"), Some("ns/p"), class).1;
            assert_eq!(
                decide(NOW, &s, &rule, Some(&e), Some(&b), &Context::default()),
                Step::Hold(Hold::NotifyOnly),
                "{class:?}"
            );
        }
    }

    #[test]
    fn exemptions_and_the_alertmanager_gate_hold_a_reclaim() {
        let e = open(7200, 5);
        let b = notified(Some(NOW - 9999));
        let exempt = Context {
            exemption: Some("snoozed".into()),
            confirmed: false,
        };
        assert_eq!(step(Some(&e), Some(&b), &exempt), Step::Hold(Hold::Exempt));
        let mut s = settings();
        s.alertmanager_confirmation = Some(Duration::from_secs(600));
        let rule = s.classes["batch"];
        assert_eq!(
            decide(NOW, &s, &rule, Some(&e), Some(&b), &Context::default()),
            Step::Hold(Hold::AwaitingAlertmanager)
        );
        let ok = Context {
            exemption: None,
            confirmed: true,
        };
        assert!(matches!(
            decide(NOW, &s, &rule, Some(&e), Some(&b), &ok),
            Step::Send(EventType::ReclaimRequested, _)
        ));
    }

    #[test]
    fn an_ended_episode_is_cancelled_or_resolved() {
        let ctx = Context::default();
        let mut resumed = open(3600, 5);
        resumed.ended_at = Some(resumed.last_second + 1);
        resumed.resumed = true;
        let mut released = open(3600, 5);
        released.ended_at = Some(released.last_second + 1);
        let requested = |delivered| Before {
            state: State::Requested,
            notice_delivered_at: Some(0),
            request_delivered: delivered,
        };
        assert_eq!(
            step(Some(&resumed), Some(&requested(true)), &ctx),
            Step::Send(EventType::ReclaimCancelled, "activity_resumed")
        );
        assert_eq!(
            step(Some(&released), Some(&requested(false)), &ctx),
            Step::Send(EventType::ReclaimCancelled, "not_delivered_before_end")
        );
        assert_eq!(
            step(Some(&released), Some(&requested(true)), &ctx),
            Step::Send(EventType::HoardingResolved, "allocation_ended")
        );
        assert_eq!(
            step(Some(&resumed), Some(&notified(Some(0))), &ctx),
            Step::Send(EventType::HoardingResolved, "activity_resumed")
        );
        assert_eq!(step(Some(&resumed), None, &ctx), Step::Close);
        assert_eq!(
            step(None, Some(&requested(false)), &ctx),
            Step::Send(EventType::ReclaimCancelled, "no_longer_an_episode")
        );
    }

    #[test]
    fn overrides_apply_first_match_and_keep_unset_keys() {
        let mut s = settings();
        s.overrides.push(Override {
            tenant: Some("vip".into()),
            workload: Some("train-*".into()),
            class: None,
            rule: super::super::config::RuleFile {
                action: Some(Action::Notify),
                after: None,
                notice: Some(Span(Duration::from_secs(1))),
            },
        });
        let (_, r, name) = rule_for(&s, Some("vip"), Some("train-7"), Some("batch"));
        assert_eq!(
            (r.action, r.after, name.as_str()),
            (Action::Notify, Duration::from_secs(1800), "override:0")
        );
        let (_, r, name) = rule_for(&s, Some("vip"), Some("eval-7"), Some("batch"));
        assert_eq!((r.action, name.as_str()), (Action::Reclaim, "class"));
    }

    /// Regression (review): a request waiting for a receiver that is down must not be delivered
    /// once the GPU went quiet, a snooze came, or the rule changed to notify.
    #[test]
    fn an_undelivered_request_is_withdrawn_when_it_would_not_be_made_now() {
        let waiting = Before {
            state: State::Requested,
            notice_delivered_at: Some(0),
            request_delivered: false,
        };
        let ctx = Context::default();
        assert_eq!(
            step(Some(&open(7200, 5)), Some(&waiting), &ctx),
            Step::Hold(Hold::Requested)
        );
        assert_eq!(
            step(Some(&open(7200, 600)), Some(&waiting), &ctx),
            Step::Send(EventType::ReclaimCancelled, "stale_before_delivery")
        );
        let snoozed = Context {
            exemption: Some("snooze".into()),
            confirmed: false,
        };
        assert_eq!(
            step(Some(&open(7200, 5)), Some(&waiting), &snoozed),
            Step::Send(EventType::ReclaimCancelled, "exempt_before_delivery")
        );
        let delivered = Before {
            request_delivered: true,
            ..waiting
        };
        assert_eq!(
            step(Some(&open(7200, 600)), Some(&delivered), &ctx),
            Step::Hold(Hold::Stale)
        );
        // Once the snooze is over, the withdrawn request is made again.
        let withdrawn = Before {
            state: State::Cancelled,
            ..waiting
        };
        assert_eq!(
            step(Some(&open(7200, 5)), Some(&withdrawn), &snoozed),
            Step::Hold(Hold::Exempt)
        );
        assert_eq!(
            step(Some(&open(7200, 5)), Some(&withdrawn), &ctx),
            Step::Send(EventType::ReclaimRequested, "idle_past_after")
        );
    }

    #[test]
    fn an_override_without_a_class_leaves_latency_critical_notify_only() {
        let mut s = settings();
        s.overrides.push(Override {
            tenant: Some("t".into()),
            workload: None,
            class: None,
            rule: super::super::config::RuleFile {
                action: Some(Action::Reclaim),
                after: None,
                notice: None,
            },
        });
        assert_eq!(
            rule_for(&s, Some("t"), None, Some("latency_critical"))
                .1
                .action,
            Action::Notify
        );
        assert_eq!(
            rule_for(&s, Some("t"), None, Some("interactive")).1.action,
            Action::Reclaim
        );
        s.overrides[0].class = Some("latency_critical".into());
        assert_eq!(
            rule_for(&s, Some("t"), None, Some("latency_critical"))
                .1
                .action,
            Action::Reclaim
        );
    }

    #[test]
    fn weekly_windows_are_utc_days_and_minutes() {
        let w = Window {
            tenant: None,
            workload: Some("nb-*".into()),
            days: vec![5, 6],
            from_minute: 0,
            to_minute: 1440,
            reason: "weekend".into(),
        };
        // 2026-01-03 was a Saturday.
        let sat = 1_767_398_400;
        assert!(window_covers(&w, Some("t"), Some("nb-1"), sat + 3600));
        assert!(!window_covers(&w, Some("t"), Some("job-1"), sat + 3600));
        assert!(!window_covers(&w, Some("t"), Some("nb-1"), sat - 1));
        assert!(window_covers(
            &w,
            Some("t"),
            Some("nb-1"),
            sat + 2 * 86400 - 1
        ));
        assert!(!window_covers(&w, Some("t"), Some("nb-1"), sat + 2 * 86400));
    }

    #[test]
    fn states_round_trip() {
        for (s, n) in State::NAMES {
            assert_eq!(State::parse(n), Some(s));
            assert_eq!(s.as_str(), n);
        }
    }
}
