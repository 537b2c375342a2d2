//! The gpuledger node exporter: one daemon per GPU node.
//!
//! Every second it samples each MIG instance (or whole GPU) from a [`source::Source`] (NVML, the
//! fleet simulator, or a trace replay), attributes it to the tenant holding it
//! ([`attribution`]), exposes it on `/metrics` ([`metrics`], [`server`]) and ships it to the
//! aggregator in batches through a bounded on-disk spool ([`ship`]). [`daemon`] wires these up.
//!
//! Key design decision: sources only *read*; everything downstream of [`source::Second`] is the
//! same code for real GPUs, the simulator and replays, so what the tests drive with the simulator
//! and fixtures is what runs against NVML.
#![warn(missing_docs)]

pub mod attribution;
pub mod cli;
pub mod daemon;
pub mod metrics;
pub mod options;
pub mod server;
pub mod ship;
pub mod source;
