//! A running aggregator under a stream of generated malformed requests, as an attacker or an
//! unlucky operator would send them: bad and missing tokens, tokens used out of scope, broken
//! bodies (gzip, JSON, types, lengths), values past every rule, batches past every limit, lying
//! headers, hostile query parameters and unknown routes. Every answer must be a 4xx naming what
//! is wrong — no 5xx, no hang — the ledger must be unchanged afterwards, and a valid batch must
//! still be stored. Beside ingest: the pages with hostile queries, sign-in and sign-out forms,
//! snoozes, exemptions and exports (issue 48).

use std::sync::Arc;
use std::time::Duration;

use crate::common::{ADMIN_TOKEN, Aggregator};
use gpuledger_schema::wire::Batch;
use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};
use serde_json::{Value, json};

const N1: &str = "node-n1-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";
const TENANT_A: &str = "tenant-a-token-0123456789";
/// How many generated requests; the suite's bound (raise it by hand for a longer soak).
const REQUESTS: usize = 10_500;

/// A small deterministic generator (xorshift64*): the same requests on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn valid_batch(t: i64) -> Batch {
    let samples: Vec<Sample> = (t..t + 5)
        .flat_map(|t| {
            (0..3u32).map(move |gi| Sample {
                timestamp: t,
                instance: Instance {
                    node: "n1".into(),
                    gpu_uuid: "GPU-n1-0".into(),
                    gpu_model: "NVIDIA H100 80GB HBM3".into(),
                    mig_profile: Some("1g.10gb".into()),
                    gpu_instance_id: Some(gi),
                    placement_start: Some(gi),
                    placement_size: Some(1),
                },
                attribution: Attribution {
                    tenant: Some("a".into()),
                    workload: Some("a/job".into()),
                    slo_class: Some(SloClass::Batch),
                    owner: None,
                    owner_ref: None,
                },
                counters: Counters {
                    sm_active: Some(0.5),
                    fb_used_bytes: Some(1 << 30),
                    fb_total_bytes: Some(10 << 30),
                    nvlink_tx_bytes: None,
                    ..Counters::default()
                },
            })
        })
        .collect();
    Batch::from_samples("n1", &samples)
}

/// One malformed request.
struct Request {
    method: reqwest::Method,
    path: String,
    token: Option<String>,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    what: String,
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A batch made invalid in one of many ways, each certain to break a rule.
fn broken_batch(rng: &mut Rng, base: &Value) -> (Value, String) {
    let mut b = base.clone();
    let s = rng.below(b["series"].as_array().unwrap().len());
    let j = rng.below(5);
    let huge = json!(18446744073709551615u64);
    let kind = rng.below(28);
    let series = &mut b["series"][s];
    match kind {
        0 => series["sm_active"] = json!([0.5, 0.5, 1.5, 0.5, 0.5]),
        1 => series["sm_active"][j] = json!(-0.01),
        2 => series["fb_used_bytes"][j] = json!(11u64 << 30),
        3 => series["nvlink_tx_bytes"] = json!([huge, huge, huge, huge, huge]),
        4 => series["fb_total_bytes"] = json!([huge, huge, huge, huge, huge]),
        5 => series["gpu_instance_id"] = json!(4294967295u64),
        6 => series["gpu_instance_id"] = json!(-1),
        7 => series["t"][j] = json!(now() + 86400 * (1 + rng.below(1000) as i64)),
        8 => series["t"][j] = json!(-(rng.below(1 << 30) as i64)),
        9 => series["t"][j] = json!("soon"),
        10 => series["sm_active"] = json!([0.5]),
        11 => series["t"] = json!([]),
        12 => series["node"] = json!("n2"),
        13 => series["tenant"] = json!("x".repeat(513 + rng.below(2000))),
        14 => series["gpu_model"] = json!(""),
        15 => series["mig_profile"] = json!("9z.1gb"),
        16 => {
            series.as_object_mut().unwrap().remove("tenant");
        }
        17 => series["processes"] = json!([1, 1, 1, 1, 1]),
        18 => series["slo_class"] = json!("gold"),
        19 => b["v"] = json!(2),
        20 => {
            b.as_object_mut().unwrap().remove("batch_id");
        }
        21 => b["batch_id"] = json!("not-a-uuid"),
        22 => b["node"] = json!(""),
        23 => b["node"] = json!("n2"),
        24 => b["series"] = json!("nope"),
        25 => {
            let mut share = base["series"][0].clone();
            share["node"] = json!("n2");
            share["processes"] = json!([1, 1, 1, 1, 1]);
            b["shares"] = json!([share]);
        }
        26 => {
            let mut share = base["series"][0].clone();
            share["processes"] = json!([1, 1, 1, 1, 1]);
            share["t"][j] = json!(4102444800i64);
            b["shares"] = json!([share]);
        }
        _ => {
            let share = base["series"][0].clone();
            b["shares"] = json!([share]);
        }
    }
    (b, format!("batch rule {kind}"))
}

fn request(rng: &mut Rng, base: &Value) -> Request {
    let ingest = |token: Option<&str>, body: Vec<u8>, gz: bool, what: String| Request {
        method: reqwest::Method::POST,
        path: "/api/v1/ingest".into(),
        token: token.map(Into::into),
        headers: if gz {
            vec![("content-encoding", "gzip".into())]
        } else {
            vec![]
        },
        body,
        what,
    };
    let good = serde_json::to_vec(base).unwrap();
    match rng.below(14) {
        // Tokens: missing, unknown, wrong scheme, out of scope.
        0 => {
            let token = rng.pick(&[
                None,
                Some("x"),
                Some("not-a-token-not-a-token"),
                Some(VIEWER),
                Some(TENANT_A),
            ]);
            ingest(
                token.as_deref(),
                gzip(&good),
                true,
                format!("ingest with token {token:?}"),
            )
        }
        1 => Request {
            method: reqwest::Method::POST,
            path: "/api/v1/ingest".into(),
            token: None,
            headers: vec![(
                "authorization",
                rng.pick(&[
                    format!("Basic {N1}"),
                    N1.to_owned(),
                    "Bearer".to_owned(),
                    format!("Bearer  {N1}x"),
                    format!("Token {N1}"),
                ])
                .clone(),
            )],
            body: gzip(&good),
            what: "a malformed Authorization header".into(),
        },
        // Bodies that are not a batch.
        2 => {
            let cut = rng.below(good.len());
            let noise = 1 + rng.below(300);
            let body = rng
                .pick(&[
                    b"".to_vec(),
                    b"null".to_vec(),
                    b"[]".to_vec(),
                    good[..cut].to_vec(),
                    b"{\"v\":1".to_vec(),
                    vec![0xff; noise],
                ])
                .clone();
            ingest(Some(N1), body, false, "not JSON".into())
        }
        3 => {
            let mut body = gzip(&good);
            let cut = 1 + rng.below(body.len() - 1);
            body.truncate(cut);
            if rng.below(2) == 0 {
                let i = rng.below(body.len());
                body[i] ^= 0x55;
            }
            ingest(Some(N1), body, true, "broken gzip".into())
        }
        4 => ingest(
            Some(N1),
            good.clone(),
            true,
            "plain JSON labelled gzip".into(),
        ),
        // Past the limits: values, samples, decoded bytes.
        5 => {
            // More values than 2,000 samples and 4,096 series may have (153,136).
            let n = 160_000 + rng.below(10_000);
            let body = format!(
                r#"{{"v":1,"batch_id":"01a2057d-f974-7779-95df-9092985a68aa","node":"n1","series":[{{"t":[{}1]}}]}}"#,
                "1,".repeat(n)
            );
            ingest(
                Some(N1),
                gzip(body.as_bytes()),
                true,
                "too many values".into(),
            )
        }
        6 => {
            // 8 MiB of JSON, past the 4.7 MB a batch of 2,000 samples may decode to.
            static BOMB: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            let bomb = BOMB.get_or_init(|| {
                let mut json = br#"{"v":1,"series":[{"node":""#.to_vec();
                json.resize(8 << 20, b'a');
                gzip(&json)
            });
            ingest(
                Some(N1),
                bomb.clone(),
                true,
                "inflates past the bound".into(),
            )
        }
        7 => {
            // Over --max-batch-samples with valid-looking seconds.
            let mut b = base.clone();
            let t0 = now() - 3000;
            let n = 2001 + rng.below(500);
            b["series"][0]["t"] = json!((t0..t0 + n as i64).collect::<Vec<_>>());
            for c in ["sm_active", "fb_used_bytes", "fb_total_bytes"] {
                b["series"][0].as_object_mut().unwrap().remove(c);
            }
            ingest(
                Some(N1),
                gzip(&serde_json::to_vec(&b).unwrap()),
                true,
                "too many samples".into(),
            )
        }
        // Valid JSON breaking a rule.
        8 | 9 => {
            let (b, what) = broken_batch(rng, base);
            let gz = rng.below(2) == 0;
            let bytes = serde_json::to_vec(&b).unwrap();
            ingest(Some(N1), if gz { gzip(&bytes) } else { bytes }, gz, what)
        }
        // Read APIs with hostile parameters.
        10 => {
            let api = rng.pick(&[
                "/api/v1/showback",
                "/api/v1/hoarding",
                "/api/v1/fragmentation",
                "/api/v1/shares",
            ]);
            // Each is invalid for every one of the four endpoints (some ignore parameters they
            // do not take, so those come with a bad time as well).
            let query = rng.pick(&[
                "from=9223372036854775707&to=9223372036854775807",
                "from=-9223372036854775808&to=9223372036854775807",
                "from=0&to=253402300800",
                "from=soon",
                "to=2026-13-01T00:00:00Z",
                "from=1700000000.5",
                "group_by=%27%3B%20DROP%20TABLE%20instances%3B--&from=soon",
                "month=2026-99&to=x",
                "tenant=%00&from=%00",
                "unknown=1&to=-1",
            ]);
            let token = rng.pick(&[None, Some(N1), Some(VIEWER)]);
            Request {
                method: reqwest::Method::GET,
                path: format!("{api}?{query}"),
                token: token.map(Into::into),
                headers: vec![],
                body: vec![],
                what: format!("{api}?{query} with {token:?}"),
            }
        }
        // The pages, with a reader's token and a query each refuses.
        12 => {
            let page = rng.pick(&[
                "/",
                "/tenants",
                "/tenants/a",
                "/fleet",
                "/hoarding",
                "/prices",
            ]);
            let query = rng.pick(&[
                "month=2026-99",
                "from=soon",
                "unknown=1",
                "mode=bogus",
                "dir=sideways",
                "format=csv",
                "format=csv&table=nope",
                "after=zz&month=2026-99",
                "node=%00&from=soon",
                "next=%2F%09%2F127.0.0.2&format=csv",
            ]);
            let token = rng.pick(&[VIEWER, TENANT_A]);
            Request {
                method: reqwest::Method::GET,
                path: format!("{page}?{query}"),
                token: Some(token.to_string()),
                headers: vec![],
                body: vec![],
                what: format!("{page}?{query} with {token}"),
            }
        }
        // Forms, exemptions and exports: sign-in with a bad token or a hostile next, sign-out
        // and snoozes without a session, exemptions past their bounds, exports without rights.
        13 => {
            let form = (
                "content-type",
                "application/x-www-form-urlencoded".to_owned(),
            );
            let json = ("content-type", "application/json".to_owned());
            let (method, path, token, headers, body): (_, _, Option<&str>, _, String) = rng
                .pick(&[
                    (
                        reqwest::Method::POST,
                        "/signin",
                        None,
                        vec![form.clone()],
                        "token=wrong-token-0123456789&next=%2F%0A%2Fevil".into(),
                    ),
                    (
                        reqwest::Method::POST,
                        "/signin",
                        None,
                        vec![form.clone()],
                        format!("token={N1}&next=%2F%5C%5Cevil.example"),
                    ),
                    (
                        reqwest::Method::POST,
                        "/signin",
                        None,
                        vec![form.clone()],
                        "next=%2F".into(),
                    ),
                    (
                        reqwest::Method::POST,
                        "/signin",
                        None,
                        vec![json.clone()],
                        "{}".into(),
                    ),
                    (
                        reqwest::Method::POST,
                        "/signout",
                        None,
                        vec![form.clone()],
                        "csrf=x".into(),
                    ),
                    (
                        reqwest::Method::POST,
                        "/hoarding/snooze",
                        Some(VIEWER),
                        vec![form.clone()],
                        "csrf=x&tenant=a&workload=a%2Fjob&duration=1h&next=%2F%2Fevil".into(),
                    ),
                    (
                        reqwest::Method::POST,
                        "/api/v1/exemptions",
                        Some(TENANT_A),
                        vec![json.clone()],
                        format!(r#"{{"duration": "1h", "reason": "{}"}}"#, "r".repeat(2000)),
                    ),
                    (
                        reqwest::Method::POST,
                        "/api/v1/exemptions",
                        Some(TENANT_A),
                        vec![json.clone()],
                        r#"{"duration": "1h", "tenant": "b"}"#.into(),
                    ),
                    (
                        reqwest::Method::POST,
                        "/api/v1/exemptions",
                        Some(VIEWER),
                        vec![json.clone()],
                        r#"{"duration": "1h"}"#.into(),
                    ),
                    (
                        reqwest::Method::DELETE,
                        "/api/v1/exemptions/exm_nope",
                        Some(TENANT_A),
                        vec![],
                        String::new(),
                    ),
                    (
                        reqwest::Method::GET,
                        "/api/v1/exemptions?limit=0",
                        Some(VIEWER),
                        vec![],
                        String::new(),
                    ),
                    (
                        reqwest::Method::GET,
                        "/api/v1/hoarding?after=1.2",
                        Some(VIEWER),
                        vec![],
                        String::new(),
                    ),
                    (
                        reqwest::Method::GET,
                        "/api/v1/fragmentation?limit=100000",
                        Some(VIEWER),
                        vec![],
                        String::new(),
                    ),
                    (
                        reqwest::Method::POST,
                        "/api/v1/export",
                        Some(VIEWER),
                        vec![json.clone()],
                        r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}"#.into(),
                    ),
                    (
                        reqwest::Method::POST,
                        "/api/v1/export",
                        Some(N1),
                        vec![json.clone()],
                        format!(r#"{{"cluster": "{}"}}"#, "c".repeat(300)),
                    ),
                ])
                .clone();
            Request {
                method,
                path: path.into(),
                token: token.map(Into::into),
                headers,
                body: body.into_bytes(),
                what: format!("{path} with {token:?}"),
            }
        }
        // Routes and methods that do not exist, admin actions without admin.
        _ => {
            let (method, path, token) = rng
                .pick(&[
                    (reqwest::Method::GET, "/api/v1/ingest", Some(N1)),
                    (reqwest::Method::PUT, "/api/v1/ingest", Some(N1)),
                    (reqwest::Method::DELETE, "/api/v1/showback", Some(VIEWER)),
                    (reqwest::Method::GET, "/api/v2/showback", Some(VIEWER)),
                    (reqwest::Method::GET, "/../../etc/passwd", None),
                    (
                        reqwest::Method::POST,
                        "/api/v1/analytics/evaluate",
                        Some(VIEWER),
                    ),
                    (
                        reqwest::Method::POST,
                        "/api/v1/analytics/evaluate",
                        Some(TENANT_A),
                    ),
                    (reqwest::Method::POST, "/api/v1/analytics/evaluate", None),
                    (
                        reqwest::Method::GET,
                        "/metrics",
                        Some("not-a-token-not-a-token"),
                    ),
                ])
                .clone();
            Request {
                method,
                path: path.into(),
                token: token.map(Into::into),
                headers: vec![],
                body: vec![],
                what: format!("{path} with {token:?}"),
            }
        }
    }
}

/// The ledger's visible state: row counts per table and the showback of the day around `t`.
async fn ledger_state(a: &Aggregator, t: i64) -> (String, Value) {
    let metrics = reqwest::get(format!("{}/metrics", a.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let rows: String = metrics
        .lines()
        .filter(|l| l.starts_with("gpuledger_aggregator_store_rows{"))
        .collect::<Vec<_>>()
        .join("\n");
    let showback: Value = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/showback?from={}&to={}",
            a.url(),
            t - 86400,
            t + 3600
        ))
        .bearer_auth(VIEWER)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (rows, showback)
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_malformed_requests_get_4xx_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("node:n1 {N1}\nviewer {VIEWER}\ntenant:a {TENANT_A}\n"),
    )
    .unwrap();
    let a = Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--max-batch-samples",
            "2000",
            "--rollup-retention",
            "30days",
            // One token sends everything here: it must not be throttled into 429s by its own
            // share (429 is a 4xx too, but then the bodies would go unexamined).
            "--ingest-slots-per-token",
            "64",
        ],
    )
    .await;
    let t = now() - 600;
    let (status, _) = a.ingest(N1, &valid_batch(t)).await;
    assert_eq!(status, 200);
    // Analytics first, so that the background pass has nothing left to change meanwhile.
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);
    let before = ledger_state(&a, t).await;
    assert!(before.1["totals"].is_object(), "{:?}", before.1);
    let base = serde_json::to_value(valid_batch(t + 100)).unwrap();

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let requests: Vec<Request> = (0..REQUESTS).map(|_| request(&mut rng, &base)).collect();
    let requests = Arc::new(std::sync::Mutex::new(requests));
    let url = a.url();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (requests, client, url) = (requests.clone(), client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let Some(r) = requests.lock().unwrap().pop() else {
                    return seen;
                };
                let mut req = client.request(r.method.clone(), format!("{url}{}", r.path));
                if let Some(t) = &r.token {
                    req = req.bearer_auth(t);
                }
                for (k, v) in &r.headers {
                    req = req.header(*k, v);
                }
                let answer = req
                    .body(r.body)
                    .send()
                    .await
                    .expect("an answer, not a hang");
                let status = answer.status().as_u16();
                let body = answer.text().await.unwrap_or_default();
                seen.push((status, r.what, body));
            }
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    assert_eq!(answers.len(), REQUESTS);
    let mut by_status = std::collections::BTreeMap::new();
    for (status, what, body) in &answers {
        assert!((400..500).contains(status), "{what}: HTTP {status}: {body}");
        *by_status.entry(*status).or_insert(0) += 1;
        // The sign-in form answers a browser: a refused token gets the form again, with the
        // hostile `next` replaced by a safe one.
        if what.starts_with("/signin ") && body.starts_with("<!DOCTYPE html>") {
            assert_eq!(*status, 401, "{what}: {body}");
            assert!(
                body.contains("name=\"next\" value=\"/\""),
                "{what}: a hostile next is not echoed: {body}"
            );
            continue;
        }
        // One error shape for every refusal, the router's own 404/405 included.
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| {
            panic!("{what}: HTTP {status}: not the JSON error shape ({e}): {body:?}")
        });
        assert!(v["error"]["message"].is_string(), "{what}: {body}");
    }
    eprintln!("answers by status: {by_status:?}");
    assert!(
        by_status.len() >= 6,
        "the categories reached the checks: {by_status:?}"
    );
    assert_eq!(
        ledger_state(&a, t).await,
        before,
        "a malformed request changed the ledger"
    );
    // A valid batch is still stored.
    let (status, body) = a.ingest(N1, &valid_batch(t + 200)).await;
    assert_eq!((status, body["stored"].as_u64()), (200, Some(15)), "{body}");
    assert_eq!(a.evaluate(ADMIN_TOKEN).await.0, 200);
}
