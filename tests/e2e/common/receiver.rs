//! A webhook receiver on loopback for the reclaim tests: it checks every request's signature with
//! the `standardwebhooks` crate (an implementation independent of gpuledger's), answers with a
//! status the test sets (to play a receiver that is down, throttling or gone), and records what
//! it accepted.

use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

/// The signing key every test endpoint uses.
pub const KEY: &[u8] = b"reclaim-test-key-0123456789abcdef";

/// The secret in the `whsec_` form.
pub fn secret() -> String {
    gpuledger_schema::webhook::Secret::encode(KEY)
}

/// One accepted delivery.
#[derive(Debug, Clone)]
pub struct Received {
    /// `webhook-id`.
    pub id: String,
    /// The parsed body.
    pub body: serde_json::Value,
    /// The raw body.
    pub raw: String,
    /// When it arrived (Unix seconds, fractional).
    pub at: f64,
}

impl Received {
    /// The event type.
    pub fn kind(&self) -> &str {
        self.body["type"].as_str().unwrap()
    }
    /// The workload.
    pub fn workload(&self) -> &str {
        self.body["data"]["workload"].as_str().unwrap_or("")
    }
}

#[derive(Default)]
struct Inner {
    status: AtomicU16,
    attempts: AtomicUsize,
    refused: AtomicUsize,
    received: Mutex<Vec<Received>>,
}

/// A running receiver.
#[derive(Clone)]
pub struct Receiver {
    inner: Arc<Inner>,
    /// Its URL.
    pub url: String,
}

async fn hook(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    inner.attempts.fetch_add(1, Ordering::SeqCst);
    let status = StatusCode::from_u16(inner.status.load(Ordering::SeqCst)).unwrap();
    if !status.is_success() {
        return status;
    }
    let wh = standardwebhooks::Webhook::new(&secret()).unwrap();
    if let Err(e) = wh.verify(&body, &headers) {
        eprintln!("receiver: refused a delivery: {e}");
        inner.refused.fetch_add(1, Ordering::SeqCst);
        return StatusCode::UNAUTHORIZED;
    }
    let raw = String::from_utf8(body.to_vec()).unwrap();
    inner.received.lock().unwrap().push(Received {
        id: headers["webhook-id"].to_str().unwrap().to_owned(),
        body: serde_json::from_str(&raw).unwrap(),
        raw,
        at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64(),
    });
    StatusCode::NO_CONTENT
}

impl Receiver {
    /// Starts one answering `status` to every attempt (2xx: after checking the signature).
    pub async fn start(status: u16) -> Receiver {
        let inner = Arc::new(Inner::default());
        inner.status.store(status, Ordering::SeqCst);
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { inner, url }
    }

    /// From now on, answer `status`.
    pub fn answer(&self, status: u16) {
        self.inner.status.store(status, Ordering::SeqCst);
    }

    /// Attempts seen (accepted or not).
    pub fn attempts(&self) -> usize {
        self.inner.attempts.load(Ordering::SeqCst)
    }

    /// Deliveries refused for a bad signature.
    pub fn refused(&self) -> usize {
        self.inner.refused.load(Ordering::SeqCst)
    }

    /// What was accepted so far.
    pub fn received(&self) -> Vec<Received> {
        self.inner.received.lock().unwrap().clone()
    }

    /// The distinct events accepted, as sorted (workload, type) pairs.
    pub fn events(&self) -> Vec<(String, String)> {
        let mut seen = std::collections::BTreeMap::new();
        for r in self.received() {
            seen.insert(r.id.clone(), (r.workload().to_owned(), r.kind().to_owned()));
        }
        let mut v: Vec<_> = seen.into_values().collect();
        v.sort();
        v
    }
}

/// Validates every accepted body against `schema/webhook.schema.json` with Python's
/// `jsonschema` (Draft 2020-12), an implementation independent of the serializer.
pub fn assert_schema_valid(received: &[Received]) {
    let dir = tempfile::tempdir().unwrap();
    let bodies = dir.path().join("bodies.json");
    let all: Vec<&serde_json::Value> = received.iter().map(|r| &r.body).collect();
    std::fs::write(&bodies, serde_json::to_string(&all).unwrap()).unwrap();
    let schema = super::root().join("schema/webhook.schema.json");
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.Draft202012Validator.check_schema(schema)\n\
             v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())\n\
             for b in json.load(open(sys.argv[2])):\n\
             \x20   v.validate(b)\n\
             print(len(json.load(open(sys.argv[2]))))\n",
        )
        .arg(&schema)
        .arg(&bodies)
        .output()
        .expect("python3 runs (./test.sh installs jsonschema)");
    assert!(
        out.status.success(),
        "an event does not match schema/webhook.schema.json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        received.len().to_string()
    );
}

/// An episode event's body as the aggregator sends it (tenant `ml`, a whole GPU of node `n1`,
/// an hour idle), for the reclaimer's tests.
pub fn episode_event(kind: &str, workload: &str, dry_run: bool) -> String {
    serde_json::json!({
        "type": kind,
        "timestamp": "2026-11-23T00:00:00Z",
        "data": {
            "episode_id": "ep_1", "tenant": "ml", "workload": workload, "node": "n1",
            "gpu_uuid": "GPU-1", "gpu_model": "NVIDIA H100 80GB HBM3", "mig_profile": null,
            "gpu_instance_id": null, "slo_class": "batch", "gpu_equivalents": 1.0,
            "idle_since": "2026-11-23T00:00:00Z", "ended_at": null, "idle_seconds": 3600,
            "mean_sm_active": 0.0, "idle_gpu_seconds": 3600.0, "idle_cost": 3.6,
            "currency": "USD",
            "policy": {"class": "batch", "action": "reclaim", "after_seconds": 1800,
                       "notice_seconds": 0, "rule": "class", "reason": "reclaim.requested: idle_past_after"},
            "dry_run": dry_run
        }
    })
    .to_string()
}

/// POSTs `body` to a reclaimer at `url` signed by the reference implementation at `ts` (None:
/// now): (status, JSON answer, Retry-After).
pub async fn send_signed(
    url: &str,
    id: &str,
    body: &str,
    ts: Option<i64>,
) -> (u16, serde_json::Value, Option<String>) {
    let wh = standardwebhooks::Webhook::new(&secret()).unwrap();
    let ts = ts.unwrap_or_else(|| chrono::Utc::now().timestamp());
    let sig = wh.sign(id, ts, body.as_bytes()).unwrap();
    post_signed(url, id, ts, &sig, body).await
}

/// POSTs `body` to a reclaimer at `url` with the given signature headers.
pub async fn post_signed(
    url: &str,
    id: &str,
    ts: i64,
    sig: &str,
    body: &str,
) -> (u16, serde_json::Value, Option<String>) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/hooks/gpuledger"))
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sig)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(serde_json::Value::Null),
        retry,
    )
}
