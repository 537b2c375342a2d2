//! What the analytics read: the dimension tables once, in memory, and minute rollup rows as
//! plain numbers fetched through DuckDB's Arrow interface (a row-by-row fetch with strings is far
//! slower; see docs/perf/analytics.md, "Analytics: hoarding + fragmentation evaluation, month
//! showback").

use std::collections::HashMap;
use std::ops::RangeInclusive;

use duckdb::arrow::array::{
    Array, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray, UInt64Array,
};
use duckdb::arrow::compute::cast;
use duckdb::arrow::datatypes::DataType;
use duckdb::{Connection, Params};
use gpuledger_schema::mig::{self, GpuModel};
use rustc_hash::FxHashMap;

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

/// Rows by the ledger's own ids (`instances.instance_id`, `holders.holder_id`), which the writer
/// hands out upwards from 1, one at a time: a vector indexed by id finds a row with one load and
/// no hashing. A pass looks up an instance and a holder for every minute row it reads, millions
/// late in the hour, and with a hash map those look-ups are a large share of the pass
/// (docs/perf/analytics.md, "The evaluation's per-row work"). The vector starts at the lowest id
/// the ledger holds ([`IdTable::start_at`]): retention deletes the oldest rows once no rollup names
/// them. An id the vector would have to grow far past its rows to hold (one below its start, or far
/// beyond the others) goes in a map beside it, so memory stays within a small multiple of the rows
/// whatever the ids.
#[derive(Debug)]
pub struct IdTable<T> {
    /// The id of `slots[0]`.
    base: i32,
    slots: Vec<Option<T>>,
    far: FxHashMap<i32, T>,
    len: usize,
}

impl<T> Default for IdTable<T> {
    fn default() -> Self {
        IdTable {
            base: 0,
            slots: Vec::new(),
            far: FxHashMap::default(),
            len: 0,
        }
    }
}

impl<T> IdTable<T> {
    /// Starts the vector at id `base` (the lowest id there is to hold), if the table is empty.
    pub fn start_at(&mut self, base: i32) {
        if self.is_empty() {
            self.base = base;
        }
    }

    /// Where `id` goes in the vector, if at or past its start.
    fn index(&self, id: i32) -> Option<usize> {
        usize::try_from(i64::from(id) - i64::from(self.base)).ok()
    }

    /// The row of `id`.
    pub fn get(&self, id: i32) -> Option<&T> {
        let slot = self
            .index(id)
            .and_then(|i| self.slots.get(i))
            .and_then(Option::as_ref);
        if slot.is_some() || self.far.is_empty() {
            slot
        } else {
            self.far.get(&id)
        }
    }

    /// Sets the row of `id`.
    pub fn insert(&mut self, id: i32, row: T) {
        let Some(i) = self
            .index(id)
            .filter(|&i| i < self.slots.len() || i <= 2 * self.len + 1024)
        else {
            if self.far.insert(id, row).is_none() {
                self.len += 1;
            }
            return;
        };
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || None);
        }
        let was_far = !self.far.is_empty() && self.far.remove(&id).is_some();
        if self.slots[i].replace(row).is_none() && !was_far {
            self.len += 1;
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every (id, row), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (i32, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((self.base + i as i32, r.as_ref()?)))
            .chain(self.far.iter().map(|(&id, r)| (id, r)))
    }
}

/// The dimension tables.
#[derive(Debug, Default)]
pub struct Dims {
    /// instance_id → instance.
    pub instances: IdTable<InstanceDim>,
    /// holder_id → holder.
    pub holders: IdTable<HolderDim>,
    /// The GPUs, indexed by [`InstanceDim::gpu`].
    pub gpus: Vec<GpuKey>,
    /// GPU → its index in [`Dims::gpus`].
    gpu_index: HashMap<GpuKey, usize>,
    /// The newest instance and holder ids read: [`Dims::load_newer`] reads past them.
    newest: (Option<i32>, Option<i32>),
}

impl Dims {
    /// Loads both tables, through DuckDB's Arrow interface: a row-by-row fetch of 210,000
    /// instances is slow, and it runs once per pass and again for `/metrics`
    /// (docs/perf/analytics.md, "Several fleets at once").
    pub fn load(conn: &Connection) -> duckdb::Result<Dims> {
        let mut d = Dims::default();
        d.load_newer(conn)?;
        Ok(d)
    }

    /// Adds the instances and holders written since these were read (ids past the newest read:
    /// the writer numbers them upwards, never gives one out twice in a process, and never changes
    /// a row), so that every fact row of the caller's snapshot has its dimensions. A pass that
    /// reads its facts in several snapshots calls this at the start of each
    /// ([`crate::analytics`]).
    pub fn load_newer(&mut self, conn: &Connection) -> duckdb::Result<()> {
        self.load_instances(conn)?;
        self.load_holders(conn)
    }

    /// Reads `instances` past the newest read into [`Dims::instances`] and [`Dims::gpus`].
    fn load_instances(&mut self, conn: &Connection) -> duckdb::Result<()> {
        if self.instances.is_empty() {
            let lowest: Option<i32> =
                conn.query_row("SELECT min(instance_id) FROM instances", [], |r| r.get(0))?;
            self.instances.start_at(lowest.unwrap_or(0));
        }
        let mut stmt = conn.prepare_cached(
            "SELECT instance_id, node, gpu_uuid, gpu_model, gpu_instance_id, mig_profile,
                    placement_start, gpu_equivalents FROM instances WHERE instance_id > ?",
        )?;
        for batch in stmt.query_arrow([self.newest.0.unwrap_or(i32::MIN)])? {
            let (id, node, uuid, model) = (
                ints(&batch, 0)?,
                strings(&batch, 1)?,
                strings(&batch, 2)?,
                strings(&batch, 3)?,
            );
            let (gi, profile, start) = (ints(&batch, 4)?, strings(&batch, 5)?, ints(&batch, 6)?);
            let size = column::<Float64Array>(&batch, 7)?;
            // A GPU's instances are usually written together: its key is looked up once.
            let mut last: Option<usize> = None;
            for k in 0..batch.num_rows() {
                let same = last.filter(|&g| {
                    let key = &self.gpus[g];
                    key.gpu_uuid == uuid.value(k)
                        && key.node == node.value(k)
                        && key.gpu_model == model.value(k)
                });
                let gpu = match same {
                    Some(g) => g,
                    None => {
                        let key = GpuKey {
                            node: node.value(k).to_owned(),
                            gpu_uuid: uuid.value(k).to_owned(),
                            gpu_model: model.value(k).to_owned(),
                        };
                        *self.gpu_index.entry(key).or_insert_with_key(|key| {
                            self.gpus.push(key.clone());
                            self.gpus.len() - 1
                        })
                    }
                };
                last = Some(gpu);
                self.newest.0 = self.newest.0.max(Some(id.value(k)));
                self.instances.insert(
                    id.value(k),
                    InstanceDim {
                        gpu,
                        gpu_instance_id: gi.value(k),
                        mig_profile: profile.is_valid(k).then(|| profile.value(k).to_owned()),
                        placement_start: start.is_valid(k).then(|| start.value(k)),
                        gpu_equivalents: size.value(k),
                        model: mig::model(model.value(k)),
                    },
                );
            }
        }
        Ok(())
    }

    /// Reads `holders` past the newest read into [`Dims::holders`].
    fn load_holders(&mut self, conn: &Connection) -> duckdb::Result<()> {
        if self.holders.is_empty() {
            let lowest: Option<i32> =
                conn.query_row("SELECT min(holder_id) FROM holders", [], |r| r.get(0))?;
            self.holders.start_at(lowest.unwrap_or(0));
        }
        let mut stmt = conn.prepare_cached(
            "SELECT holder_id, tenant, workload, slo_class FROM holders WHERE holder_id > ?",
        )?;
        for batch in stmt.query_arrow([self.newest.1.unwrap_or(i32::MIN)])? {
            let id = ints(&batch, 0)?;
            let text: [StringArray; 3] = [
                strings(&batch, 1)?,
                strings(&batch, 2)?,
                strings(&batch, 3)?,
            ];
            let at = |c: usize, k: usize| text[c].is_valid(k).then(|| text[c].value(k).to_owned());
            for k in 0..batch.num_rows() {
                self.newest.1 = self.newest.1.max(Some(id.value(k)));
                self.holders.insert(
                    id.value(k),
                    HolderDim {
                        tenant: at(0, k),
                        workload: at(1, k),
                        slo_class: at(2, k),
                    },
                );
            }
        }
        Ok(())
    }

    /// The newest instance id read, if any.
    pub fn newest_instance(&self) -> Option<i32> {
        self.newest.0
    }

    /// The instance `id` (a fact row never names an instance the table lacks: same snapshot).
    pub fn instance(&self, id: i32) -> Option<&InstanceDim> {
        self.instances.get(id)
    }

    /// Whether holder `id` is a tenant (not "unallocated").
    pub fn is_allocated(&self, id: i32) -> bool {
        self.holders.get(id).is_some_and(|h| h.tenant.is_some())
    }
}

/// Which instances' minute rows a query of one evaluation snapshot reads at least: those with
/// ids in `range` (the pass's dimensions put every instance of the snapshot's GPUs there, and
/// DuckDB skips row groups outside it), and any written since those dimensions were read (ids
/// past `newest`). The query keeps its own GPUs' rows of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The ids of the GPUs' instances known when the pass began, and others between them.
    pub range: RangeInclusive<i32>,
    /// The newest id known then.
    pub newest: i32,
}

/// Names the GPUs (by UUID) that the `temp.chosen_gpus` join of a snapshot's queries keeps, on
/// the reader connection `conn`, inside the snapshot's transaction.
pub fn choose_gpus<'a>(
    conn: &Connection,
    uuids: impl IntoIterator<Item = &'a str>,
) -> duckdb::Result<()> {
    conn.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS chosen_gpus (gpu_uuid VARCHAR);
         DELETE FROM chosen_gpus;",
    )?;
    let mut app = conn.appender("chosen_gpus")?;
    for u in uuids {
        app.append_row([u])?;
    }
    app.flush()
}

/// The error for column `i` of `batch` when it is not of the type asked for.
fn invalid(batch: &RecordBatch, i: usize) -> duckdb::Error {
    let name = batch.schema().field(i).name().clone();
    duckdb::Error::InvalidColumnType(i, name, duckdb::types::Type::Any)
}

/// `array`, column `i` of `batch`, as an `A`.
fn downcast<A: Array + Clone + 'static>(
    batch: &RecordBatch,
    i: usize,
    array: &dyn Array,
) -> duckdb::Result<A> {
    let a = array.as_any().downcast_ref::<A>().cloned();
    a.ok_or_else(|| invalid(batch, i))
}

/// Column `i` of `batch` as an `A`.
fn column<A: Array + Clone + 'static>(batch: &RecordBatch, i: usize) -> duckdb::Result<A> {
    downcast(batch, i, batch.column(i).as_ref())
}

/// An INTEGER column.
fn ints(batch: &RecordBatch, i: usize) -> duckdb::Result<Int32Array> {
    column(batch, i)
}

/// A VARCHAR column, as UTF-8 with 32-bit offsets whichever string layout DuckDB hands over.
fn strings(batch: &RecordBatch, i: usize) -> duckdb::Result<StringArray> {
    let utf8 = cast(batch.column(i), &DataType::Utf8).map_err(|_| invalid(batch, i))?;
    downcast(batch, i, utf8.as_ref())
}

/// One `rollup_1m` row, as numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
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
/// `sm_active_samples, sm_active_sum` from `rollup_1m`, and hands each row to `each` as its
/// Arrow batch is read: a pass late in the hour reads an hour and a window of minutes of every
/// changed GPU, and a copy of them all beside what the caller builds from them doubled its
/// memory (docs/perf/analytics.md, "Several fleets at once").
pub fn for_each_minute_fact(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    mut each: impl FnMut(MinuteFact),
) -> duckdb::Result<()> {
    let mut stmt = conn.prepare_cached(sql)?;
    for batch in stmt.query_arrow(params)? {
        let bucket = column::<Int64Array>(&batch, 0)?;
        let iid = ints(&batch, 1)?;
        let hid = ints(&batch, 2)?;
        let mask = column::<UInt64Array>(&batch, 3)?;
        let n = ints(&batch, 4)?;
        let sum = column::<Float64Array>(&batch, 5)?;
        for k in 0..batch.num_rows() {
            each(MinuteFact {
                bucket: bucket.value(k),
                instance_id: iid.value(k),
                holder_id: hid.value(k),
                mask: mask.value(k),
                sm_samples: i64::from(n.value(k)),
                sm_sum: sum.value(k),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_table_finds_every_id_it_was_given_wherever_it_keeps_it() {
        let mut t: IdTable<&str> = IdTable::default();
        assert!(t.is_empty() && t.get(1).is_none());
        for id in 0..100 {
            t.insert(id, "near");
        }
        // Negative, and far past the rows: kept beside the vector.
        t.insert(-5, "negative");
        t.insert(i32::MAX, "far");
        t.insert(5_000, "far for now");
        assert_eq!(t.len(), 103);
        assert!(t.slots.len() <= 2 * 100 + 1024 + 1, "{}", t.slots.len());
        // Enough rows that the vector grows past 5,000: that id is still found, and replacing it
        // keeps the count.
        for id in 100..2_500 {
            t.insert(id, "near");
        }
        assert_eq!(t.len(), 2_503);
        t.insert(5_000, "moved");
        assert_eq!(t.len(), 2_503);
        assert_eq!(t.get(5_000), Some(&"moved"));
        assert_eq!(t.get(-5), Some(&"negative"));
        assert_eq!(t.get(i32::MAX), Some(&"far"));
        assert_eq!(t.get(99), Some(&"near"));
        assert_eq!(t.get(2_500), None);
        assert_eq!(t.get(-1), None);
        let mut ids: Vec<i32> = t.iter().map(|(id, _)| id).collect();
        ids.sort_unstable();
        assert_eq!(ids.len(), 2_503);
        assert_eq!(ids[..2], [-5, 0]);
        assert_eq!(ids[ids.len() - 2..], [5_000, i32::MAX]);

        // Retention deleted the oldest ids: the vector starts at the lowest left, and holds them
        // all (none beside it), however high they are.
        let mut late: IdTable<i32> = IdTable::default();
        late.start_at(300_000);
        for id in 300_000..370_000 {
            late.insert(id, id);
        }
        late.insert(299_999, -1);
        assert_eq!(late.len(), 70_001);
        assert_eq!(late.slots.len(), 70_000);
        assert_eq!(late.far.len(), 1);
        assert_eq!(late.get(369_999), Some(&369_999));
        assert_eq!(late.get(299_999), Some(&-1));
        assert_eq!(late.iter().map(|(id, _)| id).max(), Some(369_999));
        late.start_at(0);
        assert_eq!(
            late.get(300_000),
            Some(&300_000),
            "a table in use keeps its start"
        );
    }
}
