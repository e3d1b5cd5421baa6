//! Run the fleet-proxy binary against an in-process fleet-metasched, with
//! the test playing the target agent.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fleet_api::api::{
    AgentWork, ForwardRequest, Heartbeat, NodeCapacity, OutputChunk, StartConfirmation, StatusUpdate, Stream,
};
use fleet_api::{auth, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config};

fn token_of(c: &str) -> String {
    format!("tok-{c}")
}

struct Meta {
    addr: SocketAddr,
    dir: PathBuf,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

fn config(dir: &Path) -> Config {
    std::fs::write(dir.join("admin.token"), "admin").unwrap();
    let clusters = ["alpha", "beta"]
        .iter()
        .map(|n| {
            let p = dir.join(format!("{n}.token"));
            std::fs::write(&p, token_of(n)).unwrap();
            ClusterConfig {
                name: n.to_string(),
                region: String::new(),
                provider: String::new(),
                token_file: p,
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

impl Meta {
    async fn start(dir: &Path, addr: &str) -> Meta {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(fleet_metasched::run(listener, config(dir), async {
            let _ = rx.await;
        }));
        Meta { addr, dir: dir.to_path_buf(), stop, handle }
    }

    async fn stop(self) -> (SocketAddr, PathBuf) {
        let _ = self.stop.send(());
        self.handle.await.unwrap().unwrap();
        (self.addr, self.dir)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// The test's stand-in for a cluster agent.
struct Agent {
    url: String,
    cluster: &'static str,
    http: reqwest::Client,
}

impl Agent {
    async fn post(&self, path: &str, body: serde_json::Value) -> reqwest::StatusCode {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(token_of(self.cluster))
            .json(&body)
            .send()
            .await
            .unwrap();
        let s = r.status();
        assert!(s.is_success(), "{path}: {s} {}", r.text().await.unwrap());
        s
    }

    async fn heartbeat(&self, gpu: &str) {
        let hb = Heartbeat {
            cluster: self.cluster.into(),
            scheduler: "slurm".into(),
            nodes: vec![NodeCapacity {
                name: "n0".into(),
                partitions: vec![],
                gpu_type: Some(gpu.into()),
                gpus_total: 8,
                gpus_free: 8,
                state: "idle".into(),
                ..Default::default()
            }],
            agent_version: "test".into(),
            ..Default::default()
        };
        self.post("/v1/heartbeat", serde_json::to_value(hb).unwrap()).await;
    }

    async fn forward(&self, id: &str, gpus: u32) {
        let fwd = ForwardRequest {
            fleet_job_id: id.into(),
            request: JobRequest {
                origin: self.cluster.into(),
                gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: gpus, scope: GpuScope::Node }],
                ..Default::default()
            },
            tentative_target: "alpha".into(),
            early_start: false,
        };
        self.post("/v1/jobs", serde_json::to_value(fwd).unwrap()).await;
    }

    async fn work(&self) -> AgentWork {
        self.http
            .get(format!("{}/v1/agent/work", self.url))
            .bearer_auth(token_of(self.cluster))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Wait until `pick(work)` holds `id`.
    async fn wait_for(&self, id: &str, pick: fn(&AgentWork) -> Vec<String>) {
        let t0 = Instant::now();
        while !pick(&self.work().await).iter().any(|j| j == id) {
            assert!(t0.elapsed() < Duration::from_secs(20), "{id} never showed up in {}'s work", self.cluster);
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    async fn status(&self, id: &str, upd: StatusUpdate) {
        self.post(&format!("/v1/jobs/{id}/status"), serde_json::to_value(upd).unwrap()).await;
    }

    async fn output(&self, id: &str, stream: Stream, data: &[u8], chunk: usize) {
        for (i, c) in data.chunks(chunk.max(1)).enumerate() {
            let ch = OutputChunk { stream, offset: (i * chunk) as u64, data: c.to_vec(), epoch: None };
            self.post(&format!("/v1/jobs/{id}/output"), serde_json::to_value(&ch).unwrap()).await;
            if i == 1 {
                // A retransmission overlapping what is held is harmless.
                self.post(&format!("/v1/jobs/{id}/output"), serde_json::to_value(&ch).unwrap()).await;
            }
        }
    }
}

fn running(remote: u64) -> StatusUpdate {
    StatusUpdate {
        remote_job_id: Some(remote),
        state: Some(JobState::Running),
        node_list: "a-n0".into(),
        ..Default::default()
    }
}

fn finished(state: JobState, exit: i32, out: usize, err: usize) -> StatusUpdate {
    StatusUpdate {
        state: Some(state),
        exit_code: Some(exit),
        final_stdout_len: Some(out as u64),
        final_stderr_len: Some(err as u64),
        remote_job_id: None,
        ..running(0)
    }
}

fn spawn_proxy(url: &str, id: &str, dir: &Path) -> tokio::process::Child {
    spawn_proxy_with(url, id, dir, false)
}

fn spawn_proxy_with(url: &str, id: &str, dir: &Path, token_in_file: bool) -> tokio::process::Child {
    spawn_proxy_as(url, id, dir, token_in_file, STAND_IN, 0)
}

/// The proxy as the body of Slurm job `stand_in`, run `restart` of it
/// (`SLURM_RESTART_COUNT`).
fn spawn_proxy_as(
    url: &str,
    id: &str,
    dir: &Path,
    token_in_file: bool,
    stand_in: u64,
    restart: u32,
) -> tokio::process::Child {
    // A fake scontrol that records the comment updates.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let sc = bin.join("scontrol");
    std::fs::write(&sc, format!("#!/bin/sh\necho \"$@\" >> {}/comments.log\n", dir.display())).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sc, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-proxy"));
    cmd.args(["--job", id, "--url", url, "--poll-ms", "50"]).arg("--slurm-bin-dir").arg(&bin);
    let token = auth::job_token(&token_of("beta"), id);
    if token_in_file {
        let f = dir.join(format!("{id}.token"));
        std::fs::write(&f, format!("{token}\n")).unwrap();
        cmd.arg("--token-file").arg(f);
    } else {
        cmd.env("FLEET_JOB_TOKEN", token);
    }
    if restart > 0 {
        cmd.env("SLURM_RESTART_COUNT", restart.to_string());
    }
    cmd.env("SLURM_JOB_ID", stand_in.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn finish(child: tokio::process::Child) -> (i32, Vec<u8>, Vec<u8>) {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("proxy did not exit")
        .unwrap();
    (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
}

async fn setup(dir: &Path) -> (Meta, Agent, Agent) {
    let meta = Meta::start(dir, "127.0.0.1:0").await;
    let alpha = Agent { url: meta.url(), cluster: "alpha", http: reqwest::Client::new() };
    let beta = Agent { url: meta.url(), cluster: "beta", http: reqwest::Client::new() };
    alpha.heartbeat("h100").await;
    beta.heartbeat("a100").await;
    tokio::spawn(confirm_starts(meta.url(), "beta", STAND_IN));
    (meta, alpha, beta)
}

/// The stand-ins' Slurm job id (`SLURM_JOB_ID`).
const STAND_IN: u64 = 77;

/// Play `cluster`'s origin agent: confirm every start request that names
/// stand-in `running` (as if Slurm showed it RUNNING), refuse others.
/// Runs until the test's runtime ends; rides out meta-scheduler restarts.
async fn confirm_starts(url: String, cluster: &'static str, running: u64) {
    let http = reqwest::Client::new();
    loop {
        let work = http
            .get(format!("{url}/v1/agent/work?wait_ms=2000"))
            .bearer_auth(token_of(cluster))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success());
        let Some(work) = work else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(work) = work.json::<AgentWork>().await else {
            continue;
        };
        for c in work.confirm_start {
            let body = StartConfirmation {
                origin_job_id: c.origin_job_id,
                started: c.origin_job_id == running,
                reason: "not the journaled stand-in".into(),
                ..Default::default()
            };
            let _ = http
                .post(format!("{url}/v1/jobs/{}/confirm_start", c.fleet_job_id))
                .bearer_auth(token_of(cluster))
                .json(&body)
                .send()
                .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_output_exactly_and_exits_with_the_remote_code() {
    let tmp = tempfile::tempdir().unwrap();
    let (meta, alpha, beta) = setup(tmp.path()).await;
    // The stand-in may start before the origin agent's forward arrives.
    let child = spawn_proxy(&meta.url(), "px1", tmp.path());
    tokio::time::sleep(Duration::from_millis(300)).await;
    beta.forward("px1", 8).await;
    alpha.wait_for("px1", |w| w.submit.iter().map(|a| a.fleet_job_id.clone()).collect()).await;
    alpha
        .status("px1", StatusUpdate { remote_job_id: Some(555), state: Some(JobState::Pending), ..Default::default() })
        .await;
    alpha.status("px1", running(555)).await;
    // The proxy polls: wait until it has seen "running" before finishing,
    // or a fast finish may legitimately skip that comment.
    let log = tmp.path().join("comments.log");
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("555 running") {
        assert!(t0.elapsed() < Duration::from_secs(15), "the proxy never reported running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // 3 MiB of every byte value (not UTF-8), sent in 256 KiB chunks.
    let out: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let err: Vec<u8> = b"warning: \xff\xfe not utf-8\n".to_vec();
    alpha.output("px1", Stream::Stdout, &out, 256 * 1024).await;
    alpha.output("px1", Stream::Stderr, &err, 5).await;
    alpha.status("px1", finished(JobState::Failed, 7, out.len(), err.len())).await;
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 7, "stderr: {}", String::from_utf8_lossy(&stderr));
    assert!(stdout == out, "stdout differs: {} bytes vs {}", stdout.len(), out.len());
    let text = String::from_utf8_lossy(&stderr);
    assert!(stderr.windows(err.len()).any(|w| w == err), "stderr: {text}");
    assert!(text.ends_with("fleet-proxy: job failed: failed at alpha (exit code 7)\n"), "stderr: {text}");
    let comments = std::fs::read_to_string(tmp.path().join("comments.log")).unwrap();
    assert!(comments.contains("update JobId=77 Comment=fleet: alpha job 555 running"), "{comments}");
    assert!(comments.contains("update JobId=77 Comment=fleet: alpha job 555 failed"), "{comments}");
    meta.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_cancels_the_remote_job() {
    let tmp = tempfile::tempdir().unwrap();
    let (meta, alpha, beta) = setup(tmp.path()).await;
    beta.forward("px2", 8).await;
    let child = spawn_proxy_with(&meta.url(), "px2", tmp.path(), true);
    alpha.wait_for("px2", |w| w.submit.iter().map(|a| a.fleet_job_id.clone()).collect()).await;
    alpha.status("px2", running(556)).await;
    alpha.output("px2", Stream::Stdout, b"partial\n", 1024).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // As scancel does: SIGCONT (forwarded), then SIGTERM (cancels).
    kill(&child, libc::SIGCONT);
    kill(&child, libc::SIGTERM);
    alpha.wait_for("px2", |w| w.cancel.clone()).await;
    alpha.status("px2", StatusUpdate { signal: Some(15), ..finished(JobState::Cancelled, 0, 8, 0) }).await;
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 143, "stderr: {}", String::from_utf8_lossy(&stderr));
    assert_eq!(stdout, b"partial\n");
    assert!(!String::from_utf8_lossy(&stderr).contains("not delivered"), "a cancel is not a failed signal");
    meta.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_metasched_restart_and_reports_impossible_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let (meta, alpha, beta) = setup(tmp.path()).await;
    beta.forward("huge", 64).await;
    let (code, _, stderr) = finish(spawn_proxy(&meta.url(), "huge", tmp.path())).await;
    let stderr = String::from_utf8_lossy(&stderr);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no cluster in the fleet can run gpu:h100:64"), "{stderr}");

    beta.forward("px3", 8).await;
    let child = spawn_proxy(&meta.url(), "px3", tmp.path());
    alpha.wait_for("px3", |w| w.submit.iter().map(|a| a.fleet_job_id.clone()).collect()).await;
    alpha.status("px3", running(557)).await;
    alpha.output("px3", Stream::Stdout, b"one\n", 1024).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (addr, dir) = meta.stop().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let meta = Meta::start(&dir, &addr.to_string()).await;
    let ch = OutputChunk { stream: Stream::Stdout, offset: 4, data: b"two\n".to_vec(), epoch: None };
    alpha.post("/v1/jobs/px3/output", serde_json::to_value(ch).unwrap()).await;
    alpha.status("px3", finished(JobState::Completed, 0, 8, 0)).await;
    let (code, stdout, stderr) = finish(child).await;
    let stderr = String::from_utf8_lossy(&stderr);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, b"one\ntwo\n");
    // A 1.5 s outage is not the user's news: their stderr file stays theirs.
    assert_eq!(stderr, "", "the job's stderr holds only what the job wrote");
    meta.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_ends_the_proxy_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let (meta, _alpha, beta) = setup(tmp.path()).await;
    beta.forward("px4", 8).await;
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-proxy"))
        .args(["--job", "px4", "--url", &meta.url(), "--poll-ms", "50", "--slurm-bin-dir", "/nonexistent"])
        .env("FLEET_JOB_TOKEN", auth::job_token(&token_of("beta"), "another-job"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (code, stdout, stderr) = finish(child).await;
    let stderr = String::from_utf8_lossy(&stderr);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("refused this job's token (HTTP 401"), "{stderr}");
    meta.stop().await;
}

#[test]
fn usage_errors_exit_2() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-proxy"))
        .args(["--url", "http://127.0.0.1:1"])
        .env_remove("FLEET_JOB_ID")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-proxy"))
        .args(["--job", "j", "--url", "http://127.0.0.1:1"])
        .env_remove("FLEET_JOB_TOKEN")
        .env_remove("FLEET_JOB_TOKEN_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a job token is required"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_the_origin_agent_does_not_confirm_leaves_the_job_held() {
    let tmp = tempfile::tempdir().unwrap();
    let (meta, alpha, beta) = setup(tmp.path()).await;
    beta.forward("px5", 8).await;
    // Job 99 holds px5's token but is not its journaled stand-in (77): the
    // origin agent refuses each of its start requests.
    let child = spawn_proxy_as(&meta.url(), "px5", tmp.path(), false, 99, 0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(alpha.work().await.is_empty(), "never placed");
    let r: fleet_api::api::JobRecord = reqwest::Client::new()
        .get(format!("{}/v1/jobs/px5", meta.url()))
        .bearer_auth("admin")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r.state, JobState::Held, "{r:?}");
    // (refused, or asked again: the proxy keeps asking)
    assert!(r.reason.contains("stand-in 99"), "{}", r.reason);
    drop(child); // kill_on_drop
    meta.stop().await;
}

/// The rerun of a requeued stand-in that its origin agent refuses at
/// first (before Slurm shows the stand-in running again): the job stays
/// as it was meanwhile, and the proxy neither relays the earlier run's
/// output nor ends with its exit code; it asks again, and relays the
/// rerun's own output and end once the agent confirms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_refused_at_first_relays_only_its_own_run() {
    let tmp = tempfile::tempdir().unwrap();
    let meta = Meta::start(tmp.path(), "127.0.0.1:0").await;
    let alpha = Agent { url: meta.url(), cluster: "alpha", http: reqwest::Client::new() };
    let beta = Agent { url: meta.url(), cluster: "beta", http: reqwest::Client::new() };
    alpha.heartbeat("h100").await;
    beta.heartbeat("a100").await;
    // beta's origin agent: confirms restart 0 and the second request for
    // restart 1, refuses the first one.
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = refused.clone();
    let url = meta.url();
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        loop {
            let work = http.get(format!("{url}/v1/agent/work?wait_ms=1000")).bearer_auth(token_of("beta")).send().await;
            let Ok(Ok(work)) = work_of(work).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            for c in work.confirm_start {
                let first_rerun = c.restart == 1 && seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                let body = StartConfirmation {
                    origin_job_id: c.origin_job_id,
                    started: !first_rerun,
                    reason: "not running yet".into(),
                    ..Default::default()
                };
                let _ = http
                    .post(format!("{url}/v1/jobs/{}/confirm_start", c.fleet_job_id))
                    .bearer_auth(token_of("beta"))
                    .json(&body)
                    .send()
                    .await;
            }
        }
    });
    beta.forward("px9", 8).await;
    let first = spawn_proxy(&meta.url(), "px9", tmp.path());
    alpha.wait_for("px9", |w| w.submit.iter().map(|a| a.fleet_job_id.clone()).collect()).await;
    alpha.status("px9", running(555)).await;
    alpha.output("px9", Stream::Stdout, b"run 1\n", 64).await;
    alpha.status("px9", finished(JobState::Completed, 0, 6, 0)).await;
    let (code, out, _) = finish(first).await;
    assert_eq!((code, out.as_slice()), (0, &b"run 1\n"[..]));
    // Slurm requeued the stand-in: its rerun.
    let second = spawn_proxy_as(&meta.url(), "px9", tmp.path(), false, STAND_IN, 1);
    alpha.wait_for("px9", |w| w.submit.iter().map(|a| a.fleet_job_id.clone()).collect()).await;
    assert!(refused.load(std::sync::atomic::Ordering::SeqCst) >= 2, "the refused rerun was asked again");
    alpha.status("px9", running(556)).await;
    let ch = OutputChunk { stream: Stream::Stdout, offset: 6, data: b"run 2\n".to_vec(), epoch: None };
    alpha.post("/v1/jobs/px9/output", serde_json::to_value(&ch).unwrap()).await;
    alpha.status("px9", finished(JobState::Failed, 3, 12, 0)).await;
    let (code, out, err) = finish(second).await;
    assert_eq!((code, out.as_slice()), (3, &b"run 2\n"[..]), "{}", String::from_utf8_lossy(&err));
    meta.stop().await;
}

async fn work_of(r: reqwest::Result<reqwest::Response>) -> Result<reqwest::Result<AgentWork>, ()> {
    match r {
        Ok(r) if r.status().is_success() => Ok(r.json::<AgentWork>().await),
        _ => Err(()),
    }
}

/// Send `sig` to the proxy process.
fn kill(child: &tokio::process::Child, sig: libc::c_int) {
    let pid = child.id().expect("the proxy still runs") as libc::pid_t;
    // SAFETY: kill(2) on a child process we spawned and still own (not yet reaped).
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Poll `agent`'s work until its signal orders (handed out once, so
/// gathered across polls) number `n`; returns them.
async fn signal_orders(agent: &Agent, n: usize) -> Vec<(String, String, fleet_api::api::SignalScope)> {
    let t0 = Instant::now();
    let mut got = Vec::new();
    while got.len() < n {
        assert!(t0.elapsed() < Duration::from_secs(20), "only {got:?} of {n} signal orders reached {}", agent.cluster);
        got.extend(agent.work().await.signal.into_iter().map(|o| (o.fleet_job_id, o.signal, o.scope)));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    got
}

/// Wait until the proxy's comment updates show `needle` (it polls).
async fn wait_comment(dir: &Path, needle: &str) {
    let log = dir.join("comments.log");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains(needle) {
        assert!(t0.elapsed() < Duration::from_secs(15), "the proxy never reported {needle:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_are_forwarded_to_the_remote_job_and_never_end_the_proxy() {
    use fleet_api::api::SignalScope::Full;
    let tmp = tempfile::tempdir().unwrap();
    let (meta, alpha, beta) = setup(tmp.path()).await;
    beta.forward("px6", 8).await;
    let child = spawn_proxy(&meta.url(), "px6", tmp.path());
    alpha.wait_for("px6", |w| w.submit.iter().map(|a| a.fleet_job_id.clone()).collect()).await;
    alpha.status("px6", running(558)).await;
    wait_comment(tmp.path(), "558 running").await;
    // What `scancel -b --signal=USR1` (or --full) at the origin does: a real
    // signal to the proxy, the batch step.
    kill(&child, libc::SIGUSR1);
    let s = |sig: &str| ("px6".to_string(), sig.to_string(), Full);
    assert_eq!(signal_orders(&alpha, 1).await, [s("USR1")]);
    // INT and HUP used to cancel; TTIN would stop the process: all are
    // forwarded now, one at a time, and the proxy carries on.
    for (sig, name) in [
        (libc::SIGINT, "INT"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGTTIN, "TTIN"),
        (libc::SIGUSR2, "USR2"),
        (libc::SIGPWR, "PWR"),
    ] {
        kill(&child, sig);
        assert_eq!(signal_orders(&alpha, 1).await, [s(name)], "{name}");
    }
    // TSTP (the first half of Slurm's suspend) is swallowed: not forwarded,
    // and it does not stop the proxy, which still forwards the next one.
    kill(&child, libc::SIGTSTP);
    kill(&child, libc::SIGUSR1);
    assert_eq!(signal_orders(&alpha, 1).await, [s("USR1")], "TSTP is not forwarded");
    assert!(alpha.work().await.cancel.is_empty(), "no signal but TERM cancels");
    // Still relaying: output and the remote exit code arrive as usual.
    alpha.output("px6", Stream::Stdout, b"got-usr1\n", 1024).await;
    alpha.status("px6", finished(JobState::Completed, 3, 9, 0)).await;
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 3, "stderr: {}", String::from_utf8_lossy(&stderr));
    assert_eq!(stdout, b"got-usr1\n");
    assert_eq!(String::from_utf8_lossy(&stderr), "", "delivered signals leave the user's stderr alone");
    meta.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_that_cannot_be_delivered_is_reported_once_on_stderr() {
    let tmp = tempfile::tempdir().unwrap();
    let (meta, alpha, beta) = setup(tmp.path()).await;
    beta.forward("px7", 8).await;
    // Stand-in 99 is not the journaled one: the job stays held, nothing runs it.
    let mut child = spawn_proxy_as(&meta.url(), "px7", tmp.path(), false, 99, 0);
    wait_comment(tmp.path(), "held").await;
    kill(&child, libc::SIGUSR1);
    kill(&child, libc::SIGUSR1);
    // Retried for 5 s, then said once (the second USR1 fails for the same reason).
    tokio::time::sleep(Duration::from_millis(11_500)).await;
    assert!(child.try_wait().unwrap().is_none(), "the proxy lives on");
    assert!(alpha.work().await.is_empty());
    kill(&child, libc::SIGTERM);
    let (code, _, stderr) = finish(child).await;
    let stderr = String::from_utf8_lossy(&stderr);
    assert_eq!(code, 143, "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("not delivered")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with(
            "fleet-proxy: SIGUSR1 was not delivered to the remote job: HTTP 409: job px7: the job is held"
        ),
        "{stderr}"
    );
    meta.stop().await;
}
