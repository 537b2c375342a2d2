//! The listeners of the real binaries under connections that never finish their request headers
//! (issue 48, finding 1: 20,100 of them took every file descriptor of the aggregator, and
//! `/healthz` and ingest timed out, without any token). Each role serves through
//! `gpuledger_otel::serve`: a header read timeout and a connection bound.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::{self, Aggregator};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample};

const N1: &str = "node-n1-token-0123456789";

/// The test holds thousands of sockets: its soft descriptor limit up to the hard one (the
/// binaries it starts inherit it).
fn raise_descriptor_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct passed, nothing else.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur as usize
}

async fn start(dir: &std::path::Path, extra: &[&str]) -> Aggregator {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("node:n1 {N1}\n")).unwrap();
    let mut args = vec!["--token-file", tokens.to_str().unwrap()];
    args.extend_from_slice(extra);
    Aggregator::start(&dir.join("ledger.duckdb"), 0, &args).await
}

/// `n` connections that each send the start of a request and never its end.
fn unfinished(port: u16, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect()
}

/// Whether the server has closed `s` (an answer then the end, a reset) within `wait`.
fn closed_within(s: &mut TcpStream, wait: Duration) -> Option<String> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(String::new()),
        Err(_) => None,
    }
}

fn one_gpu(t: i64) -> Batch {
    Batch::from_samples(
        "n1",
        &[Sample {
            timestamp: t,
            instance: Instance {
                node: "n1".into(),
                gpu_uuid: "GPU-n1-0".into(),
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                mig_profile: None,
                gpu_instance_id: None,
                placement_start: None,
                placement_size: None,
            },
            attribution: Attribution::default(),
            counters: Counters {
                sm_active: Some(0.5),
                ..Counters::default()
            },
        }],
    )
}

async fn healthz(a: &Aggregator) -> Result<u16, reqwest::Error> {
    let r = reqwest::Client::new()
        .get(format!("{}/healthz", a.url()))
        .timeout(Duration::from_secs(5))
        .send()
        .await?;
    Ok(r.status().as_u16())
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Regression (issue 48, finding 1): thousands of connections that never finish their headers
/// (3,000 where the limit allows); meanwhile
/// `/healthz` and a valid ingest answer, and after the header read timeout the aggregator has
/// closed every one of them (its descriptors are back to where they were).
#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_unfinished_headers_leave_healthz_and_ingest_answering() {
    // 3,000 where the open-files limit allows (20,000 on the development and CI machines);
    // fewer under a lower hard limit, leaving room for the aggregator's own descriptors.
    let limit = raise_descriptor_limit();
    let held_count = 3_000.min(limit.saturating_sub(1_024) / 2);
    assert!(
        held_count >= 256,
        "the open-files limit ({limit}) leaves too few descriptors to hold connections"
    );
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &["--header-read-timeout", "4s"]).await;
    let before = open_descriptors(a.child.id());
    let port = a.port;
    let mut held = tokio::task::spawn_blocking(move || unfinished(port, held_count))
        .await
        .unwrap();
    assert!(
        open_descriptors(a.child.id()) >= before + held_count / 2,
        "the aggregator holds the connections"
    );
    assert_eq!(healthz(&a).await.unwrap(), 200);
    let t = chrono::Utc::now().timestamp() - 30;
    let (status, body) = a.ingest(N1, &one_gpu(t)).await;
    assert_eq!(status, 200, "{body}");

    let started = Instant::now();
    held = tokio::task::spawn_blocking(move || {
        for s in &mut held {
            assert!(
                closed_within(s, Duration::from_secs(15)).is_some(),
                "a connection without a whole head is closed after the header read timeout"
            );
        }
        held
    })
    .await
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(15));
    let pid = a.child.id();
    common::eventually(
        "the aggregator's descriptors back where they were",
        Duration::from_secs(5),
        async || (open_descriptors(pid) <= before + 8).then_some(()),
    )
    .await;
    drop(held);
}

/// One connection past `--max-connections` is answered 503 naming `max_connections` and closed
/// at once, instead of waiting for a descriptor; once the held ones time out, `/healthz` answers
/// again.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_past_max_connections_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(
        dir.path(),
        &["--max-connections", "40", "--header-read-timeout", "3s"],
    )
    .await;
    // Any connection reqwest kept from the start-up probe has timed out by now or is one of 40.
    let port = a.port;
    let held = tokio::task::spawn_blocking(move || unfinished(port, 40))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut past = TcpStream::connect(("127.0.0.1", a.port)).unwrap();
    let answer = closed_within(&mut past, Duration::from_secs(2)).expect("answered at once");
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(answer.contains("\"field\":\"max_connections\""), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    common::eventually(
        "/healthz answers once the held connections time out",
        Duration::from_secs(10),
        async || healthz(&a).await.ok().filter(|s| *s == 200),
    )
    .await;
    drop(held);
}

/// The exporter's `/metrics` and the reclaimer's hook serve through the same listener: the
/// `[http]` table of each one's config file bounds them the same way.
#[test]
fn the_exporter_and_the_reclaimer_listeners_are_bounded_too() {
    let dir = tempfile::tempdir().unwrap();
    let exporter_port = common::free_port();
    let exporter_config = dir.path().join("exporter.toml");
    std::fs::write(
        &exporter_config,
        format!(
            "source = \"sim\"\nnode = \"gpu-h100-01\"\nlisten = \"127.0.0.1:{exporter_port}\"\n\
             [http]\nmax_connections = 2\nheader_read_timeout = \"2s\"\n"
        ),
    )
    .unwrap();
    let reclaimer_port = common::free_port();
    let reclaimer_config = dir.path().join("reclaimer.toml");
    std::fs::write(
        &reclaimer_config,
        format!(
            "listen = \"127.0.0.1:{reclaimer_port}\"\nsecret = \"whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\"\n\
             dry_run = true\nstate_file = {:?}\n[slurm]\ncommand = [\"/bin/true\", \"{{job}}\"]\n[http]\nmax_connections = 2\nheader_read_timeout = \"2s\"\n",
            dir.path().join("acted.log")
        ),
    )
    .unwrap();
    let children = [
        (
            common::bin("gpuledger-exporter")
                .arg("--config")
                .arg(&exporter_config)
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
            exporter_port,
            "/metrics",
        ),
        (
            common::bin("gpuledger-reclaimer")
                .arg("--config")
                .arg(&reclaimer_config)
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
            reclaimer_port,
            "/healthz",
        ),
    ];
    for (mut child, port, path) in children {
        let get = || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .ok()?;
            closed_within(&mut s, Duration::from_secs(5))
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !get().is_some_and(|a| a.starts_with("HTTP/1.1 200 ")) {
            assert!(Instant::now() < deadline, "{path} on {port} never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
        let held = unfinished(port, 2);
        std::thread::sleep(Duration::from_millis(300));
        let mut past = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let answer = closed_within(&mut past, Duration::from_secs(1)).expect("answered at once");
        assert!(answer.starts_with("HTTP/1.1 503 "), "{path}: {answer}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !get().is_some_and(|a| a.starts_with("HTTP/1.1 200 ")) {
            assert!(Instant::now() < deadline, "{path} never served again");
            std::thread::sleep(Duration::from_millis(200));
        }
        drop(held);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
