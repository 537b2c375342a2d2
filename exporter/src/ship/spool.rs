//! The bounded on-disk queue of sealed batches.
//!
//! Every sealed batch is written here before it is sent (write-ahead), so a crash or restart
//! loses at most the seconds not yet sealed into a batch. Files are named
//! `<sequence>-<batch id>.batch` (the gzip body, ready to POST); the sequence gives the send
//! order across restarts. A file is written under a temporary name, fsynced, then renamed, so a
//! crash never leaves a half batch under a real name. When the spool exceeds its byte bound, the
//! oldest batch is deleted to make room (the caller counts and logs it). Batches the aggregator
//! refuses as invalid move to `rejected/` for an operator to inspect.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use uuid::Uuid;

/// One spooled batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Send order.
    pub seq: u64,
    /// The batch's id.
    pub batch_id: Uuid,
    /// Its file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Samples in it (recorded in the name so a restart can report them).
    pub samples: u64,
}

/// The spool directory.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    entries: VecDeque<Entry>,
    total_bytes: u64,
    next_seq: u64,
}

fn parse_name(name: &str) -> Option<(u64, Uuid, u64)> {
    let stem = name.strip_suffix(".batch")?;
    let mut parts = stem.splitn(3, '-');
    let seq = parts.next()?.parse().ok()?;
    let samples = parts.next()?.parse().ok()?;
    let id = Uuid::parse_str(parts.next()?).ok()?;
    Some((seq, id, samples))
}

impl Spool {
    /// Opens (creating) `dir` and picks up the batches a previous run left.
    pub fn open(dir: &Path, max_bytes: u64) -> io::Result<Spool> {
        fs::create_dir_all(dir)?;
        let mut entries = Vec::new();
        for item in fs::read_dir(dir)? {
            let item = item?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                // A write interrupted by a crash; its batch was never acknowledged as spooled.
                fs::remove_file(item.path())?;
                continue;
            }
            if let Some((seq, batch_id, samples)) = parse_name(&name) {
                entries.push(Entry {
                    seq,
                    batch_id,
                    path: item.path(),
                    bytes: item.metadata()?.len(),
                    samples,
                });
            }
        }
        entries.sort_by_key(|e| e.seq);
        let next_seq = entries.last().map_or(0, |e| e.seq + 1);
        let total_bytes = entries.iter().map(|e| e.bytes).sum();
        Ok(Spool {
            dir: dir.to_owned(),
            max_bytes,
            entries: entries.into(),
            total_bytes,
            next_seq,
        })
    }

    /// Durably appends a batch body. Returns the entries dropped to stay within the bound
    /// (oldest first); the new batch itself is always kept.
    pub fn push(&mut self, batch_id: Uuid, samples: u64, body: &[u8]) -> io::Result<Vec<Entry>> {
        let seq = self.next_seq;
        let name = format!("{seq:020}-{samples}-{batch_id}.batch");
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        {
            let mut f = File::create(&tmp)?;
            f.write_all(body)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, &path)?;
        File::open(&self.dir)?.sync_all()?;
        self.next_seq += 1;
        self.total_bytes += body.len() as u64;
        self.entries.push_back(Entry {
            seq,
            batch_id,
            path,
            bytes: body.len() as u64,
            samples,
        });
        let mut dropped = Vec::new();
        while self.total_bytes > self.max_bytes && self.entries.len() > 1 {
            let oldest = self.entries.pop_front().expect("more than one entry");
            fs::remove_file(&oldest.path)?;
            self.total_bytes -= oldest.bytes;
            dropped.push(oldest);
        }
        Ok(dropped)
    }

    /// Whether another `bytes` would push the spool over its bound.
    pub fn would_overflow(&self, bytes: u64) -> bool {
        !self.entries.is_empty() && self.total_bytes + bytes > self.max_bytes
    }

    /// The oldest batch and its body.
    pub fn oldest(&self) -> io::Result<Option<(Entry, Vec<u8>)>> {
        match self.entries.front() {
            None => Ok(None),
            Some(e) => Ok(Some((e.clone(), fs::read(&e.path)?))),
        }
    }

    /// Removes a batch the aggregator acknowledged.
    pub fn ack(&mut self, seq: u64) -> io::Result<()> {
        if let Some(pos) = self.entries.iter().position(|e| e.seq == seq) {
            let e = self.entries.remove(pos).expect("position is in range");
            fs::remove_file(&e.path)?;
            self.total_bytes -= e.bytes;
        }
        Ok(())
    }

    /// Moves a batch the aggregator refused as invalid to `rejected/`.
    pub fn reject(&mut self, seq: u64) -> io::Result<PathBuf> {
        let rejected = self.dir.join("rejected");
        fs::create_dir_all(&rejected)?;
        let pos = self
            .entries
            .iter()
            .position(|e| e.seq == seq)
            .ok_or_else(|| io::Error::other("no such spooled batch"))?;
        let e = self.entries.remove(pos).expect("position is in range");
        let to = rejected.join(e.path.file_name().expect("spool files have names"));
        fs::rename(&e.path, &to)?;
        self.total_bytes -= e.bytes;
        Ok(to)
    }

    /// Batches waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes waiting.
    pub fn bytes(&self) -> u64 {
        self.total_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_survive_a_reopen_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
        {
            let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
            for (i, id) in ids.iter().enumerate() {
                s.push(*id, 10, &[i as u8; 100]).unwrap();
            }
            s.ack(0).unwrap();
        }
        std::fs::write(
            dir.path().join("00000000000000000009-1-x.batch.tmp"),
            b"half",
        )
        .unwrap();
        let mut s = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(s.len(), 2);
        let (e, body) = s.oldest().unwrap().unwrap();
        assert_eq!((e.seq, e.batch_id, e.samples, body[0]), (1, ids[1], 10, 1));
        s.push(Uuid::now_v7(), 1, b"new").unwrap();
        assert_eq!(
            s.entries.back().unwrap().seq,
            3,
            "sequence continues after a restart"
        );
        assert!(
            !dir.path()
                .join("00000000000000000009-1-x.batch.tmp")
                .exists()
        );
    }

    #[test]
    fn a_full_spool_drops_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spool::open(dir.path(), 250).unwrap();
        assert!(s.push(Uuid::now_v7(), 1, &[0; 100]).unwrap().is_empty());
        assert!(s.push(Uuid::now_v7(), 1, &[1; 100]).unwrap().is_empty());
        assert!(s.would_overflow(100));
        let dropped = s.push(Uuid::now_v7(), 1, &[2; 100]).unwrap();
        assert_eq!(dropped.iter().map(|e| e.seq).collect::<Vec<_>>(), [0]);
        assert_eq!((s.len(), s.bytes()), (2, 200));
        let rejected = s.reject(1).unwrap();
        assert!(rejected.exists());
        assert_eq!(s.oldest().unwrap().unwrap().0.seq, 2);
    }
}
