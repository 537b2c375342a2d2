//! Notices people can answer, end to end: a real aggregator fed the reclaim trace
//! ([`crate::reclaim`]), its signed webhooks to a scheduler receiver, chat messages to a chat
//! receiver ([`crate::common::chat`]), and the keep links they carry opened and posted over HTTP
//! on loopback (docs/reclaim.md, "Keep links" and "Chat messages").

use std::time::Duration;

use serde_json::Value;

use crate::common::chat::{Answer, ChatReceiver};
use crate::common::receiver::{Receiver, assert_schema_valid};
use crate::common::{ADMIN_TOKEN, Aggregator, eventually};
use crate::reclaim::{Fed, assert_event_count, fed, fed_logged, get, notices};

/// `[[notify]]` tables for a Slack and a Teams endpoint of `chat`.
fn chat_tables(chat: &ChatReceiver) -> String {
    format!(
        r#"
[[notify]]
name = "slack"
kind = "slack"
url = "{}"
timeout = "2s"
[[notify]]
name = "teams"
kind = "teams"
url = "{}"
timeout = "2s"
"#,
        chat.url("slack"),
        chat.url("teams")
    )
}

/// The keep link the scheduler receiver got for `workload`.
fn keep_url(rx: &Receiver, workload: &str) -> String {
    rx.received()
        .iter()
        .find(|r| r.workload() == workload && r.kind() == "hoarding.detected")
        .and_then(|r| r.body["data"]["keep_url"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no keep_url for {workload}"))
}

/// The value of the hidden input `name` of a page.
fn input_value(html: &str, name: &str) -> String {
    let at = html
        .find(&format!("name=\"{name}\" value=\""))
        .unwrap_or_else(|| panic!("no input {name} in {html}"));
    let rest = &html[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// A form body of URL-safe values (base64url, digits, durations) as a browser sends it.
fn form_body(fields: &[(&str, String)]) -> String {
    (fields.iter())
        .map(|(k, v)| {
            assert!(
                v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
                "{v}"
            );
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn open(url: &str) -> (u16, String) {
    let r = client().get(url).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Opens the link, then posts `duration` from its page as a browser on the aggregator's origin
/// would: the status and the body.
async fn keep(a: &Aggregator, url: &str, duration: &str) -> (u16, String) {
    let (status, page) = open(url).await;
    assert_eq!(status, 200, "{page}");
    let form = [
        ("duration", duration.to_owned()),
        ("form", input_value(&page, "form")),
        ("t", input_value(&page, "t")),
    ];
    let r = client()
        .post(url)
        .header("origin", a.url())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&form))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn exemptions(a: &Aggregator) -> Vec<Value> {
    let (status, body) = get(a, ADMIN_TOKEN, "/api/v1/exemptions").await;
    assert_eq!(status, 200, "{body}");
    body["exemptions"].as_array().unwrap().clone()
}

/// The issue's "done when", first part: Slack and Teams get well-formed messages whose buttons
/// are the keep link; opening it changes nothing; "keep 4 h" stores an exemption `by = "link"`
/// for exactly that workload and withdraws its pending reclaim request, so the scheduler gets
/// `reclaim.cancelled` and never the request; the Slack channel having the request does not
/// count as the request delivered.
#[tokio::test(flavor = "multi_thread")]
async fn chat_messages_carry_the_keep_link_and_a_keep_withdraws_the_pending_request() {
    let chat = ChatReceiver::start().await;
    let Fed {
        dir: _dir, rx, a, ..
    } = fed(204, "", &chat_tables(&chat)).await;
    notices(&a, &rx).await;
    assert_schema_valid(&rx.received());
    let link = keep_url(&rx, "4242");
    assert!(link.starts_with(&format!("{}/keep/1.", a.url())), "{link}");
    assert_ne!(link, keep_url(&rx, "lab/nb-idle"), "one link per episode");
    // The owner the exporter sent, in the event beside what the workload's name tells.
    let detected = (rx.received().into_iter())
        .find(|r| r.workload() == "4242" && r.kind() == "hoarding.detected")
        .unwrap();
    let owner = &detected.body["data"]["owner"];
    assert_eq!(owner["job_id"], "4242", "{owner}");
    assert_eq!(owner["owner"], "alice", "{owner}");
    assert_eq!(owner["owner_ref"], "Account/physics", "{owner}");
    // ... and on the Hoarding page's open episodes (its CSV: the table as shown).
    let csv = client()
        .get(format!("{}/hoarding?format=csv&table=open", a.url()))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(csv.lines().next().unwrap().contains(",owner,"), "{csv}");
    let row = csv.lines().find(|l| l.contains(",4242,")).expect(&csv);
    assert!(row.contains(",alice (Account/physics),"), "{row}");

    eventually("the chat messages", Duration::from_secs(30), async || {
        (chat.got("slack").len() >= 4 && chat.got("teams").len() >= 4).then_some(())
    })
    .await;
    let slack = chat.got("slack");
    for m in &slack {
        assert!(
            m.headers.get("webhook-signature").is_none(),
            "chat is not signed"
        );
        assert_eq!(m.headers["content-type"], "application/json");
        assert!(m.body["text"].as_str().is_some_and(|t| !t.is_empty()));
        assert_eq!(m.body["blocks"][0]["type"], "header");
    }
    let msg = (slack.iter())
        .find(|m| m.body["blocks"][0]["text"]["text"] == "Idle GPU: 4242")
        .expect("a Slack message about 4242");
    let buttons = msg.body["blocks"][2]["elements"].as_array().unwrap();
    let labels: Vec<&str> = buttons
        .iter()
        .map(|b| b["text"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["Keep 4 h", "Keep 8 h", "Keep 24 h"]);
    for b in buttons {
        assert_eq!(b["type"], "button");
        assert!(b["url"].as_str().unwrap().starts_with(&link), "{b}");
    }
    assert!(
        msg.body["text"].as_str().unwrap().contains(&link),
        "fallback text links too"
    );
    assert!(
        msg.body
            .to_string()
            .contains("job 4242 of Account/physics, owner alice"),
        "the message names the owner: {}",
        msg.body
    );
    let card = (chat.got("teams").into_iter())
        .map(|m| m.body)
        .find(|b| b["attachments"][0]["content"]["body"][0]["text"] == "Idle GPU: 4242")
        .expect("a Teams card about 4242");
    assert_eq!(card["type"], "message");
    let content = &card["attachments"][0]["content"];
    assert_eq!(
        card["attachments"][0]["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );
    assert_eq!(content["type"], "AdaptiveCard");
    assert_eq!(content["actions"][0]["type"], "Action.OpenUrl");
    assert!(
        content["actions"][0]["url"]
            .as_str()
            .unwrap()
            .starts_with(&link)
    );

    // The scheduler is down: the requests stay pending there (the chat channels have them).
    rx.answer(503);
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert_event_count(&report, "reclaim.requested", 2);

    // Opening the link (twice, as a link scanner and a person would) changes nothing.
    for _ in 0..2 {
        let (status, page) = open(&format!("{link}?d=4h")).await;
        assert_eq!(status, 200, "{page}");
        assert!(page.contains("4242") && page.contains("ml"), "{page}");
        assert!(
            !page.contains("serve/llm-0") && !page.contains("lab/nb-idle"),
            "one episode only"
        );
    }
    let r = client().get(&link).send().await.unwrap();
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert_eq!(r.headers()["referrer-policy"], "same-origin");
    assert!(exemptions(&a).await.is_empty(), "a GET keeps nothing");

    let (status, body) = keep(&a, &link, "4h").await;
    assert_eq!(status, 303, "{body}");
    let ex = exemptions(&a).await;
    assert_eq!(ex.len(), 1, "{ex:?}");
    assert_eq!(ex[0]["created_by"], "link");
    assert_eq!(ex[0]["tenant"], "ml");
    assert_eq!(
        ex[0]["workload"], "4242",
        "exactly this workload, never a glob"
    );
    let (_, page) = open(&link).await;
    assert!(page.contains("Kept until"), "{page}");

    // The keep withdraws 4242's request (a pass runs after it; this one may find it done).
    let (_, report) = a.evaluate(ADMIN_TOKEN).await;
    assert!(
        report["reclaim"]["events"]
            .get("reclaim.requested")
            .is_none(),
        "{report}"
    );
    rx.answer(204);
    eventually(
        "the cancellation and the other request",
        Duration::from_secs(60),
        async || {
            let e = rx.events();
            (e.contains(&("4242".into(), "reclaim.cancelled".into()))
                && e.contains(&("lab/nb-idle".into(), "reclaim.requested".into())))
            .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !rx.events()
            .contains(&("4242".into(), "reclaim.requested".into())),
        "the scheduler never gets the withdrawn request: {:?}",
        rx.events()
    );
}

/// Keep tokens are secrets as long as they last: none appears in the aggregator's log (at
/// `debug`, through issuing, opening, keeping, a refused tampered token and the evaluations after)
/// nor in its `/metrics`, though the log does record the keep (so this test can fail).
#[tokio::test(flavor = "multi_thread")]
async fn keep_tokens_appear_in_no_log_and_no_metric() {
    let chat = ChatReceiver::start().await;
    let Fed { dir, rx, a, .. } = fed_logged(204, "", &chat_tables(&chat), true).await;
    notices(&a, &rx).await;
    let link = keep_url(&rx, "4242");
    let token = link.rsplit('/').next().unwrap().to_owned();
    assert!(token.len() > 20, "{link}");
    let (status, body) = keep(&a, &link, "4h").await;
    assert_eq!(status, 303, "{body}");
    let mut tampered = link.clone();
    tampered.push('x');
    assert_eq!(open(&tampered).await.0, 403);
    let (status, body) = a.evaluate(ADMIN_TOKEN).await;
    assert_eq!(status, 200, "{body}");
    eventually("the chat messages", Duration::from_secs(30), async || {
        (chat.got("slack").len() >= 4).then_some(())
    })
    .await;
    let metrics = a.metrics_as(ADMIN_TOKEN).await;
    assert!(metrics.contains("gpuledger_aggregator_keep_requests_total"));
    assert!(!metrics.contains(&token), "a token in /metrics");
    let log = std::fs::read_to_string(dir.path().join("aggregator.log")).unwrap();
    assert!(
        log.contains("A reclaim exemption was added through a keep link."),
        "the log records the keep: {log}"
    );
    for secret in [&token, &tampered] {
        let secret = secret.rsplit('/').next().unwrap();
        assert!(!log.contains(secret), "a token in the log");
    }
}

/// The rest of the "done when": a second keep after the first expired works until the
/// per-episode bound, then the page refuses and names an admin; a tampered token, another
/// episode's id under this token's signature and garbage get 403 with a page; a post from
/// another site or without the page's form token gets 403; a duration not offered gets 400; a
/// restart keeps the link valid; an expired link gets 410.
#[tokio::test(flavor = "multi_thread")]
async fn keep_links_are_bounded_refuse_what_is_not_theirs_and_survive_a_restart() {
    let Fed {
        dir: _dir, rx, mut a, ..
    } = fed(
        204,
        "keep_durations = [\"2s\"]\nmax_keep = \"2s\"\nmax_keep_per_episode = \"4s\"\nlink_ttl = \"40s\"",
        "",
    )
    .await;
    notices(&a, &rx).await;
    let link = keep_url(&rx, "4242");
    let other = keep_url(&rx, "lab/nb-idle");
    let post = async |url: &str, origin: &str, form: &[(&str, String)]| {
        let r = client()
            .post(url)
            .header("origin", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(form))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let form_of = |page: &str, duration: &str| {
        vec![
            ("duration", duration.to_owned()),
            ("form", input_value(page, "form")),
            ("t", input_value(page, "t")),
        ]
    };

    let (status, body) = keep(&a, &link, "2s").await;
    assert_eq!(status, 303, "{body}");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (_, before_bound) = open(&link).await;
    let (status, body) = keep(&a, &link, "2s").await;
    assert_eq!(status, 303, "a second keep after the first ended: {body}");
    let (status, page) = open(&link).await;
    assert_eq!(status, 200);
    assert!(page.contains("4 s of 4 s"), "{page}");
    assert!(
        !page.contains("<button"),
        "no button past the bound: {page}"
    );
    let (status, body) = post(&link, &a.url(), &form_of(&before_bound, "2s")).await;
    assert_eq!(status, 409, "past the per-episode bound: {body}");
    assert!(body.contains("admin"), "names who can exempt it: {body}");

    // The guard of the form: same origin, the page's own form token, an offered duration.
    let (_, page) = open(&other).await;
    let form = form_of(&page, "2s");
    let (status, body) = post(&other, "http://evil.example", &form).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("another site"), "{body}");
    let mut wrong = form.clone();
    wrong[1].1 = "x".into();
    let (status, body) = post(&other, &a.url(), &wrong).await;
    assert_eq!(status, 403, "a form token not from the page: {body}");
    let (status, body) = post(&link, &a.url(), &form).await;
    assert_eq!(status, 403, "another link's form token: {body}");
    let mut long = form.clone();
    long[0].1 = "1h".into();
    let (status, body) = post(&other, &a.url(), &long).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("duration"), "{body}");
    let ex = exemptions(&a).await;
    assert!(
        ex.iter().all(|e| e["workload"] == "4242"),
        "nothing kept for lab/nb-idle: {ex:?}"
    );

    // Tampered, another episode's id under this token's signature, garbage.
    let (base, token) = link.rsplit_once('/').unwrap();
    let parts: Vec<&str> = token.split('.').collect();
    let mut sig = parts[4].to_owned();
    let c = if sig.starts_with('A') { "B" } else { "A" };
    sig.replace_range(0..1, c);
    let tampered = format!(
        "{base}/{}.{}.{}.{}.{sig}",
        parts[0], parts[1], parts[2], parts[3]
    );
    let other_ep = other.rsplit('/').next().unwrap().split('.').nth(2).unwrap();
    let foreign = format!(
        "{base}/{}.{}.{other_ep}.{}.{}",
        parts[0], parts[1], parts[3], parts[4]
    );
    for url in [tampered, foreign, format!("{base}/garbage")] {
        let (status, page) = open(&url).await;
        assert_eq!(status, 403, "{url}: {page}");
        assert!(page.contains("not valid"), "{page}");
    }

    // A restart keeps the link.
    a.crash_and_restart().await;
    let (status, page) = open(&link).await;
    assert_eq!(status, 200, "{page}");
    let metrics = a.metrics_as(ADMIN_TOKEN).await;
    assert!(!metrics.contains(parts[4]), "no token in /metrics");
    // A rotation: the new key signs, links already sent still work until they expire.
    let (status, body) = crate::reclaim::post(
        &a,
        ADMIN_TOKEN,
        "/api/v1/keep-links/rotate",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        open(&link).await.0,
        200,
        "an issued link outlives a rotation"
    );

    // Expired: 410 with a page that says when.
    eventually("the link's expiry", Duration::from_secs(60), async || {
        let (status, page) = open(&link).await;
        (status == 410).then_some(page)
    })
    .await
    .contains("expired");
}

/// A chat endpoint that throttles (429, `Retry-After: 3600`) or hangs never delays the scheduler's
/// webhooks; the throttled attempts are counted per endpoint.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_or_hanging_chat_endpoint_never_delays_webhooks() {
    let chat = ChatReceiver::start().await;
    chat.script(vec![Answer::Status(429, Some(3600))]);
    let hanging = ChatReceiver::start().await;
    hanging.script(vec![Answer::Hang]);
    let tables = format!(
        "{}\n[[notify]]\nname = \"hangs\"\nkind = \"slack\"\nurl = \"{}\"\ntimeout = \"30s\"\n",
        chat_tables(&chat),
        hanging.url("slack")
    );
    let Fed {
        dir: _dir, rx, a, ..
    } = fed(204, "", &tables).await;
    let started = std::time::Instant::now();
    notices(&a, &rx).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the webhooks came while chat hung"
    );
    eventually(
        "a throttled attempt counted",
        Duration::from_secs(30),
        async || {
            let m = a.metrics_as(ADMIN_TOKEN).await;
            m.lines()
                .any(|l| {
                    l.starts_with("gpuledger_aggregator_webhook_deliveries_total{")
                        && l.contains("endpoint=\"slack\"")
                        && l.contains("outcome=\"throttled\"")
                        && !l.ends_with(" 0")
                })
                .then_some(())
        },
    )
    .await;
    // One attempt, then the endpoint waits for its Retry-After: no second attempt.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(chat.got("slack").len(), 1, "the whole endpoint pauses");
}

/// The keep page in Chromium: it opens without signing in, shows the one episode and no other
/// tenant's or workload's data, and its "Keep 4 h" button keeps the workload; an admin then sees
/// the exemption, made by `link`, on the Hoarding page.
#[tokio::test(flavor = "multi_thread")]
async fn chromium_opens_a_keep_page_without_sign_in_and_keeps_4_h() {
    use crate::common::browser::Browser;
    let Fed {
        dir: _dir, rx, a, ..
    } = fed(204, "", "").await;
    notices(&a, &rx).await;
    let link = keep_url(&rx, "lab/nb-idle");
    let browser = Browser::start().await;
    browser.go(&format!("{link}?d=4h")).await;
    assert!(!browser.url().await.contains("/signin"), "no sign-in");
    let text = browser.js("return document.body.innerText").await;
    let text = text.as_str().unwrap();
    assert!(
        text.contains("lab/nb-idle") && text.contains("ml"),
        "{text}"
    );
    for other in ["serve/llm-0", "4242", "lab/nb-recent", "GPU-LC"] {
        assert!(
            !text.contains(other),
            "{other} is another episode's: {text}"
        );
    }
    browser.screenshot("keep-page").await;
    let button = browser.element("button[value=\"4h\"]").await;
    browser
        .cmd(
            reqwest::Method::POST,
            &format!("/element/{button}/click"),
            serde_json::json!({}),
        )
        .await;
    eventually("the kept page", Duration::from_secs(10), async || {
        let t = browser.js("return document.body.innerText").await;
        t.as_str()
            .filter(|t| t.contains("Kept until"))
            .map(str::to_owned)
    })
    .await;
    browser.screenshot("keep-page-kept").await;
    browser.sign_in(&a.url(), ADMIN_TOKEN, "/hoarding?").await;
    assert_eq!(browser.column("exemptions", "created_by").await, ["link"]);
    assert_eq!(
        browser.column("exemptions", "workload").await,
        ["lab/nb-idle"]
    );
}
