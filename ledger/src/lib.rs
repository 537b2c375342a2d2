//! The gpuledger ledger: who held which GPU slice, how much of it they used, and what follows
//! from that, kept in one embedded DuckDB file.
//!
//! One writer thread ([`store::writer`]) owns the DuckDB write connection and turns batches into
//! raw rows and minute, hour and tenant rollups in one transaction per group of batches; readers
//! use their own connections ([`store::query`]). [`analytics`] derives showback, bills, idle
//! hoarding and MIG fragmentation from the rollups; [`reclaim`] decides what to do about idle
//! episodes and records each decision with its webhook events in the same transaction (the
//! outbox); [`import`] backfills trace files through the same writer and [`export`] writes
//! Hive-partitioned Parquet for querying several ledgers at once.
//!
//! Key design decision: exactly-once is a property of the data, not of the transport. Every
//! minute rollup row carries a 60-bit mask of the seconds it holds, so a second copy of an
//! (instance, second) is recognised and dropped whatever batch, order or restart it comes with,
//! for as long as the rollups are kept — not only while batch ids or raw rows are.
//!
//! This crate knows no HTTP: the service above it (`gpuledger-aggregator`) serves it, and what
//! arrives over the network reaches it as typed batches.
#![warn(missing_docs)]

pub mod analytics;
pub mod export;
pub mod import;
pub mod memory;
pub mod reclaim;
pub mod store;
