//! One reclaim pass: read the episodes and what was done about them in one snapshot, run the
//! policy ([`super::policy::decide`]) over each, bound the blast radius, then commit the decisions,
//! the new states and the outbox rows of the events through the one writer in one transaction.
//!
//! A crash before the commit loses the pass; the next pass finds the same episodes in the same
//! states and takes the same decisions, under the same event ids. A crash after it loses nothing.

use std::collections::{HashMap, HashSet};

use duckdb::{Connection, params};
use gpuledger_schema::webhook::{self, EpisodeData, Event, EventType, OwnerData, PolicyData};

use super::config::{EndpointKind, Settings};
use super::policy::{self, Before, Context, Hold, Now, State, Step};
use crate::analytics::{self, EpisodeRow, EpisodeState};

/// Ended episodes are looked at for this long after their end (to send their resolution).
const LOOKBACK_SECS: i64 = 2 * 86400;

/// What a pass did; part of `POST /api/v1/analytics/evaluate`'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReclaimReport {
    /// Events decided, by type.
    pub events: std::collections::BTreeMap<String, usize>,
    /// Holds first recorded this pass, by reason.
    pub holds: std::collections::BTreeMap<String, usize>,
    /// Reclaims deferred by the blast-radius bound this pass.
    pub deferred: usize,
}

/// One episode's stored state.
#[derive(Debug, Clone)]
struct Stored {
    state: State,
    notified_at: Option<i64>,
    requested_at: Option<i64>,
    last_hold: Option<String>,
    notice_delivered_at: Option<i64>,
    request_delivered: bool,
    data: String,
}

/// What the read side found.
pub struct Snapshot {
    episodes: Vec<(String, EpisodeRow)>,
    stored: HashMap<String, Stored>,
    exemptions: Vec<(Option<String>, Option<String>, String)>,
    confirmed: HashSet<String>,
    requested_last_hour: HashMap<Option<String>, usize>,
}

/// The stable id of a stored episode.
pub fn id_of(e: &EpisodeRow) -> String {
    webhook::episode_id(
        &e.gpu_uuid,
        e.gpu_instance_id,
        e.tenant.as_deref(),
        e.workload.as_deref(),
        e.started_at,
    )
}

/// Reads what a pass needs, in one transaction on a reader connection.
pub fn read(
    conn: &Connection,
    analytics: &analytics::Settings,
    settings: &Settings,
    now: i64,
) -> duckdb::Result<Snapshot> {
    conn.execute_batch("BEGIN TRANSACTION")?;
    let r = read_in_snapshot(conn, analytics, settings, now);
    conn.execute_batch("COMMIT")?;
    r
}

fn read_in_snapshot(
    conn: &Connection,
    analytics: &analytics::Settings,
    settings: &Settings,
    now: i64,
) -> duckdb::Result<Snapshot> {
    // Ended episodes are read back to the oldest one still followed, so a followed episode whose
    // end is old is seen ended, not mistaken for one late data removed.
    let oldest: Option<i64> = conn.query_row(
        "SELECT min(started_at) FROM reclaim_episodes WHERE state <> 'resolved'",
        [],
        |r| r.get(0),
    )?;
    let episodes = analytics::episodes(
        conn,
        EpisodeState::All,
        oldest.map_or(now - LOOKBACK_SECS, |o| o.min(now - LOOKBACK_SECS)),
        i64::MAX,
        None,
        analytics,
    )?
    .into_iter()
    .map(|e| (id_of(&e), e))
    .collect();
    // Any endpoint's delivery of the notice counts (a person was told); only a scheduler
    // webhook's delivery of the request does, so a chat channel that has it cannot stop a keep
    // from withdrawing a request the scheduler never got.
    let no_endpoints = settings.endpoints.is_empty();
    let no_webhooks = !(settings.endpoints.iter()).any(|e| e.kind == EndpointKind::Webhook);
    let mut stmt = conn.prepare_cached(
        "WITH delivered AS (
             SELECT episode_id,
                    min(delivered_at) FILTER (WHERE event_type = 'hoarding.detected') AS notice,
                    count(*) FILTER (WHERE event_type = 'reclaim.requested'
                                     AND coalesce(channel, 'webhook') = 'webhook') > 0 AS request
             FROM webhook_outbox WHERE state = 'delivered' GROUP BY episode_id)
         SELECT r.episode_id, r.state, r.last_hold, r.data, r.notified_at, d.notice,
                coalesce(d.request, false), r.requested_at
         FROM reclaim_episodes r LEFT JOIN delivered d USING (episode_id)
         WHERE r.state <> 'resolved'",
    )?;
    let stored = stmt
        .query_map([], |r| {
            let state: String = r.get(1)?;
            let notified_at: Option<i64> = r.get(4)?;
            let delivered: Option<i64> = r.get(5)?;
            Ok((
                r.get::<_, String>(0)?,
                Stored {
                    state: State::parse(&state).unwrap_or(State::Seen),
                    notified_at,
                    requested_at: r.get(7)?,
                    last_hold: r.get(2)?,
                    data: r.get(3)?,
                    // With no receivers configured, the decision is the notice (shown by the API).
                    notice_delivered_at: if no_endpoints { notified_at } else { delivered },
                    request_delivered: no_webhooks || r.get::<_, bool>(6)?,
                },
            ))
        })?
        .collect::<Result<_, _>>()?;
    let mut stmt = conn.prepare_cached(
        "SELECT tenant, workload, reason FROM reclaim_exemptions WHERE until > ?",
    )?;
    let exemptions = stmt
        .query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let since = settings
        .alertmanager_confirmation
        .map_or(now, |d| now - d.as_secs() as i64);
    let mut stmt = conn.prepare_cached(
        "SELECT episode_id FROM alertmanager_confirmations WHERE confirmed_at >= ?",
    )?;
    let confirmed = stmt
        .query_map([since], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut stmt = conn.prepare_cached(
        "SELECT tenant, count(*) FROM reclaim_episodes WHERE requested_at >= ? GROUP BY tenant",
    )?;
    let requested_last_hour = stmt
        .query_map([now - 3600], |r| {
            Ok((r.get(0)?, r.get::<_, i64>(1)? as usize))
        })?
        .collect::<Result<_, _>>()?;
    Ok(Snapshot {
        episodes,
        stored,
        exemptions,
        confirmed,
        requested_last_hour,
    })
}

/// A row of `reclaim_episodes` to write.
#[derive(Debug, Clone)]
pub struct EpisodeWrite {
    id: String,
    notified_at: Option<i64>,
    requested_at: Option<i64>,
    row: Option<EpisodeRow>,
    state: State,
    sent: Option<EventType>,
    last_hold: Option<String>,
    /// The episode as sent, and as stored (JSON).
    episode: EpisodeData,
    data: String,
}

/// A row of `reclaim_decisions`.
#[derive(Debug, Clone)]
pub struct DecisionWrite {
    episode_id: String,
    tenant: Option<String>,
    workload: Option<String>,
    node: String,
    decision: &'static str,
    reason: String,
    detail: String,
    event_id: Option<String>,
}

/// An outbox row.
#[derive(Debug, Clone)]
pub struct OutboxWrite {
    event_id: String,
    endpoint: String,
    kind: EventType,
    episode_id: String,
    body: String,
    /// `webhook`, `slack` or `teams`.
    channel: &'static str,
}

/// What a pass commits.
#[derive(Debug, Default)]
pub struct Plan {
    now: i64,
    dry_run: bool,
    episodes: Vec<EpisodeWrite>,
    decisions: Vec<DecisionWrite>,
    outbox: Vec<OutboxWrite>,
    /// Undelivered `reclaim.requested` rows withdrawn by a cancellation.
    withdraw: Vec<String>,
    /// The report.
    pub report: ReclaimReport,
}

impl Plan {
    /// Whether anything is written.
    pub fn is_empty(&self) -> bool {
        self.episodes.is_empty() && self.decisions.is_empty()
    }

    /// Whether an event was put in the outbox.
    pub fn has_events(&self) -> bool {
        !self.outbox.is_empty()
    }
}

/// One followed episode's decision before the blast-radius bound.
struct Decided {
    id: String,
    row: Option<EpisodeRow>,
    step: Step,
    policy: PolicyData,
    /// Its tenant, from the row or the stored copy (a reclaim request counts against it).
    tenant: Option<String>,
    /// Idle seconds so far (the longest idle are granted a reclaim request first).
    idle: i64,
}

/// Runs the policy over a snapshot.
pub fn plan(
    snap: Snapshot,
    analytics: &analytics::Settings,
    settings: &Settings,
    now: i64,
) -> Plan {
    let mut plan = Plan {
        now,
        dry_run: settings.dry_run,
        ..Plan::default()
    };
    let by_id: HashMap<&str, &EpisodeRow> = snap
        .episodes
        .iter()
        .map(|(id, e)| (id.as_str(), e))
        .collect();
    let decided: Vec<Decided> = followed(&snap, &by_id)
        .into_iter()
        .filter_map(|id| decide(&snap, by_id.get(id).copied(), id, settings, now))
        .collect();
    let granted = grant(&snap, &decided, settings);
    for Decided {
        id,
        row,
        mut step,
        mut policy,
        ..
    } in decided
    {
        if matches!(step, Step::Send(EventType::ReclaimRequested, _)) && !granted.contains(&id) {
            step = Step::Hold(Hold::Deferred);
            policy.reason = format!(
                "deferred: the blast-radius bound ({} per pass, {} per tenant per hour) bit; longer-idle episodes went first",
                settings.max_per_pass, settings.max_per_tenant_per_hour
            );
            plan.report.deferred += 1;
        }
        record(
            &mut plan,
            &snap.stored,
            id,
            row,
            step,
            policy,
            analytics,
            settings,
        );
    }
    plan
}

/// The episodes a pass follows: open ones, ended ones the policy still follows, and followed
/// ones late data removed.
fn followed<'a>(snap: &'a Snapshot, by_id: &HashMap<&str, &EpisodeRow>) -> Vec<&'a str> {
    let mut ids: Vec<&str> = snap
        .episodes
        .iter()
        .filter(|(id, e)| e.ended_at.is_none() || snap.stored.contains_key(id))
        .map(|(id, _)| id.as_str())
        .collect();
    ids.extend(
        snap.stored
            .keys()
            .map(String::as_str)
            .filter(|id| !by_id.contains_key(id)),
    );
    ids
}

/// The policy's step for one episode (`row`: as detected now; `None` once late data removed
/// it, when the stored copy names it), with the policy data that explains it.
fn decide(
    snap: &Snapshot,
    row: Option<&EpisodeRow>,
    id: &str,
    settings: &Settings,
    now: i64,
) -> Option<Decided> {
    let stored = snap.stored.get(id);
    let (tenant, workload, class) = match (row, stored) {
        (Some(e), _) => (e.tenant.clone(), e.workload.clone(), e.slo_class.clone()),
        (None, Some(s)) => {
            let d: Option<EpisodeData> = serde_json::from_str(&s.data).ok();
            (
                d.as_ref().and_then(|d| d.tenant.clone()),
                d.as_ref().and_then(|d| d.workload.clone()),
                d.as_ref().and_then(|d| d.slo_class.clone()),
            )
        }
        (None, None) => return None,
    };
    let (class_name, rule, rule_name) = policy::rule_for(
        settings,
        tenant.as_deref(),
        workload.as_deref(),
        class.as_deref(),
    );
    let now_view = row.map(|e| Now {
        tenant: e.tenant.clone(),
        workload: e.workload.clone(),
        slo_class: e.slo_class.clone(),
        started_at: e.started_at,
        last_second: e.last_second,
        ended_at: e.ended_at,
        resumed: e.resumed,
    });
    let before = stored.map(|s| Before {
        state: s.state,
        notice_delivered_at: s.notice_delivered_at,
        request_delivered: s.request_delivered,
    });
    let exemption = exemption_for(snap, settings, tenant.as_deref(), workload.as_deref(), now);
    let context = Context {
        exemption: exemption.clone(),
        confirmed: snap.confirmed.contains(id),
    };
    let step = policy::decide(
        now,
        settings,
        &rule,
        now_view.as_ref(),
        before.as_ref(),
        &context,
    );
    let reason = match &step {
        Step::Hold(Hold::Exempt) => {
            format!("exempt: {}", exemption.as_deref().unwrap_or("an exemption"))
        }
        Step::Hold(h) => hold_sentence(*h, &rule, now_view.as_ref(), settings),
        Step::Send(kind, cause) => format!("{}: {cause}", kind.as_str()),
        Step::Close => "ended before anything was sent".into(),
    };
    let reclaims = rule.action == webhook::Action::Reclaim;
    let policy = PolicyData {
        class: class_name,
        action: rule.action,
        after_seconds: reclaims.then(|| rule.after.as_secs() as i64),
        notice_seconds: reclaims.then(|| rule.notice.as_secs() as i64),
        rule: rule_name,
        reason,
    };
    Some(Decided {
        id: id.to_owned(),
        row: row.cloned(),
        step,
        policy,
        idle: now_view.as_ref().map_or(0, Now::idle_seconds),
        tenant,
    })
}

/// Why the episode of `tenant`'s `workload` is exempt, if it is: a stored exemption first, then
/// a configured window that covers `now`.
fn exemption_for(
    snap: &Snapshot,
    settings: &Settings,
    tenant: Option<&str>,
    workload: Option<&str>,
    now: i64,
) -> Option<String> {
    snap.exemptions
        .iter()
        .find(|(t, w, _)| {
            t.as_deref().is_none_or(|t| Some(t) == tenant)
                && w.as_deref().is_none_or(|g| policy::glob(g, workload))
        })
        .map(|(_, _, r)| r.clone())
        .or_else(|| {
            settings
                .exemptions
                .iter()
                .find(|w| policy::window_covers(w, tenant, workload, now))
                .map(|w| w.reason.clone())
        })
}

/// The blast radius: of the episodes due a reclaim request, the ids granted one this pass,
/// longest idle first, at most `max_per_pass`, and per tenant per hour.
fn grant(snap: &Snapshot, decided: &[Decided], settings: &Settings) -> HashSet<String> {
    let mut requests: Vec<&Decided> = decided
        .iter()
        .filter(|d| matches!(d.step, Step::Send(EventType::ReclaimRequested, _)))
        .collect();
    requests.sort_by(|a, b| b.idle.cmp(&a.idle).then_with(|| a.id.cmp(&b.id)));
    let mut granted: HashSet<String> = HashSet::new();
    let mut per_tenant = snap.requested_last_hour.clone();
    for d in requests {
        let used = per_tenant.entry(d.tenant.clone()).or_default();
        if granted.len() < settings.max_per_pass && *used < settings.max_per_tenant_per_hour {
            *used += 1;
            granted.insert(d.id.clone());
        }
    }
    granted
}

fn hold_sentence(h: Hold, rule: &super::config::Rule, e: Option<&Now>, s: &Settings) -> String {
    let idle = e.map_or(0, Now::idle_seconds);
    match h {
        Hold::Stale => format!(
            "stale: the GPU has not reported within max_staleness ({} s)",
            s.max_staleness.as_secs()
        ),
        Hold::NotifyOnly => "notify_only: the rule's action is notify".into(),
        Hold::Exempt => "exempt".into(),
        Hold::WaitingAfter => format!(
            "waiting_after: idle {idle} s of the {} s before a reclaim",
            rule.after.as_secs()
        ),
        Hold::WaitingNotice => format!(
            "waiting_notice: the notice period is {} s",
            rule.notice.as_secs()
        ),
        Hold::NoticeUndelivered => "notice_undelivered: no receiver has the notice yet".into(),
        Hold::Deferred => "deferred".into(),
        Hold::AwaitingAlertmanager => {
            "awaiting_alertmanager: no alert for it reached POST /api/v1/alertmanager lately (silenced or inhibited?)".into()
        }
        Hold::Requested => "requested: waiting for the allocation to end".into(),
    }
}

#[allow(clippy::too_many_arguments)]
fn record(
    plan: &mut Plan,
    stored: &HashMap<String, Stored>,
    id: String,
    row: Option<EpisodeRow>,
    step: Step,
    policy: PolicyData,
    analytics: &analytics::Settings,
    settings: &Settings,
) {
    let before = stored.get(&id);
    let state = policy::next_state(before.map(|b| b.state), &step);
    let Some(mut data) = current_data(&id, row.as_ref(), before, &policy, analytics, settings)
    else {
        return;
    };
    // The team and contact as configured now; the owner as the exporter sent it.
    let sent = data.owner.take().unwrap_or_default();
    data.owner = owner(
        data.tenant.as_deref(),
        data.workload.as_deref(),
        (sent.owner, sent.owner_ref),
        analytics,
    );
    let data_json = serde_json::to_string(&data).expect("episode data serializes");
    let (tenant, workload, node) = (
        data.tenant.clone(),
        data.workload.clone(),
        data.node.clone(),
    );
    let mut write = EpisodeWrite {
        id: id.clone(),
        notified_at: before.and_then(|b| b.notified_at),
        requested_at: before.and_then(|b| b.requested_at),
        row,
        state,
        sent: None,
        last_hold: before.and_then(|b| b.last_hold.clone()),
        episode: data.clone(),
        data: data_json,
    };
    let decision =
        |decision: &'static str, reason: String, event_id: Option<String>| DecisionWrite {
            episode_id: id.clone(),
            tenant: tenant.clone(),
            workload: workload.clone(),
            node: node.clone(),
            decision,
            reason,
            detail: policy.reason.clone(),
            event_id,
        };
    match step {
        Step::Hold(h) => {
            // A hold is recorded when it changes, not every pass.
            if write.last_hold.as_deref() == Some(h.as_str())
                && before.is_some_and(|b| b.state == state)
            {
                return;
            }
            *plan.report.holds.entry(h.as_str().into()).or_default() += 1;
            write.last_hold = Some(h.as_str().into());
            plan.decisions
                .push(decision("hold", h.as_str().into(), None));
        }
        Step::Close => {
            plan.decisions
                .push(decision("close", "ended_before_notice".into(), None));
        }
        Step::Send(kind, cause) => {
            let event_id = queue_event(plan, settings, &id, kind, data, before);
            match kind {
                EventType::HoardingDetected => write.notified_at = Some(plan.now),
                EventType::ReclaimRequested => write.requested_at = Some(plan.now),
                _ => {}
            }
            write.sent = Some(kind);
            write.last_hold = None;
            let verb = match kind {
                EventType::HoardingDetected => "notify",
                EventType::ReclaimRequested => "request",
                EventType::ReclaimCancelled => "cancel",
                EventType::HoardingResolved => "resolve",
                EventType::BudgetForecastExceeded | EventType::BudgetExceeded => {
                    unreachable!("the reclaim policy sends episode events only")
                }
            };
            plan.decisions
                .push(decision(verb, cause.into(), Some(event_id)));
        }
    }
    plan.episodes.push(write);
}

/// The episode's data for this pass: from its row while the analytics still report it, else
/// as stored, with this pass's policy either way. `None` (logged) when the stored data cannot
/// be read.
fn current_data(
    id: &str,
    row: Option<&EpisodeRow>,
    before: Option<&Stored>,
    policy: &PolicyData,
    analytics: &analytics::Settings,
    settings: &Settings,
) -> Option<EpisodeData> {
    if let Some(e) = row {
        return Some(episode_data(
            id,
            e,
            policy.clone(),
            analytics,
            settings.dry_run,
        ));
    }
    let Some(mut d) = before.and_then(|b| serde_json::from_str::<EpisodeData>(&b.data).ok()) else {
        tracing::error!(
            episode_id = id,
            "A followed episode's stored data cannot be read; it is skipped."
        );
        return None;
    };
    d.policy = policy.clone();
    d.dry_run = settings.dry_run;
    Some(d)
}

/// Queues event `kind` of episode `id` in the outbox, once per endpoint that takes it, withdraws
/// a reclaim request that must not go out any more, and counts the event. Answers its id.
fn queue_event(
    plan: &mut Plan,
    settings: &Settings,
    id: &str,
    kind: EventType,
    mut data: EpisodeData,
    before: Option<&Stored>,
) -> String {
    let event_id = webhook::event_id(id, kind);
    if kind == EventType::HoardingResolved {
        data.ended_at = data.ended_at.or_else(|| Some(webhook::rfc3339(plan.now)));
    }
    // Only here, after `record` stored the data: the link is in the outbox bodies, never in
    // `reclaim_episodes.data`.
    if matches!(
        kind,
        EventType::HoardingDetected | EventType::ReclaimRequested
    ) && keepable(data.tenant.as_deref(), data.workload.as_deref())
    {
        data.keep_url = settings.links.url(id, plan.now);
    }
    let contact = data.owner.as_ref().and_then(|o| o.contact.clone());
    let mut body = None;
    for ep in &settings.endpoints {
        if !ep.takes(kind, data.tenant.as_deref(), contact.as_deref()) {
            continue;
        }
        let text = match ep.kind {
            EndpointKind::Webhook => body
                .get_or_insert_with(|| {
                    serde_json::to_string(&Event {
                        kind,
                        timestamp: webhook::rfc3339(plan.now),
                        data: data.clone(),
                    })
                    .expect("events serialize")
                })
                .clone(),
            chat => {
                super::chat::render_episode(chat, kind, &data, &settings.links.durations, plan.now)
            }
        };
        plan.outbox.push(OutboxWrite {
            event_id: event_id.clone(),
            endpoint: ep.name.clone(),
            kind,
            episode_id: id.to_owned(),
            body: text,
            channel: ep.kind.as_str(),
        });
    }
    // A request that is cancelled, or whose episode ended, must never go out later (a disabled
    // endpoint enabled again, a replay, another endpoint still retrying).
    if kind == EventType::ReclaimCancelled || before.is_some_and(|b| b.state == State::Requested) {
        plan.withdraw
            .push(webhook::event_id(id, EventType::ReclaimRequested));
    }
    *plan.report.events.entry(kind.as_str().into()).or_default() += 1;
    event_id
}

/// Whether a keep link can name exactly this workload: its tenant and workload are known and
/// the workload is no glob (an exemption for it would then cover others, or a whole tenant).
pub fn keepable(tenant: Option<&str>, workload: Option<&str>) -> bool {
    tenant.is_some() && workload.is_some_and(|w| !w.contains(['*', '?']))
}

/// Who holds the workload, as far as the ledger knows: a `namespace/pod` or a numeric Slurm job
/// id, the (owner, owner reference) its exporter sent, and the tenant's team and contact from
/// `[billing.tenants."NAME"]`.
pub fn owner(
    tenant: Option<&str>,
    workload: Option<&str>,
    (sent_owner, owner_ref): (Option<String>, Option<String>),
    analytics: &analytics::Settings,
) -> Option<OwnerData> {
    let info = tenant.and_then(|t| analytics.billing.tenants.get(t));
    let (namespace, name) = match workload.and_then(|w| w.split_once('/')) {
        Some((ns, n)) => (Some(ns.to_owned()), Some(n.to_owned())),
        None => (None, None),
    };
    let job_id = workload
        .filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit() || b == b'_'))
        .map(str::to_owned);
    let o = OwnerData {
        namespace,
        name,
        job_id,
        owner: sent_owner,
        owner_ref,
        team: info.and_then(|i| i.team.clone()),
        contact: info.and_then(|i| i.contact.clone()),
    };
    (o != OwnerData::default()).then_some(o)
}

/// The episode as events carry it.
pub fn episode_data(
    id: &str,
    e: &EpisodeRow,
    policy: PolicyData,
    analytics: &analytics::Settings,
    dry_run: bool,
) -> EpisodeData {
    EpisodeData {
        episode_id: id.to_owned(),
        tenant: e.tenant.clone(),
        workload: e.workload.clone(),
        node: e.node.clone(),
        gpu_uuid: e.gpu_uuid.clone(),
        gpu_model: e.gpu_model.clone(),
        mig_profile: e.mig_profile.clone(),
        gpu_instance_id: e.gpu_instance_id,
        slo_class: e.slo_class.clone(),
        gpu_equivalents: e.gpu_equivalents,
        idle_since: webhook::rfc3339(e.started_at),
        ended_at: e.ended_at.map(webhook::rfc3339),
        idle_seconds: e.last_second + 1 - e.started_at,
        mean_sm_active: e.mean_sm_active,
        idle_gpu_seconds: e.idle_gpu_seconds,
        idle_cost: e.cost,
        currency: analytics.prices.currency.clone(),
        policy,
        dry_run,
        keep_url: None,
        owner: Some(OwnerData {
            owner: e.owner.clone(),
            owner_ref: e.owner_ref.clone(),
            ..OwnerData::default()
        }),
    }
}

/// Commits a plan, in the writer's transaction: the new episode states replace the old ones,
/// the decisions are appended, and the events go into the outbox unless already there (by event
/// id and endpoint) — set-wise, through two scratch tables, so a pass costs a few statements
/// however many episodes it decides about.
pub fn store(tx: &duckdb::Transaction<'_>, plan: &Plan) -> duckdb::Result<()> {
    let now = plan.now;
    tx.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS reclaim_new AS SELECT * FROM reclaim_episodes LIMIT 0;
         DELETE FROM temp.reclaim_new;
         CREATE TEMP TABLE IF NOT EXISTS outbox_new AS SELECT * FROM webhook_outbox LIMIT 0;
         DELETE FROM temp.outbox_new;",
    )?;
    {
        let mut app = tx.appender("reclaim_new")?;
        for w in &plan.episodes {
            let data = &w.episode;
            let started_at = w.row.as_ref().map_or_else(
                || {
                    chrono::DateTime::parse_from_rfc3339(&data.idle_since)
                        .map_or(0, |t| t.timestamp())
                },
                |r| r.started_at,
            );
            app.append_row(params![
                w.id,
                data.tenant,
                data.workload,
                data.node,
                data.gpu_uuid,
                data.gpu_instance_id,
                data.slo_class,
                started_at,
                w.state.as_str(),
                w.notified_at,
                w.requested_at,
                (!w.state.is_open()).then_some(now),
                w.last_hold,
                w.data,
                now
            ])?;
        }
        app.flush()?;
    }
    tx.execute_batch(
        "DELETE FROM reclaim_episodes WHERE episode_id IN (SELECT episode_id FROM temp.reclaim_new);
         INSERT INTO reclaim_episodes SELECT * FROM temp.reclaim_new;",
    )?;
    {
        let mut app = tx.appender("reclaim_decisions")?;
        for d in &plan.decisions {
            app.append_row(params![
                now,
                d.episode_id,
                d.tenant,
                d.workload,
                d.node,
                d.decision,
                d.reason,
                d.detail,
                plan.dry_run,
                d.event_id
            ])?;
        }
        app.flush()?;
    }
    for id in &plan.withdraw {
        tx.execute(
            "UPDATE webhook_outbox SET state = 'cancelled',
                 last_error = 'withdrawn: the reclaim was cancelled or its episode ended'
             WHERE event_id = ? AND state IN ('pending', 'disabled', 'failed')",
            [id],
        )?;
    }
    {
        let mut app = tx.appender("outbox_new")?;
        for o in &plan.outbox {
            app.append_row(params![
                o.event_id,
                o.endpoint,
                o.kind.as_str(),
                o.episode_id,
                o.body,
                now,
                "pending",
                0,
                now,
                None::<i64>,
                None::<i32>,
                None::<String>,
                o.channel
            ])?;
        }
        app.flush()?;
    }
    // Idempotent: an event already in the outbox for that endpoint is not added twice. A request
    // made again after it was withdrawn undelivered (its id is the same) goes back to pending.
    tx.execute_batch(
        "UPDATE webhook_outbox SET state = 'pending', next_attempt_at = n.next_attempt_at,
             created_at = n.created_at, attempts = 0, last_error = NULL
         FROM temp.outbox_new n
         WHERE webhook_outbox.event_id = n.event_id AND webhook_outbox.endpoint = n.endpoint
           AND webhook_outbox.state = 'cancelled' AND n.event_type = 'reclaim.requested';
         INSERT INTO webhook_outbox SELECT n.* FROM temp.outbox_new n
         WHERE NOT EXISTS (SELECT 1 FROM webhook_outbox o
                           WHERE o.event_id = n.event_id AND o.endpoint = n.endpoint)",
    )?;
    Ok(())
}
