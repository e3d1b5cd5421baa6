//! `fleet-metasched`: the meta-scheduler.
//!
//! It tracks the clusters of the fleet (from their agents' heartbeats) and
//! every forwarded job (from the origin agent's `POST /v1/jobs` to the
//! target agent's final status), places a job when its stand-in starts at
//! the origin, and holds the job's output until the stand-in
//! (`fleet-proxy`) has relayed it. The HTTP API is the table in
//! `fleet_api::api`.
//!
//! Additions to that table: `GET /v1/jobs/{id}/explain` (admin, the
//! job's clusters, its job token) → [`store::Explanation`], used by
//! `fleetctl job explain`; `POST /v1/prices` (admin, body: the price CSV)
//! → [`store::PriceImport`], used by `fleetctl prices import`;
//! `GET /v1/rebalance` (admin) → [`store::Rebalance`], the latest
//! rebalancing pass, used by `fleetctl rebalance`.
//!
//! Background tasks: the sweeper (every second), the feed watcher (every
//! 30 s: carbon, egress and spot files re-read when they change, see [`feeds`]) and
//! the rebalancing pass (every `[rebalance] rebalance_interval_s`, only
//! with an engine policy). The pass only *proposes* migrations; carrying
//! them out is not built yet. [`Control`] runs the last two on demand.
//!
//! Layout: [`config`] (TOML), [`lifecycle`] (the job state machine, a
//! pure function), [`store`] (SQLite + output files, driving the
//! lifecycle, synchronous), [`conn`] (connection caps and timeouts),
//! [`metrics`], and the axum layer here (authentication before any body
//! is read, per-route body limits, the work long-poll, JSON, status codes).

pub mod config;
pub mod conn;
pub mod feeds;
pub mod lifecycle;
pub mod metrics;
pub mod ranking;
pub mod store;

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, FromRequestParts, MatchedPath, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fleet_api::api::{
    ForwardRequest, Heartbeat, OutputChunk, SignalRequest, StartConfirmation, StartRequest, StatusUpdate, Stream,
};
use fleet_api::auth;
use serde::Deserialize;

pub use config::Config;
use config::{RebalanceConfig, RebalanceMode, Tokens};
use feeds::{FeedCheck, FeedDirs, FeedWatcher};
use metrics::Metrics;
use store::{Caller, JobFilter, Store, StoreError};

/// Wall clock in Unix seconds, with an offset tests can move forward
/// (heartbeat ages are computed from it), and the monotonic clock the
/// meta-scheduler tells its own stalls by.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
    mono_offset_ms: Arc<AtomicI64>,
}

impl Clock {
    pub fn now(&self) -> f64 {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        wall + self.offset_ms.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// The monotonic clock (plus what [`Clock::pause`] added).
    pub fn mono(&self) -> std::time::Instant {
        std::time::Instant::now() + Duration::from_millis(self.mono_offset_ms.load(Ordering::Relaxed).max(0) as u64)
    }

    /// Move this clock (and every clone of it) forward: time passes while
    /// the meta-scheduler runs.
    pub fn advance(&self, d: Duration) {
        self.offset_ms.fetch_add(d.as_millis() as i64, Ordering::Relaxed);
    }

    /// Both clocks jump by `d`, as they do for a process whose host was
    /// paused or which was stopped: the meta-scheduler did not run meanwhile.
    pub fn pause(&self, d: Duration) {
        self.mono_offset_ms.fetch_add(d.as_millis() as i64, Ordering::Relaxed);
        self.advance(d);
    }
}

/// Request body limits, per route. Bodies are read only after the
/// caller is authenticated ([`require_auth`]), and never beyond these.
/// Status, start, confirm, cancel, signal: small JSON.
const SMALL_BODY: usize = 64 << 10;
/// A heartbeat lists every node (about 200 bytes each): room for 10,000.
const HEARTBEAT_BODY: usize = 2 << 20;
/// `POST /v1/agent/fence`: the runs an agent holds (ids and epochs).
const FENCE_BODY: usize = 8 << 20;
const LEASE_BODY: usize = 4 << 10;
/// A forward carries the job's script and environment, which the plugin
/// socket caps at 8 MiB per request (`fleet-agent` `MAX_REQUEST_BYTES`).
const FORWARD_BODY: usize = 10 << 20;
/// An output chunk: up to 1 MiB of data as base64, plus the JSON around it.
const OUTPUT_BODY: usize = (1 << 20) * 4 / 3 + (16 << 10);
/// A price table (CSV).
const PRICES_BODY: usize = 8 << 20;
/// Longest long-poll of `GET /v1/agent/work?wait_ms=`.
pub const MAX_WAIT_MS: u64 = 30_000;
/// Concurrent streams of one HTTP/2 (h2c) connection.
const MAX_H2_STREAMS: u32 = 4;
/// Output reads served at once (each holds up to MAX_READ in memory).
const OUTPUT_READERS: usize = 32;
/// Default and largest `max` for `GET /v1/jobs/{id}/output`.
const DEFAULT_READ: u64 = 1 << 20;
const MAX_READ: u64 = 8 << 20;

#[derive(Clone)]
struct AppState {
    // One SQLite connection behind a parking_lot (blocking) mutex: every
    // store operation is short, synchronous and runs in `spawn_blocking`,
    // so the lock is never held across an `.await` and never blocks a
    // runtime worker; one connection also serialises the state machine's
    // read-modify-write of a job without SQL transactions.
    store: Arc<parking_lot::Mutex<Store>>,
    // Replaced whole when the token files change (rotation); a short
    // std-style lock, never held across an `.await`.
    tokens: Arc<parking_lot::RwLock<Arc<Tokens>>>,
    /// Where the tokens come from (re-read on SIGHUP or a file change).
    config: Arc<Config>,
    wakers: Arc<store::Wakers>,
    /// Turns true when the daemon shuts down: long-polls answer at once.
    shutdown: tokio::sync::watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    clock: Clock,
    // The watcher is a tokio mutex: a check holds it across the
    // `spawn_blocking` that reads the files, and a timer tick and a
    // `Control` call must not reload at the same time.
    feeds: Option<Arc<tokio::sync::Mutex<FeedWatcher>>>,
    /// Turns for reading output outside the store lock (`get_output`).
    output_readers: Arc<tokio::sync::Semaphore>,
    /// Told which connections carry an agent's or the admin's token.
    conn_gate: conn::ConnGate,
    rebalance_cfg: RebalanceConfig,
    // The latest pass, replaced whole (std-style lock, never held across
    // an `.await`).
    rebalance: Arc<parking_lot::Mutex<Arc<store::Rebalance>>>,
    /// `[rebalance] mode`, or as the admin set it since the start
    /// (`POST /v1/rebalance/mode`; a restart goes back to the file's).
    rebalance_mode: Arc<parking_lot::Mutex<RebalanceMode>>,
    /// `/metrics`' jobs per state and when they were counted: anyone may
    /// ask, so the store (whose one lock every agent call needs) is asked
    /// at most once per [`JOB_COUNTS_MAX_AGE`], however often they ask.
    job_counts: Arc<tokio::sync::Mutex<Option<JobCounts>>>,
}

/// Jobs per state, and when they were counted.
type JobCounts = (std::time::Instant, Arc<Vec<(String, i64)>>);

/// How old `/metrics`' job counts may be.
const JOB_COUNTS_MAX_AGE: Duration = Duration::from_secs(1);

/// How often the feed files are checked for changes.
const FEED_CHECK: Duration = Duration::from_secs(30);
/// How often finished jobs' output is checked against output_retention_days.
const OUTPUT_PURGE_EVERY_S: f64 = 600.0;

/// Outcome of one feed check ([`Control::check_feeds`]).
#[derive(Clone, Debug, PartialEq)]
pub enum FeedReload {
    /// No `carbon` or `egress` directory configured.
    Off,
    Unchanged,
    /// A new snapshot is in use; the number of files read.
    Reloaded(usize),
    /// The old snapshot stays; `path:line: message`.
    Failed(String),
}

/// A handle on a running daemon's periodic work: run a feed check or a
/// rebalancing pass now rather than at the next tick (tests, tools).
/// Pass a clone to [`run_with`]; calls before the daemon started return
/// `None`.
#[derive(Clone, Default)]
pub struct Control {
    inner: Arc<parking_lot::Mutex<Option<AppState>>>,
}

impl Control {
    fn state(&self) -> Option<AppState> {
        self.inner.lock().clone()
    }

    /// Re-read the feed files if they changed, as the 30-second timer does.
    pub async fn check_feeds(&self) -> Option<FeedReload> {
        Some(check_feeds(&self.state()?).await)
    }

    /// Re-read the token files now, as SIGHUP does. `Err` names the
    /// problem; the tokens in use then stay.
    pub async fn reload_tokens(&self) -> Option<Result<(), String>> {
        Some(reload_tokens(&self.state()?).await)
    }

    /// Run a rebalancing pass now, as the timer does; its result is what
    /// `GET /v1/rebalance` serves next.
    pub async fn rebalance(&self) -> Option<store::Rebalance> {
        Some(rebalance_pass(&self.state()?).await)
    }
}

/// Sets each spot series' gauge at the clock's time, logging which clusters
/// a series sets (`loaded`: at a (re)load) and when one stops or starts
/// covering the clock: a stale series leaves its pools scored as configured,
/// which an admin should hear about.
async fn spot_feed_status(st: &AppState, loaded: bool) {
    // The store's lock is taken off the runtime's threads, as for every
    // store call.
    let Ok((series, unfollowed)) = with_store(st, |s, now| Ok(s.spot_status(now))).await else {
        return;
    };
    for s in &series {
        let changed = st.metrics.spot_feed(&s.series, s.current);
        if loaded {
            tracing::info!(series = %s.series, clusters = ?s.clusters, current = s.current, "spot series");
        }
        if s.current && changed && !loaded {
            tracing::info!(series = %s.series, clusters = ?s.clusters, "spot series covers the clock again");
        } else if !s.current && (changed || loaded) {
            tracing::warn!(series = %s.series, clusters = ?s.clusters,
                "spot series does not cover the clock (not started, or more than two ticks past its end): these clusters' spot is scored as configured");
        }
    }
    if loaded && st.config.spot.is_some() && !unfollowed.is_empty() {
        tracing::warn!(clusters = ?unfollowed, "cloud clusters selling spot that no spot series follows (no file name holds their region)");
    }
}

async fn check_feeds(st: &AppState) -> FeedReload {
    let Some(w) = &st.feeds else {
        return FeedReload::Off;
    };
    let mut w = w.clone().lock_owned().await;
    let checked = tokio::task::spawn_blocking(move || {
        let c = w.check();
        drop(w);
        c
    })
    .await;
    match checked {
        Ok(FeedCheck::Unchanged) => {
            spot_feed_status(st, false).await;
            FeedReload::Unchanged
        }
        Ok(FeedCheck::Reloaded(f)) => {
            let n = f.files.len();
            let f = Arc::new(f);
            st.store.lock().set_feeds(f);
            st.metrics.feed_load(true);
            tracing::info!(files = n, "carbon/egress/spot feeds reloaded");
            spot_feed_status(st, true).await;
            FeedReload::Reloaded(n)
        }
        Ok(FeedCheck::Failed(e)) => {
            spot_feed_status(st, false).await;
            st.metrics.feed_load(false);
            tracing::error!(error = %e, "feed reload failed; keeping the previous feeds");
            FeedReload::Failed(e)
        }
        Err(e) => FeedReload::Failed(format!("feed check task failed: {e}")),
    }
}

/// How often the token files' modification times are checked.
const TOKEN_CHECK: Duration = Duration::from_secs(2);

/// What identifies a version of each token file (mtime, size, inode).
fn token_stamp(config: &Config) -> Vec<Option<(SystemTime, u64, u64)>> {
    use std::os::unix::fs::MetadataExt;
    config
        .token_paths()
        .iter()
        .map(|p| std::fs::metadata(p).ok().map(|m| (m.modified().unwrap_or(UNIX_EPOCH), m.len(), m.ino())))
        .collect()
}

async fn reload_tokens(st: &AppState) -> Result<(), String> {
    let cfg = st.config.clone();
    match tokio::task::spawn_blocking(move || cfg.read_tokens()).await {
        Ok(Ok(t)) => {
            tracing::info!(tokens = ?t, "tokens reloaded");
            *st.tokens.write() = Arc::new(t);
            Ok(())
        }
        Ok(Err(e)) => {
            let msg = format!("{e}");
            tracing::error!(error = %msg, "token reload failed; the tokens in use stay");
            Err(msg)
        }
        Err(e) => Err(format!("token reload task failed: {e}")),
    }
}

/// Reload the tokens on SIGHUP and when a token file changes, so that a
/// token can be rotated without a restart (several tokens may be valid
/// at once: one per line).
async fn watch_tokens(st: AppState) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP; token files are still re-read when they change");
            None
        }
    };
    let mut stamp = token_stamp(&st.config);
    let mut tick = tokio::time::interval(TOKEN_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
        };
        let cfg = st.config.clone();
        let now = tokio::task::spawn_blocking(move || token_stamp(&cfg)).await.unwrap_or_default();
        if forced || now != stamp {
            stamp = now;
            let _ = reload_tokens(&st).await;
        }
    }
}

fn move_policy(cfg: &RebalanceConfig) -> store::MovePolicy {
    store::MovePolicy {
        checkpoint_deadline_s: cfg.checkpoint_deadline_s,
        resume_previous: cfg.missed_checkpoint == config::MissedCheckpoint::ResumePrevious,
        stop_deadline_s: cfg.stop_deadline_s,
        min_move_interval_s: cfg.min_move_interval_s,
    }
}

fn proposal_why(p: &ranking::RebalanceProposal) -> String {
    format!("rebalance {}: saves {:.2} USD", p.id, p.saving_usd)
}

async fn rebalance_pass(st: &AppState) -> store::Rebalance {
    let mode = *st.rebalance_mode.lock();
    if mode == RebalanceMode::Off {
        let r = store::Rebalance {
            reason: Some("[rebalance] mode = \"off\": no rebalancing pass runs".into()),
            mode: mode.as_str().into(),
            ..Default::default()
        };
        *st.rebalance.lock() = Arc::new(r.clone());
        return r;
    }
    let margin = st.rebalance_cfg.margin();
    let policy = move_policy(&st.rebalance_cfg);
    let budget = st.rebalance_cfg.max_moves_per_pass as usize;
    let r = match with_store(st, move |s, now| {
        let mut r = s.rebalance(&margin, now)?;
        r.mode = mode.as_str().into();
        if mode == RebalanceMode::Auto {
            // The engine's own proposals, best saving first, a few per pass.
            for p in &r.proposals {
                if r.started.len() >= budget {
                    break;
                }
                match s.start_move(&Caller::Admin, &p.fleet_job_id, &p.to, &proposal_why(p), &policy, now) {
                    Ok(_) => r.started.push(p.id.clone()),
                    Err(e) => tracing::info!(proposal = %p.id, "not moved: {e}"),
                }
            }
        }
        Ok(r)
    })
    .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e.msg, "rebalancing pass failed; keeping the previous proposals");
            return (**st.rebalance.lock()).clone();
        }
    };
    if !r.proposals.is_empty() {
        tracing::info!(proposals = r.proposals.len(), considered = r.considered, "rebalancing proposals");
    }
    st.metrics.rebalance_proposals(r.proposals.len());
    *st.rebalance.lock() = Arc::new(r.clone());
    r
}

/// Serve the API on `listener` until `shutdown` completes.
pub async fn run(
    listener: tokio::net::TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with(listener, config, Clock::default(), Control::default(), shutdown).await
}

/// [`run`] with an explicit clock (tests move it forward).
pub async fn run_with_clock(
    listener: tokio::net::TcpListener,
    config: Config,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with(listener, config, clock, Control::default(), shutdown).await
}

/// [`run_with_clock`] with a [`Control`] handle on the periodic work.
pub async fn run_with(
    listener: tokio::net::TcpListener,
    config: Config,
    clock: Clock,
    control: Control,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    if let Some(why) = listener.local_addr().ok().and_then(|a| config.plaintext_refusal(a)) {
        anyhow::bail!("{why}");
    }
    let tls = match &config.tls {
        Some(t) => Some(tls_config(t).await?),
        None => None,
    };
    let tokens = config.read_tokens()?;
    let dirs = FeedDirs { carbon: config.carbon.clone(), egress: config.egress.clone(), spot: config.spot.clone() };
    let (watcher, feeds) = if dirs.any() {
        let (w, f) = tokio::task::spawn_blocking(move || FeedWatcher::start(dirs))
            .await?
            .map_err(|e| anyhow::anyhow!("loading the carbon/egress/spot feeds: {e}"))?;
        tracing::info!(files = f.files.len(), "carbon/egress/spot feeds loaded");
        (Some(Arc::new(tokio::sync::Mutex::new(w))), Arc::new(f))
    } else {
        (None, Arc::new(feeds::Feeds::default()))
    };
    let metrics = Arc::new(Metrics::new());
    let store = {
        let (dir, clusters, timeout, clock, metrics) = (
            config.state_dir.clone(),
            config.clusters.clone(),
            config.heartbeat_timeout_s,
            clock.clone(),
            metrics.clone(),
        );
        let ranker = ranking::Ranker::load(&config, feeds)?.map(Arc::new);
        if let Some(r) = &ranker {
            tracing::info!(policy = r.policy_name(), "placement ranks with the cost engine");
        } else if watcher.is_some() {
            tracing::warn!("carbon/egress/spot feeds are configured but unused: no cost-engine policy in [placement]");
        }
        let health = config.health();
        let sla = config.sla();
        let mut store = tokio::task::spawn_blocking(move || {
            let mut s = Store::open(&dir, &clusters, timeout, &clock, metrics, ranker)?;
            s.set_sla(sla)?;
            Ok::<_, store::StoreError>(s)
        })
        .await?
        .with_context(|| format!("opening the state in {}", config.state_dir.display()))?;
        store.set_health(health);
        store.set_end_wait(config.end_wait_s());
        store.set_stranded(config.stranded_s());
        store.set_early_wait(config.start.early_submit_wait_s);
        store.set_output_limits(config.output_max_job_bytes, config.output_min_free_bytes);
        store
    };
    let has_engine = store.has_engine();
    let rebalance_cfg = config.rebalance.clone().unwrap_or_default();
    let rebalance_mode = rebalance_cfg.mode;
    let initial = store::Rebalance {
        reason: Some(if has_engine { "no rebalancing pass has run yet".into() } else { store::NO_ENGINE.into() }),
        ..Default::default()
    };
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = shutdown_tx.send(true);
    };
    let limit = conn::LimitAcceptor::new(config.limits.resolve());
    let state = AppState {
        wakers: store.wakers(),
        shutdown: shutdown_rx,
        store: Arc::new(parking_lot::Mutex::new(store)),
        tokens: Arc::new(parking_lot::RwLock::new(Arc::new(tokens))),
        config: Arc::new(config.clone()),
        metrics,
        clock,
        feeds: watcher,
        output_readers: Arc::new(tokio::sync::Semaphore::new(OUTPUT_READERS)),
        conn_gate: limit.gate(),
        rebalance_cfg,
        rebalance: Arc::new(parking_lot::Mutex::new(Arc::new(initial))),
        rebalance_mode: Arc::new(parking_lot::Mutex::new(rebalance_mode)),
        job_counts: Arc::default(),
    };
    *control.inner.lock() = Some(state.clone());
    let mut background = Vec::new();
    if state.feeds.is_some() {
        spot_feed_status(&state, true).await;
        let st = state.clone();
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(FEED_CHECK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is immediate: the feeds were just loaded
            loop {
                tick.tick().await;
                check_feeds(&st).await;
            }
        }));
    }
    if has_engine {
        let st = state.clone();
        let every = Duration::from_secs_f64(state.rebalance_cfg.rebalance_interval_s);
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first pass after one interval: no job runs yet
            loop {
                tick.tick().await;
                rebalance_pass(&st).await;
            }
        }));
    }
    background.push(tokio::spawn(watch_tokens(state.clone())));
    let sweeper = {
        let st = state.clone();
        let retention_s = config.output_retention_days * 86_400.0;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut last_purge = f64::NEG_INFINITY;
            loop {
                tick.tick().await;
                if let Err(e) = with_store(&st, |s, now| s.sweep(now)).await {
                    tracing::warn!(error = %e.msg, "sweep failed");
                }
                if retention_s > 0.0 && st.clock.now() - last_purge >= OUTPUT_PURGE_EVERY_S {
                    last_purge = st.clock.now();
                    match with_store(&st, move |s, now| s.purge_output(now, retention_s)).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(jobs = n, "deleted the output of jobs past output_retention_days"),
                        Err(e) => tracing::warn!(error = %e.msg, "output retention pass failed"),
                    }
                }
            }
        })
    };
    tracing::info!(addr = ?listener.local_addr().ok(), tls = tls.is_some(), "fleet-metasched listening");
    let app = router(state);
    let served = serve(listener, app, tls, limit, shutdown).await;
    sweeper.abort();
    background.iter().for_each(|t| t.abort());
    *control.inner.lock() = None;
    served
}

/// The server's certificate and key, read once at start (a bad file is a
/// startup error naming it).
async fn tls_config(t: &config::TlsConfig) -> anyhow::Result<axum_server::tls_rustls::RustlsConfig> {
    // One process-wide crypto provider (ring); a second install is a no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config =
        axum_server::tls_rustls::RustlsConfig::from_pem_file(&t.cert_file, &t.key_file).await.map_err(|e| {
            anyhow::anyhow!(
                "[tls]: loading cert_file {} / key_file {}: {e}",
                t.cert_file.display(),
                t.key_file.display()
            )
        })?;
    // HTTP/1.1 only: no client of ours speaks HTTP/2 (reqwest is built
    // without it), and its streams would multiply what one connection may
    // hold (each output read is up to MAX_READ in memory).
    let mut inner = (*config.get_inner()).clone();
    inner.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.reload_from_config(std::sync::Arc::new(inner));
    Ok(config)
}

/// Serve `app` on `listener` (HTTPS with `tls`) under the connection
/// limits: the caps and the first-byte/idle deadlines of [`conn`], and
/// hyper's header-read timeout for request heads.
async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<axum_server::tls_rustls::RustlsConfig>,
    limit: conn::LimitAcceptor,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let handle = axum_server::Handle::new();
    let on_stop = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        on_stop.graceful_shutdown(Some(Duration::from_secs(5)));
    });
    let listener = listener.into_std().context("taking over the listening socket")?;
    let header_timeout = limit.header_read_timeout();
    fn http<A>(b: &mut axum_server::Server<A>, header_timeout: Duration) {
        let h = b.http_builder();
        h.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_timeout);
        // HTTP/2 is not offered (ALPN), but hyper would still take plain
        // h2c by prior knowledge: then a few streams at a time, as a few
        // HTTP/1.1 connections would be.
        h.http2().max_concurrent_streams(MAX_H2_STREAMS);
    }
    // The peer's address reaches `require_auth`, which tells the gate
    // which connections an agent or the admin uses.
    let make = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    match tls {
        None => {
            let mut server = axum_server::from_tcp(listener).acceptor(limit);
            http(&mut server, header_timeout);
            server.handle(handle).serve(make).await.context("serving HTTP")
        }
        Some(tls) => {
            let mut server = axum_server::from_tcp(listener)
                .acceptor(axum_server::tls_rustls::RustlsAcceptor::new(tls).acceptor(limit));
            http(&mut server, header_timeout);
            server.handle(handle).serve(make).await.context("serving HTTPS")
        }
    }
}

fn router(state: AppState) -> Router {
    let limit = DefaultBodyLimit::max;
    // Every route here is authenticated by `require_auth` (a route layer:
    // it runs after routing, so it sees the path's job id, and before the
    // handler, so no body is read for an unauthenticated caller). The
    // body limit is SMALL_BODY unless the route sets its own.
    let authenticated = Router::new()
        .route("/v1/heartbeat", post(heartbeat).layer(limit(HEARTBEAT_BODY)))
        .route("/v1/jobs", post(forward).layer(limit(FORWARD_BODY)).get(list_jobs))
        .route("/v1/agent/work", get(agent_work))
        .route("/v1/agent/fence", post(agent_fence).layer(limit(FENCE_BODY)))
        .route("/v1/clusters", get(clusters))
        .route("/v1/prices", post(import_prices).layer(limit(PRICES_BODY)))
        .route("/v1/rebalance", get(rebalance))
        .route("/v1/rebalance/mode", post(rebalance_mode))
        .route("/v1/rebalance/approve/:id", post(rebalance_approve))
        .route("/v1/jobs/:id", get(get_job))
        .route("/v1/jobs/:id/status", post(status))
        .route("/v1/jobs/:id/output", post(post_output).layer(limit(OUTPUT_BODY)).get(get_output))
        .route("/v1/jobs/:id/explain", get(explain))
        .route("/v1/jobs/:id/start", post(start))
        .route("/v1/jobs/:id/confirm_start", post(confirm_start))
        .route("/v1/jobs/:id/cancel", post(cancel))
        .route("/v1/jobs/:id/signal", post(signal))
        .route("/v1/jobs/:id/time_limit", post(time_limit))
        .route("/v1/jobs/:id/checkpoints", post(post_checkpoint).get(get_checkpoints))
        .route("/v1/jobs/:id/lease", post(job_lease).layer(limit(LEASE_BODY)))
        .route("/v1/jobs/:id/end", post(run_end).layer(limit(LEASE_BODY)))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_auth));
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics_text))
        .merge(authenticated)
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .layer(limit(SMALL_BODY))
        .with_state(state)
}

// ---- errors -------------------------------------------------------------

struct ApiError {
    status: StatusCode,
    msg: String,
    expected_offset: Option<u64>,
    terminal: bool,
}

impl ApiError {
    fn new(status: StatusCode, msg: impl Into<String>) -> ApiError {
        ApiError { status, msg: msg.into(), expected_offset: None, terminal: false }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let status = match &e {
            StoreError::BadRequest(_) => StatusCode::BAD_REQUEST,
            StoreError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            StoreError::Forbidden(_) => StatusCode::FORBIDDEN,
            StoreError::NotFound(_) => StatusCode::NOT_FOUND,
            StoreError::Gone(_) => StatusCode::GONE,
            StoreError::Full(_) => StatusCode::INSUFFICIENT_STORAGE,
            StoreError::Conflict { expected_offset, terminal, .. } => {
                return ApiError {
                    status: StatusCode::CONFLICT,
                    msg: e.to_string(),
                    expected_offset: *expected_offset,
                    terminal: *terminal,
                }
            }
            StoreError::Db(_) | StoreError::Io(_) | StoreError::Json(_) => {
                tracing::error!(error = %e, "internal error");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // `{"error": ...}` (fleet_api::api::ApiError) plus, for output gaps,
        // `expected_offset`: the offset the next chunk must start at.
        let mut body = serde_json::json!({ "error": self.msg });
        if let Some(o) = self.expected_offset {
            body["expected_offset"] = o.into();
        }
        if self.terminal {
            body["terminal"] = true.into();
        }
        (self.status, Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid {what}: {e}")))
}

async fn with_store<T, F>(st: &AppState, f: F) -> ApiResult<T>
where
    T: Send + 'static,
    F: FnOnce(&mut Store, f64) -> Result<T, StoreError> + Send + 'static,
{
    let (store, clock) = (st.store.clone(), st.clock.clone());
    tokio::task::spawn_blocking(move || {
        let mut s = store.lock();
        f(&mut s, clock.now())
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("store task failed: {e}")))?
    .map_err(ApiError::from)
}

// ---- authentication -----------------------------------------------------

/// `Authorization: Bearer <cluster or admin token>` or
/// `Authorization: FleetJob <job token of the job in the path>`.
fn authenticate(tokens: &Tokens, headers: &HeaderMap, path_job: Option<&str>) -> ApiResult<Caller> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, m);
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("missing Authorization header"))?
        .to_str()
        .map_err(|_| unauthorized("malformed Authorization header"))?;
    let (scheme, token) = value.trim().split_once(' ').ok_or_else(|| unauthorized("malformed Authorization header"))?;
    let token = token.trim();
    if scheme.eq_ignore_ascii_case("Bearer") {
        // Every comparison is made (constant time, no early exit).
        let mut caller = None;
        for t in &tokens.admin {
            if auth::tokens_equal(token, t.expose()) {
                caller = Some(Caller::Admin);
            }
        }
        for (name, ts) in &tokens.clusters {
            for t in ts {
                if auth::tokens_equal(token, t.expose()) {
                    caller = Some(Caller::Cluster(name.clone()));
                }
            }
        }
        return caller.ok_or_else(|| unauthorized("unknown bearer token"));
    }
    if scheme.eq_ignore_ascii_case(auth::JOB_TOKEN_SCHEME) {
        let Some(id) = path_job else {
            return Err(unauthorized("a job token is only valid on that job's endpoints"));
        };
        let origin = cluster_of_derived(tokens, token, |secret| auth::job_token(secret, id));
        return origin
            .map(|origin| Caller::Job { id: id.to_string(), origin })
            .ok_or_else(|| unauthorized("job token does not match this job"));
    }
    if scheme.eq_ignore_ascii_case(auth::CKPT_TOKEN_SCHEME) {
        let Some(id) = path_job else {
            return Err(unauthorized("a checkpoint token is only valid on that job's checkpoints"));
        };
        let cluster = cluster_of_derived(tokens, token, |secret| auth::ckpt_token(secret, id));
        return cluster
            .map(|cluster| Caller::Checkpointer { id: id.to_string(), cluster })
            .ok_or_else(|| unauthorized("checkpoint token does not match this job"));
    }
    Err(unauthorized("unsupported Authorization scheme (expected Bearer, FleetJob or FleetCkpt)"))
}

/// The cluster whose secret `derive`s `token` (a job or checkpoint token is
/// a cluster secret bound to one job). Every secret is compared, with no
/// early exit, as the loops it replaces did.
fn cluster_of_derived(tokens: &Tokens, token: &str, derive: impl Fn(&str) -> String) -> Option<String> {
    let mut found = None;
    for (name, ts) in &tokens.clusters {
        for t in ts {
            if auth::tokens_equal(token, &derive(t.expose())) {
                found = Some(name.clone());
            }
        }
    }
    found
}

/// Route layer of every authenticated route: the `Authorization` header
/// is checked before anything reads the body; the [`Caller`] goes into
/// the request's extensions for the handler.
async fn require_auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let peer = parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0);
    let path_job = match Path::<std::collections::BTreeMap<String, String>>::from_request_parts(&mut parts, &st).await {
        Ok(Path(p)) => p.get("id").cloned(),
        Err(e) => return e.into_response(),
    };
    let tokens = st.tokens.read().clone();
    match authenticate(&tokens, &parts.headers, path_job.as_deref()) {
        // A checkpoint token reports checkpoints and renews its run's job
        // lease, and does nothing else.
        Ok(Caller::Checkpointer { .. })
            if !(parts.method == axum::http::Method::POST
                && parts.extensions.get::<MatchedPath>().is_some_and(|m| {
                    matches!(m.as_str(), "/v1/jobs/:id/checkpoints" | "/v1/jobs/:id/lease" | "/v1/jobs/:id/end")
                })) =>
        {
            let mut resp =
                ApiError::new(StatusCode::FORBIDDEN, "a checkpoint token only posts checkpoints").into_response();
            resp.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
            resp
        }
        Ok(caller) => {
            if let (Caller::Admin | Caller::Cluster(_), Some(peer)) = (&caller, peer) {
                st.conn_gate.trust(peer);
            }
            parts.extensions.insert(caller);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(e) => {
            let mut resp = e.into_response();
            // The body was not read: do not keep the connection for another request.
            resp.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
            resp
        }
    }
}

// ---- handlers -----------------------------------------------------------

async fn track(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let route =
        req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    st.metrics.request(&route, resp.status().as_u16());
    resp
}

async fn metrics_text(State(st): State<AppState>) -> ApiResult<Response> {
    let counts = {
        // Callers at once wait here for the one count (a tokio mutex: held
        // across the store call) rather than each queueing on the store.
        let mut cached = st.job_counts.lock().await;
        match &*cached {
            Some((at, c)) if at.elapsed() < JOB_COUNTS_MAX_AGE => c.clone(),
            _ => {
                let c = Arc::new(with_store(&st, |s, _| s.counts()).await?);
                *cached = Some((std::time::Instant::now(), c.clone()));
                c
            }
        }
    };
    let text = st.metrics.render(&counts);
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}

async fn heartbeat(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let hb: Heartbeat = parse(&body, "heartbeat")?;
    Ok(Json(with_store(&st, move |s, now| s.heartbeat(&caller, hb, now)).await?).into_response())
}

async fn forward(State(st): State<AppState>, Extension(caller): Extension<Caller>, body: Bytes) -> ApiResult<Response> {
    let fwd: ForwardRequest = parse(&body, "forward request")?;
    Ok(Json(with_store(&st, move |s, now| s.forward(&caller, fwd, now)).await?).into_response())
}

async fn list_jobs(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    uri: axum::http::Uri,
) -> ApiResult<Response> {
    let filter = job_filter(&uri)?;
    Ok(Json(with_store(&st, move |s, _| s.list(&caller, &filter)).await?).into_response())
}

/// `GET /v1/jobs`'s parameters. A malformed or unknown one is a 400 that
/// names it (serde's own message does not say which).
fn job_filter(uri: &axum::http::Uri) -> Result<JobFilter, ApiError> {
    Query::<JobFilter>::try_from_uri(uri).map(|Query(f)| f).map_err(|e| {
        let query = uri.query().unwrap_or("");
        let culprit = query.split('&').find(|pair| {
            let one: Option<axum::http::Uri> = format!("/?{pair}").parse().ok();
            one.is_none_or(|u| Query::<JobFilter>::try_from_uri(&u).is_err())
        });
        let msg = match culprit {
            Some(p) => format!("query parameter {:?}: {}", p.chars().take(100).collect::<String>(), e.body_text()),
            None => e.body_text(),
        };
        ApiError::new(StatusCode::BAD_REQUEST, msg)
    })
}

#[derive(Deserialize)]
struct WorkQuery {
    /// Long-poll: wait up to this many ms (capped at [`MAX_WAIT_MS`]) for
    /// work when there is none; absent or 0 answers at once.
    #[serde(default)]
    wait_ms: u64,
}

/// `GET /v1/agent/work?wait_ms=N`: the cluster's work, at once when there
/// is some; otherwise after its waker fires (a new assignment, cancel or
/// start request for it) or N ms, whichever comes first. The store lock
/// is taken only for each check, never while waiting.
async fn agent_work(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<WorkQuery>,
) -> ApiResult<Response> {
    let wait = Duration::from_millis(q.wait_ms.min(MAX_WAIT_MS));
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribe before the first check: a wake between the check and the
    // wait is not lost.
    let mut woken = match &caller {
        Caller::Cluster(c) => st.wakers.subscribe(c),
        _ => None,
    };
    let mut shutdown = st.shutdown.clone();
    loop {
        let c = caller.clone();
        let work = with_store(&st, move |s, now| s.work(&c, now)).await?;
        if !work.is_empty() || wait.is_zero() || tokio::time::Instant::now() >= deadline || *shutdown.borrow() {
            return Ok(Json(work).into_response());
        }
        let Some(rx) = woken.as_mut() else {
            return Ok(Json(work).into_response());
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return Ok(Json(work).into_response()) },
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// `POST /v1/agent/fence`: which of the caller's runs are stale.
async fn agent_fence(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: fleet_api::api::FenceRequest = parse(&body, "fence request")?;
    Ok(Json(with_store(&st, move |s, _| s.fence(&caller, &req)).await?).into_response())
}

async fn clusters(State(st): State<AppState>, Extension(caller): Extension<Caller>) -> ApiResult<Response> {
    match caller {
        Caller::Admin | Caller::Cluster(_) => {}
        Caller::Job { .. } | Caller::Checkpointer { .. } => {
            return Err(ApiError::new(StatusCode::FORBIDDEN, "a job token cannot read the fleet"))
        }
    }
    Ok(Json(with_store(&st, |s, now| Ok(s.view(now))).await?).into_response())
}

async fn import_prices(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let csv = String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "the price table is not UTF-8"))?;
    Ok(Json(with_store(&st, move |s, _| s.import_prices(&caller, &csv)).await?).into_response())
}

async fn rebalance(State(st): State<AppState>, Extension(caller): Extension<Caller>) -> ApiResult<Response> {
    if caller != Caller::Admin {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only the admin reads rebalancing proposals"));
    }
    let mut latest = (**st.rebalance.lock()).clone();
    latest.mode = st.rebalance_mode.lock().as_str().into();
    latest.moves = with_store(&st, |s, now| s.moves(now)).await?;
    Ok(Json(latest).into_response())
}

/// `POST /v1/rebalance/mode` `{"mode": "auto"}` (admin): the mode until
/// the next restart (the file's `[rebalance] mode` then applies again).
async fn rebalance_mode(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    if caller != Caller::Admin {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only the admin sets the rebalancing mode"));
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        mode: String,
    }
    let req: Req = parse(&body, "rebalance mode")?;
    let mode: RebalanceMode = req.mode.parse().map_err(|e: String| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    if mode != RebalanceMode::Off && !with_store(&st, |s, _| Ok(s.has_engine())).await? {
        return Err(ApiError::new(StatusCode::CONFLICT, store::NO_ENGINE));
    }
    let was = std::mem::replace(&mut *st.rebalance_mode.lock(), mode);
    tracing::info!(from = was.as_str(), to = mode.as_str(), "rebalancing mode set by the admin");
    Ok(Json(serde_json::json!({ "mode": mode.as_str(), "was": was.as_str() })).into_response())
}

/// `POST /v1/rebalance/approve/{id}` (admin, mode `approve` or `auto`):
/// carry out proposal `id` of the latest pass (a planned move starts).
async fn rebalance_approve(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    if caller != Caller::Admin {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only the admin approves a migration"));
    }
    let mode = *st.rebalance_mode.lock();
    if !matches!(mode, RebalanceMode::Approve | RebalanceMode::Auto) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "[rebalance] mode is \"{}\": proposals are not carried out (set mode = \"approve\" or \"auto\")",
                mode.as_str()
            ),
        ));
    }
    let latest = st.rebalance.lock().clone();
    let Some(p) = latest.proposals.iter().find(|p| p.id == id).cloned() else {
        let shown: String = id.chars().take(80).flat_map(char::escape_default).collect();
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no proposal \"{shown}\" in the latest rebalancing pass (see fleetctl rebalance)"),
        ));
    };
    let policy = move_policy(&st.rebalance_cfg);
    let why = proposal_why(&p);
    let rec = with_store(&st, move |s, now| s.start_move(&caller, &p.fleet_job_id, &p.to, &why, &policy, now)).await?;
    Ok((StatusCode::ACCEPTED, Json(rec)).into_response())
}

async fn get_job(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    Ok(Json(with_store(&st, move |s, _| s.get(&caller, &id).map(|j| j.record)).await?).into_response())
}

async fn explain(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    Ok(Json(with_store(&st, move |s, now| s.explain(&caller, &id, now)).await?).into_response())
}

async fn status(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let upd: StatusUpdate = parse(&body, "status update")?;
    Ok(Json(with_store(&st, move |s, now| s.status(&caller, &id, upd, now)).await?).into_response())
}

async fn post_output(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let chunk: OutputChunk = parse(&body, "output chunk")?;
    with_store(&st, move |s, now| s.write_output(&caller, &id, chunk, now)).await?;
    Ok(Json(serde_json::json!({})).into_response())
}

#[derive(Deserialize)]
struct OutputQuery {
    stream: Stream,
    #[serde(default)]
    offset: u64,
    max: Option<u64>,
}

async fn get_output(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<OutputQuery>,
) -> ApiResult<Response> {
    let max = q.max.unwrap_or(DEFAULT_READ).min(MAX_READ);
    let path = with_store(&st, move |s, _| s.output_file(&caller, &id, q.stream, q.offset)).await?;
    // Read without the store lock (every agent's call needs it), at most
    // OUTPUT_READERS at a time: each holds up to MAX_READ in memory.
    let _turn = st
        .output_readers
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down"))?;
    let bytes = tokio::task::spawn_blocking(move || store::read_range(&path, q.offset, max))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("output read failed: {e}")))?
        .map_err(ApiError::from)?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

async fn start(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: StartRequest = if body.is_empty() { StartRequest::default() } else { parse(&body, "start request")? };
    tracing::debug!(target: "fleet::start", job = %id, stand_in = req.origin_job_id, "start requested");
    let (record, held) =
        with_store(&st, move |s, now| s.start(&caller, &id, req.origin_job_id, req.restart, now)).await?;
    let status = if held { StatusCode::ACCEPTED } else { StatusCode::OK };
    Ok((status, Json(record)).into_response())
}

async fn confirm_start(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    // Refuse other callers before parsing what they sent.
    if !matches!(caller, Caller::Cluster(_)) {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only the origin cluster's agent confirms a start"));
    }
    let c: StartConfirmation = parse(&body, "start confirmation")?;
    Ok(Json(with_store(&st, move |s, now| s.confirm_start(&caller, &id, c, now)).await?).into_response())
}

async fn cancel(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    Ok(Json(with_store(&st, move |s, now| s.cancel(&caller, &id, now)).await?).into_response())
}

/// `POST /v1/jobs/{id}/signal` `{"signal": "USR1", "scope": "full"}`: 202
/// with the job's record once the signal is queued for the target agent
/// (which takes it with its next work and runs `scancel --signal`).
async fn signal(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: SignalRequest = parse(&body, "signal request")?;
    let record = with_store(&st, move |s, now| s.signal(&caller, &id, &req, now)).await?;
    Ok((StatusCode::ACCEPTED, Json(record)).into_response())
}

/// `POST /v1/jobs/{id}/time_limit` `{"minutes": 30}` (origin agent, admin):
/// 202 with the job's record once the limit is queued for the target agent
/// (which runs `scontrol update TimeLimit=` as the job's user there).
async fn time_limit(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: fleet_api::api::TimeLimitRequest = parse(&body, "time limit request")?;
    let record = with_store(&st, move |s, now| s.time_limit(&caller, &id, &req, now)).await?;
    Ok((StatusCode::ACCEPTED, Json(record)).into_response())
}

/// `POST /v1/jobs/{id}/checkpoints` (`CheckpointReport`): the job (its
/// token) or its target cluster's agent reports a complete checkpoint;
/// 200 with the catalog's record.
async fn post_checkpoint(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    // Refuse callers who may never post before parsing what they sent.
    if caller == Caller::Admin {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "only the job or its target cluster reports checkpoints"));
    }
    let rep: fleet_api::api::CheckpointReport = parse(&body, "checkpoint report")?;
    Ok(Json(with_store(&st, move |s, now| s.report_checkpoint(&caller, &id, rep, now)).await?).into_response())
}

/// `POST /v1/jobs/{id}/lease`: a run's watchdog renews its job lease.
async fn job_lease(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: fleet_api::api::JobLeaseRequest = parse(&body, "lease request")?;
    // A run placed early waits at its gate (`wait`): its answer is held
    // for up to LEASE_WAIT, until its cluster's waker fires (the origin's
    // confirmation wakes it), so its script starts as soon as the gate
    // opens. The store lock is taken only for each check.
    let asked = tokio::time::Instant::now();
    let deadline = asked + LEASE_WAIT;
    // `fleet::start` (debug): the start path's timestamps (tests/bench/start_latency.py reads them).
    let answered = |reply: &fleet_api::api::JobLeaseReply, id: &str| {
        tracing::debug!(target: "fleet::start", job = %id, wait = reply.wait, stale = reply.stale,
            valid_ms = reply.valid_ms, held_ms = asked.elapsed().as_millis() as u64, "lease answered");
    };
    let mut woken = match &caller {
        Caller::Checkpointer { cluster, .. } | Caller::Cluster(cluster) => st.wakers.subscribe(cluster),
        _ => None,
    };
    let mut shutdown = st.shutdown.clone();
    loop {
        let (c, i, r) = (caller.clone(), id.clone(), req.clone());
        let reply = with_store(&st, move |s, now| s.job_lease(&c, &i, &r, now)).await?;
        if !reply.wait || tokio::time::Instant::now() >= deadline || *shutdown.borrow() {
            answered(&reply, &id);
            return Ok(Json(reply).into_response());
        }
        let Some(rx) = woken.as_mut() else {
            answered(&reply, &id);
            return Ok(Json(reply).into_response());
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { answered(&reply, &id); return Ok(Json(reply).into_response()) },
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// `POST /v1/jobs/{id}/end`: a run's lease client says its script ended
/// (a claim; `store/ends.rs`).
async fn run_end(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: fleet_api::api::RunEndClaim = parse(&body, "end claim")?;
    Ok(Json(with_store(&st, move |s, now| s.run_end(&caller, &id, &req, now)).await?).into_response())
}
/// Longest a `wait` answer to a job lease is held back (a run asks with a
/// timeout of at least 1 s, `lease-exec` with 5 s or its lease).
const LEASE_WAIT: Duration = Duration::from_millis(800);

/// `GET /v1/jobs/{id}/checkpoints`: the catalog's checkpoints of the job, newest first.
async fn get_checkpoints(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Response> {
    Ok(Json(with_store(&st, move |s, _| s.checkpoints(&caller, &id)).await?).into_response())
}
