//! The DuckDB schema as numbered migrations (`schema/migrations/NNNN_name.sql`). The aggregator
//! applies the ones a database lacks, in order, and records each in `schema_version`; a database
//! at a higher version than [`LATEST`] belongs to a newer gpuledger and is refused.

/// One migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Its number; migrations apply in increasing order, without gaps.
    pub version: u32,
    /// Its name (the file name without number and extension).
    pub name: &'static str,
    /// The SQL, one or more statements.
    pub sql: &'static str,
}

/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "ledger",
        sql: include_str!("../migrations/0001_ledger.sql"),
    },
    Migration {
        version: 2,
        name: "analytics",
        sql: include_str!("../migrations/0002_analytics.sql"),
    },
    Migration {
        version: 3,
        name: "shares",
        sql: include_str!("../migrations/0003_shares.sql"),
    },
    Migration {
        version: 4,
        name: "writer_probe",
        sql: include_str!("../migrations/0004_writer_probe.sql"),
    },
    Migration {
        version: 5,
        name: "reclaim",
        sql: include_str!("../migrations/0005_reclaim.sql"),
    },
    Migration {
        version: 6,
        name: "fold_pending",
        sql: include_str!("../migrations/0006_fold_pending.sql"),
    },
    Migration {
        version: 7,
        name: "batch_first_second",
        sql: include_str!("../migrations/0007_batch_first_second.sql"),
    },
    Migration {
        version: 8,
        name: "hoarding_base",
        sql: include_str!("../migrations/0008_hoarding_base.sql"),
    },
    Migration {
        version: 9,
        name: "gpu_hours_changed",
        sql: include_str!("../migrations/0009_gpu_hours_changed.sql"),
    },
    Migration {
        version: 10,
        name: "single_row_tables_without_keys",
        sql: include_str!("../migrations/0010_single_row_tables_without_keys.sql"),
    },
    Migration {
        version: 11,
        name: "raw_compacted",
        sql: include_str!("../migrations/0011_raw_compacted.sql"),
    },
    Migration {
        version: 12,
        name: "energy",
        sql: include_str!("../migrations/0012_energy.sql"),
    },
    Migration {
        version: 13,
        name: "keep_links",
        sql: include_str!("../migrations/0013_keep_links.sql"),
    },
    Migration {
        version: 14,
        name: "holder_owners",
        sql: include_str!("../migrations/0014_holder_owners.sql"),
    },
];

/// The schema version this build writes.
pub const LATEST: u32 = MIGRATIONS[MIGRATIONS.len() - 1].version;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_without_gaps_and_match_their_files() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1);
        }
        let dir = std::path::PathBuf::from(
            std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
        )
        .join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let expected: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.sql", m.version, m.name))
            .collect();
        assert_eq!(
            files, expected,
            "every file in schema/migrations is listed in MIGRATIONS"
        );
    }
}
