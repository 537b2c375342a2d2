//! What the analytics read: the dimension tables once, in memory, and minute rollup rows as
//! plain numbers fetched through DuckDB's Arrow interface (a row-by-row fetch with strings cost
//! ~1 s per 600k rows; see BENCHMARKS.md).

use std::collections::HashMap;

use duckdb::arrow::array::{Array, Float64Array, Int32Array, Int64Array, UInt64Array};
use duckdb::{Connection, Params};
use gpuledger_schema::mig::{self, GpuModel};

/// A GPU as the ledger names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuKey {
    /// Node.
    pub node: String,
    /// UUID.
    pub gpu_uuid: String,
    /// Model name as reported.
    pub gpu_model: String,
}

/// One row of `instances`.
#[derive(Debug, Clone)]
pub struct InstanceDim {
    /// Index into [`Dims::gpus`].
    pub gpu: usize,
    /// NVML GPU instance id; −1 for a whole GPU.
    pub gpu_instance_id: i32,
    /// MIG profile.
    pub mig_profile: Option<String>,
    /// First placement slot.
    pub placement_start: Option<i32>,
    /// GPU-equivalents.
    pub gpu_equivalents: f64,
    /// The model's MIG tables, when known.
    pub model: Option<&'static GpuModel>,
}

/// One row of `holders`.
#[derive(Debug, Clone, Default)]
pub struct HolderDim {
    /// Tenant; `None` = unallocated.
    pub tenant: Option<String>,
    /// Workload.
    pub workload: Option<String>,
    /// SLO class.
    pub slo_class: Option<String>,
}

/// The dimension tables.
#[derive(Debug, Default)]
pub struct Dims {
    /// instance_id → instance.
    pub instances: HashMap<i32, InstanceDim>,
    /// holder_id → holder.
    pub holders: HashMap<i32, HolderDim>,
    /// The GPUs, indexed by [`InstanceDim::gpu`].
    pub gpus: Vec<GpuKey>,
}

impl Dims {
    /// Loads both tables.
    pub fn load(conn: &Connection) -> duckdb::Result<Dims> {
        let mut d = Dims::default();
        let mut index: HashMap<GpuKey, usize> = HashMap::new();
        let mut stmt = conn.prepare_cached(
            "SELECT instance_id, node, gpu_uuid, gpu_model, gpu_instance_id, mig_profile,
                    placement_start, gpu_equivalents FROM instances",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let key = GpuKey {
                node: r.get(1)?,
                gpu_uuid: r.get(2)?,
                gpu_model: r.get(3)?,
            };
            let model = mig::model(&key.gpu_model);
            let gpu = *index.entry(key.clone()).or_insert_with(|| {
                d.gpus.push(key);
                d.gpus.len() - 1
            });
            d.instances.insert(
                r.get(0)?,
                InstanceDim {
                    gpu,
                    gpu_instance_id: r.get(4)?,
                    mig_profile: r.get(5)?,
                    placement_start: r.get(6)?,
                    gpu_equivalents: r.get(7)?,
                    model,
                },
            );
        }
        let mut stmt =
            conn.prepare_cached("SELECT holder_id, tenant, workload, slo_class FROM holders")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            d.holders.insert(
                r.get(0)?,
                HolderDim {
                    tenant: r.get(1)?,
                    workload: r.get(2)?,
                    slo_class: r.get(3)?,
                },
            );
        }
        Ok(d)
    }

    /// The instance `id` (a fact row never names an instance the table lacks: same snapshot).
    pub fn instance(&self, id: i32) -> Option<&InstanceDim> {
        self.instances.get(&id)
    }

    /// Whether holder `id` is a tenant (not "unallocated").
    pub fn is_allocated(&self, id: i32) -> bool {
        self.holders.get(&id).is_some_and(|h| h.tenant.is_some())
    }
}

/// One `rollup_1m` row, as numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinuteFact {
    /// The minute's first second.
    pub bucket: i64,
    /// Instance.
    pub instance_id: i32,
    /// Holder.
    pub holder_id: i32,
    /// Seconds held (bit s = second s).
    pub mask: u64,
    /// Seconds with SM activity measured.
    pub sm_samples: i64,
    /// Σ SM activity.
    pub sm_sum: f64,
}

/// Runs `sql`, which must select `bucket, instance_id, holder_id, seconds_mask,
/// sm_active_samples, sm_active_sum` from `rollup_1m`, and returns its rows.
pub fn minute_facts(
    conn: &Connection,
    sql: &str,
    params: impl Params,
) -> duckdb::Result<Vec<MinuteFact>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut out = Vec::new();
    for batch in stmt.query_arrow(params)? {
        let col = |i: usize| batch.column(i).clone();
        let bucket = col(0);
        let iid = col(1);
        let hid = col(2);
        let mask = col(3);
        let n = col(4);
        let sum = col(5);
        let (Some(bucket), Some(iid), Some(hid), Some(mask), Some(n), Some(sum)) = (
            bucket.as_any().downcast_ref::<Int64Array>(),
            iid.as_any().downcast_ref::<Int32Array>(),
            hid.as_any().downcast_ref::<Int32Array>(),
            mask.as_any().downcast_ref::<UInt64Array>(),
            n.as_any().downcast_ref::<Int32Array>(),
            sum.as_any().downcast_ref::<Float64Array>(),
        ) else {
            return Err(duckdb::Error::InvalidColumnType(
                0,
                "minute facts".into(),
                duckdb::types::Type::Any,
            ));
        };
        out.reserve(batch.num_rows());
        for k in 0..batch.num_rows() {
            out.push(MinuteFact {
                bucket: bucket.value(k),
                instance_id: iid.value(k),
                holder_id: hid.value(k),
                mask: mask.value(k),
                sm_samples: i64::from(n.value(k)),
                sm_sum: sum.value(k),
            });
        }
    }
    Ok(out)
}
