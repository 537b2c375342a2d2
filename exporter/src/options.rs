//! Every option of `gpuledger exporter`, declared once ([`ExporterOptions`]): a flag, a key of
//! the `--config` TOML file and, through the binary, `GPULEDGER_EXPORTER_<FLAG>`
//! (`gpuledger_schema::options` says how the three are layered). [`ExporterOptions::resolve`]
//! holds every check and default, here in the library, so that anything that builds an
//! [`ExporterConfig`] from options (the binary, a test) gets the same checks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuledger_schema::SloClass;
use gpuledger_schema::options::{self, duration, pair, pairs};
use gpuledger_schema::wire;
use serde::{Deserialize, Serialize};

use crate::attribution::KubeletConfig;
use crate::attribution::kubelet::apiserver;
use crate::attribution::slurm::TenantField;
use crate::daemon::{ExporterConfig, SlurmConfig, SourceChoice, Speed};
use crate::ship::ShipConfig;
use crate::source::SOURCES;

/// The options of `gpuledger exporter`. A flag on the command line wins over its environment
/// variable, which wins over the config file (TOML, the flag's long name with `_` for `-`).
#[derive(Debug, Default, Clone, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExporterOptions {
    /// Where samples come from: nvml, sim or replay.
    #[arg(long, value_parser = source_names())]
    pub source: Option<String>,
    /// Address for /metrics.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Aggregator base URL (http://aggregator:9836); without it the exporter only serves /metrics.
    #[arg(long)]
    pub aggregator: Option<String>,
    /// File holding the bearer token for the aggregator (required with --aggregator).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// This node's name.
    #[arg(long)]
    pub node: Option<String>,
    /// Simulated fleet (TOML) for --source sim.
    #[arg(long)]
    pub fleet: Option<PathBuf>,
    /// Trace CSV for --source replay.
    #[arg(long)]
    pub replay_file: Option<PathBuf>,
    /// Replay pace: 1 (real time), a factor such as 60, or max.
    #[arg(long)]
    pub speed: Option<String>,
    /// Exit (0) once the whole replay file is shipped and acknowledged.
    #[arg(long)]
    pub once: bool,
    /// Static attribution map (TOML): device UUID → tenant, workload, SLO class.
    #[arg(long)]
    pub attribution_map: Option<PathBuf>,
    /// Directory of the on-disk spool.
    #[arg(long)]
    pub spool_dir: Option<PathBuf>,
    /// Spool bound in bytes; when full, the oldest batch is dropped.
    #[arg(long)]
    pub spool_max_bytes: Option<u64>,
    /// How batches are encoded for the aggregator: msgpack or json. An
    /// aggregator that refuses a readable MessagePack body gets JSON for --msgpack-retry
    /// (schema/WIRE.md).
    #[arg(long)]
    pub wire_format: Option<wire::Format>,
    /// After the aggregator refused a MessagePack body as unreadable, how long batches go as
    /// JSON before MessagePack is tried again.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub msgpack_retry: Option<Duration>,
    /// How often samples are sealed into a batch and shipped.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub ship_interval: Option<Duration>,
    /// NVML collector to skip (mig, memory, gpm, power, energy, processes); repeatable.
    #[arg(long)]
    pub disable_collector: Vec<String>,
    /// Slurm per-device job map written by deploy/slurm's prolog (e.g. /run/gpuledger/slurm-jobs).
    #[arg(long)]
    pub slurm_job_dir: Option<PathBuf>,
    /// Which Slurm job field is the tenant: account, user, partition or qos.
    #[arg(long)]
    pub slurm_tenant: Option<String>,
    /// A Slurm QoS's SLO class, as QOS=CLASS (e.g. high=latency_critical); repeatable
    /// (config file: a table). Unmapped QoS are batch.
    #[arg(long, value_parser = pair::<SloClass>)]
    #[serde(with = "pairs")]
    pub slurm_qos_class: Vec<(String, SloClass)>,
    /// Kubelet pod-resources socket; enables Kubernetes attribution
    /// (usually /var/lib/kubelet/pod-resources/kubelet.sock).
    #[arg(long)]
    pub kubelet_socket: Option<PathBuf>,
    /// How often to ask the kubelet.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub kubelet_poll_interval: Option<Duration>,
    /// A namespace's tenant, as NAMESPACE=TENANT; repeatable (config file: a table). Unmapped
    /// namespaces are their own tenant.
    #[arg(long, value_parser = pair::<String>)]
    #[serde(with = "pairs")]
    pub kubelet_namespace_tenant: Vec<(String, String)>,
    /// A namespace's SLO class, as NAMESPACE=CLASS; repeatable (config file: a table).
    #[arg(long, value_parser = pair::<SloClass>)]
    #[serde(with = "pairs")]
    pub kubelet_namespace_class: Vec<(String, SloClass)>,
    /// Kubernetes API server for pod labels, priority classes and deleted-pod filtering:
    /// a URL, or `in-cluster` (KUBERNETES_SERVICE_HOST/PORT with the pod's service-account
    /// token and CA). Needs --kubelet-socket.
    #[arg(long)]
    pub kube_apiserver: Option<String>,
    /// Bearer token file for the API server (in-cluster, without it: the service-account
    /// token).
    #[arg(long)]
    pub kube_token_file: Option<PathBuf>,
    /// CA bundle for the API server (in-cluster, without it: the service-account ca.crt).
    #[arg(long)]
    pub kube_ca_file: Option<PathBuf>,
    /// How often this node's pods are listed.
    #[arg(long, value_parser = humantime::parse_duration)]
    #[serde(with = "duration")]
    pub kube_refresh_interval: Option<Duration>,
    /// Pod label whose value is the tenant (wins over the namespace rules).
    #[arg(long)]
    pub kube_tenant_label: Option<String>,
    /// Pod annotation whose value is the tenant (after the label).
    #[arg(long)]
    pub kube_tenant_annotation: Option<String>,
    /// Pod label whose value is the workload's owner, named in reclaim notices (e.g.
    /// `gpuledger.io/owner`).
    #[arg(long)]
    pub kube_owner_label: Option<String>,
    /// Pod annotation whose value is the workload's owner (after the label).
    #[arg(long)]
    pub kube_owner_annotation: Option<String>,
    /// Pod label whose value is the SLO class.
    #[arg(long)]
    pub kube_class_label: Option<String>,
    /// A priority class's SLO class, as PRIORITYCLASS=CLASS; repeatable (config file: a table).
    #[arg(long, value_parser = pair::<SloClass>)]
    #[serde(with = "pairs")]
    pub kube_priority_class: Vec<(String, SloClass)>,
    /// Where GPU processes' cgroups are read to name their pod or Slurm job: the /proc of the
    /// exporter's PID namespace, which must be the host's (hostPID in Kubernetes).
    #[arg(long)]
    pub proc_path: Option<PathBuf>,
    /// OTLP push of the metrics (config file: the `[otlp]` table).
    #[command(flatten)]
    pub otlp: gpuledger_otel::OtlpOptions,
    /// The /metrics listener's connection bound and header read timeout (config file: the
    /// `[http]` table).
    #[command(flatten)]
    pub http: gpuledger_otel::serve::HttpOptions,
}

/// Where samples come from when `--source` is not given.
pub const DEFAULT_SOURCE: &str = "nvml";
/// Where `/metrics` is served when `--listen` is not given.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9835);
/// Replay's pace when `--speed` is not given: real time.
pub const DEFAULT_SPEED: &str = "1";
/// The spool when `--spool-dir` is not given.
pub const DEFAULT_SPOOL_DIR: &str = "/var/lib/gpuledger/spool";
/// The spool's bound when `--spool-max-bytes` is not given: a day of a 56-instance node's batches
/// many times over.
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 1 << 30;
/// How long batches go as JSON after a MessagePack refusal, when `--msgpack-retry` is not given.
pub const DEFAULT_MSGPACK_RETRY: Duration = Duration::from_secs(3600);
/// How often a batch is shipped when `--ship-interval` is not given.
pub const DEFAULT_SHIP_INTERVAL: Duration = Duration::from_secs(5);
/// The Slurm job field that is the tenant when `--slurm-tenant` is not given.
pub const DEFAULT_SLURM_TENANT: &str = "account";
/// How often the kubelet is asked when `--kubelet-poll-interval` is not given.
pub const DEFAULT_KUBELET_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// How often this node's pods are listed when `--kube-refresh-interval` is not given.
pub const DEFAULT_KUBE_REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// Where processes' cgroups are read when `--proc-path` is not given.
pub const DEFAULT_PROC_PATH: &str = "/proc";

/// The defaults of the exporter's options, as its help and docs/config.md show them
/// (`gpuledger_otel::process::with_defaults`): each from the constant
/// [`ExporterOptions::resolve`] fills in.
pub fn shown_defaults() -> Vec<(&'static str, String)> {
    use gpuledger_otel::process::shown_duration;
    let mut shown = vec![
        ("source", DEFAULT_SOURCE.to_owned()),
        ("listen", DEFAULT_LISTEN.to_string()),
        ("node", "$NODE_NAME, else the host name".to_owned()),
        ("fleet", "the built-in fleet".to_owned()),
        ("speed", DEFAULT_SPEED.to_owned()),
        ("spool_dir", DEFAULT_SPOOL_DIR.to_owned()),
        ("spool_max_bytes", DEFAULT_SPOOL_MAX_BYTES.to_string()),
        ("wire_format", wire::Format::default().to_string()),
        ("msgpack_retry", shown_duration(DEFAULT_MSGPACK_RETRY)),
        ("ship_interval", shown_duration(DEFAULT_SHIP_INTERVAL)),
        ("slurm_tenant", DEFAULT_SLURM_TENANT.to_owned()),
        (
            "kubelet_poll_interval",
            shown_duration(DEFAULT_KUBELET_POLL_INTERVAL),
        ),
        (
            "kube_refresh_interval",
            shown_duration(DEFAULT_KUBE_REFRESH_INTERVAL),
        ),
        ("proc_path", DEFAULT_PROC_PATH.to_owned()),
    ];
    shown.extend(gpuledger_otel::options::shown_defaults());
    shown.extend(gpuledger_otel::serve::shown_defaults());
    shown
}

fn source_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(SOURCES.iter().map(|s| s.name))
}

/// The `--help` text listing the sources, from [`SOURCES`].
pub fn sources_help() -> String {
    let mut s = String::from("Sources:\n");
    for k in SOURCES {
        s.push_str(&format!("  {:<8} {}\n", k.name, k.help));
    }
    s
}

/// Options that cannot run; the message names the flag (the config file's key is the same).
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// The config file.
    #[error(transparent)]
    File(#[from] options::OptionsError),
    /// The OTLP settings.
    #[error(transparent)]
    Otlp(#[from] gpuledger_otel::Error),
    /// Any other option.
    #[error("{0}")]
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> OptionsError {
    OptionsError::Invalid(message.into())
}

fn default_node() -> Result<String, OptionsError> {
    if let Ok(n) = std::env::var("NODE_NAME")
        && !n.is_empty()
    {
        return Ok(n);
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| invalid(format!("cannot read the host name ({e}); pass --node")))?;
    Ok(host.trim().to_owned())
}

fn read_token(path: &Path) -> Result<String, OptionsError> {
    let token = std::fs::read_to_string(path).map_err(|e| {
        invalid(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    let token = token.trim().to_owned();
    if token.is_empty() {
        return Err(invalid(format!(
            "the token file {} is empty",
            path.display()
        )));
    }
    Ok(token)
}

fn map<V>(pairs: Vec<(String, V)>) -> HashMap<String, V> {
    pairs.into_iter().collect()
}

impl ExporterOptions {
    /// These options (the flags) over the config file at `file`.
    pub fn over_file(&self, file: Option<&Path>) -> Result<ExporterOptions, OptionsError> {
        Ok(options::layered(self, file)?)
    }

    /// Checks the options and fills in the defaults.
    pub fn resolve(mut self) -> Result<ExporterConfig, OptionsError> {
        let node = match self.node.take() {
            Some(n) => n,
            None => default_node()?,
        };
        let source = self.source_choice()?;
        let ship = self.ship(&node)?;
        let slurm = self.slurm()?;
        let kubelet = self.kubelet(&node)?;
        Ok(ExporterConfig {
            slurm,
            kubelet,
            source,
            listen: self.listen.unwrap_or(DEFAULT_LISTEN),
            http: self.http.resolve().map_err(invalid)?,
            node,
            ship,
            attribution_map: self.attribution_map,
            proc_path: self.proc_path.unwrap_or_else(|| DEFAULT_PROC_PATH.into()),
            drain_timeout: Duration::from_secs(5),
            otlp: self.otlp.resolve()?,
        })
    }

    /// Where readings come from: NVML (the default), the simulator, or a trace replayed.
    fn source_choice(&mut self) -> Result<SourceChoice, OptionsError> {
        let source = self.source.take().unwrap_or_else(|| DEFAULT_SOURCE.into());
        Ok(match source.as_str() {
            "nvml" => SourceChoice::Nvml {
                disabled: std::mem::take(&mut self.disable_collector),
            },
            "sim" => SourceChoice::Sim {
                fleet: self.fleet.take(),
            },
            "replay" => SourceChoice::Replay {
                file: self
                    .replay_file
                    .take()
                    .ok_or_else(|| invalid("--source replay needs --replay-file"))?,
                speed: self
                    .speed
                    .as_deref()
                    .unwrap_or(DEFAULT_SPEED)
                    .parse::<Speed>()
                    .map_err(|e| invalid(format!("--speed: {e}")))?,
                once: self.once,
            },
            other => {
                return Err(invalid(format!(
                    "--source {other:?}: not one of {:?}",
                    SOURCES.iter().map(|s| s.name).collect::<Vec<_>>()
                )));
            }
        })
    }

    /// Shipping to the aggregator, when `--aggregator` is given.
    fn ship(&mut self, node: &str) -> Result<Option<ShipConfig>, OptionsError> {
        let Some(url) = self.aggregator.take() else {
            return Ok(None);
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(format!(
                "--aggregator {url:?} must be an http:// or https:// URL"
            )));
        }
        let token_file = self
            .token_file
            .take()
            .ok_or_else(|| invalid("--aggregator needs --token-file: ingest is authenticated"))?;
        Ok(Some(ShipConfig {
            aggregator: url,
            token: read_token(&token_file)?,
            node: node.to_owned(),
            spool_dir: self
                .spool_dir
                .take()
                .unwrap_or_else(|| DEFAULT_SPOOL_DIR.into()),
            spool_max_bytes: self.spool_max_bytes.unwrap_or(DEFAULT_SPOOL_MAX_BYTES),
            interval: self.ship_interval.unwrap_or(DEFAULT_SHIP_INTERVAL),
            max_batch_samples: 50_000,
            wait_when_full: false,
            request_timeout: Duration::from_secs(30),
            format: self.wire_format.take().unwrap_or_default(),
            msgpack_retry: self.msgpack_retry.unwrap_or(DEFAULT_MSGPACK_RETRY),
        }))
    }

    /// Slurm's job map, when `--slurm-job-dir` is given.
    fn slurm(&mut self) -> Result<Option<SlurmConfig>, OptionsError> {
        let Some(dir) = self.slurm_job_dir.take() else {
            return Ok(None);
        };
        Ok(Some(SlurmConfig {
            dir,
            tenant: self
                .slurm_tenant
                .as_deref()
                .unwrap_or(DEFAULT_SLURM_TENANT)
                .parse::<TenantField>()
                .map_err(|e| invalid(format!("--slurm-tenant: {e}")))?,
            qos_classes: map(std::mem::take(&mut self.slurm_qos_class)),
        }))
    }

    /// The kubelet's attribution, when `--kubelet-socket` is given, refined by the API server's
    /// when `--kube-apiserver` is too.
    fn kubelet(&mut self, node: &str) -> Result<Option<KubeletConfig>, OptionsError> {
        let apiserver = self.apiserver(node)?;
        if apiserver.is_some() && self.kubelet_socket.is_none() {
            return Err(invalid(
                "--kube-apiserver refines the kubelet's attribution: it needs --kubelet-socket",
            ));
        }
        let Some(socket) = self.kubelet_socket.take() else {
            return Ok(None);
        };
        Ok(Some(KubeletConfig {
            apiserver,
            socket,
            poll_interval: self
                .kubelet_poll_interval
                .unwrap_or(DEFAULT_KUBELET_POLL_INTERVAL),
            namespace_tenants: map(std::mem::take(&mut self.kubelet_namespace_tenant)),
            namespace_classes: map(std::mem::take(&mut self.kubelet_namespace_class)),
        }))
    }

    /// The API server's pod labels and annotations, when `--kube-apiserver` is given.
    fn apiserver(
        &mut self,
        node: &str,
    ) -> Result<Option<apiserver::ApiServerConfig>, OptionsError> {
        let Some(url) = self.kube_apiserver.take() else {
            return Ok(None);
        };
        let in_cluster = url == "in-cluster";
        let sa =
            |f: &str| in_cluster.then(|| PathBuf::from(apiserver::SERVICE_ACCOUNT_DIR).join(f));
        Ok(Some(apiserver::ApiServerConfig {
            url: if in_cluster {
                apiserver::ApiServerConfig::in_cluster_url().ok_or_else(|| {
                    invalid(
                        "--kube-apiserver in-cluster: KUBERNETES_SERVICE_HOST is not set (not in a pod?)",
                    )
                })?
            } else {
                url
            },
            token_file: self.kube_token_file.take().or_else(|| sa("token")),
            ca_file: self.kube_ca_file.take().or_else(|| sa("ca.crt")),
            node: node.to_owned(),
            refresh: self
                .kube_refresh_interval
                .unwrap_or(DEFAULT_KUBE_REFRESH_INTERVAL),
            tenant_label: self.kube_tenant_label.take(),
            tenant_annotation: self.kube_tenant_annotation.take(),
            owner_label: self.kube_owner_label.take(),
            owner_annotation: self.kube_owner_annotation.take(),
            class_label: self.kube_class_label.take(),
            priority_classes: map(std::mem::take(&mut self.kube_priority_class)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults once: each default the help shows, given back as its flag, resolves to what no
    /// flag resolves to (see the aggregator's test of the same name).
    #[test]
    fn the_defaults_shown_are_the_defaults_used() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            options: ExporterOptions,
        }
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "node-token-0123456789\n").unwrap();
        // Described rather than values, or meaningless without an OTLP endpoint.
        let args = gpuledger_otel::process::defaults_as_flags(
            <Cli as clap::CommandFactory>::command(),
            &shown_defaults(),
            &["node", "fleet", "interval", "timeout"],
        );
        let given = <Cli as clap::Parser>::try_parse_from(&args)
            .unwrap()
            .options;
        let resolve = |o: ExporterOptions| {
            ExporterOptions {
                node: Some("n1".into()),
                aggregator: Some("http://agg:9836".into()),
                token_file: Some(token.clone()),
                slurm_job_dir: Some(dir.path().into()),
                ..o
            }
            .resolve()
            .unwrap()
        };
        let (a, b) = (resolve(given), resolve(ExporterOptions::default()));
        assert_eq!(
            (a.listen, a.http, &a.proc_path, format!("{:?}", a.source)),
            (b.listen, b.http, &b.proc_path, format!("{:?}", b.source))
        );
        assert_eq!(format!("{:?}", a.ship), format!("{:?}", b.ship));
        assert_eq!(
            format!("{:?}", a.slurm.is_some()),
            format!("{:?}", b.slurm.is_some())
        );
    }

    fn from_file(flags: ExporterOptions, text: &str) -> Result<ExporterConfig, OptionsError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("exporter.toml");
        std::fs::write(&file, text).unwrap();
        flags.over_file(Some(&file))?.resolve()
    }

    #[test]
    fn the_config_file_fills_in_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let c = from_file(
            ExporterOptions {
                node: Some("gpu-h100-02".into()),
                kubelet_namespace_class: vec![("ml".into(), SloClass::Batch)],
                ..ExporterOptions::default()
            },
            &format!(
                "source = \"sim\"\nnode = \"gpu-h100-01\"\naggregator = \"http://agg:9836\"\ntoken_file = {token:?}\nship_interval = \"2s\"\n\
                 kubelet_socket = \"/k.sock\"\n[kubelet_namespace_class]\nml = \"latency_critical\"\nweb = \"latency_critical\"\n"
            ),
        )
        .unwrap();
        assert!(matches!(c.source, SourceChoice::Sim { fleet: None }));
        assert_eq!(c.node, "gpu-h100-02");
        let ship = c.ship.unwrap();
        assert_eq!(
            (ship.token.as_str(), ship.interval),
            ("s3cret", Duration::from_secs(2))
        );
        let classes = c.kubelet.unwrap().namespace_classes;
        assert_eq!(classes["ml"], SloClass::Batch, "the flag's pair wins");
        assert_eq!(
            classes["web"],
            SloClass::LatencyCritical,
            "the file's other pairs stay"
        );
    }

    #[test]
    fn bad_options_are_named() {
        let err = |text: &str| {
            from_file(ExporterOptions::default(), text)
                .unwrap_err()
                .to_string()
        };
        let e = err("aggregator = \"http://agg:9836\"\nnode = \"n\"\n");
        assert!(e.contains("--token-file"), "{e}");
        let e = err("sorce = \"sim\"\n");
        assert!(
            e.contains("unknown field `sorce`") && e.contains("exporter.toml"),
            "{e}"
        );
        let e = err("node = \"n\"\nship_interval = \"often\"\n");
        assert!(e.contains("ship_interval") && e.contains("often"), "{e}");
        let e = err("node = \"n\"\nsource = \"replay\"\n");
        assert!(e.contains("--replay-file"), "{e}");
        let e = err("node = \"n\"\nslurm_job_dir = \"/d\"\nslurm_tenant = \"group\"\n");
        assert!(e.contains("--slurm-tenant"), "{e}");
        let e = err("node = \"n\"\n[otlp]\nendpoint = \"collector\"\n");
        assert!(e.contains("otlp_endpoint"), "{e}");
    }
}
