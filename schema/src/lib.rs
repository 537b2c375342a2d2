//! The shapes every gpuledger crate agrees on.
//!
//! A node exporter, the aggregator and the trace tools all speak about one thing: a *sample*, the
//! counters of one GPU instance (a MIG instance or a whole GPU) during one second, together with
//! who held the instance in that second. This crate defines that sample ([`sample`]), the MIG
//! geometry rules it refers to ([`mig`]), the trace CSV that stores samples as text ([`trace`]),
//! the versioned ingest batch that carries them over HTTP ([`wire`]) and the Prometheus
//! exposition formats ([`exposition`]) and the signed reclaim webhooks ([`webhook`]).
//!
//! Key design decision: one sample type, [`sample::Sample`], is the unit everywhere. The trace
//! CSV is one sample per row, the wire batch is samples grouped column-wise per instance, and the
//! round trip between any two representations is lossless and tested.
#![warn(missing_docs)]

pub mod energy;
pub mod error;
pub mod exposition;
pub mod keep;
pub mod mig;
pub mod migrations;
pub mod options;
pub mod sample;
pub mod trace;
pub mod webhook;
pub mod wire;

pub use sample::{Attribution, Counters, GpuSample, Instance, Sample, ShareSample, SloClass};
