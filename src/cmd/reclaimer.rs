//! `gpuledger reclaimer`: the webhook receiver beside a scheduler (docs/reclaim.md), the same as
//! the `gpuledger-reclaimer` binary; its flags and keys are declared in `gpuledger_reclaimer`.

pub use gpuledger_reclaimer::cli::{Args, run};
