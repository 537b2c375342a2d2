//! The split of one GPU-second's measured energy among the instances on the GPU
//! (`schema/ANALYTICS.md`, "Energy and carbon"): Kepler's idle/active model, extended to MIG.
//!
//! Key decision: the split is made per second, where it is made once ‒ in the ledger's writer,
//! as the second is stored ‒ never from minute sums. The idle part `min(E, idle_watts × 1 s)` is
//! not linear in E, and the active part is a ratio of one second's readings, so a minute's sums
//! would give another answer whenever the load or the holder changes inside it.

/// One instance on the GPU during the second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Part {
    /// Its compute slices out of [`crate::mig::SLICES_PER_GPU`] (a whole GPU is 7; 0 for a profile
    /// the geometry does not know, which then takes no energy).
    pub slices: u32,
    /// Its SM activity in the second, 0–1; `None` = not measured.
    pub sm_active: Option<f64>,
}

/// What one instance gets, joules.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Share {
    /// Its part of the idle floor.
    pub idle: f64,
    /// Its part of the energy above the floor.
    pub active: f64,
}

/// The split of one GPU-second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Split {
    /// The idle floor of the second: `min(E, idle_watts × 1 s)`.
    pub idle: f64,
    /// What no instance covers (slices without an instance): the fleet's `unallocated`, with
    /// the parts of instances nobody holds. `E = Σ parts + uncovered` to rounding.
    pub uncovered: f64,
}

/// Splits `energy` joules of one GPU-second among `parts`, writing each part's [`Share`] into
/// `out` (the same length as `parts`).
///
/// - `E_idle = min(E, idle_watts × 1 s)`, shared by compute slices: an instance of `c` slices
///   gets `c / D` of it, `D = max(7, Σ c)` (the maximum guards a geometry that reports more
///   slices than a GPU has).
/// - `E_active = E − E_idle`, shared in proportion to `sm_active × c` over the parts with a
///   reading; when that sum is 0, or no part has a reading, it is shared like `E_idle`.
/// - What is left (slices no instance covers) is `uncovered`.
pub fn split_second(energy: f64, idle_watts: f64, parts: &[Part], out: &mut [Share]) -> Split {
    debug_assert_eq!(parts.len(), out.len());
    let e_idle = energy.min(idle_watts.max(0.0));
    let e_active = energy - e_idle;
    let slices: u32 = parts.iter().map(|p| p.slices).sum();
    let d = f64::from(slices.max(crate::mig::SLICES_PER_GPU));
    let weight: f64 = parts
        .iter()
        .filter_map(|p| p.sm_active.map(|sm| sm * f64::from(p.slices)))
        .sum();
    let mut given = 0.0;
    for (p, o) in parts.iter().zip(out.iter_mut()) {
        let c = f64::from(p.slices);
        o.idle = e_idle * c / d;
        o.active = if weight > 0.0 {
            e_active * p.sm_active.unwrap_or(0.0) * c / weight
        } else {
            e_active * c / d
        };
        given += o.idle + o.active;
    }
    Split {
        idle: e_idle,
        uncovered: (energy - given).max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(e: f64, idle: f64, parts: &[Part]) -> (Vec<Share>, Split) {
        let mut out = vec![Share::default(); parts.len()];
        let s = split_second(e, idle, parts, &mut out);
        (out, s)
    }

    fn part(slices: u32, sm: Option<f64>) -> Part {
        Part {
            slices,
            sm_active: sm,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
    }

    /// The worked case of ANALYTICS.md: 70 W idle, 420 J; a busy 3g, an idle 2g, an unheld 1g,
    /// one slice without an instance.
    #[test]
    fn the_worked_case_of_the_definition() {
        let (out, s) = split(
            420.0,
            70.0,
            &[part(3, Some(0.5)), part(2, Some(0.0)), part(1, Some(0.2))],
        );
        assert!(close(out[0].idle, 30.0) && close(out[1].idle, 20.0) && close(out[2].idle, 10.0));
        assert!(close(out[0].active, 350.0 * 1.5 / 1.7));
        assert_eq!(out[1].active, 0.0);
        assert!(close(out[2].active, 350.0 * 0.2 / 1.7));
        assert!(close(out[0].idle + out[0].active, 338.823_529_411_764_7));
        assert!(close(s.uncovered, 10.0) && close(s.idle, 70.0));
    }

    #[test]
    fn below_the_idle_floor_everything_is_idle_and_split_by_slices() {
        let (out, s) = split(35.0, 70.0, &[part(7, Some(0.9))]);
        assert_eq!((out[0].idle, out[0].active, s.uncovered), (35.0, 0.0, 0.0));
    }

    #[test]
    fn without_activity_or_readings_the_active_part_goes_by_slices() {
        for sm in [Some(0.0), None] {
            let (out, s) = split(140.0, 70.0, &[part(4, sm), part(2, sm)]);
            assert!(
                close(out[0].active, 40.0) && close(out[1].active, 20.0),
                "{sm:?}"
            );
            assert!(close(s.uncovered, 20.0), "{sm:?}");
        }
        // A part without a reading beside one with activity gets no active energy.
        let (out, _) = split(140.0, 70.0, &[part(4, None), part(2, Some(0.1))]);
        assert_eq!(out[0].active, 0.0);
        assert!(close(out[1].active, 70.0));
    }

    #[test]
    fn more_slices_than_a_gpu_has_still_sum_to_the_energy() {
        let (out, s) = split(100.0, 70.0, &[part(7, Some(0.5)), part(7, Some(0.5))]);
        let sum: f64 = out.iter().map(|o| o.idle + o.active).sum();
        assert!(close(sum + s.uncovered, 100.0));
        assert!(close(out[0].idle, 35.0));
    }

    #[test]
    fn the_parts_always_sum_to_the_energy() {
        // A small deterministic sweep in place of a property test.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 10_000) as f64 / 10_000.0
        };
        for _ in 0..2_000 {
            let n = 1 + (next() * 7.0) as usize;
            let parts: Vec<Part> = (0..n)
                .map(|_| part(1 + (next() * 3.0) as u32, (next() > 0.2).then(|| next())))
                .collect();
            let e = next() * 800.0;
            let (out, s) = split(e, 70.0, &parts);
            let sum: f64 = out.iter().map(|o| o.idle + o.active).sum();
            assert!((sum + s.uncovered - e).abs() <= 1e-9, "{parts:?} {e}");
            assert!(out.iter().all(|o| o.idle >= 0.0 && o.active >= 0.0));
        }
    }
}
