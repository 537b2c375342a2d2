//! The one client of each remote API gpuledger speaks, shared by every role that speaks it.
//!
//! - [`ingest`]: `POST /api/v1/ingest` on an aggregator (`schema/WIRE.md`), used by the
//!   exporter's shipper and by `gpuledger import --aggregator`: one place that sets the batch-id
//!   header, reads `Retry-After`, sorts answers into stored / retry / unreadable / refused, and
//!   falls back from MessagePack to JSON.
//! - [`kube`]: the Kubernetes API server, used by the exporter (pod metadata) and the reclaimer
//!   (evictions, Kueue Workloads), with typed object metadata and a service-account token that is
//!   re-read when its file changes (the kubelet rotates it).
//!
//! Key design decision: the clients classify, the callers decide. A client says what an answer
//! means (retry later, never, or stored); whether to wait on disk (the exporter's spool) or give
//! up after a few tries (an interactive import) is the caller's policy.
#![warn(missing_docs)]

pub mod ingest;
pub mod kube;
