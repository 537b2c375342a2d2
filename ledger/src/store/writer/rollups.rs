//! The rollups' arithmetic: the per-(instance, holder, minute) deltas the writer sums from fresh
//! samples (or takes whole from minute rows), and the fixed SQL that folds them into the minute,
//! hour, day, tenant and GPU rollups and the shares. No input reaches the SQL text: it is built
//! once from constant parts, and the deltas travel through appenders into scratch tables.

use std::sync::Arc;

use duckdb::arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, UInt64Array};
use duckdb::{Connection, params};

use crate::store::append_columns;

/// The writer's per-group maps, keyed by ids and Unix seconds: FxHash, several times cheaper than
/// SipHash on small integer keys. (A sender chooses only its timestamps, whose buckets the time
/// window bounds; ids are assigned here.)
pub(super) type Map<K, V> = rustc_hash::FxHashMap<K, V>;

/// How an existing rollup row absorbs a delta row `d`.
pub(super) const ROLLUP_MERGE: &str = "
    samples = r.samples + d.samples,
    sm_active_samples = r.sm_active_samples + d.sm_active_samples,
    sm_active_sum = r.sm_active_sum + d.sm_active_sum,
    sm_active_min = least(r.sm_active_min, d.sm_active_min),
    sm_active_max = greatest(r.sm_active_max, d.sm_active_max),
    sm_occupancy_samples = r.sm_occupancy_samples + d.sm_occupancy_samples,
    sm_occupancy_sum = r.sm_occupancy_sum + d.sm_occupancy_sum,
    tensor_active_samples = r.tensor_active_samples + d.tensor_active_samples,
    tensor_active_sum = r.tensor_active_sum + d.tensor_active_sum,
    dram_active_samples = r.dram_active_samples + d.dram_active_samples,
    dram_active_sum = r.dram_active_sum + d.dram_active_sum,
    fb_used_samples = r.fb_used_samples + d.fb_used_samples,
    fb_used_bytes_sum = r.fb_used_bytes_sum + d.fb_used_bytes_sum,
    fb_used_bytes_max = greatest(r.fb_used_bytes_max, d.fb_used_bytes_max),
    fb_total_bytes_max = greatest(r.fb_total_bytes_max, d.fb_total_bytes_max),
    nvlink_tx_bytes_sum = r.nvlink_tx_bytes_sum + d.nvlink_tx_bytes_sum,
    nvlink_rx_bytes_sum = r.nvlink_rx_bytes_sum + d.nvlink_rx_bytes_sum";

/// The hour deltas, derived from the minute deltas.
pub(super) const DELTA_1H: &str = "
    SELECT bucket - bucket % 3600 AS bucket, instance_id, holder_id,
           sum(samples)::INTEGER AS samples,
           sum(sm_active_samples)::INTEGER AS sm_active_samples,
           sum(sm_active_sum) AS sm_active_sum,
           min(sm_active_min) AS sm_active_min,
           max(sm_active_max) AS sm_active_max,
           sum(sm_occupancy_samples)::INTEGER AS sm_occupancy_samples,
           sum(sm_occupancy_sum) AS sm_occupancy_sum,
           sum(tensor_active_samples)::INTEGER AS tensor_active_samples,
           sum(tensor_active_sum) AS tensor_active_sum,
           sum(dram_active_samples)::INTEGER AS dram_active_samples,
           sum(dram_active_sum) AS dram_active_sum,
           sum(fb_used_samples)::INTEGER AS fb_used_samples,
           sum(fb_used_bytes_sum)::UBIGINT AS fb_used_bytes_sum,
           max(fb_used_bytes_max) AS fb_used_bytes_max,
           max(fb_total_bytes_max) AS fb_total_bytes_max,
           sum(nvlink_tx_bytes_sum)::UBIGINT AS nvlink_tx_bytes_sum,
           sum(nvlink_rx_bytes_sum)::UBIGINT AS nvlink_rx_bytes_sum
    FROM ingest_delta_1m GROUP BY ALL";

/// The per-allocation day deltas, derived from the minute deltas.
pub(super) const DELTA_ALLOC_1D: &str = "
    SELECT bucket - bucket % 86400 AS bucket, instance_id, holder_id,
           sum(samples)::BIGINT AS samples,
           sum(sm_active_samples)::BIGINT AS sm_active_samples,
           sum(sm_active_sum) AS sm_active_sum
    FROM ingest_delta_1m GROUP BY ALL";

/// The tenant deltas, derived from the minute deltas.
pub(super) const DELTA_TENANT: &str = "
    SELECT d.bucket - d.bucket % 3600 AS bucket, h.tenant, h.slo_class, i.gpu_model,
           sum(d.samples)::BIGINT AS samples,
           sum(d.samples * i.gpu_equivalents) AS gpu_seconds,
           sum(d.sm_active_samples * i.gpu_equivalents) AS sm_measured_gpu_seconds,
           sum(d.sm_active_sum * i.gpu_equivalents) AS used_gpu_seconds
    FROM ingest_delta_1m d JOIN instances i USING (instance_id) JOIN holders h USING (holder_id)
    GROUP BY ALL";

/// The statements that fold the group's minute deltas (`ingest_delta_1m`, computed by the writer
/// from the fresh samples) into the three rollups, in order: one MERGE per rollup (update the
/// rows that exist, insert those that do not). Built once from constant parts (no input reaches
/// them). The hour and tenant deltas are derived from the minute deltas, 60 times fewer rows than
/// the samples. Each MERGE matches only target rows inside the group's bucket range, so that it
/// scans only the buckets it can touch.
pub(super) fn rollup_statements() -> &'static [String] {
    static STATEMENTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    STATEMENTS.get_or_init(|| {
        let range = |width: i64| {
            format!(
                "r.bucket BETWEEN (SELECT min(bucket) - min(bucket) % {width} FROM ingest_delta_1m)
                              AND (SELECT max(bucket) FROM ingest_delta_1m)"
            )
        };
        let same_instance_row =
            "r.bucket = d.bucket AND r.instance_id = d.instance_id AND r.holder_id = d.holder_id";
        vec![
            format!(
                "MERGE INTO rollup_1m AS r USING ingest_delta_1m AS d
                 ON {same_instance_row} AND {}
                 WHEN MATCHED THEN UPDATE SET seconds_mask = r.seconds_mask | d.seconds_mask, {ROLLUP_MERGE}
                 WHEN NOT MATCHED THEN INSERT BY NAME",
                range(60)
            ),
            format!(
                "MERGE INTO rollup_1h AS r USING ({DELTA_1H}) AS d
                 ON {same_instance_row} AND {}
                 WHEN MATCHED THEN UPDATE SET {ROLLUP_MERGE}
                 WHEN NOT MATCHED THEN INSERT BY NAME",
                range(3600)
            ),
            format!(
                "MERGE INTO rollup_alloc_1d AS r USING ({DELTA_ALLOC_1D}) AS d
                 ON {same_instance_row} AND {}
                 WHEN MATCHED THEN UPDATE SET
                    samples = r.samples + d.samples,
                    sm_active_samples = r.sm_active_samples + d.sm_active_samples,
                    sm_active_sum = r.sm_active_sum + d.sm_active_sum
                 WHEN NOT MATCHED THEN INSERT BY NAME",
                range(86400)
            ),
            format!(
                "MERGE INTO rollup_tenant_1h AS r USING ({DELTA_TENANT}) AS d
                 ON r.bucket = d.bucket AND r.tenant IS NOT DISTINCT FROM d.tenant
                    AND r.slo_class IS NOT DISTINCT FROM d.slo_class AND r.gpu_model = d.gpu_model
                    AND {}
                 WHEN MATCHED THEN UPDATE SET
                    samples = r.samples + d.samples,
                    gpu_seconds = r.gpu_seconds + d.gpu_seconds,
                    sm_measured_gpu_seconds = r.sm_measured_gpu_seconds + d.sm_measured_gpu_seconds,
                    used_gpu_seconds = r.used_gpu_seconds + d.used_gpu_seconds
                 WHEN NOT MATCHED THEN INSERT BY NAME",
                range(3600)
            ),
            "DELETE FROM ingest_delta_1m".into(),
        ]
    })
}

/// Folds the group's newly observed GPU-seconds (`ingest_delta_gpu_1h`, per instance that brought
/// them) into the per-GPU hourly capacity rollup, and notes each GPU-hour it changed in
/// `gpu_hours_changed` for the analytics (migration 0009).
pub(super) const GPU_ROLLUP: &str = "
MERGE INTO rollup_gpu_1h AS r USING (
    SELECT d.bucket, i.node, i.gpu_uuid, i.gpu_model, sum(d.observed_seconds)::BIGINT AS observed_seconds,
           sum(d.instance_seconds)::BIGINT AS instance_seconds
    FROM ingest_delta_gpu_1h d JOIN instances i USING (instance_id)
    GROUP BY ALL
) AS d
ON r.bucket = d.bucket AND r.gpu_uuid = d.gpu_uuid AND r.node = d.node AND r.gpu_model = d.gpu_model
   AND r.bucket BETWEEN (SELECT min(bucket) FROM ingest_delta_gpu_1h)
                    AND (SELECT max(bucket) FROM ingest_delta_gpu_1h)
WHEN MATCHED THEN UPDATE SET observed_seconds = r.observed_seconds + d.observed_seconds,
                             instance_seconds = r.instance_seconds + d.instance_seconds
WHEN NOT MATCHED THEN INSERT BY NAME;
INSERT INTO gpu_hours_changed
SELECT nextval('gpu_hours_changed_seq'), bucket, node, gpu_uuid, gpu_model FROM (
    SELECT DISTINCT d.bucket, i.node, i.gpu_uuid, i.gpu_model
    FROM ingest_delta_gpu_1h d JOIN instances i USING (instance_id)
);
DELETE FROM ingest_delta_gpu_1h;";

/// Folds the group's shares (`ingest_shares`) into `shares_raw` and `rollup_share_1h`: a share
/// already stored, or repeated within the group, counts once.
pub(super) const SHARES_ROLLUP: &str = "
DELETE FROM ingest_shares s USING shares_raw r
WHERE r.ts = s.ts AND r.instance_id = s.instance_id AND r.holder_id = s.holder_id
  AND r.ts BETWEEN (SELECT min(ts) FROM ingest_shares) AND (SELECT max(ts) FROM ingest_shares);
CREATE OR REPLACE TEMP TABLE new_shares AS
    SELECT DISTINCT ON (ts, instance_id, holder_id) * FROM ingest_shares;
INSERT INTO shares_raw SELECT * FROM new_shares;
MERGE INTO rollup_share_1h AS r USING (
    SELECT ts - ts % 3600 AS bucket, instance_id, holder_id,
           count(*)::BIGINT AS seconds,
           sum(processes)::BIGINT AS process_seconds,
           count(memory_used_bytes)::BIGINT AS memory_samples,
           coalesce(sum(memory_used_bytes), 0)::HUGEINT AS memory_byte_seconds,
           count(sm_active)::BIGINT AS sm_active_samples,
           coalesce(sum(sm_active), 0) AS sm_active_sum
    FROM new_shares GROUP BY ALL
) AS d
ON r.bucket = d.bucket AND r.instance_id = d.instance_id AND r.holder_id = d.holder_id
WHEN MATCHED THEN UPDATE SET seconds = r.seconds + d.seconds,
                             process_seconds = r.process_seconds + d.process_seconds,
                             memory_samples = r.memory_samples + d.memory_samples,
                             memory_byte_seconds = r.memory_byte_seconds + d.memory_byte_seconds,
                             sm_active_samples = r.sm_active_samples + d.sm_active_samples,
                             sm_active_sum = r.sm_active_sum + d.sm_active_sum
WHEN NOT MATCHED THEN INSERT BY NAME;
DROP TABLE new_shares;
DELETE FROM ingest_shares;";

/// The seconds of each (instance, minute) already in the ledger, for the instance ids and bucket
/// range of one group.
pub(super) const COVERED_MASKS: &str = "
SELECT instance_id, bucket, bit_or(seconds_mask)
FROM rollup_1m
WHERE bucket BETWEEN ? AND ? AND instance_id BETWEEN ? AND ?
GROUP BY ALL";

/// One (instance, holder, minute) of the group's fresh samples, summed as the rollups keep it.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct MinuteDelta {
    pub(super) mask: u64,
    pub(super) samples: i32,
    pub(super) sm: Stat,
    pub(super) occupancy: Stat,
    pub(super) tensor: Stat,
    pub(super) dram: Stat,
    pub(super) fb_used_samples: i32,
    pub(super) fb_used_sum: u64,
    pub(super) fb_used_max: Option<u64>,
    pub(super) fb_total_max: Option<u64>,
    pub(super) tx_sum: u64,
    pub(super) rx_sum: u64,
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Stat {
    pub(super) n: i32,
    pub(super) sum: f64,
    pub(super) min: Option<f64>,
    pub(super) max: Option<f64>,
}

impl Stat {
    /// `n` seconds that each read `v`.
    pub(super) fn add_n(&mut self, v: Option<f64>, n: u32) {
        if let Some(v) = v
            && n > 0
        {
            self.n += n as i32;
            self.sum += v * f64::from(n);
            self.min = Some(self.min.map_or(v, |m| m.min(v)));
            self.max = Some(self.max.map_or(v, |m| m.max(v)));
        }
    }

    pub(super) fn add(&mut self, v: Option<f64>) {
        if let Some(v) = v {
            self.n += 1;
            self.sum += v;
            self.min = Some(self.min.map_or(v, |m| m.min(v)));
            self.max = Some(self.max.map_or(v, |m| m.max(v)));
        }
    }
}

impl MinuteDelta {
    /// Adds one second. A sum that would leave 64 bits is an error naming the counter (validation
    /// bounds make it impossible; this keeps it so whatever reaches the writer).
    pub(super) fn add(
        &mut self,
        bit: u64,
        c: &gpuledger_schema::Counters,
    ) -> Result<(), &'static str> {
        fn sum(to: &mut u64, v: Option<u64>, field: &'static str) -> Result<(), &'static str> {
            *to = to.checked_add(v.unwrap_or(0)).ok_or(field)?;
            Ok(())
        }
        sum(&mut self.fb_used_sum, c.fb_used_bytes, "fb_used_bytes")?;
        sum(&mut self.tx_sum, c.nvlink_tx_bytes, "nvlink_tx_bytes")?;
        sum(&mut self.rx_sum, c.nvlink_rx_bytes, "nvlink_rx_bytes")?;
        self.mask |= bit;
        self.samples += 1;
        self.sm.add(c.sm_active);
        self.occupancy.add(c.sm_occupancy);
        self.tensor.add(c.tensor_active);
        self.dram.add(c.dram_active);
        if let Some(b) = c.fb_used_bytes {
            self.fb_used_samples += 1;
            self.fb_used_max = Some(self.fb_used_max.map_or(b, |m| m.max(b)));
        }
        if let Some(b) = c.fb_total_bytes {
            self.fb_total_max = Some(self.fb_total_max.map_or(b, |m| m.max(b)));
        }
        Ok(())
    }
}

impl Stat {
    /// Takes in `o`'s seconds (the same minute's other seconds).
    fn merge(&mut self, o: &Stat) {
        self.n += o.n;
        self.sum += o.sum;
        self.min = match (self.min, o.min) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.max = match (self.max, o.max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

impl MinuteDelta {
    /// Takes in `o`, the same (instance, holder, minute)'s delta for other seconds: the result is
    /// what adding both deltas' seconds one by one gives. A sum that would leave 64 bits is an
    /// error naming the counter, as in [`MinuteDelta::add`].
    pub(super) fn merge(&mut self, o: &MinuteDelta) -> Result<(), &'static str> {
        fn sum(to: &mut u64, v: u64, field: &'static str) -> Result<(), &'static str> {
            *to = to.checked_add(v).ok_or(field)?;
            Ok(())
        }
        sum(&mut self.fb_used_sum, o.fb_used_sum, "fb_used_bytes")?;
        sum(&mut self.tx_sum, o.tx_sum, "nvlink_tx_bytes")?;
        sum(&mut self.rx_sum, o.rx_sum, "nvlink_rx_bytes")?;
        self.mask |= o.mask;
        self.samples += o.samples;
        self.sm.merge(&o.sm);
        self.occupancy.merge(&o.occupancy);
        self.tensor.merge(&o.tensor);
        self.dram.merge(&o.dram);
        self.fb_used_samples += o.fb_used_samples;
        self.fb_used_max = self.fb_used_max.max(o.fb_used_max);
        self.fb_total_max = self.fb_total_max.max(o.fb_total_max);
        Ok(())
    }
}

/// Adds (observed GPU-seconds, instance-seconds) of one instance-hour to the group's GPU deltas.
pub(super) fn add_gpu_counts(
    deltas: &mut Map<(i32, i64), (i64, i64)>,
    key: (i32, i64),
    counts: (i64, i64),
) {
    if counts.1 > 0 {
        let d = deltas.entry(key).or_insert((0, 0));
        d.0 += counts.0;
        d.1 += counts.1;
    }
}

/// The minute of a second, as (bucket start, second within it).
pub(super) fn minute_of(ts: i64) -> (i64, u32) {
    let bucket = ts.div_euclid(60) * 60;
    (bucket, (ts - bucket) as u32)
}

/// The seconds of each (instance, minute) already in the ledger, for instance ids `lo_i..=hi_i`
/// and the minutes from `lo_bucket` to `hi_t`.
pub(super) fn covered_masks(
    tx: &Connection,
    lo_bucket: i64,
    hi_t: i64,
    lo_i: i32,
    hi_i: i32,
) -> duckdb::Result<Map<(i32, i64), u64>> {
    let mut covered = Map::default();
    let mut stmt = tx.prepare_cached(COVERED_MASKS)?;
    let rows = stmt.query_map(params![lo_bucket, hi_t, lo_i, hi_i], |r| {
        Ok((
            (r.get::<_, i32>(0)?, r.get::<_, i64>(1)?),
            r.get::<_, u64>(2)?,
        ))
    })?;
    for row in rows {
        let (key, mask) = row?;
        covered.insert(key, mask);
    }
    Ok(covered)
}

/// Appends the minute deltas (per instance, holder, minute) to `ingest_delta_1m` and folds them
/// into the minute, hour, day and tenant rollups.
pub(super) fn fold_minute_deltas(
    tx: &Connection,
    deltas: &Map<(i32, i32, i64), MinuteDelta>,
) -> duckdb::Result<()> {
    fold_delta_rows(tx, deltas.len(), deltas.iter().map(|(&k, &d)| (k, d)))
}

/// [`fold_minute_deltas`] of rows given one by one, each (instance, holder, minute) once, at most
/// `n` of them (the columns are sized for `n`): a caller holding deltas in two maps folds them
/// without building a third.
pub(super) fn fold_delta_rows(
    tx: &Connection,
    n: usize,
    rows: impl Iterator<Item = ((i32, i32, i64), MinuteDelta)>,
) -> duckdb::Result<()> {
    if n == 0 {
        return Ok(());
    }
    // The Arrow path: one columnar chunk per 2,048 rows, not a call per value (a group of 1,000
    // live batches brings ~20,000 rows, too many for the writer's thread to append row by row).
    append_columns(tx, "ingest_delta_1m", delta_columns(n, rows))?;
    for sql in rollup_statements() {
        tx.execute(sql, [])?;
    }
    Ok(())
}

/// The minute delta rows, about `n` of them, as Arrow columns in `ingest_delta_1m`'s
/// (`rollup_1m`'s) column order.
fn delta_columns(
    n: usize,
    rows: impl Iterator<Item = ((i32, i32, i64), MinuteDelta)>,
) -> Vec<(&'static str, ArrayRef)> {
    let mut keys = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut mask = Vec::with_capacity(n);
    let mut counts: [Vec<i32>; 6] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut sums: [Vec<f64>; 4] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut sm_range = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut bytes: [Vec<u64>; 3] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut bytes_max = (Vec::with_capacity(n), Vec::with_capacity(n));
    for ((iid, hid, bucket), d) in rows {
        keys.0.push(bucket);
        keys.1.push(iid);
        keys.2.push(hid);
        mask.push(d.mask);
        for (col, v) in counts.iter_mut().zip([
            d.samples,
            d.sm.n,
            d.occupancy.n,
            d.tensor.n,
            d.dram.n,
            d.fb_used_samples,
        ]) {
            col.push(v);
        }
        for (col, v) in sums
            .iter_mut()
            .zip([d.sm.sum, d.occupancy.sum, d.tensor.sum, d.dram.sum])
        {
            col.push(v);
        }
        sm_range.0.push(d.sm.min);
        sm_range.1.push(d.sm.max);
        for (col, v) in bytes.iter_mut().zip([d.fb_used_sum, d.tx_sum, d.rx_sum]) {
            col.push(v);
        }
        bytes_max.0.push(d.fb_used_max);
        bytes_max.1.push(d.fb_total_max);
    }
    let [samples, sm_n, occ_n, tensor_n, dram_n, fb_n] = counts;
    let [sm_sum, occ_sum, tensor_sum, dram_sum] = sums;
    let [fb_sum, tx_sum, rx_sum] = bytes;
    let i32s = |v: Vec<i32>| Arc::new(Int32Array::from(v)) as ArrayRef;
    let f64s = |v: Vec<f64>| Arc::new(Float64Array::from(v)) as ArrayRef;
    let u64s = |v: Vec<u64>| Arc::new(UInt64Array::from(v)) as ArrayRef;
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("bucket", Arc::new(Int64Array::from(keys.0))),
        ("instance_id", i32s(keys.1)),
        ("holder_id", i32s(keys.2)),
        ("seconds_mask", u64s(mask)),
        ("samples", i32s(samples)),
        ("sm_active_samples", i32s(sm_n)),
        ("sm_active_sum", f64s(sm_sum)),
        ("sm_active_min", Arc::new(Float64Array::from(sm_range.0))),
        ("sm_active_max", Arc::new(Float64Array::from(sm_range.1))),
        ("sm_occupancy_samples", i32s(occ_n)),
        ("sm_occupancy_sum", f64s(occ_sum)),
        ("tensor_active_samples", i32s(tensor_n)),
        ("tensor_active_sum", f64s(tensor_sum)),
        ("dram_active_samples", i32s(dram_n)),
        ("dram_active_sum", f64s(dram_sum)),
        ("fb_used_samples", i32s(fb_n)),
        ("fb_used_bytes_sum", u64s(fb_sum)),
        (
            "fb_used_bytes_max",
            Arc::new(UInt64Array::from(bytes_max.0)),
        ),
        (
            "fb_total_bytes_max",
            Arc::new(UInt64Array::from(bytes_max.1)),
        ),
        ("nvlink_tx_bytes_sum", u64s(tx_sum)),
        ("nvlink_rx_bytes_sum", u64s(rx_sum)),
    ];
    columns
}

/// Appends the GPU deltas (per instance that brought them, per hour: observed seconds,
/// instance-seconds) and folds them into `rollup_gpu_1h`.
pub(super) fn fold_gpu_deltas(
    tx: &Connection,
    gpu_deltas: &Map<(i32, i64), (i64, i64)>,
) -> duckdb::Result<()> {
    if gpu_deltas.is_empty() {
        return Ok(());
    }
    // One row per instance and hour: a fold of what 70,000 instances sent is 70,000 rows, so they
    // are appended as columns, not a row at a time (docs/perf/analytics.md, "The writer's share
    // of an evaluation").
    let n = gpu_deltas.len();
    let (mut buckets, mut iids) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut observed, mut instance) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (&(iid, bucket), &(o, i)) in gpu_deltas {
        buckets.push(bucket);
        iids.push(iid);
        observed.push(o);
        instance.push(i);
    }
    let i64s = |v: Vec<i64>| Arc::new(Int64Array::from(v)) as ArrayRef;
    append_columns(
        tx,
        "ingest_delta_gpu_1h",
        vec![
            ("bucket", i64s(buckets)),
            ("instance_id", Arc::new(Int32Array::from(iids))),
            ("observed_seconds", i64s(observed)),
            ("instance_seconds", i64s(instance)),
        ],
    )?;
    tx.execute_batch(GPU_ROLLUP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_delta_sums_what_was_measured_and_names_an_overflowing_counter() {
        let mut d = MinuteDelta::default();
        let c = |sm: Option<f64>, tx: u64| gpuledger_schema::Counters {
            sm_active: sm,
            nvlink_tx_bytes: Some(tx),
            ..Default::default()
        };
        d.add(1 << 3, &c(Some(0.5), 10)).unwrap();
        d.add(1 << 4, &c(None, 20)).unwrap();
        d.add(1 << 5, &c(Some(0.1), 30)).unwrap();
        assert_eq!((d.mask, d.samples), (0b111000, 3));
        assert_eq!((d.sm.n, d.sm.min, d.sm.max), (2, Some(0.1), Some(0.5)));
        assert!((d.sm.sum - 0.6).abs() < 1e-12);
        assert_eq!(d.tx_sum, 60);
        assert_eq!(d.add(1 << 6, &c(None, u64::MAX)), Err("nvlink_tx_bytes"));
    }

    #[test]
    fn merged_deltas_equal_their_seconds_added_one_by_one() {
        let c = |sm: Option<f64>, fb: Option<u64>, tx: u64| gpuledger_schema::Counters {
            sm_active: sm,
            fb_used_bytes: fb,
            nvlink_tx_bytes: Some(tx),
            ..Default::default()
        };
        let seconds = [
            (1u64 << 0, c(Some(0.5), None, 10)),
            (1 << 7, c(None, Some(300), 20)),
            (1 << 9, c(Some(0.25), Some(100), 30)),
            (1 << 40, c(Some(0.75), None, 40)),
        ];
        let mut whole = MinuteDelta::default();
        for (bit, s) in &seconds {
            whole.add(*bit, s).unwrap();
        }
        for split in 0..=seconds.len() {
            let (mut a, mut b) = (MinuteDelta::default(), MinuteDelta::default());
            for (bit, s) in &seconds[..split] {
                a.add(*bit, s).unwrap();
            }
            for (bit, s) in &seconds[split..] {
                b.add(*bit, s).unwrap();
            }
            a.merge(&b).unwrap();
            assert_eq!(format!("{a:?}"), format!("{whole:?}"), "split at {split}");
        }
        let mut full = MinuteDelta {
            tx_sum: u64::MAX,
            ..Default::default()
        };
        assert_eq!(full.merge(&whole), Err("nvlink_tx_bytes"));
    }

    #[test]
    fn a_second_is_placed_in_its_minute() {
        assert_eq!(minute_of(120), (120, 0));
        assert_eq!(minute_of(179), (120, 59));
        assert_eq!(minute_of(-1), (-60, 59));
    }
}
