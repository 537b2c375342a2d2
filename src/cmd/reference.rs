//! `docs/config.md`, the configuration reference, generated from the command line's own
//! declarations: every option of every service, with its flag, its `--config` file key and its
//! environment variable, and its help text (which states its default). A test fails when the file
//! differs from what the declarations give; `GPULEDGER_BLESS=1 cargo test --workspace
//! --all-targets -- config_reference` writes it anew.

use std::fmt::Write as _;

/// The subcommands the reference covers, in its order, with what runs them.
const ROLES: [(&str, &str); 5] = [
    (
        "exporter",
        "`gpuledger-exporter` or `gpuledger exporter`, on every GPU node",
    ),
    ("aggregator", "`gpuledger aggregator`, one per cluster"),
    (
        "reclaimer",
        "`gpuledger-reclaimer` or `gpuledger reclaimer`, beside a scheduler",
    ),
    (
        "demo",
        "`gpuledger demo`, the simulated fleet on one machine",
    ),
    (
        "import",
        "`gpuledger import`, trace files into a ledger or a running aggregator",
    ),
];

/// The option groups a role flattens into its command line, by the struct that declares them,
/// and the table of the config file each one's keys live in.
const TABLES: [(&str, &str); 3] = [
    ("OtlpOptions", "otlp"),
    ("HttpOptions", "http"),
    ("LimitOptions", "limits"),
];

/// The file key of `arg`: the field's name, in its group's table when it has one.
fn file_key(sub: &clap::Command, arg: &clap::Arg) -> String {
    let id = arg.get_id();
    let table = sub
        .get_groups()
        .filter(|g| g.get_args().any(|a| a == id))
        .find_map(|g| {
            TABLES
                .iter()
                .find(|(group, _)| g.get_id() == *group)
                .map(|(_, table)| table)
        });
    match table {
        Some(t) => format!("`[{t}] {id}`"),
        None => format!("`{id}`"),
    }
}

/// The reference's Markdown.
pub fn config_reference() -> String {
    let command = super::Cli::command_with_env();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the options' declarations (`src/cmd/reference.rs`); do not edit by hand.\n\
         A flag on the command line wins over its environment variable, which wins over the\n\
         `--config` TOML file, whose key is the flag's long name with `_` for `-` (in the table\n\
         named, for grouped options: `[limits] max_batch_samples = 50000`). Tables that\n\
         only a file holds (prices, reclaim, webhooks, billing) are described in\n\
         [aggregator.md](aggregator.md) and [reclaim.md](reclaim.md); the example files are in\n\
         [deploy/config/](../deploy/config/).\n",
    );
    for (name, what) in ROLES {
        let Some(sub) = command.find_subcommand(name) else {
            continue;
        };
        let _ = write!(out, "\n## {name}\n\n{what}.\n\n");
        out.push_str("| flag | file key | environment variable | what it does |\n");
        out.push_str("| --- | --- | --- | --- |\n");
        for arg in sub.get_arguments() {
            let Some(long) = arg.get_long() else {
                continue;
            };
            if long == "help" || long == "version" {
                continue;
            }
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_else(|| "–".into());
            let key = if long == "config" {
                "–".to_owned()
            } else {
                file_key(sub, arg)
            };
            let help = arg
                .get_long_help()
                .or_else(|| arg.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default()
                .replace('\n', " ")
                .replace('|', "\\|");
            let _ = writeln!(out, "| `--{long}` | {key} | {env} | {help} |");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    /// docs/config.md is what the declarations give (module doc).
    #[test]
    fn config_reference_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.md");
        let want = super::config_reference();
        if std::env::var_os("GPULEDGER_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/config.md is stale: run `GPULEDGER_BLESS=1 cargo test --workspace --all-targets -- config_reference`"
        );
    }
}
