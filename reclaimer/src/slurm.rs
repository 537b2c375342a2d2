//! Reclaiming a Slurm job: a configured command, `scontrol requeue {job}` by default (or
//! `scancel {job}`). The command is run directly, never through a shell, with `{job}` replaced by
//! the job id — which [`super::Target::parse`] has already limited to digits and `_`.
//!
//! Key decision: the job's state is read first (`squeue -h -j {job} --states=all -o %T`: the state
//! field alone, since a job's name is free text that could spell `JobState=…`), and only a job that
//! is running (or suspended, or starting) is acted on. Slurm's own `scontrol requeue` puts a job
//! that has *finished* back in the queue while slurmctld still remembers it, so the job would run
//! again (seen against a real slurmctld, tests/slurm/NOTES.md); a job that is pending, has ended
//! or is unknown to Slurm is answered as done, with nothing run. A job Slurm refuses to requeue
//! (`--no-requeue`) cannot be acted on here (422), instead of being retried for ever.

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
    /// The command that prints the job's state first: the state alone, or a `JobState=` field
    /// (default `["squeue", "-h", "-j", "{job}", "--states=all", "-o", "%T"]`; `[]`: act without
    /// looking).
    pub state_command: Option<Vec<String>>,
}

/// A resolved Slurm action.
pub struct Slurm {
    command: Vec<String>,
    state_command: Vec<String>,
    timeout: Duration,
}

/// What the job's state says to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// It holds its allocation: act.
    Holding(String),
    /// Pending, ended or unknown: nothing to reclaim (why).
    Done(String),
}

/// Reads the state command's answer: a state alone (`squeue -o %T`), or the line of a command that
/// prints `JobState=` (the first such field).
pub fn job_state(job: &str, stdout: &str) -> Option<JobState> {
    let first = stdout.split_whitespace().next()?;
    let state = if first.contains('=') {
        stdout
            .split_whitespace()
            .find_map(|f| f.strip_prefix("JobState="))?
    } else {
        first
    };
    if state.is_empty() || !state.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
        return None;
    }
    Some(match state {
        "RUNNING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "CONFIGURING" | "RESIZING"
        | "STAGE_OUT" => JobState::Holding(state.to_owned()),
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" => JobState::Done(format!(
            "job {job} is {state}: it holds no GPU, nothing to reclaim"
        )),
        other => JobState::Done(format!("job {job} has ended ({other}): nothing to reclaim")),
    })
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
        let state_command = self.state_command.unwrap_or_else(|| {
            ["squeue", "-h", "-j", "{job}", "--states=all", "-o", "%T"]
                .map(String::from)
                .to_vec()
        });
        anyhow::ensure!(
            state_command.is_empty() || state_command.iter().any(|a| a.contains("{job}")),
            "slurm.state_command: no argument holds {{job}}"
        );
        Ok(Slurm {
            command,
            state_command,
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

    /// Runs `argv` with the timeout: (success, stdout, stderr).
    async fn run(&self, argv: &[String]) -> Result<(bool, String, String), ActError> {
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
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            format!(
                "{} exited with {}: {}",
                argv.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ))
    }

    /// Runs the command for `job`, when its state says it holds its allocation.
    pub async fn reclaim(&self, job: &str) -> Result<String, ActError> {
        if !self.state_command.is_empty() {
            let look: Vec<String> = self
                .state_command
                .iter()
                .map(|a| a.replace("{job}", job))
                .collect();
            let (ok, stdout, failed) = self.run(&look).await?;
            // Unknown to Slurm: squeue says "Invalid job id", or (some versions) prints nothing.
            if (!ok && failed.contains("Invalid job id")) || (ok && stdout.trim().is_empty()) {
                return Ok(format!(
                    "job {job} is unknown to Slurm (ended and purged): nothing to reclaim"
                ));
            }
            if !ok {
                return Err(ActError::Later {
                    retry_after: 60,
                    message: failed,
                });
            }
            match job_state(job, &stdout) {
                Some(JobState::Done(why)) => return Ok(why),
                Some(JobState::Holding(_)) => {}
                None => {
                    return Err(ActError::Later {
                        retry_after: 60,
                        message: format!("{} printed no job state", look.join(" ")),
                    });
                }
            }
        }
        let argv = self.argv(job);
        let (ok, _, failed) = self.run(&argv).await?;
        if ok {
            Ok(format!("ran {}", argv.join(" ")))
        } else if failed.contains("presently disabled") || failed.contains("Only batch jobs") {
            // Submitted with --no-requeue, or an interactive allocation (salloc, srun): Slurm
            // will not requeue it; a `[slurm] command` of `scancel {job}` can end it instead.
            Err(ActError::Cannot(failed))
        } else {
            Err(ActError::Later {
                retry_after: 60,
                message: failed,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_job_that_holds_its_allocation_is_reclaimed() {
        let line = |state: &str| {
            format!("JobId=7 JobName=wrap UserId=root(0) JobState={state} Reason=None Restarts=0")
        };
        assert_eq!(
            job_state("7", &line("RUNNING")),
            Some(JobState::Holding("RUNNING".into()))
        );
        for ended in ["COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED"] {
            assert!(
                matches!(job_state("7", &line(ended)), Some(JobState::Done(w)) if w.contains("ended")),
                "{ended}"
            );
        }
        assert!(matches!(
            job_state("7", &line("PENDING")),
            Some(JobState::Done(_))
        ));
        assert_eq!(job_state("7", "no state here"), None);
    }
}
