//! `gpuledger exporter`: the node daemon, the same as the `gpuledger-exporter` binary; its flags
//! are declared in `gpuledger_exporter::cli`.

pub use gpuledger_exporter::cli::{Args, run};
