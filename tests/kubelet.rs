//! Kubernetes attribution against a fake kubelet: a real tonic gRPC server speaking the vendored
//! pod-resources v1 API on a temporary unix socket (it stands in for the kubelet, which cannot run
//! here). It serves every device id form; the exporter labels each instance with its pod.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Exporter, eventually};
use gpuledger_exporter::attribution::kubelet::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpuledger_exporter::attribution::kubelet::proto::*;
use gpuledger_exporter::source::sim::{Fleet, Simulator};
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct FakeKubelet {
    pods: Arc<Mutex<ListPodResourcesResponse>>,
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.pods.lock().unwrap().clone()))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse::default()))
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
    let mut gpus: Vec<String> = Vec::new();
    for r in &readings {
        if !gpus.contains(&r.instance.gpu_uuid) {
            gpus.push(r.instance.gpu_uuid.clone());
        }
    }
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
