//! The engine's spot caps in the live meta-scheduler: the store hands the
//! engine the job's own history (runs that died or were requeued at their
//! target count as reclaims), so a job reclaimed as often as the policy's
//! `spot_max_reclaims` is placed on-demand. Time is the tests' own `now`.

use std::path::Path;
use std::sync::Arc;

use fleet_api::api::{ForwardRequest, Heartbeat, NodeCapacity, StartConfirmation, StatusUpdate};
use fleet_api::{FleetOptions, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config, Health, PlacementConfig};
use fleet_metasched::metrics::Metrics;
use fleet_metasched::ranking::Ranker;
use fleet_metasched::store::{Caller, Store};
use fleet_metasched::Clock;

/// `home` (the origin) has no H100; `cloud` sells H100 on-demand and,
/// four times cheaper, on spot.
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
prices = { H100 = { on_demand = 4.0, spot = 1.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2
"#;

const CLUSTERS: [(&str, &str); 2] = [("home", "a100"), ("cloud", "h100")];

struct Fx {
    _dir: tempfile::TempDir,
    store: Store,
    now: f64,
}

fn admin() -> Caller {
    Caller::Admin
}

fn cl(c: &str) -> Caller {
    Caller::Cluster(c.into())
}

impl Fx {
    /// A store ranking with `[policies.capped]` (`policy` is its body).
    fn new(policy: &str) -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let store = Fx::open(dir.path(), policy);
        let mut fx = Fx { _dir: dir, store, now: Clock::default().now().floor() };
        fx.beat_all();
        fx
    }

    fn open(dir: &Path, policy: &str) -> Store {
        let clusters: Vec<ClusterConfig> = CLUSTERS
            .iter()
            .map(|(n, _)| ClusterConfig {
                name: n.to_string(),
                region: "east".into(),
                token_file: dir.join("unused"),
                ..Default::default()
            })
            .collect();
        std::fs::write(dir.join("model.toml"), MODEL).unwrap();
        let mut cfg = Config::new("127.0.0.1:1".parse().unwrap(), dir.join("state"), dir.join("admin"));
        cfg.placement =
            Some(PlacementConfig { policy: Some("capped".into()), fleet_model: Some(dir.join("model.toml")) });
        cfg.policies = Some(toml::from_str(&format!("[capped]\n{policy}")).unwrap());
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

    fn beat_all(&mut self) {
        for (c, ty) in CLUSTERS {
            let nodes = (0..2)
                .map(|i| NodeCapacity {
                    name: format!("{c}-n{i}"),
                    partitions: vec!["gpu".into()],
                    gpu_type: Some(ty.into()),
                    gpus_total: 8,
                    gpus_free: 8,
                    state: "idle".into(),
                    ..Default::default()
                })
                .collect();
            let hb = Heartbeat { cluster: c.into(), scheduler: "slurm".into(), nodes, ..Default::default() };
            self.store.heartbeat(&cl(c), hb, self.now).unwrap();
        }
    }

    /// Interruptible job `id` from home for one H100, started and placed.
    fn placed(&mut self, id: &str) {
        let request = JobRequest {
            origin: "home".into(),
            user_id: 1000,
            time_limit_min: Some(600),
            gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
            script: Some(b"#!/bin/sh\ntrain\n".to_vec()),
            fleet: FleetOptions { interruptible: true, ..Default::default() },
            ..Default::default()
        };
        let fwd =
            ForwardRequest { fleet_job_id: id.into(), request, tentative_target: "cloud".into(), early_start: false };
        self.store.forward(&cl("home"), fwd, self.now).unwrap();
        let job = Caller::Job { id: id.into(), origin: "home".into() };
        self.store.start(&job, id, 42, 0, self.now).unwrap();
        let c = StartConfirmation { origin_job_id: 42, started: true, reason: "t".into(), ..Default::default() };
        let r = self.store.confirm_start(&cl("home"), id, c, self.now).unwrap();
        assert_eq!((r.state, r.target.as_deref()), (JobState::Assigned, Some("cloud")), "{r:?}");
    }

    /// The job's run at cloud starts, then cloud reports it preempted: the
    /// store places it again (at cloud, the only H100s).
    fn reclaimed(&mut self, id: &str) {
        let epoch = self.job(id).record.epoch;
        let at = |state| StatusUpdate {
            remote_job_id: Some(100),
            state: Some(state),
            epoch: Some(epoch),
            ..Default::default()
        };
        self.store.status(&cl("cloud"), id, at(JobState::Running), self.now).unwrap();
        self.now += 60.0;
        let died = StatusUpdate { died: Some("PREEMPTED at cloud".into()), ..at(JobState::Failed) };
        self.store.status(&cl("cloud"), id, died, self.now).unwrap();
        self.beat_all();
        self.store.sweep(self.now).unwrap();
        let j = self.job(id);
        assert_eq!((j.record.state, j.record.target.as_deref()), (JobState::Assigned, Some("cloud")), "{:?}", j.record);
        assert!(j.record.epoch > epoch, "placed again: {:?}", j.record);
    }

    fn job(&self, id: &str) -> fleet_metasched::store::Job {
        self.store.get(&admin(), id).unwrap()
    }

    /// The pricing of the placement actually taken (from its reason).
    fn pricing(&self, id: &str) -> &'static str {
        let reason = self.job(id).record.reason;
        match (reason.contains(" spot,"), reason.contains(" on-demand,")) {
            (true, false) => "spot",
            (false, true) => "on-demand",
            _ => panic!("no pricing in {reason:?}"),
        }
    }
}

#[test]
fn a_job_reclaimed_as_often_as_the_cap_is_placed_on_demand() {
    let mut fx = Fx::new("spot_max_reclaims = 2\n");
    fx.placed("j1");
    assert_eq!(fx.pricing("j1"), "spot");
    fx.reclaimed("j1");
    assert_eq!(fx.pricing("j1"), "spot", "one reclaim, under the cap of 2");
    fx.reclaimed("j1");
    assert_eq!(fx.pricing("j1"), "on-demand", "{}", fx.job("j1").record.reason);
    // The explanation on the current view agrees: cloud's option is on-demand.
    let e = fx.store.explain(&admin(), "j1", fx.now).unwrap();
    let cloud = e.ranked.iter().find(|c| c.cluster == "cloud").unwrap();
    assert_eq!(cloud.pricing, "on-demand", "{e:?}");
    // The same history under a policy without a cap stays on spot.
    let mut free = Fx::new("spot_max_reclaims = 0\n");
    free.placed("j2");
    for _ in 0..3 {
        free.reclaimed("j2");
    }
    assert_eq!(free.pricing("j2"), "spot");
}
