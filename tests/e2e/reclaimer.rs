//! `gpuledger reclaimer` (the real binary) against a fake Kubernetes API server over real HTTP —
//! it stands in for kube-apiserver, which cannot run here, and checks each request it gets — and
//! a stand-in `scontrol` that records its arguments. Requests are signed by the
//! `standardwebhooks` crate, an implementation independent of gpuledger's.

use crate::common;

use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::receiver::secret;
use crate::common::{free_port, gpuledger};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, patch, post};
use serde_json::{Value, json};

const API_TOKEN: &str = "sa-token-for-the-fake-api-server";

/// The fake API server's record and its answers.
#[derive(Default)]
struct Api {
    /// (method, path, body) of every request it accepted.
    seen: Mutex<Vec<(String, String, Value)>>,
    /// Answers to evictions, in order (then 201).
    eviction_answers: Mutex<Vec<u16>>,
    /// The token evictions need, when not [`API_TOKEN`] (a rotated one).
    accepted: Mutex<Option<String>>,
    /// The bearer token of every eviction, in order.
    bearers: Mutex<Vec<String>>,
}

type Shared = Arc<Api>;

fn authorized(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {API_TOKEN}"))
}

async fn eviction(
    State(api): State<Shared>,
    Path((ns, pod)): Path<(String, String)>,
    h: HeaderMap,
    body: String,
) -> (StatusCode, String) {
    let bearer = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_owned();
    api.bearers.lock().unwrap().push(bearer.clone());
    let want = api.accepted.lock().unwrap().clone();
    if bearer != want.as_deref().unwrap_or(API_TOKEN) {
        return (StatusCode::UNAUTHORIZED, "{}".into());
    }
    let v: Value = serde_json::from_str(&body).unwrap();
    // What a real API server requires of an Eviction.
    assert_eq!(v["apiVersion"], "policy/v1", "{v}");
    assert_eq!(v["kind"], "Eviction", "{v}");
    assert_eq!(v["metadata"]["name"], pod.as_str(), "{v}");
    assert_eq!(v["metadata"]["namespace"], ns.as_str(), "{v}");
    let status = {
        let mut a = api.eviction_answers.lock().unwrap();
        if a.is_empty() { 201 } else { a.remove(0) }
    };
    api.seen.lock().unwrap().push((
        "POST".into(),
        format!("/api/v1/namespaces/{ns}/pods/{pod}/eviction"),
        v,
    ));
    (StatusCode::from_u16(status).unwrap(), "{}".into())
}

async fn pod(Path((ns, pod)): Path<(String, String)>, h: HeaderMap) -> (StatusCode, String) {
    assert!(authorized(&h));
    let v = json!({
        "metadata": {"name": pod, "namespace": ns, "uid": "pod-uid-1",
                     "ownerReferences": [{"kind": "Job", "name": "train", "uid": "job-uid-9"}]}
    });
    (StatusCode::OK, v.to_string())
}

async fn workloads(Path(ns): Path<String>, h: HeaderMap) -> (StatusCode, String) {
    assert!(authorized(&h));
    let v = json!({"items": [
        {"metadata": {"name": "job-other-1a2b", "namespace": ns,
                      "ownerReferences": [{"kind": "Job", "uid": "job-uid-1"}]}},
        {"metadata": {"name": "job-train-3c4d", "namespace": ns,
                      "ownerReferences": [{"kind": "Job", "uid": "job-uid-9"}]}}
    ]});
    (StatusCode::OK, v.to_string())
}

async fn patch_workload(
    State(api): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    h: HeaderMap,
    body: String,
) -> (StatusCode, String) {
    assert!(authorized(&h));
    assert_eq!(
        h.get("content-type").unwrap(),
        "application/merge-patch+json"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    api.seen.lock().unwrap().push((
        "PATCH".into(),
        format!("/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads/{name}"),
        v,
    ));
    (StatusCode::OK, "{}".into())
}

async fn fake_api() -> (String, Shared) {
    let api = Shared::default();
    let app = axum::Router::new()
        .route(
            "/api/v1/namespaces/{ns}/pods/{pod}/eviction",
            post(eviction),
        )
        .route("/api/v1/namespaces/{ns}/pods/{pod}", get(pod))
        .route(
            "/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads",
            get(workloads),
        )
        .route(
            "/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads/{name}",
            patch(patch_workload),
        )
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, api)
}

struct Reclaimer {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Reclaimer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(api: &str, mode: &str, extra: &str) -> Reclaimer {
    let mut command = gpuledger();
    command.arg("reclaimer");
    start_with(command, api, mode, extra).await
}

/// Starts `command` (the `gpuledger reclaimer` subcommand or the `gpuledger-reclaimer` binary)
/// with a config for `api` and `mode`.
async fn start_with(
    mut command: std::process::Command,
    api: &str,
    mode: &str,
    extra: &str,
) -> Reclaimer {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, API_TOKEN).unwrap();
    // The stand-in scontrol: `show job -o ID` says the job runs; otherwise it records its
    // arguments, and `requeue 13` fails like a busy controller. (The real one runs in
    // slurm_real.rs.)
    let scontrol = dir.path().join("scontrol");
    let log = dir.path().join("scontrol.log");
    std::fs::write(
        &scontrol,
        format!(
            "#!/bin/sh\nif [ \"$1\" = show ]; then echo \"JobId=$4 JobState=RUNNING Restarts=0\"; exit 0; fi\nif [ \"$2\" = 13 ]; then echo 'Slurm controller busy' >&2; exit 1; fi\necho \"$@\" >> {}\n",
            log.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = free_port();
    let cfg = dir.path().join("reclaimer.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
listen = "127.0.0.1:{port}"
secret = "{}"
state_file = "{}"
{extra}
[kubernetes]
api_server = "{api}"
token_file = "{}"
mode = "{mode}"
[slurm]
command = ["{}", "requeue", "{{job}}"]
state_command = ["{}", "show", "job", "-o", "{{job}}"]
"#,
            secret(),
            dir.path().join("acted.log").display(),
            token.display(),
            scontrol.display(),
            scontrol.display()
        ),
    )
    .unwrap();
    let child = command
        .args(["--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    common::eventually("the reclaimer", Duration::from_secs(20), async || {
        reqwest::get(format!("{url}/healthz"))
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    Reclaimer { child, url, dir }
}

fn event(kind: &str, workload: &str, dry_run: bool) -> String {
    crate::common::receiver::episode_event(kind, workload, dry_run)
}

/// POSTs `body` signed by the reference implementation at `ts` (None: now).
async fn send(
    r: &Reclaimer,
    id: &str,
    body: &str,
    ts: Option<i64>,
) -> (u16, Value, Option<String>) {
    crate::common::receiver::send_signed(&r.url, id, body, ts).await
}

async fn signed(
    r: &Reclaimer,
    id: &str,
    ts: i64,
    sig: &str,
    body: &str,
) -> (u16, Value, Option<String>) {
    crate::common::receiver::post_signed(&r.url, id, ts, sig, body).await
}

#[tokio::test(flavor = "multi_thread")]
async fn evicts_a_pod_once_respecting_its_disruption_budget() {
    let (api_url, api) = fake_api().await;
    let r = start(&api_url, "evict", "").await;
    let body = event("reclaim.requested", "lab/nb-idle", false);
    let (status, v, _) = send(&r, "msg_a", &body, None).await;
    assert_eq!((status, v["outcome"].as_str()), (200, Some("acted")), "{v}");
    assert_eq!(api.seen.lock().unwrap().len(), 1);
    // The same webhook-id again (a retry after a lost answer): not acted on twice.
    let (status, v, _) = send(&r, "msg_a", &body, None).await;
    assert_eq!(
        (status, v["outcome"].as_str()),
        (200, Some("already_acted")),
        "{v}"
    );
    assert_eq!(api.seen.lock().unwrap().len(), 1);
    // A PDB refuses the eviction (429): 503 + Retry-After, so the aggregator retries; then it
    // goes through.
    api.eviction_answers.lock().unwrap().push(429);
    let guarded = event("reclaim.requested", "serve/guarded", false);
    let (status, v, retry) = send(&r, "msg_b", &guarded, None).await;
    assert_eq!(status, 503, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("PodDisruptionBudget"),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("30"));
    let (status, v, _) = send(&r, "msg_b", &guarded, None).await;
    assert_eq!((status, v["outcome"].as_str()), (200, Some("acted")), "{v}");
    // Events that need no action, and dry-run requests, touch nothing.
    let seen = api.seen.lock().unwrap().len();
    for (id, b) in [
        ("msg_c", event("hoarding.detected", "lab/x", false)),
        ("msg_d", event("reclaim.cancelled", "lab/x", false)),
        ("msg_e", event("reclaim.requested", "lab/x", true)),
    ] {
        let (status, v, _) = send(&r, id, &b, None).await;
        assert_eq!(status, 200, "{v}");
        assert_ne!(v["outcome"], "acted", "{v}");
    }
    assert_eq!(api.seen.lock().unwrap().len(), seen);
    // The acted ids survive a restart: the record is a file.
    let acted = std::fs::read_to_string(r.dir.path().join("acted.log")).unwrap();
    assert_eq!(acted.lines().collect::<Vec<_>>(), ["msg_a", "msg_b"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn unsigned_badly_signed_and_replayed_requests_get_401() {
    let (api_url, api) = fake_api().await;
    let r = start(&api_url, "evict", "").await;
    let body = event("reclaim.requested", "lab/nb-idle", false);
    let now = chrono::Utc::now().timestamp();
    let wh = standardwebhooks::Webhook::new(&secret()).unwrap();
    let good = wh.sign("msg_1", now, body.as_bytes()).unwrap();
    let other = standardwebhooks::Webhook::new(&gpuledger_schema::webhook::Secret::encode(
        b"some-other-secret-0123456789",
    ))
    .unwrap()
    .sign("msg_1", now, body.as_bytes())
    .unwrap();
    for (what, id, ts, sig, b) in [
        ("no signature", "msg_1", now, "", body.clone()),
        ("another key", "msg_1", now, other.as_str(), body.clone()),
        (
            "a changed body",
            "msg_1",
            now,
            good.as_str(),
            body.replace("nb-idle", "nb-other"),
        ),
        ("another id", "msg_2", now, good.as_str(), body.clone()),
    ] {
        let (status, v, _) = signed(&r, id, ts, sig, &b).await;
        assert_eq!(status, 401, "{what}: {v}");
    }
    // Signed correctly, but six minutes old: a replay.
    let (status, v, _) = send(&r, "msg_3", &body, Some(now - 360)).await;
    assert_eq!(status, 401, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timestamp"),
        "{v}"
    );
    assert!(api.seen.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn deactivates_the_kueue_workload_of_the_pod() {
    let (api_url, api) = fake_api().await;
    let r = start(&api_url, "kueue", "").await;
    let (status, v, _) = send(
        &r,
        "msg_k",
        &event("reclaim.requested", "ml/train-0", false),
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let seen = api.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [(
            "PATCH".to_owned(),
            "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/job-train-3c4d".to_owned(),
            json!({"spec": {"active": false}})
        )]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn requeues_a_slurm_job_with_the_configured_command() {
    let (api_url, _api) = fake_api().await;
    let r = start(&api_url, "evict", "").await;
    let (status, v, _) = send(
        &r,
        "msg_s",
        &event("reclaim.requested", "4242", false),
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let log = std::fs::read_to_string(r.dir.path().join("scontrol.log")).unwrap();
    assert_eq!(log, "requeue 4242\n");
    // A failing command: 503, retried by the aggregator.
    let (status, v, retry) =
        send(&r, "msg_t", &event("reclaim.requested", "13", false), None).await;
    assert_eq!(status, 503, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("busy"),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("60"));
    // A workload that is neither a pod nor a job id: 422, nothing run.
    let (status, v, _) = send(
        &r,
        "msg_u",
        &event("reclaim.requested", "4242; reboot", false),
        None,
    )
    .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(
        std::fs::read_to_string(r.dir.path().join("scontrol.log")).unwrap(),
        "requeue 4242\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_logs_and_does_nothing() {
    let (api_url, api) = fake_api().await;
    let r = start(&api_url, "evict", "dry_run = true").await;
    let (status, v, _) = send(
        &r,
        "msg_x",
        &event("reclaim.requested", "lab/nb", false),
        None,
    )
    .await;
    assert_eq!(
        (status, v["outcome"].as_str()),
        (200, Some("dry_run")),
        "{v}"
    );
    assert_eq!(v["action"], "evict pod lab/nb");
    assert!(api.seen.lock().unwrap().is_empty());
}

/// The whole path: a real aggregator fed an idle notebook pod and an idle Slurm job over HTTP
/// sends its signed `reclaim.requested` events to a real `gpuledger reclaimer`, which evicts the
/// pod through the (fake) API server and requeues the job through the stand-in `scontrol`.
#[tokio::test(flavor = "multi_thread")]
async fn the_aggregator_and_the_reclaimer_hand_the_gpus_back() {
    use common::traces::{H100, held, sample};
    use gpuledger_schema::{Instance, SloClass, wire::Batch};
    let (api_url, api) = fake_api().await;
    let r = start(&api_url, "evict", "").await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("aggregator.toml");
    std::fs::write(
        &cfg,
        format!(
            "hoarding_window = \"10m\"\nanalytics_interval = \"1h\"\n\
             [reclaim.classes.interactive]\naction = \"reclaim\"\nafter = \"20m\"\nnotice = \"0s\"\n\
             [reclaim.classes.batch]\naction = \"reclaim\"\nafter = \"20m\"\nnotice = \"0s\"\n\
             [[webhooks]]\nurl = \"{}/hooks/gpuledger\"\nsecret = \"{}\"\n",
            r.url,
            secret()
        ),
    )
    .unwrap();
    let a = common::Aggregator::start(
        &dir.path().join("ledger.duckdb"),
        0,
        &["--config", cfg.to_str().unwrap()],
    )
    .await;
    let now = chrono::Utc::now().timestamp();
    let gpu = |uuid: &str| Instance {
        node: "n1".into(),
        gpu_uuid: uuid.into(),
        gpu_model: H100.into(),
        mig_profile: None,
        gpu_instance_id: None,
        placement_start: None,
        placement_size: None,
    };
    let (nb, job) = (gpu("GPU-NB"), gpu("GPU-JOB"));
    let samples: Vec<_> = (now - 40 * 60..now)
        .flat_map(|t| {
            [
                sample(
                    t,
                    &nb,
                    held("ml", "lab/nb-idle", SloClass::Interactive),
                    Some(0.0),
                ),
                sample(t, &job, held("ml", "4242", SloClass::Batch), Some(0.0)),
            ]
        })
        .collect();
    let (status, body) = a
        .ingest(common::ADMIN_TOKEN, &Batch::from_samples("n1", &samples))
        .await;
    assert_eq!(status, 200, "{body}");
    // Pass 1 notifies; once the notices are delivered, pass 2 requests; the reclaimer acts.
    common::eventually("both reclaimed", Duration::from_secs(60), async || {
        a.evaluate(common::ADMIN_TOKEN).await;
        let evicted = api
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|(_, p, _)| p == "/api/v1/namespaces/lab/pods/nb-idle/eviction");
        let requeued = std::fs::read_to_string(r.dir.path().join("scontrol.log"))
            .is_ok_and(|l| l == "requeue 4242\n");
        (evicted && requeued).then_some(())
    })
    .await;
    let (_, out) = {
        let resp = reqwest::Client::new()
            .get(format!("{}/api/v1/webhooks/deliveries", a.url()))
            .bearer_auth(common::ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        (resp.status(), resp.json::<Value>().await.unwrap())
    };
    let delivered = out["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["state"] == "delivered")
        .count();
    assert_eq!(delivered, 4, "two notices and two requests: {out}");
    assert_eq!(api.seen.lock().unwrap().len(), 1, "evicted once");
}

/// Regression: the reclaimer read its service-account token once at start, so one that outlived
/// the projected token (the kubelet rotates it about hourly) had every eviction refused. The next
/// call after a rotation now carries the new token. Runs the lean `gpuledger-reclaimer` binary.
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_token_is_used_on_the_next_call() {
    let (api_url, api) = fake_api().await;
    let r = start_with(common::bin("gpuledger-reclaimer"), &api_url, "evict", "").await;
    let (status, body, _) = send(
        &r,
        "msg_rotation_1",
        &event("reclaim.requested", "lab/nb-before", false),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The kubelet writes the new token beside the old one and swaps it in.
    let rotated = "sa-token-rotated-0123456789";
    let next = r.dir.path().join("token.next");
    std::fs::write(&next, rotated).unwrap();
    std::fs::rename(&next, r.dir.path().join("token")).unwrap();
    *api.accepted.lock().unwrap() = Some(rotated.into());
    let (status, body, _) = send(
        &r,
        "msg_rotation_2",
        &event("reclaim.requested", "lab/nb-after", false),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "acted", "{body}");
    assert_eq!(
        *api.bearers.lock().unwrap(),
        [API_TOKEN.to_owned(), rotated.to_owned()]
    );
}
