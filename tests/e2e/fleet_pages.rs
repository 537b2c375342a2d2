//! The fleet's answers at scale (issue 48, finding 3: with 60,000 instances `/fleet` was 177.5 MB
//! and `/api/v1/fragmentation` 21.7 MB). Totals cover every GPU a filter keeps; the GPUs, their
//! nodes and their advice come a page at a time, each page naming the next. The figures at
//! 10,000 GPUs are benchmarks (BENCHMARKS.md); here a few hundred GPUs show the pages are right.

use std::collections::BTreeSet;

use crate::common::traces::{H100, held, sample};
use crate::common::{ADMIN_TOKEN, Aggregator};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Instance, SloClass};
use serde_json::Value;

const A100: &str = "NVIDIA A100-SXM4-80GB";

/// `nodes` nodes of 8 whole GPUs each, observed at `t`: node `k`'s GPUs are A100s when `k` is a
/// multiple of 4, H100s otherwise; GPU 0 of every node is held by `t0`, GPU 1 by `t1`, the rest
/// by nobody.
async fn fleet(a: &Aggregator, nodes: usize, t: i64) {
    for k in 0..nodes {
        let node = format!("node-{k:03}");
        let model = if k % 4 == 0 { A100 } else { H100 };
        let samples: Vec<_> = (0..8)
            .map(|g| {
                let i = Instance {
                    node: node.clone(),
                    gpu_uuid: format!("GPU-{k:03}-{g}"),
                    gpu_model: model.into(),
                    mig_profile: None,
                    gpu_instance_id: None,
                    placement_start: None,
                    placement_size: None,
                };
                let who = match g {
                    0 => held("t0", &format!("t0/job-{k}"), SloClass::Batch),
                    1 => held("t1", &format!("t1/job-{k}"), SloClass::Batch),
                    _ => Attribution::default(),
                };
                sample(t, &i, who, Some(0.5))
            })
            .collect();
        let (status, body) = a
            .ingest(ADMIN_TOKEN, &Batch::from_samples(&node, &samples))
            .await;
        assert_eq!(status, 200, "{body}");
    }
}

async fn get(a: &Aggregator, path: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", a.url()))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn json(a: &Aggregator, path: &str) -> Value {
    let (status, body) = get(a, path).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn uuids(page: &Value) -> Vec<String> {
    page["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["gpu_uuid"].as_str().unwrap().to_owned())
        .collect()
}

/// Follows `next` from `first` (a path with a query), gathering every page's GPUs; each page
/// carries the totals of the whole filter.
async fn all_pages(a: &Aggregator, first: &str, gpus: Option<u64>) -> Vec<String> {
    let mut seen = Vec::new();
    let mut path = first.to_owned();
    for _ in 0..100 {
        let page = json(a, &path).await;
        if let Some(n) = gpus {
            assert_eq!(page["fleet"]["gpus"], n, "{path}");
        }
        seen.extend(uuids(&page));
        match page["next"].as_str() {
            Some(next) => path = format!("{first}&after={next}"),
            None => return seen,
        }
    }
    panic!("more than 100 pages from {first}");
}

/// Regression (issue 48, finding 3): `/api/v1/fragmentation` answered every GPU at once. Now a
/// page at a time: the pages hold every GPU once, in node and UUID order, each page carries the
/// totals, and the node, model and tenant filters narrow both.
#[tokio::test(flavor = "multi_thread")]
async fn fragmentation_is_paged_and_filtered_with_totals_over_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    let a = Aggregator::start(&dir.path().join("ledger.duckdb"), 0, &[]).await;
    let t = chrono::Utc::now().timestamp() - 5;
    fleet(&a, 16, t).await;
    let at = format!("at={t}");

    let seen = all_pages(
        &a,
        &format!("/api/v1/fragmentation?{at}&limit=10"),
        Some(128),
    )
    .await;
    assert_eq!(seen.len(), 128, "every GPU once");
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "in node and UUID order");
    let first = json(&a, &format!("/api/v1/fragmentation?{at}&limit=10")).await;
    let models = first["models"].as_array().unwrap();
    assert_eq!(models.len(), 2, "{first}");
    let gpus: u64 = models.iter().map(|m| m["gpus"].as_u64().unwrap()).sum();
    assert_eq!(gpus, 128);
    assert_eq!(
        first["nodes"].as_array().unwrap().len(),
        2,
        "the nodes of the page's ten GPUs: {}",
        first["nodes"]
    );
    assert_eq!(
        first["nodes"][1]["gpus"], 8,
        "a node's totals are all of its GPUs"
    );

    let node = json(&a, &format!("/api/v1/fragmentation?{at}&node=node-003")).await;
    assert_eq!(uuids(&node).len(), 8);
    assert!(uuids(&node).iter().all(|u| u.starts_with("GPU-003-")));
    assert_eq!(node["fleet"]["gpus"], 8);
    assert!(node.get("next").is_none());

    // A model by its key or by the name NVML reports.
    for model in ["A100-80GB", "NVIDIA%20A100-SXM4-80GB"] {
        let page = all_pages(
            &a,
            &format!("/api/v1/fragmentation?{at}&model={model}&limit=7"),
            Some(32),
        )
        .await;
        let nodes: BTreeSet<&str> = page.iter().map(|u| &u[4..7]).collect();
        assert_eq!(
            nodes,
            BTreeSet::from(["000", "004", "008", "012"]),
            "{model}"
        );
    }

    let t1 = json(&a, &format!("/api/v1/fragmentation?{at}&tenant=t1")).await;
    assert_eq!(t1["fleet"]["gpus"], 16);
    assert!(uuids(&t1).iter().all(|u| u.ends_with("-1")), "{t1}");

    // Over a range too (node and model; a tenant holds no GPU over a range).
    let range = format!("from={}&to={}", t - 60, t + 1);
    let seen = all_pages(&a, &format!("/api/v1/fragmentation?{range}&limit=50"), None).await;
    assert!(seen.is_empty() || seen.len() == 128);

    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=251", "limit"),
        ("after=zz", "after"),
        ("after=6e6f6465", "after"),
        (&format!("{range}&tenant=t1") as &str, "tenant"),
    ] {
        let (status, body) = get(&a, &format!("/api/v1/fragmentation?{query}")).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (status, v["error"]["field"].as_str()),
            (400, Some(field)),
            "{query}: {body}"
        );
    }
}

/// The Fleet page: per-model totals for the whole fleet, the MIG maps 100 GPUs at a time with a
/// link to the next, and a filter form; a page stays the size of its 100 GPUs.
#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_page_is_paged_and_filtered() {
    let dir = tempfile::tempdir().unwrap();
    let a = Aggregator::start(&dir.path().join("ledger.duckdb"), 0, &[]).await;
    let t = chrono::Utc::now().timestamp() - 5;
    fleet(&a, 16, t).await;
    let maps = |html: &str| html.matches("<figure class=\"gpu\"").count();

    let (status, first) = get(&a, "/fleet").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(maps(&first), 100);
    assert!(first.contains("100 of the 128 GPUs"), "the section says so");
    assert!(first.contains("<form class=\"filter\" method=\"get\" action=\"/fleet\">"));
    let more = "<p class=\"more\"><a href=\"";
    let next = first
        .split_once(more)
        .and_then(|(_, rest)| rest.split('"').next())
        .filter(|href| href.starts_with("/fleet?"))
        .expect("a link to the next GPUs")
        .replace("&#38;", "&")
        .replace("&amp;", "&");
    let (status, second) = get(&a, &next).await;
    assert_eq!(status, 200, "{next}: {second}");
    assert_eq!(maps(&second), 28);
    assert!(!second.contains(more), "the last page");

    let (_, one) = get(&a, "/fleet?node=node-005").await;
    assert_eq!(maps(&one), 8);
    assert!(
        one.contains("value=\"node-005\""),
        "the filter shows what it filters by"
    );
    let (_, by_tenant) = get(&a, "/fleet?tenant=t0&node=").await;
    assert_eq!(maps(&by_tenant), 16, "a blank field filters nothing");
    let (_, csv) = get(&a, "/fleet?node=node-005&format=csv&table=gpus").await;
    assert_eq!(csv.lines().count(), 9, "the CSV is the page shown: {csv}");
    let (status, _) = get(&a, "/fleet?after=nonsense").await;
    assert_eq!(status, 400);
}

/// The rows of the table `id` in a page.
fn table_rows(html: &str, id: &str) -> usize {
    let start = html
        .find(&format!("<table id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no table {id}"));
    let table = &html[start..start + html[start..].find("</table>").unwrap()];
    table.matches("<tr>").count() - 1
}

/// Hoarding episodes at fleet scale: the API and the Hoarding page list them a page at a time,
/// in the order they started, while the page's figures count every one.
#[tokio::test(flavor = "multi_thread")]
async fn hoarding_episodes_come_a_page_at_a_time() {
    const GPUS: usize = 104;
    let dir = tempfile::tempdir().unwrap();
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &["--hoarding-window", "1m"],
    )
    .await;
    let now = chrono::Utc::now().timestamp();
    let t0 = now - now.rem_euclid(60) - 240;
    for node in 0..GPUS / 8 {
        let name = format!("node-{node:03}");
        let samples: Vec<_> = (0..8)
            .flat_map(|g| {
                let i = Instance {
                    node: name.clone(),
                    gpu_uuid: format!("GPU-{node:03}-{g}"),
                    gpu_model: H100.into(),
                    mig_profile: None,
                    gpu_instance_id: None,
                    placement_start: None,
                    placement_size: None,
                };
                // Each GPU's idle run starts a second after the last one's.
                let start = t0 + (node * 8 + g) as i64;
                (start..start + 150)
                    .map(move |t| sample(t, &i, held("t0", "t0/idle", SloClass::Batch), Some(0.0)))
            })
            .collect();
        let (status, body) = a
            .ingest(ADMIN_TOKEN, &Batch::from_samples(&name, &samples))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);

    let mut seen = Vec::new();
    let mut path = "/api/v1/hoarding?state=all&limit=30".to_owned();
    loop {
        let page = json(&a, &path).await;
        let rows = page["episodes"].as_array().unwrap();
        assert!(rows.len() <= 30);
        seen.extend(rows.iter().map(|e| {
            (
                e["started_at"].as_i64().unwrap(),
                e["gpu_uuid"].as_str().unwrap().to_owned(),
            )
        }));
        match page["next"].as_str() {
            Some(next) => path = format!("/api/v1/hoarding?state=all&limit=30&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), GPUS, "every episode once");
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "in the order they started"
    );
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=2001", "limit"),
        ("after=1.2", "after"),
    ] {
        let (status, body) = get(&a, &format!("/api/v1/hoarding?{query}")).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (status, v["error"]["field"].as_str()),
            (400, Some(field)),
            "{body}"
        );
    }

    let (status, page) = get(&a, "/hoarding").await;
    assert_eq!(status, 200, "{page}");
    let open = json(&a, "/api/v1/hoarding?state=open&limit=2000").await;
    let open_count = open["episodes"].as_array().unwrap().len();
    assert!(open_count > 100, "{open_count} open episodes");
    assert!(
        page.contains(&format!("{open_count} open")),
        "the figure counts them all"
    );
    assert_eq!(table_rows(&page, "open"), 100);
    // Summed per tenant and workload: one workload held every episode.
    assert_eq!(table_rows(&page, "by_workload"), 1);
    let by_workload = &page[page.find("<table id=\"by_workload\">").unwrap()..];
    assert!(
        by_workload.contains(&format!("data-value=\"{GPUS}\"")),
        "{GPUS} episodes of t0/idle"
    );
    let more = "<p class=\"more\"><a href=\"";
    let next = page
        .split_once(more)
        .and_then(|(_, rest)| rest.split('"').next())
        .expect("a link to the next open episodes")
        .replace("&#38;", "&")
        .replace("&amp;", "&");
    let (status, second) = get(&a, &next).await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(table_rows(&second, "open"), open_count - 100);
}
