//! MIG fragmentation of one GPU at one instant: free slots, the largest profile that can still be
//! placed, stranded capacity under a demand mix, and re-geometry advice. Pure functions over the
//! placement tables in [`gpuledger_schema::mig`]; the database side is in
//! [`super::fragmentation`].
//!
//! Stranded capacity follows the idea of Weng et al., "Beware of Fragmentation: Scheduling GPU-
//! Sharing Workloads with Fragmentation Gradient Descent" (USENIX ATC '23): free capacity is
//! fragmented *for a request* when that request cannot use it, and a GPU's fragmentation is the
//! expectation over the demand mix. Here a request is a MIG profile; what it can use is what the
//! placement rules let it occupy.

use std::collections::HashMap;

use gpuledger_schema::mig::{GpuModel, PLACEMENT_SLOTS, Profile, SLICES_PER_GPU};

/// One instance present on a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Present {
    /// Its MIG profile on this GPU's model; `None` for a whole GPU (MIG off) or a profile the
    /// tables do not know.
    pub profile: Option<&'static Profile>,
    /// First placement slot, when the exporter reported it.
    pub start: Option<u32>,
    /// Compute slices it takes (7 for a whole GPU).
    pub slices: u32,
    /// Whether a tenant holds it. An instance nobody holds is free capacity of its own profile.
    pub allocated: bool,
}

impl Present {
    fn covered(&self) -> u32 {
        match (self.profile, self.start) {
            (Some(p), Some(s)) => slot_mask(s, p.size),
            _ => 0,
        }
    }
}

fn slot_mask(start: u32, size: u32) -> u32 {
    ((1u32 << size) - 1) << start
}

/// The demand mix for one GPU model: how often each profile is requested (weights sum to 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    weights: Vec<(&'static Profile, f64)>,
}

impl Demand {
    /// From request counts per profile name; unknown names are ignored. With no counts, every
    /// profile of the model is equally likely.
    pub fn from_counts(model: &'static GpuModel, counts: &HashMap<String, f64>) -> Demand {
        let mut weights: Vec<(&'static Profile, f64)> = model
            .profiles
            .iter()
            .filter_map(|p| {
                counts
                    .get(p.name)
                    .copied()
                    .filter(|w| *w > 0.0)
                    .map(|w| (p, w))
            })
            .collect();
        if weights.is_empty() {
            weights = model.profiles.iter().map(|p| (p, 1.0)).collect();
        }
        let total: f64 = weights.iter().map(|(_, w)| w).sum();
        for (_, w) in &mut weights {
            *w /= total;
        }
        Demand { weights }
    }

    /// (profile name, weight) pairs.
    pub fn weights(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        self.weights.iter().map(|(p, w)| (p.name, *w))
    }
}

/// The fragmentation of one GPU at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Fragmentation {
    /// Placement slots no instance covers.
    pub free_slots: Vec<u32>,
    /// Free compute slices: those no instance takes, plus those of instances nobody holds.
    pub free_slices: u32,
    /// The largest profile a new request could get without re-partitioning: placeable in the
    /// free slots, or an existing instance nobody holds. `whole` for an unheld GPU without MIG.
    pub largest_placeable_profile: Option<&'static str>,
    /// Free compute slices the demand mix cannot use, weighted by how often each profile is
    /// requested.
    pub stranded_slices: f64,
}

/// How many instances of `p` fit in the slots `covered` leaves, within `slices` compute slices.
/// All instances of one profile have the same size, so taking the earliest legal start each time
/// is optimal (interval scheduling by earliest end).
fn fit_count(p: &Profile, covered: u32, slices: u32) -> u32 {
    let mut taken = covered;
    let mut n = 0;
    for &s in p.starts {
        let m = slot_mask(s, p.size);
        if taken & m == 0 {
            taken |= m;
            n += 1;
        }
    }
    n.min(slices / p.compute_slices)
}

/// The fragmentation of a GPU of `model` (`None`: a model without MIG tables) holding `present`.
pub fn analyse(
    model: Option<&'static GpuModel>,
    present: &[Present],
    demand: &Demand,
) -> Fragmentation {
    let whole = !present.is_empty() && present.iter().all(|i| i.profile.is_none());
    if model.is_none() || whole {
        // A whole GPU: free when nobody holds it, and then usable by any request.
        let free = !present.is_empty() && present.iter().all(|i| !i.allocated);
        return Fragmentation {
            free_slots: if free {
                (0..PLACEMENT_SLOTS).collect()
            } else {
                Vec::new()
            },
            free_slices: if free { SLICES_PER_GPU } else { 0 },
            largest_placeable_profile: free.then_some("whole"),
            stranded_slices: 0.0,
        };
    }
    let covered = present.iter().fold(0, |m, i| m | i.covered());
    let taken: u32 = present.iter().map(|i| i.slices).sum();
    let uncovered_slices = SLICES_PER_GPU.saturating_sub(taken);
    let unheld = |p: &Profile| -> u32 {
        present
            .iter()
            .filter(|i| !i.allocated && i.profile.is_some_and(|q| q.name == p.name))
            .map(|i| i.slices)
            .sum()
    };
    let unheld_slices: u32 = present
        .iter()
        .filter(|i| !i.allocated)
        .map(|i| i.slices)
        .sum();
    let free_slices = uncovered_slices + unheld_slices;
    let usable =
        |p: &Profile| fit_count(p, covered, uncovered_slices) * p.compute_slices + unheld(p);
    let stranded_slices = demand
        .weights
        .iter()
        .map(|(p, w)| w * f64::from(free_slices - usable(p).min(free_slices)))
        .sum();
    let largest = model
        .into_iter()
        .flat_map(|m| m.profiles.iter())
        .filter(|p| fit_count(p, covered, uncovered_slices) > 0 || unheld(p) > 0)
        .max_by_key(|p| (p.compute_slices, p.fb_bytes))
        .map(|p| p.name);
    Fragmentation {
        free_slots: (0..PLACEMENT_SLOTS)
            .filter(|s| covered & (1 << s) == 0)
            .collect(),
        free_slices,
        largest_placeable_profile: largest,
        stranded_slices,
    }
}

/// A proposed re-geometry of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// Instances to create, as (profile, start slot), left unheld for the scheduler to hand out.
    pub create: Vec<(&'static str, u32)>,
    /// Indices into `present` of the instances to destroy: unheld ones, and held ones when the
    /// advice drains the GPU.
    pub destroy: Vec<usize>,
    /// Indices into `present` of held instances the change displaces (drains).
    pub displace: Vec<usize>,
    /// Stranded compute slices after the change.
    pub stranded_slices_after: f64,
}

/// Every set of placements that fits in the slots `covered` leaves and in `slices` compute
/// slices, including the empty set (a few thousand at most: 8 slots).
fn geometries(
    model: &'static GpuModel,
    covered: u32,
    slices: u32,
) -> Vec<Vec<(&'static Profile, u32)>> {
    let options: Vec<(&'static Profile, u32)> = model
        .profiles
        .iter()
        .flat_map(|p| p.starts.iter().map(move |&s| (p, s)))
        .collect();
    let mut out = Vec::new();
    fn walk(
        options: &[(&'static Profile, u32)],
        covered: u32,
        slices: u32,
        current: &mut Vec<(&'static Profile, u32)>,
        out: &mut Vec<Vec<(&'static Profile, u32)>>,
    ) {
        out.push(current.clone());
        for (k, &(p, s)) in options.iter().enumerate() {
            let m = slot_mask(s, p.size);
            if covered & m == 0 && p.compute_slices <= slices {
                current.push((p, s));
                walk(
                    &options[k + 1..],
                    covered | m,
                    slices - p.compute_slices,
                    current,
                    out,
                );
                current.pop();
            }
        }
    }
    walk(&options, covered, slices, &mut Vec::new(), &mut out);
    out
}

/// The re-geometry that strands least under `demand`: first keeping every held instance and
/// re-partitioning only what nobody holds; then draining the whole GPU, proposed only if it
/// strands strictly less. `None` when nothing beats the current geometry.
pub fn advise(model: &'static GpuModel, present: &[Present], demand: &Demand) -> Option<Advice> {
    if present
        .iter()
        .any(|i| i.profile.is_none() || i.start.is_none())
    {
        return None;
    }
    let now = analyse(Some(model), present, demand).stranded_slices;
    let best_with = |keep: &[Present]| -> (f64, Vec<(&'static Profile, u32)>) {
        let covered = keep.iter().fold(0, |m, i| m | i.covered());
        let slices = SLICES_PER_GPU.saturating_sub(keep.iter().map(|i| i.slices).sum());
        let mut best: Option<(f64, Vec<(&'static Profile, u32)>)> = None;
        for g in geometries(model, covered, slices) {
            let mut after: Vec<Present> = keep.to_vec();
            after.extend(g.iter().map(|&(p, s)| Present {
                profile: Some(p),
                start: Some(s),
                slices: p.compute_slices,
                allocated: false,
            }));
            let stranded = analyse(Some(model), &after, demand).stranded_slices;
            // Fewer new instances wins a tie: less to change.
            if best.as_ref().is_none_or(|(b, bg)| {
                stranded < b - 1e-9 || (stranded < b + 1e-9 && g.len() < bg.len())
            }) {
                best = Some((stranded, g));
            }
        }
        best.unwrap_or((f64::INFINITY, Vec::new()))
    };
    let held: Vec<Present> = present.iter().copied().filter(|i| i.allocated).collect();
    let (keep_stranded, keep_geometry) = best_with(&held);
    // Draining: every held instance is re-created (its holder restarts elsewhere on the GPU)
    // and the rest is filled.
    let (drain_stranded, drain_geometry) = {
        let mut best: (f64, Vec<(&'static Profile, u32)>) = (f64::INFINITY, Vec::new());
        for g in geometries(model, 0, SLICES_PER_GPU) {
            let mut wanted: Vec<&str> = held.iter().filter_map(|i| Some(i.profile?.name)).collect();
            let after: Vec<Present> = g
                .iter()
                .map(|&(p, s)| {
                    let allocated = match wanted.iter().position(|n| *n == p.name) {
                        Some(k) => {
                            wanted.swap_remove(k);
                            true
                        }
                        None => false,
                    };
                    Present {
                        profile: Some(p),
                        start: Some(s),
                        slices: p.compute_slices,
                        allocated,
                    }
                })
                .collect();
            if !wanted.is_empty() {
                continue;
            }
            let stranded = analyse(Some(model), &after, demand).stranded_slices;
            if stranded < best.0 - 1e-9 || (stranded < best.0 + 1e-9 && g.len() < best.1.len()) {
                best = (stranded, g);
            }
        }
        best
    };
    let unheld: Vec<usize> = (0..present.len())
        .filter(|&k| !present[k].allocated)
        .collect();
    let advice = if drain_stranded < keep_stranded - 1e-9 && !held.is_empty() {
        Advice {
            create: drain_geometry.iter().map(|(p, s)| (p.name, *s)).collect(),
            destroy: (0..present.len()).collect(),
            displace: (0..present.len())
                .filter(|&k| present[k].allocated)
                .collect(),
            stranded_slices_after: drain_stranded,
        }
    } else {
        Advice {
            create: keep_geometry.iter().map(|(p, s)| (p.name, *s)).collect(),
            destroy: unheld,
            displace: Vec::new(),
            stranded_slices_after: keep_stranded,
        }
    };
    // Re-creating the same unheld instances is no change.
    let same = {
        let mut a: Vec<(&str, u32)> = advice.create.clone();
        let mut b: Vec<(&str, u32)> = advice
            .destroy
            .iter()
            .filter_map(|&k| Some((present[k].profile?.name, present[k].start?)))
            .collect();
        a.sort();
        b.sort();
        a == b && advice.displace.is_empty()
    };
    (advice.stranded_slices_after < now - 1e-9 && !same).then_some(advice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuledger_schema::mig;

    fn h100() -> &'static GpuModel {
        mig::model("H100-80GB").unwrap()
    }

    fn inst(name: &str, start: u32, allocated: bool) -> Present {
        let p = h100().profile(name).unwrap();
        Present {
            profile: Some(p),
            start: Some(start),
            slices: p.compute_slices,
            allocated,
        }
    }

    fn demand(pairs: &[(&str, f64)]) -> Demand {
        Demand::from_counts(
            h100(),
            &pairs.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
        )
    }

    #[test]
    fn a_checkerboard_leaves_only_one_slice_profiles() {
        // 1g.10gb held at slots 0, 2, 4, 6: three compute slices free at slots 1, 3, 5 (7 is
        // never a start for a 1g), nothing larger fits.
        let present: Vec<Present> = [0, 2, 4, 6].map(|s| inst("1g.10gb", s, true)).to_vec();
        let f = analyse(Some(h100()), &present, &demand(&[("3g.40gb", 1.0)]));
        assert_eq!(f.free_slots, [1, 3, 5, 7]);
        assert_eq!(f.free_slices, 3);
        assert_eq!(f.largest_placeable_profile, Some("1g.10gb"));
        // A 3g-only demand can use none of it.
        assert_eq!(f.stranded_slices, 3.0);
        // A 1g-only demand can use all of it.
        let f = analyse(Some(h100()), &present, &demand(&[("1g.10gb", 1.0)]));
        assert_eq!(f.stranded_slices, 0.0);
        // Half and half: half of the 3 slices is stranded in expectation.
        let f = analyse(
            Some(h100()),
            &present,
            &demand(&[("1g.10gb", 1.0), ("3g.40gb", 1.0)]),
        );
        assert_eq!(f.stranded_slices, 1.5);
    }

    #[test]
    fn an_unheld_instance_is_free_capacity_of_its_own_profile() {
        let present = [inst("4g.40gb", 0, true), inst("3g.40gb", 4, false)];
        let f = analyse(Some(h100()), &present, &demand(&[("3g.40gb", 1.0)]));
        assert_eq!(f.free_slots, Vec::<u32>::new());
        assert_eq!(f.free_slices, 3);
        assert_eq!(f.largest_placeable_profile, Some("3g.40gb"));
        assert_eq!(f.stranded_slices, 0.0);
        // Requests for 1g slices cannot use an unheld 3g without re-partitioning.
        let f = analyse(Some(h100()), &present, &demand(&[("1g.10gb", 1.0)]));
        assert_eq!(f.stranded_slices, 3.0);
        let a = advise(h100(), &present, &demand(&[("1g.10gb", 1.0)])).unwrap();
        assert_eq!(a.destroy, [1]);
        assert_eq!(a.displace, Vec::<usize>::new());
        assert_eq!(a.stranded_slices_after, 0.0);
        // Leaving the freed slots unpartitioned is enough: nothing to create.
        assert_eq!(a.create, Vec::<(&str, u32)>::new());
    }

    #[test]
    fn an_empty_gpu_strands_only_what_no_geometry_can_use() {
        let f = analyse(Some(h100()), &[], &demand(&[("3g.40gb", 1.0)]));
        // Two 3g instances take 6 of 7 slices: one is stranded.
        assert_eq!(f.stranded_slices, 1.0);
        assert_eq!(f.largest_placeable_profile, Some("7g.80gb"));
        assert_eq!(f.free_slots, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn draining_is_advised_only_when_keeping_the_held_instances_cannot_help() {
        // 1g slices held at slots 3 and 5 block both 3g placements (slots 0-3 and 4-7): the
        // only cure is to move them, which displaces their holders.
        let present = [inst("1g.10gb", 3, true), inst("1g.10gb", 5, true)];
        let d = demand(&[("3g.40gb", 1.0)]);
        let f = analyse(Some(h100()), &present, &d);
        assert_eq!(f.largest_placeable_profile, Some("2g.20gb"));
        assert_eq!(f.stranded_slices, 5.0);
        let a = advise(h100(), &present, &d).unwrap();
        assert_eq!(a.displace, [0, 1]);
        // Re-created side by side, they leave room for one 3g: 2 of 5 free slices stranded.
        assert_eq!(a.stranded_slices_after, 2.0);
        assert_eq!(a.create.iter().filter(|(p, _)| *p == "1g.10gb").count(), 2);
        // With one of them alone, a 3g still fits at slot 4 and nothing needs to move.
        let one = [inst("1g.10gb", 3, true)];
        assert_eq!(analyse(Some(h100()), &one, &d).stranded_slices, 3.0);
        let a = advise(h100(), &one, &d);
        assert!(a.as_ref().is_none_or(|a| a.displace.is_empty()), "{a:?}");
    }

    #[test]
    fn a_whole_gpu_is_free_only_when_unheld() {
        let whole = |allocated| Present {
            profile: None,
            start: None,
            slices: 7,
            allocated,
        };
        let d = demand(&[]);
        let f = analyse(Some(h100()), &[whole(true)], &d);
        assert_eq!((f.free_slices, f.largest_placeable_profile), (0, None));
        let f = analyse(None, &[whole(false)], &d);
        assert_eq!(
            (f.free_slices, f.largest_placeable_profile),
            (7, Some("whole"))
        );
        assert_eq!(f.stranded_slices, 0.0);
    }
}
