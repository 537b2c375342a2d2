//! The gpuledger aggregator: the central ledger of who held which GPU slice and how much of it
//! they used.
//!
//! Exporters POST batches ([`api::ingest`]); one writer thread ([`store::writer`]) owns the DuckDB
//! write connection and turns them into raw rows and minute, hour and tenant rollups in one
//! transaction per group of batches; readers use their own connections ([`store::query`]);
//! retention runs in the background ([`server`]). [`import`] backfills trace files through the
//! same writer and [`export`] writes Hive-partitioned Parquet for querying several ledgers at once.
//!
//! Key design decision: exactly-once is a property of the data, not of the transport. Every
//! minute rollup row carries a 60-bit mask of the seconds it holds, so a second copy of an
//! (instance, second) is recognised and dropped whatever batch, order or restart it comes with,
//! for as long as the rollups are kept — not only while batch ids or raw rows are.
#![warn(missing_docs)]

pub mod analytics;
pub mod api;
pub mod auth;
pub mod config;
pub mod export;
pub mod import;
pub mod options;
pub mod reclaim;
pub mod reclaimer;
pub mod router;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod ui;

pub use config::{Config, Limits};
pub use server::{Prepare, Startup, run, run_with};

/// glibc's allocator, set before any thread starts, for the long-lived processes that hold a
/// ledger (`gpuledger aggregator` and `demo`): at most [`malloc_arenas`] malloc arenas (two per
/// core, at least four), unless the environment sets `MALLOC_ARENA_MAX` (glibc reads it itself).
/// By default glibc gives threads their own arenas, up to 8 per core, and the pages freed in each
/// stay resident. Under the live load generator a cap of 4 cut the aggregator's peak RSS on two
/// cores from 1,680 to 1,109 MiB (BENCHMARKS.md, "Peak RSS under the live load"). On 16 cores a
/// fixed 4 made tokio's 16 workers queue on the arenas' locks: 5.6 µs of their CPU a sample
/// instead of 1.4 ("Many cores: malloc arenas"). Fixing the mmap threshold at 128 KiB as well cut
/// the two-core peak to 878 MiB but cost the backfill path about 14 % of its throughput, so that
/// is not done.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let arenas = i32::try_from(malloc_arenas(cores)).unwrap_or(i32::MAX);
        // SAFETY: mallopt only changes the allocator's parameters.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
    }
}

/// Hands the pages glibc's allocator holds free back to the system (`malloc_trim`), after work
/// that allocated and freed far more than the process keeps: the hourly raw rewrite has DuckDB
/// sort and write hundreds of millions of rows, and what it freed stayed resident for the rest of
/// the hour (BENCHMARKS.md, "The rewrite through the binary, and after a restart"). Once per
/// hour, after the hour's checkpoint, not per slice: after each slice it cut a fleet's peak from
/// 2,355 to 1,632 MiB, but every thread of the aggregator used a quarter more CPU per sample and
/// the rewrite took over 240 s instead of 183 (one run each). A no-op elsewhere than glibc.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory; it takes the arenas' locks itself.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The malloc arenas [`tune_allocator`] allows on `cores` cores: two per core, and at least four
/// (the two-core figure the memory bound was measured with).
pub fn malloc_arenas(cores: usize) -> usize {
    cores.saturating_mul(2).max(4)
}

#[cfg(test)]
mod tests {
    #[test]
    fn malloc_arenas_are_two_per_core_and_at_least_four() {
        // Two cores keep the cap the memory bound was measured with; 16 cores get the 32 arenas
        // measured there (BENCHMARKS.md, "Many cores: malloc arenas").
        assert_eq!(super::malloc_arenas(1), 4);
        assert_eq!(super::malloc_arenas(2), 4);
        assert_eq!(super::malloc_arenas(16), 32);
        assert_eq!(super::malloc_arenas(usize::MAX), usize::MAX);
    }
}
