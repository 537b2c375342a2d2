//! Shipping survives an aggregator outage and an exporter restart: every batch arrives, and a
//! batch seen twice is always the same batch id.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use crate::common::fake_aggregator::{FakeAggregator, Mode};
use crate::common::{Exporter, eventually, token_file};
use gpuledger_exporter::source::sim::{Fleet, Simulator};
use gpuledger_schema::wire::Format;

const NODE: &str = "gpu-h100-01";

/// The simulated benchmark node shipping every second to `url`.
fn shipping_args(url: &str, token: &std::path::Path, spool: &std::path::Path) -> Vec<String> {
    let args = [
        "--source",
        "sim",
        "--node",
        NODE,
        "--aggregator",
        url,
        "--ship-interval",
        "1s",
        "--token-file",
    ];
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.push(token.display().to_string());
    args.push("--spool-dir".into());
    args.push(spool.display().to_string());
    args
}

/// An exporter shipping to `fake`, once `fake` has three of its deliveries.
async fn shipping_until_three_batches(
    fake: &FakeAggregator,
    token: &std::path::Path,
    spool: &std::path::Path,
) -> Exporter {
    let owned = shipping_args(&fake.url(), token, spool);
    let args: Vec<&str> = owned.iter().map(String::as_str).collect();
    let exporter = Exporter::start(&args).await;
    eventually("three batches", Duration::from_secs(30), async || {
        (fake.deliveries().len() >= 3).then_some(())
    })
    .await;
    exporter
}

fn spooled_ids(dir: &std::path::Path) -> HashSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".batch")
                .map(|stem| stem.splitn(3, '-').nth(2).unwrap().to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn outage_and_restart_lose_nothing_and_duplicate_only_by_batch_id() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "node-token");
    let spool = dir.path().join("spool");
    let mut fake = FakeAggregator::start(0, "node-token").await;
    let url = fake.url();
    let owned = shipping_args(&url, &token, &spool);
    let args: Vec<&str> = owned.iter().map(String::as_str).collect();

    let exporter = Exporter::start(&args).await;
    eventually("two batches", Duration::from_secs(20), async || {
        (fake.deliveries().len() >= 2).then_some(())
    })
    .await;

    // The acknowledgement gets lost: the batch is stored but the exporter must send it again.
    fake.set_mode(Mode::AckLost);
    eventually("a re-sent batch", Duration::from_secs(20), async || {
        fake.deliveries().iter().any(|d| d.duplicate).then_some(())
    })
    .await;

    // The aggregator answers 503, then goes away entirely.
    fake.set_mode(Mode::Unavailable);
    eventually("refused sends", Duration::from_secs(20), async || {
        (fake.refused() >= 2).then_some(())
    })
    .await;
    fake.stop().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        exporter
            .value("gpuledger_exporter_batches_spooled_total")
            .await
            .unwrap()
            >= 1.0
    );

    // The exporter restarts while the aggregator is away.
    assert!(exporter.terminate().success());
    let waiting = spooled_ids(&spool);
    assert!(
        !waiting.is_empty(),
        "batches wait in the spool across the restart"
    );
    // It comes back sending JSON: the spool's MessagePack bodies still go as MessagePack.
    let mut json_args = args.clone();
    json_args.extend(["--wire-format", "json"]);
    let exporter = Exporter::start(&json_args).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    fake.restart().await;
    fake.set_mode(Mode::Accept);
    eventually("an empty spool", Duration::from_secs(60), async || {
        (exporter.value("gpuledger_exporter_spool_batches").await == Some(0.0)
            && exporter
                .value("gpuledger_exporter_batches_shipped_total")
                .await
                >= Some(2.0))
        .then_some(())
    })
    .await;
    assert!(exporter.terminate().success());

    let deliveries = fake.deliveries();
    let delivered: HashSet<String> = deliveries.iter().map(|d| d.batch_id.to_string()).collect();
    assert!(
        waiting.is_subset(&delivered),
        "every spooled batch arrived after the restart"
    );
    let format_of = |id: &String| {
        let d = deliveries.iter().find(|d| &d.batch_id.to_string() == id);
        d.map(|d| d.format)
    };
    assert!(
        waiting
            .iter()
            .all(|id| format_of(id) == Some(Format::MessagePack)),
        "a batch spooled as MessagePack is sent as MessagePack"
    );
    assert!(
        delivered
            .iter()
            .any(|id| !waiting.contains(id) && format_of(id) == Some(Format::Json)),
        "after the restart new batches are JSON"
    );
    assert!(
        spooled_ids(&spool).is_empty(),
        "a clean shutdown with the aggregator up leaves nothing spooled"
    );

    // Each (instance, second) is stored under exactly one batch id; repeats are whole-batch re-sends.
    let mut owner: HashMap<(String, Option<u32>, i64), uuid::Uuid> = HashMap::new();
    let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
    let sim = Simulator::new(Fleet::builtin());
    let mut first_copy: HashMap<uuid::Uuid, usize> = HashMap::new();
    for d in &deliveries {
        assert_eq!(d.node, NODE);
        if let Some(&n) = first_copy.get(&d.batch_id) {
            assert!(d.duplicate);
            assert_eq!(n, d.samples.len(), "a re-sent batch is the same batch");
            continue;
        }
        first_copy.insert(d.batch_id, d.samples.len());
        for s in &d.samples {
            let key = (
                s.instance.gpu_uuid.clone(),
                s.instance.gpu_instance_id,
                s.timestamp,
            );
            if let Some(other) = owner.insert(key.clone(), d.batch_id) {
                panic!(
                    "{key:?} arrived in two different batches: {other} and {}",
                    d.batch_id
                );
            }
            *per_second.entry(s.timestamp).or_default() += 1;
        }
    }
    // Every second that was sampled arrived whole (56 instances), with the simulator's values.
    assert!(
        per_second.len() >= 8,
        "{} seconds arrived",
        per_second.len()
    );
    for (&t, &n) in &per_second {
        assert_eq!(n, 56, "second {t} arrived with {n} of 56 instances");
    }
    let (&t, _) = per_second.iter().nth(per_second.len() / 2).unwrap();
    let expected = sim.second(Some(NODE), t);
    let got: Vec<_> = deliveries
        .iter()
        .flat_map(|d| &d.samples)
        .filter(|s| s.timestamp == t)
        .collect();
    for r in &expected.readings {
        let s = got
            .iter()
            .find(|s| s.instance == r.instance)
            .expect("every instance of the second");
        assert_eq!((&s.attribution, &s.counters), (&r.attribution, &r.counters));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_token_keeps_batches_spooled_and_counts_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "wrong");
    let spool = dir.path().join("spool");
    let fake = FakeAggregator::start(0, "right").await;
    let url = fake.url();
    let owned = shipping_args(&url, &token, &spool);
    let exporter = Exporter::start(&owned.iter().map(String::as_str).collect::<Vec<_>>()).await;
    eventually(
        "an unauthorized failure",
        Duration::from_secs(20),
        async || {
            let text = exporter.metrics("text/plain").await;
            text.contains("gpuledger_exporter_ship_failures_total{reason=\"unauthorized\"}")
                .then_some(())
        },
    )
    .await;
    assert!(fake.deliveries().is_empty());
    assert!(
        exporter
            .value("gpuledger_exporter_spool_batches")
            .await
            .unwrap()
            >= 1.0
    );
}

/// Regression: a 408 (the aggregator timed out reading a body on a slow link) counted as "the
/// aggregator will never accept this batch", so the exporter set a good batch aside in
/// `rejected/`. It is retried like a 503.
#[tokio::test(flavor = "multi_thread")]
async fn a_408_is_retried_not_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "right");
    let spool = dir.path().join("spool");
    let fake = FakeAggregator::start(0, "right").await;
    fake.set_mode(Mode::Timeout);
    let url = fake.url();
    let owned = shipping_args(&url, &token, &spool);
    let exporter = Exporter::start(&owned.iter().map(String::as_str).collect::<Vec<_>>()).await;
    eventually("a timed-out send", Duration::from_secs(20), async || {
        let text = exporter.metrics("text/plain").await;
        text.contains("gpuledger_exporter_ship_failures_total{reason=\"timeout\"}")
            .then_some(())
    })
    .await;
    let rejected = spool.join("rejected");
    let set_aside = std::fs::read_dir(&rejected).map_or(0, |d| d.count());
    assert_eq!(set_aside, 0, "a timed-out batch was set aside");
    fake.set_mode(Mode::Accept);
    eventually("the retried batches", Duration::from_secs(30), async || {
        (!fake.deliveries().is_empty()).then_some(())
    })
    .await;
}

/// Fake: an aggregator older than MessagePack bodies (it answers them 400, naming the body). The
/// exporter sends MessagePack by default; once refused it re-sends that batch, and all after it,
/// as JSON: nothing is set aside.
#[tokio::test(flavor = "multi_thread")]
async fn an_aggregator_that_reads_only_json_gets_json_and_loses_nothing() {
    json_fallback(Mode::JsonOnly).await;
}

/// Fake: a receiver that answers a MessagePack `Content-Type` 415; the exporter falls back to
/// JSON the same way.
#[tokio::test(flavor = "multi_thread")]
async fn a_receiver_that_refuses_the_msgpack_media_type_gets_json_and_loses_nothing() {
    json_fallback(Mode::JsonOnly415).await;
}

/// Regression: one damaged MessagePack body in the spool (gzip intact, MessagePack cut short)
/// drew a 400 naming `body`, which turned the exporter to JSON until it restarted. The exporter
/// now reads the refused body back: it does not decode, so it is rejected, and every other batch
/// still goes as MessagePack.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_body_is_rejected_and_the_exporter_stays_on_messagepack() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "node-token");
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let damaged = uuid::Uuid::now_v7();
    let mut body = Vec::new();
    {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(&mut body, flate2::Compression::fast());
        gz.write_all(&[0x85, 0xa1, b'v', 0x01, 0xa8]).unwrap();
        gz.finish().unwrap();
    }
    std::fs::write(spool.join(format!("{:020}-5-{damaged}.batch", 1)), &body).unwrap();
    let fake = FakeAggregator::start(0, "node-token").await;
    let exporter = shipping_until_three_batches(&fake, &token, &spool).await;
    let fallback = exporter
        .value("gpuledger_exporter_wire_json_fallback")
        .await;
    let dropped = exporter
        .value("gpuledger_exporter_batches_dropped_total{reason=\"rejected\"}")
        .await;
    assert!(exporter.terminate().success());
    assert_eq!(fallback, Some(0.0));
    assert_eq!(dropped, Some(1.0));
    let deliveries = fake.deliveries();
    assert!(
        deliveries.iter().all(|d| d.format == Format::MessagePack),
        "{:?}",
        deliveries.iter().map(|d| d.format).collect::<Vec<_>>()
    );
    assert!(deliveries.iter().all(|d| d.batch_id != damaged));
    let set_aside: Vec<String> = std::fs::read_dir(spool.join("rejected"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(set_aside.len(), 1, "{set_aside:?}");
    assert!(set_aside[0].contains(&damaged.to_string()), "{set_aside:?}");
}

/// Fake: an aggregator that reads JSON only, upgraded while the exporter runs. After
/// `--msgpack-retry` the exporter tries MessagePack again, and keeps it once it is read.
#[tokio::test(flavor = "multi_thread")]
async fn messagepack_is_tried_again_after_a_fallback_and_kept_once_read() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "node-token");
    let spool = dir.path().join("spool");
    let fake = FakeAggregator::start(0, "node-token").await;
    fake.set_mode(Mode::JsonOnly);
    let mut owned = shipping_args(&fake.url(), &token, &spool);
    owned.extend(["--msgpack-retry".to_owned(), "6s".to_owned()]);
    let args: Vec<&str> = owned.iter().map(String::as_str).collect();
    let exporter = Exporter::start(&args).await;
    eventually("a JSON delivery", Duration::from_secs(30), async || {
        (!fake.deliveries().is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        exporter
            .value("gpuledger_exporter_wire_json_fallback")
            .await,
        Some(1.0)
    );
    fake.set_mode(Mode::Accept);
    eventually(
        "a MessagePack delivery",
        Duration::from_secs(30),
        async || {
            fake.deliveries()
                .iter()
                .any(|d| d.format == Format::MessagePack)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        exporter
            .value("gpuledger_exporter_wire_json_fallback")
            .await,
        Some(0.0)
    );
    assert!(exporter.terminate().success());
    let deliveries = fake.deliveries();
    let first_msgpack = deliveries
        .iter()
        .position(|d| d.format == Format::MessagePack)
        .unwrap();
    assert!(
        deliveries[first_msgpack..]
            .iter()
            .all(|d| d.format == Format::MessagePack),
        "back to JSON after MessagePack was read"
    );
    // Nothing lost across both switches.
    assert_every_second_arrived(&deliveries);
}

/// The deliveries cover every second from their first to their last.
fn assert_every_second_arrived(deliveries: &[common::fake_aggregator::Delivery]) {
    let seconds: std::collections::BTreeSet<i64> = deliveries
        .iter()
        .flat_map(|d| d.samples.iter().map(|s| s.timestamp))
        .collect();
    let (first, last) = (*seconds.first().unwrap(), *seconds.last().unwrap());
    assert_eq!(
        seconds.len() as i64,
        last - first + 1,
        "a gap in {seconds:?}"
    );
}

/// The exporter against a fake in `mode` (one that refuses MessagePack bodies).
async fn json_fallback(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), "node-token");
    let spool = dir.path().join("spool");
    let fake = FakeAggregator::start(0, "node-token").await;
    fake.set_mode(mode);
    let exporter = shipping_until_three_batches(&fake, &token, &spool).await;
    assert!(exporter.terminate().success());
    let deliveries = fake.deliveries();
    // Exactly one MessagePack body was refused, and everything stored came as JSON (the format
    // recorded is the one the exporter sent).
    let refused = fake.refused_msgpack();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(deliveries.iter().all(|d| d.format == Format::Json));
    // The refused batch arrived as JSON under its own id, first: nothing was re-sealed under a
    // new id, and the deliveries cover every sealed second from the start.
    assert_eq!(deliveries[0].batch_id, refused[0]);
    assert_every_second_arrived(&deliveries);
    let rejected = spool.join("rejected");
    assert!(
        !rejected.exists() || std::fs::read_dir(&rejected).unwrap().next().is_none(),
        "a batch was set aside"
    );
}
