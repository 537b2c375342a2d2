//! Helpers shared by the end-to-end tests: the real `gpuledger` binary as a child process, free
//! loopback ports, and a fake aggregator.
#![allow(dead_code)]

pub mod fake_aggregator;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn gpuledger() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuledger"))
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
        let text = self.metrics("text/plain").await;
        text.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|v| v.parse().ok())
        })
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(mut self) -> ExitStatus {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().unwrap()
    }
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
