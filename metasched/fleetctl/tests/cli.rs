//! Run the fleetctl binary against an in-process fleet-metasched.

use std::path::Path;
use std::process::Output;

use fleet_api::api::{ForwardRequest, Heartbeat, NodeCapacity};
use fleet_api::{GpuRequest, GpuScope, JobRequest};
use fleet_metasched::config::{ClusterConfig, Config};

fn config(dir: &Path) -> Config {
    std::fs::write(dir.join("admin.token"), "admin\n").unwrap();
    let clusters = ["alpha", "beta"]
        .iter()
        .map(|n| {
            let p = dir.join(format!("{n}.token"));
            std::fs::write(&p, format!("tok-{n}")).unwrap();
            ClusterConfig {
                name: n.to_string(),
                region: "lab".into(),
                provider: "onprem".into(),
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

async fn ctl(url: &str, dir: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(args)
        .env("FLEET_URL", url)
        .env("FLEET_TOKEN_FILE", dir.join("admin.token"))
        .output()
        .await
        .unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A meta-scheduler over `dir` on a free port: its URL, the switch that
/// stops it, and its task.
async fn serve(
    dir: &std::path::Path,
) -> (String, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(fleet_metasched::run(listener, config(dir), async {
        let _ = rx.await;
    }));
    (url, stop, server)
}

/// alpha's agent reports one h100 node with `free` of its 8 GPUs free.
async fn heartbeat_alpha(http: &reqwest::Client, url: &str, free: u32, state: &str, queue_pending: u32) {
    let hb = Heartbeat {
        cluster: "alpha".into(),
        scheduler: "slurm".into(),
        nodes: vec![NodeCapacity {
            name: "a1".into(),
            gpu_type: Some("h100".into()),
            gpus_total: 8,
            gpus_free: free,
            state: state.into(),
            ..Default::default()
        }],
        queue_pending,
        ..Default::default()
    };
    let r = http.post(format!("{url}/v1/heartbeat")).bearer_auth("tok-alpha").json(&hb).send().await.unwrap();
    assert!(r.status().is_success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_jobs_job_cancel_explain() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (url, stop, server) = serve(dir).await;
    let http = reqwest::Client::new();
    heartbeat_alpha(&http, &url, 6, "mixed", 3).await;
    for (id, n) in [("j-small", 4), ("j-huge", 64)] {
        let fwd = ForwardRequest {
            fleet_job_id: id.into(),
            request: JobRequest {
                origin: "beta".into(),
                gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: n, scope: GpuScope::Node }],
                time_limit_min: Some(30),
                ..Default::default()
            },
            tentative_target: "alpha".into(),
            early_start: false,
        };
        let r = http.post(format!("{url}/v1/jobs")).bearer_auth("tok-beta").json(&fwd).send().await.unwrap();
        assert!(r.status().is_success());
    }

    let o = ctl(&url, dir, &["clusters"]).await;
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.starts_with("NAME "), "{out}");
    assert!(out.lines().any(|l| l.starts_with("alpha ") && l.contains(" healthy ") && l.contains("h100:6/8")), "{out}");
    // Never heard from: degraded, and why.
    assert!(
        out.lines().any(|l| l.starts_with("beta ")
            && l.contains(" degraded ")
            && l.contains(" never ")
            && l.contains("no heartbeat since the meta-scheduler started")),
        "{out}"
    );

    let o = ctl(&url, dir, &["jobs", "--state", "held"]).await;
    let out = text(&o);
    assert!(o.status.success() && out.contains("j-small") && out.contains("j-huge"), "{out}");
    assert!(out.contains("gpu:h100:4 on 1 node(s), 30 min"), "{out}");

    let o = ctl(&url, dir, &["--json", "jobs", "--origin", "alpha"]).await;
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");

    let o = ctl(&url, dir, &["job", "j-small"]).await;
    let out = text(&o);
    assert!(o.status.success() && out.contains("state             held"), "{out}");
    assert!(out.ends_with("last_checkpoint   -\n"), "the catalog has none: {out}");

    let o = ctl(&url, dir, &["job", "explain", "j-huge"]).await;
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("rule now:  impossible"), "{out}");
    assert!(out.contains("  alpha: has at most 8 h100 per node"), "{out}");
    assert!(out.contains("  beta: no heartbeat"), "{out}");
    assert!(out.contains("ranking:   first rule only"), "{out}");

    let o = ctl(&url, dir, &["job", "cancel", "j-small"]).await;
    assert_eq!(text(&o), "j-small: cancelled\n");

    let o = ctl(&url, dir, &["job", "nope"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("HTTP 404: unknown job"), "{}", text(&o));

    let o = ctl(&url, dir, &["jobs", "--state", "sleeping"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("--state \"sleeping\": unknown state"), "{}", text(&o));

    let csv = dir.join("prices.csv");
    std::fs::write(
        &csv,
        "provider,region,zone,instance_type,gpu_type,gpu_count,vcpus,memory_gib,price_ondemand_usd_hr,price_spot_usd_hr\n\
         aws,us-east-1,z,p5.48xlarge,H100,8,192,2048,40.0,12.0\n",
    )
    .unwrap();
    let o = ctl(&url, dir, &["prices", "import", csv.to_str().unwrap()]).await;
    assert_eq!(text(&o), "1 price entries (0 fractional-GPU rows skipped), stored; no cost-engine policy is configured, so it is not used yet\n");

    let o = ctl(&url, dir, &["rebalance"]).await;
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).starts_with("no cost-engine policy configured"), "{}", text(&o));
    let o = ctl(&url, dir, &["rebalance", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["proposals"], serde_json::json!([]));
    assert!(v["reason"].is_string(), "{v}");

    let o = ctl(&url, dir, &["job"]).await;
    assert_eq!(o.status.code(), Some(2));

    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(["--url", &url, "clusters"])
        .env_remove("FLEET_TOKEN_FILE")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("no token"), "{}", text(&o));

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// `fleetctl jobs` for an admin: user column, filters done by the server,
/// newest first in pages, human times, and a job that never ran shows `-`
/// and its reason rather than exit code 1 or 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_for_admins() {
    use fleet_api::api::{StartRequest, StatusUpdate};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (url, stop, server) = serve(dir).await;
    let http = reqwest::Client::new();
    heartbeat_alpha(&http, &url, 8, "idle", 0).await;
    // Oldest first: ann-1, bob-1, ann-2.
    for (id, user) in [("ann-1", "ann"), ("bob-1", "bob"), ("ann-2", "ann")] {
        let fwd = ForwardRequest {
            fleet_job_id: id.into(),
            request: JobRequest {
                origin: "beta".into(),
                user_name: Some(user.into()),
                gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
                time_limit_min: Some(30),
                ..Default::default()
            },
            tentative_target: "alpha".into(),
            early_start: false,
        };
        let r = http.post(format!("{url}/v1/jobs")).bearer_auth("tok-beta").json(&fwd).send().await.unwrap();
        assert!(r.status().is_success());
    }
    // bob-1's stand-in (job 4711 at beta) starts; sbatch at alpha refuses it.
    let token = fleet_api::auth::job_token("tok-beta", "bob-1");
    let r = http
        .post(format!("{url}/v1/jobs/bob-1/start"))
        .header("Authorization", format!("FleetJob {token}"))
        .json(&StartRequest { origin_job_id: 4711, ..Default::default() })
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    // beta's agent confirms that Slurm runs that stand-in.
    let confirm = fleet_api::api::StartConfirmation { origin_job_id: 4711, started: true, ..Default::default() };
    let r = http
        .post(format!("{url}/v1/jobs/bob-1/confirm_start"))
        .bearer_auth("tok-beta")
        .json(&confirm)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let upd = StatusUpdate {
        state: Some(fleet_api::JobState::Failed),
        exit_code: Some(1),
        reason: "sbatch at alpha: error: Invalid account".into(),
        final_stdout_len: Some(0),
        final_stderr_len: Some(0),
        ..Default::default()
    };
    let r = http.post(format!("{url}/v1/jobs/bob-1/status")).bearer_auth("tok-alpha").json(&upd).send().await.unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);

    let ids = |out: &str| {
        out.lines().skip(1).map(|l| l.split_whitespace().next().unwrap_or("").to_string()).collect::<Vec<_>>()
    };
    let o = ctl(&url, dir, &["--utc", "jobs"]).await;
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(ids(&out), ["ann-2", "bob-1", "ann-1"], "newest first:\n{out}");
    assert!(out.starts_with("ID     USER  ORIGIN  ORIGIN_JOB  TARGET  REMOTE  STATE   EXIT  SUBMITTED(UTC)"), "{out}");
    let bob = out.lines().find(|l| l.starts_with("bob-1")).unwrap();
    let cells: Vec<&str> = bob.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(&cells[..8], ["bob-1", "bob", "beta", "4711", "alpha", "-", "failed", "-"], "{out}");
    assert!(cells[8].len() == 19 && cells[8].as_bytes()[10] == b' ', "a date and time: {out}");
    assert!(bob.ends_with("sbatch at alpha: error: Invalid account"), "{out}");

    let o = ctl(&url, dir, &["jobs", "--user", "ann"]).await;
    assert_eq!(ids(&String::from_utf8_lossy(&o.stdout)), ["ann-2", "ann-1"], "{}", text(&o));
    let o = ctl(&url, dir, &["jobs", "--origin-job", "4711", "--origin", "beta"]).await;
    assert_eq!(ids(&String::from_utf8_lossy(&o.stdout)), ["bob-1"], "{}", text(&o));
    let o = ctl(&url, dir, &["jobs", "--cluster", "alpha", "--state", "failed"]).await;
    assert_eq!(ids(&String::from_utf8_lossy(&o.stdout)), ["bob-1"], "{}", text(&o));
    let o = ctl(&url, dir, &["jobs", "--active"]).await;
    assert_eq!(ids(&String::from_utf8_lossy(&o.stdout)), ["ann-2", "ann-1"], "{}", text(&o));
    let o = ctl(&url, dir, &["jobs", "--since", "1h"]).await;
    assert_eq!(ids(&String::from_utf8_lossy(&o.stdout)).len(), 3, "{}", text(&o));
    let o = ctl(&url, dir, &["jobs", "--since", "2999-01-01"]).await;
    assert!(ids(&String::from_utf8_lossy(&o.stdout)).is_empty(), "{}", text(&o));

    // Pages of two: the footer (stderr) points at the next page.
    let o = ctl(&url, dir, &["jobs", "--limit", "2"]).await;
    assert_eq!(ids(&String::from_utf8_lossy(&o.stdout)), ["ann-2", "bob-1"], "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stderr), "fleetctl: jobs 1-2 (newest first); more on --page 2\n");
    let o = ctl(&url, dir, &["jobs", "--limit", "2", "--page", "2"]).await;
    assert_eq!(ids(&String::from_utf8_lossy(&o.stdout)), ["ann-1"], "{}", text(&o));
    assert!(o.stderr.is_empty(), "{}", text(&o));
    let o = ctl(&url, dir, &["--json", "jobs", "--limit", "1"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v[0]["user"], "ann", "{v}");

    let o = ctl(&url, dir, &["--utc", "job", "bob-1"]).await;
    let out = text(&o);
    assert!(out.contains("exit              - (never ran; see reason)"), "{out}");
    assert!(out.contains("user              bob"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("submitted_at") && l.contains("Z (") && l.contains("s ago; ")), "{out}");

    let o = ctl(&url, dir, &["jobs", "--since", "last tuesday"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("--since \"last tuesday\": expected a duration"), "{}", text(&o));

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_signal_queues_the_signal_for_the_target() {
    use fleet_api::api::{AgentWork, SignalOrder, SignalScope, StartConfirmation, StartRequest, StatusUpdate};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (url, stop, server) = serve(dir).await;
    let http = reqwest::Client::new();
    let post = |path: String, auth: String, body: serde_json::Value| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let r = http.post(format!("{url}{path}")).header("Authorization", auth).json(&body).send().await.unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
        }
    };
    let hb = Heartbeat {
        cluster: "alpha".into(),
        scheduler: "slurm".into(),
        nodes: vec![NodeCapacity {
            name: "a1".into(),
            gpu_type: Some("h100".into()),
            gpus_total: 8,
            gpus_free: 8,
            state: "idle".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    post("/v1/heartbeat".into(), "Bearer tok-alpha".into(), serde_json::to_value(&hb).unwrap()).await;
    let fwd = ForwardRequest {
        fleet_job_id: "j-sig".into(),
        request: JobRequest {
            origin: "beta".into(),
            gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 8, scope: GpuScope::Node }],
            ..Default::default()
        },
        tentative_target: "alpha".into(),
        early_start: false,
    };
    post("/v1/jobs".into(), "Bearer tok-beta".into(), serde_json::to_value(&fwd).unwrap()).await;

    // Held: refused, with the reason.
    let o = ctl(&url, dir, &["job", "signal", "j-sig", "USR1"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("HTTP 409") && text(&o).contains("held until its stand-in starts"), "{}", text(&o));

    // Started, placed at alpha, running there as job 31.
    let job_auth = format!("FleetJob {}", fleet_api::auth::job_token("tok-beta", "j-sig"));
    post(
        "/v1/jobs/j-sig/start".into(),
        job_auth,
        serde_json::to_value(StartRequest { origin_job_id: 5, ..Default::default() }).unwrap(),
    )
    .await;
    let confirm = StartConfirmation { origin_job_id: 5, started: true, ..Default::default() };
    post("/v1/jobs/j-sig/confirm_start".into(), "Bearer tok-beta".into(), serde_json::to_value(confirm).unwrap()).await;
    let running =
        StatusUpdate { remote_job_id: Some(31), state: Some(fleet_api::JobState::Running), ..Default::default() };
    post("/v1/jobs/j-sig/status".into(), "Bearer tok-alpha".into(), serde_json::to_value(running).unwrap()).await;

    let o = ctl(&url, dir, &["job", "signal", "j-sig", "SIGusr1", "--scope", "batch"]).await;
    assert_eq!(
        text(&o),
        "j-sig: SIGUSR1 queued for alpha (running there as job 31; its agent runs scancel --signal=USR1 --batch)\n"
    );
    let o = ctl(&url, dir, &["job", "signal", "j-sig", "HUP", "--scope", "steps"]).await;
    assert!(text(&o).ends_with("scancel --signal=HUP)\n"), "{}", text(&o));
    let o = ctl(&url, dir, &["--json", "job", "signal", "j-sig", "WINCH"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["fleet_job_id"].as_str(), v["state"].as_str()), (Some("j-sig"), Some("running")), "{v}");
    let work: AgentWork =
        http.get(format!("{url}/v1/agent/work")).bearer_auth("tok-alpha").send().await.unwrap().json().await.unwrap();
    let order = |s: &str, scope| SignalOrder { fleet_job_id: "j-sig".into(), signal: s.into(), scope };
    assert_eq!(
        work.signal,
        [order("USR1", SignalScope::Batch), order("HUP", SignalScope::Steps), order("WINCH", SignalScope::Full)]
    );

    // A name outside the list is refused before any call.
    let o = ctl(&url, dir, &["job", "signal", "j-sig", "SEGV"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).starts_with("fleetctl: unknown signal \"SEGV\"; expected one of HUP"), "{}", text(&o));
    let o = ctl(&url, dir, &["job", "signal", "nope", "USR1"]).await;
    assert!(text(&o).contains("HTTP 404: unknown job"), "{}", text(&o));

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
