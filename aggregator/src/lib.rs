//! The gpuledger aggregator: the central service over the ledger (`gpuledger-ledger`).
//!
//! Exporters POST batches ([`api::ingest`]) that the ledger's one writer stores; the JSON API
//! ([`api`]) and the finance pages ([`ui`]) read the ledger's analytics and render them; [`auth`]
//! says who may call what; [`server`] runs the evaluation, retention and outbox delivery loops
//! ([`reclaim`]); [`telemetry`] is the service's own `/metrics`. [`router`] lists every route.
//!
//! Key design decision: layers are crates. Everything about the ledger (store, analytics, reclaim
//! policy and outbox, import, export) is in `gpuledger-ledger`, which knows no HTTP; this crate
//! turns HTTP into typed calls on it and typed answers back into JSON, CSV and pages, which
//! all render the same value ([`render`]).
#![warn(missing_docs)]

pub mod api;
pub mod auth;
pub mod config;
pub mod error;
pub mod options;
pub mod reclaim;
pub mod render;
pub mod router;
pub mod server;
pub mod telemetry;
pub mod ui;

pub use config::{Config, Limits};
pub use server::{Prepare, Startup, run, run_with};
