//! Traces with known answers for the analytics tests, built in code: a hoarder, a busy job, an
//! idle latency-critical replica, a slice changing tenant mid-hour, a whole GPU becoming
//! unallocated, a checkerboard MIG layout; and random fleets for the invariants.

use gpuledger_schema::{Attribution, Counters, Instance, Sample, SloClass};

pub const H100: &str = "NVIDIA H100 80GB HBM3";

pub fn mig(gpu: &str, gi: u32, start: u32) -> Instance {
    Instance {
        node: "n1".into(),
        gpu_uuid: gpu.into(),
        gpu_model: H100.into(),
        mig_profile: Some("1g.10gb".into()),
        gpu_instance_id: Some(gi),
        placement_start: Some(start),
        placement_size: Some(1),
    }
}

pub fn whole(node: &str, gpu: &str) -> Instance {
    Instance {
        node: node.into(),
        gpu_uuid: gpu.into(),
        gpu_model: H100.into(),
        mig_profile: None,
        gpu_instance_id: None,
        placement_start: None,
        placement_size: None,
    }
}

pub fn held(tenant: &str, workload: &str, class: SloClass) -> Attribution {
    Attribution {
        tenant: Some(tenant.into()),
        workload: Some(workload.into()),
        slo_class: Some(class),
        owner: None,
        owner_ref: None,
    }
}

pub fn sample(t: i64, instance: &Instance, attribution: Attribution, sm: Option<f64>) -> Sample {
    Sample {
        timestamp: t,
        instance: instance.clone(),
        attribution,
        counters: Counters {
            sm_active: sm,
            ..Counters::default()
        },
    }
}

/// Two hours from `t0` (whole hour) on node n1. GPU-A is a checkerboard of four held 1g.10gb slices (slots
/// 0, 2, 4, 6); GPU-B is a whole GPU.
pub fn known_trace(t0: i64) -> Vec<Sample> {
    let a0 = mig("GPU-A", 7, 0);
    let a2 = mig("GPU-A", 8, 2);
    let a4 = mig("GPU-A", 9, 4);
    let a6 = mig("GPU-A", 10, 6);
    let b = whole("n1", "GPU-B");
    let mut out = Vec::new();
    for t in t0..t0 + 7200 {
        // The hoarder: idle for two hours but for one second at 100 % (minute 20).
        let blip = if t == t0 + 20 * 60 + 5 { 1.0 } else { 0.0 };
        out.push(sample(
            t,
            &a0,
            held("team-a", "team-a/notebook-1", SloClass::Interactive),
            Some(blip),
        ));
        out.push(sample(
            t,
            &a2,
            held("team-b", "team-b/train-1", SloClass::Batch),
            Some(0.8),
        ));
        out.push(sample(
            t,
            &a4,
            held("team-c", "team-c/infer-0", SloClass::LatencyCritical),
            Some(0.01),
        ));
        // Changes tenant at t0 + 30 min + 17 s.
        if t < t0 + 1817 {
            out.push(sample(
                t,
                &a6,
                held("team-a", "team-a/job-x", SloClass::Batch),
                Some(0.0),
            ));
        } else {
            out.push(sample(
                t,
                &a6,
                held("team-b", "team-b/job-y", SloClass::Batch),
                Some(0.5),
            ));
        }
        // Busy, with every 10th second unmeasured; nobody holds it for the last 30 minutes.
        let sm = (t % 10 != 0).then_some(0.6);
        if t < t0 + 5400 {
            out.push(sample(
                t,
                &b,
                held("team-b", "team-b/train-2", SloClass::Batch),
                sm,
            ));
        } else {
            out.push(sample(t, &b, Attribution::default(), sm));
        }
    }
    out
}

/// A deterministic pseudo-random sequence (the same cases on every machine).
pub struct Lcg(pub u64);
impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random fleet: 3 nodes, MIG GPUs with random legal geometries that change over time, whole
/// GPUs, holders that come and go, gaps in reporting, unmeasured seconds.
pub fn random_trace(seed: u64, t0: i64, seconds: i64) -> Vec<Sample> {
    let mut rng = Lcg(seed);
    let model = gpuledger_schema::mig::model("H100-80GB").unwrap();
    let geometries: &[&[&str]] = &[
        &["1g.10gb"; 7],
        &["3g.40gb", "3g.40gb"],
        &["4g.40gb", "2g.20gb", "1g.10gb"],
        &["2g.20gb", "2g.20gb", "3g.40gb"],
        &["7g.80gb"],
        &["1g.20gb", "1g.20gb", "3g.40gb"],
    ];
    let tenants = ["t1", "t2", "t3"];
    let mut out = Vec::new();
    let start = t0 - 1800 + rng.below(3600) as i64;
    for g in 0..4 {
        let node = format!("node-{}", g % 3);
        let uuid = format!("GPU-{seed}-{g}");
        let is_mig = g != 3;
        let mut t = start;
        while t < start + seconds {
            let span = 200 + rng.below(1500) as i64;
            let geometry = geometries[rng.below(geometries.len() as u64) as usize];
            let placed = gpuledger_schema::mig::place(model, geometry).unwrap();
            let instances: Vec<Instance> = if is_mig {
                placed
                    .iter()
                    .enumerate()
                    .map(|(k, (p, s))| Instance {
                        node: node.clone(),
                        gpu_uuid: uuid.clone(),
                        gpu_model: H100.into(),
                        mig_profile: Some(p.name.into()),
                        gpu_instance_id: Some(k as u32 + 1),
                        placement_start: Some(*s),
                        placement_size: Some(p.size),
                    })
                    .collect()
            } else {
                vec![whole(&node, &uuid)]
            };
            let holders: Vec<Attribution> = instances
                .iter()
                .map(|_| match rng.below(4) {
                    0 => Attribution::default(),
                    k => held(
                        tenants[k as usize - 1],
                        &format!("{}/w{}", tenants[k as usize - 1], rng.below(3)),
                        SloClass::ALL[rng.below(3) as usize],
                    ),
                })
                .collect();
            let gap = rng.below(5) == 0;
            for tt in t..(t + span).min(start + seconds) {
                if gap && tt < t + 90 {
                    continue; // the node did not report
                }
                for (i, h) in instances.iter().zip(&holders) {
                    let sm = (rng.below(20) != 0).then(|| rng.below(1001) as f64 / 1000.0);
                    out.push(sample(tt, i, h.clone(), sm));
                }
            }
            t += span;
        }
    }
    out
}
