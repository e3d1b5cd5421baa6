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
//!
//! Early pickup ([`pickup`]): the agent does not wait for the stand-in's
//! start. It looks in Slurm for deferred stand-ins still PENDING (woken by
//! the plugin's datagram on `AgentSpoolDir/pickup.sock`, whose content is
//! ignored, and at least every [`PICKUP_EVERY`]), reads each one's request
//! from its stored batch script exactly as for a proxy's request (the
//! proxy partition, Fleet's tag, `deferred` as the plugin wrote it in
//! `AdminComment`, owned by the uid the request names), and journals the
//! forward with the stand-in's Slurm id, marked for early start: the job
//! may be placed and submitted at its target while the stand-in waits,
//! but its script starts only once Slurm starts the stand-in
//! (docs/failover.md, early placement). When the stand-in starts, its
//! proxy's request finds that journaled forward and gets the same job.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fleet_api::deferred::{self, ARRAY_VARS};
use fleet_api::placement::{self, Placement};
use fleet_api::wire::{DeferredReply, DeferredRequest, MAX_DEFERRED_REQUEST_BYTES, WIRE_VERSION};
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader};
use tokio::net::{UnixDatagram, UnixListener, UnixStream};
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

/// Connections served at once, in all and per caller (uid). Anyone may
/// connect: one more is closed at once, unread (its proxy retries with
/// backoff), so that a user's idle or repeated connections cannot take
/// the agent's file descriptors (which its sbatch, squeue and the plugin
/// socket need too) or queue Slurm commands without end.
const MAX_CONNS: usize = 256;
const MAX_CONNS_PER_UID: usize = 32;
/// How long a caller may take to send its request line (the proxy sends
/// it at once).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The connections being served, per uid ([`MAX_CONNS`],
/// [`MAX_CONNS_PER_UID`]).
#[derive(Clone, Default)]
struct Admission(Arc<parking_lot::Mutex<std::collections::HashMap<u32, usize>>>);

/// One admitted connection; dropping it frees its place.
struct Admitted {
    of: Admission,
    uid: u32,
}

impl Admission {
    fn admit(&self, uid: u32) -> Option<Admitted> {
        let mut m = self.0.lock();
        let total: usize = m.values().sum();
        if total >= MAX_CONNS || m.get(&uid).is_some_and(|&n| n >= MAX_CONNS_PER_UID) {
            return None;
        }
        *m.entry(uid).or_default() += 1;
        Some(Admitted { of: self.clone(), uid })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut m = self.of.0.lock();
        if let Some(n) = m.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.uid);
            }
        }
    }
}

/// Serve the deferred socket, one task per connection (each costs two
/// Slurm commands; the plugin socket is not involved), at most
/// [`MAX_CONNS`] at once and [`MAX_CONNS_PER_UID`] per caller.
pub async fn serve<B: Backend>(agent: Arc<Agent<B>>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    let admission = Admission::default();
    let mut last_refusal: Option<std::time::Instant> = None;
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.changed() => return,
        };
        match conn {
            Ok((stream, _)) => {
                let Some(admitted) = stream.peer_cred().ok().and_then(|c| admission.admit(c.uid())) else {
                    if last_refusal.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(
                            "deferred socket: too many connections at once (at most {MAX_CONNS}, \
                             {MAX_CONNS_PER_UID} per user): closing new ones until some end"
                        );
                        last_refusal = Some(std::time::Instant::now());
                    }
                    continue;
                };
                let agent = agent.clone();
                tokio::spawn(async move {
                    let _admitted = admitted;
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
    tokio::time::timeout(REQUEST_TIMEOUT, rd.read_until(b'\n', &mut line))
        .await
        .map_err(|_| anyhow::anyhow!("no request within {REQUEST_TIMEOUT:?}"))??;
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
    // One job, by id (libslurm's fast path where it is on; else the JSON
    // dump): this is the stand-in's start path.
    let stand_ins = match agent.backend.stand_ins_by_id(&cfg.proxy_partition, &[req.slurm_job_id]).await {
        Ok(s) => s,
        Err(e) => return DeferredReply::Retry { message: format!("reading Slurm's queue: {e:#}") },
    };
    let s = stand_ins.iter().find(|s| s.native_id == req.slurm_job_id);
    let tag = match check_stand_in(s, uid, req.slurm_job_id, &cfg.proxy_partition) {
        Ok(t) => t.to_string(),
        Err(m) => return refuse(m),
    };
    let Some(s) = s else { return refuse(format!("job {} vanished", req.slurm_job_id)) };
    // Only the plugin (as slurmctld) writes `deferred` after the tag: a
    // stand-in forwarded through the agent's round trip has its own proxy,
    // and a second one (its owner running `fleet-proxy --deferred` by hand)
    // gets nothing, even once that stand-in's start is journaled.
    if !marked_deferred(&s.admin_comment) {
        return refuse(format!("job {} is not a deferred stand-in", s.native_id));
    }
    // Already journaled for this very stand-in (picked up while pending, or
    // asked before): the same job, without reading the script again.
    let known = match s.array_task_id {
        None => tag.clone(),
        Some(task) => deferred::element_id(&tag, task),
    };
    if matches!(agent.journal.stand_in_of_forward(&known), Ok(Some(Some(sid))) if sid == s.native_id) {
        let token = fleet_api::auth::job_token(&cfg.token, &known);
        return DeferredReply::Forwarded { fleet_job_id: known, token };
    }
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
    job.user_name = Some(user);
    match journal_forward(agent, &cfg, &id, job, target_hint, s.native_id, false) {
        Ok(()) => DeferredReply::Forwarded { fleet_job_id: id, token },
        Err(Journaled::Elsewhere) => refuse(format!("fleet job {id} belongs to another stand-in")),
        Err(Journaled::Failed(e)) => DeferredReply::Retry { message: format!("journal: {e:#}") },
    }
}

enum Journaled {
    /// The fleet job is journaled with another stand-in.
    Elsewhere,
    Failed(anyhow::Error),
}

/// Journal fleet job `id` as the forward of stand-in `sid` (once: a job
/// already journaled with this stand-in is done, with another refused).
/// `pending`: picked up before Slurm started the stand-in.
fn journal_forward<B: Backend>(
    agent: &Agent<B>,
    cfg: &crate::config::AgentConfig,
    id: &str,
    job: fleet_api::JobRequest,
    target_hint: String,
    sid: u64,
    pending: bool,
) -> Result<(), Journaled> {
    let journaled = |agent: &Agent<B>| match agent.journal.stand_in_of_forward(id) {
        Ok(Some(Some(s))) if s == sid => Ok(true),
        Ok(Some(_)) => Err(Journaled::Elsewhere),
        Ok(None) => Ok(false),
        Err(e) => Err(Journaled::Failed(e)),
    };
    if journaled(agent)? {
        return Ok(());
    }
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
    if let Err(e) = agent.journal.add_forward_of_stand_in(id, &job, &target, sid, pending) {
        // The pickup and the proxy's request at once: the first one won.
        return if journaled(agent)? { Ok(()) } else { Err(Journaled::Failed(e)) };
    }
    agent.forwards_pending.notify_one();
    if pending {
        tracing::info!(%id, %target, stand_in = sid, "forwarding a deferred job while its stand-in is pending");
    } else {
        tracing::info!(%id, %target, stand_in = sid, "forwarding a deferred job");
    }
    Ok(())
}

/// The periodic scan for pending deferred stand-ins when nothing woke
/// the agent (a datagram lost, the agent down at submission).
pub const PICKUP_EVERY: Duration = Duration::from_secs(5);
/// The least time between two scans (each is one `slurm_load_jobs` RPC, or
/// `squeue --json` without libslurm, which slurmctld answers under its job
/// read lock), however many datagrams
/// arrive: a flood of them (anyone may send) costs a scan per second.
pub const PICKUP_MIN_GAP: Duration = Duration::from_secs(1);
/// A datagram's scan waits until none has come for this long, so that a
/// burst of submissions is picked up by one scan after it, not a scan per
/// interval while slurmctld is busiest (the scan, the script reads and
/// each forward's journal write and delivery take CPU and slurmctld's job
/// read lock from the submissions: about 8 % of a 2-core host's sbatch
/// throughput when they ran during `make bench`'s bursts)...
pub const PICKUP_QUIET: Duration = Duration::from_millis(500);
/// ...but not longer than this after the first datagram (a job that is to
/// wait at its origin is placed at most this late; one Slurm starts at
/// once asks for itself through its proxy).
pub const PICKUP_MAX_DELAY: Duration = Duration::from_secs(5);
/// The scan after one a datagram started.
pub const PICKUP_AGAIN: Duration = Duration::from_secs(1);
/// At most this many stand-ins read (one `slurm_job_batch_script` RPC each,
/// or an `scontrol write batch_script` process) per scan; the rest wait for
/// the next one.
pub const PICKUP_MAX_PER_SCAN: usize = 64;

/// The fleet tag of a deferred stand-in that Slurm still holds pending,
/// in the proxy partition, not an array (an array's elements are
/// forwarded as each starts), with the plugin's `deferred` note after
/// the tag in `AdminComment` (which users cannot set); `None` for any
/// other job.
pub fn pending_deferred<'a>(s: &'a NativeJob, partition: &str) -> Option<&'a str> {
    if s.partition != partition || s.raw_state != "PENDING" || s.array_task_id.is_some() || s.array_job_id.is_some() {
        return None;
    }
    let tag = fleet_api::wire::parse_admin_tag(&s.admin_comment)?;
    marked_deferred(&s.admin_comment).then_some(tag)
}

/// The plugin's `deferred` note right after the tag in a stand-in's
/// `AdminComment` (which users cannot set).
fn marked_deferred(admin_comment: &str) -> bool {
    admin_comment.split_whitespace().nth(1) == Some("deferred")
}

/// Bind the wake-up socket: anyone may send (slurmctld runs as
/// SlurmUser); a datagram only brings the next scan forward, within
/// [`PICKUP_QUIET`] (never within [`PICKUP_MIN_GAP`] of the last scan),
/// and its content is never read.
pub fn bind_pickup(path: &std::path::Path) -> Result<UnixDatagram> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let s = UnixDatagram::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("chmod 0666 {}", path.display()))?;
    Ok(s)
}

/// Scan for pending deferred stand-ins when woken (datagrams, then
/// [`PICKUP_QUIET`] without one, at most [`PICKUP_MAX_DELAY`]) or every
/// [`PICKUP_EVERY`], never twice within [`PICKUP_MIN_GAP`]. A scan a
/// datagram started is followed by one more [`PICKUP_AGAIN`] later: the
/// plugin sends it from inside `job_submit`, before slurmctld has the
/// job's record. Every scan also publishes the stand-ins for the plugin's
/// `job_modify` (`crate::publish_stand_ins`); the plugin sends a datagram
/// for every stand-in it makes, deferred or not.
pub async fn pickup_loop<B: Backend>(agent: Arc<Agent<B>>, wake: UnixDatagram, mut stop: watch::Receiver<bool>) {
    let mut tried = Tried::default();
    let mut buf = [0u8; 64];
    let mut warned = false;
    let mut next = PICKUP_EVERY;
    loop {
        let t0 = Instant::now();
        match agent.backend.stand_ins_brief(&agent.live().proxy_partition).await {
            Ok(list) => {
                warned = false;
                // The plugin refuses resource updates of these
                // (`job_modify`); it wakes this scan for every stand-in
                // it makes, so a new one is listed within about a second.
                crate::publish_stand_ins(&agent.cfg.spool, &crate::stand_ins_text(&list), agent.cfg.slurm_uid);
                pickup(&agent, &list, &mut tried).await;
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!("looking for pending deferred stand-ins: {e:#}")
            }
            Err(_) => {}
        }
        // Datagrams that came during the scan are answered by it.
        while wake.try_recv(&mut buf).is_ok() {}
        let gap = PICKUP_MIN_GAP.saturating_sub(t0.elapsed());
        tokio::select! {
            _ = tokio::time::sleep(gap) => {}
            _ = stop.changed() => return,
        }
        next = tokio::select! {
            _ = wake.recv(&mut buf) => PICKUP_AGAIN,
            _ = tokio::time::sleep(next.saturating_sub(gap)) => PICKUP_EVERY,
            _ = stop.changed() => return,
        };
        if next == PICKUP_AGAIN {
            // Woken: let the burst end first (bounded).
            let first = Instant::now();
            loop {
                let left = PICKUP_MAX_DELAY.saturating_sub(first.elapsed());
                if left.is_zero() {
                    break;
                }
                tokio::select! {
                    _ = wake.recv(&mut buf) => {}
                    _ = tokio::time::sleep(left.min(PICKUP_QUIET)) => break,
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// Stand-ins the pickup read and did not forward (an array, not deferred
/// after all, a request that does not match its stand-in): not read
/// again while Slurm still shows them pending.
#[derive(Default)]
pub struct Tried(HashSet<u64>);

/// Journal the forward of each pending deferred stand-in in `stand_ins`
/// (as Slurm shows the proxy partition) not journaled yet;
/// returns how many were journaled now.
pub async fn pickup<B: Backend>(agent: &Agent<B>, stand_ins: &[NativeJob], tried: &mut Tried) -> usize {
    let cfg = agent.live();
    let pending: Vec<(&NativeJob, &str)> =
        stand_ins.iter().filter_map(|s| pending_deferred(s, &cfg.proxy_partition).map(|t| (s, t))).collect();
    tried.0.retain(|id| pending.iter().any(|(s, _)| s.native_id == *id));
    let mut n = 0;
    let mut read = 0;
    for (s, tag) in pending {
        if tried.0.contains(&s.native_id) || !matches!(agent.journal.stand_in_of_forward(tag), Ok(None)) {
            continue;
        }
        if read == PICKUP_MAX_PER_SCAN {
            break;
        }
        read += 1;
        match pick_one(agent, &cfg, s, tag).await {
            Ok(true) => n += 1,
            // An array (its elements go as each starts): not read again.
            Ok(false) => {
                tried.0.insert(s.native_id);
            }
            Err(Pick::Refused(why)) => {
                tried.0.insert(s.native_id);
                tracing::warn!(stand_in = s.native_id, "pending stand-in not forwarded: {why}");
            }
            Err(Pick::Later(why)) => tracing::info!(stand_in = s.native_id, "pending stand-in: {why}; next scan"),
        }
    }
    n
}

enum Pick {
    /// Never: the stand-in is not one this agent forwards.
    Refused(String),
    /// Not now (Slurm or the journal failed).
    Later(String),
}

/// One pending stand-in: its request read from Slurm, checked against
/// what Slurm says of it, journaled. `Ok(false)`: an array after all.
async fn pick_one<B: Backend>(
    agent: &Agent<B>,
    cfg: &crate::config::AgentConfig,
    s: &NativeJob,
    tag: &str,
) -> Result<bool, Pick> {
    let uid = s.user_id.ok_or_else(|| Pick::Refused("Slurm shows no owner".into()))?;
    let user = {
        let found = tokio::task::spawn_blocking(move || crate::identity::name_of_uid(uid)).await.ok().flatten();
        found.ok_or_else(|| Pick::Refused(format!("uid {uid} has no name on this host")))?
    };
    let script =
        agent.backend.batch_script(s.native_id, &user).await.map_err(|e| Pick::Later(format!("its script: {e:#}")))?;
    let payload = deferred::parse(&script).map_err(|e| Pick::Refused(format!("not a deferred stand-in: {e}")))?;
    if payload.request.is_array {
        return Ok(false);
    }
    let target_hint = payload.target.clone();
    let (id, mut job) = job_of(payload, tag, s, &cfg.site, &[]).map_err(Pick::Refused)?;
    job.user_name = Some(user);
    match journal_forward(agent, cfg, &id, job, target_hint, s.native_id, true) {
        Ok(()) => Ok(true),
        Err(Journaled::Elsewhere) => Err(Pick::Refused(format!("fleet job {id} belongs to another stand-in"))),
        Err(Journaled::Failed(e)) => Err(Pick::Later(format!("journal: {e:#}"))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn connections_are_admitted_up_to_the_caps_in_all_and_per_user() {
        let a = super::Admission::default();
        let alice: Vec<_> = (0..super::MAX_CONNS_PER_UID).map(|_| a.admit(1000).expect("admitted")).collect();
        assert!(a.admit(1000).is_none(), "one more of alice's is closed");
        let bob = a.admit(1001).expect("another user is still served");
        drop(bob);
        drop(alice.into_iter().next());
        assert!(a.admit(1000).is_some(), "a place freed is alice's again");
        // In all: many users at once reach the total cap.
        let b = super::Admission::default();
        let held: Vec<_> = (0..super::MAX_CONNS as u32).filter_map(|u| b.admit(2000 + u)).collect();
        assert_eq!(held.len(), super::MAX_CONNS);
        assert!(b.admit(1).is_none(), "the total cap holds");
        drop(held);
        assert!(b.0.lock().is_empty(), "every place is freed");
        assert!(b.admit(1).is_some());
    }

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
    fn only_pending_tagged_deferred_stand_ins_of_the_proxy_partition_are_picked_up() {
        let ok = stand_in("PENDING", 1001, "fleet:beta-1 deferred beta -> alpha: gpu:h100:1", None);
        assert_eq!(pending_deferred(&ok, "fleet"), Some("beta-1"));
        assert_eq!(pending_deferred(&ok, "gpu"), None, "another partition");
        for (state, admin, task) in [
            ("RUNNING", "fleet:beta-1 deferred beta -> alpha", None),
            ("PENDING", "fleet:beta-1 forwarded beta -> alpha", None),
            ("PENDING", "fleet:beta-1", None),
            ("PENDING", "deferred fleet:beta-1 deferred", None),
            ("PENDING", "site note deferred", None),
            ("PENDING", "fleet:beta-1 deferred beta -> alpha", Some(2)),
        ] {
            assert_eq!(
                pending_deferred(&stand_in(state, 1001, admin, task), "fleet"),
                None,
                "{state} {admin} {task:?}"
            );
        }
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
