//! `gpuledger exporter`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use super::duration;
use std::collections::HashMap;

use gpuledger_exporter::attribution::KubeletConfig;
use gpuledger_exporter::attribution::kubelet::apiserver;
use gpuledger_exporter::attribution::slurm::TenantField;
use gpuledger_exporter::daemon::{self, ExporterConfig, SlurmConfig, SourceChoice, Speed};
use gpuledger_exporter::ship::ShipConfig;
use gpuledger_exporter::source::SOURCES;
use gpuledger_schema::SloClass;
use serde::Deserialize;

/// Flags of `gpuledger exporter`. Every flag can also be set in `--config FILE` (TOML, the flag's
/// long name with `_` for `-`); a flag on the command line wins.
#[derive(Debug, Default, clap::Args)]
#[command(after_help = sources_help())]
pub struct Args {
    /// Where samples come from: nvml, sim or replay [default: nvml].
    #[arg(long, value_parser = source_names(), env = "GPULEDGER_EXPORTER_SOURCE")]
    source: Option<String>,
    /// Address for /metrics [default: 0.0.0.0:9835].
    #[arg(long, env = "GPULEDGER_EXPORTER_LISTEN")]
    listen: Option<SocketAddr>,
    /// Aggregator base URL (http://aggregator:9836); without it the exporter only serves /metrics.
    #[arg(long, env = "GPULEDGER_EXPORTER_AGGREGATOR")]
    aggregator: Option<String>,
    /// File holding the bearer token for the aggregator (required with --aggregator).
    #[arg(long, env = "GPULEDGER_EXPORTER_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// This node's name [default: $NODE_NAME, else the host name].
    #[arg(long, env = "GPULEDGER_EXPORTER_NODE")]
    node: Option<String>,
    /// TOML file with any of these flags.
    #[arg(long, env = "GPULEDGER_EXPORTER_CONFIG")]
    config: Option<PathBuf>,
    /// Simulated fleet (TOML) for --source sim [default: the built-in fleet].
    #[arg(long, env = "GPULEDGER_EXPORTER_FLEET")]
    fleet: Option<PathBuf>,
    /// Trace CSV for --source replay.
    #[arg(long, env = "GPULEDGER_EXPORTER_REPLAY_FILE")]
    replay_file: Option<PathBuf>,
    /// Replay pace: 1 (real time), a factor such as 60, or max [default: 1].
    #[arg(long, env = "GPULEDGER_EXPORTER_SPEED")]
    speed: Option<String>,
    /// Exit (0) once the whole replay file is shipped and acknowledged.
    #[arg(long)]
    once: bool,
    /// Static attribution map (TOML): device UUID → tenant, workload, SLO class.
    #[arg(long, env = "GPULEDGER_EXPORTER_ATTRIBUTION_MAP")]
    attribution_map: Option<PathBuf>,
    /// Directory of the on-disk spool [default: /var/lib/gpuledger/spool].
    #[arg(long, env = "GPULEDGER_EXPORTER_SPOOL_DIR")]
    spool_dir: Option<PathBuf>,
    /// Spool bound in bytes; when full, the oldest batch is dropped [default: 1073741824].
    #[arg(long, env = "GPULEDGER_EXPORTER_SPOOL_MAX_BYTES")]
    spool_max_bytes: Option<u64>,
    /// How often samples are sealed into a batch and shipped [default: 5s].
    #[arg(long, env = "GPULEDGER_EXPORTER_SHIP_INTERVAL")]
    ship_interval: Option<humantime::Duration>,
    /// NVML collector to skip (mig, memory, gpm, power, processes); repeatable.
    #[arg(long, env = "GPULEDGER_EXPORTER_DISABLE_COLLECTOR")]
    disable_collector: Vec<String>,
    /// Slurm per-device job map written by deploy/slurm's prolog (e.g. /run/gpuledger/slurm-jobs).
    #[arg(long, env = "GPULEDGER_EXPORTER_SLURM_JOB_DIR")]
    slurm_job_dir: Option<PathBuf>,
    /// Which Slurm job field is the tenant: account, user, partition or qos [default: account].
    #[arg(long, env = "GPULEDGER_EXPORTER_SLURM_TENANT")]
    slurm_tenant: Option<String>,
    /// A Slurm QoS's SLO class, as QOS=CLASS (e.g. high=latency_critical); repeatable.
    /// Unmapped QoS are batch.
    #[arg(long, env = "GPULEDGER_EXPORTER_SLURM_QOS_CLASS")]
    slurm_qos_class: Vec<String>,
    /// Kubelet pod-resources socket; enables Kubernetes attribution
    /// (usually /var/lib/kubelet/pod-resources/kubelet.sock).
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBELET_SOCKET")]
    kubelet_socket: Option<PathBuf>,
    /// How often to ask the kubelet [default: 5s].
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBELET_POLL_INTERVAL")]
    kubelet_poll_interval: Option<humantime::Duration>,
    /// A namespace's tenant, as NAMESPACE=TENANT; repeatable. Unmapped namespaces are their own tenant.
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBELET_NAMESPACE_TENANT")]
    kubelet_namespace_tenant: Vec<String>,
    /// A namespace's SLO class, as NAMESPACE=CLASS; repeatable.
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBELET_NAMESPACE_CLASS")]
    kubelet_namespace_class: Vec<String>,
    /// Kubernetes API server for pod labels, priority classes and deleted-pod filtering:
    /// a URL, or `in-cluster` (KUBERNETES_SERVICE_HOST/PORT with the pod's service-account
    /// token and CA). Needs --kubelet-socket.
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBE_APISERVER")]
    kube_apiserver: Option<String>,
    /// Bearer token file for the API server [default in-cluster: the service-account token].
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBE_TOKEN_FILE")]
    kube_token_file: Option<PathBuf>,
    /// CA bundle for the API server [default in-cluster: the service-account ca.crt].
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBE_CA_FILE")]
    kube_ca_file: Option<PathBuf>,
    /// How often this node's pods are listed [default: 30s].
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBE_REFRESH_INTERVAL")]
    kube_refresh_interval: Option<humantime::Duration>,
    /// Pod label whose value is the tenant (wins over the namespace rules).
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBE_TENANT_LABEL")]
    kube_tenant_label: Option<String>,
    /// Pod annotation whose value is the tenant (after the label).
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBE_TENANT_ANNOTATION")]
    kube_tenant_annotation: Option<String>,
    /// Pod label whose value is the SLO class.
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBE_CLASS_LABEL")]
    kube_class_label: Option<String>,
    /// A priority class's SLO class, as PRIORITYCLASS=CLASS; repeatable.
    #[arg(long, env = "GPULEDGER_EXPORTER_KUBE_PRIORITY_CLASS")]
    kube_priority_class: Vec<String>,
    /// Where GPU processes' cgroups are read to name their pod or Slurm job: the /proc of the
    /// exporter's PID namespace, which must be the host's (hostPID in Kubernetes) [default: /proc].
    #[arg(long, env = "GPULEDGER_EXPORTER_PROC_PATH")]
    proc_path: Option<PathBuf>,
}

fn sources_help() -> String {
    let mut s = String::from("Sources:\n");
    for k in SOURCES {
        s.push_str(&format!("  {:<8} {}\n", k.name, k.help));
    }
    s
}

fn source_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(SOURCES.iter().map(|s| s.name))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    source: Option<String>,
    listen: Option<SocketAddr>,
    aggregator: Option<String>,
    token_file: Option<PathBuf>,
    node: Option<String>,
    fleet: Option<PathBuf>,
    replay_file: Option<PathBuf>,
    speed: Option<String>,
    once: Option<bool>,
    attribution_map: Option<PathBuf>,
    spool_dir: Option<PathBuf>,
    spool_max_bytes: Option<u64>,
    ship_interval: Option<String>,
    #[serde(default)]
    disable_collector: Vec<String>,
    slurm_job_dir: Option<PathBuf>,
    slurm_tenant: Option<String>,
    #[serde(default)]
    slurm_qos_class: HashMap<String, SloClass>,
    kubelet_socket: Option<PathBuf>,
    kubelet_poll_interval: Option<String>,
    #[serde(default)]
    kubelet_namespace_tenant: HashMap<String, String>,
    #[serde(default)]
    kubelet_namespace_class: HashMap<String, SloClass>,
    kube_apiserver: Option<String>,
    kube_token_file: Option<PathBuf>,
    kube_ca_file: Option<PathBuf>,
    kube_refresh_interval: Option<String>,
    kube_tenant_label: Option<String>,
    kube_tenant_annotation: Option<String>,
    kube_class_label: Option<String>,
    #[serde(default)]
    kube_priority_class: HashMap<String, SloClass>,
    proc_path: Option<PathBuf>,
}

/// `KEY=VALUE` pairs from repeated flags, over the config file's table.
fn pairs<V>(
    flag: &str,
    given: &[String],
    mut base: HashMap<String, V>,
    parse: impl Fn(&str) -> anyhow::Result<V>,
) -> anyhow::Result<HashMap<String, V>> {
    for pair in given {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("{flag} {pair:?}: expected KEY=VALUE"))?;
        base.insert(
            k.to_owned(),
            parse(v).with_context(|| format!("{flag} {pair:?}"))?,
        );
    }
    Ok(base)
}

fn default_node() -> anyhow::Result<String> {
    if let Ok(n) = std::env::var("NODE_NAME")
        && !n.is_empty()
    {
        return Ok(n);
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("cannot read the host name; pass --node")?;
    Ok(host.trim().to_owned())
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = token.trim().to_owned();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token)
}

/// Merges flags over the config file over defaults.
fn config(args: Args) -> anyhow::Result<ExporterConfig> {
    let file: FileConfig = super::config_file(args.config.as_deref())?;
    let source = args.source.or(file.source).unwrap_or_else(|| "nvml".into());
    let node = match args.node.or(file.node) {
        Some(n) => n,
        None => default_node()?,
    };
    let speed: Speed = args
        .speed
        .or(file.speed)
        .unwrap_or_else(|| "1".into())
        .parse()
        .map_err(anyhow::Error::msg)
        .context("--speed")?;
    let once = args.once || file.once.unwrap_or(false);
    let disabled: Vec<String> = args
        .disable_collector
        .into_iter()
        .chain(file.disable_collector)
        .collect();
    let source = match source.as_str() {
        "nvml" => SourceChoice::Nvml { disabled },
        "sim" => SourceChoice::Sim {
            fleet: args.fleet.or(file.fleet),
        },
        "replay" => SourceChoice::Replay {
            file: args
                .replay_file
                .or(file.replay_file)
                .context("--source replay needs --replay-file")?,
            speed,
            once,
        },
        other => bail!("unknown source {other:?}"),
    };
    let ship_interval = duration("ship_interval", args.ship_interval, file.ship_interval, 5)?;
    let ship = match args.aggregator.or(file.aggregator) {
        None => None,
        Some(url) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("--aggregator {url:?} must be an http:// or https:// URL");
            }
            let token_file = args
                .token_file
                .or(file.token_file)
                .context("--aggregator needs --token-file: ingest is authenticated")?;
            Some(ShipConfig {
                aggregator: url,
                token: read_token(&token_file)?,
                node: node.clone(),
                spool_dir: args
                    .spool_dir
                    .or(file.spool_dir)
                    .unwrap_or_else(|| "/var/lib/gpuledger/spool".into()),
                spool_max_bytes: args
                    .spool_max_bytes
                    .or(file.spool_max_bytes)
                    .unwrap_or(1 << 30),
                interval: ship_interval,
                max_batch_samples: 50_000,
                wait_when_full: false,
                request_timeout: Duration::from_secs(30),
            })
        }
    };
    let slurm = match args.slurm_job_dir.or(file.slurm_job_dir) {
        None => None,
        Some(dir) => {
            let tenant: TenantField = args
                .slurm_tenant
                .or(file.slurm_tenant)
                .unwrap_or_else(|| "account".into())
                .parse()
                .map_err(anyhow::Error::msg)
                .context("--slurm-tenant")?;
            let qos_classes = pairs(
                "--slurm-qos-class",
                &args.slurm_qos_class,
                file.slurm_qos_class,
                |v| Ok(v.parse()?),
            )?;
            Some(SlurmConfig {
                dir,
                tenant,
                qos_classes,
            })
        }
    };
    let apiserver = match args.kube_apiserver.or(file.kube_apiserver) {
        None => None,
        Some(url) => {
            let in_cluster = url == "in-cluster";
            let sa =
                |f: &str| in_cluster.then(|| PathBuf::from(apiserver::SERVICE_ACCOUNT_DIR).join(f));
            Some(apiserver::ApiServerConfig {
                url: if in_cluster {
                    apiserver::ApiServerConfig::in_cluster_url().context(
                        "--kube-apiserver in-cluster: KUBERNETES_SERVICE_HOST is not set (not in a pod?)",
                    )?
                } else {
                    url
                },
                token_file: args
                    .kube_token_file
                    .or(file.kube_token_file)
                    .or_else(|| sa("token")),
                ca_file: args
                    .kube_ca_file
                    .or(file.kube_ca_file)
                    .or_else(|| sa("ca.crt")),
                node: node.clone(),
                refresh: duration(
                    "kube_refresh_interval",
                    args.kube_refresh_interval,
                    file.kube_refresh_interval,
                    30,
                )?,
                tenant_label: args.kube_tenant_label.or(file.kube_tenant_label),
                tenant_annotation: args.kube_tenant_annotation.or(file.kube_tenant_annotation),
                class_label: args.kube_class_label.or(file.kube_class_label),
                priority_classes: pairs(
                    "--kube-priority-class",
                    &args.kube_priority_class,
                    file.kube_priority_class,
                    |v| Ok(v.parse()?),
                )?,
            })
        }
    };
    let kubelet_socket = args.kubelet_socket.or(file.kubelet_socket);
    anyhow::ensure!(
        apiserver.is_none() || kubelet_socket.is_some(),
        "--kube-apiserver refines the kubelet's attribution: it needs --kubelet-socket"
    );
    let kubelet = match kubelet_socket {
        None => None,
        Some(socket) => Some(KubeletConfig {
            apiserver,
            socket,
            poll_interval: duration(
                "kubelet_poll_interval",
                args.kubelet_poll_interval,
                file.kubelet_poll_interval,
                5,
            )?,
            namespace_tenants: pairs(
                "--kubelet-namespace-tenant",
                &args.kubelet_namespace_tenant,
                file.kubelet_namespace_tenant,
                |v| Ok(v.to_owned()),
            )?,
            namespace_classes: pairs(
                "--kubelet-namespace-class",
                &args.kubelet_namespace_class,
                file.kubelet_namespace_class,
                |v| Ok(v.parse()?),
            )?,
        }),
    };
    Ok(ExporterConfig {
        slurm,
        kubelet,
        source,
        listen: args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| "0.0.0.0:9835".parse().expect("a valid address")),
        node,
        ship,
        attribution_map: args.attribution_map.or(file.attribution_map),
        proc_path: args
            .proc_path
            .or(file.proc_path)
            .unwrap_or_else(|| "/proc".into()),
        drain_timeout: Duration::from_secs(5),
    })
}

/// Runs the exporter until SIGTERM/SIGINT (or, with --once, until the trace is shipped).
pub fn run(args: Args) -> anyhow::Result<()> {
    let config = config(args)?;
    super::runtime()?.block_on(daemon::run(config, super::shutdown_signal()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_file_fills_in_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let file = dir.path().join("exporter.toml");
        std::fs::write(
            &file,
            format!("source = \"sim\"\nnode = \"gpu-h100-01\"\naggregator = \"http://agg:9836\"\ntoken_file = {:?}\nship_interval = \"2s\"\n", token),
        )
        .unwrap();
        let c = config(Args {
            config: Some(file.clone()),
            node: Some("gpu-h100-02".into()),
            ..Args::default()
        })
        .unwrap();
        assert!(matches!(c.source, SourceChoice::Sim { fleet: None }));
        assert_eq!(c.node, "gpu-h100-02");
        let ship = c.ship.unwrap();
        assert_eq!(
            (ship.token.as_str(), ship.interval),
            ("s3cret", Duration::from_secs(2))
        );

        std::fs::write(&file, "aggregator = \"http://agg:9836\"\nnode = \"n\"\n").unwrap();
        let err = config(Args {
            config: Some(file.clone()),
            ..Args::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("--token-file"), "{err}");

        std::fs::write(&file, "sorce = \"sim\"\n").unwrap();
        let err = config(Args {
            config: Some(file),
            ..Args::default()
        })
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("unknown field `sorce`"),
            "{err:#}"
        );
    }
}
