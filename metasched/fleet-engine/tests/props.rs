//! Property tests: whatever the fleet, state and job, a placement never
//! violates a hard constraint, every cluster is ranked or excluded with a
//! reason, and the fast path agrees with the explanation.

use fleet_api::FleetMode;
use fleet_engine::model::{ClusterConfig, Cooling, DatasetConfig, FleetConfig, Health, PoolConfig, Prices};
use fleet_engine::{
    decide, explain, prepare, propose_migrations_unpruned, propose_migrations_with, FleetModel, FleetState, JobSpec,
    MigrationMargin, Parallelism, Policy, Pricing, RunningJob,
};
use proptest::prelude::*;

const TYPES: [&str; 3] = ["H100", "A100", "H200"];
const REGIONS: [(&str, &str); 4] =
    [("aws", "us-east-1"), ("aws", "eu-west-2"), ("lambda", "us-west-1"), ("onprem", "dc")];

fn price() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![Just(None), (0.0f64..20.0).prop_map(Some)]
}

fn pool() -> impl Strategy<Value = PoolConfig> {
    (
        0usize..3,
        prop::sample::select(vec![1u32, 2, 4, 8]),
        1u32..9,
        0u32..4,
        any::<bool>(),
        prop::option::of(1u32..9),
        prop::option::of(2000.0f64..80000.0),
        1u32..9,
        (price(), price(), price()),
    )
        .prop_map(|(t, gpn, nodes, nvl_mult, ib, island, cap, per_rack, (od, spot, onprem))| PoolConfig {
            name: None,
            gpu_type: TYPES[t].into(),
            gpus_per_node: gpn,
            nodes,
            nvlink_domain_gpus: Some(gpn * (1 << nvl_mult.min(3))),
            ib_fabric: ib.then(|| "ib".into()),
            ib_island_nodes: island,
            rack_power_cap_w: cap,
            nodes_per_rack: Some(per_rack),
            gpu_power_w: None,
            node_overhead_w: None,
            cooling: Cooling::Air,
            // At least one price so the model builds.
            prices: Some(Prices { on_demand: od.or(Some(3.0)), spot, onprem, running: None }),
        })
}

fn cluster(i: usize) -> impl Strategy<Value = ClusterConfig> {
    (
        0usize..4,
        any::<bool>(),
        prop::sample::select(vec![Health::Up, Health::Up, Health::Degraded, Health::Down]),
        prop::option::of(600.0f64..100000.0),
        prop::collection::vec(pool(), 0..4),
        0.0f64..1.0,
        0.0f64..1200.0,
    )
        .prop_map(move |(r, onprem, health, max_tl, pools, preempt, prov)| ClusterConfig {
            name: format!("c{i}"),
            provider: REGIONS[r].0.into(),
            region: REGIONS[r].1.into(),
            onprem,
            health,
            max_time_limit_s: max_tl,
            spot_preemptions_per_hour: preempt,
            provision_s: prov,
            pools,
            ..ClusterConfig::default()
        })
}

/// `provider:region` of `REGIONS[i]`.
fn qualified(i: usize) -> String {
    format!("{}:{}", REGIONS[i].0, REGIONS[i].1)
}

/// Clusters, and datasets `s3://d<i>` with a replica in one region each (the
/// jobs' data: egress and transfer time away from it).
fn fleet() -> impl Strategy<Value = FleetConfig> {
    (1usize..7, prop::collection::vec((0usize..4, 0.0f64..2000.0), 0..3)).prop_flat_map(|(n, data)| {
        (0..n).map(cluster).collect::<Vec<_>>().prop_map(move |clusters| FleetConfig {
            clusters,
            datasets: data
                .iter()
                .enumerate()
                .map(|(i, &(r, size_gb))| DatasetConfig {
                    uri: format!("s3://d{i}"),
                    locations: vec![qualified(r)],
                    size_gb,
                })
                .collect(),
            ..FleetConfig::default()
        })
    })
}

fn job(n_clusters: usize) -> impl Strategy<Value = JobSpec> {
    (
        prop_oneof![2 => Just(vec![]), 1 => prop::collection::vec(0usize..3, 1..3)],
        prop_oneof![6 => 0u32..20, 2 => 0u32..80, 1 => Just(u32::MAX)],
        prop_oneof![3 => Just(None), 1 => prop::option::of(0u32..10)],
        prop::sample::select(vec![Parallelism::Data, Parallelism::Tp, Parallelism::Fsdp]),
        prop_oneof![8 => 0.0f64..200000.0, 1 => Just(f64::NAN), 1 => Just(-1.0), 1 => Just(f64::INFINITY)],
        any::<bool>(),
        prop::option::of(prop_oneof![0.0f64..10000.0, Just(f64::NAN)]),
        prop_oneof![3 => Just(None), 1 => prop::option::of(0.0f64..12.0)],
        (
            prop_oneof![4 => Just(vec![]), 1 => prop::collection::vec(0usize..4, 1..3)],
            prop_oneof![4 => Just(vec![]), 1 => prop::collection::vec(0usize..4, 1..2)],
        ),
        prop_oneof![4 => Just(vec![]), 1 => prop::collection::vec(0usize..8, 1..3)],
        0usize..8,
        (
            prop_oneof![6 => Just(FleetMode::Auto), 1 => Just(FleetMode::Local), 1 => Just(FleetMode::Remote)],
            prop_oneof![3 => Just(None), 1 => prop::option::of(0.0f64..200000.0)],
            prop::collection::vec(0usize..3, 0..3),
        ),
    )
        .prop_map(
            move |(types, gpus, nodes, par, dur, intr, ckpt, maxp, (allow, deny), to, home, (mode, tl, data))| {
                let q = qualified;
                JobSpec {
                    id: "p".into(),
                    gpu_types: types.iter().map(|&t| TYPES[t].to_string()).collect(),
                    gpus,
                    nodes,
                    parallelism: par,
                    duration_s: dur,
                    time_limit_s: tl,
                    interruptible: intr,
                    ckpt_interval_s: ckpt,
                    max_price: maxp,
                    region_allow: allow.into_iter().map(q).collect(),
                    region_deny: deny.into_iter().map(q).collect(),
                    to: to.into_iter().map(|i| format!("c{i}")).collect(),
                    home: format!("c{}", home % n_clusters.max(1) + usize::from(home >= 6)),
                    mode,
                    datasets: data.into_iter().map(|i| format!("s3://d{i}/train")).collect(),
                    ..JobSpec::default()
                }
            },
        )
}

fn state(m: &FleetModel, seed: &[u32]) -> FleetState {
    let mut st = FleetState::idle(m);
    let mut k = 0usize;
    let mut next = || {
        k += 1;
        seed.get(k % seed.len().max(1)).copied().unwrap_or(0)
    };
    for cs in &mut st.clusters {
        cs.healthy = next() % 5 != 0;
        for ps in &mut cs.pools {
            ps.free_gpus = ps.free_gpus.min(next() % 40);
            ps.spot_available = next() % 2 == 0;
            ps.expected_wait_s = (next() % 3 == 0).then(|| f64::from(next() % 20000));
            // What a spot option pays after reclaims: the wait for spot to come
            // back (or on demand meanwhile) and how long a start keeps spot.
            ps.spot_recovery_s = (next() % 2 == 0).then(|| f64::from(next() % 20000));
            if next() % 3 == 0 {
                let lens = vec![0.2, 1.0, f64::from(next() % 50)];
                ps.spot_windows = fleet_engine::SpotWindows::new(lens).map(std::sync::Arc::new);
                ps.spot_window_since_unix = (next() % 2 == 0).then(|| -f64::from(next() % 36000));
            }
        }
    }
    st
}

/// The fleet with a copy of every cluster (`<name>-copy`, the same in all but
/// its name): exact ties everywhere.
fn with_copies(mut cfg: FleetConfig) -> Result<FleetModel, TestCaseError> {
    let copies: Vec<_> =
        cfg.clusters.iter().map(|c| ClusterConfig { name: format!("{}-copy", c.name), ..c.clone() }).collect();
    cfg.clusters.extend(copies);
    FleetModel::build(cfg).map_err(|e| TestCaseError::fail(e.to_string()))
}

/// Re-checks every hard constraint independently of the engine.
fn violation(
    m: &FleetModel,
    st: &FleetState,
    j: &JobSpec,
    policy: &Policy,
    p: &fleet_engine::Placement,
) -> Option<String> {
    let c = m.cluster(p.cluster)?;
    let pool = c.pools.get(p.pool as usize)?;
    let ps = &st.clusters[p.cluster as usize].pools[p.pool as usize];
    let g = j.gpus;
    let is_home = c.name == j.home;
    let fail = |s: &str| Some(format!("{s}: {} pool {}", c.name, pool.name));
    if c.health == Health::Down || !st.clusters[p.cluster as usize].healthy {
        return fail("unhealthy");
    }
    if (j.mode == FleetMode::Local && !is_home) || (j.mode == FleetMode::Remote && is_home) {
        return fail("mode");
    }
    if !j.to.is_empty() && !j.to.contains(&c.name) {
        return fail("to");
    }
    if j.region_deny.contains(&c.region) || (!j.region_allow.is_empty() && !j.region_allow.contains(&c.region)) {
        return fail("region");
    }
    if let Some(max) = c.max_time_limit_s {
        if j.time_limit_s.unwrap_or(j.duration_s) > max {
            return fail("time limit");
        }
    }
    let tname = m.gpu_type_name(pool.gpu_type);
    if !j.gpu_types.is_empty() && !j.gpu_types.iter().any(|t| t == tname) {
        return fail("gpu type");
    }
    if g > pool.total_gpus {
        return fail("capacity");
    }
    if let Some(n) = j.nodes.filter(|n| *n > 0) {
        if n > pool.nodes || g.div_ceil(n) > pool.gpus_per_node {
            return fail("node shape");
        }
    }
    let mut in_domain = g.min(pool.gpus_per_node);
    match j.parallelism {
        Parallelism::Tp => {
            if g > pool.nvlink_domain_gpus {
                return fail("tp split across NVLink domains");
            }
            in_domain = g;
        }
        Parallelism::Fsdp => {
            if g <= pool.nvlink_domain_gpus {
                in_domain = g;
            } else if pool.ib_fabric.is_none() || g > pool.ib_island_gpus {
                return fail("fsdp split across IB islands");
            }
        }
        Parallelism::Data => {}
    }
    if let Some(cap) = pool.rack_power_cap_w {
        let nodes = in_domain.div_ceil(pool.gpus_per_node).max(1);
        if g > 0 && f64::from(in_domain) * pool.gpu_power_w + f64::from(nodes) * pool.node_overhead_w > cap {
            return fail("power cap");
        }
    }
    let price = p.breakdown.price_per_gpu_hour;
    if j.max_price.is_some_and(|mx| price > mx) {
        return fail("max price");
    }
    match p.pricing {
        Pricing::Spot if !(j.interruptible && policy.allow_spot && ps.spot_available && !c.onprem) => {
            return fail("spot not allowed")
        }
        Pricing::Onprem if !c.onprem => return fail("onprem pricing on cloud"),
        Pricing::OnDemand if c.onprem => return fail("cloud pricing on-prem"),
        _ => {}
    }
    if !p.breakdown.total.is_finite() {
        return fail("non-finite score");
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_placement_violates_a_hard_constraint(
        (cfg, j) in fleet().prop_flat_map(|f| { let n = f.clusters.len(); (Just(f), job(n)) }),
        seed in prop::collection::vec(any::<u32>(), 1..16),
        pol in 0usize..3,
    ) {
        let m = FleetModel::build(cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let st = state(&m, &seed);
        let policy = [Policy::cost(), Policy::time(), Policy::green()][pol].clone();
        let fast = decide(&m, &st, &prepare(&m, &j), &policy);
        let d = explain(&m, &st, &j, &policy);
        prop_assert_eq!(d.ranked.len() + d.excluded.len(), m.clusters.len());
        prop_assert!(d.excluded.iter().all(|e| !e.reason.trim().is_empty()));
        prop_assert_eq!(fast.map(|p| m.clusters[p.cluster as usize].name.clone()), d.chosen().map(|c| c.cluster.clone()));
        if let Some(p) = fast {
            if let Some(v) = violation(&m, &st, &j, &policy, &p) {
                return Err(TestCaseError::fail(format!("{v}\n{d}")));
            }
        }
        // Every ranked candidate is feasible too, not just the winner.
        let pj = prepare(&m, &j);
        for (cid, r) in fleet_engine::evaluate_all(&m, &st, &pj, &policy) {
            if let Ok(p) = r {
                prop_assert_eq!(p.cluster, cid);
                if let Some(v) = violation(&m, &st, &j, &policy, &p) {
                    return Err(TestCaseError::fail(format!("{v}\n{d}")));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// `decide`'s pruning (home first, per-cluster floors, ties) picks exactly
    /// the placement `explain` ranks first, also when clusters are copies of
    /// each other (equal scores: ties go home first, then to the lower id).
    #[test]
    fn decide_is_explains_first_choice_with_duplicate_clusters(
        (cfg, j) in fleet().prop_flat_map(|f| { let n = f.clusters.len(); (Just(f), job(n)) }),
        seed in prop::collection::vec(any::<u32>(), 1..16),
        pol in 0usize..3,
    ) {
        let m = with_copies(cfg)?;
        let st = state(&m, &seed);
        let policy = [Policy::cost(), Policy::time(), Policy::green()][pol].clone();
        let fast = decide(&m, &st, &prepare(&m, &j), &policy);
        let d = explain(&m, &st, &j, &policy);
        let key = |cl: &str, pool: &str, pr: Pricing, total: f64| (cl.to_string(), pool.to_string(), pr, total.to_bits());
        prop_assert_eq!(
            fast.map(|p| {
                let c = &m.clusters[p.cluster as usize];
                key(&c.name, &c.pools[p.pool as usize].name, p.pricing, p.breakdown.total)
            }),
            d.chosen().map(|c| key(&c.cluster, &c.pool, c.pricing, c.breakdown.total))
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The rebalancing pass's pruning (its bound from staying, the margin and
    /// the best saving so far; the clusters' floors; kgCO2 only for the chosen
    /// moves) proposes exactly what a plain scan of every cluster does, also
    /// when clusters are copies of each other (equal savings: the lower id).
    #[test]
    fn rebalancing_proposes_what_a_plain_scan_does(
        (cfg, jobs) in fleet().prop_flat_map(|f| {
            let n = f.clusters.len();
            (Just(f), prop::collection::vec((job(n), 0usize..12, 0usize..3, 0usize..3, 0.0f64..200000.0, 0.0f64..20000.0), 1..6))
        }),
        seed in prop::collection::vec(any::<u32>(), 1..16),
        pol in 0usize..3,
        same_cluster in any::<bool>(),
        margin in (prop_oneof![Just(0.0), 0.0f64..50.0], prop_oneof![Just(0.0), 0.0f64..0.5]),
    ) {
        let m = with_copies(cfg)?;
        let st = state(&m, &seed);
        let policy = [Policy::cost(), Policy::time(), Policy::green()][pol].clone();
        let running: Vec<RunningJob> = jobs
            .into_iter()
            .map(|(mut j, c, p, k, left, since)| {
                j.interruptible = true;
                let cluster = (c % m.clusters.len()) as u32;
                let pool = (p % m.clusters[cluster as usize].pools.len().max(1)) as u16;
                let pricing = [Pricing::OnDemand, Pricing::Spot, Pricing::Onprem][k];
                RunningJob { job: prepare(&m, &j), cluster, pool, pricing, remaining_s: left, since_ckpt_s: since }
            })
            .collect();
        let margin = MigrationMargin { min_saving_usd: margin.0, min_saving_fraction: margin.1 };
        let key = |v: Vec<fleet_engine::MigrationProposal>| -> Vec<_> {
            v.into_iter()
                .map(|p| (p.index, p.to.cluster, p.to.pool, p.to.pricing, p.saving_usd.to_bits(), p.to.breakdown.kg_co2.to_bits()))
                .collect()
        };
        prop_assert_eq!(
            key(propose_migrations_with(&m, &st, &running, &policy, &margin, same_cluster)),
            key(propose_migrations_unpruned(&m, &st, &running, &policy, &margin, same_cluster))
        );
    }
}

/// The property above is not vacuous: a good share of generated cases
/// do get placed (and many get excluded).
#[test]
fn generated_cases_exercise_both_outcomes() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strat = fleet().prop_flat_map(|f| {
        let n = f.clusters.len();
        (Just(f), job(n))
    });
    let (mut placed, mut none, mut total) = (0, 0, 0);
    for _ in 0..400 {
        let Ok(tree) = strat.new_tree(&mut runner) else {
            continue;
        };
        let (cfg, j) = tree.current();
        let Ok(m) = FleetModel::build(cfg) else {
            continue;
        };
        let st = state(&m, &[7, 3, 11, 2, 9]);
        total += 1;
        match decide(&m, &st, &prepare(&m, &j), &Policy::cost()) {
            Some(_) => placed += 1,
            None => none += 1,
        }
    }
    eprintln!("placed {placed}, unplaced {none}, of {total}");
    assert!(total >= 350, "{total}");
    assert!(placed * 10 >= total, "only {placed}/{total} placed");
    assert!(none * 10 >= total, "only {none}/{total} unplaced");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Parsers return errors, never panic, whatever the text.
    #[test]
    fn parsers_never_panic(s in "(?s).{0,300}", pick in 0usize..6) {
        use fleet_engine::feeds::{CARBON_HEADER, PRICES_HEADER};
        let _ = fleet_engine::parse_duration(&s);
        let _ = fleet_engine::Directives::parse(&format!("#FLEET {s}"));
        let _ = fleet_engine::feeds::parse_datetime_utc(&s);
        match pick {
            0 => { let _ = fleet_engine::parse_prices(&format!("{PRICES_HEADER}\n{s}")); }
            1 => { let _ = fleet_engine::parse_carbon(&format!("{CARBON_HEADER}\n{s}")); }
            2 => { let _ = fleet_engine::parse_egress("aws", &format!(",a,b\n{s}")); }
            3 => { let _ = FleetModel::from_toml_str(&s); }
            4 => { let _ = fleet_engine::Policies::from_toml_str(&s); }
            _ => { let _ = fleet_engine::parse_prices(&s); }
        }
    }

    #[test]
    fn numeric_fields_never_panic(a in any::<u64>(), b in any::<i64>(), c in any::<u32>()) {
        let _ = fleet_engine::parse_duration(&format!("{a}-{c}:{c}:{c}"));
        let _ = fleet_engine::parse_duration(&format!("{a}h{c}m"));
        let _ = fleet_engine::feeds::parse_datetime_utc(&format!("{b}-{c}-{c} {c}:{c}:{c}"));
        let _ = fleet_engine::parse_carbon(&format!("datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh\n{b}-01-01 00:00:00,Z,{a},{c}\n"));
    }
}
