//! The README's two commands compile the bundled DuckDB once: `cargo run -- demo` (the binary
//! alone, dev profile) and `./test.sh` (`cargo test --workspace --all-targets`, dev profile) must
//! resolve the same `libduckdb-sys` units, down to every dependency of its build script.
//!
//! They did not: a crate that only the build scripts used (tempfile, under `tar` and `zip`) was a
//! host-only unit without debug info in the binary's build and a unit shared with the tests'
//! dev-dependencies, with debug info, in the tests' build; the build script's hash differed and
//! DuckDB's C++ compiled twice (about 30 minutes each on 2 cores). The binary now depends on
//! `tempfile` itself (the demo's spool directory).
//!
//! Cargo's `--unit-graph` says which units a command would build without building anything. It
//! is unstable; `__CARGO_TEST_CHANNEL_OVERRIDE_DO_NOT_USE_THIS=nightly` lets the stable cargo
//! that runs these tests print it.

use std::collections::HashMap;
use std::process::Command;

/// A unit's identity, including every unit it depends on (recursively): two commands share a
/// compiled unit only if all of this agrees.
fn signatures(args: &[&str]) -> HashMap<(String, String, String), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .args(["--locked", "--unit-graph", "-Z", "unstable-options"])
        .env("__CARGO_TEST_CHANNEL_OVERRIDE_DO_NOT_USE_THIS", "nightly")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?} --unit-graph failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let graph: serde_json::Value = serde_json::from_slice(&out.stdout).expect("unit graph JSON");
    let units = graph["units"].as_array().expect("units").clone();
    let mut memo: HashMap<usize, String> = HashMap::new();
    fn sig(i: usize, units: &[serde_json::Value], memo: &mut HashMap<usize, String>) -> String {
        if let Some(s) = memo.get(&i) {
            return s.clone();
        }
        let u = &units[i];
        let mut deps: Vec<String> = u["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .map(|d| sig(d["index"].as_u64().expect("index") as usize, units, memo))
            .collect();
        deps.sort();
        let s = format!(
            "{} {} {} {} {} {} {} [{}]",
            u["pkg_id"],
            u["target"]["name"],
            u["mode"],
            u["features"],
            u["profile"]["opt_level"],
            u["profile"]["debuginfo"],
            u["platform"],
            deps.join(",")
        );
        memo.insert(i, s.clone());
        s
    }
    let mut out = HashMap::new();
    for (i, u) in units.iter().enumerate() {
        let key = (
            u["pkg_id"].as_str().unwrap_or_default().to_owned(),
            u["target"]["name"].as_str().unwrap_or_default().to_owned(),
            u["mode"].as_str().unwrap_or_default().to_owned(),
        );
        out.insert(key, sig(i, &units, &mut memo));
    }
    out
}

#[test]
fn the_demo_and_the_tests_share_one_duckdb_build() {
    let demo = signatures(&["build"]);
    let tests = signatures(&["test", "--workspace", "--all-targets", "--no-run"]);
    let duckdb: Vec<_> = demo
        .keys()
        .filter(|k| k.0.contains("libduckdb-sys"))
        .cloned()
        .collect();
    assert_eq!(
        duckdb.len(),
        3,
        "libduckdb-sys: its library, build script and the script's run: {duckdb:?}"
    );
    for k in duckdb {
        assert_eq!(
            demo.get(&k),
            tests.get(&k),
            "`cargo run -- demo` and `./test.sh` would build {k:?} differently, so DuckDB's C++ \
             would compile twice; compare the two unit graphs for the unit that differs"
        );
    }
}
