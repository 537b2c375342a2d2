//! Analytics against a real DuckDB file, on traces whose answers are known by construction: a
//! hoarder with a one-second blip, a busy job, an idle latency-critical replica, a slice that
//! changes tenant mid-hour, a whole GPU that becomes unallocated, and a checkerboard MIG layout.
//! Then randomised traces check the invariants (allocated + unallocated = capacity, used ≤
//! allocated, rollup-based = raw-based) over random ranges.

use std::sync::Arc;

use crate::common::traces::{self, Lcg};
use duckdb::Connection;
use gpuledger_ledger::analytics::showback::{self, GroupBy};
use gpuledger_ledger::analytics::{self, EpisodeState, Settings};
use gpuledger_ledger::store::query::Readers;
use gpuledger_ledger::store::{self, Writer};
use gpuledger_schema::Sample;
use gpuledger_schema::wire::Batch;

const T0: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

fn known_trace() -> Vec<Sample> {
    traces::known_trace(T0)
}

/// The known trace without minute 50 of the hoarder (slot 0 of GPU-A), and that minute: data
/// that arrives late.
fn known_trace_with_a_late_minute() -> (Vec<Sample>, Vec<Sample>) {
    let minute_50 = T0 + 50 * 60..T0 + 51 * 60;
    let (late, early): (Vec<Sample>, Vec<Sample>) = known_trace()
        .into_iter()
        .partition(|s| minute_50.contains(&s.timestamp) && s.instance.placement_start == Some(0));
    (early, late)
}

struct Ledger {
    _dir: tempfile::TempDir,
    writer: Writer,
    readers: Readers,
}

impl Ledger {
    fn open() -> Ledger {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.duckdb");
        let (conn, _) = store::open(&path).unwrap();
        let readers = Readers::new(&conn, Some(path)).unwrap();
        let (writer, _thread) = Writer::spawn(conn, 4_000_000, Arc::new(())).unwrap();
        Ledger {
            _dir: dir,
            writer,
            readers,
        }
    }

    async fn write(&self, samples: &[Sample], per_batch: usize) {
        for chunk in samples.chunks(per_batch) {
            let b = Batch::from_samples("n1", chunk);
            let r = self.writer.try_reserve(b.sample_count()).unwrap();
            self.writer.ingest(b, i64::MIN, r).await.unwrap();
        }
    }

    fn conn(&self) -> Connection {
        self.readers.connect().unwrap()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

macro_rules! assert_close {
    ($a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        assert!(close(a, b), "{} = {a}, expected {b}", stringify!($a));
    }};
}

fn settings() -> Settings {
    Settings {
        prices: gpuledger_ledger::analytics::prices::PriceBook::from_config(
            &[("H100-80GB".to_owned(), 3.6)].into_iter().collect(),
            &[],
            0.0,
            "USD".into(),
        )
        .unwrap(),
        ..Settings::default()
    }
}

fn row<'a>(s: &'a showback::Showback, key: &[&str]) -> &'a showback::Figures {
    &s.rows
        .iter()
        .find(|r| {
            r.key
                .iter()
                .map(|k| k.as_deref().unwrap_or(""))
                .eq(key.iter().copied())
        })
        .unwrap_or_else(|| panic!("no row {key:?} in {:?}", s.rows))
        .figures
}

#[tokio::test(flavor = "multi_thread")]
async fn known_trace_gives_exact_gpu_seconds_episodes_and_fragmentation() {
    let ledger = Ledger::open();
    let trace = known_trace();
    ledger.write(&trace, 3_000).await;
    let s = settings();
    let report = analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
        .await
        .unwrap();
    assert_eq!(report.gpu_hours, 4, "2 GPUs × 2 hours");
    let again = analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
        .await
        .unwrap();
    assert_eq!(again.gpu_hours, 0, "nothing is dirty once evaluated");
    let conn = ledger.conn();
    let seventh = 1.0 / 7.0;

    // Showback over the two hours (hour rollups only).
    let sb = showback::showback(&conn, T0, T0 + 7200, GroupBy::Tenant, None, i64::MIN, &s).unwrap();
    let a = row(&sb, &["team-a"]);
    assert_close!(a.allocated_gpu_seconds, (7200.0 + 1817.0) * seventh);
    assert_close!(a.used_gpu_seconds, 1.0 * seventh);
    assert_close!(a.idle_gpu_seconds, (9017.0 - 1.0) * seventh);
    // 3.6 per GPU-hour = 0.001 per GPU-second.
    assert_close!(a.cost, a.allocated_gpu_seconds * 0.001);
    let b = row(&sb, &["team-b"]);
    let b_measured = (0..5400).filter(|t| (T0 + t) % 10 != 0).count() as f64;
    assert_close!(
        b.allocated_gpu_seconds,
        7200.0 * seventh + 5383.0 * seventh + 5400.0
    );
    assert_close!(
        b.used_gpu_seconds,
        0.8 * 7200.0 * seventh + 0.5 * 5383.0 * seventh + 0.6 * b_measured
    );
    assert_close!(b.unmeasured_gpu_seconds, 5400.0 - b_measured);
    let c = row(&sb, &["team-c"]);
    assert_close!(c.allocated_gpu_seconds, 7200.0 * seventh);
    assert_close!(c.efficiency.unwrap(), 0.01);
    let t = &sb.totals;
    assert_close!(t.capacity_gpu_seconds, 2.0 * 7200.0);
    assert_close!(t.allocated_gpu_seconds, 4.0 * 7200.0 * seventh + 5400.0);
    assert_close!(t.unallocated_gpu_seconds, 3.0 * 7200.0 * seventh + 1800.0);
    assert_close!(t.coverage, 1.0);
    assert_eq!(t.gpus, 2);
    // Observed demand: five 1g.10gb allocations and one whole GPU (a 7g.80gb request). The
    // checkerboard's 3 free slices serve every 1g request and no 7g one: 3 × 1/6 stranded.
    assert_close!(t.stranded_gpu_seconds, 0.5 * seventh * 7200.0);

    // The same range from raw and minute pieces: a second later and earlier at both ends.
    let edges = showback::showback(
        &conn,
        T0 + 1,
        T0 + 7199,
        GroupBy::Tenant,
        None,
        i64::MIN,
        &s,
    )
    .unwrap();
    let c = row(&edges, &["team-c"]);
    assert_close!(c.allocated_gpu_seconds, 7198.0 * seventh);
    assert_close!(edges.totals.capacity_gpu_seconds, 2.0 * 7198.0);
    assert_close!(edges.totals.stranded_gpu_seconds, 0.5 * seventh * 7198.0);
    // Raw samples gone (raw_from after the edge) → a clear error naming the field.
    let e = showback::showback(&conn, T0 + 1, T0 + 7200, GroupBy::Tenant, None, T0 + 60, &s)
        .unwrap_err();
    assert!(
        e.to_string().starts_with("from is not on a whole minute"),
        "{e}"
    );

    // Per workload, and a tenant-scoped reader sees only its rows.
    let w = showback::showback(
        &conn,
        T0,
        T0 + 7200,
        GroupBy::Workload,
        Some("team-a"),
        i64::MIN,
        &s,
    )
    .unwrap();
    assert_eq!(w.rows.len(), 2);
    assert_close!(
        row(&w, &["team-a", "team-a/job-x"]).allocated_gpu_seconds,
        1817.0 * seventh
    );
    assert_eq!(
        w.totals.capacity_gpu_seconds, 0.0,
        "no fleet figures for a tenant"
    );
    let by_class =
        showback::showback(&conn, T0, T0 + 7200, GroupBy::SloClass, None, i64::MIN, &s).unwrap();
    assert_close!(
        row(&by_class, &["latency_critical"]).allocated_gpu_seconds,
        7200.0 * seventh
    );

    // Episodes: the hoarder (the blip does not break it), the idle latency-critical replica,
    // and team-a's job-x, which ended when the slice changed hands.
    let eps = analytics::episodes(&conn, EpisodeState::All, i64::MIN, i64::MAX, None, &s).unwrap();
    let mut found: Vec<(&str, i64, Option<i64>)> = eps
        .iter()
        .map(|e| (e.workload.as_deref().unwrap(), e.started_at, e.ended_at))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            ("team-a/job-x", T0, Some(T0 + 1817)),
            ("team-a/notebook-1", T0, None),
            ("team-c/infer-0", T0, None),
        ]
    );
    let hoarder = eps
        .iter()
        .find(|e| e.workload.as_deref() == Some("team-a/notebook-1"))
        .unwrap();
    assert_eq!(hoarder.detected_at, T0 + 1800);
    assert_eq!(hoarder.gpu_instance_id, Some(7));
    assert_eq!(hoarder.slo_class.as_deref(), Some("interactive"));
    assert_close!(hoarder.idle_gpu_seconds, (7200.0 - 1.0) * seventh);
    assert_close!(hoarder.mean_sm_active.unwrap(), 1.0 / 7200.0);
    assert_close!(hoarder.cost, hoarder.idle_gpu_seconds * 0.001);
    let open = analytics::episodes(
        &conn,
        EpisodeState::Open,
        i64::MIN,
        i64::MAX,
        Some("team-a"),
        &s,
    )
    .unwrap();
    assert_eq!(open.len(), 1);
    let closed =
        analytics::episodes(&conn, EpisodeState::Closed, T0 + 1817, i64::MAX, None, &s).unwrap();
    assert!(
        closed.is_empty(),
        "job-x's episode ended at T0+1817: outside [T0+1817, …)"
    );

    // Fragmentation at the last second: the checkerboard leaves slots 1, 3, 5, 7 and only 1g.
    let demand = analytics::demand_mix(&conn, &s, T0 + 7199).unwrap();
    let gpus = analytics::fragmentation::at(
        &conn,
        &analytics::facts::Dims::load(&conn).unwrap(),
        T0 + 7199,
        120,
        &demand,
        &mut |_, _| true,
    )
    .unwrap();
    assert_eq!(gpus.len(), 2);
    let a = gpus.iter().find(|g| g.gpu.gpu_uuid == "GPU-A").unwrap();
    assert_eq!(a.fragmentation.free_slots, [1, 3, 5, 7]);
    assert_eq!(a.fragmentation.largest_placeable_profile, Some("1g.10gb"));
    assert_close!(a.fragmentation.stranded_slices, 0.5);
    let b = gpus.iter().find(|g| g.gpu.gpu_uuid == "GPU-B").unwrap();
    assert_eq!(
        b.fragmentation.largest_placeable_profile,
        Some("whole"),
        "unheld by then"
    );

    // The metrics' view: the newest minute, per tenant; the open episodes.
    let current = analytics::current(&conn, &s).unwrap();
    assert_eq!(current.newest, Some(T0 + 7199));
    let team_c = current
        .tenants
        .iter()
        .find(|(k, _)| k.0 == "team-c")
        .unwrap();
    assert_close!(team_c.1.0, seventh);
    assert_eq!(current.episodes.len(), 2);
    assert_eq!(current.nodes.len(), 1);
    assert_close!(current.nodes[0].1.0, 2.0);
}

/// Late data is corrected: minute 50 of the hoarder arrives last. Until it does, the slice looks
/// released for a minute, which splits the idle run in two; once it arrives (idle), the episodes
/// are recomputed into one.
#[tokio::test(flavor = "multi_thread")]
async fn late_data_recomputes_episodes() {
    let ledger = Ledger::open();
    let (early, late) = known_trace_with_a_late_minute();
    ledger.write(&early, 5_000).await;
    let s = settings();
    analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
        .await
        .unwrap();
    let conn = ledger.conn();
    let hoarder = |conn: &Connection| -> Vec<(i64, i64, Option<i64>)> {
        analytics::episodes(
            conn,
            EpisodeState::All,
            i64::MIN,
            i64::MAX,
            Some("team-a"),
            &s,
        )
        .unwrap()
        .into_iter()
        .filter(|e| e.workload.as_deref() == Some("team-a/notebook-1"))
        .map(|e| (e.started_at, e.detected_at, e.ended_at))
        .collect()
    };
    assert_eq!(
        hoarder(&conn),
        [
            (T0, T0 + 1800, Some(T0 + 50 * 60)),
            (T0 + 51 * 60, T0 + 81 * 60, None)
        ]
    );
    ledger.write(&late, 5_000).await;
    let r = analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
        .await
        .unwrap();
    assert_eq!(r.gpu_hours, 1, "only GPU-A's first hour changed");
    assert_eq!(hoarder(&conn), [(T0, T0 + 1800, None)]);
    // And a restart finds nothing left to do: the state is in the ledger.
    let r = analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
        .await
        .unwrap();
    assert_eq!(r.gpu_hours, 0);
}

/// The demand mix reads whole UTC days from the day rollup and only the hours at either end from
/// the hour rollup: the allocations it counts are those the hour rollup alone gives, for ranges
/// that start and end anywhere.
#[tokio::test(flavor = "multi_thread")]
async fn observed_allocations_from_days_and_hours_equal_those_of_the_hours_alone() {
    use gpuledger_ledger::analytics::fragmentation::observed_allocations;
    use gpuledger_ledger::store::writer::{MinuteBatch, MinuteRow};
    use gpuledger_schema::wire::Series;
    use gpuledger_schema::{Attribution, Counters, SloClass};
    let ledger = Ledger::open();
    let mut rng = Lcg(7);
    let instances: Vec<_> = (0..6u32)
        .map(|k| traces::mig("GPU-M", k + 1, k))
        .chain([traces::whole("n1", "GPU-W")])
        .collect();
    let mut batch = MinuteBatch::default();
    for hour in 0..9 * 24 {
        for instance in &instances {
            if rng.below(3) != 0 {
                continue;
            }
            let attribution = match rng.below(4) {
                0 => Attribution::default(),
                h => traces::held("team", &format!("team/w{h}"), SloClass::Batch),
            };
            batch
                .entries
                .push(Series::describing(instance, &attribution));
            batch.rows.push(MinuteRow {
                entry: batch.entries.len() - 1,
                bucket: T0 + hour * 3600 + 60 * rng.below(60) as i64,
                mask: (1 << 60) - 1,
                counters: Counters {
                    sm_active: Some(0.5),
                    ..Counters::default()
                },
            });
        }
    }
    ledger.writer.ingest_minutes(batch).await.unwrap();
    let conn = ledger.conn();
    let hours_alone = |from: i64, to: i64| -> Vec<(String, Option<String>, i64)> {
        conn.prepare(
            "SELECT i.gpu_model, i.mig_profile, count(DISTINCT (r.instance_id, r.holder_id))
             FROM rollup_1h r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
             WHERE h.tenant IS NOT NULL AND r.bucket >= ? AND r.bucket < ?
             GROUP BY ALL",
        )
        .unwrap()
        .query_map([from, to], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    };
    let mut compared = 0;
    for k in 0..200 {
        let at = T0 + rng.below(9 * 86_400) as i64;
        let at = if k % 2 == 0 { at - at % 3600 } else { at };
        let from = at - rng.below(8 * 86_400) as i64;
        let to = at
            + if k % 3 == 0 {
                3600
            } else {
                rng.below(86_400) as i64
            };
        let mut got = observed_allocations(&conn, from, to).unwrap();
        let mut want = hours_alone(from, to);
        got.sort();
        want.sort();
        compared += usize::from(!want.is_empty());
        assert_eq!(got, want, "[{from}, {to})");
    }
    assert!(compared > 150, "most ranges hold allocations: {compared}");
}

/// A ledger written by a build before migrations 0008 and 0009 upgrades to the same answers: its
/// episodes have no stored totals (the pass reads them whole), and the hour left dirty before the
/// upgrade has no note but is found by 0009's one full comparison.
#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_from_before_the_notes_and_the_totals_upgrades_to_the_same_answers() {
    let (early, late) = known_trace_with_a_late_minute();
    let s = settings();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.duckdb");
    {
        let (conn, _) = store::open(&path).unwrap();
        let readers = Readers::new(&conn, Some(path.clone())).unwrap();
        let (writer, thread) = Writer::spawn(conn, 4_000_000, Arc::new(())).unwrap();
        let write = |part: &[Sample]| {
            let b = Batch::from_samples("n1", part);
            let r = writer.try_reserve(b.sample_count()).unwrap();
            writer.ingest(b, i64::MIN, r)
        };
        write(&early).await.unwrap();
        analytics::evaluate(&readers, &writer, &s, 100)
            .await
            .unwrap();
        // Late data, and the build stops before it evaluates again.
        write(&late).await.unwrap();
        drop((writer, readers));
        thread.join().unwrap();
    }
    // What schema version 7 had: no notes, no stored totals.
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE holder_owners;
             DROP TABLE energy_gpu_1m; DROP TABLE energy_gpu_1h; DROP TABLE energy_gpu_1d;
             DROP TABLE energy_1m; DROP TABLE energy_1h; DROP TABLE energy_1d;
             DROP TABLE ingest_energy_gpu; DROP TABLE ingest_energy; DROP TABLE energy_idle_watts;
             DROP TABLE keep_link_keys; DROP TABLE reclaim_keeps;
             ALTER TABLE webhook_outbox DROP COLUMN channel;
             DROP TABLE raw_compacted; DROP TABLE gpu_hours_changed; DROP SEQUENCE gpu_hours_changed_seq;
             ALTER TABLE hoarding_episodes DROP COLUMN base_through;
             ALTER TABLE hoarding_episodes DROP COLUMN base_held_seconds;
             ALTER TABLE hoarding_episodes DROP COLUMN base_sm_active_samples;
             ALTER TABLE hoarding_episodes DROP COLUMN base_sm_active_sum;
             ALTER TABLE hoarding_episodes DROP COLUMN base_last_second;
             DELETE FROM schema_version WHERE version >= 8;",
        )
        .unwrap();
    }
    let (conn, found) = store::open(&path).unwrap();
    assert_eq!(found, 7);
    let upgraded = Ledger {
        readers: Readers::new(&conn, Some(path.clone())).unwrap(),
        writer: Writer::spawn(conn, 4_000_000, Arc::new(())).unwrap().0,
        _dir: dir,
    };
    assert_eq!(
        notes(&upgraded.conn()).len(),
        1,
        "the hour the late data changed"
    );
    let r = analytics::evaluate(&upgraded.readers, &upgraded.writer, &s, 100)
        .await
        .unwrap();
    assert_eq!(r.gpu_hours, 1);
    let once = Ledger::open();
    once.write(&early, 5_000).await;
    once.write(&late, 5_000).await;
    analytics::evaluate(&once.readers, &once.writer, &s, 100)
        .await
        .unwrap();
    assert_eq!(
        evaluated_answers(&upgraded, &s),
        evaluated_answers(&once, &s)
    );
}

/// What evaluations stored in a ledger: every episode, and every GPU-hour's fragmentation.
fn evaluated_answers(l: &Ledger, s: &Settings) -> (String, Vec<(i64, String, i64, f64, f64)>) {
    let conn = l.conn();
    let episodes =
        analytics::episodes(&conn, EpisodeState::All, i64::MIN, i64::MAX, None, s).unwrap();
    let fragmentation = conn
        .prepare(
            "SELECT bucket, gpu_uuid, observed_seconds, free_slice_seconds,
                    stranded_slice_seconds FROM fragmentation_1h ORDER BY ALL",
        )
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    (
        serde_json::to_string_pretty(&episodes).unwrap(),
        fragmentation,
    )
}

fn notes(conn: &Connection) -> Vec<(i64, String)> {
    let mut stmt = conn
        .prepare("SELECT DISTINCT bucket, gpu_uuid FROM gpu_hours_changed ORDER BY ALL")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A pass looks only at the GPU-hours the writer noted as changed (migration 0009), and clears
/// the notes of the hours it stored; late data notes its hour again.
#[tokio::test(flavor = "multi_thread")]
async fn the_writer_notes_the_gpu_hours_it_changes_and_a_pass_clears_them() {
    let ledger = Ledger::open();
    let (early, late) = known_trace_with_a_late_minute();
    ledger.write(&early, 5_000).await;
    let gpus_hours = notes(&ledger.conn());
    assert_eq!(gpus_hours.len(), 4, "2 GPUs × 2 hours: {gpus_hours:?}");
    let s = settings();
    let r = analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
        .await
        .unwrap();
    assert_eq!(r.gpu_hours, 4);
    assert_eq!(notes(&ledger.conn()), []);
    ledger.write(&late, 5_000).await;
    let gpu_a = late[0].instance.gpu_uuid.clone();
    assert_eq!(notes(&ledger.conn()), [(T0, gpu_a)]);
    let r = analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
        .await
        .unwrap();
    assert_eq!(r.gpu_hours, 1);
    assert_eq!(notes(&ledger.conn()), []);
}

/// An evaluation's passes look at the notes up to the newest its first pass saw: hours that
/// change while it runs wait for the next evaluation, so one under a live fleet's ingest ends.
#[tokio::test(flavor = "multi_thread")]
async fn dirty_hours_are_those_noted_up_to_the_bound() {
    use gpuledger_ledger::analytics::fragmentation::{changed_through, dirty_hours};
    let ledger = Ledger::open();
    let (first_hour, second_hour): (Vec<Sample>, Vec<Sample>) = known_trace()
        .into_iter()
        .partition(|s| s.timestamp < T0 + 3600);
    let dirty = |until: i64| -> Vec<(i64, String)> {
        let rows = dirty_hours(&ledger.conn(), 1_000, until).unwrap();
        rows.into_iter().map(|d| (d.0, d.1.gpu_uuid)).collect()
    };
    ledger.write(&first_hour, 5_000).await;
    let until = changed_through(&ledger.conn()).unwrap().unwrap();
    let before = dirty(until);
    assert_eq!(before.len(), 2, "2 GPUs, their first hour: {before:?}");
    assert!(before.iter().all(|d| d.0 == T0), "{before:?}");
    ledger.write(&second_hour, 5_000).await;
    assert_eq!(
        dirty(until),
        before,
        "the second hour was noted after the bound"
    );
    let newest = changed_through(&ledger.conn()).unwrap().unwrap();
    let after = dirty(newest);
    assert_eq!(
        after.len(),
        4,
        "and is dirty up to the newest note: {after:?}"
    );
    assert!(after.iter().filter(|d| d.0 == T0 + 3600).count() == 2);
}

/// A pass clears the notes its snapshot saw and keeps those written after it: the hour they name
/// changed again, after the counts the pass stored.
#[test]
fn storing_an_hour_keeps_the_notes_written_after_the_snapshot() {
    use gpuledger_ledger::analytics::facts::GpuKey;
    use gpuledger_ledger::analytics::fragmentation::{self, GpuHour, StoredHour};
    let dir = tempfile::tempdir().unwrap();
    let (mut conn, _) = store::open(&dir.path().join("ledger.duckdb")).unwrap();
    conn.execute_batch(&format!(
        "INSERT INTO gpu_hours_changed VALUES
             (1, {T0}, 'n1', 'GPU-A', 'H100'), (2, {T0}, 'n1', 'GPU-A', 'H100'),
             (3, {T0}, 'n1', 'GPU-B', 'H100'), (7, {T0}, 'n1', 'GPU-A', 'H100')"
    ))
    .unwrap();
    let hour = StoredHour {
        hour: GpuHour {
            bucket: T0,
            gpu: GpuKey {
                node: "n1".into(),
                gpu_uuid: "GPU-A".into(),
                gpu_model: "H100".into(),
            },
            observed_seconds: 60,
            free_slice_seconds: 0.0,
            stranded_slice_seconds: 0.0,
        },
        observed_seconds: 60,
        instance_seconds: 60,
    };
    let tx = conn.transaction().unwrap();
    fragmentation::store(&tx, &[hour], Some(5)).unwrap();
    tx.commit().unwrap();
    let left: Vec<(i64, String)> = conn
        .prepare("SELECT seq, gpu_uuid FROM gpu_hours_changed ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(left, [(3, "GPU-B".to_owned()), (7, "GPU-A".to_owned())]);
}

/// Idle and busy spells of 3 to 53 minutes on 2 GPUs × 7 slices, each spell under a holder drawn
/// again (or none), some not reported at all, a few seconds unmeasured; in time order.
fn spells_trace(seed: u64, t0: i64, seconds: i64) -> Vec<Sample> {
    let mut rng = Lcg(seed);
    let mut out = Vec::new();
    for g in 0..2 {
        let gpu = format!("GPU-{g}");
        for k in 0..7u32 {
            let instance = traces::mig(&gpu, k + 1, k);
            let mut t = t0;
            while t < t0 + seconds {
                let span = 60 * (3 + rng.below(50) as i64) + rng.below(60) as i64;
                let holder = match rng.below(4) {
                    0 => gpuledger_schema::Attribution::default(),
                    h => traces::held(
                        "team",
                        &format!("team/w{h}"),
                        gpuledger_schema::SloClass::Batch,
                    ),
                };
                let idle = rng.below(2) == 0;
                let reported = rng.below(8) != 0;
                for tt in t..(t + span).min(t0 + seconds) {
                    let sm = match (rng.below(40), idle) {
                        (0, _) => None,
                        (_, true) => Some(rng.below(30) as f64 / 1000.0),
                        (_, false) => Some(0.3 + rng.below(700) as f64 / 1000.0),
                    };
                    if reported {
                        out.push(traces::sample(tt, &instance, holder.clone(), sm));
                    }
                }
                t += span;
            }
        }
    }
    out.sort_by_key(|s| s.timestamp);
    out
}

/// A pass continues long episodes from the totals stored with them (migration 0008) instead of
/// reading their whole history: evaluating every 10 minutes as the data arrives, and once more
/// after half an hour of one slice comes late, stores exactly the episodes that one evaluation
/// of all of it stores.
#[tokio::test(flavor = "multi_thread")]
async fn evaluating_as_data_arrives_stores_what_one_evaluation_of_all_of_it_stores() {
    let s = Settings {
        window: std::time::Duration::from_secs(20 * 60),
        ..settings()
    };
    for seed in 1..=2u64 {
        let trace = spells_trace(seed, T0, 5 * 3600);
        let late_range = T0 + 200 * 60..T0 + 230 * 60;
        let (late, live): (Vec<Sample>, Vec<Sample>) = trace.iter().cloned().partition(|x| {
            late_range.contains(&x.timestamp)
                && x.instance.gpu_uuid == "GPU-0"
                && x.instance.gpu_instance_id == Some(2)
        });
        let ledger = Ledger::open();
        for chunk in live.chunk_by(|a, b| a.timestamp / 600 == b.timestamp / 600) {
            ledger.write(chunk, 50_000).await;
            analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
                .await
                .unwrap();
        }
        let continued: i64 = ledger
            .conn()
            .query_row(
                "SELECT count(*) FROM hoarding_episodes WHERE base_through IS NOT NULL
                   AND started_at < base_through",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(
            continued > 0,
            "seed {seed}: some episodes reach past their base point"
        );
        ledger.write(&late, 50_000).await;
        analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
            .await
            .unwrap();
        let once = Ledger::open();
        once.write(&trace, 50_000).await;
        analytics::evaluate(&once.readers, &once.writer, &s, 100)
            .await
            .unwrap();
        let stored = |l: &Ledger| {
            let all =
                analytics::episodes(&l.conn(), EpisodeState::All, i64::MIN, i64::MAX, None, &s)
                    .unwrap();
            (all.len(), serde_json::to_string_pretty(&all).unwrap())
        };
        let (n, expected) = stored(&once);
        assert!(n >= 10, "seed {seed}: the trace has episodes ({n})");
        assert_eq!(stored(&ledger).1, expected, "seed {seed}");
    }
}

/// A pass reads its GPUs' facts in snapshots of `snapshot_instances` instances, after three
/// short ones (what is dirty, the demand mix, the dimensions): one GPU per snapshot, or all of them in one, an evaluation every
/// 10 minutes of data stores the same episodes and fragmentation, and says how many snapshots it
/// read in.
#[tokio::test(flavor = "multi_thread")]
async fn a_pass_read_in_many_snapshots_stores_what_one_snapshot_stores() {
    let trace = spells_trace(3, T0, 3 * 3600);
    let base = Settings {
        window: std::time::Duration::from_secs(20 * 60),
        ..settings()
    };
    let mut answers = Vec::new();
    // 7 instances a GPU: at most 7 per snapshot is one GPU each; usize::MAX is all of them.
    // Three snapshots before the facts: the dirty hours, the demand mix, the dimensions.
    for (per_snapshot, snapshots_a_pass) in [(7, 5), (1, 5), (usize::MAX, 4)] {
        let s = Settings {
            snapshot_instances: per_snapshot,
            ..base.clone()
        };
        let ledger = Ledger::open();
        let mut evaluations = 0;
        for chunk in trace.chunk_by(|a, b| a.timestamp / 600 == b.timestamp / 600) {
            ledger.write(chunk, 50_000).await;
            let r = analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
                .await
                .unwrap();
            // Both GPUs change in every 10 minutes: one pass, over both.
            assert_eq!(r.gpus, 2, "{per_snapshot} per snapshot: {r:?}");
            assert_eq!(
                r.snapshots, snapshots_a_pass,
                "{per_snapshot} per snapshot: {r:?}"
            );
            evaluations += 1;
        }
        assert_eq!(evaluations, 18);
        let (episodes, fragmentation) = evaluated_answers(&ledger, &s);
        assert!(
            fragmentation.len() >= 6 && episodes.matches("started_at").count() >= 4,
            "the trace has GPU-hours and episodes: {fragmentation:?} {episodes}"
        );
        answers.push((episodes, fragmentation));
    }
    assert_eq!(answers[0], answers[2], "a GPU per snapshot");
    assert_eq!(
        answers[1], answers[2],
        "a GPU per snapshot, the limit under one GPU"
    );
}

/// Showback computed from raw samples only, as the definition says.
fn from_raw(conn: &Connection, from: i64, to: i64) -> (Vec<(String, f64, f64)>, f64) {
    let mut stmt = conn
        .prepare(
            "SELECT h.tenant, sum(i.gpu_equivalents), sum(coalesce(s.sm_active, 0) * i.gpu_equivalents)
             FROM samples_raw s JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
             WHERE s.ts >= ? AND s.ts < ? AND h.tenant IS NOT NULL GROUP BY ALL ORDER BY 1",
        )
        .unwrap();
    let rows = stmt
        .query_map([from, to], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let capacity: i64 = conn
        .query_row(
            "SELECT count(*) FROM (SELECT DISTINCT s.ts, i.gpu_uuid FROM samples_raw s
             JOIN instances i USING (instance_id) WHERE s.ts >= ? AND s.ts < ?)",
            [from, to],
            |r| r.get(0),
        )
        .unwrap();
    (rows, capacity as f64)
}

#[tokio::test(flavor = "multi_thread")]
async fn invariants_hold_on_random_fleets_and_ranges() {
    for seed in 1..=6u64 {
        let ledger = Ledger::open();
        let trace = traces::random_trace(seed, T0, 3 * 3600);
        // Shuffled batch sizes, and a third of it sent twice.
        let mut rng = Lcg(seed * 31);
        let mut i = 0;
        while i < trace.len() {
            let n = 1 + rng.below(4000) as usize;
            ledger.write(&trace[i..(i + n).min(trace.len())], n).await;
            i += n;
        }
        ledger.write(&trace[..trace.len() / 3], 7_000).await;
        let s = settings();
        analytics::evaluate(&ledger.readers, &ledger.writer, &s, 100)
            .await
            .unwrap();
        let conn = ledger.conn();
        let first = trace.iter().map(|s| s.timestamp).min().unwrap();
        let last = trace.iter().map(|s| s.timestamp).max().unwrap() + 1;
        // Two whole days around the trace (it crosses midnight at T0): the day rollup, for the
        // groupings that read it, equals raw.
        for by in [GroupBy::Workload, GroupBy::Node] {
            let sb =
                showback::showback(&conn, T0 - 86400, T0 + 86400, by, None, i64::MIN, &s).unwrap();
            let total: f64 = sb
                .rows
                .iter()
                .map(|r| r.figures.allocated_gpu_seconds)
                .sum();
            let used: f64 = sb.rows.iter().map(|r| r.figures.used_gpu_seconds).sum();
            let (raw_rows, raw_capacity) = from_raw(&conn, T0 - 86400, T0 + 86400);
            assert!(
                close(total, raw_rows.iter().map(|r| r.1).sum()),
                "seed {seed}: {by:?} days allocated"
            );
            assert!(
                close(used, raw_rows.iter().map(|r| r.2).sum()),
                "seed {seed}: {by:?} days used"
            );
            assert!(
                close(sb.totals.capacity_gpu_seconds, raw_capacity),
                "seed {seed}: days capacity"
            );
        }
        for case in 0..12 {
            // Random ranges, some aligned to hours or minutes, some not.
            let mut a = first - 300 + rng.below((last - first + 600) as u64) as i64;
            let mut b = first - 300 + rng.below((last - first + 600) as u64) as i64;
            if a > b {
                std::mem::swap(&mut a, &mut b);
            }
            match case % 3 {
                0 => (a, b) = (a - a.rem_euclid(3600), b - b.rem_euclid(3600) + 3600),
                1 => (a, b) = (a - a.rem_euclid(60), b - b.rem_euclid(60) + 60),
                _ => b += 1,
            }
            let sb = showback::showback(&conn, a, b, GroupBy::Tenant, None, i64::MIN, &s).unwrap();
            let t = &sb.totals;
            let ctx = format!("seed {seed}, range [{a}, {b})");
            assert!(
                close(
                    t.allocated_gpu_seconds + t.unallocated_gpu_seconds,
                    t.capacity_gpu_seconds
                ),
                "{ctx}: allocated + unallocated != capacity"
            );
            assert!(
                t.unallocated_gpu_seconds >= -1e-6,
                "{ctx}: allocated > capacity"
            );
            assert!(
                t.stranded_gpu_seconds <= t.unallocated_gpu_seconds + 1e-6,
                "{ctx}: stranded > free"
            );
            for r in &sb.rows {
                assert!(
                    r.figures.used_gpu_seconds <= r.figures.allocated_gpu_seconds + 1e-6,
                    "{ctx}: used > allocated for {:?}",
                    r.key
                );
            }
            let (raw_rows, raw_capacity) = from_raw(&conn, a, b);
            assert!(
                close(t.capacity_gpu_seconds, raw_capacity),
                "{ctx}: capacity {} != raw {raw_capacity}",
                t.capacity_gpu_seconds
            );
            assert_eq!(sb.rows.len(), raw_rows.len(), "{ctx}");
            for (r, (tenant, allocated, used)) in sb.rows.iter().zip(&raw_rows) {
                assert_eq!(r.key[0].as_deref(), Some(tenant.as_str()), "{ctx}");
                assert!(
                    close(r.figures.allocated_gpu_seconds, *allocated),
                    "{ctx}: {tenant} allocated"
                );
                assert!(
                    close(r.figures.used_gpu_seconds, *used),
                    "{ctx}: {tenant} used"
                );
            }
            // Stranded from the stored hours = stranded computed second by second, under the
            // demand mix the (single) evaluation pass used: as of the end of the last hour.
            if case % 3 == 0 {
                let pass_end = (last - 1) - (last - 1).rem_euclid(3600) + 3600;
                let demand = analytics::demand_mix(&conn, &s, pass_end).unwrap();
                let direct: f64 = analytics::fragmentation::over_range(
                    &conn,
                    &analytics::facts::Dims::load(&conn).unwrap(),
                    a,
                    b,
                    &demand,
                )
                .unwrap()
                .iter()
                .map(|h| h.stranded_slice_seconds / 7.0)
                .sum();
                assert!(
                    close(t.stranded_gpu_seconds, direct),
                    "{ctx}: stranded {} != {direct}",
                    t.stranded_gpu_seconds
                );
            }
        }
        // Stored GPU-hours agree with the capacity rollup.
        let mismatched: i64 = conn
            .query_row(
                "SELECT count(*) FROM rollup_gpu_1h g JOIN fragmentation_1h f USING (bucket, node, gpu_uuid, gpu_model)
                 WHERE f.observed_seconds <> g.observed_seconds",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(mismatched, 0);
    }
}

/// The rollups of a ledger, described by instance and holder rather than by id (two ledgers
/// number their dimensions in the order they met them), floats to 1e-6.
fn rollup_contents(conn: &Connection) -> Vec<(String, Vec<String>)> {
    let who = "i.gpu_uuid, i.gpu_instance_id, h.tenant, h.workload, h.slo_class";
    let queries = [
        (
            "rollup_1m",
            format!(
                "SELECT r.bucket, {who}, r.seconds_mask, r.samples, r.sm_active_samples,
                        round(r.sm_active_sum, 6), r.sm_occupancy_samples, round(r.tensor_active_sum, 6),
                        r.fb_used_samples, r.fb_used_bytes_sum, r.fb_total_bytes_max,
                        r.nvlink_tx_bytes_sum, r.nvlink_rx_bytes_sum
                 FROM rollup_1m r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)"
            ),
        ),
        (
            "rollup_1h",
            format!(
                "SELECT r.bucket, {who}, r.samples, round(r.sm_active_sum, 6), r.fb_used_bytes_sum,
                        r.nvlink_tx_bytes_sum
                 FROM rollup_1h r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)"
            ),
        ),
        (
            "rollup_alloc_1d",
            format!(
                "SELECT r.bucket, {who}, r.samples, r.sm_active_samples, round(r.sm_active_sum, 6)
                 FROM rollup_alloc_1d r JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)"
            ),
        ),
        (
            "rollup_tenant_1h",
            "SELECT bucket, tenant, slo_class, gpu_model, samples, round(gpu_seconds, 6),
                    round(sm_measured_gpu_seconds, 6), round(used_gpu_seconds, 6)
             FROM rollup_tenant_1h"
                .to_owned(),
        ),
        (
            "rollup_gpu_1h",
            "SELECT bucket, node, gpu_uuid, gpu_model, observed_seconds, instance_seconds FROM rollup_gpu_1h"
                .to_owned(),
        ),
    ];
    queries
        .into_iter()
        .map(|(table, sql)| {
            let mut stmt = conn.prepare(&format!("{sql} ORDER BY ALL")).unwrap();
            let rows = stmt
                .query_map([], |r| {
                    let n = r.as_ref().column_count();
                    Ok((0..n)
                        .map(|k| format!("{:?}", r.get::<_, duckdb::types::Value>(k).unwrap()))
                        .collect::<Vec<_>>()
                        .join("|"))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            (table.to_owned(), rows)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn minute_rows_store_exactly_what_their_seconds_would() {
    use gpuledger_exporter::source::sim::{Fleet, Simulator};
    use gpuledger_ledger::store::writer::{MinuteBatch, MinuteRow};
    use gpuledger_schema::wire::Series;

    // Two hours of the simulator's minute view for one mixed node: leases start and end
    // mid-minute, slices change hands.
    let sim = Simulator::new(Fleet::builtin());
    let (from, to) = (T0 + 7 * 60 + 13, T0 + 2 * 3600);
    let mut readings = Vec::new();
    sim.minutes(Some("gpu-h100-02"), from, to, |m| readings.push(m));
    let mut batch = MinuteBatch::default();
    let mut seconds = Vec::new();
    for m in &readings {
        batch
            .entries
            .push(Series::describing(&m.instance, &m.attribution));
        batch.rows.push(MinuteRow {
            entry: batch.entries.len() - 1,
            bucket: m.bucket,
            mask: m.mask,
            counters: m.counters,
        });
        for s in 0..60 {
            if m.mask & (1 << s) != 0 {
                seconds.push(Sample {
                    timestamp: m.bucket + s,
                    instance: m.instance.clone(),
                    attribution: m.attribution.clone(),
                    counters: m.counters,
                });
            }
        }
    }
    assert_eq!(
        batch.rows[0].bucket,
        T0 + 8 * 60,
        "whole minutes from `from`"
    );

    let by_minute = Ledger::open();
    let outcome = by_minute
        .writer
        .ingest_minutes(batch.clone())
        .await
        .unwrap();
    assert_eq!(outcome.stored_rows, batch.rows.len());
    assert_eq!(outcome.stored_seconds, seconds.len() as u64);
    assert!(outcome.overlapping.is_empty());
    let by_second = Ledger::open();
    by_second.write(&seconds, 5_000).await;
    let contents = rollup_contents(&by_second.conn());
    assert!(
        contents.iter().all(|(_, rows)| rows.len() >= 2),
        "every rollup has rows to compare"
    );
    assert_eq!(
        rollup_contents(&by_minute.conn()),
        rollup_contents(&by_second.conn()),
        "minute rows and their seconds leave the same rollups"
    );
    let raw: i64 = by_minute
        .conn()
        .query_row("SELECT count(*) FROM samples_raw", [], |r| r.get(0))
        .unwrap();
    assert_eq!(raw, 0, "minute rows have no raw samples");

    // Sent again: nothing is stored twice, and every row is reported as overlapping.
    let again = by_minute
        .writer
        .ingest_minutes(batch.clone())
        .await
        .unwrap();
    assert_eq!(again.stored_rows, 0);
    assert_eq!(again.overlapping, (0..batch.rows.len()).collect::<Vec<_>>());

    // One second already held makes its row (only) overlap; the seconds path then fills it.
    let partial = Ledger::open();
    let first_row_seconds: Vec<Sample> = seconds
        .iter()
        .filter(|s| {
            s.instance == readings[0].instance
                && s.attribution == readings[0].attribution
                && s.timestamp / 60 * 60 == readings[0].bucket
        })
        .cloned()
        .collect();
    partial.write(&first_row_seconds[..1], 10).await;
    let o = partial.writer.ingest_minutes(batch.clone()).await.unwrap();
    assert_eq!(o.overlapping, vec![0]);
    partial.write(&first_row_seconds, 10).await;
    assert_eq!(
        rollup_contents(&partial.conn()),
        rollup_contents(&by_second.conn()),
        "an overlapping minute sent as seconds completes the ledger exactly"
    );
}
