//! The engine's hard constraints hold in the live meta-scheduler: a job
//! that must leave its origin never goes to a cluster the placement engine
//! excludes (here `#FLEET min-gpu`, a speed the only other cluster lacks),
//! even though the first rule (GPU type and count) would allow it; a job
//! its origin can run stays there, as without Fleet. Time is the tests'
//! own `now`.

use std::sync::Arc;

use fleet_api::api::{ForwardRequest, Heartbeat, NodeCapacity, StartConfirmation};
use fleet_api::{FleetMode, FleetOptions, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config, Health, PlacementConfig};
use fleet_metasched::metrics::Metrics;
use fleet_metasched::ranking::Ranker;
use fleet_metasched::store::{Caller, Store};
use fleet_metasched::Clock;

/// Both clusters have A100s only.
const MODEL: &str = r#"
[[clusters]]
name = "home"
provider = "onprem"
region = "east"
onprem = true
prices = { A100 = { onprem = 1.0 } }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 2

[[clusters]]
name = "cloud"
provider = "aws"
region = "us-east-1"
prices = { A100 = { on_demand = 3.0 } }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 2
"#;

fn cl(c: &str) -> Caller {
    Caller::Cluster(c.into())
}

fn store(dir: &std::path::Path) -> Store {
    let clusters: Vec<ClusterConfig> = ["home", "cloud"]
        .iter()
        .map(|n| ClusterConfig {
            name: n.to_string(),
            region: "east".into(),
            token_file: dir.join("unused"),
            ..Default::default()
        })
        .collect();
    std::fs::write(dir.join("model.toml"), MODEL).unwrap();
    let mut cfg = Config::new("127.0.0.1:1".parse().unwrap(), dir.join("state"), dir.join("admin"));
    cfg.placement = Some(PlacementConfig { policy: Some("cost".into()), fleet_model: Some(dir.join("model.toml")) });
    let ranker = Arc::new(Ranker::load(&cfg, Arc::default()).unwrap().unwrap());
    let mut store =
        Store::open(&dir.join("state"), &clusters, 3.0, &Clock::default(), Arc::new(Metrics::new()), Some(ranker))
            .unwrap();
    store.set_health(Health {
        degraded_after_s: 100_000.0,
        grace_s: 10_000.0,
        max_migrations: 10,
        job_lease_s: 0.0,
        job_lease_margin_s: 0.0,
        first_lease_s: 0.0,
    });
    store
}

fn beat_all(store: &mut Store, now: f64) {
    for c in ["home", "cloud"] {
        let nodes = (0..2)
            .map(|i| NodeCapacity {
                name: format!("{c}-n{i}"),
                partitions: vec!["gpu".into()],
                gpu_type: Some("a100".into()),
                gpus_total: 8,
                gpus_free: 8,
                state: "idle".into(),
                ..Default::default()
            })
            .collect();
        let hb = Heartbeat { cluster: c.into(), scheduler: "slurm".into(), nodes, ..Default::default() };
        store.heartbeat(&cl(c), hb, now).unwrap();
    }
}

/// Job `id` from home for one A100 that asks for at least H100 speed,
/// forwarded, started and confirmed: the record after placement.
fn submit(store: &mut Store, id: &str, mode: FleetMode, now: f64) -> fleet_api::api::JobRecord {
    let request = JobRequest {
        origin: "home".into(),
        user_id: 1000,
        time_limit_min: Some(60),
        gpus: vec![GpuRequest { gpu_type: Some("a100".into()), count: 1, scope: GpuScope::Node }],
        script: Some(b"#!/bin/sh\n#FLEET min-gpu=H100\ntrain\n".to_vec()),
        fleet: FleetOptions { mode, ..Default::default() },
        ..Default::default()
    };
    let fwd = ForwardRequest { fleet_job_id: id.into(), request, tentative_target: "cloud".into(), early_start: false };
    store.forward(&cl("home"), fwd, now).unwrap();
    let job = Caller::Job { id: id.into(), origin: "home".into() };
    store.start(&job, id, 42, 0, now).unwrap();
    let c = StartConfirmation { origin_job_id: 42, started: true, reason: "t".into(), ..Default::default() };
    let _ = store.confirm_start(&cl("home"), id, c, now);
    store.get(&Caller::Admin, id).unwrap().record
}

#[test]
fn a_job_that_must_leave_never_goes_where_the_engine_excludes_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = store(dir.path());
    let now = Clock::default().now().floor();
    beat_all(&mut store, now);
    let r = submit(&mut store, "j-remote", FleetMode::Remote, now);
    assert_eq!(r.state, JobState::Failed, "{r:?}");
    assert_eq!(r.target, None, "{r:?}");
    assert!(
        r.reason.contains("placement engine") && r.reason.contains("cloud:") && r.reason.contains("min-gpu"),
        "the reason names the engine, the cluster and the constraint: {}",
        r.reason
    );
    // Its explanation agrees: the engine ranks no cluster.
    let e = store.explain(&Caller::Admin, "j-remote", now).unwrap();
    assert!(e.ranked.is_empty(), "{e:?}");
}

#[test]
fn a_job_its_origin_can_run_stays_there_whatever_the_engine_excludes() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = store(dir.path());
    let now = Clock::default().now().floor();
    beat_all(&mut store, now);
    let r = submit(&mut store, "j-auto", FleetMode::Auto, now);
    assert_eq!(r.target.as_deref(), Some("home"), "{r:?}");
    assert_ne!(r.state, JobState::Failed, "{r:?}");
}
