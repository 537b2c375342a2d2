//! The showback pages in real headless Chromium (Debian `chromium`, driven over WebDriver by
//! Debian's `chromedriver`), against a running aggregator fed the known trace plus a tenant
//! named `<script>alert(1)</script>`: sign-in with a token sets the session cookie; every page
//! opens; the bill's numbers on the page equal the API's and the CSV's; the bill reconciles to
//! the cent; the hostile tenant renders as text; a `tenant:team-a` reader sees only team-a on
//! every page and export. Screenshots of every page are saved under the test's target tmpdir
//! (`web-screenshots/`).

use crate::common;

use crate::common::browser::Browser;
use crate::common::{ADMIN_TOKEN, Aggregator};
use gpuledger_schema::SloClass;
use gpuledger_schema::wire::Batch;
use serde_json::{Value, json};

const FINANCE: &str = "finance-token-0123456789";
const TEAM_A: &str = "team-a-token-0123456789";
const NODE: &str = "node-n1-token-0123456789";
const EVIL: &str = "<script>alert(1)</script>";

async fn fed(dir: &std::path::Path) -> (Aggregator, i64) {
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!("finance {FINANCE}\ntenant:team-a {TEAM_A}\nnode:n1 {NODE}\n"),
    )
    .unwrap();
    let config = dir.join("aggregator.toml");
    std::fs::write(
        &config,
        r#"
default_price = 3.6
currency = "EUR"
[[price_book]]
gpu_model = "H100-80GB"
per_gpu_hour = 3.6
[billing]
cost_mode = "allocation"
idle = "overhead"
[billing.tenants."team-a"]
team = "vision"
org = "research"
monthly_budget = 1000
[billing.tenants."team-b"]
team = "language"
org = "research"
[ui]
cookie_secure = true
"#,
    )
    .unwrap();
    let a = Aggregator::start(
        &dir.join("ledger.duckdb"),
        0,
        &[
            "--config",
            config.to_str().unwrap(),
            "--token-file",
            tokens.to_str().unwrap(),
            "--analytics-interval",
            "1h",
        ],
    )
    .await;
    let now = chrono::Utc::now().timestamp();
    let t0 = now - now.rem_euclid(3600) - 3 * 3600;
    let mut trace = common::traces::known_trace(t0);
    let evil = common::traces::whole("n1", "GPU-EVIL");
    for t in t0..t0 + 1800 {
        trace.push(common::traces::sample(
            t,
            &evil,
            common::traces::held(EVIL, "evil/job", SloClass::Batch),
            Some(0.5),
        ));
    }
    for chunk in trace.chunks(5_000) {
        let (status, body) = a.ingest(NODE, &Batch::from_samples("n1", chunk)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _) = a.evaluate(ADMIN_TOKEN).await;
    assert_eq!(status, 200);
    (a, t0)
}

async fn get_json(a: &Aggregator, token: &str, path: &str) -> (u16, Value) {
    let (status, body) = get_text(a, token, path).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

async fn get_text(a: &Aggregator, token: &str, path: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", a.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// An `application/x-www-form-urlencoded` body.
fn form(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn cents(v: &Value) -> i64 {
    (v.as_f64().unwrap_or_else(|| panic!("not money: {v}")) * 100.0).round() as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pages_in_headless_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let (a, t0) = fed(dir.path()).await;
    let month = chrono::DateTime::from_timestamp(t0, 0)
        .unwrap()
        .format("%Y-%m")
        .to_string();
    let q = format!("month={month}");
    // localhost, not 127.0.0.1: Chromium keeps a Secure cookie from http://localhost.
    let app = format!("http://localhost:{}", a.port);

    // The bill in JSON reconciles to the cent.
    let (status, bill) = get_json(&a, FINANCE, &format!("/api/v1/bill?{q}")).await;
    assert_eq!(status, 200, "{bill}");
    let lines = bill["lines"].as_array().unwrap();
    let tenants: Vec<&str> = lines
        .iter()
        .map(|l| l["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, [EVIL, "team-a", "team-b", "team-c"]);
    let sum: i64 = lines.iter().map(|l| cents(&l["total"])).sum();
    assert_eq!(
        sum + cents(&bill["overhead"]["total"]),
        cents(&bill["fleet_cost"]),
        "Σ tenants + overhead = fleet cost: {bill}"
    );
    for mode in [
        "mode=allocation",
        "mode=usage&idle=share",
        "mode=allocation&idle=share",
        "mode=usage",
    ] {
        let (_, b) = get_json(&a, FINANCE, &format!("/api/v1/bill?{q}&{mode}")).await;
        let o = &b["overhead"];
        let sum: i64 = b["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| cents(&l["total"]))
            .sum();
        assert_eq!(
            sum + cents(&o["total"]),
            cents(&b["fleet_cost"]),
            "{mode}: {b}"
        );
        // The overhead's parts add up to it, in cents.
        assert_eq!(
            cents(&o["unallocated_cost"]) + cents(&o["holders_idle_cost"]),
            cents(&o["before_sharing"]),
            "{mode}: {o}"
        );
        assert_eq!(
            cents(&o["before_sharing"]) - cents(&o["shared_out"]),
            cents(&o["total"]),
            "{mode}: {o}"
        );
        if mode.contains("share") {
            assert_eq!(cents(&o["total"]), 0, "{mode}: {o}");
        }
    }

    let browser = Browser::start().await;
    browser
        .sign_in(&app, FINANCE, &format!("/tenants?{q}"))
        .await;
    // The page's numbers are the API's.
    let on_page = browser.column("bill", "total").await;
    let in_api: Vec<String> = lines
        .iter()
        .map(|l| format!("{:.2}", l["total"].as_f64().unwrap()))
        .collect();
    assert_eq!(on_page, in_api);
    let allocated = browser.column("bill", "allocated_gpu_hours").await;
    for (p, l) in allocated.iter().zip(lines) {
        let p: f64 = p.parse().unwrap();
        assert!((p - l["allocated_gpu_hours"].as_f64().unwrap()).abs() < 1e-9);
    }
    // …and the CSV's.
    let (status, csv) = get_text(&a, FINANCE, &format!("/tenants?{q}&format=csv&table=bill")).await;
    assert_eq!(status, 200);
    let mut r = csv::Reader::from_reader(csv.as_bytes());
    let headers = r.headers().unwrap().clone();
    let total_col = headers.iter().position(|h| h == "total").unwrap();
    let from_csv: Vec<String> = r
        .records()
        .map(|rec| rec.unwrap()[total_col].to_owned())
        .collect();
    assert_eq!(from_csv, on_page);
    // The showback CSV has the JSON's rows and numbers, for the same parameters.
    let (_, sb) = get_json(
        &a,
        FINANCE,
        &format!("/api/v1/showback?{q}&group_by=workload"),
    )
    .await;
    let (status, csv) = get_text(
        &a,
        FINANCE,
        &format!("/api/v1/showback.csv?{q}&group_by=workload"),
    )
    .await;
    assert_eq!(status, 200);
    let mut r = csv::Reader::from_reader(csv.as_bytes());
    let headers = r.headers().unwrap().clone();
    assert_eq!(
        &headers.iter().take(3).collect::<Vec<_>>(),
        &["tenant", "workload", "allocated_gpu_seconds"]
    );
    let records: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
    let rows = sb["rows"].as_array().unwrap();
    assert_eq!(records.len(), rows.len());
    for (rec, row) in records.iter().zip(rows) {
        assert_eq!(&rec[1], row["workload"].as_str().unwrap());
        for (i, h) in headers.iter().enumerate().skip(2) {
            match row[h].as_f64() {
                // serde_json's default parser may be off in the last bit; the texts are exact.
                Some(v) => {
                    let c = rec[i].parse::<f64>().unwrap();
                    assert!((c - v).abs() <= 1e-12 * v.abs().max(1.0), "{h}: {c} vs {v}");
                }
                None => assert_eq!(&rec[i], "", "{h}"),
            }
        }
    }
    // The hostile tenant is text: no script ran, none was added, the name is shown as written.
    let scripts = browser.js("return document.scripts.length").await;
    assert_eq!(scripts, json!(0));
    let text = browser.js("return document.body.innerText").await;
    assert!(text.as_str().unwrap().contains(EVIL), "{text}");
    let alert = browser
        .cmd(reqwest::Method::GET, "/alert/text", Value::Null)
        .await;
    assert_eq!(alert["error"], "no such alert", "{alert}");
    browser.screenshot("tenants").await;
    // Printed on A4 (the print stylesheet: no navigation, no CSV links), the bill fits on a page.
    let pdf = browser.print("tenants").await;
    assert!(pdf.starts_with(b"%PDF"), "not a PDF");
    let pages = pdf.windows(11).filter(|w| w == b"/Type /Page").count()
        - pdf.windows(12).filter(|w| w == b"/Type /Pages").count();
    assert_eq!(pages, 1, "the tenants page prints on {pages} A4 pages");

    // Every page opens, with a heading and no error.
    for (path, name, table) in [
        (format!("/?{q}"), "overview", "daily"),
        (
            format!("/tenants/team-a?{q}"),
            "tenant-team-a",
            "by_profile",
        ),
        (format!("/tenants/team-a?{q}"), "tenant-team-a", "reclaims"),
        (format!("/tenants/team-a?{q}"), "tenant-team-a", "budget"),
        (
            format!("/rightsizing?{q}"),
            "rightsizing-page",
            "rightsizing",
        ),
        (
            format!("/tenants/{}?{q}", "%3Cscript%3Ealert(1)%3C%2Fscript%3E"),
            "tenant-evil",
            "workloads",
        ),
        (format!("/fleet?{q}"), "fleet", "gpus"),
        (format!("/hoarding?{q}"), "hoarding", "open"),
        (format!("/prices?{q}"), "prices", "prices"),
    ] {
        browser.go(&format!("{app}{path}")).await;
        let found = browser
            .js(&format!("return !!document.getElementById('{table}') && document.querySelector('h1').innerText"))
            .await;
        assert!(found.as_str().is_some(), "{path}: {found}");
        assert_eq!(
            browser.js("return document.scripts.length").await,
            json!(0),
            "{path}"
        );
        browser.screenshot(name).await;
    }
    // A budgeted tenant's page draws its cost to date under the budget line, whose label names
    // the budget; the last day's cost to date is its bill's cost (allocation, overhead not
    // shared), within the cent the bill's apportioning may move.
    browser.go(&format!("{app}/tenants/team-a?{q}")).await;
    let rule = browser
        .js("const t = document.querySelector('svg text.rule'); return t && t.textContent")
        .await;
    assert_eq!(rule, "budget 1000 EUR");
    let to_date = browser.column("budget", "cost_to_date").await;
    let team_a = lines.iter().find(|l| l["tenant"] == "team-a").unwrap();
    let last: f64 = to_date.last().unwrap().parse().unwrap();
    assert!(
        last > 0.0 && (last - team_a["cost"].as_f64().unwrap()).abs() <= 0.011,
        "{to_date:?} against {team_a}"
    );
    // The overview's daily trend sums to the bill's allocated GPU-hours.
    browser.go(&format!("{app}/?{q}")).await;
    let daily: f64 = browser
        .column("daily", "allocated_gpu_hours")
        .await
        .iter()
        .map(|v| v.parse::<f64>().unwrap())
        .sum();
    let billed: f64 = lines
        .iter()
        .map(|l| l["allocated_gpu_hours"].as_f64().unwrap())
        .sum();
    assert!((daily - billed).abs() < 1e-6, "{daily} vs {billed}");
    // The fleet page draws the checkerboard GPU: four team slices and four free slots.
    browser.go(&format!("{app}/fleet?{q}")).await;
    let gpus = browser
        .js("return document.querySelectorAll('figure.gpu').length")
        .await;
    assert!(gpus.as_u64().unwrap() >= 1, "{gpus}");

    // Sign out (a CSRF-checked form), then a tenant reader.
    browser.go(&format!("{app}/tenants?{q}")).await;
    let out = browser.element("header form button").await;
    browser
        .cmd(
            reqwest::Method::POST,
            &format!("/element/{out}/click"),
            json!({}),
        )
        .await;
    let url = browser.wait_for_url(|u| u.contains("/signin")).await;
    assert!(url.contains("/signin"), "{url}");
    browser
        .sign_in(&app, TEAM_A, &format!("/tenants?{q}"))
        .await;
    assert_eq!(browser.column("bill", "tenant").await, ["team-a"]);
    let text = browser.js("return document.body.innerText").await;
    let text = text.as_str().unwrap();
    for other in [
        "team-b",
        "team-c",
        "alert(1)",
        "Fleet cost",
        "Reconciliation",
    ] {
        assert!(!text.contains(other), "a tenant reader sees {other:?}");
    }
    browser.screenshot("tenants-as-team-a").await;
    for path in [
        format!("/"),
        format!("/hoarding"),
        format!("/tenants/team-a"),
    ] {
        browser.go(&format!("{app}{path}?{q}")).await;
        let text = browser.js("return document.body.innerText").await;
        for other in ["team-b", "team-c", "alert(1)"] {
            assert!(
                !text.as_str().unwrap().contains(other),
                "{path} shows {other:?} to team-a"
            );
        }
    }
    // Another tenant's page, the fleet page and exports: refused or scoped.
    for path in [format!("/tenants/team-b?{q}"), format!("/fleet?{q}")] {
        let (status, _) = get_text(&a, TEAM_A, &path).await;
        assert_eq!(status, 403, "{path}");
    }
    let (_, csv) = get_text(&a, TEAM_A, &format!("/tenants?{q}&format=csv&table=bill")).await;
    assert!(csv.contains("team-a") && !csv.contains("team-b"), "{csv}");
    let (_, csv) = get_text(
        &a,
        TEAM_A,
        &format!("/hoarding?{q}&format=csv&table=closed"),
    )
    .await;
    assert!(!csv.contains("team-b"), "{csv}");
    let (_, b) = get_json(&a, TEAM_A, &format!("/api/v1/bill?{q}")).await;
    assert_eq!(b["lines"].as_array().unwrap().len(), 1, "{b}");
    assert!(b["fleet_cost"].is_null() && b["overhead"].is_null(), "{b}");
    let team_a_line = lines.iter().find(|l| l["tenant"] == "team-a").unwrap();
    assert_eq!(
        b["lines"][0], *team_a_line,
        "a tenant sees the same line finance sees"
    );
    let day = t0 - t0.rem_euclid(86400);
    let (_, csv) = get_text(
        &a,
        TEAM_A,
        &format!("/api/v1/showback.csv?from={day}&to={}", day + 86400),
    )
    .await;
    assert!(csv.starts_with("tenant,allocated_gpu_seconds,"), "{csv}");
    assert!(!csv.contains("team-b"), "{csv}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_need_a_reader_and_forms_refuse_other_sites() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = fed(dir.path()).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // No credentials: a redirect to the sign-in page that keeps where it came from.
    let r = http
        .get(format!("{}/tenants?month=2026-11", a.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"],
        "/signin?next=%2Ftenants%3Fmonth%3D2026-11"
    );
    // An exporter token cannot read pages.
    let (status, _) = get_text(&a, NODE, "/tenants").await;
    assert_eq!(status, 403);
    // Sign-in from another site is refused; a good sign-in sets a Secure, HttpOnly,
    // SameSite=Strict cookie and never an open redirect.
    let r = http
        .post(format!("{}/signin", a.url()))
        .header("origin", "https://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", FINANCE), ("next", "/")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = http
        .post(format!("{}/signin", a.url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", FINANCE), ("next", "//evil.example/")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/");
    // Regression (issue 48, finding 6): a newline in next was a 500 "failed to parse header
    // value" with a session cookie set anyway; now it is the way home like any unsafe next.
    for next in ["/\n/evil", "/\r\n/evil", "/\u{7f}"] {
        let r = http
            .post(format!("{}/signin", a.url()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("token", FINANCE), ("next", next)]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 303, "{next:?}");
        assert_eq!(r.headers()["location"], "/", "{next:?}");
    }
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    for attr in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    let session = cookie.split(';').next().unwrap().to_owned();
    // The cookie reads pages; sign-out without the CSRF token is refused.
    let r = http
        .get(format!("{}/prices", a.url()))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = http
        .post(format!("{}/signout", a.url()))
        .header("cookie", &session)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", "wrong")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // A form of the wrong type, or missing its field, gets the one JSON error shape.
    let r = http
        .post(format!("{}/signin", a.url()))
        .header("content-type", "text/plain")
        .body("token=x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["field"], "body", "{body}");
    let r = http
        .post(format!("{}/signin", a.url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("next=/")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"].as_str().unwrap().contains("token"),
        "{body}"
    );
    // A wrong token is a 401 page, and bad parameters name themselves.
    let r = http
        .post(format!("{}/signin", a.url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", "not-a-token-at-all-0000")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    for (path, field) in [
        ("/tenants?month=2026-13", "month"),
        ("/tenants?sort=nope", "sort"),
        ("/tenants?format=xml", "format"),
        ("/tenants?format=csv&table=nope", "table"),
        ("/tenants?mode=free", "mode"),
        ("/tenants?bogus=1", "bogus"),
    ] {
        let (status, body) = get_json(&a, FINANCE, path).await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (400, Some(field)),
            "{path}: {body}"
        );
    }
}

/// Signs in with `token` over HTTP; returns the session cookie (`name=value`).
async fn session_cookie(http: &reqwest::Client, a: &Aggregator, token: &str) -> String {
    let r = http
        .post(format!("{}/signin", a.url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", token), ("next", "/")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    cookie.split(';').next().unwrap().to_owned()
}

/// The value of the first `<input name="{name}" value="…">` of a page.
fn input_value(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!(r#"name="{name}" value=""#))?;
    let rest = &html[at + name.len() + 15..];
    Some(rest[..rest.find('"')?].to_owned())
}

/// The only write the pages offer: an admin's session snoozes an open episode's workload from
/// the Hoarding page (same origin, CSRF token); finance and tenant sessions get no form and a
/// 403, a wrong CSRF token a 403, and the snooze is the same exemption the API lists.
#[tokio::test(flavor = "multi_thread")]
async fn only_an_admin_session_snoozes_from_the_hoarding_page() {
    let dir = tempfile::tempdir().unwrap();
    let (a, t0) = fed(dir.path()).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let month = chrono::DateTime::from_timestamp(t0, 0)
        .unwrap()
        .format("%Y-%m")
        .to_string();
    let page = |cookie: String| {
        let (http, url) = (http.clone(), format!("{}/hoarding?month={month}", a.url()));
        async move {
            let r = http.get(url).header("cookie", cookie).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            r.text().await.unwrap()
        }
    };
    let post = |cookie: String, body: String| {
        let (http, url) = (http.clone(), format!("{}/hoarding/snooze", a.url()));
        async move {
            http.post(url)
                .header("cookie", cookie)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body)
                .send()
                .await
                .unwrap()
        }
    };
    // Finance reads the page but gets no form, and cannot post one with its own CSRF token.
    let finance = session_cookie(&http, &a, FINANCE).await;
    let html = page(finance.clone()).await;
    assert!(
        !html.contains("/hoarding/snooze"),
        "finance sees a snooze form"
    );
    let csrf = input_value(&html, "csrf").expect("the sign-out form's CSRF token");
    let r = post(
        finance,
        form(&[
            ("csrf", &csrf),
            ("tenant", "team-a"),
            ("workload", "w"),
            ("duration", "1h"),
        ]),
    )
    .await;
    assert_eq!(r.status().as_u16(), 403);
    // An admin's session gets a form per open episode's workload.
    let admin = session_cookie(&http, &a, ADMIN_TOKEN).await;
    let html = page(admin.clone()).await;
    assert!(
        html.contains(r#"action="/hoarding/snooze""#),
        "no snooze form for an admin"
    );
    let csrf = input_value(&html, "csrf").unwrap();
    let tenant = input_value(&html, "tenant").unwrap();
    let workload = input_value(&html, "workload").unwrap();
    let fields = |csrf: &str, duration: &str| {
        form(&[
            ("csrf", csrf),
            ("tenant", &tenant),
            ("workload", &workload),
            ("duration", duration),
            ("next", "/hoarding"),
        ])
    };
    assert_eq!(
        post(admin.clone(), fields("wrong", "1h"))
            .await
            .status()
            .as_u16(),
        403
    );
    let r = post(admin.clone(), fields(&csrf, "30d")).await;
    assert_eq!(r.status().as_u16(), 400, "longer than a week");
    let r = post(admin.clone(), fields(&csrf, "8h")).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/hoarding");
    let (_, listed) = get_json(&a, ADMIN_TOKEN, "/api/v1/exemptions").await;
    let found = listed["exemptions"].as_array().unwrap();
    assert_eq!(found.len(), 1, "{listed}");
    assert_eq!(found[0]["tenant"].as_str(), Some(tenant.as_str()));
    assert_eq!(found[0]["workload"].as_str(), Some(workload.as_str()));
    assert_eq!(found[0]["reason"], "snoozed on the Hoarding page");
}

/// Regression (issue 48, finding 2): `next=/\t/127.0.0.2:…/pwned.html` survived sign-in as a
/// `Location` that a browser reads as `//127.0.0.2:…` once it drops the tab, and headless Chromium
/// ended on the foreign page. Now every form of it — tab, newline, backslash, `//` — leaves a
/// real Chromium on this site, whether it comes in the sign-in page's URL or in a crafted form.
#[tokio::test(flavor = "multi_thread")]
async fn open_redirect_after_sign_in_stays_on_the_site_in_chromium() {
    // The foreign site: anything it serves says "pwned".
    let foreign = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let foreign_port = foreign.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in foreign.incoming() {
            use std::io::{Read, Write};
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 5\r\nconnection: close\r\n\r\npwned",
            );
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("finance {FINANCE}\n")).unwrap();
    let config = dir.path().join("aggregator.toml");
    std::fs::write(&config, "[ui]\ncookie_secure = true\n").unwrap();
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &[
            "--config",
            config.to_str().unwrap(),
            "--token-file",
            tokens.to_str().unwrap(),
        ],
    )
    .await;
    let app = format!("http://localhost:{}", a.port);
    let browser = Browser::start().await;
    let away = format!("127.0.0.2:{foreign_port}/pwned.html");
    for hostile in [
        format!("/\t/{away}"),
        format!("/\n/{away}"),
        format!("/\r\n/{away}"),
        format!("/\\{away}"),
        format!("/\\/{away}"),
        format!("//{away}"),
        format!("/\t\\{away}"),
        format!("http://{away}"),
    ] {
        for crafted in [false, true] {
            let encoded: String = hostile.bytes().map(|b| format!("%{b:02X}")).collect();
            browser.go(&format!("{app}/signin?next={encoded}")).await;
            if crafted {
                // A form someone else wrote: the hidden field carries the hostile value as is.
                browser
                    .js(&format!(
                        "document.querySelector('input[name=next]').value = {}; return true",
                        serde_json::to_string(&hostile).unwrap()
                    ))
                    .await;
            }
            let field = browser.element("#token").await;
            browser
                .cmd(
                    reqwest::Method::POST,
                    &format!("/element/{field}/value"),
                    json!({ "text": FINANCE }),
                )
                .await;
            let button = browser.element("button[type=submit]").await;
            browser
                .cmd(
                    reqwest::Method::POST,
                    &format!("/element/{button}/click"),
                    json!({}),
                )
                .await;
            let url = browser.wait_for_url(|u| !u.contains("/signin")).await;
            let text = browser.js("return document.body.innerText").await;
            assert!(
                url.starts_with(&format!("{app}/")) && !text.as_str().unwrap().contains("pwned"),
                "{hostile:?} (crafted form: {crafted}) ended at {url}"
            );
        }
    }
}

/// Regression (issue 48, finding 5): a tenant named `=HYPERLINK(…)` was a leading cell, as is, of
/// `/api/v1/showback.csv` and every page's CSV, which a spreadsheet runs as a formula. Now every
/// CSV the pages and the API offer writes such text with a leading `'`; only numbers may begin
/// with `-`.
#[tokio::test(flavor = "multi_thread")]
async fn every_csv_writes_a_formula_as_text() {
    const HYPERLINK: &str = "=HYPERLINK(\"http://evil.example\",\"click\")";
    let hostile = [(HYPERLINK, "@SUM(1+1)*cmd|' /C calc'!A0"), ("+1+1", "-2+3")];
    let dir = tempfile::tempdir().unwrap();
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &["--hoarding-window", "1m"],
    )
    .await;
    let now = chrono::Utc::now().timestamp();
    let t0 = now - now.rem_euclid(60) - 300;
    let mut samples = Vec::new();
    for (k, (tenant, workload)) in hostile.iter().enumerate() {
        let gpu = common::traces::whole("n1", &format!("GPU-{k}"));
        for t in t0..t0 + 240 {
            samples.push(common::traces::sample(
                t,
                &gpu,
                common::traces::held(tenant, workload, SloClass::Batch),
                Some(0.0),
            ));
        }
    }
    let (status, body) = a
        .ingest(ADMIN_TOKEN, &Batch::from_samples("n1", &samples))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);

    let day = format!("from={}&to={}", t0 - t0.rem_euclid(86400), now + 60);
    let mut csvs = vec![
        format!("/api/v1/showback.csv?{day}&group_by=tenant"),
        format!("/api/v1/showback.csv?{day}&group_by=workload"),
    ];
    let tenant_page = format!("/tenants/{}", common_segment(HYPERLINK));
    for page in [
        "/",
        "/tenants",
        &tenant_page,
        "/fleet",
        "/hoarding",
        "/prices",
    ] {
        let (status, html) = get_text(&a, ADMIN_TOKEN, &format!("{page}?{day}")).await;
        assert_eq!(status, 200, "{page}: {html}");
        for part in html.split("<p class=\"csv\"><a href=\"").skip(1) {
            let href = part.split('"').next().unwrap();
            csvs.push(href.replace("&#38;", "&").replace("&amp;", "&"));
        }
    }
    assert!(
        csvs.len() >= 10,
        "the pages offer their tables as CSV: {csvs:?}"
    );
    let mut shown_as_text = 0;
    for path in &csvs {
        let (status, text) = get_text(&a, ADMIN_TOKEN, path).await;
        assert_eq!(status, 200, "{path}: {text}");
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        for record in reader.records() {
            for cell in record.unwrap().iter() {
                if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) {
                    assert!(
                        cell.parse::<f64>().is_ok(),
                        "{path}: {cell:?} would run as a formula"
                    );
                }
                if cell == format!("'{HYPERLINK}") {
                    shown_as_text += 1;
                }
            }
        }
    }
    assert!(
        shown_as_text >= 3,
        "the tenant is in the CSVs, as text: {shown_as_text}"
    );
}

/// A path segment, percent-encoded.
fn common_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
