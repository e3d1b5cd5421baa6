//! Deferred stand-ins, the agent's side ([`fleet_api::deferred`]).
//!
//! A deferred stand-in's `fleet-proxy` (running as the job's user, on the
//! agent's host) asks on `AgentSpoolDir/deferred.sock` to forward its job
//! now. Nothing it says is trusted but its Slurm job id, which only names
//! what to check, and its `SLURM_ARRAY_*` numbers: the agent reads the
//! stand-in from Slurm (RUNNING, in the proxy partition, Fleet's tag in
//! `AdminComment`, owned by the caller's uid from SO_PEERCRED) and the
//! request from the batch script Slurm stores (`scontrol write
//! batch_script`), which the plugin wrote and no user can change. Then the
//! forward is journaled with that stand-in's id, as the synchronous path
//! journals its own, and the proxy gets the job's token.
//!
//! Idempotent: a repeated request (a lost reply, a requeued stand-in)
//! gets the same fleet job and token; another stand-in claiming that
//! fleet job is refused.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fleet_api::deferred::{self, ARRAY_VARS};
use fleet_api::placement::{self, Placement};
use fleet_api::wire::{DeferredReply, DeferredRequest, MAX_DEFERRED_REQUEST_BYTES, WIRE_VERSION};
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use crate::backend::{Backend, NativeJob};
use crate::Agent;

/// How long one proxy connection may take (two Slurm commands).
const CONN_TIMEOUT: Duration = Duration::from_secs(30);

/// Bind the deferred socket: anyone may connect (the caller is checked
/// per request against the stand-in's owner).
pub fn bind(path: &std::path::Path) -> Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("chmod 0666 {}", path.display()))?;
    Ok(l)
}

/// Serve the deferred socket, one task per connection (each costs two
/// Slurm commands; the plugin socket is not involved).
pub async fn serve<B: Backend>(agent: Arc<Agent<B>>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.changed() => return,
        };
        match conn {
            Ok((stream, _)) => {
                let agent = agent.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(CONN_TIMEOUT, handle(&agent, stream)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::warn!("deferred connection: {e:#}"),
                        Err(_) => tracing::warn!("deferred connection: no answer within {CONN_TIMEOUT:?}"),
                    }
                });
            }
            Err(e) => {
                tracing::warn!("accept (deferred socket): {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle<B: Backend>(agent: &Agent<B>, stream: UnixStream) -> Result<()> {
    let uid = stream.peer_cred().context("SO_PEERCRED")?.uid();
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd).take(MAX_DEFERRED_REQUEST_BYTES as u64);
    let mut line = Vec::new();
    rd.read_until(b'\n', &mut line).await?;
    let reply = match serde_json::from_slice::<DeferredRequest>(&line) {
        Ok(req) => forward(agent, uid, &req).await,
        Err(e) => DeferredReply::Refused { message: format!("bad request: {e}") },
    };
    match &reply {
        DeferredReply::Forwarded { fleet_job_id, .. } => {
            tracing::info!(uid, id = %fleet_job_id, "deferred stand-in forwarded")
        }
        DeferredReply::Refused { message } => tracing::warn!(uid, "deferred request refused: {message}"),
        DeferredReply::Retry { message } => tracing::info!(uid, "deferred request postponed: {message}"),
    }
    wr.write_all(format!("{}\n", serde_json::to_string(&reply)?).as_bytes()).await?;
    Ok(())
}

/// Why a stand-in as Slurm shows it cannot ask `uid`'s forward, or its tag.
pub fn check_stand_in<'a>(s: Option<&'a NativeJob>, uid: u32, id: u64, partition: &str) -> Result<&'a str, String> {
    // (22.05's `squeue --json` ignores `-p`: the partition is checked here.)
    let Some(s) = s.filter(|s| s.partition == partition) else {
        return Err(format!("job {id} is not in partition {partition}"));
    };
    if s.user_id != Some(uid) {
        return Err(format!("job {id} is not yours (uid {uid})"));
    }
    if s.raw_state != "RUNNING" {
        return Err(format!("job {id} is {}, not RUNNING", s.raw_state));
    }
    fleet_api::wire::parse_admin_tag(&s.admin_comment).ok_or_else(|| format!("job {id} is not a Fleet stand-in"))
}

/// The fleet job of a stand-in's payload, checked against what Slurm says
/// of the stand-in: the tag, the owner and this site.
pub fn job_of(
    payload: deferred::Payload,
    tag: &str,
    s: &NativeJob,
    site: &str,
    proxy_env: &[String],
) -> Result<(String, fleet_api::JobRequest), String> {
    if payload.fleet_job_id != tag {
        return Err(format!("job {}'s script does not carry its tag {tag}", s.native_id));
    }
    let mut job = payload.request;
    if Some(job.user_id) != s.user_id || job.origin != site {
        return Err(format!("job {}'s request is not this user's at {site}", s.native_id));
    }
    let id = match s.array_task_id {
        None => tag.to_string(),
        Some(task) => {
            // Slurm's own numbers for the element; the array's shape
            // (count, min, max, step) as the proxy saw it, decimals only.
            let mut env = vec![
                format!("SLURM_ARRAY_JOB_ID={}", s.array_job_id.unwrap_or(s.native_id)),
                format!("SLURM_ARRAY_TASK_ID={task}"),
            ];
            for (k, v) in deferred::array_vars(proxy_env.iter().map(String::as_str)) {
                if k != ARRAY_VARS[0] && k != ARRAY_VARS[1] {
                    env.push(format!("{k}={v}"));
                }
            }
            job.array_env = env;
            job.is_array = false;
            deferred::element_id(tag, task)
        }
    };
    Ok((id, job))
}

/// Forward the job of the deferred stand-in `req.slurm_job_id` for `uid`.
pub async fn forward<B: Backend>(agent: &Agent<B>, uid: u32, req: &DeferredRequest) -> DeferredReply {
    let refuse = |message: String| DeferredReply::Refused { message };
    if req.v != WIRE_VERSION {
        return refuse(format!("unknown wire version {}", req.v));
    }
    let cfg = agent.live();
    let stand_ins = match agent.backend.stand_ins(&cfg.proxy_partition).await {
        Ok(s) => s,
        Err(e) => return DeferredReply::Retry { message: format!("reading Slurm's queue: {e:#}") },
    };
    let s = stand_ins.iter().find(|s| s.native_id == req.slurm_job_id);
    let tag = match check_stand_in(s, uid, req.slurm_job_id, &cfg.proxy_partition) {
        Ok(t) => t.to_string(),
        Err(m) => return refuse(m),
    };
    let Some(s) = s else { return refuse(format!("job {} vanished", req.slurm_job_id)) };
    let Some(user) = crate::identity::name_of_uid(uid) else {
        return refuse(format!("uid {uid} has no name on this host"));
    };
    let script = match agent.backend.batch_script(s.native_id, &user).await {
        Ok(b) => b,
        Err(e) => return DeferredReply::Retry { message: format!("reading job {}'s script: {e:#}", s.native_id) },
    };
    let payload = match deferred::parse(&script) {
        Ok(p) => p,
        Err(e) => return refuse(format!("job {} is not a deferred stand-in: {e}", s.native_id)),
    };
    let target_hint = payload.target.clone();
    let (id, mut job) = match job_of(payload, &tag, s, &cfg.site, &req.env) {
        Ok(x) => x,
        Err(m) => return refuse(m),
    };
    let token = fleet_api::auth::job_token(&cfg.token, &id);
    match agent.journal.stand_in_of_forward(&id) {
        Ok(Some(Some(sid))) if sid == s.native_id => return DeferredReply::Forwarded { fleet_job_id: id, token },
        Ok(Some(_)) => return refuse(format!("fleet job {id} belongs to another stand-in")),
        Ok(None) => {}
        Err(e) => return DeferredReply::Retry { message: format!("journal: {e:#}") },
    }
    job.user_name = Some(user);
    // The cluster the fleet view picks now (the meta-scheduler has the
    // last word); the plugin's pick without a fresh view.
    let target = {
        let view = agent.view.read();
        let fresh = view.at.is_some_and(|t| t.elapsed() <= cfg.view_max_age);
        match view.view.as_ref().filter(|_| fresh).map(|v| placement::place_or_wait(v, &job).0) {
            Some(Placement::Remote { target, .. }) => target,
            _ => target_hint,
        }
    };
    if let Err(e) = agent.journal.add_forward_of_stand_in(&id, &job, &target, s.native_id) {
        return DeferredReply::Retry { message: format!("journal: {e:#}") };
    }
    agent.forwards_pending.notify_one();
    tracing::info!(%id, %target, stand_in = s.native_id, "forwarding a deferred job");
    DeferredReply::Forwarded { fleet_job_id: id, token }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stand_in(state: &str, uid: u32, admin: &str, task: Option<u32>) -> NativeJob {
        let mut s = NativeJob::new(41, state);
        s.user_id = Some(uid);
        s.admin_comment = admin.into();
        s.partition = "fleet".into();
        s.array_task_id = task;
        s.array_job_id = task.map(|_| 40);
        s
    }

    #[test]
    fn only_the_owner_of_a_running_tagged_stand_in_may_ask() {
        let ok = stand_in("RUNNING", 1001, "fleet:beta-1 deferred", None);
        assert_eq!(check_stand_in(Some(&ok), 1001, 41, "fleet"), Ok("beta-1"));
        let e = |s: Option<&NativeJob>, uid| check_stand_in(s, uid, 41, "fleet").unwrap_err();
        assert!(e(None, 1001).contains("not in partition fleet"));
        let mut elsewhere = ok.clone();
        elsewhere.partition = "gpu".into();
        assert!(e(Some(&elsewhere), 1001).contains("not in partition fleet"));
        assert!(e(Some(&ok), 1002).contains("not yours"));
        assert!(e(Some(&stand_in("PENDING", 1001, "fleet:beta-1", None)), 1001).contains("PENDING"));
        assert!(e(Some(&stand_in("RUNNING", 1001, "site note", None)), 1001).contains("not a Fleet stand-in"));
    }

    fn payload(id: &str, uid: u32, origin: &str) -> deferred::Payload {
        deferred::Payload {
            fleet_job_id: id.into(),
            target: "alpha".into(),
            request: fleet_api::JobRequest {
                origin: origin.into(),
                user_id: uid,
                is_array: true,
                script: Some(b"echo".to_vec()),
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_payload_must_match_the_stand_in_and_elements_get_their_own_job() {
        let s = stand_in("RUNNING", 1001, "fleet:beta-1", None);
        let (id, job) = job_of(payload("beta-1", 1001, "beta"), "beta-1", &s, "beta", &[]).unwrap();
        assert_eq!((id.as_str(), job.array_env.len()), ("beta-1", 0));
        assert!(job_of(payload("beta-2", 1001, "beta"), "beta-1", &s, "beta", &[]).unwrap_err().contains("tag"));
        assert!(job_of(payload("beta-1", 1002, "beta"), "beta-1", &s, "beta", &[]).is_err());
        assert!(job_of(payload("beta-1", 1001, "gamma"), "beta-1", &s, "beta", &[]).is_err());
        // An element: Slurm's ids win over the proxy's, the shape comes from it.
        let e = stand_in("RUNNING", 1001, "fleet:beta-1", Some(3));
        let env: Vec<String> =
            ["SLURM_ARRAY_JOB_ID=999", "SLURM_ARRAY_TASK_ID=7", "SLURM_ARRAY_TASK_COUNT=6", "SLURM_ARRAY_TASK_MAX=x"]
                .map(String::from)
                .to_vec();
        let (id, job) = job_of(payload("beta-1", 1001, "beta"), "beta-1", &e, "beta", &env).unwrap();
        assert_eq!(id, "beta-1_3");
        assert!(!job.is_array);
        assert_eq!(job.array_env, ["SLURM_ARRAY_JOB_ID=40", "SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_COUNT=6"]);
    }
}
