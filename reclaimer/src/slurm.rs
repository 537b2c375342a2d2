//! Reclaiming a Slurm job: a configured command, `scontrol requeue {job}` by default (or
//! `scancel {job}`). The command is run directly, never through a shell, with `{job}` replaced by
//! the job id — which [`super::Target::parse`] has already limited to digits and `_`.

use std::time::Duration;

use serde::Deserialize;

use super::ActError;

/// `[slurm]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmFile {
    /// The command and its arguments; `{job}` is the job id (default
    /// `["scontrol", "requeue", "{job}"]`).
    pub command: Option<Vec<String>>,
    /// How long it may run (default 30s).
    pub timeout: Option<gpuledger_schema::options::Span>,
}

/// A resolved Slurm action.
pub struct Slurm {
    command: Vec<String>,
    timeout: Duration,
}

impl SlurmFile {
    /// Checks the command.
    pub fn resolve(self) -> anyhow::Result<Slurm> {
        let command = self
            .command
            .unwrap_or_else(|| vec!["scontrol".into(), "requeue".into(), "{job}".into()]);
        anyhow::ensure!(!command.is_empty(), "slurm.command: must name a program");
        anyhow::ensure!(
            command.iter().any(|a| a.contains("{job}")),
            "slurm.command: no argument holds {{job}}"
        );
        Ok(Slurm {
            command,
            timeout: self.timeout.map_or(Duration::from_secs(30), |d| d.0),
        })
    }
}

impl Slurm {
    fn argv(&self, job: &str) -> Vec<String> {
        self.command
            .iter()
            .map(|a| a.replace("{job}", job))
            .collect()
    }

    /// What `reclaim` would run.
    pub fn describe(&self, job: &str) -> String {
        format!("run {}", self.argv(job).join(" "))
    }

    /// Runs the command for `job`.
    pub async fn reclaim(&self, job: &str) -> Result<String, ActError> {
        let argv = self.argv(job);
        let run = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| ActError::Later {
                retry_after: 60,
                message: format!("{} took longer than {:?}", argv[0], self.timeout),
            })?
            .map_err(|e| ActError::Later {
                retry_after: 60,
                message: format!("cannot run {}: {e}", argv[0]),
            })?;
        if out.status.success() {
            Ok(format!("ran {}", argv.join(" ")))
        } else {
            Err(ActError::Later {
                retry_after: 60,
                message: format!(
                    "{} exited with {}: {}",
                    argv.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            })
        }
    }
}
