//! Early placement through the store (docs/failover.md, "Start latency"):
//! a job forwarded at sbatch time is placed at once on a cluster that
//! gates its runs' scripts, its run's first lease is answered "wait" until
//! the origin confirms the stand-in runs, then granted; past the wait
//! bound the early run is withdrawn and the job starts the ordinary way;
//! scancel while it waits cancels it at the target. Time is the tests'
//! own `now`.

use std::sync::Arc;

use fleet_api::api::{
    ForwardRequest, Heartbeat, JobLeaseRequest, NodeCapacity, SignalRequest, SignalScope, StartConfirmation,
    StatusUpdate,
};
use fleet_api::{GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Health};
use fleet_metasched::metrics::Metrics;
use fleet_metasched::store::{Caller, Store};
use fleet_metasched::Clock;

struct Fx {
    _dir: tempfile::TempDir,
    store: Store,
    now: f64,
    /// Clusters whose heartbeats say their runs start gated.
    gated: Vec<&'static str>,
    metrics: Arc<Metrics>,
}

fn admin() -> Caller {
    Caller::Admin
}

fn cl(c: &str) -> Caller {
    Caller::Cluster(c.into())
}

fn job_token(id: &str) -> Caller {
    Caller::Job { id: id.into(), origin: "beta".into() }
}

/// The run's own checkpoint token at `c`.
fn run_at(id: &str, c: &str) -> Caller {
    Caller::Checkpointer { id: id.into(), cluster: c.into() }
}

impl Fx {
    /// alpha (h100, gated) and beta (the origin, no h100): a job asking
    /// for an h100 goes to alpha. Job leases of 8 s, first lease within 24 s.
    fn new() -> Fx {
        Fx::with(&["alpha"], 8.0)
    }

    fn with(gated: &[&'static str], job_lease_s: f64) -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let clusters: Vec<ClusterConfig> = ["alpha", "beta"]
            .iter()
            .map(|n| ClusterConfig {
                name: n.to_string(),
                region: "east".into(),
                provider: "onprem".into(),
                token_file: dir.path().join("unused"),
                ..Default::default()
            })
            .collect();
        let clock = Clock::default();
        let metrics = Arc::new(Metrics::new());
        let mut store = Store::open(&dir.path().join("state"), &clusters, 3.0, &clock, metrics.clone(), None).unwrap();
        store.set_health(Health {
            degraded_after_s: 3.0,
            grace_s: 10.0,
            max_migrations: 3,
            job_lease_s,
            job_lease_margin_s: 4.0,
            first_lease_s: 24.0,
        });
        store.set_early_wait(30.0);
        let mut fx = Fx { _dir: dir, store, now: clock.now(), gated: gated.to_vec(), metrics };
        fx.beat_all();
        fx
    }

    fn beat_all(&mut self) {
        for c in ["alpha", "beta"] {
            let ty = if c == "alpha" { "h100" } else { "a100" };
            let nodes = vec![NodeCapacity {
                name: format!("{c}-n0"),
                partitions: vec!["gpu".into()],
                gpu_type: Some(ty.into()),
                gpus_total: 8,
                gpus_free: 8,
                state: "idle".into(),
                ..Default::default()
            }];
            let hb = Heartbeat {
                cluster: c.into(),
                scheduler: "slurm".into(),
                nodes,
                start_gate: self.gated.contains(&c),
                ..Default::default()
            };
            self.store.heartbeat(&cl(c), hb, self.now).unwrap();
        }
    }

    fn tick(&mut self, s: f64) {
        self.now += s;
        self.beat_all();
        self.store.sweep(self.now).unwrap();
    }

    fn request() -> JobRequest {
        JobRequest {
            origin: "beta".into(),
            user_id: 1000,
            time_limit_min: Some(60),
            gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
            script: Some(b"#!/bin/sh\ndate +%s.%N > started\n".to_vec()),
            ..Default::default()
        }
    }

    fn forward_with(&mut self, id: &str, request: JobRequest, early_start: bool) -> fleet_api::api::JobRecord {
        let fwd = ForwardRequest { fleet_job_id: id.into(), request, tentative_target: "alpha".into(), early_start };
        self.store.forward(&cl("beta"), fwd, self.now).unwrap()
    }

    fn forward(&mut self, id: &str) -> fleet_api::api::JobRecord {
        self.forward_with(id, Fx::request(), true)
    }

    fn report(&mut self, id: &str, c: &str, s: JobState, epoch: u64) -> Result<fleet_api::api::JobRecord, String> {
        let upd = StatusUpdate {
            remote_job_id: Some(100 + epoch),
            state: Some(s),
            epoch: Some(epoch),
            job_lease: true,
            ..Default::default()
        };
        self.store.status(&cl(c), id, upd, self.now).map_err(|e| e.to_string())
    }

    fn lease(&mut self, id: &str, c: &str, epoch: u64) -> fleet_api::api::JobLeaseReply {
        let req = JobLeaseRequest { epoch, lease_ms: 8000 };
        self.store.job_lease(&run_at(id, c), id, &req, self.now).unwrap()
    }

    /// The stand-in (Slurm id 42) asks to start; `Some(started)`: the
    /// origin agent answers.
    fn stand_in_starts(&mut self, id: &str, confirm: Option<bool>) -> fleet_api::api::JobRecord {
        let (_, held) = self.store.start(&job_token(id), id, 42, 0, self.now).unwrap();
        assert!(held, "the stand-in's start request is answered 202 until the origin confirms");
        let w = self.store.work(&cl("beta"), self.now).unwrap();
        assert!(
            w.confirm_start.iter().any(|c| c.fleet_job_id == id && c.origin_job_id == 42),
            "the origin agent is asked to confirm: {w:?}"
        );
        match confirm {
            Some(started) => {
                let c = StartConfirmation { origin_job_id: 42, started, reason: "t".into(), ..Default::default() };
                self.store.confirm_start(&cl("beta"), id, c, self.now).unwrap()
            }
            None => self.job(id).record,
        }
    }

    fn job(&self, id: &str) -> fleet_metasched::store::Job {
        self.store.get(&admin(), id).unwrap()
    }

    /// The placement counter of `outcome` (0 when never counted).
    fn placements(&self, outcome: &str) -> u64 {
        let text = self.metrics.render(&[]);
        let key = format!("placements_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.split_once(key.as_str()).filter(|(name, _)| !name.contains(' ')).map(|(_, n)| n))
            .map_or(0, |n| n.trim().parse().unwrap())
    }
}

/// Early placement decides on a copy of the job: a trial thrown away (no
/// cluster gates its runs) counts no placement, and a kept one counts
/// once, as early; the ordinary placement at the stand-in's start counts.
#[test]
fn an_early_placement_trial_is_silent_and_counted_only_when_kept() {
    let mut fx = Fx::with(&[], 8.0);
    let r = fx.forward("j1");
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Held, None, 0), "{r:?}");
    for outcome in ["remote", "home", "early", "waiting", "impossible"] {
        assert_eq!(fx.placements(outcome), 0, "{outcome}: {}", fx.metrics.render(&[]));
    }
    // Placed the ordinary way when its stand-in starts: counted then.
    let r = fx.stand_in_starts("j1", Some(true));
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Assigned, Some("alpha"), 1), "{r:?}");
    assert_eq!((fx.placements("remote"), fx.placements("early")), (1, 0), "{}", fx.metrics.render(&[]));

    let mut fx = Fx::new();
    let r = fx.forward("j2");
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Assigned, Some("alpha"), 1), "{r:?}");
    assert_eq!((fx.placements("early"), fx.placements("remote")), (1, 0), "{}", fx.metrics.render(&[]));
}

#[test]
fn an_early_run_waits_at_its_first_lease_until_the_origin_confirms_the_stand_in() {
    let mut fx = Fx::new();
    let r = fx.forward("j1");
    // Placed at once, before any start request: the target submits it.
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Assigned, Some("alpha"), 1), "{r:?}");
    assert!(r.reason.contains("placed early"), "{}", r.reason);
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    let a = w.submit.iter().find(|a| a.fleet_job_id == "j1").expect("submitted at alpha");
    assert!(a.request.fleet.start_gated, "only under the lease that gates its script");
    // Submitted and started by alpha's Slurm: lease-exec asks, and waits.
    fx.report("j1", "alpha", JobState::Pending, 1).unwrap();
    fx.tick(1.0);
    fx.report("j1", "alpha", JobState::Running, 1).unwrap();
    let l = fx.lease("j1", "alpha", 1);
    assert!(l.wait && !l.stale && l.valid_ms == 0, "{l:?}");
    assert!(l.reason.contains("waiting for beta"), "{}", l.reason);
    // No signal reaches a script that does not run yet.
    let e = fx
        .store
        .signal(&admin(), "j1", &SignalRequest { signal: "USR1".into(), scope: SignalScope::Batch }, fx.now)
        .unwrap_err();
    assert!(e.to_string().contains("held until its stand-in starts"), "{e}");
    // It waits past first_lease_s (24 s) without being taken for a lost launch.
    for _ in 0..25 {
        fx.tick(1.0);
        assert!(fx.lease("j1", "alpha", 1).wait);
    }
    assert_eq!(fx.job("j1").record.state, JobState::Running);
    // The stand-in starts; until the origin agent confirms, still waiting.
    fx.stand_in_starts("j1", None);
    assert!(fx.lease("j1", "alpha", 1).wait);
    // A refusal drops the request; the run keeps waiting.
    let r = fx.stand_in_starts("j1", Some(false));
    assert_eq!(r.state, JobState::Running);
    assert!(fx.lease("j1", "alpha", 1).wait);
    // Confirmed: granted, and the job simply runs at alpha (same epoch).
    let r = fx.stand_in_starts("j1", Some(true));
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Running, Some("alpha"), 1), "{r:?}");
    assert!(fx.job("j1").early.is_none());
    let l = fx.lease("j1", "alpha", 1);
    assert!(!l.wait && !l.stale && l.valid_ms == 8000, "{l:?}");
    // The proxy's next start request is answered 200 (not held).
    let (_, held) = fx.store.start(&job_token("j1"), "j1", 42, 0, fx.now).unwrap();
    assert!(!held);
    // No confirmation is asked for any more.
    assert!(fx.store.work(&cl("beta"), fx.now).unwrap().confirm_start.is_empty());
    fx.report("j1", "alpha", JobState::Completed, 1).unwrap();
    assert_eq!(fx.job("j1").record.state, JobState::Completed);
}

/// Why an early run waits at its target (a pod the scheduler cannot
/// place), which the target says once, stays the first thing the job's
/// reason says through its stand-in's start request and the origin's
/// confirmation (the stand-in's comment at the origin shows it), and goes
/// once the run leaves pending.
#[test]
fn why_an_early_run_waits_at_its_target_outlasts_the_start_request_and_the_confirmation() {
    let mut fx = Fx::new();
    fx.forward("j1");
    let why = "Unschedulable: 0/3 nodes are available: 2 Insufficient nvidia.com/gpu.";
    let upd = StatusUpdate {
        remote_job_id: Some(101),
        state: Some(JobState::Pending),
        epoch: Some(1),
        reason: why.into(),
        ..Default::default()
    };
    let r = fx.store.status(&cl("alpha"), "j1", upd, fx.now).unwrap();
    assert_eq!(r.reason, why);
    fx.tick(1.0);
    let r = fx.stand_in_starts("j1", None);
    assert!(r.reason.starts_with(&format!("{why}; held at beta: stand-in 42 asked to start")), "{}", r.reason);
    let r = fx.stand_in_starts("j1", Some(true));
    assert_eq!(r.state, JobState::Pending);
    assert_eq!(r.reason, format!("{why}; placed early at alpha; the origin confirmed stand-in 42"));
    // Running: the target's word no longer holds.
    let r = fx.report("j1", "alpha", JobState::Running, 1).unwrap();
    assert_eq!(r.reason, "placed early at alpha; the origin confirmed stand-in 42");
    assert!(fx.job("j1").target_waits.is_none());
}

#[test]
fn a_time_limit_changed_while_the_stand_in_pended_reaches_the_early_run() {
    let mut fx = Fx::new();
    fx.forward("j1");
    fx.report("j1", "alpha", JobState::Running, 1).unwrap();
    fx.store.start(&job_token("j1"), "j1", 42, 0, fx.now).unwrap();
    let c = StartConfirmation { origin_job_id: 42, started: true, time_limit_min: Some(30), ..Default::default() };
    fx.store.confirm_start(&cl("beta"), "j1", c, fx.now).unwrap();
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    assert_eq!(w.time_limit.iter().map(|t| (t.fleet_job_id.as_str(), t.minutes)).collect::<Vec<_>>(), [("j1", 30)]);
    // Not yet submitted: the assignment itself carries the new limit.
    fx.forward("j2");
    fx.store.start(&job_token("j2"), "j2", 43, 0, fx.now).unwrap();
    let c = StartConfirmation { origin_job_id: 43, started: true, time_limit_min: Some(20), ..Default::default() };
    fx.store.confirm_start(&cl("beta"), "j2", c, fx.now).unwrap();
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    let a = w.submit.iter().find(|a| a.fleet_job_id == "j2").unwrap();
    assert_eq!(a.request.time_limit_min, Some(20));
    assert!(w.time_limit.is_empty(), "{w:?}");
}

#[test]
fn once_its_gate_opens_a_run_that_never_asks_for_its_lease_is_a_lost_launch() {
    let mut fx = Fx::new();
    fx.forward("j1");
    fx.report("j1", "alpha", JobState::Running, 1).unwrap();
    fx.tick(20.0);
    fx.stand_in_starts("j1", Some(true));
    // The first-lease clock starts at the confirmation, not at the report.
    fx.tick(20.0);
    assert_eq!(fx.job("j1").record.state, JobState::Running);
    fx.tick(5.0);
    // Nothing of it ran: placed again, though it is not restartable.
    let r = fx.job("j1").record;
    assert_eq!((r.state, r.epoch, r.migrations), (JobState::Assigned, 2, 1), "{r:?}");
    assert!(r.reason.contains("never asked for its job lease"), "{}", r.reason);
    assert!(r.reason.contains("starting it again (its script never started there"), "{}", r.reason);
}

#[test]
fn an_unconfirmed_early_run_is_withdrawn_and_the_job_starts_the_ordinary_way() {
    let mut fx = Fx::new();
    fx.forward("j1");
    fx.report("j1", "alpha", JobState::Running, 1).unwrap();
    fx.tick(29.0);
    assert!(fx.lease("j1", "alpha", 1).wait);
    assert!(fx.store.work(&cl("alpha"), fx.now).unwrap().cancel.is_empty());
    // Past the bound (30 s): cancelled at alpha, its lease stale at once.
    fx.tick(2.0);
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    assert_eq!(w.cancel, ["j1"], "{w:?}");
    let l = fx.lease("j1", "alpha", 1);
    assert!(l.stale && l.reason.contains("withdrawn"), "{l:?}");
    // The stand-in asks meanwhile: recorded, confirmed only once it is back to held.
    let (_, held) = fx.store.start(&job_token("j1"), "j1", 42, 0, fx.now).unwrap();
    assert!(held);
    assert!(fx.store.work(&cl("beta"), fx.now).unwrap().confirm_start.is_empty());
    // alpha's cancel lands: held again, nothing of that run counts.
    let r = fx.report("j1", "alpha", JobState::Cancelled, 1).unwrap();
    assert_eq!((r.state, r.target.as_deref(), r.remote_job_id), (JobState::Held, None, None), "{r:?}");
    assert!(r.reason.contains("was withdrawn"), "{}", r.reason);
    let e = fx.report("j1", "alpha", JobState::Failed, 1).unwrap_err();
    assert!(e.contains("stale"), "{e}");
    // The ordinary start: confirmed, placed in a new epoch, granted at once.
    let w = fx.store.work(&cl("beta"), fx.now).unwrap();
    assert_eq!(w.confirm_start.iter().map(|c| c.fleet_job_id.as_str()).collect::<Vec<_>>(), ["j1"]);
    let c = StartConfirmation { origin_job_id: 42, started: true, reason: "t".into(), ..Default::default() };
    let r = fx.store.confirm_start(&cl("beta"), "j1", c, fx.now).unwrap();
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Assigned, Some("alpha"), 2), "{r:?}");
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    assert!(!w.submit[0].request.fleet.start_gated, "{w:?}");
    fx.report("j1", "alpha", JobState::Running, 2).unwrap();
    let l = fx.lease("j1", "alpha", 2);
    assert!(l.valid_ms > 0 && !l.wait, "{l:?}");
    // The withdrawn run's epoch stays stale.
    assert!(fx.lease("j1", "alpha", 1).stale);
}

#[test]
fn an_early_run_never_submitted_within_the_bound_is_forgotten_at_once() {
    let mut fx = Fx::new();
    fx.forward("j1");
    fx.tick(31.0);
    let r = fx.job("j1").record;
    assert_eq!((r.state, r.target.as_deref()), (JobState::Held, None), "{r:?}");
    assert!(fx.store.work(&cl("alpha"), fx.now).unwrap().submit.is_empty());
    // A late submission there is stale: its agent stops it.
    let e = fx.report("j1", "alpha", JobState::Pending, 1).unwrap_err();
    assert!(e.contains("stale"), "{e}");
}

#[test]
fn scancel_of_the_stand_in_while_its_run_waits_cancels_it_at_the_target() {
    let mut fx = Fx::new();
    fx.forward("j1");
    fx.report("j1", "alpha", JobState::Running, 1).unwrap();
    assert!(fx.lease("j1", "alpha", 1).wait);
    // The origin agent's reconciler (the stand-in was cancelled pending).
    fx.store.cancel(&cl("beta"), "j1", fx.now).unwrap();
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    assert_eq!(w.cancel, ["j1"], "{w:?}");
    let l = fx.lease("j1", "alpha", 1);
    assert!(l.stale && l.reason.contains("cancelled"), "{l:?}");
    let r = fx.report("j1", "alpha", JobState::Cancelled, 1).unwrap();
    assert_eq!(r.state, JobState::Cancelled, "{r:?}");
    // Not yet submitted: cancelled here, nothing to submit there.
    fx.forward("j2");
    fx.store.cancel(&cl("beta"), "j2", fx.now).unwrap();
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    assert!(w.submit.is_empty(), "{w:?}");
    assert_eq!(fx.job("j2").record.state, JobState::Cancelled);
}

#[test]
fn an_early_run_that_fails_to_launch_sends_the_job_back_to_held() {
    let mut fx = Fx::new();
    fx.forward("j1");
    fx.report("j1", "alpha", JobState::Failed, 1).unwrap();
    let r = fx.job("j1").record;
    assert_eq!((r.state, r.target.as_deref(), r.exit_code), (JobState::Held, None, None), "{r:?}");
    assert!(r.reason.contains("ended failed before it started"), "{}", r.reason);
    // Then the ordinary start.
    let r = fx.stand_in_starts("j1", Some(true));
    assert_eq!((r.state, r.epoch), (JobState::Assigned, 2), "{r:?}");
}

#[test]
fn only_jobs_whose_stand_in_starts_by_itself_soon_are_placed_early() {
    type Change = fn(&mut JobRequest);
    /// (why, request change, early_start, gated clusters, job_lease_s, placed early)
    type Case = (&'static str, Change, bool, &'static [&'static str], f64, bool);
    let same: Change = |_| {};
    let cases: &[Case] = &[
        ("eligible", same, true, &["alpha"], 8.0, true),
        ("dependency", |r| r.dependency = Some("afterok:12".into()), true, &["alpha"], 8.0, false),
        ("held", |r| r.hold = true, true, &["alpha"], 8.0, false),
        ("begin later", |r| r.begin_time = Some(4_000_000_000), true, &["alpha"], 8.0, false),
        ("begin past", |r| r.begin_time = Some(1), true, &["alpha"], 8.0, true),
        ("deferred or older agent", same, false, &["alpha"], 8.0, false),
        ("target does not gate", same, true, &["beta"], 8.0, false),
        ("job leases off", same, true, &["alpha"], 0.0, false),
    ];
    for (why, change, early_start, gated, lease, want) in cases {
        let mut fx = Fx::with(gated, *lease);
        let mut req = Fx::request();
        change(&mut req);
        let r = fx.forward_with("j1", req, *early_start);
        let early = r.state == JobState::Assigned;
        assert_eq!(early, *want, "{why}: {r:?}");
        if !early {
            assert_eq!((r.state, r.target.as_deref()), (JobState::Held, None), "{why}");
        }
    }
    // Off by configuration.
    let mut fx = Fx::new();
    fx.store.set_early_wait(0.0);
    assert_eq!(fx.forward("j1").state, JobState::Held);
}
