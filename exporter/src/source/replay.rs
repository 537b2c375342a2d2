//! Replay of a recorded trace CSV (`schema/TRACE.md`): the way to backfill history over HTTP and
//! to drive the exporter from fixtures.
//!
//! The whole file is validated before the first second is returned, so a bad file is refused
//! with `file:line:column` and nothing of it is used. Rows must be in time order (several rows
//! per second, one per instance); consecutive rows with the same timestamp form one [`Second`].

use std::fs::File;
use std::path::{Path, PathBuf};

use gpuledger_schema::Sample;
use gpuledger_schema::trace::{EnergyCheck, TraceError, TraceReader};

use super::{EnergySource, GpuReading, Reading, Second, Source, SourceError};

/// A trace file played back second by second.
pub struct ReplaySource {
    path: PathBuf,
    reader: TraceReader<File>,
    /// The next second's first row, with its GPU's energy.
    pending: Option<(Sample, Option<f64>)>,
    /// Rows in the file.
    pub samples: u64,
}

impl ReplaySource {
    /// Validates all of `path` (values and time order), then opens it for playback.
    pub fn open(path: &Path) -> Result<ReplaySource, TraceError> {
        let mut reader = TraceReader::open(path)?;
        let mut last = i64::MIN;
        let mut samples = 0;
        let mut energy = EnergyCheck::default();
        while let Some(sample) = reader.next_sample() {
            let sample = sample?;
            energy.check(&reader, &sample)?;
            let t = sample.timestamp;
            if t < last {
                return Err(reader.error_at(
                    "timestamp",
                    format!(
                        "goes back in time ({t} after {last}); replay needs rows in time order"
                    ),
                ));
            }
            last = t;
            samples += 1;
        }
        Ok(ReplaySource {
            path: path.to_owned(),
            reader: TraceReader::open(path)?,
            pending: None,
            samples,
        })
    }

    /// The file being replayed.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn reading(s: Sample) -> Reading {
    Reading {
        instance: s.instance,
        mig_uuid: None,
        gpu_index: None,
        attribution: s.attribution,
        counters: s.counters,
    }
}

impl Source for ReplaySource {
    fn name(&self) -> &'static str {
        "replay"
    }

    fn is_recorded(&self) -> bool {
        true
    }

    fn collect(&mut self, _now: i64) -> Result<Option<Second>, SourceError> {
        let first = match self.pending.take() {
            Some(s) => s,
            None => match self.reader.next_sample() {
                None => return Ok(None),
                Some(s) => (s?, self.reader.gpu_energy_joules()),
            },
        };
        let mut second = Second {
            timestamp: first.0.timestamp,
            ..Second::default()
        };
        let add = |(s, energy): (Sample, Option<f64>), second: &mut Second| {
            // One GPU reading per GPU with energy in the second (its rows agree: checked at open).
            if energy.is_some()
                && !second
                    .gpus
                    .iter()
                    .any(|g| g.gpu_uuid == s.instance.gpu_uuid)
            {
                second.gpus.push(GpuReading {
                    node: s.instance.node.clone(),
                    gpu_uuid: s.instance.gpu_uuid.clone(),
                    gpu_model: s.instance.gpu_model.clone(),
                    power_watts: None,
                    energy_joules: energy,
                    energy_source: Some(EnergySource::Trace),
                });
            }
            second.readings.push(reading(s));
        };
        add(first, &mut second);
        while let Some(next) = self.reader.next_sample() {
            let next = (next?, self.reader.gpu_energy_joules());
            if next.0.timestamp != second.timestamp {
                self.pending = Some(next);
                break;
            }
            add(next, &mut second);
        }
        Ok(Some(second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const HEADER: &str = "timestamp,node,gpu_uuid,gpu_model,mig_profile,gpu_instance_id,sm_active";

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn rows_group_into_seconds() {
        let f = file(&format!(
            "{HEADER}\n10,n,G,m,1g.10gb,7,0.1\n10,n,G,m,1g.10gb,8,0.2\n11,n,G,m,1g.10gb,7,0.3\n"
        ));
        let mut r = ReplaySource::open(f.path()).unwrap();
        assert_eq!(r.samples, 3);
        let a = r.collect(0).unwrap().unwrap();
        assert_eq!((a.timestamp, a.readings.len()), (10, 2));
        let b = r.collect(0).unwrap().unwrap();
        assert_eq!((b.timestamp, b.readings.len()), (11, 1));
        assert!(r.collect(0).unwrap().is_none());
    }

    #[test]
    fn a_bad_row_anywhere_refuses_the_whole_file() {
        let f = file(&format!(
            "{HEADER}\n10,n,G,m,1g.10gb,7,0.1\n11,n,G,m,1g.10gb,7,x\n"
        ));
        let err = ReplaySource::open(f.path()).err().unwrap();
        assert_eq!((err.line, err.column), (3, 7));
        let f = file(&format!(
            "{HEADER}\n10,n,G,m,1g.10gb,7,0.1\n9,n,G,m,1g.10gb,7,0.1\n"
        ));
        let err = ReplaySource::open(f.path()).err().unwrap();
        assert_eq!((err.line, err.column), (3, 1));
        assert!(err.message.contains("time order"), "{err}");
    }
}
