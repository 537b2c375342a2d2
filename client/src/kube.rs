//! The Kubernetes API server, as gpuledger uses it: the exporter lists its node's pods (labels,
//! annotations, priority class, phase); the reclaimer evicts a pod or deactivates its Kueue
//! Workload. One client, typed objects, the one place that knows how to authenticate.
//!
//! Key decision: the bearer token is read from its file when the file changes, not once at
//! start. The kubelet rotates a projected service-account token (about hourly, valid for about
//! an hour more), so a process that kept the token it started with presents an expired one.
//! Each request looks at the file's metadata (modification time, length, inode: the kubelet
//! swaps a symlink, which changes all three) and reads it again only when they changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Where a pod finds its service-account token and the API server's CA.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The API server's address inside a cluster, from `KUBERNETES_SERVICE_HOST` and
/// `KUBERNETES_SERVICE_PORT` (`https://kubernetes.default.svc` is the same service by name).
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

/// How to reach and authenticate to the API server.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// Base URL (`https://kubernetes.default.svc`).
    pub api_server: String,
    /// Bearer token file (a pod's service-account token); none sends no token.
    pub token_file: Option<PathBuf>,
    /// CA bundle for the API server's certificate; none uses the system roots.
    pub ca_file: Option<PathBuf>,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// Why a request to the API server did not get a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The client cannot be built (a bad URL or CA).
    #[error("{0}")]
    Config(String),
    /// The token file cannot be read.
    #[error("cannot read the token {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No answer (connection refused, TLS, timeout).
    #[error("the API server cannot be reached: {0}")]
    Unreachable(String),
    /// An answer other than the ones the caller expects.
    #[error("{method} {path} answered {status}: {body}")]
    Status {
        /// The method.
        method: &'static str,
        /// The path.
        path: String,
        /// The status code.
        status: u16,
        /// `Retry-After`, in seconds, if given.
        retry_after: Option<u64>,
        /// The start of the body.
        body: String,
    },
    /// A 2xx whose body is not the object expected.
    #[error("{path}: {message}")]
    Decode {
        /// The path.
        path: String,
        /// serde's message.
        message: String,
    },
}

/// `metadata` of any object, as far as gpuledger reads it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace (none for cluster objects).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The object's uid.
    #[serde(default)]
    pub uid: String,
    /// Labels.
    #[serde(default)]
    pub labels: HashMap<String, String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: HashMap<String, String>,
    /// The objects that own this one (a Job owns its pods).
    #[serde(default)]
    pub owner_references: Vec<OwnerReference>,
}

/// One entry of `metadata.ownerReferences`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    /// The owner's kind (`Job`, `JobSet`, `Pod`…).
    #[serde(default)]
    pub kind: String,
    /// The owner's name.
    #[serde(default)]
    pub name: String,
    /// The owner's uid.
    #[serde(default)]
    pub uid: String,
    /// Whether this owner is the object's managing controller.
    #[serde(default)]
    pub controller: bool,
}

/// A list answer (`PodList`, `WorkloadList`…).
#[derive(Debug, Clone, Deserialize)]
pub struct List<T> {
    /// The objects.
    #[serde(default = "Vec::new")]
    pub items: Vec<T>,
}

/// A pod, as far as gpuledger reads it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pod {
    /// Metadata.
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: PodSpec,
    /// Status.
    #[serde(default)]
    pub status: PodStatus,
}

/// `spec` of a pod.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// `spec.priorityClassName`.
    #[serde(default)]
    pub priority_class_name: Option<String>,
    /// `spec.nodeName`.
    #[serde(default)]
    pub node_name: Option<String>,
}

/// `status` of a pod.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    #[serde(default)]
    pub phase: Option<String>,
}

/// Any object of which only the metadata matters (a Kueue Workload).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Meta {
    /// Metadata.
    pub metadata: ObjectMeta,
}

/// The body of `POST …/pods/{name}/eviction` (`policy/v1` Eviction).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Eviction<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: EvictionMeta<'a>,
}

#[derive(Debug, Clone, Serialize)]
struct EvictionMeta<'a> {
    name: &'a str,
    namespace: &'a str,
}

/// What a write answered, when it was an expected status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// The status code.
    pub status: u16,
    /// `Retry-After`, in seconds, if given.
    pub retry_after: Option<u64>,
}

/// The token file and what was last read from it.
#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    cached: Mutex<Option<(Stamp, String)>>,
}

/// What says a file changed: its modification time, length and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp(Option<SystemTime>, u64, u64);

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let m = std::fs::metadata(path)?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let inode = 0;
    Ok(Stamp(m.modified().ok(), m.len(), inode))
}

impl TokenFile {
    /// The token now in the file: read again when the file changed since the last read.
    fn current(&self) -> Result<String, KubeError> {
        let err = |source| KubeError::Token {
            path: self.path.clone(),
            source,
        };
        let now = stamp(&self.path).map_err(err)?;
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, token)) = cached.as_ref()
            && *seen == now
        {
            return Ok(token.clone());
        }
        let token = std::fs::read_to_string(&self.path)
            .map_err(err)?
            .trim()
            .to_owned();
        *cached = Some((now, token.clone()));
        Ok(token)
    }
}

/// A client of one API server.
#[derive(Debug)]
pub struct KubeClient {
    api: String,
    token: Option<TokenFile>,
    http: reqwest::Client,
}

/// Everything but RFC 3986's unreserved characters.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A path segment or query value, percent-encoded (names are DNS labels, but nothing from
/// outside is put into a URL unescaped).
pub fn escape(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

impl KubeClient {
    /// Builds the client: checks the URL and reads the CA now; the token is read per request
    /// (module doc), so a token file that appears later is used then ([`KubeClient::check_token`]
    /// makes a missing one an error at start).
    pub fn new(config: KubeConfig) -> Result<KubeClient, KubeError> {
        let api = config.api_server.trim_end_matches('/').to_owned();
        reqwest::Url::parse(&api)
            .map_err(|e| KubeError::Config(format!("{api:?} is not a URL: {e}")))?;
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(5)))
            .user_agent(concat!("gpuledger/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &config.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| KubeError::Config(format!("cannot read {}: {e}", ca.display())))?;
            let cert = reqwest::Certificate::from_pem(&pem).map_err(|e| {
                KubeError::Config(format!("{} is not a PEM certificate: {e}", ca.display()))
            })?;
            builder = builder.add_root_certificate(cert);
        }
        let token = config.token_file.map(|path| TokenFile {
            path,
            cached: Mutex::new(None),
        });
        Ok(KubeClient {
            api,
            token,
            http: builder
                .build()
                .map_err(|e| KubeError::Config(format!("cannot build the HTTP client: {e}")))?,
        })
    }

    /// Reads the token file now: an error if it is configured and cannot be read.
    pub fn check_token(&self) -> Result<(), KubeError> {
        self.token
            .as_ref()
            .map_or(Ok(()), |t| t.current().map(drop))
    }

    /// The API server's base URL.
    pub fn api_server(&self) -> &str {
        &self.api
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<(u16, Option<u64>, Vec<u8>), KubeError> {
        let mut request = self.http.request(method, format!("{}{path}", self.api));
        if let Some(t) = &self.token {
            request = request.bearer_auth(t.current()?);
        }
        if let Some((content_type, bytes)) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes);
        }
        let response = request
            .send()
            .await
            .map_err(|e| KubeError::Unreachable(e.without_url().to_string()))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
        let bytes = response
            .bytes()
            .await
            .map_err(|e| KubeError::Unreachable(e.without_url().to_string()))?;
        Ok((status, retry_after, bytes.to_vec()))
    }

    fn unexpected(
        method: &'static str,
        path: &str,
        (status, retry_after, body): (u16, Option<u64>, Vec<u8>),
    ) -> KubeError {
        KubeError::Status {
            method,
            path: path.to_owned(),
            status,
            retry_after,
            body: String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
        }
    }

    /// `GET path` as `T`; `None` on 404.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, KubeError> {
        let answer = self.send(reqwest::Method::GET, path, None).await?;
        match answer.0 {
            200 => serde_json::from_slice(&answer.2)
                .map(Some)
                .map_err(|e| KubeError::Decode {
                    path: path.to_owned(),
                    message: e.to_string(),
                }),
            404 => Ok(None),
            _ => Err(Self::unexpected("GET", path, answer)),
        }
    }

    /// The pods scheduled on `node` (`fieldSelector=spec.nodeName=NODE`, `resourceVersion=0`:
    /// served from the API server's watch cache, the cheapest read it offers).
    pub async fn node_pods(&self, node: &str) -> Result<Vec<Pod>, KubeError> {
        let path = format!(
            "/api/v1/pods?fieldSelector={}&resourceVersion=0",
            escape(&format!("spec.nodeName={node}"))
        );
        Ok(self
            .get::<List<Pod>>(&path)
            .await?
            .map(|l| l.items)
            .unwrap_or_default())
    }

    /// Asks for the eviction of a pod (the Eviction API: PodDisruptionBudgets are respected).
    /// 200/201 (evicted), 404 (gone) and 429 (a budget forbids it now) are answers; anything
    /// else is an error.
    pub async fn evict(&self, namespace: &str, name: &str) -> Result<Answered, KubeError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            escape(namespace),
            escape(name)
        );
        let body = serde_json::to_vec(&Eviction {
            api_version: "policy/v1",
            kind: "Eviction",
            metadata: EvictionMeta { name, namespace },
        })
        .expect("an eviction serializes");
        let answer = self
            .send(
                reqwest::Method::POST,
                &path,
                Some(("application/json", body)),
            )
            .await?;
        match answer.0 {
            200 | 201 | 404 | 429 => Ok(Answered {
                status: answer.0,
                retry_after: answer.1,
            }),
            _ => Err(Self::unexpected("POST", &path, answer)),
        }
    }

    /// `PATCH path` with a JSON merge patch. 200 and 404 are answers.
    pub async fn merge_patch(
        &self,
        path: &str,
        patch: &serde_json::Value,
    ) -> Result<Answered, KubeError> {
        let body = serde_json::to_vec(patch).expect("a JSON value serializes");
        let answer = self
            .send(
                reqwest::Method::PATCH,
                path,
                Some(("application/merge-patch+json", body)),
            )
            .await?;
        match answer.0 {
            200 | 404 => Ok(Answered {
                status: answer.0,
                retry_after: answer.1,
            }),
            _ => Err(Self::unexpected("PATCH", path, answer)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_list_is_read_as_typed_objects() {
        let body = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[
            {"metadata":{"namespace":"ml","name":"train-0","uid":"u1","labels":{"team":"vision"},
              "annotations":{"cost-center":"cc-42"},
              "ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":"train","uid":"j1"}]},
             "spec":{"priorityClassName":"high","nodeName":"n1"},"status":{"phase":"Running"}},
            {"metadata":{"namespace":"ml","name":"done-1"},"spec":{},"status":{"phase":"Succeeded"}}]}"#;
        let pods: List<Pod> = serde_json::from_slice(body).unwrap();
        let p = &pods.items[0];
        assert_eq!(p.metadata.labels["team"], "vision");
        assert_eq!(p.metadata.annotations["cost-center"], "cc-42");
        assert_eq!(p.metadata.owner_references[0].kind, "Job");
        assert_eq!(p.metadata.owner_references[0].uid, "j1");
        assert_eq!(p.spec.priority_class_name.as_deref(), Some("high"));
        assert_eq!(pods.items[1].status.phase.as_deref(), Some("Succeeded"));
        assert!(serde_json::from_slice::<List<Pod>>(b"{\"items\": 3}").is_err());
    }

    #[test]
    fn a_rotated_token_file_is_read_again_and_an_unchanged_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let t = TokenFile {
            path: path.clone(),
            cached: Mutex::new(None),
        };
        assert_eq!(t.current().unwrap(), "first");
        // The kubelet writes the new token beside the old one and swaps it in (a new inode).
        let next = dir.path().join("token.new");
        std::fs::write(&next, "second-token\n").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(t.current().unwrap(), "second-token");
        assert_eq!(t.current().unwrap(), "second-token");
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(t.current(), Err(KubeError::Token { .. })));
    }

    #[test]
    fn names_are_escaped_in_paths() {
        assert_eq!(escape("spec.nodeName=n 1/x"), "spec.nodeName%3Dn%201%2Fx");
        assert_eq!(escape("gpu-node-7.a_b~"), "gpu-node-7.a_b~");
    }
}
