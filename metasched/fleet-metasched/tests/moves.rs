//! Planned migrations (rebalancing moves) through the store: a running
//! job is signalled for a checkpoint, stopped at its source once a new
//! valid checkpoint is in the catalog, and placed again at the move's
//! target, which resumes it from that checkpoint; every failure on the way
//! has its outcome (deadline missed, target refusing, scancel, the job
//! ending by itself, the source dying). Time is the tests' own `now`.

use std::sync::Arc;

use fleet_api::api::{CheckpointReport, ForwardRequest, Heartbeat, NodeCapacity, StartConfirmation, StatusUpdate};
use fleet_api::{FleetOptions, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Health};
use fleet_metasched::metrics::Metrics;
use fleet_metasched::store::{Caller, MovePolicy, Store};
use fleet_metasched::Clock;

const CLUSTERS: [(&str, &str, &str); 3] =
    [("alpha", "east", "h100"), ("beta", "west", "a100"), ("delta", "central", "h100")];

struct Fx {
    _dir: tempfile::TempDir,
    store: Store,
    now: f64,
}

fn policy(resume_previous: bool) -> MovePolicy {
    MovePolicy { checkpoint_deadline_s: 60.0, resume_previous, stop_deadline_s: 30.0, min_move_interval_s: 600.0 }
}

fn admin() -> Caller {
    Caller::Admin
}

fn cl(c: &str) -> Caller {
    Caller::Cluster(c.into())
}

impl Fx {
    fn new() -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let clusters: Vec<ClusterConfig> = CLUSTERS
            .iter()
            .map(|(n, region, _)| ClusterConfig {
                name: n.to_string(),
                region: region.to_string(),
                provider: "onprem".into(),
                token_file: dir.path().join("unused"),
                ckpt_url: Some(format!("s3://ckpt-{region}/fleet")),
                ..Default::default()
            })
            .collect();
        let clock = Clock::default();
        let mut store =
            Store::open(&dir.path().join("state"), &clusters, 3.0, &clock, Arc::new(Metrics::new()), None).unwrap();
        store.set_health(Health {
            degraded_after_s: 3.0,
            grace_s: 10.0,
            max_migrations: 3,
            job_lease_s: 0.0,
            job_lease_margin_s: 0.0,
            first_lease_s: 0.0,
        });
        let mut fx = Fx { _dir: dir, store, now: clock.now() };
        fx.beat_all();
        fx
    }

    fn beat_all(&mut self) {
        for (c, _, _) in CLUSTERS {
            self.beat(c);
        }
    }

    fn beat(&mut self, c: &str) {
        let ty = CLUSTERS.iter().find(|x| x.0 == c).unwrap().2;
        let nodes = (0..2)
            .map(|i| NodeCapacity {
                name: format!("{c}-n{i}"),
                partitions: vec!["gpu".into()],
                gpu_type: Some(ty.into()),
                gpus_total: 8,
                // Fewer free at delta: the first rule picks alpha first.
                gpus_free: if c == "delta" { 6 } else { 8 },
                state: "idle".into(),
                ..Default::default()
            })
            .collect();
        let hb = Heartbeat { cluster: c.into(), scheduler: "slurm".into(), nodes, ..Default::default() };
        self.store.heartbeat(&cl(c), hb, self.now).unwrap();
    }

    fn tick(&mut self, s: f64) {
        self.now += s;
        self.beat_all();
        self.store.sweep(self.now).unwrap();
    }

    /// Job `id` from beta, running at alpha (remote id 100), checkpointing
    /// when `ckpt`, interruptible when `interruptible`; `script` extra lines.
    fn running(&mut self, id: &str, ckpt: bool, interruptible: bool, script: &str) {
        let request = JobRequest {
            origin: "beta".into(),
            user_id: 1000,
            time_limit_min: Some(60),
            gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
            script: Some(format!("#!/bin/sh\n{script}train\n").into_bytes()),
            fleet: FleetOptions { ckpt: ckpt.then(|| format!("s3://own/{id}")), interruptible, ..Default::default() },
            ..Default::default()
        };
        let fwd =
            ForwardRequest { fleet_job_id: id.into(), request, tentative_target: "alpha".into(), early_start: false };
        self.store.forward(&cl("beta"), fwd, self.now).unwrap();
        let job = Caller::Job { id: id.into(), origin: "beta".into() };
        self.store.start(&job, id, 42, 0, self.now).unwrap();
        let c = StartConfirmation { origin_job_id: 42, started: true, reason: "t".into(), ..Default::default() };
        let r = self.store.confirm_start(&cl("beta"), id, c, self.now).unwrap();
        assert_eq!((r.state, r.target.as_deref()), (JobState::Assigned, Some("alpha")), "{r:?}");
        self.report(id, "alpha", JobState::Running, 100).unwrap();
    }

    fn report(&mut self, id: &str, c: &str, s: JobState, rid: u64) -> Result<fleet_api::api::JobRecord, String> {
        let epoch = self.store.get(&admin(), id).unwrap().record.epoch;
        let upd = StatusUpdate { remote_job_id: Some(rid), state: Some(s), epoch: Some(epoch), ..Default::default() };
        self.store.status(&cl(c), id, upd, self.now).map_err(|e| e.to_string())
    }

    fn checkpoint(&mut self, id: &str, seq: u64) {
        let rep = CheckpointReport {
            seq,
            url: format!("s3://own/{id}/ckpt-{seq:012}"),
            bytes: 1000,
            manifest_sha256: "a".repeat(64),
            step: Some(seq),
            valid: true,
            copied_from: None,
            copy_seconds: None,
        };
        self.store.report_checkpoint(&cl("alpha"), id, rep, self.now).unwrap();
    }

    fn job(&self, id: &str) -> fleet_metasched::store::Job {
        self.store.get(&admin(), id).unwrap()
    }

    fn phase(&self, id: &str) -> Option<String> {
        self.job(id).planned.map(|m| format!("{:?}", m.phase))
    }

    fn stderr(&self, id: &str) -> String {
        let bytes = self.store.read_output(&admin(), id, fleet_api::api::Stream::Stderr, 0, 1 << 20).unwrap();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[test]
fn a_checkpointing_job_is_signalled_stopped_and_resumed_at_the_target() {
    let mut fx = Fx::new();
    fx.running("j1", true, true, "#FLEET ckpt-signal=USR1\n");
    fx.checkpoint("j1", 1);
    let r = fx.store.start_move(&admin(), "j1", "delta", "test", &policy(false), fx.now).unwrap();
    assert!(r.reason.contains("waiting for a new checkpoint (sent SIGUSR1)"), "{}", r.reason);
    assert_eq!(fx.phase("j1").as_deref(), Some("Checkpointing"));
    // The signal goes to alpha's agent; nothing is cancelled yet.
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    assert_eq!(
        w.signal.iter().map(|s| (s.fleet_job_id.as_str(), s.signal.as_str())).collect::<Vec<_>>(),
        [("j1", "USR1")]
    );
    assert!(w.cancel.is_empty(), "{w:?}");
    // A second move of the same job is refused while this one runs.
    let e = fx.store.start_move(&admin(), "j1", "delta", "again", &policy(false), fx.now).unwrap_err();
    assert!(e.to_string().contains("already being moved"), "{e}");
    // The old checkpoint does not count; a new one does.
    fx.tick(1.0);
    assert_eq!(fx.phase("j1").as_deref(), Some("Checkpointing"));
    fx.checkpoint("j1", 2);
    fx.tick(1.0);
    assert_eq!(fx.phase("j1").as_deref(), Some("Stopping"));
    let w = fx.store.work(&cl("alpha"), fx.now).unwrap();
    assert_eq!(w.cancel, ["j1"], "the source cancels its run");
    let rec = fx.job("j1").record;
    assert_eq!((rec.state, rec.cancel_requested), (JobState::Running, false), "the job itself is not cancelled");
    // The stopped run reports its end: placed at delta, a new epoch, resuming from checkpoint 2.
    let r = fx.report("j1", "alpha", JobState::Cancelled, 100).unwrap();
    assert_eq!(
        (r.state, r.target.as_deref(), r.epoch, r.migrations),
        (JobState::Assigned, Some("delta"), 2, 1),
        "{r:?}"
    );
    assert!(r.reason.contains("planned move to delta"), "{}", r.reason);
    let w = fx.store.work(&cl("delta"), fx.now).unwrap();
    let a = w.submit.iter().find(|a| a.fleet_job_id == "j1").expect("submitted at delta");
    assert_eq!(a.request.fleet.resume_from.as_deref(), Some("s3://own/j1/ckpt-000000000002"));
    assert_eq!(a.epoch, 2);
    // The note on stderr, once.
    let err = fx.stderr("j1");
    assert_eq!(err.matches("stopped for a planned move to delta").count(), 1, "{err}");
    assert!(err.contains("resuming from checkpoint 2"), "{err}");
    // alpha's late reports are stale.
    let e = fx.report("j1", "alpha", JobState::Running, 100).unwrap_err();
    assert!(e.contains("stale"), "{e}");
    // Running at delta: the figures are there; it ends with its own exit code.
    fx.tick(2.0);
    fx.report("j1", "delta", JobState::Running, 7).unwrap();
    let f = fx.job("j1").last_move.unwrap();
    // Differences of wall-clock timestamps (about 1.7e9 s): equal to within
    // their rounding.
    let near = |x: Option<f64>, want: f64| x.is_some_and(|x| (x - want).abs() < 1e-3);
    assert!(near(f.checkpoint_wait_s, 2.0), "{f:?}");
    assert!(near(f.running_at.map(|r| r - f.decided_at), 4.0), "{f:?}");
    let moves = fx.store.moves(fx.now).unwrap();
    assert_eq!(moves.len(), 1);
    assert_eq!(moves[0].phase, "running");
    assert!(near(moves[0].decision_to_running_s, 4.0), "{:?}", moves[0].decision_to_running_s);
    let epoch = fx.job("j1").record.epoch;
    let upd = StatusUpdate {
        remote_job_id: Some(7),
        state: Some(JobState::Completed),
        exit_code: Some(5),
        epoch: Some(epoch),
        ..Default::default()
    };
    let r = fx.store.status(&cl("delta"), "j1", upd, fx.now).unwrap();
    assert_eq!((r.state, r.exit_code), (JobState::Completed, Some(5)));
}

#[test]
fn a_missed_checkpoint_deadline_stays_or_moves_from_the_previous_one() {
    let mut fx = Fx::new();
    // Policy stay: abandoned, the job keeps running at alpha.
    fx.running("j1", true, true, "");
    fx.checkpoint("j1", 1);
    let r = fx.store.start_move(&admin(), "j1", "delta", "t", &policy(false), fx.now).unwrap();
    assert!(!r.reason.contains("sent SIG"), "no signal declared: {}", r.reason);
    assert!(fx.store.work(&cl("alpha"), fx.now).unwrap().signal.is_empty());
    fx.tick(59.0);
    assert_eq!(fx.phase("j1").as_deref(), Some("Checkpointing"));
    fx.tick(2.0);
    let j = fx.job("j1");
    assert_eq!(
        (j.planned.is_none(), j.record.state, j.record.target.as_deref()),
        (true, JobState::Running, Some("alpha"))
    );
    assert!(j.record.reason.contains("abandoned (no new checkpoint within 60 s)"), "{}", j.record.reason);
    assert!(fx.store.work(&cl("alpha"), fx.now).unwrap().cancel.is_empty());
    // Policy resume-previous: stopped anyway, resumes from checkpoint 1.
    fx.running("j2", true, true, "");
    fx.checkpoint("j2", 1);
    fx.store.start_move(&admin(), "j2", "delta", "t", &policy(true), fx.now).unwrap();
    fx.tick(61.0);
    assert_eq!(fx.phase("j2").as_deref(), Some("Stopping"));
    let r = fx.report("j2", "alpha", JobState::Cancelled, 100).unwrap();
    assert_eq!(r.target.as_deref(), Some("delta"));
    assert!(fx.stderr("j2").contains("resuming from checkpoint 1"), "{}", fx.stderr("j2"));
}

#[test]
fn jobs_that_cannot_resume_are_not_moved_and_restartable_ones_restart() {
    let mut fx = Fx::new();
    // Neither checkpoints nor restartable: refused, nothing changes.
    fx.running("j1", false, false, "");
    let e = fx.store.start_move(&admin(), "j1", "delta", "t", &policy(false), fx.now).unwrap_err();
    assert!(e.to_string().contains("nor is restartable"), "{e}");
    assert!(fx.job("j1").planned.is_none());
    // Restartable without checkpoints: stopped at once, restarted from the start.
    fx.running("j2", false, true, "");
    fx.store.start_move(&admin(), "j2", "delta", "t", &policy(false), fx.now).unwrap();
    assert_eq!(fx.phase("j2").as_deref(), Some("Stopping"));
    assert_eq!(fx.store.work(&cl("alpha"), fx.now).unwrap().cancel, ["j2"]);
    fx.report("j2", "alpha", JobState::Cancelled, 100).unwrap();
    assert!(fx.stderr("j2").contains("restarting from the start"), "{}", fx.stderr("j2"));
    let w = fx.store.work(&cl("delta"), fx.now).unwrap();
    assert_eq!(w.submit.iter().find(|a| a.fleet_job_id == "j2").unwrap().resume_from, None);
    // Only the admin moves jobs; only running jobs move; not where it already is;
    // not onto a cluster that cannot run it.
    fx.running("j3", true, true, "");
    let e = fx.store.start_move(&cl("alpha"), "j3", "delta", "t", &policy(false), fx.now).unwrap_err();
    assert!(e.to_string().contains("only the admin"), "{e}");
    let e = fx.store.start_move(&admin(), "j3", "alpha", "t", &policy(false), fx.now).unwrap_err();
    assert!(e.to_string().contains("already runs at alpha"), "{e}");
    let e = fx.store.start_move(&admin(), "j3", "beta", "t", &policy(false), fx.now).unwrap_err();
    assert!(e.to_string().contains("beta cannot take job j3"), "{e}");
}

#[test]
fn scancel_the_end_of_the_job_and_a_dying_source_end_a_move() {
    let mut fx = Fx::new();
    // scancel while checkpointing: cancelled at the target as usual.
    fx.running("j1", true, true, "");
    fx.store.start_move(&admin(), "j1", "delta", "t", &policy(false), fx.now).unwrap();
    fx.store.cancel(&admin(), "j1", fx.now).unwrap();
    assert!(fx.job("j1").planned.is_none());
    let r = fx.report("j1", "alpha", JobState::Cancelled, 100).unwrap();
    assert_eq!((r.state, r.target.as_deref()), (JobState::Cancelled, Some("alpha")));
    // scancel while stopping: it ends cancelled, not moved.
    fx.running("j2", true, true, "");
    fx.store.start_move(&admin(), "j2", "delta", "t", &policy(false), fx.now).unwrap();
    fx.checkpoint("j2", 1);
    fx.tick(1.0);
    assert_eq!(fx.phase("j2").as_deref(), Some("Stopping"));
    fx.store.cancel(&admin(), "j2", fx.now).unwrap();
    let r = fx.report("j2", "alpha", JobState::Cancelled, 100).unwrap();
    assert_eq!((r.state, r.migrations), (JobState::Cancelled, 0));
    // It completes by itself while checkpointing: completed with its exit code.
    fx.running("j3", true, true, "");
    fx.store.start_move(&admin(), "j3", "delta", "t", &policy(false), fx.now).unwrap();
    let r = fx.report("j3", "alpha", JobState::Completed, 100).unwrap();
    assert_eq!(r.state, JobState::Completed);
    assert!(fx.job("j3").planned.is_none());
    // The source never confirms the stop: treated as dead after the stop deadline,
    // moved to the target anyway (its stale copy is fenced by the epoch).
    fx.running("j4", true, true, "");
    fx.checkpoint("j4", 1);
    fx.store.start_move(&admin(), "j4", "delta", "t", &policy(false), fx.now).unwrap();
    fx.checkpoint("j4", 2);
    fx.tick(1.0);
    fx.tick(29.0);
    assert_eq!(fx.phase("j4").as_deref(), Some("Stopping"));
    fx.tick(2.0);
    let j = fx.job("j4");
    assert_eq!((j.record.state, j.record.target.as_deref(), j.record.epoch), (JobState::Assigned, Some("delta"), 2));
    assert!(fx.stderr("j4").contains("did not confirm the stop"), "{}", fx.stderr("j4"));
    // The target becomes unable to take it while checkpointing: abandoned.
    fx.running("j5", true, true, "");
    fx.store.start_move(&admin(), "j5", "delta", "t", &policy(false), fx.now).unwrap();
    fx.now += 20.0; // delta falls silent (the others beat)
    fx.beat("alpha");
    fx.beat("beta");
    fx.checkpoint("j5", 1);
    fx.store.sweep(fx.now).unwrap();
    let j = fx.job("j5");
    assert_eq!((j.planned.is_none(), j.record.target.as_deref()), (true, Some("alpha")));
    assert!(j.record.reason.contains("delta can no longer take it"), "{}", j.record.reason);
}

#[test]
fn a_job_moves_at_most_max_migrations_times_and_not_too_often() {
    let mut fx = Fx::new();
    fx.running("j1", false, true, "");
    fx.store.start_move(&admin(), "j1", "delta", "t", &policy(false), fx.now).unwrap();
    fx.report("j1", "alpha", JobState::Cancelled, 100).unwrap();
    fx.report("j1", "delta", JobState::Running, 5).unwrap();
    fx.tick(10.0);
    let e = fx.store.start_move(&admin(), "j1", "alpha", "t", &policy(false), fx.now).unwrap_err();
    assert!(e.to_string().contains("min_move_interval_s"), "{e}");
    let mut p = policy(false);
    p.min_move_interval_s = 0.0;
    fx.store.start_move(&admin(), "j1", "alpha", "t", &p, fx.now).unwrap();
    fx.report("j1", "delta", JobState::Cancelled, 5).unwrap();
    fx.report("j1", "alpha", JobState::Running, 6).unwrap();
    fx.store.start_move(&admin(), "j1", "delta", "t", &p, fx.now).unwrap();
    fx.report("j1", "alpha", JobState::Cancelled, 6).unwrap();
    fx.report("j1", "delta", JobState::Running, 8).unwrap();
    assert_eq!(fx.job("j1").record.migrations, 3);
    let e = fx.store.start_move(&admin(), "j1", "alpha", "t", &p, fx.now).unwrap_err();
    assert!(e.to_string().contains("max_migrations"), "{e}");
}

/// The admin's rebalancing endpoints over HTTP, on a daemon without an
/// engine policy (so no pass, no proposals): the mode is reported, set,
/// checked; approving needs mode approve or auto and a listed proposal.
#[tokio::test]
async fn rebalance_mode_and_approve_endpoints() {
    use fleet_metasched::config::{Config, RebalanceConfig, RebalanceMode};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), "admin-secret\n").unwrap();
    std::fs::write(dir.path().join("alpha.token"), "secret-alpha\n").unwrap();
    let config = Config {
        clusters: vec![ClusterConfig {
            name: "alpha".into(),
            region: "east".into(),
            provider: "onprem".into(),
            token_file: dir.path().join("alpha.token"),
            ..Default::default()
        }],
        rebalance: Some(RebalanceConfig { mode: RebalanceMode::Approve, ..Default::default() }),
        ..Config::new("127.0.0.1:0".parse().unwrap(), dir.path().join("state"), dir.path().join("admin.token"))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(fleet_metasched::run_with(
        listener,
        config,
        Clock::default(),
        fleet_metasched::Control::default(),
        async {
            let _ = rx.await;
        },
    ));
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, token: &str, body: Option<serde_json::Value>| {
        let mut b = http.request(method, format!("{url}{path}")).header("Authorization", format!("Bearer {token}"));
        if let Some(body) = body {
            b = b.json(&body);
        }
        async move {
            let r = b.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    use reqwest::Method as M;
    let (s, t) = call(M::GET, "/v1/rebalance", "admin-secret", None).await;
    assert_eq!(s, 200, "{t}");
    assert!(t.contains("\"mode\":\"approve\""), "{t}");
    // Approve mode, but no proposal of that id.
    let (s, t) = call(M::POST, "/v1/rebalance/approve/j1-e1", "admin-secret", None).await;
    assert_eq!((s, t.contains("no proposal \\\"j1-e1\\\" in the latest rebalancing pass")), (404, true), "{t}");
    // Only the admin.
    let (s, _) = call(M::POST, "/v1/rebalance/approve/j1-e1", "secret-alpha", None).await;
    assert_eq!(s, 403);
    let (s, _) = call(M::POST, "/v1/rebalance/mode", "secret-alpha", Some(serde_json::json!({"mode": "off"}))).await;
    assert_eq!(s, 403);
    // Bad modes and bodies are refused with the reason.
    let (s, t) = call(M::POST, "/v1/rebalance/mode", "admin-secret", Some(serde_json::json!({"mode": "Auto"}))).await;
    assert_eq!((s, t.contains("unknown rebalance mode \\\"Auto\\\"")), (400, true), "{t}");
    let (s, _) = call(M::POST, "/v1/rebalance/mode", "admin-secret", Some(serde_json::json!({"mode": 1}))).await;
    assert_eq!(s, 400);
    // Without an engine policy nothing can be proposed, so auto is refused; off is fine.
    let (s, t) = call(M::POST, "/v1/rebalance/mode", "admin-secret", Some(serde_json::json!({"mode": "auto"}))).await;
    assert_eq!((s, t.contains("no cost-engine policy")), (409, true), "{t}");
    let (s, t) = call(M::POST, "/v1/rebalance/mode", "admin-secret", Some(serde_json::json!({"mode": "off"}))).await;
    assert_eq!((s, t.contains("\"was\":\"approve\"")), (200, true), "{t}");
    let (s, t) = call(M::POST, "/v1/rebalance/approve/j1-e1", "admin-secret", None).await;
    assert_eq!((s, t.contains("mode is \\\"off\\\"")), (409, true), "{t}");
    let (_, t) = call(M::GET, "/v1/rebalance", "admin-secret", None).await;
    assert!(t.contains("\"mode\":\"off\""), "{t}");
    let _ = tx.send(());
    handle.await.unwrap().unwrap();
}
