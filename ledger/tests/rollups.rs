//! The writer against a real DuckDB file: rollups equal the raw data they summarise, and no
//! (instance, second) is ever counted twice, whatever the batch ids, order or overlaps.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use duckdb::Connection;
use gpuledger_ledger::store::{self, Retention, Writer};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};

/// A deterministic pseudo-random sequence (no dependency, same numbers on every machine).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn unit(&mut self) -> f64 {
        (self.next() % 10_001) as f64 / 10_000.0
    }
}

fn instance(gi: Option<u32>, profile: Option<&str>, start: Option<u32>) -> Instance {
    Instance {
        node: "n1".into(),
        gpu_uuid: "GPU-aaaa".into(),
        gpu_model: "NVIDIA H100 80GB HBM3".into(),
        mig_profile: profile.map(Into::into),
        gpu_instance_id: gi,
        placement_start: start,
        placement_size: profile.map(|p| if p.starts_with('3') { 4 } else { 1 }),
    }
}

fn holder(tenant: &str, workload: &str, class: SloClass) -> Attribution {
    Attribution {
        tenant: Some(tenant.into()),
        workload: Some(workload.into()),
        slo_class: Some(class),
        owner: None,
        owner_ref: None,
    }
}

/// 3 instances over [t0, t0 + 2h40m): a whole GPU, a 3g.40gb that changes tenant mid-hour and a
/// 1g.10gb that is unallocated half the time, with some unmeasured seconds.
fn samples(t0: i64) -> Vec<Sample> {
    let mut rng = Lcg(42);
    let whole = Instance {
        gpu_uuid: "GPU-bbbb".into(),
        ..instance(None, None, None)
    };
    let three = instance(Some(1), Some("3g.40gb"), Some(0));
    let one = instance(Some(9), Some("1g.10gb"), Some(6));
    let mut out = Vec::new();
    for t in t0..t0 + 9600 {
        for (inst, attribution) in [
            (
                &whole,
                holder("research", "research/train", SloClass::Batch),
            ),
            (
                &three,
                if t < t0 + 5000 {
                    holder("inference", "inference/api", SloClass::LatencyCritical)
                } else {
                    holder("notebooks", "notebooks/jupyter-7", SloClass::Interactive)
                },
            ),
            (
                &one,
                if (t / 600) % 2 == 0 {
                    Attribution::default()
                } else {
                    holder("notebooks", "notebooks/jupyter-9", SloClass::Interactive)
                },
            ),
        ] {
            let measured = rng.next() % 50 != 0;
            out.push(Sample {
                timestamp: t,
                instance: inst.clone(),
                attribution,
                counters: Counters {
                    sm_active: measured.then(|| rng.unit()),
                    sm_occupancy: measured.then(|| rng.unit()),
                    tensor_active: Some(rng.unit()),
                    dram_active: Some(rng.unit()),
                    fb_used_bytes: Some(rng.next() % 40_000_000_000),
                    fb_total_bytes: Some(42_949_672_960),
                    nvlink_tx_bytes: inst
                        .mig_profile
                        .is_none()
                        .then(|| rng.next() % 1_000_000_000),
                    nvlink_rx_bytes: inst
                        .mig_profile
                        .is_none()
                        .then(|| rng.next() % 1_000_000_000),
                },
            });
        }
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

async fn write_all(writer: &Writer, batches: Vec<Batch>, raw_cutoff: i64) -> (u64, u64) {
    let (mut stored, mut dup) = (0, 0);
    for b in batches {
        let r = writer.try_reserve(b.sample_count()).unwrap();
        let o = writer.ingest(b, raw_cutoff, r).await.unwrap();
        stored += o.stored;
        dup += o.duplicate_samples;
    }
    (stored, dup)
}

/// Retention as of `now` with a 1 h raw window and 2 h of rollups: the rows it deleted, per table.
async fn retain_1h_2h(writer: &Writer, now: i64) -> BTreeMap<&'static str, u64> {
    let retention = Retention {
        raw_secs: 3600,
        rollup_secs: 2 * 3600,
    };
    let report = writer
        .apply_retention(now, retention)
        .await
        .expect("retention answers what it deleted");
    report.deleted.into_iter().collect()
}

fn open(path: &std::path::Path) -> (Writer, std::thread::JoinHandle<()>) {
    let (conn, _) = store::open(path).unwrap();
    Writer::spawn(conn, 1_000_000, Arc::new(())).unwrap()
}

/// Rows of `sql` as (key, values) for comparing two queries.
/// The one integer `sql` answers.
fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

fn rows(conn: &Connection, sql: &str) -> BTreeMap<String, Vec<f64>> {
    let mut stmt = conn.prepare(sql).unwrap();
    let mut out = BTreeMap::new();
    let mut q = stmt.query([]).unwrap();
    while let Some(r) = q.next().unwrap() {
        let key: String = r.get(0).unwrap();
        let n = r.as_ref().column_count();
        let vals = (1..n)
            .map(|i| r.get::<_, Option<f64>>(i).unwrap().unwrap_or(f64::NAN))
            .collect();
        out.insert(key, vals);
    }
    out
}

fn assert_same(conn: &Connection, what: &str, from_rollup: &str, from_raw: &str) {
    let a = rows(conn, from_rollup);
    let b = rows(conn, from_raw);
    assert_eq!(a.len(), b.len(), "{what}: row counts differ");
    assert!(!a.is_empty(), "{what}: no rows");
    for (k, va) in &a {
        let vb = b
            .get(k)
            .unwrap_or_else(|| panic!("{what}: {k} missing from raw"));
        for (x, y) in va.iter().zip(vb) {
            assert!(
                (x.is_nan() && y.is_nan()) || close(*x, *y),
                "{what} {k}: rollup {va:?} != raw {vb:?}"
            );
        }
    }
}

const ROLLUP_COLUMNS: &str = "sum(samples), sum(sm_active_samples), sum(sm_active_sum), min(sm_active_min), max(sm_active_max), sum(sm_occupancy_sum), sum(tensor_active_sum), sum(dram_active_sum), sum(fb_used_bytes_sum), max(fb_used_bytes_max), sum(nvlink_tx_bytes_sum), sum(nvlink_rx_bytes_sum)";
const RAW_COLUMNS: &str = "count(*), count(sm_active), coalesce(sum(sm_active), 0), min(sm_active), max(sm_active), coalesce(sum(sm_occupancy), 0), coalesce(sum(tensor_active), 0), coalesce(sum(dram_active), 0), coalesce(sum(fb_used_bytes), 0), max(fb_used_bytes), coalesce(sum(nvlink_tx_bytes), 0), coalesce(sum(nvlink_rx_bytes), 0)";

#[tokio::test(flavor = "multi_thread")]
async fn rollups_equal_raw_whatever_the_batching_order_and_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.duckdb");
    let (writer, thread) = open(&path);
    let t0 = 1_767_225_600 - 1_000; // 16 min 40 s before an hour boundary
    let all = samples(t0);
    let mut rng = Lcg(7);
    // Batches of varying size, shuffled; then whole-batch re-sends (same id) and overlapping
    // re-sends under new ids.
    let mut batches = Vec::new();
    let mut i = 0;
    while i < all.len() {
        let n = (1 + rng.next() % 3000) as usize;
        batches.push(Batch::from_samples("n1", &all[i..(i + n).min(all.len())]));
        i += n;
    }
    for k in (1..batches.len()).rev() {
        batches.swap(k, (rng.next() as usize) % (k + 1));
    }
    let resent: Vec<Batch> = batches.iter().step_by(3).cloned().collect();
    let overlapping: Vec<Batch> = (0..20)
        .map(|_| {
            let a = (rng.next() as usize) % all.len();
            let b = (a + 5000).min(all.len());
            Batch::from_samples("n1", &all[a..b])
        })
        .collect();
    let (stored, dup) = write_all(&writer, batches, 0).await;
    assert_eq!(stored, all.len() as u64, "every sample stored once");
    assert_eq!(dup, 0);
    let (stored, dup) =
        write_all(&writer, resent.into_iter().chain(overlapping).collect(), 0).await;
    assert_eq!(stored, 0, "re-sends and overlaps store nothing");
    assert!(dup > 0);
    drop(writer);
    thread.join().unwrap();

    let (conn, _) = store::open(&path).unwrap();
    let raw = count(&conn, "SELECT count(*) FROM samples_raw");
    assert_eq!(raw as usize, all.len());
    let distinct: i64 = conn
        .query_row(
            "SELECT count(*) FROM (SELECT DISTINCT instance_id, ts FROM samples_raw)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(distinct, raw, "no (instance, second) twice");
    let bits: i64 = conn
        .query_row(
            "SELECT sum(bit_count(seconds_mask))::BIGINT FROM rollup_1m",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        bits, raw,
        "the minute masks hold exactly the stored seconds"
    );
    // Masks of one instance-minute never overlap across holders.
    let overlap: i64 = conn
        .query_row(
            "SELECT count(*) FROM (SELECT instance_id, bucket, sum(bit_count(seconds_mask)) AS b, bit_count(bit_or(seconds_mask)) AS u FROM rollup_1m GROUP BY ALL) WHERE b <> u",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(overlap, 0);
    for (table, width) in [("rollup_1m", 60), ("rollup_1h", 3600)] {
        assert_same(
            &conn,
            table,
            &format!(
                "SELECT concat_ws('/', instance_id, holder_id, bucket), {ROLLUP_COLUMNS} FROM {table} GROUP BY ALL"
            ),
            &format!(
                "SELECT concat_ws('/', instance_id, holder_id, ts - ts % {width}), {RAW_COLUMNS} FROM samples_raw GROUP BY ALL"
            ),
        );
    }
    assert_same(
        &conn,
        "rollup_alloc_1d",
        "SELECT concat_ws('/', instance_id, holder_id, bucket), sum(samples), sum(sm_active_samples), sum(sm_active_sum) FROM rollup_alloc_1d GROUP BY ALL",
        "SELECT concat_ws('/', instance_id, holder_id, ts - ts % 86400), count(*), count(sm_active), coalesce(sum(sm_active), 0) FROM samples_raw GROUP BY ALL",
    );
    assert_same(
        &conn,
        "rollup_tenant_1h",
        "SELECT concat_ws('/', coalesce(tenant, '-'), coalesce(slo_class, '-'), gpu_model, bucket), sum(samples), sum(gpu_seconds), sum(sm_measured_gpu_seconds), sum(used_gpu_seconds) FROM rollup_tenant_1h GROUP BY ALL",
        "SELECT concat_ws('/', coalesce(h.tenant, '-'), coalesce(h.slo_class, '-'), i.gpu_model, ts - ts % 3600), count(*), sum(i.gpu_equivalents), coalesce(sum(CASE WHEN sm_active IS NOT NULL THEN i.gpu_equivalents END), 0), coalesce(sum(sm_active * i.gpu_equivalents), 0) FROM samples_raw JOIN instances i USING (instance_id) JOIN holders h USING (holder_id) GROUP BY ALL",
    );
    // And both equal what the samples say, computed here without SQL.
    let expected_used: f64 = all
        .iter()
        .filter(|s| s.attribution.tenant.as_deref() == Some("notebooks"))
        .map(|s| s.counters.sm_active.unwrap_or(0.0) * s.instance.gpu_equivalents().unwrap())
        .sum();
    let used = gpuledger_ledger::store::query::tenant_usage(&conn, 0, i64::MAX).unwrap();
    let notebooks = used
        .iter()
        .find(|u| u.tenant.as_deref() == Some("notebooks"))
        .unwrap();
    assert!(close(notebooks.used_gpu_seconds, expected_used));
    let expected_alloc: f64 = all
        .iter()
        .filter(|s| s.attribution.tenant.as_deref() == Some("notebooks"))
        .map(|s| s.instance.gpu_equivalents().unwrap())
        .sum();
    assert!(close(notebooks.allocated_gpu_seconds, expected_alloc));
    let unallocated = used.iter().find(|u| u.tenant.is_none()).unwrap();
    assert_eq!(unallocated.samples, 9600 / 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn samples_older_than_the_raw_window_go_to_the_rollups_only_and_still_deduplicate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.duckdb");
    let (writer, thread) = open(&path);
    let t0 = 1_767_225_600;
    let all: Vec<Sample> = samples(t0).into_iter().take(3000).collect();
    let cutoff = t0 + 10_000; // everything is "old"
    let (stored, _) = write_all(&writer, vec![Batch::from_samples("n1", &all)], cutoff).await;
    assert_eq!(stored, 3000);
    let (stored, dup) = write_all(
        &writer,
        vec![Batch::from_samples("n1", &all[1000..])],
        cutoff,
    )
    .await;
    assert_eq!(
        (stored, dup),
        (0, 2000),
        "a backfill sent twice counts once"
    );
    drop(writer);
    thread.join().unwrap();
    let (conn, _) = store::open(&path).unwrap();
    let count = |sql: &str| count(&conn, sql);
    assert_eq!(count("SELECT count(*) FROM samples_raw"), 0);
    assert_eq!(count("SELECT sum(samples)::BIGINT FROM rollup_1m"), 3000);
    assert_eq!(count("SELECT sum(samples)::BIGINT FROM rollup_1h"), 3000);
    assert_eq!(
        count("SELECT sum(samples)::BIGINT FROM rollup_tenant_1h"),
        3000
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_deletes_what_is_older_than_each_window() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.duckdb");
    let (writer, thread) = open(&path);
    let t0 = 1_767_225_600;
    let all = samples(t0);
    write_all(&writer, vec![Batch::from_samples("n1", &all)], 0).await;
    // Raw window: 1 hour; rollups: 2 hours; "now" is t0 + 3h.
    let now = t0 + 3 * 3600;
    let deleted = retain_1h_2h(&writer, now).await;
    drop(writer);
    thread.join().unwrap();
    let (conn, _) = store::open(&path).unwrap();
    let count = |sql: &str| count(&conn, sql);
    assert_eq!(
        count("SELECT count(*) FROM samples_raw WHERE ts < 1767225600 + 7200"),
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM samples_raw") as usize,
        all.iter().filter(|s| s.timestamp >= now - 3600).count()
    );
    assert_eq!(
        count("SELECT count(*) FROM rollup_1h WHERE bucket + 3600 <= 1767225600 + 3600"),
        0
    );
    assert_eq!(count("SELECT min(bucket) FROM rollup_1h"), t0 + 3600);
    assert_eq!(
        deleted["samples_raw"] as usize,
        all.iter().filter(|s| s.timestamp < now - 3600).count()
    );
    let seconds: HashSet<i64> = all.iter().map(|s| s.timestamp).collect();
    assert_eq!(seconds.len(), 9600);
}

/// Regression: retention's checkpoint, after its deletes had committed, failed whenever another
/// connection had a write transaction open (DuckDB: "Cannot CHECKPOINT: there are other write
/// transactions active"; the compactor's slices run beside the writer). Retention answered an
/// error, so its deletions went uncounted and the log said nothing was deleted. The checkpoint is
/// now left to the next one. (An UPDATE, a sequence or a catalog change holds the lock; the
/// aggregator's slices only insert and delete, so which connection held it in the bench run that
/// showed it is not known.)
#[tokio::test(flavor = "multi_thread")]
async fn retention_beside_another_connections_open_write_reports_what_it_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.duckdb");
    let (conn, _) = store::open(&path).unwrap();
    let mut other = conn.try_clone().unwrap();
    let (writer, thread) = Writer::spawn(conn, 1_000_000, Arc::new(())).unwrap();
    let t0 = 1_767_225_600;
    let all = samples(t0);
    write_all(&writer, vec![Batch::from_samples("n1", &all)], 0).await;
    // An UPDATE holds DuckDB's checkpoint lock (shared) until its transaction ends.
    let open_write = other.transaction().unwrap();
    open_write
        .execute_batch(
            "INSERT INTO raw_compacted VALUES (1); UPDATE raw_compacted SET until_ts = 2",
        )
        .unwrap();
    let now = t0 + 3 * 3600;
    let deleted = retain_1h_2h(&writer, now).await;
    assert_eq!(
        deleted["samples_raw"] as usize,
        all.iter().filter(|s| s.timestamp < now - 3600).count()
    );
    open_write.commit().unwrap();
    drop(other);
    drop(writer);
    thread.join().unwrap();
    let (conn, _) = store::open(&path).unwrap();
    assert_eq!(
        count(&conn, "SELECT count(*) FROM samples_raw") as usize,
        all.iter().filter(|s| s.timestamp >= now - 3600).count()
    );
}

/// Regression: retention never removed instances or holders, so a burst of made-up instances
/// stayed in the writer's memory and every analytics pass forever. Once no fact refers to them
/// they go, the writer forgets them, and new ones are numbered and stored as usual.
#[tokio::test(flavor = "multi_thread")]
async fn retention_removes_instances_and_holders_no_fact_refers_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.duckdb");
    let (writer, thread) = open(&path);
    let t0 = 1_767_225_600;
    write_all(&writer, vec![Batch::from_samples("n1", &samples(t0))], 0).await;
    let report = writer
        .apply_retention(
            t0 + 400 * 86400,
            Retention {
                raw_secs: 3600,
                rollup_secs: 2 * 3600,
            },
        )
        .await
        .unwrap();
    let deleted: BTreeMap<_, _> = report.deleted.into_iter().collect();
    assert!(
        deleted["instances"] > 0 && deleted["holders"] > 0,
        "{deleted:?}"
    );
    // Written again after the purge: stored as new, not as duplicates of forgotten ids.
    let later = t0 + 399 * 86400;
    let again = samples(later);
    let (stored, duplicates) =
        write_all(&writer, vec![Batch::from_samples("n1", &again)], later).await;
    assert_eq!((stored as usize, duplicates), (again.len(), 0));
    drop(writer);
    thread.join().unwrap();
    let (conn, _) = store::open(&path).unwrap();
    let count = |sql: &str| count(&conn, sql);
    assert_eq!(
        count(
            "SELECT count(*) FROM rollup_1h r LEFT JOIN instances i USING (instance_id) WHERE i.instance_id IS NULL"
        ),
        0,
        "every fact has its instance"
    );
    assert_eq!(
        count(
            "SELECT count(*) FROM rollup_1h r LEFT JOIN holders h USING (holder_id) WHERE h.holder_id IS NULL"
        ),
        0,
        "every fact has its holder"
    );
    assert_eq!(
        count("SELECT count(*) FROM holders WHERE holder_id = 0"),
        1,
        "nobody stays"
    );
}

#[test]
fn a_full_queue_refuses_without_waiting_and_a_batch_larger_than_the_queue_is_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let (conn, _) = store::open(&dir.path().join("l.duckdb")).unwrap();
    let (writer, _thread) = Writer::spawn(conn, 100, Arc::new(())).unwrap();
    let held = writer.try_reserve(80).unwrap();
    assert!(matches!(
        writer.try_reserve(30),
        Err(store::QueueError::Full {
            queued: 80,
            capacity: 100
        })
    ));
    assert!(matches!(
        writer.try_reserve(101),
        Err(store::QueueError::TooLarge { .. })
    ));
    drop(held);
    assert!(writer.try_reserve(100).is_ok());
}

/// Minute rows written between live batches are seen by the next batch's dedup: the writer's
/// copy of the recent minutes' stored seconds (`store/writer/recent.rs`) is read
/// again after a job that is not an ingest, and a batch sent again whole is still its duplicate.
#[tokio::test]
async fn minute_rows_between_live_batches_are_seen_by_the_next_batch() {
    use gpuledger_ledger::store::writer::{MinuteBatch, MinuteRow};
    use gpuledger_schema::wire::Series;

    let dir = tempfile::tempdir().unwrap();
    let (writer, thread) = open(&dir.path().join("l.duckdb"));
    let t0 = 1_767_225_600; // a minute's first second
    let minute: Vec<Sample> = samples(t0)
        .into_iter()
        .filter(|s| s.timestamp < t0 + 60)
        .collect();
    let (early, late): (Vec<Sample>, Vec<Sample>) =
        minute.iter().cloned().partition(|s| s.timestamp < t0 + 30);
    // The minute's first half live: the writer now keeps this minute.
    let first = Batch::from_samples("n1", &early);
    assert_eq!(
        write_all(&writer, vec![first.clone()], 0).await,
        (early.len() as u64, 0)
    );
    // Its second half as minute rows, one per instance and holder (each second reading the
    // same counters).
    let mut rows = MinuteBatch::default();
    for s in late.iter().filter(|s| s.timestamp == t0 + 30) {
        rows.entries
            .push(Series::describing(&s.instance, &s.attribution));
        rows.rows.push(MinuteRow {
            entry: rows.entries.len() - 1,
            bucket: t0,
            mask: ((1u64 << 60) - 1) & !((1u64 << 30) - 1),
            counters: s.counters,
        });
    }
    let o = writer.ingest_minutes(rows).await.unwrap();
    assert_eq!(o.stored_seconds, late.len() as u64, "{o:?}");
    // The second half sent live as well, under a new batch id: every second is stored already.
    let (stored, duplicate) = write_all(&writer, vec![Batch::from_samples("n1", &late)], 0).await;
    assert_eq!((stored, duplicate), (0, late.len() as u64));
    // The first batch again, whole: a duplicate by its id.
    let r = writer.try_reserve(first.sample_count()).unwrap();
    let again = writer.ingest(first, 0, r).await.unwrap();
    assert!(again.duplicate_batch && again.stored == 0, "{again:?}");
    drop(writer);
    thread.join().unwrap();
    let (conn, _) = store::open(&dir.path().join("l.duckdb")).unwrap();
    assert_eq!(
        count(&conn, "SELECT sum(samples)::BIGINT FROM rollup_1m") as usize,
        minute.len(),
        "every second of the minute once"
    );
}
