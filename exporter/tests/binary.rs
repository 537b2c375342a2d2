//! The `gpuledger-exporter` binary itself: it runs the simulated node and serves `/metrics`, and
//! a bad value from the environment names its variable. (The exporter's behaviour end to end is
//! in the repository's `tests/e2e/`.)

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn exporter() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuledger-exporter"))
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` over a plain TCP connection (the body, once the daemon answers).
fn scrape(port: u16) -> Option<String> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

#[test]
fn the_simulated_node_is_served_on_metrics() {
    let port = free_port();
    let mut child = exporter()
        .args(["--source", "sim", "--node", "gpu-h100-01"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        if let Some(b) = scrape(port).filter(|b| b.contains("gpuledger_instance_sm_active_ratio")) {
            break b;
        }
        assert!(Instant::now() < deadline, "no instance metrics in 30 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(body.contains("gpu-h100-01"), "{body}");
}

#[test]
fn a_bad_value_from_the_environment_names_the_variable() {
    let out = exporter()
        .env("GPULEDGER_EXPORTER_LISTEN", "not-an-address")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("GPULEDGER_EXPORTER_LISTEN"), "{stderr}");
}
