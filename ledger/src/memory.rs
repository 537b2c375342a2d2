//! glibc's allocator, tuned for the long-lived processes that hold a ledger (`gpuledger
//! aggregator` and `demo`). No-ops elsewhere than glibc.
//!
//! Key decision: fewer malloc arenas and an hourly trim, rather than a fixed mmap threshold,
//! which bounded memory further but slowed backfill (the measurements: docs/perf/memory.md).

/// Caps glibc's malloc arenas at [`malloc_arenas`] (two per core, at least four) unless the
/// environment sets `MALLOC_ARENA_MAX` (glibc reads it itself). Call before any thread starts.
/// By default glibc gives threads their own arenas, up to 8 per core, and the pages freed in each
/// stay resident.
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
/// sort and write hundreds of millions of rows. Once per hour, after the hour's checkpoint, not
/// per slice: trimming after each slice cost every thread of the aggregator CPU per sample.
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
        assert_eq!(super::malloc_arenas(1), 4);
        assert_eq!(super::malloc_arenas(2), 4);
        assert_eq!(super::malloc_arenas(16), 32);
        assert_eq!(super::malloc_arenas(usize::MAX), usize::MAX);
    }
}
