//! What the kubelet's pod-resources API does not say about a pod, from the Kubernetes API server:
//! its labels, annotations and priority class (for tenant and SLO rules), and whether it still
//! exists (the kubelet keeps reporting the devices of pods that finished or were deleted until it
//! reclaims them).
//!
//! One node-scoped list every `refresh` (`GET /api/v1/pods?fieldSelector=spec.nodeName=NODE&
//! resourceVersion=0`: served from the API server's watch cache, the cheapest read it offers),
//! cached in memory. RBAC: `get`/`list` on `pods` (`deploy/kubernetes/exporter-daemonset.yaml`).
//! Requests go through the one Kubernetes client (`gpuledger_client::kube`), which re-reads the
//! rotated service-account token when it changes. A failed list keeps the last one and is
//! logged once per failure streak.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gpuledger_client::kube::{self, KubeClient, KubeConfig};
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
    /// Pod label whose value is the workload's owner, named in notices (before the annotation).
    pub owner_label: Option<String>,
    /// Pod annotation whose value is the workload's owner (after the label).
    pub owner_annotation: Option<String>,
    /// Pod label whose value is the SLO class (`latency_critical`, `interactive`, `batch`).
    pub class_label: Option<String>,
    /// Priority class name → SLO class.
    pub priority_classes: HashMap<String, SloClass>,
}

impl ApiServerConfig {
    /// In-cluster defaults: the API server from `KUBERNETES_SERVICE_HOST`/`_PORT` and the
    /// mounted service-account token and CA.
    pub fn in_cluster_url() -> Option<String> {
        kube::in_cluster_url()
    }
}

/// The service-account token and CA every pod gets.
pub const SERVICE_ACCOUNT_DIR: &str = kube::SERVICE_ACCOUNT_DIR;

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
    /// The pod's owner as `Kind/name` (`Job/train`): the controller among its
    /// `ownerReferences`, else the first.
    pub owner_ref: Option<String>,
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

/// What gpuledger keeps of a listed pod, under its (namespace, name).
fn pod_meta(p: kube::Pod) -> ((String, String), PodMeta) {
    (
        (p.metadata.namespace.unwrap_or_default(), p.metadata.name),
        PodMeta {
            uid: p.metadata.uid,
            labels: p.metadata.labels,
            annotations: p.metadata.annotations,
            priority_class: p.spec.priority_class_name,
            phase: p.status.phase,
            owner_ref: p
                .metadata
                .owner_references
                .iter()
                .find(|o| o.controller)
                .or(p.metadata.owner_references.first())
                .filter(|o| !o.kind.is_empty() && !o.name.is_empty())
                .map(|o| format!("{}/{}", o.kind, o.name)),
        },
    )
}

/// The latest snapshot and the latest error, shared with the attributor.
#[derive(Debug, Default)]
pub struct Shared {
    /// The last good list.
    pub snapshot: Option<Snapshot>,
    /// Why the last list failed, if it did.
    pub error: Option<String>,
}

fn client(config: &ApiServerConfig) -> Result<KubeClient, String> {
    KubeClient::new(KubeConfig {
        api_server: config.url.clone(),
        token_file: config.token_file.clone(),
        ca_file: config.ca_file.clone(),
        timeout: Duration::from_secs(10),
    })
    .map_err(|e| e.to_string())
}

async fn list(client: &KubeClient, config: &ApiServerConfig) -> Result<Snapshot, String> {
    let requested_at = Instant::now();
    let pods = client
        .node_pods(&config.node)
        .await
        .map_err(|e| format!("cannot list this node's pods from {}: {e}", config.url))?;
    Ok(Snapshot {
        requested_at,
        pods: pods.into_iter().map(pod_meta).collect(),
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
    fn a_listed_pod_is_kept_by_namespace_and_name() {
        let body = br#"{"items":[
            {"metadata":{"namespace":"ml","name":"train-0","labels":{"team":"vision"},"annotations":{"cost-center":"cc-42"}},
             "spec":{"priorityClassName":"high","nodeName":"n1"},"status":{"phase":"Running"}},
            {"metadata":{"namespace":"ml","name":"done-1"},"spec":{},"status":{"phase":"Succeeded"}}]}"#;
        let list: kube::List<kube::Pod> = serde_json::from_slice(body).unwrap();
        let pods: HashMap<_, _> = list.items.into_iter().map(pod_meta).collect();
        let p = &pods[&("ml".to_owned(), "train-0".to_owned())];
        assert_eq!(p.labels["team"], "vision");
        assert_eq!(p.annotations["cost-center"], "cc-42");
        assert_eq!(p.priority_class.as_deref(), Some("high"));
        assert!(!p.is_finished());
        assert!(pods[&("ml".to_owned(), "done-1".to_owned())].is_finished());
    }
}
