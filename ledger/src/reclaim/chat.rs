//! The chat messages of `[[notify]]` endpoints: a short message per event a person can act on,
//! rendered when the event is queued, as Slack Block Kit (Slack incoming webhooks; Mattermost and
//! Rocket.Chat read its `text`) or a Microsoft Teams Adaptive Card (a Workflows webhook)
//! (docs/reclaim.md, "Chat messages").
//!
//! Key decision: the message is rendered once, into the outbox row, from the same event data the
//! webhook carries, so a retry resends the same words and the same keep link, and the chat body
//! needs no second path through the policy.

use gpuledger_schema::webhook::{BudgetData, EpisodeData, EventType};
use serde_json::{Value, json};

use super::config::EndpointKind;

/// A Slack button's text may hold this many characters at most.
const SLACK_BUTTON_TEXT: usize = 75;
/// A Slack header's text may hold this many characters at most.
const SLACK_HEADER_TEXT: usize = 150;

/// One fact of a message: (label, value).
type Fact = (String, String);

/// What a message says, before it is put in a chat's format.
#[derive(Debug, Clone, PartialEq)]
struct Message {
    title: String,
    sentence: String,
    facts: Vec<Fact>,
    /// (label, url).
    buttons: Vec<(String, String)>,
}

/// `secs` as `2 h 05 min` (or `45 s` under a minute).
pub fn span_text(secs: i64) -> String {
    let secs = secs.max(0);
    let (d, h, m) = (secs / 86400, secs % 86400 / 3600, secs % 3600 / 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{secs} s"),
        (0, 0, m) => format!("{m} min"),
        (0, h, m) => format!("{h} h {m:02} min"),
        (d, h, _) => format!("{d} d {h} h"),
    }
}

/// A configured keep duration (`4h`, `1d`) as a button's words (`Keep 4 h`).
pub fn keep_label(text: &str) -> String {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let label = if n.is_empty() || unit.is_empty() {
        format!("Keep {text}")
    } else {
        format!("Keep {n} {unit}")
    };
    label.chars().take(SLACK_BUTTON_TEXT).collect()
}

/// When the reclaim comes, in words, for an episode's event.
fn deadline(kind: EventType, d: &EpisodeData, now: i64) -> String {
    let p = &d.policy;
    match (kind, p.after_seconds, p.notice_seconds) {
        (EventType::ReclaimRequested, _, _) => "requested now".into(),
        (EventType::HoardingDetected, Some(after), Some(notice)) => {
            let since =
                chrono::DateTime::parse_from_rfc3339(&d.idle_since).map_or(0, |t| t.timestamp());
            // The notice period counts from the notice's delivery: now at the earliest.
            let at = (since + after).max(now + notice);
            format!("not before {}", gpuledger_schema::webhook::rfc3339(at))
        }
        (_, None, _) | (_, _, None) => "not reclaimed (notify only)".into(),
        _ => "none".into(),
    }
}

fn episode_message(
    kind: EventType,
    d: &EpisodeData,
    durations: &[(String, std::time::Duration)],
    now: i64,
) -> Message {
    let workload = d.workload.as_deref().unwrap_or("(unattributed)");
    let what = match kind {
        EventType::HoardingDetected => "Idle GPU",
        EventType::ReclaimRequested => "Reclaim requested",
        EventType::ReclaimCancelled => "Reclaim cancelled",
        EventType::HoardingResolved => "GPU in use again",
        _ => "GPU",
    };
    let mut title = format!("{what}: {workload}");
    if d.dry_run {
        title = format!("[dry run] {title}");
    }
    let mut facts: Vec<Fact> = vec![
        (
            "Tenant".into(),
            d.tenant.clone().unwrap_or_else(|| "-".into()),
        ),
        ("Node".into(), d.node.clone()),
        ("Idle".into(), span_text(d.idle_seconds)),
        (
            "Idle cost".into(),
            format!("{:.2} {}", d.idle_cost, d.currency),
        ),
    ];
    if matches!(
        kind,
        EventType::HoardingDetected | EventType::ReclaimRequested
    ) {
        facts.push(("Reclaim".into(), deadline(kind, d, now)));
    }
    if let Some(o) = &d.owner {
        facts.push(("Owner".into(), o.describe()));
    }
    let buttons = match (&d.keep_url, kind) {
        (Some(url), EventType::HoardingDetected | EventType::ReclaimRequested) => durations
            .iter()
            .map(|(t, _)| (keep_label(t), format!("{url}?d={t}")))
            .collect(),
        _ => Vec::new(),
    };
    Message {
        title,
        sentence: d.policy.reason.clone(),
        facts,
        buttons,
    }
}

fn budget_message(kind: EventType, b: &BudgetData) -> Message {
    let title = match kind {
        EventType::BudgetExceeded => format!("Budget reached: {} ({})", b.tenant, b.month),
        _ => format!("Budget forecast over: {} ({})", b.tenant, b.month),
    };
    let sentence = match &b.forecast_exceeds_on {
        Some(day) => format!("At this rate the month's spend reaches the budget on {day}."),
        None => "The month's spend has reached its budget.".into(),
    };
    Message {
        title,
        sentence,
        facts: vec![
            ("Tenant".into(), b.tenant.clone()),
            ("Spent".into(), format!("{:.2} {}", b.spent, b.currency)),
            ("Budget".into(), format!("{:.2} {}", b.budget, b.currency)),
            (
                "Forecast".into(),
                format!("{:.2} {}", b.forecast, b.currency),
            ),
        ],
        buttons: Vec::new(),
    }
}

/// Escapes text for Slack's mrkdwn (`&`, `<`, `>`; the rest is literal).
pub fn mrkdwn(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn slack(m: &Message) -> Value {
    let mut fallback = format!("*{}*\n{}", mrkdwn(&m.title), mrkdwn(&m.sentence));
    for (k, v) in &m.facts {
        fallback.push_str(&format!("\n{}: {}", mrkdwn(k), mrkdwn(v)));
    }
    if !m.buttons.is_empty() {
        let links: Vec<String> = (m.buttons.iter())
            .map(|(label, url)| format!("<{url}|{}>", mrkdwn(label)))
            .collect();
        fallback.push_str(&format!("\n{}", links.join(" · ")));
    }
    let mut blocks = vec![
        json!({"type": "header", "text": {"type": "plain_text",
            "text": m.title.chars().take(SLACK_HEADER_TEXT).collect::<String>()}}),
        json!({"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn(&m.sentence)},
            "fields": m.facts.iter().map(|(k, v)| json!({"type": "mrkdwn",
                "text": format!("*{}*\n{}", mrkdwn(k), mrkdwn(v))})).collect::<Vec<_>>()}),
    ];
    if !m.buttons.is_empty() {
        let elements: Vec<Value> = (m.buttons.iter().enumerate())
            .map(|(i, (label, url))| {
                let mut b = json!({"type": "button", "action_id": format!("keep_{i}"),
                    "text": {"type": "plain_text", "text": label}, "url": url});
                if i == 0 {
                    b["style"] = json!("primary");
                }
                b
            })
            .collect();
        blocks.push(json!({"type": "actions", "block_id": "keep", "elements": elements}));
    }
    json!({"text": fallback, "blocks": blocks})
}

fn teams(m: &Message) -> Value {
    let facts: Vec<Value> = (m.facts.iter())
        .map(|(k, v)| json!({"title": k, "value": v}))
        .collect();
    let actions: Vec<Value> = (m.buttons.iter())
        .map(|(label, url)| json!({"type": "Action.OpenUrl", "title": label, "url": url}))
        .collect();
    let mut card = json!({
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            {"type": "TextBlock", "text": m.title, "weight": "Bolder", "size": "Medium", "wrap": true},
            {"type": "TextBlock", "text": m.sentence, "wrap": true},
            {"type": "FactSet", "facts": facts},
        ],
    });
    if !actions.is_empty() {
        card["actions"] = Value::Array(actions);
    }
    json!({"type": "message", "attachments": [{
        "contentType": "application/vnd.microsoft.card.adaptive",
        "contentUrl": null,
        "content": card,
    }]})
}

fn format(kind: EndpointKind, m: &Message) -> String {
    let v = match kind {
        EndpointKind::Teams => teams(m),
        _ => slack(m),
    };
    v.to_string()
}

/// The chat body of an episode's event `kind` for an endpoint of `chat` kind; `durations` are the
/// keep buttons (shown when `d.keep_url` is set); `now` is when it is queued.
pub fn render_episode(
    chat: EndpointKind,
    kind: EventType,
    d: &EpisodeData,
    durations: &[(String, std::time::Duration)],
    now: i64,
) -> String {
    format(chat, &episode_message(kind, d, durations, now))
}

/// The chat body of a budget event.
pub fn render_budget(chat: EndpointKind, kind: EventType, b: &BudgetData) -> String {
    format(chat, &budget_message(kind, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_schema::webhook::{Action, OwnerData, PolicyData};

    fn data() -> EpisodeData {
        EpisodeData {
            episode_id: "ep_0123456789abcdef01234567".into(),
            tenant: Some("ml".into()),
            workload: Some("lab/nb-<idle>&co".into()),
            node: "gpu-node-1".into(),
            gpu_uuid: "GPU-1".into(),
            gpu_model: "H100".into(),
            mig_profile: None,
            gpu_instance_id: None,
            slo_class: Some("interactive".into()),
            gpu_equivalents: 1.0,
            idle_since: "2026-01-01T10:00:00Z".into(),
            ended_at: None,
            idle_seconds: 7500,
            mean_sm_active: Some(0.0),
            idle_gpu_seconds: 7500.0,
            idle_cost: 7.5,
            currency: "USD".into(),
            policy: PolicyData {
                class: "interactive".into(),
                action: Action::Reclaim,
                after_seconds: Some(3600),
                notice_seconds: Some(900),
                rule: "class".into(),
                reason: "hoarding.detected: idle 7500 s".into(),
            },
            dry_run: false,
            keep_url: Some("https://gpu.example/keep/TOKEN".into()),
            owner: Some(OwnerData {
                namespace: Some("lab".into()),
                name: Some("nb-<idle>&co".into()),
                job_id: None,
                owner: Some("alice".into()),
                owner_ref: Some("StatefulSet/notebooks".into()),
                team: Some("vision".into()),
                contact: Some("#ml-gpu".into()),
            }),
        }
    }

    fn durations() -> Vec<(String, std::time::Duration)> {
        ["4h", "8h", "24h"]
            .iter()
            .map(|d| ((*d).into(), humantime::parse_duration(d).unwrap()))
            .collect()
    }

    #[test]
    fn the_slack_message_has_keep_buttons_and_escaped_text() {
        let body = render_episode(
            EndpointKind::Slack,
            EventType::HoardingDetected,
            &data(),
            &durations(),
            1_767_268_800,
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["text"].as_str().unwrap().contains("&lt;idle&gt;&amp;co"));
        // The owner as the exporter sent it, beside the tenant's team and contact.
        assert!(
            body.contains("of StatefulSet/notebooks, owner alice, team vision, #ml-gpu"),
            "{body}"
        );
        let buttons = v["blocks"][2]["elements"].as_array().unwrap();
        assert_eq!(buttons.len(), 3);
        assert_eq!(buttons[0]["url"], "https://gpu.example/keep/TOKEN?d=4h");
        assert_eq!(buttons[2]["text"]["text"], "Keep 24 h");
    }

    #[test]
    fn the_teams_card_opens_the_keep_link() {
        let body = render_episode(
            EndpointKind::Teams,
            EventType::ReclaimRequested,
            &data(),
            &durations(),
            1_767_268_800,
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        let card = &v["attachments"][0]["content"];
        assert_eq!(card["type"], "AdaptiveCard");
        assert_eq!(card["actions"][1]["type"], "Action.OpenUrl");
        assert_eq!(
            card["actions"][1]["url"],
            "https://gpu.example/keep/TOKEN?d=8h"
        );
    }

    #[test]
    fn a_cancellation_has_no_buttons() {
        let mut d = data();
        d.dry_run = true;
        let body = render_episode(
            EndpointKind::Slack,
            EventType::ReclaimCancelled,
            &d,
            &durations(),
            1_767_268_800,
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["blocks"].as_array().unwrap().len(), 2);
        assert!(
            v["blocks"][0]["text"]["text"]
                .as_str()
                .unwrap()
                .starts_with("[dry run]")
        );
    }

    #[test]
    fn spans_and_labels_read_as_words() {
        assert_eq!(span_text(7500), "2 h 05 min");
        assert_eq!(span_text(45), "45 s");
        assert_eq!(span_text(90000), "1 d 1 h");
        assert_eq!(keep_label("4h"), "Keep 4 h");
        assert_eq!(keep_label("90m"), "Keep 90 m");
    }
}
