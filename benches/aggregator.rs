//! Aggregator benchmarks, each against a baseline measured in the same run:
//!
//! 1. ingest rate: the raw DuckDB appender writing the same rows into a bare table (baseline),
//!    the writer alone (dedup, raw rows and three rollups, in process), and end to end over HTTP:
//!    simulated exporters POSTing gzip batches to a real `gpuledger aggregator` process;
//! 2. that process's RSS while it ingests, and bytes on disk per stored sample;
//! 3. a month's showback for 1,000 GPUs × 7 MIG instances, from the rollups, through the same
//!    function the API calls;
//! 4. one hoarding + fragmentation evaluation over the last hour for 10,000 instances;
//! 5. (`-- history`) a day of the demo's history as minute rows against the same seconds;
//! 6. (`-- writer-live`) the writer alone on live 5 s batches from 1,000 known nodes, on a fresh
//!    ledger and on one that holds 10 M batch ids already;
//! 7. (`-- import`) `gpuledger import` of a 2 h trace against DuckDB's `read_csv` of the file;
//! 8. (`-- decode`) decoding alone (gzip, JSON or MessagePack, validation) on one core, of 100 s and live 5 s
//!    bodies; `-- decode --bodies DIR` adds the `.batch` files of an exporter's spool, the bodies
//!    a real exporter sent;
//! 9. (`-- evaluation-history`) the evaluation pass a live fleet pays after each new minute, with
//!    2, 6 and 24 hours of history whose idle allocations are open episodes all along, and with
//!    24 hours after 30 and 365 days of GPU-hours evaluated before;
//! 10. (`-- demand-mix`) the demand mix's week of observed allocations over the month ledger;
//! 11. (`-- evaluation-minute`) the same live pass early and late in the hour, for 10,003 and
//!     70,000 instances, with the memory it takes;
//! 12. (`-- rewrite [--instances N] [--beside-only]`) the hourly rewrite of a closed hour's raw rows while a
//!     fleet's nodes send live batches: as a writer job, and beside the writer;
//! 13. (`-- writer-shares`) the writer alone on live batches with and without two owners' shares
//!     of every instance (per-process views of time-sliced GPUs).
//! 14. (`-- fleet-pages`) the Fleet page, fragmentation and hoarding answers of a 10,000-GPU
//!     fleet (70,000 MIG instances) over HTTP, their p50 / p95 and size, against the showback
//!     JSON of the same ledger in the same run. `GPULEDGER_BIN=target/release/gpuledger` measures
//!     a release server from the test build's harness.
//!
//! Run with `cargo bench --bench aggregator` (add `-- --only analytics` for 3 and 4 alone);
//! `cargo test` runs it only as a smoke check.

#[path = "support/fleet.rs"]
mod fleet;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet::{TOKEN, batches, start_aggregator};
use gpuledger_ledger::analytics::{
    self,
    showback::{self, GroupBy},
};
use gpuledger_ledger::store::{self, Writer};
use gpuledger_schema::Sample;
use gpuledger_schema::wire::{Batch, Format, Limits};

const BARE_TABLE: &str = "CREATE TABLE t (ts BIGINT, instance_id INTEGER, holder_id INTEGER, sm_active DOUBLE, sm_occupancy DOUBLE, tensor_active DOUBLE, dram_active DOUBLE, fb_used_bytes UBIGINT, fb_total_bytes UBIGINT, nvlink_tx_bytes UBIGINT, nvlink_rx_bytes UBIGINT)";

/// Baseline: DuckDB's appender writing the same rows into a bare table with `samples_raw`'s
/// shape, on its Arrow path (`arrow`) or row by row. Returns samples/s.
fn raw_appender(batches: &[Batch], dir: &std::path::Path, arrow: bool) -> f64 {
    let conn = duckdb::Connection::open(dir.join(format!("appender-{arrow}.duckdb"))).unwrap();
    conn.execute_batch(BARE_TABLE).unwrap();
    let n: usize = batches.iter().map(Batch::sample_count).sum();
    let start = Instant::now();
    {
        let mut app = conn.appender("t").unwrap();
        for b in batches {
            if arrow {
                let mut cols = gpuledger_ledger::store::writer::RawColumns::default();
                for (k, s) in b.series.iter().enumerate() {
                    for j in 0..s.t.len() {
                        cols.push(s, j, k as i32, k as i32);
                    }
                }
                app.append_record_batch(cols.into_record_batch().unwrap())
                    .unwrap();
                continue;
            }
            for (k, s) in b.series.iter().enumerate() {
                for (j, &ts) in s.t.iter().enumerate() {
                    let c = s.counters(j);
                    app.append_row(duckdb::params![
                        ts,
                        k as i32,
                        k as i32,
                        c.sm_active,
                        c.sm_occupancy,
                        c.tensor_active,
                        c.dram_active,
                        c.fb_used_bytes,
                        c.fb_total_bytes,
                        c.nvlink_tx_bytes,
                        c.nvlink_rx_bytes
                    ])
                    .unwrap();
                }
            }
        }
        app.flush().unwrap();
    }
    conn.execute_batch("CHECKPOINT").unwrap();
    n as f64 / start.elapsed().as_secs_f64()
}

/// The writer alone: every step of ingest but HTTP and decoding. `warm` is written first, not
/// timed; then each round's batches are queued at once and all of them awaited before the next
/// round (one round per 5 s of 1,000 live exporters, each with one batch in flight).
fn writer_only(
    warm: Vec<Batch>,
    rounds: Vec<Vec<Batch>>,
    dir: &std::path::Path,
    name: &str,
) -> f64 {
    writer_aged(warm, rounds, dir, name, 0, false)
}

/// [`writer_only`] on a ledger that already holds `batch_ids` stored batch ids: a fleet's live
/// batches of the hours before (250 per second, as 1,250 nodes sending every 5 s), written
/// before the clock starts. `one_at_a_time`: each batch is written before the next is sent, so
/// that every group is one batch (a fleet at its own pace gives groups of a few).
fn writer_aged(
    warm: Vec<Batch>,
    rounds: Vec<Vec<Batch>>,
    dir: &std::path::Path,
    name: &str,
    batch_ids: u64,
    one_at_a_time: bool,
) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (conn, _) = store::open(&dir.join(format!("{name}.duckdb"))).unwrap();
    if batch_ids > 0 {
        let first = warm.iter().filter_map(Batch::first_second).min().unwrap();
        conn.execute(
            "INSERT INTO ingested_batches
             SELECT uuid(), 'node-' || (i % 1250), t, 280, 280, t
             FROM (SELECT i, ? - (? - i) // 250 AS t FROM range(?) r(i))",
            duckdb::params![first - 5, batch_ids as i64, batch_ids as i64],
        )
        .unwrap();
        conn.execute_batch("CHECKPOINT").unwrap();
    }
    let (writer, thread) = Writer::spawn(conn, 4_000_000, Arc::new(())).unwrap();
    let write = |batches: Vec<Batch>| {
        rt.block_on(async {
            let mut pending = Vec::new();
            for b in batches {
                let r = writer.reserve(b.sample_count()).await.unwrap();
                let w = writer.clone();
                let one = tokio::spawn(async move { w.ingest(b, 0, r).await.unwrap() });
                if one_at_a_time {
                    one.await.unwrap();
                } else {
                    pending.push(one);
                }
            }
            for p in pending {
                p.await.unwrap();
            }
        })
    };
    write(warm);
    let n: usize = rounds.iter().flatten().map(Batch::sample_count).sum();
    let start = Instant::now();
    for round in rounds {
        write(round);
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    drop(writer);
    thread.join().unwrap();
    rate
}

/// `nodes` nodes' live 5 s batches of `seconds` seconds, as (each node's first batch, then rounds
/// of one batch per node).
fn live_rounds(nodes: usize, seconds: i64, t0: i64) -> (Vec<Batch>, Vec<Vec<Batch>>) {
    let per_node: Vec<Vec<Batch>> = (0..nodes)
        .map(|n| fleet::node_batches(n, seconds, 5, t0, 88172645463325252 + n as u64))
        .collect();
    let mut rounds: Vec<Vec<Batch>> = vec![Vec::new(); per_node[0].len()];
    for node in per_node {
        for (r, b) in node.into_iter().enumerate() {
            rounds[r].push(b);
        }
    }
    let warm = rounds.remove(0);
    (warm, rounds)
}

/// The writer alone on live batches whose every instance is shared by two owners (a
/// time-sliced GPU's per-process view: two share rows per sample), against the same batches
/// without shares, alternating three times; the difference is what the shares cost.
fn writer_shares(dir: &std::path::Path) {
    let t0 = chrono::Utc::now().timestamp() - 6 * 3600;
    let (warm, rounds) = live_rounds(1000, 35, t0);
    let shared = |b: &Batch| {
        let owner = |tenant: &str| gpuledger_schema::Attribution {
            tenant: Some(tenant.into()),
            workload: Some(format!("{tenant}/job")),
            slo_class: None,
            owner: None,
            owner_ref: None,
        };
        let shares: Vec<gpuledger_schema::ShareSample> = b
            .samples()
            .flat_map(|s| {
                let sm = s.counters.sm_active;
                [("team-a", 0.6), ("team-b", 0.4)].map(|(tenant, part)| {
                    gpuledger_schema::ShareSample {
                        timestamp: s.timestamp,
                        instance: s.instance.clone(),
                        attribution: owner(tenant),
                        processes: 1,
                        memory_used_bytes: s.counters.fb_used_bytes.map(|b| b / 2),
                        sm_active: sm.map(|x| x * part),
                    }
                })
            })
            .collect();
        b.clone().with_shares(&shares)
    };
    let with = |v: &[Batch]| v.iter().map(shared).collect::<Vec<_>>();
    let (warm_s, rounds_s) = (
        with(&warm),
        rounds.iter().map(|r| with(r)).collect::<Vec<_>>(),
    );
    let samples: usize = rounds.iter().flatten().map(Batch::sample_count).sum();
    let share_rows: usize = rounds_s
        .iter()
        .flatten()
        .flat_map(|b| &b.shares)
        .map(|s| s.t.len())
        .sum();
    for i in 0..3 {
        let plain = writer_only(warm.clone(), rounds.clone(), dir, &format!("plain-{i}"));
        let with_shares = writer_only(
            warm_s.clone(),
            rounds_s.clone(),
            dir,
            &format!("shares-{i}"),
        );
        // Every share row is stored (the raw window starts at 0 here), or the rate means nothing.
        let ledger = duckdb::Connection::open(dir.join(format!("shares-{i}.duckdb"))).unwrap();
        let stored: i64 = ledger
            .query_row("SELECT count(*) FROM shares_raw", [], |r| r.get(0))
            .unwrap();
        let warm_rows: usize = warm_s
            .iter()
            .flat_map(|b| &b.shares)
            .map(|s| s.t.len())
            .sum();
        assert_eq!(stored as usize, share_rows + warm_rows, "share rows stored");
        let extra_us = (1.0 / with_shares - 1.0 / plain) * samples as f64 * 1e6 / share_rows as f64;
        eprintln!(
            "  writer, in process, live batches of 1,000 nodes: {plain:.0} samples/s without shares, {with_shares:.0} with two owners' shares of every instance ({share_rows} share rows for {samples} samples) = {:.2}×; {extra_us:.2} µs more per share row",
            with_shares / plain
        );
    }
}

/// Decodes every batch's body (gzip + JSON or MessagePack + validation) on one core, three
/// times, and prints the best rate against `base`, for each wire format.
fn decoding(batches: &[Batch], what: &str, base: f64) {
    for format in Format::ALL {
        let bodies: Vec<Vec<u8>> = batches.iter().map(|b| b.encode_as(format)).collect();
        decoding_bodies(&bodies, 0, what, base);
    }
}

/// [`decoding`] of bodies as they were sent, repeated within a pass to `at_least` samples.
fn decoding_bodies(bodies: &[Vec<u8>], at_least: usize, what: &str, base: f64) {
    assert!(!bodies.is_empty(), "no bodies to decode for {what}");
    // Each body in its own format: a spool may hold both (schema/WIRE.md).
    let formats: Vec<Format> = bodies.iter().map(|b| Format::of_body(b, true)).collect();
    let format = if formats.iter().all(|f| *f == formats[0]) {
        formats[0].to_string()
    } else {
        "JSON and MessagePack".to_owned()
    };
    let decode = |b: &[u8], f: Format| Batch::decode_as(b, true, f, &Limits::default()).unwrap();
    let n: usize = bodies
        .iter()
        .zip(&formats)
        .map(|(b, f)| decode(b, *f).sample_count())
        .sum();
    let times = at_least.div_ceil(n.max(1)).max(1);
    let mut best = 0f64;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..times {
            for (b, f) in bodies.iter().zip(&formats) {
                std::hint::black_box(decode(b, *f));
            }
        }
        best = best.max((n * times) as f64 / start.elapsed().as_secs_f64());
    }
    // A gzip member's last four bytes are its inflated length.
    let inflated: usize = bodies
        .iter()
        .map(|b| u32::from_le_bytes(b[b.len() - 4..].try_into().unwrap()) as usize)
        .sum();
    eprintln!(
        "  decoding {what} (gzip + {format} + validation), one core, best of 3: {best:.0} samples/s = {:.2}× the baseline; {:.1} bytes per sample on the wire, {:.1} of {format}; {:.0} bytes of {format} per body",
        best / base,
        bodies.iter().map(Vec::len).sum::<usize>() as f64 / n as f64,
        inflated as f64 / n as f64,
        inflated as f64 / bodies.len() as f64
    );
}

/// The bodies in an exporter's spool (`--spool-dir`): its `.batch` files are the gzip bodies it
/// POSTs, byte for byte.
fn spool_bodies(dir: &str) -> Vec<Vec<u8>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("--bodies {dir}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "batch"))
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// End to end: `clients` concurrent exporters POST pre-encoded bodies in `format`, each with its
/// node's own `node:NAME` token; a 503 or 429 is retried after a pause, as the exporter does.
/// Returns (samples/s, peak RSS KiB of the aggregator, ledger bytes after a clean stop).
fn http_ingest(
    batches: Vec<Batch>,
    format: Format,
    clients: usize,
    dir: &std::path::Path,
    name: &str,
) -> (f64, u64, u64) {
    let db = dir.join(format!("{name}.duckdb"));
    let token = |node: &str| format!("{node}-token-0123456789");
    let nodes: std::collections::BTreeSet<&str> = batches.iter().map(|b| b.node.as_str()).collect();
    let tokens: String = nodes
        .iter()
        .map(|n| format!("node:{n} {}\n", token(n)))
        .collect();
    let token_file = dir.join(format!("{name}.tokens"));
    std::fs::write(&token_file, tokens).unwrap();
    let server = start_aggregator(&db, &["--token-file", token_file.to_str().unwrap()]);
    let n: usize = batches.iter().map(Batch::sample_count).sum();
    let bodies: Vec<(String, Vec<u8>)> = batches
        .iter()
        .map(|b| (token(&b.node), b.encode_as(format)))
        .collect();
    drop(batches);
    let url = format!("http://127.0.0.1:{}/api/v1/ingest", server.port);
    let pid = server.child.id();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let bodies = Arc::new(bodies);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let retries = rt.block_on(async {
        let client = reqwest::Client::new();
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (client, url, bodies, next) =
                (client.clone(), url.clone(), bodies.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut retries = 0u64;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((token, body)) = bodies.get(i) else {
                        return retries;
                    };
                    loop {
                        let r = client
                            .post(&url)
                            .bearer_auth(token)
                            .header("content-encoding", "gzip")
                            .header("content-type", format.content_type())
                            .body(body.clone())
                            .send()
                            .await
                            .unwrap();
                        if r.status().is_success() {
                            break;
                        }
                        let status = r.status().as_u16();
                        assert!(
                            status == 503 || status == 429,
                            "{}",
                            r.text().await.unwrap()
                        );
                        retries += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }));
        }
        let mut retries = 0;
        for t in tasks {
            retries += t.await.unwrap();
        }
        retries
    });
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let peak = fleet::peak_rss_kib(pid);
    // A clean stop checkpoints the WAL into the file, so the size is the ledger's.
    server.stop();
    let bytes = std::fs::metadata(&db).unwrap().len();
    eprintln!("    ({retries} requests answered 503 or 429 and were retried)");
    (rate, peak, bytes)
}

/// A ledger holding a month (January 2026) of rollups for 1,000 GPUs × 7 instances, 40 tenants,
/// written with SQL.
fn month_ledger(path: &std::path::Path) -> (duckdb::Connection, u32) {
    let (conn, v) = store::open(path).unwrap();
    let month = 30 * 24;
    let t0: i64 = 1_767_225_600;
    let build = Instant::now();
    conn.execute_batch(&format!(
        "INSERT INTO instances SELECT i + 1, 'node-' || (i // 56), 'GPU-' || (i // 7), i % 7, 'NVIDIA H100 80GB HBM3', '1g.10gb', i % 7, 1, 1.0 / 7 FROM range(7000) t(i);
         INSERT INTO holders SELECT h, 'tenant-' || (h % 40), 'wl-' || h, 'batch' FROM range(1, 7001) t(h);
         INSERT INTO rollup_1h SELECT {t0} + 3600 * hr, i, i, 3600, 3600, 3600 * 0.3, 0.0, 1.0, 3600, 1000.0, 3600, 500.0, 3600, 200.0, 3600, 3600 * 5000000000, 9000000000, 10737418240, 0, 0
             FROM range({month}) a(hr), range(1, 7001) b(i);
         INSERT INTO rollup_tenant_1h SELECT {t0} + 3600 * hr, 'tenant-' || tn, 'batch', 'NVIDIA H100 80GB HBM3', 3600 * 175, 3600 * 25.0, 3600 * 25.0, 3600 * 7.5
             FROM range({month}) a(hr), range(40) b(tn);
         INSERT INTO rollup_alloc_1d SELECT bucket - bucket % 86400, instance_id, holder_id, sum(samples), sum(sm_active_samples), sum(sm_active_sum)
             FROM rollup_1h GROUP BY ALL;
         INSERT INTO rollup_gpu_1h SELECT {t0} + 3600 * hr, 'node-' || (g // 8), 'GPU-' || g, 'NVIDIA H100 80GB HBM3', 3600, 3600 * 7
             FROM range({month}) a(hr), range(1000) b(g);
         INSERT INTO fragmentation_1h SELECT {t0} + 3600 * hr, 'node-' || (g // 8), 'GPU-' || g, 'NVIDIA H100 80GB HBM3', 3600, 3600 * 7, 0.0, 0.0
             FROM range({month}) a(hr), range(1000) b(g);
         CHECKPOINT;"
    ))
    .unwrap();
    eprintln!(
        "  month of rollups built in {:.1} s",
        build.elapsed().as_secs_f64()
    );
    (conn, v)
}

/// The month's overview and tenants pages for 1,000 GPUs × 30 days over HTTP from the real
/// aggregator, against the showback JSON call of the same month in the same run: p50 and p95
/// of 30 requests each, interleaved.
fn month_pages(dir: &std::path::Path) {
    let db = dir.join("pages.duckdb");
    drop(month_ledger(&db));
    let server = start_aggregator(&db, &[]);
    let base = format!("http://127.0.0.1:{}", server.port);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let get = |path: &str| {
        rt.block_on(async {
            let start = Instant::now();
            let r = client
                .get(format!("{base}{path}"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
            std::hint::black_box(r.bytes().await.unwrap());
            start.elapsed().as_secs_f64() * 1000.0
        })
    };
    let paths = [
        (
            "GET /api/v1/showback (baseline)",
            "/api/v1/showback?from=2026-01-01T00:00:00Z&to=2026-01-31T00:00:00Z",
        ),
        (
            "GET / (overview page)",
            "/?from=2026-01-01T00:00:00Z&to=2026-01-31T00:00:00Z",
        ),
        (
            "GET /tenants (bill page)",
            "/tenants?from=2026-01-01T00:00:00Z&to=2026-01-31T00:00:00Z",
        ),
    ];
    for (_, p) in paths {
        get(p);
    }
    let mut times = vec![Vec::new(); paths.len()];
    for _ in 0..30 {
        for (k, (_, p)) in paths.iter().enumerate() {
            times[k].push(get(p));
        }
    }
    let pct = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64 - 1.0) * q).round() as usize]
    };
    let base_p95 = pct(&mut times[0].clone(), 0.95);
    for (k, (what, _)) in paths.iter().enumerate() {
        let (p50, p95) = (pct(&mut times[k], 0.5), pct(&mut times[k], 0.95));
        eprintln!(
            "  {what}: p50 {p50:.1} ms, p95 {p95:.1} ms = {:.2}× the showback JSON's p95",
            p95 / base_p95
        );
    }
}

/// A 10,000-GPU fleet (1,250 nodes × 8 GPUs × 7 `1g.10gb` instances, 40 tenants) that reported
/// its last two seconds just now, ingested over HTTP into a real aggregator; then each fleet
/// answer 20 times, interleaved with the showback JSON of the same day (the baseline), with the
/// size of each answer.
fn fleet_pages(dir: &std::path::Path) {
    const NODES: usize = 1250;
    let db = dir.join("fleet.duckdb");
    eprintln!("fleet pages: {}", fleet::binary().display());
    let server = start_aggregator(&db, &[]);
    let base = format!("http://127.0.0.1:{}", server.port);
    let now = chrono::Utc::now().timestamp();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let started = Instant::now();
    rt.block_on(async {
        let bodies: Vec<Vec<u8>> = batches(NODES, 2, 2, now - 3)
            .iter()
            .map(|b| b.encode_as(Format::Json))
            .collect();
        let bodies = Arc::new(bodies);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (client, base, bodies, next) =
                (client.clone(), base.clone(), bodies.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                while let Some(body) =
                    bodies.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    loop {
                        let r = client
                            .post(format!("{base}/api/v1/ingest"))
                            .bearer_auth(TOKEN)
                            .header("content-encoding", "gzip")
                            .header("content-type", Format::Json.content_type())
                            .body(body.clone())
                            .send()
                            .await
                            .unwrap();
                        if r.status().is_success() {
                            break;
                        }
                        assert_eq!(r.status().as_u16(), 503, "{}", r.text().await.unwrap());
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    eprintln!(
        "  {NODES} nodes' 140,000 samples ingested in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let day = now - now.rem_euclid(86400);
    let get = |path: &str| {
        rt.block_on(async {
            let start = Instant::now();
            let r = client
                .get(format!("{base}{path}"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
            let body = r.bytes().await.unwrap();
            (start.elapsed().as_secs_f64() * 1000.0, body)
        })
    };
    let paths = [
        (
            "GET /api/v1/showback, the day (baseline)".to_owned(),
            format!("/api/v1/showback?from={day}&to={}", day + 86400),
        ),
        ("GET /fleet (first page)".into(), "/fleet".into()),
        (
            "GET /fleet?node= (one node)".into(),
            "/fleet?node=bench-0625".into(),
        ),
        (
            "GET /api/v1/fragmentation (first page, 100 GPUs)".into(),
            "/api/v1/fragmentation".into(),
        ),
        (
            "GET /api/v1/fragmentation?limit=250 (the largest page)".into(),
            "/api/v1/fragmentation?limit=250".into(),
        ),
        (
            "GET /api/v1/fragmentation?tenant= (one tenant's GPUs)".into(),
            "/api/v1/fragmentation?tenant=tenant-7".into(),
        ),
        (
            "GET /api/v1/hoarding?state=all".into(),
            "/api/v1/hoarding?state=all".into(),
        ),
        ("GET / (overview page)".into(), "/".into()),
        ("GET /tenants (bill page)".into(), "/tenants".into()),
        (
            "GET /tenants/tenant-7 (one tenant's page)".into(),
            "/tenants/tenant-7".into(),
        ),
        ("GET /hoarding (page)".into(), "/hoarding".into()),
        (
            "GET /api/v1/showback?group_by=workload".into(),
            format!(
                "/api/v1/showback?from={day}&to={}&group_by=workload",
                day + 86400
            ),
        ),
    ];
    let mut sizes = vec![0usize; paths.len()];
    for (k, (_, p)) in paths.iter().enumerate() {
        sizes[k] = get(p).1.len();
    }
    let first = String::from_utf8(get("/fleet").1.to_vec()).unwrap();
    assert_eq!(
        first.matches("<figure class=\"gpu\"").count(),
        100,
        "the Fleet page shows the fleet's first 100 GPUs"
    );
    assert!(first.contains("of the 10000 GPUs"), "every GPU counted");
    let mut times = vec![Vec::new(); paths.len()];
    for _ in 0..20 {
        for (k, (_, p)) in paths.iter().enumerate() {
            times[k].push(get(p).0);
        }
    }
    let base_p95 = fleet::quantile(&mut times[0].clone(), 0.95);
    for (k, (what, _)) in paths.iter().enumerate() {
        let (p50, p95) = (
            fleet::quantile(&mut times[k], 0.5),
            fleet::quantile(&mut times[k], 0.95),
        );
        eprintln!(
            "  {what}: p50 {p50:.1} ms, p95 {p95:.1} ms = {:.2}× the showback JSON's p95; {:.0} KB",
            p95 / base_p95,
            sizes[k] as f64 / 1000.0
        );
    }
    server.stop();
}

/// A month of rollups for 1,000 GPUs × 7 instances, written with SQL; then the showback queries.
fn month_showback(dir: &std::path::Path) {
    let (conn, _) = month_ledger(&dir.join("month.duckdb"));
    let month = 30 * 24;
    let t0: i64 = 1_767_225_600;
    let time = |what: &str, sql: &str| {
        let mut stmt = conn.prepare(sql).unwrap();
        let run = |stmt: &mut duckdb::Statement| {
            let mut rows = stmt.query(duckdb::params![t0, t0 + 3600 * month]).unwrap();
            let mut n = 0;
            while rows.next().unwrap().is_some() {
                n += 1;
            }
            n
        };
        run(&mut stmt);
        let runs = 10;
        let start = Instant::now();
        let mut n = 0;
        for _ in 0..runs {
            n = run(&mut stmt);
        }
        let ms = start.elapsed().as_secs_f64() * 1000.0 / runs as f64;
        eprintln!("  {what}: {ms:.2} ms ({n} rows)");
        ms
    };
    let base = time(
        "baseline: count the month's 5,040,000 hourly instance rows",
        "SELECT count(*) FROM rollup_1h WHERE bucket >= ? AND bucket < ?",
    );
    let tenant = time(
        "showback by tenant from rollup_tenant_1h",
        "SELECT tenant, sum(samples), sum(gpu_seconds), sum(used_gpu_seconds) FROM rollup_tenant_1h WHERE bucket >= ? AND bucket < ? GROUP BY tenant",
    );
    let workload = time(
        "showback by workload from rollup_1h (joins the dimensions)",
        "SELECT h.tenant, h.workload, sum(r.samples * i.gpu_equivalents), sum(r.sm_active_sum * i.gpu_equivalents) FROM rollup_1h r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id) WHERE r.bucket >= ? AND r.bucket < ? GROUP BY ALL",
    );
    eprintln!(
        "  ratios: tenant {:.2}×, workload {:.2}× the baseline",
        tenant / base,
        workload / base
    );
    // The API's function: rows, capacity, coverage and stranded for the month.
    let settings = analytics::Settings::default();
    for by in [GroupBy::Tenant, GroupBy::Workload] {
        let run = || {
            showback::showback(&conn, t0, t0 + 3600 * month, by, None, i64::MIN, &settings).unwrap()
        };
        let rows = run().rows.len();
        let runs = 10;
        let start = Instant::now();
        for _ in 0..runs {
            std::hint::black_box(run());
        }
        let ms = start.elapsed().as_secs_f64() * 1000.0 / runs as f64;
        eprintln!(
            "  showback::showback(group_by={by:?}) for the month (what GET /api/v1/showback runs): {ms:.2} ms ({rows} rows) = {:.2}× the baseline",
            ms / base
        );
    }
}

/// The demand mix's week of observed allocations, as each evaluation pass reads it twice, over
/// the month ledger's 7,000 instances: from whole days of the day rollup and the hours at either
/// end (`observed_allocations`), against the baseline of the same count from the hour rollup
/// alone (what it read before), for 20 lookbacks ending at hours spread over the last week.
fn demand_mix_lookback(dir: &std::path::Path) {
    let (conn, _) = month_ledger(&dir.join("demand-mix.duckdb"));
    let t0: i64 = 1_767_225_600;
    let ends: Vec<i64> = (0..20)
        .map(|k| t0 + 23 * 86_400 + 3600 * (7 * k + 3))
        .collect();
    let week = 7 * 86_400;
    let hours_alone = |from: i64, to: i64| -> Vec<(String, Option<String>, i64)> {
        let mut stmt = conn
            .prepare_cached(
                "SELECT i.gpu_model, i.mig_profile, count(DISTINCT (r.instance_id, r.holder_id))
                 FROM rollup_1h r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
                 WHERE h.tenant IS NOT NULL AND r.bucket >= ? AND r.bucket < ?
                 GROUP BY ALL",
            )
            .unwrap();
        stmt.query_map([from, to], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let time = |f: &dyn Fn(i64, i64) -> Vec<(String, Option<String>, i64)>| {
        let start = Instant::now();
        let mut out = Vec::new();
        for &at in &ends {
            out.push(f(at - week, at + 3600));
        }
        (
            start.elapsed().as_secs_f64() * 1000.0 / ends.len() as f64,
            out,
        )
    };
    let (base, want) = time(&hours_alone);
    let (days, got) =
        time(&|from, to| analytics::fragmentation::observed_allocations(&conn, from, to).unwrap());
    assert_eq!(got, want, "the same allocations either way");
    eprintln!(
        "  demand mix, a week of 7,000 instances: from the hour rollup alone (baseline) {base:.1} ms; from whole days and the hours at either end {days:.1} ms = {:.2}x the baseline's time",
        days / base
    );
}

/// The evaluation benches' baseline: one SQL scan of the hour of minute rows from `hour`
/// (`count(*)` and the seconds held), in ms, the mean of five.
fn hour_scan_ms(conn: &duckdb::Connection, hour: i64) -> f64 {
    let start = Instant::now();
    let runs = 5;
    for _ in 0..runs {
        let v: (i64, i64) = conn
            .query_row(
                "SELECT count(*), sum(bit_count(seconds_mask))::BIGINT FROM rollup_1m WHERE bucket >= ? AND bucket < ?",
                [hour, hour + 3600],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        std::hint::black_box(v);
    }
    start.elapsed().as_secs_f64() * 1000.0 / runs as f64
}

/// One evaluation pass over the last hour of 10,000 instances (1,429 GPUs × 7 1g.10gb slices),
/// written as minute rollups with SQL: a quarter of the allocations idle (hoarding candidates),
/// every GPU-hour dirty. Baseline: scanning the same minute rows once in SQL.
fn hour_evaluation(dir: &std::path::Path) {
    let (conn, _) = store::open(&dir.join("hour.duckdb")).unwrap();
    let t0: i64 = 1_767_225_600;
    let gpus = 1429;
    let n = gpus * 7;
    conn.execute_batch(&format!(
        "INSERT INTO instances SELECT i + 1, 'node-' || (i // 56), 'GPU-' || (i // 7), i % 7, 'NVIDIA H100 80GB HBM3', '1g.10gb', i % 7, 1, 1.0 / 7 FROM range({n}) t(i);
         INSERT INTO holders SELECT h, 'tenant-' || (h % 40), 'wl-' || h, 'interactive' FROM range(1, {n} + 1) t(h);
         INSERT INTO rollup_1m (bucket, instance_id, holder_id, seconds_mask, samples, sm_active_samples, sm_active_sum,
                                sm_occupancy_samples, sm_occupancy_sum, tensor_active_samples, tensor_active_sum,
                                dram_active_samples, dram_active_sum, fb_used_samples, fb_used_bytes_sum,
                                nvlink_tx_bytes_sum, nvlink_rx_bytes_sum)
             SELECT {t0} + 60 * m, i, CASE WHEN i % 7 = 6 THEN 0 ELSE i END, (1::UBIGINT << 60) - 1, 60, 60,
                    CASE WHEN i % 4 = 0 THEN 0.0 ELSE 60 * 0.7 END, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
             FROM range(60) a(m), range(1, {n} + 1) b(i);
         INSERT INTO rollup_gpu_1h SELECT {t0}, 'node-' || (g // 8), 'GPU-' || g, 'NVIDIA H100 80GB HBM3', 3600, 3600 * 7
             FROM range({gpus}) b(g);
         INSERT INTO gpu_hours_changed SELECT nextval('gpu_hours_changed_seq'), bucket, node, gpu_uuid, gpu_model FROM rollup_gpu_1h;
         CHECKPOINT;"
    ))
    .unwrap();
    let base = hour_scan_ms(&conn, t0);
    eprintln!(
        "  baseline: one SQL scan of the hour's {} minute rows: {base:.1} ms",
        n * 60
    );
    let readers = store::query::Readers::new(&conn, None).unwrap();
    let (writer, _thread) = Writer::spawn(conn, 1_000, Arc::new(())).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let settings = analytics::Settings::default();
    let start = Instant::now();
    let report = rt
        .block_on(analytics::evaluate(&readers, &writer, &settings, 10))
        .unwrap();
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    eprintln!(
        "  hoarding + fragmentation evaluation of the hour ({} GPU-hours, {} episodes): {ms:.0} ms = {:.1}× the baseline",
        report.gpu_hours,
        report.episodes,
        ms / base
    );
}

/// What [`history_evaluation`] measured, in ms and MiB.
struct HistoryPass {
    /// One SQL scan of the last hour's minute rows.
    base: f64,
    /// The first pass, over everything.
    first: f64,
    /// The live pass: the median of three steps.
    live: f64,
    /// The most the process's resident memory rose above what it was before the live steps,
    /// during them (`VmHWM`, reset first through `/proc/self/clear_refs`).
    live_peak_mib: f64,
}

/// The 256 KiB blocks that hold the row groups of `samples_raw` whose rows all lie in the hour
/// from `hour` (a block shared with another hour's row groups counts whole), per row of the hour.
fn raw_bytes_per_row_in_hour(path: &std::path::Path, hour: i64) -> f64 {
    let conn = duckdb::Connection::open(path).unwrap();
    conn.query_row(
        "WITH info AS (SELECT * FROM pragma_storage_info('samples_raw') WHERE persistent),
              ts AS (SELECT row_group_id,
                            regexp_extract(stats, 'Min: (-?[0-9]+)', 1)::BIGINT AS lo,
                            regexp_extract(stats, 'Max: (-?[0-9]+)', 1)::BIGINT AS hi
                     FROM info WHERE column_name = 'ts' AND segment_type = 'BIGINT'),
              groups AS (SELECT row_group_id FROM ts GROUP BY 1 HAVING min(lo) >= ?1 AND max(hi) < ?1 + 3600),
              blocks AS (SELECT block_id AS b FROM info JOIN groups USING (row_group_id) WHERE block_id >= 0
                         UNION SELECT unnest(additional_block_ids) FROM info JOIN groups USING (row_group_id))
         SELECT (SELECT count(DISTINCT b) FROM blocks) * 262144.0
                / (SELECT count(*) FROM samples_raw WHERE ts >= ?1 AND ts < ?1 + 3600)",
        [hour],
        |r| r.get(0),
    )
    .unwrap()
}

/// What a fleet's batches met while an hour was rewritten.
struct DuringRewrite {
    rewrite_s: f64,
    rows: u64,
    batches: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    peak_mib: f64,
}

/// The hourly rewrite of raw rows against a fleet's live batches: one closed hour of `instances`
/// instances is rewritten while `instances / 56` nodes send their 5 s batches at their own pace
/// (1,250 nodes: a 10,000-GPU fleet, 70,000 samples/s), once as a job of the writer (how the
/// aggregator did it before `Compactor`) and once by a [`store::Compactor`] beside it. Each
/// batch's latency is taken from when it was due to when the writer answered; the figures count
/// the batches due from the rewrite's start to two rounds (10 s) after its end, so that what the
/// writer pays once the rewrite is over (the WAL it could not checkpoint meanwhile) counts too.
fn hourly_rewrite(dir: &std::path::Path, instances: i64) {
    let nodes = (instances as usize).div_ceil(fleet::INSTANCES_PER_NODE);
    let instances = (nodes * fleet::INSTANCES_PER_NODE) as i64;
    let path = dir.join("rewrite.duckdb");
    let now = chrono::Utc::now().timestamp();
    let (on_writer, beside) = (now - now % 3600 - 4 * 3600, now - now % 3600 - 3 * 3600);
    let ways: &[bool] = if std::env::args().any(|a| a == "--beside-only") {
        &[true]
    } else {
        &[false, true]
    };
    let built = Instant::now();
    {
        let (conn, _) = store::open_with(&path, Some("1GB")).unwrap();
        for &beside_the_writer in ways {
            fleet::live_order_hour(
                &conn,
                if beside_the_writer { beside } else { on_writer },
                instances,
            );
        }
        conn.execute_batch("CHECKPOINT").unwrap();
    }
    eprintln!(
        "  {} closed hour(s) of {instances} instances in live order ({} rows each) written in {:.0} s; {nodes} nodes send 5 s batches",
        ways.len(),
        instances * 3600,
        built.elapsed().as_secs_f64()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut t0 = now - 60;
    for &beside_the_writer in ways {
        let (conn, _) = store::open_with(&path, Some("1GB")).unwrap();
        let compactor = store::Compactor::new(&conn).unwrap();
        let (writer, thread) = Writer::spawn(conn, 2_000_000, Arc::new(())).unwrap();
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let during = rt.block_on(async {
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let fleet_writer = writer.clone();
            let fleet_done = done.clone();
            let from = t0;
            // The fleet: each node's batch due at its own offset in every 5 s round.
            let fleet = tokio::spawn(async move {
                let start = tokio::time::Instant::now();
                let mut answers = Vec::new();
                let mut round = 0i64;
                let mut tail_rounds = None;
                loop {
                    for n in 0..nodes {
                        let due = start
                            + Duration::from_secs(5 * round as u64)
                            + Duration::from_secs(5) * n as u32 / nodes as u32;
                        tokio::time::sleep_until(due).await;
                        let b =
                            fleet::node_batches(n, 5, 5, from + 5 * round, 7 + n as u64).remove(0);
                        let w = fleet_writer.clone();
                        answers.push(tokio::spawn(async move {
                            let r = w.reserve(b.sample_count()).await.unwrap();
                            w.ingest(b, 0, r).await.unwrap();
                            (due, tokio::time::Instant::now())
                        }));
                    }
                    round += 1;
                    // Two rounds after the rewrite ended.
                    match tail_rounds {
                        None if fleet_done.load(std::sync::atomic::Ordering::SeqCst) => {
                            tail_rounds = Some(2)
                        }
                        Some(0) => break,
                        Some(k) => tail_rounds = Some(k - 1),
                        None => {}
                    }
                }
                let mut out = Vec::new();
                for a in answers {
                    out.push(a.await.unwrap());
                }
                (out, round)
            });
            // Two rounds to settle, then the rewrite.
            tokio::time::sleep(Duration::from_secs(10)).await;
            let began = tokio::time::Instant::now();
            let hour = if beside_the_writer { beside } else { on_writer };
            let rows = if beside_the_writer {
                compactor.compact(&writer, hour, hour + 3600).await.unwrap()
            } else {
                writer.compact_raw(hour, hour + 3600).await.unwrap()
            };
            let ended = tokio::time::Instant::now();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            let (answers, rounds) = fleet.await.unwrap();
            t0 += 5 * rounds;
            let mut lat: Vec<f64> = answers
                .iter()
                .filter(|(due, _)| *due >= began)
                .map(|(due, answered)| (*answered - *due).as_secs_f64() * 1000.0)
                .collect();
            lat.sort_by(f64::total_cmp);
            let at = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
            DuringRewrite {
                rewrite_s: (ended - began).as_secs_f64(),
                rows,
                batches: lat.len(),
                p50_ms: at(0.5),
                p99_ms: at(0.99),
                max_ms: at(1.0),
                peak_mib: rss_and_peak_mib().1,
            }
        });
        drop(writer);
        thread.join().unwrap();
        drop(compactor);
        let hour = if beside_the_writer { beside } else { on_writer };
        eprintln!(
            "  rewrite {}: {} rows in {:.1} s, then {:.2} B per row on disk; the fleet's {} batches due meanwhile and 10 s after: latency p50 / p99 / max {:.0} / {:.0} / {:.0} ms; peak RSS {:.1} MiB",
            if beside_the_writer {
                "beside the writer (Compactor)"
            } else {
                "as a writer job (before)"
            },
            during.rows,
            during.rewrite_s,
            raw_bytes_per_row_in_hour(&path, hour),
            during.batches,
            during.p50_ms,
            during.p99_ms,
            during.max_ms,
            during.peak_mib,
        );
    }
}

/// `VmRSS` and `VmHWM` of this process, in MiB.
fn rss_and_peak_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The evaluation a live fleet pays every 15 s, against how much history its hoarders have and
/// how far into the hour it is: `gpus` GPUs × 7 instances (1,429 GPUs: the same 10,003 instances
/// as [`hour_evaluation`]) with `minutes` minutes of minute rollups (written with SQL), a quarter
/// of the allocations idle all along, so their episodes are open and as old as the history;
/// before them, `old_days` days of GPU-hours already evaluated (`rollup_gpu_1h` and
/// `fragmentation_1h` alike, as a ledger of that age holds). After a first pass over everything,
/// each live step adds one minute of every instance (and its GPU-hour counts, which make the
/// hour dirty) and times the pass that follows. Baseline: one SQL scan of the last hour's minute
/// rows, as above.
fn history_evaluation(
    dir: &std::path::Path,
    gpus: i64,
    minutes: i64,
    old_days: i64,
) -> HistoryPass {
    let name = format!("history-{gpus}g-{minutes}m-{old_days}d.duckdb");
    let (conn, _) = store::open(&dir.join(name)).unwrap();
    let t0: i64 = 1_767_225_600;
    let n = gpus * 7;
    let minute_rows = |from: i64, to: i64| {
        format!(
            "INSERT INTO rollup_1m (bucket, instance_id, holder_id, seconds_mask, samples, sm_active_samples, sm_active_sum,
                                    sm_occupancy_samples, sm_occupancy_sum, tensor_active_samples, tensor_active_sum,
                                    dram_active_samples, dram_active_sum, fb_used_samples, fb_used_bytes_sum,
                                    nvlink_tx_bytes_sum, nvlink_rx_bytes_sum)
                 SELECT {t0} + 60 * m, i, CASE WHEN i % 7 = 6 THEN 0 ELSE i END, (1::UBIGINT << 60) - 1, 60, 60,
                        CASE WHEN i % 4 = 0 THEN 0.0 ELSE 60 * 0.7 END, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
                 FROM range({from}, {to}) a(m), range(1, {n} + 1) b(i)"
        )
    };
    // Each GPU-hour's counts as the writer keeps them: 60 observed seconds and 7 instance-seconds
    // per minute, and the writer's note that they changed.
    let gpu_hours = |from: i64, to: i64| {
        format!(
            "DELETE FROM rollup_gpu_1h WHERE bucket >= {t0} + 3600 * ({from} // 60);
             INSERT INTO rollup_gpu_1h
             SELECT {t0} + 3600 * h, 'node-' || (g // 8), 'GPU-' || g, 'NVIDIA H100 80GB HBM3',
                    60 * least(60, {to} - 60 * h), 60 * 7 * least(60, {to} - 60 * h)
             FROM range({from} // 60, ({to} + 59) // 60) a(h), range({gpus}) b(g);
             INSERT INTO gpu_hours_changed
             SELECT nextval('gpu_hours_changed_seq'), bucket, node, gpu_uuid, gpu_model
             FROM rollup_gpu_1h WHERE bucket >= {t0} + 3600 * ({from} // 60)"
        )
    };
    conn.execute_batch(&format!(
        "INSERT INTO instances SELECT i + 1, 'node-' || (i // 56), 'GPU-' || (i // 7), i % 7, 'NVIDIA H100 80GB HBM3', '1g.10gb', i % 7, 1, 1.0 / 7 FROM range({n}) t(i);
         INSERT INTO holders SELECT h, 'tenant-' || (h % 40), 'wl-' || h, 'interactive' FROM range(1, {n} + 1) t(h);
         {}; {};
         INSERT INTO rollup_gpu_1h
         SELECT {t0} - 3600 * (1 + h), 'node-' || (g // 8), 'GPU-' || g, 'NVIDIA H100 80GB HBM3', 3600, 3600 * 7
         FROM range({old_days} * 24) a(h), range({gpus}) b(g);
         INSERT INTO fragmentation_1h
         SELECT bucket, node, gpu_uuid, gpu_model, observed_seconds, instance_seconds, 0.0, 0.0
         FROM rollup_gpu_1h WHERE bucket < {t0};
         CHECKPOINT;",
        minute_rows(0, minutes),
        gpu_hours(0, minutes),
    ))
    .unwrap();
    let last_hour = t0 + 60 * (minutes - 60);
    let base = hour_scan_ms(&conn, last_hour);
    let readers = store::query::Readers::new(&conn, None).unwrap();
    let (writer, _thread) = Writer::spawn(conn, 1_000, Arc::new(())).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let settings = analytics::Settings::default();
    let pass = || {
        let start = Instant::now();
        let report = rt
            .block_on(analytics::evaluate(&readers, &writer, &settings, 10))
            .unwrap();
        (start.elapsed().as_secs_f64() * 1000.0, report)
    };
    let (first, report) = pass();
    assert!(report.episodes > 0, "the idle quarter are episodes");
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (before, _) = rss_and_peak_mib();
    let mut live = Vec::new();
    for step in 0..3 {
        let m = minutes + step;
        let sql = format!("{}; {};", minute_rows(m, m + 1), gpu_hours(m, m + 1));
        // Rollup rows through a caller's job, which `Writer::apply` rules out for a writer that
        // ingests: its dedup would not see them. No batch is ingested on this writer.
        rt.block_on(writer.apply(Box::new(move |tx| tx.execute_batch(&sql))))
            .unwrap();
        let (ms, report) = pass();
        assert!(
            report.gpus > 0,
            "the new minute makes every GPU's hour dirty"
        );
        live.push(ms);
    }
    let (_, peak) = rss_and_peak_mib();
    live.sort_by(f64::total_cmp);
    HistoryPass {
        base,
        first,
        live: live[1],
        live_peak_mib: peak - before,
    }
}

/// The demo's history (`src/cmd/demo/history.rs`): one day of the built-in fleet written through
/// the one writer as the simulator's minute rows, against the baseline of the same day's seconds
/// (each second reading its minute row's counters) sent as 1 s batches of an hour per node, all
/// older than the raw window (rollups only, as most of the demo's month is). Generating the rows
/// is not timed, only the writer.
fn history_day(dir: &std::path::Path) {
    use gpuledger_exporter::source::sim::{Fleet, Simulator};
    use gpuledger_ledger::store::writer::{MinuteBatch, MinuteRow};
    use gpuledger_schema::wire::Series;
    let sim = Simulator::new(Fleet::builtin());
    let day = (chrono::Utc::now().timestamp() / 86_400 - 3) * 86_400;
    let open = |name: &str| {
        let (conn, _) = store::open(&dir.join(name)).unwrap();
        Writer::spawn(conn, 4_000_000, Arc::new(())).unwrap()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (minutes_writer, _t1) = open("history-minutes.duckdb");
    let mut batch = MinuteBatch::default();
    sim.minutes(None, day, day + 86_400, |m| {
        batch
            .entries
            .push(Series::describing(&m.instance, &m.attribution));
        batch.rows.push(MinuteRow {
            entry: batch.entries.len() - 1,
            bucket: m.bucket,
            mask: m.mask,
            counters: m.counters,
        });
    });
    let rows = batch.rows.len();
    let start = Instant::now();
    let outcome = rt.block_on(minutes_writer.ingest_minutes(batch)).unwrap();
    let minutes_secs = start.elapsed().as_secs_f64();
    let (seconds_writer, _t2) = open("history-seconds.duckdb");
    let mut seconds_secs = 0.0;
    let mut samples = 0u64;
    for hour in 0..24 {
        let from = day + hour * 3600;
        let mut by_node: std::collections::HashMap<String, Vec<Sample>> = Default::default();
        sim.minutes(None, from, from + 3600, |m| {
            for s in 0..60 {
                if m.mask & (1 << s) != 0 {
                    by_node
                        .entry(m.instance.node.clone())
                        .or_default()
                        .push(Sample {
                            timestamp: m.bucket + s,
                            instance: m.instance.clone(),
                            attribution: m.attribution.clone(),
                            counters: m.counters,
                        });
                }
            }
        });
        for (node, chunk) in by_node {
            for part in chunk.chunks(50_000) {
                let b = Batch::from_samples(&node, part);
                let start = Instant::now();
                let r = seconds_writer.try_reserve(b.sample_count()).unwrap();
                samples += rt
                    .block_on(seconds_writer.ingest(b, i64::MAX, r))
                    .unwrap()
                    .stored;
                seconds_secs += start.elapsed().as_secs_f64();
            }
        }
    }
    assert_eq!(samples, outcome.stored_seconds, "the same instance-seconds");
    eprintln!(
        "history, one day of the built-in fleet ({samples} instance-seconds):\n  baseline: 1 s samples through the writer: {seconds_secs:.2} s ({:.0} instance-seconds/s)\n  {rows} minute rows through the writer: {minutes_secs:.3} s ({:.0} instance-seconds/s) = {:.0}× the baseline",
        samples as f64 / seconds_secs,
        samples as f64 / minutes_secs,
        seconds_secs / minutes_secs
    );
}

/// `gpuledger import` of a simulated trace CSV into a fresh ledger file (the whole command:
/// parsing, checking every row, dedup, raw rows and rollups), against DuckDB's own `read_csv` of
/// the same file into a plain table in the same run; `hours` of the built-in fleet.
fn import_against_read_csv(dir: &std::path::Path, hours: u32) {
    let bin = env!("CARGO_BIN_EXE_gpuledger");
    let csv = dir.join("trace.csv");
    let start = (chrono::Utc::now().timestamp() / 3600 - i64::from(hours) - 1) * 3600;
    let status = std::process::Command::new(bin)
        .args([
            "simulate",
            "--duration",
            &format!("{hours}h"),
            "--start",
            &start.to_string(),
        ])
        .arg("--out")
        .arg(&csv)
        .env("RUST_LOG", "error")
        .status()
        .unwrap();
    assert!(status.success());
    let bytes = std::fs::metadata(&csv).unwrap().len();
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    };
    let mut rows = 0i64;
    let mut runs = Vec::new();
    for run in 0..3 {
        let db = dir.join(format!("read_csv-{run}.duckdb"));
        let base = time(&mut || {
            let conn = duckdb::Connection::open(&db).unwrap();
            conn.execute_batch(&format!(
                "CREATE TABLE t AS SELECT * FROM read_csv('{}'); CHECKPOINT;",
                csv.display()
            ))
            .unwrap();
            rows = conn
                .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap();
        });
        let ledger = dir.join(format!("import-{run}.duckdb"));
        let import = time(&mut || {
            let status = std::process::Command::new(bin)
                .args(["import", "--db"])
                .arg(&ledger)
                .arg(&csv)
                .env("RUST_LOG", "error")
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success());
        });
        runs.push((base, import));
    }
    let (base, import) = runs
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    // The largest resident set of any child so far: the imports (the simulator's is smaller).
    // SAFETY: getrusage(2) fills the struct it is given.
    let peak_kib = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage.ru_maxrss
    };
    eprintln!(
        "import of a {hours} h trace ({rows} rows, {:.1} MB of CSV), best of 3 each:\n  baseline: DuckDB read_csv into a plain table (+ checkpoint): {base:.2} s ({:.0} rows/s)\n  gpuledger import --db (parse, check, dedup, raw + rollups): {import:.2} s ({:.0} rows/s) = {:.2}× the baseline's time; import peak RSS {:.1} MiB",
        bytes as f64 / 1e6,
        rows as f64 / base,
        rows as f64 / import,
        import / base,
        peak_kib as f64 / 1024.0
    );
}

/// Rightsizing's month for 1,000 GPUs × 7 instances × 30 days of minute rollups (302 million
/// minute rows, written with SQL; half the instances near idle, the rest busy at varying levels),
/// against the month showback by workload in the same run: the first answer (which reads every
/// minute row into the per-day histograms), then p50 / p95 of 30 answers each, interleaved; and
/// the memory the histograms hold. Every instance is a `1g.20gb` holding 3 GB, so the idle half
/// fits a `1g.10gb`.
fn month_rightsizing(dir: &std::path::Path) {
    use gpuledger_ledger::analytics::rightsizing::{self, DemandCache, Filter};
    let (conn, _) = store::open(&dir.join("rightsizing.duckdb")).unwrap();
    let minutes: i64 = 30 * 24 * 60;
    let t0: i64 = 1_767_225_600;
    let build = Instant::now();
    conn.execute_batch(
        "SET preserve_insertion_order = false;
         INSERT INTO instances SELECT i + 1, 'node-' || (i // 56), 'GPU-' || (i // 7), i % 7, 'NVIDIA H100 80GB HBM3', '1g.20gb', i % 7, 1, 1.0 / 7 FROM range(7000) t(i);
         INSERT INTO holders SELECT h, 'tenant-' || (h % 40), 'wl-' || h, 'batch' FROM range(1, 7001) t(h);",
    )
    .unwrap();
    // A day at a time (10 million rows each), so the build shows its progress.
    for day in 0..minutes / 1440 {
        conn.execute_batch(&format!(
            "INSERT INTO rollup_1m (bucket, instance_id, holder_id, seconds_mask, samples, sm_active_samples, sm_active_sum,
                    sm_active_min, sm_active_max, sm_occupancy_samples, sm_occupancy_sum, tensor_active_samples,
                    tensor_active_sum, dram_active_samples, dram_active_sum, fb_used_samples, fb_used_bytes_sum,
                    fb_used_bytes_max, fb_total_bytes_max, nvlink_tx_bytes_sum, nvlink_rx_bytes_sum)
             SELECT {t0} + 60 * m, i, i, 1152921504606846975, 60, 60, 60 * s, s, s, 0, 0, 0, 0, 0, 0,
                    60, 60 * 3000000000, 3000000000, 10737418240, 0, 0
             FROM (SELECT m, i, CASE WHEN i % 2 = 0 THEN 0.01 * ((m + i) % 3)
                                      ELSE 0.3 + 0.01 * ((m * 7 + i * 13) % 60) END AS s
                   FROM range({}, {}) a(m), range(1, 7001) b(i));",
            day * 1440,
            (day + 1) * 1440
        ))
        .unwrap();
        eprint!(
            "\r  minute rollups: day {} of 30 ({:.0} s)",
            day + 1,
            build.elapsed().as_secs_f64()
        );
    }
    eprintln!();
    conn.execute_batch(&format!(
        "         INSERT INTO rollup_1h SELECT bucket - bucket % 3600, instance_id, holder_id, sum(samples), sum(sm_active_samples),
                sum(sm_active_sum), min(sm_active_min), max(sm_active_max), 0, 0, 0, 0, 0, 0, sum(fb_used_samples),
                sum(fb_used_bytes_sum), max(fb_used_bytes_max), max(fb_total_bytes_max), 0, 0
             FROM rollup_1m GROUP BY ALL;
         INSERT INTO rollup_tenant_1h SELECT bucket, h.tenant, 'batch', 'NVIDIA H100 80GB HBM3', sum(r.samples)::BIGINT,
                sum(r.samples) / 7.0, sum(r.sm_active_samples) / 7.0, sum(r.sm_active_sum) / 7.0
             FROM rollup_1h r JOIN holders h USING (holder_id) GROUP BY ALL;
         INSERT INTO rollup_alloc_1d SELECT bucket - bucket % 86400, instance_id, holder_id, sum(samples), sum(sm_active_samples), sum(sm_active_sum)
             FROM rollup_1h GROUP BY ALL;
         INSERT INTO rollup_gpu_1h SELECT {t0} + 3600 * hr, 'node-' || (g // 8), 'GPU-' || g, 'NVIDIA H100 80GB HBM3', 3600, 3600 * 7
             FROM range({hours}) a(hr), range(1000) b(g);
         CHECKPOINT;",
        hours = minutes / 60
    ))
    .unwrap();
    eprintln!(
        "  a month of minute rollups (302,400,000 rows) built in {:.1} s",
        build.elapsed().as_secs_f64()
    );
    let mut settings = analytics::Settings::default();
    settings.prices.default_per_gpu_hour = 3.5;
    // A 1g.20gb costs more than a 1g.10gb (its memory), as cloud price lists have it.
    settings.prices.entries.push(analytics::prices::Price {
        gpu_model: "H100-80GB".into(),
        mig_profile: Some("1g.20gb".into()),
        per_hour: 0.8,
        from: None,
    });
    let (from, to) = (t0, t0 + 60 * minutes);
    let cache = DemandCache::default();
    let (rss0, _) = rss_and_peak_mib();
    let cold = Instant::now();
    let first = rightsizing::rightsizing(
        &conn,
        &cache,
        (from, to),
        &settings,
        i64::MIN,
        Filter::default(),
    )
    .unwrap();
    let cold_s = cold.elapsed().as_secs_f64();
    let (rss1, _) = rss_and_peak_mib();
    eprintln!(
        "  first answer (reads every minute row into {} day histograms, {:.1} MiB of them): {cold_s:.1} s, {} rows, {} recommendations, savings {}; RSS {rss0:.0} → {rss1:.0} MiB",
        cache.len().0,
        cache.bytes() as f64 / 1048576.0,
        first.rows.len(),
        first.totals.recommendations,
        first.totals.savings
    );
    let (mut sb, mut rs) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let t = Instant::now();
        std::hint::black_box(
            showback::showback(
                &conn,
                from,
                to,
                GroupBy::Workload,
                None,
                i64::MIN,
                &settings,
            )
            .unwrap(),
        );
        sb.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let again = rightsizing::rightsizing(
            &conn,
            &cache,
            (from, to),
            &settings,
            i64::MIN,
            Filter::default(),
        )
        .unwrap();
        rs.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(again, first, "a cached answer is the first answer");
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((p * v.len() as f64).ceil() as usize).max(1) - 1]
    };
    let (sb50, sb95, rs50, rs95) = (
        pct(&mut sb, 0.5),
        pct(&mut sb, 0.95),
        pct(&mut rs, 0.5),
        pct(&mut rs, 0.95),
    );
    eprintln!(
        "  month showback by workload p50 / p95: {sb50:.1} / {sb95:.1} ms; month rightsizing p50 / p95: {rs50:.1} / {rs95:.1} ms = {:.2}× the showback's p95",
        rs95 / sb95
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/aggregator.rs: run with `cargo bench --bench aggregator`");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    if std::env::args().any(|a| a == "history") {
        history_day(dir.path());
        return;
    }
    if std::env::args().any(|a| a == "rightsizing") {
        month_rightsizing(dir.path());
        return;
    }
    if std::env::args().any(|a| a == "pages") {
        month_pages(dir.path());
        return;
    }
    if std::env::args().any(|a| a == "fleet-pages") {
        fleet_pages(dir.path());
        return;
    }
    if std::env::args().any(|a| a == "rewrite") {
        // `-- rewrite --instances N` (default 70,000: a 10,000-GPU fleet's MIG instances).
        let args: Vec<String> = std::env::args().collect();
        let instances = args
            .iter()
            .position(|a| a == "--instances")
            .and_then(|i| args.get(i + 1))
            .map_or(70_000, |v| v.parse().expect("--instances N"));
        hourly_rewrite(dir.path(), instances);
        return;
    }
    if std::env::args().any(|a| a == "import") {
        import_against_read_csv(dir.path(), 2);
        return;
    }
    if std::env::args().any(|a| a == "writer-live") {
        let t0 = chrono::Utc::now().timestamp() - 6 * 3600;
        let (warm, rounds) = live_rounds(1000, 35, t0);
        let (first_warm, first_round) = (warm.clone(), vec![rounds[0].clone()]);
        let live = writer_only(warm, rounds, dir.path(), "writer-live");
        eprintln!("  writer, in process, live batches, 1,000 nodes: {live:.0} samples/s");
        // Groups of one batch, on a fresh ledger and on one holding the batch ids a 10,000-GPU
        // fleet (1,250 nodes, one batch each per 5 s) stores in 11 h.
        let rate = |name: &str, ids: u64| {
            writer_aged(
                first_warm.clone(),
                first_round.clone(),
                dir.path(),
                name,
                ids,
                true,
            )
        };
        let fresh = rate("one-fresh", 0);
        let aged = rate("one-aged", 10_000_000);
        eprintln!(
            "  one batch per group, 1,000 batches: fresh ledger {fresh:.0} samples/s; holding 10,000,000 batch ids already {aged:.0} samples/s = {:.2}× the fresh ledger's",
            aged / fresh
        );
        return;
    }
    if std::env::args().any(|a| a == "writer-shares") {
        writer_shares(dir.path());
        return;
    }
    if std::env::args().any(|a| a == "decode") {
        // Decoding alone, for both shapes of body: a backfill's 100 s batches and a live
        // exporter's 5 s ones (56 series of 5 seconds: the per-series names weigh more).
        let t0 = chrono::Utc::now().timestamp() - 6 * 3600;
        let big = batches(40, 900, 100, t0);
        let base = raw_appender(&big, dir.path(), true);
        eprintln!("  baseline: raw appender (Arrow path) into a bare table: {base:.0} samples/s");
        decoding(&big, "100 s bodies", base);
        let (_, rounds) = live_rounds(1000, 40, t0);
        let live: Vec<Batch> = rounds.into_iter().flatten().collect();
        decoding(&live, "live 5 s bodies", base);
        // An exporter's own bodies (`--bodies SPOOL_DIR`), repeated to about 2 M samples a pass.
        let args: Vec<String> = std::env::args().collect();
        if let Some(dir) = args
            .iter()
            .position(|a| a == "--bodies")
            .map(|i| &args[i + 1])
        {
            let bodies = spool_bodies(dir);
            assert!(!bodies.is_empty(), "--bodies {dir}: no .batch file");
            let what = format!("{} bodies of {dir}", bodies.len());
            decoding_bodies(&bodies, 2_000_000, &what, base);
        }
        return;
    }
    if std::env::args().any(|a| a == "demand-mix") {
        demand_mix_lookback(dir.path());
        return;
    }
    if std::env::args().any(|a| a == "evaluation-history") {
        for (hours, old_days) in [(2, 0), (6, 0), (24, 0), (24, 30), (24, 365)] {
            let p = history_evaluation(dir.path(), 1429, hours * 60 + 30, old_days);
            eprintln!(
                "  evaluation with {hours} h 30 min of history (10,003 instances, a quarter idle all along) after {old_days} days of evaluated GPU-hours: first pass {:.0} ms; live pass after one more minute {:.0} ms = {:.1}x the baseline (one SQL scan of the last hour's minute rows, {:.1} ms)",
                p.first,
                p.live,
                p.live / p.base,
                p.base
            );
        }
        return;
    }
    // The live pass early and late in the hour, for one fleet's instances and for a 10,000-GPU
    // fleet's: the live steps add minutes 2–4, or 56–58, of the third hour.
    if std::env::args().any(|a| a == "evaluation-minute") {
        for gpus in [1429, 10_000] {
            for minutes in [122, 176] {
                let p = history_evaluation(dir.path(), gpus, minutes, 0);
                eprintln!(
                    "  evaluation of {} instances at minute {} of the hour: live pass {:.0} ms = {:.1}x the baseline (one SQL scan of the last hour's minute rows, {:.1} ms); resident memory rose by at most {:.1} MiB during the live passes",
                    gpus * 7,
                    minutes % 60 + 1,
                    p.live,
                    p.live / p.base,
                    p.base,
                    p.live_peak_mib
                );
            }
        }
        return;
    }
    if std::env::args().any(|a| a == "analytics") {
        month_showback(dir.path());
        hour_evaluation(dir.path());
        return;
    }
    let t0 = chrono::Utc::now().timestamp() - 6 * 3600;
    // 40 nodes × 56 instances × 900 s = 2,016,000 samples, as 100 s batches (5,600 samples).
    let big = batches(40, 900, 100, t0);
    let n: usize = big.iter().map(Batch::sample_count).sum();
    eprintln!(
        "{n} samples in {} batches of {} samples",
        big.len(),
        big[0].sample_count()
    );
    let rows = raw_appender(&big, dir.path(), false);
    let base = raw_appender(&big, dir.path(), true);
    eprintln!("  baseline: raw appender (Arrow path) into a bare table: {base:.0} samples/s");
    eprintln!(
        "  raw appender row by row, same rows: {rows:.0} samples/s = {:.2}× the baseline",
        rows / base
    );
    let w = writer_only(Vec::new(), vec![big.clone()], dir.path(), "writer");
    eprintln!(
        "  writer (dedup + raw + 3 rollups), in process: {w:.0} samples/s = {:.2}× the baseline",
        w / base
    );
    let (warm, rounds) = live_rounds(1000, 35, t0 + 7200);
    let live = writer_only(warm, rounds, dir.path(), "writer-live");
    eprintln!(
        "  writer, in process, live 5 s batches of 280 samples: 1,000 nodes known, 6 rounds of one batch per node: {live:.0} samples/s = {:.2}× the baseline",
        live / base
    );
    decoding(&big, "the bodies", base);
    for format in Format::ALL {
        let name = format!("e2e-big-{format}");
        let (e2e, peak, bytes) = http_ingest(big.clone(), format, 40, dir.path(), &name);
        eprintln!(
            "  end to end over HTTP (40 clients, one per node, {format} bodies): {e2e:.0} samples/s = {:.2}× the baseline; aggregator peak RSS {:.1} MiB; {:.1} bytes on disk per sample",
            e2e / base,
            peak as f64 / 1024.0,
            bytes as f64 / n as f64
        );
    }
    // Live batches (280 samples from 1,000 senders): `cargo bench --bench ingest_load`.
    month_showback(dir.path());
    hour_evaluation(dir.path());
}
