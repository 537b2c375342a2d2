//! The example configuration under deploy/ parses with the real code.

use crate::common;

use gpuledger_exporter::attribution::StaticMap;

#[test]
fn the_example_attribution_map_loads() {
    StaticMap::load(std::path::Path::new(&format!(
        "{}/deploy/config/attribution.toml",
        common::root().display()
    )))
    .unwrap();
}

#[test]
fn the_example_exporter_config_is_accepted_up_to_the_missing_token() {
    // Every key parses; on this machine the systemd credential does not exist, and the exporter
    // says so instead of starting unauthenticated.
    let out = common::gpuledger()
        .args([
            "exporter",
            "--config",
            &format!("{}/deploy/config/exporter.toml", common::root().display()),
            "--source",
            "sim",
            "--node",
            "gpu-h100-01",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "cannot read the token file /run/credentials/gpuledger-exporter.service/token"
        ),
        "{stderr}"
    );
}

#[test]
fn nvml_without_a_driver_exits_with_one_sentence() {
    let mut child = common::gpuledger()
        .args([
            "exporter",
            "--source",
            "nvml",
            "--node",
            "n",
            "--listen",
            "127.0.0.1:0",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            // Still sampling: a machine with the NVIDIA driver, where there is nothing to check.
            child.kill().unwrap();
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1));
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("gpuledger: NVML is not available on this machine"),
        "{stderr}"
    );
}

/// A file embedded in a manifest's ConfigMap (`  <name>: |` and its indented lines), written to
/// `dir`.
fn config_map_file(dir: &std::path::Path, manifest: &str, name: &str) -> std::path::PathBuf {
    let yaml = std::fs::read_to_string(format!(
        "{}/deploy/kubernetes/{manifest}",
        common::root().display()
    ))
    .unwrap();
    let key = format!("  {name}: |\n");
    let start = yaml.find(&key).expect("the ConfigMap holds the file") + key.len();
    let text: String = yaml[start..]
        .lines()
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_daemonset_config_map_is_accepted_up_to_the_missing_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_map_file(dir.path(), "exporter-daemonset.yaml", "exporter.toml");
    let out = common::gpuledger()
        .args(["exporter", "--config"])
        .arg(&path)
        .args(["--source", "sim", "--node", "gpu-h100-01"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read the token file /var/run/gpuledger/token/token"),
        "{stderr}"
    );
}

#[test]
fn the_example_aggregator_config_and_token_file_are_accepted() {
    // Every key of the example parses; the systemd credential does not exist here, and the
    // aggregator says so instead of starting unauthenticated.
    let out = common::gpuledger()
        .args([
            "aggregator",
            "--config",
            &format!("{}/deploy/config/aggregator.toml", common::root().display()),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("token file /run/credentials/gpuledger-aggregator.service/tokens"),
        "{stderr}"
    );
    gpuledger_aggregator::auth::Tokens::from_file(std::path::Path::new(&format!(
        "{}/deploy/config/aggregator-tokens.example",
        common::root().display()
    )))
    .unwrap();
}

#[test]
fn the_statefulset_config_map_is_accepted_up_to_the_missing_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_map_file(dir.path(), "aggregator-statefulset.yaml", "aggregator.toml");
    let out = common::gpuledger()
        .args(["aggregator", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("token file /var/run/gpuledger/tokens/tokens"),
        "{stderr}"
    );
}

#[test]
fn the_grafana_dashboard_queries_only_documented_metrics() {
    let doc =
        std::fs::read_to_string(format!("{}/docs/metrics.md", common::root().display())).unwrap();
    let documented: std::collections::BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `gpuledger_"))
        .map(|l| format!("gpuledger_{}", l.split('`').next().unwrap()))
        .collect();
    let mut used = 0;
    for expr in common::dashboard_exprs() {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("gpuledger_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| documented.contains(*f)))
                .unwrap_or(&name);
            assert!(
                documented.contains(family),
                "{name} (in {expr}) is not in docs/metrics.md's metric tables"
            );
            used += 1;
        }
    }
    assert!(used > 10);
}

/// Every key of the example aggregator and reclaimer configs is checked (`--check-config`), with
/// the systemd credential paths pointed at files that exist here.
#[test]
fn the_example_reclaim_configs_pass_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let root = common::root();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "admin 0123456789abcdef0123\n").unwrap();
    let secret = dir.path().join("webhook-secret");
    std::fs::write(&secret, format!("{}\n", common::receiver::secret())).unwrap();
    let text = std::fs::read_to_string(root.join("deploy/config/aggregator.toml"))
        .unwrap()
        .replace(
            "/run/credentials/gpuledger-aggregator.service/tokens",
            tokens.to_str().unwrap(),
        )
        .replace(
            "/run/credentials/gpuledger-aggregator.service/webhook-secret",
            secret.to_str().unwrap(),
        );
    let cfg = dir.path().join("aggregator.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = check_config("aggregator", &cfg);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("batch=reclaim interactive=reclaim latency_critical=notify"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(dry run), 2 webhook endpoint(s), Alertmanager push on"),
        "{stdout}"
    );
    // A bad key is named with its table.
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("after = \"30m\"", "after = \"half an hour\""),
    )
    .unwrap();
    let out = check_config("aggregator", &cfg);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("half an hour") && stderr.contains("after"),
        "{stderr}"
    );

    let text = std::fs::read_to_string(root.join("deploy/config/reclaimer.toml"))
        .unwrap()
        .replace(
            "/run/credentials/gpuledger-reclaimer.service/webhook-secret",
            secret.to_str().unwrap(),
        )
        .replace(
            "/var/lib/gpuledger-reclaimer/acted.log",
            dir.path().join("acted.log").to_str().unwrap(),
        );
    let cfg = dir.path().join("reclaimer.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = check_config("reclaimer", &cfg);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Kubernetes evictions and Slurm, dry run"),
        "{stdout}"
    );
}

/// The reclaimer's ConfigMap is accepted by `--check-config` once its secret exists.
#[test]
fn the_reclaimer_config_map_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_map_file(dir.path(), "reclaimer-deployment.yaml", "reclaimer.toml");
    let secret = dir.path().join("webhook-secret");
    std::fs::write(&secret, common::receiver::secret()).unwrap();
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            "/var/run/gpuledger/webhook-secret/webhook-secret",
            secret.to_str().unwrap(),
        )
        .replace(
            "/var/lib/gpuledger-reclaimer/acted.log",
            dir.path().join("acted.log").to_str().unwrap(),
        );
    std::fs::write(&path, text).unwrap();
    let out = check_config("reclaimer", &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Kubernetes evictions, dry run"), "{stdout}");
}

/// `gpuledger <subcommand> --check-config --config <path>`.
fn check_config(subcommand: &str, path: &std::path::Path) -> std::process::Output {
    common::gpuledger()
        .args([subcommand, "--check-config", "--config"])
        .arg(path)
        .output()
        .unwrap()
}

/// The Kustomize base, validated against the Kubernetes OpenAPI schemas (Python's
/// `kubernetes-validate`, strict): see tests/kubernetes_manifests.py. The Prometheus Operator
/// kinds are skipped with the reason printed; the PrometheusRule's groups, which must be
/// alerts/*.rules.yml's, go through `promtool check rules`.
#[test]
fn the_kubernetes_base_validates_against_the_openapi_schemas() {
    common::require_tool("promtool");
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("prometheus-rule.groups.yml");
    let out = std::process::Command::new("python3")
        .arg(common::root().join("tests/kubernetes_manifests.py"))
        .arg(common::root())
        .arg(&rules)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "tests/kubernetes_manifests.py failed (./test.sh installs kubernetes-validate): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for skipped in report["skipped"].as_array().unwrap() {
        println!("skipped {}", skipped.as_str().unwrap());
    }
    let errors = report["errors"].as_array().unwrap();
    assert!(errors.is_empty(), "{errors:#?}");
    let validated = report["validated"].as_array().unwrap();
    for kind in [
        "DaemonSet/",
        "StatefulSet/gpuledger-aggregator",
        "ClusterRole/",
        "Service/",
    ] {
        assert!(
            validated.iter().any(|v| v.as_str().unwrap().contains(kind)),
            "{kind} was validated: {validated:?}"
        );
    }
    let check = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

/// `systemd-analyze verify` accepts every unit without a warning (the ExecStart pointed at the
/// binary under test, since /usr/local/bin/gpuledger is not installed here), and each unit keeps
/// its hardening.
#[test]
fn the_systemd_units_verify_and_are_hardened() {
    common::require_tool("systemd-analyze");
    let dir = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for entry in std::fs::read_dir(common::root().join("deploy/systemd")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "service") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for directive in [
            "DynamicUser=yes",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "StateDirectory=",
            "ProtectKernelTunables=yes",
            "RestrictAddressFamilies=",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(directive)),
                "{} lacks {directive}",
                path.display()
            );
        }
        let copy = dir.path().join(path.file_name().unwrap());
        // The exporter and the reclaimer run their lean binaries, the aggregator the combined one.
        let text = ["gpuledger-exporter", "gpuledger-reclaimer"]
            .iter()
            .fold(text, |t, name| {
                t.replace(
                    &format!("/usr/local/bin/{name}"),
                    common::bin_path(name).to_str().unwrap(),
                )
            })
            .replace(
                "/usr/local/bin/gpuledger ",
                &format!("{} ", env!("CARGO_BIN_EXE_gpuledger")),
            );
        assert!(!text.contains("/usr/local/bin/"), "{}", path.display());
        std::fs::write(&copy, text).unwrap();
        units.push(copy);
    }
    assert_eq!(
        units.len(),
        3,
        "the exporter, aggregator and reclaimer units"
    );
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&units)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
}

/// Every option of the services can come from `GPULEDGER_<COMMAND>_<FLAG>` (a flag on the
/// command line wins; the config file comes last); a bad value names the variable.
#[test]
fn environment_variables_set_options_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "admin aaaaaaaaaaaaaaaaaaaaaaaa\n").unwrap();
    let config = dir.path().join("aggregator.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:7001\"\n").unwrap();
    let check = |env: &[(&str, &str)], args: &[&str]| {
        let out = common::gpuledger()
            .args(["aggregator", "--check-config"])
            .args(args)
            .env("GPULEDGER_AGGREGATOR_TOKEN_FILE", &tokens)
            .env("GPULEDGER_AGGREGATOR_CONFIG", &config)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = check(&[], &[]);
    assert!(
        ok && text.contains("listen 127.0.0.1:7001"),
        "the file: {text}"
    );
    let (ok, text) = check(&[("GPULEDGER_AGGREGATOR_LISTEN", "127.0.0.1:7002")], &[]);
    assert!(
        ok && text.contains("listen 127.0.0.1:7002"),
        "env over the file: {text}"
    );
    let (ok, text) = check(
        &[("GPULEDGER_AGGREGATOR_LISTEN", "127.0.0.1:7002")],
        &["--listen", "127.0.0.1:7003"],
    );
    assert!(
        ok && text.contains("listen 127.0.0.1:7003"),
        "the flag over env: {text}"
    );
    let (ok, text) = check(&[("GPULEDGER_AGGREGATOR_LISTEN", "nope")], &[]);
    assert!(!ok);
    assert!(
        text.contains("--listen") && text.contains("GPULEDGER_AGGREGATOR_LISTEN"),
        "{text}"
    );
    let (ok, text) = check(&[("GPULEDGER_AGGREGATOR_IDLE_THRESHOLD", "lots")], &[]);
    assert!(
        !ok && text.contains("GPULEDGER_AGGREGATOR_IDLE_THRESHOLD"),
        "{text}"
    );
}
