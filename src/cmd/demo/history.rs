//! The demo's history: the month before "now" laid into the ledger before it says it is ready.
//!
//! A month of the built-in fleet at 1 s is about 230 million instance-seconds: too many to load
//! in the minute a newcomer waits. So the history is written at minute resolution straight into
//! the rollups through the one writer ([`MinuteBatch`]: exact holders and minute masks,
//! each counter its expected value over the minute; see the simulator's `minutes` module), and
//! only its last `--history-seconds` second by second, as the exporters would have sent it. Both
//! paths deduplicate by the minute masks, so the history is exact where it meets what the ledger
//! already holds: a second run starts from the newest minute stored, and a minute that is partly
//! there (where the last run stopped, or where the live exporters began) is sent as seconds,
//! which are deduplicated one by one.

use std::collections::{BTreeSet, HashMap};
use std::io::{IsTerminal, Write};

use gpuledger_aggregator::Startup;
use gpuledger_exporter::source::sim::{MinuteReading, Simulator};
use gpuledger_ledger::store::writer::{MinuteBatch, MinuteRow};
use gpuledger_schema::wire::{Batch, Series};
use gpuledger_schema::{Attribution, Instance};

/// What to lay down.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The first second of the history (unless the ledger already reaches further).
    pub from: i64,
    /// Seconds from here on are sent as 1 s samples.
    pub seconds_from: i64,
    /// The history ends here (exclusive): the live exporters take over.
    pub to: i64,
    /// Samples older than this go to the rollups only (the raw window).
    pub raw_cutoff: i64,
}

/// What was laid down.
#[derive(Debug, Default, Clone, Copy)]
pub struct Report {
    /// Where the history started (after what the ledger already held).
    pub from: i64,
    /// Minute rows stored.
    pub minute_rows: usize,
    /// Instance-seconds they cover.
    pub minute_seconds: u64,
    /// 1 s samples stored.
    pub samples: u64,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Lays the history down through `startup`'s writer, a day of minute rows per transaction.
pub async fn prepare(startup: Startup, sim: Simulator, plan: Plan) -> Result<Report, Error> {
    // Live exporters may already have written the minutes around `to`: not counted here.
    let newest = newest_minute(&startup, (plan.to - 120).div_euclid(60) * 60)?;
    // A ledger from an earlier run: start at its newest minute (partly held, so sent as seconds).
    let from = newest
        .map_or(plan.from, |n| n.max(plan.from))
        .div_euclid(60)
        * 60;
    let seconds_from = (plan.seconds_from.max(from)).div_euclid(60) * 60;
    let mut report = Report {
        from,
        ..Report::default()
    };
    let progress = Progress::new(from, seconds_from, plan.to);
    // Days of minute rows are made on a blocking thread while the writer stores the previous one.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(i64, MinuteBatch, Vec<Instance>)>(1);
    let maker = tokio::task::spawn_blocking(move || {
        let mut day = from;
        while day < seconds_from {
            let end = (day + 86_400).min(seconds_from);
            let made = minute_batch(&sim, day, end);
            if tx.blocking_send((end, made.0, made.1)).is_err() {
                break;
            }
            day = end;
        }
        sim
    });
    // The minutes the ledger already partly held, per node: sent as seconds afterwards.
    let mut partly: BTreeSet<(String, i64)> = BTreeSet::new();
    while let Some((end, batch, nodes_of_rows)) = rx.recv().await {
        let keys: Vec<(usize, i64)> = batch.rows.iter().map(|r| (r.entry, r.bucket)).collect();
        let outcome = startup.writer.ingest_minutes(batch).await?;
        report.minute_rows += outcome.stored_rows;
        report.minute_seconds += outcome.stored_seconds;
        for i in outcome.overlapping {
            let (entry, bucket) = keys[i];
            partly.insert((nodes_of_rows[entry].node.clone(), bucket));
        }
        startup.progress(progress.line(end));
        progress.draw(end);
    }
    let sim = maker.await?;
    for (node, bucket) in partly {
        report.samples += send_seconds(
            &startup,
            &sim,
            Some(&node),
            bucket,
            bucket + 60,
            plan.raw_cutoff,
        )
        .await?;
    }
    // The last stretch second by second, a minute of the fleet per batch.
    let mut t = seconds_from;
    while t < plan.to {
        let end = (t + 60).min(plan.to);
        report.samples += send_seconds(&startup, &sim, None, t, end, plan.raw_cutoff).await?;
        t = end;
        startup.progress(progress.line(t));
        progress.draw(t);
    }
    progress.finish();
    Ok(report)
}

/// The newest minute before `before` that the ledger holds, if any.
fn newest_minute(startup: &Startup, before: i64) -> Result<Option<i64>, Error> {
    let conn = startup.readers.connect()?;
    Ok(conn.query_row(
        "SELECT max(bucket) FROM rollup_1m WHERE bucket < ?",
        [before],
        |r| r.get(0),
    )?)
}

/// The minute rows of `from..to`, and each entry's instance.
fn minute_batch(sim: &Simulator, from: i64, to: i64) -> (MinuteBatch, Vec<Instance>) {
    let mut batch = MinuteBatch::default();
    let mut instances = Vec::new();
    let mut index: HashMap<(Instance, Attribution), usize> = HashMap::new();
    sim.minutes(None, from, to, |m: MinuteReading| {
        let key = (m.instance, m.attribution);
        let entry = match index.get(&key) {
            Some(&e) => e,
            None => {
                batch.entries.push(Series::describing(&key.0, &key.1));
                instances.push(key.0.clone());
                index.insert(key, batch.entries.len() - 1);
                batch.entries.len() - 1
            }
        };
        batch.rows.push(MinuteRow {
            entry,
            bucket: m.bucket,
            mask: m.mask,
            counters: m.counters,
        });
    });
    (batch, instances)
}

/// Sends the seconds `from..to` of `node` (every node when `None`) as 1 s samples, one batch per
/// node; returns the samples stored.
async fn send_seconds(
    startup: &Startup,
    sim: &Simulator,
    node: Option<&str>,
    from: i64,
    to: i64,
    raw_cutoff: i64,
) -> Result<u64, Error> {
    let mut by_node: HashMap<String, Vec<gpuledger_schema::Sample>> = HashMap::new();
    for t in from..to {
        for s in sim.second(node, t).into_samples() {
            by_node.entry(s.instance.node.clone()).or_default().push(s);
        }
    }
    let mut stored = 0;
    for (node, samples) in by_node {
        let batch = Batch::from_samples(&node, &samples);
        let reservation = startup.writer.reserve(samples.len()).await?;
        stored += startup
            .writer
            .ingest(batch, raw_cutoff, reservation)
            .await?
            .stored;
    }
    Ok(stored)
}

/// The progress line: in `/readyz`, and redrawn on stderr when it is a terminal.
struct Progress {
    from: i64,
    seconds_from: i64,
    to: i64,
    terminal: bool,
}

impl Progress {
    fn new(from: i64, seconds_from: i64, to: i64) -> Progress {
        Progress {
            from,
            seconds_from,
            to,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn line(&self, at: i64) -> String {
        let done = (at - self.from) as f64 / (self.to - self.from).max(1) as f64;
        let stage = if at > self.seconds_from {
            format!(
                ", then second by second: minute {} of {}",
                (at - self.seconds_from + 59) / 60,
                (self.to - self.seconds_from + 59) / 60
            )
        } else {
            String::new()
        };
        format!(
            "laying down the history: {:.1} of {:.1} days ({:.0} %){stage}",
            (at - self.from) as f64 / 86_400.0,
            (self.to - self.from) as f64 / 86_400.0,
            100.0 * done
        )
    }

    fn draw(&self, at: i64) {
        if self.terminal {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r{}   ", self.line(at));
            let _ = e.flush();
        }
    }

    fn finish(&self) {
        if self.terminal {
            eprintln!();
        }
    }
}
