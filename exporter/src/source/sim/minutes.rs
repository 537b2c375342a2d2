//! The simulator at minute resolution: how `gpuledger demo` lays down a month of history in
//! seconds instead of the hours that 1 s samples of it would take.
//!
//! Key decision: who holds an instance stays exact to the second (the leases are the same ones
//! [`Simulator::second`] uses, so allocated GPU-seconds and the minute masks are what a second-by-
//! second run would store), while each counter is its **expected value over the minute** under
//! the same model: the per-second noise averaged out, the per-minute draws (an inference burst, a
//! notebook's busy minute) taken exactly. A [`MinuteReading`] therefore stands for `mask`'s
//! seconds, each reading `counters`; the aggregator stores it as exactly that (see
//! `store::writer::minutes`).

use std::f64::consts::TAU;

use gpuledger_schema::{Attribution, Counters, Instance};
use rand::RngExt;

use super::{Behaviour, Lease, SimInstance, Simulator, derived_counters, rng};

/// One instance, one UTC minute, one holder (or nobody): the seconds of the minute it covers and
/// what each of them reads.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteReading {
    /// The instance.
    pub instance: Instance,
    /// Who held it during these seconds (default: nobody).
    pub attribution: Attribution,
    /// The minute's first second (a multiple of 60).
    pub bucket: i64,
    /// Bit `s` set: second `bucket + s` is covered.
    pub mask: u64,
    /// Every covered second's counters.
    pub counters: Counters,
}

/// All 60 seconds of a minute.
const FULL: u64 = (1 << 60) - 1;

impl Simulator {
    /// The minute view of every instance of `node` (every node when `None`) over the whole minutes
    /// in `from..to` (Unix seconds, rounded to minutes: `from` up, `to` down), instance by
    /// instance, oldest minute first. `each` is called once per (instance, minute, holder).
    pub fn minutes(
        &self,
        node: Option<&str>,
        from: i64,
        to: i64,
        mut each: impl FnMut(MinuteReading),
    ) {
        let first = from.div_euclid(60) * 60 + if from.rem_euclid(60) == 0 { 0 } else { 60 };
        let last = to.div_euclid(60) * 60;
        for gpu in self
            .gpus
            .iter()
            .filter(|g| node.is_none_or(|n| g.node == n))
        {
            for inst in &gpu.instances {
                // Leases last about `lease_minutes`: each is worked out once, not once a minute.
                let mut cached: Option<(i64, Option<Lease>)> = None;
                let mut lease_of = |slot: i64| -> Option<Lease> {
                    if cached.as_ref().is_none_or(|(s, _)| *s != slot) {
                        cached = Some((slot, self.lease_in_slot(inst, slot)));
                    }
                    cached.as_ref().and_then(|(_, l)| l.clone())
                };
                let mut bucket = first;
                while bucket < last {
                    // A minute spans at most two lease slots (a slot is longer than a minute).
                    let slots = [self.slot_of(inst, bucket), self.slot_of(inst, bucket + 59)];
                    let mut held = 0u64;
                    for (k, &slot) in slots.iter().enumerate() {
                        if k == 1 && slot == slots[0] {
                            break;
                        }
                        let Some(lease) = lease_of(slot) else {
                            continue;
                        };
                        let mask = seconds_between(bucket, lease.start, lease.end) & !held;
                        if mask == 0 {
                            continue;
                        }
                        held |= mask;
                        each(MinuteReading {
                            instance: inst.instance.clone(),
                            attribution: Attribution {
                                tenant: Some(lease.tenant.clone()),
                                workload: Some(lease.workload.clone()),
                                slo_class: Some(lease.slo_class),
                                owner: None,
                                owner_ref: None,
                            },
                            bucket,
                            mask,
                            counters: self.expected_counters(inst, Some(&lease), bucket),
                        });
                    }
                    if held != FULL {
                        each(MinuteReading {
                            instance: inst.instance.clone(),
                            attribution: Attribution::default(),
                            bucket,
                            mask: FULL & !held,
                            counters: self.expected_counters(inst, None, bucket),
                        });
                    }
                    bucket += 60;
                }
            }
        }
    }

    /// [`Simulator::counters`]' expected values over the minute starting at `bucket`.
    fn expected_counters(
        &self,
        inst: &SimInstance,
        lease: Option<&Lease>,
        bucket: i64,
    ) -> Counters {
        let minute = (bucket / 60) as u64;
        let (sm, fb_share) = match lease {
            None => (0.0, 0.0),
            Some(l) => {
                let sm = match l.behaviour {
                    // The noise is symmetric around the base.
                    Behaviour::Training => 0.88 * l.intensity.min(1.1),
                    Behaviour::Inference => {
                        let hour = (bucket + 30).rem_euclid(86_400) as f64 / 3600.0;
                        let diurnal = 0.5 + 0.5 * (TAU * (hour - 9.0) / 24.0).sin();
                        let burst = rng(&[inst.key, 4, minute]).random_bool(0.1);
                        0.08 + 0.55 * diurnal * l.intensity + if burst { 0.25 } else { 0.0 }
                    }
                    Behaviour::Notebook => {
                        if rng(&[inst.key, 5, minute]).random_bool(0.04) {
                            0.45
                        } else {
                            // A 1 % chance of a 0.5 blip, otherwise uniform on 0–0.02.
                            0.01 * 0.5 + 0.99 * 0.01
                        }
                    }
                    Behaviour::Abandoned => 0.0,
                };
                (sm.clamp(0.0, 1.0), l.fb_share)
            }
        };
        let whole_gpu = inst.instance.mig_profile.is_none();
        let (tx, rx) = match (whole_gpu, lease.map(|l| l.behaviour)) {
            (false, _) => (None, None),
            (true, Some(Behaviour::Training)) => {
                let rate = (60e9 * sm + 5e9) as u64;
                (Some(rate), Some(rate))
            }
            (true, Some(Behaviour::Inference)) => (Some(100_000_000), Some(100_000_000)),
            (true, _) => (Some(0), Some(0)),
        };
        derived_counters(inst, lease, sm, fb_share, (tx, rx))
    }
}

/// The seconds of the minute at `bucket` that fall in `start..end`, as a mask.
fn seconds_between(bucket: i64, start: i64, end: i64) -> u64 {
    let lo = (start - bucket).clamp(0, 60);
    let hi = (end - bucket).clamp(0, 60);
    if hi <= lo {
        return 0;
    }
    (FULL >> (60 - (hi - lo))) << lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::sim::Fleet;

    fn holder(a: &Attribution) -> Option<String> {
        a.workload.clone()
    }

    #[test]
    fn the_minute_view_has_the_same_holders_second_by_second() {
        let sim = Simulator::new(Fleet::builtin());
        // Three hours from an odd start: leases begin and end inside these minutes.
        let from = 1_700_000_000 / 60 * 60;
        let to = from + 3 * 3600;
        let mut minutes = Vec::new();
        sim.minutes(None, from, to, |m| minutes.push(m));
        let mut by_second = std::collections::HashMap::new();
        for m in &minutes {
            for s in 0..60 {
                if m.mask & (1 << s) != 0 {
                    let key = (m.instance.clone(), m.bucket + s);
                    assert!(
                        by_second.insert(key, holder(&m.attribution)).is_none(),
                        "a second is covered twice"
                    );
                }
            }
        }
        let mut seconds = 0;
        for t in from..to {
            for r in sim.second(None, t).readings {
                seconds += 1;
                assert_eq!(
                    by_second.get(&(r.instance.clone(), t)),
                    Some(&holder(&r.attribution)),
                    "{t} {:?}",
                    r.instance
                );
            }
        }
        assert_eq!(seconds, by_second.len(), "every second, once");
        assert!(
            minutes
                .iter()
                .any(|m| m.mask != FULL && m.attribution.tenant.is_some()),
            "some lease starts or ends mid-minute"
        );
    }

    #[test]
    fn the_minute_view_is_the_mean_of_the_seconds_within_the_noise() {
        let sim = Simulator::new(Fleet::builtin());
        let from = 1_700_000_000 / 60 * 60;
        let to = from + 6 * 3600;
        let mut expected = 0.0;
        sim.minutes(None, from, to, |m| {
            expected += m.counters.sm_active.unwrap_or(0.0) * f64::from(m.mask.count_ones());
        });
        let mut measured = 0.0;
        for t in from..to {
            for r in sim.second(None, t).readings {
                measured += r.counters.sm_active.unwrap_or(0.0);
            }
        }
        let ratio = expected / measured;
        assert!(
            (0.97..1.03).contains(&ratio),
            "Σ SM activity: minute view {expected:.0}, seconds {measured:.0}"
        );
    }

    #[test]
    fn masks_cover_the_seconds_between_two_instants() {
        assert_eq!(seconds_between(60, 0, 1000), FULL);
        assert_eq!(seconds_between(60, 90, 1000), FULL & !((1 << 30) - 1));
        assert_eq!(seconds_between(60, 0, 61), 1);
        assert_eq!(seconds_between(60, 119, 200), 1 << 59);
        assert_eq!(seconds_between(60, 120, 200), 0);
        assert_eq!(seconds_between(60, 0, 60), 0);
    }
}
