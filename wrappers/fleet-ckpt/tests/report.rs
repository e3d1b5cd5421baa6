//! `fleet-ckpt save` reports to a real (in-process) meta-scheduler's
//! catalog with the job's token, as a job does at its target; the
//! catalog's record matches what was saved.

mod common;

use std::path::Path;

use common::{bytes, write_tree};
use fleet_api::api::{Checkpoint, ForwardRequest, JobRecord, StartConfirmation, StartRequest};
use fleet_api::{auth, FleetOptions, GpuRequest, GpuScope, JobRequest, JobState};
use fleet_metasched::config::{ClusterConfig, Config};
use reqwest::Method;
use serde_json::Value;

fn config(dir: &Path, store: &str) -> Config {
    std::fs::write(dir.join("admin.token"), "admin-secret").unwrap();
    let clusters = ["alpha", "beta"]
        .iter()
        .map(|n| {
            let p = dir.join(format!("{n}.token"));
            std::fs::write(&p, format!("secret-{n}")).unwrap();
            ClusterConfig {
                name: n.to_string(),
                region: format!("r-{n}"),
                token_file: p,
                ckpt_url: (*n == "alpha").then(|| store.to_string()),
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

#[tokio::test]
async fn save_reports_to_the_catalog_with_the_job_token() {
    let tmp = tempfile::tempdir().unwrap();
    let store = format!("file://{}/store-alpha", tmp.path().display());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(fleet_metasched::run_with(
        listener,
        config(tmp.path(), &store),
        fleet_metasched::Clock::default(),
        fleet_metasched::Control::default(),
        async {
            let _ = rx.await;
        },
    ));
    let http = reqwest::Client::new();
    let hb = serde_json::json!({"cluster": "alpha", "scheduler": "slurm", "queue_pending": 0, "queue_running": 0, "agent_version": "t", "nodes": [{"name": "a1", "partitions": ["gpu"],
        "gpu_type": "h100", "gpus_total": 8, "gpus_free": 8, "state": "idle"}]});
    call(&http, &url, Method::POST, "/v1/heartbeat", "Bearer secret-alpha", Some(hb)).await;
    // A job from beta, placed at alpha.
    let id = "beta-7";
    let request = JobRequest {
        origin: "beta".into(),
        user_id: 1000,
        gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 1, scope: GpuScope::Node }],
        script: Some(b"#!/bin/sh\n".to_vec()),
        fleet: FleetOptions { to: vec!["alpha".into()], ..Default::default() },
        ..Default::default()
    };
    let fwd = ForwardRequest { fleet_job_id: id.into(), request, tentative_target: "alpha".into(), early_start: false };
    call(&http, &url, Method::POST, "/v1/jobs", "Bearer secret-beta", Some(serde_json::to_value(fwd).unwrap())).await;
    let token = auth::job_token("secret-beta", id);
    let start = serde_json::to_value(StartRequest { origin_job_id: 3, ..Default::default() }).unwrap();
    call(&http, &url, Method::POST, &format!("/v1/jobs/{id}/start"), &format!("FleetJob {token}"), Some(start)).await;
    let c = serde_json::to_value(StartConfirmation {
        origin_job_id: 3,
        started: true,
        reason: String::new(),
        ..Default::default()
    })
    .unwrap();
    let r: JobRecord = serde_json::from_value(
        call(&http, &url, Method::POST, &format!("/v1/jobs/{id}/confirm_start"), "Bearer secret-beta", Some(c)).await,
    )
    .unwrap();
    assert_eq!((r.state, r.target.as_deref()), (JobState::Assigned, Some("alpha")));
    // What alpha's agent hands the job: its prefix in alpha's region.
    let work = call(&http, &url, Method::GET, "/v1/agent/work", "Bearer secret-alpha", None).await;
    let prefix = work["submit"][0]["request"]["fleet"]["ckpt"].as_str().unwrap().to_string();
    assert_eq!(prefix, format!("{store}/{id}"));

    // The job saves a checkpoint with the helper, given its token.
    let dir = tmp.path().join("ckpt");
    write_tree(&dir, &[("w.bin", bytes(1, 1_000_000))]);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-ckpt"))
        .args(["--json", "save", dir.to_str().unwrap(), "--step", "40"])
        .env("FLEET_CKPT_URL", &prefix)
        .env("FLEET_JOB_ID", id)
        .env("FLEET_METASCHED_URL", &url)
        .env("FLEET_JOB_TOKEN", &token)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("warning"), "{stderr}");
    let saved: Value = serde_json::from_slice(&out.stdout).unwrap();

    let list: Vec<Checkpoint> = serde_json::from_value(
        call(&http, &url, Method::GET, &format!("/v1/jobs/{id}/checkpoints"), "Bearer admin-secret", None).await,
    )
    .unwrap();
    assert_eq!(list.len(), 1);
    let c = &list[0];
    assert_eq!(c.url, format!("{prefix}/ckpt-000000000001"));
    assert_eq!(c.url, saved["url"].as_str().unwrap());
    assert_eq!(c.manifest_sha256, saved["manifest_sha256"].as_str().unwrap());
    assert_eq!((c.seq, c.step, c.bytes, c.valid), (1, Some(40), 1_000_000, true));
    assert_eq!((c.region.as_deref(), c.reported_by.as_str()), (Some("r-alpha"), "job"));
    // The manifest digest in the catalog is that of the stored manifest.
    let manifest =
        std::fs::read(tmp.path().join(format!("store-alpha/{id}/ckpt-000000000001/fleet-ckpt.json"))).unwrap();
    assert_eq!(fleet_ckpt::manifest::sha256_hex(&manifest), c.manifest_sha256);

    // A wrong token: the checkpoint is saved, the report refused with a warning.
    write_tree(&dir, &[("w.bin", bytes(2, 1000))]);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-ckpt"))
        .args(["save", dir.to_str().unwrap()])
        .env("FLEET_CKPT_URL", &prefix)
        .env("FLEET_JOB_ID", id)
        .env("FLEET_METASCHED_URL", &url)
        .env("FLEET_JOB_TOKEN", auth::job_token("secret-alpha", id))
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("warning") && stderr.contains("401") && stderr.contains("does not match"), "{stderr}");

    // At its target the job has a checkpoint token file (the agent's
    // crate::ckpt writes it): its own job's token reports, another job's
    // does not, and a link instead of a file is not followed.
    let save_with = |token_file: std::path::PathBuf, seq: u64| {
        let (dir, prefix, url) = (dir.clone(), prefix.clone(), url.clone());
        async move {
            write_tree(&dir, &[("w.bin", bytes(seq, 1000))]);
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleet-ckpt"))
                .args(["save", dir.to_str().unwrap(), "--seq", &seq.to_string()])
                .env("FLEET_CKPT_URL", &prefix)
                .env("FLEET_JOB_ID", id)
                .env("FLEET_METASCHED_URL", &url)
                .env("FLEET_CKPT_TOKEN_FILE", &token_file)
                .output()
                .await
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(out.status.success(), "{stderr}");
            stderr
        }
    };
    let mine = tmp.path().join("token-mine");
    std::fs::write(&mine, format!("{}\n", auth::ckpt_token("secret-alpha", id))).unwrap();
    let theirs = tmp.path().join("token-theirs");
    std::fs::write(&theirs, auth::ckpt_token("secret-alpha", "beta-8")).unwrap();
    let link = tmp.path().join("token-link");
    std::os::unix::fs::symlink(&mine, &link).unwrap();
    let e = save_with(mine, 5).await;
    assert!(!e.contains("warning"), "{e}");
    let e = save_with(theirs, 6).await;
    assert!(e.contains("401") && e.contains("checkpoint token does not match"), "{e}");
    let e = save_with(link, 7).await;
    assert!(e.contains("warning") && e.contains("token file"), "{e}");
    let list: Vec<Checkpoint> = serde_json::from_value(
        call(&http, &url, Method::GET, &format!("/v1/jobs/{id}/checkpoints"), "Bearer admin-secret", None).await,
    )
    .unwrap();
    assert_eq!(list.iter().map(|c| c.seq).collect::<Vec<_>>(), [5, 1], "only the own token's report landed");
    assert_eq!(list[0].reported_by, "job");

    let _ = tx.send(());
    daemon.await.unwrap().unwrap();
}
