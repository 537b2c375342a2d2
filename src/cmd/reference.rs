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
         only a file holds (prices, reclaim, webhooks, billing, rightsizing, energy) are described in\n\
         [aggregator.md](aggregator.md), [showback.md](showback.md) and [reclaim.md](reclaim.md);\n\
         the example files are in [deploy/config/](../deploy/config/).\n",
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

    /// A value as the manual writes it, in one form: a duration as seconds, a size with its
    /// binary unit as bytes, a number without its thousands commas; anything else as written,
    /// without spaces.
    fn canonical(text: &str) -> String {
        let t = text.trim().trim_start_matches("default ").replace('`', "");
        let compact: String = t.chars().filter(|c| !c.is_whitespace()).collect();
        if let Ok(d) = humantime::parse_duration(&compact) {
            return format!("{}s", d.as_secs_f64());
        }
        for (unit, bytes) in [("KiB", 1u64 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)] {
            if let Some(n) = compact
                .strip_suffix(unit)
                .and_then(|n| n.parse::<u64>().ok())
            {
                return (n * bytes).to_string();
            }
        }
        let digits = compact.replace(',', "");
        if digits.parse::<f64>().is_ok() {
            return digits;
        }
        compact
    }

    /// Defaults the manual states beside a flag (`--ship-interval` (default 5 s)) are the ones
    /// the role declares: a default changed in code fails here until the manual follows.
    #[test]
    fn defaults_in_the_manual_are_the_options_defaults() {
        let command = super::super::Cli::command_with_env();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut checked = 0;
        for (doc, role) in [
            ("docs/aggregator.md", "aggregator"),
            ("docs/operations.md", "aggregator"),
            ("docs/exporter.md", "exporter"),
            ("docs/demo.md", "demo"),
        ] {
            let text = std::fs::read_to_string(root.join(doc)).unwrap();
            let sub = command.find_subcommand(role).unwrap();
            for (at, _) in text.match_indices("`--") {
                let rest = &text[at + 3..];
                let Some(end) = rest.find('`') else { continue };
                let long = &rest[..end];
                let after = rest[end + 1..].trim_start_matches('*');
                let Some(inside) = after.strip_prefix(" (") else {
                    continue;
                };
                let stated = inside
                    .split(')')
                    .next()
                    .unwrap()
                    .split(';')
                    .next()
                    .unwrap()
                    .split(", ")
                    .next()
                    .unwrap();
                let Some(arg) = sub.get_arguments().find(|a| a.get_long() == Some(long)) else {
                    continue;
                };
                let declared = arg
                    .get_default_values()
                    .first()
                    .map(|v| v.to_string_lossy().into_owned())
                    .or_else(|| {
                        let help = arg.get_help()?.to_string();
                        let (_, d) = help.rsplit_once("[default: ")?;
                        Some(d.trim_end_matches(']').to_owned())
                    });
                let Some(declared) = declared else { continue };
                if stated.starts_with('[') || stated.starts_with("usually") {
                    continue;
                }
                assert_eq!(
                    canonical(stated),
                    canonical(&declared),
                    "{doc}: --{long} ({stated}), but its default is {declared}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 20, "{checked} defaults checked");
    }
}
