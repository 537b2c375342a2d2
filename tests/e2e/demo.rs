//! `gpuledger demo`, the README's first command, as a newcomer runs it: the real binary on a fresh
//! data directory. `/readyz` says "preparing" while the month is laid down and 200 once it is
//! there; a day 29 days back reads, through the API, exactly what the simulator's own minute view
//! of that day says; the tenants page in headless Chromium shows 30 days of bills; `/metrics`
//! shows the tenants; Ctrl-C stops it cleanly with the totals; a second run on the same directory
//! fills only the gap and counts nothing twice.

use crate::common;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::browser::Browser;
use gpuledger_exporter::source::sim::{Fleet, Simulator};
use serde_json::Value;

const TOKEN: &str = "demo-test-token-0123456789";

struct Demo {
    child: Child,
    base: String,
    log: std::path::PathBuf,
}

impl Demo {
    fn start(data: &std::path::Path, name: &str) -> Demo {
        let port = common::free_port();
        let exporters = common::free_port();
        let log = data.with_extension(format!("{name}.log"));
        let child = common::gpuledger()
            .args(["demo", "--data"])
            .arg(data)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--exporter-listen", &format!("127.0.0.1:{exporters}")])
            .env("GPULEDGER_ADMIN_TOKEN", TOKEN)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("gpuledger demo starts");
        Demo {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    fn log(&self) -> String {
        let mut s = String::new();
        std::fs::File::open(&self.log)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        s
    }

    /// Waits for `/readyz` to answer 200; returns every other answer seen before it.
    async fn ready(&mut self, http: &reqwest::Client) -> Vec<String> {
        let mut before = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(600);
        loop {
            if let Ok(r) = http.get(format!("{}/readyz", self.base)).send().await {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                if status.is_success() {
                    return before;
                }
                before.push(format!("{status} {}", body.trim()));
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the demo exited: {}",
                self.log()
            );
            assert!(
                std::time::Instant::now() < deadline,
                "not ready: {before:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn json(&self, http: &reqwest::Client, path: &str) -> Value {
        let r = http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        r.json().await.unwrap()
    }

    /// Ctrl-C, then the exit status.
    fn interrupt(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
        self.child.wait().unwrap()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Per tenant: (allocated, used) GPU-seconds of `from..to` in the simulator's minute view.
fn simulated_day(from: i64, to: i64) -> BTreeMap<String, (f64, f64)> {
    let sim = Simulator::new(Fleet::builtin());
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    sim.minutes(None, from, to, |m| {
        if let Some(tenant) = m.attribution.tenant {
            let size = m.instance.gpu_equivalents().unwrap_or(0.0);
            let n = f64::from(m.mask.count_ones());
            let e = out.entry(tenant).or_default();
            e.0 += n * size;
            e.1 += n * size * m.counters.sm_active.unwrap_or(0.0);
        }
    });
    out
}

/// Per tenant: (allocated, used) GPU-seconds of `from..to` from the API's showback.
async fn api_day(
    demo: &Demo,
    http: &reqwest::Client,
    from: i64,
    to: i64,
) -> BTreeMap<String, (f64, f64)> {
    let v = demo
        .json(
            http,
            &format!("/api/v1/showback?group_by=tenant&from={from}&to={to}"),
        )
        .await;
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["tenant"].as_str().unwrap().to_owned(),
                (
                    r["allocated_gpu_seconds"].as_f64().unwrap(),
                    r["used_gpu_seconds"].as_f64().unwrap(),
                ),
            )
        })
        .collect()
}

fn assert_same(api: &BTreeMap<String, (f64, f64)>, sim: &BTreeMap<String, (f64, f64)>) {
    assert_eq!(
        api.keys().collect::<Vec<_>>(),
        sim.keys().collect::<Vec<_>>(),
        "tenants"
    );
    for (tenant, (a, u)) in sim {
        let (api_a, api_u) = api[tenant];
        assert!(
            (api_a - a).abs() < 1e-6,
            "{tenant}: allocated {api_a} in the API, {a} simulated"
        );
        assert!(
            (api_u - u).abs() < 1e-6 * u.max(1.0),
            "{tenant}: used {api_u} in the API, {u} simulated"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_opens_on_a_month_of_history() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("gpuledger-demo");
    let http = reqwest::Client::new();
    let started = chrono::Utc::now().timestamp();
    let mut demo = Demo::start(&data, "first");
    let before = demo.ready(&http).await;
    assert!(
        before
            .iter()
            .any(|b| b.starts_with("503") && b.contains("preparing")),
        "/readyz says it is preparing before it is ready: {before:?}"
    );
    let log = demo.log();
    assert!(
        log.contains("admin token:      demo-test-token-0123456789"),
        "{log}"
    );
    assert!(
        log.contains(&format!("{}/", demo.base)),
        "the UI's URL: {log}"
    );
    common::eventually(
        "the demo's 'ready after' line",
        Duration::from_secs(10),
        async || demo.log().contains("ready after").then_some(()),
    )
    .await;
    // An idle notebook's keep link, which opens without signing in.
    let link = common::eventually(
        "the demo's keep link",
        Duration::from_secs(20),
        async || {
            let log = demo.log();
            let at = log.find("keep link (no sign-in): ")?;
            let rest = &log[at + "keep link (no sign-in): ".len()..];
            Some(rest[..rest.find(char::is_whitespace).unwrap_or(rest.len())].to_owned())
        },
    )
    .await;
    assert!(link.starts_with(&format!("{}/keep/", demo.base)), "{link}");
    let page = http.get(&link).send().await.unwrap();
    assert_eq!(page.status(), 200, "{link}");
    assert!(
        page.text().await.unwrap().contains("jupyter-"),
        "the notebook's page"
    );

    // A day 29 days back: what the simulator says of it, to the GPU-second.
    let day = (started - 29 * 86_400).div_euclid(86_400) * 86_400;
    let sim = simulated_day(day, day + 86_400);
    assert!(
        sim.len() >= 4,
        "the fleet's tenants held slices that day: {sim:?}"
    );
    assert_same(&api_day(&demo, &http, day, day + 86_400).await, &sim);

    // The month's bill: 30 days of every tenant, reconciled.
    let from = (started - 30 * 86_400).div_euclid(86_400) * 86_400 + 86_400;
    let to = started.div_euclid(86_400) * 86_400;
    let bill = demo
        .json(&http, &format!("/api/v1/bill?from={from}&to={to}"))
        .await;
    let lines = bill["lines"].as_array().unwrap();
    assert!(lines.len() >= 4, "{bill}");
    for line in lines {
        assert!(
            line["allocated_gpu_hours"].as_f64().unwrap() > 24.0 * 28.0 * 0.5,
            "a tenant of the demo fleet holds several GPUs all month: {line}"
        );
    }
    let fleet_gpus = 28.0;
    let capacity = bill["capacity_gpu_hours"]
        .as_f64()
        .unwrap_or_else(|| panic!("{bill}"));
    assert!(
        (capacity - fleet_gpus * (to - from) as f64 / 3600.0).abs() < 1e-6,
        "every GPU observed every second of the {} days: {capacity}",
        (to - from) / 86_400
    );

    // What a newcomer finds on first open: workloads that fit a smaller MIG profile (a notebook
    // on a big slice, among them) and a tenant forecast over its budget.
    let sizing = demo
        .json(
            &http,
            &format!(
                "/api/v1/rightsizing?from={from}&to={to}&reason=smaller_profile_fits&limit=5000"
            ),
        )
        .await;
    let recs = sizing["rows"].as_array().unwrap();
    assert!(
        recs.iter()
            .any(|r| r["workload"].as_str().unwrap().contains("/jupyter-")
                && r["savings"].as_f64().unwrap() > 0.0),
        "a notebook that fits a smaller slice: {}",
        sizing["totals"]
    );
    assert!(sizing["totals"]["savings"].as_f64().unwrap() > 0.0);
    let budgets = demo.json(&http, "/api/v1/budgets").await;
    assert!(
        budgets["lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["forecast_ratio"].as_f64().unwrap() > 1.0),
        "a tenant forecast over its budget: {budgets}"
    );

    // The tenants page in headless Chromium, over the same 30 days.
    let browser = Browser::start().await;
    browser
        .sign_in(&demo.base, TOKEN, &format!("/tenants?from={from}&to={to}"))
        .await;
    let tenants = browser.column("bill", "tenant").await;
    assert_eq!(
        tenants.len(),
        lines.len(),
        "the page shows the JSON's bill lines"
    );
    let hours = browser.column("bill", "allocated_gpu_hours").await;
    assert!(
        hours
            .iter()
            .all(|h| h.parse::<f64>().unwrap() > 24.0 * 28.0 * 0.5),
        "{hours:?}"
    );
    browser.screenshot("demo-tenants-30-days").await;
    drop(browser);

    // The ledger's metrics name the tenants.
    let metrics = http
        .get(format!("{}/metrics", demo.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("gpuledger_tenant_allocated") && metrics.contains("tenant=\"research\""),
        "{}",
        &metrics[..metrics.len().min(2000)]
    );

    // Ctrl-C: a clean stop, with the ledger's totals.
    let status = demo.interrupt();
    assert!(status.success(), "{status:?}: {}", demo.log());
    assert!(demo.log().contains("fleet:"), "{}", demo.log());

    // A second run on the same directory fills the gap only: the old day is unchanged.
    let mut again = Demo::start(&data, "second");
    again.ready(&http).await;
    let log = again.log();
    let line = log
        .lines()
        .find(|l| l.contains("history from"))
        .unwrap_or_else(|| panic!("{log}"));
    let from_text = line
        .split("history from ")
        .nth(1)
        .and_then(|rest| rest.get(..23))
        .unwrap_or_else(|| panic!("{line}"));
    let resumed = chrono::NaiveDateTime::parse_from_str(from_text, "%Y-%m-%d %H:%M:%S UTC")
        .unwrap_or_else(|e| panic!("{from_text:?}: {e}"))
        .and_utc()
        .timestamp();
    assert!(
        resumed >= started - 300,
        "the second run starts where the first one's ledger ends, not 30 days back: {line}"
    );
    assert_same(&api_day(&again, &http, day, day + 86_400).await, &sim);
    let status = again.interrupt();
    assert!(status.success(), "{status:?}: {}", again.log());
}

#[test]
fn version_names_the_commit_and_the_profile() {
    let out = common::gpuledger().arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(common::root())
        .output()
        .unwrap();
    let head = String::from_utf8(head.stdout).unwrap();
    assert!(
        text.starts_with(&format!("gpuledger {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(text.contains(head.trim()), "{text} is not HEAD {head}");
    assert!(text.trim_end().ends_with("dev profile)"), "{text}");
}
