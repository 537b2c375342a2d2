//! Kubernetes: who holds each device, from the kubelet's pod-resources gRPC API v1 (`List`) over
//! its unix socket (default `/var/lib/kubelet/pod-resources/kubelet.sock`), and which devices it
//! can hand out (`GetAllocatableResources`).
//!
//! A background task polls both every `poll_interval` (5 s by default: far inside the
//! endpoint's rate limit, and it backs off on `ResourceExhausted`) and publishes a device → pod
//! table; the sampler applies the latest table each second. Devices assigned or allocatable that
//! match no instance on the node are logged once and counted ([`DeviceCounts`]). Only NVIDIA GPU
//! resources are read ([`is_gpu_resource`]). Each poll opens a fresh connection,
//! so a kubelet restart (which recreates the socket) heals by itself; an absent socket or a failed
//! poll is logged once per failure streak, keeps the last good table, and shows as
//! `gpuledger_exporter_collector_success{collector="attribution_kubelet"} 0`.
//!
//! Device ids in the wild ([`parse_device_id`]): `GPU-<uuid>`, `MIG-<uuid>`, the EKS
//! time-slicing suffix `GPU-<uuid>::N`, GKE's `nvidia0` / `nvidia0/gi3` (GPU index, GPU instance
//! id), plain indices, and DRA claims, whose devices are read from CDI device names and the
//! device name ([`parse_claim_device`]). The tenant is the pod's namespace, or what the namespace
//! map says; the workload is `namespace/pod`; the SLO class comes from a namespace map.
//!
//! With API-server access ([`apiserver`]), pod labels, annotations and priority class refine the
//! tenant and SLO class, and pods the kubelet still reports but that finished (phase Succeeded or
//! Failed) or no longer exist are not charged. Without it, the kubelet's word is taken as is.
//!
//! Proto: `exporter/proto/podresources/v1/api.proto` (vendored from k8s.io/kubelet).

pub mod apiserver;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use gpuledger_schema::{Attribution, SloClass};

use super::{Attributor, DeviceCounts};
use crate::source::Reading;

/// Code generated from the vendored pod-resources proto.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("v1");
}

/// How a device is named by the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceKey {
    /// A GPU (`GPU-…`) or MIG (`MIG-…`) UUID.
    Uuid(String),
    /// A GPU by NVML index.
    Index(u32),
    /// A MIG GPU instance by GPU index and GPU instance id.
    Instance(u32, u32),
}

/// Reads a device-plugin device id.
pub fn parse_device_id(id: &str) -> Option<DeviceKey> {
    let id = id.trim();
    // EKS / the NVIDIA device plugin's time-slicing replicas: `GPU-<uuid>::<replica>`.
    let id = match id.rsplit_once("::") {
        Some((base, replica)) if replica.parse::<u32>().is_ok() => base,
        _ => id,
    };
    if id.starts_with("GPU-") || id.starts_with("MIG-") {
        return Some(DeviceKey::Uuid(id.to_owned()));
    }
    if let Some(rest) = id.strip_prefix("nvidia") {
        return match rest.split_once("/gi") {
            Some((gpu, gi)) => Some(DeviceKey::Instance(gpu.parse().ok()?, gi.parse().ok()?)),
            None => Some(DeviceKey::Index(rest.parse().ok()?)),
        };
    }
    id.parse().ok().map(DeviceKey::Index)
}

/// The first `GPU-…`/`MIG-…` UUID inside `s` (CDI names such as `nvidia.com/gpu=MIG-…`).
fn find_uuid(s: &str) -> Option<String> {
    let start = s.find("MIG-").or_else(|| s.find("GPU-"))?;
    let tail = &s[start..];
    let end = tail[4..]
        .find(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
        .map_or(tail.len(), |e| e + 4);
    (end > 4).then(|| tail[..end].to_owned())
}

/// Reads a DRA claim's device: a UUID in its CDI device names or device name, else a device name
/// of the form `gpu-<index>`.
pub fn parse_claim_device(c: &proto::ClaimResource) -> Option<DeviceKey> {
    c.cdi_devices
        .iter()
        .find_map(|d| find_uuid(&d.name))
        .or_else(|| find_uuid(&c.device_name))
        .map(DeviceKey::Uuid)
        .or_else(|| {
            c.device_name
                .strip_prefix("gpu-")
                .and_then(|n| n.parse().ok())
                .map(DeviceKey::Index)
        })
}

/// A pod holding a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
}

/// Whether a device-plugin resource is an NVIDIA GPU or MIG resource: `nvidia.com/gpu`, its
/// renames `nvidia.com/gpu.<name>` (`gpu.shared` for time-slicing), and `nvidia.com/mig-<profile>`.
/// Other plugins' ids must not be read as GPU indices: the Network Operator's RDMA devices
/// (`nvidia.com/rdma_shared_device_a`) are numbered `0`, `1`, … too.
pub fn is_gpu_resource(resource_name: &str) -> bool {
    resource_name == "nvidia.com/gpu"
        || resource_name.starts_with("nvidia.com/gpu.")
        || resource_name.starts_with("nvidia.com/mig-")
}

/// Whether a DRA driver is NVIDIA's GPU driver (not, say, `compute-domain.nvidia.com`).
fn is_gpu_driver(driver_name: &str) -> bool {
    driver_name == "gpu.nvidia.com"
}

/// Builds the device → holders table from a `List` answer.
pub fn device_table(response: &proto::ListPodResourcesResponse) -> HashMap<DeviceKey, Vec<Holder>> {
    let mut table: HashMap<DeviceKey, Vec<Holder>> = HashMap::new();
    for pod in &response.pod_resources {
        let holder = Holder {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
        };
        for c in &pod.containers {
            let plugin = c
                .devices
                .iter()
                .filter(|d| is_gpu_resource(&d.resource_name))
                .flat_map(|d| d.device_ids.iter().filter_map(|id| parse_device_id(id)));
            let dra = c.dynamic_resources.iter().flat_map(|r| {
                r.claim_resources
                    .iter()
                    .filter(|c| is_gpu_driver(&c.driver_name))
                    .filter_map(parse_claim_device)
            });
            for key in plugin.chain(dra) {
                let holders = table.entry(key).or_default();
                if !holders.contains(&holder) {
                    holders.push(holder.clone());
                }
            }
        }
    }
    for holders in table.values_mut() {
        holders.sort();
    }
    table
}

/// Builds the device → id count table from a `GetAllocatableResources` answer: every GPU
/// device the kubelet can hand out, with how many ids name it (time-slicing replicas `::N` name
/// one GPU several times).
pub fn allocatable_table(
    response: &proto::AllocatableResourcesResponse,
) -> HashMap<DeviceKey, u32> {
    let mut table = HashMap::new();
    for d in response
        .devices
        .iter()
        .filter(|d| is_gpu_resource(&d.resource_name))
    {
        for key in d.device_ids.iter().filter_map(|id| parse_device_id(id)) {
            *table.entry(key).or_default() += 1;
        }
    }
    table
}

/// Every name the kubelet may give a reading's device: its UUIDs, and its NVML index (a whole
/// GPU) or GPU index and GPU instance id (a MIG slice).
fn device_keys(r: &Reading, index: u32) -> Vec<DeviceKey> {
    match (&r.mig_uuid, r.instance.gpu_instance_id) {
        (mig, Some(gi)) => mig
            .iter()
            .map(|u| DeviceKey::Uuid(u.clone()))
            .chain([DeviceKey::Instance(index, gi)])
            .collect(),
        (_, None) => vec![
            DeviceKey::Uuid(r.instance.gpu_uuid.clone()),
            DeviceKey::Index(index),
        ],
    }
}

/// Kubelet attribution settings.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// The pod-resources socket.
    pub socket: PathBuf,
    /// How often to call `List`.
    pub poll_interval: Duration,
    /// Namespace → tenant (unmapped namespaces are their own tenant).
    pub namespace_tenants: HashMap<String, String>,
    /// Namespace → SLO class.
    pub namespace_classes: HashMap<String, SloClass>,
    /// Pod metadata and deleted-pod filtering from the API server, when configured.
    pub apiserver: Option<apiserver::ApiServerConfig>,
}

#[derive(Default)]
struct State {
    table: HashMap<DeviceKey, Vec<Holder>>,
    /// Allocatable devices (id count each); empty until known.
    allocatable: HashMap<DeviceKey, u32>,
    /// When each holder in the table was first listed by the kubelet.
    first_seen: HashMap<Holder, Instant>,
    error: Option<String>,
}

/// The kubelet attributor: a poller task and the table it publishes.
pub struct KubeletAttributor {
    config: KubeletConfig,
    state: Arc<RwLock<State>>,
    api: Option<Arc<RwLock<apiserver::Shared>>>,
    /// Devices the kubelet assigns or can allocate that match no instance here, as of the last
    /// `apply`; each is logged once (a device-plugin MIG strategy or id form gpuledger does not
    /// map).
    unmatched: std::sync::Mutex<(Vec<DeviceKey>, std::collections::HashSet<DeviceKey>)>,
    counts: std::sync::Mutex<DeviceCounts>,
}

/// A failed poll of the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollError {
    /// What went wrong, as a sentence fragment.
    pub message: String,
    /// The kubelet's rate limiter refused the call (`ResourceExhausted`): back off.
    pub throttled: bool,
}

impl PollError {
    fn of(call: &str, s: &tonic::Status) -> PollError {
        PollError {
            message: format!("kubelet {call} failed: {} ({})", s.message(), s.code()),
            throttled: s.code() == tonic::Code::ResourceExhausted,
        }
    }
}

/// One poll's answers.
#[derive(Debug, Clone)]
pub struct Polled {
    /// `List`.
    pub pods: proto::ListPodResourcesResponse,
    /// `GetAllocatableResources`: `Ok(None)` from a kubelet that does not serve it (before 1.23,
    /// or the feature gate off); `Err` when it failed this time. The `List` answer stands either
    /// way.
    pub allocatable: Result<Option<proto::AllocatableResourcesResponse>, PollError>,
}

/// Asks the kubelet at `socket` for its pods' devices (`List`) and its allocatable devices
/// (`GetAllocatableResources`), over one fresh connection.
pub async fn poll(socket: PathBuf) -> Result<Polled, PollError> {
    let fail = |message: String| PollError {
        message,
        throttled: false,
    };
    if !socket.exists() {
        return Err(fail(format!(
            "the kubelet pod-resources socket {} does not exist",
            socket.display()
        )));
    }
    // The URI is a placeholder: the connector below dials the unix socket.
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .map_err(|e| fail(format!("cannot connect to the kubelet: {e}")))?;
    let mut client = proto::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    let pods = client
        .list(proto::ListPodResourcesRequest {})
        .await
        .map_err(|s| PollError::of("List", &s))?
        .into_inner();
    // Kubelets 1.21–1.22 with the feature gate off answer `Unknown` ("... disabled"), older ones
    // `Unimplemented`.
    let allocatable = match client
        .get_allocatable_resources(proto::AllocatableResourcesRequest {})
        .await
    {
        Ok(r) => Ok(Some(r.into_inner())),
        Err(s)
            if s.code() == tonic::Code::Unimplemented
                || (s.code() == tonic::Code::Unknown && s.message().contains("disabled")) =>
        {
            Ok(None)
        }
        Err(s) => Err(PollError::of("GetAllocatableResources", &s)),
    };
    Ok(Polled { pods, allocatable })
}

impl KubeletAttributor {
    /// Starts the poller on the current tokio runtime.
    pub fn start(config: KubeletConfig) -> KubeletAttributor {
        let state = Arc::new(RwLock::new(State {
            error: Some("the kubelet has not answered yet".into()),
            ..State::default()
        }));
        let (shared, socket, interval) =
            (state.clone(), config.socket.clone(), config.poll_interval);
        tokio::spawn(async move {
            let (mut failing, mut allocatable_failing) = (false, false);
            loop {
                let mut wait = interval;
                match poll(socket.clone()).await {
                    Ok(polled) => {
                        let table = device_table(&polled.pods);
                        if failing {
                            tracing::info!("The kubelet answers again.");
                        }
                        failing = false;
                        let mut s = shared.write().unwrap_or_else(|e| e.into_inner());
                        let now = Instant::now();
                        let mut first_seen = HashMap::new();
                        for h in table.values().flatten() {
                            let seen = s.first_seen.get(h).copied().unwrap_or(now);
                            first_seen.insert(h.clone(), seen);
                        }
                        s.first_seen = first_seen;
                        s.table = table;
                        match &polled.allocatable {
                            Ok(answer) => {
                                if allocatable_failing {
                                    tracing::info!(
                                        "The kubelet answers GetAllocatableResources again."
                                    );
                                }
                                allocatable_failing = false;
                                s.allocatable =
                                    answer.as_ref().map(allocatable_table).unwrap_or_default();
                            }
                            // A failure keeps the last allocatable view; List's answer stands.
                            Err(e) => {
                                if !allocatable_failing {
                                    tracing::warn!(error = %e.message, "Cannot read allocatable devices from the kubelet; keeping the last known ones.");
                                }
                                allocatable_failing = true;
                                if e.throttled {
                                    wait = interval * 4; // the kubelet's rate limiter: back off
                                }
                            }
                        }
                        s.error = None;
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(error = %e.message, "Cannot read pod resources from the kubelet; keeping the last known allocations.");
                        }
                        if e.throttled {
                            wait = interval * 4; // the kubelet's rate limiter: back off
                        }
                        failing = true;
                        shared.write().unwrap_or_else(|e| e.into_inner()).error = Some(e.message);
                    }
                }
                tokio::time::sleep(wait).await;
            }
        });
        let api = config.apiserver.clone().map(apiserver::start);
        KubeletAttributor {
            config,
            state,
            api,
            unmatched: Default::default(),
            counts: Default::default(),
        }
    }

    /// Devices the kubelet assigned or can allocate, at the last `apply`, that no instance of
    /// this node matched.
    pub fn unmatched(&self) -> Vec<DeviceKey> {
        self.unmatched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// Whether `h` still holds its devices, as far as the API server's last list can tell: a
    /// finished pod does not; a pod the list lacks does not, if the kubelet showed it at least a
    /// refresh interval before that list was asked for (so that a pod created since is not
    /// mistaken for a deleted one). No list yet: the kubelet's word.
    fn is_live(
        &self,
        h: &Holder,
        first_seen: Option<&Instant>,
        snapshot: Option<&apiserver::Snapshot>,
    ) -> bool {
        let Some(s) = snapshot else { return true };
        match s.pods.get(&(h.namespace.clone(), h.pod.clone())) {
            Some(meta) => !meta.is_finished(),
            None => {
                let grace = self
                    .config
                    .apiserver
                    .as_ref()
                    .map_or(Duration::ZERO, |a| a.refresh);
                first_seen.is_none_or(|seen| *seen + grace >= s.requested_at)
            }
        }
    }

    fn attribution(&self, h: &Holder, meta: Option<&apiserver::PodMeta>) -> Attribution {
        let api = self.config.apiserver.as_ref();
        let from_meta =
            |key: Option<&String>, map: fn(&apiserver::PodMeta) -> &HashMap<String, String>| {
                Some(map(meta?).get(key?)?.clone()).filter(|v| !v.is_empty())
            };
        let tenant = from_meta(api.and_then(|a| a.tenant_label.as_ref()), |m| &m.labels)
            .or_else(|| {
                from_meta(api.and_then(|a| a.tenant_annotation.as_ref()), |m| {
                    &m.annotations
                })
            })
            .or_else(|| self.config.namespace_tenants.get(&h.namespace).cloned())
            .unwrap_or_else(|| h.namespace.clone());
        let slo_class = from_meta(api.and_then(|a| a.class_label.as_ref()), |m| &m.labels)
            .and_then(|v| v.parse().ok())
            .or_else(|| {
                let pc = meta?.priority_class.as_ref()?;
                api?.priority_classes.get(pc).copied()
            })
            .or_else(|| self.config.namespace_classes.get(&h.namespace).copied());
        // Named in notices only: a value that could not travel is left out, never sent.
        let wire = |v: Option<String>| v.filter(|v| gpuledger_schema::sample::is_wire_name(v));
        let owner = wire(
            from_meta(api.and_then(|a| a.owner_label.as_ref()), |m| &m.labels).or_else(|| {
                from_meta(api.and_then(|a| a.owner_annotation.as_ref()), |m| {
                    &m.annotations
                })
            }),
        );
        Attribution {
            tenant: Some(tenant),
            workload: Some(format!("{}/{}", h.namespace, h.pod)),
            slo_class,
            owner,
            owner_ref: wire(meta.and_then(|m| m.owner_ref.clone())),
        }
    }
}

impl Attributor for KubeletAttributor {
    fn name(&self) -> &'static str {
        "kubelet"
    }

    fn collector(&self) -> &'static str {
        "attribution_kubelet"
    }

    fn refresh(&mut self) -> Result<(), String> {
        if let Some(e) = &self.state.read().unwrap_or_else(|e| e.into_inner()).error {
            return Err(e.clone());
        }
        match self
            .api
            .as_ref()
            .map(|a| a.read().unwrap_or_else(|e| e.into_inner()))
        {
            Some(a) if a.error.is_some() => Err(a.error.clone().unwrap_or_default()),
            _ => Ok(()),
        }
    }

    /// A pod is named from its UID through the API server's list; without API-server access the
    /// kubelet's pod-resources answer has no UIDs, and the pod stays unnamed.
    fn owner_attribution(&self, owner: &super::shares::Owner) -> Option<Attribution> {
        let super::shares::Owner::Pod { uid } = owner else {
            return None;
        };
        let api = self.api.as_ref()?.read().unwrap_or_else(|e| e.into_inner());
        let ((namespace, pod), meta) = api
            .snapshot
            .as_ref()?
            .pods
            .iter()
            .find(|(_, m)| &m.uid == uid)?;
        let holder = Holder {
            namespace: namespace.clone(),
            pod: pod.clone(),
        };
        Some(self.attribution(&holder, Some(meta)))
    }

    fn apply(&self, readings: &mut [Reading]) {
        // Several pods on one device (time-slicing) are charged to the first live one by name;
        // what each of them uses is the per-process view's job (`shares`).
        let named = self.holders(readings);
        for (r, named) in readings.iter_mut().zip(named) {
            if let Some(a) = named.into_iter().next() {
                r.attribution = a;
            }
        }
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let gpu_index = super::gpu_indices(readings);
        // Every name an instance of this node goes by.
        let local: std::collections::HashSet<DeviceKey> = readings
            .iter()
            .flat_map(|r| device_keys(r, gpu_index[&r.instance.gpu_uuid]))
            .collect();
        let mut unmatched: Vec<DeviceKey> = state
            .table
            .keys()
            .chain(state.allocatable.keys())
            .filter(|k| !local.contains(*k))
            .cloned()
            .collect();
        unmatched.sort_by_key(|k| format!("{k:?}"));
        unmatched.dedup();
        *self.counts.lock().unwrap_or_else(|e| e.into_inner()) = DeviceCounts {
            assigned: state.table.len() as u64,
            allocatable: Some(state.allocatable.len() as u64),
            unmatched: unmatched.len() as u64,
        };
        let mut u = self.unmatched.lock().unwrap_or_else(|e| e.into_inner());
        for k in &unmatched {
            if u.1.insert(k.clone()) {
                match state.table.get(k) {
                    Some(holders) => {
                        tracing::warn!(device = ?k, holders = ?holders, "The kubelet assigns a device that matches no GPU or MIG instance on this node; its pods are not charged for it. Check the device plugin's MIG strategy and device ids.")
                    }
                    None => {
                        tracing::warn!(device = ?k, "The kubelet can allocate a device that matches no GPU or MIG instance on this node; a pod given it would not be charged. Check the device plugin's MIG strategy and device ids.")
                    }
                }
            }
        }
        u.0 = unmatched;
    }

    fn device_counts(&self) -> Option<DeviceCounts> {
        Some(*self.counts.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn holders(&self, readings: &[Reading]) -> Vec<Vec<Attribution>> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let api = self
            .api
            .as_ref()
            .map(|a| a.read().unwrap_or_else(|e| e.into_inner()));
        let snapshot = api.as_ref().and_then(|a| a.snapshot.as_ref());
        let gpu_index = super::gpu_indices(readings);
        readings
            .iter()
            .map(|r| {
                let keys = device_keys(r, gpu_index[&r.instance.gpu_uuid]);
                keys.iter()
                    .find_map(|k| state.table.get(k))
                    .into_iter()
                    .flatten()
                    .filter(|h| self.is_live(h, state.first_seen.get(*h), snapshot))
                    .map(|h| {
                        let meta = snapshot
                            .and_then(|s| s.pods.get(&(h.namespace.clone(), h.pod.clone())));
                        self.attribution(h, meta)
                    })
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_schema::{Counters, Instance};

    #[tokio::test]
    async fn devices_that_match_no_instance_are_reported() {
        let a = KubeletAttributor::start(KubeletConfig {
            socket: "/nonexistent/kubelet.sock".into(),
            poll_interval: Duration::from_secs(3600),
            namespace_tenants: HashMap::new(),
            namespace_classes: HashMap::new(),
            apiserver: None,
        });
        let holder = |pod: &str| {
            vec![Holder {
                namespace: "ml".into(),
                pod: pod.into(),
            }]
        };
        {
            let mut s = a.state.write().unwrap();
            s.table.insert(DeviceKey::Uuid("GPU-1".into()), holder("a"));
            // A MIG slice by GPU index and GPU instance id that this node does not have.
            s.table.insert(DeviceKey::Instance(0, 9), holder("b"));
            // Allocatable: GPU-1 as two time-slicing replicas, and a MIG device not here.
            s.allocatable.insert(DeviceKey::Uuid("GPU-1".into()), 2);
            s.allocatable
                .insert(DeviceKey::Uuid("MIG-elsewhere".into()), 1);
        }
        let mut readings = vec![Reading {
            instance: Instance {
                node: "n".into(),
                gpu_uuid: "GPU-1".into(),
                gpu_model: "m".into(),
                mig_profile: None,
                gpu_instance_id: None,
                placement_start: None,
                placement_size: None,
            },
            mig_uuid: None,
            gpu_index: None,
            attribution: Attribution::default(),
            counters: Counters::default(),
        }];
        a.apply(&mut readings);
        assert_eq!(readings[0].attribution.workload.as_deref(), Some("ml/a"));
        assert_eq!(
            a.unmatched(),
            [
                DeviceKey::Instance(0, 9),
                DeviceKey::Uuid("MIG-elsewhere".into())
            ]
        );
        assert_eq!(
            a.device_counts(),
            Some(DeviceCounts {
                assigned: 2,
                allocatable: Some(2),
                unmatched: 2
            })
        );
    }

    #[test]
    fn only_nvidia_resources_are_read_as_gpus() {
        let devices = |resource: &str, ids: &[&str]| proto::ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|i| i.to_string()).collect(),
            topology: None,
        };
        let response = proto::ListPodResourcesResponse {
            pod_resources: vec![proto::PodResources {
                name: "p".into(),
                namespace: "ml".into(),
                containers: vec![proto::ContainerResources {
                    name: "main".into(),
                    devices: vec![
                        devices("nvidia.com/gpu", &["1"]),
                        // An RDMA NIC's device "0" is not GPU 0.
                        devices("nvidia.com/rdma_shared_device_a", &["0"]),
                        devices("rdma/hca_shared_devices_a", &["0"]),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let table = device_table(&response);
        assert_eq!(table.keys().collect::<Vec<_>>(), [&DeviceKey::Index(1)]);
        let allocatable = allocatable_table(&proto::AllocatableResourcesResponse {
            devices: vec![
                devices("nvidia.com/gpu", &["GPU-a::0", "GPU-a::1", "GPU-b::0"]),
                devices("nvidia.com/mig-1g.10gb", &["MIG-c"]),
                devices("nvidia.com/gpu.shared", &["GPU-d::0"]),
                devices("amd.com/gpu", &["0"]),
            ],
            ..Default::default()
        });
        assert_eq!(
            allocatable,
            HashMap::from([
                (DeviceKey::Uuid("GPU-a".into()), 2),
                (DeviceKey::Uuid("GPU-b".into()), 1),
                (DeviceKey::Uuid("MIG-c".into()), 1),
                (DeviceKey::Uuid("GPU-d".into()), 1),
            ])
        );
    }

    #[test]
    fn every_device_id_form_in_the_wild_is_read() {
        let u = |s: &str| Some(DeviceKey::Uuid(s.into()));
        assert_eq!(
            parse_device_id("GPU-8ebdae18-e942-4bfb-9c80-0c73a65e366b"),
            u("GPU-8ebdae18-e942-4bfb-9c80-0c73a65e366b")
        );
        assert_eq!(
            parse_device_id("MIG-5c0fa9d8-1111-2222-3333-444455556666"),
            u("MIG-5c0fa9d8-1111-2222-3333-444455556666")
        );
        assert_eq!(
            parse_device_id("GPU-8ebdae18-e942-4bfb-9c80-0c73a65e366b::3"),
            u("GPU-8ebdae18-e942-4bfb-9c80-0c73a65e366b")
        );
        assert_eq!(
            parse_device_id("nvidia0/gi3"),
            Some(DeviceKey::Instance(0, 3))
        );
        assert_eq!(parse_device_id("nvidia2"), Some(DeviceKey::Index(2)));
        assert_eq!(parse_device_id("1"), Some(DeviceKey::Index(1)));
        assert_eq!(parse_device_id("something-else"), None);
        let claim = |cdi: &[&str], name: &str| proto::ClaimResource {
            cdi_devices: cdi
                .iter()
                .map(|n| proto::CdiDevice {
                    name: n.to_string(),
                })
                .collect(),
            driver_name: "gpu.nvidia.com".into(),
            pool_name: "node-a".into(),
            device_name: name.into(),
            share_id: None,
        };
        assert_eq!(
            parse_claim_device(&claim(
                &["k8s.gpu.nvidia.com/device=MIG-5c0fa9d8-1111-2222-3333-444455556666"],
                "gpu-0-mig-1"
            )),
            u("MIG-5c0fa9d8-1111-2222-3333-444455556666")
        );
        assert_eq!(
            parse_claim_device(&claim(&[], "gpu-4")),
            Some(DeviceKey::Index(4))
        );
        assert_eq!(parse_claim_device(&claim(&[], "nic-0")), None);
    }
}
