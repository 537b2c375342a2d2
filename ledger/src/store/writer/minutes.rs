//! Minute rows: history written straight into the rollups, for a month that 1 s samples would
//! take hours to load (`gpuledger demo` lays down 30 days this way; see its module).
//!
//! A [`MinuteRow`] stands for the seconds set in its mask, each reading its counters: the writer
//! stores exactly what it would store for those seconds sent one by one (the same minute delta,
//! folded by the same statements into the minute, hour, day, tenant and GPU rollups), except that
//! nothing goes to `samples_raw`. Exactly-once is kept by the minute masks, all or nothing per
//! row: a row none of whose seconds the ledger (or an earlier row of the same job) holds is
//! stored; a row that overlaps is not stored, and its index is returned so that the caller can
//! send that minute's seconds as samples instead, which are deduplicated one by one. Sending the
//! same rows again is therefore a no-op.

use gpuledger_schema::Counters;
use gpuledger_schema::wire::Series;

use super::rollups::{Map, MinuteDelta, covered_masks, fold_gpu_deltas, fold_minute_deltas};
use super::{WriteError, WriterThread};
use crate::store::StoreError;

/// All 60 seconds of a minute.
const FULL: u64 = (1 << 60) - 1;

/// One instance, one holder, one UTC minute.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteRow {
    /// Index into [`MinuteBatch::entries`]: the instance and its holder.
    pub entry: usize,
    /// The minute's first second (a multiple of 60).
    pub bucket: i64,
    /// Bit `s` set: second `bucket + s` is covered (bits 0–59).
    pub mask: u64,
    /// What each covered second reads.
    pub counters: Counters,
}

/// Minute rows and the instances and holders they name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MinuteBatch {
    /// Instance and holder descriptions (a series whose `t` is empty).
    pub entries: Vec<Series>,
    /// The rows.
    pub rows: Vec<MinuteRow>,
}

/// What became of a [`MinuteBatch`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MinutesOutcome {
    /// Rows stored.
    pub stored_rows: usize,
    /// Instance-seconds they cover.
    pub stored_seconds: u64,
    /// Rows not stored because the ledger already held some of their seconds, by index.
    pub overlapping: Vec<usize>,
}

impl MinuteDelta {
    /// Adds the seconds of `mask`, each reading `c`: the same as adding them one at a time.
    fn add_seconds(&mut self, mask: u64, c: &Counters) -> Result<(), &'static str> {
        let n = mask.count_ones();
        fn sum(
            to: &mut u64,
            v: Option<u64>,
            n: u32,
            field: &'static str,
        ) -> Result<(), &'static str> {
            let add = v.unwrap_or(0).checked_mul(u64::from(n)).ok_or(field)?;
            *to = to.checked_add(add).ok_or(field)?;
            Ok(())
        }
        sum(&mut self.fb_used_sum, c.fb_used_bytes, n, "fb_used_bytes")?;
        sum(&mut self.tx_sum, c.nvlink_tx_bytes, n, "nvlink_tx_bytes")?;
        sum(&mut self.rx_sum, c.nvlink_rx_bytes, n, "nvlink_rx_bytes")?;
        self.mask |= mask;
        self.samples += n as i32;
        self.sm.add_n(c.sm_active, n);
        self.occupancy.add_n(c.sm_occupancy, n);
        self.tensor.add_n(c.tensor_active, n);
        self.dram.add_n(c.dram_active, n);
        if let Some(b) = c.fb_used_bytes {
            self.fb_used_samples += n as i32;
            self.fb_used_max = Some(self.fb_used_max.map_or(b, |m| m.max(b)));
        }
        if let Some(b) = c.fb_total_bytes {
            self.fb_total_max = Some(self.fb_total_max.map_or(b, |m| m.max(b)));
        }
        Ok(())
    }
}

/// A row the writer refuses, naming its field.
fn check(i: usize, row: &MinuteRow, entries: usize) -> Result<(), WriteError> {
    let reject = |field: &str, message: &str| WriteError::Rejected {
        field: format!("rows[{i}].{field}"),
        message: message.to_owned(),
    };
    if row.entry >= entries {
        return Err(reject("entry", "names no entry of the batch"));
    }
    if row.bucket.rem_euclid(60) != 0 {
        return Err(reject("bucket", "is not the first second of a minute"));
    }
    if row.mask == 0 || row.mask & !FULL != 0 {
        return Err(reject("mask", "must set some of bits 0–59 and no other"));
    }
    for (name, v) in [
        ("sm_active", row.counters.sm_active),
        ("sm_occupancy", row.counters.sm_occupancy),
        ("tensor_active", row.counters.tensor_active),
        ("dram_active", row.counters.dram_active),
    ] {
        if v.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
            return Err(reject(
                &format!("counters.{name}"),
                "must be between 0 and 1",
            ));
        }
    }
    Ok(())
}

impl WriterThread {
    /// Writes one minute batch in one transaction.
    pub(super) fn write_minutes(
        &mut self,
        batch: &MinuteBatch,
    ) -> Result<MinutesOutcome, StoreError> {
        let result = self.try_write_minutes(batch);
        if result.is_err() {
            self.reload_dims();
        }
        result.map_err(|e| match e {
            WriteError::Rejected { field, message } => StoreError::Rejected { field, message },
            WriteError::Db(e) => StoreError::from_db(e),
        })
    }

    fn try_write_minutes(&mut self, batch: &MinuteBatch) -> Result<MinutesOutcome, WriteError> {
        for (i, row) in batch.rows.iter().enumerate() {
            check(i, row, batch.entries.len())?;
        }
        let tx = self.conn.transaction()?;
        let mut ids = Vec::with_capacity(batch.entries.len());
        for (j, s) in batch.entries.iter().enumerate() {
            let iid = self
                .dims
                .instance_id(s, self.bounds, || format!("entries[{j}]"))?;
            ids.push((iid, self.dims.holder_id(s)));
        }
        self.dims.flush(&tx)?;
        let mut outcome = MinutesOutcome::default();
        if batch.rows.is_empty() {
            tx.commit()?;
            return Ok(outcome);
        }
        // The seconds already held, for every instance of the GPUs named and the minutes spanned.
        let (mut lo_t, mut hi_t, mut lo_i, mut hi_i) = (i64::MAX, i64::MIN, i32::MAX, i32::MIN);
        for row in &batch.rows {
            let (iid, _) = ids[row.entry];
            lo_t = lo_t.min(row.bucket);
            hi_t = hi_t.max(row.bucket + 59);
            for &m in &self.dims.gpu_members[self.dims.gpu_of[&iid]] {
                lo_i = lo_i.min(m);
                hi_i = hi_i.max(m);
            }
        }
        let mut covered = covered_masks(&tx, lo_t, hi_t, lo_i, hi_i)?;
        let mut gpu_seen = self.dims.gpu_seen(&covered, 0);
        let mut deltas: Map<(i32, i32, i64), MinuteDelta> = Map::default();
        let mut gpu_deltas: Map<(i32, i64), (i64, i64)> = Map::default();
        let mut newest = None;
        for (i, row) in batch.rows.iter().enumerate() {
            let (iid, hid) = ids[row.entry];
            let seen = covered.entry((iid, row.bucket)).or_insert(0);
            if *seen & row.mask != 0 {
                outcome.overlapping.push(i);
                continue;
            }
            *seen |= row.mask;
            let gpu = gpu_seen
                .entry((self.dims.gpu_of[&iid], row.bucket))
                .or_insert(0);
            let observed = (row.mask & !*gpu).count_ones();
            *gpu |= row.mask;
            let counts = gpu_deltas
                .entry((iid, row.bucket - row.bucket.rem_euclid(3600)))
                .or_insert((0, 0));
            counts.0 += i64::from(observed);
            counts.1 += i64::from(row.mask.count_ones());
            deltas
                .entry((iid, hid, row.bucket))
                .or_default()
                .add_seconds(row.mask, &row.counters)
                .map_err(|field| WriteError::Rejected {
                    field: format!("rows[{i}].counters.{field}"),
                    message: "the minute's sum of this counter leaves 64 bits".into(),
                })?;
            outcome.stored_rows += 1;
            outcome.stored_seconds += u64::from(row.mask.count_ones());
            newest = newest.max(Some(row.bucket + 63 - i64::from(row.mask.leading_zeros())));
        }
        fold_minute_deltas(&tx, &deltas)?;
        fold_gpu_deltas(&tx, &gpu_deltas)?;
        tx.commit()?;
        if let Some(newest) = newest {
            self.observer.newest_sample(newest);
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(sm: f64) -> Counters {
        Counters {
            sm_active: Some(sm),
            fb_used_bytes: Some(1 << 30),
            nvlink_tx_bytes: Some(7),
            ..Counters::default()
        }
    }

    #[test]
    fn a_row_adds_what_its_seconds_one_by_one_would() {
        let mask = 0b1011u64 << 20;
        let mut whole = MinuteDelta::default();
        whole.add_seconds(mask, &counters(0.25)).unwrap();
        let mut one_by_one = MinuteDelta::default();
        for s in 0..60 {
            if mask & (1 << s) != 0 {
                one_by_one.add(1 << s, &counters(0.25)).unwrap();
            }
        }
        assert_eq!(whole.mask, one_by_one.mask);
        assert_eq!(whole.samples, 3);
        assert_eq!(whole.samples, one_by_one.samples);
        assert_eq!(whole.sm.n, one_by_one.sm.n);
        assert_eq!(whole.sm.sum, one_by_one.sm.sum);
        assert_eq!(whole.sm.min, one_by_one.sm.min);
        assert_eq!(whole.fb_used_sum, one_by_one.fb_used_sum);
        assert_eq!(whole.tx_sum, 21);
        assert_eq!(
            whole.occupancy.n, 0,
            "a counter not measured stays unmeasured"
        );
    }

    #[test]
    fn rows_that_cannot_be_minutes_are_refused_by_field() {
        let row = |bucket, mask| MinuteRow {
            entry: 0,
            bucket,
            mask,
            counters: counters(0.5),
        };
        let field = |r: Result<(), WriteError>| match r {
            Err(WriteError::Rejected { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert!(check(0, &row(120, FULL), 1).is_ok());
        assert_eq!(field(check(3, &row(121, FULL), 1)), "rows[3].bucket");
        assert_eq!(field(check(0, &row(120, 0), 1)), "rows[0].mask");
        assert_eq!(field(check(0, &row(120, 1 << 60), 1)), "rows[0].mask");
        assert_eq!(field(check(0, &row(120, 1), 0)), "rows[0].entry");
        let mut busy = row(120, 1);
        busy.counters.sm_active = Some(1.5);
        assert_eq!(field(check(0, &busy, 1)), "rows[0].counters.sm_active");
    }
}
