//! `fleet-agent`: one per cluster, beside slurmctld.
//!
//! Tasks (all in one tokio runtime, stopped by one shutdown signal):
//! * **plugin socket** ([`serve_plugin`]): answers job_submit_fleet from
//!   the cached fleet view; checks the peer's uid (SO_PEERCRED);
//! * **heartbeat**: reports this cluster's capacity, receives the fleet view;
//! * **delivery**: hands journaled forwards to the meta-scheduler;
//! * **work** (long poll): submits jobs assigned to this cluster as their
//!   submitter's local identity ([`identity`]), cancels on request, and
//!   confirms that a stand-in asking to start really runs here;
//! * **watch** ([`track`]): one reconcile per job this cluster runs, each
//!   with its own backoff: state from `squeue --json` (one call a pass),
//!   identity by Slurm id + submit time + owner, output relayed without
//!   following anything the job controls ([`jobdir`]);
//! * **reconcile** ([`reconcile`]): cancels jobs forwarded from here whose
//!   stand-in ended without cancelling them (proxy SIGKILLed, stand-in
//!   cancelled while pending), matched by journaled Slurm ids.
//!
//! Invariant: the agent only touches Slurm jobs it created (journaled id
//! with the submit time and owner Slurm reported for it), as its own
//! unprivileged user; sbatch, scancel and scontrol as the job's user through sudo.

pub mod backend;
pub mod ckpt;
pub mod client;
pub mod config;
pub mod decide;
pub mod deferred;
pub mod fault;
pub mod identity;
pub mod jobdir;
pub mod journal;
pub mod kube;
pub mod lease;
pub mod libslurm;
pub mod names;
pub mod nss;
pub mod reconcile;
pub mod slurm;
pub mod track;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fleet_api::api::{ForwardRequest, Heartbeat};
use fleet_api::wire::{PluginReply, PluginRequest, WIRE_VERSION};
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
pub const CHUNK: usize = 512 << 10;

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
    /// The settings read at start. What may change while the agent runs
    /// (SIGHUP, [`config::merge_reload`]) is read through [`Agent::live`].
    pub cfg: AgentConfig,
    /// The settings as last reloaded. Sync lock: held to clone the Arc.
    pub live: RwLock<Arc<AgentConfig>>,
    pub journal: Journal,
    pub backend: B,
    pub meta: MetaClient,
    /// The fleet view. std-style sync lock (parking_lot): readers hold it
    /// for a lookup, never across an `.await`.
    pub view: RwLock<CachedView>,
    pub forwards_pending: Notify,
    /// Names of submitting uids for the plugin's FORWARD answers
    /// ([`names`]). parking_lot: held for a map lookup, never across an
    /// `.await` nor an NSS call.
    pub names: parking_lot::Mutex<names::NameCache>,
    /// The lease on the jobs this cluster runs. std-style sync lock
    /// (parking_lot): held for a renew or a check, never across an `.await`.
    pub lease: parking_lot::Mutex<lease::Lease>,
    /// Failed checkpoint copies per fleet job (`track::resume_from`);
    /// parking_lot, never held across an `.await`.
    pub copy_failures: parking_lot::Mutex<std::collections::HashMap<String, u32>>,
    /// Running stand-ins' time limits, passed on when lowered (the work
    /// loop records each confirmed start, the reconciler compares). Sync
    /// lock: held for a lookup, no `.await`.
    pub time_limits: parking_lot::Mutex<reconcile::TimeLimits>,
    /// The identities published with each heartbeat, read again only when
    /// the account files change. Sync lock: held for a lookup, no `.await`.
    pub identities: std::sync::Arc<parking_lot::Mutex<identity::AdmittedCache>>,
    /// The scheduler's last answer to a capacity query (when, what), for
    /// a heartbeat whose query is slow, and the query in flight (a slow
    /// one is not dropped: the next heartbeat waits on it again). Sync
    /// lock: held for a copy or a swap, no `.await`.
    pub capacity: parking_lot::Mutex<CapacityProbe>,
}

/// The heartbeat's capacity queries ([`Agent::capacity`]).
#[derive(Default)]
pub struct CapacityProbe {
    pub last: Option<(Instant, Capacity)>,
    pub query: Option<tokio::task::JoinHandle<Result<Capacity>>>,
}

pub use backend::Capacity;

/// How long an answer to a capacity query stays good for heartbeats whose
/// own query is slow; past it, a heartbeat says the scheduler is silent.
const CAPACITY_FRESH: Duration = Duration::from_secs(30);

pub async fn run(cfg: AgentConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    prepare_spool(&cfg.spool)?;
    let job_ckpt = ckpt::JobCkpt {
        metasched_url: cfg.metasched_url.clone(),
        ca_file: cfg.metasched_ca_file.clone(),
        cluster_token: cfg.token.clone(),
        stores: cfg.ckpt_stores.clone(),
        user_stores: cfg.ckpt_user_stores.clone(),
        job_lease: cfg.job_lease,
        helper: cfg.ckpt_helper.clone(),
    };
    let runs_get_stores = cfg.ckpt_user_stores.is_none();
    if let Some(why) =
        cfg.ckpt_stores.as_deref().and_then(|p| ckpt::stores_exposure(p, cfg.kube.is_some(), runs_get_stores))
    {
        tracing::warn!("{why} (docs/checkpoints.md, \"Who can read checkpoints\")");
    }
    if let Some(t) = &cfg.ckpt_user_stores {
        for (path, why) in ckpt::user_stores_exposure(t) {
            tracing::warn!(
                "CkptUserStores: {}: {why} (docs/checkpoints.md, \"Who can read checkpoints\")",
                path.display()
            );
        }
    }
    if let Some(k) = cfg.kube.clone() {
        if job_ckpt.job_lease.is_some() && k.helper_image.is_none() {
            tracing::warn!(
                "JobLeaseMs is set but KubeHelperImage is not: pods run without their in-job lease (docs/failover.md)"
            );
        }
        let mut backend = kube::KubeBackend::connect(k, &cfg.site, cfg.spool.clone()).await?;
        backend.ckpt = job_ckpt;
        return run_with(cfg, backend, shutdown).await;
    }
    let backend = SlurmBackend {
        bin: cfg.slurm_bin.clone(),
        slurm_conf: cfg.slurm_conf.clone(),
        spool: cfg.spool.clone(),
        site: cfg.site.clone(),
        ckpt: job_ckpt,
        max_time: Default::default(),
    };
    check_identity(&cfg, &backend).await?;
    let me = identity::name_of_uid(own_uid()).unwrap_or_default();
    if let Some(note) = backend.check_operator_role(&me).await? {
        tracing::info!("{note}");
    }
    let conf = cfg.slurm_conf.clone();
    let exe = std::env::current_exe().unwrap_or_else(|_| "fleet-agent".into());
    match tokio::task::spawn_blocking(move || libslurm::enable(&exe, &conf)).await? {
        Ok(what) => tracing::info!("start checks read stand-ins through {what}"),
        Err(e) => tracing::warn!("start checks fall back to squeue --json (slower on a busy controller): {e}"),
    }
    run_with(cfg, backend, shutdown).await
}

/// The agent's own uid (the owner of `/proc/self`; `u32::MAX` if unreadable).
pub fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX)
}

/// The agent's tasks over `backend` (Slurm or Kubernetes).
pub async fn run_with<B: Backend>(
    cfg: AgentConfig,
    backend: B,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let journal = Journal::open(&cfg.spool.join("journal.db"))?;
    let meta = MetaClient::new(&cfg.metasched_url, &cfg.token, cfg.metasched_ca_file.as_deref())?;
    if cleartext_off_host(&cfg.metasched_url) {
        tracing::warn!(url = %cfg.metasched_url, "the meta-scheduler is reached over plain HTTP off this host: tokens cross the network in the clear; use an https:// MetaSchedulerUrl");
    }
    let lease = parking_lot::Mutex::new(lease::Lease::new(cfg.lease, Instant::now()));
    let agent = Arc::new(Agent {
        live: RwLock::new(Arc::new(cfg.clone())),
        cfg,
        journal,
        backend,
        meta,
        view: RwLock::default(),
        forwards_pending: Notify::new(),
        names: Default::default(),
        lease,
        copy_failures: Default::default(),
        identities: Default::default(),
        time_limits: Default::default(),
        capacity: Default::default(),
    });

    let _ = std::fs::remove_file(&agent.cfg.socket);
    if let Some(dir) = agent.cfg.socket.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    let listener =
        UnixListener::bind(&agent.cfg.socket).with_context(|| format!("binding {}", agent.cfg.socket.display()))?;
    // Anyone may connect (slurmctld runs as SlurmUser, Debian's `slurm`, not
    // as the agent's user); who may *ask* is decided per connection by
    // SO_PEERCRED (root, SlurmUser, AllowedSubmitUids), answered at once
    // for anybody else without reading a byte.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent.cfg.socket, std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("chmod 0666 {}", agent.cfg.socket.display()))?;
    }
    // Deferred stand-ins ask here, as their job's user (fleet_api::deferred).
    let deferred_listener = deferred::bind(&agent.cfg.spool.join(fleet_api::wire::DEFERRED_SOCKET))?;
    // The plugin wakes the pickup of pending deferred stand-ins here.
    let pickup_socket = deferred::bind_pickup(&agent.cfg.spool.join(slurm_conf::fleet::PICKUP_SOCKET))?;
    tracing::info!(site = %agent.cfg.site, socket = %agent.cfg.socket.display(), url = %agent.cfg.metasched_url, "fleet-agent started");

    let (stop_tx, stop_rx) = watch::channel(false);
    let tasks = vec![
        serve_plugin_apart(agent.clone(), listener, stop_rx.clone())?,
        tokio::spawn(deferred::serve(agent.clone(), deferred_listener, stop_rx.clone())),
        tokio::spawn(deferred::pickup_loop(agent.clone(), pickup_socket, stop_rx.clone())),
        tokio::spawn(heartbeat_loop(agent.clone(), stop_rx.clone())),
        tokio::spawn(delivery_loop(agent.clone(), stop_rx.clone())),
        tokio::spawn(work_loop(agent.clone(), stop_rx.clone())),
        tokio::spawn(watch_loop(agent.clone(), stop_rx.clone())),
        tokio::spawn(reconcile_loop(agent.clone(), stop_rx.clone())),
        tokio::spawn(reload_loop(agent.clone(), stop_rx.clone())),
    ];
    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let _ = std::fs::remove_file(&agent.cfg.socket);
    let _ = std::fs::remove_file(agent.cfg.spool.join(fleet_api::wire::DEFERRED_SOCKET));
    let _ = std::fs::remove_file(agent.cfg.spool.join(slurm_conf::fleet::PICKUP_SOCKET));
    Ok(())
}

/// The spool: private to the agent except that job users may traverse it
/// (0711) to reach their own job directory under `jobs/` (0711, not
/// listable), whose ACL admits them alone. Refuses a filesystem without
/// POSIX ACLs.
pub fn prepare_spool(spool: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let jobs = spool.join("jobs");
    std::fs::create_dir_all(&jobs).with_context(|| format!("creating {}", jobs.display()))?;
    for d in [spool, jobs.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))
            .with_context(|| format!("chmod 0711 {}", d.display()))?;
    }
    let probe = jobs.join(format!(".acl-probe-{}", std::process::id()));
    let _ = jobdir::remove(&probe);
    jobdir::create(&probe, 65534).context(
        "AgentSpoolDir must be on a filesystem with POSIX ACLs (ext4, xfs, btrfs; tmpfs with CONFIG_TMPFS_POSIX_ACL)",
    )?;
    jobdir::remove(&probe)?;
    Ok(())
}

/// Start-up check of who jobs run as: a shared `RunAsUser` is usable (and
/// warned about); otherwise sudo admits the agent for a member of
/// `JobUserGroup` (when the group has one yet).
async fn check_identity(cfg: &AgentConfig, backend: &SlurmBackend) -> Result<()> {
    use identity::Mapping;
    match &cfg.identity.mapping {
        Mapping::Shared(u) => {
            tracing::warn!(user = %u, "RunAsUser: every forwarded job runs as {u}; users' jobs are not isolated from each other (JobUserMap is the per-user default)");
            let Some(run_as) = &cfg.run_as else { anyhow::bail!("RunAsUser={u}: no such user") };
            if run_as.uid == cfg.identity.agent_uid || run_as.uid == 0 {
                anyhow::bail!("RunAsUser={u} (uid {}) must be neither root nor the agent's own user: job code could read the agent's token", run_as.uid);
            }
            backend.check_sudo(u).await
        }
        Mapping::Same | Mapping::File(_) => {
            let acc = identity::Accounts::read()?;
            match acc
                .members(&cfg.identity.group)
                .into_iter()
                .find(|m| acc.user(m).is_some_and(|(uid, _)| uid >= cfg.identity.min_uid))
            {
                Some(m) => backend.check_sudo(&m).await,
                None => {
                    tracing::warn!(group = %cfg.identity.group, "JobUserGroup has no member yet: no forwarded job can run here");
                    Ok(())
                }
            }
        }
    }
}

pub use fleet_api::client::cleartext_off_host;

async fn stopped(rx: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *rx.borrow(),
        _ = rx.changed() => true,
    }
}

impl<B: Backend> Agent<B> {
    /// The name of `uid` on this host: remembered ([`names`]), or looked
    /// up through NSS on a blocking thread (it may wait on a directory).
    pub async fn user_name(&self, uid: u32) -> Option<String> {
        if let Some(n) = self.names.lock().get(uid, Instant::now()) {
            return Some(n);
        }
        let found = tokio::task::spawn_blocking(move || identity::name_of_uid(uid)).await.ok().flatten();
        self.names.lock().put(uid, found.as_deref(), Instant::now());
        found
    }

    /// The settings now (the start's, or those of the last SIGHUP).
    pub fn live(&self) -> Arc<AgentConfig> {
        self.live.read().clone()
    }

    /// Reads fleet.conf again and applies what may change while running
    /// (see [`config::merge_reload`]); logs what changed and what waits
    /// for a restart. A file that does not load changes nothing.
    pub fn reload(&self) -> Result<config::Reload> {
        let running = self.live();
        let new = AgentConfig::load(&running.source)
            .with_context(|| format!("reloading {}: keeping the running settings", running.source.display()))?;
        let r = config::merge_reload(&running, new);
        for a in &r.applied {
            tracing::info!("reload: {a}");
        }
        if !r.need_restart.is_empty() {
            tracing::warn!(
                "reload: {} changed in {} but take(s) effect only when fleet-agent restarts",
                r.need_restart.join(", "),
                running.source.display()
            );
        }
        if r.applied.iter().any(|a| a.starts_with("LogLevel")) {
            set_log_level(&r.cfg.log_level);
        }
        *self.live.write() = Arc::new(r.cfg.clone());
        tracing::info!(applied = r.applied.len(), restart = r.need_restart.len(), "fleet.conf reloaded");
        Ok(r)
    }
}

/// Sets the log filter from `LogLevel` (main installs the hook; `FLEET_LOG`
/// in the environment wins over fleet.conf, at start as on reload).
pub static LOG_LEVEL_HOOK: std::sync::OnceLock<LogLevelHook> = std::sync::OnceLock::new();

/// Sets the log filter to a `LogLevel` value.
pub type LogLevelHook = Box<dyn Fn(&str) + Send + Sync>;

fn set_log_level(level: &str) {
    if let Some(hook) = LOG_LEVEL_HOOK.get() {
        hook(level);
    }
}

/// SIGHUP reads fleet.conf again (`systemctl reload fleet-agent`).
async fn reload_loop<B: Backend>(agent: Arc<Agent<B>>, mut stop: watch::Receiver<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGHUP ({e}): fleet.conf is read at start only");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = hup.recv() => {
                if let Err(e) = agent.reload() {
                    tracing::error!("{e:#}");
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// Serve the plugin socket on a thread of its own, with a runtime of its
/// own: slurmctld waits for each answer (under its locks, with
/// SubmitTimeoutMs), so a request must never queue behind another task's
/// poll on the shared workers (a pass of the tracking loops, a heartbeat).
/// Measured in `make bench` on a loaded 2-core host: the time a request
/// spent outside its own work was most of the FORWARD hook's p99.
fn serve_plugin_apart<B: Backend>(
    agent: Arc<Agent<B>>,
    listener: UnixListener,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = listener.into_std().context("plugin socket")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("fleet-plugin")
        .build()
        .context("starting the plugin socket's runtime")?;
    Ok(tokio::task::spawn_blocking(move || {
        rt.block_on(async move {
            match UnixListener::from_std(listener) {
                Ok(l) => serve_plugin(agent, l, stop).await,
                Err(e) => tracing::error!("plugin socket: {e}: jobs are answered without the agent"),
            }
        })
    }))
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
                Err(_) => {
                    tracing::warn!("plugin connection: no request within {PLUGIN_IO_TIMEOUT:?}")
                }
            },
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle_plugin<B: Backend>(agent: &Agent<B>, stream: UnixStream) -> Result<()> {
    let accepted = Instant::now();
    let uid = stream.peer_cred().context("SO_PEERCRED")?.uid();
    let (rd, mut wr) = stream.into_split();
    let live = agent.live();
    if !live.allowed_uids.contains(&uid) {
        tracing::warn!(uid, "refusing plugin connection from a uid that is not slurmctld's");
        let reply = PluginReply::Local { reason: "peer not allowed".into() };
        wr.write_all(format!("{}\n", serde_json::to_string(&reply)?).as_bytes()).await?;
        return Ok(());
    }
    let mut rd = BufReader::new(rd).take(MAX_REQUEST_BYTES as u64);
    let mut line = Vec::new();
    rd.read_until(b'\n', &mut line).await?;
    let t0 = Instant::now();
    // Where the time of one request goes (DEBUG "answered plugin"): the
    // name lookup (a blocking-thread hop and the NSS lock), the decision,
    // the journal write (its lock and the statement).
    let mut spans = PluginSpans::default();
    // A forward journaled for this answer (its id).
    let mut journaled: Option<String> = None;
    let reply = match serde_json::from_slice::<PluginRequest>(&line) {
        Ok(PluginRequest::Ping { .. }) => PluginReply::Pong,
        Ok(PluginRequest::Submit { v, .. }) if v != WIRE_VERSION => {
            PluginReply::Local { reason: format!("unknown wire version {v}") }
        }
        Ok(PluginRequest::Submit { mut job, .. }) => {
            // Who submitted is slurmctld's uid for the job, named from this
            // host's accounts: the target runs the job as that name's
            // identity, so the name never comes from the request itself.
            let uid = job.user_id;
            let t = Instant::now();
            job.user_name = agent.user_name(uid).await;
            spans.lookup = t.elapsed();
            let t = Instant::now();
            let (reply, new) = {
                let view = agent.view.read();
                decide::decide(&live, &view, &job)
            };
            spans.decide = t.elapsed();
            match new {
                None => reply,
                Some(f) => match agent.journal.add_forward(&f.id, &job, &f.target) {
                    Ok(timing) => {
                        (spans.journal_wait, spans.journal_write) = (timing.wait, timing.write);
                        tracing::info!(id = %f.id, target = %f.target, "forwarding job");
                        journaled = Some(f.id.clone());
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
    let answer = format!("{}\n", serde_json::to_string(&reply)?);
    if let Err(e) = wr.write_all(answer.as_bytes()).await {
        // slurmctld gave up waiting (the plugin's deadline) and closed the
        // connection: the job stayed as submitted or became a deferred
        // stand-in with an id of its own, and this forward has no stand-in.
        // Registered, it would be placed (early: a run holding GPUs until
        // its wait ran out) and cancelled as an orphan only later.
        if let Some(id) = &journaled {
            match agent.journal.withdraw_forward(id) {
                Ok(true) => tracing::warn!(%id, "the plugin did not take the forward (its deadline passed): withdrawn"),
                Ok(false) => {}
                Err(e) => tracing::error!(%id, "journal: {e:#}"),
            }
        }
        return Err(e).context("answering the plugin");
    }
    if journaled.is_some() {
        agent.forwards_pending.notify_one();
    }
    tracing::debug!(
        us = t0.elapsed().as_micros() as u64,
        read_us = t0.duration_since(accepted).as_micros() as u64,
        req_bytes = line.len(),
        lookup_us = spans.lookup.as_micros() as u64,
        decide_us = spans.decide.as_micros() as u64,
        journal_wait_us = spans.journal_wait.as_micros() as u64,
        journal_write_us = spans.journal_write.as_micros() as u64,
        "answered plugin"
    );
    Ok(())
}

/// The parts of one plugin request's time (see [`handle_plugin`]).
#[derive(Default)]
struct PluginSpans {
    lookup: Duration,
    decide: Duration,
    journal_wait: Duration,
    journal_write: Duration,
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
        let action = agent.lease.lock().tick(Instant::now());
        if let lease::LeaseAction::SelfFence { silent } = action {
            tracing::warn!(silent_s = silent.as_secs(), "lease expired: stopping every fleet job this cluster runs");
            if let Err(e) = track::self_fence(&agent, silent).await {
                tracing::warn!("self-fencing: {e:#}");
                agent.lease.lock().retry_fence();
            }
        }
        if stopped(&mut stop, agent.live().heartbeat).await {
            return;
        }
    }
}

/// Whether the last heartbeat found the scheduler silent (logged once per
/// outage; one agent per process).
static SCHEDULER_DOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub async fn heartbeat_once<B: Backend>(agent: &Arc<Agent<B>>) -> Result<()> {
    use std::sync::atomic::Ordering;
    // A scheduler that does not answer (slurmctld killed or restarting)
    // does not silence the cluster: its jobs run on under slurmd, and a
    // silent cluster's jobs move and lose their in-job leases. The
    // heartbeat says so instead, with no capacity (no new work here).
    // A slow query (a loaded or restarting controller: Slurm's clients
    // retry for seconds) waits at most a heartbeat interval; the last
    // answer stands in for it while it is fresh.
    let wait = agent.live().heartbeat.clamp(Duration::from_secs(1), Duration::from_secs(5));
    let mut query = agent.capacity.lock().query.take().unwrap_or_else(|| {
        let a = agent.clone();
        tokio::spawn(async move { a.backend.capacity().await })
    });
    let answer = match tokio::time::timeout(wait, &mut query).await {
        Ok(Ok(Ok(mut c))) => {
            // Nodes that only run stand-ins are no capacity for jobs.
            c.nodes.retain(|n| n.partitions.iter().any(|p| *p != agent.cfg.proxy_partition));
            // RealMemory bounds placement whatever the select type; free memory
            // is said only where Slurm allocates memory.
            slurm::memory_view(&mut c.nodes, agent.cfg.memory_scheduled);
            agent.capacity.lock().last = Some((Instant::now(), c.clone()));
            Ok(c)
        }
        Ok(Ok(Err(e))) => Err(format!("{e:#}")),
        Ok(Err(e)) => Err(format!("the capacity query failed: {e}")),
        Err(_) => {
            // Still running: the next heartbeat waits on it again.
            let mut probe = agent.capacity.lock();
            probe.query = Some(query);
            match probe.last.clone().filter(|(at, _)| at.elapsed() < CAPACITY_FRESH) {
                Some((_, last)) => Ok(last),
                None => Err(format!("no answer to a capacity query in the last {} s", CAPACITY_FRESH.as_secs())),
            }
        }
    };
    let (Capacity { nodes, pending, running, holding }, scheduler_error) = match answer {
        Ok(c) => {
            if SCHEDULER_DOWN.swap(false, Ordering::Relaxed) {
                tracing::info!("the scheduler answers again");
            }
            (c, None)
        }
        Err(e) => {
            let why: String = e.chars().filter(|c| !c.is_control()).take(300).collect();
            if !SCHEDULER_DOWN.swap(true, Ordering::Relaxed) {
                tracing::warn!("the scheduler does not answer: heartbeats go on without capacity: {why}");
            }
            let nodes = agent.capacity.lock().last.as_ref().map(|(_, c)| nodes_while_silent(&c.nodes));
            (Capacity { nodes: nodes.unwrap_or_default(), ..Default::default() }, Some(why))
        }
    };
    // Which of this agent's runs those nodes show holding GPUs (none is
    // free while the scheduler is silent: nothing to name then).
    let holding = if scheduler_error.is_none() {
        match agent.journal.runs_by_native_id() {
            Ok(runs) => Some(runs_holding(&runs, &holding)),
            Err(e) => {
                tracing::warn!("reading the journal for the heartbeat: {e:#}");
                None
            }
        }
    } else {
        None
    };
    let policy = agent.live().identity.clone();
    // Through NSS this may wait on the site's directory: not on a runtime
    // thread.
    let admitted = {
        let (cache, policy) = (agent.identities.clone(), policy.clone());
        tokio::task::spawn_blocking(move || cache.lock().get(&policy)).await?
    };
    if let Some(e) = &admitted.new_error {
        tracing::warn!("{e}");
    }
    let gpu_quotas = admitted.users.as_deref().and_then(|users| agent.backend.gpu_quotas(users, &admitted.accounts));
    let identities =
        admitted.users.map(|users| fleet_api::api::Identities { mapping: identity::describe(&policy.mapping), users });
    let hb = Heartbeat {
        cluster: agent.cfg.site.clone(),
        region: agent.cfg.region.clone(),
        provider: agent.cfg.provider.clone(),
        scheduler: agent.backend.scheduler().into(),
        nodes,
        queue_pending: pending,
        queue_running: running,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        identities,
        lease_s: agent.cfg.lease.map(|l| l.as_secs_f64()),
        start_gate: agent.backend.start_gate(),
        scheduler_error,
        holding,
        gpu_quotas,
        max_time_min: agent.backend.max_time_min(),
    };
    let view = agent.meta.heartbeat(&hb).await?;
    agent.lease.lock().renew(Instant::now());
    publish_view(&agent.cfg.spool, &view, agent.cfg.slurm_uid);
    let mut c = agent.view.write();
    c.view = Some(view);
    c.at = Some(Instant::now());
    Ok(())
}

/// The runs among `runs` (native id, fleet job id, epoch) whose native
/// job is in `holding`, in order.
fn runs_holding(runs: &[(u64, String, u64)], holding: &[u64]) -> Vec<fleet_api::api::RunRef> {
    let holding: std::collections::HashSet<u64> = holding.iter().copied().collect();
    let mut out: Vec<fleet_api::api::RunRef> = runs
        .iter()
        .filter(|(n, _, _)| holding.contains(n))
        .map(|(_, job, epoch)| fleet_api::api::RunRef { job: job.clone(), epoch: *epoch })
        .collect();
    out.sort();
    out
}

/// The nodes a heartbeat names while the scheduler does not answer: the
/// ones it answered last, installed but none usable now (`not_responding`,
/// nothing free). The cluster gets no new work, yet a job its nodes can
/// run waits for them instead of being refused: a `scontrol reconfigure`
/// or a slurmctld restart makes the capacity query fail for a moment,
/// while sbatch at this cluster goes on (a heartbeat with no nodes at all
/// had the next GPU job here refused, "beta: has no a100 GPUs").
fn nodes_while_silent(last: &[fleet_api::api::NodeCapacity]) -> Vec<fleet_api::api::NodeCapacity> {
    last.iter()
        .map(|n| fleet_api::api::NodeCapacity { state: "not_responding".into(), gpus_free: 0, ..n.clone() })
        .collect()
}

/// Name of the fleet view the agent publishes for the plugin.
pub const VIEW_FILE: &str = "view.json";

/// The lines of [`fleet_api::wire::STAND_INS_FILE`]: the jobs of `jobs` tagged as
/// stand-ins (`AdminComment`, which only operators and the plugin set)
/// that have not ended.
pub fn stand_ins_text(jobs: &[crate::backend::NativeJob]) -> String {
    let mut ids: Vec<u64> = jobs
        .iter()
        .filter(|j| !j.state.is_terminal() && fleet_api::wire::parse_admin_tag(&j.admin_comment).is_some())
        .map(|j| j.native_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.iter().map(|id| format!("{id}\n")).collect()
}

/// Write the stand-ins list where job_submit_fleet reads it, when its text
/// changed. Only the agent and `reader` (SlurmUser) may read it
/// ([`jobdir::replace_private`]); with no reader known, the plugin checks no update.
pub(crate) fn publish_stand_ins(spool: &std::path::Path, text: &str, reader: Option<u32>) {
    use std::os::unix::fs::PermissionsExt;
    let name = fleet_api::wire::STAND_INS_FILE;
    let path = spool.join(name);
    // A list an older agent left readable by all is written again.
    let private = std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o007 == 0);
    if private && std::fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
        return;
    }
    if let Err(e) = jobdir::replace_private(spool, name, text.as_bytes(), reader) {
        tracing::warn!("publishing the stand-ins for the plugin: {e}");
    }
}

/// Write the view where job_submit_fleet reads it (atomically: temp + rename),
/// so the plugin answers LOCAL without a socket round trip. Its mtime is
/// the view's age: the plugin ignores a view older than ViewMaxAgeMs. Only
/// the agent and `reader` (SlurmUser) may read it; with no reader known,
/// the plugin asks the agent for every job instead.
fn publish_view(spool: &std::path::Path, view: &fleet_api::api::FleetView, reader: Option<u32>) {
    let res = serde_json::to_vec(view)
        .map_err(std::io::Error::other)
        .and_then(|b| jobdir::replace_private(spool, VIEW_FILE, &b, reader));
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
                    // A stand-in not journaled with its Slurm id came through
                    // the plugin at sbatch time, and a deferred one picked up
                    // while pending: it is still to be scheduled at the
                    // origin (a deferred stand-in that asked already runs).
                    let early_start = agent.journal.early_start(&f.id).unwrap_or(false);
                    let req = ForwardRequest {
                        fleet_job_id: f.id.clone(),
                        request: f.request,
                        tentative_target: f.target,
                        early_start,
                    };
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
    let mut recent = track::Recent::default();
    loop {
        let t0 = Instant::now();
        let res = tokio::select! {
            r = work_once(&agent, client::WORK_WAIT_MS, &mut recent) => r,
            _ = stop.changed() => return,
        };
        let progressed = *res.as_ref().unwrap_or(&false);
        let failed = res.is_err();
        report("work", &mut warned, res.map(|_| ()));
        // A long poll that answered at once with nothing new (an old
        // meta-scheduler, or work already in hand): wait a poll interval.
        let poll = agent.live().poll;
        let pause = if failed {
            poll.max(Duration::from_secs(1))
        } else if !progressed && t0.elapsed() < poll {
            poll
        } else {
            Duration::ZERO
        };
        if stopped(&mut stop, pause).await {
            return;
        }
    }
}

async fn watch_loop<B: Backend>(agent: Arc<Agent<B>>, mut stop: watch::Receiver<bool>) {
    let mut warned = false;
    let mut tracker = track::Tracker::default();
    loop {
        report("watch", &mut warned, track::watch_once(&agent, &mut tracker).await);
        if stopped(&mut stop, agent.live().poll).await {
            return;
        }
    }
}

async fn reconcile_loop<B: Backend>(agent: Arc<Agent<B>>, mut stop: watch::Receiver<bool>) {
    let mut warned = false;
    let mut suspects = reconcile::Suspects::default();
    let mut suspensions = reconcile::Suspensions::default();
    loop {
        report("reconcile", &mut warned, reconcile_once(&agent, &mut suspects, &mut suspensions).await);
        if stopped(&mut stop, Duration::from_secs_f64(reconcile::EVERY_S)).await {
            return;
        }
    }
}

/// How many assignments of one long-poll answer are submitted at once.
pub const SUBMIT_CONCURRENCY: usize = 6;

/// Take new assignments, cancel requests and start checks; true when
/// something new was done.
pub async fn work_once<B: Backend>(agent: &Agent<B>, wait_ms: u64, recent: &mut track::Recent) -> Result<bool> {
    let work = agent.meta.work(wait_ms).await?;
    agent.lease.lock().renew(Instant::now());
    if !work.submit.is_empty() || !work.confirm_start.is_empty() {
        // `fleet::start` (debug): the start path's timestamps (tests/bench/start_latency.py reads them).
        let submit: Vec<&str> = work.submit.iter().map(|a| a.fleet_job_id.as_str()).collect();
        let confirm: Vec<&str> = work.confirm_start.iter().map(|c| c.fleet_job_id.as_str()).collect();
        tracing::debug!(target: "fleet::start", ?submit, ?confirm, "work taken");
    }
    let mut progressed = false;
    let fresh: Vec<_> = track::newest_placements(work.submit)
        .into_iter()
        .filter(|a| recent.fresh(&format!("submit:{}:{}", a.fleet_job_id, a.epoch)))
        .collect();
    progressed |= !fresh.is_empty();
    // Several at once (a failover moves many jobs here together; one
    // sbatch takes a few tenths of a second): each job is still one
    // submit_one, its journal row its own, so at most once holds per job.
    use futures::StreamExt;
    futures::stream::iter(fresh)
        .for_each_concurrent(SUBMIT_CONCURRENCY, |a| async move {
            let id = a.fleet_job_id.clone();
            if let Err(e) = track::submit_one(agent, a).await {
                tracing::warn!(%id, "submitting: {e:#}");
            }
        })
        .await;
    for id in work.cancel {
        if !recent.fresh(&format!("cancel:{id}")) {
            continue;
        }
        progressed = true;
        if let Err(e) = track::cancel_one(agent, &id).await {
            tracing::warn!(%id, "cancelling: {e:#}");
        }
    }
    for o in work.signal {
        progressed = true;
        if let Err(e) = track::signal_one(agent, &o.fleet_job_id, &o.signal, o.scope).await {
            tracing::warn!(id = %o.fleet_job_id, signal = %o.signal, "signalling: {e:#}");
        }
    }
    for o in work.time_limit {
        progressed = true;
        if let Err(e) = time_limit_one(agent, &o.fleet_job_id, o.minutes, o.raise).await {
            tracing::warn!(id = %o.fleet_job_id, minutes = o.minutes, "setting the time limit: {e:#}");
        }
    }
    let checks: Vec<_> = work
        .confirm_start
        .into_iter()
        .filter(|c| recent.fresh(&format!("start:{}:{}", c.fleet_job_id, c.origin_job_id)))
        .collect();
    if !checks.is_empty() {
        progressed = true;
        track::confirm_starts(agent, &checks).await?;
    }
    Ok(progressed)
}

/// Cancel jobs forwarded from here whose stand-in has ended or vanished.
pub async fn reconcile_once<B: Backend>(
    agent: &Agent<B>,
    suspects: &mut reconcile::Suspects,
    suspensions: &mut reconcile::Suspensions,
) -> Result<()> {
    // Stand-ins first: a proxy exits only after its job is finished, so a
    // job still active after its stand-in ended is an orphan, not a race.
    let stand_ins = agent.backend.stand_ins(&agent.cfg.proxy_partition).await?;
    let jobs = agent.meta.active_jobs_from(&agent.cfg.site).await?;
    let mut active = Vec::new();
    for j in reconcile::active_from(&agent.cfg.site, &jobs) {
        active.push((j.clone(), agent.journal.stand_in_of(&j.fleet_job_id)?));
    }
    for (id, reason) in suspects.pass(&active, &stand_ins, now()) {
        match agent.meta.cancel(&id).await {
            Ok(_) => tracing::warn!(%id, "cancelled: {reason}"),
            Err(e) => tracing::warn!(%id, "cancelling an orphan ({reason}): {e:#}"),
        }
    }
    for (id, signal) in suspensions.pass(&active, &stand_ins) {
        match agent.meta.signal(&id, signal, fleet_api::api::SignalScope::Full).await {
            Ok(_) => tracing::info!(%id, signal, "the stand-in was suspended or resumed: signalled its job"),
            Err(e) => tracing::warn!(%id, signal, "passing a suspend/resume on: {e:#}"),
        }
    }
    let changes = agent.time_limits.lock().pass(&active, &stand_ins, now());
    for (id, change) in changes {
        match change {
            reconcile::LimitChange::Lower(minutes) => match agent.meta.time_limit(&id, minutes, false).await {
                Ok(_) => tracing::info!(%id, minutes, "the stand-in's time limit was lowered: sent to its job"),
                Err(e) => tracing::warn!(%id, minutes, "passing a time limit on: {e:#}"),
            },
            // Raised (by an operator at home: Slurm refuses the owner a
            // running job's raise): carried as one. The target agent sets it
            // as the job's user where Slurm allows that, else as itself, an
            // operator there (README: PrivateData).
            reconcile::LimitChange::Raise { from, to: Some(minutes) } => {
                match agent.meta.time_limit(&id, minutes, true).await {
                    Ok(_) => {
                        tracing::info!(%id, from = %fmt_minutes(from), minutes, "the stand-in's time limit was raised: sent to its job")
                    }
                    Err(e) => tracing::warn!(%id, minutes, "passing a raised time limit on: {e:#}"),
                }
            }
            reconcile::LimitChange::Raise { from, to: None } => tracing::warn!(
                %id,
                "the running stand-in's time limit was raised ({} -> UNLIMITED): not carried to the job, which keeps \
                 its limit where it runs (a limit is carried in minutes; set one, or raise it there too: fleetctl \
                 job {id} names the job)",
                fmt_minutes(from)
            ),
        }
    }
    Ok(())
}

fn fmt_minutes(m: Option<u32>) -> String {
    m.map_or_else(|| "UNLIMITED".to_string(), |m| format!("{m} min"))
}

/// Set the time limit the origin asked for on the job this cluster runs
/// (`scontrol update TimeLimit=`: as its user, or, for an operator's
/// `raise` at home, as the agent where only an operator may, see
/// [`Backend::set_time_limit`]), after checking the journal.
pub async fn time_limit_one<B: Backend>(agent: &Agent<B>, id: &str, minutes: u32, raise: bool) -> Result<()> {
    let Some((run, req)) = agent.journal.run(id)? else { return Ok(()) };
    let (Some(sid), false) = (run.slurm_id, run.done) else { return Ok(()) };
    // A job with a `--signal` warning gets it from its stand-in at home,
    // T seconds before the stand-in's new limit (forwarded like any
    // signal): a limit here too would send it a second time.
    if req.warn_signal.is_some() {
        tracing::info!(%id, slurm_id = sid, minutes, "time limit left as submitted: the job's --signal warning and its end come from its stand-in at home");
        return Ok(());
    }
    let user = run.user.as_deref().context("journal has no user for this run")?;
    agent.backend.set_time_limit(sid, user, minutes, raise).await?;
    tracing::info!(%id, slurm_id = sid, minutes, "time limit set on request");
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The plugin's list: tagged stand-ins not ended, each once, sorted;
    /// a job without the tag (`AdminComment`, which users cannot set) is
    /// not one. It is written only when it changes.
    #[test]
    fn the_stand_ins_published_are_the_tagged_jobs_not_ended() {
        let job = |id: u64, state: &str, admin: &str| {
            let mut j = crate::backend::NativeJob::new(id, state);
            j.admin_comment = admin.into();
            j
        };
        let jobs = [
            job(9, "RUNNING", "fleet:beta-b fleet: forwarded beta -> alpha"),
            job(7, "PENDING", "fleet:beta-a"),
            job(8, "COMPLETED", "fleet:beta-c"),
            job(4, "RUNNING", ""),
            job(6, "PENDING", "fleet:"),
            job(7, "PENDING", "fleet:beta-a"),
        ];
        assert_eq!(super::stand_ins_text(&jobs), "7\n9\n");
        assert_eq!(super::stand_ins_text(&[]), "");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(fleet_api::wire::STAND_INS_FILE);
        // A reader who is neither root nor the agent, as SlurmUser is. An
        // older agent's list, readable by all, is replaced.
        let reader = Some(4242);
        std::fs::write(&path, "7\n9\n").unwrap();
        super::publish_stand_ins(dir.path(), "7\n9\n", reader);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "7\n9\n");
        let private = |path: &std::path::Path| {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            // With a named entry the group bits show the ACL's mask (r).
            assert_eq!(mode, 0o640, "{}: mode {mode:o}", path.display());
            assert_eq!(crate::jobdir::named_acl(path, "system.posix_acl_access"), vec![(4242, 4)]);
        };
        private(&path);
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
        super::publish_stand_ins(dir.path(), "7\n9\n", reader);
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), old, "the same list is not written again");
        // A leftover temporary file (a crash between write and rename) is
        // replaced, not written through.
        std::fs::write(dir.path().join(format!(".{}.tmp", fleet_api::wire::STAND_INS_FILE)), "junk").unwrap();
        super::publish_stand_ins(dir.path(), "9\n", reader);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "9\n");
        private(&path);
        // No reader known: the agent's alone.
        super::publish_stand_ins(dir.path(), "", None);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(crate::jobdir::named_acl(&path, "system.posix_acl_access"), vec![]);
    }

    #[test]
    fn the_runs_holding_are_those_whose_native_job_holds_an_allocation() {
        let runs = [(12, "beta-b".to_string(), 2), (11, "beta-a".to_string(), 1), (13, "beta-c".to_string(), 1)];
        let r = |job: &str, epoch| fleet_api::api::RunRef { job: job.into(), epoch };
        // Unsorted, with ids of other users' jobs.
        assert_eq!(super::runs_holding(&runs, &[99, 12, 11, 5]), vec![r("beta-a", 1), r("beta-b", 2)]);
        assert_eq!(super::runs_holding(&runs, &[]), vec![]);
    }

    /// While the scheduler does not answer, the nodes seen last go on in
    /// the heartbeat, all unusable and with nothing free (the
    /// meta-scheduler counts them installed, never as capacity now).
    #[test]
    fn nodes_while_silent_are_the_last_seen_none_usable() {
        let node = |name: &str, state: &str, free: u32| fleet_api::api::NodeCapacity {
            name: name.into(),
            partitions: vec!["gpu".into()],
            gpu_type: Some("a100".into()),
            gpus_total: 8,
            gpus_free: free,
            state: state.into(),
            cpus: 32,
            memory_mb: 64000,
            ..Default::default()
        };
        let last = [node("b1", "idle", 8), node("b2", "mixed", 3), node("b3", "drained", 8)];
        let silent = super::nodes_while_silent(&last);
        assert_eq!(silent.len(), 3);
        for (s, l) in silent.iter().zip(&last) {
            assert_eq!((s.state.as_str(), s.gpus_free), ("not_responding", 0));
            assert_eq!((&s.name, s.gpus_total, s.cpus, s.memory_mb, &s.gpu_type), (&l.name, 8, 32, 64000, &l.gpu_type));
        }
        assert!(super::nodes_while_silent(&[]).is_empty());
    }
}
