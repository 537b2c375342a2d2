//! Reclaiming a pod: the Eviction API (`mode = "evict"`, PodDisruptionBudgets respected: the API
//! server's 429 becomes a 503 + Retry-After to the aggregator, which retries), or deactivating
//! the pod's Kueue Workload (`mode = "kueue"`: `spec.active = false`, Kueue then evicts and
//! requeues it).
//!
//! The Kueue Workload of a pod is found by owner: the Workload whose `ownerReferences` name the
//! pod itself (plain pods managed by Kueue) or the pod's own owner (a Job, a JobSet…).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

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
    /// A bearer token file (default: the service account's).
    pub token_file: Option<PathBuf>,
    /// The API server's CA (default: the service account's; absent file: the system roots).
    pub ca_file: Option<PathBuf>,
    /// evict (default) or kueue.
    pub mode: Option<Mode>,
    /// Kueue's API version (default `v1beta1`).
    pub kueue_version: Option<String>,
}

const SA: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A resolved client.
pub struct Kubernetes {
    api: String,
    token: Option<String>,
    mode: Mode,
    kueue_version: String,
    client: reqwest::Client,
}

impl KubernetesFile {
    /// Reads the token and CA, builds the client.
    pub fn resolve(self) -> anyhow::Result<Kubernetes> {
        use anyhow::Context;
        let api = self
            .api_server
            .unwrap_or_else(|| "https://kubernetes.default.svc".into())
            .trim_end_matches('/')
            .to_owned();
        reqwest::Url::parse(&api).with_context(|| format!("kubernetes.api_server {api:?}"))?;
        let token = match self.token_file {
            Some(p) => Some(
                std::fs::read_to_string(&p)
                    .with_context(|| format!("kubernetes.token_file {}", p.display()))?
                    .trim()
                    .to_owned(),
            ),
            None => std::fs::read_to_string(format!("{SA}/token"))
                .ok()
                .map(|t| t.trim().to_owned()),
        };
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(15));
        let ca = self
            .ca_file
            .or_else(|| Some(PathBuf::from(format!("{SA}/ca.crt"))).filter(|p| p.exists()));
        if let Some(p) = ca {
            let pem =
                std::fs::read(&p).with_context(|| format!("kubernetes.ca_file {}", p.display()))?;
            builder =
                builder.add_root_certificate(reqwest::Certificate::from_pem(&pem).with_context(
                    || format!("kubernetes.ca_file {}: not a PEM certificate", p.display()),
                )?);
        }
        Ok(Kubernetes {
            api,
            token,
            mode: self.mode.unwrap_or(Mode::Evict),
            kueue_version: self.kueue_version.unwrap_or_else(|| "v1beta1".into()),
            client: builder.build().context("the Kubernetes client")?,
        })
    }
}

fn later(message: String) -> ActError {
    ActError::Later {
        retry_after: 30,
        message,
    }
}

impl Kubernetes {
    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.request(method, format!("{}{path}", self.api));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

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
        let body = json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        });
        let r = self
            .req(
                reqwest::Method::POST,
                &format!("/api/v1/namespaces/{ns}/pods/{name}/eviction"),
            )
            .json(&body)
            .send()
            .await
            .map_err(|e| later(format!("the API server cannot be reached: {e}")))?;
        match r.status().as_u16() {
            200 | 201 => Ok(format!("evicted pod {ns}/{name}")),
            404 => Ok(format!("pod {ns}/{name} is gone already")),
            429 => Err(ActError::Later {
                retry_after: r
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(30),
                message: format!(
                    "a PodDisruptionBudget does not allow evicting {ns}/{name} now (429)"
                ),
            }),
            s => Err(later(format!("the eviction of {ns}/{name} answered {s}"))),
        }
    }

    async fn get_json(&self, path: &str) -> Result<Option<Value>, ActError> {
        let r = self
            .req(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| later(format!("the API server cannot be reached: {e}")))?;
        match r.status().as_u16() {
            200 => r
                .json()
                .await
                .map(Some)
                .map_err(|e| later(format!("GET {path}: {e}"))),
            404 => Ok(None),
            s => Err(later(format!("GET {path} answered {s}"))),
        }
    }

    async fn deactivate(&self, ns: &str, name: &str) -> Result<String, ActError> {
        let Some(pod) = self
            .get_json(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
            .await?
        else {
            return Ok(format!("pod {ns}/{name} is gone already"));
        };
        let uid = |v: &Value| v["metadata"]["uid"].as_str().map(str::to_owned);
        let mut owners: Vec<String> = uid(&pod).into_iter().collect();
        if let Some(refs) = pod["metadata"]["ownerReferences"].as_array() {
            owners.extend(
                refs.iter()
                    .filter_map(|r| r["uid"].as_str().map(str::to_owned)),
            );
        }
        let path = format!(
            "/apis/kueue.x-k8s.io/{}/namespaces/{ns}/workloads",
            self.kueue_version
        );
        let list = self.get_json(&path).await?.unwrap_or(Value::Null);
        let workload = list["items"].as_array().and_then(|items| {
            items.iter().find(|w| {
                w["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| {
                        refs.iter().any(|r| {
                            r["uid"]
                                .as_str()
                                .is_some_and(|u| owners.iter().any(|o| o == u))
                        })
                    })
            })
        });
        let Some(w) = workload.and_then(|w| w["metadata"]["name"].as_str()) else {
            return Err(ActError::Cannot(format!(
                "no Kueue Workload in {ns} is owned by pod {ns}/{name} or its owner"
            )));
        };
        let r = self
            .req(reqwest::Method::PATCH, &format!("{path}/{w}"))
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/merge-patch+json",
            )
            .body(json!({"spec": {"active": false}}).to_string())
            .send()
            .await
            .map_err(|e| later(format!("the API server cannot be reached: {e}")))?;
        match r.status().as_u16() {
            200 => Ok(format!(
                "deactivated Kueue Workload {ns}/{w} of pod {ns}/{name}"
            )),
            404 => Ok(format!("Kueue Workload {ns}/{w} is gone already")),
            s => Err(later(format!("PATCH Workload {ns}/{w} answered {s}"))),
        }
    }
}
