//! The simulator driven by the real engine over small fleets and traces written here.

use clap::Parser;
use fleet_sim::cli::{run_loaded, Loaded, SimulateArgs};
use fleet_sim::engine_model::{EngineModel, EngineSetup};
use fleet_sim::report::write_outputs;
use fleet_sim::sim::{simulate, SimConfig, Strategy};
use fleet_sim::spot::SpotTrace;
use fleet_sim::trace::{read_philly, ReadOptions};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

fn args(extra: &[&str]) -> SimulateArgs {
    let mut v = vec!["t", "--trace", "t.csv", "--fleet", "f.toml", "--quiet"];
    v.extend_from_slice(extra);
    Cli::parse_from(v).args
}

/// Home (`home`, expensive cloud on-demand H100) and a cheaper provider (`cheap`,
/// on-demand + spot), plus a small on-prem A100 cluster.
const FLEET: &str = r#"
[overheads]
remote_submit_s = 60.0

[[clusters]]
name = "home"
provider = "aws"
region = "us-east-1"
carbon_zone = "DIRTY"
provision_s = 120.0
prices.H100 = { on_demand = 12.0, spot = 5.0 }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2

[[clusters]]
name = "cheap"
provider = "lambda"
region = "us-west-1"
carbon_zone = "CLEAN"
provision_s = 120.0
prices.H100 = { on_demand = 3.0, spot = 1.0 }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 8

[[clusters]]
name = "lab"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 4.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 4
nodes = 1

[[teams]]
name = "vc1"
home = "home"
[[teams]]
name = "vc2"
home = "home"
"#;

fn carbon(zone: &str, g: f64) -> (String, String) {
    let mut s = String::from("datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh\n");
    for h in 0..48 {
        s.push_str(&format!("2017-09-{:02} {:02}:00:00,{zone},{g},{g}\n", 4 + h / 24, h % 24));
    }
    (zone.to_string(), s)
}

fn setup() -> EngineSetup {
    EngineSetup {
        fleet_toml: FLEET.into(),
        carbon_csvs: vec![carbon("DIRTY", 700.0), carbon("CLEAN", 50.0)],
        dataset_gb: 10.0,
        ..EngineSetup::default()
    }
}

/// 60 jobs over ~10 hours: a mix of 1/2/4/8-GPU jobs of 30 min to 12 h.
fn trace_csv() -> String {
    jobs_csv(60, 600, &[1, 2, 4, 8])
}

/// `n` jobs from 10:00 on 2017-09-04 on, one every `every_s` seconds, of 30 min
/// to 12 h, the i-th on `sizes[i % len]` GPUs, a third of them team vc2's.
fn jobs_csv(n: u32, every_s: u32, sizes: &[u32]) -> String {
    let mut s = String::from("timestamp,duration,num_gpus,gpu_time,cluster\n");
    for i in 0..n {
        let t = 10 * 3600 + every_s * i;
        let (day, h, m, sec) = (4 + t / 86400, (t % 86400) / 3600, (t % 3600) / 60, t % 60);
        let dur = 1800 + (i * 7919 % 12) * 3600;
        let g = sizes[i as usize % sizes.len()];
        let vc = if i % 3 == 0 { "vc2" } else { "vc1" };
        s.push_str(&format!("2017-09-{day:02} {h:02}:{m:02}:{sec:02},{dur}.0,{g},{},{vc}\n", dur * g));
    }
    s
}

fn loaded(spot: Vec<SpotTrace>) -> Loaded {
    Loaded {
        trace: read_philly(trace_csv().as_bytes(), "t.csv", &ReadOptions::default()).unwrap(),
        trace_name: "t.csv".into(),
        fleet_name: "f.toml".into(),
        setup: setup(),
        spot,
    }
}

fn spot_trace() -> SpotTrace {
    SpotTrace::parse(r#"{"metadata":{"gap_seconds":1800},"data":[4,4,4,2,4,4,0,4]}"#, "spot-us-west-1").unwrap()
}

#[test]
fn same_inputs_and_seed_give_byte_identical_outputs() {
    let a = args(&["--seed", "42"]);
    let r1 = run_loaded(&a, &loaded(vec![spot_trace()])).unwrap();
    let r2 = run_loaded(&a, &loaded(vec![spot_trace()])).unwrap();
    let d1 = std::env::temp_dir().join(format!("fleet-sim-det-{}-1", std::process::id()));
    let d2 = std::env::temp_dir().join(format!("fleet-sim-det-{}-2", std::process::id()));
    let f1 = write_outputs(&r1, &d1).unwrap();
    let f2 = write_outputs(&r2, &d2).unwrap();
    assert_eq!(f1.len(), 3 + r1.policies.len());
    for (x, y) in f1.iter().zip(&f2) {
        assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap(), "{} differs", x.display());
    }
    let _ = std::fs::remove_dir_all(d1);
    let _ = std::fs::remove_dir_all(d2);
    // every policy and baseline is there, each job accounted for
    let names: Vec<&str> = r1.policies.iter().map(|p| p.policy.as_str()).collect();
    assert_eq!(names, ["cost", "time", "green", "home-only", "greedy", "greedy-spot", "first-start", "random"]);
    for p in &r1.policies {
        assert_eq!(p.completed + p.unplaced, 60, "{}", p.policy);
        // the size classes split the completed jobs: 15 each of 1, 2, 4 and 8
        // GPUs, their work, USD and completions adding up to the policy's
        let classes: Vec<(&str, usize)> = p.by_size.iter().map(|c| (c.gpus.as_str(), c.jobs)).collect();
        assert_eq!(classes, [("1", 15), ("2-4", 30), ("5-8", 15)], "{}", p.policy);
        let sum = |f: fn(&fleet_sim::report::SizeClass) -> f64| p.by_size.iter().map(f).sum::<f64>();
        assert!((sum(|c| c.gpu_hours) - p.useful_gpu_hours).abs() < 1e-6, "{}", p.policy);
        assert!((sum(|c| c.usd) - p.total_usd).abs() < 1e-6 * p.total_usd.max(1.0), "{}", p.policy);
        let mean = sum(|c| c.completion_mean_s * c.jobs as f64) / 60.0;
        assert!((mean - p.completion_mean_s).abs() < 1e-6, "{}", p.policy);
        assert!(p.by_size.iter().all(|c| 0.0 <= c.wait_mean_s && c.wait_mean_s < c.completion_mean_s), "{}", p.policy);
    }
    assert!(r1.table().contains("mean completion by job size"), "{}", r1.table());
}

#[test]
fn engine_policy_beats_home_only_and_respects_the_lower_bound() {
    let r = run_loaded(&args(&[]), &loaded(vec![])).unwrap();
    let get = |n: &str| r.policies.iter().find(|p| p.policy == n).unwrap().clone();
    let (cost, home, greedy) = (get("cost"), get("home-only"), get("greedy"));
    // home is 4x the price of cheap: the engine moves long jobs away, home-only cannot
    assert!(cost.total_usd < 0.6 * home.total_usd, "cost {} home {}", cost.total_usd, home.total_usd);
    // greedy never uses spot; the cost policy does for interruptible jobs
    assert!(cost.total_usd < greedy.total_usd, "cost {} greedy {}", cost.total_usd, greedy.total_usd);
    assert_eq!(home.moved_jobs, 0);
    // greedy with spot uses the cheaper spot capacity for these interruptible jobs
    let gs = get("greedy-spot");
    assert!(gs.spend.keys().any(|k| k.ends_with(" spot")), "{:?}", gs.spend);
    assert!(gs.total_usd < greedy.total_usd, "greedy-spot {} greedy {}", gs.total_usd, greedy.total_usd);
    assert!(greedy.spend.keys().all(|k| !k.ends_with(" spot")), "{:?}", greedy.spend);
    // first-start never waits longer than greedy does for its first start
    assert!(get("first-start").wait_mean_s <= greedy.wait_mean_s + 1e-9);
    assert!(cost.moved_jobs > 0);
    assert!(r.lower_bound_usd > 0.0);
    for p in &r.policies {
        assert!(p.total_usd >= r.lower_bound_usd * 0.999, "{} below the lower bound", p.policy);
        let bound = r.lp_bound.as_ref().map(|b| b.usd).unwrap_or(0.0).max(r.lower_bound_usd);
        assert!(p.total_usd >= bound * 0.999, "{} below the LP bound", p.policy);
        assert!((p.ratio_to_lower_bound - p.total_usd / bound).abs() < 1e-9);
    }
    // green emits far less than the policies that ignore carbon for speed
    // (time) or stay in the dirty zone (home-only). It is NOT asserted to
    // beat `cost` here: with the engine as of 6fa870a it emits 92 kg against
    // cost's 85 kg in this case — per-job decisions fill the clean cluster
    // early and later jobs queue or run dirty. Recorded as a known gap.
    let green = get("green");
    assert!(green.kg_co2 < 0.8 * get("time").kg_co2, "green {} time {}", green.kg_co2, get("time").kg_co2);
    assert!(green.kg_co2 < 0.2 * home.kg_co2, "green {} home {}", green.kg_co2, home.kg_co2);
    // every job that could not go anywhere else than home still ran at home
    assert_eq!(home.unplaced, 0);
}

#[test]
fn spot_trace_drops_preempt_engine_spot_jobs() {
    let l = loaded(vec![spot_trace()]);
    let mut model = EngineModel::new(&l.setup, l.trace.epoch_unix as f64).unwrap();
    let mut a = args(&["--policy", "cost"]);
    a.interruptible_share = 1.0;
    let jobs = fleet_sim::cli::sim_jobs(&l.trace, &mut model, &a).unwrap();
    model.assign_spot_traces(&l.spot);
    let r = simulate(&mut model, Strategy::Engine("cost".into()), &jobs, &l.spot, &SimConfig::default(), &|_| {});
    assert!(r.preemptions > 0, "{r:?}");
    assert!(r.lost_gpu_hours > 0.0);
    assert_eq!(r.completed, 60);
    // without checkpoints every preemption loses all the work done so far: more lost
    // (a fresh model: the engine must know these jobs do not checkpoint, or it would
    // queue them for spot again after every reclaim, and they would never finish)
    let mut a0 = a.clone();
    a0.checkpoint_interval_s = 0.0;
    let mut model = EngineModel::new(&l.setup, l.trace.epoch_unix as f64).unwrap();
    let no_ckpt = fleet_sim::cli::sim_jobs(&l.trace, &mut model, &a0).unwrap();
    assert!(no_ckpt.iter().all(|j| j.checkpoint_s == 0.0));
    model.assign_spot_traces(&l.spot);
    let r0 = simulate(&mut model, Strategy::Engine("cost".into()), &no_ckpt, &l.spot, &SimConfig::default(), &|_| {});
    // It finishes (no queueing for spot without checkpoints), and a reclaim costs it
    // more work than a checkpointing job loses on average. (The runs place jobs
    // differently: the engine queues only checkpointing jobs for spot.)
    assert_eq!(r0.completed, 60);
    assert!(r0.preemptions > 0);
    let per = |x: &fleet_sim::report::PolicyReport| x.lost_gpu_hours / x.preemptions as f64;
    assert!(per(&r0) > per(&r), "{} vs {} GPU-h lost per reclaim", per(&r0), per(&r));
}

#[test]
fn a_job_that_writes_no_checkpoints_stops_using_spot_at_the_caps() {
    // Every job says it checkpoints every 30 min (so the engine queues it for
    // spot) but writes none: each reclaim loses all its work. Spot on `cheap`
    // drops to half and then to nothing every 4 h, so no job longer than a
    // spot window can finish there; without a cap such a job would wait for
    // spot again after every reclaim, for ever.
    let l = loaded(vec![spot_trace()]);
    let run = |policies: &str| {
        let s = EngineSetup { policies_toml: Some(policies.into()), ..l.setup.clone() };
        let mut model = EngineModel::new(&s, l.trace.epoch_unix as f64).unwrap();
        let mut a = args(&["--policy", "cost", "--checkpoint-interval-s", "1800"]);
        a.interruptible_share = 1.0;
        let mut jobs = fleet_sim::cli::sim_jobs(&l.trace, &mut model, &a).unwrap();
        for j in &mut jobs {
            j.writes_no_checkpoints = true;
        }
        model.assign_spot_traces(&l.spot);
        let r = simulate(&mut model, Strategy::Engine("cost".into()), &jobs, &l.spot, &SimConfig::default(), &|_| {});
        let gpus: f64 = jobs.iter().map(|j| j.gpus as f64).sum();
        (r, gpus)
    };
    // At most 3 reclaims per job: all end, and the cap is what ended some.
    let (r, _) = run("[policies.cost]\nspot_max_reclaims = 3\nspot_max_lost_h = 0\n");
    assert_eq!(r.completed, 60, "{r:?}");
    assert_eq!(r.max_reclaims_per_job, 3, "{r:?}");
    // At most 1 h of run lost before the job goes on-demand: all end; no job
    // loses more than that hour plus the segment that crossed it (a spot
    // window here is at most 4 h).
    let (r1, gpus) = run("[policies.cost]\nspot_max_reclaims = 0\nspot_max_lost_h = 1\n");
    assert_eq!(r1.completed, 60, "{r1:?}");
    assert!(r1.preemptions > 0);
    assert!(r1.lost_gpu_hours <= gpus * (1.0 + 4.0), "{} GPU-h lost", r1.lost_gpu_hours);
    // The built-in caps end it too.
    let (r2, _) = run("");
    assert_eq!(r2.completed, 60, "{r2:?}");
    assert!(r2.max_reclaims_per_job <= fleet_engine::policy::SPOT_MAX_RECLAIMS as usize);
}

#[test]
fn outage_of_the_cheap_cluster_sends_work_elsewhere() {
    let l = loaded(vec![]);
    let r = run_loaded(&args(&["--policy", "cost", "--outage", "cheap:1:3"]), &l).unwrap();
    let p = &r.policies[0];
    assert_eq!(p.completed, 60);
    assert!(p.outage_kills > 0, "{p:?}");
    let bad = run_loaded(&args(&["--policy", "cost", "--outage", "nowhere:1:3"]), &l);
    assert!(bad.is_err());
}

#[test]
fn capacity_is_never_exceeded_with_the_engine() {
    let r = run_loaded(&args(&[]), &loaded(vec![spot_trace()])).unwrap();
    for p in &r.policies {
        for (c, u) in &p.util_series {
            for (k, x) in u.iter().enumerate() {
                assert!(*x <= 1.0 + 1e-9, "{} {c} bucket {k}: {x}", p.policy);
            }
        }
    }
}

#[test]
fn homes_are_declared_or_an_error_unless_auto_homes() {
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n\
               2017-09-04 10:00:00,3600,8,1,vc1\n\
               2017-09-04 10:00:00,7200,1,1,vc9\n\
               2017-09-04 10:00:00,60,1,1,vc8\n";
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&setup(), 0.0).unwrap();
    let e = model.home_map(&t.jobs, false).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("2 team(s) of the trace have no declared home in the fleet file: vc9, vc8"), "{e}");
    let m = model.home_map(&t.jobs, true).unwrap();
    let name = |l: &str| model.fleet.clusters[m[l]].name.clone();
    assert_eq!(name("vc1"), "home"); // declared
    assert_eq!(name("vc9"), "cheap"); // biggest undeclared label: emptiest cluster per GPU
    assert_eq!(name("vc8"), "lab"); // then the next emptiest
                                    // a team "*" is the home of every undeclared label
    let s = EngineSetup { fleet_toml: format!("{FLEET}[[teams]]\nname = \"*\"\nhome = \"lab\"\n"), ..setup() };
    let mut model = EngineModel::new(&s, 0.0).unwrap();
    let m = model.home_map(&t.jobs, false).unwrap();
    assert_eq!((m["vc1"], m["vc9"], m["vc8"]), (0, 2, 2));
}

#[test]
fn fleet_typos_are_errors_with_file_and_line() {
    for (bad, frag) in [
        (FLEET.replace("[[clusters", "[[cluster"), "f.toml:5:3: unknown field `cluster`"),
        (FLEET.replace("[overheads]", "[overhead]"), "f.toml:2:"),
        (
            FLEET.replace(
                "provision_s = 120.0\nprices.H100 = { on_demand = 12.0",
                "provison_s = 120.0\nprices.H100 = { on_demand = 12.0",
            ),
            "unknown field `provison_s`",
        ),
        (FLEET.replace("nodes = 8\n", "nodes = 8\nnode = 1\n"), "f.toml:28:1: unknown field `node`"),
        (FLEET.replace("home = \"home\"", "home = \"nowhere\""), "home \"nowhere\" is not a cluster"),
    ] {
        let s = EngineSetup { fleet_toml: bad, fleet_name: "f.toml".into(), ..setup() };
        match EngineModel::new(&s, 0.0) {
            Ok(_) => panic!("accepted: {frag}"),
            Err(e) => assert!(format!("{e:#}").contains(frag), "{e:#} lacks {frag}"),
        }
    }
}

/// One job on a one-cluster cloud fleet: provisioning and remote submission delay it,
/// provisioning is billed, the run time follows the GPU's speed, the dataset is
/// staged (and paid for) once even when the job lands on the same cluster again.
#[test]
fn overheads_speed_and_staging_are_applied_once() {
    let fleet = r#"
[overheads]
remote_submit_s = 60.0
staging_latency_s = 30.0
restore_s = 300.0
cross_provider_gbps = 10.0
internet_egress_usd_per_gb = { default = 0.1 }

[[clusters]]
name = "home"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 100.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 1
nodes = 1

[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
provision_s = 3600.0
prices.H100 = { on_demand = 2.0, spot = 1.0 }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "t"
home = "home"
"#;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 45.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:00:00,68400,8,1,t\n";
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let a = args(&["--policy", "cost", "--interruptible-share", "0"]);
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &a).unwrap();
    // 8 GPUs: only the cloud's H100 pool can take it. 68,400 s of A100 work runs in
    // 36,000 s on H100s (1.9×), after 3,600 s of provisioning (billed); it queues
    // after remote submission (60 s) and staging (45 GB at 10 Gbps = 36 s + 30 s).
    let r = simulate(&mut model, Strategy::Engine("cost".into()), &jobs, &[], &SimConfig::default(), &|_| {});
    assert_eq!(r.completed, 1);
    assert!((r.wait_mean_s - 126.0).abs() < 1e-6, "wait {}", r.wait_mean_s);
    assert!((r.completion_mean_s - (126.0 + 3600.0 + 36000.0)).abs() < 1e-6, "{}", r.completion_mean_s);
    assert!((r.compute_usd - 2.0 * 8.0 * (3600.0 + 36000.0) / 3600.0).abs() < 1e-6, "{}", r.compute_usd);
    assert!((r.egress_usd - 4.5).abs() < 1e-9, "{}", r.egress_usd);
    // an outage on the cloud sends it back to placement: it returns to the same
    // cluster (nothing else fits) and does not pay the staging again
    let cfg = SimConfig { outages: vec![(1, 7200.0, 7300.0)], ..SimConfig::default() };
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &a).unwrap();
    let r = simulate(&mut model, Strategy::Engine("cost".into()), &jobs, &[], &cfg, &|_| {});
    assert_eq!((r.completed, r.outage_kills), (1, 1), "{r:?}");
    assert!((r.egress_usd - 4.5).abs() < 1e-9, "staged once: {}", r.egress_usd);
}

/// `own`: one A100 at 1 USD/h (team `t`'s home); `cloud`: eight at 3 USD/h.
const ONE_CHEAP_EIGHT_DEAR: &str = r#"
[[clusters]]
name = "own"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 1.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 1
nodes = 1

[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
prices.A100 = { on_demand = 3.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "t"
home = "own"
"#;

/// The LP bound sees capacity over time: 4 one-GPU hour-long jobs at once on a fleet
/// with one cheap GPU (1 USD/h) and eight dear ones (3 USD/h). Done within an hour,
/// three must run on the dear GPUs (10 USD); within four hours all can run on the
/// cheap one (4 USD). The cheap bound says 4 in both cases.
#[test]
fn lp_bound_accounts_for_capacity_and_release_times() {
    let fleet = ONE_CHEAP_EIGHT_DEAR;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv =
        "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string() + &"2017-09-04 10:00:00,3600,1,1,t\n".repeat(4);
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &args(&[])).unwrap();
    let (cheap, _) = fleet_sim::sim::lower_bound(&mut model, &jobs);
    assert!((cheap - 4.0).abs() < 1e-9, "{cheap}");
    let lp1 = fleet_sim::lp::lp_bound(&mut model, &jobs, &[], 3600.0, 1000).unwrap();
    assert!((lp1.usd - 10.0).abs() < 1e-6, "{lp1:?}");
    let lp4 = fleet_sim::lp::lp_bound(&mut model, &jobs, &[], 4.0 * 3600.0, 1000).unwrap();
    assert!((lp4.usd - 4.0).abs() < 1e-6, "{lp4:?}");
    // each bound is what clarabel's dual certifies (crate::certify), at most
    // the solver's optimum and within its tolerance of it
    for b in [&lp1, &lp4] {
        assert!(b.certificate.starts_with("certified: clarabel's dual bound is"), "{b:?}");
        assert!(b.usd <= b.solver_usd && b.usd >= b.solver_usd - 1e-6, "{b:?}");
    }
    // a horizon too short for the work (9 GPUs × 20 min < 4 GPU-hours) is
    // infeasible, not a wrong bound
    assert!(fleet_sim::lp::lp_bound(&mut model, &jobs, &[], 1200.0, 1000).is_err());
    // in a full run every policy is at or above the LP bound it reports
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&[]), &l).unwrap();
    let lp = r.lp_bound.clone().unwrap();
    assert_eq!(r.bound_used, "lp");
    // the planner's page says the bound is proven
    assert!(r.summary().contains("proven from the LP's dual"), "{}", r.summary());
    for p in &r.policies {
        assert!(p.total_usd >= lp.usd - 1e-6, "{} {} < {}", p.policy, p.total_usd, lp.usd);
    }
    // cost per team adds up; the owned GPU's fixed cost covers the whole run and its
    // idle share is what no job paid for
    for p in &r.policies {
        let teams: f64 = p.cost_by_team.values().sum();
        assert!((teams - p.total_usd).abs() < 1e-6, "{} {teams} vs {}", p.policy, p.total_usd);
        assert_eq!(p.cost_by_team.keys().collect::<Vec<_>>(), ["t"]);
        let h = p.makespan_s / 3600.0;
        assert!((p.owned_fixed_usd - h).abs() < 1e-9, "{} {}", p.policy, p.owned_fixed_usd);
        let own_used = p.spend.iter().filter(|(k, _)| k.starts_with("own/")).map(|(_, s)| s.gpu_hours).sum::<f64>();
        assert!((p.owned_idle_share - (1.0 - own_used / h)).abs() < 1e-9, "{p:?}");
        assert!(own_used > 0.0, "{p:?}");
    }
}

/// An LP that is not solved within `--lp-time-limit` leaves its bound out and
/// says why; the run goes on with the cheap bound. A limit that is not a
/// positive number of seconds is an error naming the flag.
#[test]
fn an_lp_past_its_time_limit_falls_back_to_the_cheap_bound() {
    let s = EngineSetup { fleet_toml: ONE_CHEAP_EIGHT_DEAR.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string()
        + &(0..40).map(|i| format!("2017-09-04 10:{:02}:00,{},1,1,t\n", i, 600 + 97 * i)).collect::<String>();
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--policy", "cost", "--lp-time-limit", "1e-9"]), &l).unwrap();
    assert!(r.lp_bound.is_none(), "{:?}", r.lp_bound);
    assert!(r.bound_used.starts_with("cheap (LP not solved: "), "{}", r.bound_used);
    assert!(r.bound_used.contains("time limit"), "{}", r.bound_used);
    let p = &r.policies[0];
    assert!(p.ratio_to_lower_bound >= 1.0 && (p.ratio_to_lower_bound - p.total_usd / r.lower_bound_usd).abs() < 1e-9);
    // the default limit solves it, certified
    let r = run_loaded(&args(&["--policy", "cost"]), &l).unwrap();
    let lp = r.lp_bound.unwrap();
    assert!(lp.certificate.starts_with("certified"), "{lp:?}");
    for bad in ["0", "-5", "inf", "NaN"] {
        let e = run_loaded(&args(&["--policy", "cost", &format!("--lp-time-limit={bad}")]), &l).unwrap_err();
        assert!(e.to_string().contains("--lp-time-limit"), "{bad}: {e}");
    }
}

/// The fine cells see capacity inside a slot: one one-GPU hour-long job at 10:00 and
/// four at 15:00, on one cheap GPU (1 USD/h) and eight dear ones (3 USD/h), all done
/// by 16:00. The best schedule runs the first on the cheap GPU and, in the last hour,
/// one on the cheap GPU and three on dear ones: 11 USD. One 6 h slot lets the cheap
/// GPU's idle hours before 15:00 stand for the four late jobs (5 USD); cells of 3, 2
/// and 1 h (as the variable budget allows) give 7, 9 and 11.
#[test]
fn fine_cells_raise_the_lp_bound_to_the_optimum() {
    let s = EngineSetup { fleet_toml: ONE_CHEAP_EIGHT_DEAR.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:00:00,3600,1,1,t\n".to_string()
        + &"2017-09-04 15:00:00,3600,1,1,t\n".repeat(4);
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &args(&[])).unwrap();
    for (max_vars, cell_h, usd) in [(3, 6.0, 5.0), (5, 3.0, 7.0), (10, 2.0, 9.0), (1000, 1.0, 11.0)] {
        let b = fleet_sim::lp::lp_bound(&mut model, &jobs, &[], 6.0 * 3600.0, max_vars).unwrap();
        assert!((b.usd - usd).abs() < 1e-6 && (b.cell_hours - cell_h).abs() < 1e-9, "{max_vars}: {b:?}");
        assert!(b.variables <= max_vars, "{b:?}");
    }
    // every simulated policy pays at least the bound of the horizon it ends by
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&[]), &l).unwrap();
    for p in &r.policies {
        let own = fleet_sim::lp::lp_bound(&mut model, &jobs, &[], p.makespan_s, 1000).unwrap();
        assert!(p.total_usd >= own.usd - 1e-6, "{} {} < {}", p.policy, p.total_usd, own.usd);
        if p.makespan_s <= 6.0 * 3600.0 + 1e-6 {
            assert!(p.total_usd >= 11.0 - 1e-6, "{} {}", p.policy, p.total_usd);
        }
    }
}

/// Spot in short windows: one one-GPU job of an hour of work on a cloud pool whose
/// spot (1 USD/h against 3 on demand, 10 min provisioning at every start) is up for
/// the first 30 min of every hour and gone for the rest (all-or-nothing). A spot
/// segment does at most 20 min of work (the setup first), keeps it only at a
/// checkpoint (hourly) or by finishing the job, so at most 1/3 GPU-hour of the work
/// is done on spot: the LP is 1/3 × (1 + 1/6) + 2/3 × (3 + 1/2) = 2.72 USD (at the
/// trace's mean availability it was 1 + 1/6); the best schedule pays 3.5 (on
/// demand for the whole hour), and every simulated policy at least the bound.
#[test]
fn lp_bound_sees_spot_windows_setups_and_checkpoints() {
    let fleet = r#"
[[clusters]]
name = "c"
provider = "aws"
region = "us-east-1"
provision_s = 600
prices.A100 = { on_demand = 3.0, spot = 1.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "t"
home = "c"
"#;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:00:00,3600,1,1,t\n";
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let spot = vec![SpotTrace::parse(r#"{"metadata":{"gap_seconds":1800},"data":[1,0]}"#, "half-hours").unwrap()];
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &args(&[])).unwrap();
    model.assign_spot_traces(&spot);
    let want = (1.0 + 1.0 / 6.0) / 3.0 + 2.0 * 3.5 / 3.0;
    for h in [2.0, 4.0, 10.0] {
        let b = fleet_sim::lp::lp_bound(&mut model, &jobs, &spot, h * 3600.0, 1000).unwrap();
        assert!((b.usd - want).abs() < 1e-6, "{h}: {b:?}");
    }
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: spot.clone() };
    let r = run_loaded(&args(&[]), &l).unwrap();
    assert!((r.lp_bound.as_ref().unwrap().usd - want).abs() < 1e-6, "{:?}", r.lp_bound);
    for p in &r.policies {
        assert!(p.total_usd >= want - 1e-6, "{} {} < {want}", p.policy, p.total_usd);
    }
}

#[test]
fn help_lists_only_the_simulators_flags_and_json_is_a_flag() {
    let e = fleet_sim::cli::parse_from(["fleetctl simulate".to_string(), "--help".to_string()]).err().unwrap();
    assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
    let help = e.render().to_string();
    assert!(help.contains("Usage: fleetctl simulate"), "{help}");
    for own in ["--trace", "--fleet", "--skip-invalid", "--auto-homes", "--lp-max-vars", "--json"] {
        assert!(help.contains(own), "{own} missing:\n{help}");
    }
    for foreign in ["--url", "--token-file", "--ca-file"] {
        assert!(!help.contains(foreign), "{foreign} in:\n{help}");
    }
    let a = fleet_sim::cli::parse_from(["x", "--trace", "t", "--fleet", "f", "--json"].map(String::from)).unwrap();
    assert!(a.json);
    assert!(fleet_sim::cli::parse_from(["x", "--trace", "t", "--fleet", "f", "--url", "u"].map(String::from)).is_err());
}

/// PAI's published layout → generic format → simulator: fractional GPUs hold one
/// GPU, model constraints are honoured (T4 jobs only on T4s), durations measured
/// on a T4 run faster on an A100, non-Terminated and CPU-only work is left out.
#[test]
fn pai_sample_converts_and_simulates_with_model_constraints() {
    let (jobs, tasks) = fleet_sim::convert::pai_sample(300, 7);
    let mut out = Vec::new();
    let (n, left) = fleet_sim::convert::pai_to_generic(jobs.as_bytes(), "j", tasks.as_bytes(), "t", &mut out).unwrap();
    assert_eq!(n + left, 300);
    assert!(left > 0 && n > 200, "{n} {left}");
    let text = String::from_utf8(out).unwrap();
    assert!(text.lines().any(|l| l.contains(",0.25,T4,T4,")), "a quarter-GPU T4 job");
    assert!(text.lines().any(|l| l.contains(",V100-32GB,V100-32GB,")));
    assert!(text.lines().any(|l| l.contains(",,K80,")), "MISC: no constraint, K80 speed");
    let t = fleet_sim::trace::read_generic(text.as_bytes(), "g.csv", &ReadOptions::default()).unwrap();
    assert_eq!(t.jobs.len(), n);
    // a fleet with T4s, V100s and A100s (no P100 and no 32 GB V100: those jobs
    // cannot be placed anywhere)
    let fleet = r#"
[[clusters]]
name = "t4"
provider = "aws"
region = "us-east-1"
prices.T4 = { on_demand = 0.5 }
[[clusters.pools]]
gpu_type = "T4"
gpus_per_node = 8
nodes = 8
[[clusters]]
name = "v100"
provider = "aws"
region = "us-east-1"
prices.V100 = { on_demand = 3.0 }
[[clusters.pools]]
gpu_type = "V100"
gpus_per_node = 8
nodes = 8
[[clusters]]
name = "a100"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 1.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 8
[[teams]]
name = "*"
home = "a100"
"#;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 1.0, ..EngineSetup::default() };
    let l = Loaded { trace: t.clone(), trace_name: "g".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--policy", "cost", "--lp-max-vars", "0"]), &l).unwrap();
    let p = &r.policies[0];
    let pinned = |m: &str| t.jobs.iter().filter(|j| j.extra.gpu_models == [m]).count();
    assert_eq!(p.unplaced, pinned("P100") + pinned("V100-32GB"), "{p:?}");
    // T4-only jobs ran on the T4 pool and nowhere else can: the T4 pool was used
    assert!(p.spend.keys().any(|k| k.starts_with("t4/")), "{:?}", p.spend);
    // unconstrained jobs (MISC, measured on a K80 at 0.1×) run 10× faster on A100s
    let misc: f64 = t
        .jobs
        .iter()
        .filter(|j| j.extra.gpu_models.is_empty())
        .map(|j| j.duration_s * j.gpus as f64 / 3600.0 * 0.1)
        .sum();
    let a100 = p.spend.iter().filter(|(k, _)| k.starts_with("a100/")).map(|(_, s)| s.gpu_hours).sum::<f64>();
    assert!(a100 >= misc * 0.99, "A100 GPU-h {a100} vs MISC work {misc}");
}

#[test]
fn philly_converts_to_the_generic_format_losslessly() {
    let mut out = Vec::new();
    let n = fleet_sim::convert::philly_to_generic(trace_csv().as_bytes(), "p", &mut out).unwrap();
    assert_eq!(n, 60);
    let g = fleet_sim::trace::read_generic(&out[..], "g", &ReadOptions::default()).unwrap();
    let p = read_philly(trace_csv().as_bytes(), "p", &ReadOptions::default()).unwrap();
    assert_eq!(g.epoch_unix, p.epoch_unix);
    for (a, b) in g.jobs.iter().zip(&p.jobs) {
        assert_eq!(
            (a.submit_s, a.duration_s, a.gpus, &a.home_label),
            (b.submit_s, b.duration_s, b.gpus, &b.home_label)
        );
    }
    assert_eq!(fleet_sim::convert::roundtrip(1_593_561_600), Some(1_593_561_600));
}

#[test]
fn cheap_bound_finds_the_offer_of_the_full_scan() {
    use fleet_sim::sim::{idle_load, per_work, Model};
    // The test fleet three times over (equal prices: ties between copies), plus the
    // sample fleet's shapes through `lower_bound`'s own path.
    let mut toml = FLEET.split("[[teams]]").next().unwrap_or_default().to_string();
    for k in 1..3 {
        let copy = FLEET.split("[[teams]]").next().unwrap_or_default().replace("name = \"", &format!("name = \"k{k}-"));
        toml.push_str(&copy.replace("[overheads]\nremote_submit_s = 60.0\n", ""));
    }
    toml.push_str("[[teams]]\nname = \"*\"\nhome = \"k1-cheap\"\n");
    let s = EngineSetup { fleet_toml: toml, ..setup() };
    let t = read_philly(trace_csv().as_bytes(), "t.csv", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    model.assign_spot_traces(&[spot_trace()]);
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &args(&[])).unwrap();
    assert_eq!(model.clusters().len(), 9);
    for j in &jobs {
        model.resume(j, 0.0, None);
        let empty = idle_load(model.clusters());
        let scan = model
            .offers("lower-bound", j, j.submit_s, &empty)
            .into_iter()
            .min_by(|a, b| per_work(a).total_cmp(&per_work(b)));
        assert_eq!(model.cheapest(j), scan, "job {}", j.id);
        assert!(scan.is_some());
    }
}

#[test]
fn lp_bound_charges_one_provisioning_per_cloud_option() {
    let fleet = r#"
[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
provision_s = 1800.0
prices.A100 = { on_demand = 3.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "t"
home = "cloud"
"#;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:00:00,3600,2,2,t\n".to_string();
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &args(&[])).unwrap();
    // 2 GPUs × (1 h of work + 0.5 h provisioning) × 3.00: what the simulator bills.
    let lp = fleet_sim::lp::lp_bound(&mut model, &jobs, &[], 10.0 * 3600.0, 1000).unwrap();
    assert!((lp.usd - 9.0).abs() < 1e-6, "{lp:?}");
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&[]), &l).unwrap();
    for p in &r.policies {
        assert!(p.total_usd >= lp.usd - 1e-6, "{} {} < {}", p.policy, p.total_usd, lp.usd);
        if let Some(own) = p.own_lp_bound_usd {
            assert!(p.total_usd >= own - 1e-6, "{} {} < own {own}", p.policy, p.total_usd);
        }
    }
}

#[test]
fn incremental_pool_state_decides_as_the_full_rebuild() {
    // The test fleet three times over (equal prices: ties between copies, which the
    // baselines' unsorted scan must break as the sorted offers did), spot reclaims,
    // an outage and hourly rebalancing: every path that changes a pool's load.
    let mut toml = FLEET.split("[[teams]]").next().unwrap_or_default().to_string();
    for k in 1..3 {
        let copy = FLEET.split("[[teams]]").next().unwrap_or_default().replace("name = \"", &format!("name = \"k{k}-"));
        toml.push_str(&copy.replace("[overheads]\nremote_submit_s = 60.0\n", ""));
    }
    toml.push_str("[[teams]]\nname = \"vc1\"\nhome = \"home\"\n[[teams]]\nname = \"*\"\nhome = \"k1-cheap\"\n");
    let s = EngineSetup { fleet_toml: toml, ..setup() };
    // Busier than `trace_csv`: 240 jobs, one every 150 s, so queues form; runs of
    // jobs of one size (the engine state is kept across them).
    let csv = jobs_csv(240, 150, &[1, 1, 1, 2, 4, 4, 8, 16, 1, 8]);
    let t = read_philly(csv.as_bytes(), "t.csv", &ReadOptions::default()).unwrap();
    let spot = vec![spot_trace()];
    let a = args(&[]);
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    model.assign_spot_traces(&spot);
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &a).unwrap();
    let strategies = fleet_sim::cli::strategies(&a, &model).unwrap();
    assert_eq!(strategies.len(), 8);
    let cheap = model.cluster_index("k1-cheap").unwrap();
    let base = SimConfig { seed: 3, outages: vec![(cheap, 3.0 * 3600.0, 7.0 * 3600.0)], ..SimConfig::default() };
    let mut moved = 0;
    for st in strategies {
        let run = |full_rebuild: bool| {
            let mut m = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
            m.assign_spot_traces(&spot);
            let cfg = SimConfig { full_rebuild, ..base.clone() };
            simulate(&mut m, st.clone(), &jobs, &spot, &cfg, &|_| {})
        };
        let (fast, full) = (run(false), run(true));
        assert_eq!(fast.completed + fast.unplaced, 240, "{}", fast.policy);
        moved += fast.moved_jobs + fast.preemptions as usize + fast.outage_kills as usize;
        assert_eq!(
            serde_json::to_string(&fast).unwrap(),
            serde_json::to_string(&full).unwrap(),
            "{}: the incremental path decided differently",
            fast.policy
        );
    }
    // The runs exercised remote placements, reclaims and the outage.
    assert!(moved > 0);
}

/// Runs every strategy over `t` on `s` (no spot): each pays at least the bound
/// the report gives.
fn every_policy_pays_at_least_the_bound(a: &SimulateArgs, t: fleet_sim::trace::Trace, s: EngineSetup) {
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(a, &l).unwrap();
    for p in &r.policies {
        assert!(p.total_usd >= r.bound_usd() - 1e-6, "{} {} < {}", p.policy, p.total_usd, r.bound_usd());
    }
}

/// Two teams, each at home on its own cluster (on-prem 1 USD/h, cloud 3 USD/h),
/// one one-GPU hour-long job each, 45 GB of data at home (4.5 USD to move). The
/// cloud team's job pays 3 at home or 1 + 4.5 on-prem: the least any schedule
/// pays is 1 + 3 = 4. Both jobs fall in one LP group (same release, same
/// options); before 2026-12-02 the group paid its cheapest member's egress on
/// each cluster (0 on both: each is some team's home) and the LP said 2.
#[test]
fn lp_bound_charges_each_jobs_own_egress() {
    let fleet = r#"
[overheads]
internet_egress_usd_per_gb = { default = 0.1 }

[[clusters]]
name = "own"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 1.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
prices.A100 = { on_demand = 3.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "ta"
home = "own"
[[teams]]
name = "tb"
home = "cloud"
"#;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 45.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:00:00,3600,1,1,ta\n2017-09-04 10:00:00,3600,1,1,tb\n";
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let a = args(&["--interruptible-share", "0"]);
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &a).unwrap();
    let (cheap, _) = fleet_sim::sim::lower_bound(&mut model, &jobs);
    assert!((cheap - 2.0).abs() < 1e-9, "{cheap}");
    let lp = fleet_sim::lp::lp_bound(&mut model, &jobs, &[], 10.0 * 3600.0, 1000).unwrap();
    assert_eq!(lp.groups, 1, "{lp:?}");
    assert!((lp.usd - 4.0).abs() < 1e-6, "{lp:?}");
    every_policy_pays_at_least_the_bound(&a, t, s);
}

/// Each job's work is charged its one-off costs once over all options. One
/// on-prem GPU (`own`, 1 USD/h), a cloud (3 USD/h, no provisioning) and a dear
/// one (`far`, 100 USD/h); 45 GB of data at each team's home (4.5 USD to move
/// over the internet). At 10:00 `ta` (home `own`) submits a 4-hour one-GPU job and `tc`
/// (home `far`) a 1-hour one; all done by 14:00. The long job fills `own`, the
/// short one moves to the cloud: 4 + 3 + 4.5 = 11.5, the least any schedule
/// pays. Split per option, the one-offs let the long job's work stand for the
/// egress-free work on `own` and for the cheapest work on the cloud (4.5 ÷ 4
/// per hour) at once: 4 + 3 + 1.125 = 8.125 (the LP before 2026-12-06). With a
/// fifth hour the short job runs on `own` after it: 4 + 1 + 4.5 = 9.5.
#[test]
fn lp_bound_charges_each_jobs_one_offs_once_over_its_options() {
    let fleet = r#"
[overheads]
internet_egress_usd_per_gb = { default = 0.1 }

[[clusters]]
name = "own"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 1.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 1
nodes = 1

[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
provision_s = 0
prices.A100 = { on_demand = 3.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "far"
provider = "gcp"
region = "us-central1"
provision_s = 0
prices.A100 = { on_demand = 100.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "ta"
home = "own"
[[teams]]
name = "tc"
home = "far"
"#;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 45.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n\
               2017-09-04 10:00:00,14400,1,4,ta\n2017-09-04 10:00:00,3600,1,1,tc\n";
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let a = args(&["--interruptible-share", "0"]);
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &a).unwrap();
    for (h, want) in [(4.0, 11.5), (5.0, 9.5)] {
        let lp = fleet_sim::lp::lp_bound(&mut model, &jobs, &[], h * 3600.0, 1000).unwrap();
        assert_eq!(lp.groups, 1, "{lp:?}");
        // (the link rows' slack of 1e-7 of a type's work lowers it by ~1e-6)
        assert!((lp.usd - want).abs() < 1e-5, "{h} h: {lp:?}");
    }
    every_policy_pays_at_least_the_bound(&a, t, s);
}

/// Two one-pool zones of A100s: `dirty` at 1 USD/GPU-h and 700 g/kWh (the
/// team's home), `clean` at `clean_price` and 50 g/kWh.
fn two_zones(clean_price: f64) -> EngineSetup {
    let fleet = format!(
        r#"
[[clusters]]
name = "dirty"
provider = "aws"
region = "us-east-1"
carbon_zone = "DIRTY"
prices.A100 = {{ on_demand = 1.0 }}
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "clean"
provider = "aws"
region = "us-east-1"
carbon_zone = "CLEAN"
prices.A100 = {{ on_demand = {clean_price} }}
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "t"
home = "dirty"
"#
    );
    EngineSetup {
        fleet_toml: fleet,
        carbon_csvs: vec![carbon("DIRTY", 700.0), carbon("CLEAN", 50.0)],
        dataset_gb: 0.0,
        ..EngineSetup::default()
    }
}

/// Four one-GPU 2-hour jobs of a team at home on `dirty` (1 USD/h, 700 g/kWh);
/// `clean` (50 g/kWh) sells the same GPU at `clean_price`. The carbon LP says how
/// much CO2 a schedule costing ≤ 1.05 × the cost policy can save: at 1.30 USD/h
/// only a sixth of the work can move (≈ 15 % less CO2: the green target is
/// proven unreachable), at 1.04 all of it (≈ 93 %). The test reads the proof's
/// inequalities back from the report JSON, and checks the carbon bound against
/// every simulated policy within the budget.
fn carbon_case(clean_price: f64) -> serde_json::Value {
    let s = two_zones(clean_price);
    let csv =
        "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string() + &"2017-09-04 10:00:00,7200,1,2,t\n".repeat(4);
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--interruptible-share", "0"]), &l).unwrap();
    let v: serde_json::Value = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    let f = |x: &serde_json::Value| x.as_f64().unwrap();
    let pol = |name: &str| v["policies"].as_array().unwrap().iter().find(|p| p["policy"] == name).unwrap().clone();
    let (cost, greedy) = (pol("cost"), pol("greedy"));
    let c = &v["carbon_lp"];
    // the carbon LP is clarabel's first (microlp's when clarabel fails), the cost LP microlp's
    assert_eq!(c["solver"], "clarabel", "{c}");
    assert_eq!(v["lp_bound"]["solver"], "microlp", "{}", v["lp_bound"]);
    // both certified by clarabel's dual: the carbon LP's from its own solve,
    // the cost LP's from a second solve of microlp's LP
    for b in [c, &v["lp_bound"]] {
        assert!(b["certificate"].as_str().unwrap().starts_with("certified: clarabel's dual"), "{b}");
    }
    assert!(f(&c["kg_co2"]) <= f(&c["solver_kg_co2"]) + 1e-9, "{c}");
    let cap = f(&c["usd_cap"]);
    assert!((cap - 1.05 * f(&cost["total_usd"])).abs() < 1e-6, "{c}");
    assert!(f(&c["usd"]) <= cap + 1e-6, "{c}");
    // the carbon bound holds for every simulated schedule within the budget
    for p in v["policies"].as_array().unwrap() {
        if f(&p["total_usd"]) <= cap {
            assert!(f(&p["kg_co2"]) >= f(&c["kg_co2"]) - 1e-6, "{} {} < {}", p["policy"], p["kg_co2"], c["kg_co2"]);
        }
    }
    // every proof printed holds on the report's own figures
    let bound = r.bound_usd();
    for t in v["targets"].as_array().unwrap() {
        if t.get("unreachable").is_none() {
            continue;
        }
        assert_eq!(t["met"], false, "{t}");
        match t["target"].as_str().unwrap() {
            "cost vs greedy: saving" => assert!(bound > 0.85 * f(&greedy["total_usd"]), "{t}"),
            "cost vs greedy-spot: saving" => {
                let gs = f(&pol("greedy-spot")["total_usd"]);
                assert!(
                    bound >= gs
                        || (v["completion_lp"].is_object()
                            && v["completion_lp"]["usd"].as_f64().is_none_or(|u| u >= gs)),
                    "{t}"
                )
            }
            "cost vs greedy-spot: mean completion worse by" => {
                let gs = f(&pol("greedy-spot")["total_usd"]);
                assert!(
                    (v["completion_lp"].is_object() && v["completion_lp"]["usd"].as_f64().is_none_or(|u| u >= gs)),
                    "{t}"
                )
            }
            "green: kgCO2 cut at <= +5 % USD" => assert!(
                f(&c["kg_co2"]) > 0.8 * f(&cost["kg_co2"])
                    || (v["carbon_cap_lp"].is_object()
                        && v["carbon_cap_lp"]["usd"].as_f64().is_none_or(|u| u > 1.05 * f(&cost["total_usd"]))),
                "{t}"
            ),
            other => panic!("no proof expected for {other}"),
        }
    }
    v
}

#[test]
fn carbon_lp_proves_or_allows_the_green_target() {
    let unreachable = |v: &serde_json::Value, name: &str| {
        v["targets"].as_array().unwrap().iter().find(|t| t["target"] == name).unwrap().get("unreachable").is_some()
    };
    let f = |x: &serde_json::Value| x.as_f64().unwrap();
    let cut = |v: &serde_json::Value| {
        let cost = v["policies"].as_array().unwrap().iter().find(|p| p["policy"] == "cost").unwrap().clone();
        1.0 - f(&v["carbon_lp"]["kg_co2"]) / f(&cost["kg_co2"])
    };
    let dear = carbon_case(1.30);
    // the cost policy runs all 8 GPU-hours on `dirty` (8 USD); within 8.4 USD the
    // LP moves 0.4 / 0.3 GPU-hours: a sixth of the work, 1/6 × (1 − 50/700) less CO2
    assert!((cut(&dear) - (1.0 / 6.0) * (1.0 - 50.0 / 700.0)).abs() < 1e-3, "{}", cut(&dear));
    assert!(unreachable(&dear, "green: kgCO2 cut at <= +5 % USD"), "{:#}", dear["targets"]);
    // the cost policy is the cheapest possible here: 15 % below greedy, or
    // anything below greedy-spot, is proven out
    assert!(unreachable(&dear, "cost vs greedy: saving"));
    assert!(unreachable(&dear, "cost vs greedy-spot: saving"));
    let near = carbon_case(1.04);
    assert!((cut(&near) - (1.0 - 50.0 / 700.0)).abs() < 1e-3, "{}", cut(&near));
    assert!(!unreachable(&near, "green: kgCO2 cut at <= +5 % USD"));
    // The same question from the cost side: the least cost at 0.8 × the cost
    // policy's kgCO2. A share φ of the 8 GPU-hours moved to `clean` cuts
    // φ × (1 − 50/700), so −20 % needs φ = 0.2 / (1 − 1/14) and costs 8 + 8 φ ×
    // (price − 1): 8.517 at 1.30 (> 8.4 = 1.05 × 8: unreachable, as the carbon LP
    // says), 8.069 at 1.04 (allowed).
    let phi = 0.2 / (1.0 - 50.0 / 700.0);
    for (v, price) in [(&dear, 1.30), (&near, 1.04)] {
        let c = &v["carbon_cap_lp"];
        let cost = v["policies"].as_array().unwrap().iter().find(|p| p["policy"] == "cost").unwrap().clone();
        assert!((f(&cost["total_usd"]) - 8.0).abs() < 1e-6, "{cost}");
        assert!((f(&c["caps"]["kg_co2"]) - 0.8 * f(&cost["kg_co2"])).abs() < 1e-6, "{c}");
        assert!((f(&c["usd"]) - (8.0 + 8.0 * phi * (price - 1.0))).abs() < 1e-3, "{price}: {c}");
        assert!(f(&c["kg_co2"]) <= f(&c["caps"]["kg_co2"]) + 1e-6, "{c}");
    }
}

/// Twelve one-GPU one-hour jobs submitted together; `own` has one GPU at
/// 1 USD/h, `cloud` eight at 3 USD/h; horizon 12 h (two LP slots of 6 h). With
/// `k` jobs run one after another on `own` and the rest at once on `cloud`, a
/// schedule costs 36 − 2k with mean completion (k(k+1)/2 + 12 − k) / 12 h.
///
/// The completion-capped LP, by hand: `own` does 6 GPU-hours per slot; work in
/// the second slot (`L`) counts 6 h (slot end − submission) per unit for its
/// job, so Σ completion ≥ max(12 × 1 h, 12 × 0.5 h + 6 L), i.e. `L ≤ 2C − 1`
/// for a mean completion `C`, and the least cost is 6 + L + 3 (6 − L) = 24 − 2L:
/// 12 USD from C = 3.5 h on (the plain LP), 18 at C = 2 h, 22 at C = 1 h,
/// infeasible below 1 h (no job ends before its hour of work).
#[test]
fn completion_capped_lp_bounds_every_schedule_meeting_the_mean_completion() {
    let fleet = ONE_CHEAP_EIGHT_DEAR;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv =
        "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string() + &"2017-09-04 10:00:00,3600,1,1,t\n".repeat(12);
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let mut model = EngineModel::new(&s, t.epoch_unix as f64).unwrap();
    let a = args(&[]);
    let jobs = fleet_sim::cli::sim_jobs(&t, &mut model, &a).unwrap();
    let h12 = 12.0 * 3600.0;
    // (a budget of 7 variables leaves the two 6 h slots without fine cells: the
    // hand computation above; 1000 gives 1 h cells, a bound at least as high)
    let capped_n = |model: &mut EngineModel, c: f64, n: usize| {
        let caps = fleet_sim::lp::Caps { mean_completion_h: Some(c), kg_co2: None };
        fleet_sim::lp::capped_bound(model, &jobs, &[], h12, n, caps).unwrap()
    };
    let capped = |model: &mut EngineModel, c: f64| capped_n(model, c, 1000);
    let plain = fleet_sim::lp::lp_bound(&mut model, &jobs, &[], h12, 1000).unwrap();
    assert!((plain.usd - 12.0).abs() < 1e-6, "{plain:?}");
    for (c, want) in [(12.0, 12.0), (3.5, 12.0), (2.0, 18.0), (1.5, 20.0), (1.0, 22.0)] {
        let b = capped_n(&mut model, c, 7);
        assert_eq!((b.slot_hours, b.cell_hours), (6.0, 6.0));
        let fine = capped(&mut model, c);
        assert_eq!(fine.cell_hours, 1.0);
        assert!(fine.usd.unwrap() >= want - 1e-6, "C = {c}: {fine:?}");
        let usd = b.usd.unwrap_or(f64::NAN);
        assert!((usd - want).abs() < 1e-6, "C = {c}: {b:?}");
        assert!(b.describe().contains(&format!("{want:.0} USD")), "{}", b.describe());
    }
    let none = capped(&mut model, 0.9);
    assert_eq!(none.usd, None, "{none:?}");
    assert!(none.describe().contains("infeasible"), "{}", none.describe());
    // a proof that no schedule meets the cap: both solvers say so, and
    // clarabel's Farkas vector, checked against the LP's rows, proves it
    assert_eq!(none.solver, "infeasible by microlp and clarabel", "{none:?}");
    assert!(none.certificate.starts_with("certified: clarabel's Farkas vector"), "{none:?}");
    assert!(capped(&mut model, 2.0).certificate.starts_with("certified: clarabel's dual"));
    // a lower bound of every such schedule (here: the k-on-own family)
    for k in 0..=12u32 {
        let kf = k as f64;
        let (usd, c) = (36.0 - 2.0 * kf, (kf * (kf + 1.0) / 2.0 + 12.0 - kf) / 12.0);
        let b = capped(&mut model, c);
        assert!(b.usd.unwrap() <= usd + 1e-6, "k = {k}: {b:?} > {usd}");
    }
    // and of every simulated policy at its own mean completion, by its own end
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--bound-completion-h", "2", "--bound-completion-h", "0.5"]), &l).unwrap();
    for p in r.policies.iter().filter(|p| p.unplaced == 0) {
        let caps = fleet_sim::lp::Caps { mean_completion_h: Some(p.completion_mean_s / 3600.0), kg_co2: None };
        let b = fleet_sim::lp::capped_bound(&mut model, &jobs, &[], p.makespan_s.max(3600.0), 1000, caps).unwrap();
        assert!(b.usd.unwrap() <= p.total_usd + 1e-6, "{}: {b:?} > {}", p.policy, p.total_usd);
    }
    let cost = r.policies.iter().find(|p| p.policy == "cost").unwrap();
    let own = cost.own_completion_lp_usd.unwrap();
    assert!(own <= cost.total_usd + 1e-6 && own >= r.bound_usd() - 1e-6, "{own} {}", cost.total_usd);
    assert!(r.notes.iter().all(|n| !n.contains("LP")), "{:?}", r.notes);
    // the flag's bounds are in the report, the impossible one says so
    assert_eq!(r.bound_checks.len(), 2, "{:?}", r.bound_checks);
    assert_eq!(r.bound_checks[0].caps.mean_completion_h, Some(2.0));
    assert!(r.bound_checks[0].usd.unwrap() >= 18.0 - 1e-6, "{:?}", r.bound_checks[0]);
    assert_eq!(r.bound_checks[1].usd, None);
    assert!(r.table().contains("min cost at mean completion ≤ 2.00 h"), "{}", r.table());
    let gs = r.policies.iter().find(|p| p.policy == "greedy-spot").unwrap();
    let cl = r.completion_lp.as_ref().unwrap();
    assert_eq!(cl.caps.mean_completion_h, Some(gs.completion_mean_s / 3600.0));
    assert!(cl.usd.unwrap() <= gs.total_usd + 1e-6);
    for bad in ["--bound-completion-h=-1", "--bound-completion-h=NaN", "--bound-completion-h=0"] {
        let e = run_loaded(&args(&[bad]), &l).err().unwrap().to_string();
        assert!(e.contains("--bound-completion-h"), "{bad}: {e}");
    }
}

/// A report's LPs do not depend on how they are run: one after another
/// (`--threads 1`), several LPs at once (`--threads 2`, `6`), or each of
/// them with its two solvers at once besides (`--threads 16`: two threads per
/// LP) give the same report, to the byte. And
/// `--lp-uncertified` takes the solvers' points as the bounds, saying so: the
/// same values here (the LPs are small and solved exactly), no certificate,
/// and the planner's page says the bound is not proven.
#[test]
fn lps_solved_at_once_or_uncertified_give_the_same_report() {
    let s = EngineSetup { fleet_toml: ONE_CHEAP_EIGHT_DEAR.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string()
        + &(0..12).map(|i| format!("2017-09-04 10:{:02}:00,{},1,1,t\n", i, 1800 + 300 * i)).collect::<String>();
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let checks = ["--bound-completion-h", "2", "--bound-completion-h", "0.5"];
    let run = |extra: &[&str]| {
        let mut a = checks.to_vec();
        a.extend_from_slice(extra);
        run_loaded(&args(&a), &l).unwrap()
    };
    let one = run(&["--threads", "1"]);
    // every LP of the report was solved: the plain one, each policy's own end
    // and the cost policy's completion LP, the carbon and both capped ones,
    // both checks (the second infeasible, proven)
    let lp = one.lp_bound.as_ref().unwrap();
    assert!(lp.is_certified(), "{lp:?}");
    assert!(one.carbon_lp.as_ref().is_some_and(|c| c.certificate.starts_with("certified")), "{:?}", one.carbon_lp);
    assert!(one.completion_lp.is_some() && one.carbon_cap_lp.is_some());
    assert_eq!(one.bound_checks.len(), 2);
    assert_eq!(one.bound_checks[1].usd, None);
    assert!(
        one.bound_checks[1].certificate.starts_with("certified: clarabel's Farkas vector"),
        "{:?}",
        one.bound_checks
    );
    let cost = one.policies.iter().find(|p| p.policy == "cost").unwrap();
    assert!(cost.own_completion_lp_usd.is_some(), "{cost:?}");
    assert!(one.policies.iter().any(|p| p.own_lp_bound_usd.is_some()), "no policy ended before the slowest");
    assert!(one.notes.iter().all(|n| !n.contains("LP")), "{:?}", one.notes);
    let json = |r: &fleet_sim::report::Report| serde_json::to_string(r).unwrap();
    for n in ["2", "6", "16"] {
        assert_eq!(json(&one), json(&run(&["--threads", n])), "--threads {n}");
    }
    // uncertified: the solver's point is the bound, and says it is not proven
    for n in ["1", "2"] {
        let fast = run(&["--threads", n, "--lp-uncertified"]);
        let lp_fast = fast.lp_bound.as_ref().unwrap();
        assert!(!lp_fast.is_certified(), "{lp_fast:?}");
        assert_eq!(lp_fast.certificate, "not certified: not asked (--lp-uncertified)");
        assert_eq!(lp_fast.usd, lp_fast.solver_usd);
        assert!((lp_fast.usd - lp.usd).abs() < 1e-6, "{} vs {}", lp_fast.usd, lp.usd);
        for (a, b) in fast.policies.iter().zip(&one.policies) {
            assert_eq!(a.total_usd, b.total_usd, "{}", a.policy);
            assert!((a.ratio_to_lower_bound - b.ratio_to_lower_bound).abs() < 1e-6, "{}", a.policy);
        }
        assert!(fast.summary().contains("not certified: not asked (--lp-uncertified)"), "{}", fast.summary());
        assert!(!fast.summary().contains("proven from the LP's dual"), "{}", fast.summary());
        assert!(one.summary().contains("proven from the LP's dual"), "{}", one.summary());
        // an infeasible LP is still proven so by clarabel's Farkas vector (it
        // comes with clarabel's answer, at no extra solve)
        assert_eq!(fast.bound_checks[1].usd, None);
    }
}

/// The carbon hold through the CLI: off by default; on, only the green policy's
/// report changes (the other policies and baselines are byte-identical), every job
/// still completes; bad values are errors naming the flag.
#[test]
fn carbon_hold_flags_change_only_the_green_policy() {
    let plain = run_loaded(&args(&[]), &loaded(vec![spot_trace()])).unwrap();
    let held =
        run_loaded(&args(&["--carbon-hold-h", "24", "--carbon-hold-slack", "2"]), &loaded(vec![spot_trace()])).unwrap();
    for (a, b) in plain.policies.iter().zip(&held.policies) {
        assert_eq!(a.policy, b.policy);
        assert_eq!(a.completed + a.unplaced, b.completed + b.unplaced);
        assert_eq!(b.unplaced, a.unplaced, "{}", a.policy);
        if a.policy != "green" {
            assert_eq!(serde_json::to_string(a).unwrap(), serde_json::to_string(b).unwrap(), "{}", a.policy);
        }
        assert_eq!(a.held_jobs, 0, "{}: the hold is off by default", a.policy);
    }
    // (This fleet's carbon is flat, so green finds nothing to hold here: the hold
    // itself is tested on a diurnal series in `sim::tests`.)
    let json = serde_json::to_string(&plain).unwrap();
    assert!(!json.contains("held_jobs"), "no hold fields when nothing is held");
    for bad in [
        ["--carbon-hold-h=25", "--carbon-hold-slack=1"],
        ["--carbon-hold-h=-1", "--carbon-hold-slack=1"],
        ["--carbon-hold-h=NaN", "--carbon-hold-slack=1"],
        ["--carbon-hold-h=12", "--carbon-hold-slack=-0.5"],
        ["--carbon-hold-h=12", "--carbon-hold-min-saving=2"],
    ] {
        let flag = bad.iter().find(|f| !f.ends_with("=12") && !f.ends_with("slack=1")).unwrap();
        let name = flag.split('=').next().unwrap();
        let e = run_loaded(&args(&bad), &loaded(vec![])).err().unwrap().to_string();
        assert!(e.contains(name), "{bad:?}: {e}");
    }
}

/// Owned pools priced differently: a cheap GPU that works and eight dear ones
/// that sit idle. The report's owned line splits the total by each pool's own
/// price. (It used to take the fixed cost × the busy share as the owned part:
/// 81 USD/h × 1/9 of the GPU-hours = 9 USD/h against the 1 USD/h really paid,
/// and printed a negative "cloud + egress"; onprem-heavy showed −291,372 USD.)
/// The cash view: what a policy adds to the bill is its cloud compute, its
/// egress and the running cost of the owned GPUs it used (the fleet's
/// `running`), the owned hardware being paid either way. A policy that scores
/// owned GPUs at that running cost (`owned_at_running_cost`) fills them before
/// renting, and is still billed at their amortized price in the report's USD.
#[test]
fn cash_is_cloud_egress_and_the_running_cost_of_the_owned_gpus_used() {
    const FLEET: &str = r#"
[[clusters]]
name = "own"
provider = "onprem"
region = "lab"
onprem = true
prices.H100 = { onprem = 4.0, running = 0.25 }
[[clusters.pools]]
name = "h100"
gpu_type = "H100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
prices.H100 = { on_demand = 2.5 }
[[clusters.pools]]
name = "h100"
gpu_type = "H100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "t"
home = "own"
"#;
    let policies = "[policies.cost-running]\nowned_at_running_cost = true\n";
    let s = EngineSetup {
        fleet_toml: FLEET.into(),
        dataset_gb: 0.0,
        policies_toml: Some(policies.into()),
        ..EngineSetup::default()
    };
    // one 8-GPU job of 8 h: 256 USD at home amortized, 160 in the cloud
    let csv = "submit_time,duration_s,gpus,gpu_models,duration_gpu,min_gpu,team,interruptible,checkpoint_s,datasets\n\
               2017-09-04 10:00:00,28800,8,H100,H100,,t,,,\n";
    let t = fleet_sim::trace::read_generic(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--lp-max-vars", "0"]), &l).unwrap();
    let by = |name: &str| r.policies.iter().find(|p| p.policy == name).unwrap_or_else(|| panic!("no {name}"));
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    // the cost policy prices the owned GPUs amortized and rents: cash = its bill
    let cost = by("cost");
    assert!(cost.spend.keys().all(|k| k.starts_with("cloud/")), "{:?}", cost.spend);
    assert!(close(cost.total_usd, 160.0), "{cost:?}");
    assert_eq!((cost.owned_running_usd, cost.cash_usd), (Some(0.0), Some(cost.total_usd)));
    // at the running cost the job stays on the idle owned GPUs: billed 256 USD
    // amortized, but it adds only 8 h × 8 GPUs × 0.25 = 16 USD of cash
    let run = by("cost-running");
    assert!(run.spend.keys().all(|k| k.starts_with("own/")), "{:?}", run.spend);
    assert!(close(run.total_usd, 256.0) && close(run.owned_used_usd, 256.0), "{run:?}");
    assert!(close(run.owned_running_usd.unwrap(), 16.0) && close(run.cash_usd.unwrap(), 16.0), "{run:?}");
    let table = r.table();
    let line = table.lines().find(|x| x.trim_start().starts_with("cost-running") && x.contains("cash")).unwrap();
    assert!(line.ends_with("running         16 USD, cash           16 USD"), "{line}");
    let summary = r.summary();
    assert!(summary.contains("- Cash: 160 USD added to the bill (cloud, egress and 0 USD of running"), "{summary}");
    // without a running cost for every owned pool there is no cash view
    let s =
        EngineSetup { fleet_toml: FLEET.replace(", running = 0.25", ""), dataset_gb: 0.0, ..EngineSetup::default() };
    let t = fleet_sim::trace::read_generic(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--lp-max-vars", "0"]), &l).unwrap();
    assert!(r.policies.iter().all(|p| p.owned_running_usd.is_none() && p.cash_usd.is_none()));
    assert!(!r.table().contains("cash") && !r.summary().contains("Cash"));
}

#[test]
fn owned_spend_is_each_pools_busy_hours_at_its_own_price() {
    const FLEET: &str = r#"
[[clusters]]
name = "own"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 1.0 }
prices.H100 = { onprem = 10.0 }
[[clusters.pools]]
name = "cheap"
gpu_type = "A100"
gpus_per_node = 1
nodes = 1
[[clusters.pools]]
name = "dear"
gpu_type = "H100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
prices.A100 = { on_demand = 3.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "t"
home = "own"
"#;
    let s = EngineSetup { fleet_toml: FLEET.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    // one A100-only job: it can use the cheap owned GPU or the cloud, never the
    // dear owned pool
    let csv = "submit_time,duration_s,gpus,gpu_models,duration_gpu,min_gpu,team,interruptible,checkpoint_s,datasets\n\
               2017-09-04 10:00:00,3600,1,A100,A100,,t,,,\n";
    let t = fleet_sim::trace::read_generic(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--lp-max-vars", "0"]), &l).unwrap();
    let table = r.table();
    for p in &r.policies {
        let owned: f64 = p.spend.iter().filter(|(k, _)| k.starts_with("own/")).map(|(_, s)| s.usd).sum();
        assert!((p.owned_used_usd - owned).abs() < 1e-9, "{}: {} vs {owned}", p.policy, p.owned_used_usd);
        let cloud: f64 = p.spend.iter().filter(|(k, _)| k.starts_with("cloud/")).map(|(_, s)| s.usd).sum();
        assert!((p.total_usd - p.owned_used_usd - cloud - p.egress_usd).abs() < 1e-9, "{p:?}");
        assert!(p.total_usd - p.owned_used_usd >= 0.0, "{p:?}");
        // the fixed cost covers both owned pools over the whole run
        let h = p.makespan_s / 3600.0;
        assert!((p.owned_fixed_usd - 81.0 * h).abs() < 1e-6, "{} {}", p.policy, p.owned_fixed_usd);
        let line = table
            .lines()
            .find(|x| x.trim_start().starts_with(&p.policy) && x.contains("cloud + egress"))
            .unwrap_or_else(|| panic!("no owned line for {}:\n{table}", p.policy));
        assert!(line.ends_with(&format!("{:>12.0} USD", cloud + p.egress_usd)), "{line}");
    }
    // the home-only baseline ran the job on the cheap owned GPU: 1 USD, nothing in the cloud
    let home = r.policies.iter().find(|p| p.policy == "home-only").unwrap();
    assert!((home.owned_used_usd - 1.0).abs() < 1e-9 && (home.total_usd - 1.0).abs() < 1e-9, "{home:?}");
}

/// The estimate check: where nothing the engine does not know happens (jobs known
/// in advance, no spot), its expectations at first placement are what the replay
/// does; a spot drop it could not foresee shows as a replay later than expected.
/// Engine policies carry the check, the baselines (which ignore the engine's
/// estimates) do not.
#[test]
fn the_report_checks_the_engines_estimates_against_the_replay() {
    let fleet = ONE_CHEAP_EIGHT_DEAR;
    let s = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv =
        "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string() + &"2017-09-04 10:00:00,3600,1,1,t\n".repeat(4);
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--lp-max-vars", "0"]), &l).unwrap();
    for p in &r.policies {
        let engine = ["cost", "time", "green"].contains(&p.policy.as_str());
        assert_eq!(!p.estimates.is_empty(), engine, "{}: {:?}", p.policy, p.estimates);
        if !engine {
            continue;
        }
        let all = p.estimates.last().unwrap();
        assert_eq!(all.class, "all");
        assert_eq!(all.jobs, 4);
        assert_eq!(p.estimates[..p.estimates.len() - 1].iter().map(|e| e.jobs).sum::<usize>(), 4, "{:?}", p.estimates);
        assert!((all.completion_mean_s - p.completion_mean_s).abs() < 1e-6, "{all:?} vs {}", p.completion_mean_s);
        assert!((all.wait_mean_s - p.wait_mean_s).abs() < 1e-6, "{all:?} vs {}", p.wait_mean_s);
        for e in &p.estimates {
            assert!(e.jobs > 0);
            assert!((e.expected_completion_mean_s - e.completion_mean_s).abs() < 1.0, "{}: {e:?}", p.policy);
            assert!((e.expected_wait_mean_s - e.wait_mean_s).abs() < 1.0, "{}: {e:?}", p.policy);
            assert!(e.completion_abs_error_mean_s < 1.0 && e.within_25pct == 1.0, "{}: {e:?}", p.policy);
        }
    }
    assert!(r.table().contains("engine estimates at each job's first placement"), "{}", r.table());

    // Spot for 2 h, then gone for good; a 4 h job checkpointing hourly. The
    // engine prices the trace's 0.5 reclaims per hour of spot: 2 reclaims over the
    // run, each losing half an interval and a restore (0.5 h + 300 s), and no wait
    // for spot again (no spell seen yet) — 14,400 + 2 × 2,100 = 18,600 s. The
    // replay reclaims it once, right at its second checkpoint: it loses only the
    // restore on demand, 14,400 + 300 = 14,700 s.
    const SPOT: &str = r#"
[[clusters]]
name = "c"
provider = "aws"
region = "us-east-1"
spot_preemptions_per_hour = 0.15
prices.A100 = { on_demand = 3.0, spot = 0.5 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 1
nodes = 1

[[teams]]
name = "t"
home = "c"
"#;
    let s = EngineSetup { fleet_toml: SPOT.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:00:00,14400,1,14400,t\n";
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let spot = vec![SpotTrace::parse(
        r#"{"metadata":{"gap_seconds":1800},"data":[1,1,1,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}"#,
        "gone-us-east-1",
    )
    .unwrap()];
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot };
    let r = run_loaded(&args(&["--lp-max-vars", "0", "--policy", "cost"]), &l).unwrap();
    let cost = &r.policies[0];
    assert_eq!(cost.policy, "cost");
    let e = cost.estimates.iter().find(|e| e.class == "spot").unwrap_or_else(|| panic!("{:?}", cost.estimates));
    assert_eq!(cost.preemptions, 1, "{cost:?}");
    assert_eq!(e.jobs, 1);
    assert!((e.expected_completion_mean_s - 18_600.0).abs() < 1e-6, "{e:?}");
    assert!((e.completion_mean_s - 14_700.0).abs() < 1e-6, "{e:?}");
    assert!((e.completion_abs_error_mean_s - 3_900.0).abs() < 1e-6, "{e:?}");
    assert_eq!(e.within_25pct, 1.0, "3,900 s is within 25 % of 18,600 s: {e:?}");
}

/// The one-page summary for a capacity planner: every policy's cost and
/// completion, the cost policy against the baselines and the bound, where its
/// money goes, its estimates against the replay and the targets — in one page,
/// with the same figures as the report; `--out-dir` writes it as `summary.md`.
#[test]
fn the_summary_is_one_page_with_the_reports_figures() {
    let r = run_loaded(&args(&[]), &loaded(vec![spot_trace()])).unwrap();
    let text = r.summary();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() <= 60, "{} lines:\n{text}", lines.len());
    assert!(lines[0].starts_with("# Simulation summary: t.csv on f.toml"), "{text}");
    let cost = r.policies.iter().find(|p| p.policy == "cost").unwrap();
    let home = r.policies.iter().find(|p| p.policy == "home-only").unwrap();
    for p in &r.policies {
        let row = format!("| {} | {:.0} | ", p.policy, p.total_usd);
        let line = lines.iter().find(|l| l.starts_with(&row)).unwrap_or_else(|| panic!("no row {row}:\n{text}"));
        assert!(line.contains(&format!("| {:.2} h |", p.completion_mean_s / 3600.0)), "{line}");
        assert!(line.contains(&format!("{:+.1} %", 100.0 * (p.total_usd / home.total_usd - 1.0))), "{line}");
    }
    assert!(text.contains(&format!(
        "- Pays {:.0} USD at a mean completion of {:.2} h.",
        cost.total_usd,
        cost.completion_mean_s / 3600.0
    )));
    let saving = 100.0 * (1.0 - cost.total_usd / home.total_usd);
    assert!(text.contains(&format!("{saving:.1} % cheaper than home-only ({:.0} USD", home.total_usd)), "{text}");
    assert!(text.contains(&format!("{:.1} % above the bound", 100.0 * (cost.ratio_to_lower_bound - 1.0))), "{text}");
    let all = cost.estimates.iter().find(|e| e.class == "all").unwrap();
    assert!(text.contains(&format!("the replay gave {:.2} h", all.completion_mean_s / 3600.0)), "{text}");
    assert_eq!(text.matches("\n- met ").count(), r.targets.iter().filter(|t| t.met).count(), "{text}");
    assert_eq!(text.matches("\n- **missed** ").count(), r.targets.iter().filter(|t| !t.met).count(), "{text}");
    // a baseline that could not place some jobs says so where it is compared
    assert!(!text.contains("Not placed"), "{text}");
    let mut short = r.clone();
    short.policies.iter_mut().find(|p| p.policy == "home-only").unwrap().unplaced = 3;
    let t2 = short.summary();
    assert!(t2.contains("Not placed: home-only (3 jobs)."), "{t2}");
    assert!(t2.contains("which could not place 3 of the 60 jobs)"), "{t2}");
    // written beside report.json
    let d = std::env::temp_dir().join(format!("fleet-sim-summary-{}", std::process::id()));
    let files = write_outputs(&r, &d).unwrap();
    assert!(files.iter().any(|f| f.ends_with("summary.md")));
    assert_eq!(std::fs::read_to_string(d.join("summary.md")).unwrap(), text);
    let _ = std::fs::remove_dir_all(d);
    // --summary prints it instead of the table, and is not --json
    assert!(args(&["--summary"]).summary);
    let both = Cli::try_parse_from(["t", "--trace", "t.csv", "--fleet", "f.toml", "--summary", "--json"]);
    assert!(both.is_err());
}

/// Jobs on their way to a pool (remote submission, staging) are counted there:
/// two 8-GPU jobs placed at one instant away from home see the cheap cluster's
/// eight free GPUs taken by the first, and the second goes to the next cluster
/// instead of queueing ten hours behind it. Before, the second saw the same free
/// GPUs (the first joins the queue only after its 120 s of remote submission),
/// was told it would start at once, and waited the first job's ten hours; the
/// engine's estimates now hold for both.
#[test]
fn jobs_on_their_way_to_a_pool_take_its_free_gpus() {
    const FLEET: &str = r#"
[overheads]
remote_submit_s = 120.0

[[clusters]]
name = "home"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 0.5 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 1
nodes = 1

[[clusters]]
name = "a"
provider = "aws"
region = "us-east-1"
prices.A100 = { on_demand = 1.0 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "b"
provider = "gcp"
region = "us-central1"
prices.A100 = { on_demand = 1.5 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 1

[[teams]]
name = "t"
home = "home"
"#;
    let s = EngineSetup { fleet_toml: FLEET.into(), dataset_gb: 0.0, ..EngineSetup::default() };
    let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string()
        + &"2017-09-04 10:00:00,36000,8,288000,t\n".repeat(2);
    let t = read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap();
    let l = Loaded { trace: t, trace_name: "t".into(), fleet_name: "f".into(), setup: s, spot: vec![] };
    let r = run_loaded(&args(&["--lp-max-vars", "0", "--policy", "cost"]), &l).unwrap();
    let cost = &r.policies[0];
    let used: Vec<&str> = cost.spend.keys().map(|k| k.split('/').next().unwrap()).collect();
    assert_eq!(used, ["a", "b"], "one job on each cloud: {:?}", cost.spend);
    // each starts after its remote submission, not after the other's ten hours
    assert!((cost.wait_mean_s - 120.0).abs() < 1.0, "{cost:?}");
    for e in &cost.estimates {
        assert!(e.completion_abs_error_mean_s < 1.0 && e.within_25pct == 1.0, "{e:?}");
    }
}

/// Twelve one-GPU two-hour jobs of team `t`, one every 30 min from 10:00, over `s`.
fn half_hourly(s: EngineSetup) -> Loaded {
    let mut csv = "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string();
    for i in 0..12 {
        csv.push_str(&format!("2017-09-04 {:02}:{:02}:00,7200,1,7200,t\n", 10 + i / 2, 30 * (i % 2)));
    }
    Loaded {
        trace: read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap(),
        trace_name: "t".into(),
        fleet_name: "f".into(),
        setup: s,
        spot: vec![],
    }
}

/// The flags of `--tune green` within `budget` over jobs on demand only,
/// trying the time value 2 and the carbon prices `prices`; then `extra`.
fn green_args(budget: &str, prices: &str, extra: &[&str]) -> SimulateArgs {
    let mut flags = vec![
        "--interruptible-share",
        "0",
        "--tune",
        "green",
        "--tune-budget",
        budget,
        "--tune-time-values",
        "2",
        "--tune-carbon-prices",
        prices,
    ];
    flags.extend_from_slice(extra);
    args(&flags)
}

/// `--tune green` over `l` (jobs on demand only), trying the time value 2 and
/// the carbon prices 0 and 1.
fn tune_green(l: &Loaded, budget: &str, folds: &str) -> anyhow::Result<fleet_sim::tune::Tuned> {
    let a = green_args(budget, "0,1", &["--tune-folds", folds]);
    fleet_sim::tune::tune(&a, l, fleet_sim::tune::goal(&a)?.expect("--tune is given"))
}

/// `--tune green` over the two-zone fleet of [`carbon_case`] at a clean price of
/// 1.04 (8 GPUs each; 1-GPU 2-hour jobs, never more than 4 at once, so the
/// cost policy runs them all on `dirty`). Any carbon price above 0.04 USD per
/// 0.26 kg (an A100-hour at 700 g/kWh against 50) moves every job to `clean`:
/// −93 % kgCO2 for +4 % USD. Within a 5 % budget the tuner takes it; within 3 %
/// only the price 0 keeps the budget. The held-out half (jobs it did not
/// choose on) shows the same, and the chosen weights come out as a policies
/// table that the engine reads back.
#[test]
fn tuning_green_picks_the_cleanest_weights_within_the_budget_and_checks_them_on_held_out_jobs() {
    let l = half_hourly(two_zones(1.04));
    let tuned = |budget: &str| tune_green(&l, budget, "1").unwrap();
    let t = tuned("0.05");
    assert_eq!((t.tuning_jobs, t.held_out_jobs), (6, 6), "{t:#?}");
    assert!((t.split_h - 3.0).abs() < 1e-9, "{t:#?}");
    // tuning part: the cost policy pays 6 jobs × 2 GPU-hours × 1 USD
    assert!((t.tuning_reference[0].usd - 12.0).abs() < 1e-6, "{t:#?}");
    assert!((t.tuning_limit - 12.6).abs() < 1e-6, "{t:#?}");
    let [zero, one] = [&t.trials[0], &t.trials[1]];
    assert_eq!((zero.weights.carbon_usd_per_kg, one.weights.carbon_usd_per_kg), (0.0, 1.0));
    assert!((zero.figures.usd - 12.0).abs() < 1e-6 && (one.figures.usd - 12.48).abs() < 1e-6, "{t:#?}");
    assert!((one.figures.kg_co2 / zero.figures.kg_co2 - 50.0 / 700.0).abs() < 1e-6, "{t:#?}");
    assert!(zero.within && one.within);
    assert_eq!(t.chosen, Some(1), "{t:#?}");
    // held out: the cost policy, the built-in green (1 USD/kg: moves too), the tuned
    let names: Vec<&str> = t.held_out.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["cost", "green", "tuned"]);
    assert!((t.held_out[2].usd / t.held_out[0].usd - 1.04).abs() < 1e-6, "{t:#?}");
    assert!((t.held_out[2].kg_co2 / t.held_out[0].kg_co2 - 50.0 / 700.0).abs() < 1e-6, "{t:#?}");
    let toml = t.policy_toml.as_deref().unwrap();
    assert!(toml.starts_with("[policies.green]\n") && toml.contains("carbon_usd_per_kg = 1.0"), "{toml}");
    let p = fleet_engine::policy::Policies::from_toml_str(toml).unwrap();
    assert_eq!(p.get("green").unwrap().carbon_usd_per_kg, 1.0);
    assert!(t.text().contains("← chosen"), "{}", t.text());
    // +4 % is over a 3 % budget: only the price 0 keeps it
    let t = tuned("0.03");
    assert!(!t.trials[1].within && t.trials[0].within, "{t:#?}");
    assert_eq!(t.chosen, Some(0), "{t:#?}");
    assert!(t.policy_toml.as_deref().unwrap().contains("carbon_usd_per_kg = 0.0"));
}

/// `--tune-size-slack`: the built-in cost policy is replayed on the tuning part
/// beside the references, and a weight is kept only where, beside the mean
/// completion, no size class of at least 20 jobs completes more than the slack
/// later than the built-in's. 240 jobs of [`jobs_csv`] (60 each of 1, 2, 4
/// and 8 GPUs), the site's cost policy at 8 USD/GPU-h without the spot
/// queue (fast for every size), so weights cheaper at the same mean
/// completion make some size wait longer.
#[test]
fn tuning_cost_with_a_size_slack_holds_every_job_size_to_the_built_in() {
    let site = |n: u32| Loaded {
        trace: read_philly(jobs_csv(n, 150, &[1, 2, 4, 8]).as_bytes(), "t.csv", &ReadOptions::default()).unwrap(),
        trace_name: "t.csv".into(),
        fleet_name: "f.toml".into(),
        setup: EngineSetup {
            policies_toml: Some("[policies.cost]\ntime_value_usd_per_gpu_hour = 8.0\nspot_queue = false\n".into()),
            ..setup()
        },
        spot: vec![spot_trace()],
    };
    let l = site(240);
    let flags = ["--tune", "cost", "--tune-time-values", "0,0.5,2,8", "--tune-job-time-values", "0,10"];
    let run = |extra: &[&str]| {
        let a = args(&[&flags[..], extra].concat());
        let goal = fleet_sim::tune::goal(&a).unwrap().unwrap();
        fleet_sim::tune::tune(&a, &l, goal).unwrap()
    };
    let t = run(&["--tune-size-slack", "0.05"]);
    assert_eq!(t.size_slack, Some(0.05));
    let names: Vec<&str> = t.tuning_reference.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["greedy-spot", "greedy", "cost"]);
    let base = &t.tuning_reference[2];
    let sizes: Vec<(&str, usize)> = base.by_size.iter().map(|c| (c.gpus.as_str(), c.jobs)).collect();
    assert_eq!(sizes, [("1", 30), ("2-4", 60), ("5-8", 30)]);
    for tr in &t.trials {
        let sizes_ok = tr.figures.worst_size_ratio(base).is_none_or(|(_, r)| r <= 1.05);
        let mean_ok = tr.figures.unplaced == 0 && tr.figures.mean_completion_h <= t.tuning_limit;
        assert_eq!(tr.within, mean_ok && sizes_ok, "{tr:?}");
    }
    // the same trials without the guard: the guard keeps some out, adds none
    let plain = run(&[]);
    assert_eq!(plain.trials.len(), t.trials.len());
    for (g, p) in t.trials.iter().zip(&plain.trials) {
        assert_eq!(g.figures.usd, p.figures.usd);
        assert!(!g.within || p.within, "{g:?}");
    }
    let removed = t.trials.iter().zip(&plain.trials).filter(|(g, p)| p.within && !g.within).count();
    assert!(removed > 0, "the guard keeps out some weights within the mean: {:#?}", t.trials);
    assert!(plain.tuning_reference.iter().all(|f| f.name != "cost"));
    let text = t.text();
    assert!(text.contains("no job size more than 5 % later than `cost`"), "{text}");
    assert!(text.contains("worst size "), "{text}");
    // Walking forward (960 jobs over 40 h, three periods), the guard holds each
    // period's folds to the built-in replayed over the same jobs, and changes
    // a choice; the whole trace's lines show the sizes.
    let l = site(960);
    let a = args(&[&flags[..], &["--tune-walk", "3", "--tune-size-slack", "0.05"]].concat());
    let goal = fleet_sim::tune::goal(&a).unwrap().unwrap();
    let w = fleet_sim::walk::walk(&a, &l, goal, 3).unwrap();
    assert_eq!(w.size_slack, Some(0.05));
    let names: Vec<&str> = w.whole.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["greedy-spot", "greedy", "cost", "walk"]);
    for f in &w.whole {
        assert_eq!(f.by_size.iter().map(|c| c.jobs).sum::<usize>(), 960 - f.unplaced, "{f:?}");
    }
    for p in &w.periods {
        for f in &p.ran {
            assert_eq!(f.by_size.iter().map(|c| c.jobs).sum::<usize>(), f.jobs - f.unplaced, "{f:?}");
        }
    }
    let text = w.text();
    assert!(text.contains("whole trace (limit") && text.contains("no job size more than 5 % later than `cost`"));
    let walk_line = text.lines().find(|l| l.trim_start().starts_with("walk ")).expect("the walk's line");
    assert!(walk_line.contains("worst size "), "{walk_line}");
    let a = args(&[&flags[..], &["--tune-walk", "3"]].concat());
    let plain = fleet_sim::walk::walk(&a, &l, goal, 3).unwrap();
    let pw: Vec<_> = plain.periods.iter().map(|p| p.weights).collect();
    let gw: Vec<_> = w.periods.iter().map(|p| p.weights).collect();
    assert_ne!(pw, gw, "the guard changes no choice:\n{}\n{}", plain.text(), w.text());
}

/// `--tune cost` over the spot fleet of the tests above: every trial within the
/// limit has a mean completion no worse than greedy-spot's on the tuning part,
/// the chosen one is the cheapest of those, and the held-out part replays the
/// references, the built-in cost policy and the chosen weights. Bad flags are
/// errors naming them.
#[test]
fn tuning_cost_picks_the_cheapest_weights_no_slower_than_greedy_spot() {
    let a = args(&["--tune", "cost", "--tune-time-values", "0.5,2,8", "--tune-job-time-values", "0,10"]);
    let goal = fleet_sim::tune::goal(&a).unwrap().unwrap();
    let t = fleet_sim::tune::tune(&a, &loaded(vec![spot_trace()]), goal).unwrap();
    assert_eq!(t.trials.len(), 12, "three time values per GPU-hour, two per job-hour, with and without the spot queue");
    assert!(t.trials.iter().any(|x| x.weights.time_value_usd_per_job_hour == 10.0 && x.weights.spot_queue));
    assert_eq!(t.tuning_jobs + t.held_out_jobs, 60);
    let gs = t.tuning_reference.iter().find(|f| f.name == "greedy-spot").unwrap();
    assert!((t.tuning_limit - gs.mean_completion_h).abs() < 1e-12);
    for tr in &t.trials {
        assert_eq!(tr.within, tr.figures.unplaced == 0 && tr.figures.mean_completion_h <= t.tuning_limit, "{tr:?}");
    }
    let within: Vec<&fleet_sim::tune::Trial> = t.trials.iter().filter(|x| x.within).collect();
    match t.chosen {
        Some(i) => {
            assert!(within.iter().all(|x| x.figures.usd >= t.trials[i].figures.usd), "{t:#?}");
            let names: Vec<&str> = t.held_out.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(names, ["greedy-spot", "greedy", "cost", "tuned"]);
        }
        None => assert!(within.is_empty(), "{t:#?}"),
    }
    // held out, every replay but the references is marked where over the limit,
    // the built-in cost policy included
    let text = t.text();
    assert!(text.contains("tv 0.5 + 10/job carbon 0 queue false"), "{text}");
    let held = &text[text.find("held-out part").unwrap()..];
    for f in &t.held_out[2..] {
        let line = held.lines().find(|l| l.trim_start().starts_with(&format!("{} ", f.name))).unwrap();
        let over = f.unplaced > 0 || f.mean_completion_h > t.held_out_limit;
        assert_eq!(line.contains("(over the limit)"), over, "{line} / {:?} / {}", f, t.held_out_limit);
    }
    for (flags, msg) in [
        (vec!["--tune", "green", "--tune-split", "1"], "--tune-split"),
        (vec!["--tune", "green", "--tune-budget=-1"], "--tune-budget"),
        (vec!["--tune", "green", "--tune-carbon-prices", "1,nan"], "--tune-carbon-prices"),
    ] {
        let e = fleet_sim::tune::goal(&args(&flags)).unwrap_err().to_string();
        assert!(e.contains(msg), "{flags:?}: {e}");
    }
    assert!(
        fleet_sim::cli::parse_from(["x", "--trace", "t", "--fleet", "f", "--tune", "time"].map(String::from)).is_err()
    );
}

/// `--tune-folds`: the two zones of [`two_zones`] at a clean price of 1.04,
/// but `clean` is as dirty as `dirty` until 13:00. Of the six tuning jobs (2 h
/// each, from 10:00 every 30 min) the first three run wholly before 13:00 and
/// stay on `dirty` at any carbon price; the last three gain from `clean` and
/// move at 1 USD/kg, +4 % on their half and +2 % over the tuning part. Within a
/// 3 % budget that is kept over the whole part (one fold) but not on the second
/// of two folds, so with two folds only the price 0 is kept.
#[test]
fn tuning_folds_keep_only_weights_that_hold_the_limit_in_every_period() {
    let mut clean = String::from("datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh\n");
    for h in 0..48 {
        let g = if h < 13 { 700.0 } else { 50.0 };
        clean.push_str(&format!("2017-09-{:02} {:02}:00:00,CLEAN,{g},{g}\n", 4 + h / 24, h % 24));
    }
    let mut s = two_zones(1.04);
    s.carbon_csvs = vec![carbon("DIRTY", 700.0), ("CLEAN".into(), clean)];
    let l = half_hourly(s);
    let tuned = |folds: &str| tune_green(&l, "0.03", folds).unwrap();
    let one = tuned("1");
    let moved = &one.trials[1];
    assert!((moved.figures.usd - 12.24).abs() < 1e-6, "{one:#?}");
    assert!(moved.within && moved.folds_within == 1 && one.chosen == Some(1), "{one:#?}");
    let two = tuned("2");
    assert_eq!(two.folds, 2);
    // the same replays, merged: the figures over the tuning part do not change
    assert!((two.trials[1].figures.usd - 12.24).abs() < 1e-6, "{two:#?}");
    assert!((two.tuning_limit - one.tuning_limit).abs() < 1e-9, "{two:#?}");
    assert_eq!((two.trials[1].within, two.trials[1].folds_within), (false, 1), "{two:#?}");
    assert_eq!(two.chosen, Some(0), "{two:#?}");
    assert!(two.text().contains("over the limit on 1 of 2 folds"), "{}", two.text());
    let e = tune_green(&l, "0.03", "0").unwrap_err().to_string();
    assert!(e.contains("--tune-folds"), "{e}");
}

/// `--tune-walk 2` over the twelve jobs of [`half_hourly`] on the two zones of
/// [`two_zones`] at a clean price of 1.04 (moving a job to `clean` costs +4 %
/// and cuts its CO2 to 50/700). The first period (10:00–12:30) runs the
/// built-in green policy, which moves every job. The second, from 13:00, runs
/// the weights chosen on the first period's jobs whose run could have ended by
/// 13:00 (the three from 10:00 to 11:00): within a 5 % budget the price 1 (its
/// jobs move too), within 3 % the price 0 (they stay on `dirty`). The switch
/// takes effect for the job submitted at 13:00 itself. The weights for the jobs
/// to come are chosen on the second period's jobs done by its last submission
/// (15:30): the two from 13:00 and 13:30.
#[test]
fn walking_forward_runs_each_period_with_the_weights_chosen_before_it() {
    let l = half_hourly(two_zones(1.04));
    let walk_at = |budget: &str, prices: &str, extra: &[&str]| {
        let a = green_args(budget, prices, extra);
        fleet_sim::walk::walk(&a, &l, fleet_sim::tune::goal(&a)?.expect("--tune is given"), a.tune_walk.unwrap_or(2))
    };
    let walk = |budget: &str, extra: &[&str]| walk_at(budget, "0,1", extra);
    let w = walk("0.05", &[]).unwrap();
    assert_eq!(w.periods.len(), 2);
    let (first, second) = (&w.periods[0], &w.periods[1]);
    assert_eq!((first.jobs, first.tuned_on_jobs, first.weights.as_ref()), (6, 0, None), "{w:#?}");
    assert_eq!((second.jobs, second.tuned_on_jobs), (6, 3), "{w:#?}");
    assert!((second.start_h - 3.0).abs() < 1e-9, "{w:#?}");
    // three jobs × 2 GPU-hours × 1 USD on `dirty`, and 5 % more
    assert!((second.limit.unwrap() - 6.3).abs() < 1e-6, "{w:#?}");
    assert_eq!(second.weights.as_ref().map(|x| x.carbon_usd_per_kg), Some(1.0), "{w:#?}");
    assert_eq!(w.next.tuned_on_jobs, 2, "{w:#?}");
    let names: Vec<&str> = w.whole.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["cost", "green", "walk"]);
    let (cost, walked) = (&w.whole[0], &w.whole[2]);
    assert!((cost.usd - 24.0).abs() < 1e-6, "{w:#?}");
    // every job moved: 12 × 2 × 1.04 USD, 50/700 of the CO2
    assert!((walked.usd - 24.96).abs() < 1e-6, "{w:#?}");
    assert!((walked.kg_co2 / cost.kg_co2 - 50.0 / 700.0).abs() < 1e-6, "{w:#?}");
    assert!(w.policy_toml.as_deref().unwrap().contains("carbon_usd_per_kg = 1.0"), "{w:#?}");
    // within 3 %: the second period stays on `dirty`, the first still moved
    let w = walk("0.03", &[]).unwrap();
    assert!((w.periods[1].limit.unwrap() - 6.18).abs() < 1e-6, "{w:#?}");
    assert_eq!(w.periods[1].weights.as_ref().map(|x| x.carbon_usd_per_kg), Some(0.0), "{w:#?}");
    let (cost, walked) = (&w.whole[0], &w.whole[2]);
    assert!((walked.usd - (12.0 * 1.04 + 12.0)).abs() < 1e-6, "{w:#?}");
    assert!((walked.kg_co2 / cost.kg_co2 - (6.0 * 50.0 / 700.0 + 6.0) / 12.0).abs() < 1e-6, "{w:#?}");
    assert!(w.policy_toml.as_deref().unwrap().contains("carbon_usd_per_kg = 0.0"), "{w:#?}");
    // each period's jobs in the whole replays: the first moved (12.48 USD), the
    // second stayed (12, as the cost policy); the periods add up to the whole
    let ran = |p: usize, name: &str| w.periods[p].ran.iter().find(|f| f.name == name).unwrap().clone();
    assert!((ran(0, "walk").usd - 12.48).abs() < 1e-6 && (ran(1, "walk").usd - 12.0).abs() < 1e-6, "{w:#?}");
    assert!((ran(1, "cost").usd - 12.0).abs() < 1e-6, "{w:#?}");
    for (k, f) in w.whole.iter().enumerate() {
        let parts: Vec<&fleet_sim::tune::Figures> = w.periods.iter().map(|p| &p.ran[k]).collect();
        assert!((parts.iter().map(|x| x.usd).sum::<f64>() - f.usd).abs() < 1e-6, "{f:?}");
        assert!((parts.iter().map(|x| x.kg_co2).sum::<f64>() - f.kg_co2).abs() < 1e-6, "{f:?}");
        assert_eq!(parts.iter().map(|x| x.jobs).sum::<usize>(), f.jobs);
    }
    assert!(w.periods.iter().skip(1).all(|p| p.kept_limit), "{w:#?}");
    // started on the cost policy (--tune-walk-start): the first period's jobs
    // stay on `dirty` (12 USD), the second runs the price chosen on them (1,
    // within 5 %) and moves (12.48): the whole walk, its first period from the
    // first submission on, pays 24.48
    let w = walk("0.05", &["--tune-walk", "2", "--tune-walk-start", "cost"]).unwrap();
    assert_eq!(w.start, "cost");
    assert_eq!(w.periods[1].weights.as_ref().map(|x| x.carbon_usd_per_kg), Some(1.0), "{w:#?}");
    let ran = |p: usize, name: &str| w.periods[p].ran.iter().find(|f| f.name == name).unwrap().clone();
    assert!((ran(0, "walk").usd - 12.0).abs() < 1e-6 && (ran(1, "walk").usd - 12.48).abs() < 1e-6, "{w:#?}");
    assert!((w.whole[2].usd - 24.48).abs() < 1e-6, "{w:#?}");
    assert!(w.text().contains("`cost` (nothing to tune on)"), "{}", w.text());
    let e = walk("0.05", &["--tune-walk", "2", "--tune-walk-start", "nope"]).unwrap_err().to_string();
    assert!(e.contains("--tune-walk-start") && e.contains("`nope`"), "{e}");
    for flag in [&["--tune-walk-start", "time"][..], &["--tune-walk-carry"]] {
        let line = [&["x", "--trace", "t", "--fleet", "f", "--tune", "cost"][..], flag].concat();
        assert!(fleet_sim::cli::parse_from(line.iter().map(|x| x.to_string())).is_err(), "{flag:?}");
    }
    // carrying the balance (--tune-walk-carry), within 3 %: the first period,
    // on the cost policy, left 3 % of what it paid by 13:00 (its six jobs run
    // until then: 2 + 2 + 2 + 1.5 + 1 + 0.5 USD), 0.27 USD. Spread over the six
    // jobs to come, the fold of three (the jobs done by 13:00) gets half: its
    // limit 6.18 + 0.135 lets in the price 1 (6.24), which 6.18 alone keeps
    // out. The whole walk pays 24.48 ≤ 1.03 × 24.
    let from_cost = |extra: &[&str]| {
        walk("0.03", &[&["--tune-walk", "2", "--tune-walk-start", "cost"][..], extra].concat()).unwrap()
    };
    let w = from_cost(&[]);
    assert_eq!(w.periods[1].weights.as_ref().map(|x| x.carbon_usd_per_kg), Some(0.0), "{w:#?}");
    assert_eq!(w.periods[1].carried, None, "{w:#?}");
    let w = from_cost(&["--tune-walk-carry"]);
    let second = &w.periods[1];
    assert!((second.carried.unwrap() - 0.27).abs() < 1e-6, "{w:#?}");
    assert!((second.limit.unwrap() - 6.315).abs() < 1e-6, "{w:#?}");
    assert_eq!(second.weights.as_ref().map(|x| x.carbon_usd_per_kg), Some(1.0), "{w:#?}");
    assert!((w.whole[2].usd - 24.48).abs() < 1e-6 && w.whole[2].usd <= 1.03 * w.whole[0].usd, "{w:#?}");
    assert!(w.text().contains("(carried +0.27 USD)"), "{}", w.text());
    // no weights keep a 3 % budget when moving is all there is: the period runs
    // the nearest (the least USD), marked so
    let w = walk_at("0.03", "1", &[]).unwrap();
    assert!(!w.periods[1].kept_limit, "{w:#?}");
    assert_eq!(w.periods[1].weights.as_ref().map(|x| x.carbon_usd_per_kg), Some(1.0), "{w:#?}");
    assert!(w.text().contains("none kept the limit: the nearest"), "{}", w.text());
    let text = w.text();
    assert!(text.contains("period 1") && text.contains("tv 2 carbon 1 queue"), "{text}");
    // bad walks are errors naming the flag; --tune-walk needs --tune
    for (extra, msg) in [(["--tune-walk", "1"], "--tune-walk"), (["--tune-folds", "2"], "--tune-folds")] {
        let e = walk("0.05", &extra).unwrap_err().to_string();
        assert!(e.contains(msg), "{extra:?}: {e}");
    }
    assert!(fleet_sim::cli::parse_from(["x", "--trace", "t", "--fleet", "f", "--tune-walk", "2"].map(String::from))
        .is_err());
}

/// A period's weights are chosen on the fleet as the jobs before it left it.
/// `clean` has one GPU here (1.04 × the price for 1/14 of the carbon). Of the
/// first period, a 10-hour job from 10:00 and three 1-hour jobs from 10:30,
/// 11:00 and 11:30, the two done by 12:00 (the second period's start) are
/// tuned on. At the carbon price 1 the long job takes `clean` (2.6 USD of
/// carbon saved for 0.4 USD more) and holds it past 12:00, so the two short
/// ones run on `dirty` (waiting 1 h or more at 2 USD/GPU-h is dearer than
/// the 0.26 USD of carbon they would save): the price changes nothing for them
/// and the tie goes to the price 0. Replayed without the long job (from an
/// empty fleet, as `--tune` replays its folds), the first short one would
/// take `clean`, and the price 1 would win.
#[test]
fn walking_forward_tunes_on_the_fleet_the_earlier_jobs_left() {
    let mut s = two_zones(1.04);
    let k = s.fleet_toml.rfind("gpus_per_node = 8").unwrap();
    s.fleet_toml.replace_range(k..k + "gpus_per_node = 8".len(), "gpus_per_node = 1");
    // one-GPU jobs: (hour, minute, seconds)
    let loaded = |jobs: &[(u32, u32, u32)]| {
        let mut csv = "timestamp,duration,num_gpus,gpu_time,cluster\n".to_string();
        for (h, m, d) in jobs {
            csv.push_str(&format!("2017-09-04 {h:02}:{m:02}:00,{d},1,{d},t\n"));
        }
        Loaded {
            trace: read_philly(csv.as_bytes(), "t", &ReadOptions::default()).unwrap(),
            trace_name: "t".into(),
            fleet_name: "f".into(),
            setup: s.clone(),
            spot: vec![],
        }
    };
    let short = [(10, 30, 3600), (11, 0, 3600)];
    let later = [(12, 0, 3600), (12, 30, 3600), (13, 0, 3600), (13, 30, 3600)];
    let l = loaded(&[&[(10, 0, 36000)][..], &short, &[(11, 30, 3600)], &later].concat());
    let flags = |extra: &[&str]| green_args("0.05", "0,1", extra);
    let a = flags(&["--tune-walk", "2"]);
    let w = fleet_sim::walk::walk(&a, &l, fleet_sim::tune::goal(&a).unwrap().unwrap(), 2).unwrap();
    let second = &w.periods[1];
    assert_eq!(second.tuned_on_jobs, 2, "{w:#?}");
    // the two short jobs on `dirty`, and 5 % more
    assert!((second.limit.unwrap() - 2.1).abs() < 1e-6, "{w:#?}");
    assert_eq!(second.weights.as_ref().map(|x| x.carbon_usd_per_kg), Some(0.0), "{w:#?}");
    // the two short jobs alone (then two held out), from an empty fleet: the
    // price 1 moves the first to `clean`, +2 %, and is chosen
    let a = flags(&[]);
    let t = fleet_sim::tune::tune(
        &a,
        &loaded(&[&short[..], &later[..2]].concat()),
        fleet_sim::tune::goal(&a).unwrap().unwrap(),
    )
    .unwrap();
    assert_eq!(t.tuning_jobs, 2, "{t:#?}");
    assert!((t.trials[1].figures.usd - 2.04).abs() < 1e-6, "{t:#?}");
    assert_eq!(t.chosen, Some(1), "{t:#?}");
}

/// A site's own Slurm accounting (`sacct --parsable2`, the columns of
/// `SACCT_FORMAT`) → generic format: one row per allocation that ran with
/// GPUs, its run time measured on the type it was given, limited to the type
/// it asked for; Fleet's stand-ins, jobs that did not end or never started,
/// 0 s runs and jobs without GPUs are left out and counted. Rows by hand,
/// as sacct 22.05 prints them (`SLURM_TIME_FORMAT=%s`; one ISO time, as
/// with `TZ=UTC`). The real sacct is read in the lab test
/// `federation::a_sites_own_accounting_becomes_a_trace_the_simulator_replays`.
#[test]
fn slurm_accounting_converts_to_the_generic_format() {
    use fleet_sim::convert::{sacct_to_generic, SacctOptions, TeamKey, SACCT_FORMAT};
    let head = SACCT_FORMAT.replace(',', "|");
    let rows = [
        // asked for 8 H100s (pinned), ran 2 h
        "alpha|100|physics|ann|1796648679|1796648700|7200|COMPLETED|billing=8,cpu=8,gres/gpu:h100=8,gres/gpu=8,mem=8G,node=1|billing=8,cpu=8,gres/gpu:h100=8,gres/gpu=8,node=1|",
        // asked for any GPU, given an a100_80g (mapped), submitted first (ISO)
        "beta|7|bio|bob|2026-12-07T13:00:00|2026-12-07T13:00:05|600|FAILED|cpu=2,gres/gpu:a100_80g=2,gres/gpu=2,node=1|cpu=2,gres/gpu=2,node=1|",
        // the stand-in of a forwarded job (its run is the alpha row above)
        "beta|8|physics|ann|1796648679|1796648680|7300|COMPLETED|billing=1,cpu=1,mem=1M,node=1|billing=1,cpu=1,node=1|fleet:beta-c518c40461e2 fleet: forwarded beta -> alpha",
        // still running, pending, cancelled before it started, 0 s, CPU only, MPS only
        "alpha|101|physics|ann|1796648679|1796648700|50|RUNNING|cpu=1,gres/gpu:h100=1,gres/gpu=1|gres/gpu=1|",
        "alpha|102|physics|ann|1796648679|Unknown|0|PENDING|||",
        "alpha|103|physics|ann|1796648679|None|0|CANCELLED by 1000|||",
        "alpha|104|physics|ann|1796648679|1796648679|0|COMPLETED|cpu=1,gres/gpu:h100=1,gres/gpu=1||",
        "alpha|105|physics|ann|1796648679|1796648680|30|COMPLETED|cpu=4,mem=4G,node=1||",
        "alpha|106|physics|ann|1796648679|1796648680|30|TIMEOUT|cpu=1,gres/mps=50,node=1||",
        // a two-node job given 16 GPUs of two types: the type holding most
        "delta|9|bio|cy|1796648690|1796648695|90|TIMEOUT|cpu=2,gres/gpu:a100=6,gres/gpu:h100=10,gres/gpu=16,node=2|cpu=2,gres/gpu=16,node=2|",
    ];
    let input = format!("{head}\n{}\n", rows.join("\n"));
    let mut models = std::collections::BTreeMap::new();
    models.insert("a100_80g".to_string(), "A100-80GB".to_string());
    let opts = SacctOptions { models, ..SacctOptions::default() };
    let mut out = Vec::new();
    let s = sacct_to_generic(input.as_bytes(), "acct.txt", &opts, &mut out).unwrap();
    assert_eq!(s.written, 3, "{s:?}");
    let left: Vec<(&str, usize)> = s.left_out.iter().map(|(w, n)| (*w, *n)).collect();
    assert_eq!(
        left,
        [
            ("Fleet stand-in (its job is counted where it ran)", 1),
            ("GPU shares only (gres/shard, gres/mps; not modelled)", 1),
            ("never started", 1),
            ("no GPU in AllocTRES", 1),
            ("not ended when sacct ran (pending, running or suspended)", 2),
            ("ran 0 s", 1),
        ]
    );
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            "submit_time,duration_s,gpus,gpu_models,duration_gpu,min_gpu,team,interruptible,checkpoint_s,datasets",
            "2026-12-07 13:00:00,600,2,,A100-80GB,,bio,,,",
            "2026-12-07 13:04:39,7200,8,H100,H100,,physics,,,",
            "2026-12-07 13:04:50,90,16,,H100,,bio,,,",
        ]
    );
    // Other team keys.
    for (team, want) in [
        (TeamKey::User, ["bob", "ann", "cy"]),
        (TeamKey::Cluster, ["beta", "alpha", "delta"]),
        (TeamKey::ClusterAccount, ["beta/bio", "alpha/physics", "delta/bio"]),
    ] {
        let mut out = Vec::new();
        sacct_to_generic(input.as_bytes(), "a", &SacctOptions { team, ..opts.clone() }, &mut out).unwrap();
        let g = fleet_sim::trace::read_generic(&out[..], "g", &ReadOptions::default()).unwrap();
        assert_eq!(g.jobs.iter().map(|j| j.home_label.as_str()).collect::<Vec<_>>(), want, "{team:?}");
    }

    // Read back and replayed: the pinned H100 job runs only on H100s (2 h
    // measured on an H100 is 3.8 A100-hours of work per GPU).
    let g = fleet_sim::trace::read_generic(text.as_bytes(), "g.csv", &ReadOptions::default()).unwrap();
    assert_eq!(g.jobs[1].extra.gpu_models, ["H100"]);
    assert_eq!(g.jobs[1].extra.duration_gpu.as_deref(), Some("H100"));
    let fleet = r#"
[[clusters]]
name = "h"
provider = "onprem"
region = "lab"
onprem = true
prices.H100 = { onprem = 2.0 }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2
[[clusters]]
name = "a"
provider = "onprem"
region = "lab"
onprem = true
prices.A100 = { onprem = 0.1 }
prices.A100-80GB = { onprem = 0.1 }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 2
[[clusters.pools]]
name = "big"
gpu_type = "A100-80GB"
gpus_per_node = 8
nodes = 1
[[teams]]
name = "*"
home = "a"
"#;
    let setup = EngineSetup { fleet_toml: fleet.into(), dataset_gb: 1.0, ..EngineSetup::default() };
    let l = Loaded { trace: g, trace_name: "g".into(), fleet_name: "f".into(), setup, spot: vec![] };
    let r = run_loaded(&args(&["--policy", "cost", "--lp-max-vars", "0"]), &l).unwrap();
    let p = &r.policies[0];
    assert_eq!(p.unplaced, 0, "{p:?}");
    let h100_h: f64 = p.spend.iter().filter(|(k, _)| k.starts_with("h/")).map(|(_, s)| s.gpu_hours).sum();
    assert!((h100_h - 16.0).abs() < 0.5, "the pinned job's 8 GPUs × 2 h on H100s: {:?}", p.spend);

    // Bad input: an error naming file:line and the problem, nothing written.
    let bad = |row: &str, frag: &str| {
        let mut out = Vec::new();
        let e = sacct_to_generic(format!("{head}\n{}\n{row}\n", rows[0]).as_bytes(), "acct.txt", &opts, &mut out)
            .expect_err(row)
            .to_string();
        assert!(e.contains(frag), "{row}: {e}");
        assert!(out.is_empty(), "{row}: wrote {out:?}");
    };
    bad("alpha|1|p|u|1796648679|1796648680|7|COMPLETED|gres/gpu=1|", "acct.txt:3: 10 fields, the header has 11");
    bad("alpha|1|p|u|1796648679|1796648680|7|COMPLETED|gres/gpu=1||x|y", "acct.txt:3: 12 fields");
    bad("alpha|1|p|u|1796648679|1796648680|7.5|COMPLETED|gres/gpu=1||", "acct.txt:3: ElapsedRaw `7.5`");
    bad("alpha|1|p|u|yesterday|1796648680|7|COMPLETED|gres/gpu=1||", "acct.txt:3: Submit: bad time `yesterday`");
    bad("alpha|1|p|u|2026-02-30T00:00:00|1796648680|7|COMPLETED|gres/gpu=1||", "bad time `2026-02-30T00:00:00`");
    bad("alpha|1|p|u|1796648679|1796648680|7|COMPLETED|gres/gpu=x||", "acct.txt:3: AllocTRES: TRES `gres/gpu=x`");
    bad(
        "alpha|1|p|u|1796648679|1796648680|7|COMPLETED|gres/gpu:h.100=1||",
        "GPU type `h.100` gives the model name `H.100`",
    );
    bad("alpha|1||u|1796648679|1796648680|7|COMPLETED|gres/gpu=1||", "acct.txt:3: empty Account (the team, --team)");
    let err = |input: &str| {
        sacct_to_generic(input.as_bytes(), "acct.txt", &opts, &mut Vec::new()).expect_err(input).to_string()
    };
    assert!(err("").starts_with("acct.txt: empty"), "{}", err(""));
    assert!(err(&format!("{head}\n")).contains("acct.txt: no job in it"), "{}", err(&head));
    assert!(err("Cluster|Submit|Start|State|AllocTRES|Account\n").contains("acct.txt:1: no `ElapsedRaw` column"));
    // No GPU anywhere: the likely cause is named.
    let cpu_only = format!("{head}\n{}\n", rows[7]);
    assert!(err(&cpu_only).contains("AccountingStorageTRES list gres/gpu"), "{}", err(&cpu_only));
    let untyped = format!("{head}\nalpha|1|p|u|1796648679|1796648680|7|COMPLETED|gres/gpu=1|gres/gpu=1|\n");
    let mut out = Vec::new();
    let o = SacctOptions { untyped_gpu: Some("V100".into()), ..SacctOptions::default() };
    sacct_to_generic(untyped.as_bytes(), "a", &o, &mut out).unwrap();
    assert!(String::from_utf8(out).unwrap().ends_with(",7,1,,V100,,p,,,\n"));
}

/// Alibaba's `cluster-trace-gpu-v2023` pod list (openb) → generic: rows in
/// the published layout (the README's and `openb_pod_list_gpuspec33.csv`'s
/// first rows, shortened): sharing pods hold a share of one GPU, `gpu_spec`
/// limits the models (`V100M16` → V100, `V100M32` → V100-32GB), best-effort
/// pods are interruptible, CPU-only and never-scheduled pods are left out.
/// The synthetic sample converts and replays on the PAI fleet with every
/// pod placed.
#[test]
fn openb_pod_lists_convert_to_the_generic_format() {
    use fleet_sim::convert::{openb_sample, openb_to_generic};
    let input =
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0005,20000,65536,0,0,,LS,Running,2759674,12902960,2759676
openb-pod-0017,88000,327680,8,1000,nan,Burstable,Succeeded,9437497,10769854,9437497
openb-pod-0022,4000,15258,1,220,T4,BE,Running,9679175,9973826,9679175
openb-pod-0021,8000,30517,1,440,G2|P100|T4|V100M16|V100M32,LS,Running,9671707,12902960,9671708
openb-pod-0035,16000,32768,1,1000,V100M16|V100M32,LS,Running,9967058,9968575,9967063
openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,
openb-pod-0200,3152,5600,1,1000,T4,BE,Failed,10082034,10082034,10082034
";
    let mut out = Vec::new();
    let (n, left) = openb_to_generic(input.as_bytes(), "pods.csv", &mut out).unwrap();
    assert_eq!(n, 4);
    let left: Vec<_> = left.into_iter().collect();
    assert_eq!(left, [("deleted when scheduled (0 s)", 1), ("never scheduled", 1), ("no GPU", 1)]);
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        [
            // 2023-01-02 + 9,437,497 s = 2023-04-21 05:31:37 (`date -u -d`)
            "2023-04-21 05:31:37,1332357,8,,,,openb,0,,",
            "2023-04-23 22:35:07,3231252,0.44,G2|P100|T4|V100|V100-32GB,,,openb,0,,",
            "2023-04-24 00:39:35,294651,0.22,T4,T4,,openb,1,,",
            "2023-04-27 08:37:38,1512,1,V100|V100-32GB,,,openb,0,,",
        ]
    );
    let g = fleet_sim::trace::read_generic(text.as_bytes(), "g", &ReadOptions::default()).unwrap();
    assert_eq!(g.jobs[1].extra.gpu_share, 0.44);
    assert_eq!(g.jobs[2].extra.interruptible, Some(true));
    // Bad rows: file:line and the problem.
    for (row, frag) in [
        ("p,1,1,1,1000,,LS,Running,x,5,1", "pods.csv:3: bad creation_time `x`"),
        ("p,1,1,1,1500,,LS,Running,1,5,1", "pods.csv:3: num_gpu 1, gpu_milli 1500"),
        ("p,1,1,1,1000,,LS,Running,1,,1", "pods.csv:3: scheduled but no deletion_time"),
        ("p,1,1,1,1000,T 4,LS,Running,1,5,1", "pods.csv:3: gpu_spec `T 4`"),
        ("p,1,1,1,1000,,LS,Running,1,5", "pods.csv:3: 10 fields, the header has 11"),
    ] {
        let head = input.lines().take(2).collect::<Vec<_>>().join("\n");
        let e = openb_to_generic(format!("{head}\n{row}\n").as_bytes(), "pods.csv", &mut Vec::new())
            .expect_err(row)
            .to_string();
        assert!(e.contains(frag), "{row}: {e}");
    }
    let e = openb_to_generic("name,num_gpu\n".as_bytes(), "pods.csv", &mut Vec::new()).unwrap_err().to_string();
    assert!(e.contains("pods.csv: no `cpu_milli` column"), "{e}");

    // The sample: converted, read back and replayed with every pod placed.
    let sample = openb_sample(400, 3);
    let mut out = Vec::new();
    let (n, left) = openb_to_generic(sample.as_bytes(), "sample", &mut out).unwrap();
    assert_eq!(n + left.values().sum::<usize>(), 400);
    let g = fleet_sim::trace::read_generic(&out[..], "g", &ReadOptions::default()).unwrap();
    assert!(g.jobs.iter().any(|j| j.extra.gpu_share < 1.0) && g.jobs.iter().any(|j| j.gpus >= 4));
    assert!(g.jobs.iter().any(|j| j.extra.gpu_models.iter().any(|m| m == "G2")));
    let fleet =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../conf/fleet-pai-sample.toml")).unwrap();
    let setup = EngineSetup { fleet_toml: fleet, dataset_gb: 1.0, ..EngineSetup::default() };
    let l = Loaded { trace: g, trace_name: "g".into(), fleet_name: "f".into(), setup, spot: vec![] };
    let r = run_loaded(&args(&["--policy", "cost", "--lp-max-vars", "0"]), &l).unwrap();
    assert_eq!((r.policies[0].unplaced, r.policies[0].completed), (0, n), "{:?}", r.policies[0]);
}
