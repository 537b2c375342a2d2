//! Kubernetes attribution against a fake kubelet: a real tonic gRPC server speaking the vendored
//! pod-resources v1 API on a temporary unix socket (it stands in for the kubelet, which cannot run
//! here). It serves every device id form; the exporter labels each instance with its pod.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{Exporter, eventually};
use gpuledger_exporter::attribution::kubelet::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpuledger_exporter::attribution::kubelet::proto::*;
use gpuledger_exporter::source::sim::{Fleet, Simulator};
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct FakeKubelet {
    pods: Arc<Mutex<ListPodResourcesResponse>>,
    allocatable: Arc<Mutex<AllocatableResourcesResponse>>,
    /// Answer every call as the kubelet's rate limiter does.
    throttled: Arc<std::sync::atomic::AtomicBool>,
    /// Answer `GetAllocatableResources` as a 1.21–1.22 kubelet with the feature gate off does.
    allocatable_disabled: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeKubelet {
    fn throttle(&self) -> Result<(), Status> {
        if self.throttled.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Status::resource_exhausted(
                "rejected by rate limit: pod resources rate limit exceeded",
            ));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.throttle()?;
        Ok(Response::new(self.pods.lock().unwrap().clone()))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.throttle()?;
        if self
            .allocatable_disabled
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(Status::unknown(
                "Pod Resources API GetAllocatableResources disabled",
            ));
        }
        Ok(Response::new(self.allocatable.lock().unwrap().clone()))
    }
    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used by gpuledger"))
    }
}

fn serve(kubelet: FakeKubelet, socket: &std::path::Path) -> tokio::task::JoinHandle<()> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(kubelet))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .unwrap();
    })
}

fn pod(
    namespace: &str,
    name: &str,
    device_ids: &[&str],
    claims: Vec<ClaimResource>,
) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: device_ids.iter().map(|d| d.to_string()).collect(),
                topology: None,
            }],
            dynamic_resources: if claims.is_empty() {
                vec![]
            } else {
                vec![DynamicResource {
                    claim_name: "gpu-claim".into(),
                    claim_namespace: namespace.into(),
                    claim_resources: claims,
                }]
            },
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn claim(cdi: &str, device_name: &str) -> ClaimResource {
    ClaimResource {
        cdi_devices: if cdi.is_empty() {
            vec![]
        } else {
            vec![CdiDevice { name: cdi.into() }]
        },
        driver_name: "gpu.nvidia.com".into(),
        pool_name: "gpu-h100-02".into(),
        device_name: device_name.into(),
        share_id: None,
    }
}

/// The node's GPU UUIDs in NVML order (the order the simulator lists them).
fn gpu_uuids(readings: &[gpuledger_exporter::source::Reading]) -> Vec<String> {
    let mut gpus: Vec<String> = Vec::new();
    for r in readings {
        if !gpus.contains(&r.instance.gpu_uuid) {
            gpus.push(r.instance.gpu_uuid.clone());
        }
    }
    gpus
}

/// The `/metrics` line of `gpuledger_instance_fb_total_bytes` for a GPU (and GPU instance).
fn line_for<'a>(text: &'a str, gpu_uuid: &str, gi: Option<u32>) -> Option<&'a str> {
    let gpu = format!("gpu_uuid=\"{gpu_uuid}\"");
    let gi = format!(
        "gpu_instance_id=\"{}\"",
        gi.map(|g| g.to_string()).unwrap_or_default()
    );
    text.lines().find(|l| {
        l.starts_with("gpuledger_instance_fb_total_bytes{") && l.contains(&gpu) && l.contains(&gi)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn every_device_id_form_is_attributed_to_its_pod() {
    // gpu-h100-02: GPU 0 [3g 2g 1g 1g], GPU 1 [4g 3g], GPU 2 [3g 3g], GPU 3 [2g 2g 2g 1g], GPUs 4–7 whole.
    let sim = Simulator::new(Fleet::builtin());
    let readings = sim.second(Some("gpu-h100-02"), 0).readings;
    let gpus = gpu_uuids(&readings);
    let mig0 = readings
        .iter()
        .find(|r| r.instance.gpu_uuid == gpus[0])
        .unwrap();
    let mig1 = readings
        .iter()
        .find(|r| r.instance.gpu_uuid == gpus[1])
        .unwrap();
    let mig3 = readings
        .iter()
        .find(|r| r.instance.gpu_uuid == gpus[3])
        .unwrap();
    let mig0_uuid = mig0.mig_uuid.clone().unwrap();
    let mig3_uuid = mig3.mig_uuid.clone().unwrap();
    let gi1 = mig1.instance.gpu_instance_id.unwrap();

    let kubelet = FakeKubelet::default();
    *kubelet.pods.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![
            // A notebook holding a MIG slice with no process on it.
            pod("ml", "notebook-0", &[&mig0_uuid], vec![]),
            // GKE's form: GPU index 1, GPU instance id.
            pod("search", "ranker-0", &[&format!("nvidia1/gi{gi1}")], vec![]),
            pod("ads", "train-0", &[&gpus[4]], vec![]),
            // EKS time-slicing replica suffix.
            pod("ads", "serve-0", &[&format!("{}::2", gpus[5])], vec![]),
            // DRA: by GPU index, and by a MIG UUID in a CDI device name.
            pod("research", "dra-0", &[], vec![claim("", "gpu-6")]),
            pod(
                "research",
                "dra-1",
                &[],
                vec![claim(
                    &format!("k8s.gpu.nvidia.com/device={mig3_uuid}"),
                    "gpu-3-mig-0",
                )],
            ),
        ],
    };
    // Allocatable: every MIG device of GPU 0 and whole GPUs 4–7 in two time-slicing replicas,
    // plus one MIG device this node does not have (a device-plugin misconfiguration).
    let mut allocatable: Vec<String> = readings
        .iter()
        .filter(|r| r.instance.gpu_uuid == gpus[0])
        .map(|r| r.mig_uuid.clone().unwrap())
        .collect();
    let mig0_count = allocatable.len() as u64;
    for g in &gpus[4..8] {
        allocatable.extend([format!("{g}::0"), format!("{g}::1")]);
    }
    allocatable.push("MIG-00000000-0000-4000-8000-0000000000ff".into());
    *kubelet.allocatable.lock().unwrap() = AllocatableResourcesResponse {
        devices: vec![ContainerDevices {
            resource_name: "nvidia.com/gpu".into(),
            device_ids: allocatable,
            topology: None,
        }],
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let server = serve(kubelet.clone(), &socket);

    let exporter = Exporter::start(&[
        "--source",
        "sim",
        "--node",
        "gpu-h100-02",
        "--kubelet-socket",
        socket.to_str().unwrap(),
        "--kubelet-poll-interval",
        "1s",
        "--kubelet-namespace-tenant",
        "ml=research-ml",
        "--kubelet-namespace-class",
        "search=latency_critical",
    ])
    .await;
    let text = eventually("kubelet labels", Duration::from_secs(20), async || {
        let text = exporter.metrics("text/plain").await;
        text.contains("workload=\"research/dra-1\"").then_some(text)
    })
    .await;
    let expect = |gpu: &str, gi: Option<u32>, tenant: &str, workload: &str| {
        let line = line_for(&text, gpu, gi).unwrap_or_else(|| panic!("no series for {gpu} {gi:?}"));
        assert!(
            line.contains(&format!("tenant=\"{tenant}\""))
                && line.contains(&format!("workload=\"{workload}\"")),
            "{line}"
        );
        line.to_owned()
    };
    expect(
        &gpus[0],
        mig0.instance.gpu_instance_id,
        "research-ml",
        "ml/notebook-0",
    );
    let ranker = expect(&gpus[1], Some(gi1), "search", "search/ranker-0");
    assert!(
        ranker.contains("slo_class=\"latency_critical\""),
        "{ranker}"
    );
    expect(&gpus[4], None, "ads", "ads/train-0");
    expect(&gpus[5], None, "ads", "ads/serve-0");
    expect(&gpus[6], None, "research", "research/dra-0");
    expect(
        &gpus[3],
        mig3.instance.gpu_instance_id,
        "research",
        "research/dra-1",
    );
    assert!(
        text.contains("gpuledger_exporter_collector_success{collector=\"attribution_kubelet\"} 1")
    );
    // Six devices assigned; GPU 0's slices, four GPUs and the stray MIG device allocatable; the
    // stray one matches nothing.
    for (state, n) in [
        ("assigned", 6),
        ("allocatable", mig0_count + 4 + 1),
        ("unmatched", 1),
    ] {
        let series = format!(
            "gpuledger_exporter_attribution_devices{{attributor=\"kubelet\",state=\"{state}\"}} {n}\n"
        );
        assert!(text.contains(&series), "no {series} in\n{text}");
    }

    // The kubelet goes away: the failure shows, the last known allocations stay.
    server.abort();
    let _ = std::fs::remove_file(&socket);
    eventually(
        "a failing kubelet collector",
        Duration::from_secs(20),
        async || {
            exporter
                .metrics("text/plain")
                .await
                .contains(
                    "gpuledger_exporter_collector_success{collector=\"attribution_kubelet\"} 0",
                )
                .then_some(())
        },
    )
    .await;
    assert!(
        exporter
            .metrics("text/plain")
            .await
            .contains("workload=\"ml/notebook-0\"")
    );

    // The kubelet restarts with the notebook gone: it heals by itself and the slice is released.
    kubelet.pods.lock().unwrap().pod_resources.remove(0);
    let _server = serve(kubelet, &socket);
    eventually(
        "the notebook released",
        Duration::from_secs(20),
        async || {
            let text = exporter.metrics("text/plain").await;
            (!text.contains("workload=\"ml/notebook-0\"")
                && text.contains("collector=\"attribution_kubelet\"} 1"))
            .then_some(())
        },
    )
    .await;
}

/// A fake Kubernetes API server (it stands in for kube-apiserver, which cannot run here): serves
/// `GET /api/v1/pods` as a PodList, checks the bearer token and the node field selector, and
/// records the queries it got.
async fn fake_apiserver(
    pods: Arc<Mutex<serde_json::Value>>,
    queries: Arc<Mutex<Vec<String>>>,
) -> u16 {
    use axum::extract::{RawQuery, State};
    use axum::http::{HeaderMap, StatusCode};
    type Shared = (Arc<Mutex<serde_json::Value>>, Arc<Mutex<Vec<String>>>);
    let app = axum::Router::new()
        .route(
            "/api/v1/pods",
            axum::routing::get(
                |State((pods, queries)): State<Shared>,
                 headers: HeaderMap,
                 RawQuery(q): RawQuery| async move {
                    if headers.get("authorization").and_then(|v| v.to_str().ok())
                        != Some("Bearer sa-token-0123456789")
                    {
                        return Err(StatusCode::UNAUTHORIZED);
                    }
                    queries.lock().unwrap().push(q.unwrap_or_default());
                    Ok(axum::Json(pods.lock().unwrap().clone()))
                },
            ),
        )
        .with_state((pods, queries));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

fn api_pod(
    namespace: &str,
    name: &str,
    labels: serde_json::Value,
    priority: &str,
    phase: &str,
) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"namespace": namespace, "name": name, "labels": labels},
        "spec": {"nodeName": "gpu-h100-02", "priorityClassName": priority},
        "status": {"phase": phase}
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn api_server_labels_set_tenant_and_class_and_finished_or_deleted_pods_are_not_charged() {
    // gpu-h100-02's whole GPUs 4–7.
    let sim = Simulator::new(Fleet::builtin());
    let readings = sim.second(Some("gpu-h100-02"), 0).readings;
    let gpus = gpu_uuids(&readings);
    let kubelet = FakeKubelet::default();
    *kubelet.pods.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![
            pod("ml", "train-0", &[&gpus[4]], vec![]),
            pod("serving", "api-0", &[&gpus[5]], vec![]),
            // Finished, but the kubelet still lists its device.
            pod("ml", "done-0", &[&gpus[6]], vec![]),
            // Deleted from the API server, still listed by the kubelet.
            pod("ml", "gone-0", &[&gpus[7]], vec![]),
        ],
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let _server = serve(kubelet.clone(), &socket);
    let pods = Arc::new(Mutex::new(serde_json::json!({"kind": "PodList", "items": [
        api_pod("ml", "train-0", serde_json::json!({"gpuledger.io/tenant": "vision"}), "", "Running"),
        api_pod("serving", "api-0", serde_json::json!({}), "inference-high", "Running"),
        api_pod("ml", "done-0", serde_json::json!({}), "", "Succeeded"),
    ]})));
    let queries = Arc::new(Mutex::new(Vec::new()));
    let port = fake_apiserver(pods.clone(), queries.clone()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "sa-token-0123456789\n").unwrap();

    let exporter = Exporter::start(&[
        "--source",
        "sim",
        "--node",
        "gpu-h100-02",
        "--kubelet-socket",
        socket.to_str().unwrap(),
        "--kubelet-poll-interval",
        "1s",
        "--kube-apiserver",
        &format!("http://127.0.0.1:{port}"),
        "--kube-token-file",
        token.to_str().unwrap(),
        "--kube-refresh-interval",
        "1s",
        "--kube-tenant-label",
        "gpuledger.io/tenant",
        "--kube-priority-class",
        "inference-high=latency_critical",
    ])
    .await;
    // The deleted pod is dropped once a list asked for a refresh interval after the kubelet
    // first showed it lacks it.
    let text = eventually(
        "API server attribution",
        Duration::from_secs(30),
        async || {
            let text = exporter.metrics("text/plain").await;
            (text.contains("tenant=\"vision\"") && !text.contains("workload=\"ml/gone-0\""))
                .then_some(text)
        },
    )
    .await;
    let line = |gpu: &str| line_for(&text, gpu, None).unwrap().to_owned();
    assert!(
        line(&gpus[4]).contains("tenant=\"vision\",workload=\"ml/train-0\""),
        "{}",
        line(&gpus[4])
    );
    let api = line(&gpus[5]);
    assert!(
        api.contains("tenant=\"serving\"") && api.contains("slo_class=\"latency_critical\""),
        "{api}"
    );
    // Neither is charged for the device (the simulator's own attribution stays; with NVML
    // there is none, and the device is unallocated).
    assert!(
        !line(&gpus[6]).contains("workload=\"ml/done-0\""),
        "finished pod: {}",
        line(&gpus[6])
    );
    assert!(
        !line(&gpus[7]).contains("workload=\"ml/gone-0\""),
        "deleted pod: {}",
        line(&gpus[7])
    );
    assert!(
        text.contains("gpuledger_exporter_collector_success{collector=\"attribution_kubelet\"} 1")
    );
    let q = queries.lock().unwrap()[0].clone();
    assert_eq!(
        q,
        "fieldSelector=spec.nodeName%3Dgpu-h100-02&resourceVersion=0"
    );

    // The API server fails: the failure shows, the last list keeps working.
    std::fs::write(&token, "a-wrong-token-0123456789").unwrap();
    eventually(
        "a failing API server",
        Duration::from_secs(20),
        async || {
            let text = exporter.metrics("text/plain").await;
            (text.contains("collector=\"attribution_kubelet\"} 0")
                && text.contains("tenant=\"vision\""))
            .then_some(())
        },
    )
    .await;
}

/// A fixture of the host's `/proc` (it stands in for the processes of GPU workloads): one
/// `<pid>/cgroup` per process.
fn proc_fixture(dir: &std::path::Path, cgroups: &[(u32, String)]) {
    for (pid, cgroup) in cgroups {
        std::fs::create_dir_all(dir.join(pid.to_string())).unwrap();
        std::fs::write(dir.join(pid.to_string()).join("cgroup"), cgroup).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_time_sliced_gpu_is_split_per_pod_through_process_cgroups() {
    use gpuledger_exporter::attribution::kubelet::apiserver::ApiServerConfig;
    use gpuledger_exporter::attribution::shares::{Owner, ProcFs, shares};
    use gpuledger_exporter::attribution::{Attributor, KubeletAttributor, KubeletConfig};
    use gpuledger_exporter::source::ProcessReading;

    const TRAIN: &str = "0a1b2c3d-0000-4000-8000-00000000000a";
    const API: &str = "0a1b2c3d-0000-4000-8000-00000000000b";
    let sim = Simulator::new(Fleet::builtin());
    let mut readings = sim.second(Some("gpu-h100-02"), 0).readings;
    let gpus = gpu_uuids(&readings);
    // Whole GPU 4, time-sliced into replicas (the NVIDIA device plugin's `::N` ids).
    let shared = &gpus[4];
    let kubelet = FakeKubelet::default();
    *kubelet.pods.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![
            pod("ml", "train-0", &[&format!("{shared}::0")], vec![]),
            pod("serving", "api-0", &[&format!("{shared}::1")], vec![]),
            // Holds a replica and runs nothing: the idle holder to catch.
            pod("ml", "notebook-0", &[&format!("{shared}::2")], vec![]),
        ],
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let _server = serve(kubelet.clone(), &socket);
    let with_uid = |ns: &str, name: &str, uid: &str, labels| {
        let mut p = api_pod(ns, name, labels, "", "Running");
        p["metadata"]["uid"] = uid.into();
        p
    };
    // The pod that the shared device is charged to: its owner label and its controller.
    let mut notebook = with_uid(
        "ml",
        "notebook-0",
        "0a1b2c3d-0000-4000-8000-00000000000c",
        serde_json::json!({"gpuledger.io/owner": "alice"}),
    );
    notebook["metadata"]["annotations"] = serde_json::json!({"example.com/contact": "bob"});
    notebook["metadata"]["ownerReferences"] = serde_json::json!([
        {"kind": "ReplicaSet", "name": "not-the-controller", "uid": "u1"},
        {"kind": "StatefulSet", "name": "notebooks", "uid": "u2", "controller": true},
    ]);
    let pods = Arc::new(Mutex::new(serde_json::json!({"kind": "PodList", "items": [
        with_uid("ml", "train-0", TRAIN, serde_json::json!({"gpuledger.io/tenant": "vision"})),
        with_uid("serving", "api-0", API, serde_json::json!({})),
        notebook,
    ]})));
    let port = fake_apiserver(pods, Arc::new(Mutex::new(Vec::new()))).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "sa-token-0123456789\n").unwrap();
    let mut attributor = KubeletAttributor::start(KubeletConfig {
        socket: socket.clone(),
        poll_interval: Duration::from_millis(200),
        namespace_tenants: Default::default(),
        namespace_classes: Default::default(),
        apiserver: Some(ApiServerConfig {
            url: format!("http://127.0.0.1:{port}"),
            token_file: Some(token),
            ca_file: None,
            node: "gpu-h100-02".into(),
            refresh: Duration::from_millis(200),
            tenant_label: Some("gpuledger.io/tenant".into()),
            tenant_annotation: None,
            owner_label: Some("gpuledger.io/owner".into()),
            owner_annotation: Some("example.com/contact".into()),
            class_label: None,
            priority_classes: Default::default(),
        }),
    });
    eventually(
        "the kubelet and the API server",
        Duration::from_secs(20),
        async || attributor.refresh().ok(),
    )
    .await;

    // Two processes of train-0 (systemd cgroup driver), one of api-0 (cgroupfs driver), and the
    // MPS server, which belongs to no pod (and, named by its `comm`, hides no holder's process).
    let procfs = dir.path().join("proc");
    let systemd = |uid: &str| {
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-9f.scope\n",
            uid.replace('-', "_")
        )
    };
    proc_fixture(
        &procfs,
        &[
            (101, systemd(TRAIN)),
            (102, systemd(TRAIN)),
            (
                201,
                format!("12:memory:/kubepods/besteffort/pod{API}/7c\n0::/\n"),
            ),
            (301, "0::/system.slice/nvidia-mps.service\n".into()),
        ],
    );
    // What the kernel writes for `nvidia-cuda-mps-server`: the first 15 bytes.
    std::fs::write(procfs.join("301/comm"), "nvidia-cuda-mps\n").unwrap();
    let process = |pid, gib: u64, sm| ProcessReading {
        gpu_uuid: shared.clone(),
        gpu_instance_id: None,
        pid,
        used_memory_bytes: Some(gib << 30),
        sm_util: Some(sm),
        mps_client: false,
    };
    let processes = [
        process(101, 10, 0.30),
        process(102, 6, 0.10),
        process(201, 20, 0.20),
        process(301, 1, 0.0),
    ];
    attributor.apply(&mut readings);
    // The device is charged to the first live pod by namespace/name, and names its owner: the
    // label before the annotation, and the controller among the owner references.
    let held = &readings
        .iter()
        .find(|r| &r.instance.gpu_uuid == shared)
        .unwrap()
        .attribution;
    assert_eq!(held.workload.as_deref(), Some("ml/notebook-0"));
    assert_eq!(held.owner.as_deref(), Some("alice"));
    assert_eq!(held.owner_ref.as_deref(), Some("StatefulSet/notebooks"));
    // The GPU was 60 % active over the second; the driver saw 0.3 + 0.1 of train-0's kernels and
    // 0.2 of api-0's.
    for r in readings
        .iter_mut()
        .filter(|r| &r.instance.gpu_uuid == shared)
    {
        r.counters.sm_active = Some(0.6);
    }
    let procfs = ProcFs::new(&procfs);
    let got = shares(
        &readings,
        &processes,
        &attributor.holders(&readings),
        |pid| procfs.owner(pid),
        |o| attributor.owner_attribution(o),
    );
    let view: Vec<(Option<&str>, Option<&str>, u32, Option<u64>)> = got
        .iter()
        .map(|s| {
            (
                s.attribution.tenant.as_deref(),
                s.attribution.workload.as_deref(),
                s.processes,
                s.memory_used_bytes,
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            (None, None, 1, Some(1 << 30)),
            (Some("serving"), Some("serving/api-0"), 1, Some(20 << 30)),
            (Some("vision"), Some("ml/train-0"), 2, Some(16 << 30)),
            // The ledger charges the device to one pod; every other holder shows here.
            (Some("ml"), Some("ml/notebook-0"), 0, Some(0)),
        ]
    );
    let sm: Vec<f64> = got.iter().map(|s| s.sm_active.unwrap()).collect();
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(
        close(sm[0], 0.0) && close(sm[1], 0.2) && close(sm[2], 0.4) && sm[3] == 0.0,
        "{sm:?}"
    );
    assert!(
        close(sm.iter().sum::<f64>(), 0.6),
        "the shares sum to the GPU's activity"
    );
    // A pod known only by UID to the kubelet attributor, not to the API server: unnamed.
    assert_eq!(
        attributor.owner_attribution(&Owner::Pod {
            uid: "0a1b2c3d-0000-4000-8000-0000000000ff".into()
        }),
        None
    );

    // Exposed per owner, and gone when the processes are.
    let mut m = gpuledger_exporter::metrics::InstanceMetrics::new();
    m.update(&readings, &[]);
    m.update_shares(&got);
    let text = gpuledger_exporter::metrics::render(
        &[m.registry()],
        gpuledger_schema::exposition::Format::Classic,
    );
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("gpuledger_share_memory_used_bytes{")
                && l.contains("workload=\"ml/train-0\"")
        })
        .unwrap_or_else(|| panic!("no share series in\n{text}"));
    assert!(
        line.contains(&format!("gpu_uuid=\"{shared}\""))
            && line.ends_with(&format!(" {}", 16u64 << 30)),
        "{line}"
    );
    m.update_shares(&[]);
    let text = gpuledger_exporter::metrics::render(
        &[m.registry()],
        gpuledger_schema::exposition::Format::Classic,
    );
    assert!(!text.contains("gpuledger_share_"), "{text}");
}

/// Regression: a throttled kubelet (gRPC ResourceExhausted) was not recognised, because the check
/// looked for the code's name in its human description, so the poller never backed off.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_kubelet_is_recognised_so_the_poller_backs_off() {
    use gpuledger_exporter::attribution::kubelet::poll;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    let _server = serve(kubelet.clone(), &socket);
    let ok = eventually("the fake kubelet", Duration::from_secs(10), async || {
        poll(socket.clone()).await.ok()
    })
    .await;
    assert!(matches!(ok.allocatable, Ok(Some(_))));
    // A kubelet with GetAllocatableResources disabled still gives its allocations.
    kubelet
        .allocatable_disabled
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let polled = poll(socket.clone()).await.unwrap();
    assert!(
        matches!(polled.allocatable, Ok(None)),
        "{:?}",
        polled.allocatable
    );
    kubelet
        .throttled
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let e = poll(socket.clone()).await.unwrap_err();
    assert!(e.throttled, "{e:?}");
    assert!(e.message.contains("rate limit"), "{e:?}");
    // An absent socket is a plain failure, not throttling.
    let e = poll(dir.path().join("absent.sock")).await.unwrap_err();
    assert!(
        !e.throttled && e.message.contains("does not exist"),
        "{e:?}"
    );
}
