//! What the kubelet's pod-resources API does not say about a pod, from the Kubernetes API server:
//! its labels, annotations and priority class (for tenant and SLO rules), and whether it still
//! exists (the kubelet keeps reporting the devices of pods that finished or were deleted until it
//! reclaims them).
//!
//! One node-scoped list every `refresh` (`GET /api/v1/pods?fieldSelector=spec.nodeName=NODE&
//! resourceVersion=0`: served from the API server's watch cache, the cheapest read it offers),
//! cached in memory. RBAC: `get`/`list` on `pods` (`deploy/kubernetes/exporter-daemonset.yaml`).
//! The service-account token is re-read for every request (it is rotated). A failed list keeps
//! the last one and is logged once per failure streak.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gpuledger_schema::SloClass;

/// Where the API server is and what to read from its pods.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Base URL (`https://kubernetes.default.svc`).
    pub url: String,
    /// Bearer token file (the pod's service-account token).
    pub token_file: Option<PathBuf>,
    /// CA bundle for the API server's certificate (the service-account `ca.crt`).
    pub ca_file: Option<PathBuf>,
    /// This node's name: only its pods are listed.
    pub node: String,
    /// How often the list is refreshed.
    pub refresh: Duration,
    /// Pod label whose value is the tenant (before the namespace rules).
    pub tenant_label: Option<String>,
    /// Pod annotation whose value is the tenant (after the label).
    pub tenant_annotation: Option<String>,
    /// Pod label whose value is the SLO class (`latency_critical`, `interactive`, `batch`).
    pub class_label: Option<String>,
    /// Priority class name → SLO class.
    pub priority_classes: HashMap<String, SloClass>,
}

impl ApiServerConfig {
    /// In-cluster defaults: the API server from `KUBERNETES_SERVICE_HOST`/`_PORT` and the
    /// mounted service-account token and CA.
    pub fn in_cluster_url() -> Option<String> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Some(format!("https://{host}:{port}"))
    }
}

/// The service-account token and CA every pod gets.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// What gpuledger keeps of a pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodMeta {
    /// `metadata.uid`: how a process's cgroup names its pod.
    pub uid: String,
    /// Labels.
    pub labels: HashMap<String, String>,
    /// Annotations.
    pub annotations: HashMap<String, String>,
    /// `spec.priorityClassName`.
    pub priority_class: Option<String>,
    /// `status.phase`.
    pub phase: Option<String>,
}

impl PodMeta {
    /// A pod that finished (Succeeded or Failed) holds its devices no longer, whatever the
    /// kubelet still lists.
    pub fn is_finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// One successful list.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When the request was sent: a pod the kubelet showed before this and the list lacks is
    /// gone.
    pub requested_at: Instant,
    /// (namespace, name) → pod.
    pub pods: HashMap<(String, String), PodMeta>,
}

#[derive(Debug, serde::Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Debug, serde::Deserialize)]
struct Pod {
    metadata: Metadata,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Status,
}

#[derive(Debug, serde::Deserialize)]
struct Metadata {
    namespace: String,
    name: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    labels: HashMap<String, String>,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct Spec {
    #[serde(default, rename = "priorityClassName")]
    priority_class_name: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct Status {
    #[serde(default)]
    phase: Option<String>,
}

/// Reads a `PodList` JSON answer.
pub fn parse_pod_list(body: &[u8]) -> Result<HashMap<(String, String), PodMeta>, String> {
    let list: PodList =
        serde_json::from_slice(body).map_err(|e| format!("the API server's pod list: {e}"))?;
    Ok(list
        .items
        .into_iter()
        .map(|p| {
            (
                (p.metadata.namespace, p.metadata.name),
                PodMeta {
                    uid: p.metadata.uid,
                    labels: p.metadata.labels,
                    annotations: p.metadata.annotations,
                    priority_class: p.spec.priority_class_name,
                    phase: p.status.phase,
                },
            )
        })
        .collect())
}

/// The latest snapshot and the latest error, shared with the attributor.
#[derive(Debug, Default)]
pub struct Shared {
    /// The last good list.
    pub snapshot: Option<Snapshot>,
    /// Why the last list failed, if it did.
    pub error: Option<String>,
}

fn client(config: &ApiServerConfig) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(5));
    if let Some(ca) = &config.ca_file {
        let pem = std::fs::read(ca).map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
        let cert = reqwest::Certificate::from_pem(&pem)
            .map_err(|e| format!("{} is not a PEM certificate: {e}", ca.display()))?;
        b = b.add_root_certificate(cert);
    }
    b.build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

async fn list(client: &reqwest::Client, config: &ApiServerConfig) -> Result<Snapshot, String> {
    let requested_at = Instant::now();
    // Node names are DNS labels; anything else is escaped rather than trusted.
    let node: String = config
        .node
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let url = format!(
        "{}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}&resourceVersion=0",
        config.url.trim_end_matches('/')
    );
    let mut request = client.get(&url);
    if let Some(f) = &config.token_file {
        let token = std::fs::read_to_string(f)
            .map_err(|e| format!("cannot read the token {}: {e}", f.display()))?;
        request = request.bearer_auth(token.trim());
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("cannot list pods from {}: {e}", config.url))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| format!("reading the pod list: {e}"))?;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        return Err(format!(
            "the API server answered {status} to the pod list: {text}"
        ));
    }
    Ok(Snapshot {
        requested_at,
        pods: parse_pod_list(&body)?,
    })
}

/// Starts the refresher on the current tokio runtime.
pub fn start(config: ApiServerConfig) -> Arc<RwLock<Shared>> {
    let shared = Arc::new(RwLock::new(Shared {
        snapshot: None,
        error: Some("the API server has not answered yet".into()),
    }));
    let state = shared.clone();
    tokio::spawn(async move {
        let client = match client(&config) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "Kubernetes API attribution cannot start: pod labels and deleted-pod filtering are off.");
                state.write().unwrap_or_else(|e| e.into_inner()).error = Some(e);
                return;
            }
        };
        let mut failing = false;
        loop {
            match list(&client, &config).await {
                Ok(snapshot) => {
                    if failing {
                        tracing::info!("The Kubernetes API server answers again.");
                    }
                    failing = false;
                    let mut s = state.write().unwrap_or_else(|e| e.into_inner());
                    s.snapshot = Some(snapshot);
                    s.error = None;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "Cannot list this node's pods from the API server; keeping the last list.");
                    }
                    failing = true;
                    state.write().unwrap_or_else(|e| e.into_inner()).error = Some(e);
                }
            }
            tokio::time::sleep(config.refresh).await;
        }
    });
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_list_is_read() {
        let body = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[
            {"metadata":{"namespace":"ml","name":"train-0","labels":{"team":"vision"},"annotations":{"cost-center":"cc-42"}},
             "spec":{"priorityClassName":"high","nodeName":"n1"},"status":{"phase":"Running"}},
            {"metadata":{"namespace":"ml","name":"done-1"},"spec":{},"status":{"phase":"Succeeded"}}]}"#;
        let pods = parse_pod_list(body).unwrap();
        let p = &pods[&("ml".to_owned(), "train-0".to_owned())];
        assert_eq!(p.labels["team"], "vision");
        assert_eq!(p.annotations["cost-center"], "cc-42");
        assert_eq!(p.priority_class.as_deref(), Some("high"));
        assert!(!p.is_finished());
        assert!(pods[&("ml".to_owned(), "done-1".to_owned())].is_finished());
        assert!(parse_pod_list(b"{\"items\": 3}").is_err());
    }
}
