//! The in-job lease against a real (in-process) meta-scheduler: a run
//! started by `fleet-ckpt lease-exec` runs its script with its own
//! interpreter, arguments and exit code; it stops itself (its whole process
//! tree) within its lease plus a few seconds once its epoch is stale, or
//! once the meta-scheduler is unreachable; a stale run never starts.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleet_api::api::{ForwardRequest, JobLeaseReply, StartConfirmation, StartRequest, StatusUpdate};
use fleet_api::{auth, FleetOptions, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config, HealthConfig};
use reqwest::Method;
use serde_json::Value;

/// The lease the tests' runs hold.
const LEASE_MS: u64 = 4000;

fn config(dir: &Path) -> Config {
    std::fs::write(dir.join("admin.token"), "admin-secret").unwrap();
    let clusters = ["alpha", "beta"]
        .iter()
        .map(|n| {
            let p = dir.join(format!("{n}.token"));
            std::fs::write(&p, format!("secret-{n}")).unwrap();
            ClusterConfig { name: n.to_string(), region: format!("r-{n}"), token_file: p, ..Default::default() }
        })
        .collect();
    Config {
        heartbeat_timeout_s: 3600.0,
        clusters,
        health: Some(HealthConfig {
            heartbeat_interval_s: 1.0,
            missed_heartbeats: 600,
            grace_s: 60.0,
            max_migrations: 3,
            job_lease_s: 4.0,
            job_lease_margin_s: 1.0,
            first_lease_s: None,
            end_wait_s: None,
            stranded_s: None,
        }),
        ..Config::new("127.0.0.1:0".parse().unwrap(), dir.join("state"), dir.join("admin.token"))
    }
}

async fn call(http: &reqwest::Client, url: &str, m: Method, path: &str, auth: &str, body: Option<Value>) -> Value {
    let mut b = http.request(m, format!("{url}{path}")).header("Authorization", auth);
    if let Some(body) = body {
        b = b.json(&body);
    }
    let r = b.send().await.unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert!(status.is_success(), "{path}: {status} {v}");
    v
}

/// A job from beta, placed at alpha and running there as epoch 1.
async fn running_at_alpha(http: &reqwest::Client, url: &str, id: &str) {
    let hb = serde_json::json!({"cluster": "alpha", "scheduler": "slurm", "queue_pending": 0, "queue_running": 0, "agent_version": "t", "nodes": [{"name": "a1", "partitions": ["gpu"],
        "gpu_type": "h100", "gpus_total": 8, "gpus_free": 8, "state": "idle"}]});
    call(http, url, Method::POST, "/v1/heartbeat", "Bearer secret-alpha", Some(hb)).await;
    let request = JobRequest {
        origin: "beta".into(),
        user_id: 1000,
        gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
        script: Some(b"#!/bin/sh\n#FLEET interruptible\n".to_vec()),
        fleet: FleetOptions { to: vec!["alpha".into()], ..Default::default() },
        ..Default::default()
    };
    let fwd = ForwardRequest { fleet_job_id: id.into(), request, tentative_target: "alpha".into(), early_start: false };
    call(http, url, Method::POST, "/v1/jobs", "Bearer secret-beta", Some(serde_json::to_value(fwd).unwrap())).await;
    let token = auth::job_token("secret-beta", id);
    let start = serde_json::to_value(StartRequest { origin_job_id: 3, ..Default::default() }).unwrap();
    call(http, url, Method::POST, &format!("/v1/jobs/{id}/start"), &format!("FleetJob {token}"), Some(start)).await;
    let c = serde_json::to_value(StartConfirmation { origin_job_id: 3, started: true, ..Default::default() }).unwrap();
    call(http, url, Method::POST, &format!("/v1/jobs/{id}/confirm_start"), "Bearer secret-beta", Some(c)).await;
    let running = StatusUpdate {
        remote_job_id: Some(7),
        state: Some(JobState::Running),
        node_list: "a1".into(),
        epoch: Some(1),
        ..Default::default()
    };
    call(
        http,
        url,
        Method::POST,
        &format!("/v1/jobs/{id}/status"),
        "Bearer secret-alpha",
        Some(serde_json::to_value(running).unwrap()),
    )
    .await;
}

/// A run's directory with its token and script, as alpha's agent makes it.
fn run_dir(tmp: &Path, id: &str, script: &str) -> PathBuf {
    let d = tmp.join(id);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(".fleet-ckpt-token"), auth::ckpt_token("secret-alpha", id)).unwrap();
    std::fs::write(d.join(".fleet-script"), script).unwrap();
    // What Slurm would run: the same script under lease-exec.
    let rest = &script[script.find('\n').unwrap()..];
    std::fs::write(d.join("slurm_script"), format!("#!{} lease-exec{rest}", env!("CARGO_BIN_EXE_fleet-ckpt"))).unwrap();
    d
}

fn lease_exec(url: &str, id: &str, dir: &Path, epoch: u64, args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-ckpt"));
    c.arg("lease-exec")
        .arg(dir.join("slurm_script"))
        .args(args)
        .current_dir(dir)
        .env("FLEET_JOB_ID", id)
        .env("FLEET_EPOCH", epoch.to_string())
        .env("FLEET_JOB_LEASE_MS", LEASE_MS.to_string())
        .env("FLEET_METASCHED_URL", url)
        .env("FLEET_CKPT_TOKEN_FILE", dir.join(".fleet-ckpt-token"))
        .env("FLEET_JOB_SCRIPT", dir.join(".fleet-script"))
        .kill_on_drop(true);
    c
}

/// A step counter: one line a tenth of a second, from a child process.
const COUNTER: &str = "#!/bin/sh\ni=0\nwhile :; do i=$((i+1)); sh -c \"echo $i >> marks\"; sleep 0.1; done\n";

fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map(|t| t.lines().count()).unwrap_or(0)
}

/// Waits until `dir`'s counter has written something and the watchdog runs.
async fn started(dir: &Path) {
    started_logging_in(dir, dir).await
}

/// As [`started`], the watchdog's log in `log_dir` (`FLEET_LEASE_DIR`).
async fn started_logging_in(dir: &Path, log_dir: &Path) {
    let t0 = Instant::now();
    while lines(&dir.join("marks")) < 3
        || !std::fs::read_to_string(log_dir.join(".fleet-lease.log")).unwrap_or_default().contains("watching")
    {
        assert!(t0.elapsed() < Duration::from_secs(20), "the run did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The run's exit, and that nothing of it writes any more.
async fn stopped_within(child: &mut tokio::process::Child, dir: &Path, from: Instant, limit: Duration) -> Duration {
    let status = tokio::time::timeout(limit.saturating_sub(from.elapsed()), child.wait())
        .await
        .unwrap_or_else(|_| panic!("the run still runs {limit:?} later"))
        .unwrap();
    let took = from.elapsed();
    assert!(!status.success(), "{status}");
    // Its children (the counter's subshells) are gone too.
    let n = lines(&dir.join("marks"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(lines(&dir.join("marks")), n, "something of the run still writes");
    took
}

#[tokio::test]
async fn a_run_stops_itself_when_stale_or_cut_off_and_otherwise_is_its_own_script() {
    let tmp = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(fleet_metasched::run_with(
        listener,
        config(tmp.path()),
        fleet_metasched::Clock::default(),
        fleet_metasched::Control::default(),
        async {
            let _ = rx.await;
        },
    ));
    let http = reqwest::Client::new();

    // 1. The run is its own script: interpreter, arguments, exit code,
    //    output; leased while it counts.
    running_at_alpha(&http, &url, "beta-1").await;
    let dir = run_dir(tmp.path(), "beta-1", "#!/bin/sh\necho \"args: $*\"\necho \"to stderr\" >&2\nexit 7\n");
    let out = lease_exec(&url, "beta-1", &dir, 1, &["a b", "-c"])
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_RESTART_COUNT", "2")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "args: a b -c\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "to stderr\n");
    // The notes the target agent reads when Slurm takes the launch for
    // failed: the script started, and how it ended by itself, each naming
    // its run (Slurm job, Slurm's restart count, fleet epoch).
    let note = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let (start_note, ended, starts) = (note(".fleet-run-started"), note(".fleet-run-ended"), note(".fleet-run-starts"));
    let noted = start_note.strip_prefix("started ").unwrap_or_default().to_string();
    assert!(noted.starts_with("job 4242 restart 2 epoch 1 at "), "{start_note:?}");
    let at = noted.trim_end().rsplit(' ').next().unwrap().parse::<u64>();
    assert!(at.is_ok_and(|ms| ms > 1_700_000_000_000), "{noted:?}");
    assert_eq!((ended, starts), (format!("exit 7 {noted}"), noted.clone()));
    let tok = format!("FleetCkpt {}", auth::ckpt_token("secret-alpha", "beta-1"));
    let r: JobLeaseReply = serde_json::from_value(
        call(
            &http,
            &url,
            Method::POST,
            "/v1/jobs/beta-1/lease",
            &tok,
            Some(serde_json::json!({"epoch": 1, "lease_ms": 60000})),
        )
        .await,
    )
    .unwrap();
    assert_eq!((r.valid_ms, r.stale), (4000, false), "at most the meta-scheduler's job_lease_s");
    // Another job's checkpoint token renews nothing.
    let other = format!("FleetCkpt {}", auth::ckpt_token("secret-alpha", "beta-9"));
    let s = http
        .post(format!("{url}/v1/jobs/beta-1/lease"))
        .header("Authorization", other)
        .json(&serde_json::json!({"epoch": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(s.status(), reqwest::StatusCode::UNAUTHORIZED);

    // 2. A stale run (another epoch) never starts its script.
    let out = lease_exec(&url, "beta-1", &dir, 2, &[]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "fleet: this run does not start: this run is stale: this run is epoch 2; the job is now epoch 1"
        ),
        "{err}"
    );
    assert!(out.stdout.is_empty());

    // 3. A run whose epoch goes stale while it runs (its run "died" at
    //    alpha and the job was placed again) stops itself, all of it.
    running_at_alpha(&http, &url, "beta-2").await;
    let dir = run_dir(tmp.path(), "beta-2", COUNTER);
    let mut child = lease_exec(&url, "beta-2", &dir, 1, &[]).env("SLURM_JOB_ID", "4243").spawn().unwrap();
    started(&dir).await;
    let died = StatusUpdate {
        remote_job_id: Some(7),
        state: Some(JobState::Failed),
        epoch: Some(1),
        died: Some("NODE_FAIL at alpha".into()),
        ..Default::default()
    };
    let t_stale = Instant::now();
    call(
        &http,
        &url,
        Method::POST,
        "/v1/jobs/beta-2/status",
        "Bearer secret-alpha",
        Some(serde_json::to_value(died).unwrap()),
    )
    .await;
    let rec = call(&http, &url, Method::GET, "/v1/jobs/beta-2", "Bearer admin-secret", None).await;
    assert_eq!(rec["epoch"], 2, "{rec}");
    let took = stopped_within(&mut child, &dir, t_stale, Duration::from_millis(LEASE_MS + 3000)).await;
    let log = std::fs::read_to_string(dir.join(".fleet-lease.log")).unwrap();
    assert!(log.contains("stopping the run: this run is stale"), "{log}");
    // The note the agent reads to report the run as died, not failed.
    let note = std::fs::read_to_string(dir.join(".fleet-lease-stopped")).unwrap();
    assert!(note.starts_with("this run is stale: this run is epoch 1; the job is now epoch 2"), "{note}");
    // Started, and no end of its own: the lease stopped it, and its
    // lease-exec's claim says so.
    assert!(dir.join(".fleet-run-started").is_file());
    assert!(!dir.join(".fleet-run-ended").exists());
    assert!(log.contains("its lease watchdog stopped it): not recorded"), "{log}");
    eprintln!("LEASE stale run stopped {took:?} after its epoch went stale (lease {LEASE_MS} ms)");

    // 4. Cut off from the meta-scheduler: the run stops once its lease ran out.
    running_at_alpha(&http, &url, "beta-3").await;
    let dir = run_dir(tmp.path(), "beta-3", COUNTER);
    let mut child = lease_exec(&url, "beta-3", &dir, 1, &[]).spawn().unwrap();
    started(&dir).await;
    // Renewed for longer than one lease while the meta-scheduler answers.
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 1000)).await;
    assert!(child.try_wait().unwrap().is_none(), "a leased run goes on");
    let t_cut = Instant::now();
    let _ = tx.send(());
    daemon.await.unwrap().unwrap();
    let took = stopped_within(&mut child, &dir, t_cut, Duration::from_millis(LEASE_MS + 3000)).await;
    assert!(took >= Duration::from_millis(LEASE_MS / 2), "it held a lease, it did not stop at once: {took:?}");
    let log = std::fs::read_to_string(dir.join(".fleet-lease.log")).unwrap();
    assert!(log.contains("stopping the run: its job lease ran out"), "{log}");
    eprintln!("LEASE cut-off run stopped {took:?} after the meta-scheduler went away (lease {LEASE_MS} ms)");
}

/// A leased run's `lease-exec` stays the batch process: it reports the
/// script's end to the meta-scheduler (recorded for the current epoch)
/// and exits as the script did (code, or the same signal). A signal sent
/// to it alone reaches the script once; one sent to the whole process
/// group (as Slurm signals a step) reaches the script once too, not twice.
#[tokio::test]
async fn a_leased_run_reports_its_end_and_its_signals_arrive_once() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(fleet_metasched::run_with(
        listener,
        config(tmp.path()),
        fleet_metasched::Clock::default(),
        fleet_metasched::Control::default(),
        async {
            let _ = rx.await;
        },
    ));
    let http = reqwest::Client::new();
    let log_of = |dir: &Path| std::fs::read_to_string(dir.join(".fleet-lease.log")).unwrap_or_default();

    // 1. Exit 7: reported, and lease-exec exits 7.
    running_at_alpha(&http, &url, "end-1").await;
    let dir = run_dir(tmp.path(), "end-1", "#!/bin/sh\necho out\nexit 7\n");
    let out = lease_exec(&url, "end-1", &dir, 1, &[]).output().await.unwrap();
    assert_eq!((out.status.code(), out.stdout.as_slice()), (Some(7), &b"out\n"[..]));
    assert!(log_of(&dir).contains("the script ended (exit code 7, on its own): reported"), "{}", log_of(&dir));
    // The same run's claim again is still its current epoch's; another epoch's is not recorded.
    let tok = format!("FleetCkpt {}", auth::ckpt_token("secret-alpha", "end-1"));
    let v = call(
        &http,
        &url,
        Method::POST,
        "/v1/jobs/end-1/end",
        &tok,
        Some(serde_json::json!({"epoch": 2, "exit_code": 0})),
    )
    .await;
    assert_eq!(v["recorded"], false, "{v}");

    // 2. Signals: USR1 to lease-exec alone, then to the whole group; each
    //    reaches the script's trap once. Then TERM to the group ends it.
    running_at_alpha(&http, &url, "end-2").await;
    let script = "#!/bin/sh\ntrap 'echo usr1 >> sigs' USR1\necho ready > ready\nwhile [ ! -e stop ]; do sleep 0.05; done\nexit 0\n";
    let dir = run_dir(tmp.path(), "end-2", script);
    let mut cmd = lease_exec(&url, "end-2", &dir, 1, &[]);
    cmd.process_group(0);
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().unwrap() as i32;
    let t0 = Instant::now();
    while !dir.join("ready").exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the script did not start: {}", log_of(&dir));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let usr1 = |n: usize| {
        let dir = dir.clone();
        async move {
            let t0 = Instant::now();
            while lines(&dir.join("sigs")) < n && t0.elapsed() < Duration::from_secs(5) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Anything doubled would have arrived by now.
            tokio::time::sleep(Duration::from_millis(700)).await;
            lines(&dir.join("sigs"))
        }
    };
    // SAFETY: kill(2) to the child we started.
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    assert_eq!(usr1(1).await, 1, "a signal to the batch process alone reaches the script");
    // SAFETY: kill(2) to the child's own process group.
    unsafe { libc::kill(-pid, libc::SIGUSR1) };
    assert_eq!(usr1(2).await, 2, "a signal to the whole group reaches the script once");
    // SAFETY: as above.
    unsafe { libc::kill(-pid, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    let log = log_of(&dir);
    // A signal not sent by its watchdog: the script's own end (whose), by
    // a signal sent to the whole step (which the agent and meta-scheduler
    // weigh against what Slurm says of the run).
    assert!(
        log.contains("the script ended (signal 15 after signal 15 to the whole step, on its own): reported"),
        "{log}"
    );

    // 2b. The script catches the step's SIGTERM and exits 0 (a
    //     checkpointing job's trap): its end note and claim say the kill
    //     came first, and lease-exec still exits 0 as the script did.
    running_at_alpha(&http, &url, "end-2b").await;
    let script = "#!/bin/sh\ntrap 'exit 0' TERM\necho ready > ready\nwhile :; do sleep 0.05; done\n";
    let dir = run_dir(tmp.path(), "end-2b", script);
    let mut cmd = lease_exec(&url, "end-2b", &dir, 1, &[]);
    cmd.process_group(0).env("SLURM_JOB_ID", "4245");
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().unwrap() as i32;
    wait_for(&dir.join("ready"), &log_of).await;
    // SAFETY: kill(2) to the child's own process group.
    unsafe { libc::kill(-pid, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let log = log_of(&dir);
    assert!(
        log.contains("the script ended (exit code 0 after signal 15 to the whole step, on its own): reported"),
        "{log}"
    );
    let note = std::fs::read_to_string(dir.join(".fleet-run-ended")).unwrap();
    assert!(note.starts_with("exit 0 after 15 job 4245 restart 0 epoch 1 at "), "{note}");

    // 2c. Slurm's abort of a job it does not know: SIGKILL to every
    //     process of the step, the deepest first. The script's child dies
    //     first and the script exits 5 before its own turn; the sentinel's
    //     comes next (lease-exec's would follow, never sent here): the
    //     end came after that kill, not on its own.
    running_at_alpha(&http, &url, "end-2c").await;
    let script = "#!/bin/sh\nsleep 600 &\necho $! > child\necho ready > ready\nwait\nexit 5\n";
    let dir = run_dir(tmp.path(), "end-2c", script);
    let mut cmd = lease_exec(&url, "end-2c", &dir, 1, &[]);
    cmd.env("SLURM_JOB_ID", "4246");
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().unwrap() as i32;
    wait_for(&dir.join("ready"), &log_of).await;
    let sleeper: i32 = std::fs::read_to_string(dir.join("child")).unwrap().trim().parse().unwrap();
    let sentinel = sentinel_of(pid);
    // SAFETY: kill(2) to processes this test started (through lease-exec).
    unsafe {
        libc::kill(sleeper, libc::SIGKILL);
        libc::kill(sentinel, libc::SIGKILL);
    }
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(5), "{status:?}");
    let log = log_of(&dir);
    assert!(
        log.contains("the script ended (exit code 5 after signal 9 to the whole step, on its own): reported"),
        "{log}"
    );
    let note = std::fs::read_to_string(dir.join(".fleet-run-ended")).unwrap();
    assert!(note.starts_with("exit 5 after 9 job 4246 "), "{note}");
    // Without a kill, an exit is noted as it was (case 3 below too).

    // 3. The script ends by itself, then its lease runs out while
    //    lease-exec still tries to report that end (the meta-scheduler is
    //    gone): the end was the script's own (decided before the watchdog
    //    decided to stop the run), so the watchdog leaves lease-exec alone
    //    and writes no lease-stopped note, and lease-exec exits as the
    //    script did, not killed by the watchdog.
    running_at_alpha(&http, &url, "end-3").await;
    let script = "#!/bin/sh\necho ready > ready\nwhile [ ! -e go ]; do sleep 0.05; done\nexit 0\n";
    let dir = run_dir(tmp.path(), "end-3", script);
    let mut child = lease_exec(&url, "end-3", &dir, 1, &[]).env("SLURM_JOB_ID", "4244").spawn().unwrap();
    wait_for(&dir.join("ready"), &log_of).await;
    let _ = tx.send(());
    daemon.await.unwrap().unwrap();
    std::fs::write(dir.join("go"), "").unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.unwrap().unwrap();
    let log = log_of(&dir);
    assert_eq!(status.code(), Some(0), "{status:?}: {log}");
    assert!(log.contains("its script ended first; stopping what is left of it"), "the lease ran out meanwhile: {log}");
    assert!(log.contains("the script ended (exit code 0, on its own): not reported"), "{log}");
    assert_eq!(std::fs::read_to_string(dir.join(".fleet-run-end-cause")).unwrap(), "script\n");
    assert!(!dir.join(".fleet-lease-stopped").exists(), "{log}");
    assert!(std::fs::read_to_string(dir.join(".fleet-run-ended")).unwrap().starts_with("exit 0 job 4244 "));
}

/// Waits (at most 20 s) for `ready` to exist and the run's watchdog to watch.
async fn wait_for(ready: &Path, log_of: &impl Fn(&Path) -> String) {
    let dir = ready.parent().unwrap();
    let t0 = Instant::now();
    while !ready.exists() || !log_of(dir).contains("watching") {
        assert!(t0.elapsed() < Duration::from_secs(20), "the script did not start: {}", log_of(dir));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pid of `lease-exec`'s (pid `parent`) sentinel.
fn sentinel_of(parent: i32) -> i32 {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat.rsplit_once(") ").and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<i32>().ok());
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(parent) && String::from_utf8_lossy(&cmd).contains("lease-sentinel")
        })
        .expect("lease-exec's sentinel")
}

/// A run in a PID namespace of its own, as a pod's container with
/// `shareProcessNamespace`: PID 1 there is a shell standing for the pod's
/// `pause` (it outlives the run until `release` exists in `dir`; the run's
/// exit code goes to `rc`). Unprivileged, through a user namespace.
fn lease_exec_in_pod(url: &str, id: &str, dir: &Path, pod_scope: bool) -> tokio::process::Command {
    let std = lease_exec(url, id, dir, 1, &[]);
    let mut c = tokio::process::Command::new("unshare");
    // SAFETY: getuid(2) cannot fail.
    if unsafe { libc::getuid() } != 0 {
        c.args(["--user", "--map-root-user"]);
    }
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child", "--", "/bin/sh", "-c"])
        .arg("\"$@\"; echo $? > rc; while [ ! -e release ]; do sleep 0.1; done")
        .arg("pause")
        .arg(std.as_std().get_program())
        .args(std.as_std().get_args())
        .current_dir(dir)
        .envs(std.as_std().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .kill_on_drop(true);
    if pod_scope {
        c.env("FLEET_LEASE_SCOPE", "pod");
    }
    c
}

/// A script that double-forks a daemon (re-parented to the namespace's
/// init, in a session of its own: out of the run's process tree), then counts.
const DAEMONIZES: &str = "#!/bin/sh\n( setsid sh -c 'while :; do echo d >> dmarks; sleep 0.1; done' & )\n\
                          i=0\nwhile :; do i=$((i+1)); sh -c \"echo $i >> marks\"; sleep 0.1; done\n";

/// Whether `dir/dmarks` still grows over 800 ms.
async fn daemon_writes(dir: &Path) -> bool {
    let n = lines(&dir.join("dmarks"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    lines(&dir.join("dmarks")) != n
}

#[tokio::test]
async fn in_a_pod_a_stale_run_stops_what_it_daemonized_too() {
    let tmp = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(fleet_metasched::run_with(
        listener,
        config(tmp.path()),
        fleet_metasched::Clock::default(),
        fleet_metasched::Control::default(),
        async {
            let _ = rx.await;
        },
    ));
    let http = reqwest::Client::new();
    // With the pod's scope (what a Kubernetes target sets) and, for
    // contrast, without it (a Slurm run: its tree and its job's cgroup).
    // The pod's run has, as a Kubernetes target gives it, a writable
    // directory of its own (an emptyDir: its script's is a read-only
    // ConfigMap) and a termination message file.
    for (id, pod_scope) in [("beta-4", true), ("beta-5", false)] {
        running_at_alpha(&http, &url, id).await;
        let dir = run_dir(tmp.path(), id, DAEMONIZES);
        let lease_dir = if pod_scope { dir.join("fleet-run") } else { dir.clone() };
        let termination = dir.join("termination-log");
        let mut cmd = lease_exec_in_pod(&url, id, &dir, pod_scope);
        if pod_scope {
            std::fs::create_dir(&lease_dir).unwrap();
            cmd.env("FLEET_LEASE_DIR", &lease_dir).env("FLEET_TERMINATION_LOG", &termination);
        }
        let mut pod = cmd.spawn().expect("unshare");
        started_logging_in(&dir, &lease_dir).await;
        assert!(daemon_writes(&dir).await, "{id}: the daemon runs");
        let died = StatusUpdate {
            remote_job_id: Some(7),
            state: Some(JobState::Failed),
            epoch: Some(1),
            died: Some("NODE_FAIL at alpha".into()),
            ..Default::default()
        };
        let t_stale = Instant::now();
        let path = format!("/v1/jobs/{id}/status");
        call(&http, &url, Method::POST, &path, "Bearer secret-alpha", Some(serde_json::to_value(died).unwrap())).await;
        while !dir.join("rc").exists() {
            assert!(
                t_stale.elapsed() < Duration::from_millis(LEASE_MS + 5000),
                "{id}: the run still runs; {:?}",
                std::fs::read_to_string(lease_dir.join(".fleet-lease.log"))
            );
            assert!(pod.try_wait().unwrap().is_none(), "{id}: the namespace ended before the run");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = std::fs::read_to_string(lease_dir.join(".fleet-lease.log")).unwrap();
        assert!(log.contains("stopping the run: this run is stale"), "{id}: {log}");
        // lease-exec found the watchdog's note where it wrote it: the run's
        // end is its lease's, not reported as the script's own.
        assert!(log.contains("its lease watchdog stopped it): not recorded"), "{id}: {log}");
        let decided = std::fs::read_to_string(lease_dir.join(".fleet-run-end-cause")).unwrap();
        assert!(decided.starts_with("lease: this run is stale"), "{id}: {decided}");
        let note = std::fs::read_to_string(lease_dir.join(".fleet-lease-stopped")).unwrap();
        assert!(note.starts_with("this run is stale"), "{id}: {note}");
        if pod_scope {
            assert!(!dir.join(".fleet-lease-stopped").exists() && !dir.join(".fleet-lease.log").exists(), "{id}");
            let msg = std::fs::read_to_string(&termination).unwrap();
            assert!(
                msg.starts_with(&format!("fleet: stopping this run of job {id} at this cluster: this run is stale")),
                "{msg}"
            );
        } else {
            assert!(!termination.exists(), "{id}: no termination message file unless named");
        }
        let n = lines(&dir.join("marks"));
        assert_eq!(daemon_writes(&dir).await, !pod_scope, "{id}: does the daemon outlive the run's stop?");
        assert_eq!(lines(&dir.join("marks")), n, "{id}: the run's own tree is stopped");
        eprintln!("LEASE {id} (pod scope: {pod_scope}) stopped {:?} after its epoch went stale", t_stale.elapsed());
        // The pod ends: its init exits and the kernel ends the namespace.
        std::fs::write(dir.join("release"), "").unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), pod.wait()).await.expect("the pod ends").unwrap();
        assert!(status.success(), "{id}: {status}");
    }
}

/// A job placed early (docs/failover.md, "Start latency"): its run's
/// `lease-exec` is answered "wait" and keeps its script from starting
/// until the origin confirms the stand-in; then the script starts at once
/// (the held-back answer comes as soon as the gate opens).
#[tokio::test]
async fn a_run_placed_early_starts_its_script_only_once_the_origin_confirms() {
    let tmp = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(fleet_metasched::run_with(
        listener,
        config(tmp.path()),
        fleet_metasched::Clock::default(),
        fleet_metasched::Control::default(),
        async {
            let _ = rx.await;
        },
    ));
    let http = reqwest::Client::new();
    let hb = serde_json::json!({"cluster": "alpha", "scheduler": "slurm", "queue_pending": 0, "queue_running": 0, "agent_version": "t", "start_gate": true, "nodes": [{"name": "a1", "partitions": ["gpu"],
        "gpu_type": "h100", "gpus_total": 8, "gpus_free": 8, "state": "idle"}]});
    call(&http, &url, Method::POST, "/v1/heartbeat", "Bearer secret-alpha", Some(hb)).await;
    let request = JobRequest {
        origin: "beta".into(),
        user_id: 1000,
        gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
        script: Some(b"#!/bin/sh\n".to_vec()),
        ..Default::default()
    };
    let fwd =
        ForwardRequest { fleet_job_id: "beta-e".into(), request, tentative_target: "alpha".into(), early_start: true };
    let r = call(&http, &url, Method::POST, "/v1/jobs", "Bearer secret-beta", Some(serde_json::to_value(fwd).unwrap()))
        .await;
    assert_eq!((r["state"].as_str(), r["target"].as_str()), (Some("assigned"), Some("alpha")), "placed early: {r}");
    let running =
        StatusUpdate { remote_job_id: Some(7), state: Some(JobState::Running), epoch: Some(1), ..Default::default() };
    let body = Some(serde_json::to_value(running).unwrap());
    call(&http, &url, Method::POST, "/v1/jobs/beta-e/status", "Bearer secret-alpha", body).await;

    let dir = run_dir(tmp.path(), "beta-e", "#!/bin/sh\ntouch started\necho ran\n");
    let mut child = lease_exec(&url, "beta-e", &dir, 1, &[]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    // Longer than the lease (4 s): a wait is not a refusal.
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 1500)).await;
    assert!(!dir.join("started").exists(), "the script ran before the origin confirmed its stand-in");
    assert!(child.try_wait().unwrap().is_none(), "lease-exec gave up while told to wait");
    // The stand-in starts and the origin agent confirms.
    let token = auth::job_token("secret-beta", "beta-e");
    let start = serde_json::to_value(StartRequest { origin_job_id: 3, ..Default::default() }).unwrap();
    call(&http, &url, Method::POST, "/v1/jobs/beta-e/start", &format!("FleetJob {token}"), Some(start)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!dir.join("started").exists(), "a start request alone starts nothing");
    let c = serde_json::to_value(StartConfirmation { origin_job_id: 3, started: true, ..Default::default() }).unwrap();
    let t0 = Instant::now();
    call(&http, &url, Method::POST, "/v1/jobs/beta-e/confirm_start", "Bearer secret-beta", Some(c)).await;
    while !dir.join("started").exists() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the script did not start after the confirmation");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = t0.elapsed();
    println!("confirmation to script start: {} ms", took.as_millis());
    assert!(took < Duration::from_millis(600), "the held-back lease answer comes with the confirmation: {took:?}");
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    let _ = tx.send(());
    let _ = daemon.await;
}
