//! Names the build for `gpuledger --version`: the package version, the git commit it was built
//! from and the Cargo profile; compresses a release binary's debug sections.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| format!("commit {}", String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| "commit unknown".into());
    // Cargo says "debug" for the dev profile (and the profiles that inherit from it).
    let profile = match std::env::var("PROFILE").as_deref() {
        Ok("release") => "release",
        _ => "dev",
    };
    println!(
        "cargo:rustc-env=GPULEDGER_BUILD={} ({commit}, {profile} profile)",
        env!("CARGO_PKG_VERSION")
    );
    // Release: the Rust line tables (the bundled C++ has none, Cargo.toml) are kept for
    // backtraces but compressed, so the binary stays small. Done here rather than in RUSTFLAGS,
    // which would change every unit of every profile, DuckDB's build script included.
    if profile == "release" {
        println!("cargo:rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
        println!("cargo:rustc-link-arg-bins=-Wl,--discard-all");
    }
    // A new commit or a checkout moves HEAD or the branch it names.
    for path in [".git/HEAD", ".git/refs/heads"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
