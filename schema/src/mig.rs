//! MIG geometry: the GPU models gpuledger knows, their instance profiles and where each profile
//! may be placed.
//!
//! The tables follow NVIDIA's MIG user guide ("Supported MIG Profiles" and the placement lists
//! `nvidia-smi mig -lgipp` prints). Placements are in memory slices: every supported GPU has 8
//! memory-slice slots and 7 compute slices; a profile may start only at the listed slots and
//! covers `size` slots from there. Two instances conflict when their slot ranges overlap.

/// Compute slices in a whole MIG-capable GPU.
pub const SLICES_PER_GPU: u32 = 7;
/// Memory-slice placement slots in a MIG-capable GPU.
pub const PLACEMENT_SLOTS: u32 = 8;

/// One GPU instance profile and its legal placements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// The profile name as NVML and nvidia-smi print it (`3g.40gb`).
    pub name: &'static str,
    /// Compute slices (the `3` in `3g.40gb`).
    pub compute_slices: u32,
    /// Framebuffer of an instance of this profile, in bytes.
    pub fb_bytes: u64,
    /// Slots at which an instance may start.
    pub starts: &'static [u32],
    /// Slots an instance covers.
    pub size: u32,
}

impl Profile {
    /// Whether an instance of this profile may start at `start`.
    pub fn can_start_at(&self, start: u32) -> bool {
        self.starts.contains(&start)
    }
}

/// A GPU model gpuledger can simulate and place instances on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuModel {
    /// Short name used in configuration (`H100-80GB`).
    pub key: &'static str,
    /// The product name NVML reports (`NVIDIA H100 80GB HBM3`).
    pub nvml_name: &'static str,
    /// Framebuffer of the whole GPU, in bytes.
    pub fb_bytes: u64,
    /// Whether the GPU has GPM (Hopper and newer): SM, tensor and DRAM activity per MIG instance.
    pub has_gpm: bool,
    /// Board power with the GPU powered and nothing running, watts: the default `idle_watts` of
    /// the energy split (`schema/ANALYTICS.md`, "Energy and carbon") and the simulator's floor.
    pub idle_watts: f64,
    /// Board power limit (TDP), watts: what the simulator draws at full activity.
    pub max_watts: f64,
    /// MIG profiles, smallest first.
    pub profiles: &'static [Profile],
}

impl GpuModel {
    /// The profile called `name` on this model.
    pub fn profile(&self, name: &str) -> Option<&'static Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

const GIB: u64 = 1 << 30;
const ONE_SLOT: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN_SLOTS: &[u32] = &[0, 2, 4, 6];
const TWO_G_SLOTS: &[u32] = &[0, 2, 4];
const HALF_SLOTS: &[u32] = &[0, 4];
const FIRST_SLOT: &[u32] = &[0];

const fn p(
    name: &'static str,
    compute_slices: u32,
    gib: u64,
    starts: &'static [u32],
    size: u32,
) -> Profile {
    Profile {
        name,
        compute_slices,
        fb_bytes: gib * GIB,
        starts,
        size,
    }
}

/// The GPU models gpuledger knows, in the order of their NVIDIA generation.
pub const MODELS: &[GpuModel] = &[
    GpuModel {
        key: "A100-40GB",
        nvml_name: "NVIDIA A100-SXM4-40GB",
        fb_bytes: 40 * GIB,
        has_gpm: false,
        idle_watts: 50.0,
        max_watts: 400.0,
        profiles: &[
            p("1g.5gb", 1, 5, ONE_SLOT, 1),
            p("1g.10gb", 1, 10, EVEN_SLOTS, 2),
            p("2g.10gb", 2, 10, TWO_G_SLOTS, 2),
            p("3g.20gb", 3, 20, HALF_SLOTS, 4),
            p("4g.20gb", 4, 20, FIRST_SLOT, 4),
            p("7g.40gb", 7, 40, FIRST_SLOT, 8),
        ],
    },
    GpuModel {
        key: "A100-80GB",
        nvml_name: "NVIDIA A100-SXM4-80GB",
        fb_bytes: 80 * GIB,
        has_gpm: false,
        idle_watts: 60.0,
        max_watts: 400.0,
        profiles: &[
            p("1g.10gb", 1, 10, ONE_SLOT, 1),
            p("1g.20gb", 1, 20, EVEN_SLOTS, 2),
            p("2g.20gb", 2, 20, TWO_G_SLOTS, 2),
            p("3g.40gb", 3, 40, HALF_SLOTS, 4),
            p("4g.40gb", 4, 40, FIRST_SLOT, 4),
            p("7g.80gb", 7, 80, FIRST_SLOT, 8),
        ],
    },
    GpuModel {
        key: "H100-80GB",
        nvml_name: "NVIDIA H100 80GB HBM3",
        fb_bytes: 80 * GIB,
        has_gpm: true,
        idle_watts: 70.0,
        max_watts: 700.0,
        profiles: &[
            p("1g.10gb", 1, 10, ONE_SLOT, 1),
            p("1g.20gb", 1, 20, EVEN_SLOTS, 2),
            p("2g.20gb", 2, 20, TWO_G_SLOTS, 2),
            p("3g.40gb", 3, 40, HALF_SLOTS, 4),
            p("4g.40gb", 4, 40, FIRST_SLOT, 4),
            p("7g.80gb", 7, 80, FIRST_SLOT, 8),
        ],
    },
    GpuModel {
        key: "H200-141GB",
        nvml_name: "NVIDIA H200",
        fb_bytes: 141 * GIB,
        has_gpm: true,
        idle_watts: 75.0,
        max_watts: 700.0,
        profiles: &[
            p("1g.18gb", 1, 18, ONE_SLOT, 1),
            p("1g.35gb", 1, 35, EVEN_SLOTS, 2),
            p("2g.35gb", 2, 35, TWO_G_SLOTS, 2),
            p("3g.71gb", 3, 71, HALF_SLOTS, 4),
            p("4g.71gb", 4, 71, FIRST_SLOT, 4),
            p("7g.141gb", 7, 141, FIRST_SLOT, 8),
        ],
    },
];

/// The model with configuration key `key` (`H100-80GB`) or NVML name (`NVIDIA H100 80GB HBM3`).
pub fn model(key_or_nvml_name: &str) -> Option<&'static GpuModel> {
    MODELS
        .iter()
        .find(|m| m.key == key_or_nvml_name || m.nvml_name == key_or_nvml_name)
}

/// An instance's size in GPU-equivalents: compute slices / 7 for a MIG profile, 1 for a whole
/// GPU (`None`); `None` for a name that is not a MIG profile.
pub fn gpu_equivalents_of(profile: Option<&str>) -> Option<f64> {
    let slices = match profile {
        None => SLICES_PER_GPU,
        Some(p) => compute_slices_of(p)?,
    };
    Some(f64::from(slices) / f64::from(SLICES_PER_GPU))
}

/// Compute slices of a profile name (`3g.40gb` → 3), whatever the model.
pub fn compute_slices_of(profile: &str) -> Option<u32> {
    let (n, rest) = profile.split_once("g.")?;
    if rest.is_empty() {
        return None;
    }
    let n: u32 = n.parse().ok()?;
    (1..=SLICES_PER_GPU).contains(&n).then_some(n)
}

/// One instance placed on a GPU: `(profile, start)`.
pub type Placement<'a> = (&'a Profile, u32);

/// Why a set of placements is not a legal MIG geometry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// A profile started where the placement table does not allow it.
    #[error("{profile} cannot start at slot {start} (allowed: {allowed:?})")]
    BadStart {
        /// Profile name.
        profile: &'static str,
        /// Requested start slot.
        start: u32,
        /// Allowed start slots.
        allowed: &'static [u32],
    },
    /// Two instances cover the same memory slot.
    #[error("{a} at slot {a_start} overlaps {b} at slot {b_start}")]
    Overlap {
        /// First profile.
        a: &'static str,
        /// Its start.
        a_start: u32,
        /// Second profile.
        b: &'static str,
        /// Its start.
        b_start: u32,
    },
    /// More compute slices than the GPU has.
    #[error("the instances use {0} compute slices; a GPU has 7")]
    TooManySlices(u32),
}

/// Checks that `placements` can coexist on one GPU.
pub fn check_geometry(placements: &[Placement<'_>]) -> Result<(), GeometryError> {
    let mut slices = 0;
    for (i, (a, a_start)) in placements.iter().enumerate() {
        if !a.can_start_at(*a_start) {
            return Err(GeometryError::BadStart {
                profile: a.name,
                start: *a_start,
                allowed: a.starts,
            });
        }
        slices += a.compute_slices;
        for (b, b_start) in &placements[i + 1..] {
            let disjoint = a_start + a.size <= *b_start || b_start + b.size <= *a_start;
            if !disjoint {
                return Err(GeometryError::Overlap {
                    a: a.name,
                    a_start: *a_start,
                    b: b.name,
                    b_start: *b_start,
                });
            }
        }
    }
    if slices > SLICES_PER_GPU {
        return Err(GeometryError::TooManySlices(slices));
    }
    Ok(())
}

/// Finds a legal placement for `profiles` on an empty GPU (a backtracking search over the
/// placement tables, the choice `nvidia-smi mig -cgi` leaves to the driver). The result is in the
/// order of `profiles`; `None` if no geometry holds them all.
pub fn place<'m>(model: &'m GpuModel, profiles: &[&str]) -> Option<Vec<Placement<'m>>> {
    let profiles: Vec<&'m Profile> = profiles
        .iter()
        .map(|n| model.profile(n))
        .collect::<Option<_>>()?;
    let mut placed: Vec<Placement<'m>> = Vec::with_capacity(profiles.len());
    fn search<'m>(rest: &[&'m Profile], placed: &mut Vec<Placement<'m>>) -> bool {
        let Some((profile, rest)) = rest.split_first() else {
            return true;
        };
        for &start in profile.starts {
            placed.push((profile, start));
            if check_geometry(placed).is_ok() && search(rest, placed) {
                return true;
            }
            placed.pop();
        }
        false
    }
    search(&profiles, &mut placed).then_some(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> &'static GpuModel {
        model("H100-80GB").unwrap()
    }

    #[test]
    fn seven_small_instances_fill_a_gpu() {
        let fit = place(h100(), &["1g.10gb"; 7]).unwrap();
        let starts: Vec<u32> = fit.iter().map(|(_, s)| *s).collect();
        assert_eq!(starts, [0, 1, 2, 3, 4, 5, 6]);
        assert!(place(h100(), &["1g.10gb"; 8]).is_none());
    }

    #[test]
    fn the_guide_geometries_are_legal() {
        for geometry in [
            &["4g.40gb", "3g.40gb"][..],
            &["3g.40gb", "3g.40gb"],
            &["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            &["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"],
            &["7g.80gb"],
            &["1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb"],
        ] {
            assert!(place(h100(), geometry).is_some(), "{geometry:?}");
        }
    }

    #[test]
    fn illegal_geometries_are_refused() {
        let m = h100();
        let three = m.profile("3g.40gb").unwrap();
        let four = m.profile("4g.40gb").unwrap();
        assert!(matches!(
            check_geometry(&[(three, 2)]),
            Err(GeometryError::BadStart { .. })
        ));
        assert!(matches!(
            check_geometry(&[(four, 0), (three, 0)]),
            Err(GeometryError::Overlap { .. })
        ));
        assert!(place(m, &["4g.40gb", "4g.40gb"]).is_none());
        assert!(place(m, &["7g.80gb", "1g.10gb"]).is_none());
    }

    #[test]
    fn profile_names_give_compute_slices() {
        assert_eq!(compute_slices_of("3g.40gb"), Some(3));
        assert_eq!(compute_slices_of("7g.141gb"), Some(7));
        assert_eq!(compute_slices_of("8g.1gb"), None);
        assert_eq!(compute_slices_of("whole"), None);
        for m in MODELS {
            for p in m.profiles {
                assert_eq!(
                    compute_slices_of(p.name),
                    Some(p.compute_slices),
                    "{}",
                    p.name
                );
                assert!(p.starts.iter().all(|s| s + p.size <= PLACEMENT_SLOTS));
            }
        }
    }
}
