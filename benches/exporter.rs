//! Exporter benchmarks: CPU per 1 s sampling cycle and per scrape for a full node (8 GPUs × 7 MIG
//! instances, sim source), and the running exporter's CPU share and RSS. Each figure is also given
//! as a ratio against a baseline measured in the same run, because these machines are shared and
//! noisy. Run with `cargo bench --bench exporter`; `cargo test` runs it only as a smoke check.

use std::hint::black_box;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuledger_exporter::metrics::Metrics;
use gpuledger_exporter::source::Source;
use gpuledger_exporter::source::sim::{Fleet, SimSource};
use gpuledger_schema::exposition::Format;
use gpuledger_schema::{Sample, wire::Batch};

fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Mean CPU time of `f` over `n` runs.
fn measure(n: u32, mut f: impl FnMut()) -> Duration {
    f();
    let start = cpu_time();
    for _ in 0..n {
        f();
    }
    (cpu_time() - start) / n
}

fn proc_stat(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap();
    (ticks, rss_kib)
}

/// The per-process view's cost per second on a heavily time-sliced node: 8 whole GPUs with 16
/// processes each (8 pods of 2 processes per GPU), owners read from a fixture `/proc`, named by a
/// fixed table (standing in for the API server's pod list), shares computed and exported.
fn shares_cycle() -> Duration {
    use gpuledger_exporter::attribution::shares::{Owner, ProcFs, shares};
    use gpuledger_exporter::metrics::InstanceMetrics;
    use gpuledger_exporter::source::ProcessReading;
    use gpuledger_schema::Attribution;

    let sim = gpuledger_exporter::source::sim::Simulator::new(Fleet::builtin());
    let readings: Vec<_> = sim
        .second(Some("gpu-h100-02"), 1_767_225_600)
        .readings
        .into_iter()
        .filter(|r| r.instance.mig_profile.is_none())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut processes = Vec::new();
    for (g, r) in readings.iter().enumerate() {
        for k in 0..16u32 {
            let pid = 10_000 + g as u32 * 100 + k;
            let uid = format!("00000000-0000-4000-8000-{:012x}", g as u32 * 8 + k / 2);
            let cgroup = format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{pid:x}.scope\n",
                uid.replace('-', "_")
            );
            std::fs::create_dir_all(dir.path().join(pid.to_string())).unwrap();
            std::fs::write(dir.path().join(pid.to_string()).join("cgroup"), cgroup).unwrap();
            processes.push(ProcessReading {
                gpu_uuid: r.instance.gpu_uuid.clone(),
                gpu_instance_id: None,
                pid,
                used_memory_bytes: Some(1 << 30),
                sm_util: Some(f64::from(k) / 100.0),
                mps_client: false,
            });
        }
    }
    let procfs = ProcFs::new(dir.path());
    let name = |o: &Owner| match o {
        Owner::Pod { uid } => Some(Attribution {
            tenant: Some("team".into()),
            workload: Some(format!("ns/pod-{}", &uid[24..])),
            slo_class: None,
            owner: None,
            owner_ref: None,
        }),
        _ => None,
    };
    let mut m = InstanceMetrics::new();
    measure(500, || {
        let got = shares(&readings, &processes, &[], |pid| procfs.owner(pid), name);
        m.update_shares(black_box(&got));
    })
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/exporter.rs: run with `cargo bench --bench exporter`");
        return;
    }
    const NODE: &str = "gpu-h100-01";
    let mut source = SimSource::new(Fleet::builtin(), NODE).unwrap();
    let metrics = Metrics::new();
    let mut t = 1_767_225_600;

    // One sampling cycle: collect 56 instances, update /metrics, hand samples to the shipper.
    let cycle = measure(2000, || {
        t += 1;
        let second = source.collect(t).unwrap().unwrap();
        metrics
            .instances
            .lock()
            .unwrap()
            .update(&second.readings, &second.gpus);
        black_box(second.into_samples());
    });
    let second = source.collect(t + 1).unwrap().unwrap();
    let samples = second.into_samples();
    // Baseline: serialising the same second's samples as one JSON wire batch (no compression).
    let batch = Batch::from_samples(NODE, &samples);
    let baseline = measure(2000, || {
        black_box(serde_json::to_vec(black_box(&batch)).unwrap());
    });
    let scrape_om = measure(500, || {
        black_box(metrics.render(Format::OpenMetrics));
    });
    let scrape_classic = measure(500, || {
        black_box(metrics.render(Format::Classic));
    });
    // What one OTLP push reads (otel/src/metrics.rs): the OpenMetrics rendering, parsed back into
    // families; the SDK's own encoding and the HTTP request come on top.
    let otlp_read = measure(500, || {
        black_box(
            gpuledger_schema::exposition::parse(&metrics.render(Format::OpenMetrics)).unwrap(),
        );
    });
    let five_seconds: Vec<Sample> = (0..5)
        .flat_map(|k| {
            samples.iter().map(move |s| Sample {
                timestamp: s.timestamp + k,
                ..s.clone()
            })
        })
        .collect();
    let seal = measure(500, || {
        black_box(Batch::from_samples(NODE, black_box(&five_seconds)).encode());
    });

    let shares_cycle = shares_cycle();

    println!("full node: 56 instances (8 × H100, 7 × 1g.10gb each), sim source");
    println!(
        "baseline (serde_json of one second's batch): {:>9.1} µs CPU",
        baseline.as_secs_f64() * 1e6
    );
    for (what, d) in [
        ("sampling cycle (collect + /metrics update)", cycle),
        ("scrape render, OpenMetrics", scrape_om),
        ("scrape render, classic text", scrape_classic),
        ("OTLP push: render + parse the families", otlp_read),
        ("seal a 5 s batch (group + JSON + gzip)", seal),
        (
            "shared GPUs: 8 whole GPUs × 16 processes, owners from /proc, shares to /metrics",
            shares_cycle,
        ),
    ] {
        println!(
            "{what:<45} {:>9.1} µs CPU  = {:>5.1}× baseline",
            d.as_secs_f64() * 1e6,
            d.as_secs_f64() / baseline.as_secs_f64()
        );
    }
    println!(
        "sampling share of one core at 1 Hz: {:.3} %",
        cycle.as_secs_f64() * 100.0
    );

    // The real daemon: 30 s of the sim source at 1 Hz with a scrape every 5 s; then the same
    // with an OTLP push every second to a receiver that answers 200 (the worst case: the
    // default interval is 60 s).
    let receiver = sink();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    for (what, otlp) in [
        ("running exporter", None),
        ("running exporter + OTLP push every 1 s", Some(receiver)),
    ] {
        let (share, elapsed, rss0, rss1) = daemon(NODE, otlp);
        println!(
            "{what}, {elapsed:.0} s at 1 Hz with a scrape every 5 s: {share:.2} % of one core (clock-tick resolution: {:.2} %)",
            100.0 / hz / elapsed
        );
        println!(
            "{what} RSS: {:.1} MiB after 2 s, {:.1} MiB after {elapsed:.0} s more ({:.2}× growth)",
            rss0 as f64 / 1024.0,
            rss1 as f64 / 1024.0,
            rss1 as f64 / rss0 as f64
        );
    }
}

/// An HTTP server on loopback that answers every request 200 with an empty body: it stands in
/// for an OTLP collector, whose own cost is not the exporter's. Returns its port.
fn sink() -> u16 {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some((k, v)) = line.split_once(':')
                            && k.eq_ignore_ascii_case("content-length")
                        {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                }
            });
        }
    });
    port
}

/// Runs `gpuledger exporter --source sim` for 30 s (scraped every 5 s, OTLP to `otlp` when
/// given) and returns its CPU share of one core in %, the seconds measured, and its RSS in KiB
/// after 2 s and at the end.
fn daemon(node: &str, otlp: Option<u16>) -> (f64, f64, u64, u64) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuledger"));
    cmd.args([
        "exporter",
        "--source",
        "sim",
        "--node",
        node,
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]);
    if let Some(p) = otlp {
        cmd.args([
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{p}"),
            "--otlp-interval",
            "1s",
        ]);
    }
    let mut child = cmd.stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let (ticks0, rss0) = proc_stat(child.id());
    let started = Instant::now();
    for _ in 0..6 {
        std::thread::sleep(Duration::from_secs(5));
        let _ = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                &format!("http://127.0.0.1:{port}/metrics"),
            ])
            .status();
    }
    let (ticks1, rss1) = proc_stat(child.id());
    let elapsed = started.elapsed().as_secs_f64();
    child.kill().unwrap();
    child.wait().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let share = (ticks1 - ticks0) as f64 / hz / elapsed * 100.0;
    (share, elapsed, rss0, rss1)
}
