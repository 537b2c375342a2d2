//! Property tests over hostile input: the wire decoder and the trace CSV parser are fed mutations
//! of a committed seed corpus (`tests/corpus/`), a bounded number of cases per run so the suite
//! stays fast. Whatever the input, decoding never panics, a refusal names a field (a JSON path,
//! or a CSV line and column), and what is accepted obeys every rule and round-trips.
//!
//! The mutator is a few lines of seeded xorshift rather than a property-testing crate: adding
//! `proptest` changes the host build of a crate DuckDB's build script uses (`zip` → `getrandom`)
//! and so recompiles the bundled DuckDB (about 25 minutes on 2 cores). Cases are reproducible
//! from their number: set `FUZZ_CASES` to run more (e.g. 200000 before a release) and
//! `FUZZ_SEED` to start elsewhere; a failing case prints its seed, its edits and its input, which
//! can then be kept in the corpus as a new seed.

use std::path::{Path, PathBuf};

use gpuledger_schema::trace::TraceReader;
use gpuledger_schema::wire::{Batch, Format, Limits, WireError};

/// A test case's failure: what broke.
type Fail = String;

macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// xorshift64*: small, seeded, the same cases on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn cases() -> u64 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000)
}

/// Runs `case` for every case number, each with its own generator; panics naming the first
/// failing case, its edits and its input.
fn run(name: &str, mut case: impl FnMut(&mut Rng) -> Result<(), (Fail, Vec<Edit>, Vec<u8>)>) {
    let start: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for n in start..start + cases() {
        let mut rng = Rng(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        if let Err((why, edits, input)) = case(&mut rng) {
            panic!(
                "{name}: case FUZZ_SEED={n} failed: {why}\nedits: {edits:?}\ninput: {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}

fn corpus(kind: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(kind);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&path).unwrap(),
            )
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    files
}

/// One edit of a byte string: the kinds of damage real clients and attackers do.
#[derive(Debug, Clone)]
enum Edit {
    /// Overwrite one byte.
    Set(usize, u8),
    /// Insert a token that changes meaning (a quote, a bracket, a huge number, a sign).
    Insert(usize, &'static str),
    /// Delete a range.
    Delete(usize, usize),
    /// Repeat a range (grows arrays, duplicates keys).
    Repeat(usize, usize, u8),
    /// Cut the input short.
    Truncate(usize),
}

const TOKENS: &[&str] = &[
    "\"",
    "\\",
    ",",
    "[",
    "]",
    "{",
    "}",
    ":",
    "null",
    "-1",
    "1e999",
    "-0",
    "NaN",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "4294967295",
    "1.5",
    "\"t\":[]",
    ",\"v\":2",
    "\u{0}",
    "\u{2028}",
    "\"\\ud800\"",
    "\n",
    "\r\n",
    "\"\"",
];

fn edit(rng: &mut Rng) -> Edit {
    let at = rng.next() as usize;
    match rng.below(5) {
        0 => Edit::Set(at, rng.next() as u8),
        1 => Edit::Insert(at, TOKENS[rng.below(TOKENS.len())]),
        2 => Edit::Delete(at, 1 + rng.below(39)),
        3 => Edit::Repeat(at, 1 + rng.below(59), 1 + rng.below(4) as u8),
        _ => Edit::Truncate(at),
    }
}

fn edits(rng: &mut Rng, min: usize, max: usize) -> Vec<Edit> {
    let n = min + rng.below(max - min);
    (0..n).map(|_| edit(rng)).collect()
}

fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = bytes.len().max(1);
        match *e {
            Edit::Set(i, b) if !bytes.is_empty() => bytes[i % len] = b,
            Edit::Set(..) => {}
            Edit::Insert(i, t) => {
                let at = i % (bytes.len() + 1);
                bytes.splice(at..at, t.bytes());
            }
            Edit::Delete(i, n) => {
                let at = i % len;
                let end = (at + n).min(bytes.len());
                if at < end {
                    bytes.drain(at..end);
                }
            }
            Edit::Repeat(i, n, k) => {
                let at = i % len;
                let end = (at + n).min(bytes.len());
                if at < end {
                    let piece = bytes[at..end].to_vec();
                    for _ in 0..k {
                        bytes.splice(end..end, piece.iter().copied());
                    }
                }
            }
            Edit::Truncate(i) => bytes.truncate(i % len),
        }
    }
    bytes
}

/// The first segment of a JSON path a wire error may name.
const WIRE_FIELDS: &[&str] = &["body", "v", "batch_id", "node", "series", "shares"];

fn check_wire(bytes: &[u8], gzip: bool) -> Result<(), Fail> {
    check_wire_as(bytes, gzip, Format::Json)
}

fn check_wire_as(bytes: &[u8], gzip: bool, format: Format) -> Result<(), Fail> {
    let limits = Limits {
        max_samples: 2_000,
        max_series: 64,
    };
    match Batch::decode_as(bytes, gzip, format, &limits) {
        Ok(batch) => {
            check!(batch.validate().is_ok(), "accepted an invalid batch");
            check!(
                batch.weight() <= limits.max_samples,
                "accepted past the limit"
            );
            for s in batch.samples() {
                check!(s.validate().is_ok(), "accepted an invalid sample {s:?}");
            }
            // What was accepted survives the trip an exporter makes.
            let again = Batch::decode_as(&batch.encode_as(format), true, format, &limits);
            check!(
                again.as_ref().ok() == Some(&batch),
                "no round trip: {again:?}"
            );
        }
        Err(e) => {
            let field = e.field();
            let head = field.split(['.', '[']).next().unwrap_or("");
            check!(
                WIRE_FIELDS.contains(&head),
                "error names no field of a batch: {e}"
            );
            if let WireError::Invalid { problem, .. } = &e {
                check!(!problem.is_empty(), "an error without a reason: {e}");
            }
        }
    }
    Ok(())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

fn check_trace(bytes: &[u8]) -> Result<(), Fail> {
    let name = Path::new("fuzz.csv");
    let mut reader = match TraceReader::new(name, bytes) {
        Ok(r) => r,
        Err(e) => {
            check!(e.line == 1, "a header error is on line 1: {e}");
            return Ok(());
        }
    };
    let mut rows = 0;
    while let Some(next) = reader.next_sample() {
        rows += 1;
        check!(rows < 100_000, "the reader does not end");
        match next {
            Ok(sample) => check!(sample.validate().is_ok(), "accepted {sample:?}"),
            Err(e) => {
                check!(!e.message.is_empty(), "an error without a reason");
                check!(e.to_string().starts_with("fuzz.csv:"), "unnamed: {e}");
            }
        }
    }
    Ok(())
}

#[test]
fn the_wire_decoder_names_a_field_or_accepts_only_valid_batches() {
    let seeds = corpus("wire");
    run("wire", |rng| {
        let seed = &seeds[rng.below(seeds.len())].1;
        let edits = edits(rng, 0, 6);
        let bytes = apply(seed.clone(), &edits);
        let result = if rng.below(2) == 0 {
            check_wire(&gzip(&bytes), true)
        } else {
            check_wire(&bytes, false)
        };
        result.map_err(|why| (why, edits, bytes))
    });
}

/// The same seeds as MessagePack, damaged byte-wise: lengths that lie, markers that change type,
/// documents cut short or run on.
#[test]
fn the_msgpack_decoder_names_a_field_or_accepts_only_valid_batches() {
    let seeds: Vec<Vec<u8>> = corpus("wire")
        .into_iter()
        .map(|(_, json)| {
            let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
            rmp_serde::to_vec_named(&value).unwrap()
        })
        .collect();
    run("msgpack", |rng| {
        let seed = &seeds[rng.below(seeds.len())];
        let edits = edits(rng, 0, 6);
        let bytes = apply(seed.clone(), &edits);
        let result = if rng.below(2) == 0 {
            check_wire_as(&gzip(&bytes), true, Format::MessagePack)
        } else {
            check_wire_as(&bytes, false, Format::MessagePack)
        };
        result.map_err(|why| (why, edits, bytes))
    });
}

#[test]
fn damaged_gzip_is_refused_as_the_body() {
    // The compressed bytes themselves damaged: a bad stream, never a panic.
    let seeds = corpus("wire");
    run("gzip", |rng| {
        let seed = &seeds[rng.below(seeds.len())].1;
        let edits = edits(rng, 1, 4);
        let bytes = apply(gzip(seed), &edits);
        check_wire(&bytes, true).map_err(|why| (why, edits, bytes))
    });
}

#[test]
fn the_trace_parser_names_a_line_or_accepts_only_valid_samples() {
    let seeds = corpus("trace");
    run("trace", |rng| {
        let seed = &seeds[rng.below(seeds.len())].1;
        let edits = edits(rng, 0, 6);
        let bytes = apply(seed.clone(), &edits);
        check_trace(&bytes).map_err(|why| (why, edits, bytes))
    });
}

/// The seeds themselves are valid: the harness mutates good input, not noise.
#[test]
fn every_seed_is_valid() {
    for (name, bytes) in corpus("wire") {
        Batch::decode(&bytes, false).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for (name, bytes) in corpus("trace") {
        let mut r = TraceReader::new(Path::new(&name), &bytes[..]).unwrap();
        let mut n = 0;
        while let Some(s) = r.next_sample() {
            s.unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
        assert!(n > 0, "{name} has no rows");
    }
}
