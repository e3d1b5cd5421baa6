//! Table tests of the engine on small fleets written here.

use std::sync::Arc;

use fleet_api::FleetMode;
use fleet_engine::{
    all_options, decide, explain, prepare, propose_migrations, propose_migrations_with, FleetModel, FleetState,
    JobSpec, MigrationMargin, Parallelism, Policy, Pricing, RunningJob, SpotWindows,
};

fn fleet(toml: &str) -> FleetModel {
    match FleetModel::from_toml_str(toml) {
        Ok(m) => m,
        Err(e) => panic!("test fleet does not build: {e}"),
    }
}

/// `a` of [`DEAR_ON_DEMAND`] alone: on demand 6.00, spot 1.00, 0.1 reclaims per hour.
fn only_a() -> FleetModel {
    fleet(&DEAR_ON_DEMAND.split("[[clusters]]").take(2).collect::<Vec<_>>().join("[[clusters]]"))
}

/// An interruptible job of `hours` on 8 H100s at home on `a`, checkpointing every 30 min.
fn spot_job(hours: f64) -> JobSpec {
    JobSpec { interruptible: true, ckpt_interval_s: Some(1800.0), home: "a".into(), ..job(8, hours) }
}

/// A job of `hours` on H100s (the GPU most fleets here have).
fn job(gpus: u32, hours: f64) -> JobSpec {
    JobSpec {
        id: "j".into(),
        gpus,
        duration_s: hours * 3600.0,
        home: "home".into(),
        duration_gpu: Some("H100".into()),
        ..JobSpec::default()
    }
}

/// Where `job` lands (cluster name) under `policy` with an idle state,
/// and the explanation for the message.
fn place(m: &FleetModel, st: &FleetState, j: &JobSpec, policy: &Policy) -> (Option<String>, String) {
    let d = explain(m, st, j, policy);
    let fast = decide(m, st, &prepare(m, j), policy).map(|p| m.clusters[p.cluster as usize].name.clone());
    let slow = d.chosen().map(|c| c.cluster.clone());
    assert_eq!(fast, slow, "decide and explain disagree:\n{d}");
    assert_eq!(d.ranked.len() + d.excluded.len(), m.clusters.len(), "every cluster is ranked or excluded:\n{d}");
    for e in &d.excluded {
        assert!(!e.reason.trim().is_empty(), "cluster {} excluded without a reason", e.cluster);
    }
    (fast, d.to_string())
}

fn check(m: &FleetModel, j: &JobSpec, policy: &Policy, expected: Option<&str>) {
    let st = FleetState::idle(m);
    let (got, text) = place(m, &st, j, policy);
    assert_eq!(got.as_deref(), expected, "\n{text}");
}

/// Home on-prem H100 at 4.00 USD/GPU-h; a cloud H100 at 2.50 with 10 min
/// provisioning; NVL domains 8.
const HOME_AND_CLOUD: &str = r#"
[overheads]
remote_submit_s = 120
staging_latency_s = 60

[[clusters]]
name = "home"
provider = "onprem"
region = "east"
onprem = true
prices = { H100 = { onprem = 4.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 4
ib_fabric = "ib0"

[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
provision_s = 600
prices = { H100 = { on_demand = 2.5, spot = 1.0 } }
spot_preemptions_per_hour = 0.1
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 4
ib_fabric = "efa"
"#;

#[test]
fn short_jobs_stay_home_long_jobs_move() {
    let m = fleet(HOME_AND_CLOUD);
    let p = Policy::cost();
    // Break-even (docs/placement.md): D* = (V·(submit+prov) + p_r·prov) / Δp
    //   = (2·(2+10)/60 + 2.5·10/60) / 1.5 = (0.4 + 0.4167) / 1.5 ≈ 0.544 h.
    let cases: &[(f64, &str)] = &[(0.25, "home"), (0.5, "home"), (0.6, "cloud"), (2.0, "cloud"), (8.0, "cloud")];
    for &(h, want) in cases {
        check(&m, &job(8, h), &p, Some(want));
    }
}

#[test]
fn tp_16_never_split_across_nvlink_domains() {
    // "cheap" has many 8-GPU nodes; "nvl" has 72-GPU NVLink racks but costs more.
    let m = fleet(
        r#"
[[clusters]]
name = "cheap"
provider = "lambda"
region = "us-east-1"
prices = { H100 = { on_demand = 2.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 64
ib_fabric = "ib"

[[clusters]]
name = "nvl"
provider = "aws"
region = "us-east-1"
prices = { H200 = { on_demand = 5.0 } }
[[clusters.pools]]
gpu_type = "H200"
gpus_per_node = 4
nodes = 36
nvlink_domain_gpus = 72
"#,
    );
    let p = Policy::cost();
    let mk = |g: u32, par: Parallelism| JobSpec { parallelism: par, home: "cheap".into(), ..job(g, 4.0) };
    let cases: &[(u32, Parallelism, Option<&str>)] = &[
        (8, Parallelism::Tp, Some("cheap")),
        (16, Parallelism::Tp, Some("nvl")),
        (72, Parallelism::Tp, Some("nvl")),
        (80, Parallelism::Tp, None),
        (16, Parallelism::Fsdp, Some("cheap")), // IB fabric holds it
        (16, Parallelism::Data, Some("cheap")),
    ];
    for &(g, par, want) in cases {
        check(&m, &mk(g, par), &p, want);
    }
    // The reason names the NVLink domain.
    let d = explain(&m, &FleetState::idle(&m), &mk(16, Parallelism::Tp), &p);
    let why = &d.excluded.iter().find(|e| e.cluster == "cheap").map(|e| e.reason.clone()).unwrap_or_default();
    assert!(why.contains("NVLink"), "{why}");
    // Even when the NVL cluster is busy, tp 16 waits for it rather than split.
    let mut st = FleetState::idle(&m);
    st.clusters[1].pools[0].free_gpus = 0;
    let (got, text) = place(&m, &st, &mk(16, Parallelism::Tp), &p);
    assert_eq!(got.as_deref(), Some("nvl"), "{text}");
}

#[test]
fn data_gravity_flips_the_choice() {
    let m = fleet(
        r#"
[overheads]
internet_egress_usd_per_gb = { default = 0.09 }

[[clusters]]
name = "home"
provider = "aws"
region = "us-east-1"
prices = { A100 = { on_demand = 3.0 } }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 2

[[clusters]]
name = "far"
provider = "lambda"
region = "us-west-1"
prices = { A100 = { on_demand = 2.5 } }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 2

[[datasets]]
uri = "s3://small/"
locations = ["aws:us-east-1"]
size_gb = 10

[[datasets]]
uri = "s3://big/"
locations = ["aws:us-east-1"]
size_gb = 5000
"#,
    );
    let p = Policy::cost();
    // 8 GPUs × 10 h × 0.5 USD gap = 40 USD saved by moving; 10 GB costs
    // 0.9 USD to move, 5 TB costs 450 USD.
    let cases: &[(&str, &str)] = &[("s3://small/train", "far"), ("s3://big/train", "home")];
    for &(ds, want) in cases {
        let j = JobSpec { datasets: vec![ds.into()], ..job(8, 10.0) };
        check(&m, &j, &p, Some(want));
    }
}

#[test]
fn max_price_is_respected() {
    let m = fleet(HOME_AND_CLOUD);
    let p = Policy::cost();
    let cases: &[(Option<f64>, bool, Option<&str>)] = &[
        (None, false, Some("cloud")),
        (Some(3.0), false, Some("cloud")),
        (Some(2.0), false, None),
        (Some(2.0), true, Some("cloud")), // spot at 1.00 fits the cap
        (Some(0.5), true, None),
    ];
    for &(max, interruptible, want) in cases {
        let j = JobSpec { max_price: max, interruptible, ckpt_interval_s: Some(900.0), ..job(8, 8.0) };
        check(&m, &j, &p, want);
        if let Some(c) = explain(&m, &FleetState::idle(&m), &j, &p).chosen() {
            assert!(c.breakdown.price_per_gpu_hour <= max.unwrap_or(f64::INFINITY));
        }
    }
    let d = explain(&m, &FleetState::idle(&m), &JobSpec { max_price: Some(2.0), ..job(8, 8.0) }, &p);
    assert!(d.excluded.iter().all(|e| e.reason.contains("max-price")), "{d}");
}

#[test]
fn power_capped_rack_is_not_given_a_dense_job() {
    // "capped": NVL32 racks (8 nodes × 4 H100) under a 15 kW cap, cheap.
    // A 32-GPU tp job draws 32 × 700 W + 8 × 1.5 kW = 34.4 kW in one rack.
    let m = fleet(
        r#"
[[clusters]]
name = "capped"
provider = "onprem"
region = "dc1"
onprem = true
prices = { H100 = { onprem = 1.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 4
nodes = 16
nvlink_domain_gpus = 32
nodes_per_rack = 8
rack_power_cap_w = 15000

[[clusters]]
name = "dense"
provider = "onprem"
region = "dc1"
onprem = true
prices = { H100 = { onprem = 3.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 4
nodes = 16
nvlink_domain_gpus = 32
nodes_per_rack = 8
rack_power_cap_w = 60000
cooling = "liquid"
"#,
    );
    let p = Policy::cost();
    let mk = |g: u32, par| JobSpec { parallelism: par, home: "capped".into(), ..job(g, 4.0) };
    let cases: &[(u32, Parallelism, &str)] = &[
        (4, Parallelism::Tp, "capped"),    // 4×700 + 1.5 kW = 4.3 kW
        (8, Parallelism::Tp, "capped"),    // 8×700 + 2×1.5 kW = 8.6 kW
        (16, Parallelism::Tp, "dense"),    // 16×700 + 4×1.5 kW = 17.2 kW > 15
        (32, Parallelism::Tp, "dense"),    // 34.4 kW
        (32, Parallelism::Data, "capped"), // spread node by node: 4.3 kW per node
    ];
    for &(g, par, want) in cases {
        check(&m, &mk(g, par), &p, Some(want));
    }
    let d = explain(&m, &FleetState::idle(&m), &mk(32, Parallelism::Tp), &p);
    assert!(d.excluded.iter().any(|e| e.cluster == "capped" && e.reason.contains("power cap")), "{d}");
}

#[test]
fn every_excluded_cluster_has_a_reason() {
    let m = fleet(
        r#"
[[clusters]]
name = "home"
provider = "onprem"
region = "dc"
onprem = true
max_time_limit_s = 7200
prices = { A100 = { onprem = 1.0 } }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "down"
provider = "aws"
region = "us-east-1"
health = "down"
prices = { H100 = { on_demand = 3.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 8

[[clusters]]
name = "eu"
provider = "aws"
region = "eu-west-1"
prices = { H100 = { on_demand = 3.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 8

[[clusters]]
name = "small"
provider = "lambda"
region = "us-west-1"
prices = { H100 = { on_demand = 2.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "pricey"
provider = "nebius"
region = "us-central1"
prices = { H100 = { on_demand = 9.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 8
"#,
    );
    let mut st = FleetState::idle(&m);
    let j = JobSpec {
        gpu_types: vec!["H100".into()],
        region_deny: vec!["eu-*".into()],
        max_price: Some(5.0),
        time_limit_s: Some(4.0 * 3600.0),
        ..job(16, 4.0)
    };
    let d = explain(&m, &st, &j, &Policy::cost());
    assert!(d.chosen().is_none(), "{d}");
    let want: &[(&str, &str)] = &[
        ("home", "time limit"),
        ("down", "drained"),
        ("eu", "denied"),
        ("small", "needs 16 H100 GPUs"),
        ("pricey", "max-price"),
    ];
    for &(c, frag) in want {
        let r = d.excluded.iter().find(|e| e.cluster == c).map(|e| e.reason.as_str()).unwrap_or("");
        assert!(r.contains(frag), "{c}: {r:?} lacks {frag:?}\n{d}");
    }
    // Unhealthy (no heartbeat) and --fleet-to.
    st.clusters[3].healthy = false;
    let j2 = JobSpec { to: vec!["pricey".into()], ..job(8, 1.0) };
    let d = explain(&m, &st, &j2, &Policy::cost());
    assert_eq!(d.chosen().map(|c| c.cluster.as_str()), Some("pricey"), "{d}");
    let r = d.excluded.iter().find(|e| e.cluster == "small").map(|e| e.reason.clone()).unwrap_or_default();
    assert!(r.contains("heartbeat"), "{r}");
    let r = d.excluded.iter().find(|e| e.cluster == "eu").map(|e| e.reason.clone()).unwrap_or_default();
    assert!(r.contains("--fleet-to"), "{r}");
    // The printed table shows the breakdown columns and the reasons.
    let text = d.to_string();
    for frag in ["rank", "compute$", "egress$", "kgCO2", "total$", "excluded:", "pricey"] {
        assert!(text.contains(frag), "{frag} missing in\n{text}");
    }
}

#[test]
fn fleet_modes_and_spot() {
    let m = fleet(HOME_AND_CLOUD);
    let p = Policy::cost();
    type Case<'a> = (FleetMode, f64, bool, Option<&'a str>, Option<Pricing>);
    let cases: &[Case] = &[
        (FleetMode::Local, 8.0, false, Some("home"), Some(Pricing::Onprem)),
        (FleetMode::Remote, 0.1, false, Some("cloud"), Some(Pricing::OnDemand)),
        (FleetMode::Auto, 8.0, true, Some("cloud"), Some(Pricing::Spot)),
        (FleetMode::Auto, 8.0, false, Some("cloud"), Some(Pricing::OnDemand)),
    ];
    for &(mode, h, intr, want, pricing) in cases {
        let j = JobSpec { mode, interruptible: intr, ckpt_interval_s: Some(600.0), ..job(8, h) };
        let st = FleetState::idle(&m);
        let got = decide(&m, &st, &prepare(&m, &j), &p);
        assert_eq!(got.map(|g| m.clusters[g.cluster as usize].name.as_str()), want);
        assert_eq!(got.map(|g| g.pricing), pricing);
    }
    // The time policy never uses spot.
    let j = JobSpec { interruptible: true, ..job(8, 8.0) };
    let got = decide(&m, &FleetState::idle(&m), &prepare(&m, &j), &Policy::time());
    assert_ne!(got.map(|g| g.pricing), Some(Pricing::Spot));
}

#[test]
fn queue_wait_sends_jobs_elsewhere_under_time_policy() {
    let m = fleet(HOME_AND_CLOUD);
    let mut st = FleetState::idle(&m);
    // Home is full with a 3 h expected wait; a 0.5 h job now moves.
    st.clusters[0].pools[0].free_gpus = 0;
    st.clusters[0].pools[0].expected_wait_s = Some(3.0 * 3600.0);
    let (got, text) = place(&m, &st, &job(8, 0.5), &Policy::time());
    assert_eq!(got.as_deref(), Some("cloud"), "{text}");
}

#[test]
fn green_prefers_clean_zone_on_near_ties() {
    let m = fleet(
        r#"
[[clusters]]
name = "home"
provider = "aws"
region = "us-east-1"
carbon_zone = "DIRTY"
prices = { H100 = { on_demand = 3.00 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2

[[clusters]]
name = "clean"
provider = "aws"
region = "us-west-2"
carbon_zone = "CLEAN"
prices = { H100 = { on_demand = 3.10 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2
"#,
    );
    let mut st = FleetState::idle(&m);
    st.clusters[0].carbon_g_per_kwh = Some(700.0);
    st.clusters[1].carbon_g_per_kwh = Some(50.0);
    let j = job(8, 10.0);
    assert_eq!(place(&m, &st, &j, &Policy::cost()).0.as_deref(), Some("home"));
    assert_eq!(place(&m, &st, &j, &Policy::green()).0.as_deref(), Some("clean"));
    // Carbon series: the mean over the run window is used.
    let series = fleet_engine::CarbonSeries::new(
        "CLEAN".into(),
        0.0,
        3600.0,
        vec![900.0, 900.0, 10.0, 10.0, 10.0, 10.0],
        vec![0.0; 6],
    );
    assert!(st.set_carbon_series(&m, std::sync::Arc::new(series)));
    st.now_unix = 2.0 * 3600.0;
    let d = explain(&m, &st, &job(8, 2.0), &Policy::green());
    let clean = d.ranked.iter().find(|c| c.cluster == "clean").map(|c| c.breakdown.carbon_g_per_kwh);
    assert!(clean.is_some_and(|x| (x - 10.0).abs() < 1e-6), "{d}");
}

#[test]
fn rebalancing_moves_a_spot_job_when_it_pays() {
    let m = fleet(HOME_AND_CLOUD);
    let p = Policy::cost();
    let spec = JobSpec { interruptible: true, ckpt_interval_s: Some(1800.0), ckpt_size_gb: Some(10.0), ..job(8, 48.0) };
    let pj = prepare(&m, &spec);
    let st = FleetState::idle(&m);
    let run = |remaining_h: f64, since_ckpt_h: f64| RunningJob {
        job: pj.clone(),
        cluster: 0,
        pool: 0,
        pricing: Pricing::Onprem,
        remaining_s: remaining_h * 3600.0,
        since_ckpt_s: since_ckpt_h * 3600.0,
    };
    let margin = MigrationMargin::default();
    // 40 h left at home (4.00) vs cloud spot (1.00): move.
    let props = propose_migrations(&m, &st, &[run(40.0, 0.2)], &p, &margin);
    assert_eq!(props.len(), 1);
    assert_eq!(props[0].to.cluster, 1);
    assert!(props[0].saving_usd > margin.min_saving_usd);
    // 10 minutes left: not worth it.
    assert!(propose_migrations(&m, &st, &[run(10.0 / 60.0, 0.2)], &p, &margin).is_empty());
    // Not interruptible: never.
    let mut r = run(40.0, 0.0);
    r.job.spec.interruptible = false;
    assert!(propose_migrations(&m, &st, &[r], &p, &margin).is_empty());
    // Capacity: two jobs of 24 GPUs, cloud has 32 free: only one moves.
    let big = prepare(&m, &JobSpec { gpus: 24, ..spec.clone() });
    let rb = |_: usize| RunningJob { job: big.clone(), ..run(40.0, 0.0) };
    let props = propose_migrations(&m, &st, &[rb(0), rb(1)], &p, &margin);
    assert_eq!(props.len(), 1);
}

/// Cloud `a` (on-demand 6.00, spot 1.00) and on-prem `b` (2.00).
const DEAR_ON_DEMAND: &str = r#"
[[clusters]]
name = "a"
provider = "aws"
region = "us-east-1"
prices = { H100 = { on_demand = 6.0, spot = 1.0 } }
spot_preemptions_per_hour = 0.1
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 4

[[clusters]]
name = "b"
provider = "onprem"
region = "east"
onprem = true
prices = { H100 = { onprem = 2.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 4
"#;

#[test]
fn rebalancing_scores_staying_at_the_price_the_job_pays() {
    let m = fleet(DEAR_ON_DEMAND);
    let st = FleetState::idle(&m);
    let spec = spot_job(48.0);
    let pj = prepare(&m, &spec);
    let run = |pricing| RunningJob {
        job: pj.clone(),
        cluster: 0,
        pool: 0,
        pricing,
        remaining_s: 40.0 * 3600.0,
        since_ckpt_s: 600.0,
    };
    let margin = MigrationMargin::default();
    // On on-demand at 6.00 (spot at 1.00 is on offer there for new jobs, but this
    // job does not pay it): moving to b at 2.00 pays.
    let props = propose_migrations(&m, &st, &[run(Pricing::OnDemand)], &Policy::cost(), &margin);
    assert_eq!(props.len(), 1, "{props:?}");
    assert_eq!(props[0].to.cluster, 1);
    assert!((props[0].stay_usd - 6.0 * 8.0 * 40.0).abs() < 1e-6, "{props:?}");
    // The same job on spot at 1.00 stays.
    assert!(propose_migrations(&m, &st, &[run(Pricing::Spot)], &Policy::cost(), &margin).is_empty());
    // A pool or pricing the cluster does not have: scored by its best option (spot).
    let mut odd = run(Pricing::Onprem);
    odd.pool = 7;
    assert!(propose_migrations(&m, &st, &[odd], &Policy::cost(), &margin).is_empty());
}

#[test]
fn rebalancing_may_restart_a_job_on_spot_in_its_own_cluster_when_asked() {
    // Only cluster `a` (on-demand 6.00, spot 1.00): the on-demand job can only
    // save by going to spot there.
    let m = only_a();
    let st = FleetState::idle(&m);
    let spec = spot_job(48.0);
    let run = |pricing| RunningJob {
        job: prepare(&m, &spec),
        cluster: 0,
        pool: 0,
        pricing,
        remaining_s: 40.0 * 3600.0,
        since_ckpt_s: 600.0,
    };
    let margin = MigrationMargin::default();
    let p = Policy::cost();
    // Other clusters only (the production default): nothing to propose.
    assert!(propose_migrations(&m, &st, &[run(Pricing::OnDemand)], &p, &margin).is_empty());
    let props = propose_migrations_with(&m, &st, &[run(Pricing::OnDemand)], &p, &margin, true);
    assert_eq!(props.len(), 1, "{props:?}");
    assert_eq!((props[0].to.cluster, props[0].to.pool, props[0].to.pricing), (0, 0, Pricing::Spot));
    assert!(props[0].saving_usd > 0.10 * props[0].stay_usd, "{props:?}");
    // Already on spot: restarting in the same option is never proposed.
    assert!(propose_migrations_with(&m, &st, &[run(Pricing::Spot)], &p, &margin, true).is_empty());
    // No spot capacity now: nothing to move to.
    let mut busy = st.clone();
    busy.clusters[0].pools[0].spot_available = false;
    assert!(propose_migrations_with(&m, &busy, &[run(Pricing::OnDemand)], &p, &margin, true).is_empty());
}

#[test]
fn a_long_interruptible_job_queues_for_spot_when_the_wait_pays() {
    // `a` alone: on-demand 6.00, spot 1.00; spot taken now.
    let m = only_a();
    let spec = spot_job(20.0);
    let pj = prepare(&m, &spec);
    let mut st = FleetState::idle(&m);
    st.clusters[0].pools[0].spot_available = false;
    let pick = |st: &FleetState, p: &Policy| decide(&m, st, &pj, p).map(|x| (x.pricing, x.fits_now, x.breakdown));
    // No spot wait known: on-demand, as before.
    assert_eq!(pick(&st, &Policy::cost()).map(|x| x.0), Some(Pricing::OnDemand));
    // Spot back in 2 h: 2 h × 8 GPUs × 2 USD of waiting buys 5 USD/GPU-h × 160 GPU-h.
    st.clusters[0].pools[0].spot_wait_s = Some(2.0 * 3600.0);
    let (pricing, fits_now, b) = pick(&st, &Policy::cost()).expect("placed");
    assert_eq!((pricing, fits_now), (Pricing::Spot, false), "{b:?}");
    assert!((b.wait_h - 2.0).abs() < 1e-9, "the spot wait is scored: {b:?}");
    assert!((b.time_usd - 2.0 * 8.0 * b.delay_h()).abs() < 1e-9, "{b:?}");
    // The explanation ranks the same choice.
    let d = explain(&m, &st, &spec, &Policy::cost());
    assert_eq!(d.chosen().map(|c| c.pricing), Some(Pricing::Spot), "{d}");
    // A wait longer than the saving is worth: on-demand now.
    st.clusters[0].pools[0].spot_wait_s = Some(100.0 * 3600.0);
    assert_eq!(pick(&st, &Policy::cost()).map(|x| (x.0, x.1)), Some((Pricing::OnDemand, true)));
    // A policy that does not queue for spot, a job that is not interruptible,
    // a non-finite wait: never queued on spot.
    st.clusters[0].pools[0].spot_wait_s = Some(2.0 * 3600.0);
    let launch_only = Policy { spot_queue: false, ..Policy::cost() };
    assert_eq!(pick(&st, &launch_only).map(|x| x.0), Some(Pricing::OnDemand));
    let pinned = prepare(&m, &JobSpec { interruptible: false, ..spec.clone() });
    assert_eq!(decide(&m, &st, &pinned, &Policy::cost()).map(|x| x.pricing), Some(Pricing::OnDemand));
    st.clusters[0].pools[0].spot_wait_s = Some(f64::NAN);
    assert_eq!(pick(&st, &Policy::cost()).map(|x| x.0), Some(Pricing::OnDemand));
    // A job that never checkpoints, or whose checkpoint interval (30 min) does not
    // fit in the expected spot window (1 ÷ 3 reclaims/h = 20 min): no queueing,
    // it could wait for spot again after every reclaim and never finish.
    st.clusters[0].pools[0].spot_wait_s = Some(2.0 * 3600.0);
    let no_ckpt = prepare(&m, &JobSpec { ckpt_interval_s: None, ..spec.clone() });
    assert_eq!(decide(&m, &st, &no_ckpt, &Policy::cost()).map(|x| x.pricing), Some(Pricing::OnDemand));
    st.clusters[0].pools[0].spot_preemptions_per_hour = Some(3.0);
    assert_eq!(pick(&st, &Policy::cost()).map(|x| x.0), Some(Pricing::OnDemand));
    st.clusters[0].pools[0].spot_preemptions_per_hour = None;
    assert_eq!(pick(&st, &Policy::cost()).map(|x| x.0), Some(Pricing::Spot));
    // Spot free now: no wait, whatever the state says about waiting.
    st.clusters[0].pools[0].spot_available = true;
    st.clusters[0].pools[0].spot_wait_s = Some(100.0 * 3600.0);
    let (pricing, fits_now, b) = pick(&st, &Policy::cost()).expect("placed");
    assert_eq!((pricing, fits_now, b.wait_h), (Pricing::Spot, true, 0.0));
}

#[test]
fn a_time_value_per_job_hour_keeps_small_jobs_from_waiting_for_spot() {
    // `a` alone: on demand 6.00, spot 1.00, spot taken now and back in 2 h.
    let m = only_a();
    let mut st = FleetState::idle(&m);
    st.clusters[0].pools[0].spot_available = false;
    st.clusters[0].pools[0].spot_wait_s = Some(2.0 * 3600.0);
    // 20 USD per hour a job waits against 2.5 per GPU-hour: the same price of
    // delay for an 8-GPU job.
    let per_gpu = Policy { time_value_usd_per_gpu_hour: 2.5, ..Policy::cost() };
    let per_job = Policy { time_value_usd_per_gpu_hour: 0.0, time_value_usd_per_job_hour: 20.0, ..Policy::cost() };
    let pick = |spec: &JobSpec, p: &Policy| decide(&m, &st, &prepare(&m, spec), p).expect("placed");
    let big = spot_job(20.0);
    let (a, b) = (pick(&big, &per_gpu), pick(&big, &per_job));
    assert_eq!((a.pricing, b.pricing), (Pricing::Spot, Pricing::Spot), "{a:?} / {b:?}");
    assert_eq!(a.breakdown.time_usd, b.breakdown.time_usd);
    // A 4 h job on one GPU saves 5 USD × 4 GPU-h on spot. Per GPU-hour, its
    // 2 h wait costs 2.5 × 2 = 5 USD: it queues. Per job it costs 20 × 2 = 40:
    // it runs on demand now, as a mean completion over jobs would have it.
    let small = JobSpec { gpus: 1, ..spot_job(4.0) };
    let (a, b) = (pick(&small, &per_gpu), pick(&small, &per_job));
    assert_eq!((a.pricing, a.fits_now), (Pricing::Spot, false), "{a:?}");
    assert!((a.breakdown.time_usd - 2.5 * a.breakdown.delay_h()).abs() < 1e-9, "{a:?}");
    assert_eq!((b.pricing, b.fits_now), (Pricing::OnDemand, true), "{b:?}");
    // What the 1-GPU job would pay to wait: 20 USD per hour of its delay.
    let opts = all_options(&m, &st, &prepare(&m, &small), &per_job);
    let spot = opts.iter().find(|o| o.pricing == Pricing::Spot).expect("a spot option");
    assert!((spot.breakdown.time_usd - 20.0 * spot.breakdown.delay_h()).abs() < 1e-9, "{:?}", spot.breakdown);
}

#[test]
fn waiting_for_spot_again_after_reclaims_is_priced() {
    // `a` alone: on-demand 6.00, spot 1.00 free now, 0.1 reclaims per hour.
    let m = only_a();
    let spec = spot_job(20.0);
    let pj = prepare(&m, &spec);
    let mut st = FleetState::idle(&m);
    let b = decide(&m, &st, &pj, &Policy::cost()).expect("placed");
    assert_eq!((b.pricing, b.breakdown.requeue_h), (Pricing::Spot, 0.0), "not priced without a recovery time");
    // Spot comes back 1 h after a reclaim: 0.1/h × 20 h × 1 h of waiting.
    st.clusters[0].pools[0].spot_recovery_s = Some(3600.0);
    let b2 = decide(&m, &st, &pj, &Policy::cost()).expect("placed");
    assert_eq!(b2.pricing, Pricing::Spot);
    assert!((b2.breakdown.requeue_h - 2.0).abs() < 1e-9, "{:?}", b2.breakdown);
    assert!((b2.breakdown.time_usd - b.breakdown.time_usd - 2.0 * 8.0 * 2.0).abs() < 1e-9, "{:?}", b2.breakdown);
    assert_eq!(b2.breakdown.compute_usd, b.breakdown.compute_usd, "a delay, not billed");
    // Spot gone for 100 h after each reclaim: waiting (1,600 USD a reclaim at
    // 16 USD/h) costs more than going on demand at once and staying there until
    // the job ends, so that is charged. The job runs on spot until the first
    // reclaim (E[min(T, 20 h)] = (1 − e^−2) ÷ 0.1 = 8.65 h; the long-run share
    // 20 ÷ (1 + 0.1 × 100) = 1.8 h is smaller), so 0.865 reclaims, each one
    // more setup billed at 6 USD/h and waited, and the 11.35 h left on demand
    // at 5 USD/h more. Before 2026-12-04 it was charged 2 reclaims × 10 h on
    // demand: 20 on-demand hours for a 20 h job.
    st.clusters[0].pools[0].spot_recovery_s = Some(100.0 * 3600.0);
    let setup_h = (m.clusters[0].provision_s + m.overheads.restore_s) / 3600.0;
    let on_spot = (1.0 - (-2.0f64).exp()) / 0.1;
    let opts = all_options(&m, &st, &pj, &Policy::cost());
    let spot = opts.iter().find(|o| o.cluster == 0 && o.pricing == Pricing::Spot).expect("a spot option");
    assert!((spot.breakdown.requeue_h - 0.1 * on_spot * setup_h).abs() < 1e-9, "{:?}", spot.breakdown);
    // Work lost at reclaims (billed at spot's 1 USD/h) scales with them: 0.865 against 2.
    let lost = |x: &fleet_engine::Breakdown| 8.0 * 1.0 * x.lost_work_h;
    assert!((spot.breakdown.lost_work_h / b.breakdown.lost_work_h - 0.1 * on_spot / 2.0).abs() < 1e-9);
    let fallback = 8.0 * (5.0 * (20.0 - on_spot) + 0.1 * on_spot * 6.0 * setup_h);
    let extra = spot.breakdown.compute_usd - lost(&spot.breakdown) - (b.breakdown.compute_usd - lost(&b.breakdown));
    assert!((extra - fallback).abs() < 1e-6, "{:?}", spot.breakdown);
    // 960 USD all on demand against 69 on spot + 454 on demand + setups and
    // lost work: spot first is the cheaper bet.
    assert_eq!(decide(&m, &st, &pj, &Policy::cost()).map(|x| x.pricing), Some(Pricing::Spot));
    // Spot back in 4 h: waiting (2 reclaims × 64 USD) beats going on demand
    // (the run alternates 10 h on spot and 4 h on demand: 20 ÷ 1.4 = 14.3 h on
    // spot, 5.7 h × 8 × 5 USD = 229 USD more): the wait is what is charged.
    st.clusters[0].pools[0].spot_recovery_s = Some(4.0 * 3600.0);
    let b4 = decide(&m, &st, &pj, &Policy::cost()).expect("placed");
    assert_eq!(b4.pricing, Pricing::Spot);
    assert!((b4.breakdown.requeue_h - 8.0).abs() < 1e-9, "{:?}", b4.breakdown);
    assert_eq!(b4.breakdown.compute_usd, b.breakdown.compute_usd, "{:?}", b4.breakdown);
    // With the time value at 20 USD/GPU-h the waits cost 1,280 USD: on demand
    // meanwhile is charged instead (229 USD + 1.43 setups, billed and waited).
    let dear_time = Policy { time_value_usd_per_gpu_hour: 20.0, ..Policy::cost() };
    let o = all_options(&m, &st, &pj, &dear_time);
    let s4 = o.iter().find(|o| o.cluster == 0 && o.pricing == Pricing::Spot).expect("a spot option");
    let on_spot4 = 20.0 / 1.4;
    let fallback4 = 8.0 * (5.0 * (20.0 - on_spot4) + 0.1 * on_spot4 * 6.0 * setup_h);
    let extra4 = s4.breakdown.compute_usd - lost(&s4.breakdown) - (b.breakdown.compute_usd - lost(&b.breakdown));
    assert!((extra4 - fallback4).abs() < 1e-6, "{:?}", s4.breakdown);
    assert!((s4.breakdown.requeue_h - 0.1 * on_spot4 * setup_h).abs() < 1e-9, "{:?}", s4.breakdown);
}

#[test]
fn spot_windows_give_the_first_stretch_on_spot() {
    assert_eq!(SpotWindows::new(vec![f64::NAN, -1.0, 0.0]), None);
    let w = SpotWindows::new(vec![3.0, f64::INFINITY, 1.0]).expect("two windows");
    assert_eq!(w.lengths_h(), &[1.0, 3.0]);
    let close = |(e, p): (f64, f64), (e2, p2): (f64, f64)| {
        assert!((e - e2).abs() < 1e-12 && (p - p2).abs() < 1e-12, "({e}, {p}) against ({e2}, {p2})")
    };
    // A random moment of availability: the 3 h window holds it 3 times as
    // often as the 1 h one, at a uniform point. For 2 h: E[min(R, 2)] = (1 ×
    // 0.5 + 3 × (2 + 2) / 3) / 4, P(R ≤ 2) = (1 × 1 + 3 × 2/3) / 4.
    close(w.first_stretch(2.0, None), (1.125, 0.75));
    close(w.first_stretch(10.0, None), ((0.5 + 4.5) / 4.0, 1.0));
    // In a window 0.5 h old: 0.5 or 2.5 h left, each as likely.
    close(w.first_stretch(2.0, Some(0.5)), ((0.5 + 2.0) / 2.0, 0.5));
    // 1.5 h old: only the 3 h window lasts that long; 1.5 h left.
    close(w.first_stretch(1.0, Some(1.5)), (1.0, 0.0));
    close(w.first_stretch(2.0, Some(1.5)), (1.5, 1.0));
    // Older than every window seen: a random moment again.
    close(w.first_stretch(2.0, Some(5.0)), (1.125, 0.75));
    close(w.first_stretch(0.0, None), (0.0, 0.0));
}

#[test]
fn a_long_spot_window_makes_going_on_demand_after_a_reclaim_cheaper() {
    // As in `waiting_for_spot_again_after_reclaims_is_priced`: `a` alone, on
    // demand 6, spot 1, 0.1 reclaims/h, spot gone 100 h after a reclaim, a 20 h
    // job on 8 GPUs: going on demand after a reclaim is what is charged.
    let m = only_a();
    let spec = spot_job(20.0);
    let pj = prepare(&m, &spec);
    let mut st = FleetState::idle(&m);
    st.now_unix = 1000.0 * 3600.0;
    st.clusters[0].pools[0].spot_recovery_s = Some(100.0 * 3600.0);
    let setup_h = (m.clusters[0].provision_s + m.overheads.restore_s) / 3600.0;
    let spot_of = |st: &FleetState| {
        let o = all_options(&m, st, &pj, &Policy::cost());
        o.into_iter().find(|o| o.cluster == 0 && o.pricing == Pricing::Spot).expect("a spot option").breakdown
    };
    let exp = spot_of(&st);
    // Windows of 40 h seen: from a random moment the job keeps spot E[min(R,
    // 20)] = 20 − 400/80 = 15 h and is reclaimed with P = 0.5 (the exponential
    // gave 8.65 h and 0.865).
    st.clusters[0].pools[0].spot_windows = SpotWindows::new(vec![40.0]).map(Arc::new);
    let w = spot_of(&st);
    assert!((w.requeue_h - 0.5 * setup_h).abs() < 1e-9, "{w:?}");
    let premium = |on_spot: f64, n: f64| 8.0 * (5.0 * (20.0 - on_spot) + n * 6.0 * setup_h);
    let lost = |b: &fleet_engine::Breakdown| 8.0 * b.lost_work_h;
    let on_exp = (1.0 - (-2.0f64).exp()) / 0.1;
    let diff = (w.compute_usd - lost(&w)) - (exp.compute_usd - lost(&exp));
    assert!((diff - (premium(15.0, 0.5) - premium(on_exp, 0.1 * on_exp))).abs() < 1e-6, "{w:?}");
    assert!(w.total < exp.total);
    // In a window open for 10 h (30 h left of a 40 h one): no reclaim within the
    // job's 20 h, so nothing but spot is charged.
    st.clusters[0].pools[0].spot_window_since_unix = Some(st.now_unix - 10.0 * 3600.0);
    let aged = spot_of(&st);
    assert_eq!((aged.requeue_h, aged.lost_work_h), (0.0, 0.0), "{aged:?}");
    assert!((aged.compute_usd - 8.0 * 1.0 * (20.0 + m.clusters[0].provision_s / 3600.0)).abs() < 1e-6, "{aged:?}");
    // 35 h into it, 5 h left: reclaimed for sure, 5 h on spot and 15 h on demand.
    st.clusters[0].pools[0].spot_window_since_unix = Some(st.now_unix - 35.0 * 3600.0);
    let old = spot_of(&st);
    assert!((old.requeue_h - setup_h).abs() < 1e-9, "{old:?}");
    let diff = (old.compute_usd - lost(&old)) - (exp.compute_usd - lost(&exp));
    assert!((diff - (premium(5.0, 1.0) - premium(on_exp, 0.1 * on_exp))).abs() < 1e-6, "{old:?}");
}

#[test]
fn a_job_reclaimed_too_often_goes_on_demand() {
    // `a` alone: on-demand 6.00, spot 1.00.
    let m = only_a();
    let spec = spot_job(20.0);
    let mut st = FleetState::idle(&m);
    let capped = Policy { spot_max_reclaims: 3, spot_max_lost_h: 2.0, ..Policy::cost() };
    let pick = |st: &FleetState, reclaims: u32, lost_h: f64, p: &Policy| {
        let mut pj = prepare(&m, &spec);
        pj.spot_reclaims = reclaims;
        pj.spot_lost_h = lost_h;
        decide(&m, st, &pj, p).map(|x| x.pricing)
    };
    // Spot free now, and (second state) queued for: both end at the caps.
    let mut queued = st.clone();
    queued.clusters[0].pools[0].spot_available = false;
    queued.clusters[0].pools[0].spot_wait_s = Some(3600.0);
    for st in [&st, &queued] {
        assert_eq!(pick(st, 0, 0.0, &capped), Some(Pricing::Spot));
        assert_eq!(pick(st, 2, 1.9, &capped), Some(Pricing::Spot));
        assert_eq!(pick(st, 3, 0.0, &capped), Some(Pricing::OnDemand), "reclaim cap");
        assert_eq!(pick(st, 1, 2.0, &capped), Some(Pricing::OnDemand), "lost-work cap");
        // 0 = no cap.
        let uncapped = Policy { spot_max_reclaims: 0, spot_max_lost_h: 0.0, ..Policy::cost() };
        assert_eq!(pick(st, 1000, 1000.0, &uncapped), Some(Pricing::Spot));
    }
    // The built-in policies cap.
    assert!(Policy::cost().spot_max_reclaims > 0 && Policy::cost().spot_max_lost_h > 0.0);
    assert_eq!(pick(&st, Policy::cost().spot_max_reclaims, 0.0, &Policy::cost()), Some(Pricing::OnDemand));
    // A capped job running on-demand is not migrated back to spot.
    let mut pj = prepare(&m, &spec);
    pj.spot_reclaims = 3;
    let run = RunningJob {
        job: pj,
        cluster: 0,
        pool: 0,
        pricing: Pricing::OnDemand,
        remaining_s: 18.0 * 3600.0,
        since_ckpt_s: 0.0,
    };
    st.clusters[0].pools[0].spot_available = true;
    let margin = MigrationMargin::default();
    assert!(propose_migrations_with(&m, &st, std::slice::from_ref(&run), &capped, &margin, true).is_empty());
    let fresh = RunningJob { job: prepare(&m, &spec), ..run };
    assert_eq!(propose_migrations_with(&m, &st, &[fresh], &capped, &margin, true).len(), 1);
}

#[test]
fn a_migration_never_targets_spot_it_would_have_to_queue_for() {
    let m = only_a();
    let spec = spot_job(48.0);
    let run = RunningJob {
        job: prepare(&m, &spec),
        cluster: 0,
        pool: 0,
        pricing: Pricing::OnDemand,
        remaining_s: 40.0 * 3600.0,
        since_ckpt_s: 600.0,
    };
    let mut st = FleetState::idle(&m);
    st.clusters[0].pools[0].spot_available = false;
    st.clusters[0].pools[0].spot_wait_s = Some(60.0);
    let margin = MigrationMargin::default();
    assert!(propose_migrations_with(&m, &st, std::slice::from_ref(&run), &Policy::cost(), &margin, true).is_empty());
    st.clusters[0].pools[0].spot_available = true;
    assert_eq!(propose_migrations_with(&m, &st, &[run], &Policy::cost(), &margin, true).len(), 1);
}

#[test]
fn bad_inputs_do_not_panic() {
    let m = fleet(HOME_AND_CLOUD);
    let st = FleetState::idle(&m);
    let p = Policy::cost();
    for d in [f64::NAN, f64::INFINITY, -5.0, 0.0, 1e300] {
        for g in [0, 1, u32::MAX] {
            let j = JobSpec {
                duration_s: d,
                ckpt_interval_s: Some(d),
                ckpt_size_gb: Some(d),
                max_price: Some(d),
                ..job(g, 1.0)
            };
            let _ = explain(&m, &st, &j, &p).to_string();
            let _ = decide(&m, &st, &prepare(&m, &j), &p);
        }
    }
    // A state that does not match the model.
    let empty = FleetState::default();
    let d = explain(&m, &empty, &job(8, 1.0), &p);
    assert!(d.chosen().is_none());
    assert_eq!(d.excluded.len(), 2);
}

#[test]
fn sample_fleet_loads_and_places() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conf/fleet-sample.toml");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let m = fleet(&text);
    assert!(m.clusters.len() >= 8);
    let providers: std::collections::BTreeSet<&str> = m.clusters.iter().map(|c| c.provider.as_str()).collect();
    assert!(providers.len() >= 3, "{providers:?}");
    let regions: std::collections::BTreeSet<&str> = m.clusters.iter().map(|c| c.region.as_str()).collect();
    assert!(regions.len() >= 4);
    assert!(m.clusters.iter().any(|c| c.onprem) && m.clusters.iter().any(|c| !c.onprem));
    for t in ["H100", "A100", "H200"] {
        assert!(m.gpu_type_id(t).is_some(), "{t} missing");
    }
    let st = FleetState::idle(&m);
    let home = m.clusters[0].name.clone();
    for p in [Policy::cost(), Policy::time(), Policy::green()] {
        let d = explain(&m, &st, &JobSpec { home: home.clone(), ..job(8, 6.0) }, &p);
        assert!(d.chosen().is_some(), "{d}");
    }
}

#[test]
fn state_from_heartbeat_view() {
    use fleet_api::api::{ClusterSummary, FleetView, GpuPool};
    let m = fleet(HOME_AND_CLOUD);
    let view = FleetView {
        generated_at: 1000.0,
        clusters: vec![ClusterSummary {
            name: "cloud".into(),
            healthy: true,
            gpus: vec![GpuPool {
                gpu_type: "h100".into(),
                total: 32,
                free: 12,
                max_per_node: 8,
                nodes: 4,
                ..GpuPool::default()
            }],
            queue_pending: 3,
            ..ClusterSummary::default()
        }],
    };
    let st = FleetState::from_view(&m, &view);
    assert_eq!(st.now_unix, 1000.0);
    // "home" sent no heartbeat: unhealthy; "cloud" has 12 free H100.
    assert!(!st.clusters[0].healthy);
    assert!(st.clusters[1].healthy);
    assert_eq!(st.clusters[1].pools[0].free_gpus, 12);
    assert_eq!(st.clusters[1].queue_pending, 3);
    // A 16-GPU job does not fit now: it is still placed, with the history wait.
    let d = explain(&m, &st, &job(16, 4.0), &Policy::cost());
    let c = d.chosen().unwrap_or_else(|| panic!("{d}"));
    assert_eq!((c.cluster.as_str(), c.fits_now), ("cloud", false), "{d}");
    assert!(c.breakdown.wait_h > 0.0);
}

/// Three clusters, one with T4s, one A100s, one H100s, priced per GPU-hour so
/// that the T4 is cheapest per hour but dearest per unit of work.
const MIXED: &str = r#"
[[clusters]]
name = "t4"
provider = "aws"
region = "us-east-1"
prices = { T4 = { on_demand = 0.5 } }
[[clusters.pools]]
gpu_type = "T4"
gpus_per_node = 8
nodes = 4
[[clusters]]
name = "a100"
provider = "aws"
region = "us-east-1"
prices = { A100 = { on_demand = 1.5 } }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 4
[[clusters]]
name = "home"
provider = "aws"
region = "us-east-1"
prices = { H100 = { on_demand = 2.5 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 4
"#;

#[test]
fn run_time_cost_and_carbon_scale_with_the_gpu_model() {
    let m = fleet(MIXED);
    let st = FleetState::idle(&m);
    let p = Policy::cost();
    // 10 h of A100 work (the reference): T4 0.15× = 66.7 h × 0.5 = 33.3 USD/GPU,
    // A100 10 h × 1.5 = 15, H100 10/1.9 = 5.26 h × 2.5 = 13.2: the H100 wins.
    let spec = JobSpec { duration_gpu: None, ..job(1, 10.0) };
    let d = explain(&m, &st, &spec, &p);
    let by_type = |t: &str| d.ranked.iter().find(|c| c.gpu_type == t).map(|c| c.breakdown).unwrap_or_default();
    assert_eq!(d.chosen().map(|c| c.gpu_type.as_str()), Some("H100"), "{d}");
    assert!((by_type("T4").compute_usd - 0.5 * 10.0 / 0.15).abs() < 1e-9, "{d}");
    assert!((by_type("A100").compute_usd - 15.0).abs() < 1e-9, "{d}");
    assert!((by_type("H100").compute_usd - 2.5 * 10.0 / 1.9).abs() < 1e-9, "{d}");
    // carbon follows the run time: power × hours (T4 70 W × 66.7 h vs H100 700 W × 5.26 h)
    let kg = |t: &str, w: f64, h: f64| (by_type(t).kg_co2 - 400.0 * w * h * 1.4 / 1e6).abs() < 1e-9;
    assert!(kg("T4", 70.0, 10.0 / 0.15) && kg("H100", 700.0, 10.0 / 1.9), "{d}");
    // the estimate of a job that asks for T4s only is T4 time: it stays 10 h there
    let t4 = JobSpec { gpu_types: vec!["T4".into()], duration_gpu: None, ..job(1, 10.0) };
    let d = explain(&m, &st, &t4, &p);
    assert!((d.ranked[0].breakdown.compute_usd - 5.0).abs() < 1e-9, "{d}");
    // a minimum GPU excludes slower pools, with the reason
    let fast = JobSpec { min_gpu: Some("A100".into()), gpu_types: vec!["T4".into()], ..job(1, 10.0) };
    let d = explain(&m, &st, &fast, &p);
    assert!(d.ranked.is_empty(), "{d}");
    assert!(
        d.excluded.iter().any(|e| e.cluster == "t4" && e.reason.contains("T4 runs at 0.15× the reference GPU")),
        "{d}"
    );
    let fast = JobSpec { min_gpu: Some("A100".into()), duration_gpu: None, ..job(1, 1.0) };
    let d = explain(&m, &st, &fast, &Policy::time());
    assert!(d.ranked.iter().all(|c| c.gpu_type != "T4"), "{d}");
}

/// An owned GPU's amortized price is paid whether it is used or not; a policy
/// with `owned_at_running_cost` scores it at its running cost instead, so idle
/// owned hardware is filled before renting. The built-ins keep the amortized
/// price; a pool without a running cost stays at it under either.
#[test]
fn owned_gpus_scored_at_their_running_cost_are_filled_before_renting() {
    let with_running = HOME_AND_CLOUD.replace("{ onprem = 4.0 }", "{ onprem = 4.0, running = 0.3 }");
    let m = fleet(&with_running);
    let running = Policy { owned_at_running_cost: true, ..Policy::cost() };
    let long = job(8, 8.0);
    // Amortized: 4.00 at home against 2.50 + provisioning in the cloud.
    check(&m, &long, &Policy::cost(), Some("cloud"));
    // At its running cost, 0.30, home wins, and the score is at that price.
    check(&m, &long, &running, Some("home"));
    let st = FleetState::idle(&m);
    let p = decide(&m, &st, &prepare(&m, &long), &running).expect("placed");
    assert_eq!((p.cluster, p.pricing), (0, Pricing::Onprem));
    assert!((p.breakdown.price_per_gpu_hour - 0.3).abs() < 1e-12, "{p:?}");
    assert!((p.breakdown.compute_usd - 0.3 * 8.0 * 8.0).abs() < 1e-9, "{p:?}");
    // The same job running in the cloud on demand with 40 h left: the
    // amortized policy keeps it there; the running-cost one brings it home.
    let movable = JobSpec { interruptible: true, ckpt_interval_s: Some(1800.0), ..long.clone() };
    let run = RunningJob {
        job: prepare(&m, &movable),
        cluster: 1,
        pool: 0,
        pricing: Pricing::OnDemand,
        remaining_s: 40.0 * 3600.0,
        since_ckpt_s: 600.0,
    };
    let margin = MigrationMargin::default();
    assert!(propose_migrations(&m, &st, std::slice::from_ref(&run), &Policy::cost(), &margin).is_empty());
    let props = propose_migrations(&m, &st, std::slice::from_ref(&run), &running, &margin);
    assert_eq!(props.len(), 1, "{props:?}");
    assert_eq!((props[0].to.cluster, props[0].to.pricing), (0, Pricing::Onprem));
    // A user's most per GPU-hour is against the price an owned GPU is billed
    // at (4.00), not the running cost it is scored at.
    let capped = JobSpec { max_price: Some(3.0), ..long.clone() };
    check(&m, &capped, &running, Some("cloud"));
    // Without a running cost in the fleet the policy scores the amortized price.
    check(&fleet(HOME_AND_CLOUD), &long, &running, Some("cloud"));
    // Clusters are scanned in the order of the policy's prices: home first.
    assert_eq!(m.cheapest_for(&running)[0].1, 0);
    assert_eq!(m.cheapest_for(&Policy::cost())[0].1, 1);
}
