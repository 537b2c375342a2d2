//! The `gpuledger-reclaimer` binary itself: its configuration check, the environment variable of
//! each flag, and a bad file named. (Acting on webhooks against a fake API server is in the
//! repository's `tests/e2e/reclaimer.rs`, which also runs this binary.)

use std::process::Command;

fn reclaimer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuledger-reclaimer"))
}

fn config(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("reclaimer.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const SLURM_ONLY: &str = r#"
listen = "127.0.0.1:0"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
[slurm]
command = ["true", "{job}"]
"#;

#[test]
fn check_config_accepts_a_good_file_and_names_a_bad_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = config(dir.path(), SLURM_ONLY);
    let out = reclaimer()
        .args(["--check-config", "--config", good.to_str().unwrap()])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("the configuration is valid"), "{stdout}");
    let bad = config(dir.path(), &format!("{SLURM_ONLY}\nbogus = 1\n"));
    let out = reclaimer()
        .args(["--check-config", "--config", bad.to_str().unwrap()])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("bogus"), "{stderr}");
}

#[test]
fn the_config_flag_comes_from_its_environment_variable() {
    let dir = tempfile::tempdir().unwrap();
    let good = config(dir.path(), SLURM_ONLY);
    let out = reclaimer()
        .arg("--check-config")
        .env("GPULEDGER_RECLAIMER_CONFIG", &good)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
