//! Drive a real fleet-metasched over HTTP.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_api::api::{
    AgentWork, FleetView, ForwardRequest, Heartbeat, JobRecord, NodeCapacity, OutputChunk, SignalOrder, SignalScope,
    StartCheck, StartConfirmation, StartRequest, StatusUpdate, Stream,
};
use fleet_api::{auth, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config};
use fleet_metasched::Clock;
use reqwest::StatusCode;
use serde_json::Value;

const CLUSTERS: [(&str, &str); 3] = [("alpha", "h100"), ("beta", "a100"), ("gamma", "h100")];

struct Daemon {
    url: String,
    dir: PathBuf,
    clock: Clock,
    control: fleet_metasched::Control,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    http: reqwest::Client,
}

fn token_of(name: &str) -> String {
    format!("secret-{name}")
}

fn config(dir: &Path) -> Config {
    std::fs::write(dir.join("admin.token"), "admin-secret\n").unwrap();
    let clusters = CLUSTERS
        .iter()
        .map(|(n, _)| {
            let p = dir.join(format!("{n}.token"));
            std::fs::write(&p, format!("  {}\n", token_of(n))).unwrap();
            ClusterConfig {
                name: n.to_string(),
                region: format!("r-{n}"),
                provider: "onprem".into(),
                token_file: p,
                ..Default::default()
            }
        })
        .collect();
    Config {
        heartbeat_timeout_s: 10.0,
        clusters,
        ..Config::new("127.0.0.1:0".parse().unwrap(), dir.join("state"), dir.join("admin.token"))
    }
}

impl Daemon {
    async fn start(dir: &Path, clock: Clock) -> Daemon {
        Daemon::start_with(dir, clock, config(dir)).await
    }

    async fn start_with(dir: &Path, clock: Clock, config: Config) -> Daemon {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let control = fleet_metasched::Control::default();
        let handle = tokio::spawn(fleet_metasched::run_with(listener, config, clock.clone(), control.clone(), async {
            let _ = rx.await;
        }));
        Daemon { url, dir: dir.to_path_buf(), clock, control, stop: Some(tx), handle, http: reqwest::Client::new() }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.handle.await.unwrap().unwrap();
    }

    fn req(&self, method: reqwest::Method, path: &str, auth: &str) -> reqwest::RequestBuilder {
        let b = self.http.request(method, format!("{}{path}", self.url));
        if auth.is_empty() {
            b
        } else {
            b.header("Authorization", auth)
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, auth: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut b = self.req(method, path, auth);
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
        method: reqwest::Method,
        path: &str,
        auth: &str,
        body: Option<Value>,
    ) -> T {
        let (s, v) = self.call(method, path, auth, body).await;
        assert!(s.is_success(), "{path}: {s} {v}");
        serde_json::from_value(v).unwrap()
    }

    async fn heartbeat(&self, cluster: &str, free: u32) -> FleetView {
        self.heartbeat_holding(cluster, free, None).await
    }

    /// A heartbeat that publishes GPU quotas.
    async fn heartbeat_quotas(&self, cluster: &str, free: u32, quotas: Vec<fleet_api::api::GpuQuota>) -> FleetView {
        self.heartbeat_full(cluster, free, None, Some(quotas)).await
    }

    /// A heartbeat that names the runs holding GPUs (`(job, epoch)`).
    async fn heartbeat_holding(&self, cluster: &str, free: u32, holding: Option<&[(&str, u64)]>) -> FleetView {
        self.heartbeat_full(cluster, free, holding, None).await
    }

    async fn heartbeat_full(
        &self,
        cluster: &str,
        free: u32,
        holding: Option<&[(&str, u64)]>,
        gpu_quotas: Option<Vec<fleet_api::api::GpuQuota>>,
    ) -> FleetView {
        let ty = CLUSTERS.iter().find(|c| c.0 == cluster).unwrap().1;
        let nodes = (0..2)
            .map(|i| NodeCapacity {
                name: format!("{cluster}-n{i}"),
                partitions: vec!["gpu".into()],
                gpu_type: Some(ty.into()),
                gpus_total: 8,
                gpus_free: if i == 0 { free.min(8) } else { free.saturating_sub(8) },
                state: "idle".into(),
                switch: None,
                ..Default::default()
            })
            .collect();
        let hb = Heartbeat {
            cluster: cluster.into(),
            region: String::new(),
            provider: String::new(),
            scheduler: "slurm".into(),
            nodes,
            queue_pending: 1,
            queue_running: 2,
            agent_version: "test".into(),
            holding: holding.map(|h| {
                h.iter().map(|(job, epoch)| fleet_api::api::RunRef { job: job.to_string(), epoch: *epoch }).collect()
            }),
            gpu_quotas,
            ..Default::default()
        };
        self.ok(reqwest::Method::POST, "/v1/heartbeat", &bearer(cluster), Some(serde_json::to_value(hb).unwrap())).await
    }

    async fn forward(&self, id: &str, origin: &str, gpu: &str, n: u32) -> JobRecord {
        let fwd = ForwardRequest {
            fleet_job_id: id.into(),
            request: request(origin, gpu, n),
            tentative_target: "alpha".into(),
            early_start: false,
        };
        self.ok(reqwest::Method::POST, "/v1/jobs", &bearer(origin), Some(serde_json::to_value(fwd).unwrap())).await
    }

    /// The stand-in's `POST /start` (with Slurm job id `stand_in`).
    async fn request_start(&self, id: &str, origin: &str, stand_in: u64) -> (StatusCode, Value) {
        let body = serde_json::to_value(StartRequest { origin_job_id: stand_in, ..Default::default() }).unwrap();
        self.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/start"), &job_auth(origin, id), Some(body)).await
    }

    /// A `POST /confirm_start` with `auth`.
    async fn confirm(&self, id: &str, auth: &str, stand_in: u64, started: bool) -> (StatusCode, Value) {
        let body = StartConfirmation { origin_job_id: stand_in, started, reason: "test".into(), ..Default::default() };
        self.call(
            reqwest::Method::POST,
            &format!("/v1/jobs/{id}/confirm_start"),
            auth,
            Some(serde_json::to_value(body).unwrap()),
        )
        .await
    }

    /// Start a job as stand-in 42 would and its origin agent confirm it.
    async fn start_job(&self, id: &str, origin: &str) -> JobRecord {
        let (s, v) = self.request_start(id, origin, 42).await;
        let r: JobRecord = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{s} {v}: {e}"));
        if r.state != JobState::Held {
            assert_eq!(s, StatusCode::OK, "{v}");
            return r;
        }
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        let check = StartCheck { fleet_job_id: id.into(), origin_job_id: 42, ..Default::default() };
        assert!(self.work(origin).await.confirm_start.contains(&check), "the origin agent is asked to confirm {id}");
        let (s, v) = self.confirm(id, &bearer(origin), 42, true).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        serde_json::from_value(v).unwrap()
    }

    async fn job(&self, id: &str) -> JobRecord {
        self.ok(reqwest::Method::GET, &format!("/v1/jobs/{id}"), "Bearer admin-secret", None).await
    }

    async fn work(&self, cluster: &str) -> AgentWork {
        self.ok(reqwest::Method::GET, "/v1/agent/work", &bearer(cluster), None).await
    }

    async fn status(&self, id: &str, cluster: &str, upd: StatusUpdate) -> (StatusCode, Value) {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/jobs/{id}/status"),
            &bearer(cluster),
            Some(serde_json::to_value(upd).unwrap()),
        )
        .await
    }

    async fn status_raw(&self, id: &str, cluster: &str, body: Value) -> (StatusCode, Value) {
        self.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/status"), &bearer(cluster), Some(body)).await
    }

    async fn chunk(&self, id: &str, cluster: &str, stream: Stream, offset: u64, data: &[u8]) -> (StatusCode, Value) {
        let c = OutputChunk { stream, offset, data: data.to_vec(), epoch: None };
        self.call(
            reqwest::Method::POST,
            &format!("/v1/jobs/{id}/output"),
            &bearer(cluster),
            Some(serde_json::to_value(c).unwrap()),
        )
        .await
    }

    async fn read_output(&self, id: &str, origin: &str, stream: &str, offset: u64, max: u64) -> Vec<u8> {
        let r = self
            .req(
                reqwest::Method::GET,
                &format!("/v1/jobs/{id}/output?stream={stream}&offset={offset}&max={max}"),
                &job_auth(origin, id),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.bytes().await.unwrap().to_vec()
    }
}

fn bearer(cluster: &str) -> String {
    format!("Bearer {}", token_of(cluster))
}

fn job_auth(origin: &str, id: &str) -> String {
    format!("FleetJob {}", auth::job_token(&token_of(origin), id))
}

fn request(origin: &str, gpu: &str, n: u32) -> JobRequest {
    JobRequest {
        origin: origin.into(),
        user_id: 1000,
        time_limit_min: Some(60),
        gpus: vec![GpuRequest { gpu_type: Some(gpu.into()), count: n, scope: GpuScope::Node }],
        script: Some(b"#!/bin/sh\necho hi\n\xff".to_vec()),
        ..Default::default()
    }
}

fn st(state: JobState) -> StatusUpdate {
    StatusUpdate { remote_job_id: Some(7), state: Some(state), node_list: "alpha-n0".into(), ..Default::default() }
}

async fn fleet(dir: &Path) -> Daemon {
    let d = Daemon::start(dir, Clock::default()).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    d
}

#[tokio::test]
async fn health_and_metrics_need_no_token() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    let (s, v) = d.call(reqwest::Method::GET, "/health", "", None).await;
    assert_eq!((s, v), (StatusCode::OK, Value::String("ok".into())));
    d.forward("m1", "beta", "h100", 8).await;
    let (s, v) = d.call(reqwest::Method::GET, "/metrics", "", None).await;
    assert_eq!(s, StatusCode::OK);
    let text = v.as_str().unwrap();
    assert!(text.contains("fleet_metasched_jobs{state=\"held\"} 1"), "{text}");
    assert!(text.contains("fleet_metasched_heartbeats_total{cluster=\"alpha\"} 1"), "{text}");
    assert!(text.contains("fleet_metasched_api_requests_total{route=\"/v1/jobs\",status=\"200\"} 1"), "{text}");
    d.stop().await;
}

#[tokio::test]
async fn auth_matrix() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("j1", "beta", "h100", 8).await;
    d.forward("j2", "beta", "h100", 8).await;
    use reqwest::Method as M;
    let body_start = Some(serde_json::json!({"origin_job_id": 5}));
    let cases: Vec<(M, &str, String, Option<Value>, StatusCode)> = vec![
        (M::GET, "/v1/jobs/j1", String::new(), None, StatusCode::UNAUTHORIZED),
        (M::GET, "/v1/jobs/j1", "Bearer nope".into(), None, StatusCode::UNAUTHORIZED),
        (M::GET, "/v1/jobs/j1", "Basic abc".into(), None, StatusCode::UNAUTHORIZED),
        (M::GET, "/v1/jobs/j1", "Bearer admin-secret".into(), None, StatusCode::OK),
        (M::GET, "/v1/jobs/j1", bearer("beta"), None, StatusCode::OK),
        // gamma is neither origin nor target
        (M::GET, "/v1/jobs/j1", bearer("gamma"), None, StatusCode::FORBIDDEN),
        (M::GET, "/v1/jobs/j1", job_auth("beta", "j1"), None, StatusCode::OK),
        // job token for another job, or minted with the wrong cluster's secret
        (M::GET, "/v1/jobs/j1", job_auth("beta", "j2"), None, StatusCode::UNAUTHORIZED),
        (M::GET, "/v1/jobs/j1", job_auth("alpha", "j1"), None, StatusCode::UNAUTHORIZED),
        (M::GET, "/v1/jobs/nope", "Bearer admin-secret".into(), None, StatusCode::NOT_FOUND),
        (M::GET, "/v1/jobs/nope", job_auth("beta", "nope"), None, StatusCode::NOT_FOUND),
        (M::GET, "/v1/jobs", job_auth("beta", "j1"), None, StatusCode::UNAUTHORIZED),
        (M::GET, "/v1/jobs", "Bearer admin-secret".into(), None, StatusCode::OK),
        (M::GET, "/v1/clusters", bearer("alpha"), None, StatusCode::OK),
        (M::GET, "/v1/clusters", String::new(), None, StatusCode::UNAUTHORIZED),
        (M::GET, "/v1/agent/work", "Bearer admin-secret".into(), None, StatusCode::FORBIDDEN),
        (M::POST, "/v1/jobs/j1/start", bearer("alpha"), body_start.clone(), StatusCode::FORBIDDEN),
        (M::POST, "/v1/jobs/j1/start", job_auth("beta", "j2"), body_start.clone(), StatusCode::UNAUTHORIZED),
        (M::POST, "/v1/jobs/j1/cancel", bearer("gamma"), None, StatusCode::FORBIDDEN),
        // a job token does not open cluster endpoints
        (
            M::POST,
            "/v1/jobs/j1/status",
            job_auth("beta", "j1"),
            Some(serde_json::json!({"remote_job_id": 1, "state": "running"})),
            StatusCode::FORBIDDEN,
        ),
        (
            M::POST,
            "/v1/heartbeat",
            bearer("alpha"),
            Some(
                serde_json::json!({"cluster": "beta", "scheduler": "slurm", "nodes": [], "queue_pending": 0, "queue_running": 0, "agent_version": "x"}),
            ),
            StatusCode::FORBIDDEN,
        ),
        (
            M::POST,
            "/v1/heartbeat",
            bearer("alpha"),
            Some(serde_json::json!({"cluster": "alpha"})),
            StatusCode::BAD_REQUEST,
        ),
        (
            M::POST,
            "/v1/jobs",
            bearer("alpha"),
            Some(
                serde_json::to_value(ForwardRequest {
                    fleet_job_id: "x".into(),
                    request: request("beta", "h100", 1),
                    tentative_target: "alpha".into(),
                    early_start: false,
                })
                .unwrap(),
            ),
            StatusCode::FORBIDDEN,
        ),
        (
            M::POST,
            "/v1/jobs",
            bearer("beta"),
            Some(
                serde_json::to_value(ForwardRequest {
                    fleet_job_id: "../x".into(),
                    request: request("beta", "h100", 1),
                    tentative_target: "alpha".into(),
                    early_start: false,
                })
                .unwrap(),
            ),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (m, path, auth, body, want) in cases {
        let (got, v) = d.call(m.clone(), path, &auth, body).await;
        assert_eq!(got, want, "{m} {path} with {auth:?}: {v}");
        if !got.is_success() {
            assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{m} {path}: error body {v}");
        }
    }
    // The job target may post status; others may not.
    d.start_job("j1", "beta").await;
    assert_eq!(d.status("j1", "gamma", st(JobState::Pending)).await.0, StatusCode::FORBIDDEN);
    assert_eq!(d.status("j1", "beta", st(JobState::Pending)).await.0, StatusCode::FORBIDDEN);
    assert_eq!(d.chunk("j1", "beta", Stream::Stdout, 0, b"x").await.0, StatusCode::FORBIDDEN);
    assert_eq!(d.status("j1", "alpha", st(JobState::Pending)).await.0, StatusCode::OK);
    // A cluster lists only its own jobs.
    let listed: Vec<JobRecord> = d.ok(M::GET, "/v1/jobs", &bearer("gamma"), None).await;
    assert!(listed.is_empty());
    let listed: Vec<JobRecord> = d.ok(M::GET, "/v1/jobs?state=pending", &bearer("alpha"), None).await;
    assert_eq!(listed.iter().map(|j| j.fleet_job_id.as_str()).collect::<Vec<_>>(), ["j1"]);
    // The origin's reconciler asks for its jobs that may still run.
    let ids = |l: Vec<JobRecord>| l.into_iter().map(|j| j.fleet_job_id).collect::<Vec<_>>();
    let active: Vec<JobRecord> = d.ok(M::GET, "/v1/jobs?origin=beta&active=true", &bearer("beta"), None).await;
    assert!(ids(active).contains(&"j1".to_string()));
    let done = StatusUpdate {
        final_stdout_len: Some(0),
        final_stderr_len: Some(0),
        exit_code: Some(0),
        ..st(JobState::Completed)
    };
    assert_eq!(d.status("j1", "alpha", done).await.0, StatusCode::OK);
    let active: Vec<JobRecord> = d.ok(M::GET, "/v1/jobs?origin=beta&active=true", &bearer("beta"), None).await;
    assert!(!ids(active).contains(&"j1".to_string()));
    let finished: Vec<JobRecord> = d.ok(M::GET, "/v1/jobs?origin=beta&active=false", &bearer("beta"), None).await;
    assert_eq!(ids(finished), ["j1"]);
    d.stop().await;
}

#[tokio::test]
async fn full_lifecycle_with_output() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    let r = d.forward("life", "beta", "h100", 8).await;
    assert_eq!(r.state, JobState::Held);
    assert_eq!(r.summary, "gpu:h100:8 on 1 node(s), 60 min");
    // Held jobs are nobody's work yet.
    assert!(d.work("alpha").await.submit.is_empty());
    let r = d.start_job("life", "beta").await;
    assert_eq!((r.state, r.target.as_deref(), r.origin_job_id), (JobState::Assigned, Some("alpha"), Some(42)));
    assert!(r.reason.contains("alpha"), "{}", r.reason);
    // Idempotent start.
    assert_eq!(d.start_job("life", "beta").await.state, JobState::Assigned);
    let w = d.work("alpha").await;
    assert_eq!(w.submit.len(), 1);
    assert_eq!(w.submit[0].request, request("beta", "h100", 8));
    assert!(d.work("gamma").await.submit.is_empty());

    let (s, v) = d.status("life", "alpha", st(JobState::Pending)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(d.work("alpha").await.submit.is_empty(), "acknowledged");
    assert_eq!(d.status("life", "alpha", st(JobState::Running)).await.0, StatusCode::OK);
    assert_eq!(d.status("life", "alpha", st(JobState::Running)).await.0, StatusCode::OK, "idempotent repeat");
    // The run's limit there, and a change of it, reach the record (its
    // stand-in's proxy mails the job's TIME_LIMIT_* shares of it).
    assert_eq!(d.job("life").await.time_limit_min, None);
    for m in [30, 45] {
        let (s, v) = d.status("life", "alpha", StatusUpdate { time_limit_min: Some(m), ..st(JobState::Running) }).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(d.job("life").await.time_limit_min, Some(m));
    }
    assert_eq!(d.status("life", "alpha", st(JobState::Queued)).await.0, StatusCode::BAD_REQUEST);

    assert_eq!(d.chunk("life", "alpha", Stream::Stdout, 0, b"hello ").await.0, StatusCode::OK);
    assert_eq!(d.chunk("life", "alpha", Stream::Stdout, 6, b"world\n").await.0, StatusCode::OK);
    assert_eq!(d.chunk("life", "alpha", Stream::Stderr, 0, b"\xffwarn\n").await.0, StatusCode::OK);
    let done = StatusUpdate {
        exit_code: Some(3),
        final_stdout_len: Some(14),
        final_stderr_len: Some(6),
        ..st(JobState::Completed)
    };
    let (s, v) = d.status("life", "alpha", done.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let r: JobRecord = serde_json::from_value(v).unwrap();
    assert_eq!((r.state, r.exit_code, r.output_complete), (JobState::Completed, Some(3), false));
    assert_eq!(d.chunk("life", "alpha", Stream::Stdout, 12, b"!!").await.0, StatusCode::OK);
    let r = d.job("life").await;
    assert_eq!((r.stdout_len, r.stderr_len, r.output_complete), (14, 6, true));
    assert_eq!((r.remote_job_id, r.node_list.as_str()), (Some(7), "alpha-n0"));
    assert_eq!(d.status("life", "alpha", done).await.0, StatusCode::OK, "terminal repeat");
    let (s, v) = d.status("life", "alpha", st(JobState::Running)).await;
    assert_eq!((s, &v["terminal"]), (StatusCode::CONFLICT, &Value::Bool(true)), "terminal is final: {v}");
    // A disagreeing terminal report is answered with the stored outcome.
    let (s, v) = d.status("life", "alpha", StatusUpdate { exit_code: Some(9), ..st(JobState::Failed) }).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let r: JobRecord = serde_json::from_value(v).unwrap();
    assert_eq!((r.state, r.exit_code), (JobState::Completed, Some(3)));

    assert_eq!(d.read_output("life", "beta", "stdout", 0, 100).await, b"hello world\n!!");
    assert_eq!(d.read_output("life", "beta", "stdout", 6, 3).await, b"wor");
    assert_eq!(d.read_output("life", "beta", "stdout", 100, 3).await, b"");
    assert_eq!(d.read_output("life", "beta", "stderr", 0, 100).await, b"\xffwarn\n");
    d.stop().await;
}

/// `scontrol requeue` of the stand-in at the origin: the proxy cancels the
/// run, and the stand-in's restart asks for a rerun (`restart` in its
/// start request). The job is held again, confirmed by the origin agent
/// for that restart only, reassigned with its output continuing where
/// the first run's ended, and runs to a new outcome.
#[tokio::test]
async fn a_requeued_stand_in_reruns_its_job_and_the_streams_continue() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("rq", "beta", "h100", 8).await;
    d.start_job("rq", "beta").await;
    assert_eq!(d.status("rq", "alpha", st(JobState::Running)).await.0, StatusCode::OK);
    assert_eq!(d.chunk("rq", "alpha", Stream::Stdout, 0, b"run 1\n").await.0, StatusCode::OK);
    let rerun = |restart| serde_json::to_value(StartRequest { origin_job_id: 42, restart }).unwrap();
    let start_path = "/v1/jobs/rq/start";
    // Still running at alpha (the proxy could not cancel it): cancelled there first.
    let (s, v) = d.call(reqwest::Method::POST, start_path, &job_auth("beta", "rq"), Some(rerun(1))).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("previous run is being cancelled"), "{v}");
    assert_eq!(d.work("alpha").await.cancel, ["rq"]);
    let ended = StatusUpdate { final_stdout_len: Some(6), final_stderr_len: Some(0), ..st(JobState::Cancelled) };
    assert_eq!(d.status("rq", "alpha", ended).await.0, StatusCode::OK);
    // Now the rerun: held again for restart 1, the first run's outcome forgotten.
    let (s, v) = d.call(reqwest::Method::POST, start_path, &job_auth("beta", "rq"), Some(rerun(1))).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let r: JobRecord = serde_json::from_value(v).unwrap();
    assert_eq!((r.state, r.origin_restart, r.requeues), (JobState::Held, 1, 1));
    assert_eq!((r.target, r.remote_job_id, r.exit_code, r.output_complete), (None, None, None, false));
    assert_eq!((r.stdout_base, r.stderr_base, r.stdout_len), (6, 0, 6));
    // The origin agent is asked to confirm restart 1 of stand-in 42.
    let check = StartCheck { fleet_job_id: "rq".into(), origin_job_id: 42, restart: 1 };
    assert!(d.work("beta").await.confirm_start.contains(&check));
    // A repeat of the same restart is not a second rerun.
    let (s, v) = d.call(reqwest::Method::POST, start_path, &job_auth("beta", "rq"), Some(rerun(1))).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(d.job("rq").await.requeues, 1);
    let (s, v) = d.confirm("rq", &bearer("beta"), 42, true).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let w = d.work("alpha").await;
    assert_eq!(w.submit.len(), 1, "{w:?}");
    assert_eq!((w.submit[0].origin_restart, w.submit[0].stdout_base, w.submit[0].stderr_base), (1, 6, 0));
    // The second run reports under a new id; its output continues the stream.
    let second = StatusUpdate { remote_job_id: Some(8), ..st(JobState::Running) };
    assert_eq!(d.status("rq", "alpha", second).await.0, StatusCode::OK);
    assert_eq!(d.chunk("rq", "alpha", Stream::Stdout, 6, b"run 2\n").await.0, StatusCode::OK);
    let done = StatusUpdate {
        remote_job_id: Some(8),
        exit_code: Some(3),
        final_stdout_len: Some(12),
        final_stderr_len: Some(0),
        ..st(JobState::Failed)
    };
    assert_eq!(d.status("rq", "alpha", done).await.0, StatusCode::OK);
    let r = d.job("rq").await;
    assert_eq!((r.state, r.exit_code, r.remote_job_id, r.output_complete), (JobState::Failed, Some(3), Some(8), true));
    assert_eq!(d.read_output("rq", "beta", "stdout", 0, 100).await, b"run 1\nrun 2\n");
    assert_eq!(d.read_output("rq", "beta", "stdout", r.stdout_base, 100).await, b"run 2\n");
    // Another stand-in's restart cannot rerun it.
    let other = serde_json::to_value(StartRequest { origin_job_id: 43, restart: 2 }).unwrap();
    let (s, v) = d.call(reqwest::Method::POST, start_path, &job_auth("beta", "rq"), Some(other)).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    // The job token alone asks for a rerun that Slurm never made: held
    // until the origin agent answers, and as it was once it refuses.
    let (s, v) = d.call(reqwest::Method::POST, start_path, &job_auth("beta", "rq"), Some(rerun(2))).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(d.job("rq").await.state, JobState::Held);
    let (s, v) = d.confirm("rq", &bearer("beta"), 42, false).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let after = d.job("rq").await;
    assert_eq!(
        (after.state, after.exit_code, after.remote_job_id, after.target.as_deref(), after.output_complete),
        (JobState::Failed, Some(3), Some(8), Some("alpha"), true)
    );
    assert_eq!((after.origin_restart, after.requeues, after.stdout_base, after.start_requested_at), (1, 1, 6, None));
    assert_eq!(d.read_output("rq", "beta", "stdout", after.stdout_base, 100).await, b"run 2\n");
    assert!(d.work("beta").await.confirm_start.is_empty());
    d.stop().await;
}

/// A target's report reaches squeue at the origin (the stand-in's comment)
/// and fleetctl: its reason and node list keep no control characters
/// (terminal escapes), whatever text the target's scheduler passed on.
#[tokio::test]
async fn reported_reasons_and_node_lists_lose_their_control_characters() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("esc", "beta", "h100", 8).await;
    d.start_job("esc", "beta").await;
    let upd = StatusUpdate {
        reason: "Resources\u{1b}]0;owned\u{7}\n\u{1b}[2J".into(),
        node_list: "a-n0\u{1b}[31m".into(),
        ..st(JobState::Pending)
    };
    assert_eq!(d.status("esc", "alpha", upd).await.0, StatusCode::OK);
    let r = d.job("esc").await;
    assert_eq!((r.reason.as_str(), r.node_list.as_str()), ("Resources]0;owned[2J", "a-n0[31m"));
    d.stop().await;
}

#[tokio::test]
async fn chunks_overlap_and_gaps_and_idempotent_forward() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    let a = d.forward("c1", "beta", "h100", 8).await;
    let b = d.forward("c1", "beta", "h100", 8).await;
    assert_eq!(a, b, "POST /v1/jobs is idempotent");
    // Same id from another origin is a conflict.
    let fwd = ForwardRequest {
        fleet_job_id: "c1".into(),
        request: request("gamma", "h100", 8),
        tentative_target: "alpha".into(),
        early_start: false,
    };
    let (s, _) =
        d.call(reqwest::Method::POST, "/v1/jobs", &bearer("gamma"), Some(serde_json::to_value(fwd).unwrap())).await;
    assert_eq!(s, StatusCode::CONFLICT);
    d.start_job("c1", "beta").await;

    // (offset, data, expected status, expected stdout afterwards)
    let table: &[(u64, &[u8], u16, &[u8])] = &[
        (0, b"abcd", 200, b"abcd"),
        (0, b"abcd", 200, b"abcd"),   // exact repeat
        (2, b"cdef", 200, b"abcdef"), // overlap trimmed
        (1, b"bc", 200, b"abcdef"),   // entirely held
        (8, b"zz", 409, b"abcdef"),   // gap
        (6, b"", 200, b"abcdef"),     // empty
        (6, b"g", 200, b"abcdefg"),
    ];
    for (offset, data, want, after) in table {
        let (s, v) = d.chunk("c1", "alpha", Stream::Stdout, *offset, data).await;
        assert_eq!(s.as_u16(), *want, "chunk at {offset}: {v}");
        if *want == 409 {
            assert_eq!(v["expected_offset"], 6, "{v}");
            assert!(v["error"].as_str().unwrap().contains("expected offset 6"), "{v}");
        }
        assert_eq!(d.read_output("c1", "beta", "stdout", 0, 100).await, *after);
    }
    let (s, v) = d
        .call(
            reqwest::Method::POST,
            "/v1/jobs/c1/output",
            &bearer("alpha"),
            Some(serde_json::json!({"stream": "stdout", "offset": 0, "data": "***"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("invalid output chunk"), "{v}");
    d.stop().await;
}

#[tokio::test]
async fn cancel_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    // Held → Cancelled directly.
    d.forward("k1", "beta", "h100", 8).await;
    let r: JobRecord = d.ok(reqwest::Method::POST, "/v1/jobs/k1/cancel", &job_auth("beta", "k1"), None).await;
    assert_eq!((r.state, r.cancel_requested, r.output_complete), (JobState::Cancelled, true, true));
    // Starting a cancelled job leaves it cancelled.
    assert_eq!(d.start_job("k1", "beta").await.state, JobState::Cancelled);

    // Assigned, not yet submitted → Cancelled, and never handed out.
    d.forward("k2", "beta", "h100", 8).await;
    d.start_job("k2", "beta").await;
    let r: JobRecord = d.ok(reqwest::Method::POST, "/v1/jobs/k2/cancel", &bearer("beta"), None).await;
    assert_eq!(r.state, JobState::Cancelled);
    assert!(d.work("alpha").await.submit.is_empty());
    // The agent had in fact submitted it: it is told to cancel it.
    let (s, _) = d.status("k2", "alpha", st(JobState::Pending)).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(d.work("alpha").await.cancel, ["k2"]);
    assert_eq!(d.status("k2", "alpha", st(JobState::Cancelled)).await.0, StatusCode::OK);
    assert!(d.work("alpha").await.cancel.is_empty());

    // Submitted → cancel_requested, shows up in the target's work.
    d.forward("k3", "beta", "h100", 8).await;
    d.start_job("k3", "beta").await;
    d.status("k3", "alpha", st(JobState::Running)).await;
    let r: JobRecord = d.ok(reqwest::Method::POST, "/v1/jobs/k3/cancel", "Bearer admin-secret", None).await;
    assert_eq!((r.state, r.cancel_requested), (JobState::Running, true));
    assert_eq!(d.work("alpha").await, AgentWork { cancel: vec!["k3".into()], ..Default::default() });
    let fin = StatusUpdate {
        final_stdout_len: Some(0),
        final_stderr_len: Some(0),
        signal: Some(15),
        ..st(JobState::Cancelled)
    };
    assert_eq!(d.status("k3", "alpha", fin).await.0, StatusCode::OK);
    let r = d.job("k3").await;
    assert_eq!((r.state, r.signal, r.output_complete), (JobState::Cancelled, Some(15), true));
    assert!(d.work("alpha").await.cancel.is_empty());
    d.stop().await;
}

#[tokio::test]
async fn impossible_placement_fails_the_job() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("big", "beta", "h100", 64).await;
    let r = d.start_job("big", "beta").await;
    assert_eq!(r.state, JobState::Failed);
    assert!(r.output_complete);
    assert!(r.reason.contains("no cluster in the fleet can run gpu:h100:64"), "{}", r.reason);
    let e: fleet_metasched::store::Explanation =
        d.ok(reqwest::Method::GET, "/v1/jobs/big/explain", &job_auth("beta", "big"), None).await;
    assert_eq!(e.placement, "impossible");
    let ex: Vec<_> = e.exclusions.iter().map(|x| x.cluster.as_str()).collect();
    assert_eq!(ex, ["alpha", "beta", "gamma"]);
    assert!(e.exclusions[0].reason.contains("at most 8 h100 per node"), "{:?}", e.exclusions);
    // A job that fits at home runs at home (the origin agent is the target).
    d.forward("small", "beta", "a100", 4).await;
    let r = d.start_job("small", "beta").await;
    assert_eq!((r.state, r.target.as_deref()), (JobState::Assigned, Some("beta")));
    assert_eq!(d.work("beta").await.submit.len(), 1);
    d.stop().await;
}

#[tokio::test]
async fn silent_clusters_become_unhealthy_and_jobs_move() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(tmp.path(), Clock::default()).await;
    let view: FleetView = d.ok(reqwest::Method::GET, "/v1/clusters", "Bearer admin-secret", None).await;
    assert_eq!(view.clusters.len(), 3);
    assert!(view.clusters.iter().all(|c| !c.healthy), "never heard from = unhealthy");
    d.heartbeat("alpha", 16).await;
    d.heartbeat("beta", 16).await;
    d.heartbeat("gamma", 8).await;
    let v: FleetView = d.ok(reqwest::Method::GET, "/v1/clusters", &bearer("beta"), None).await;
    let alpha = &v.clusters[0];
    assert!(alpha.healthy);
    assert_eq!(
        (alpha.gpus[0].total, alpha.gpus[0].free, alpha.gpus[0].nodes, alpha.region.as_str()),
        (16, 16, 2, "r-alpha")
    );

    d.forward("mv", "beta", "h100", 8).await;
    assert_eq!(d.start_job("mv", "beta").await.target.as_deref(), Some("alpha"));
    // alpha goes silent; the others keep beating.
    d.clock.advance(Duration::from_secs(6));
    d.heartbeat("beta", 16).await;
    d.heartbeat("gamma", 8).await;
    d.clock.advance(Duration::from_secs(6));
    let v: FleetView = d.ok(reqwest::Method::GET, "/v1/clusters", "Bearer admin-secret", None).await;
    assert!(!v.clusters[0].healthy && v.clusters[0].heartbeat_age_s >= 12.0, "{:?}", v.clusters[0]);
    assert!(v.clusters[1].healthy);
    // The job was not submitted at alpha: it is re-placed on gamma.
    assert_eq!(d.work("gamma").await.submit.len(), 1);
    let r = d.job("mv").await;
    assert_eq!((r.state, r.target.as_deref()), (JobState::Assigned, Some("gamma")));
    assert!(r.reason.contains("alpha became unhealthy"), "{}", r.reason);

    // Everyone silent: a new job waits instead of failing, then runs.
    d.clock.advance(Duration::from_secs(20));
    d.forward("wait", "beta", "h100", 8).await;
    let r = d.start_job("wait", "beta").await;
    assert_eq!(r.state, JobState::Queued, "{}", r.reason);
    assert!(r.reason.starts_with("waiting for a healthy cluster"), "{}", r.reason);
    d.heartbeat("alpha", 16).await;
    let r = d.job("wait").await;
    assert_eq!((r.state, r.target.as_deref()), (JobState::Assigned, Some("alpha")));
    d.stop().await;
}

#[tokio::test]
async fn restart_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("p1", "beta", "h100", 8).await;
    d.start_job("p1", "beta").await;
    d.status("p1", "alpha", st(JobState::Running)).await;
    d.chunk("p1", "alpha", Stream::Stdout, 0, b"before restart\n").await;
    d.forward("p2", "beta", "h100", 8).await;
    let before = (d.job("p1").await, d.job("p2").await);
    let dir = d.dir.clone();
    d.stop().await;

    let d = Daemon::start(&dir, Clock::default()).await;
    assert_eq!((d.job("p1").await, d.job("p2").await), before);
    // Offsets survived: the next chunk continues, a gap is still a gap.
    assert_eq!(d.chunk("p1", "alpha", Stream::Stdout, 15, b"after\n").await.0, StatusCode::OK);
    assert_eq!(d.chunk("p1", "alpha", Stream::Stdout, 99, b"x").await.0, StatusCode::CONFLICT);
    assert_eq!(d.read_output("p1", "beta", "stdout", 0, 100).await, b"before restart\nafter\n");
    // Heartbeats survived: alpha is still known and healthy; so did what the
    // view takes for p1, running at alpha since after alpha's last heartbeat
    // (8 of its 16 H100s), and p2 goes where more are free.
    let v: FleetView = d.ok(reqwest::Method::GET, "/v1/clusters", "Bearer admin-secret", None).await;
    assert!(v.clusters.iter().all(|c| c.healthy));
    let free = |c: &str| v.clusters.iter().find(|x| x.name == c).unwrap().gpus.iter().map(|p| p.free).sum::<u32>();
    assert_eq!((free("alpha"), free("gamma")), (8, 16), "{v:?}");
    assert_eq!(d.start_job("p2", "beta").await.target.as_deref(), Some("gamma"));
    d.stop().await;
}

/// alpha and gamma both hold H100s; gamma's (cloud) are four times cheaper
/// until a price import says otherwise.
const MODEL: &str = r#"
[[clusters]]
name = "alpha"
provider = "onprem"
region = "east"
onprem = true
prices = { H100 = { onprem = 4.0 } }
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
name = "gamma"
provider = "aws"
region = "us-east-1"
prices = { H100 = { on_demand = 1.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2
"#;

#[tokio::test]
async fn cost_policy_ranks_the_allowed_clusters() {
    let tmp = tempfile::tempdir().unwrap();
    // First rule alone: most free H100s wins (alpha has more free).
    let d = Daemon::start(tmp.path(), Clock::default()).await;
    d.heartbeat("alpha", 16).await;
    d.heartbeat("beta", 16).await;
    d.heartbeat("gamma", 8).await;
    d.forward("ff", "beta", "h100", 8).await;
    assert_eq!(d.start_job("ff", "beta").await.target.as_deref(), Some("alpha"));
    d.stop().await;

    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("model.toml"), MODEL).unwrap();
    let mut cfg = config(tmp.path());
    cfg.placement = Some(fleet_metasched::config::PlacementConfig {
        policy: Some("cheap".into()),
        fleet_model: Some(tmp.path().join("model.toml")),
    });
    let policies: toml::Table = toml::from_str("[cheap]\n").unwrap();
    cfg.policies = Some(policies);
    let d = Daemon::start_with(tmp.path(), Clock::default(), cfg).await;
    d.heartbeat("alpha", 16).await;
    d.heartbeat("beta", 16).await;
    let v = d.heartbeat("gamma", 8).await;
    // The view carries the engine's prices (for --fleet-max-price): owned
    // hardware at its amortized price, cloud at on-demand.
    let price = |v: &FleetView, c: &str| {
        v.clusters.iter().find(|x| x.name == c).and_then(|x| x.gpus.first()).and_then(|p| p.price_per_gpu_hour)
    };
    assert_eq!((price(&v, "alpha"), price(&v, "beta"), price(&v, "gamma")), (Some(4.0), Some(1.0), Some(1.0)));
    d.forward("cost", "beta", "h100", 8).await;
    let r = d.start_job("cost", "beta").await;
    assert_eq!(r.target.as_deref(), Some("gamma"), "{}", r.reason);
    assert!(r.reason.contains("policy cheap: gamma ranked 1 of 2"), "{}", r.reason);
    let e: fleet_metasched::store::Explanation =
        d.ok(reqwest::Method::GET, "/v1/jobs/cost/explain", "Bearer admin-secret", None).await;
    assert_eq!(e.policy, "cheap");
    let ranked: Vec<_> = e.ranked.iter().map(|c| c.cluster.as_str()).collect();
    assert_eq!(ranked, ["gamma", "alpha"]);
    assert!(e.ranked[0].score < e.ranked[1].score);
    assert_eq!(e.engine_exclusions.iter().map(|x| x.cluster.as_str()).collect::<Vec<_>>(), ["beta"]);
    // A price import makes gamma dearer than alpha: the next job goes to alpha.
    let csv = "provider,region,zone,instance_type,gpu_type,gpu_count,vcpus,memory_gib,price_ondemand_usd_hr,price_spot_usd_hr\n\
               aws,us-east-1,use1-az1,p5.48xlarge,H100,8,192,2048,40.0,\n";
    let r = d.req(reqwest::Method::POST, "/v1/prices", &bearer("beta")).body(csv).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = d.req(reqwest::Method::POST, "/v1/prices", "Bearer admin-secret").body("nonsense\n").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let imp: fleet_metasched::store::PriceImport = d
        .req(reqwest::Method::POST, "/v1/prices", "Bearer admin-secret")
        .body(csv)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((imp.entries, imp.applied), (1, true));
    assert_eq!(price(&d.heartbeat("gamma", 8).await, "gamma"), Some(5.0), "40 USD/h for 8 H100s");
    d.forward("cost2", "beta", "h100", 8).await;
    let r = d.start_job("cost2", "beta").await;
    assert_eq!(r.target.as_deref(), Some("alpha"), "{}", r.reason);
    assert!(tmp.path().join("state/prices.csv").exists());
    // The engine never overrides the hard rule: a job too big for anyone still fails.
    d.forward("huge", "beta", "h100", 64).await;
    assert_eq!(d.start_job("huge", "beta").await.state, JobState::Failed);
    d.stop().await;
}

#[tokio::test]
async fn unknown_engine_policy_is_a_startup_error() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("model.toml"), MODEL).unwrap();
    let mut cfg = config(tmp.path());
    cfg.placement = Some(fleet_metasched::config::PlacementConfig {
        policy: Some("nope".into()),
        fleet_model: Some(tmp.path().join("model.toml")),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = fleet_metasched::run(listener, cfg, async {}).await.unwrap_err();
    assert!(format!("{err:#}").contains("policy \"nope\" is unknown"), "{err:#}");
}

// ---- live feeds and rebalancing -------------------------------------------

/// alpha (on-prem, zone ZA, dear) and gamma (cloud, zone ZG, cheap) hold
/// H100s; beta A100s.
fn feed_model(alpha_price: f64) -> String {
    format!(
        r#"
[[clusters]]
name = "alpha"
provider = "onprem"
region = "east"
onprem = true
carbon_zone = "ZA"
prices = {{ H100 = {{ onprem = {alpha_price} }} }}
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2

[[clusters]]
name = "beta"
provider = "onprem"
region = "east"
onprem = true
prices = {{ A100 = {{ onprem = 1.0 }} }}
[[clusters.pools]]
gpu_type = "A100"
gpus_per_node = 8
nodes = 2

[[clusters]]
name = "gamma"
provider = "aws"
region = "us-east-1"
carbon_zone = "ZG"
prices = {{ H100 = {{ on_demand = 1.0 }} }}
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 2
"#
    )
}

fn carbon_csv(zone: &str, g: f64) -> String {
    format!(
        "datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh\n\
         2023-01-01 00:00:00,{zone},{g},{g}\n2023-01-01 01:00:00,{zone},{g},{g}\n"
    )
}

const EGRESS_CSV: &str = ",us-east-1,us-east-2\nus-east-1,0,0.01\nus-east-2,0.01,0\n";

/// A daemon ranking with policy `cheap` over [`feed_model`].
fn engine_config(dir: &Path, alpha_price: f64) -> Config {
    std::fs::write(dir.join("model.toml"), feed_model(alpha_price)).unwrap();
    let mut cfg = config(dir);
    cfg.placement = Some(fleet_metasched::config::PlacementConfig {
        policy: Some("cheap".into()),
        fleet_model: Some(dir.join("model.toml")),
    });
    cfg.policies = Some(toml::from_str("[cheap]\n").unwrap());
    cfg
}

fn feed_dirs(dir: &Path) -> (PathBuf, PathBuf) {
    let (c, e) = (dir.join("carbon"), dir.join("network"));
    std::fs::create_dir_all(&c).unwrap();
    std::fs::create_dir_all(&e).unwrap();
    std::fs::write(c.join("ZA_2023_hourly.csv"), carbon_csv("ZA", 100.0)).unwrap();
    std::fs::write(c.join("ZG_2023_hourly.csv"), carbon_csv("ZG", 200.0)).unwrap();
    std::fs::write(e.join("aws_transmission_cost_matrix.csv"), EGRESS_CSV).unwrap();
    (c, e)
}

/// Carbon intensity the engine uses per ranked cluster for job `id`.
async fn intensities(d: &Daemon, id: &str) -> Vec<(String, f64)> {
    let e: fleet_metasched::store::Explanation =
        d.ok(reqwest::Method::GET, &format!("/v1/jobs/{id}/explain"), "Bearer admin-secret", None).await;
    e.ranked
        .iter()
        .map(|c| {
            let g = c.terms.iter().find(|(k, _)| k == "carbon_g_per_kwh").map(|(_, v)| *v).unwrap();
            (c.cluster.clone(), g)
        })
        .collect()
}

async fn metric(d: &Daemon, needle: &str) -> bool {
    let r = d.req(reqwest::Method::GET, "/metrics", "").send().await.unwrap();
    r.text().await.unwrap().lines().any(|l| l == needle)
}

#[tokio::test]
async fn feeds_load_reload_on_change_and_survive_a_broken_file() {
    use fleet_metasched::FeedReload;
    let tmp = tempfile::tempdir().unwrap();
    let (carbon, egress) = feed_dirs(tmp.path());
    let mut cfg = engine_config(tmp.path(), 4.0);
    cfg.carbon = Some(carbon.clone());
    cfg.egress = Some(egress);
    let d = Daemon::start_with(tmp.path(), Clock::default(), cfg).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    d.forward("c1", "beta", "h100", 8).await;
    // Loaded at start: both series are in use.
    let want = |a: f64| vec![("gamma".to_string(), 200.0), ("alpha".to_string(), a)];
    assert_eq!(intensities(&d, "c1").await, want(100.0));
    assert_eq!(d.control.check_feeds().await, Some(FeedReload::Unchanged));

    // A changed file is picked up at the next check.
    std::fs::write(carbon.join("ZA_2023_hourly.csv"), carbon_csv("ZA", 350.0)).unwrap();
    assert_eq!(d.control.check_feeds().await, Some(FeedReload::Reloaded(3)));
    assert_eq!(intensities(&d, "c1").await, want(350.0));

    // A broken file keeps the previous snapshot; the error names file:line,
    // and it is reported once, not at every check.
    let bad = format!("{}2023-01-01 02:00:00,ZA,oops,1\n", carbon_csv("ZA", 1.0));
    std::fs::write(carbon.join("ZA_2023_hourly.csv"), bad).unwrap();
    match d.control.check_feeds().await {
        Some(FeedReload::Failed(e)) => assert!(e.contains("ZA_2023_hourly.csv:4: ci_direct_gco2_kwh"), "{e}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(intensities(&d, "c1").await, want(350.0));
    assert_eq!(d.control.check_feeds().await, Some(FeedReload::Unchanged));
    assert!(metric(&d, "fleet_metasched_feed_loads_total{result=\"error\"} 1").await);

    // Fixed again: reloaded.
    std::fs::write(carbon.join("ZA_2023_hourly.csv"), carbon_csv("ZA", 50.0)).unwrap();
    assert_eq!(d.control.check_feeds().await, Some(FeedReload::Reloaded(3)));
    assert_eq!(intensities(&d, "c1").await, want(50.0));
    // A price import keeps the feeds.
    let csv = "provider,region,zone,instance_type,gpu_type,gpu_count,vcpus,memory_gib,price_ondemand_usd_hr,price_spot_usd_hr\n\
               aws,us-east-1,use1-az1,p5.48xlarge,H100,8,192,2048,16.0,\n";
    let r = d.req(reqwest::Method::POST, "/v1/prices", "Bearer admin-secret").body(csv).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(intensities(&d, "c1").await, want(50.0));
    d.stop().await;
}

#[tokio::test]
async fn a_broken_feed_at_start_is_a_startup_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, egress) = feed_dirs(tmp.path());
    std::fs::write(egress.join("aws_transmission_cost_matrix.csv"), ",us-east-1\nus-east-1,0,9\n").unwrap();
    let mut cfg = engine_config(tmp.path(), 4.0);
    cfg.egress = Some(egress);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = fleet_metasched::run(listener, cfg, async {}).await.unwrap_err();
    assert!(format!("{err:#}").contains("aws_transmission_cost_matrix.csv:2: expected 2 fields"), "{err:#}");
}

/// Forwards job `id` from beta: 8 H100s for `minutes`, tentatively to alpha.
async fn forward_h100_job(d: &Daemon, id: &str, minutes: u32, interruptible: bool) {
    let mut req = request("beta", "h100", 8);
    req.time_limit_min = Some(minutes);
    req.fleet.interruptible = interruptible;
    req.user_name = Some("alice".into());
    let fwd =
        ForwardRequest { fleet_job_id: id.into(), request: req, tentative_target: "alpha".into(), early_start: false };
    let _: JobRecord =
        d.ok(reqwest::Method::POST, "/v1/jobs", &bearer("beta"), Some(serde_json::to_value(fwd).unwrap())).await;
}

/// gamma (cloud, us-east-1) sells H100 spot at 1 USD/GPU-h, on demand at 4;
/// alpha's owned H100s cost 3.
fn spot_model() -> String {
    feed_model(3.0)
        .replace("prices = { H100 = { on_demand = 1.0 } }", "prices = { H100 = { on_demand = 4.0, spot = 1.0 } }")
}

/// Where and at which pricing the engine ranks interruptible job `id` first,
/// and gamma's candidate (pricing, wait_h).
async fn spot_ranking(d: &Daemon, id: &str) -> ((String, String), (String, f64)) {
    let e: fleet_metasched::store::Explanation =
        d.ok(reqwest::Method::GET, &format!("/v1/jobs/{id}/explain"), "Bearer admin-secret", None).await;
    let first = e.ranked.first().map(|c| (c.cluster.clone(), c.pricing.clone())).unwrap_or_default();
    let g = e.ranked.iter().find(|c| c.cluster == "gamma").expect("gamma ranked");
    let wait = g.terms.iter().find(|(k, _)| k == "wait_h").map(|(_, v)| *v).unwrap();
    (first, (g.pricing.clone(), wait))
}

/// A live spot feed tells the engine, at the view's time, whether a cloud
/// region's spot is there, how often it is reclaimed and how long a
/// shortfall lasts; a feed past its end is ignored (the pool as configured).
#[tokio::test]
async fn a_spot_feed_says_whether_spot_is_there_now() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = engine_config(tmp.path(), 3.0);
    std::fs::write(tmp.path().join("model.toml"), spot_model()).unwrap();
    let spot = tmp.path().join("spot");
    std::fs::create_dir_all(&spot).unwrap();
    let t0 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64() - 60.0;
    // Hours from t0: full, full, gone, gone, full, gone, full.
    let series = format!("{{\"metadata\":{{\"gap_seconds\":3600,\"start_unix\":{t0}}},\"data\":[8,8,0,0,8,0,8]}}");
    std::fs::write(spot.join("aws-2026__us-east-1a_h100.json"), series).unwrap();
    std::fs::write(spot.join("notes.txt"), "not a series").unwrap();
    cfg.spot = Some(spot.clone());
    let clock = Clock::default();
    let d = Daemon::start_with(tmp.path(), clock.clone(), cfg).await;
    let beat = || async {
        for (c, _) in CLUSTERS {
            d.heartbeat(c, 16).await;
        }
    };
    beat().await;
    // A 10-minute job and a day-long one, neither checkpointing.
    for (id, minutes) in [("sp", 10), ("long", 24 * 60)] {
        forward_h100_job(&d, id, minutes, true).await;
    }
    let gauge = |v: u8| format!("fleet_metasched_spot_feed_current{{series=\"aws-2026__us-east-1a_h100\"}} {v}");
    assert!(metric(&d, &gauge(1)).await);
    let spot_first = (("gamma".to_string(), "spot".to_string()), ("spot".to_string(), 0.0));
    assert_eq!(spot_ranking(&d, "sp").await, spot_first, "spot is there in the first hour");
    assert_eq!(spot_ranking(&d, "long").await, spot_first, "no reclaim seen yet");

    // 5.5 h on: spot gone since 5 h; the job does not checkpoint, so it cannot
    // queue for spot: gamma only on demand (4 > alpha's 3).
    clock.advance(Duration::from_secs(5 * 3600 + 1800));
    beat().await;
    let (first, gamma) = spot_ranking(&d, "sp").await;
    assert_eq!((first.0.as_str(), gamma.0.as_str()), ("alpha", "on-demand"), "{first:?} {gamma:?}");

    // 6.5 h: back, after two reclaims in four hours of spot: the short job
    // goes to spot again; the day-long one, which would lose its work at
    // every reclaim, goes to alpha, gamma's spot no longer its best there.
    clock.advance(Duration::from_secs(3600));
    beat().await;
    assert_eq!(spot_ranking(&d, "sp").await, spot_first);
    let (first, gamma) = spot_ranking(&d, "long").await;
    assert_eq!((first.0.as_str(), gamma.0.as_str()), ("alpha", "on-demand"), "{first:?} {gamma:?}");
    // 9.5 h: the feed ended at 7 h and is stale from 9 h: gamma as configured.
    clock.advance(Duration::from_secs(3 * 3600));
    beat().await;
    assert_eq!(spot_ranking(&d, "sp").await, spot_first);
    assert_eq!(spot_ranking(&d, "long").await, spot_first);
    // The gauge says so from the next feed check.
    assert!(metric(&d, &gauge(1)).await);
    assert_eq!(d.control.check_feeds().await, Some(fleet_metasched::FeedReload::Unchanged));
    assert!(metric(&d, &gauge(0)).await);
    d.stop().await;

    // A series without its start time cannot be a live feed: a start-up error
    // naming the file.
    std::fs::write(spot.join("aws-2026__us-east-1a_h100.json"), "{\"metadata\":{\"gap_seconds\":60},\"data\":[1]}")
        .unwrap();
    let mut cfg = engine_config(tmp.path(), 3.0);
    cfg.spot = Some(spot);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = format!("{:#}", fleet_metasched::run(listener, cfg, async {}).await.unwrap_err());
    assert!(err.contains("aws-2026__us-east-1a_h100.json:1: no metadata.start_unix"), "{err}");
}

async fn rebalance(d: &Daemon) -> fleet_metasched::store::Rebalance {
    d.ok(reqwest::Method::GET, "/v1/rebalance", "Bearer admin-secret", None).await
}

#[tokio::test]
async fn rebalance_proposes_moving_a_running_interruptible_job_to_a_cheaper_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    // alpha costs 20 USD/GPU-h, gamma 1.
    let d = Daemon::start_with(tmp.path(), Clock::default(), engine_config(tmp.path(), 20.0)).await;
    let r = rebalance(&d).await;
    assert!(r.proposals.is_empty() && r.computed_at.is_none(), "{r:?}");
    // gamma is silent: both jobs can only go to alpha.
    d.heartbeat("alpha", 16).await;
    d.heartbeat("beta", 16).await;
    for (id, interruptible) in [("mv", true), ("stay", false)] {
        forward_h100_job(&d, id, 24 * 60, interruptible).await;
        assert_eq!(d.start_job(id, "beta").await.target.as_deref(), Some("alpha"));
        let (s, v) = d.status(id, "alpha", st(JobState::Running)).await;
        assert!(s.is_success(), "{v}");
    }
    // Nothing cheaper is free yet.
    let r = d.control.rebalance().await.unwrap();
    assert_eq!((r.considered, r.proposals.len(), r.policy.as_str()), (1, 0, "cheap"), "{r:?}");
    // gamma comes up with 16 free H100s at a twentieth of the price.
    d.heartbeat("alpha", 0).await;
    d.heartbeat("gamma", 16).await;
    d.control.rebalance().await.unwrap();
    let (s, _) = d.call(reqwest::Method::GET, "/v1/rebalance", &bearer("alpha"), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = d.call(reqwest::Method::GET, "/v1/rebalance", "", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let r = rebalance(&d).await;
    assert_eq!(r.considered, 1);
    assert_eq!(r.proposals.len(), 1, "{r:?}");
    let p = &r.proposals[0];
    assert_eq!((p.fleet_job_id.as_str(), p.from.as_str(), p.to.as_str()), ("mv", "alpha", "gamma"));
    assert!(p.saving_usd > 1000.0 && p.stay_usd > p.move_usd + p.migration_usd, "{p:?}");
    assert!(r.reason.is_none() && r.computed_at.is_some());
    assert!(metric(&d, "fleet_metasched_rebalance_proposals 1").await);
    // Proposals only: the job has not moved.
    assert_eq!(d.job("mv").await.target.as_deref(), Some("alpha"));
    // alice's GPU quota at gamma has 4 GPUs left of 16, her job needs 8:
    // no move there (it would wait for the quota); with room, again.
    let quota = |used| {
        vec![fleet_api::api::GpuQuota {
            scope: "namespace ml".into(),
            users: vec!["beta:alice".into()],
            hard: 16,
            used,
        }]
    };
    d.heartbeat_quotas("gamma", 16, quota(12)).await;
    let r = d.control.rebalance().await.unwrap();
    assert_eq!((r.considered, r.proposals.len()), (1, 0), "{r:?}");
    d.heartbeat_quotas("gamma", 16, quota(8)).await;
    let r = d.control.rebalance().await.unwrap();
    assert_eq!(r.proposals.iter().map(|p| p.to.as_str()).collect::<Vec<_>>(), ["gamma"], "{r:?}");
    d.stop().await;
}

#[tokio::test]
async fn rebalance_without_an_engine_policy_is_empty_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    let r = rebalance(&d).await;
    assert!(r.proposals.is_empty());
    assert!(r.reason.as_deref().unwrap_or("").contains("no cost-engine policy"), "{r:?}");
    let r = d.control.rebalance().await.unwrap();
    assert!(r.proposals.is_empty() && r.reason.is_some(), "{r:?}");
    d.stop().await;
}

#[tokio::test]
async fn output_is_deleted_after_the_retention_period_and_the_record_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::default();
    let d = Daemon::start(tmp.path(), clock.clone()).await;
    d.heartbeat("alpha", 16).await;
    d.heartbeat("beta", 16).await;
    d.forward("old", "beta", "h100", 8).await;
    d.start_job("old", "beta").await;
    assert_eq!(d.chunk("old", "alpha", Stream::Stdout, 0, b"result\n").await.0, StatusCode::OK);
    let done = StatusUpdate {
        final_stdout_len: Some(7),
        final_stderr_len: Some(0),
        exit_code: Some(0),
        ..st(JobState::Completed)
    };
    assert_eq!(d.status("old", "alpha", done).await.0, StatusCode::OK);
    assert_eq!(d.read_output("old", "beta", "stdout", 0, 100).await, b"result\n");
    // A running job is never touched, however old.
    d.forward("live", "beta", "h100", 8).await;
    d.start_job("live", "beta").await;
    assert_eq!(d.chunk("live", "alpha", Stream::Stdout, 0, b"still running\n").await.0, StatusCode::OK);
    assert_eq!(d.status("live", "alpha", st(JobState::Running)).await.0, StatusCode::OK);

    // 15 days later (default retention 14): the next pass deletes it.
    clock.advance(Duration::from_secs(15 * 86_400));
    let stored = tmp.path().join("state/output/old.stdout");
    let t0 = std::time::Instant::now();
    while stored.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "output not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = d
        .call(
            reqwest::Method::GET,
            "/v1/jobs/old/output?stream=stdout&offset=0&max=100",
            &job_auth("beta", "old"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert!(body["error"].as_str().unwrap().contains("output_retention_days"), "{body}");
    assert_eq!(d.job("old").await.state, JobState::Completed, "the record stays");
    assert_eq!(d.read_output("live", "beta", "stdout", 0, 100).await, b"still running\n");
    d.stop().await;
}

#[tokio::test]
async fn start_needs_the_origin_agents_confirmation() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("s1", "beta", "h100", 8).await;
    let (s, v) = d.request_start("s1", "beta", 0).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "no stand-in id, nothing to check: {v}");
    // The job token only records a request: the job stays held, nobody's work.
    let (s, v) = d.request_start("s1", "beta", 77).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let r: JobRecord = serde_json::from_value(v).unwrap();
    assert_eq!((r.state, r.origin_job_id, r.target.as_deref()), (JobState::Held, Some(77), None));
    let asked = r.start_requested_at.expect("start_requested_at");
    assert_eq!(d.request_start("s1", "beta", 77).await.0, StatusCode::ACCEPTED, "idempotent");
    // Another stand-in id does not displace the pending request.
    assert_eq!(d.request_start("s1", "beta", 78).await.0, StatusCode::ACCEPTED);
    assert_eq!((d.job("s1").await.origin_job_id, d.job("s1").await.start_requested_at), (Some(77), Some(asked)));
    assert!(d.work("alpha").await.is_empty() && d.work("gamma").await.is_empty());
    let check = vec![StartCheck { fleet_job_id: "s1".into(), origin_job_id: 77, ..Default::default() }];
    assert_eq!(d.work("beta").await.confirm_start, check);

    // Only the origin cluster's agent confirms.
    for (auth, want) in [
        (job_auth("beta", "s1"), StatusCode::FORBIDDEN),
        (bearer("alpha"), StatusCode::FORBIDDEN),
        ("Bearer admin-secret".to_string(), StatusCode::FORBIDDEN),
        (String::new(), StatusCode::UNAUTHORIZED),
        (job_auth("beta", "other"), StatusCode::UNAUTHORIZED),
    ] {
        let (s, v) = d.confirm("s1", &auth, 77, true).await;
        assert_eq!(s, want, "{auth:?}: {v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
    assert_eq!(d.job("s1").await.state, JobState::Held);
    let (s, v) = d.confirm("s1", &bearer("beta"), 78, true).await;
    assert_eq!(s, StatusCode::CONFLICT, "another stand-in: {v}");
    assert!(v["error"].as_str().unwrap().contains("names stand-in 77, not 78"), "{v}");
    let (s, v) = d
        .call(
            reqwest::Method::POST,
            "/v1/jobs/s1/confirm_start",
            &bearer("beta"),
            Some(serde_json::json!({"started": true})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");

    // Refused: the request is dropped, the job stays held.
    let (s, v) = d.confirm("s1", &bearer("beta"), 77, false).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let r: JobRecord = serde_json::from_value(v).unwrap();
    assert_eq!((r.state, r.start_requested_at, r.origin_job_id), (JobState::Held, None, None));
    assert!(r.reason.contains("refused the start of stand-in 77"), "{}", r.reason);
    assert!(d.work("beta").await.is_empty());
    let (s, v) = d.confirm("s1", &bearer("beta"), 77, true).await;
    assert_eq!(s, StatusCode::CONFLICT, "no request pending: {v}");

    // Asked again and confirmed: placed exactly as /start used to.
    assert_eq!(d.request_start("s1", "beta", 77).await.0, StatusCode::ACCEPTED);
    let (s, v) = d.confirm("s1", &bearer("beta"), 77, true).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let r: JobRecord = serde_json::from_value(v).unwrap();
    assert_eq!((r.state, r.target.as_deref(), r.origin_job_id), (JobState::Assigned, Some("alpha"), Some(77)));
    assert_eq!(d.work("alpha").await.submit.len(), 1);
    assert!(d.work("beta").await.confirm_start.is_empty());
    // Repeats past held: 200 with the record.
    let (s, v) = d.request_start("s1", "beta", 77).await;
    assert_eq!((s, v["state"].as_str()), (StatusCode::OK, Some("assigned")));
    assert_eq!(d.confirm("s1", &bearer("beta"), 77, true).await.0, StatusCode::OK, "a repeated confirmation");
    assert_eq!(d.confirm("s1", &bearer("beta"), 5, true).await.0, StatusCode::CONFLICT);
    d.stop().await;
}

/// `GET /v1/agent/work?wait_ms=` for `cluster`, timed.
async fn long_poll(url: String, cluster: &'static str, wait_ms: u64) -> (AgentWork, Duration) {
    let t0 = std::time::Instant::now();
    let w: AgentWork = reqwest::Client::new()
        .get(format!("{url}/v1/agent/work?wait_ms={wait_ms}"))
        .header("Authorization", bearer(cluster))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (w, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_answers_when_work_arrives() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    // Nothing to do: the poll waits its time, then answers empty.
    let (w, took) = long_poll(d.url.clone(), "alpha", 300).await;
    assert!(w.is_empty() && took >= Duration::from_millis(300), "{w:?} after {took:?}");
    // wait_ms=0 (and absent) answer at once.
    assert!(long_poll(d.url.clone(), "alpha", 0).await.0.is_empty());

    d.forward("lp", "beta", "h100", 8).await;
    let origin = tokio::spawn(long_poll(d.url.clone(), "beta", 60_000));
    let target = tokio::spawn(long_poll(d.url.clone(), "alpha", 60_000));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!origin.is_finished() && !target.is_finished(), "both wait while there is nothing");
    // The store is not locked by the waiting polls.
    assert_eq!(d.job("lp").await.state, JobState::Held);
    let t0 = std::time::Instant::now();
    assert_eq!(d.request_start("lp", "beta", 42).await.0, StatusCode::ACCEPTED);
    let (w, _) = origin.await.unwrap();
    let t_origin = t0.elapsed();
    assert_eq!(w.confirm_start, [StartCheck { fleet_job_id: "lp".into(), origin_job_id: 42, ..Default::default() }]);
    assert!(!target.is_finished(), "a start request is the origin's work, not the target's");
    assert_eq!(d.confirm("lp", &bearer("beta"), 42, true).await.0, StatusCode::OK);
    let (w, _) = target.await.unwrap();
    let t_target = t0.elapsed();
    assert_eq!(w.submit.iter().map(|a| a.fleet_job_id.as_str()).collect::<Vec<_>>(), ["lp"]);
    println!(
        "latency: /start -> origin long-poll answered {:.1} ms; /start + confirm -> target long-poll has the assignment {:.1} ms",
        t_origin.as_secs_f64() * 1e3,
        t_target.as_secs_f64() * 1e3
    );
    // Work already there: answered at once, however long the wait asked.
    let (w, _) = long_poll(d.url.clone(), "alpha", 60_000).await;
    assert_eq!(w.submit.len(), 1);

    // A cancel request wakes the target.
    d.status("lp", "alpha", st(JobState::Running)).await;
    let target = tokio::spawn(long_poll(d.url.clone(), "alpha", 60_000));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!target.is_finished());
    d.ok::<JobRecord>(reqwest::Method::POST, "/v1/jobs/lp/cancel", &job_auth("beta", "lp"), None).await;
    assert_eq!(target.await.unwrap().0.cancel, ["lp"]);

    // A waiting poll does not hold up shutdown.
    let waiting = tokio::spawn(long_poll(d.url.clone(), "gamma", 60_000));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = std::time::Instant::now();
    d.stop().await;
    assert!(waiting.await.unwrap().0.is_empty());
    println!("shutdown with a waiting long-poll took {:?}", t0.elapsed());
}

#[tokio::test]
async fn requeue_terminal_and_remote_id_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("rq", "beta", "h100", 8).await;
    d.start_job("rq", "beta").await;
    // (update, expected status, expected state and requeues afterwards)
    let table: Vec<(StatusUpdate, StatusCode, JobState, u32)> = vec![
        (st(JobState::Pending), StatusCode::OK, JobState::Pending, 0),
        (st(JobState::Pending), StatusCode::OK, JobState::Pending, 0),
        (st(JobState::Running), StatusCode::OK, JobState::Running, 0),
        (StatusUpdate { node_list: "alpha-n1".into(), ..st(JobState::Running) }, StatusCode::OK, JobState::Running, 0),
        // Slurm requeued it at the target.
        (st(JobState::Pending), StatusCode::OK, JobState::Pending, 1),
        (st(JobState::Running), StatusCode::OK, JobState::Running, 1),
        (st(JobState::Pending), StatusCode::OK, JobState::Pending, 2),
        // Another Slurm job's report never overwrites this one's.
        (StatusUpdate { remote_job_id: Some(8), ..st(JobState::Failed) }, StatusCode::CONFLICT, JobState::Pending, 2),
        (st(JobState::Running), StatusCode::OK, JobState::Running, 2),
        (StatusUpdate { exit_code: Some(0), ..st(JobState::Completed) }, StatusCode::OK, JobState::Completed, 2),
        (StatusUpdate { exit_code: Some(1), ..st(JobState::Failed) }, StatusCode::OK, JobState::Completed, 2),
        (st(JobState::Pending), StatusCode::CONFLICT, JobState::Completed, 2),
        (StatusUpdate { state: None, ..st(JobState::Running) }, StatusCode::CONFLICT, JobState::Completed, 2),
    ];
    for (i, (upd, want, state, requeues)) in table.into_iter().enumerate() {
        let terminal_before = d.job("rq").await.state.is_terminal();
        let (s, v) = d.status("rq", "alpha", upd.clone()).await;
        assert_eq!(s, want, "row {i} {upd:?}: {v}");
        if s == StatusCode::CONFLICT {
            assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
            assert_eq!(v.get("terminal").is_some(), terminal_before, "row {i}: {v}");
        }
        let r = d.job("rq").await;
        assert_eq!((r.state, r.requeues, r.remote_job_id), (state, requeues, Some(7)), "row {i}");
    }
    assert_eq!(d.job("rq").await.node_list, "alpha-n0");
    assert_eq!(d.job("rq").await.exit_code, Some(0), "the first terminal report stands");
    d.stop().await;
}

/// Slurm at the target ran the job again without counting it (a
/// slurmctld recovered from older state): the agent's cumulative count is
/// added to `requeues` once per re-run, with a note naming the cluster,
/// whatever order, repetition or restart it comes in.
#[tokio::test]
async fn re_runs_the_target_agent_saw_count_once_each() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = fleet(tmp.path()).await;
    d.forward("rr", "beta", "h100", 8).await;
    let epoch = d.start_job("rr", "beta").await.epoch;
    assert_eq!(epoch, 1);
    let up = |state, reruns: Option<u32>, why: &str| StatusUpdate {
        reruns,
        rerun_why: why.into(),
        epoch: Some(epoch),
        ..st(state)
    };
    let restarted = "its stdout file restarted (truncated by a new run)";
    // (update, status, state, requeues, notes) after each report.
    let table: Vec<(StatusUpdate, StatusCode, JobState, u32, usize)> = vec![
        (up(JobState::Running, Some(0), ""), StatusCode::OK, JobState::Running, 0, 0),
        // Seen only in its output: counted, it keeps running.
        (up(JobState::Running, Some(1), restarted), StatusCode::OK, JobState::Running, 1, 1),
        (up(JobState::Running, Some(1), restarted), StatusCode::OK, JobState::Running, 1, 1),
        // Back to pending: counted as running → pending, once.
        (
            up(JobState::Pending, Some(2), "it went back to pending after it ran"),
            StatusCode::OK,
            JobState::Pending,
            2,
            2,
        ),
        (up(JobState::Running, Some(2), ""), StatusCode::OK, JobState::Running, 2, 2),
        // An older agent's running → pending, then a newer one's count of it.
        (up(JobState::Pending, None, ""), StatusCode::OK, JobState::Pending, 3, 3),
        (up(JobState::Running, Some(3), ""), StatusCode::OK, JobState::Running, 3, 3),
        // Two at once (reports lost), seen with the final report.
        (up(JobState::Completed, Some(5), restarted), StatusCode::OK, JobState::Completed, 5, 4),
        (up(JobState::Completed, Some(5), restarted), StatusCode::OK, JobState::Completed, 5, 4),
        // A stale epoch's count is not this run's.
        (
            StatusUpdate { epoch: Some(7), ..up(JobState::Completed, Some(9), "") },
            StatusCode::CONFLICT,
            JobState::Completed,
            5,
            4,
        ),
    ];
    for (i, (upd, want, state, requeues, notes)) in table.into_iter().enumerate() {
        let (s, v) = d.status("rr", "alpha", upd.clone()).await;
        assert_eq!(s, want, "row {i} {upd:?}: {v}");
        let r = d.job("rr").await;
        assert_eq!((r.state, r.requeues, r.requeue_notes.len()), (state, requeues, notes), "row {i}: {r:?}");
        if i == 4 {
            // The meta-scheduler restarts: nothing is counted again.
            let dir = d.dir.clone();
            d.stop().await;
            d = Daemon::start(&dir, Clock::default()).await;
        }
    }
    let r = d.job("rr").await;
    assert!(r.requeue_notes.iter().all(|n| n.starts_with("Slurm at alpha re-ran it")), "{:?}", r.requeue_notes);
    assert!(r.requeue_notes[0].contains(restarted), "{:?}", r.requeue_notes);
    assert!(r.requeue_notes[1].contains("went back to pending"), "{:?}", r.requeue_notes);
    assert!(r.requeue_notes[3].contains("re-ran it 2 more times"), "{:?}", r.requeue_notes);
    d.stop().await;
}

#[tokio::test]
async fn absurd_output_offsets_are_client_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("off", "beta", "h100", 8).await;
    d.start_job("off", "beta").await;
    for (offset, data) in [(u64::MAX, &b"x"[..]), (u64::MAX - 1, &b"xyz"[..]), ((1 << 40) + 1, &b""[..])] {
        let (s, v) = d.chunk("off", "alpha", Stream::Stdout, offset, data).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "offset {offset}: {v}");
        assert!(v["error"].as_str().unwrap().contains("1 TiB"), "{v}");
    }
    // An offset past what is held is a gap, as before.
    assert_eq!(d.chunk("off", "alpha", Stream::Stdout, 5, b"x").await.0, StatusCode::CONFLICT);
    for offset in [u64::MAX, 1 << 41] {
        let (s, v) = d
            .call(
                reqwest::Method::GET,
                &format!("/v1/jobs/off/output?stream=stdout&offset={offset}"),
                &job_auth("beta", "off"),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    }
    assert_eq!(d.read_output("off", "beta", "stdout", 1 << 39, 10).await, b"");
    d.stop().await;
}

#[tokio::test]
async fn a_job_whose_output_passes_the_cap_is_cancelled_and_keeps_what_came_before() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), Config { output_max_job_bytes: 10, ..config(tmp.path()) })
        .await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    d.forward("loud", "beta", "h100", 8).await;
    d.start_job("loud", "beta").await;
    assert_eq!(d.status("loud", "alpha", st(JobState::Running)).await.0, StatusCode::OK);
    assert_eq!(d.chunk("loud", "alpha", Stream::Stdout, 0, b"12345678").await.0, StatusCode::OK);
    assert!(d.work("alpha").await.cancel.is_empty(), "under the cap: nothing happens");
    // The chunk that passes the cap: kept up to it, the job is cancelled.
    assert_eq!(d.chunk("loud", "alpha", Stream::Stdout, 8, b"abcdef").await.0, StatusCode::OK);
    assert_eq!(d.work("alpha").await.cancel, ["loud"]);
    let r = d.job("loud").await;
    assert!(r.reason.starts_with("its stdout passed output_max_job_bytes (10 bytes)"), "{}", r.reason);
    assert_eq!(r.stdout_len, 10);
    // What follows is taken and dropped (the agent moves on, no gap loop).
    assert_eq!(d.chunk("loud", "alpha", Stream::Stdout, 14, b"zzz").await.0, StatusCode::OK);
    assert_eq!(d.chunk("loud", "alpha", Stream::Stdout, 1 << 20, b"zzz").await.0, StatusCode::OK);
    // stderr has a cap of its own and is still kept.
    assert_eq!(d.chunk("loud", "alpha", Stream::Stderr, 0, b"warn\n").await.0, StatusCode::OK);
    let end = StatusUpdate {
        final_stdout_len: Some(1 << 20),
        final_stderr_len: Some(5),
        signal: Some(15),
        ..st(JobState::Cancelled)
    };
    assert_eq!(d.status("loud", "alpha", end).await.0, StatusCode::OK);
    let r = d.job("loud").await;
    assert_eq!((r.state, r.output_complete), (JobState::Cancelled, true), "{r:?}");
    assert!(r.reason.starts_with("its stdout passed output_max_job_bytes"), "{}", r.reason);
    assert_eq!(d.read_output("loud", "beta", "stdout", 0, 100).await, b"12345678ab");
    assert_eq!(d.read_output("loud", "beta", "stderr", 0, 100).await, b"warn\n");
    assert_eq!(std::fs::metadata(tmp.path().join("state/output/loud.stdout")).unwrap().len(), 10);
    d.stop().await;
}

#[tokio::test]
async fn output_is_refused_while_the_state_disk_is_short_of_room_and_taken_later() {
    let tmp = tempfile::tempdir().unwrap();
    // More free space than any disk has: every chunk is refused.
    let short = Config { output_min_free_bytes: u64::MAX / 2, ..config(tmp.path()) };
    let d = Daemon::start_with(tmp.path(), Clock::default(), short).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    d.forward("w", "beta", "h100", 8).await;
    d.start_job("w", "beta").await;
    let (s, v) = d.chunk("w", "alpha", Stream::Stdout, 0, b"result\n").await;
    assert_eq!(s, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    assert!(v["error"].as_str().unwrap().contains("output_min_free_bytes"), "{v}");
    // The job's state is still taken, and nothing of the chunk was kept.
    assert_eq!(d.status("w", "alpha", st(JobState::Running)).await.0, StatusCode::OK);
    assert_eq!((d.job("w").await.state, d.job("w").await.stdout_len), (JobState::Running, 0));
    let metrics = d.req(reqwest::Method::GET, "/metrics", "Bearer admin-secret").send().await.unwrap();
    let text = metrics.text().await.unwrap();
    assert!(text.contains("fleet_metasched_output_refused_total{why=\"room\"} 1"), "{text}");
    d.stop().await;
    // Room again (a restart with the default): the agent's next send is taken.
    let d = Daemon::start(tmp.path(), Clock::default()).await;
    assert_eq!(d.chunk("w", "alpha", Stream::Stdout, 0, b"result\n").await.0, StatusCode::OK);
    assert_eq!(d.read_output("w", "beta", "stdout", 0, 100).await, b"result\n");
    d.stop().await;
}

// ---- hardening -----------------------------------------------------------

/// A raw TCP connection to the daemon from `local` (any 127.0.0.0/8 address).
async fn raw_conn(d: &Daemon, local: &str) -> tokio::net::TcpStream {
    let addr: std::net::SocketAddr = d.url.trim_start_matches("http://").parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{local}:0").parse().unwrap()).unwrap();
    sock.connect(addr).await.unwrap()
}

/// Read until the peer closes or `limit` passes; what was read and whether it closed.
async fn read_until_closed(s: &mut tokio::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_bodies_are_refused_before_they_are_read() {
    use tokio::io::AsyncWriteExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    // 50 posts announcing 30 MB each: the 401 comes after the headers and
    // 64 KiB, the other 29.9 MB never sent.
    for i in 0..50 {
        let mut s = raw_conn(&d, "127.0.0.1").await;
        let auth = if i % 2 == 0 { "" } else { "Authorization: Bearer wrong\r\n" };
        let head = format!(
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            30 << 20
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&vec![b' '; 64 << 10]).await.unwrap();
        let (got, _) = read_until_closed(&mut s, Duration::from_secs(10)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 401"), "request {i}: {text}");
        assert!(text.contains("\"error\""), "{text}");
    }
    // Authenticated, but over the route's limit: 413, and the daemon is fine.
    d.forward("big-body", "beta", "h100", 8).await;
    d.start_job("big-body", "beta").await;
    let huge = serde_json::json!({"state": "running", "remote_job_id": 1, "reason": "x".repeat(100 << 10)});
    let (s, _) = d.status_raw("big-body", "alpha", huge).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    // A 1 MiB output chunk fits its route's limit.
    assert_eq!(d.chunk("big-body", "alpha", Stream::Stdout, 0, &vec![7u8; 1 << 20]).await.0, StatusCode::OK);
    assert_eq!(d.job("big-body").await.stdout_len, 1 << 20);
    d.stop().await;
}

fn limited_config(dir: &Path, header_read_timeout_s: f64) -> Config {
    let mut c = config(dir);
    c.limits = fleet_metasched::config::LimitsConfig {
        max_connections: 40,
        max_connections_per_ip: 8,
        header_read_timeout_s,
        idle_timeout_s: 31.0,
    };
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_header_connections_are_closed() {
    use tokio::io::AsyncWriteExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), limited_config(tmp.path(), 1.0)).await;
    // Silent: closed after header_read_timeout_s.
    let mut silent = raw_conn(&d, "127.0.0.1").await;
    let t0 = std::time::Instant::now();
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(closed, "a connection that sends nothing is closed");
    println!("silent connection closed after {:?} (header_read_timeout_s = 1)", t0.elapsed());
    // Half a request head: closed too (hyper's header-read timeout).
    let mut slow = raw_conn(&d, "127.0.0.1").await;
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let t0 = std::time::Instant::now();
    let (_, closed) = read_until_closed(&mut slow, Duration::from_secs(5)).await;
    assert!(closed, "a request head that never ends is cut off");
    println!("slow-header connection closed after {:?}", t0.elapsed());
    // A complete request on the same kind of connection is answered.
    let mut fine = raw_conn(&d, "127.0.0.1").await;
    fine.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let (got, closed) = read_until_closed(&mut fine, Duration::from_secs(5)).await;
    assert!(closed && String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    d.stop().await;
}

/// One keep-alive request on `s`; the status of its answer (body read).
async fn request_on(s: &mut tokio::net::TcpStream, path: &str, auth: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&got[..end]).to_string();
            let len: usize = text
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                .unwrap_or(0);
            while got.len() < end + 4 + len {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed in the middle of an answer");
                got.extend_from_slice(&buf[..n]);
            }
            return text.split(' ').nth(1).unwrap().parse().unwrap();
        }
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed before an answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
}

/// Open `n` connections from `local` that each send half a request head;
/// how many the daemon closed within `window`, and the open ones.
async fn flood(d: &Daemon, local: &str, n: usize, window: Duration) -> (usize, Vec<tokio::net::TcpStream>) {
    use tokio::io::AsyncWriteExt;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let mut s = raw_conn(d, local).await;
        set.spawn(async move {
            let _ = s.write_all(b"GET /health HTTP/1.1\r\n").await;
            let (_, closed) = read_until_closed(&mut s, window).await;
            (s, closed)
        });
    }
    let (mut closed, mut open) = (0, Vec::new());
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            (_, true) => closed += 1,
            (s, false) => open.push(s),
        }
    }
    (closed, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_caps_keep_agents_served_under_a_flood() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), limited_config(tmp.path(), 10.0)).await;
    // One source floods with slow heads: it keeps 8 connections, the other
    // 22 are closed at once, and an agent elsewhere is served meanwhile.
    let (closed, held) = flood(&d, "127.0.0.2", 30, Duration::from_millis(500)).await;
    assert_eq!((closed, held.len()), (22, 8), "max_connections_per_ip = 8");
    let agent = reqwest::Client::new();
    let r = agent.get(format!("{}/v1/clusters", d.url)).header("Authorization", bearer("alpha")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "an agent is served during the flood");
    assert_eq!(r.json::<FleetView>().await.unwrap().clusters.len(), 3);
    drop((held, agent));
    // (the daemon sees those connections end)
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An agent's keep-alive connection, opened before the flood (the
    // oldest): its token makes it trusted.
    let mut agent_conn = raw_conn(&d, "127.0.0.3").await;
    assert_eq!(request_on(&mut agent_conn, "/v1/clusters", &bearer("alpha")).await, 200);
    // Five sources take every other slot (40 in all): each connection over
    // the total closes the oldest one no agent's token was shown on, never
    // the agent's, so that no flood from any number of sources holds every
    // slot; a new connection is served.
    let mut fill = Vec::new();
    for i in 1..=5 {
        let (closed, held) = flood(&d, &format!("127.0.1.{i}"), 8, Duration::from_millis(100)).await;
        assert_eq!(closed, 0);
        fill.extend(held);
    }
    let mut extra = raw_conn(&d, "127.0.0.1").await;
    assert_eq!(request_on(&mut extra, "/v1/clusters", &bearer("beta")).await, 200, "served over a full table");
    let mut closed_fill = 0;
    for s in fill.iter_mut() {
        if read_until_closed(s, Duration::from_millis(20)).await.1 {
            closed_fill += 1;
        }
    }
    assert_eq!(closed_fill, 2, "one flood connection closed for each new connection over the cap");
    assert_eq!(request_on(&mut agent_conn, "/v1/clusters", &bearer("alpha")).await, 200, "the agent's stayed");
    drop((fill, extra, agent_conn));
    let t0 = std::time::Instant::now();
    loop {
        let r = reqwest::Client::new()
            .get(format!("{}/v1/clusters", d.url))
            .header("Authorization", bearer("alpha"))
            .send()
            .await;
        if r.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "service did not resume after the flood");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    d.stop().await;
}

#[tokio::test]
async fn state_files_are_private_and_fixed_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("priv", "beta", "h100", 8).await;
    d.start_job("priv", "beta").await;
    d.chunk("priv", "alpha", Stream::Stdout, 0, b"secret output").await;
    let state = tmp.path().join("state");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let files = [
        state.join("metasched.db"),
        state.join("metasched.db-wal"),
        state.join("metasched.db-shm"),
        state.join("output/priv.stdout"),
    ];
    let check = |when: &str| {
        assert_eq!(mode(&state), 0o700, "{when}: state dir");
        assert_eq!(mode(&state.join("output")), 0o700, "{when}: output dir");
        for f in &files {
            assert_eq!(mode(f), 0o600, "{when}: {}", f.display());
        }
    };
    check("fresh");
    d.stop().await;
    // An older version's modes are fixed at the next start.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(state.join("output"), std::fs::Permissions::from_mode(0o755)).unwrap();
    for f in files.iter().filter(|f| f.exists()) {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let d = Daemon::start(tmp.path(), Clock::default()).await;
    d.job("priv").await;
    check("after restart");
    d.stop().await;
}

#[tokio::test]
async fn a_heartbeat_beyond_the_declared_inventory_quarantines_the_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.clusters[0].max_nodes = Some(2);
    cfg.clusters[0].max_gpus = Some([("h100".to_string(), 16)].into_iter().collect());
    let d = Daemon::start_with(tmp.path(), Clock::default(), cfg).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    let v: FleetView = d.ok(reqwest::Method::GET, "/v1/clusters", "Bearer admin-secret", None).await;
    assert!(v.clusters[0].healthy && v.clusters[0].unhealthy_reason.is_empty(), "{:?}", v.clusters[0]);
    d.forward("q1", "beta", "h100", 8).await;
    assert_eq!(d.start_job("q1", "beta").await.target.as_deref(), Some("alpha"));
    // alpha advertises 64 H100 on 8 nodes to capture work.
    let fake = Heartbeat {
        cluster: "alpha".into(),
        scheduler: "slurm".into(),
        nodes: (0..8)
            .map(|i| NodeCapacity {
                name: format!("fake{i}"),
                gpu_type: Some("h100".into()),
                gpus_total: 8,
                gpus_free: 8,
                state: "idle".into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let v: FleetView = d
        .ok(reqwest::Method::POST, "/v1/heartbeat", &bearer("alpha"), Some(serde_json::to_value(&fake).unwrap()))
        .await;
    let alpha = &v.clusters[0];
    assert!(!alpha.healthy, "{alpha:?}");
    assert!(alpha.unhealthy_reason.contains("quarantined: heartbeat reports 8 nodes, max_nodes is 2"), "{alpha:?}");
    assert_eq!(alpha.gpus[0].total, 16, "the fake capacity is not believed");
    // Its job not yet submitted moves; new work goes elsewhere.
    assert!(d.work("alpha").await.submit.is_empty());
    assert_eq!(d.job("q1").await.target.as_deref(), Some("gamma"));
    // A valid heartbeat afterwards does not lift it.
    d.heartbeat("alpha", 16).await;
    d.forward("q2", "beta", "h100", 8).await;
    assert_eq!(d.start_job("q2", "beta").await.target.as_deref(), Some("gamma"));
    let v: FleetView = d.ok(reqwest::Method::GET, "/v1/clusters", &bearer("beta"), None).await;
    assert!(!v.clusters[0].healthy && v.clusters[0].unhealthy_reason.starts_with("quarantined"));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rotate_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    let extra = tmp.path().join("alpha-extra.token");
    std::fs::write(&extra, "alpha-extra\n").unwrap();
    cfg.clusters[0].token_files = vec![extra.clone()];
    let d = Daemon::start_with(tmp.path(), Clock::default(), cfg).await;
    let status_with = |t: &'static str| {
        let (url, http) = (d.url.clone(), d.http.clone());
        async move {
            http.get(format!("{url}/v1/clusters"))
                .header("Authorization", format!("Bearer {t}"))
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(status_with("secret-alpha").await, StatusCode::OK);
    assert_eq!(status_with("alpha-extra").await, StatusCode::OK, "token_files are accepted too");
    assert_eq!(status_with("alpha-new").await, StatusCode::UNAUTHORIZED);
    // Rotation, step 1: old and new both valid (SIGHUP's path).
    std::fs::write(tmp.path().join("alpha.token"), "secret-alpha\nalpha-new\n").unwrap();
    assert_eq!(d.control.reload_tokens().await, Some(Ok(())));
    assert_eq!(status_with("secret-alpha").await, StatusCode::OK);
    assert_eq!(status_with("alpha-new").await, StatusCode::OK);
    // A job token minted with the new secret is accepted as well.
    d.forward("rot", "alpha", "a100", 1).await;
    let t = auth::job_token("alpha-new", "rot");
    let (s, _) = d.call(reqwest::Method::GET, "/v1/jobs/rot", &format!("FleetJob {t}"), None).await;
    assert_eq!(s, StatusCode::OK);
    // A broken file keeps the tokens in use.
    std::fs::write(tmp.path().join("alpha.token"), "\n  \n").unwrap();
    let e = d.control.reload_tokens().await.unwrap().unwrap_err();
    assert!(e.contains("alpha.token is empty"), "{e}");
    assert_eq!(status_with("alpha-new").await, StatusCode::OK);
    // Two principals with one token is refused.
    std::fs::write(tmp.path().join("alpha.token"), "secret-beta\n").unwrap();
    let e = d.control.reload_tokens().await.unwrap().unwrap_err();
    assert!(e.contains("share a token"), "{e}");
    // Step 2: the old one removed; picked up from the file's change alone.
    std::fs::write(tmp.path().join("alpha.token"), "alpha-new\n").unwrap();
    let t0 = std::time::Instant::now();
    while status_with("secret-alpha").await != StatusCode::UNAUTHORIZED {
        assert!(t0.elapsed() < Duration::from_secs(10), "the changed token file was not re-read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status_with("alpha-new").await, StatusCode::OK);
    d.stop().await;
}

#[tokio::test]
async fn list_filters_and_pages() {
    use reqwest::Method as M;
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    // (only alpha has H100s free: the placed jobs are both there)
    d.heartbeat("gamma", 0).await;
    let admin = "Bearer admin-secret";
    // Five jobs, one second apart: j0..j4; users ann (j0, j2, j4) and bob (j1, j3).
    let t0 = d.clock.now();
    for i in 0..5u32 {
        let user = if i % 2 == 0 { "ann" } else { "bob" };
        let fwd = ForwardRequest {
            fleet_job_id: format!("j{i}"),
            request: JobRequest { user_name: Some(user.into()), ..request("beta", "h100", 1) },
            tentative_target: "alpha".into(),
            early_start: false,
        };
        let r: JobRecord = d.ok(M::POST, "/v1/jobs", &bearer("beta"), Some(serde_json::to_value(fwd).unwrap())).await;
        assert_eq!(r.user.as_deref(), Some(user), "the record names the submitter");
        d.clock.advance(Duration::from_secs(1));
    }
    // j1 and j3 start (stand-ins 101 and 103) and are placed.
    for i in [1, 3] {
        let body = serde_json::to_value(StartRequest { origin_job_id: 100 + i, ..Default::default() }).unwrap();
        let id = format!("j{i}");
        let _: JobRecord = d.ok(M::POST, &format!("/v1/jobs/{id}/start"), &job_auth("beta", &id), Some(body)).await;
        let (s, v) = d.confirm(&id, &bearer("beta"), 100 + i, true).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let ids = |l: Vec<JobRecord>| l.into_iter().map(|j| j.fleet_job_id).collect::<Vec<_>>();
    let dr = &d;
    let list =
        |q: String| async move { ids(dr.ok::<Vec<JobRecord>>(M::GET, &format!("/v1/jobs{q}"), admin, None).await) };
    assert_eq!(list(String::new()).await, ["j0", "j1", "j2", "j3", "j4"], "default: everything, oldest first");
    assert_eq!(list("?order=desc".into()).await, ["j4", "j3", "j2", "j1", "j0"]);
    assert_eq!(list("?user=ann".into()).await, ["j0", "j2", "j4"]);
    assert_eq!(list("?user=bob&order=desc".into()).await, ["j3", "j1"]);
    assert!(list("?user=carol".into()).await.is_empty());
    assert_eq!(list("?origin_job=103".into()).await, ["j3"]);
    assert!(list("?origin_job=104".into()).await.is_empty());
    assert_eq!(list(format!("?since={}", t0 + 2.0)).await, ["j2", "j3", "j4"]);
    assert_eq!(list(format!("?since={}&user=bob", t0 + 2.0)).await, ["j3"]);
    assert_eq!(list("?state=held".into()).await, ["j0", "j2", "j4"]);
    let placed = list("?state=assigned".into()).await;
    assert_eq!(placed, ["j1", "j3"]);
    let target = d.job("j1").await.target.expect("j1 is placed");
    assert_eq!(list(format!("?target={target}")).await, ["j1", "j3"]);
    assert!(list("?target=nowhere".into()).await.is_empty());
    assert_eq!(list("?origin=beta&active=true&user=ann".into()).await, ["j0", "j2", "j4"], "old parameters still work");
    // Pages, newest first.
    assert_eq!(list("?order=desc&limit=2".into()).await, ["j4", "j3"]);
    assert_eq!(list("?order=desc&limit=2&offset=2".into()).await, ["j2", "j1"]);
    assert_eq!(list("?order=desc&limit=2&offset=4".into()).await, ["j0"]);
    assert!(list("?order=desc&limit=2&offset=6".into()).await.is_empty());
    // An agent still sees only its own cluster's jobs, filters or not
    // (ann's jobs are held: beta's alone).
    let other: Vec<JobRecord> = d.ok(M::GET, "/v1/jobs?user=ann", &bearer("gamma"), None).await;
    assert!(other.is_empty(), "{:?}", ids(other));
    let own: Vec<JobRecord> = d.ok(M::GET, "/v1/jobs?user=ann", &bearer("beta"), None).await;
    assert_eq!(ids(own), ["j0", "j2", "j4"]);
    // Bad parameters: 400 with the problem named.
    for (q, needle) in [
        ("?limit=0", "limit=0"),
        ("?limit=10001", "limit=10001"),
        ("?limit=x", "limit"),
        ("?offset=2", "offset needs a limit"),
        ("?since=NaN", "since"),
        ("?order=sideways", "sideways"),
        ("?origin_job=-1", "origin_job"),
        ("?usr=ann", "usr"),
        ("?state=bogus", "bogus"),
    ] {
        let (s, v) = d.call(M::GET, &format!("/v1/jobs{q}"), admin, None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
        let e = v["error"].as_str().unwrap_or_default();
        assert!(e.contains(needle), "{q}: error {e:?} should name {needle:?}");
    }
    d.stop().await;
}

/// `POST /v1/jobs/{id}/signal` with `auth`.
async fn send_signal(d: &Daemon, id: &str, auth: &str, signal: &str, scope: &str) -> (StatusCode, Value) {
    let body = serde_json::json!({ "signal": signal, "scope": scope });
    d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/signal"), auth, Some(body)).await
}

fn order(id: &str, signal: &str, scope: SignalScope) -> SignalOrder {
    SignalOrder { fleet_job_id: id.into(), signal: signal.into(), scope }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_are_queued_for_the_target_handed_out_once_and_wake_its_long_poll() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("sg", "beta", "h100", 8).await;
    let job = job_auth("beta", "sg");

    // Held: nothing runs it yet.
    let (s, v) = send_signal(&d, "sg", &job, "USR1", "full").await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("held until its stand-in starts"), "{v}");
    assert_eq!(v.get("terminal"), None, "{v}");
    // Assigned, not yet submitted at alpha.
    d.start_job("sg", "beta").await;
    let (s, v) = send_signal(&d, "sg", &job, "USR1", "full").await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().contains("not submitted there yet"), "{v}");
    assert_eq!(d.work("alpha").await.signal, [], "a refused signal is nobody's work");

    // Running at alpha: queued, 202 with the (unchanged) record.
    assert_eq!(d.status("sg", "alpha", st(JobState::Running)).await.0, StatusCode::OK);
    let before = d.job("sg").await;
    let (s, v) = send_signal(&d, "sg", &job, "USR1", "full").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let r: JobRecord = serde_json::from_value(v).unwrap();
    assert_eq!((r.state, r.target.as_deref(), r.updated_at), (JobState::Running, Some("alpha"), before.updated_at));
    // The origin agent and the admin may signal too, with every scope.
    assert_eq!(send_signal(&d, "sg", &bearer("beta"), "USR2", "batch").await.0, StatusCode::ACCEPTED);
    assert_eq!(send_signal(&d, "sg", "Bearer admin-secret", "TERM", "steps").await.0, StatusCode::ACCEPTED);
    // The same signal and scope again before delivery: one order.
    assert_eq!(send_signal(&d, "sg", &job, "USR1", "full").await.0, StatusCode::ACCEPTED);
    assert_eq!(send_signal(&d, "sg", &job, "USR1", "batch").await.0, StatusCode::ACCEPTED);
    // Neither the origin nor anyone else gets the orders: only the target, once, in order.
    assert_eq!(d.work("beta").await.signal, []);
    assert_eq!(d.work("gamma").await.signal, []);
    let w = d.work("alpha").await;
    assert_eq!(
        w.signal,
        [
            order("sg", "USR1", SignalScope::Full),
            order("sg", "USR2", SignalScope::Batch),
            order("sg", "TERM", SignalScope::Steps),
            order("sg", "USR1", SignalScope::Batch),
        ]
    );
    assert!(!w.is_empty());
    assert_eq!(d.work("alpha").await.signal, [], "handed out once");
    assert!(d.work("alpha").await.is_empty());

    // An order waiting for the agent wakes its long-poll at once ...
    let target = tokio::spawn(long_poll(d.url.clone(), "alpha", 60_000));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!target.is_finished(), "nothing to do yet");
    let t0 = std::time::Instant::now();
    assert_eq!(send_signal(&d, "sg", &job, "HUP", "full").await.0, StatusCode::ACCEPTED);
    let (w, _) = target.await.unwrap();
    println!("signal -> target long-poll answered in {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    assert_eq!(w.signal, [order("sg", "HUP", SignalScope::Full)]);

    // ... and survives a restart until it is handed out.
    assert_eq!(send_signal(&d, "sg", &job, "CONT", "full").await.0, StatusCode::ACCEPTED);
    let dir = d.dir.clone();
    d.stop().await;
    let d = Daemon::start(&dir, Clock::default()).await;
    assert_eq!(d.work("alpha").await.signal, [order("sg", "CONT", SignalScope::Full)]);

    // Pending again (requeued at alpha): still the target's to deliver.
    assert_eq!(d.status("sg", "alpha", st(JobState::Pending)).await.0, StatusCode::OK);
    assert_eq!(send_signal(&d, "sg", &job, "USR1", "full").await.0, StatusCode::ACCEPTED);
    // Finished before the agent took it: the order is dropped, not handed out.
    let done = StatusUpdate { exit_code: Some(0), ..st(JobState::Completed) };
    assert_eq!(d.status("sg", "alpha", done).await.0, StatusCode::OK);
    assert_eq!(d.work("alpha").await.signal, []);
    // Terminal: 409 terminal.
    let (s, v) = send_signal(&d, "sg", &job, "USR1", "full").await;
    assert_eq!((s, &v["terminal"]), (StatusCode::CONFLICT, &Value::Bool(true)), "{v}");
    assert!(v["error"].as_str().unwrap().contains("already completed"), "{v}");
    d.stop().await;
}

/// A signal is for the run it was sent to: an order still waiting when its
/// job runs again at the same cluster (a new epoch) is dropped, not handed
/// to the new run; sent again, it is the new run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_waiting_when_its_job_runs_again_at_the_same_cluster_is_not_the_new_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    // Only alpha may run it (--fleet-to=alpha).
    let mut req = request("beta", "h100", 8);
    req.fleet.to = vec!["alpha".into()];
    let fwd = ForwardRequest {
        fleet_job_id: "ep".into(),
        request: req,
        tentative_target: "alpha".into(),
        early_start: false,
    };
    let _: JobRecord =
        d.ok(reqwest::Method::POST, "/v1/jobs", &bearer("beta"), Some(serde_json::to_value(fwd).unwrap())).await;
    assert_eq!(d.start_job("ep", "beta").await.target.as_deref(), Some("alpha"));
    assert_eq!(d.status("ep", "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    let job = job_auth("beta", "ep");
    assert_eq!(send_signal(&d, "ep", &job, "USR1", "full").await.0, StatusCode::ACCEPTED);
    // Before alpha's agent takes the order, the run turns out never to have
    // started (a launch Slurm lost): the job runs again at alpha, epoch 2.
    let lost = StatusUpdate {
        died: Some("launch failed requeued held".into()),
        never_started: true,
        ..at(JobState::Failed, 1)
    };
    assert_eq!(d.status("ep", "alpha", lost).await.0, StatusCode::OK);
    let r = d.job("ep").await;
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Assigned, Some("alpha"), 2), "{}", r.reason);
    assert_eq!(d.work("alpha").await.signal, [], "epoch 1's signal is not epoch 2's");
    // Sent to the new run: delivered.
    assert_eq!(d.status("ep", "alpha", at(JobState::Running, 2)).await.0, StatusCode::OK);
    assert_eq!(send_signal(&d, "ep", &job, "USR1", "full").await.0, StatusCode::ACCEPTED);
    assert_eq!(d.work("alpha").await.signal, [order("ep", "USR1", SignalScope::Full)]);
    d.stop().await;
}

#[tokio::test]
async fn signal_auth_and_validation() {
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("sa", "beta", "h100", 8).await;
    d.forward("other", "beta", "h100", 8).await;
    d.start_job("sa", "beta").await;
    assert_eq!(d.status("sa", "alpha", st(JobState::Running)).await.0, StatusCode::OK);
    let job = job_auth("beta", "sa");
    // Who may: the job's own token, the origin agent, the admin. Who may not:
    for (auth, want) in [
        (bearer("alpha"), StatusCode::FORBIDDEN), // the target agent: it delivers, it does not order
        (bearer("gamma"), StatusCode::FORBIDDEN), // an unrelated cluster
        (job_auth("beta", "other"), StatusCode::UNAUTHORIZED), // another job's token
        (job_auth("gamma", "sa"), StatusCode::UNAUTHORIZED), // this id, minted by the wrong cluster
        ("Bearer nope".into(), StatusCode::UNAUTHORIZED),
        (String::new(), StatusCode::UNAUTHORIZED),
    ] {
        let (s, v) = send_signal(&d, "sa", &auth, "USR1", "full").await;
        assert_eq!(s, want, "{auth:?}: {v}");
    }
    assert_eq!(d.work("alpha").await.signal, [], "no refused signal was queued");
    // What may be sent: signal names of the fixed list, a known scope.
    for (body, needle) in [
        (serde_json::json!({"signal": "SIGUSR1", "scope": "full"}), "write USR1, without SIG"),
        (serde_json::json!({"signal": "usr1", "scope": "full"}), "write USR1, in upper case"),
        (serde_json::json!({"signal": "10", "scope": "full"}), "unknown signal \"10\""),
        (serde_json::json!({"signal": "SEGV", "scope": "full"}), "expected one of HUP, INT"),
        (serde_json::json!({"signal": "USR1;rm -rf /\n", "scope": "full"}), "unknown signal \"USR1;rm -rf /\\n\""),
        (serde_json::json!({"signal": "", "scope": "full"}), "unknown signal \"\""),
        (serde_json::json!({"signal": "USR1", "scope": "everything"}), "invalid signal request"),
        (serde_json::json!({"signal": "USR1"}), "missing field `scope`"),
        (serde_json::json!({"scope": "full"}), "missing field `signal`"),
        (serde_json::json!("USR1"), "invalid signal request"),
    ] {
        let (s, v) = d.call(reqwest::Method::POST, "/v1/jobs/sa/signal", &job, Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{body}: {v} lacks {needle:?}");
    }
    let (s, v) = send_signal(&d, "sa", &job, &"A".repeat(10_000), "full").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().len() < 400, "a hostile name is not echoed whole: {v}");
    let (s, _) = send_signal(&d, "sa", &job, &"A".repeat(100_000), "full").await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "bodies beyond 64 KiB are not read");
    assert_eq!(d.work("alpha").await.signal, [], "no invalid signal was queued");
    // Unknown job.
    assert_eq!(send_signal(&d, "nope", "Bearer admin-secret", "USR1", "full").await.0, StatusCode::NOT_FOUND);
    // Every valid name is accepted.
    for name in fleet_api::api::SIGNAL_NAMES {
        assert_eq!(send_signal(&d, "sa", &job, name, "batch").await.0, StatusCode::ACCEPTED, "{name}");
    }
    let got: Vec<String> = d.work("alpha").await.signal.into_iter().map(|o| o.signal).collect();
    assert_eq!(got, fleet_api::api::SIGNAL_NAMES);
    d.stop().await;
}

// ---- failover: health, grace, epochs ---------------------------------

/// The default test fleet with `[health]`: Degraded after 3 missed beats
/// of 1 s, jobs moved after `grace_s` more.
fn health_config(dir: &Path, grace_s: f64) -> Config {
    Config {
        health: Some(fleet_metasched::config::HealthConfig {
            heartbeat_interval_s: 1.0,
            missed_heartbeats: 3,
            grace_s,
            max_migrations: 3,
            job_lease_s: 2.0,
            job_lease_margin_s: 1.0,
            first_lease_s: None,
            end_wait_s: None,
            stranded_s: None,
        }),
        ..config(dir)
    }
}

/// A job from beta that may restart from scratch (`#FLEET interruptible`).
async fn forward_restartable(d: &Daemon, id: &str) {
    forward_h100(d, id, true, Some(60)).await;
}

/// An 8-GPU H100 job from beta, restartable (`#FLEET interruptible`) or
/// not, under `time_limit_min`.
async fn forward_h100(d: &Daemon, id: &str, interruptible: bool, time_limit_min: Option<u32>) {
    let mut request = request("beta", "h100", 8);
    let script: &[u8] = if interruptible { b"#!/bin/sh\n#FLEET interruptible\necho step\n" } else { b"#!/bin/sh\n" };
    request.script = Some(script.to_vec());
    request.time_limit_min = time_limit_min;
    let fwd = ForwardRequest { fleet_job_id: id.into(), request, tentative_target: "alpha".into(), early_start: false };
    let _: JobRecord =
        d.ok(reqwest::Method::POST, "/v1/jobs", &bearer("beta"), Some(serde_json::to_value(fwd).unwrap())).await;
}

/// A second of the daemon's clock, `secs` times, with beta and gamma
/// beating (and alpha, when `with_alpha`).
async fn beat(d: &Daemon, secs: u32, with_alpha: bool) {
    for _ in 0..secs {
        d.clock.advance(Duration::from_secs(1));
        d.heartbeat("beta", 16).await;
        d.heartbeat("gamma", 16).await;
        if with_alpha {
            d.heartbeat("alpha", 16).await;
        }
    }
}

/// `POST /v1/jobs/{id}/end` with the run's checkpoint token at `cluster`.
async fn claim_end(d: &Daemon, id: &str, cluster: &str, body: Value) -> (StatusCode, Value) {
    let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of(cluster), id));
    d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/end"), &auth, Some(body)).await
}

/// A daemon whose clusters all beat with 16 free GPUs but gamma (none
/// yet: every job placed from beta goes to alpha); `end_wait_s`, when
/// given, with 20 s of grace.
async fn ends_daemon(dir: &Path, end_wait_s: Option<f64>) -> Daemon {
    let d = match end_wait_s {
        Some(w) => {
            let mut config = health_config(dir, 20.0);
            if let Some(h) = config.health.as_mut() {
                h.end_wait_s = Some(w);
            }
            Daemon::start_with(dir, Clock::default(), config).await
        }
        None => Daemon::start(dir, Clock::default()).await,
    };
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    d.heartbeat("gamma", 0).await;
    d
}

fn at(state: JobState, epoch: u64) -> StatusUpdate {
    StatusUpdate { epoch: Some(epoch), ..st(state) }
}

async fn chunk_at(d: &Daemon, id: &str, cluster: &str, offset: u64, data: &[u8], epoch: Option<u64>) -> StatusCode {
    let c = OutputChunk { stream: Stream::Stdout, offset, data: data.to_vec(), epoch };
    d.call(
        reqwest::Method::POST,
        &format!("/v1/jobs/{id}/output"),
        &bearer(cluster),
        Some(serde_json::to_value(c).unwrap()),
    )
    .await
    .0
}

async fn fence(d: &Daemon, cluster: &str, runs: &[(&str, u64)]) -> Vec<String> {
    let body = serde_json::json!({"runs": runs.iter().map(|(id, e)| serde_json::json!({"fleet_job_id": id, "epoch": e})).collect::<Vec<_>>()});
    let r: fleet_api::api::FenceReply =
        d.ok(reqwest::Method::POST, "/v1/agent/fence", &bearer(cluster), Some(body)).await;
    r.stale.into_iter().map(|s| s.fleet_job_id).collect()
}

/// `health` and `unhealthy_reason` of `cluster` in the view.
async fn health_of(d: &Daemon, cluster: &str) -> (String, String) {
    let v: FleetView = d.ok(reqwest::Method::GET, "/v1/clusters", "Bearer admin-secret", None).await;
    let c = v.clusters.into_iter().find(|c| c.name == cluster).unwrap();
    (c.health, c.unhealthy_reason)
}

/// A daemon (grace 20 s) with every cluster beating and the restartable job
/// `mv` from beta started at alpha, epoch 1.
async fn restartable_at_alpha(dir: &Path) -> Daemon {
    let d = Daemon::start_with(dir, Clock::default(), health_config(dir, 20.0)).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    forward_restartable(&d, "mv").await;
    let r = d.start_job("mv", "beta").await;
    assert_eq!((r.target.as_deref(), r.epoch), (Some("alpha"), 1), "first placement: epoch 1");
    d
}

/// The meta-scheduler itself did not run for a minute (its host paused, the
/// process stopped: both its clocks jump). Every cluster looks silent for a
/// minute, but none was: no job moves, no cluster turns unhealthy, and a
/// cluster that stays silent afterwards is judged by its silence since.
#[tokio::test]
async fn a_paused_meta_scheduler_holds_no_cluster_to_the_silence_it_did_not_hear() {
    let tmp = tempfile::tempdir().unwrap();
    let d = restartable_at_alpha(tmp.path()).await;
    assert_eq!(d.status("mv", "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);

    d.clock.pause(Duration::from_secs(60));
    // Whatever runs first after the pause (the sweeper, a heartbeat) sees it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d.heartbeat("beta", 16).await;
    let r = d.job("mv").await;
    assert_eq!(
        (r.state, r.target.as_deref(), r.epoch, r.migrations),
        (JobState::Running, Some("alpha"), 1, 0),
        "{}",
        r.reason
    );
    assert_eq!(health_of(&d, "alpha").await.0, "healthy", "60 s unheard, none of it alpha's");

    // alpha then stays silent (beta and gamma beat): it moves after 3 + 20 s
    // of its own silence, and the reason counts only that.
    for _ in 0..25 {
        d.clock.advance(Duration::from_secs(1));
        d.heartbeat("beta", 16).await;
        d.heartbeat("gamma", 16).await;
    }
    let r = d.job("mv").await;
    assert_eq!((r.target.as_deref(), r.epoch, r.migrations), (Some("gamma"), 2, 1), "{}", r.reason);
    let silent: f64 = r
        .reason
        .split("has sent no heartbeat for ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(f64::NAN);
    assert!((23.0..30.0).contains(&silent), "{}", r.reason);
    d.stop().await;
}

#[tokio::test]
async fn a_silent_clusters_running_job_moves_after_its_grace_period_and_the_old_epoch_is_fenced() {
    let tmp = tempfile::tempdir().unwrap();
    let d = restartable_at_alpha(tmp.path()).await;
    let a = d.work("alpha").await.submit.pop().unwrap();
    assert_eq!((a.epoch, a.resume_from.as_deref()), (1, None));
    assert_eq!(d.status("mv", "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    assert_eq!(chunk_at(&d, "mv", "alpha", 0, b"step 1\n", Some(1)).await, StatusCode::OK);
    let beat = |secs| {
        let d = &d;
        async move {
            for _ in 0..secs {
                d.clock.advance(Duration::from_secs(1));
                d.heartbeat("beta", 16).await;
                d.heartbeat("gamma", 16).await;
            }
        }
    };
    // alpha misses 4 beats: Degraded (no new work), its job stays.
    beat(4).await;
    let (h, why) = health_of(&d, "alpha").await;
    assert_eq!(h, "degraded", "{why}");
    assert!(why.starts_with("no heartbeat for "), "{why}");
    assert!(why.ends_with(" s; no new work; its fleet jobs move after 23 s of silence"), "{why}");
    let r = d.job("mv").await;
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Running, Some("alpha"), 1));
    // Past 3 + 20 s of silence: moved to gamma, a new epoch.
    beat(20).await;
    let r = d.job("mv").await;
    assert_eq!((r.state, r.target.as_deref(), r.epoch, r.migrations), (JobState::Assigned, Some("gamma"), 2, 1));
    assert!(r.reason.starts_with("moved off alpha (epoch 1): alpha has sent no heartbeat for 2"), "{}", r.reason);
    assert!(r.reason.contains(" s (past its grace period)"), "{}", r.reason);
    assert!(r.reason.contains("restarting from the start"), "{}", r.reason);
    assert!(health_of(&d, "alpha").await.1.contains("past its grace period"));
    // One line on stderr says so; the next run's output follows what is there.
    let err = String::from_utf8(d.read_output("mv", "beta", "stderr", 0, 1 << 20).await).unwrap();
    assert!(err.starts_with("fleet: run 1 of job mv at alpha died (alpha has sent no heartbeat"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!((r.stdout_base, r.stderr_base), (7, err.len() as u64));
    let a = d.work("gamma").await.submit.pop().unwrap();
    assert_eq!((a.fleet_job_id.as_str(), a.epoch, a.stdout_base), ("mv", 2, 7));
    // alpha comes back: every report of its copy is stale, named so.
    d.heartbeat("alpha", 16).await;
    for upd in [at(JobState::Running, 1), st(JobState::Completed)] {
        let (s, v) = d.status("mv", "alpha", upd).await;
        assert_eq!(s, StatusCode::CONFLICT, "{v}");
        assert_eq!(v["terminal"], true, "{v}");
        assert!(v["error"].as_str().unwrap().contains("epoch 1 at alpha is stale: the job is now epoch 2"), "{v}");
    }
    assert_eq!(chunk_at(&d, "mv", "alpha", 7, b"step 2\n", Some(1)).await, StatusCode::CONFLICT);
    assert_eq!(chunk_at(&d, "mv", "alpha", 7, b"step 2\n", None).await, StatusCode::CONFLICT);
    assert_eq!(fence(&d, "alpha", &[("mv", 1), ("nope", 3)]).await, ["mv", "nope"]);
    // alpha learns nothing of the job now at gamma: the reason for it is
    // the one for a job that does not exist (no epoch, state or cluster).
    let body = serde_json::json!({"runs": [{"fleet_job_id": "mv", "epoch": 1}, {"fleet_job_id": "nope", "epoch": 3}]});
    let r: fleet_api::api::FenceReply =
        d.ok(reqwest::Method::POST, "/v1/agent/fence", &bearer("alpha"), Some(body)).await;
    let reasons: Vec<&str> = r.stale.iter().map(|s| s.reason.as_str()).collect();
    assert_eq!(reasons, ["the job is not placed at alpha", "the job is not placed at alpha"], "{r:?}");
    // gamma's run is the job now; an old epoch at gamma is refused too.
    assert!(fence(&d, "gamma", &[("mv", 2)]).await.is_empty());
    assert_eq!(fence(&d, "gamma", &[("mv", 1)]).await, ["mv"]);
    assert_eq!(d.status("mv", "gamma", at(JobState::Running, 1)).await.0, StatusCode::CONFLICT);
    assert_eq!(d.status("mv", "gamma", at(JobState::Running, 2)).await.0, StatusCode::OK);
    assert_eq!(chunk_at(&d, "mv", "gamma", 7, b"step 1\n", Some(1)).await, StatusCode::CONFLICT);
    assert_eq!(chunk_at(&d, "mv", "gamma", 7, b"step 1\nstep 2\n", Some(2)).await, StatusCode::OK);
    let done = StatusUpdate {
        exit_code: Some(3),
        final_stdout_len: Some(21),
        final_stderr_len: Some(err.len() as u64),
        ..at(JobState::Failed, 2)
    };
    assert_eq!(d.status("mv", "gamma", done).await.0, StatusCode::OK);
    let r = d.job("mv").await;
    assert_eq!((r.state, r.exit_code, r.output_complete), (JobState::Failed, Some(3), true));
    assert_eq!(d.read_output("mv", "beta", "stdout", 0, 100).await, b"step 1\nstep 1\nstep 2\n");
    d.stop().await;
}

#[tokio::test]
async fn a_dead_run_that_cannot_restart_fails_with_the_reason_and_one_that_can_avoids_its_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), health_config(tmp.path(), 20.0)).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    // Neither checkpointed nor restartable: fails at the origin with why.
    d.forward("once", "beta", "h100", 8).await;
    assert_eq!(d.start_job("once", "beta").await.target.as_deref(), Some("alpha"));
    assert_eq!(d.status("once", "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    let died = StatusUpdate { died: Some("NODE_FAIL at alpha".into()), ..at(JobState::Failed, 1) };
    let (s, v) = d.status("once", "alpha", died.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let r = d.job("once").await;
    assert_eq!((r.state, r.output_complete), (JobState::Failed, true), "{}", r.reason);
    assert!(r.reason.contains("its run at alpha died (alpha reports: NODE_FAIL at alpha) and it has no valid checkpoint and is not restartable"), "{}", r.reason);
    let err = String::from_utf8(d.read_output("once", "beta", "stderr", 0, 1 << 20).await).unwrap();
    assert!(err.starts_with("fleet: job once failed: its run at alpha died"), "{err}");
    // Restartable: placed again at once, away from alpha (which is healthy
    // and cheaper for the first rule) while gamma can take it.
    forward_restartable(&d, "again").await;
    assert_eq!(d.start_job("again", "beta").await.target.as_deref(), Some("alpha"));
    // A report of a died run from another epoch changes nothing.
    let stale = StatusUpdate { epoch: Some(5), ..died.clone() };
    assert_eq!(d.status("again", "alpha", stale).await.0, StatusCode::CONFLICT);
    assert_eq!(d.status("again", "alpha", died).await.0, StatusCode::OK);
    let r = d.job("again").await;
    assert_eq!((r.state, r.target.as_deref(), r.epoch, r.migrations), (JobState::Assigned, Some("gamma"), 2, 1));
    assert!(r.reason.starts_with("moved off alpha (epoch 1): alpha reports: NODE_FAIL at alpha"), "{}", r.reason);
    d.stop().await;
}

#[tokio::test]
async fn an_agents_lease_longer_than_the_grace_period_delays_the_move() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), health_config(tmp.path(), 5.0)).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    let hb = serde_json::json!({"cluster": "alpha", "scheduler": "slurm", "queue_pending": 0, "queue_running": 0,
        "agent_version": "t", "lease_s": 30.0, "nodes": [
            {"name": "a1", "partitions": ["gpu"], "gpu_type": "h100", "gpus_total": 8, "gpus_free": 8, "state": "idle"},
            {"name": "a2", "partitions": ["gpu"], "gpu_type": "h100", "gpus_total": 8, "gpus_free": 8, "state": "idle"}]});
    let _: FleetView = d.ok(reqwest::Method::POST, "/v1/heartbeat", &bearer("alpha"), Some(hb)).await;
    forward_restartable(&d, "leased").await;
    assert_eq!(d.start_job("leased", "beta").await.target.as_deref(), Some("alpha"));
    assert_eq!(d.status("leased", "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    for _ in 0..30 {
        d.clock.advance(Duration::from_secs(1));
        d.heartbeat("gamma", 16).await;
    }
    // 30 s silent: past 3 + 5 s, but the agent may still run it until its
    // 30 s lease is over (3 + 30 s).
    assert_eq!(d.job("leased").await.target.as_deref(), Some("alpha"));
    for _ in 0..4 {
        d.clock.advance(Duration::from_secs(1));
        d.heartbeat("gamma", 16).await;
    }
    assert_eq!(d.job("leased").await.target.as_deref(), Some("gamma"));
    d.stop().await;
}

/// An agent whose scheduler does not answer (slurmctld killed or
/// restarting) goes on beating with `scheduler_error`: its cluster is
/// degraded (no new work) but not silent, so its running jobs are not
/// moved past the grace period and their in-job leases are granted whole.
#[tokio::test]
async fn a_cluster_whose_scheduler_is_down_gets_no_work_but_keeps_its_jobs_and_their_leases() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), health_config(tmp.path(), 5.0)).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    forward_restartable(&d, "runs-on").await;
    assert_eq!(d.start_job("runs-on", "beta").await.target.as_deref(), Some("alpha"));
    assert_eq!(d.status("runs-on", "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    let down = serde_json::json!({"cluster": "alpha", "scheduler": "slurm", "queue_pending": 0, "queue_running": 0,
        "agent_version": "t", "nodes": [], "scheduler_error": "sinfo: Unable to contact slurm controller"});
    let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of("alpha"), "runs-on"));
    // 20 s: well past its grace period (3 + 5 s) had it been silent.
    for _ in 0..20 {
        d.clock.advance(Duration::from_secs(1));
        let v: FleetView = d.ok(reqwest::Method::POST, "/v1/heartbeat", &bearer("alpha"), Some(down.clone())).await;
        let alpha = v.clusters.iter().find(|c| c.name == "alpha").unwrap();
        assert_eq!((alpha.healthy, alpha.health.as_str()), (false, "degraded"), "{alpha:?}");
        assert!(alpha.unhealthy_reason.contains("its scheduler does not answer its agent"), "{alpha:?}");
        d.heartbeat("gamma", 16).await;
        let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
        let (s, v) = d.call(reqwest::Method::POST, "/v1/jobs/runs-on/lease", &auth, Some(body)).await;
        assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{v}");
    }
    let r = d.job("runs-on").await;
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Running, Some("alpha"), 1), "{}", r.reason);
    // New work goes elsewhere.
    forward_restartable(&d, "new").await;
    assert_eq!(d.start_job("new", "beta").await.target.as_deref(), Some("gamma"));
    d.stop().await;
}

#[tokio::test]
async fn installed_but_unavailable_capacity_makes_a_job_wait_not_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), health_config(tmp.path(), 20.0)).await;
    d.heartbeat("beta", 16).await;
    // alpha reports, but Slurm drained both its nodes; gamma never spoke.
    let hb = serde_json::json!({"cluster": "alpha", "scheduler": "slurm", "queue_pending": 0, "queue_running": 0,
        "agent_version": "t", "nodes": [
            {"name": "a1", "partitions": ["gpu"], "gpu_type": "h100", "gpus_total": 8, "gpus_free": 8, "state": "drained"},
            {"name": "a2", "partitions": ["gpu"], "gpu_type": "h100", "gpus_total": 8, "gpus_free": 8, "state": "down*"}]});
    let v: FleetView = d.ok(reqwest::Method::POST, "/v1/heartbeat", &bearer("alpha"), Some(hb.clone())).await;
    let alpha = v.clusters.iter().find(|c| c.name == "alpha").unwrap();
    assert!(alpha.gpus.is_empty() && alpha.installed.iter().map(|s| s.count).sum::<u32>() == 2, "{alpha:?}");
    d.forward("drained", "beta", "h100", 8).await;
    let r = d.start_job("drained", "beta").await;
    assert_eq!(r.state, JobState::Queued, "{}", r.reason);
    assert!(r.reason.starts_with("waiting for a healthy cluster"), "{}", r.reason);
    // More than is installed anywhere is still impossible.
    d.forward("huge", "beta", "h100", 64).await;
    assert_eq!(d.start_job("huge", "beta").await.state, JobState::Failed);
    // A node back: it runs.
    let mut hb = hb;
    hb["nodes"][0]["state"] = "idle".into();
    let _: FleetView = d.ok(reqwest::Method::POST, "/v1/heartbeat", &bearer("alpha"), Some(hb)).await;
    let r = d.job("drained").await;
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Assigned, Some("alpha"), 1));
    d.stop().await;
}

/// `POST /v1/jobs/{id}/time_limit` with `auth`.
async fn send_time_limit(d: &Daemon, id: &str, auth: &str, minutes: u64) -> (StatusCode, Value) {
    let body = serde_json::json!({ "minutes": minutes });
    d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/time_limit"), auth, Some(body)).await
}

#[tokio::test]
async fn time_limits_are_queued_for_the_target_by_the_origin_agent_only_the_latest_one_handed_out() {
    use fleet_api::api::TimeLimitOrder;
    let tmp = tempfile::tempdir().unwrap();
    let d = fleet(tmp.path()).await;
    d.forward("tl", "beta", "h100", 8).await;
    let origin = bearer("beta");
    // Held: nothing runs it yet.
    assert_eq!(send_time_limit(&d, "tl", &origin, 20).await.0, StatusCode::CONFLICT);
    d.start_job("tl", "beta").await;
    assert_eq!(d.status("tl", "alpha", st(JobState::Running)).await.0, StatusCode::OK);
    // Neither the job's token (its user lowers the stand-in's limit in
    // Slurm; the origin agent passes it on), nor the target, nor a stranger.
    for who in [job_auth("beta", "tl"), bearer("alpha"), bearer("gamma")] {
        let (s, v) = send_time_limit(&d, "tl", &who, 20).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{who}: {v}");
    }
    for bad in [0, 366 * 24 * 60 + 1, u64::from(u32::MAX) + 1] {
        let (s, v) = send_time_limit(&d, "tl", &origin, bad).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    assert_eq!(d.work("alpha").await.time_limit, [], "a refused limit is nobody's work");
    // Queued for the target alone; a later one replaces one not handed out.
    let (s, v) = send_time_limit(&d, "tl", &origin, 30).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(send_time_limit(&d, "tl", "Bearer admin-secret", 20).await.0, StatusCode::ACCEPTED);
    assert_eq!(d.work("beta").await.time_limit, []);
    let order = TimeLimitOrder { fleet_job_id: "tl".into(), minutes: 20, raise: false };
    assert_eq!(d.work("alpha").await.time_limit, std::slice::from_ref(&order));
    assert_eq!(d.work("alpha").await.time_limit, [], "handed out once");
    // An operator's raise at home travels as one (the target agent may set
    // it as itself); a request without the flag, as from an older agent, is
    // the user's own update.
    let body = serde_json::json!({ "minutes": 45, "raise": true });
    let (s, v) = d.call(reqwest::Method::POST, "/v1/jobs/tl/time_limit", &origin, Some(body)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let raised = TimeLimitOrder { fleet_job_id: "tl".into(), minutes: 45, raise: true };
    assert_eq!(d.work("alpha").await.time_limit, [raised]);
    // It wakes the target's long-poll.
    let target = tokio::spawn(long_poll(d.url.clone(), "alpha", 60_000));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!target.is_finished(), "nothing to do yet");
    assert_eq!(send_time_limit(&d, "tl", &origin, 20).await.0, StatusCode::ACCEPTED);
    assert_eq!(target.await.unwrap().0.time_limit, [order]);
    // Finished before the agent took it: dropped; then a terminal conflict.
    assert_eq!(send_time_limit(&d, "tl", &origin, 10).await.0, StatusCode::ACCEPTED);
    let done = StatusUpdate { exit_code: Some(0), ..st(JobState::Completed) };
    assert_eq!(d.status("tl", "alpha", done).await.0, StatusCode::OK);
    assert_eq!(d.work("alpha").await.time_limit, []);
    let (s, v) = send_time_limit(&d, "tl", &origin, 10).await;
    assert_eq!((s, &v["terminal"]), (StatusCode::CONFLICT, &Value::Bool(true)), "{v}");
}

/// A run reported running under its in-job lease that never asks for it
/// never started (Slurm lost the launch and shows it RUNNING): after
/// `[health] first_lease_s` it died — moved when restartable, failed with
/// the reason otherwise. A run that asked, or one without the lease, stays.
#[tokio::test]
async fn a_run_that_never_asks_for_its_first_lease_never_started() {
    let tmp = tempfile::tempdir().unwrap();
    // first_lease_s 20 (the clock is the wall clock moved forward: room for a slow machine).
    let mut config = health_config(tmp.path(), 40.0);
    if let Some(h) = config.health.as_mut() {
        h.first_lease_s = Some(20.0);
    }
    let d = Daemon::start_with(tmp.path(), Clock::default(), config).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    // Only alpha has H100s free: every job here starts there (the view
    // takes the GPUs of those placed since its heartbeat).
    d.heartbeat("gamma", 0).await;
    let leased = |state| StatusUpdate { job_lease: true, ..at(state, 1) };
    for id in ["lost", "asked", "older"] {
        forward_restartable(&d, id).await;
        assert_eq!(d.start_job(id, "beta").await.target.as_deref(), Some("alpha"));
    }
    d.forward("once", "beta", "h100", 8).await;
    assert_eq!(d.start_job("once", "beta").await.target.as_deref(), Some("alpha"));
    for id in ["lost", "asked", "once"] {
        assert_eq!(d.status(id, "alpha", leased(JobState::Running)).await.0, StatusCode::OK);
    }
    // An older agent does not say: nothing is expected of its runs.
    assert_eq!(d.status("older", "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    let ask = |id: &'static str| {
        let d = &d;
        async move {
            let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of("alpha"), id));
            let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
            d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/lease"), &auth, Some(body)).await
        }
    };
    let (s, v) = ask("asked").await;
    assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{v}");
    // 10 s: not yet.
    for _ in 0..10 {
        d.clock.advance(Duration::from_secs(1));
        for (c, _) in CLUSTERS {
            d.heartbeat(c, 16).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = d.job("lost").await;
    assert_eq!(r.state, JobState::Running, "within first_lease_s: {}", r.reason);
    // Past 20 s: the lost launch died at alpha.
    for _ in 0..11 {
        d.clock.advance(Duration::from_secs(1));
        for (c, _) in CLUSTERS {
            d.heartbeat(c, 16).await;
        }
    }
    let t0 = std::time::Instant::now();
    let r = loop {
        let r = d.job("lost").await;
        if r.epoch == 2 {
            break r;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "not moved: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((r.state, r.target.as_deref(), r.migrations), (JobState::Assigned, Some("gamma"), 1), "{}", r.reason);
    assert!(r.reason.starts_with("moved off alpha (epoch 1): alpha has reported it running for "), "{}", r.reason);
    assert!(r.reason.contains("its script never asked for its job lease: it never started there"), "{}", r.reason);
    let err = String::from_utf8(d.read_output("lost", "beta", "stderr", 0, 1 << 20).await).unwrap();
    assert!(err.starts_with("fleet: run 1 of job lost at alpha died (alpha has reported it running for"), "{err}");
    // alpha's copy (if it ever runs) is stale; its lease is refused.
    let (s, v) = ask("lost").await;
    assert_eq!((s, v["stale"].as_bool()), (StatusCode::OK, Some(true)), "{v}");
    // Neither checkpointed nor restartable, but nothing of it ran: placed
    // again all the same (nothing runs twice).
    let r = d.job("once").await;
    assert_eq!((r.state, r.epoch, r.migrations), (JobState::Assigned, 2, 1), "{}", r.reason);
    assert!(
        r.reason.contains("its script never asked for its job lease")
            && r.reason.contains("starting it again (its script never started there"),
        "{}",
        r.reason
    );
    // The run that asked, and the one without a lease, run on.
    for id in ["asked", "older"] {
        let r = d.job(id).await;
        assert_eq!((r.state, r.epoch), (JobState::Running, 1), "{id}: {}", r.reason);
    }
    d.stop().await;
}

/// Slurm at the target held a run after a launch it took for failed
/// (`launch failed requeued held`, reported as died). A run whose script
/// claimed its end in this epoch ends as claimed (its exit code, nothing
/// runs again); a run its agent says never started is placed again even
/// when it is not restartable, unless it asked for its job lease (then it
/// did start, and it fails as before when it cannot resume).
#[tokio::test]
async fn a_run_held_after_a_failed_launch_ends_as_its_script_did_or_starts_again_when_nothing_ran() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), health_config(tmp.path(), 20.0)).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    // Only alpha has H100s free: every job here starts there (the view
    // takes the GPUs of those placed since its heartbeat).
    d.heartbeat("gamma", 0).await;
    let ids = ["ended", "ended3", "unstarted", "liar", "started", "other-epoch"];
    for id in ids {
        // None of them restartable, none checkpointed.
        d.forward(id, "beta", "h100", 8).await;
        assert_eq!(d.start_job(id, "beta").await.target.as_deref(), Some("alpha"));
        let up = StatusUpdate { job_lease: true, ..at(JobState::Running, 1) };
        assert_eq!(d.status(id, "alpha", up).await.0, StatusCode::OK);
    }
    let auth = |id: &str| format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of("alpha"), id));
    for id in ["ended", "ended3", "liar", "started", "other-epoch"] {
        let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
        let (s, v) = d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/lease"), &auth(id), Some(body)).await;
        assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{id}: {v}");
    }
    for (id, code) in [("ended", 0), ("ended3", 3)] {
        let body = serde_json::json!({"epoch": 1, "exit_code": code});
        let (s, v) = d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/end"), &auth(id), Some(body)).await;
        assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(true)), "{id}: {v}");
    }
    let held = |never_started: bool, epoch: u64| StatusUpdate {
        died: Some("Slurm at alpha held it after a failed launch (launch failed requeued held)".into()),
        never_started,
        final_stdout_len: Some(0),
        final_stderr_len: Some(0),
        ..at(JobState::Failed, epoch)
    };
    for (id, never_started) in
        [("ended", false), ("ended3", true), ("unstarted", true), ("liar", true), ("started", false)]
    {
        assert_eq!(d.status(id, "alpha", held(never_started, 1)).await.0, StatusCode::OK, "{id}");
    }
    // Its script's end is its result.
    let r = d.job("ended").await;
    assert_eq!((r.state, r.exit_code, r.epoch, r.migrations), (JobState::Completed, Some(0), 1, 0), "{}", r.reason);
    assert!(
        r.reason.starts_with("completed at alpha (exit code 0), as its script claimed; then Slurm at alpha held it"),
        "{}",
        r.reason
    );
    let r = d.job("ended3").await;
    assert_eq!((r.state, r.exit_code, r.epoch, r.migrations), (JobState::Failed, Some(3), 1, 0), "{}", r.reason);
    // Nothing ran: placed again though it is not restartable.
    let r = d.job("unstarted").await;
    assert_eq!(
        (r.state, r.target.as_deref(), r.epoch, r.migrations),
        (JobState::Assigned, Some("gamma"), 2, 1),
        "{}",
        r.reason
    );
    assert!(r.reason.contains("starting it again (its script never started there"), "{}", r.reason);
    // It asked for its lease: its script started, whatever the report says.
    for id in ["liar", "started"] {
        let r = d.job(id).await;
        assert_eq!((r.state, r.epoch, r.migrations), (JobState::Failed, 1, 0), "{id}: {}", r.reason);
        assert!(r.reason.contains("not restartable"), "{id}: {}", r.reason);
    }
    // A report of another epoch than the claim's does not end the job as claimed.
    let body = serde_json::json!({"epoch": 1, "exit_code": 0});
    let (s, v) = d.call(reqwest::Method::POST, "/v1/jobs/other-epoch/end", &auth("other-epoch"), Some(body)).await;
    assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(true)), "{v}");
    let (s, _) = d.status("other-epoch", "alpha", held(false, 2)).await;
    let r = d.job("other-epoch").await;
    assert_ne!(r.state, JobState::Completed, "{s}: {}", r.reason);
    d.stop().await;
}

/// Job `id` (forwarded from beta) started and placed at alpha, running
/// there under its in-job lease (epoch 1, a 2 s lease granted), and, with
/// `end`, the end claim its script sent (recorded).
async fn run_at_alpha_under_lease(d: &Daemon, id: &str, end: Option<Value>) {
    let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of("alpha"), id));
    assert_eq!(d.start_job(id, "beta").await.target.as_deref(), Some("alpha"));
    let up = StatusUpdate { job_lease: true, ..at(JobState::Running, 1) };
    assert_eq!(d.status(id, "alpha", up).await.0, StatusCode::OK);
    let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
    let (s, v) = d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/lease"), &auth, Some(body)).await;
    assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{id}: {v}");
    if let Some(body) = end {
        let (s, v) = d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/end"), &auth, Some(body)).await;
        assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(true)), "{id}: {v}");
    }
}

/// Slurm at the target requeued a run after its script started (it held
/// the job after a launch it took for failed, and killed what ran of it:
/// the script's end claim says signal 15). Its agent reports it died with
/// `slurm_requeued`: the job runs again whatever its restart policy, as
/// native Slurm runs a requeued job, and the re-run is counted in
/// `requeues` with a note. A run whose script claimed an end by an exit
/// code ends as claimed even so; a plain death (no `slurm_requeued`) of a
/// script that claimed a signal ends as claimed (the user's signal).
#[tokio::test]
async fn a_run_slurm_requeued_after_it_started_runs_again_and_counts_as_a_requeue() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), health_config(tmp.path(), 20.0)).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    // Only alpha has H100s free: every job here starts there (the view
    // takes the GPUs of those placed since its heartbeat).
    d.heartbeat("gamma", 0).await;
    // (job, the end its script claimed: (exit code, signal), slurm_requeued)
    type Claim = Option<(Option<i32>, Option<i32>)>;
    let cases: [(&str, Claim, bool); 4] = [
        ("killed-by-slurm", Some((None, Some(15))), true),
        ("end-unknown", None, true),
        ("exited", Some((Some(2), None)), true),
        ("user-signal", Some((None, Some(15))), false),
    ];
    for (id, claim, _) in cases {
        // None of them restartable, none checkpointed.
        d.forward(id, "beta", "h100", 8).await;
        let end =
            claim.map(|(exit_code, signal)| serde_json::json!({"epoch": 1, "exit_code": exit_code, "signal": signal}));
        run_at_alpha_under_lease(&d, id, end).await;
    }
    for (id, _, slurm_requeued) in cases {
        let up = StatusUpdate {
            died: Some(
                "Slurm at alpha held it after a failed launch (launch failed requeued held); its script was killed there by signal 15, which no user sent"
                    .into(),
            ),
            slurm_requeued,
            final_stdout_len: Some(0),
            final_stderr_len: Some(0),
            ..at(JobState::Failed, 1)
        };
        assert_eq!(d.status(id, "alpha", up).await.0, StatusCode::OK, "{id}");
    }
    // Run again (a new placement, elsewhere), one requeue counted and noted.
    for id in ["killed-by-slurm", "end-unknown"] {
        let r = d.job(id).await;
        assert_eq!(
            (r.state, r.target.as_deref(), r.epoch, r.requeues),
            (JobState::Assigned, Some("gamma"), 2, 1),
            "{id}: {}",
            r.reason
        );
        assert!(r.reason.contains("as Slurm at alpha requeued it"), "{id}: {}", r.reason);
        assert_eq!(r.requeue_notes.len(), 1, "{id}: {:?}", r.requeue_notes);
        assert!(
            r.requeue_notes[0].starts_with("Slurm at alpha requeued run 1 after it started"),
            "{:?}",
            r.requeue_notes
        );
    }
    // Its script ended by itself: that end, nothing runs again.
    let r = d.job("exited").await;
    assert_eq!((r.state, r.exit_code, r.epoch, r.requeues), (JobState::Failed, Some(2), 1, 0), "{}", r.reason);
    // No requeue at the target: the signal its script claimed is its end.
    let r = d.job("user-signal").await;
    assert_eq!((r.state, r.signal, r.epoch, r.requeues), (JobState::Failed, Some(15), 1, 0), "{}", r.reason);
    d.stop().await;
}

/// A run that died with its node (a pod evicted by `kubectl drain`, a
/// preemption) was stopped with SIGTERM before its agent's report, so its
/// `lease-exec` claimed an end by signal 15 first. Reported `disrupted`
/// (no user had a signal delivered to it), that claim is the cluster's
/// kill: an interruptible job moves, one that may not restart fails with
/// the report's reason. An end claimed by an exit code still stands, and
/// without `disrupted` (its user signalled it) the claimed signal stands.
#[tokio::test]
async fn a_claimed_end_by_a_signal_yields_to_a_report_that_the_run_died_with_its_node() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), health_config(tmp.path(), 20.0)).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    // Only alpha has H100s free: every job here starts there (the view
    // takes the GPUs of those placed since its heartbeat).
    d.heartbeat("gamma", 0).await;
    // (job, interruptible, the end its script claimed: (exit code, signal,
    // Slurm's kill of the step first), disrupted)
    type Claim = (Option<i32>, Option<i32>, Option<i32>);
    let cases: [(&str, bool, Claim, bool); 5] = [
        ("drained-interruptible", true, (None, Some(15), None), true),
        ("drained-plain", false, (None, Some(15), None), true),
        ("exited-first", true, (Some(0), None, None), true),
        ("user-signalled", true, (None, Some(15), None), false),
        // It caught Slurm's SIGTERM and exited 0 (a checkpointing job's
        // trap): still that kill, not its own end.
        ("trapped-term", true, (Some(0), None, Some(15)), true),
    ];
    for (id, interruptible, (exit_code, signal, after_signal), _) in cases {
        if interruptible {
            forward_restartable(&d, id).await;
        } else {
            d.forward(id, "beta", "h100", 8).await;
        }
        let end = serde_json::json!({"epoch": 1, "exit_code": exit_code, "signal": signal,
            "after_signal": after_signal, "cause": "script"});
        run_at_alpha_under_lease(&d, id, Some(end)).await;
    }
    let why = "NODE_FAIL at alpha: DisruptionTarget: EvictionByEvictionAPI: Eviction API: evicting";
    for (id, _, _, disrupted) in cases {
        let up = StatusUpdate {
            died: Some(why.into()),
            disrupted,
            final_stdout_len: Some(0),
            final_stderr_len: Some(0),
            reason: why.into(),
            ..at(JobState::Failed, 1)
        };
        assert_eq!(d.status(id, "alpha", up).await.0, StatusCode::OK, "{id}");
    }
    // Moved: placed again elsewhere, a new epoch, no requeue counted
    // (the cluster took it away; Slurm did not rerun it).
    let r = d.job("drained-interruptible").await;
    assert_eq!(
        (r.state, r.target.as_deref(), r.epoch, r.requeues),
        (JobState::Assigned, Some("gamma"), 2, 0),
        "{}",
        r.reason
    );
    assert_eq!(r.migrations, 1, "{}", r.reason);
    // May not restart: failed with the node failure, not the claim.
    let r = d.job("drained-plain").await;
    assert_eq!((r.state, r.epoch), (JobState::Failed, 1), "{}", r.reason);
    assert!(r.reason.contains("NODE_FAIL at alpha") && !r.reason.contains("as its script claimed"), "{}", r.reason);
    // Its script had exited 0 before the node went: that end.
    let r = d.job("exited-first").await;
    assert_eq!((r.state, r.exit_code, r.epoch), (JobState::Completed, Some(0), 1), "{}", r.reason);
    // Its user signalled it: the signal is its end.
    let r = d.job("user-signalled").await;
    assert_eq!((r.state, r.signal, r.epoch), (JobState::Failed, Some(15), 1), "{}", r.reason);
    assert!(r.reason.contains("as its script claimed"), "{}", r.reason);
    // Its exit 0 came after Slurm's kill of the step began: moved.
    let r = d.job("trapped-term").await;
    assert_eq!((r.state, r.epoch, r.migrations, r.exit_code), (JobState::Assigned, 2, 1, None), "{}", r.reason);
    assert_ne!(r.target.as_deref(), Some("alpha"), "{}", r.reason);
    d.stop().await;
}

/// A run's claim that its in-job lease stopped it comes from a file in its
/// own directory, which the job could write: believed (the job moves) only
/// when no lease the meta-scheduler granted still covered the run;
/// otherwise the run's end is its own (failed, with its exit code).
#[tokio::test]
async fn a_claim_that_the_lease_stopped_a_run_is_checked_against_the_grants() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(tmp.path(), Clock::default(), health_config(tmp.path(), 20.0)).await;
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    // Only alpha has H100s free: every job here starts there (the view
    // takes the GPUs of those placed since its heartbeat).
    d.heartbeat("gamma", 0).await;
    for id in ["forged", "real"] {
        forward_restartable(&d, id).await;
        assert_eq!(d.start_job(id, "beta").await.target.as_deref(), Some("alpha"));
        let up = StatusUpdate { job_lease: true, ..at(JobState::Running, 1) };
        assert_eq!(d.status(id, "alpha", up).await.0, StatusCode::OK);
        let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of("alpha"), id));
        let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
        let (s, v) = d.call(reqwest::Method::POST, &format!("/v1/jobs/{id}/lease"), &auth, Some(body)).await;
        assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{v}");
    }
    let claim = StatusUpdate {
        died: Some("stopped at alpha by its job lease: its job lease ran out (2000 ms without a renewal)".into()),
        lease_stopped: true,
        exit_code: Some(1),
        ..at(JobState::Failed, 1)
    };
    // Still covered by a grant: the job wrote the note itself; its end stands.
    assert_eq!(d.status("forged", "alpha", claim.clone()).await.0, StatusCode::OK);
    let r = d.job("forged").await;
    assert_eq!((r.state, r.exit_code, r.epoch, r.migrations), (JobState::Failed, Some(1), 1, 0), "{}", r.reason);
    assert!(r.reason.contains("it claimed its job lease stopped it, but its lease still held for 2 s"), "{}", r.reason);
    // No grant covers it any more: it died there, the job moves.
    d.clock.advance(Duration::from_secs(3));
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    assert_eq!(d.status("real", "alpha", claim.clone()).await.0, StatusCode::OK);
    let r = d.job("real").await;
    assert_eq!(
        (r.state, r.target.as_deref(), r.epoch, r.migrations),
        (JobState::Assigned, Some("gamma"), 2, 1),
        "{}",
        r.reason
    );
    assert!(r.reason.contains("alpha reports: stopped at alpha by its job lease"), "{}", r.reason);

    // The reply to a renewal lost (answered after the watchdog gave up, as
    // on a loaded host): the watchdog still holds the grant before it, and
    // stops the run when that one ends. Believed, though the last grant
    // (which never reached it) still covers the run.
    forward_restartable(&d, "late").await;
    assert_eq!(d.start_job("late", "beta").await.target.as_deref(), Some("alpha"));
    let up = StatusUpdate { job_lease: true, ..at(JobState::Running, 1) };
    assert_eq!(d.status("late", "alpha", up).await.0, StatusCode::OK);
    let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of("alpha"), "late"));
    let renew = || async {
        let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
        let (s, v) = d.call(reqwest::Method::POST, "/v1/jobs/late/lease", &auth, Some(body)).await;
        assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{v}");
    };
    renew().await;
    d.clock.advance(Duration::from_millis(1500));
    renew().await; // its reply "lost": the last grant covers the run for 1.4 s more
    d.clock.advance(Duration::from_millis(600));
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    assert_eq!(d.status("late", "alpha", claim).await.0, StatusCode::OK);
    let r = d.job("late").await;
    assert_eq!((r.epoch, r.migrations), (2, 1), "{:?}: {}", r.state, r.reason);
    d.stop().await;
}

/// A run whose script ended says so itself (`POST /end`, its checkpoint
/// token): when its cluster then goes silent past its grace period the job
/// is not moved (it would run its work again); the agent's report, when
/// its cluster comes back, is the job's end. A cluster that never comes
/// back: past `[health] end_wait_s` the job ends as its run claimed, with
/// a note on its stderr. A run without a claim moves as before.
#[tokio::test]
async fn a_run_that_reported_its_end_is_not_moved_off_a_silent_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    // Only alpha has H100s free: every job here starts there (the view
    // takes the GPUs of those placed since its heartbeat).
    let d = ends_daemon(tmp.path(), Some(30.0)).await;
    for id in ["back", "gone", "plain"] {
        forward_restartable(&d, id).await;
        assert_eq!(d.start_job(id, "beta").await.target.as_deref(), Some("alpha"));
        assert_eq!(d.status(id, "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    }
    // Submitted and ended before alpha's agent ever reported it.
    forward_restartable(&d, "early").await;
    assert_eq!(d.start_job("early", "beta").await.target.as_deref(), Some("alpha"));
    let end = |id, cluster, body| claim_end(&d, id, cluster, body);
    // Claims that do not count: another epoch, another cluster's token, nonsense.
    let (s, v) = end("back", "alpha", serde_json::json!({"epoch": 2, "exit_code": 0})).await;
    assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(false)), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("epoch 2 is stale"), "{v}");
    let (s, v) = end("back", "gamma", serde_json::json!({"epoch": 1, "exit_code": 0})).await;
    assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(false)), "{v}");
    let (s, v) = end("back", "alpha", serde_json::json!({"epoch": 1, "exit_code": 300})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    for k in [0, 65] {
        let (s, v) = end("back", "alpha", serde_json::json!({"epoch": 1, "exit_code": 0, "after_signal": k})).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["error"].as_str().unwrap().contains("after_signal in [1, 64]"), "{v}");
    }
    // A checkpoint token reaches nothing else with this route's help.
    let (s, _) = end("back", "alpha", serde_json::json!({"epoch": "one"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // The two claims that count.
    for (id, code) in [("back", 0), ("gone", 3), ("early", 0)] {
        let (s, v) = end(id, "alpha", serde_json::json!({"epoch": 1, "exit_code": code})).await;
        assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(true)), "{id}: {v}");
    }
    let beat = |secs, with_alpha| beat(&d, secs, with_alpha);
    let settle = || async { tokio::time::sleep(Duration::from_millis(1500)).await };
    // alpha silent past 3 + 20 s: the run without a claim moves, the two
    // that claimed their end stay where they ended.
    beat(25, false).await;
    settle().await;
    let r = d.job("plain").await;
    assert_eq!((r.target.as_deref(), r.epoch, r.migrations), (Some("gamma"), 2, 1), "{}", r.reason);
    let r = d.job("early").await;
    assert_eq!((r.state, r.target.as_deref(), r.epoch), (JobState::Assigned, Some("alpha"), 1), "{}", r.reason);
    for id in ["back", "gone"] {
        let r = d.job(id).await;
        assert_eq!(
            (r.state, r.target.as_deref(), r.epoch, r.migrations),
            (JobState::Running, Some("alpha"), 1, 0),
            "{id}: {}",
            r.reason
        );
    }
    // alpha comes back and reports "back": the agent's word is its end.
    beat(1, true).await;
    let done = StatusUpdate {
        exit_code: Some(0),
        final_stdout_len: Some(0),
        final_stderr_len: Some(0),
        ..at(JobState::Completed, 1)
    };
    assert_eq!(d.status("back", "alpha", done).await.0, StatusCode::OK);
    let r = d.job("back").await;
    assert_eq!((r.state, r.exit_code, r.migrations), (JobState::Completed, Some(0), 0), "{}", r.reason);
    // alpha goes silent again and never comes back: within the bound
    // (23 + 30 s) "gone" waits; past it, it ends as claimed, failed with 3.
    beat(45, false).await;
    settle().await;
    let r = d.job("gone").await;
    assert_eq!((r.state, r.target.as_deref()), (JobState::Running, Some("alpha")), "within the bound: {}", r.reason);
    beat(10, false).await;
    let t0 = std::time::Instant::now();
    let r = loop {
        let r = d.job("gone").await;
        if r.state.is_terminal() {
            break r;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "not ended: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (r.state, r.exit_code, r.migrations, r.output_complete),
        (JobState::Failed, Some(3), 0, true),
        "{}",
        r.reason
    );
    assert!(r.reason.starts_with("failed as its run at alpha claimed (exit code 3)"), "{}", r.reason);
    let err = String::from_utf8(d.read_output("gone", "beta", "stderr", 0, 1 << 20).await).unwrap();
    assert!(
        err.starts_with(
            "fleet: run 1 of job gone at alpha said its script ended (exit code 3), but alpha never reported it"
        ),
        "{err}"
    );
    assert!(err.trim_end().ends_with("output after that point was not relayed"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let r = d.job("early").await;
    assert_eq!((r.state, r.exit_code, r.epoch), (JobState::Completed, Some(0), 1), "{}", r.reason);
    // A claim on an ended job changes nothing.
    let (s, v) = end("gone", "alpha", serde_json::json!({"epoch": 1, "exit_code": 0})).await;
    assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(false)), "{v}");
    assert_eq!(d.job("gone").await.exit_code, Some(3));
    // A run whose lease ran out may have been stopped by its watchdog:
    // its end claim then is not its own end.
    forward_restartable(&d, "late").await;
    let at_c = d.start_job("late", "beta").await.target.unwrap();
    let at_c: &'static str = if at_c == "gamma" { "gamma" } else { "beta" };
    assert_eq!(d.status("late", at_c, at(JobState::Running, 1)).await.0, StatusCode::OK);
    let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of(at_c), "late"));
    let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
    let (s, v) = d.call(reqwest::Method::POST, "/v1/jobs/late/lease", &auth, Some(body)).await;
    assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{v}");
    beat(5, false).await;
    let (s, v) = end("late", at_c, serde_json::json!({"epoch": 1, "exit_code": 0})).await;
    assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(false)), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("its job lease ran out"), "{v}");
    // Also a second before it runs out: the watchdog stops the run then
    // (and in a pod cannot leave its note where lease-exec looks).
    forward_restartable(&d, "edge").await;
    let at_c = d.start_job("edge", "beta").await.target.unwrap();
    let at_c: &'static str = if at_c == "gamma" { "gamma" } else { "beta" };
    assert_eq!(d.status("edge", at_c, at(JobState::Running, 1)).await.0, StatusCode::OK);
    let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of(at_c), "edge"));
    let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
    let (s, v) = d.call(reqwest::Method::POST, "/v1/jobs/edge/lease", &auth, Some(body)).await;
    assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{v}");
    d.clock.advance(Duration::from_millis(1500));
    let (s, v) = end("edge", at_c, serde_json::json!({"epoch": 1, "exit_code": 0})).await;
    assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(false)), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("or was about to"), "{v}");
    // A claim that says whose end it was: the watchdog's is no end of its
    // own (refused as before); the script's own (lease-exec decided it
    // before its watchdog decided to stop the run) is taken in the lease's
    // last second too.
    let (s, v) = end("edge", at_c, serde_json::json!({"epoch": 1, "signal": 15, "cause": "lease"})).await;
    assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(false)), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("its lease watchdog stopped it"), "{v}");
    let (s, v) = end("edge", at_c, serde_json::json!({"epoch": 1, "exit_code": 0, "cause": "script"})).await;
    assert_eq!((s, v["recorded"].as_bool(), v["reason"].as_str()), (StatusCode::OK, Some(true), Some("")), "{v}");
    // One that says the lease stopped it, while a grant still covers it,
    // is refused too (no end of its own: the watchdog's word).
    forward_restartable(&d, "held").await;
    let at_c = d.start_job("held", "beta").await.target.unwrap();
    let at_c: &'static str = if at_c == "gamma" { "gamma" } else { "beta" };
    assert_eq!(d.status("held", at_c, at(JobState::Running, 1)).await.0, StatusCode::OK);
    let auth = format!("FleetCkpt {}", fleet_api::auth::ckpt_token(&token_of(at_c), "held"));
    let body = serde_json::json!({"epoch": 1, "lease_ms": 2000});
    let (s, v) = d.call(reqwest::Method::POST, "/v1/jobs/held/lease", &auth, Some(body)).await;
    assert_eq!((s, v["valid_ms"].as_u64()), (StatusCode::OK, Some(2000)), "{v}");
    let (s, v) = end("held", at_c, serde_json::json!({"epoch": 1, "exit_code": 1, "cause": "lease"})).await;
    assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(false)), "{v}");
    let (s, v) = end("held", at_c, serde_json::json!({"epoch": 1, "cause": "someone"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    d.stop().await;
}

/// Free GPUs of cluster `c` in view `v`, all types.
fn free_gpus(v: &FleetView, c: &str) -> u32 {
    v.clusters.iter().find(|x| x.name == c).unwrap().gpus.iter().map(|p| p.free).sum()
}

/// The view takes from a cluster's free GPUs those of the jobs placed there
/// that its last heartbeat cannot show taken: two 8-GPU jobs placed between
/// heartbeats go to alpha and gamma (8 free H100s each) instead of both to the
/// first, where the second would queue. Once the target reports a job running
/// and a later heartbeat shows its GPUs in use, they are not taken twice; a job
/// still with its agent keeps its GPUs taken whatever the heartbeat says.
#[tokio::test]
async fn placements_between_heartbeats_take_the_gpus_they_will_use() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(tmp.path(), Clock::default()).await;
    d.heartbeat("alpha", 8).await;
    d.heartbeat("gamma", 8).await;
    d.heartbeat("beta", 0).await;
    let free = free_gpus;
    d.forward("b1", "beta", "h100", 8).await;
    d.forward("b2", "beta", "h100", 8).await;
    let first = d.start_job("b1", "beta").await;
    let second = d.start_job("b2", "beta").await;
    assert_eq!((first.state, second.state), (JobState::Assigned, JobState::Assigned));
    let (t1, t2) = (first.target.unwrap(), second.target.unwrap());
    assert_ne!(t1, t2, "both placed at {t1}: {} / {}", first.reason, second.reason);
    // what every agent's view says now: no H100 free at either
    let v = d.heartbeat("beta", 0).await;
    assert_eq!((free(&v, "alpha"), free(&v, "gamma")), (0, 0), "{v:?}");
    // b1 runs at t1, whose next heartbeat shows its GPUs in use: not taken twice
    assert_eq!(d.status("b1", &t1, st(JobState::Pending)).await.0, StatusCode::OK);
    assert_eq!(d.status("b1", &t1, st(JobState::Running)).await.0, StatusCode::OK);
    d.clock.advance(Duration::from_secs(1));
    let v = d.heartbeat(&t1, 0).await;
    assert_eq!(free(&v, &t1), 0);
    // t1 frees its GPUs while b1 still runs (it shrank, say): the view follows
    // the heartbeat, newer than b1's start
    let v = d.heartbeat(&t1, 8).await;
    assert_eq!(free(&v, &t1), 8);
    // b2 is still with t2's agent: t2's heartbeat of 8 free does not show it
    let v = d.heartbeat(&t2, 8).await;
    assert_eq!(free(&v, &t2), 0);
    // b2 ends (cancelled before it ran): its GPUs are free again
    let done = StatusUpdate {
        exit_code: Some(0),
        final_stdout_len: Some(0),
        final_stderr_len: Some(0),
        ..st(JobState::Completed)
    };
    assert_eq!(d.status("b2", &t2, done).await.0, StatusCode::OK);
    let v = d.heartbeat(&t2, 8).await;
    assert_eq!(free(&v, &t2), 8);
    d.stop().await;
}

/// An agent that names the runs its capacity shows holding GPUs: a job
/// its scheduler has started is not taken twice, though its start has
/// not been reported yet (slurmctld allocates the GPUs before the agent's
/// next poll sees the job running; a second job then went elsewhere,
/// seeing no GPUs free where half were); one it does not name is taken,
/// though reported running (its run in another epoch holds them).
#[tokio::test]
async fn a_heartbeat_naming_the_runs_that_hold_gpus_counts_each_once() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(tmp.path(), Clock::default()).await;
    for (c, n) in [("alpha", 16), ("gamma", 0), ("beta", 0)] {
        d.heartbeat(c, n).await;
    }
    let free = free_gpus;
    d.forward("h1", "beta", "h100", 8).await;
    let first = d.start_job("h1", "beta").await;
    assert_eq!(first.target.as_deref(), Some("alpha"), "{}", first.reason);
    let epoch = first.epoch;
    // Slurm started h1 (8 taken), its agent has not said so: named holding.
    let v = d.heartbeat_holding("alpha", 8, Some(&[("h1", epoch)])).await;
    assert_eq!(free(&v, "alpha"), 8, "h1 counted once: {v:?}");
    d.forward("h2", "beta", "h100", 8).await;
    let second = d.start_job("h2", "beta").await;
    assert_eq!(second.target.as_deref(), Some("alpha"), "the other 8 are free: {}", second.reason);
    // Not named (still in alpha's queue): taken from the heartbeat's free.
    let v = d.heartbeat_holding("alpha", 8, Some(&[("h1", epoch)])).await;
    assert_eq!(free(&v, "alpha"), 0, "h2 will take the other 8: {v:?}");
    // Named in another epoch (a stale copy): not this placement's GPUs.
    let v = d.heartbeat_holding("alpha", 16, Some(&[("h1", epoch + 1), ("h2", epoch + 1)])).await;
    assert_eq!(free(&v, "alpha"), 0, "{v:?}");
    // h1 reported running; alpha's heartbeat names only h2 (h1's GPUs
    // free, its run no longer holding them): h1 is taken again, h2 not.
    assert_eq!(d.status("h1", "alpha", st(JobState::Pending)).await.0, StatusCode::OK);
    assert_eq!(d.status("h1", "alpha", st(JobState::Running)).await.0, StatusCode::OK);
    d.clock.advance(Duration::from_secs(1));
    let v = d.heartbeat_holding("alpha", 8, Some(&[("h2", second.epoch)])).await;
    assert_eq!(free(&v, "alpha"), 0, "{v:?}");
    let v = d.heartbeat_holding("alpha", 0, Some(&[("h1", epoch), ("h2", second.epoch)])).await;
    assert_eq!(free(&v, "alpha"), 0, "{v:?}");
    let v = d.heartbeat_holding("alpha", 16, Some(&[("h1", epoch), ("h2", second.epoch)])).await;
    assert_eq!(free(&v, "alpha"), 16, "the heartbeat's word: {v:?}");
    d.stop().await;
}

/// A run at a cluster that never comes back, whose script said it ended
/// once Slurm's kill of the whole step began (`after_signal`): at its time
/// limit the job timed out; otherwise Slurm killed it for a reason no one
/// asked for (a requeue, a preemption) and it runs again, as a run that
/// died with its node; with a signal its user had sent, the end is the
/// script's own. Each only once the end-wait bound has passed.
#[tokio::test]
async fn an_end_after_slurms_kill_at_a_silent_cluster_is_its_time_limit_or_its_death() {
    let tmp = tempfile::tempdir().unwrap();
    let d = ends_daemon(tmp.path(), Some(30.0)).await;
    for (id, limit) in [("timed", Some(1)), ("killed", Some(60)), ("unlimited", None), ("user", Some(60))] {
        forward_h100(&d, id, true, limit).await;
        assert_eq!(d.start_job(id, "beta").await.target.as_deref(), Some("alpha"));
        assert_eq!(d.status(id, "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    }
    let (s, v) = send_signal(&d, "user", &bearer("beta"), "TERM", "full").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    // A minute at alpha: "timed" reaches its limit.
    beat(&d, 62, true).await;
    for id in ["timed", "killed", "unlimited", "user"] {
        let body = serde_json::json!({"epoch": 1, "exit_code": 0, "after_signal": 15, "cause": "script"});
        let (s, v) = claim_end(&d, id, "alpha", body).await;
        assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(true)), "{id}: {v}");
    }
    // alpha silent past its grace: all four wait for its word.
    beat(&d, 40, false).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in ["timed", "killed", "unlimited", "user"] {
        let r = d.job(id).await;
        assert_eq!(
            (r.state, r.target.as_deref(), r.epoch),
            (JobState::Running, Some("alpha"), 1),
            "{id}: {}",
            r.reason
        );
    }
    // Past the end-wait bound.
    beat(&d, 20, false).await;
    let t0 = std::time::Instant::now();
    let ended = |r: &JobRecord| r.state.is_terminal() || r.epoch > 1;
    let mut rs = Vec::new();
    for id in ["timed", "killed", "unlimited", "user"] {
        let r = loop {
            let r = d.job(id).await;
            if ended(&r) {
                break r;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "{id} not judged: {r:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        rs.push(r);
    }
    let [timed, killed, unlimited, user] = rs.try_into().unwrap();
    assert_eq!((timed.state, timed.exit_code, timed.migrations), (JobState::Failed, Some(0), 0), "{}", timed.reason);
    assert!(
        timed.reason.starts_with("TIMEOUT at alpha: its run claimed its script ended (exit code 0 after signal 15"),
        "{}",
        timed.reason
    );
    assert!(timed.reason.contains("at its time limit of 1 min"), "{}", timed.reason);
    for r in [&killed, &unlimited] {
        assert_eq!((r.target.as_deref(), r.epoch, r.migrations), (Some("gamma"), 2, 1), "{}", r.reason);
        assert!(r.reason.contains("once Slurm there began to kill it with signal 15"), "{}", r.reason);
    }
    let err = String::from_utf8(d.read_output("killed", "beta", "stderr", 0, 1 << 20).await).unwrap();
    assert!(err.contains("died (alpha has sent no heartbeat"), "{err}");
    assert!(err.contains("exit code 0 after signal 15 to the whole step"), "{err}");
    assert_eq!((user.state, user.exit_code, user.migrations), (JobState::Completed, Some(0), 0), "{}", user.reason);
    d.stop().await;
}

/// A target that reports a run completed, whose script exited 0 only once
/// a kill of its whole step began (`after_signal`) on no one's request: a
/// pod that caught an eviction's SIGTERM leaves a `Complete` Job, and an
/// agent that did not see the eviction (down, or restarted since) reports
/// just that. The run was taken away: it runs again when it may, fails
/// like a run whose node failed when it may not. With a signal its user
/// sent, or without the kill, the completion stands.
#[tokio::test]
async fn a_completion_after_a_kill_no_one_asked_for_is_a_run_taken_away() {
    let tmp = tempfile::tempdir().unwrap();
    let d = ends_daemon(tmp.path(), None).await;
    let jobs =
        [("taken", true), ("pinned", false), ("signalled", true), ("own", true), ("timed", true), ("forgot", true)];
    for (id, interruptible) in jobs {
        let limit = if matches!(id, "timed" | "forgot") { Some(1) } else { Some(60) };
        forward_h100(&d, id, interruptible, limit).await;
        assert_eq!(d.start_job(id, "beta").await.target.as_deref(), Some("alpha"));
        assert_eq!(d.status(id, "alpha", at(JobState::Running, 1)).await.0, StatusCode::OK);
    }
    let (s, v) = send_signal(&d, "signalled", &bearer("beta"), "TERM", "full").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    // A minute later: "timed" and "forgot" reach their limit.
    d.clock.advance(Duration::from_secs(61));
    for (c, _) in CLUSTERS {
        d.heartbeat(c, 16).await;
    }
    for (id, _) in jobs {
        let after = if id == "own" { None } else { Some(15) };
        let body = serde_json::json!({"epoch": 1, "exit_code": 0, "after_signal": after, "cause": "script"});
        let (s, v) = claim_end(&d, id, "alpha", body).await;
        assert_eq!((s, v["recorded"].as_bool()), (StatusCode::OK, Some(true)), "{id}: {v}");
        let report = if id == "forgot" {
            // Slurm lost the run (its agent judges it died with its node).
            StatusUpdate {
                died: Some("Slurm at alpha no longer knows job 7".into()),
                disrupted: true,
                ..at(JobState::Failed, 1)
            }
        } else {
            StatusUpdate {
                exit_code: Some(0),
                final_stdout_len: Some(0),
                final_stderr_len: Some(0),
                ..at(JobState::Completed, 1)
            }
        };
        assert_eq!(d.status(id, "alpha", report).await.0, StatusCode::OK, "{id}");
    }
    let r = d.job("taken").await;
    assert_eq!(
        (r.state, r.target.as_deref(), r.epoch, r.migrations),
        (JobState::Assigned, Some("gamma"), 2, 1),
        "{r:?}"
    );
    assert!(r.reason.contains("exited 0 only once a kill of its whole step by signal 15 began"), "{}", r.reason);
    let r = d.job("pinned").await;
    assert_eq!((r.state, r.epoch, r.migrations), (JobState::Failed, 1, 0), "{r:?}");
    assert!(
        r.reason.contains("its node or pod was taken away") && r.reason.contains("not restartable"),
        "{}",
        r.reason
    );
    for id in ["signalled", "own"] {
        let r = d.job(id).await;
        assert_eq!((r.state, r.exit_code, r.epoch), (JobState::Completed, Some(0), 1), "{id}: {r:?}");
    }
    // At its time limit the kill was Slurm's TIMEOUT: the job timed out,
    // whether its target called it completed or lost it.
    for id in ["timed", "forgot"] {
        let r = d.job(id).await;
        assert_eq!((r.state, r.exit_code, r.epoch, r.migrations), (JobState::Failed, Some(0), 1, 0), "{id}: {r:?}");
        assert!(
            r.reason.starts_with(
                "TIMEOUT at alpha: its script ended (exit code 0 after signal 15 to the whole step) at its time limit of 1 min"
            ),
            "{id}: {}",
            r.reason
        );
    }
    d.stop().await;
}
