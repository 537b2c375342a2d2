//! Reclaiming a pod: the Eviction API (`mode = "evict"`, PodDisruptionBudgets respected: the API
//! server's 429 becomes a 503 + Retry-After to the aggregator, which retries), or deactivating
//! the pod's Kueue Workload (`mode = "kueue"`: `spec.active = false`, Kueue then evicts and
//! requeues it). Requests go through the one Kubernetes client (`gpuledger_client::kube`), which
//! re-reads the rotated service-account token when it changes.
//!
//! The Kueue Workload of a pod is found by owner: the Workload whose `ownerReferences` name the
//! pod itself (plain pods managed by Kueue) or the pod's own owner (a Job, a JobSet…).

use std::path::PathBuf;
use std::time::Duration;

use gpuledger_client::kube::{self, KubeClient, KubeConfig, KubeError};
use serde::Deserialize;

use super::ActError;

/// How a pod is reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `POST …/pods/{name}/eviction`.
    Evict,
    /// `PATCH` the Kueue Workload: `spec.active = false`.
    Kueue,
}

/// `[kubernetes]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesFile {
    /// The API server (default: the in-cluster `https://kubernetes.default.svc`).
    pub api_server: Option<String>,
    /// A bearer token file (default: the service account's, when it exists).
    pub token_file: Option<PathBuf>,
    /// The API server's CA (default: the service account's; absent file: the system roots).
    pub ca_file: Option<PathBuf>,
    /// evict (default) or kueue.
    pub mode: Option<Mode>,
    /// Kueue's API version (default `v1beta1`).
    pub kueue_version: Option<String>,
}

/// A resolved client.
pub struct Kubernetes {
    client: KubeClient,
    mode: Mode,
    kueue_version: String,
}

impl KubernetesFile {
    /// Checks the URL, the token and the CA, builds the client.
    pub fn resolve(self) -> anyhow::Result<Kubernetes> {
        use anyhow::Context;
        let sa = |f: &str| PathBuf::from(kube::SERVICE_ACCOUNT_DIR).join(f);
        let api = self
            .api_server
            .unwrap_or_else(|| "https://kubernetes.default.svc".into());
        let token_file = self
            .token_file
            .or_else(|| Some(sa("token")).filter(|p| p.exists()));
        let ca_file = self
            .ca_file
            .or_else(|| Some(sa("ca.crt")).filter(|p| p.exists()));
        let client = KubeClient::new(KubeConfig {
            api_server: api,
            token_file,
            ca_file,
            timeout: Duration::from_secs(15),
        })
        .context("kubernetes")?;
        client.check_token().context("kubernetes.token_file")?;
        Ok(Kubernetes {
            client,
            mode: self.mode.unwrap_or(Mode::Evict),
            kueue_version: self.kueue_version.unwrap_or_else(|| "v1beta1".into()),
        })
    }
}

fn later(message: String) -> ActError {
    ActError::Later {
        retry_after: 30,
        message,
    }
}

/// A failed request: the action waits (the aggregator retries).
fn failed(e: KubeError) -> ActError {
    later(e.to_string())
}

impl Kubernetes {
    /// The mode, in words.
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Evict => "Kubernetes evictions",
            Mode::Kueue => "Kueue Workload deactivation",
        }
    }

    /// What `reclaim` would do.
    pub fn describe(&self, ns: &str, name: &str) -> String {
        match self.mode {
            Mode::Evict => format!("evict pod {ns}/{name}"),
            Mode::Kueue => format!("deactivate the Kueue Workload of pod {ns}/{name}"),
        }
    }

    /// Reclaims the pod.
    pub async fn reclaim(&self, ns: &str, name: &str) -> Result<String, ActError> {
        match self.mode {
            Mode::Evict => self.evict(ns, name).await,
            Mode::Kueue => self.deactivate(ns, name).await,
        }
    }

    async fn evict(&self, ns: &str, name: &str) -> Result<String, ActError> {
        let answer = self.client.evict(ns, name).await.map_err(failed)?;
        match answer.status {
            404 => Ok(format!("pod {ns}/{name} is gone already")),
            429 => Err(ActError::Later {
                retry_after: answer.retry_after.unwrap_or(30),
                message: format!(
                    "a PodDisruptionBudget does not allow evicting {ns}/{name} now (429)"
                ),
            }),
            _ => Ok(format!("evicted pod {ns}/{name}")),
        }
    }

    async fn deactivate(&self, ns: &str, name: &str) -> Result<String, ActError> {
        let pod_path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            kube::escape(ns),
            kube::escape(name)
        );
        let Some(pod) = self
            .client
            .get::<kube::Pod>(&pod_path)
            .await
            .map_err(failed)?
        else {
            return Ok(format!("pod {ns}/{name} is gone already"));
        };
        let mut owners: Vec<String> = vec![pod.metadata.uid.clone()];
        owners.extend(pod.metadata.owner_references.iter().map(|r| r.uid.clone()));
        owners.retain(|u| !u.is_empty());
        let path = format!(
            "/apis/kueue.x-k8s.io/{}/namespaces/{}/workloads",
            kube::escape(&self.kueue_version),
            kube::escape(ns)
        );
        let list = self
            .client
            .get::<kube::List<kube::Meta>>(&path)
            .await
            .map_err(failed)?
            .map(|l| l.items)
            .unwrap_or_default();
        let workload = list.into_iter().find(|w| {
            w.metadata
                .owner_references
                .iter()
                .any(|r| owners.iter().any(|o| *o == r.uid))
        });
        let Some(w) = workload.map(|w| w.metadata.name) else {
            return Err(ActError::Cannot(format!(
                "no Kueue Workload in {ns} is owned by pod {ns}/{name} or its owner"
            )));
        };
        let answer = self
            .client
            .merge_patch(
                &format!("{path}/{}", kube::escape(&w)),
                &serde_json::json!({"spec": {"active": false}}),
            )
            .await
            .map_err(failed)?;
        match answer.status {
            404 => Ok(format!("Kueue Workload {ns}/{w} is gone already")),
            _ => Ok(format!(
                "deactivated Kueue Workload {ns}/{w} of pod {ns}/{name}"
            )),
        }
    }
}
