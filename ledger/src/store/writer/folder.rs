//! The held folds, run on a thread and a connection of their own.
//!
//! Under load the writer holds a group's minute and GPU deltas back ([`held`](super::held)) and
//! folds what it holds about once a second, or once every 30 s while it is far behind. On the
//! writer's own thread such a fold stopped the writer: at three fleets' pace it was the longest
//! stall (five `MERGE`s over every held row), and every batch that arrived meanwhile waited for it
//! (docs/perf/analytics.md, "What sets the three fleets' tail: the held fold"). So a fold that
//! falls due while batches wait is handed to this thread, which folds it in a transaction of its
//! own while the writer goes on committing raw rows.
//!
//! DuckDB lets the two transactions run side by side as long as they do not change the same
//! rows: the fold changes only the rollups (and appends to `gpu_hours_changed`), the writer's
//! groups only raw rows, batch ids, dimensions, shares and `fold_pending`. The writer keeps to
//! that: while a fold is in flight it holds every group's deltas, and a transaction it begins
//! with a fold in flight never touches the rollups (DuckDB would refuse its update of a row the
//! fold changed after it began: "Conflict on update"). Everything else that writes the rollups
//! (minute rows, retention, a recovery, the idle fold) waits for the fold in flight first.
//!
//! One fold at a time. Its result comes back on a channel; the writer is also woken (`wake`),
//! so that an idle writer learns of it without waiting for the next batch.

use std::sync::mpsc;
use std::thread::JoinHandle;

use duckdb::Connection;

use super::rollups::{Map, MinuteDelta, fold_delta_rows, fold_gpu_deltas};

/// What a fold takes: the held minute deltas and GPU deltas.
pub(super) struct FoldJob {
    pub(super) deltas: Map<(i32, i32, i64), MinuteDelta>,
    pub(super) gpu: Map<(i32, i64), (i64, i64)>,
}

/// What became of a fold.
#[derive(Debug)]
pub(super) struct Folded {
    pub(super) result: Result<(), FoldError>,
    /// The held rows it took.
    pub(super) rows: usize,
    /// How long it took on the fold thread.
    pub(super) seconds: f64,
}

/// Why a fold did not land.
#[derive(Debug, thiserror::Error)]
pub(super) enum FoldError {
    #[error(transparent)]
    Db(#[from] duckdb::Error),
    #[error("the fold thread has stopped")]
    Stopped,
}

impl Folded {
    fn stopped() -> Folded {
        Folded {
            result: Err(FoldError::Stopped),
            rows: 0,
            seconds: 0.0,
        }
    }
}

/// The handle the writer holds: at most one fold in flight.
pub(super) struct Folder {
    jobs: Option<mpsc::Sender<FoldJob>>,
    done: mpsc::Receiver<Folded>,
    busy: bool,
    thread: Option<JoinHandle<()>>,
    /// Whether the writer has been told the thread is gone ([`Folder::stopped`]).
    stop_reported: bool,
}

impl Folder {
    /// Starts the fold thread on `conn` (a connection to the writer's database). `wake` is
    /// called after each fold's result is sent.
    pub(super) fn spawn(conn: Connection, wake: Box<dyn Fn() + Send>) -> std::io::Result<Folder> {
        Self::spawn_with(conn, wake, Box::new(|| {}))
    }

    /// [`Folder::spawn`], whose thread commits each fold only once `gate` has a message: a test
    /// keeps a fold in flight, its rollup updates made and uncommitted, for as long as it needs.
    #[cfg(test)]
    pub(super) fn spawn_gated(
        conn: Connection,
        gate: mpsc::Receiver<()>,
    ) -> std::io::Result<Folder> {
        Self::spawn_with(
            conn,
            Box::new(|| {}),
            Box::new(move || {
                let _ = gate.recv();
            }),
        )
    }

    fn spawn_with(
        conn: Connection,
        wake: Box<dyn Fn() + Send>,
        mut before_commit: Box<dyn FnMut() + Send>,
    ) -> std::io::Result<Folder> {
        let (jobs, rx) = mpsc::channel::<FoldJob>();
        let (tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("gpuledger-fold".into())
            .spawn(move || {
                let mut conn = conn;
                for job in rx {
                    let (rows, started) = (job.deltas.len(), std::time::Instant::now());
                    let result = fold(&mut conn, job, &mut before_commit).map_err(FoldError::from);
                    let seconds = started.elapsed().as_secs_f64();
                    if tx
                        .send(Folded {
                            result,
                            rows,
                            seconds,
                        })
                        .is_err()
                    {
                        break;
                    }
                    wake();
                }
            })?;
        Ok(Folder {
            jobs: Some(jobs),
            done,
            busy: false,
            thread: Some(thread),
            stop_reported: false,
        })
    }

    /// Whether the fold thread is gone (a panic ended it): the writer then folds on its own
    /// thread, as it did before there was one. Logged the first time it is seen.
    pub(super) fn stopped(&mut self) -> bool {
        let gone = self.jobs.is_none() || self.thread.as_ref().is_none_or(JoinHandle::is_finished);
        if gone && !self.stop_reported {
            tracing::error!("The fold thread has stopped; the writer folds on its own thread.");
            self.stop_reported = true;
        }
        gone
    }

    /// Ends the fold thread, as a panic would.
    #[cfg(test)]
    pub(super) fn stop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Whether a fold is in flight (its result not yet taken).
    pub(super) fn busy(&self) -> bool {
        self.busy
    }

    /// Hands `job` to the fold thread. Fails only when the thread is gone (it ended after
    /// [`Folder::stopped`] was asked); then the job is lost and the caller must re-derive what it
    /// held ([`held::recover`](super::held::recover)).
    pub(super) fn start(&mut self, job: FoldJob) -> Result<(), ()> {
        debug_assert!(!self.busy, "one fold at a time");
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
        self.busy = sent;
        if sent { Ok(()) } else { Err(()) }
    }

    /// The result of the fold in flight, if it has ended.
    pub(super) fn poll(&mut self) -> Option<Folded> {
        if !self.busy {
            return None;
        }
        let result = match self.done.try_recv() {
            Ok(r) => r,
            Err(mpsc::TryRecvError::Empty) => return None,
            Err(mpsc::TryRecvError::Disconnected) => Folded::stopped(),
        };
        self.busy = false;
        Some(result)
    }

    /// The result of the fold in flight, waiting for it to end; `None` if none is in flight.
    pub(super) fn wait(&mut self) -> Option<Folded> {
        if !self.busy {
            return None;
        }
        self.busy = false;
        Some(self.done.recv().unwrap_or_else(|_| Folded::stopped()))
    }
}

impl Drop for Folder {
    /// Lets the fold in flight end and closes the thread's connection before the writer's own
    /// is closed.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Folds `job` into the rollups in one transaction; `before_commit` runs just before it commits
/// (a test's gate, [`Folder::spawn_gated`]).
fn fold(
    conn: &mut Connection,
    job: FoldJob,
    before_commit: &mut dyn FnMut(),
) -> duckdb::Result<()> {
    let _span = tracing::info_span!("writer.fold", rows = job.deltas.len()).entered();
    let tx = conn.transaction()?;
    fold_delta_rows(&tx, job.deltas.len(), job.deltas.into_iter())?;
    fold_gpu_deltas(&tx, &job.gpu)?;
    before_commit();
    tx.commit()
}
