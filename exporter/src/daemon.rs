//! The exporter daemon: sample every second, attribute, expose, ship.
//!
//! A dedicated thread owns the source (NVML calls block) and paces it: live sources on each
//! wall-clock second, recorded ones at `--speed`. Each second's readings update `/metrics` and go
//! over a bounded channel to the shipper task. On SIGTERM/SIGINT the sampler stops, the shipper
//! seals what it holds into the spool and tries to send for up to `drain_timeout`; anything left
//! is sent on the next start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpuledger_schema::ShareSample;
use tokio::sync::{mpsc, watch};

use crate::attribution::shares::{self, ProcFs};
use crate::attribution::slurm::TenantField;
use crate::attribution::{Attributor, KubeletAttributor, KubeletConfig, SlurmJobMap, StaticMap};
use crate::metrics::Metrics;
use crate::ship::{self, Finish, ShipConfig, Shipment};
use crate::source::nvml::{NvmlDriver, NvmlSource};
use crate::source::replay::ReplaySource;
use crate::source::sim::{Fleet, SimSource};
use crate::source::{CollectorOutcome, Second, Source};

/// How fast a recorded trace plays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Speed {
    /// `factor` trace seconds per wall second (1 = real time).
    Times(f64),
    /// As fast as the shipper takes it.
    Max,
}

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "max" {
            return Ok(Speed::Max);
        }
        match s.trim_end_matches('x').parse::<f64>() {
            Ok(f) if f > 0.0 && f.is_finite() => Ok(Speed::Times(f)),
            _ => Err(format!(
                "{s:?} is not a speed: use 1, a factor such as 60, or max"
            )),
        }
    }
}

/// Which source to run.
#[derive(Debug, Clone)]
pub enum SourceChoice {
    /// Real GPUs; the named collectors are skipped.
    Nvml {
        /// Collectors to skip.
        disabled: Vec<String>,
    },
    /// The simulator, with a fleet file or the built-in fleet.
    Sim {
        /// Fleet file.
        fleet: Option<PathBuf>,
    },
    /// A trace CSV.
    Replay {
        /// The file.
        file: PathBuf,
        /// Pace.
        speed: Speed,
        /// Exit once the file is shipped and acknowledged.
        once: bool,
    },
}

/// Everything the daemon needs.
#[derive(Debug, Clone)]
pub struct ExporterConfig {
    /// The source.
    pub source: SourceChoice,
    /// `/metrics` address.
    pub listen: SocketAddr,
    /// The `/metrics` listener's connection bound and header read timeout.
    pub http: gpuledger_otel::serve::Listening,
    /// This node's name.
    pub node: String,
    /// Shipping; `None` serves `/metrics` only.
    pub ship: Option<ShipConfig>,
    /// Static attribution map.
    pub attribution_map: Option<PathBuf>,
    /// The host's `/proc`, for the per-process view of shared instances.
    pub proc_path: PathBuf,
    /// Slurm per-device job map.
    pub slurm: Option<SlurmConfig>,
    /// Kubernetes pod-resources attribution.
    pub kubelet: Option<KubeletConfig>,
    /// How long to keep sending at shutdown.
    pub drain_timeout: Duration,
    /// Also push `/metrics`'s families over OTLP/HTTP (docs/otlp.md, "OpenTelemetry (OTLP)").
    pub otlp: Option<gpuledger_otel::OtlpConfig>,
}

/// Where the Slurm prolog writes its job map, and how to read it.
#[derive(Debug, Clone)]
pub struct SlurmConfig {
    /// The job map directory.
    pub dir: PathBuf,
    /// Which job field is the tenant.
    pub tenant: TenantField,
    /// QoS → SLO class; unmapped QoS are `batch`.
    pub qos_classes: std::collections::HashMap<String, gpuledger_schema::SloClass>,
}

/// Why the daemon could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The source could not be set up.
    #[error("{0}")]
    Source(String),
    /// The attribution map is unusable.
    #[error(transparent)]
    Map(#[from] crate::attribution::MapError),
    /// The listen address is unusable.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Shipping failed in a way retrying cannot fix.
    #[error(transparent)]
    Ship(#[from] ship::ShipError),
    /// The OTLP push could not start.
    #[error(transparent)]
    Otlp(#[from] gpuledger_otel::Error),
    /// `--once` without an aggregator.
    #[error(
        "--once needs --aggregator: it exits when the aggregator has acknowledged the whole file"
    )]
    OnceWithoutAggregator,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Builds the source a choice names.
pub fn open_source(choice: &SourceChoice, node: &str) -> Result<Box<dyn Source>, DaemonError> {
    Ok(match choice {
        SourceChoice::Nvml { disabled } => {
            let driver = NvmlDriver::init().map_err(|e| DaemonError::Source(e.to_string()))?;
            Box::new(
                NvmlSource::new(driver, node, disabled)
                    .map_err(|e| DaemonError::Source(e.to_string()))?,
            )
        }
        SourceChoice::Sim { fleet } => {
            let fleet = match fleet {
                Some(path) => Fleet::load(path).map_err(|e| DaemonError::Source(e.to_string()))?,
                None => Fleet::builtin(),
            };
            Box::new(SimSource::new(fleet, node).map_err(|e| DaemonError::Source(e.to_string()))?)
        }
        SourceChoice::Replay { file, .. } => {
            Box::new(ReplaySource::open(file).map_err(|e| DaemonError::Source(e.to_string()))?)
        }
    })
}

struct Sampler {
    source: Box<dyn Source>,
    attributors: Vec<Box<dyn Attributor>>,
    procfs: ProcFs,
    metrics: Arc<Metrics>,
    tx: Option<mpsc::Sender<Shipment>>,
    stop: Arc<AtomicBool>,
    speed: Speed,
}

impl Sampler {
    /// Sleeps until `deadline` unless asked to stop; returns false when stopping.
    fn sleep_until(&self, deadline: Instant) -> bool {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(100)));
        }
    }

    fn run(mut self) {
        let recorded = self.source.is_recorded();
        let started = Instant::now();
        let mut first_trace_second: Option<i64> = None;
        let mut failing = false;
        let mut attributor_failing = vec![false; self.attributors.len()];
        loop {
            if !recorded {
                let now = unix_now();
                let next = now.floor() + 1.0;
                if !self.sleep_until(Instant::now() + Duration::from_secs_f64(next - now)) {
                    return;
                }
            } else if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let t0 = Instant::now();
            let result = self.source.collect(unix_now().round() as i64);
            let outcome = CollectorOutcome {
                collector: self.source.name(),
                duration: t0.elapsed(),
                success: result.is_ok(),
            };
            self.metrics.exporter.record_collector(&outcome);
            let mut second = match result {
                Ok(Some(second)) => {
                    if failing {
                        tracing::info!(source = self.source.name(), "The source works again.");
                    }
                    failing = false;
                    second
                }
                Ok(None) => {
                    tracing::info!(source = self.source.name(), "The source has no more data.");
                    return;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(source = self.source.name(), error = %e, "The source failed; retrying every second.");
                    }
                    failing = true;
                    continue;
                }
            };
            for c in &second.collectors {
                self.metrics.exporter.record_collector(c);
            }
            if let (true, Speed::Times(factor)) = (recorded, self.speed) {
                let first = *first_trace_second.get_or_insert(second.timestamp);
                let offset = (second.timestamp - first) as f64 / factor;
                if !self.sleep_until(started + Duration::from_secs_f64(offset)) {
                    return;
                }
            }
            self.refresh_attributors(&mut second, &mut attributor_failing);
            let shares = self.shares_of(&second);
            {
                let mut m = self
                    .metrics
                    .instances
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                m.update(&second.readings, &second.gpus);
                m.update_shares(&shares);
            }
            self.metrics
                .exporter
                .samples_collected
                .inc_by(second.readings.len() as u64);
            self.metrics.exporter.last_sample.set(second.timestamp);
            if !self.ship(second, shares) {
                return;
            }
        }
    }

    /// Refreshes every attributor (a failure streak logged once, each refresh timed as its
    /// collector) and lets each name the second's readings, in order.
    fn refresh_attributors(&mut self, second: &mut Second, failing: &mut [bool]) {
        for (a, failing) in self.attributors.iter_mut().zip(failing.iter_mut()) {
            let started = Instant::now();
            let refreshed = a.refresh();
            // Once per failure streak: a kubelet that is away for an hour is one warning.
            match (&refreshed, *failing) {
                (Err(e), false) => {
                    tracing::warn!(attributor = a.name(), error = %e, "Attribution could not refresh; keeping its last state until it can.")
                }
                (Ok(()), true) => {
                    tracing::info!(attributor = a.name(), "Attribution refreshes again.")
                }
                _ => {}
            }
            *failing = refreshed.is_err();
            self.metrics.exporter.record_collector(&CollectorOutcome {
                collector: a.collector(),
                duration: started.elapsed(),
                success: refreshed.is_ok(),
            });
            a.apply(&mut second.readings);
            if let Some(counts) = a.device_counts() {
                self.metrics.exporter.record_devices(a.name(), &counts);
            }
        }
    }

    /// The second's shares of shared instances, from its processes and the attributors.
    fn shares_of(&self, second: &Second) -> Vec<shares::Share> {
        // As in `apply`, the last attributor that names a reading's holders speaks for it.
        let mut holders: Vec<Vec<gpuledger_schema::Attribution>> =
            vec![Vec::new(); second.readings.len()];
        for a in &self.attributors {
            for (slot, named) in holders.iter_mut().zip(a.holders(&second.readings)) {
                if !named.is_empty() {
                    *slot = named;
                }
            }
        }
        shares::shares(
            &second.readings,
            &second.processes,
            &holders,
            |pid| self.procfs.owner(pid),
            |owner| {
                self.attributors
                    .iter()
                    .find_map(|a| a.owner_attribution(owner))
            },
        )
    }

    /// Hands the second and its shares to the shipper, if there is one; false once it is gone.
    fn ship(&self, second: Second, shares: Vec<shares::Share>) -> bool {
        let Some(tx) = &self.tx else {
            return true;
        };
        let timestamp = second.timestamp;
        let gpus = second.gpu_samples();
        let shipment = Shipment {
            gpus,
            samples: second.into_samples(),
            shares: shares
                .into_iter()
                .map(|s| ShareSample {
                    timestamp,
                    instance: s.instance,
                    attribution: s.attribution,
                    processes: s.processes,
                    memory_used_bytes: s.memory_used_bytes,
                    sm_active: s.sm_active,
                })
                .collect(),
        };
        tx.blocking_send(shipment).is_ok()
    }
}

/// The configured attributors, in the order they name a reading (the last one that names it
/// wins): the static map, then Slurm's job map, then the kubelet.
fn attributors(config: &ExporterConfig) -> Result<Vec<Box<dyn Attributor>>, DaemonError> {
    let mut attributors: Vec<Box<dyn Attributor>> = Vec::new();
    if let Some(path) = &config.attribution_map {
        attributors.push(Box::new(StaticMap::load(path)?));
    }
    if let Some(slurm) = &config.slurm {
        attributors.push(Box::new(SlurmJobMap::new(
            &slurm.dir,
            slurm.tenant,
            slurm.qos_classes.clone(),
        )));
    }
    if let Some(kubelet) = &config.kubelet {
        attributors.push(Box::new(KubeletAttributor::start(kubelet.clone())));
    }
    Ok(attributors)
}

/// The /metrics listener, with the address it took (port 0 picks one).
async fn bind(
    addr: std::net::SocketAddr,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr), DaemonError> {
    let listen = |source| DaemonError::Listen { addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(listen)?;
    let local = listener.local_addr().map_err(listen)?;
    Ok((listener, local))
}

/// Runs the exporter until `shutdown` resolves (or, with `--once`, until the trace is shipped).
pub async fn run(
    config: ExporterConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    let once = matches!(config.source, SourceChoice::Replay { once: true, .. });
    if once && config.ship.is_none() {
        return Err(DaemonError::OnceWithoutAggregator);
    }
    let speed = match config.source {
        SourceChoice::Replay { speed, .. } => speed,
        _ => Speed::Times(1.0),
    };
    let source = open_source(&config.source, &config.node)?;
    let attributors = attributors(&config)?;
    let metrics = Metrics::new();
    let (listener, local) = bind(config.listen).await?;
    tracing::info!(listen = %local, source = source.name(), node = %config.node, "Serving /metrics.");
    // Started once the address is bound, so that no early return leaves a push to stop on an
    // async worker (stopping it pushes once more, over blocking HTTP).
    let otlp = start_otlp(&config, &metrics)?;
    let (server_stop_tx, server_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gpuledger_otel::serve::serve(
        listener,
        crate::server::router(metrics.clone()),
        config.http,
        async {
            let _ = server_stop_rx.await;
        },
    ));

    let (finish_tx, finish_rx) = watch::channel(Finish::Running);
    let (tx, shipper) = match config.ship.clone() {
        Some(ship_config) => {
            let (tx, shipper) =
                start_shipper(ship_config, source.is_recorded(), &metrics, finish_rx);
            (Some(tx), Some(shipper))
        }
        None => (None, None),
    };

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = Sampler {
        source,
        attributors,
        procfs: ProcFs::new(&config.proc_path),
        metrics: metrics.clone(),
        tx,
        stop: stop.clone(),
        speed,
    };
    let sampler = tokio::task::spawn_blocking(move || sampler.run());
    let finish = sampled(sampler, shutdown, &stop, once, config.drain_timeout).await;
    let _ = finish_tx.send(finish);
    let shipped = match shipper {
        Some(shipper) => shipper.await.expect("the shipper does not panic"),
        None => Ok(()),
    };
    if once && shipped.is_ok() {
        tracing::info!("The whole trace is shipped and acknowledged.");
    }
    let _ = server_stop_tx.send(());
    let _ = server.await;
    if let Some(otlp) = otlp {
        // The push's last export blocks on HTTP; keep it off the runtime's workers.
        let _ = tokio::task::spawn_blocking(move || otlp.shutdown()).await;
    }
    Ok(shipped?)
}

/// Waits for the sampler to end (a replay's trace ran out) or for `shutdown`, stops the sampler,
/// and answers how the shipper finishes: a `--once` replay drains all it has; otherwise the
/// shipper gets `drain_timeout` to send what is buffered (a finished replay without `--once`
/// keeps serving its last values until `shutdown`).
async fn sampled(
    sampler: tokio::task::JoinHandle<()>,
    shutdown: impl std::future::Future<Output = ()>,
    stop: &AtomicBool,
    once: bool,
    drain_timeout: Duration,
) -> Finish {
    tokio::pin!(sampler);
    tokio::pin!(shutdown);
    let mut sampler_done = false;
    tokio::select! {
        _ = &mut shutdown => {
            tracing::info!("Shutting down: sealing and sending what is buffered.");
        }
        _ = &mut sampler => {
            sampler_done = true;
        }
    }
    stop.store(true, Ordering::Relaxed);
    if !sampler_done {
        let _ = sampler.await;
    }
    if once && sampler_done {
        return Finish::Drain(None);
    }
    if sampler_done {
        // A replay without --once keeps serving its last values and shipping until told to stop.
        shutdown.await;
    }
    Finish::Drain(Some(tokio::time::Instant::now() + drain_timeout))
}

/// The OTLP push of the exporter's own metrics, when `--otlp-endpoint` asks for one.
fn start_otlp(
    config: &ExporterConfig,
    metrics: &Arc<Metrics>,
) -> Result<Option<gpuledger_otel::MetricsPush>, DaemonError> {
    let Some(otlp) = &config.otlp else {
        return Ok(None);
    };
    let m = metrics.clone();
    let service = gpuledger_otel::Service::exporter(&config.node);
    Ok(Some(gpuledger_otel::MetricsPush::start(
        otlp,
        &service,
        Arc::new(move || m.render(gpuledger_schema::exposition::Format::OpenMetrics)),
    )?))
}

/// The shipper's task, and the channel the sampler hands it each second's shipment on. A
/// recorded source (a replay) waits for room in a full spool rather than drop its oldest batch.
fn start_shipper(
    mut ship_config: ShipConfig,
    recorded: bool,
    metrics: &Arc<Metrics>,
    finish: watch::Receiver<Finish>,
) -> (
    mpsc::Sender<Shipment>,
    tokio::task::JoinHandle<Result<(), ship::ShipError>>,
) {
    ship_config.wait_when_full = recorded;
    let (tx, rx) = mpsc::channel(16);
    let shipper = tokio::spawn(ship::run(ship_config, metrics.clone(), rx, finish));
    (tx, shipper)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{ProcessReading, Reading, Second, SourceError};
    use gpuledger_schema::exposition::Format;
    use gpuledger_schema::{Attribution, Counters, Instance};

    /// Stands in for NVML on a time-sliced GPU: one recorded second of one whole GPU with two
    /// processes.
    struct SharedGpuSecond {
        done: bool,
    }

    impl Source for SharedGpuSecond {
        fn name(&self) -> &'static str {
            "test"
        }
        fn collect(&mut self, _now: i64) -> Result<Option<Second>, SourceError> {
            if std::mem::replace(&mut self.done, true) {
                return Ok(None);
            }
            let process = |pid, sm| ProcessReading {
                gpu_uuid: "GPU-1".into(),
                gpu_instance_id: None,
                pid,
                used_memory_bytes: Some(1 << 30),
                sm_util: Some(sm),
                mps_client: false,
            };
            Ok(Some(Second {
                timestamp: 100,
                readings: vec![Reading {
                    instance: Instance {
                        node: "n".into(),
                        gpu_uuid: "GPU-1".into(),
                        gpu_model: "NVIDIA H100 80GB HBM3".into(),
                        mig_profile: None,
                        gpu_instance_id: None,
                        placement_start: None,
                        placement_size: None,
                    },
                    mig_uuid: None,
                    gpu_index: None,
                    attribution: Attribution::default(),
                    counters: Counters {
                        sm_active: Some(0.5),
                        ..Counters::default()
                    },
                }],
                processes: vec![process(11, 0.3), process(12, 0.1)],
                ..Second::default()
            }))
        }
        fn is_recorded(&self) -> bool {
            true
        }
    }

    #[test]
    fn each_second_the_sampler_exports_and_ships_shares_named_by_the_attributors() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::write(jobs.join("job-7"), "job_id=7\naccount=physics\n").unwrap();
        std::fs::write(jobs.join("job-8"), "job_id=8\naccount=chem\n").unwrap();
        let proc = dir.path().join("proc");
        for (pid, job) in [(11, 7), (12, 8)] {
            std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
            std::fs::write(
                proc.join(pid.to_string()).join("cgroup"),
                format!("0::/system.slice/slurmstepd.scope/job_{job}/step_0\n"),
            )
            .unwrap();
        }
        let metrics = Metrics::new();
        let (tx, mut rx) = mpsc::channel(4);
        Sampler {
            source: Box::new(SharedGpuSecond { done: false }),
            attributors: vec![Box::new(SlurmJobMap::new(
                &jobs,
                TenantField::Account,
                Default::default(),
            ))],
            procfs: ProcFs::new(&proc),
            metrics: metrics.clone(),
            tx: Some(tx),
            stop: Arc::new(AtomicBool::new(false)),
            speed: Speed::Max,
        }
        .run();
        // The shares go to the shipper with the second's samples.
        let shipment = rx.try_recv().unwrap();
        assert_eq!(shipment.samples.len(), 1);
        let mut shipped: Vec<(Option<&str>, i64, u32)> = shipment
            .shares
            .iter()
            .map(|s| (s.attribution.tenant.as_deref(), s.timestamp, s.processes))
            .collect();
        shipped.sort();
        assert_eq!(shipped, [(Some("chem"), 100, 1), (Some("physics"), 100, 1)]);
        let text = metrics.render(Format::Classic);
        let share = |tenant: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("gpuledger_share_sm_active_ratio{")
                        && l.contains(&format!("tenant=\"{tenant}\""))
                })
                .unwrap_or_else(|| panic!("no share of {tenant} in\n{text}"))
                .rsplit_once(' ')
                .unwrap()
                .1
                .parse::<f64>()
                .unwrap()
        };
        assert!((share("physics") - 0.375).abs() < 1e-9);
        assert!((share("chem") - 0.125).abs() < 1e-9);
    }
}
