//! The provisioning SLA through the store: a cluster whose jobs do not
//! run within its deadline gets them re-placed (cancelled there first, or
//! fenced by the epoch when it had not submitted them), is SLA-degraded —
//! avoided by the first rule, scored down by the engine — and recovers;
//! a job no other cluster can run stays and waits; the samples survive a
//! restart. Time is the tests' own `now`.

use std::path::Path;
use std::sync::Arc;

use fleet_api::api::{ClusterSla, ForwardRequest, GpuQuota, Heartbeat, NodeCapacity, StartConfirmation, StatusUpdate};
use fleet_api::{FleetOptions, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config, Health, PlacementConfig, Sla, SlaConfig};
use fleet_metasched::metrics::Metrics;
use fleet_metasched::ranking::Ranker;
use fleet_metasched::store::{Caller, Store};
use fleet_metasched::Clock;

const CLUSTERS: [(&str, &str); 3] = [("alpha", "h100"), ("beta", "a100"), ("delta", "h100")];

/// alpha's H100s are the cheaper (the engine's first choice), delta's dearer.
const MODEL: &str = r#"
[[clusters]]
name = "alpha"
provider = "onprem"
region = "east"
onprem = true
prices = { H100 = { onprem = 1.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2

[[clusters]]
name = "beta"
provider = "onprem"
region = "east"
onprem = true
prices = { A100 = { onprem = 1.0 } }
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 2

[[clusters]]
name = "delta"
provider = "onprem"
region = "east"
onprem = true
prices = { H100 = { onprem = 1.5 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2
"#;

struct Fx {
    dir: tempfile::TempDir,
    store: Store,
    now: f64,
    engine: bool,
    /// Clusters whose nodes report `drained` in their heartbeats.
    drained: Vec<&'static str>,
    /// GPU quotas a cluster's heartbeat publishes.
    quotas: Vec<(&'static str, GpuQuota)>,
}

fn admin() -> Caller {
    Caller::Admin
}

fn cl(c: &str) -> Caller {
    Caller::Cluster(c.into())
}

fn cluster_configs(dir: &Path) -> Vec<ClusterConfig> {
    CLUSTERS
        .iter()
        .map(|(n, _)| ClusterConfig {
            name: n.to_string(),
            region: "east".into(),
            provider: if *n == "alpha" { "slowcloud".into() } else { "onprem".into() },
            token_file: dir.join("unused"),
            // alpha's own deadline; the others take the default (300 s).
            sla_deadline_s: (*n == "alpha").then_some(60.0),
            ..Default::default()
        })
        .collect()
}

fn sla_config() -> SlaConfig {
    SlaConfig { recover_runs: 2, cooldown_s: 600.0, ..Default::default() }
}

impl Fx {
    fn new(engine: bool) -> Fx {
        let dir = tempfile::tempdir().unwrap();
        // Whole seconds: sums of the ticks stay exact.
        let now = Clock::default().now().floor();
        let store = Fx::open(dir.path(), engine);
        let mut fx = Fx { dir, store, now, engine, drained: Vec::new(), quotas: Vec::new() };
        fx.beat_all();
        fx
    }

    fn open(dir: &Path, engine: bool) -> Store {
        let clusters = cluster_configs(dir);
        let ranker = engine.then(|| {
            std::fs::write(dir.join("model.toml"), MODEL).unwrap();
            let mut cfg = Config::new("127.0.0.1:1".parse().unwrap(), dir.join("state"), dir.join("admin"));
            cfg.placement =
                Some(PlacementConfig { policy: Some("cheap".into()), fleet_model: Some(dir.join("model.toml")) });
            cfg.policies = Some(toml::from_str("[cheap]\n").unwrap());
            Arc::new(Ranker::load(&cfg, Arc::default()).unwrap().unwrap())
        });
        let clock = Clock::default();
        let mut store =
            Store::open(&dir.join("state"), &clusters, 3.0, &clock, Arc::new(Metrics::new()), ranker).unwrap();
        // Ticks are long and the clusters beat one after another: never
        // Degraded here (failover is not what these tests are about).
        store.set_health(Health {
            degraded_after_s: 100_000.0,
            grace_s: 10_000.0,
            max_migrations: 3,
            job_lease_s: 0.0,
            job_lease_margin_s: 0.0,
            first_lease_s: 0.0,
        });
        store.set_sla(Sla::from_config(Some(&sla_config()), &clusters)).unwrap();
        store
    }

    /// The meta-scheduler restarts on the same state.
    fn restart(&mut self) {
        self.store = Fx::open(self.dir.path(), self.engine);
        self.beat_all();
    }

    fn beat_all(&mut self) {
        for (c, ty) in CLUSTERS {
            let nodes = (0..2)
                .map(|i| NodeCapacity {
                    name: format!("{c}-n{i}"),
                    partitions: vec!["gpu".into()],
                    gpu_type: Some(ty.into()),
                    gpus_total: 8,
                    // Fewer free at delta: the first rule picks alpha first.
                    gpus_free: if c == "delta" { 6 } else { 8 },
                    state: if self.drained.contains(&c) { "drained" } else { "idle" }.into(),
                    ..Default::default()
                })
                .collect();
            let q: Vec<GpuQuota> = self.quotas.iter().filter(|(at, _)| *at == c).map(|(_, q)| q.clone()).collect();
            let gpu_quotas = (!q.is_empty()).then_some(q);
            let hb =
                Heartbeat { cluster: c.into(), scheduler: "slurm".into(), nodes, gpu_quotas, ..Default::default() };
            self.store.heartbeat(&cl(c), hb, self.now).unwrap();
        }
    }

    fn tick(&mut self, s: f64) {
        self.now += s;
        self.beat_all();
        self.store.sweep(self.now).unwrap();
    }

    /// Job `id` from beta for one H100 (only at `to` when given), started
    /// and placed; returns its target.
    fn placed(&mut self, id: &str, to: &[&str]) -> String {
        let request = JobRequest {
            origin: "beta".into(),
            user_id: 1000,
            user_name: Some("alice".into()),
            time_limit_min: Some(60),
            gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
            script: Some(b"#!/bin/sh\ntrain\n".to_vec()),
            fleet: FleetOptions { to: to.iter().map(|s| s.to_string()).collect(), ..Default::default() },
            ..Default::default()
        };
        let fwd =
            ForwardRequest { fleet_job_id: id.into(), request, tentative_target: "alpha".into(), early_start: false };
        self.store.forward(&cl("beta"), fwd, self.now).unwrap();
        let job = Caller::Job { id: id.into(), origin: "beta".into() };
        self.store.start(&job, id, 42, 0, self.now).unwrap();
        let c = StartConfirmation { origin_job_id: 42, started: true, reason: "t".into(), ..Default::default() };
        let r = self.store.confirm_start(&cl("beta"), id, c, self.now).unwrap();
        assert_eq!(r.state, JobState::Assigned, "{r:?}");
        r.target.unwrap()
    }

    fn report_epoch(&mut self, id: &str, c: &str, s: JobState, epoch: u64) -> Result<JobState, String> {
        let upd = StatusUpdate { remote_job_id: Some(100), state: Some(s), epoch: Some(epoch), ..Default::default() };
        self.store.status(&cl(c), id, upd, self.now).map(|r| r.state).map_err(|e| e.to_string())
    }

    fn report(&mut self, id: &str, c: &str, s: JobState) -> Result<JobState, String> {
        let epoch = self.job(id).record.epoch;
        self.report_epoch(id, c, s, epoch)
    }

    /// Its target reports job `id` pending, held for good by a limit there
    /// (`why`) or not (`None`).
    fn held(&mut self, id: &str, c: &str, why: Option<&str>) -> Result<JobState, String> {
        let epoch = self.job(id).record.epoch;
        let upd = StatusUpdate {
            remote_job_id: Some(100),
            state: Some(JobState::Pending),
            epoch: Some(epoch),
            reason: if why.is_some() { "AssocMaxWallDurationPerJobLimit" } else { "Resources" }.into(),
            held_by_limit: why.map(str::to_string),
            ..Default::default()
        };
        self.store.status(&cl(c), id, upd, self.now).map(|r| r.state).map_err(|e| e.to_string())
    }

    /// Job `id` stays pending at `at`, its reason saying no other cluster
    /// can run it, written once (the next sweeps leave it as it is).
    fn stays_waiting(&mut self, id: &str, at: &str) {
        let p = self.job(id);
        assert_eq!(
            (p.record.state, p.record.target.as_deref(), p.planned.is_none()),
            (JobState::Pending, Some(at), true)
        );
        assert!(
            p.record.reason.ends_with("no other cluster can run it now, so it stays and waits there"),
            "{}",
            p.record.reason
        );
        let (reason, updated) = (p.record.reason.clone(), p.record.updated_at);
        self.tick(5.0);
        assert_eq!((self.job(id).record.reason, self.job(id).record.updated_at), (reason, updated), "written once");
    }

    fn job(&self, id: &str) -> fleet_metasched::store::Job {
        self.store.get(&admin(), id).unwrap()
    }

    fn stderr(&self, id: &str) -> String {
        let bytes = self.store.read_output(&admin(), id, fleet_api::api::Stream::Stderr, 0, 1 << 20).unwrap();
        String::from_utf8(bytes).unwrap()
    }

    fn sla(&self, c: &str) -> ClusterSla {
        self.store.view(self.now).clusters.into_iter().find(|x| x.name == c).unwrap().sla.unwrap()
    }
}

#[test]
fn a_pending_job_past_the_deadline_is_cancelled_there_and_runs_once_elsewhere() {
    let mut fx = Fx::new(false);
    assert_eq!(fx.placed("j1", &[]), "alpha");
    let assigned_at = fx.now;
    fx.report("j1", "alpha", JobState::Pending).unwrap();
    // Within the deadline (60 s at alpha): nothing happens.
    fx.tick(59.0);
    assert_eq!((fx.job("j1").record.state, fx.job("j1").planned.is_none()), (JobState::Pending, true));
    assert_eq!(fx.sla("alpha").state, "ok");
    // Past it: cancelled at alpha first (its cancel work), still one job.
    fx.tick(2.0);
    let j = fx.job("j1");
    assert_eq!(j.record.state, JobState::Pending);
    assert!(j.planned.as_ref().is_some_and(|m| m.sla), "{:?}", j.planned);
    assert!(j.record.reason.contains("not running at alpha 61 s after its assignment (provisioning deadline 60 s)"));
    let work = fx.store.work(&cl("alpha"), fx.now).unwrap();
    assert_eq!(work.cancel, ["j1"], "{work:?}");
    assert!(fx.store.work(&cl("delta"), fx.now).unwrap().submit.is_empty(), "never two copies: not placed yet");
    let sla = fx.sla("alpha");
    assert_eq!((sla.state.as_str(), sla.samples, sla.missed), ("degraded", 1, 1), "{sla:?}");
    assert!(sla.why.contains("missed 1 of last 1, p90 61 s > 60 s"), "{}", sla.why);
    // alpha confirms the cancel: the job is placed again, at delta, epoch 2.
    fx.tick(1.0);
    assert_eq!(fx.report("j1", "alpha", JobState::Cancelled), Ok(JobState::Assigned));
    let j = fx.job("j1");
    let replaced_after = fx.now - assigned_at;
    println!(
        "re-placement: {replaced_after:.0} s from the assignment at alpha to the assignment at delta (deadline 60 s)"
    );
    assert_eq!((j.record.target.as_deref(), j.record.epoch, j.record.migrations), (Some("delta"), 2, 0));
    assert!(j.record.reason.starts_with("re-placing: not running at alpha"), "{}", j.record.reason);
    assert_eq!(
        fx.stderr("j1"),
        "fleet: run 1 of job j1 was not running at alpha 61 s after its assignment (provisioning deadline 60 s); \
         cancelled there, re-placing it elsewhere\n"
    );
    let work = fx.store.work(&cl("delta"), fx.now).unwrap();
    assert_eq!(work.submit.iter().map(|a| (a.fleet_job_id.as_str(), a.epoch)).collect::<Vec<_>>(), [("j1", 2)]);
    // alpha's copy is stale from now on: its agent stops it.
    let late = fx.report_epoch("j1", "alpha", JobState::Running, 1).unwrap_err();
    assert!(late.contains("stale"), "{late}");
    // It runs once, at delta, and ends with its own exit code.
    fx.tick(5.0);
    assert_eq!(fx.report("j1", "delta", JobState::Running), Ok(JobState::Running));
    let d = fx.sla("delta");
    assert_eq!((d.state.as_str(), d.samples, d.missed, d.p90_s.map(f64::round)), ("ok", 1, 0, Some(5.0)), "{d:?}");
    let upd = StatusUpdate {
        remote_job_id: Some(100),
        state: Some(JobState::Completed),
        exit_code: Some(3),
        epoch: Some(2),
        ..Default::default()
    };
    let r = fx.store.status(&cl("delta"), "j1", upd, fx.now).unwrap();
    assert_eq!((r.state, r.exit_code), (JobState::Completed, Some(3)));
}

#[test]
fn a_job_requeued_at_its_target_after_it_started_is_not_an_sla_miss() {
    let mut fx = Fx::new(false);
    assert_eq!(fx.placed("rq", &[]), "alpha");
    fx.tick(10.0);
    fx.report("rq", "alpha", JobState::Running).unwrap();
    fx.tick(10.0);
    assert_eq!(fx.report("rq", "alpha", JobState::Pending), Ok(JobState::Pending));
    fx.tick(120.0);
    let j = fx.job("rq");
    assert_eq!(
        (j.record.state, j.record.target.as_deref(), j.planned.is_none()),
        (JobState::Pending, Some("alpha"), true)
    );
    let sla = fx.sla("alpha");
    assert_eq!((sla.state.as_str(), sla.samples, sla.missed), ("ok", 1, 0), "{sla:?}");
}

#[test]
fn an_assignment_never_submitted_is_re_placed_at_once_and_fenced() {
    let mut fx = Fx::new(false);
    assert_eq!(fx.placed("j2", &[]), "alpha");
    fx.tick(61.0);
    let j = fx.job("j2");
    assert_eq!((j.record.state, j.record.target.as_deref(), j.record.epoch), (JobState::Assigned, Some("delta"), 2));
    assert!(j.record.reason.contains("re-placing: not running at alpha 61 s"), "{}", j.record.reason);
    assert!(fx.stderr("j2").ends_with("re-placing it elsewhere\n"), "{}", fx.stderr("j2"));
    assert!(fx.store.work(&cl("alpha"), fx.now).unwrap().submit.is_empty());
    // alpha submitted it after all: its report is stale, the agent cancels that copy.
    let late = fx.report_epoch("j2", "alpha", JobState::Pending, 1).unwrap_err();
    assert!(late.contains("stale") && late.contains("stop this copy"), "{late}");
}

#[test]
fn a_job_no_other_cluster_can_run_stays_and_waits() {
    let mut fx = Fx::new(false);
    assert_eq!(fx.placed("pinned", &["alpha"]), "alpha");
    fx.report("pinned", "alpha", JobState::Pending).unwrap();
    fx.tick(100.0);
    let j = fx.job("pinned");
    assert_eq!(
        (j.record.state, j.record.target.as_deref(), j.planned.is_none()),
        (JobState::Pending, Some("alpha"), true)
    );
    assert!(
        j.record.reason.contains("no other cluster can run it now, so it stays and waits there"),
        "{}",
        j.record.reason
    );
    assert_eq!(fx.sla("alpha").state, "degraded");
    fx.tick(100.0);
    let later = fx.job("pinned");
    assert_eq!(later.record.state, JobState::Pending, "never failed");
    // Its reason is written once, not again at every pass with its age.
    assert_eq!((later.record.reason, later.record.updated_at), (j.record.reason, j.record.updated_at));
    // It starts at last: the miss carries its real time.
    assert_eq!(fx.report("pinned", "alpha", JobState::Running), Ok(JobState::Running));
    let sla = fx.sla("alpha");
    assert_eq!((sla.samples, sla.missed, sla.p90_s.map(f64::round)), (1, 1, Some(200.0)), "{sla:?}");
}

#[test]
fn a_degraded_cluster_is_avoided_then_recovers_and_keeps_its_figures_across_a_restart() {
    let mut fx = Fx::new(false);
    assert_eq!(fx.placed("j1", &[]), "alpha");
    fx.tick(61.0);
    assert_eq!(fx.job("j1").record.target.as_deref(), Some("delta"));
    // alpha has the most free GPUs, but it is SLA-degraded: delta gets the next job.
    assert_eq!(fx.placed("j2", &[]), "delta");
    // The samples are in the database: a restart keeps alpha degraded.
    fx.restart();
    let sla = fx.sla("alpha");
    assert_eq!((sla.state.as_str(), sla.samples, sla.missed), ("degraded", 1, 1), "{sla:?}");
    // A job only alpha may run still goes there; two runs in a row within
    // the deadline (recover_runs = 2) end the degradation.
    for id in ["p1", "p2"] {
        assert_eq!(fx.placed(id, &["alpha"]), "alpha");
        fx.tick(10.0);
        fx.report(id, "alpha", JobState::Running).unwrap();
    }
    let sla = fx.sla("alpha");
    assert_eq!((sla.state.as_str(), sla.samples, sla.missed), ("ok", 3, 1), "{sla:?}");
    assert!(sla.why.contains("recovered: the last 2 runs started within the deadline"), "{}", sla.why);
    assert_eq!((sla.provider_samples, sla.provider_p90_s.map(f64::round)), (3, Some(61.0)), "slowcloud is alpha alone");
    assert_eq!(fx.placed("j3", &[]), "alpha");
    // Another miss degrades it again; the cool-down (600 s) also recovers it.
    fx.tick(61.0);
    assert_eq!(fx.job("j3").record.target.as_deref(), Some("delta"));
    assert_eq!(fx.sla("alpha").state, "degraded");
    fx.tick(599.0);
    assert_eq!(fx.sla("alpha").state, "degraded");
    fx.tick(1.0);
    let sla = fx.sla("alpha");
    assert_eq!(sla.state, "ok", "{sla:?}");
    assert!(sla.why.contains("recovered: no miss for 600 s"), "{}", sla.why);
}

#[test]
fn the_engine_scores_a_degraded_cluster_down_and_explains_it() {
    let mut fx = Fx::new(true);
    // The engine's pick: alpha (cheaper).
    assert_eq!(fx.placed("j1", &[]), "alpha");
    let e = fx.store.explain(&admin(), "j1", fx.now).unwrap();
    assert_eq!(e.ranked.iter().map(|c| c.cluster.as_str()).collect::<Vec<_>>(), ["alpha", "delta"]);
    let sla_term = |c: &fleet_metasched::store::RankedCandidate| {
        c.terms.iter().find(|(k, _)| k == "sla_usd").map(|(_, v)| *v).unwrap()
    };
    assert!(e.ranked.iter().all(|c| sla_term(c) == 0.0), "{e:?}");
    let alpha_before = e.ranked[0].score;
    fx.tick(61.0);
    assert_eq!(fx.job("j1").record.target.as_deref(), Some("delta"));
    // alpha is SLA-degraded: its score doubles (penalty_frac 1) plus its
    // expected delay (61 s at the policy's time value); delta ranks first.
    let e = fx.store.explain(&admin(), "j1", fx.now).unwrap();
    assert_eq!(e.ranked.iter().map(|c| c.cluster.as_str()).collect::<Vec<_>>(), ["delta", "alpha"], "{e:?}");
    let alpha = &e.ranked[1];
    let penalty = sla_term(alpha);
    assert!(penalty > alpha_before, "{penalty} vs {alpha_before}");
    assert!((alpha.score - alpha_before - penalty).abs() < 1e-9, "{alpha:?}");
    assert!(e.notes.iter().any(|n| n.starts_with("alpha is SLA-degraded (missed 1 of last 1")), "{:?}", e.notes);
    assert_eq!(fx.placed("j2", &[]), "delta");
    assert!(fx.job("j2").record.reason.contains("policy cheap: delta ranked 1 of 2"), "{}", fx.job("j2").record.reason);
    // Recovered after the cool-down: alpha is the engine's pick again.
    fx.tick(600.0);
    assert_eq!(fx.placed("j3", &[]), "alpha");
}

#[test]
fn a_late_cluster_that_does_not_confirm_the_cancel_is_fenced_and_scancel_wins() {
    let mut fx = Fx::new(false);
    assert_eq!(fx.placed("j1", &[]), "alpha");
    fx.report("j1", "alpha", JobState::Pending).unwrap();
    fx.tick(61.0);
    assert!(fx.job("j1").planned.is_some());
    // alpha never confirms the cancel: after SLA_STOP_DEADLINE_S (60 s) the
    // job is placed again anyway, never failed (it never ran: not
    // interruptible does not matter), and alpha's copy is stale.
    fx.tick(59.0);
    assert_eq!(fx.job("j1").record.target.as_deref(), Some("alpha"));
    fx.tick(1.0);
    let j = fx.job("j1");
    assert_eq!((j.record.state, j.record.target.as_deref(), j.record.epoch), (JobState::Assigned, Some("delta"), 2));
    assert!(j.record.reason.contains("alpha did not confirm its cancel within 60 s"), "{}", j.record.reason);
    let late = fx.report_epoch("j1", "alpha", JobState::Running, 1).unwrap_err();
    assert!(late.contains("stale"), "{late}");
    let fence = fx
        .store
        .fence(
            &cl("alpha"),
            &fleet_api::api::FenceRequest {
                runs: vec![fleet_api::api::RunEpoch { fleet_job_id: "j1".into(), epoch: 1 }],
            },
        )
        .unwrap();
    assert_eq!(fence.stale.iter().map(|s| s.fleet_job_id.as_str()).collect::<Vec<_>>(), ["j1"], "{fence:?}");

    // scancel while the late run is being cancelled: it ends cancelled, not
    // re-placed (a fresh fleet: alpha is not SLA-degraded there yet).
    let mut fx = Fx::new(false);
    assert_eq!(fx.placed("j2", &[]), "alpha");
    fx.report("j2", "alpha", JobState::Pending).unwrap();
    fx.tick(61.0);
    assert!(fx.job("j2").planned.as_ref().is_some_and(|m| m.sla));
    fx.store.cancel(&Caller::Job { id: "j2".into(), origin: "beta".into() }, "j2", fx.now).unwrap();
    assert_eq!(fx.report("j2", "alpha", JobState::Cancelled), Ok(JobState::Cancelled));
    let j = fx.job("j2");
    assert_eq!((j.record.state, j.record.target.as_deref(), j.record.epoch), (JobState::Cancelled, Some("alpha"), 1));
}

/// Fx without `[sla]` (so only the stranded check acts), `stranded_s` 30.
fn stranded_fx() -> Fx {
    let mut fx = Fx::new(false);
    let clusters = cluster_configs(fx.dir.path());
    fx.store.set_sla(Sla::from_config(None, &clusters)).unwrap();
    fx.store.set_stranded(30.0);
    fx
}

#[test]
fn a_job_waiting_at_a_cluster_whose_nodes_all_drained_is_cancelled_there_and_runs_once_elsewhere() {
    let mut fx = stranded_fx();
    assert_eq!(fx.placed("s1", &[]), "alpha");
    fx.report("s1", "alpha", JobState::Pending).unwrap();
    fx.tick(100.0);
    assert!(fx.job("s1").planned.is_none(), "no [sla]: waiting alone moves nothing");
    // Both of alpha's nodes are drained: for stranded_s it waits, as for
    // a slurmd coming back.
    fx.drained = vec!["alpha"];
    fx.tick(1.0);
    fx.tick(29.0);
    let j = fx.job("s1");
    assert_eq!(
        (j.record.state, j.record.target.as_deref(), j.planned.is_none()),
        (JobState::Pending, Some("alpha"), true)
    );
    // Past it: cancelled at alpha first, then placed at delta, epoch 2.
    fx.tick(2.0);
    let j = fx.job("s1");
    assert!(j.planned.as_ref().is_some_and(|m| m.sla), "{:?}", j.planned);
    let why =
        "stranded at alpha: its usable nodes could not run it for 30 s ([health] stranded_s; alpha has no h100 GPUs";
    assert!(j.record.reason.starts_with(why), "{}", j.record.reason);
    assert_eq!(fx.store.work(&cl("alpha"), fx.now).unwrap().cancel, ["s1"]);
    assert!(fx.store.work(&cl("delta"), fx.now).unwrap().submit.is_empty(), "never two copies");
    fx.tick(1.0);
    assert_eq!(fx.report("s1", "alpha", JobState::Cancelled), Ok(JobState::Assigned));
    let j = fx.job("s1");
    assert_eq!((j.record.target.as_deref(), j.record.epoch, j.record.migrations), (Some("delta"), 2, 0));
    assert!(fx.stderr("s1").starts_with("fleet: run 1 of job s1 was stranded at alpha"), "{}", fx.stderr("s1"));
    assert!(fx.stderr("s1").ends_with("cancelled there, re-placing it elsewhere\n"), "{}", fx.stderr("s1"));
    assert!(fx.report_epoch("s1", "alpha", JobState::Running, 1).unwrap_err().contains("stale"));
    assert_eq!(fx.report("s1", "delta", JobState::Running), Ok(JobState::Running));
    // Not an SLA miss of alpha (nothing is enforced), its nodes are the cause.
    assert_eq!(fx.sla("alpha").missed, 0);
}

#[test]
fn a_stranded_wait_starts_again_when_the_nodes_come_back_in_between() {
    let mut fx = stranded_fx();
    assert_eq!(fx.placed("s2", &[]), "alpha");
    fx.report("s2", "alpha", JobState::Pending).unwrap();
    fx.drained = vec!["alpha"];
    fx.tick(1.0);
    fx.tick(20.0);
    fx.drained.clear();
    fx.tick(1.0);
    fx.drained = vec!["alpha"];
    fx.tick(1.0);
    fx.tick(20.0);
    // 42 s drained, but never 30 in one stretch.
    let j = fx.job("s2");
    assert_eq!((j.record.target.as_deref(), j.planned.is_none()), (Some("alpha"), true), "{}", j.record.reason);
    fx.tick(11.0);
    assert!(fx.job("s2").planned.is_some(), "31 s in one stretch");
}

#[test]
fn a_stranded_job_that_already_ran_there_or_may_run_nowhere_else_stays() {
    let mut fx = stranded_fx();
    // Requeued by Slurm after it started: its restart is the target's.
    assert_eq!(fx.placed("ran", &[]), "alpha");
    fx.report("ran", "alpha", JobState::Running).unwrap();
    fx.tick(1.0);
    fx.report("ran", "alpha", JobState::Pending).unwrap();
    // Pinned to alpha (--fleet-to=alpha): no other cluster may run it.
    assert_eq!(fx.placed("pinned", &["alpha"]), "alpha");
    fx.report("pinned", "alpha", JobState::Pending).unwrap();
    fx.drained = vec!["alpha"];
    fx.tick(1.0);
    fx.tick(60.0);
    let ran = fx.job("ran");
    assert_eq!((ran.record.target.as_deref(), ran.planned.is_none()), (Some("alpha"), true));
    fx.stays_waiting("pinned", "alpha");
}

#[test]
fn with_stranded_s_0_a_job_waits_for_drained_nodes_as_natively() {
    let mut fx = stranded_fx();
    fx.store.set_stranded(0.0);
    assert_eq!(fx.placed("s3", &[]), "alpha");
    fx.report("s3", "alpha", JobState::Pending).unwrap();
    fx.drained = vec!["alpha"];
    fx.tick(1.0);
    fx.tick(1000.0);
    let j = fx.job("s3");
    assert_eq!((j.record.target.as_deref(), j.planned.is_none()), (Some("alpha"), true));
}

const HELD: &str = "Slurm at alpha keeps it pending (AssocMaxWallDurationPerJobLimit): it asks for more than a \
                    per-job limit of its association there";

/// A job its target keeps pending for a per-job limit there (its agent
/// says so) is given up there after `stranded_s`, as a stranded one, and
/// runs elsewhere; a planned move never takes it back there.
#[test]
fn a_job_a_limit_at_its_target_holds_for_good_runs_elsewhere_and_is_not_moved_back() {
    let mut fx = stranded_fx();
    assert_eq!(fx.placed("h1", &[]), "alpha");
    assert_eq!(fx.held("h1", "alpha", Some(HELD)), Ok(JobState::Pending));
    assert_eq!(fx.job("h1").held_by_limit, Some((1, HELD.to_string())));
    fx.tick(29.0);
    let j = fx.job("h1");
    assert_eq!((j.record.target.as_deref(), j.planned.is_none()), (Some("alpha"), true), "{}", j.record.reason);
    assert_eq!(j.record.reason, "AssocMaxWallDurationPerJobLimit");
    // Past it: cancelled at alpha first, then placed at delta, epoch 2.
    fx.tick(2.0);
    let j = fx.job("h1");
    assert!(j.planned.as_ref().is_some_and(|m| m.sla), "{:?}", j.planned);
    let why = format!("held at alpha for good: {HELD} (for 30 s, [health] stranded_s)");
    assert!(j.record.reason.starts_with(&why), "{}", j.record.reason);
    assert_eq!(j.refused_at, [("alpha".to_string(), HELD.to_string())]);
    assert_eq!(fx.store.work(&cl("alpha"), fx.now).unwrap().cancel, ["h1"]);
    fx.tick(1.0);
    assert_eq!(fx.report("h1", "alpha", JobState::Cancelled), Ok(JobState::Assigned));
    let j = fx.job("h1");
    assert_eq!((j.record.target.as_deref(), j.record.epoch), (Some("delta"), 2));
    assert!(fx.stderr("h1").starts_with(&format!("fleet: run 1 of job h1 was {why}")), "{}", fx.stderr("h1"));
    assert_eq!(fx.report("h1", "delta", JobState::Running), Ok(JobState::Running));
    fx.tick(1000.0);
    let policy = fleet_metasched::store::MovePolicy {
        checkpoint_deadline_s: 60.0,
        resume_previous: false,
        stop_deadline_s: 30.0,
        min_move_interval_s: 0.0,
    };
    let refused = fx.store.start_move(&admin(), "h1", "alpha", "test", &policy, fx.now).unwrap_err().to_string();
    assert!(refused.contains("is not moved to alpha, whose limits held it for good: Slurm at alpha"), "{refused}");
    let notes = fx.store.explain(&admin(), "h1", fx.now).unwrap().notes;
    let note =
        format!("alpha: avoided while another cluster can take the job, as its limits there held it for good ({HELD})");
    assert!(notes.contains(&note), "{notes:?}");
    // Not an SLA miss of alpha: its limits, not its provisioning.
    assert_eq!(fx.sla("alpha").missed, 0);
}

/// The wait counts in one stretch of reports that say the limit holds it:
/// a report of a wait that clears starts it again. A job no other cluster
/// can run stays, saying why, once.
#[test]
fn a_held_wait_starts_again_when_the_reason_clears_and_a_pinned_job_stays() {
    let mut fx = stranded_fx();
    assert_eq!(fx.placed("h2", &[]), "alpha");
    fx.held("h2", "alpha", Some(HELD)).unwrap();
    fx.tick(20.0);
    fx.held("h2", "alpha", None).unwrap();
    assert_eq!(fx.job("h2").held_by_limit, None);
    fx.tick(20.0);
    fx.held("h2", "alpha", Some(HELD)).unwrap();
    fx.tick(20.0);
    let j = fx.job("h2");
    assert_eq!((j.record.target.as_deref(), j.planned.is_none()), (Some("alpha"), true), "{}", j.record.reason);
    fx.tick(11.0);
    assert!(fx.job("h2").planned.is_some(), "31 s in one stretch");

    assert_eq!(fx.placed("pinned", &["alpha"]), "alpha");
    fx.held("pinned", "alpha", Some(HELD)).unwrap();
    fx.tick(31.0);
    fx.stays_waiting("pinned", "alpha");

    // A restart of the meta-scheduler starts the wait again, from what
    // its database says (the agent reports only changes).
    assert_eq!(fx.placed("h4", &[]), "alpha");
    fx.held("h4", "alpha", Some(HELD)).unwrap();
    fx.tick(20.0);
    fx.restart();
    fx.store.set_sla(Sla::from_config(None, &cluster_configs(fx.dir.path()))).unwrap();
    fx.store.set_stranded(30.0);
    fx.tick(29.0);
    assert!(fx.job("h4").planned.is_none(), "{}", fx.job("h4").record.reason);
    fx.tick(2.0);
    assert!(fx.job("h4").planned.is_some(), "31 s after the restart");

    // With stranded_s 0 it waits as natively.
    let mut fx = stranded_fx();
    fx.store.set_stranded(0.0);
    assert_eq!(fx.placed("h3", &[]), "alpha");
    fx.held("h3", "alpha", Some(HELD)).unwrap();
    fx.tick(1000.0);
    assert!(fx.job("h3").planned.is_none());
}

/// A submitter's full GPU quota at a cluster (a Kubernetes namespace's
/// ResourceQuota, published in its heartbeat) sends the job where it can
/// start, under the first rule and under the engine alike; a submitter
/// the quota does not bind still goes there; jobs placed there that the
/// heartbeat cannot show yet count in the quota's use.
#[test]
fn a_full_gpu_quota_of_the_submitter_at_a_cluster_sends_the_job_elsewhere() {
    for engine in [false, true] {
        let mut fx = Fx::new(engine);
        assert_eq!(fx.placed("q0", &[]), "alpha", "engine {engine}: alpha first");
        let quota = |users: &[&str], hard, used| GpuQuota {
            scope: "namespace ml".into(),
            users: users.iter().map(|u| u.to_string()).collect(),
            hard,
            used,
        };
        // 3 of 4 taken, and q0 (alice's, on its way there) takes the last.
        fx.quotas = vec![("alpha", quota(&["beta:alice"], 4, 3))];
        fx.tick(1.0);
        let seen = fx.store.view(fx.now).clusters.into_iter().find(|c| c.name == "alpha").unwrap();
        assert_eq!(seen.gpu_quotas.as_deref(), Some(&[quota(&["beta:alice"], 4, 4)][..]), "3 published + q0");
        assert_eq!(fx.placed("q1", &[]), "delta", "engine {engine}: alice's quota at alpha is full");
        let why = fx.store.explain(&admin(), "q1", fx.now).unwrap();
        let note = "alpha: namespace ml binds this job's submitter: 0 of 4 GPUs left";
        assert!(why.notes.iter().any(|n| n.starts_with(note)), "{:?}", why.notes);
        assert_eq!(why.placement_target.as_deref(), Some("delta"), "explain places as placement did: {why:?}");
        fx.quotas = vec![("alpha", quota(&["beta:bob"], 4, 4))];
        fx.tick(1.0);
        assert_eq!(fx.placed("q2", &[]), "alpha", "engine {engine}: bob's quota does not bind alice");
        // Room for one more beside q0 and q2: under the engine (the
        // cheaper alpha while it can start the job) one goes there, the
        // next elsewhere. (The first rule prefers the most free GPUs, so
        // its pick with room left is not the point.)
        fx.quotas = vec![("alpha", quota(&["*:*"], 6, 3))];
        fx.tick(1.0);
        if engine {
            assert_eq!(fx.placed("q3", &[]), "alpha", "one GPU left");
            assert_eq!(fx.placed("q4", &[]), "delta", "q3 took it");
        } else {
            fx.placed("q3", &[]);
            let seen = fx.store.view(fx.now).clusters.into_iter().find(|c| c.name == "alpha").unwrap();
            let used = 3 + 1 + 1 + u64::from(fx.job("q3").record.target.as_deref() == Some("alpha"));
            assert_eq!(seen.gpu_quotas.unwrap()[0].used, used, "q0, q2 (and q3 if there) on their way");
        }
    }
}
