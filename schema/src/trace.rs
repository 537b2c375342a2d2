//! The trace CSV: one sample per row. The format is specified in `schema/TRACE.md`.
//!
//! Reading validates every row and reports the first problem as `file:line:column: message`,
//! so a caller that wants all-or-nothing semantics reads (or [`validate`]s) the whole file before
//! using any of it.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};

use crate::sample::{Attribution, Counters, Instance, MAX_GPU_JOULES_PER_SECOND, Sample, SloClass};

/// The columns, in the order gpuledger writes them. Readers find columns by name, so files may
/// order them differently and carry extra columns.
pub const COLUMNS: [&str; 20] = [
    "timestamp",
    "node",
    "gpu_uuid",
    "gpu_model",
    "mig_profile",
    "gpu_instance_id",
    "placement_start",
    "placement_size",
    "tenant",
    "workload",
    "slo_class",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fb_used_bytes",
    "fb_total_bytes",
    "nvlink_tx_bytes",
    "nvlink_rx_bytes",
    "gpu_energy_joules",
];

/// Columns a file must have.
const REQUIRED: [&str; 4] = ["timestamp", "node", "gpu_uuid", "gpu_model"];

/// Where in a trace file something went wrong, and what.
#[derive(Debug, thiserror::Error)]
#[error("{}:{line}:{column}: {message}", file.display())]
pub struct TraceError {
    /// The file (or `-` for a reader).
    pub file: PathBuf,
    /// 1-based line number.
    pub line: u64,
    /// 1-based column number (the CSV field, not the character).
    pub column: usize,
    /// What is wrong, naming the column.
    pub message: String,
}

/// Reads samples from a trace CSV.
pub struct TraceReader<R: Read> {
    file: PathBuf,
    reader: csv::Reader<R>,
    index: [Option<usize>; COLUMNS.len()],
    record: csv::StringRecord,
    /// Lines of the file before what this reader reads, past its header row (a [`Parts`] range).
    line_offset: u64,
    /// The `gpu_energy_joules` of the row read last.
    energy: Option<f64>,
}

/// A trace file cut into byte ranges of whole records, to be read at once by several threads:
/// each range is read with the file's header row in front of it, and errors name the lines of the
/// whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    /// The header row, with its line break.
    pub header: Vec<u8>,
    /// Each range's bytes and the line number of its first record.
    pub ranges: Vec<(std::ops::Range<u64>, u64)>,
}

/// The reader of one [`Parts`] range.
pub type PartReader = io::Chain<io::Cursor<Vec<u8>>, io::Take<File>>;

impl Parts {
    /// Cuts `path` into `n` ranges of about equal size at line breaks, or `None` when it should
    /// be read whole: `n` < 2, fewer than `min_bytes` bytes, no record after the header, or a
    /// quote character anywhere (a quoted field may hold a line break, so a line break would not
    /// always end a record). One read of the file; the caller reads it again.
    pub fn of(path: &Path, n: usize, min_bytes: u64) -> Result<Option<Parts>, TraceError> {
        let io_err = |e: io::Error| TraceError {
            file: path.to_owned(),
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        };
        let mut file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        if n < 2 || len < min_bytes {
            return Ok(None);
        }
        let targets: Vec<u64> = (1..n as u64).map(|k| k * len / n as u64).collect();
        let (mut header, mut header_end) = (Vec::new(), None);
        // Cut points (after a line break) with the lines before them.
        let mut cuts: Vec<(u64, u64)> = Vec::new();
        let (mut offset, mut lines) = (0u64, 0u64);
        let mut block = vec![0u8; 1 << 20];
        loop {
            let got = file.read(&mut block).map_err(io_err)?;
            if got == 0 {
                break;
            }
            let block = &block[..got];
            if block.contains(&b'"') {
                return Ok(None);
            }
            if header_end.is_none() {
                header.extend_from_slice(block);
                if let Some(i) = header.iter().position(|&b| b == b'\n') {
                    header.truncate(i + 1);
                    header_end = Some(i as u64 + 1);
                }
            }
            let end = offset + got as u64;
            // The first line break at or after the next target, if it is in this block.
            while let Some(&target) = targets.get(cuts.len()) {
                let from = target.max(offset).max(cuts.last().map_or(0, |c| c.0));
                if from >= end {
                    break;
                }
                let skip = (from - offset) as usize;
                match block[skip..].iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        let at = skip + i + 1;
                        let before = block[..at].iter().filter(|&&b| b == b'\n').count();
                        cuts.push((offset + at as u64, lines + before as u64));
                    }
                    None => break,
                }
            }
            lines += block.iter().filter(|&&b| b == b'\n').count() as u64;
            offset = end;
        }
        let Some(start) = header_end else {
            return Ok(None);
        };
        cuts.retain(|&(at, _)| at > start && at < len);
        cuts.dedup();
        let mut ranges = Vec::with_capacity(cuts.len() + 1);
        let mut from = (start, 2);
        for (at, lines_before) in cuts {
            ranges.push((from.0..at, from.1));
            from = (at, lines_before + 1);
        }
        ranges.push((from.0..len, from.1));
        Ok((ranges.len() > 1).then_some(Parts { header, ranges }))
    }

    /// A reader of range `i`.
    pub fn reader(&self, path: &Path, i: usize) -> Result<TraceReader<PartReader>, TraceError> {
        use std::io::Seek;
        let (range, first_line) = self.ranges[i].clone();
        let file = File::open(path)
            .and_then(|mut f| f.seek(io::SeekFrom::Start(range.start)).map(|_| f))
            .map_err(|e| TraceError {
                file: path.to_owned(),
                line: first_line,
                column: 0,
                message: format!("cannot read: {e}"),
            })?;
        let input = io::Cursor::new(self.header.clone()).chain(file.take(range.end - range.start));
        let mut reader = TraceReader::new(path, input)?;
        // The header is the reader's line 1 and the range's first record its line 2.
        reader.line_offset = first_line - 2;
        Ok(reader)
    }
}

impl TraceReader<File> {
    /// Opens `path` and checks its header.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path).map_err(|e| TraceError {
            file: path.to_owned(),
            line: 0,
            column: 0,
            message: format!("cannot open: {e}"),
        })?;
        TraceReader::new(path, file)
    }
}

impl<R: Read> TraceReader<R> {
    /// Reads a trace from `input`; `name` is used in error messages.
    pub fn new(name: &Path, input: R) -> Result<Self, TraceError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(false)
            .from_reader(input);
        let err = |message: String| TraceError {
            file: name.to_owned(),
            line: 1,
            column: 1,
            message,
        };
        let headers = reader
            .headers()
            .map_err(|e| err(format!("cannot read the header row: {e}")))?
            .clone();
        let mut index = [None; COLUMNS.len()];
        for (i, column) in COLUMNS.iter().enumerate() {
            index[i] = headers.iter().position(|h| h.trim() == *column);
        }
        for required in REQUIRED {
            let i = COLUMNS
                .iter()
                .position(|c| *c == required)
                .expect("required columns are columns");
            if index[i].is_none() {
                return Err(err(format!("the header row has no {required:?} column")));
            }
        }
        Ok(TraceReader {
            file: name.to_owned(),
            reader,
            index,
            record: csv::StringRecord::new(),
            line_offset: 0,
            energy: None,
        })
    }

    /// The next sample, `None` at the end of the file.
    pub fn next_sample(&mut self) -> Option<Result<Sample, TraceError>> {
        match self.reader.read_record(&mut self.record) {
            Ok(false) => None,
            Ok(true) => Some(self.parse_record().map(|(sample, energy)| {
                self.energy = energy;
                sample
            })),
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line() + self.line_offset);
                Some(Err(TraceError {
                    file: self.file.clone(),
                    line,
                    column: 1,
                    message: format!("malformed CSV: {e}"),
                }))
            }
        }
    }

    /// The `gpu_energy_joules` of the row read last (its GPU's energy in that second; the same
    /// on every row of the GPU-second): `None` when empty or absent.
    pub fn gpu_energy_joules(&self) -> Option<f64> {
        self.energy
    }

    /// An error about `column` of the row read last, for checks a caller adds (such as time order).
    pub fn error_at(&self, column: &'static str, message: impl std::fmt::Display) -> TraceError {
        let line = self.line();
        Row {
            file: &self.file,
            line,
            record: &self.record,
            index: &self.index,
        }
        .error(column, message)
    }

    /// The line of the row read last, in the whole file.
    pub fn line(&self) -> u64 {
        self.record
            .position()
            .map_or(0, |p| p.line() + self.line_offset)
    }

    fn parse_record(&self) -> Result<(Sample, Option<f64>), TraceError> {
        let line = self.line();
        let row = Row {
            file: &self.file,
            line,
            record: &self.record,
            index: &self.index,
        };
        let sample = Sample {
            timestamp: row.required("timestamp", parse_timestamp)?,
            instance: Instance {
                node: row.required("node", parse_name)?,
                gpu_uuid: row.required("gpu_uuid", parse_name)?,
                gpu_model: row.required("gpu_model", parse_name)?,
                mig_profile: row.optional("mig_profile", parse_name)?,
                gpu_instance_id: row.optional("gpu_instance_id", parse_u32)?,
                placement_start: row.optional("placement_start", parse_u32)?,
                placement_size: row.optional("placement_size", parse_u32)?,
            },
            attribution: Attribution {
                tenant: row.optional("tenant", parse_name)?,
                workload: row.optional("workload", parse_name)?,
                slo_class: row.optional("slo_class", |s| {
                    s.parse::<SloClass>().map_err(|e| e.to_string())
                })?,
                owner: None,
                owner_ref: None,
            },
            counters: Counters {
                sm_active: row.optional("sm_active", parse_ratio)?,
                sm_occupancy: row.optional("sm_occupancy", parse_ratio)?,
                tensor_active: row.optional("tensor_active", parse_ratio)?,
                dram_active: row.optional("dram_active", parse_ratio)?,
                fb_used_bytes: row.optional("fb_used_bytes", parse_bytes)?,
                fb_total_bytes: row.optional("fb_total_bytes", parse_bytes)?,
                nvlink_tx_bytes: row.optional("nvlink_tx_bytes", parse_bytes)?,
                nvlink_rx_bytes: row.optional("nvlink_rx_bytes", parse_bytes)?,
            },
        };
        sample
            .validate()
            .map_err(|e| row.error(e.field, e.problem))?;
        let energy = row.optional("gpu_energy_joules", parse_joules)?;
        Ok((sample, energy))
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Sample, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_sample()
    }
}

/// Checks that the rows of one GPU-second agree on its `gpu_energy_joules`: each row is compared
/// with the GPU's previous row when that row was of the same second (rows of one GPU-second lie
/// side by side in the traces exporters and `gpuledger simulate` write). Memory: one entry per GPU.
#[derive(Debug, Default)]
pub struct EnergyCheck {
    /// Per GPU UUID: the second, energy and line of its last row.
    last: std::collections::HashMap<String, (i64, Option<f64>, u64)>,
}

impl EnergyCheck {
    /// Checks the row `reader` read last, `sample`.
    pub fn check<R: Read>(
        &mut self,
        reader: &TraceReader<R>,
        sample: &Sample,
    ) -> Result<(), TraceError> {
        let (t, e, line) = (sample.timestamp, reader.gpu_energy_joules(), reader.line());
        match self.last.get_mut(sample.instance.gpu_uuid.as_str()) {
            Some((lt, le, ll)) if *lt == t => {
                if *le != e {
                    let shown = |v: Option<f64>| v.map_or("empty".to_owned(), |v| format!("{v} J"));
                    return Err(reader.error_at(
                        "gpu_energy_joules",
                        format!(
                            "{} disagrees with {} on line {ll} for {} at {t}",
                            shown(e),
                            shown(*le),
                            sample.instance.gpu_uuid
                        ),
                    ));
                }
            }
            Some(last) => *last = (t, e, line),
            None => {
                self.last
                    .insert(sample.instance.gpu_uuid.clone(), (t, e, line));
            }
        }
        Ok(())
    }
}

struct Row<'a> {
    file: &'a Path,
    line: u64,
    record: &'a csv::StringRecord,
    index: &'a [Option<usize>; COLUMNS.len()],
}

impl Row<'_> {
    fn position(&self, column: &str) -> Option<usize> {
        let i = COLUMNS
            .iter()
            .position(|c| *c == column)
            .expect("a known column");
        self.index[i]
    }

    fn error(&self, column: &str, message: impl std::fmt::Display) -> TraceError {
        TraceError {
            file: self.file.to_owned(),
            line: self.line,
            column: self.position(column).map_or(1, |p| p + 1),
            message: format!("{column}: {message}"),
        }
    }

    fn optional<T>(
        &self,
        column: &'static str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, TraceError> {
        let Some(at) = self.position(column) else {
            return Ok(None);
        };
        let raw = self.record.get(at).unwrap_or("").trim();
        if raw.is_empty() {
            return Ok(None);
        }
        parse(raw).map(Some).map_err(|e| self.error(column, e))
    }

    fn required<T>(
        &self,
        column: &'static str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, TraceError> {
        self.optional(column, parse)?
            .ok_or_else(|| self.error(column, "is required"))
    }
}

fn parse_name(s: &str) -> Result<String, String> {
    Ok(s.to_owned())
}

fn parse_u32(s: &str) -> Result<u32, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not a whole number"))
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not a non-negative whole number of bytes"))
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is outside 0–1"))
    }
}

fn parse_joules(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && (0.0..=MAX_GPU_JOULES_PER_SECOND).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{v} J in one second is not an energy a GPU uses (0 to {MAX_GPU_JOULES_PER_SECOND})"
        ))
    }
}

/// Parses a trace timestamp: integer Unix seconds or an RFC 3339 time on a whole second.
pub fn parse_timestamp(s: &str) -> Result<i64, String> {
    if let Ok(secs) = s.parse::<i64>() {
        return Ok(secs);
    }
    let t = DateTime::parse_from_rfc3339(s)
        .map_err(|e| format!("{s:?} is neither Unix seconds nor an RFC 3339 time ({e})"))?;
    if t.timestamp_subsec_nanos() != 0 {
        return Err(format!("{s:?} is not on a whole second"));
    }
    Ok(t.timestamp())
}

/// Formats Unix seconds as the RFC 3339 UTC time traces use (`2026-01-01T00:00:00Z`).
pub fn format_timestamp(secs: i64) -> String {
    DateTime::<Utc>::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_else(|| secs.to_string())
}

/// What a full pass over a valid trace found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Rows (samples).
    pub samples: u64,
    /// Earliest timestamp.
    pub first: Option<i64>,
    /// Latest timestamp.
    pub last: Option<i64>,
}

/// Reads the whole file and returns the first error, or what it holds. Use it before acting on
/// a file that should be used all or not at all.
pub fn validate(path: &Path) -> Result<Summary, TraceError> {
    let mut summary = Summary::default();
    for sample in TraceReader::open(path)? {
        let t = sample?.timestamp;
        summary.samples += 1;
        summary.first = Some(summary.first.map_or(t, |f| f.min(t)));
        summary.last = Some(summary.last.map_or(t, |l| l.max(t)));
    }
    Ok(summary)
}

/// Writes samples as a trace CSV.
pub struct TraceWriter<W: Write> {
    writer: csv::Writer<W>,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace on `output` and writes the header row.
    pub fn new(output: W) -> io::Result<Self> {
        let mut writer = csv::Writer::from_writer(output);
        writer.write_record(COLUMNS)?;
        Ok(TraceWriter { writer })
    }

    /// Writes one sample as a row, without energy.
    pub fn write(&mut self, s: &Sample) -> io::Result<()> {
        self.write_with_energy(s, None)
    }

    /// Writes one sample as a row with its GPU's energy in that second (`gpu_energy_joules`,
    /// the same on every row of the GPU-second).
    pub fn write_with_energy(&mut self, s: &Sample, energy: Option<f64>) -> io::Result<()> {
        fn opt<T: ToString>(v: &Option<T>) -> String {
            v.as_ref().map(T::to_string).unwrap_or_default()
        }
        let (i, a, c) = (&s.instance, &s.attribution, &s.counters);
        self.writer.write_record([
            format_timestamp(s.timestamp),
            i.node.clone(),
            i.gpu_uuid.clone(),
            i.gpu_model.clone(),
            opt(&i.mig_profile),
            opt(&i.gpu_instance_id),
            opt(&i.placement_start),
            opt(&i.placement_size),
            opt(&a.tenant),
            opt(&a.workload),
            opt(&a.slo_class),
            opt(&c.sm_active),
            opt(&c.sm_occupancy),
            opt(&c.tensor_active),
            opt(&c.dram_active),
            opt(&c.fb_used_bytes),
            opt(&c.fb_total_bytes),
            opt(&c.nvlink_tx_bytes),
            opt(&c.nvlink_rx_bytes),
            opt(&energy),
        ])?;
        Ok(())
    }

    /// Flushes and returns the output.
    pub fn finish(self) -> io::Result<W> {
        self.writer.into_inner().map_err(|e| e.into_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "timestamp,node,gpu_uuid,gpu_model,mig_profile,gpu_instance_id,placement_start,placement_size,tenant,workload,slo_class,sm_active,sm_occupancy,tensor_active,dram_active,fb_used_bytes,fb_total_bytes,nvlink_tx_bytes,nvlink_rx_bytes";

    fn read(text: &str) -> Result<Vec<Sample>, TraceError> {
        TraceReader::new(Path::new("t.csv"), text.as_bytes())?.collect()
    }

    #[test]
    fn reads_both_timestamp_forms_and_empty_fields() {
        let text = format!(
            "{HEADER}\n2026-01-01T00:00:00Z,n1,GPU-a,NVIDIA H100 80GB HBM3,3g.40gb,2,0,4,team-a,ml/train-0,batch,0.5,0.25,0.125,0.1,100,200,,\n\
             1767225601,n1,GPU-a,NVIDIA H100 80GB HBM3,,,,,,,,,,,,,,7,8\n"
        );
        let samples = read(&text).unwrap();
        assert_eq!(samples[0].timestamp, 1_767_225_600);
        assert_eq!(samples[1].timestamp, 1_767_225_601);
        assert_eq!(samples[0].instance.mig_profile.as_deref(), Some("3g.40gb"));
        assert_eq!(samples[0].attribution.slo_class, Some(SloClass::Batch));
        assert_eq!(samples[1].counters.sm_active, None);
        assert_eq!(samples[1].counters.nvlink_rx_bytes, Some(8));
        assert!(!samples[1].attribution.is_allocated());
    }

    #[test]
    fn errors_name_file_line_and_column() {
        let text = format!(
            "{HEADER}\n1767225600,n1,GPU-a,NVIDIA H100 80GB HBM3,,,,,,,,0.5,,,,,,,\n1767225601,n1,GPU-a,NVIDIA H100 80GB HBM3,,,,,,,,1.5,,,,,,,\n"
        );
        let err = read(&text).unwrap_err();
        assert_eq!((err.line, err.column), (3, 12));
        assert_eq!(err.to_string(), "t.csv:3:12: sm_active: 1.5 is outside 0–1");

        let err = read(&format!("{HEADER}\nyesterday,n1,GPU-a,m,,,,,,,,,,,,,,,\n")).unwrap_err();
        assert_eq!((err.line, err.column), (2, 1));
        assert!(err.message.starts_with("timestamp: "), "{err}");

        let err = read(&format!("{HEADER}\n1,n1,GPU-a,m,,,,,,,,,,,,-5,,,\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:2:16: fb_used_bytes: \"-5\" is not a non-negative whole number of bytes"
        );

        let err = read("node,gpu_uuid\nn,g\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:1:1: the header row has no \"timestamp\" column"
        );

        let err = read(&format!("{HEADER}\n1,n1,GPU-a\n")).unwrap_err();
        assert_eq!(err.line, 2, "{err}");
    }

    #[test]
    fn parts_read_what_the_whole_file_reads_and_name_the_same_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        let rows: String = (0..100)
            .map(|i| {
                format!(
                    "{},n1,GPU-{},m,,,,,,,,0.{},,,,,,,\n",
                    1_767_225_600 + i,
                    i % 7,
                    i % 10
                )
            })
            .collect();
        let whole = read(&format!("{HEADER}\n{rows}")).unwrap();
        std::fs::write(&path, format!("{HEADER}\n{rows}")).unwrap();
        for n in [2, 3, 7] {
            let parts = Parts::of(&path, n, 0).unwrap().expect("cut");
            assert_eq!(parts.ranges.len(), n);
            assert_eq!(parts.header, format!("{HEADER}\n").into_bytes());
            let mut read_in_parts = Vec::new();
            for i in 0..n {
                let part: Vec<Sample> = parts
                    .reader(&path, i)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                assert!(!part.is_empty());
                read_in_parts.extend(part);
            }
            assert_eq!(read_in_parts, whole, "{n} parts");
        }

        // A bad row near the end: the part that holds it names its line in the whole file.
        let bad = rows.replacen(
            "1767225690,n1,GPU-6,m,,,,,,,,0.0",
            "1767225690,n1,GPU-6,m,,,,,,,,7.5",
            1,
        );
        std::fs::write(&path, format!("{HEADER}\n{bad}")).unwrap();
        let parts = Parts::of(&path, 2, 0).unwrap().expect("cut");
        let err = parts
            .reader(&path, 1)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:92:12: sm_active: 7.5 is outside 0–1"
                .replace("t.csv", &path.display().to_string())
        );
        assert_eq!(
            parts.reader(&path, 0).unwrap().count(),
            parts.ranges[1].1 as usize - 2
        );

        // A quote anywhere, a small file, one part: read whole.
        std::fs::write(
            &path,
            format!("{HEADER}\n{rows}1,n1,GPU-a,m,,,,,,\"a,b\",,,,,,,,,\n"),
        )
        .unwrap();
        assert_eq!(Parts::of(&path, 2, 0).unwrap(), None);
        std::fs::write(&path, format!("{HEADER}\n{rows}")).unwrap();
        assert_eq!(Parts::of(&path, 2, 1 << 30).unwrap(), None);
        assert_eq!(Parts::of(&path, 1, 0).unwrap(), None);
    }

    #[test]
    fn extra_and_reordered_columns_are_fine() {
        let samples =
            read("gpu_model,extra,timestamp,gpu_uuid,node,sm_active\nm,x,5,GPU-a,n1,0.5\n")
                .unwrap();
        assert_eq!(samples[0].timestamp, 5);
        assert_eq!(samples[0].counters.sm_active, Some(0.5));
    }

    #[test]
    fn written_traces_read_back_identically() {
        let text = format!(
            "{HEADER},gpu_energy_joules\n2026-01-01T00:00:00Z,n1,GPU-a,NVIDIA H100 80GB HBM3,3g.40gb,2,0,4,team-a,\"ml/train,0\",batch,0.5,0.25,0.125,0.1,100,200,,,\n"
        );
        let samples = read(&text).unwrap();
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        for s in &samples {
            w.write(s).unwrap();
        }
        let out = String::from_utf8(w.finish().unwrap()).unwrap();
        assert_eq!(read(&out).unwrap(), samples);
        assert_eq!(out, text);
    }
}
