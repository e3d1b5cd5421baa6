//! `fleet-agent`: one per cluster, beside slurmctld.
//!
//! Tasks (all in one tokio runtime, stopped by one shutdown signal):
//! * **plugin socket** ([`serve_plugin`]): answers job_submit_fleet from
//!   the cached fleet view; checks the peer's uid (SO_PEERCRED);
//! * **heartbeat**: reports this cluster's capacity, receives the fleet view;
//! * **delivery**: hands journaled forwards to the meta-scheduler;
//! * **work**: submits jobs assigned to this cluster, cancels on request;
//! * **watch**: reports state, exit code and output of those jobs;
//! * **reconcile** ([`reconcile`]): cancels jobs forwarded from here whose
//!   stand-in ended without cancelling them (proxy SIGKILLed, stand-in
//!   cancelled while pending).
//!
//! Invariant: the agent only touches Slurm jobs it created (journal +
//! `Comment=fleet:<id>` tag), as its own unprivileged user.

pub mod backend;
pub mod client;
pub mod config;
pub mod decide;
pub mod journal;
pub mod reconcile;
pub mod slurm;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fleet_api::api::{ForwardRequest, Heartbeat, OutputChunk, StatusUpdate, Stream};
use fleet_api::wire::{PluginReply, PluginRequest, WIRE_VERSION};
use fleet_api::JobState;
use parking_lot::RwLock;
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Notify};

use crate::backend::Backend;
use crate::client::MetaClient;
use crate::config::AgentConfig;
use crate::decide::CachedView;
use crate::journal::Journal;
use crate::slurm::SlurmBackend;

/// Largest request line accepted from the plugin.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;
/// How long one plugin connection may take before it is dropped.
const PLUGIN_IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest output chunk sent per request.
const CHUNK: usize = 512 << 10;

pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

pub struct Agent<B: Backend> {
    pub cfg: AgentConfig,
    pub journal: Journal,
    pub backend: B,
    pub meta: MetaClient,
    /// The fleet view. std-style sync lock (parking_lot): readers hold it
    /// for a lookup, never across an `.await`.
    pub view: RwLock<CachedView>,
    pub forwards_pending: Notify,
}

pub async fn run(cfg: AgentConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    std::fs::create_dir_all(&cfg.spool).with_context(|| format!("creating AgentSpoolDir {}", cfg.spool.display()))?;
    let journal = Journal::open(&cfg.spool.join("journal.db"))?;
    let backend = SlurmBackend {
        bin: cfg.slurm_bin.clone(),
        slurm_conf: cfg.slurm_conf.clone(),
        spool: cfg.spool.clone(),
        site: cfg.site.clone(),
        run_as: cfg.run_as.clone(),
    };
    match &cfg.run_as {
        Some(u) => backend.check_run_as(u).await?,
        None => tracing::warn!("no RunAsUser: jobs forwarded here run as the agent's own user and could read its token"),
    }
    let meta = MetaClient::new(&cfg.metasched_url, &cfg.token, cfg.metasched_ca_file.as_deref())?;
    if cleartext_off_host(&cfg.metasched_url) {
        tracing::warn!(url = %cfg.metasched_url, "the meta-scheduler is reached over plain HTTP off this host: tokens cross the network in the clear; use an https:// MetaSchedulerUrl");
    }
    let agent = Arc::new(Agent { cfg, journal, backend, meta, view: RwLock::default(), forwards_pending: Notify::new() });

    let _ = std::fs::remove_file(&agent.cfg.socket);
    if let Some(dir) = agent.cfg.socket.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    let listener = UnixListener::bind(&agent.cfg.socket).with_context(|| format!("binding {}", agent.cfg.socket.display()))?;
    tracing::info!(site = %agent.cfg.site, socket = %agent.cfg.socket.display(), url = %agent.cfg.metasched_url, "fleet-agent started");

    let (stop_tx, stop_rx) = watch::channel(false);
    let tasks = vec![
        tokio::spawn(serve_plugin(agent.clone(), listener, stop_rx.clone())),
        tokio::spawn(heartbeat_loop(agent.clone(), stop_rx.clone())),
        tokio::spawn(delivery_loop(agent.clone(), stop_rx.clone())),
        tokio::spawn(work_loop(agent.clone(), stop_rx.clone())),
    ];
    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let _ = std::fs::remove_file(&agent.cfg.socket);
    Ok(())
}

/// An `http://` URL whose host is not loopback.
pub fn cleartext_off_host(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else { return false };
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    !(host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()))
}

async fn stopped(rx: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *rx.borrow(),
        _ = rx.changed() => true,
    }
}

/// Serve the plugin socket.
pub async fn serve_plugin<B: Backend>(agent: Arc<Agent<B>>, listener: UnixListener, mut stop: watch::Receiver<bool>) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.changed() => return,
        };
        match conn {
            // Served inline, one at a time: slurmctld asks serially (under
            // its locks), and skipping a task spawn and a thread hop is
            // measurable on the FORWARD path. A stuck peer costs at most
            // PLUGIN_IO_TIMEOUT, far beyond the plugin's own deadline.
            Ok((stream, _)) => match tokio::time::timeout(PLUGIN_IO_TIMEOUT, handle_plugin(&agent, stream)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("plugin connection: {e:#}"),
                Err(_) => tracing::warn!("plugin connection: no request within {PLUGIN_IO_TIMEOUT:?}"),
            },
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle_plugin<B: Backend>(agent: &Agent<B>, stream: UnixStream) -> Result<()> {
    let uid = stream.peer_cred().context("SO_PEERCRED")?.uid();
    let (rd, mut wr) = stream.into_split();
    if !agent.cfg.allowed_uids.contains(&uid) {
        tracing::warn!(uid, "refusing plugin connection from a uid that is not slurmctld's");
        let reply = PluginReply::Local { reason: "peer not allowed".into() };
        wr.write_all(format!("{}\n", serde_json::to_string(&reply)?).as_bytes()).await?;
        return Ok(());
    }
    let mut rd = BufReader::new(rd).take(MAX_REQUEST_BYTES as u64);
    let mut line = Vec::new();
    rd.read_until(b'\n', &mut line).await?;
    let t0 = Instant::now();
    let reply = match serde_json::from_slice::<PluginRequest>(&line) {
        Ok(PluginRequest::Ping { .. }) => PluginReply::Pong,
        Ok(PluginRequest::Submit { v, .. }) if v != WIRE_VERSION => PluginReply::Local { reason: format!("unknown wire version {v}") },
        Ok(PluginRequest::Submit { job, .. }) => {
            let (reply, new) = {
                let view = agent.view.read();
                decide::decide(&agent.cfg, &view, &job)
            };
            match new {
                None => reply,
                Some(f) => match agent.journal.add_forward(&f.id, &job, &f.target) {
                    Ok(()) => {
                        agent.forwards_pending.notify_one();
                        tracing::info!(id = %f.id, target = %f.target, "forwarding job");
                        reply
                    }
                    Err(e) => {
                        tracing::error!("journal write failed, job stays local: {e:#}");
                        PluginReply::Local { reason: "agent journal unavailable".into() }
                    }
                },
            }
        }
        Err(e) => {
            tracing::warn!("bad request from the plugin: {e}");
            PluginReply::Local { reason: format!("bad request: {e}") }
        }
    };
    tracing::debug!(us = t0.elapsed().as_micros() as u64, "answered plugin");
    wr.write_all(format!("{}\n", serde_json::to_string(&reply)?).as_bytes()).await?;
    Ok(())
}

/// A failing periodic step is logged once at WARN, then at DEBUG until it
/// succeeds again (the meta-scheduler being down must not flood the log).
fn report(what: &str, warned: &mut bool, res: Result<()>) {
    match res {
        Ok(()) => *warned = false,
        Err(e) if !*warned => {
            tracing::warn!("{what}: {e:#}");
            *warned = true;
        }
        Err(e) => tracing::debug!("{what}: {e:#}"),
    }
}

async fn heartbeat_loop<B: Backend>(agent: Arc<Agent<B>>, mut stop: watch::Receiver<bool>) {
    let mut warned = false;
    loop {
        report("heartbeat", &mut warned, heartbeat_once(&agent).await);
        if stopped(&mut stop, agent.cfg.heartbeat).await {
            return;
        }
    }
}

pub async fn heartbeat_once<B: Backend>(agent: &Agent<B>) -> Result<()> {
    let (nodes, pending, running) = agent.backend.capacity().await?;
    let hb = Heartbeat {
        cluster: agent.cfg.site.clone(),
        region: agent.cfg.region.clone(),
        provider: agent.cfg.provider.clone(),
        scheduler: "slurm".into(),
        nodes,
        queue_pending: pending,
        queue_running: running,
        agent_version: env!("CARGO_PKG_VERSION").into(),
    };
    let view = agent.meta.heartbeat(&hb).await?;
    publish_view(&agent.cfg.spool, &view);
    let mut c = agent.view.write();
    c.view = Some(view);
    c.at = Some(Instant::now());
    Ok(())
}

/// Name of the fleet view the agent publishes for the plugin.
pub const VIEW_FILE: &str = "view.json";

/// Write the view where job_submit_fleet reads it (atomically: temp + rename),
/// so the plugin answers LOCAL without a socket round trip. Its mtime is
/// the view's age: the plugin ignores a view older than ViewMaxAgeMs.
fn publish_view(spool: &std::path::Path, view: &fleet_api::api::FleetView) {
    let tmp = spool.join(format!("{VIEW_FILE}.tmp"));
    let res = serde_json::to_vec(view)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, spool.join(VIEW_FILE)));
    if let Err(e) = res {
        tracing::warn!("publishing the fleet view for the plugin: {e}");
    }
}

async fn delivery_loop<B: Backend>(agent: Arc<Agent<B>>, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let mut failed = false;
        match agent.journal.unregistered_forwards() {
            Ok(list) => {
                for f in list {
                    let req = ForwardRequest { fleet_job_id: f.id.clone(), request: f.request, tentative_target: f.target };
                    match agent.meta.forward(&req).await {
                        Ok(_) => {
                            if let Err(e) = agent.journal.mark_registered(&f.id) {
                                tracing::error!("journal: {e:#}");
                            }
                        }
                        Err(e) => {
                            tracing::warn!(id = %f.id, "delivering forward: {e:#}");
                            failed = true;
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::error!("journal: {e:#}"),
        }
        backoff = if failed { (backoff * 2).min(Duration::from_secs(10)) } else { Duration::from_millis(200) };
        tokio::select! {
            _ = agent.forwards_pending.notified(), if !failed => {}
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
    }
}

async fn work_loop<B: Backend>(agent: Arc<Agent<B>>, mut stop: watch::Receiver<bool>) {
    let mut warned = false;
    let mut suspects = reconcile::Suspects::default();
    let mut last_reconcile = f64::NEG_INFINITY;
    loop {
        report("work", &mut warned, work_once(&agent).await);
        if let Err(e) = watch_once(&agent).await {
            tracing::warn!("watch: {e:#}");
        }
        if now() - last_reconcile >= reconcile::EVERY_S {
            last_reconcile = now();
            if let Err(e) = reconcile_once(&agent, &mut suspects).await {
                tracing::warn!("reconcile: {e:#}");
            }
        }
        if stopped(&mut stop, agent.cfg.poll).await {
            return;
        }
    }
}

/// Take new assignments and cancel requests.
pub async fn work_once<B: Backend>(agent: &Agent<B>) -> Result<()> {
    let work = agent.meta.work().await?;
    for a in work.submit {
        let id = a.fleet_job_id;
        // A journaled run with a Slurm id was submitted already (the
        // meta-scheduler did not hear back): report, never submit twice.
        if let Some((run, _)) = agent.journal.run(&id)? {
            if let Some(sid) = run.slurm_id {
                let up = StatusUpdate { remote_job_id: Some(sid), state: Some(JobState::Pending), ..Default::default() };
                agent.meta.status(&id, &up).await?;
                continue;
            }
        } else {
            agent.journal.add_run(&id, &a.request)?;
        }
        match agent.backend.submit(&id, &a.request).await {
            Ok(sid) => {
                agent.journal.set_slurm_id(&id, sid)?;
                tracing::info!(%id, slurm_id = sid, origin = %a.request.origin, "submitted");
                let up = StatusUpdate { remote_job_id: Some(sid), state: Some(JobState::Pending), ..Default::default() };
                agent.meta.status(&id, &up).await?;
            }
            Err(e) => {
                tracing::warn!(%id, "sbatch failed: {e:#}");
                let mut run = agent.journal.run(&id)?.map(|r| r.0).unwrap_or_default();
                run.id = id.clone();
                run.done = true;
                run.reported = Some("failed".into());
                agent.journal.update_run(&run)?;
                let up = StatusUpdate { state: Some(JobState::Failed), exit_code: Some(1), reason: format!("sbatch at {}: {e:#}", agent.cfg.site), final_stdout_len: Some(0), final_stderr_len: Some(0), ..Default::default() };
                agent.meta.status(&id, &up).await?;
            }
        }
    }
    let mut seen = HashSet::new();
    for id in work.cancel {
        if !seen.insert(id.clone()) {
            continue;
        }
        match agent.journal.run(&id)? {
            Some((run, _)) if !run.done => match run.slurm_id {
                Some(sid) => {
                    if let Err(e) = agent.backend.cancel(&id, sid).await {
                        tracing::warn!(%id, "cancel: {e:#}");
                    } else {
                        tracing::info!(%id, slurm_id = sid, "cancelled on request");
                    }
                }
                None => {
                    let up = StatusUpdate { state: Some(JobState::Cancelled), final_stdout_len: Some(0), final_stderr_len: Some(0), ..Default::default() };
                    agent.meta.status(&id, &up).await?;
                }
            },
            // Not ours, or already finished: nothing to touch.
            _ => tracing::debug!(%id, "cancel request for a job this agent does not run"),
        }
    }
    Ok(())
}

/// Cancel jobs forwarded from here whose stand-in has ended or vanished.
pub async fn reconcile_once<B: Backend>(agent: &Agent<B>, suspects: &mut reconcile::Suspects) -> Result<()> {
    // Stand-ins first: a proxy exits only after its job is finished, so a
    // job still active after its stand-in ended is an orphan, not a race.
    let stand_ins = agent.backend.stand_ins(&agent.cfg.proxy_partition).await?;
    let jobs = agent.meta.active_jobs_from(&agent.cfg.site).await?;
    let active: Vec<_> = reconcile::active_from(&agent.cfg.site, &jobs).cloned().collect();
    for (id, reason) in suspects.pass(&active, &stand_ins, now()) {
        match agent.meta.cancel(&id).await {
            Ok(_) => tracing::warn!(%id, "cancelled: {reason}"),
            Err(e) => tracing::warn!(%id, "cancelling an orphan ({reason}): {e:#}"),
        }
    }
    Ok(())
}

/// Relay new output of `path` from `*off`; returns false on a send error.
async fn relay<B: Backend>(agent: &Agent<B>, id: &str, stream: Stream, path: &std::path::Path, off: &mut u64) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut f = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    f.seek(std::io::SeekFrom::Start(*off)).await?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let chunk = OutputChunk { stream, offset: *off, data: buf[..n].to_vec() };
        match agent.meta.output(id, &chunk).await? {
            None => *off += n as u64,
            Some(held) => {
                // The meta-scheduler lost the tail: send it again from our copy.
                tracing::warn!(%id, stream = stream.as_str(), held, sent = *off, "meta-scheduler lost output; resending from its offset");
                *off = held;
                f.seek(std::io::SeekFrom::Start(held)).await?;
            }
        }
    }
}

/// Report state changes and output of the jobs this cluster runs.
pub async fn watch_once<B: Backend>(agent: &Agent<B>) -> Result<()> {
    let runs = agent.journal.active_runs()?;
    let ids: Vec<u64> = runs.iter().filter_map(|(r, _)| r.slurm_id).collect();
    if ids.is_empty() {
        return Ok(());
    }
    let statuses = agent.backend.status(&ids).await?;
    for (mut run, _req) in runs {
        let Some(sid) = run.slurm_id else { continue };
        let status = statuses.iter().find(|(i, _)| *i == sid).and_then(|(_, s)| s.clone());
        let paths = agent.backend.output_paths(&run.id);
        relay(agent, &run.id, Stream::Stdout, &paths.stdout, &mut run.stdout_off).await?;
        relay(agent, &run.id, Stream::Stderr, &paths.stderr, &mut run.stderr_off).await?;
        let (state, mut up) = match status {
            Some(s) => (
                s.state,
                StatusUpdate {
                    remote_job_id: Some(sid),
                    state: Some(s.state),
                    exit_code: s.exit_code,
                    signal: s.signal,
                    reason: s.reason,
                    node_list: s.node_list,
                    ..Default::default()
                },
            ),
            None => (
                JobState::Lost,
                StatusUpdate { remote_job_id: Some(sid), state: Some(JobState::Lost), reason: "Slurm no longer knows the job".into(), ..Default::default() },
            ),
        };
        if state.is_terminal() {
            // Read whatever the job wrote last, then close the streams.
            relay(agent, &run.id, Stream::Stdout, &paths.stdout, &mut run.stdout_off).await?;
            relay(agent, &run.id, Stream::Stderr, &paths.stderr, &mut run.stderr_off).await?;
            up.final_stdout_len = Some(run.stdout_off);
            up.final_stderr_len = Some(run.stderr_off);
        }
        let label = format!("{}:{}", state.as_str(), up.node_list);
        if run.reported.as_deref() != Some(label.as_str()) || state.is_terminal() {
            agent.meta.status(&run.id, &up).await?;
            if run.reported.as_deref() != Some(label.as_str()) {
                tracing::info!(id = %run.id, slurm_id = sid, state = %state, "state");
            }
            run.reported = Some(label);
        }
        run.done = state.is_terminal();
        agent.journal.update_run(&run)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn cleartext_off_host() {
        for (url, off) in [
            ("http://127.0.0.1:16900", false),
            ("http://localhost:1", false),
            ("http://[::1]:16900", false),
            ("https://meta.example:443", false),
            ("http://meta.example:16900", true),
            ("http://10.1.2.3:16900/", true),
            ("http://[2001:db8::1]:1", true),
        ] {
            assert_eq!(super::cleartext_off_host(url), off, "{url}");
        }
    }
}
