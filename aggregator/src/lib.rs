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
/// ledger (`gpuledger aggregator` and `demo`; a batch tool such as `import` keeps glibc's
/// defaults, which were 10–15 % faster for it).
/// By default glibc gives threads their own arenas, up to 8 per core, and raises its mmap
/// threshold each time a large block is freed, after which large blocks (DuckDB's are 256 KiB)
/// come from the arenas and freed pages stay resident. Here: four arenas, and blocks of 128 KiB
/// or more always mapped on their own, so that freeing one returns it. Under the live load
/// generator this cut the aggregator's peak RSS from 1,680 to 878 MiB, at some latency (paced
/// p99 480 → 770 ms; BENCHMARKS.md, "Peak RSS under the live load"). Either is left alone when the environment sets
/// it (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, which glibc reads itself).
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            // SAFETY: mallopt only changes the allocator's parameters.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, 4) };
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: as above; setting the threshold also stops glibc from raising it.
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
        }
    }
}
