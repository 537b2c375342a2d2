//! Helpers shared by the end-to-end tests: the real `gpuledger` binary as a child process, free
//! loopback ports, and a fake aggregator.
#![allow(dead_code)]

pub mod browser;
pub mod chat;
pub mod fake_aggregator;
pub mod receiver;
pub mod traces;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn gpuledger() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuledger"))
}

/// Another binary of the workspace (`gpuledger-exporter`, `gpuledger-reclaimer`): `cargo test
/// --workspace` builds them beside `gpuledger`.
pub fn bin(name: &str) -> Command {
    Command::new(bin_path(name))
}

/// Where [`bin`] finds `name`.
pub fn bin_path(name: &str) -> std::path::PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_gpuledger")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is not built; run the tests with `cargo test --workspace --all-targets` (./test.sh)",
        path.display()
    );
    path
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` every 100 ms until it returns `Some`, failing the test after `timeout`.
/// The repository root, read when the test runs: a test binary reused from another checkout
/// sharing the target directory must not look at that checkout's files.
pub fn root() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .expect("cargo test sets CARGO_MANIFEST_DIR")
        .into()
}

pub async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fails the test naming the tool when a required external program is missing: tests never
/// skip; the README's test command installs these.
pub fn require_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{name} is not installed; run the README's test command (./test.sh), which installs it"
    );
}

/// A child process killed (and reaped) when dropped: a test that fails never leaves one behind.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running exporter process; killed when dropped.
pub struct Exporter {
    pub child: Child,
    pub port: u16,
}

impl Exporter {
    /// Starts `gpuledger exporter <args> --listen 127.0.0.1:<free port>` and waits for /healthz.
    pub async fn start(args: &[&str]) -> Exporter {
        let port = free_port();
        let child = gpuledger()
            .arg("exporter")
            .args(args)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .spawn()
            .expect("the gpuledger binary starts");
        let exporter = Exporter { child, port };
        let url = format!("http://127.0.0.1:{port}/healthz");
        eventually(
            "the exporter's /healthz",
            Duration::from_secs(20),
            async || {
                reqwest::get(&url)
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
            },
        )
        .await;
        exporter
    }

    /// GET /metrics with an `Accept` header.
    pub async fn metrics(&self, accept: &str) -> String {
        reqwest::Client::new()
            .get(format!("http://127.0.0.1:{}/metrics", self.port))
            .header("accept", accept)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of an unlabelled sample in the classic exposition.
    pub async fn value(&self, name: &str) -> Option<f64> {
        metric_value(self.port, name).await
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(mut self) -> ExitStatus {
        terminate(&mut self.child)
    }
}

/// The value of a sample (name with labels, as written) in a server's classic `/metrics`.
pub async fn metric_value(port: u16, name: &str) -> Option<f64> {
    metric_value_as(port, name, None).await
}

/// [`metric_value`] scraped with a bearer token (the aggregator's ledger families need one).
pub async fn metric_value_as(port: u16, name: &str, token: Option<&str>) -> Option<f64> {
    let mut req = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/metrics"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let text = req.send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

/// Sends SIGTERM to a child and waits for it to exit.
pub fn terminate(child: &mut Child) -> ExitStatus {
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    child.wait().unwrap()
}

/// The admin token the test aggregators get through GPULEDGER_ADMIN_TOKEN.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// A running aggregator (the real binary, a real DuckDB file); killed when dropped.
pub struct Aggregator {
    pub child: Child,
    pub port: u16,
    pub db: std::path::PathBuf,
    args: Vec<String>,
    /// Where its log goes (at `debug`), when a test reads it; else the test's stderr (`warn`).
    log: Option<std::path::PathBuf>,
}

impl Aggregator {
    /// Starts `gpuledger aggregator --db <db> --listen 127.0.0.1:<port> <args>` (port 0: a free
    /// one) with [`ADMIN_TOKEN`] and waits for /healthz.
    pub async fn start(db: &Path, port: u16, args: &[&str]) -> Aggregator {
        Self::start_logged(db, port, args, None).await
    }

    /// [`Aggregator::start`], its log at `debug` appended to `log` (restarts too) when given.
    pub async fn start_logged(
        db: &Path,
        port: u16,
        args: &[&str],
        log: Option<&Path>,
    ) -> Aggregator {
        let port = if port == 0 { free_port() } else { port };
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let log = log.map(Path::to_owned);
        let mut a = Aggregator {
            child: Self::spawn(db, port, &args, log.as_deref()),
            port,
            db: db.to_owned(),
            args,
            log,
        };
        a.wait_healthy().await;
        a
    }

    fn spawn(db: &Path, port: u16, args: &[String], log: Option<&Path>) -> Child {
        let mut cmd = gpuledger();
        cmd.arg("aggregator")
            .arg("--db")
            .arg(db)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("GPULEDGER_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null());
        if let Some(log) = log {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap();
            cmd.env("RUST_LOG", "debug").stderr(file);
        }
        cmd.spawn().expect("the gpuledger binary starts")
    }

    async fn wait_healthy(&mut self) {
        let url = format!("http://127.0.0.1:{}/healthz", self.port);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the aggregator exited early: {status}");
            }
            assert!(Instant::now() < deadline, "the aggregator did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The value of a sample in its classic `/metrics` (scraped without a token: the operational
    /// families only).
    pub async fn value(&self, name: &str) -> Option<f64> {
        metric_value(self.port, name).await
    }

    /// The value of a sample in its `/metrics` scraped with `token` (the ledger families: tenants,
    /// hoarding, fragmentation).
    pub async fn value_as(&self, token: &str, name: &str) -> Option<f64> {
        metric_value_as(self.port, name, Some(token)).await
    }

    /// Its classic `/metrics` text, scraped with `token`.
    pub async fn metrics_as(&self, token: &str) -> String {
        self.metrics_accepting(token, "text/plain").await
    }

    /// Its `/metrics` in the format `accept` asks for, scraped with `token`.
    pub async fn metrics_accepting(&self, token: &str, accept: &str) -> String {
        reqwest::Client::new()
            .get(format!("{}/metrics", self.url()))
            .bearer_auth(token)
            .header("accept", accept)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// kill -9, then start again on the same port and file.
    pub async fn crash_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::spawn(&self.db, self.port, &self.args, self.log.as_deref());
        self.wait_healthy().await;
    }

    /// SIGTERM; waits for a clean exit (the writer finishes its queue first).
    pub fn terminate(mut self) -> ExitStatus {
        terminate(&mut self.child)
    }

    /// `POST /api/v1/analytics/evaluate` with a bearer token; returns the status and the JSON
    /// answer (what was recomputed).
    pub async fn evaluate(&self, token: &str) -> (u16, serde_json::Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/api/v1/analytics/evaluate", self.url()))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// POSTs a batch with a bearer token; returns the status and the JSON answer.
    pub async fn ingest(
        &self,
        token: &str,
        batch: &gpuledger_schema::wire::Batch,
    ) -> (u16, serde_json::Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/api/v1/ingest", self.url()))
            .bearer_auth(token)
            .header("content-encoding", "gzip")
            .header("content-type", "application/json")
            .body(batch.encode())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }
}

impl Drop for Aggregator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Opens a ledger file read-only (the aggregator that wrote it must have exited).
pub fn open_ledger(db: &Path) -> duckdb::Connection {
    duckdb::Connection::open_with_flags(
        db,
        duckdb::Config::default()
            .access_mode(duckdb::AccessMode::ReadOnly)
            .unwrap(),
    )
    .unwrap()
}

/// Replays `trace` of `node` into `a` once, as fast as it goes, through a real exporter (admin
/// token, its spool in `dir`).
pub fn replay(dir: &Path, a: &Aggregator, node: &str, trace: &Path) -> tokio::process::Child {
    let token = token_file(dir, ADMIN_TOKEN);
    tokio::process::Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args([
            "exporter", "--source", "replay", "--speed", "max", "--once", "--node", node,
        ])
        .args(["--listen", "127.0.0.1:0", "--aggregator", &a.url()])
        .arg("--token-file")
        .arg(&token)
        .arg("--spool-dir")
        .arg(dir.join(format!("spool-{node}")))
        .arg("--replay-file")
        .arg(trace)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Writes a simulated trace of `node` from `start` for `duration` (humantime).
pub fn simulate(path: &Path, node: &str, start: &str, duration: &str) {
    simulate_with(path, node, start, duration, &[]);
}

/// [`simulate`] with more flags (`--energy`).
pub fn simulate_with(path: &Path, node: &str, start: &str, duration: &str, more: &[&str]) {
    let status = gpuledger()
        .args([
            "simulate",
            "--seed",
            "7",
            "--duration",
            duration,
            "--start",
            start,
            "--node",
            node,
            "--out",
        ])
        .arg(path)
        .args(more)
        .status()
        .unwrap();
    assert!(status.success());
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a token file.
pub fn token_file(dir: &Path, token: &str) -> std::path::PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path
}

/// Fails unless `promtool check metrics` accepts `text` (classic format) without a word.
pub fn assert_promtool_clean(text: &str) {
    use std::io::Write;
    require_tool("promtool");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool check metrics:\n{report}"
    );
}

/// Fails unless the reference OpenMetrics parser (Python prometheus_client) accepts `text`; it
/// rejects anything off-spec: unit suffixes, counter naming, label escaping, the final # EOF.
pub fn assert_openmetrics_valid(text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.txt");
    std::fs::write(&path, text).unwrap();
    let script = "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\nprint(len(list(parse(open(sys.argv[1]).read()))))";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the exposition:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every PromQL expression of `deploy/grafana/gpuledger-dashboard.json`.
pub fn dashboard_exprs() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x.as_str()) {
                        ("expr", Some(e)) => out.push(e.to_owned()),
                        _ => walk(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let text =
        std::fs::read_to_string(root().join("deploy/grafana/gpuledger-dashboard.json")).unwrap();
    let mut out = Vec::new();
    walk(&serde_json::from_str(&text).unwrap(), &mut out);
    assert!(!out.is_empty());
    out
}
