//! Names the build for `gpuledger --version`: the package version, the git commit it was built
//! from and the Cargo profile.

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
    // A new commit or a checkout moves HEAD or the branch it names.
    for path in [".git/HEAD", ".git/refs/heads"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
