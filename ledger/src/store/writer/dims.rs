//! The dimension tables (`instances`, `holders`) mirrored in memory, so that the writer assigns
//! ids without a query per series, and the GPU index (which instances share a GPU, whose observed
//! seconds are the union of theirs). New ids are appended in the caller's transaction; if it
//! fails, the writer reloads the mirror from the database.
//!
//! Keys live as bytes in one arena per table ([`Interned`]), and each node's last batch is
//! remembered as the places its entries' keys were found at: a node's next batch, the same
//! entries in the same order, is checked against those bytes in order, and an entry is looked
//! up in the table only when it differs. Either way a series gets an id only when its key's
//! bytes equal the stored key's.

use std::collections::HashMap;

use duckdb::{Connection, params};
use gpuledger_schema::wire::{Batch, List, Series};

use super::rollups::Map;
use super::{InstanceBounds, WriteError};

/// The dimension tables, mirrored in memory so that ids are assigned without a query per series.
pub(super) struct Dims {
    pub(super) instances: Interned,
    pub(super) holders: Interned,
    /// Each instance's GPU, as an index into `gpu_members` (GPUs are told apart by UUID).
    pub(super) gpu_of: Map<i32, usize>,
    pub(super) gpu_slots: HashMap<String, usize>,
    /// The instance ids on each GPU: the GPU's observed seconds are the union of theirs.
    pub(super) gpu_members: Vec<Vec<i32>>,
    /// Instances per node, for the per-node bound.
    pub(super) per_node: HashMap<String, usize>,
    /// Instances in all, for the fleet's bound.
    pub(super) total: usize,
    pub(super) next_instance: i32,
    pub(super) next_holder: i32,
    pub(super) new_instances: Vec<(i32, InstanceKey)>,
    pub(super) new_holders: Vec<(i32, HolderKey)>,
    /// Each holder's owner and owner reference as last sent (`holder_owners`); a series without
    /// them changes nothing, so only a change is written.
    owners: HashMap<i32, Owner>,
    new_owners: Vec<(i32, Owner)>,
    /// A series' key, encoded for a look-up; kept to reuse its allocation.
    scratch: Vec<u8>,
    /// Each node's last batch: the slots its entries' keys were found at, in its order.
    recent: HashMap<String, Vec<(Slot, Slot)>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct InstanceKey {
    pub(super) node: String,
    pub(super) gpu_uuid: String,
    pub(super) gpu_instance_id: i32,
    pub(super) gpu_model: String,
    pub(super) mig_profile: Option<String>,
    pub(super) placement_start: Option<i32>,
    pub(super) placement_size: Option<i32>,
}

pub(super) type HolderKey = (Option<String>, Option<String>, Option<String>);

/// A holder's (owner, owner_ref).
type Owner = (Option<String>, Option<String>);

/// Keys interned as bytes, found from a series' borrowed fields without an allocation.
///
/// The key decision: every key is encoded ([`Encoded`]) into one arena, and the table holds
/// only its place there. A look-up encodes the series' fields into a scratch buffer, hashes
/// those bytes, and compares them with the arena's, so it reads two places in memory (the
/// table's slot and the key's bytes) rather than a bucket and each of a key's strings: at a
/// fleet's 70,000 instances none of them is in cache, and those reads were most of what the
/// writer spent assigning ids (docs/perf/writer.md, "Ids found in one arena, and from each node's
/// last batch"). Equality is still checked byte for byte: a hash never stands for a key.
#[derive(Debug, Default)]
pub(super) struct Interned {
    /// Keyed by [`hash_of`]'s keyed hash already: FxHash of it is a multiply, not a second hash.
    slots: Map<u64, Slot>,
    /// Keys whose hash an earlier key has already, each chained from its slot.
    collided: Vec<Slot>,
    arena: Vec<u8>,
}

/// One key's place in the arena, its id, and the next key with its hash (`collided[next - 1]`;
/// 0 for none).
#[derive(Debug, Clone, Copy)]
struct Slot {
    start: usize,
    len: usize,
    id: i32,
    next: usize,
}

impl Interned {
    fn bytes(&self, slot: &Slot) -> &[u8] {
        &self.arena[slot.start..slot.start + slot.len]
    }

    #[cfg(test)]
    fn get(&self, hash: u64, key: &[u8]) -> Option<i32> {
        self.find(hash, key).map(|slot| slot.id)
    }

    fn find(&self, hash: u64, key: &[u8]) -> Option<Slot> {
        let mut slot = self.slots.get(&hash)?;
        loop {
            if self.bytes(slot) == key {
                return Some(*slot);
            }
            slot = self.collided.get(slot.next.checked_sub(1)?)?;
        }
    }

    /// Adds a key that [`Interned::find`] did not find, and answers its slot.
    fn insert(&mut self, hash: u64, key: &[u8], id: i32) -> Slot {
        let mut slot = Slot {
            start: self.arena.len(),
            len: key.len(),
            id,
            next: 0,
        };
        self.arena.extend_from_slice(key);
        if let Some(first) = self.slots.get_mut(&hash) {
            slot.next = first.next;
            self.collided.push(slot);
            first.next = self.collided.len();
        } else {
            self.slots.insert(hash, slot);
        }
        slot
    }

    fn ids(&self) -> impl Iterator<Item = i32> + '_ {
        self.slots
            .values()
            .chain(&self.collided)
            .map(|slot| slot.id)
    }

    /// Every key's bytes with its id, sorted: two mirrors hold the same keys when these are equal.
    #[cfg(test)]
    fn sorted(&self) -> Vec<(&[u8], i32)> {
        let mut all: Vec<_> = self
            .slots
            .values()
            .chain(&self.collided)
            .map(|slot| (self.bytes(slot), slot.id))
            .collect();
        all.sort_unstable();
        all
    }
}

/// The hash of an encoded key; one process-wide random key, so that keys loaded and keys looked
/// up hash alike and no sender can choose colliding names. aHash, keyed at run time: SipHash of
/// every series' strings weighed on id assignment in the live load's profile.
fn hash_of(key: &[u8]) -> u64 {
    static STATE: std::sync::OnceLock<ahash::RandomState> = std::sync::OnceLock::new();
    STATE.get_or_init(ahash::RandomState::new).hash_one(key)
}

/// A key's fields written one after another, each string after its length and each optional
/// field after a present/absent byte, so that two different keys never encode alike.
struct Encoded<'a>(&'a mut Vec<u8>);

impl Encoded<'_> {
    fn str(&mut self, s: &str) -> &mut Self {
        self.0.extend_from_slice(&(s.len() as u64).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }

    fn opt_str(&mut self, s: Option<&str>) -> &mut Self {
        self.opt(s, Self::str)
    }

    fn int(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn opt_int(&mut self, v: Option<i32>) -> &mut Self {
        self.opt(v, Self::int)
    }

    fn opt<T>(&mut self, v: Option<T>, put: impl FnOnce(&mut Self, T) -> &mut Self) -> &mut Self {
        match v {
            None => self.0.push(0),
            Some(v) => {
                self.0.push(1);
                put(self, v);
            }
        }
        self
    }
}

/// A MIG id or placement as the ledger stores it. Validation bounds them far below i32::MAX
/// (`MAX_MIG_ID`); saturating keeps an unvalidated id from ever becoming -1, the whole-GPU marker.
fn small(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

impl InstanceKey {
    /// Encodes the key into `buf` (cleared first), as [`InstanceKey::encode_series`] does `s`'s.
    fn encode(&self, buf: &mut Vec<u8>) {
        encode_instance(
            &self.node,
            &self.gpu_uuid,
            self.gpu_instance_id,
            &self.gpu_model,
            self.mig_profile.as_deref(),
            (self.placement_start, self.placement_size),
            buf,
        );
    }

    fn encode_series(s: &Series, buf: &mut Vec<u8>) {
        encode_instance(
            &s.node,
            &s.gpu_uuid,
            s.gpu_instance_id.map_or(-1, small),
            &s.gpu_model,
            s.mig_profile.as_deref(),
            (s.placement_start.map(small), s.placement_size.map(small)),
            buf,
        );
    }

    pub(super) fn of(s: &Series) -> InstanceKey {
        InstanceKey {
            node: s.node.clone(),
            gpu_uuid: s.gpu_uuid.clone(),
            gpu_instance_id: s.gpu_instance_id.map_or(-1, small),
            gpu_model: s.gpu_model.clone(),
            mig_profile: s.mig_profile.clone(),
            placement_start: s.placement_start.map(small),
            placement_size: s.placement_size.map(small),
        }
    }
}

/// An instance key's encoding, one function for a stored key and a series' fields alike.
fn encode_instance(
    node: &str,
    gpu_uuid: &str,
    gpu_instance_id: i32,
    gpu_model: &str,
    mig_profile: Option<&str>,
    (placement_start, placement_size): (Option<i32>, Option<i32>),
    buf: &mut Vec<u8>,
) {
    buf.clear();
    Encoded(buf)
        .str(node)
        .str(gpu_uuid)
        .int(gpu_instance_id)
        .str(gpu_model)
        .opt_str(mig_profile)
        .opt_int(placement_start)
        .opt_int(placement_size);
}

pub(super) fn holder_key(s: &Series) -> HolderKey {
    (
        s.tenant.clone(),
        s.workload.clone(),
        s.slo_class.map(|c| c.as_str().to_owned()),
    )
}

fn encode_holder(
    tenant: Option<&str>,
    workload: Option<&str>,
    slo_class: Option<&str>,
    buf: &mut Vec<u8>,
) {
    buf.clear();
    Encoded(buf)
        .opt_str(tenant)
        .opt_str(workload)
        .opt_str(slo_class);
}

fn encode_holder_key(key: &HolderKey, buf: &mut Vec<u8>) {
    encode_holder(key.0.as_deref(), key.1.as_deref(), key.2.as_deref(), buf);
}

fn encode_holder_series(s: &Series, buf: &mut Vec<u8>) {
    encode_holder(
        s.tenant.as_deref(),
        s.workload.as_deref(),
        s.slo_class.map(|c| c.as_str()),
        buf,
    );
}

impl Dims {
    pub(super) fn load(conn: &Connection) -> duckdb::Result<Dims> {
        let mut instances = Interned::default();
        let mut stmt = conn.prepare(
            "SELECT instance_id, node, gpu_uuid, gpu_instance_id, gpu_model, mig_profile, placement_start, placement_size FROM instances",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i32>(0)?,
                InstanceKey {
                    node: r.get(1)?,
                    gpu_uuid: r.get(2)?,
                    gpu_instance_id: r.get(3)?,
                    gpu_model: r.get(4)?,
                    mig_profile: r.get(5)?,
                    placement_start: r.get(6)?,
                    placement_size: r.get(7)?,
                },
            ))
        })?;
        let mut gpus = GpuIndex::default();
        let mut per_node: HashMap<String, usize> = HashMap::new();
        let mut scratch = Vec::new();
        for row in rows {
            let (id, key) = row?;
            gpus.add(id, &key.gpu_uuid);
            *per_node.entry(key.node.clone()).or_default() += 1;
            key.encode(&mut scratch);
            instances.insert(hash_of(&scratch), &scratch, id);
        }
        let mut holders = Interned::default();
        let mut stmt =
            conn.prepare("SELECT holder_id, tenant, workload, slo_class FROM holders")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, i32>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?)))
        })?;
        for row in rows {
            let (id, key) = row?;
            encode_holder_key(&key, &mut scratch);
            holders.insert(hash_of(&scratch), &scratch, id);
        }
        let mut stmt = conn.prepare("SELECT holder_id, owner, owner_ref FROM holder_owners")?;
        let owners = stmt
            .query_map([], |r| Ok((r.get::<_, i32>(0)?, (r.get(1)?, r.get(2)?))))?
            .collect::<duckdb::Result<HashMap<i32, Owner>>>()?;
        Ok(Dims {
            total: per_node.values().sum(),
            next_instance: instances.ids().max().unwrap_or(0) + 1,
            next_holder: holders.ids().max().unwrap_or(0) + 1,
            instances,
            holders,
            gpu_of: gpus.gpu_of,
            gpu_slots: gpus.slots,
            gpu_members: gpus.members,
            per_node,
            new_instances: Vec::new(),
            new_holders: Vec::new(),
            owners,
            new_owners: Vec::new(),
            scratch,
            recent: HashMap::new(),
        })
    }

    /// The id of `s`'s instance; a new one is assigned in memory and written by [`Dims::flush`].
    /// A refusal naming `field` when a new one would pass one of `bounds`.
    pub(super) fn instance_id(
        &mut self,
        s: &Series,
        bounds: InstanceBounds,
        field: impl FnOnce() -> String,
    ) -> Result<i32, WriteError> {
        self.instance_slot(s, bounds, field).map(|slot| slot.id)
    }

    fn instance_slot(
        &mut self,
        s: &Series,
        bounds: InstanceBounds,
        field: impl FnOnce() -> String,
    ) -> Result<Slot, WriteError> {
        InstanceKey::encode_series(s, &mut self.scratch);
        let hash = hash_of(&self.scratch);
        if let Some(slot) = self.instances.find(hash, &self.scratch) {
            return Ok(slot);
        }
        let key = InstanceKey::of(s);
        let count = self.per_node.entry(key.node.clone()).or_default();
        let message = if *count >= bounds.per_node {
            Some(format!(
                "node {:?} would have more than {} GPU instances in the ledger (--max-instances-per-node)",
                s.node, bounds.per_node
            ))
        } else if self.total >= bounds.fleet {
            Some(format!(
                "the ledger would hold more than {} GPU instances (--max-instances)",
                bounds.fleet
            ))
        } else {
            None
        };
        if let Some(message) = message {
            return Err(WriteError::Rejected {
                field: field(),
                message,
            });
        }
        *count += 1;
        self.total += 1;
        let id = self.next_instance;
        self.next_instance += 1;
        let slot = match self.gpu_slots.get(&key.gpu_uuid) {
            Some(&g) => g,
            None => {
                self.gpu_members.push(Vec::new());
                self.gpu_slots
                    .insert(key.gpu_uuid.clone(), self.gpu_members.len() - 1);
                self.gpu_members.len() - 1
            }
        };
        self.gpu_of.insert(id, slot);
        self.gpu_members[slot].push(id);
        self.new_instances.push((id, key));
        Ok(self.instances.insert(hash, &self.scratch, id))
    }

    /// The id of `s`'s holder; a new one is written by [`Dims::flush`].
    pub(super) fn holder_id(&mut self, s: &Series) -> i32 {
        self.holder_slot(s).id
    }

    fn holder_slot(&mut self, s: &Series) -> Slot {
        encode_holder_series(s, &mut self.scratch);
        let hash = hash_of(&self.scratch);
        if let Some(slot) = self.holders.find(hash, &self.scratch) {
            return slot;
        }
        let id = self.next_holder;
        self.next_holder += 1;
        self.new_holders.push((id, holder_key(s)));
        self.holders.insert(hash, &self.scratch, id)
    }

    /// Whether `s`'s instance and holder keys are those at `slots`' places.
    fn still(&mut self, s: &Series, (instance, holder): (Slot, Slot)) -> bool {
        InstanceKey::encode_series(s, &mut self.scratch);
        if self.instances.bytes(&instance) != self.scratch.as_slice() {
            return false;
        }
        encode_holder_series(s, &mut self.scratch);
        self.holders.bytes(&holder) == self.scratch.as_slice()
    }

    /// The (instance, holder) ids of every series and every share of the new batches, assigning
    /// new ones; a batch that would pass one of `bounds` is refused, naming its first entry that
    /// would.
    pub(super) fn assign_ids(
        &mut self,
        bounds: InstanceBounds,
        batches: &[(&Batch, i64)],
        new: &[usize],
    ) -> Result<Vec<BatchIds>, WriteError> {
        let mut ids = Vec::with_capacity(new.len());
        for &i in new {
            let batch = batches[i].0;
            // A node sends the same entries in the same order batch after batch: each entry is
            // first checked against the keys its place had in the node's last batch, which sit
            // side by side in the arenas (a node's first batch added them together), and looked
            // up only when they differ.
            let (node, last) = self
                .recent
                .remove_entry(batch.node.as_str())
                .unwrap_or_else(|| (batch.node.clone(), Vec::new()));
            let mut seen = Vec::with_capacity(last.len());
            let mut these = BatchIds::default();
            // `gpus` come last and name GPUs, not instances: the energy writer keys them by name.
            let instance_entries = batch.entries().filter(|(list, ..)| *list != List::Gpus);
            for (k, (list, j, s)) in instance_entries.enumerate() {
                let known = last.get(k).copied().filter(|&slots| self.still(s, slots));
                let slots = match known {
                    Some(slots) => slots,
                    None => {
                        let instance = self.instance_slot(s, bounds, || format!("{list}[{j}]"))?;
                        (instance, self.holder_slot(s))
                    }
                };
                seen.push(slots);
                if s.owner.is_some() || s.owner_ref.is_some() {
                    self.note_owner(slots.1.id, s);
                }
                let pair = (slots.0.id, slots.1.id);
                match list {
                    List::Series => these.series.push(pair),
                    List::Shares => these.shares.push(pair),
                    List::Gpus => unreachable!("left out above"),
                }
            }
            if !seen.is_empty() {
                self.recent.insert(node, seen);
            }
            ids.push(these);
        }
        Ok(ids)
    }

    /// Records `s`'s owner for `holder` when it differs from the one last sent.
    fn note_owner(&mut self, holder: i32, s: &Series) {
        let same = self.owners.get(&holder).is_some_and(|(o, r)| {
            o.as_deref() == s.owner.as_deref() && r.as_deref() == s.owner_ref.as_deref()
        });
        if !same {
            let owner = (s.owner.clone(), s.owner_ref.clone());
            self.owners.insert(holder, owner.clone());
            self.new_owners.push((holder, owner));
        }
    }

    /// Every instance of the GPUs of `instances`, sorted, each once: whose masks a group reads (a
    /// GPU's observed seconds are the union of its instances').
    pub(super) fn gpu_mates(&self, instances: impl IntoIterator<Item = i32>) -> Vec<i32> {
        let mut gpus: Vec<usize> = instances.into_iter().map(|i| self.gpu_of[&i]).collect();
        gpus.sort_unstable();
        gpus.dedup();
        let mut ids: Vec<i32> = gpus
            .into_iter()
            .flat_map(|g| self.gpu_members[g].iter().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The seconds each GPU was observed in, per minute, given the instances' covered masks;
    /// the map has room for `more` (GPU, minute) keys besides.
    pub(super) fn gpu_seen(
        &self,
        covered: &Map<(i32, i64), u64>,
        more: usize,
    ) -> Map<(usize, i64), u64> {
        let mut gpu_seen: Map<(usize, i64), u64> =
            Map::with_capacity_and_hasher(covered.len() + more, Default::default());
        for (&(iid, bucket), &mask) in covered {
            if let Some(&g) = self.gpu_of.get(&iid) {
                *gpu_seen.entry((g, bucket)).or_insert(0) |= mask;
            }
        }
        gpu_seen
    }

    /// Appends the ids assigned since the last flush, in the caller's transaction (a fleet's
    /// first batches bring thousands of new instances: one appender, not a statement each). If
    /// that transaction fails, the writer reloads the mirror from the database.
    pub(super) fn flush(&mut self, conn: &Connection) -> duckdb::Result<()> {
        if !self.new_instances.is_empty() {
            let mut app = conn.appender("instances")?;
            for (id, key) in self.new_instances.drain(..) {
                let size = gpuledger_schema::mig::gpu_equivalents_of(key.mig_profile.as_deref())
                    .unwrap_or(0.0);
                app.append_row(params![
                    id,
                    key.node,
                    key.gpu_uuid,
                    key.gpu_instance_id,
                    key.gpu_model,
                    key.mig_profile,
                    key.placement_start,
                    key.placement_size,
                    size
                ])?;
            }
            app.flush()?;
        }
        if !self.new_holders.is_empty() {
            let mut app = conn.appender("holders")?;
            for (id, key) in self.new_holders.drain(..) {
                app.append_row(params![id, key.0, key.1, key.2])?;
            }
            app.flush()?;
        }
        if !self.new_owners.is_empty() {
            let mut forget = conn.prepare("DELETE FROM holder_owners WHERE holder_id = ?")?;
            let mut keep = conn.prepare("INSERT INTO holder_owners VALUES (?, ?, ?)")?;
            for (id, (owner, owner_ref)) in self.new_owners.drain(..) {
                forget.execute([id])?;
                keep.execute(params![id, owner, owner_ref])?;
            }
        }
        Ok(())
    }
}

/// The (instance, holder) ids of one batch's entries, in the order of its lists.
#[derive(Default)]
pub(super) struct BatchIds {
    pub(super) series: Vec<(i32, i32)>,
    pub(super) shares: Vec<(i32, i32)>,
}

/// Builds [`Dims`]' GPU index while loading.
#[derive(Default)]
pub(super) struct GpuIndex {
    pub(super) gpu_of: Map<i32, usize>,
    pub(super) slots: HashMap<String, usize>,
    pub(super) members: Vec<Vec<i32>>,
}

impl GpuIndex {
    pub(super) fn add(&mut self, iid: i32, gpu_uuid: &str) {
        let next = self.members.len();
        let slot = *self.slots.entry(gpu_uuid.to_owned()).or_insert(next);
        if slot == next {
            self.members.push(Vec::new());
        }
        self.members[slot].push(iid);
        self.gpu_of.insert(iid, slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(uuid: &str, gi: Option<u32>, tenant: Option<&str>) -> Series {
        let instance = gpuledger_schema::Instance {
            node: "n1".into(),
            gpu_uuid: uuid.into(),
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
            mig_profile: gi.map(|_| "1g.10gb".into()),
            gpu_instance_id: gi,
            placement_start: gi,
            placement_size: gi.map(|_| 1),
        };
        let holder = gpuledger_schema::Attribution {
            tenant: tenant.map(str::to_owned),
            ..Default::default()
        };
        Series::describing(&instance, &holder)
    }

    fn per_node(n: usize) -> InstanceBounds {
        InstanceBounds {
            per_node: n,
            fleet: usize::MAX,
        }
    }

    /// A new in-memory ledger and its (empty) mirror.
    fn in_memory() -> (Connection, Dims) {
        let conn = crate::store::open(std::path::Path::new(":memory:"))
            .unwrap()
            .0;
        let dims = Dims::load(&conn).unwrap();
        (conn, dims)
    }

    #[test]
    fn ids_are_assigned_once_and_instances_are_grouped_by_gpu() {
        let (conn, mut dims) = in_memory();
        let a = dims
            .instance_id(&series("GPU-a", Some(7), None), per_node(10), String::new)
            .ok()
            .unwrap();
        let b = dims
            .instance_id(&series("GPU-a", Some(8), None), per_node(10), String::new)
            .ok()
            .unwrap();
        let c = dims
            .instance_id(&series("GPU-b", None, None), per_node(10), String::new)
            .ok()
            .unwrap();
        assert_eq!(
            dims.instance_id(
                &series("GPU-a", Some(7), Some("x")),
                per_node(10),
                String::new
            )
            .ok(),
            Some(a)
        );
        assert_ne!(a, b);
        assert_eq!(dims.gpu_of[&a], dims.gpu_of[&b], "one GPU");
        assert_ne!(dims.gpu_of[&a], dims.gpu_of[&c]);
        assert_eq!(dims.gpu_members[dims.gpu_of[&a]], vec![a, b]);
        let nobody = dims.holder_id(&series("GPU-a", Some(7), None));
        let x = dims.holder_id(&series("GPU-b", None, Some("x")));
        assert_eq!(nobody, 0, "holder 0 is nobody, loaded from the migration");
        assert_eq!(dims.holder_id(&series("GPU-a", Some(8), Some("x"))), x);
        dims.flush(&conn).unwrap();
        let mut reloaded = Dims::load(&conn).unwrap();
        assert_eq!(
            reloaded.instances.sorted(),
            dims.instances.sorted(),
            "what was flushed loads back"
        );
        assert_eq!(reloaded.holders.sorted(), dims.holders.sorted());
        assert_eq!(reloaded.next_instance, dims.next_instance);
        // A key loaded from the table and a series' fields hash alike: the same series finds
        // the same ids after a restart, and no new row is made.
        assert_eq!(
            reloaded
                .instance_id(&series("GPU-a", Some(7), None), per_node(10), String::new)
                .ok(),
            Some(a)
        );
        assert_eq!(
            reloaded
                .instance_id(&series("GPU-b", None, None), per_node(10), String::new)
                .ok(),
            Some(c)
        );
        assert_eq!(reloaded.holder_id(&series("GPU-a", Some(8), Some("x"))), x);
        assert_eq!(reloaded.holder_id(&series("GPU-a", Some(8), None)), nobody);
        assert!(reloaded.new_instances.is_empty() && reloaded.new_holders.is_empty());
    }

    #[test]
    fn keys_with_one_hash_are_all_found_and_never_confused() {
        let mut interned = Interned::default();
        interned.insert(7, b"first", 1);
        interned.insert(7, b"second", 2);
        interned.insert(7, b"third", 3);
        interned.insert(8, b"other", 4);
        assert_eq!(interned.get(7, b"first"), Some(1));
        assert_eq!(interned.get(7, b"second"), Some(2));
        assert_eq!(interned.get(7, b"third"), Some(3));
        assert_eq!(interned.get(8, b"other"), Some(4));
        assert_eq!(
            interned.get(7, b"other"),
            None,
            "the hash alone finds nothing"
        );
        assert_eq!(interned.get(9, b"first"), None);
        let mut ids: Vec<i32> = interned.ids().collect();
        ids.sort_unstable();
        assert_eq!(ids, [1, 2, 3, 4]);
    }

    #[test]
    fn fields_that_concatenate_alike_encode_apart() {
        let key = |node: &str, uuid: &str, mig: Option<&str>| {
            let mut buf = Vec::new();
            InstanceKey {
                node: node.into(),
                gpu_uuid: uuid.into(),
                gpu_instance_id: -1,
                gpu_model: String::new(),
                mig_profile: mig.map(str::to_owned),
                placement_start: None,
                placement_size: None,
            }
            .encode(&mut buf);
            buf
        };
        assert_ne!(key("ab", "c", None), key("a", "bc", None));
        assert_ne!(key("a", "b", None), key("a", "b", Some("")));
        let holder = |t: Option<&str>, w: Option<&str>| {
            let mut buf = Vec::new();
            encode_holder(t, w, None, &mut buf);
            buf
        };
        assert_ne!(holder(Some("x"), None), holder(None, Some("x")));
        assert_ne!(holder(Some(""), None), holder(None, None));
        // A series and the key it is stored as encode alike.
        let s = series("GPU-a", Some(3), Some("t"));
        let (mut from_series, mut from_key) = (Vec::new(), Vec::new());
        InstanceKey::encode_series(&s, &mut from_series);
        InstanceKey::of(&s).encode(&mut from_key);
        assert_eq!(from_series, from_key);
        encode_holder_series(&s, &mut from_series);
        encode_holder_key(&holder_key(&s), &mut from_key);
        assert_eq!(from_series, from_key);
    }

    #[test]
    fn a_node_s_next_batch_gets_the_ids_of_its_entries_not_of_their_places() {
        let (_conn, mut dims) = in_memory();
        let batch = |series: Vec<Series>| {
            let mut b = Batch::from_samples("n1", &[]);
            b.series = series;
            b
        };
        let mut assign = |b: &Batch| {
            dims.assign_ids(per_node(10), &[(b, 0)], &[0])
                .unwrap()
                .remove(0)
        };
        let (a, b) = (
            series("GPU-a", None, Some("x")),
            series("GPU-b", None, Some("y")),
        );
        let first = assign(&batch(vec![a.clone(), b.clone()])).series;
        assert_ne!(first[0], first[1]);
        assert_eq!(assign(&batch(vec![a.clone(), b.clone()])).series, first);
        // The same entries in another order: the ids follow the entries.
        assert_eq!(
            assign(&batch(vec![b.clone(), a.clone()])).series,
            vec![first[1], first[0]]
        );
        // A new holder at a known place, and a new instance after the known ones.
        let moved = series("GPU-a", None, Some("z"));
        let c = series("GPU-c", None, Some("x"));
        let next = assign(&batch(vec![moved, b.clone(), c])).series;
        assert_eq!(next[0].0, first[0].0, "the same instance");
        assert_ne!(next[0].1, first[0].1, "another holder");
        assert_eq!(next[1], first[1]);
        assert!(next[2].0 != first[0].0 && next[2].0 != first[1].0);
        assert_eq!(next[2].1, first[0].1, "holder x, known");
        // A batch of another node with the same entries: the same ids.
        let mut other = batch(vec![b.clone(), a.clone()]);
        other.node = "n2".into();
        assert_eq!(assign(&other).series, vec![first[1], first[0]]);
    }

    #[test]
    fn a_node_past_its_bound_gets_no_new_instance() {
        let (_conn, mut dims) = in_memory();
        assert!(
            dims.instance_id(&series("GPU-a", Some(7), None), per_node(1), String::new)
                .ok()
                .is_some()
        );
        assert!(
            dims.instance_id(&series("GPU-a", Some(7), None), per_node(1), String::new)
                .ok()
                .is_some(),
            "a known one"
        );
        assert!(
            dims.instance_id(&series("GPU-a", Some(8), None), per_node(1), String::new)
                .ok()
                .is_none()
        );
    }

    /// Regression (issue 48, finding 3): a `node:*` token added 60,000 instances under 240
    /// invented nodes, each within the per-node bound. The fleet's bound holds across nodes, and
    /// its refusal names the entry and the flag.
    #[test]
    fn the_fleet_bound_holds_across_nodes() {
        let (_conn, mut dims) = in_memory();
        let bounds = InstanceBounds {
            per_node: 2,
            fleet: 3,
        };
        let on = |node: &str, gi: u32| {
            let mut s = series("GPU-a", Some(gi), None);
            s.node = node.into();
            s.gpu_uuid = format!("GPU-{node}");
            s
        };
        for (node, gi) in [("n1", 1), ("n1", 2), ("n2", 1)] {
            dims.instance_id(&on(node, gi), bounds, String::new)
                .unwrap();
        }
        assert!(
            dims.instance_id(&on("n1", 1), bounds, String::new).is_ok(),
            "a known instance is no new one"
        );
        match dims.instance_id(&on("n3", 1), bounds, || "series[4]".into()) {
            Err(WriteError::Rejected { field, message }) => {
                assert_eq!(field, "series[4]");
                assert!(message.contains("--max-instances)"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(dims.total, 3);
    }
}
