#!/usr/bin/env bash
# Runs every gpuledger test. On a fresh Debian machine it first installs what the tests need:
# Prometheus (promtool and the scrape test), Alertmanager, Chromium and chromedriver (the web UI
# tests), Slurm's daemons and munge (tests/e2e/slurm_real.rs), shellcheck, systemd-analyze, the
# TLS headers the HTTP client links against, Python's prometheus-client (the reference
# OpenMetrics parser), jsonschema (validates the webhook events), kubernetes-validate (the
# Kubernetes OpenAPI schemas for deploy/kubernetes), and pyspark with a Java runtime
# (tests/e2e/spark.rs).
# Tests never skip for a missing tool; they fail naming it.
set -euo pipefail
cd "$(dirname "$0")"

# The build goes where `cargo run` puts it too (./target, or $CARGO_TARGET_DIR when set), so the
# README's two commands compile the bundled DuckDB once, whichever runs first.

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v shellcheck >/dev/null || missing+=(shellcheck)
command -v pkg-config >/dev/null || missing+=(pkg-config)
dpkg -s libssl-dev >/dev/null 2>&1 || missing+=(libssl-dev)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v slurmctld >/dev/null || missing+=(slurm-wlm)
command -v munged >/dev/null || missing+=(munge)
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
if ((${#missing[@]})); then
  echo "test.sh: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! python3 -c 'import prometheus_client.openmetrics.parser' 2>/dev/null; then
  echo "test.sh: installing the Python prometheus-client (OpenMetrics reference parser)"
  python3 -m pip install -q --disable-pip-version-check prometheus-client
fi

if ! python3 -c 'import jsonschema' 2>/dev/null; then
  echo "test.sh: installing the Python jsonschema package (checks the webhook events' JSON Schema)"
  python3 -m pip install -q --disable-pip-version-check jsonschema
fi

if ! python3 -c 'import pyspark' 2>/dev/null; then
  echo "test.sh: installing the Python pyspark package (Spark in local mode reads the fleet's Parquet)"
  python3 -m pip install -q --disable-pip-version-check pyspark
fi

if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  echo "test.sh: installing the Python kubernetes-validate package (the Kubernetes OpenAPI schemas)"
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate
fi

shellcheck test.sh .ci/run deploy/slurm/*.sh tests/slurm/*.sh benches/*.sh benches/prometheus/*.sh benches/gpu/*.sh
# The real-GPU check's tools run only where a GPU is (benches/gpu/): here they must still compile.
cc -Wall -Werror -fsyntax-only benches/gpu/gpuload.c
python3 -m py_compile benches/gpu/gpm_reference.py benches/gpu/energy_report.py
cargo test --workspace --all-targets --locked
