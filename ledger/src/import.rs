//! `gpuledger import`: backfill trace CSVs (`schema/TRACE.md`) into a ledger through the same
//! writer, deduplication and rollups as live ingest.
//!
//! All or nothing per run: every file is read and checked in full first (the sample rules, time
//! order is not required, and the same time window as ingest), and one bad row stops the run
//! before anything is written, naming `file:line:column`. Importing the same file twice stores
//! nothing the second time. The checking pass reads a large file in parts, one thread per core,
//! and keeps what it read, as batches, for imports of up to [`KEEP_SAMPLES`] samples, so that
//! those files are read once.
//!
//! Raw rows end in instance order, as the aggregator leaves a closed hour (`writer/compact.rs`):
//! a kept file is sent that way, and a larger one, read as it lies, has each hour rewritten as
//! soon as the file has moved past it and no later file reaches into it ([`Rewritten`]). The
//! rewrite frees the hour's rows in file order, and the next hour's rows reuse those blocks (and
//! those rows skip DuckDB's optimistic writes, so most reach the file only sorted); were every
//! hour to wait for the end, the file would grow by all of them and keep them free
//! (docs/perf/storage.md, "A streamed import rewrites each hour on the way").
//! An hour the file comes back to is rewritten again at the end.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpuledger_schema::trace::{EnergyCheck, Parts, TraceError, TraceReader};
use gpuledger_schema::wire::{self, Batch, BatchSink};
use gpuledger_schema::{GpuSample, Sample};

use crate::store::{self, Retention, StoreError, Writer};

/// Samples per batch handed to the writer.
const CHUNK: usize = 50_000;

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Files read.
    pub files: usize,
    /// Samples read.
    pub samples: u64,
    /// Samples stored.
    pub stored: u64,
    /// Samples the ledger held already.
    pub duplicates: u64,
}

impl ImportReport {
    /// Counts one batch's outcome, and advances the progress bar.
    fn add(&mut self, samples: u64, stored: u64, duplicates: u64, bar: &indicatif::ProgressBar) {
        self.samples += samples;
        self.stored += stored;
        self.duplicates += duplicates;
        bar.inc(samples);
    }
}

/// Why an import stopped.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A file is invalid; nothing was imported.
    #[error("{0} (nothing was imported)")]
    Trace(#[from] TraceError),
    /// The ledger failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where an import goes.
pub enum Target {
    /// A ledger file, written here through its own writer (no aggregator may have it open).
    Ledger(PathBuf),
    /// A running aggregator, through its ingest API (as exporters send; the ingest client of
    /// `gpuledger-client` is the sink): its writer deduplicates the samples like any batch, so
    /// the ledger need not stop. The files are all checked before the first batch is sent; a run
    /// cut short part-way is completed by running it again (what was stored is not stored twice).
    Aggregator(Box<dyn BatchSink>),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Ledger(p) => f.debug_tuple("Ledger").field(p).finish(),
            Target::Aggregator(_) => f.write_str("Aggregator"),
        }
    }
}

/// Options of an import.
#[derive(Debug)]
pub struct ImportOptions {
    /// Where the samples go.
    pub target: Target,
    /// The traces.
    pub files: Vec<PathBuf>,
    /// The ledger's retention (older samples are refused, as at ingest).
    pub retention: Retention,
    /// Allowed clock skew for samples in the future, seconds.
    pub max_future_skew_secs: i64,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
}

/// Samples the checking pass keeps, as batches, so that an import of up to this many reads its
/// files once (a kept sample costs about 150 bytes); a larger import reads its files a second
/// time to write them.
const KEEP_SAMPLES: u64 = 1_000_000;

/// Samples, each with its GPU's energy in that second, cut into the batches handed on, at most
/// [`CHUNK`] samples each. A full chunk leaves its last GPU-second (the rows of the last row's GPU
/// and second side by side at its end) to the next one: the ledger splits a GPU-second's energy
/// among the samples of its batch (`schema/WIRE.md`, "Request").
#[derive(Default)]
struct Chunker {
    samples: Vec<Sample>,
    energy: Vec<Option<f64>>,
}

impl Chunker {
    /// Adds a sample; a batch when it completes one.
    fn push(&mut self, s: Sample, energy: Option<f64>) -> Option<Batch> {
        self.samples.push(s);
        self.energy.push(energy);
        (self.samples.len() >= CHUNK).then(|| self.take(true))
    }

    /// The last, partial batch.
    fn finish(mut self) -> Option<Batch> {
        self.flush()
    }

    /// What is gathered so far, as a partial batch.
    fn flush(&mut self) -> Option<Batch> {
        (!self.samples.is_empty()).then(|| self.take(false))
    }

    fn take(&mut self, keep_last_gpu_second: bool) -> Batch {
        let n = self.samples.len();
        let mut cut = n;
        if keep_last_gpu_second {
            let last = &self.samples[n - 1];
            let same = |s: &Sample| {
                s.timestamp == last.timestamp && s.instance.gpu_uuid == last.instance.gpu_uuid
            };
            while cut > 0 && same(&self.samples[cut - 1]) {
                cut -= 1;
            }
            if cut == 0 {
                cut = n;
            }
        }
        let rest = (self.samples.split_off(cut), self.energy.split_off(cut));
        let mut seen = std::collections::HashSet::new();
        let gpus: Vec<GpuSample> = self
            .samples
            .iter()
            .zip(&self.energy)
            .filter(|(s, e)| e.is_some() && seen.insert((&s.instance.gpu_uuid, s.timestamp)))
            .map(|(s, &energy_joules)| GpuSample {
                timestamp: s.timestamp,
                node: s.instance.node.clone(),
                gpu_uuid: s.instance.gpu_uuid.clone(),
                gpu_model: s.instance.gpu_model.clone(),
                energy_joules,
            })
            .collect();
        let batch =
            Batch::from_samples(&self.samples[0].instance.node, &self.samples).with_gpus(&gpus);
        (self.samples, self.energy) = rest;
        batch
    }
}

/// A kept file's batches again, their series ordered by instance and then by first second, in
/// batches of at most [`CHUNK`] samples. The writer appends raw rows in the order it is given
/// them, and one instance's seconds side by side take far fewer bytes than rows that interleave
/// instances (docs/perf/storage.md, "Row order matters"); rows written in this order need no
/// rewrite afterwards, which would leave their old copies as free blocks in the file. Batches
/// with shares or energy are left as they are (a GPU-second's energy goes with its samples), and
/// say so: the second element is whether the batches are in instance order.
fn in_instance_order(batches: Vec<Batch>) -> (Vec<Batch>, bool) {
    if batches
        .iter()
        .any(|b| !b.shares.is_empty() || !b.gpus.is_empty())
    {
        return (batches, false);
    }
    let batches_series = batches.iter().map(|b| b.series.len()).max().unwrap_or(0);
    let mut series: Vec<_> = batches.into_iter().flat_map(|b| b.series).collect();
    series.sort_by(|a, b| instance_order(a).cmp(&instance_order(b)));
    // No batch holds more series than one of the file's own did: pieces of many short-lived
    // instances side by side must not pass the receiver's series limit.
    let most_series = batches_series.max(1);
    let mut out = Vec::new();
    let mut chunk: Vec<wire::Series> = Vec::new();
    let mut samples = 0;
    for s in series {
        if (samples + s.t.len() > CHUNK || chunk.len() == most_series) && !chunk.is_empty() {
            out.push(batch_of(std::mem::take(&mut chunk)));
            samples = 0;
        }
        samples += s.t.len();
        chunk.push(s);
    }
    if !chunk.is_empty() {
        out.push(batch_of(chunk));
    }
    (out, true)
}

/// The order of [`in_instance_order`]: the ledger's instance is the whole of this key (a MIG
/// reconfiguration makes a new one on the same GPU instance id), then the series' first second
/// (a holder change within an instance only starts a new series).
#[allow(clippy::type_complexity)]
fn instance_order(
    s: &wire::Series,
) -> (
    (&str, &str, &str),
    (Option<&str>, Option<u32>),
    (Option<u32>, Option<u32>, Option<i64>),
) {
    (
        (s.gpu_uuid.as_str(), s.node.as_str(), s.gpu_model.as_str()),
        (s.mig_profile.as_deref(), s.gpu_instance_id),
        (s.placement_start, s.placement_size, s.t.first().copied()),
    )
}

/// A new batch (fresh id) of `series`, named for the first one's node as [`Chunker`]'s are.
fn batch_of(series: Vec<wire::Series>) -> Batch {
    let mut batch = Batch::from_samples(&series[0].node, &[]);
    batch.series = series;
    batch
}

/// One file, checked.
struct Checked {
    samples: u64,
    /// The first and last second.
    span: Option<(i64, i64)>,
    /// Its samples as batches, unless there were more than the checking pass could keep.
    kept: Option<Vec<Batch>>,
}

/// Files at least this large are checked by several threads at once, one part each.
const PARALLEL_BYTES: u64 = 8 << 20;

/// Reads and checks one file, keeping its batches if it holds at most `keep` samples: in parts
/// on one thread per core when it can be cut ([`Parts`]), else whole. The first problem in the
/// file's order is the one reported, as reading it whole would.
fn check_file(path: &Path, oldest: i64, newest: i64, keep: u64) -> Result<Checked, TraceError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let Some(parts) = Parts::of(path, threads, PARALLEL_BYTES)? else {
        return check_part(TraceReader::open(path)?, oldest, newest, keep);
    };
    let n = parts.ranges.len();
    let checked: Vec<Result<Checked, TraceError>> = std::thread::scope(|s| {
        let parts = &parts;
        let handles: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || check_part(parts.reader(path, i)?, oldest, newest, keep / n as u64))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a checking thread does not panic"))
            .collect()
    });
    let mut whole = Checked {
        samples: 0,
        span: None,
        kept: Some(Vec::new()),
    };
    for part in checked {
        let part = part?;
        whole.samples += part.samples;
        whole.span = match (whole.span, part.span) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (a, b) => a.or(b),
        };
        whole.kept = whole.kept.zip(part.kept).map(|(mut a, b)| {
            a.extend(b);
            a
        });
    }
    Ok(whole)
}

/// Reads and checks what `reader` reads, keeping its batches if it holds at most `keep` samples.
fn check_part<R: std::io::Read>(
    mut reader: TraceReader<R>,
    oldest: i64,
    newest: i64,
    keep: u64,
) -> Result<Checked, TraceError> {
    let mut checked = Checked {
        samples: 0,
        span: None,
        kept: Some(Vec::new()),
    };
    let mut chunker = Chunker::default();
    let mut energy = EnergyCheck::default();
    while let Some(sample) = reader.next_sample() {
        let sample = sample?;
        energy.check(&reader, &sample)?;
        let t = sample.timestamp;
        if t < oldest {
            return Err(reader.error_at(
                "timestamp",
                format!(
                    "{t} is older than the ledger's rollup retention (oldest accepted: {oldest})"
                ),
            ));
        }
        if t > newest {
            return Err(reader.error_at(
                "timestamp",
                format!("{t} is in the future (newest accepted: {newest})"),
            ));
        }
        checked.samples += 1;
        checked.span = Some(checked.span.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        if checked.samples > keep {
            checked.kept = None;
        }
        if let Some(kept) = &mut checked.kept {
            kept.extend(chunker.push(sample, reader.gpu_energy_joules()));
        }
    }
    if let Some(kept) = &mut checked.kept {
        kept.extend(chunker.finish());
    }
    Ok(checked)
}

/// Where checked batches go: a writer of the ledger file, or a running aggregator's API.
enum Dest {
    Writer(Writer),
    Aggregator(Box<dyn BatchSink>),
}

/// Where checked batches go, and what became of them.
struct Sink {
    dest: Dest,
    raw_cutoff: i64,
    /// Batches handed to the writer, in order.
    pending: Vec<tokio::task::JoinHandle<Result<store::IngestOutcome, StoreError>>>,
    /// Hours' rewrites queued on the way, in order.
    rewrites: Vec<tokio::task::JoinHandle<Result<u64, StoreError>>>,
    report: ImportReport,
    bar: indicatif::ProgressBar,
}

impl Sink {
    async fn send(&mut self, batch: Batch) -> Result<(), ImportError> {
        match &mut self.dest {
            Dest::Aggregator(sink) => {
                let o = sink
                    .send_batch(&batch)
                    .await
                    .map_err(|e| ImportError::Store(StoreError::Io(e)))?;
                self.report
                    .add(o.samples, o.stored, o.duplicate_samples, &self.bar);
            }
            Dest::Writer(writer) => {
                let reservation = writer
                    .reserve(batch.sample_count())
                    .await
                    .map_err(|e| StoreError::Io(e.to_string()))?;
                // Queued here, in order: kept files are sent in instance order, and their raw
                // rows are written as they are queued.
                let outcome = writer.submit(batch, self.raw_cutoff, reservation)?;
                self.pending.push(tokio::spawn(outcome));
            }
        }
        // Results are collected in order as they complete; the queue bounds memory.
        while self.pending.first().is_some_and(|h| h.is_finished()) {
            let h = self.pending.remove(0);
            self.collect(h).await?;
        }
        Ok(())
    }

    async fn collect(
        &mut self,
        h: tokio::task::JoinHandle<Result<store::IngestOutcome, StoreError>>,
    ) -> Result<(), ImportError> {
        let o = h.await.map_err(|e| StoreError::Io(e.to_string()))??;
        self.report
            .add(o.samples, o.stored, o.duplicate_samples, &self.bar);
        Ok(())
    }

    /// Waits for every batch handed to the writer.
    async fn drain(&mut self) -> Result<(), ImportError> {
        for h in std::mem::take(&mut self.pending) {
            self.collect(h).await?;
        }
        Ok(())
    }

    /// Queues the rewrite of the hour starting at `hour` in instance order, if no `later` file
    /// reaches into it (into a ledger only; an aggregator rewrites its closed hours itself). The
    /// writer takes its jobs in order, so the rewrite comes after every batch sent before it;
    /// reading goes on meanwhile. [`Sink::rewrites_done`] collects the answers.
    fn rewrite_hour(&mut self, hour: i64, later: &[(i64, i64)], rewritten: &mut Rewritten) {
        let Dest::Writer(writer) = &self.dest else {
            return;
        };
        if !Rewritten::may_rewrite(hour, later) {
            return;
        }
        if hour + HOUR > self.raw_cutoff {
            let (writer, from) = (writer.clone(), hour.max(self.raw_cutoff));
            self.rewrites.push(tokio::spawn(async move {
                writer.compact_raw(from, hour + HOUR).await
            }));
        }
        rewritten.0.insert(hour);
    }

    /// Waits for the rewrites queued on the way.
    async fn rewrites_done(&mut self) -> Result<(), ImportError> {
        for h in std::mem::take(&mut self.rewrites) {
            h.await.map_err(|e| StoreError::Io(e.to_string()))??;
        }
        Ok(())
    }
}

const HOUR: i64 = 3600;

fn hour_of(t: i64) -> i64 {
    t - t.rem_euclid(HOUR)
}

/// The hours whose raw rows a streamed file's import has rewritten in instance order on its way
/// (module doc).
#[derive(Debug, Default)]
struct Rewritten(std::collections::BTreeSet<i64>);

impl Rewritten {
    /// The hour starting at `hour` may be rewritten now: the file being read has moved past it,
    /// and no file after it (`later`, their first and last seconds) has a second in it.
    fn may_rewrite(hour: i64, later: &[(i64, i64)]) -> bool {
        later
            .iter()
            .all(|&(first, last)| hour_of(last) < hour || hour_of(first) > hour)
    }

    /// The stream came back to `t`'s hour: it must be rewritten again.
    fn reopened(&mut self, t: i64) {
        self.0.remove(&hour_of(t));
    }

    /// The ranges of `[from, to)` left to rewrite at the end: runs of hours not rewritten yet,
    /// cut to `[from, to)`.
    fn left(&self, from: i64, to: i64) -> Vec<(i64, i64)> {
        let mut ranges: Vec<(i64, i64)> = Vec::new();
        let mut hour = hour_of(from);
        while hour < to {
            if !self.0.contains(&hour) {
                let (a, b) = (hour.max(from), (hour + HOUR).min(to));
                match ranges.last_mut() {
                    Some(last) if last.1 == a => last.1 = b,
                    _ => ranges.push((a, b)),
                }
            }
            hour += HOUR;
        }
        ranges
    }
}

/// Runs an import.
pub async fn import(opts: ImportOptions) -> Result<ImportReport, ImportError> {
    let now = chrono::Utc::now().timestamp();
    let checked = check_files(&opts, now)?;
    let total = checked.iter().map(|c| c.samples).sum();
    // The first and last second read.
    let span = checked
        .iter()
        .filter_map(|c| c.span)
        .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)));
    // Kept files are sent each in instance order, so their raw rows need no rewrite, unless
    // other rows share an hour with them: rows the ledger holds already, or another file's.
    let mut rewrite = kept_files_share_an_hour(&checked);
    let (dest, thread) = open_dest(opts.target, &checked, span, &mut rewrite)?;
    let raw_cutoff = now - opts.retention.raw_secs;
    let mut sink = Sink {
        dest,
        raw_cutoff,
        pending: Vec::new(),
        rewrites: Vec::new(),
        report: ImportReport {
            files: opts.files.len(),
            ..ImportReport::default()
        },
        bar: progress_bar(total, opts.progress),
    };
    // Whether any file was read as it lies (too large to keep), its raw rows in file order.
    let mut streamed = false;
    let mut rewritten = Rewritten::default();
    let spans: Vec<(i64, i64)> = checked.iter().filter_map(|c| c.span).collect();
    let mut spans_before = 0;
    for (f, c) in opts.files.iter().zip(checked) {
        // The spans of the files after this one.
        spans_before += usize::from(c.span.is_some());
        let later = &spans[spans_before..];
        if let Some(batches) = c.kept {
            let (batches, ordered) = in_instance_order(batches);
            rewrite |= !ordered;
            for batch in batches {
                sink.send(batch).await?;
            }
            continue;
        }
        streamed = true;
        stream_file(&mut sink, f, later, &mut rewritten).await?;
    }
    sink.drain().await?;
    sink.rewrites_done().await?;
    sink.bar.finish_and_clear();
    if let (Dest::Writer(writer), Some(span)) = (&sink.dest, span) {
        leave_in_instance_order(
            writer,
            span,
            streamed || rewrite,
            &rewritten,
            raw_cutoff,
            now,
        )
        .await?;
    }
    drop(sink.dest);
    if let Some(thread) = thread {
        tokio::task::block_in_place(|| {
            let _ = thread.join();
        });
    }
    Ok(sink.report)
}

/// Checks every file before anything is sent, keeping the batches of the first files up to
/// [`KEEP_SAMPLES`] in all.
fn check_files(opts: &ImportOptions, now: i64) -> Result<Vec<Checked>, ImportError> {
    let (oldest, newest) = (
        now - opts.retention.rollup_secs,
        now + opts.max_future_skew_secs,
    );
    let mut checked = Vec::with_capacity(opts.files.len());
    let mut keep = KEEP_SAMPLES;
    for f in &opts.files {
        let c = tokio::task::block_in_place(|| check_file(f, oldest, newest, keep))?;
        if c.kept.is_some() {
            keep -= c.samples;
        }
        checked.push(c);
    }
    Ok(checked)
}

/// Where the batches go: a writer of the ledger file (with its thread) or the aggregator's API.
/// On a ledger, `rewrite` is also set when it holds raw rows in the imported hours already.
fn open_dest(
    target: Target,
    checked: &[Checked],
    span: Option<(i64, i64)>,
    rewrite: &mut bool,
) -> Result<(Dest, Option<std::thread::JoinHandle<()>>), ImportError> {
    match target {
        Target::Ledger(db) => {
            let (conn, _) = tokio::task::block_in_place(|| store::open(&db))?;
            if checked.iter().any(|c| c.kept.is_none()) {
                // Rows read as they lie are rewritten an hour later: kept out of the file until
                // then (DuckDB's optimistic writes would put them there at once), most never
                // reach it in file order, and the file does not grow by their blocks.
                conn.execute_batch("SET enable_optimistic_write = false")
                    .map_err(StoreError::from_db)?;
            }
            if let Some(span) = span {
                *rewrite |= tokio::task::block_in_place(|| raw_rows_in_hours_of(&conn, span))
                    .map_err(StoreError::from_db)?;
            }
            let (writer, thread) = Writer::spawn(conn, 4 * CHUNK, Arc::new(()))?;
            Ok((Dest::Writer(writer), Some(thread)))
        }
        Target::Aggregator(sink) => Ok((Dest::Aggregator(sink), None)),
    }
}

/// The import's progress on the terminal (`--progress`), or a hidden bar.
fn progress_bar(total: u64, shown: bool) -> indicatif::ProgressBar {
    let bar = if shown {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} samples ({per_sec}, {eta} left)",
        )
        .expect("a valid template"),
    );
    bar
}

/// Sends a file too large to keep as it lies, in chunks; each hour is rewritten in instance
/// order once the file has left it (`later`: the spans of the files still to come).
async fn stream_file(
    sink: &mut Sink,
    f: &Path,
    later: &[(i64, i64)],
    rewritten: &mut Rewritten,
) -> Result<(), ImportError> {
    let mut reader = TraceReader::open(f)?;
    let mut chunker = Chunker::default();
    // The hour the file is in.
    let mut open: Option<i64> = None;
    while let Some(s) = tokio::task::block_in_place(|| reader.next_sample()) {
        let s = s?;
        let hour = hour_of(s.timestamp);
        match open {
            Some(o) if hour > o => {
                if let Some(batch) = chunker.flush() {
                    sink.send(batch).await?;
                }
                sink.rewrite_hour(o, later, rewritten);
                open = Some(hour);
            }
            Some(o) if hour < o => rewritten.reopened(s.timestamp),
            Some(_) => {}
            None => open = Some(hour),
        }
        if let Some(batch) = chunker.push(s, reader.gpu_energy_joules()) {
            sink.send(batch).await?;
        }
    }
    if let Some(batch) = chunker.finish() {
        sink.send(batch).await?;
    }
    Ok(())
}

/// After a ledger import of `span` (first and last second): the imported seconds' raw rows in
/// instance order, as the aggregator leaves a closed hour (kept files were sent in that order
/// already; `rewrite` says whether any were not), but for the hours rewritten on the way; then
/// the closed hours recorded as in order, so the aggregator's first start does not rewrite them.
async fn leave_in_instance_order(
    writer: &Writer,
    (first, last): (i64, i64),
    rewrite: bool,
    rewritten: &Rewritten,
    raw_cutoff: i64,
    now: i64,
) -> Result<(), ImportError> {
    if rewrite {
        for (from, to) in rewritten.left(first.max(raw_cutoff), last + 1) {
            writer.compact_raw(from, to).await?;
        }
    }
    let hour = |t: i64| t - t.rem_euclid(3600);
    let until = (hour(last) + 3600).min(hour(now - store::COMPACT_AFTER));
    writer
        .record_in_order(hour(first.max(raw_cutoff)), until)
        .await?;
    Ok(())
}

/// Whether two kept files have seconds in one hour: each is sent in instance order, but the
/// second's rows follow the first's, so that hour's raw rows are not in instance order.
fn kept_files_share_an_hour(checked: &[Checked]) -> bool {
    let mut hours: Vec<(i64, i64)> = checked
        .iter()
        .filter(|c| c.kept.is_some())
        .filter_map(|c| c.span)
        .map(|(a, b)| (a.div_euclid(3600), b.div_euclid(3600)))
        .collect();
    hours.sort_unstable();
    let mut last = i64::MIN;
    hours.into_iter().any(|(a, b)| {
        let shared = a <= last;
        last = last.max(b);
        shared
    })
}

/// Whether the ledger holds raw rows in the hours of `(first, last)`: the import's rows would
/// follow them, out of instance order.
fn raw_rows_in_hours_of(
    conn: &duckdb::Connection,
    (first, last): (i64, i64),
) -> duckdb::Result<bool> {
    let (from, to) = (hour_of(first), hour_of(last) + HOUR);
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM samples_raw WHERE ts >= ? AND ts < ?)",
        duckdb::params![from, to],
        |r| r.get(0),
    )
}

#[cfg(test)]
mod tests {
    use gpuledger_schema::{Attribution, Counters, Instance, Sample};

    use super::*;

    /// One second of whole GPU `gpu` (on one of three nodes).
    fn sample(gpu: usize, t: i64) -> Sample {
        Sample {
            timestamp: t,
            instance: Instance {
                node: format!("n{}", gpu % 3),
                gpu_uuid: format!("GPU-{gpu:03}"),
                gpu_model: "NVIDIA H100 80GB HBM3".into(),
                mig_profile: None,
                gpu_instance_id: None,
                placement_start: None,
                placement_size: None,
            },
            attribution: Attribution::default(),
            counters: Counters {
                sm_active: Some(0.5),
                ..Counters::default()
            },
        }
    }

    /// `samples` cut into batches as a kept file's are.
    fn chunked(samples: impl Iterator<Item = Sample>) -> Vec<Batch> {
        let mut chunker = Chunker::default();
        let mut batches: Vec<Batch> = samples.filter_map(|s| chunker.push(s, None)).collect();
        batches.extend(chunker.finish());
        batches
    }

    /// Kept files are rewritten when two of them have seconds in one hour, however they nest.
    #[test]
    fn kept_files_share_an_hour_when_their_hours_meet() {
        let file = |span: Option<(i64, i64)>, kept: bool| Checked {
            samples: 1,
            span,
            kept: kept.then(Vec::new),
        };
        let h = 3600;
        let share = |files: &[Checked]| kept_files_share_an_hour(files);
        assert!(!share(&[
            file(Some((0, h - 1)), true),
            file(Some((h, 2 * h)), true)
        ]));
        assert!(share(&[
            file(Some((h, 2 * h)), true),
            file(Some((0, h)), true)
        ]));
        assert!(share(&[
            file(Some((0, 5 * h)), true),
            file(Some((2 * h, 2 * h + 9)), true)
        ]));
        assert!(
            !share(&[file(Some((0, h)), true), file(Some((0, h)), false)]),
            "a streamed file is rewritten anyway"
        );
        assert!(!share(&[file(Some((0, h)), true), file(None, true)]));
    }

    /// An hour is rewritten on the way once no later file reaches into it; what is left for the
    /// end is every other hour of the span, and any hour the stream came back to.
    #[test]
    fn hours_are_rewritten_on_the_way_unless_a_later_file_or_the_stream_comes_back() {
        let h = 1_795_658_400; // an hour's first second
        assert_eq!(hour_of(h + 3599), h);
        assert_eq!(hour_of(h - 1), h - HOUR);
        // A later file from the hour's last second on, or up to its first: not yet.
        assert!(!Rewritten::may_rewrite(h, &[(h + 3599, h + 9000)]));
        assert!(!Rewritten::may_rewrite(h, &[(h - 9000, h)]));
        assert!(Rewritten::may_rewrite(
            h,
            &[(h + HOUR, h + 9000), (h - 9000, h - 1)]
        ));
        assert!(Rewritten::may_rewrite(h, &[]));
        let mut done = Rewritten::default();
        // Nothing rewritten: the whole span, cut to its seconds, in one range.
        assert_eq!(
            done.left(h + 10, h + 3 * HOUR + 5),
            vec![(h + 10, h + 3 * HOUR + 5)]
        );
        done.0.extend([h, h + HOUR, h + 3 * HOUR]);
        assert_eq!(
            done.left(h + 10, h + 4 * HOUR),
            vec![(h + 2 * HOUR, h + 3 * HOUR)]
        );
        done.reopened(h + HOUR + 59);
        assert_eq!(
            done.left(h + 10, h + 4 * HOUR),
            vec![(h + HOUR, h + 3 * HOUR)]
        );
        assert_eq!(done.left(h, h + HOUR), vec![]);
    }

    /// Time-major batches (every instance's seconds side by side, as a trace lies) come back with
    /// each instance's series together, seconds rising, every sample once, within [`CHUNK`].
    #[test]
    fn kept_batches_come_back_in_instance_order() {
        let (gpus, seconds) = (40usize, 3_000i64);
        let batches =
            chunked((0..seconds).flat_map(|t| (0..gpus).rev().map(move |gpu| sample(gpu, t))));
        assert!(batches.len() > 2);

        let ordered = in_instance_order(batches).0;
        assert!(ordered.iter().all(|b| b.sample_count() <= CHUNK));
        let rows: Vec<(String, i64)> = ordered
            .iter()
            .flat_map(|b| &b.series)
            .flat_map(|s| s.t.iter().map(|&t| (s.gpu_uuid.clone(), t)))
            .collect();
        assert_eq!(rows.len(), gpus * seconds as usize);
        let mut sorted = rows.clone();
        sorted.sort();
        assert_eq!(rows, sorted);
    }

    /// Regression (review): ten GPUs every second and a hundred seen once in a while gave
    /// batches of 110 series; sorted, the hundred's short pieces came out side by side, 400
    /// series in one batch, past what a receiver's series limit was sized for. A reordered
    /// batch holds no more series than the file's own.
    #[test]
    fn reordered_batches_hold_no_more_series_than_the_files_own() {
        let samples = (0..20_000i64).flat_map(|t| {
            let short = if t % 1_000 == 0 { 100..200 } else { 0..0 };
            (0..10).chain(short).map(move |gpu| sample(gpu, t))
        });
        let batches = chunked(samples);
        let most = batches.iter().map(|b| b.series.len()).max().unwrap();
        assert_eq!(most, 110);
        let total: usize = batches.iter().map(Batch::sample_count).sum();
        let ordered = in_instance_order(batches).0;
        assert!(ordered.iter().all(|b| b.series.len() <= most));
        assert_eq!(
            ordered.iter().map(Batch::sample_count).sum::<usize>(),
            total
        );
    }
}
