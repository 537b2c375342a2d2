//! The Prometheus rules in alerts/ are valid and do what their unit tests say (promtool), and the
//! example Alertmanager configuration is valid (amtool).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::require_tool;

fn alerts_dir() -> PathBuf {
    common::root().join("alerts")
}

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no {suffix} files in {}", dir.display());
    found
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_rule_file_is_valid() {
    require_tool("promtool");
    for rules in files(&alerts_dir(), ".rules.yml") {
        run(Command::new("promtool").args(["check", "rules"]).arg(rules));
    }
}

#[test]
fn every_rule_unit_test_passes() {
    require_tool("promtool");
    let tests = alerts_dir().join("tests");
    for test in files(&tests, ".yml") {
        run(Command::new("promtool")
            .args(["test", "rules"])
            .arg(test)
            .current_dir(&tests));
    }
}

#[test]
fn every_rule_has_a_runbook_section() {
    let runbook = std::fs::read_to_string(alerts_dir().join("RUNBOOK.md")).unwrap();
    for rules in files(&alerts_dir(), ".rules.yml") {
        let text = std::fs::read_to_string(&rules).unwrap();
        for name in text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- alert: "))
        {
            assert!(
                runbook.contains(&format!("\n## {name}\n")),
                "RUNBOOK.md has no section for {name}"
            );
            assert!(
                text.contains(&format!("alerts/RUNBOOK.md#{}", name.to_lowercase())),
                "{name} has no runbook_url"
            );
        }
    }
}

#[test]
fn the_example_alertmanager_config_is_valid() {
    require_tool("amtool");
    run(Command::new("amtool")
        .args(["check-config"])
        .arg(alerts_dir().join("alertmanager.example.yml")));
}
