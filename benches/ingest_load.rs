//! The live-ingest load generator (issue: ingest and storage at fleet scale).
//!
//! What live exporters send: every node POSTs one gzip batch of 5 s × 56 instances (280 samples)
//! at a time, with its own `node:NAME` token, to a real `gpuledger aggregator` process (this
//! build's binary) on loopback. Three phases, one run:
//!
//! 1. **first contact**: each node's first batch, all at once (56 new instances per node);
//! 2. **throughput**: every sender POSTs its node's next batches back to back, as fast as the
//!    aggregator answers (a 503 or 429 is retried after its Retry-After, as the exporter does);
//! 3. **latency at a fixed rate**: `--paced-senders` nodes each POST one batch every 5 s, spread
//!    evenly (1,250 nodes = 70,000 samples/s, a 10,000-GPU fleet cut into 7 slices each), and every
//!    request's latency is kept.
//!
//! The baseline, measured in the same run: DuckDB's own columnar insert (the appender's Arrow
//! path, record batches of about a million rows) of the throughput phase's rows into a plain
//! table of `samples_raw`'s shape. After a
//! clean stop the ledger is opened and its raw rows, minute rollups and batch ids are counted:
//! stored must equal sent. Peak RSS is the aggregator's `VmHWM`; every 5 s the aggregator's own
//! `/metrics` is read for its resident memory and DuckDB's part of it (`duckdb_memory()`), and
//! each phase reports the most it saw (every 30 s with `--memory-trace`). Each phase also reports
//! the CPU time per sample of the aggregator's writer thread, its tokio threads (requests, and the
//! analytics evaluation: `--flag --analytics-interval --flag 1h` leaves requests alone) and the
//! rest of it, and of this load generator (from `/proc`), against the baseline's time per row: on
//! a machine shared with other work, CPU per sample moves less than samples per second. It also
//! reports how many analytics evaluations ended in the phase and their mean wall time (the
//! aggregator's `gpuledger_aggregator_analytics_duration_seconds`). Last, the
//! raw rows are rewritten in instance order, as the aggregator does to each closed hour, and
//! `samples_raw`'s blocks are counted before and after.
//!
//! Run: `cargo bench --bench ingest_load` (release), options after `--`: `--senders 1000`,
//! `--seconds 60` (per node, throughput phase; 0 skips it), `--paced-senders 1250`, `--paced-seconds 30`,
//! `--flag ARG` (repeatable: passed to the aggregator), `--memory-trace`, `--energy` (each batch
//! also carries its 8 GPUs' joules per second, as with the exporter's energy collector), `--wire-format json`
//! (the bodies' encoding; default msgpack, what the exporter sends), `--rewrite-instances N`
//! (the aggregator starts on a ledger holding a closed hour of N instances in live order that it
//! has yet to rewrite, as after a restart; use with `--seconds 0` and a paced phase long enough
//! to outlast the rewrite). `cargo test` runs it
//! only as a smoke check.

#[path = "support/fleet.rs"]
mod fleet;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet::{INSTANCES_PER_NODE, node_batches_with, node_name, quantile};
use gpuledger_ledger::store::writer::RawColumns;
use gpuledger_schema::wire::{Batch, Format};

const BATCH_SECONDS: i64 = 5;

struct Args {
    senders: usize,
    seconds: i64,
    paced_senders: usize,
    paced_seconds: i64,
    flags: Vec<String>,
    memory_trace: bool,
    format: Format,
    /// Instances of the closed hour the aggregator rewrites as it starts (0: none).
    rewrite_instances: i64,
    /// Each batch carries its GPUs' joules per second (`gpus`), as with the energy collector.
    energy: bool,
}

/// Two values of the aggregator's `/metrics`, by their full names.
async fn metrics_pair(client: &reqwest::Client, url: &str, names: [&str; 2]) -> Option<(f64, f64)> {
    let text = client.get(url).send().await.ok()?.text().await.ok()?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    Some((value(names[0])?, value(names[1])?))
}

/// The aggregator's memory as its `/metrics` says: (resident, DuckDB's buffer manager), bytes.
async fn memory_of(client: &reqwest::Client, url: &str) -> Option<(f64, f64)> {
    let names = [
        "gpuledger_aggregator_resident_memory_bytes",
        "gpuledger_aggregator_store_memory_bytes",
    ];
    metrics_pair(client, url, names).await
}

/// The aggregator's analytics evaluations so far, from its `/metrics`: (passes, seconds in
/// them), the `gpuledger_aggregator_analytics_duration_seconds` histogram's count and sum (wall
/// time of the evaluation and the figures `/metrics` shows, not the reclaim pass).
async fn analytics_of(client: &reqwest::Client, url: &str) -> Option<(f64, f64)> {
    let names = [
        "gpuledger_aggregator_analytics_duration_seconds_count",
        "gpuledger_aggregator_analytics_duration_seconds_sum",
    ];
    metrics_pair(client, url, names).await
}

/// Readings of the aggregator's memory every 5 s: (seconds since the first, resident, DuckDB).
type MemoryLog = Arc<std::sync::Mutex<Vec<(f64, f64, f64)>>>;

async fn watch_memory(url: String, log: MemoryLog) {
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        if let Some((rss, duckdb)) = memory_of(&client, &url).await {
            log.lock()
                .unwrap()
                .push((start.elapsed().as_secs_f64(), rss, duckdb));
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// CPU seconds used so far: the aggregator's writer thread, its tokio threads (the request
/// path: HTTP, gzip, JSON, validation; and the analytics evaluation, every 15 s by default,
/// which runs on tokio's blocking threads), the whole aggregator process (threads that ended
/// included), and this load generator.
#[derive(Clone, Copy, Default)]
struct Cpu {
    writer: f64,
    tokio: f64,
    aggregator: f64,
    generator: f64,
}

impl Cpu {
    /// Reads `/proc` for the aggregator `pid` and this process.
    fn now(pid: u32) -> Cpu {
        // utime and stime, the 14th and 15th fields of `stat`, in clock ticks; the 2nd, the
        // name, is in parentheses and may hold spaces.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let secs = |path: String| -> f64 {
            let Ok(stat) = std::fs::read_to_string(path) else {
                return 0.0;
            };
            let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
            let f: Vec<f64> = after
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0.0))
                .collect();
            (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / ticks
        };
        let mut cpu = Cpu {
            aggregator: secs(format!("/proc/{pid}/stat")),
            generator: secs("/proc/self/stat".into()),
            ..Cpu::default()
        };
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
        {
            let dir = task.unwrap().path();
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let used = secs(dir.join("stat").display().to_string());
            if name.starts_with("gpuledger-write") {
                cpu.writer += used;
            } else if name.starts_with("tokio-r") {
                // "tokio-runtime-worker" or "tokio-rt-worker" (as tokio's version names them),
                // workers and blocking threads alike.
                cpu.tokio += used;
            }
        }
        cpu
    }

    /// Microseconds of CPU per sample from `before` to `self`, for `samples` samples; with the
    /// baseline's rate, each also as a multiple of the baseline's time per row (one thread).
    fn report(&self, before: &Cpu, samples: u64, base: Option<f64>) {
        let per = |a: f64, b: f64| (a - b) * 1e6 / samples as f64;
        let parts = [
            ("writer thread", per(self.writer, before.writer)),
            ("tokio threads", per(self.tokio, before.tokio)),
            (
                "other aggregator threads",
                per(self.aggregator, before.aggregator)
                    - per(self.writer, before.writer)
                    - per(self.tokio, before.tokio),
            ),
            ("load generator", per(self.generator, before.generator)),
        ];
        let text: Vec<String> = parts
            .iter()
            .map(|(what, us)| match base {
                Some(b) => format!("{what} {us:.2} µs ({:.1}×)", us * b / 1e6),
                None => format!("{what} {us:.2} µs"),
            })
            .collect();
        let base = base.map_or(String::new(), |b| {
            format!(
                "; the baseline appends a row in {:.2} µs on one thread",
                1e6 / b
            )
        });
        eprintln!("    CPU per sample: {}{base}", text.join(", "));
    }
}

fn args() -> Args {
    let mut a = Args {
        senders: 1000,
        seconds: 60,
        paced_senders: 1250,
        paced_seconds: 30,
        flags: Vec::new(),
        memory_trace: false,
        format: Format::default(),
        rewrite_instances: 0,
        energy: false,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let value = || argv.get(i + 1).cloned().expect("a value after the option");
        match argv[i].as_str() {
            "--senders" => a.senders = value().parse().unwrap(),
            "--seconds" => a.seconds = value().parse().unwrap(),
            "--paced-senders" => a.paced_senders = value().parse().unwrap(),
            "--paced-seconds" => a.paced_seconds = value().parse().unwrap(),
            "--flag" => a.flags.push(value()),
            "--wire-format" => a.format = value().parse().unwrap(),
            "--rewrite-instances" => a.rewrite_instances = value().parse().unwrap(),
            "--energy" => {
                a.energy = true;
                i += 1;
                continue;
            }
            "--memory-trace" => {
                a.memory_trace = true;
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    // A phase sends whole 5 s batches and counts them as such: a shorter last one would be
    // counted as sent in full and fail the stored = sent check.
    for (name, secs) in [
        ("--seconds", a.seconds),
        ("--paced-seconds", a.paced_seconds),
    ] {
        assert!(
            secs >= 0 && secs % BATCH_SECONDS == 0,
            "{name} {secs}: must be a multiple of {BATCH_SECONDS} (one batch)"
        );
    }
    a
}

/// One node's gzip bodies for one phase, in time order.
struct Node {
    token: String,
    bodies: Vec<Vec<u8>>,
    format: Format,
}

/// What one phase's requests measured.
#[derive(Default)]
struct Phase {
    requests: u64,
    samples: u64,
    stored: u64,
    retried: u64,
    latencies_ms: Vec<f64>,
    /// Paced phases: each batch's due time (seconds from the phase's start) and the time from
    /// then to its answer (ms), so that a queue behind a slow request counts in full.
    due: Vec<(f64, f64)>,
    started: Option<Instant>,
    seconds: f64,
}

impl Phase {
    fn report(&mut self, what: &str, base: Option<f64>) {
        let rate = self.samples as f64 / self.seconds;
        let ratio = base.map_or(String::new(), |b| {
            format!(" = {:.2}× the baseline", rate / b)
        });
        let (p50, p99, max) = (
            quantile(&mut self.latencies_ms, 0.5),
            quantile(&mut self.latencies_ms, 0.99),
            quantile(&mut self.latencies_ms, 1.0),
        );
        eprintln!(
            "  {what}: {} samples in {} requests, {:.2} s: {rate:.0} samples/s{ratio}; latency p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms; {} retried after 503/429",
            self.samples, self.requests, self.seconds, self.retried
        );
    }
}

/// POSTs `body` until it is accepted; returns (stored samples, retries).
async fn post(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    body: &[u8],
    format: Format,
) -> (u64, u64) {
    #[derive(serde::Deserialize)]
    struct Accepted {
        stored: u64,
    }
    let mut retries = 0;
    loop {
        let r = client
            .post(url)
            .bearer_auth(token)
            .header("content-encoding", "gzip")
            .header("content-type", format.content_type())
            .body(body.to_vec())
            .send()
            .await
            .expect("the aggregator answers");
        let status = r.status().as_u16();
        if status == 200 {
            return (r.json::<Accepted>().await.unwrap().stored, retries);
        }
        assert!(
            status == 503 || status == 429,
            "{status}: {}",
            r.text().await.unwrap()
        );
        let wait = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1);
        retries += 1;
        tokio::time::sleep(Duration::from_secs(wait)).await;
    }
}

/// Every node sends its bodies back to back (one in flight per node, as an exporter ships);
/// `pace`: the time between one node's batches, the nodes' first sends spread over it.
async fn run_phase(nodes: Vec<Node>, url: String, pace: Option<Duration>) -> Phase {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .build()
        .unwrap();
    let (n, samples) = (
        nodes.len(),
        nodes.iter().map(|n| n.bodies.len()).sum::<usize>(),
    );
    let start = Instant::now();
    let stored = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (k, node) in nodes.into_iter().enumerate() {
        let (client, url, stored) = (client.clone(), url.clone(), stored.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(node.bodies.len());
            let mut due = Vec::new();
            let mut retried = 0;
            let first = pace.map(|p| start + p.mul_f64(k as f64 / n as f64));
            for (b, body) in node.bodies.iter().enumerate() {
                if let (Some(first), Some(p)) = (first, pace) {
                    tokio::time::sleep_until((first + p * b as u32).into()).await;
                }
                let sent = Instant::now();
                let (s, r) = post(&client, &url, &node.token, body, node.format).await;
                latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
                if let (Some(first), Some(p)) = (first, pace) {
                    let at = first + p * b as u32;
                    due.push((
                        (at - start).as_secs_f64(),
                        at.elapsed().as_secs_f64() * 1000.0,
                    ));
                }
                stored.fetch_add(s, Ordering::Relaxed);
                retried += r;
            }
            (latencies, due, retried)
        }));
    }
    let mut phase = Phase {
        started: Some(start),
        ..Phase::default()
    };
    for t in tasks {
        let (latencies, due, retried) = t.await.unwrap();
        phase.requests += latencies.len() as u64;
        phase.latencies_ms.extend(latencies);
        phase.due.extend(due);
        phase.retried += retried;
    }
    phase.seconds = start.elapsed().as_secs_f64();
    phase.samples = (samples * INSTANCES_PER_NODE * BATCH_SECONDS as usize) as u64;
    phase.stored = stored.load(Ordering::Relaxed);
    phase
}

/// Rows per Arrow record batch the baseline appends (a columnar insert of a large table).
const BASELINE_CHUNK: usize = 1 << 20;

const BARE_TABLE: &str = "CREATE TABLE t (ts BIGINT, instance_id INTEGER, holder_id INTEGER, sm_active DOUBLE, sm_occupancy DOUBLE, tensor_active DOUBLE, dram_active DOUBLE, fb_used_bytes UBIGINT, fb_total_bytes UBIGINT, nvlink_tx_bytes UBIGINT, nvlink_rx_bytes UBIGINT)";

/// One closed hour of `instances` instances' raw rows in live order, written with SQL into a new
/// ledger before the aggregator starts, and the ledger's record of the raw rewrite set to that
/// hour's start (`raw_compacted`): the aggregator starts as one restarted after the hour closed,
/// and rewrites it at its first retention tick, while the phases' batches arrive. Answers the
/// rows written.
fn prefill(db: &std::path::Path, hour: i64, instances: i64) -> u64 {
    let started = Instant::now();
    let (conn, _) = gpuledger_ledger::store::open_with(db, Some("1GB")).unwrap();
    fleet::live_order_hour(&conn, hour, instances);
    conn.execute("INSERT INTO raw_compacted VALUES (?)", [hour])
        .unwrap();
    conn.execute_batch("CHECKPOINT").unwrap();
    eprintln!(
        "  a closed hour of {instances} instances in live order ({} raw rows) written into the ledger in {:.0} s, to be rewritten by the aggregator as it starts",
        instances * 3600,
        started.elapsed().as_secs_f64()
    );
    (instances * 3600) as u64
}

/// Sets `done` to when the aggregator's `/metrics` first counts `rows` raw rows rewritten.
async fn watch_rewrite(url: String, rows: u64, done: Arc<std::sync::Mutex<Option<Instant>>>) {
    let client = reqwest::Client::new();
    let names = [
        "gpuledger_aggregator_raw_rewritten_rows_total",
        "gpuledger_aggregator_raw_rewritten_until_timestamp_seconds",
    ];
    loop {
        if let Some((n, _)) = metrics_pair(&client, &url, names).await
            && n >= rows as f64
        {
            *done.lock().unwrap() = Some(Instant::now());
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The paced phase's batches while the aggregator rewrote the prefilled hour (it starts at the
/// aggregator's first tick, as it starts): those due up to 10 s (two rounds) after the rewrite
/// ended, and those due later, each from its due time to its answer.
fn report_rewrite(paced: &Phase, server_started: Instant, ended: Option<Instant>) {
    let started = paced.started.unwrap();
    let Some(ended) = ended else {
        eprintln!(
            "    the rewrite had not ended when the paced phase did: lengthen --paced-seconds"
        );
        return;
    };
    let end = ended.saturating_duration_since(started).as_secs_f64();
    let (mut during, mut after): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    for &(due, ms) in &paced.due {
        if due <= end + 10.0 {
            during.push(ms);
        } else {
            after.push(ms);
        }
    }
    let line = |v: &mut Vec<f64>| {
        if v.is_empty() {
            return "no batches".to_owned();
        }
        format!(
            "{} batches, p50 / p99 / max {:.0} / {:.0} / {:.0} ms",
            v.len(),
            quantile(v, 0.5),
            quantile(v, 0.99),
            quantile(v, 1.0)
        )
    };
    eprintln!(
        "    the aggregator's rewrite took {:.1} s from its start, ending {end:.1} s into the paced phase; from due to answer, due until 10 s after it ended: {}; due later: {}",
        ended.duration_since(server_started).as_secs_f64(),
        line(&mut during),
        line(&mut after)
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/ingest_load.rs: run with `cargo bench --bench ingest_load`");
        return;
    }
    let a = args();
    let memory_trace = a.memory_trace;
    let dir = tempfile::tempdir().unwrap();
    let t0 = (chrono::Utc::now().timestamp() - 6 * 3600) / 60 * 60;
    let nodes = a.senders.max(a.paced_senders);
    let token = |node: usize| format!("bench-node-token-{node:06}-0123456789");
    let tokens: String = (0..nodes)
        .map(|n| format!("node:{} {}\n", node_name(n), token(n)))
        .collect();
    std::fs::write(dir.path().join("tokens"), tokens).unwrap();

    // Every node's batches: the first 5 s (first contact), then the throughput phase's seconds,
    // then the paced phase's. The baseline appends the throughput phase's rows while they exist.
    eprintln!(
        "preparing {nodes} nodes: first contact, {} s each for {} senders, {} s each for {} paced senders",
        a.seconds, a.senders, a.paced_seconds, a.paced_senders
    );
    let base_conn = duckdb::Connection::open(dir.path().join("baseline.duckdb")).unwrap();
    base_conn.execute_batch(BARE_TABLE).unwrap();
    let mut base_secs = 0.0;
    let mut base_rows = 0usize;
    let mut cols = RawColumns::default();
    let (mut first, mut bulk, mut paced) = (Vec::new(), Vec::new(), Vec::new());
    for node in 0..nodes {
        let all = node_batches_with(
            node,
            BATCH_SECONDS + a.seconds + a.paced_seconds,
            BATCH_SECONDS,
            t0,
            88172645463325252 + node as u64,
            a.energy,
        );
        let (head, rest) = all.split_at(1);
        let (mid, tail) = rest.split_at((a.seconds / BATCH_SECONDS) as usize);
        let encode = |b: &[Batch]| Node {
            token: token(node),
            bodies: b.iter().map(|b| b.encode_as(a.format)).collect(),
            format: a.format,
        };
        first.push(encode(head));
        if node < a.senders {
            for b in mid {
                for (k, s) in b.series.iter().enumerate() {
                    for j in 0..s.t.len() {
                        cols.push(s, j, k as i32, k as i32);
                    }
                }
            }
            if cols.len() >= BASELINE_CHUNK || node + 1 == a.senders {
                base_rows += cols.len();
                let chunk = std::mem::take(&mut cols).into_record_batch().unwrap();
                let start = Instant::now();
                let mut app = base_conn.appender("t").unwrap();
                app.append_record_batch(chunk).unwrap();
                app.flush().unwrap();
                drop(app);
                base_secs += start.elapsed().as_secs_f64();
            }
            bulk.push(encode(mid));
        }
        if node < a.paced_senders {
            paced.push(encode(tail));
        }
    }
    let start = Instant::now();
    base_conn.execute_batch("CHECKPOINT").unwrap();
    base_secs += start.elapsed().as_secs_f64();
    drop(base_conn);
    let base = base_rows as f64 / base_secs;
    let wire: usize = bulk.iter().flat_map(|n| &n.bodies).map(Vec::len).sum();
    if base_rows > 0 {
        eprintln!(
            "  baseline: DuckDB appender, Arrow path, the throughput phase's {base_rows} rows into a plain table (+ checkpoint): {base:.0} samples/s; {:.1} bytes per sample on the wire (gzip {})",
            wire as f64 / base_rows as f64,
            a.format
        );
    }

    let db = dir.path().join("ledger.duckdb");
    let rewrite_hour = t0 - t0.rem_euclid(3600) - 2 * 3600;
    let prefilled = if a.rewrite_instances > 0 {
        prefill(&db, rewrite_hour, a.rewrite_instances)
    } else {
        0
    };
    let token_file = dir.path().join("tokens");
    let mut flags: Vec<&str> = vec!["--token-file", token_file.to_str().unwrap()];
    flags.extend(a.flags.iter().map(String::as_str));
    let server_started = Instant::now();
    let server = fleet::start_aggregator(&db, &flags);
    let pid = server.child.id();
    let url = format!("http://127.0.0.1:{}/api/v1/ingest", server.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let memory = MemoryLog::default();
    let metrics_url = format!("http://127.0.0.1:{}/metrics", server.port);
    let metrics_client = reqwest::Client::new();
    rt.spawn(watch_memory(metrics_url.clone(), memory.clone()));
    let rewritten_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    if prefilled > 0 {
        rt.spawn(watch_rewrite(
            metrics_url.clone(),
            prefilled,
            rewritten_at.clone(),
        ));
    }
    let mib = |bytes: f64| bytes / (1 << 20) as f64;
    let mut sent = 0;
    let mut stored = 0;
    let mut run = |what: &str, nodes: Vec<Node>, pace: Option<Duration>, base: Option<f64>| {
        let from = memory.lock().unwrap().len();
        let cpu = Cpu::now(pid);
        let passes = rt.block_on(analytics_of(&metrics_client, &metrics_url));
        let mut phase = rt.block_on(run_phase(nodes, url.clone(), pace));
        phase.report(what, base);
        Cpu::now(pid).report(&cpu, phase.samples, base);
        if let (Some((n0, s0)), Some((n1, s1))) = (
            passes,
            rt.block_on(analytics_of(&metrics_client, &metrics_url)),
        ) {
            let n = n1 - n0;
            eprintln!(
                "    analytics evaluations ended in this phase: {n:.0}, {:.0} ms each on average (wall time)",
                if n > 0.0 { (s1 - s0) * 1e3 / n } else { 0.0 }
            );
        }
        sent += phase.samples;
        stored += phase.stored;
        let log = memory.lock().unwrap();
        let most = log[from..]
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(String::new(), |&(_, rss, duckdb)| {
                format!(
                    "; most resident in this phase (read every 5 s) {:.1} MiB, of which DuckDB {:.1} MiB",
                    mib(rss),
                    mib(duckdb)
                )
            });
        eprintln!(
            "    aggregator peak RSS so far {:.1} MiB{most}",
            fleet::peak_rss_kib(pid) as f64 / 1024.0
        );
        if memory_trace {
            for &(t, rss, duckdb) in log[from..].iter().step_by(6) {
                eprintln!(
                    "      t={t:>5.0} s: resident {:.1} MiB, DuckDB {:.1} MiB",
                    mib(rss),
                    mib(duckdb)
                );
            }
        }
        phase
    };
    run(
        &format!("first contact, {nodes} nodes at once (56 new instances each)"),
        first,
        None,
        None,
    );
    // `--seconds 0`: no throughput phase, so that the paced phase starts on a writer with no
    // backlog (a fleet's own pace, measured alone).
    if a.seconds > 0 {
        run(
            &format!(
                "throughput, {} senders back to back, 280-sample gzip batches",
                a.senders
            ),
            bulk,
            None,
            Some(base),
        );
    }
    // `--paced-seconds 0`: no paced phase (the throughput phase alone, e.g. under a profiler).
    let paced = (a.paced_seconds > 0).then(|| {
        run(
            &format!(
                "paced, {} senders × one batch per 5 s ({:.0} samples/s offered)",
                a.paced_senders,
                (a.paced_senders * 280) as f64 / 5.0
            ),
            paced,
            Some(Duration::from_secs(BATCH_SECONDS as u64)),
            None,
        )
    });
    if let (true, Some(paced)) = (prefilled > 0, &paced) {
        report_rewrite(paced, server_started, *rewritten_at.lock().unwrap());
    }
    let peak = fleet::peak_rss_kib(pid);
    server.stop();
    let conn = duckdb::Connection::open(&db).unwrap();
    let count =
        |sql: &str| -> u64 { conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap() as u64 };
    let raw = count("SELECT count(*) FROM samples_raw") - prefilled;
    let minutes = count("SELECT sum(samples)::BIGINT FROM rollup_1m");
    let batches = count("SELECT sum(stored)::BIGINT FROM ingested_batches");
    eprintln!(
        "  sent {sent}, acknowledged as stored {stored}; in the ledger: {raw} raw rows, {minutes} samples in the minute rollups, {batches} in the batch ids; aggregator peak RSS {:.1} MiB",
        peak as f64 / 1024.0
    );
    assert!(
        [stored, raw, minutes, batches].iter().all(|&n| n == sent),
        "stored must equal sent"
    );
    if a.energy {
        // Every GPU-second sent (one per 7 instance-seconds) is in the minute energy rollup once.
        let gpu_seconds = count("SELECT sum(observed_seconds)::BIGINT FROM energy_gpu_1m");
        eprintln!("  GPU-seconds of energy in the ledger's minute rollup: {gpu_seconds}");
        assert_eq!(
            gpu_seconds * 7,
            sent,
            "every GPU-second's energy stored once"
        );
    }
    if prefilled > 0 {
        // The file holds the prefilled hour too: its bytes say nothing of the batches'.
        return;
    }
    let raw_blocks = |conn: &duckdb::Connection| -> u64 {
        conn.query_row(
            "SELECT count(DISTINCT block_id) FROM pragma_storage_info('samples_raw') WHERE block_id >= 0",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as u64
    };
    let before = raw_blocks(&conn);
    drop(conn);
    let bytes = std::fs::metadata(&db).unwrap().len();
    eprintln!(
        "  ledger file after a clean stop: {:.1} bytes per stored sample; samples_raw in arrival order: {before} blocks of 256 KiB = {:.1} bytes per raw row",
        bytes as f64 / sent as f64,
        (before * 262_144) as f64 / raw as f64
    );
    // What the aggregator does to each closed hour: the raw rows rewritten in instance order.
    let (conn, _) = gpuledger_ledger::store::open(&db).unwrap();
    let (writer, thread) =
        gpuledger_ledger::store::Writer::spawn(conn, 1, std::sync::Arc::new(())).unwrap();
    let rewritten = rt
        .block_on(writer.compact_raw(t0, chrono::Utc::now().timestamp()))
        .unwrap();
    drop(writer);
    thread.join().unwrap();
    let conn = duckdb::Connection::open(&db).unwrap();
    let after = raw_blocks(&conn);
    eprintln!(
        "  after the raw rows' rewrite in instance order ({rewritten} rows): samples_raw {after} blocks = {:.1} bytes per raw row ({:.2}× the arrival order's)",
        (after * 262_144) as f64 / raw as f64,
        after as f64 / before as f64
    );
}
