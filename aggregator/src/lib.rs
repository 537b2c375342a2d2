//! The gpuledger aggregator: the central ledger of who held which GPU slice and how much of it
//! they used.
//!
//! Key design decision: the ledger is one embedded DuckDB file owned by one writer; readers open
//! their own connections. This crate so far holds the store's schema management ([`store`]);
//! ingest, rollups and analytics build on it.
#![warn(missing_docs)]

pub mod store;
