//! The `budget.*` webhook events: a tenant's month-end forecast went over its budget
//! (`budget.forecast_exceeded`), or its spend reached it (`budget.exceeded`), each sent at most
//! once per tenant and month (`schema/WEBHOOK.md`, "Budget events").
//!
//! Key decision: the once-ness is in the data, as for episodes. An event's id is derived from the
//! tenant, the month and the type, and the outbox keeps one row per (event id, endpoint) —
//! delivered rows for the rollup-retention window — so the aggregator deciding the same thing
//! again every evaluation, after a restart or after the forecast dipped and rose, adds nothing.
//! Budget events go only to the endpoints that name them in `events` (an endpoint with none gets
//! the episode events it always got: a scheduler bridge is not sent money).

use duckdb::params;
use gpuledger_schema::webhook::{self, BudgetData, BudgetEvent, EventType};

use super::config::{Endpoint, EndpointKind};
use crate::analytics::bill::BillingSettings;
use crate::analytics::budgets::Budgets;

/// One outbox row to add.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The event id (`webhook-id`).
    pub event_id: String,
    /// The endpoint's name.
    pub endpoint: String,
    /// The type.
    pub kind: EventType,
    /// The tenant's month (`bud_…`), in the outbox's episode column.
    pub notice_id: String,
    /// The body.
    pub body: String,
    /// `webhook`, `slack` or `teams`.
    pub channel: &'static str,
}

/// The notices `b` (a month's budgets as of now) calls for, per endpoint that takes them (a
/// chat endpoint routes by tenant and by the tenant's `contact` in `billing`).
pub fn plan(
    b: &Budgets,
    endpoints: &[Endpoint],
    billing: &BillingSettings,
    now: i64,
) -> Vec<Notice> {
    let takers = |kind: EventType, tenant: String| {
        let contact = billing.tenants.get(&tenant).and_then(|i| i.contact.clone());
        endpoints.iter().filter(move |e| {
            e.events.contains(&kind) && e.takes(kind, Some(&tenant), contact.as_deref())
        })
    };
    let month = chrono::DateTime::from_timestamp(b.from, 0)
        .map(|d| d.format("%Y-%m").to_string())
        .unwrap_or_default();
    let mut out = Vec::new();
    for l in &b.lines {
        let kinds = [
            // Sent once a month: not on a forecast from the month's first hours alone (a rate
            // over whole days, or spend already over).
            (
                l.forecast_ratio > 1.0 && (l.run_rate_days >= 1 || l.spent_ratio >= 1.0),
                EventType::BudgetForecastExceeded,
            ),
            (l.spent_ratio >= 1.0, EventType::BudgetExceeded),
        ];
        for (due, kind) in kinds {
            if !due || takers(kind, l.tenant.clone()).next().is_none() {
                continue;
            }
            let notice_id = webhook::budget_notice_id(&l.tenant, &month);
            let event = BudgetEvent {
                kind,
                timestamp: webhook::rfc3339(now),
                data: BudgetData {
                    notice_id: notice_id.clone(),
                    tenant: l.tenant.clone(),
                    month: month.clone(),
                    budget: l.budget.0 as f64 / 100.0,
                    spent: l.spent.0 as f64 / 100.0,
                    forecast: l.forecast.0 as f64 / 100.0,
                    spent_ratio: l.spent_ratio,
                    forecast_ratio: l.forecast_ratio,
                    forecast_exceeds_on: l.forecast_exceeds_on.clone(),
                    currency: b.currency.clone(),
                    cost_mode: b.cost_mode.as_str().to_owned(),
                },
            };
            let body = serde_json::to_string(&event).expect("events serialize");
            for e in takers(kind, l.tenant.clone()) {
                out.push(Notice {
                    event_id: webhook::event_id(&notice_id, kind),
                    endpoint: e.name.clone(),
                    kind,
                    notice_id: notice_id.clone(),
                    body: match e.kind {
                        EndpointKind::Webhook => body.clone(),
                        chat => super::chat::render_budget(chat, kind, &event.data),
                    },
                    channel: e.kind.as_str(),
                });
            }
        }
    }
    out
}

/// Adds the notices the outbox does not hold yet (by event id and endpoint), in the writer's
/// transaction; answers how many were added.
pub fn store(tx: &duckdb::Transaction<'_>, notices: &[Notice], now: i64) -> duckdb::Result<usize> {
    let mut added = 0;
    let mut stmt = tx.prepare_cached(
        "INSERT INTO webhook_outbox
         SELECT ?, ?, ?, ?, ?, ?, 'pending', 0, ?, NULL, NULL, NULL, ?
         WHERE NOT EXISTS (SELECT 1 FROM webhook_outbox WHERE event_id = ? AND endpoint = ?)",
    )?;
    for n in notices {
        added += stmt.execute(params![
            n.event_id,
            n.endpoint,
            n.kind.as_str(),
            n.notice_id,
            n.body,
            now,
            now,
            n.channel,
            n.event_id,
            n.endpoint
        ])?;
    }
    Ok(added)
}
