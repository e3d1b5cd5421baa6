//! Synthetic fleets and job queues for benchmarks (deterministic, no I/O).
//! Not a model of any real fleet; sizes and prices are spread over the
//! ranges of the sample fleet.

use std::sync::Arc;

use crate::feeds::CarbonSeries;
use crate::job::{JobSpec, Parallelism};
use crate::model::{ClusterConfig, DatasetConfig, FleetConfig, PoolConfig, Prices};
use crate::state::FleetState;
use crate::FleetModel;

/// A small deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const TYPES: [&str; 3] = ["H100", "A100", "H200"];
const PROVIDERS: [&str; 6] = ["aws", "lambda", "nebius", "onprem-a", "onprem-b", "onprem-c"];
const ZONES: [&str; 8] = ["US-CAL-CISO", "US-NY-NYIS", "US-TEX-ERCO", "US-MIDA-PJM", "DE-LU", "GB", "SG", "JP-TK"];

/// Regions used by a synthetic fleet of `n` clusters (bounded: real fleets
/// have at most a few hundred provider regions).
pub fn region_count(n: usize) -> usize {
    (n / 5).clamp(1, 100)
}

/// A fleet of `n` clusters with 1–3 pools each and 20 datasets.
pub fn fleet_config(n: usize, seed: u64) -> FleetConfig {
    let mut r = Rng::new(seed);
    let nreg = region_count(n);
    let clusters = (0..n)
        .map(|i| {
            let prov = PROVIDERS[i % PROVIDERS.len()];
            let onprem = prov.starts_with("onprem");
            let npools = 1 + r.below(3) as usize;
            let pools = (0..npools)
                .map(|_| {
                    let t = TYPES[r.below(3) as usize];
                    let base = match t {
                        "H100" => 3.0,
                        "A100" => 1.5,
                        _ => 4.0,
                    };
                    let od = base * (0.8 + 2.0 * r.unit());
                    let nvl72 = r.below(8) == 0;
                    PoolConfig {
                        name: None,
                        gpu_type: t.into(),
                        gpus_per_node: if nvl72 { 4 } else { 8 },
                        nodes: if nvl72 { 18 } else { 4 + r.below(60) as u32 },
                        nvlink_domain_gpus: Some(if nvl72 { 72 } else { 8 }),
                        ib_fabric: (r.below(4) != 0).then(|| "ib".to_string()),
                        ib_island_nodes: None,
                        rack_power_cap_w: (r.below(3) == 0).then(|| 20000.0 + 60000.0 * r.unit()),
                        nodes_per_rack: Some(4),
                        gpu_power_w: None,
                        node_overhead_w: None,
                        cooling: Default::default(),
                        prices: Some(if onprem {
                            Prices { onprem: Some(od * 0.5), ..Prices::default() }
                        } else {
                            Prices {
                                on_demand: Some(od),
                                spot: (r.below(2) == 0).then_some(od * 0.35),
                                ..Prices::default()
                            }
                        }),
                    }
                })
                .collect();
            ClusterConfig {
                name: format!("c{i:04}"),
                provider: prov.into(),
                region: format!("r{}", r.below(nreg as u64)),
                carbon_zone: Some(ZONES[i % ZONES.len()].into()),
                onprem,
                provision_s: if onprem { 0.0 } else { 300.0 + 300.0 * r.unit() },
                spot_preemptions_per_hour: if onprem { 0.0 } else { 0.1 },
                pools,
                ..ClusterConfig::default()
            }
        })
        .collect();
    let datasets = (0..20)
        .map(|d| DatasetConfig {
            uri: format!("s3://bench/ds{d}/"),
            locations: vec![format!("{}:r{}", PROVIDERS[d % 3], r.below(nreg as u64))],
            size_gb: 10.0 + 5000.0 * r.unit(),
        })
        .collect();
    FleetConfig { clusters, datasets, ..FleetConfig::default() }
}

/// `n` jobs homed on random clusters of a fleet of `clusters`.
pub fn jobs(n: usize, clusters: usize, seed: u64) -> Vec<JobSpec> {
    let mut r = Rng::new(seed ^ 0xA5A5);
    (0..n)
        .map(|i| {
            let gpus = [1u32, 1, 2, 4, 8, 8, 16, 32, 64][r.below(9) as usize];
            let par = [Parallelism::Data, Parallelism::Tp, Parallelism::Fsdp][r.below(3) as usize];
            let par = if par == Parallelism::Tp && gpus > 8 && r.below(2) == 0 { Parallelism::Fsdp } else { par };
            JobSpec {
                id: format!("j{i}"),
                gpu_types: match r.below(4) {
                    0 => vec![],
                    1 => vec!["H100".into(), "H200".into()],
                    _ => vec![TYPES[r.below(3) as usize].into()],
                },
                gpus,
                parallelism: par,
                duration_s: 600.0 + 86400.0 * r.unit() * r.unit(),
                interruptible: r.below(2) == 0,
                ckpt_interval_s: Some(1800.0),
                datasets: if r.below(3) == 0 { vec![format!("s3://bench/ds{}/x", r.below(20))] } else { vec![] },
                max_price: (r.below(5) == 0).then(|| 2.0 + 4.0 * r.unit()),
                home: format!("c{:04}", r.below(clusters as u64)),
                ..JobSpec::default()
            }
        })
        .collect()
}

/// A busy state: random free GPUs, hourly carbon series for every zone.
pub fn busy_state(m: &FleetModel, seed: u64) -> FleetState {
    let mut r = Rng::new(seed ^ 0x5A5A);
    let mut st = FleetState::idle(m);
    for cs in &mut st.clusters {
        for ps in &mut cs.pools {
            ps.free_gpus = r.below(u64::from(ps.free_gpus) + 1) as u32;
            ps.expected_wait_s = Some(3600.0 * r.unit() * 4.0);
        }
    }
    for z in m.carbon_zones.clone() {
        let v: Vec<f64> = (0..8760).map(|_| 50.0 + 600.0 * r.unit()).collect();
        st.set_carbon_series(m, Arc::new(CarbonSeries::new(z, 1_672_531_200.0, 3600.0, v.clone(), v)));
    }
    st.now_unix = 1_680_000_000.0;
    st
}
