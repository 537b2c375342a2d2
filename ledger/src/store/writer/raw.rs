//! Raw 1 s rows for `samples_raw`, built column by column for DuckDB's appender on its Arrow path
//! (one columnar chunk per 2,048 rows instead of a call per value; `benches/aggregator.rs`
//! measures both).
//!
//! The columns are Arrow builders (values plus a validity bitmap), sized once for the group: an
//! `Option<f64>` column took 16 bytes a value and grew by reallocation, which the writer's
//! profile showed as copies and page faults (docs/perf/writer.md, "The writer's own work, and what
//! bounds the live path").

use std::sync::Arc;

use duckdb::arrow::array::{
    ArrayBuilder, ArrayRef, Float64Builder, Int32Builder, Int64Builder, RecordBatch, UInt64Builder,
};
use duckdb::arrow::datatypes::{DataType, Field, Schema};
use gpuledger_schema::wire::Series;

/// Raw rows in `samples_raw`'s column order, built column-wise for the appender's Arrow path.
#[derive(Debug, Default)]
pub struct RawColumns {
    ts: Int64Builder,
    instance_id: Int32Builder,
    holder_id: Int32Builder,
    ratios: [Float64Builder; 4],
    bytes: [UInt64Builder; 4],
}

impl RawColumns {
    /// Room for `rows` rows without reallocating.
    pub fn with_capacity(rows: usize) -> Self {
        RawColumns {
            ts: Int64Builder::with_capacity(rows),
            instance_id: Int32Builder::with_capacity(rows),
            holder_id: Int32Builder::with_capacity(rows),
            ratios: std::array::from_fn(|_| Float64Builder::with_capacity(rows)),
            bytes: std::array::from_fn(|_| UInt64Builder::with_capacity(rows)),
        }
    }

    /// Adds the `j`th second of `s` as held by `instance_id`/`holder_id`.
    pub fn push(&mut self, s: &Series, j: usize, instance_id: i32, holder_id: i32) {
        fn at<T: Copy>(col: &Option<Vec<Option<T>>>, j: usize) -> Option<T> {
            col.as_ref().and_then(|c| c.get(j).copied().flatten())
        }
        self.ts.append_value(s.t[j]);
        self.instance_id.append_value(instance_id);
        self.holder_id.append_value(holder_id);
        for (out, col) in self.ratios.iter_mut().zip([
            &s.sm_active,
            &s.sm_occupancy,
            &s.tensor_active,
            &s.dram_active,
        ]) {
            out.append_option(at(col, j));
        }
        for (out, col) in self.bytes.iter_mut().zip([
            &s.fb_used_bytes,
            &s.fb_total_bytes,
            &s.nvlink_tx_bytes,
            &s.nvlink_rx_bytes,
        ]) {
            out.append_option(at(col, j));
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.ts.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.ts.len() == 0
    }

    /// The rows as an Arrow record batch.
    pub fn into_record_batch(mut self) -> duckdb::Result<RecordBatch> {
        let f64s = |name: &str| Field::new(name, DataType::Float64, true);
        let u64s = |name: &str| Field::new(name, DataType::UInt64, true);
        let schema = Schema::new(vec![
            Field::new("ts", DataType::Int64, false),
            Field::new("instance_id", DataType::Int32, false),
            Field::new("holder_id", DataType::Int32, false),
            f64s("sm_active"),
            f64s("sm_occupancy"),
            f64s("tensor_active"),
            f64s("dram_active"),
            u64s("fb_used_bytes"),
            u64s("fb_total_bytes"),
            u64s("nvlink_tx_bytes"),
            u64s("nvlink_rx_bytes"),
        ]);
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.ts.finish()),
            Arc::new(self.instance_id.finish()),
            Arc::new(self.holder_id.finish()),
        ];
        for b in &mut self.ratios {
            columns.push(Arc::new(b.finish()));
        }
        for b in &mut self.bytes {
            columns.push(Arc::new(b.finish()));
        }
        RecordBatch::try_new(Arc::new(schema), columns)
            .map_err(|e| duckdb::Error::ToSqlConversionFailure(Box::new(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_columns_follow_samples_raw_and_keep_missing_values_null() {
        let instance = gpuledger_schema::Instance {
            node: "n1".into(),
            gpu_uuid: "GPU-a".into(),
            gpu_model: "m".into(),
            mig_profile: None,
            gpu_instance_id: None,
            placement_start: None,
            placement_size: None,
        };
        let sample = |t: i64, sm: Option<f64>| gpuledger_schema::Sample {
            timestamp: t,
            instance: instance.clone(),
            attribution: Default::default(),
            counters: gpuledger_schema::Counters {
                sm_active: sm,
                ..Default::default()
            },
        };
        let batch = gpuledger_schema::wire::Batch::from_samples(
            "n1",
            &[sample(10, Some(0.5)), sample(11, None)],
        );
        let mut cols = RawColumns::default();
        cols.push(&batch.series[0], 0, 3, 4);
        cols.push(&batch.series[0], 1, 3, 4);
        assert_eq!(cols.len(), 2);
        let rb = cols.into_record_batch().unwrap();
        assert_eq!(rb.num_rows(), 2);
        assert_eq!(rb.num_columns(), 11, "samples_raw's columns");
        assert_eq!(rb.schema().field(3).name(), "sm_active");
        assert_eq!(
            rb.column(3).null_count(),
            1,
            "an unmeasured second stays NULL"
        );
    }
}
