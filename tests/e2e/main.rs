//! The end-to-end tests: the real binaries, real HTTP on loopback, real DuckDB files, real
//! Prometheus, Alertmanager and Chromium, across crates. One test binary rather than one per
//! file: each links the ledger (DuckDB), and linking was most of the suite's build time. Filter
//! by file with the module name: `cargo test --workspace --all-targets -- reclaimer::`.

mod common;

mod aggregator_analytics_api;
mod aggregator_crash;
mod aggregator_export;
mod aggregator_hardening;
mod aggregator_hostile;
mod aggregator_ingest;
mod aggregator_metrics;
mod aggregator_shares;
mod alerting;
mod alerts;
mod analytics;
mod budgets;
mod connections;
mod demo;
mod deploy_config;
mod docs_links;
mod energy;
mod exporter_metrics;
mod exporter_prometheus;
mod exporter_replay;
mod exporter_spool;
mod fleet_pages;
mod kubelet;
mod notices;
mod one_build;
mod otlp;
mod reclaim;
mod reclaimer;
mod rightsizing;
mod slurm;
mod slurm_real;
mod spark;
mod web_ui;
