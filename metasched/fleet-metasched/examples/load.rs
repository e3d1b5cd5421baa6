//! Load figures for the meta-scheduler, in process over real HTTP:
//! `cargo run --release -p fleet-metasched --example load -- [jobs] [concurrency]`
//!
//! Each job goes forward → start → confirm_start → work → pending → running →
//! one 4 KiB chunk → completed (8 requests). Then 64 MiB of output is written in
//! 1 MiB chunks and read back.

use std::time::{Duration, Instant};

use fleet_api::api::{ForwardRequest, Heartbeat, NodeCapacity, OutputChunk, StatusUpdate, Stream};
use fleet_api::{GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let jobs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let conc: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16);
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    std::fs::write(dir.join("admin"), "admin")?;
    let mut clusters = Vec::new();
    for n in ["alpha", "beta"] {
        std::fs::write(dir.join(n), format!("tok-{n}"))?;
        clusters.push(ClusterConfig {
            name: n.into(),
            region: String::new(),
            provider: String::new(),
            token_file: dir.join(n),
            ..Default::default()
        });
    }
    let config = Config {
        heartbeat_timeout_s: 3600.0,
        clusters,
        ..Config::new("127.0.0.1:0".parse()?, dir.join("state"), dir.join("admin"))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(fleet_metasched::run(listener, config, std::future::pending()));
    let http = reqwest::Client::new();
    for (c, ty) in [("alpha", "h100"), ("beta", "a100")] {
        let hb = Heartbeat {
            cluster: c.into(),
            scheduler: "slurm".into(),
            nodes: vec![NodeCapacity {
                name: "n".into(),
                partitions: vec![],
                gpu_type: Some(ty.into()),
                gpus_total: 8,
                gpus_free: 8,
                state: "idle".into(),
                switch: None,
                ..Default::default()
            }],
            ..Default::default()
        };
        http.post(format!("{url}/v1/heartbeat"))
            .bearer_auth(format!("tok-{c}"))
            .json(&hb)
            .send()
            .await?
            .error_for_status()?;
    }

    let t0 = Instant::now();
    let mut lat = Vec::new();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..conc {
        let (http, url) = (http.clone(), url.clone());
        set.spawn(async move {
            let mut lat = Vec::new();
            for i in (w..jobs).step_by(conc) {
                let id = format!("job-{i}");
                let fwd = ForwardRequest {
                    fleet_job_id: id.clone(),
                    request: JobRequest {
                        origin: "beta".into(),
                        gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 8, scope: GpuScope::Node }],
                        ..Default::default()
                    },
                    tentative_target: "alpha".into(),
                    early_start: false,
                };
                let step = |rb: reqwest::RequestBuilder| {
                    let t = Instant::now();
                    async move {
                        let r = rb.send().await.expect("send");
                        assert!(r.status().is_success(), "{}", r.status());
                        let _ = r.bytes().await;
                        t.elapsed()
                    }
                };
                lat.push(step(http.post(format!("{url}/v1/jobs")).bearer_auth("tok-beta").json(&fwd)).await);
                lat.push(
                    step(
                        http.post(format!("{url}/v1/jobs/{id}/start"))
                            .bearer_auth("tok-beta")
                            .json(&serde_json::json!({"origin_job_id": 1})),
                    )
                    .await,
                );
                lat.push(
                    step(
                        http.post(format!("{url}/v1/jobs/{id}/confirm_start"))
                            .bearer_auth("tok-beta")
                            .json(&serde_json::json!({"origin_job_id": 1, "started": true})),
                    )
                    .await,
                );
                lat.push(step(http.get(format!("{url}/v1/agent/work")).bearer_auth("tok-alpha")).await);
                for s in [JobState::Pending, JobState::Running] {
                    let u = StatusUpdate { remote_job_id: Some(i as u64), state: Some(s), ..Default::default() };
                    lat.push(
                        step(http.post(format!("{url}/v1/jobs/{id}/status")).bearer_auth("tok-alpha").json(&u)).await,
                    );
                }
                let ch = OutputChunk { stream: Stream::Stdout, offset: 0, data: vec![b'x'; 4096], epoch: None };
                lat.push(
                    step(http.post(format!("{url}/v1/jobs/{id}/output")).bearer_auth("tok-alpha").json(&ch)).await,
                );
                let u = StatusUpdate {
                    state: Some(JobState::Completed),
                    exit_code: Some(0),
                    final_stdout_len: Some(4096),
                    final_stderr_len: Some(0),
                    ..Default::default()
                };
                lat.push(step(http.post(format!("{url}/v1/jobs/{id}/status")).bearer_auth("tok-alpha").json(&u)).await);
            }
            lat
        });
    }
    while let Some(r) = set.join_next().await {
        lat.extend(r?);
    }
    let el = t0.elapsed();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "{jobs} job lifecycles ({} requests, concurrency {conc}) in {:.2}s: {:.0} req/s, {:.0} jobs/s; latency p50 {:?} p99 {:?} max {:?}",
        lat.len(),
        el.as_secs_f64(),
        lat.len() as f64 / el.as_secs_f64(),
        jobs as f64 / el.as_secs_f64(),
        pct(0.5),
        pct(0.99),
        lat[lat.len() - 1]
    );

    // Output throughput on one job (already completed above: write to a fresh one).
    let fwd = ForwardRequest {
        fleet_job_id: "big".into(),
        request: JobRequest {
            origin: "beta".into(),
            gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 8, scope: GpuScope::Node }],
            ..Default::default()
        },
        tentative_target: "alpha".into(),
        early_start: false,
    };
    http.post(format!("{url}/v1/jobs")).bearer_auth("tok-beta").json(&fwd).send().await?.error_for_status()?;
    http.post(format!("{url}/v1/jobs/big/start"))
        .bearer_auth("tok-beta")
        .json(&serde_json::json!({"origin_job_id": 1}))
        .send()
        .await?
        .error_for_status()?;
    http.post(format!("{url}/v1/jobs/big/confirm_start"))
        .bearer_auth("tok-beta")
        .json(&serde_json::json!({"origin_job_id": 1, "started": true}))
        .send()
        .await?
        .error_for_status()?;
    let mb = 64u64;
    let t = Instant::now();
    for i in 0..mb {
        let ch = OutputChunk { stream: Stream::Stdout, offset: i << 20, data: vec![b'y'; 1 << 20], epoch: None };
        http.post(format!("{url}/v1/jobs/big/output"))
            .bearer_auth("tok-alpha")
            .json(&ch)
            .send()
            .await?
            .error_for_status()?;
    }
    let w = t.elapsed();
    let t = Instant::now();
    let mut off = 0u64;
    while off < mb << 20 {
        let b = http
            .get(format!("{url}/v1/jobs/big/output?stream=stdout&offset={off}&max={}", 1 << 20))
            .bearer_auth("admin")
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        off += b.len() as u64;
    }
    let r = t.elapsed();
    let rate = |d: Duration| mb as f64 / d.as_secs_f64();
    println!("output: write {mb} MiB in 1 MiB chunks {:.0} MiB/s, read back {:.0} MiB/s", rate(w), rate(r));
    Ok(())
}
