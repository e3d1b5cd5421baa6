//! The checkpoint catalog over HTTP: who may report, what is accepted,
//! what an assignment carries, and the failover's questions
//! (`latest_valid_checkpoint`, `plan_restore`) on the stored catalog.

use std::path::Path;
use std::sync::Arc;

use fleet_api::api::{
    AgentWork, Checkpoint, CheckpointReport, ForwardRequest, Heartbeat, JobRecord, NodeCapacity, StartConfirmation,
    StartRequest,
};
use fleet_api::{auth, FleetOptions, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config};
use fleet_metasched::Clock;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// name, region, GPU type, site default checkpoint store.
const CLUSTERS: [(&str, &str, &str, &str); 3] = [
    ("alpha", "east", "h100", "s3://ckpt-east/fleet"),
    ("beta", "west", "a100", "s3://ckpt-west/fleet/"),
    ("gamma", "south", "h100", "s3://ckpt-south/fleet"),
];

fn token_of(name: &str) -> String {
    format!("secret-{name}")
}

fn bearer(cluster: &str) -> String {
    format!("Bearer {}", token_of(cluster))
}

fn job_auth(origin: &str, id: &str) -> String {
    format!("FleetJob {}", auth::job_token(&token_of(origin), id))
}

fn config(dir: &Path) -> Config {
    std::fs::write(dir.join("admin.token"), "admin-secret\n").unwrap();
    let clusters = CLUSTERS
        .iter()
        .map(|(n, region, _, ckpt)| {
            let p = dir.join(format!("{n}.token"));
            std::fs::write(&p, token_of(n)).unwrap();
            ClusterConfig {
                name: n.to_string(),
                region: region.to_string(),
                provider: "onprem".into(),
                token_file: p,
                ckpt_url: Some(ckpt.to_string()),
                ..Default::default()
            }
        })
        .collect();
    Config {
        heartbeat_timeout_s: 3600.0,
        clusters,
        ..Config::new("127.0.0.1:0".parse().unwrap(), dir.join("state"), dir.join("admin.token"))
    }
}

struct Daemon {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    http: reqwest::Client,
}

impl Daemon {
    async fn start(config: Config) -> Daemon {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let control = fleet_metasched::Control::default();
        let handle = tokio::spawn(fleet_metasched::run_with(listener, config, Clock::default(), control, async {
            let _ = rx.await;
        }));
        let d = Daemon { url, stop: Some(tx), handle, http: reqwest::Client::new() };
        for (c, _, ty, _) in CLUSTERS {
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
            d.ok::<Value>(Method::POST, "/v1/heartbeat", &bearer(c), Some(serde_json::to_value(hb).unwrap())).await;
        }
        d
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.handle.await.unwrap().unwrap();
    }

    async fn call(&self, method: Method, path: &str, auth: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut b = self.http.request(method, format!("{}{path}", self.url));
        if !auth.is_empty() {
            b = b.header("Authorization", auth);
        }
        if let Some(body) = body {
            b = b.json(&body);
        }
        let r = b.send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn ok<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        auth: &str,
        body: Option<Value>,
    ) -> T {
        let (s, v) = self.call(method, path, auth, body).await;
        assert!(s.is_success(), "{path}: {s} {v}");
        serde_json::from_value(v).unwrap()
    }

    /// Forward `id` from beta for one H100 at `to`, start its stand-in and
    /// confirm it: the job is assigned to `to`.
    async fn assigned(&self, id: &str, to: &str, own_ckpt: Option<&str>) -> JobRecord {
        self.assigned_with(id, to, own_ckpt, b"#!/bin/sh\ntrain\n").await
    }

    async fn assigned_with(&self, id: &str, to: &str, own_ckpt: Option<&str>, script: &[u8]) -> JobRecord {
        self.assigned_as(id, to, own_ckpt, script, None).await
    }

    /// As [`Daemon::assigned_with`], submitted by `user` (the origin's name for them).
    async fn assigned_as(
        &self,
        id: &str,
        to: &str,
        own_ckpt: Option<&str>,
        script: &[u8],
        user: Option<&str>,
    ) -> JobRecord {
        let request = JobRequest {
            origin: "beta".into(),
            user_id: 1000,
            user_name: user.map(Into::into),
            time_limit_min: Some(60),
            gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
            script: Some(script.to_vec()),
            fleet: FleetOptions { to: vec![to.into()], ckpt: own_ckpt.map(Into::into), ..Default::default() },
            ..Default::default()
        };
        let fwd = ForwardRequest { fleet_job_id: id.into(), request, tentative_target: to.into(), early_start: false };
        self.ok::<JobRecord>(Method::POST, "/v1/jobs", &bearer("beta"), Some(serde_json::to_value(fwd).unwrap())).await;
        let body = serde_json::to_value(StartRequest { origin_job_id: 42, ..Default::default() }).unwrap();
        let (s, v) = self.call(Method::POST, &format!("/v1/jobs/{id}/start"), &job_auth("beta", id), Some(body)).await;
        assert!(s.is_success(), "{s} {v}");
        let c = StartConfirmation { origin_job_id: 42, started: true, reason: "test".into(), ..Default::default() };
        let r: JobRecord = self
            .ok(
                Method::POST,
                &format!("/v1/jobs/{id}/confirm_start"),
                &bearer("beta"),
                Some(serde_json::to_value(c).unwrap()),
            )
            .await;
        assert_eq!((r.state, r.target.as_deref()), (JobState::Assigned, Some(to)), "{r:?}");
        r
    }

    async fn report(&self, id: &str, auth: &str, rep: &CheckpointReport) -> (StatusCode, Value) {
        self.call(Method::POST, &format!("/v1/jobs/{id}/checkpoints"), auth, Some(serde_json::to_value(rep).unwrap()))
            .await
    }

    async fn catalog(&self, id: &str, auth: &str) -> Vec<Checkpoint> {
        self.ok(Method::GET, &format!("/v1/jobs/{id}/checkpoints"), auth, None).await
    }

    async fn work(&self, cluster: &str) -> AgentWork {
        self.ok(Method::GET, "/v1/agent/work", &bearer(cluster), None).await
    }
}

fn rep(url: &str, seq: u64, sha: char) -> CheckpointReport {
    CheckpointReport {
        seq,
        url: url.into(),
        bytes: 200_000_000,
        manifest_sha256: sha.to_string().repeat(64),
        step: Some(seq * 1000),
        valid: true,
        copied_from: None,
        copy_seconds: None,
    }
}

fn ckpt_auth(target: &str, id: &str) -> String {
    format!("FleetCkpt {}", auth::ckpt_token(&token_of(target), id))
}

fn check_status(got: (StatusCode, Value), want: StatusCode, msg: &str) {
    assert_eq!(got.0, want, "{}", got.1);
    let text = got.1.to_string();
    assert!(text.contains(msg), "{text} lacks {msg:?}");
}

#[tokio::test]
async fn only_the_job_and_its_target_report_and_reports_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(config(tmp.path())).await;
    d.assigned("j1", "alpha", None).await;
    d.assigned("j2", "gamma", None).await;
    let url = "s3://ckpt-east/fleet/j1/ckpt-000000000001";
    let r = rep(url, 1, 'a');

    // Who may post: the job's token and the target's agent; nobody else.
    check_status(d.report("j1", "", &r).await, StatusCode::UNAUTHORIZED, "missing Authorization");
    check_status(d.report("j1", "Bearer admin-secret", &r).await, StatusCode::FORBIDDEN, "only the job or its target");
    check_status(d.report("j1", &bearer("beta"), &r).await, StatusCode::FORBIDDEN, "does not run j1");
    check_status(d.report("j1", &bearer("gamma"), &r).await, StatusCode::FORBIDDEN, "does not run j1");
    check_status(d.report("j1", &job_auth("beta", "j2"), &r).await, StatusCode::UNAUTHORIZED, "does not match");
    check_status(d.report("j1", &job_auth("alpha", "j1"), &r).await, StatusCode::UNAUTHORIZED, "does not match");
    check_status(d.report("nope", &bearer("alpha"), &r).await, StatusCode::NOT_FOUND, "unknown job");

    // What is accepted: a ckpt-<seq> under one of the job's prefixes.
    let bad: &[(CheckpointReport, StatusCode, &str)] = &[
        (
            rep("s3://ckpt-east/fleet/j2/ckpt-000000000001", 1, 'a'),
            StatusCode::FORBIDDEN,
            "not under a checkpoint prefix of j1",
        ),
        (rep("s3://evil/j1/ckpt-000000000001", 1, 'a'), StatusCode::FORBIDDEN, "s3://ckpt-east/fleet/j1"),
        (rep("s3://ckpt-east/fleet/j1/ckpt-1", 1, 'a'), StatusCode::BAD_REQUEST, "ckpt-<12 digits>"),
        (rep("s3://ckpt-east/fleet/j1/ckpt-000000000002", 1, 'a'), StatusCode::BAD_REQUEST, "names seq 2"),
        (rep(url, 1, 'Z'), StatusCode::BAD_REQUEST, "64 lower-case hex"),
        (rep("s3://ckpt-east/fleet/j1/x y/ckpt-000000000001", 1, 'a'), StatusCode::BAD_REQUEST, "whitespace"),
    ];
    for (r, status, msg) in bad {
        check_status(d.report("j1", &bearer("alpha"), r).await, *status, msg);
    }
    let (s, v) =
        d.call(Method::POST, "/v1/jobs/j1/checkpoints", &bearer("alpha"), Some(serde_json::json!({"seq": 1}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(d.catalog("j1", "Bearer admin-secret").await.is_empty(), "nothing refused was stored");

    // Accepted from the target and from the job; region from the prefix.
    let c1: Checkpoint = serde_json::from_value(d.report("j1", &bearer("alpha"), &r).await.1).unwrap();
    assert_eq!((c1.region.as_deref(), c1.reported_by.as_str(), c1.valid), (Some("east"), "alpha", true));
    let r2 = rep("s3://ckpt-east/fleet/j1/ckpt-000000000002", 2, 'b');
    let (s, _) = d.report("j1", &job_auth("beta", "j1"), &r2).await;
    assert_eq!(s, StatusCode::OK);
    // A repeat is a no-op; the same URL with another manifest is a conflict.
    assert_eq!(d.report("j1", &bearer("alpha"), &r2).await.0, StatusCode::OK);
    check_status(
        d.report("j1", &bearer("alpha"), &rep(&r2.url, 2, 'c')).await,
        StatusCode::CONFLICT,
        "never rewritten",
    );

    // Readers: newest first, for the admin, the job, origin and target.
    for who in ["Bearer admin-secret".to_string(), job_auth("beta", "j1"), bearer("beta"), bearer("alpha")] {
        let list = d.catalog("j1", &who).await;
        assert_eq!(list.iter().map(|c| c.seq).collect::<Vec<_>>(), [2, 1], "{who}");
        assert_eq!(list[0].reported_by, "job");
    }
    let (s, _) = d.call(Method::GET, "/v1/jobs/j1/checkpoints", &bearer("gamma"), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Found torn: marked invalid, stays invalid.
    let torn = CheckpointReport { valid: false, ..r2.clone() };
    let c: Checkpoint = serde_json::from_value(d.report("j1", &bearer("alpha"), &torn).await.1).unwrap();
    assert!(!c.valid);
    let c: Checkpoint = serde_json::from_value(d.report("j1", &job_auth("beta", "j1"), &r2).await.1).unwrap();
    assert!(!c.valid, "a torn checkpoint is not made valid again");
    d.stop().await;

    // The failover's questions, on the stored catalog.
    let cfg = config(tmp.path());
    let store = fleet_metasched::store::Store::open(
        &cfg.state_dir,
        &cfg.clusters,
        cfg.heartbeat_timeout_s,
        &Clock::default(),
        Arc::new(fleet_metasched::metrics::Metrics::new()),
        None,
    )
    .unwrap();
    assert_eq!(store.latest_valid_checkpoint("j1").unwrap().map(|c| c.seq), Some(1), "seq 2 is torn");
    assert_eq!(store.latest_valid_checkpoint("j2").unwrap(), None);
    let here = store.plan_restore("j1", "east").unwrap().unwrap();
    assert_eq!((here.copy_needed, here.copy_bytes, here.checkpoint.url.as_str()), (false, 0, url));
    let there = store.plan_restore("j1", "south").unwrap().unwrap();
    assert_eq!((there.copy_needed, there.copy_bytes), (true, 200_000_000));
    assert_eq!(there.copy_to.as_deref(), Some("s3://ckpt-south/fleet/j1"));
    assert_eq!(store.plan_restore("j2", "south").unwrap(), None);
}

#[tokio::test]
async fn site_default_prefixes_name_the_origin_and_user_so_a_store_can_scope_keys_by_user() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(config(tmp.path())).await;
    let script = b"#!/bin/sh\ntrain\n";
    d.assigned_as("k1", "alpha", None, script, Some("alice")).await;
    let w = d.work("alpha").await;
    let a = w.submit.iter().find(|a| a.fleet_job_id == "k1").unwrap();
    assert_eq!(a.request.fleet.ckpt.as_deref(), Some("s3://ckpt-east/fleet/beta/alice/k1"));
    let mine = "s3://ckpt-east/fleet/beta/alice/k1/ckpt-000000000001";
    assert_eq!(d.report("k1", &ckpt_auth("alpha", "k1"), &rep(mine, 1, 'a')).await.0, StatusCode::OK);
    // A run started before prefixes named their user still saves where it was told.
    let legacy = "s3://ckpt-east/fleet/k1/ckpt-000000000002";
    assert_eq!(d.report("k1", &ckpt_auth("alpha", "k1"), &rep(legacy, 2, 'b')).await.0, StatusCode::OK);
    // Another user's prefix, or another origin's, is not this job's.
    for other in
        ["s3://ckpt-east/fleet/beta/bob/k1/ckpt-000000000003", "s3://ckpt-east/fleet/alpha/alice/k1/ckpt-000000000003"]
    {
        check_status(
            d.report("k1", &ckpt_auth("alpha", "k1"), &rep(other, 3, 'c')).await,
            StatusCode::FORBIDDEN,
            "s3://ckpt-east/fleet/beta/alice/k1",
        );
    }
    // A move to another region copies into the user's prefix there.
    let c = d.assigned_as("k2", "gamma", None, script, Some("alice")).await;
    assert_eq!(c.target.as_deref(), Some("gamma"));
    let west = "s3://ckpt-west/fleet/beta/alice/k2/ckpt-000000000001";
    assert_eq!(d.report("k2", &job_auth("beta", "k2"), &rep(west, 1, 'e')).await.0, StatusCode::OK);
    let w = d.work("gamma").await;
    let a = w.submit.iter().find(|a| a.fleet_job_id == "k2").unwrap();
    assert_eq!(a.resume_copy_to.as_deref(), Some("s3://ckpt-south/fleet/beta/alice/k2"));
    // A name that cannot be one path component keeps the job-id prefix.
    for (id, user) in [("k3", "../bob"), ("k4", "a/b"), ("k5", "..")] {
        d.assigned_as(id, "alpha", None, script, Some(user)).await;
        let w = d.work("alpha").await;
        let a = w.submit.iter().find(|a| a.fleet_job_id == id).unwrap();
        assert_eq!(a.request.fleet.ckpt.as_deref(), Some(format!("s3://ckpt-east/fleet/{id}").as_str()), "{user}");
    }
    d.stop().await;
}

#[tokio::test]
async fn assignments_carry_the_checkpoint_prefix_and_what_to_resume_from() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(config(tmp.path())).await;
    // Site default of the target's region, under the job's id.
    d.assigned("j1", "alpha", None).await;
    let w = d.work("alpha").await;
    let a = w.submit.iter().find(|a| a.fleet_job_id == "j1").unwrap();
    assert_eq!(a.request.fleet.ckpt.as_deref(), Some("s3://ckpt-east/fleet/j1"));
    assert_eq!(a.request.fleet.resume_from, None, "no checkpoint yet");
    // A checkpoint in the target's region is resumed from in place.
    let url = "s3://ckpt-east/fleet/j1/ckpt-000000000003";
    assert_eq!(d.report("j1", &job_auth("beta", "j1"), &rep(url, 3, 'd')).await.0, StatusCode::OK);
    let w = d.work("alpha").await;
    assert_eq!(w.submit[0].request.fleet.resume_from.as_deref(), Some(url));

    // A checkpoint only in another region's store needs a copy first: the
    // assignment does not point at it.
    d.assigned("j3", "gamma", None).await;
    let west = "s3://ckpt-west/fleet/j3/ckpt-000000000001";
    assert_eq!(d.report("j3", &job_auth("beta", "j3"), &rep(west, 1, 'e')).await.0, StatusCode::OK);
    let w = d.work("gamma").await;
    let a = w.submit.iter().find(|a| a.fleet_job_id == "j3").unwrap();
    assert_eq!(a.request.fleet.ckpt.as_deref(), Some("s3://ckpt-south/fleet/j3"));
    assert_eq!(a.request.fleet.resume_from, None);
    // Once the copy is reported in the target's region, it is resumed from.
    let south = "s3://ckpt-south/fleet/j3/ckpt-000000000001";
    assert_eq!(d.report("j3", &bearer("gamma"), &rep(south, 1, 'e')).await.0, StatusCode::OK);
    let w = d.work("gamma").await;
    assert_eq!(w.submit[0].request.fleet.resume_from.as_deref(), Some(south));

    // The job's own --fleet-ckpt wins over the site default everywhere.
    d.assigned("j4", "alpha", Some("s3://my-bucket/run7/")).await;
    let w = d.work("alpha").await;
    let a = w.submit.iter().find(|a| a.fleet_job_id == "j4").unwrap();
    assert_eq!(a.request.fleet.ckpt.as_deref(), Some("s3://my-bucket/run7"));
    let own = "s3://my-bucket/run7/ckpt-000000000009";
    let c: Checkpoint = serde_json::from_value(d.report("j4", &bearer("alpha"), &rep(own, 9, 'f')).await.1).unwrap();
    assert_eq!(c.region, None, "the job's own store: no region, readable everywhere");
    // A site default is none of its prefixes: nothing there is its to
    // report (a target agent would copy it, with the site's credentials,
    // into the store the job named).
    let planted = rep("s3://ckpt-west/fleet/j4/ckpt-000000000010", 10, 'f');
    check_status(d.report("j4", &job_auth("beta", "j4"), &planted).await, StatusCode::FORBIDDEN, "not under");
    let w = d.work("alpha").await;
    let a = w.submit.iter().find(|a| a.fleet_job_id == "j4").unwrap();
    assert_eq!(a.request.fleet.resume_from.as_deref(), Some(own));

    // `#FLEET ckpt=` in the script declares it too; --fleet-ckpt wins over it.
    let script = b"#!/bin/sh\n#FLEET ckpt=s3://lab-bucket/j5-run\ntrain\n";
    d.assigned_with("j5", "alpha", None, script).await;
    d.assigned_with("j6", "alpha", Some("s3://opt-bucket/j6"), script).await;
    let w = d.work("alpha").await;
    let ckpt = |id: &str| w.submit.iter().find(|a| a.fleet_job_id == id).unwrap().request.fleet.ckpt.clone();
    assert_eq!(ckpt("j5").as_deref(), Some("s3://lab-bucket/j5-run"));
    assert_eq!(ckpt("j6").as_deref(), Some("s3://opt-bucket/j6"));
    let url = "s3://lab-bucket/j5-run/ckpt-000000000001";
    assert_eq!(d.report("j5", &bearer("alpha"), &rep(url, 1, 'a')).await.0, StatusCode::OK);
    d.stop().await;
}

#[tokio::test]
async fn a_checkpoint_token_reports_for_its_job_at_its_target_only() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(config(tmp.path())).await;
    d.assigned("ja", "alpha", None).await;
    d.assigned("jb", "alpha", None).await;
    let ra = rep("s3://ckpt-east/fleet/ja/ckpt-000000000001", 1, 'a');
    let rb = rep("s3://ckpt-east/fleet/jb/ckpt-000000000001", 1, 'b');

    // Job A's token, minted by its target alpha: A's checkpoints only.
    let c: Checkpoint = serde_json::from_value(d.report("ja", &ckpt_auth("alpha", "ja"), &ra).await.1).unwrap();
    assert_eq!((c.reported_by.as_str(), c.valid), ("job", true));
    check_status(d.report("jb", &ckpt_auth("alpha", "ja"), &rb).await, StatusCode::UNAUTHORIZED, "does not match");
    // Minted with another cluster's secret (not the target): refused.
    check_status(d.report("ja", &ckpt_auth("gamma", "ja"), &ra).await, StatusCode::FORBIDDEN, "does not run at gamma");
    // Nor is it a job token, nor a job token a checkpoint token.
    let as_job = format!("FleetJob {}", auth::ckpt_token(&token_of("alpha"), "ja"));
    check_status(d.report("ja", &as_job, &ra).await, StatusCode::UNAUTHORIZED, "does not match");
    let as_ckpt = format!("FleetCkpt {}", auth::job_token(&token_of("beta"), "ja"));
    check_status(d.report("ja", &as_ckpt, &ra).await, StatusCode::UNAUTHORIZED, "does not match");
    // It does nothing but post checkpoints: no reads, no control.
    for (method, path) in [
        (Method::GET, "/v1/jobs/ja/checkpoints"),
        (Method::GET, "/v1/jobs/ja"),
        (Method::POST, "/v1/jobs/ja/cancel"),
        (Method::POST, "/v1/jobs/ja/start"),
        (Method::GET, "/v1/jobs/ja/output?stream=stdout&offset=0"),
    ] {
        let (s, v) = d.call(method.clone(), path, &ckpt_auth("alpha", "ja"), Some(serde_json::json!({}))).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path}: {v}");
    }
    assert_eq!(d.catalog("jb", "Bearer admin-secret").await, vec![], "nothing posted for B");

    // A copy for a resume: the target reports it with where it came from
    // and how long it took; a copy of something the catalog lacks, or
    // with another manifest, is refused.
    d.assigned("jc", "gamma", None).await;
    let west = rep("s3://ckpt-west/fleet/jc/ckpt-000000000004", 4, 'c');
    assert_eq!(d.report("jc", &ckpt_auth("gamma", "jc"), &west).await.0, StatusCode::OK);
    let w = d.work("gamma").await;
    let a = w.submit.iter().find(|a| a.fleet_job_id == "jc").unwrap();
    assert_eq!(a.resume_from.as_deref(), Some(west.url.as_str()));
    assert_eq!(a.resume_copy_to.as_deref(), Some("s3://ckpt-south/fleet/jc"));
    assert_eq!((a.resume_bytes, a.request.fleet.resume_from.as_deref()), (200_000_000, None));
    let copy = |from: &str, sha: char| CheckpointReport {
        copied_from: Some(from.into()),
        copy_seconds: Some(6.5),
        ..rep("s3://ckpt-south/fleet/jc/ckpt-000000000004", 4, sha)
    };
    check_status(
        d.report("jc", &bearer("gamma"), &copy("s3://x/y", 'c')).await,
        StatusCode::BAD_REQUEST,
        "not a checkpoint of jc",
    );
    check_status(
        d.report("jc", &bearer("gamma"), &copy(&west.url, 'd')).await,
        StatusCode::BAD_REQUEST,
        "another seq or manifest",
    );
    let bad_time = CheckpointReport { copy_seconds: Some(-1.0), ..copy(&west.url, 'c') };
    let (s, _) = d
        .call(Method::POST, "/v1/jobs/jc/checkpoints", &bearer("gamma"), Some(serde_json::to_value(&bad_time).unwrap()))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let c: Checkpoint =
        serde_json::from_value(d.report("jc", &bearer("gamma"), &copy(&west.url, 'c')).await.1).unwrap();
    assert_eq!(
        (c.region.as_deref(), c.copied_from.as_deref(), c.copy_seconds),
        (Some("south"), Some(west.url.as_str()), Some(6.5))
    );
    // Now the assignment resumes from the copy, in place.
    let w = d.work("gamma").await;
    let a = w.submit.iter().find(|a| a.fleet_job_id == "jc").unwrap();
    assert_eq!(a.resume_from.as_deref(), Some("s3://ckpt-south/fleet/jc/ckpt-000000000004"));
    assert_eq!(a.resume_copy_to, None);
    assert_eq!(a.request.fleet.resume_from, a.resume_from);
    d.stop().await;
}
