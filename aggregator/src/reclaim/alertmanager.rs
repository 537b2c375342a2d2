//! Alertmanager, both ways.
//!
//! - Push: every `[alertmanager] interval`, each open episode whose GPU reports is sent to
//!   Alertmanager's `POST /api/v2/alerts` as a `GpuledgerIdleHoarding` alert with `endsAt` three
//!   intervals ahead (so it stays firing while re-sent, and resolves by itself if gpuledger stops);
//!   episodes that ended within the last hour are sent with their end as `endsAt` (resolved).
//! - Intake: `POST /api/v1/alertmanager` takes Alertmanager's webhook (payload version 4). A
//!   firing alert that reaches it was neither silenced nor inhibited, so with
//!   `reclaim.alertmanager_confirmation` set, only such episodes are reclaimed: a silence in
//!   Alertmanager is an exemption.

use std::collections::BTreeMap;

use duckdb::{Connection, params};
use gpuledger_schema::webhook;
use serde::{Deserialize, Serialize};

use gpuledger_ledger::analytics::{self, EpisodeState};
use gpuledger_ledger::reclaim::config::{Alertmanager, Settings};
use gpuledger_ledger::reclaim::pass::id_of;

/// The alert name.
pub const ALERT_NAME: &str = "GpuledgerHoardingEpisode";

/// One alert as `POST /api/v2/alerts` takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostableAlert {
    /// Labels (identify the alert).
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Start (RFC 3339).
    pub starts_at: String,
    /// End (RFC 3339): in the future while firing.
    pub ends_at: String,
}

/// The alerts to push as of `now`.
pub fn alerts(
    conn: &Connection,
    analytics: &analytics::Settings,
    settings: &Settings,
    am: &Alertmanager,
    now: i64,
) -> duckdb::Result<Vec<PostableAlert>> {
    let stale = settings.max_staleness.as_secs() as i64;
    let ahead = 3 * am.interval.as_secs() as i64;
    let rows = analytics::episodes(
        conn,
        EpisodeState::All,
        now - 3600,
        i64::MAX,
        None,
        analytics,
    )?;
    // Keep links only for episodes the reclaim pass already follows: a link must name an episode
    // the keep page can find.
    let followed: std::collections::HashSet<String> = conn
        .prepare_cached("SELECT episode_id FROM reclaim_episodes WHERE state <> 'resolved'")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(rows
        .into_iter()
        .filter(|e| e.ended_at.is_some() || now - (e.last_second + 1) <= stale)
        .map(|e| {
            let labels: BTreeMap<String, String> = [
                ("alertname", ALERT_NAME.to_owned()),
                ("episode_id", id_of(&e)),
                ("tenant", e.tenant.clone().unwrap_or_default()),
                ("workload", e.workload.clone().unwrap_or_default()),
                ("node", e.node.clone()),
                ("gpu", e.gpu_uuid.clone()),
                (
                    "gpu_instance",
                    e.gpu_instance_id.map(|g| g.to_string()).unwrap_or_default(),
                ),
                ("slo_class", e.slo_class.clone().unwrap_or_default()),
                ("severity", "info".into()),
            ]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            let idle = e.last_second + 1 - e.started_at;
            let id = id_of(&e);
            let keep_url = (e.ended_at.is_none()
                && followed.contains(&id)
                && gpuledger_ledger::reclaim::pass::keepable(
                    e.tenant.as_deref(),
                    e.workload.as_deref(),
                ))
            .then(|| settings.links.url(&id, now))
            .flatten();
            let annotations = [
                (
                    "summary",
                    format!(
                        "{} has held {} idle for {} min",
                        e.workload.as_deref().unwrap_or("a workload"),
                        e.mig_profile.as_deref().unwrap_or(&e.gpu_model),
                        idle / 60
                    ),
                ),
                (
                    "idle_cost",
                    format!("{:.2} {}", e.cost, analytics.prices.currency),
                ),
                (
                    "runbook_url",
                    "alerts/RUNBOOK.md#gpuledgerhoardingepisode".into(),
                ),
            ]
            .into_iter()
            .chain(keep_url.map(|u| ("keep_url", u)))
            .chain(
                gpuledger_ledger::reclaim::pass::owner(
                    e.tenant.as_deref(),
                    e.workload.as_deref(),
                    (e.owner.clone(), e.owner_ref.clone()),
                    analytics,
                )
                .map(|o| ("owner", o.describe())),
            )
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            PostableAlert {
                labels,
                annotations,
                starts_at: webhook::rfc3339(e.detected_at),
                ends_at: webhook::rfc3339(e.ended_at.unwrap_or(now + ahead)),
            }
        })
        .collect())
}

/// Pushes `alerts` once.
pub async fn push(
    client: &reqwest::Client,
    am: &Alertmanager,
    alerts: &[PostableAlert],
) -> Result<(), String> {
    if alerts.is_empty() {
        return Ok(());
    }
    let mut req = client
        .post(format!("{}/api/v2/alerts", am.url))
        .timeout(std::time::Duration::from_secs(10))
        .json(alerts);
    if let Some(t) = &am.token {
        req = req.bearer_auth(t);
    }
    match req.send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("Alertmanager answered {}", r.status())),
        Err(e) => Err(format!("cannot reach Alertmanager: {e}")),
    }
}

/// Alertmanager's webhook body (version 4); only what gpuledger reads.
#[derive(Debug, Clone, Deserialize)]
pub struct WebhookMessage {
    /// `"4"`.
    pub version: String,
    /// The alerts of the notification.
    pub alerts: Vec<WebhookAlert>,
}

/// One alert of a notification.
#[derive(Debug, Clone, Deserialize)]
pub struct WebhookAlert {
    /// `firing` or `resolved`.
    pub status: String,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// What `POST /api/v1/alertmanager` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IntakeReport {
    /// Firing gpuledger episodes confirmed.
    pub confirmed: usize,
    /// Alerts that were not firing gpuledger episodes (ignored).
    pub ignored: usize,
}

/// The episode ids a notification confirms.
pub fn confirmed(msg: &WebhookMessage) -> (Vec<String>, IntakeReport) {
    let mut ids = Vec::new();
    let mut report = IntakeReport::default();
    for a in &msg.alerts {
        match (a.status.as_str(), a.labels.get("episode_id")) {
            ("firing", Some(id))
                if a.labels.get("alertname").map(String::as_str) == Some(ALERT_NAME) =>
            {
                ids.push(id.clone());
                report.confirmed += 1;
            }
            _ => report.ignored += 1,
        }
    }
    (ids, report)
}

/// Records confirmations, in the writer's transaction.
pub fn store(tx: &duckdb::Transaction<'_>, ids: &[String], now: i64) -> duckdb::Result<()> {
    for id in ids {
        tx.execute(
            "DELETE FROM alertmanager_confirmations WHERE episode_id = ?",
            [id],
        )?;
        tx.execute(
            "INSERT INTO alertmanager_confirmations VALUES (?, ?)",
            params![id, now],
        )?;
    }
    Ok(())
}
