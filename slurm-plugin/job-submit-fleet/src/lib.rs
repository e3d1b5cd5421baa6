//! `job_submit/fleet`: slurmctld calls [`FleetSubmit::submit`] for every
//! submission, under its job and partition write locks.
//!
//! Invariant: this code never stalls or crashes slurmctld. The only I/O is
//! one round trip on the local agent's Unix socket under a hard deadline
//! (`SubmitTimeoutMs`, default 50 ms), or one datagram sent without
//! blocking and never answered ([`wake_agent`]); no agent, a slow agent or a reply
//! that does not parse leaves the job exactly as submitted (fail open),
//! with one rate-limited warning in slurmctld's log. No panic crosses the
//! C boundary (the `slurm` crate's entry points catch them).
//!
//! Decisions:
//! * interactive jobs (salloc/srun: no script) and `--fleet=local` are
//!   left alone without asking the agent;
//! * jobs without GPUs and without `--fleet*` options likewise;
//! * a job the agent's published fleet view places at home is LOCAL
//!   without a round trip ([`view`]);
//! * otherwise the agent answers LOCAL (untouched), FORWARD (rewritten
//!   into a stand-in, see [`rewrite`]) or REJECT (sbatch prints why);
//! * a job without `--fleet*` options the view sends away (with
//!   `ForwardMode=deferred`, the default;
//!   with `ForwardMode=sync` only while the agent does not answer), and
//!   every GPU job array the view sends away, becomes a *deferred*
//!   stand-in ([`deferred_plan`]): it carries the request in its own batch
//!   script, durable in slurmctld's state; the agent, woken by a datagram
//!   ([`wake_agent`]), forwards it while it is pending, or when Slurm
//!   starts it (an array element by element, as each starts);
//! * every stand-in made (forwarded or deferred) sends that datagram, so
//!   that the agent lists it for [`FleetSubmit::modify`]'s check soon.

mod client;
mod config;

/// The proxy partition while fleet.conf has not loaded (its default).
const DEFAULT_PROXY_PARTITION: &str = "fleet";

/// The most `fini` waits for one of the plugin's threads to stop.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// Joins `t` if it ends within `wait`; otherwise leaves it to end on its
/// own (it holds its own references; the library is never unmapped, see
/// `slurm::job_submit::Slot`): `fini` runs under slurmctld's reconfigure
/// locks, and a thread stuck in a user lookup (LDAP away) or a `stat` on
/// a hung file system must not hold it there.
fn join_within(t: std::thread::JoinHandle<()>, wait: Duration) {
    let t0 = Instant::now();
    while !t.is_finished() {
        if t0.elapsed() >= wait {
            log::error(&format!(
                "job_submit/fleet: thread {:?} did not stop within {} ms; left to end on its own",
                t.thread().name().unwrap_or("?"),
                wait.as_millis()
            ));
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = t.join();
}
mod request;
mod stats;
mod view;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_api::wire::{ForwardPlan, PluginReply};
use slurm::job_desc::{JobDesc, NumField, StrField};
use slurm::job_submit::{JobSubmitPlugin, Reject};
use slurm::{log, sys};

pub use config::PluginConfig;
pub use request::{build_request, complete, finish_shape, prepare, read_shape, Prepared, Shape};

pub struct FleetSubmit {
    config: config::LiveConfig,
    stats: Mutex<stats::Stats>,
    warn: Mutex<stats::RateLimit>,
    /// When the agent last let a submission time out: for
    /// [`client::QUIET`] after it, submissions do not ask it.
    timed_out: Mutex<Option<Instant>>,
    view: view::ViewCache,
    /// An unbound, non-blocking datagram socket: wakes the agent's scan of
    /// stand-ins ([`wake_agent`]). `None` if it could not be made.
    wake: Option<std::os::unix::net::UnixDatagram>,
}

impl JobSubmitPlugin for FleetSubmit {
    fn init() -> Result<Self, String> {
        let (config, read) = config::LiveConfig::load(&config::conf_path());
        let noticed =
            if config.watched() { "noticed through inotify" } else { "looked for on every submission (no inotify)" };
        let view_path = match (read, config.get().0) {
            (Ok(warnings), Some(cfg)) => {
                warnings.iter().for_each(|w| log::info(&format!("job_submit/fleet: {w}")));
                log::info(&format!("job_submit/fleet: {}; fleet.conf changes {noticed}", cfg.describe()));
                cfg.view_path.clone()
            }
            (read, _) => {
                // slurmctld calls init once: the plugin waits for a
                // usable fleet.conf, passing jobs through meanwhile.
                let why = read.err().unwrap_or_default();
                log::error(&format!(
                    "job_submit/fleet: {why}; passing every job through untouched (but keeping users out of \
                     partition {DEFAULT_PROXY_PARTITION}) until fleet.conf loads; its changes {noticed}"
                ));
                std::path::PathBuf::new()
            }
        };
        // The cache follows the view path of the settings in use.
        let view = view::ViewCache::start(view_path);
        let wake = std::os::unix::net::UnixDatagram::unbound().ok().filter(|s| s.set_nonblocking(true).is_ok());
        Ok(FleetSubmit {
            config,
            stats: Mutex::default(),
            warn: Mutex::default(),
            timed_out: Mutex::default(),
            view,
            wake,
        })
    }

    fn submit(&self, job: &mut JobDesc<'_>, submit_uid: u32) -> Result<(), Reject> {
        let t0 = Instant::now();
        let Some(cfg) = self.config() else {
            return request::proxy_partition_rule(job, DEFAULT_PROXY_PARTITION, submit_uid);
        };
        let mut ask_us = None;
        let (outcome, result) = self.decide(&cfg, job, submit_uid, &mut ask_us);
        let us = t0.elapsed().as_micros() as u64;
        if let Some(line) = self.stats.lock().map(|mut s| s.record(outcome, ask_us, us)).unwrap_or(None) {
            log::info(&line);
        }
        result
    }

    /// `scontrol update` of a job: nobody but root and SlurmUser moves a
    /// job into the proxy partition, and nobody changes the resources of a
    /// stand-in ([`request::stand_in_update_rule`]).
    fn modify(&self, job: &mut JobDesc<'_>, submit_uid: u32) -> Result<(), Reject> {
        let cfg = self.config();
        let partition = cfg.as_ref().map(|c| c.proxy_partition.clone());
        request::proxy_partition_rule(job, partition.as_deref().unwrap_or(DEFAULT_PROXY_PARTITION), submit_uid)?;
        // A stand-in, by the agent's list (no I/O here: the view's watcher
        // keeps it in memory).
        if let (Some(cfg), Some(id)) = (&cfg, job.job_id()) {
            if self.view.is_stand_in(cfg, id) {
                let res = request::stand_in_update_rule(job, id);
                if let Err(r) = &res {
                    // 22.05 does not hand the message to scontrol.
                    log::info(&format!("job_submit/fleet: update refused by uid {submit_uid}: {}", r.message));
                }
                return res;
            }
        }
        Ok(())
    }

    fn fini(&self) {
        // The watcher runs this library's code: joined before slurmctld
        // unloads it.
        self.view.stop();
        self.config.stop();
        if let Ok(s) = self.stats.lock() {
            if let Some(line) = s.summary() {
                log::info(&line);
            }
        }
    }
}

slurm::job_submit_plugin!(FleetSubmit, "Fleet federation job_submit", "job_submit/fleet");

impl FleetSubmit {
    /// fleet.conf as it is now (read again when it changed; see [`config`]).
    /// The settings in use (`None` while fleet.conf has never loaded).
    fn config(&self) -> Option<std::sync::Arc<PluginConfig>> {
        let (cfg, change) = self.config.get();
        match change {
            Some(config::Change::Reloaded(lines)) => {
                lines.iter().for_each(|l| log::info(&format!("job_submit/fleet: {l}")))
            }
            Some(config::Change::Failed(e)) => log::error(&format!("job_submit/fleet: {e}")),
            None => {}
        }
        cfg
    }

    /// What to do with the job; `ask_us` is set when the agent was asked
    /// (to how long the round trip took).
    fn decide(
        &self,
        cfg: &Arc<PluginConfig>,
        job: &mut JobDesc<'_>,
        uid: u32,
        ask_us: &mut Option<u64>,
    ) -> (stats::Outcome, Result<(), Reject>) {
        use stats::Outcome;
        // Only what placement reads first: a job that stays home costs no
        // copy of its script and no pass over its environment.
        let pre = match request::read_pre(job, cfg, uid) {
            Ok(Some(pre)) => pre,
            Ok(None) => return (Outcome::Skip, Ok(())),
            Err(rej) => return (Outcome::Reject, Err(rej)),
        };
        // A plain job of a shape the view held now already placed home:
        // the same answer, for a comparison of bytes (slurmctld runs the
        // hook with its caches cold, where reading and placing a shape
        // costs most; a site's GPU jobs come in a few shapes).
        let mut key = request::ShapeKey::default();
        let key = (pre.is_plain() && key.read(job)).then_some(&key);
        if key.is_some_and(|k| self.view.remembered_home(cfg, k.as_bytes())) {
            return (Outcome::Remembered, Ok(()));
        }
        let shape = match request::shape_of(job, cfg, pre) {
            Ok(Some(shape)) => shape,
            Ok(None) => return (Outcome::Skip, Ok(())),
            Err(rej) => return (Outcome::Reject, Err(rej)),
        };
        // The common LOCAL answer (home can run it and has the GPUs free
        // now), from the view the agent publishes: no other cluster is
        // looked at (`place` would say the same, for more work).
        if shape.is_plain() && self.view.home_starts_now(cfg, &shape.req, key.map(request::ShapeKey::as_bytes)) {
            return (Outcome::Local, Ok(()));
        }
        let mut req = match request::finish_shape(job, shape) {
            Prepared::Untouched => return (Outcome::Skip, Ok(())),
            Prepared::Ask(req) => req,
            Prepared::Hetjob(req, offset) => return self.hetjob(cfg, &req, offset),
        };
        // The submitter's name if the view's watcher has resolved it (it
        // resolves it now otherwise: learned from any job that may leave).
        let user_name = self.view.user_name(req.user_id);
        // Jobs that stay home are answered from the view the agent
        // publishes, parsed by the view watcher (no I/O here). Only
        // jobs that may leave (or carry --fleet options) ask the agent.
        if req.fleet == Default::default() && self.view.stays_home(cfg, &req) {
            return (Outcome::Local, Ok(()));
        }
        request::complete(job, cfg, &mut req);
        // A job array never asks the agent: one the view sends away becomes
        // an array of deferred stand-ins, each element forwarded when Slurm
        // starts it (its throttle and dependencies are slurmctld's).
        if req.is_array {
            return match self.view.leaving_to(cfg, &req) {
                Some(target) => {
                    let why = "a GPU job array, forwarded element by element";
                    self.defer(cfg, job, &req, target.clone(), why)
                        .unwrap_or_else(|e| self.not_deferred(cfg, &req, &target, &e))
                }
                None => (Outcome::Local, Ok(())),
            };
        }
        // A job with --fleet* options asks the agent in either mode: it
        // decides them (and names the refusal) with the submitter's name.
        if cfg.always_defer && req.fleet == Default::default() {
            // Placement reads the submitter's name against each cluster's
            // identities; the view's watcher resolves it (NSS, never here),
            // so the first job of a user not known yet asks the agent,
            // which names the user, and refuses where nobody maps them.
            if let Some(name) = user_name {
                req.user_name = Some(name);
                if let Some(target) = self.view.leaving_to(cfg, &req) {
                    match self.defer(cfg, job, &req, target, "ForwardMode=deferred") {
                        Ok(done) => return done,
                        // Its stand-in could not carry it (too large for
                        // Slurm): the agent's round trip, whose stand-in does
                        // not carry the request.
                        Err(e) => log::verbose(&format!("job_submit/fleet: not deferred ({e}); asking the agent")),
                    }
                }
            }
        }
        let t_ask = Instant::now();
        let (reply, req) = self.ask(cfg, req);
        *ask_us = Some(t_ask.elapsed().as_micros() as u64);
        match reply {
            Ok(PluginReply::Local { .. }) | Ok(PluginReply::Pong) => (Outcome::Local, Ok(())),
            Ok(PluginReply::Reject { message }) => (
                Outcome::Reject,
                Err(Reject {
                    code: sys::ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE as i32,
                    message: format!("fleet: {message}"),
                }),
            ),
            Ok(PluginReply::Forward(plan)) => {
                rewrite(job, &plan, StandInTime::of(cfg, &req));
                // So that the agent lists the new stand-in for `job_modify`
                // within about a second.
                wake_agent(self.wake.as_ref(), &cfg.pickup_socket);
                log::verbose(&format!(
                    "job_submit/fleet: uid {uid} job forwarded to {} as {}",
                    plan.target, plan.fleet_job_id
                ));
                (Outcome::Forward, Ok(()))
            }
            Err(e) => {
                // The view says the job must leave: it leaves later, as a
                // deferred stand-in the agent picks up when Slurm starts it.
                let leaving = self.view.leaving_to(cfg, &req);
                self.warn_unavailable(cfg, &e, leaving.is_some());
                if let Some(target) = leaving {
                    return self
                        .defer(cfg, job, &req, target.clone(), "the site agent did not answer at submission")
                        .unwrap_or_else(|e| self.not_deferred(cfg, &req, &target, &e));
                }
                if cfg.fail_open {
                    (Outcome::FailOpen, Ok(()))
                } else {
                    (
                        Outcome::Reject,
                        Err(Reject {
                            code: slurm::SLURM_ERROR,
                            message: format!("fleet: the site agent is unavailable ({e}) and FailOpen=no"),
                        }),
                    )
                }
            }
        }
    }

    /// [`client::ask`], unless the agent timed out less than
    /// [`client::QUIET`] ago: then `Quiet` at once, so that a hung agent
    /// costs one deadline per interval, not one per submission.
    fn ask(
        &self,
        cfg: &PluginConfig,
        req: Box<fleet_api::JobRequest>,
    ) -> (Result<fleet_api::wire::PluginReply, client::AskError>, Box<fleet_api::JobRequest>) {
        let last = self.timed_out.lock().map(|t| *t).unwrap_or(None);
        if let Some(ago) = last.map(|t| t.elapsed()).filter(|ago| *ago < client::QUIET) {
            return (Err(client::AskError::Quiet(ago)), req);
        }
        let (reply, req) = client::ask(&cfg.socket, req, cfg.timeout);
        if let Ok(mut t) = self.timed_out.lock() {
            *t = matches!(reply, Err(client::AskError::Timeout(_))).then(Instant::now);
        }
        (reply, req)
    }

    fn warn_unavailable(&self, cfg: &PluginConfig, e: &client::AskError, deferred: bool) {
        if let Ok(mut w) = self.warn.lock() {
            if let Some(n) = w.allow() {
                let also = if n > 0 { format!(" ({n} more since the last warning)") } else { String::new() };
                let what = if deferred {
                    "job deferred: its stand-in carries the request and is forwarded when Slurm starts it"
                } else {
                    "job stays local"
                };
                log::error(&format!(
                    "job_submit/fleet: agent at {} unavailable: {e}; {what}{also}",
                    cfg.socket.display()
                ));
            }
        }
    }

    /// Rewrite `job` into a deferred stand-in (see [`deferred_plan`]); a
    /// job that cannot be deferred is left as submitted (fail open), except
    /// one that cannot leave (a script over `MaxScriptBytes`, fields that
    /// are not UTF-8) which the view says home cannot run: refused, naming
    /// why, as the agent refuses it (rather than Slurm's generic refusal).
    /// A job that had to be deferred and could not be (`why`), untouched:
    /// refused naming why when the view says home cannot run it (Slurm
    /// would refuse it with a generic error), else left local (fail open).
    fn not_deferred(
        &self,
        cfg: &PluginConfig,
        req: &fleet_api::JobRequest,
        target: &str,
        why: &str,
    ) -> (stats::Outcome, Result<(), Reject>) {
        if self.view.origin_cannot_run(cfg, req) {
            return (
                stats::Outcome::Reject,
                Err(Reject {
                    code: sys::ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE as i32,
                    message: format!("fleet: cannot forward to {target}: {why}"),
                }),
            );
        }
        log::verbose(&format!("job_submit/fleet: job stays local: cannot defer it ({why})"));
        (stats::Outcome::FailOpen, Ok(()))
    }

    /// `Err`: the job could not be deferred and is untouched (the caller
    /// asks the agent, or leaves it local).
    fn defer(
        &self,
        cfg: &PluginConfig,
        job: &mut JobDesc<'_>,
        req: &fleet_api::JobRequest,
        target: String,
        why: &str,
    ) -> Result<(stats::Outcome, Result<(), Reject>), String> {
        if let Some(why_not) = cannot_leave(cfg, req) {
            if self.view.origin_cannot_run(cfg, req) {
                return Ok((
                    stats::Outcome::Reject,
                    Err(Reject {
                        code: sys::ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE as i32,
                        message: format!("fleet: cannot forward to {target}: {why_not}"),
                    }),
                ));
            }
        }
        let plan = deferred_plan(cfg, req, &target, why)?;
        rewrite(job, &plan, StandInTime::of(cfg, req));
        // The agent forwards it while it is pending (an array: element by
        // element as Slurm starts them), and lists it for `job_modify`.
        wake_agent(self.wake.as_ref(), &cfg.pickup_socket);
        log::verbose(&format!("job_submit/fleet: job deferred for {target} as {} ({why})", plan.fleet_job_id));
        Ok((stats::Outcome::Deferred, Ok(())))
    }
}

/// Tell the agent that a stand-in is about to exist: one
/// datagram on its wake-up socket, sent without blocking (the socket is
/// non-blocking: a full queue is `EAGAIN`), no reply read, every failure
/// ignored (no agent: its periodic scan, or the stand-in's start, picks
/// the job up). The datagram carries nothing: the agent reads stand-ins
/// from Slurm.
fn wake_agent(sock: Option<&std::os::unix::net::UnixDatagram>, path: &std::path::Path) {
    if let Some(s) = sock {
        let _ = s.send_to(b"\n", path);
    }
}

/// Why `req` cannot leave its origin at all, whatever the target (the
/// agent's words, `fleet-agent`'s `decide`): a script over
/// `MaxScriptBytes` (not read into the request) or fields that are not
/// UTF-8.
fn cannot_leave(cfg: &PluginConfig, req: &fleet_api::JobRequest) -> Option<String> {
    if req.script.is_none() {
        let len = req.script_len.unwrap_or(0);
        return Some(format!(
            "the script is {len} bytes, more than MaxScriptBytes={}; shrink it or use --fleet=local",
            cfg.max_script_bytes
        ));
    }
    req.non_utf8_fields.first().map(|f| format!("field {f} is not valid UTF-8; fix it or use --fleet=local"))
}

/// A fleet job id minted without the agent: `<site>-<12 hex>`, as the
/// agent's (std's per-process random hash keys, a counter and the time).
fn new_fleet_id(site: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    format!("{site}-{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// The deferred stand-in of `req`: its script execs `fleet-proxy
/// --deferred` and embeds the whole request ([`fleet_api::deferred`]);
/// `AdminComment` carries Fleet's tag. Errors when the job cannot leave
/// (too large a script, fields that are not UTF-8, no meta-scheduler), or
/// cannot leave this way: a stand-in over Slurm's `max_script_size`
/// (script and environment ride in it, encoded), which Slurm would refuse
/// after this hook, or a target name that is no cluster name.
pub fn deferred_plan(
    cfg: &PluginConfig,
    req: &fleet_api::JobRequest,
    target: &str,
    why: &str,
) -> Result<ForwardPlan, String> {
    use fleet_api::deferred::{embed, shell_quote, Payload};
    if let Some(why) = cannot_leave(cfg, req) {
        return Err(why);
    }
    // It is written into the stand-in's script and AdminComment.
    if !fleet_api::options::valid_cluster_name(target) {
        return Err(format!("the view names cluster {target:?}, which is no cluster name"));
    }
    let url = cfg.metasched_url.as_deref().ok_or("fleet.conf names no MetaSchedulerUrl")?;
    let q = |p: &std::path::Path| shell_quote(&p.display().to_string());
    let id = new_fleet_id(&cfg.site);
    let head = format!(
        "#!/bin/sh\n# Fleet deferred stand-in of fleet job {id}, for cluster {target} ({why}).\n\
         # Slurm starts it when the job's dependencies, begin time and array throttle allow;\n\
         # the site agent then reads the request below from Slurm (never from this job)\n\
         # and forwards it. scancel cancels it at any time.\n\
         unset FLEET_JOB_TOKEN FLEET_JOB_TOKEN_FILE FLEET_JOB_ID FLEET_URL\n\
         exec {} --deferred --agent-socket {} --url {}{} --slurm-bin-dir {}{}\n",
        q(&cfg.proxy_path),
        q(&cfg.deferred_socket),
        shell_quote(url),
        cfg.ca_file.as_deref().map(|p| format!(" --ca-file {}", q(p))).unwrap_or_default(),
        q(&cfg.slurm_bin),
        fleet_api::sbatch::proxy_mail_args(req),
    );
    let admin_comment = format!(
        "deferred {} -> {target}: {}{}{}",
        cfg.site,
        fleet_api::placement::describe(req),
        req.time_limit_min.map(|t| format!(" time={t}m")).unwrap_or_default(),
        req.partition.as_deref().map(|p| format!(" partition={p}")).unwrap_or_default(),
    );
    let payload = Payload { fleet_job_id: id.clone(), target: target.to_string(), request: req.clone() };
    let proxy_script = embed(&head, &payload)?;
    if proxy_script.len() as u64 > cfg.slurm_max_script_size {
        return Err(format!(
            "its deferred stand-in would be {} bytes (the request rides in its script), over Slurm's \
             max_script_size={} (SchedulerParameters)",
            proxy_script.len(),
            cfg.slurm_max_script_size
        ));
    }
    Ok(ForwardPlan {
        comment: format!("fleet: {target} (deferred) {id}"),
        fleet_job_id: id,
        target: target.to_string(),
        proxy_partition: cfg.proxy_partition.clone(),
        proxy_script,
        admin_comment,
        proxy_mail: fleet_api::sbatch::proxy_mail_bits(req),
    })
}

impl FleetSubmit {
    /// A heterogeneous job is never split: each component stays local.
    /// One that the published view says this cluster cannot run is
    /// refused with the reason, rather than left pending forever.
    fn hetjob(
        &self,
        cfg: &PluginConfig,
        req: &fleet_api::JobRequest,
        offset: u64,
    ) -> (stats::Outcome, Result<(), Reject>) {
        match self.view.origin_verdict(cfg, req) {
            Some(Err(why)) => (
                stats::Outcome::Reject,
                Err(Reject {
                    code: sys::ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE as i32,
                    message: format!(
                        "fleet: heterogeneous job component {offset} cannot run at {} ({why}); a heterogeneous job is never split across clusters: submit the components as separate jobs to let Fleet place them",
                        cfg.site
                    ),
                }),
            ),
            _ => {
                log::verbose(&format!(
                    "job_submit/fleet: heterogeneous job component {offset} stays local (a hetjob is never split across clusters)"
                ));
                (stats::Outcome::Local, Ok(()))
            }
        }
    }
}

/// A stand-in's own time limit ([`rewrite`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StandInTime {
    /// None of its own, the proxy partition's: the stand-in lives as long
    /// as its job's run elsewhere, queue wait included.
    Proxy,
    /// Where slurm.conf enforces QOS and association limits: its job's
    /// `--time`, so that Slurm here accepts, holds or refuses it against a
    /// QOS's or association's `MaxWall` exactly as the job itself. Without
    /// `--time`, `default_time` (Slurm's minutes, `INFINITE` for
    /// `UNLIMITED`) where the job's partition here has a `DefaultTime`,
    /// which Slurm gives the job there (not in the proxy partition); else
    /// none, and Slurm gives it `MaxWall` as it gives a native job. Once it
    /// starts, its origin agent lifts its limit (the job's own runs at its
    /// target, counted from its start there: `track::confirm_starts`).
    Job { default_time: Option<u32> },
}

impl StandInTime {
    pub fn of(cfg: &PluginConfig, req: &fleet_api::JobRequest) -> Self {
        if !cfg.enforces_limits {
            return StandInTime::Proxy;
        }
        let implied = cfg.partition_limits.implied(req.partition.as_deref()).filter(|i| i.default_time);
        StandInTime::Job {
            default_time: implied.map(|i| match i.limit {
                config::TimeLimit::Minutes(m) => m,
                config::TimeLimit::Unlimited => slurm::INFINITE,
            }),
        }
    }
}

/// Turn the submission into the stand-in job: proxy partition, no GPUs,
/// one task on one node, the `fleet-proxy` script, Fleet's tag and the
/// original request in `admin_comment` (`fleet:<fleet_job_id> <summary>`,
/// which users cannot change). The user's `Comment`, output paths, work
/// dir, name, account, dependencies, begin time and mail settings are
/// kept, so the stand-in behaves at the origin the way the job would have.
///
/// Its own time limit is [`StandInTime`]'s.
pub fn rewrite(job: &mut JobDesc<'_>, plan: &ForwardPlan, time: StandInTime) {
    use slurm::{NO_VAL, NO_VAL16};
    job.set(StrField::Partition, Some(&plan.proxy_partition));
    for f in [
        StrField::TresPerJob,
        StrField::TresPerNode,
        StrField::TresPerTask,
        StrField::TresPerSocket,
        StrField::CpusPerTres,
        StrField::MemPerTres,
        StrField::TresBind,
        StrField::TresFreq,
        StrField::ReqNodes,
        StrField::ExcNodes,
        StrField::Features,
    ] {
        job.set(f, None);
    }
    job.set(StrField::Script, Some(&plan.proxy_script));
    job.set(StrField::AdminComment, Some(&fleet_api::wire::admin_tag(&plan.fleet_job_id, &plan.admin_comment)));
    // Where the job runs, for `squeue -O comment`, only when the user left
    // the comment empty: theirs is never replaced. (The agent's reconciler
    // still finds pending stand-ins by this comment; it should read the
    // tag in admin_comment instead, which is always there.)
    if job.get(StrField::Comment).is_none_or(|c| c.is_empty()) {
        job.set(StrField::Comment, Some(&plan.comment));
    }
    job.set_num(NumField::MinNodes, 1);
    job.set_num(NumField::MaxNodes, 1);
    job.set_num(NumField::NumTasks, 1);
    job.set_num(NumField::MinCpus, 1);
    job.set_num(NumField::CpusPerTask, 1);
    for f in [
        NumField::NtasksPerNode,
        NumField::NtasksPerSocket,
        NumField::NtasksPerCore,
        NumField::NtasksPerTres,
        NumField::SocketsPerNode,
        NumField::CoresPerSocket,
        NumField::ThreadsPerCore,
        NumField::PnMinCpus,
        NumField::Shared,
    ] {
        job.set_num(f, NO_VAL16.into());
    }
    job.set_num(NumField::Contiguous, 0);
    // Memory: a token amount; the real request travels with the job.
    job.set_num(NumField::PnMinMemory, 1);
    match time {
        StandInTime::Proxy => job.set_num(NumField::TimeLimit, NO_VAL.into()),
        StandInTime::Job { default_time: Some(t) } if job.num(NumField::TimeLimit) == u64::from(NO_VAL) => {
            job.set_num(NumField::TimeLimit, t.into())
        }
        StandInTime::Job { .. } => {}
    }
    job.set_num(NumField::TimeMin, NO_VAL.into());
    // With an explicit --mail-user the target mails the user (it carries
    // --mail-type, fleet_api::sbatch); the stand-in then sends none, so
    // that nobody gets each mail twice. Without one, the origin's mail
    // (to the submitting user) comes from the stand-in.
    if job.get(StrField::MailUser).is_some_and(|u| !u.is_empty()) {
        job.set_num(NumField::MailType, 0);
    } else if plan.proxy_mail != 0 {
        // The proxy sends these (BEGIN when the job starts at its target,
        // time-limit fractions of its run there), not Slurm for the
        // stand-in (fleet_api::sbatch::proxy_mail_bits).
        let bits = job.num(NumField::MailType);
        if bits != u64::from(NO_VAL16) {
            job.set_num(NumField::MailType, bits & !u64::from(plan.proxy_mail));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fini_waits_for_a_stuck_thread_only_so_long() {
        // A thread stuck as in an LDAP lookup: left, after the wait.
        let stuck = std::thread::Builder::new()
            .name("stuck".into())
            .spawn(|| std::thread::sleep(Duration::from_secs(3)))
            .unwrap();
        let t0 = Instant::now();
        join_within(stuck, Duration::from_millis(100));
        assert!(t0.elapsed() < Duration::from_millis(1000), "{:?}", t0.elapsed());
        // One that stops in time is joined.
        let quick = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(20)));
        join_within(quick, Duration::from_secs(5));
    }
    use slurm::job_desc::free_test_descriptor;

    fn plan() -> ForwardPlan {
        ForwardPlan {
            fleet_job_id: "beta-00ab12cd34ef".into(),
            target: "alpha".into(),
            proxy_partition: "fleet".into(),
            proxy_script: "#!/bin/sh\nexec fleet-proxy\n".into(),
            admin_comment: "forwarded beta -> alpha: gpu:h100:8 on 1 node(s)".into(),
            comment: "fleet: alpha (waiting) beta-00ab12cd34ef".into(),
            proxy_mail: 0,
        }
    }

    #[test]
    fn the_stand_in_keeps_the_users_comment_and_carries_fleets_tag_in_admin_comment() {
        let mut d = JobDesc::test_descriptor();
        {
            let mut jd = JobDesc::from_box(&mut d);
            jd.set(StrField::Comment, Some("my run 7"));
            jd.set(StrField::TresPerNode, Some("gres:gpu:h100:8"));
            jd.set(StrField::MailUser, Some("me@example.org"));
            jd.set_num(NumField::MailType, 3);
            rewrite(&mut jd, &plan(), StandInTime::Proxy);
            assert_eq!(jd.get(StrField::Comment).as_deref(), Some("my run 7"));
            let admin = jd.get(StrField::AdminComment).unwrap().into_owned();
            assert_eq!(admin, "fleet:beta-00ab12cd34ef forwarded beta -> alpha: gpu:h100:8 on 1 node(s)");
            assert_eq!(fleet_api::wire::parse_admin_tag(&admin), Some("beta-00ab12cd34ef"));
            assert_eq!(jd.get(StrField::Partition).as_deref(), Some("fleet"));
            assert_eq!(jd.get(StrField::TresPerNode), None);
            assert_eq!(jd.num(NumField::MailType), 0, "the target mails --mail-user; the stand-in does not");
        }
        free_test_descriptor(d);
        // Without a comment of the user's, the stand-in shows where it runs.
        // Without --mail-user the stand-in keeps the mail (to the submitting user).
        let mut d = JobDesc::test_descriptor();
        {
            let mut jd = JobDesc::from_box(&mut d);
            jd.set_num(NumField::MailType, 3);
            rewrite(&mut jd, &plan(), StandInTime::Proxy);
            assert_eq!(jd.num(NumField::MailType), 3);
            assert_eq!(jd.get(StrField::Comment).as_deref(), Some("fleet: alpha (waiting) beta-00ab12cd34ef"));
        }
        free_test_descriptor(d);
        // What the proxy mails (here BEGIN, TIME_LIMIT_80 and _50), Slurm
        // does not for the stand-in; END, TIME_LIMIT_90 (not the proxy's
        // here) and the rest stay.
        let mut d = JobDesc::test_descriptor();
        {
            let mut jd = JobDesc::from_box(&mut d);
            jd.set_num(NumField::MailType, 0b1110_0011);
            rewrite(&mut jd, &ForwardPlan { proxy_mail: 0b1100_0001, ..plan() }, StandInTime::Proxy);
            assert_eq!(jd.num(NumField::MailType), 0b0010_0010);
        }
        free_test_descriptor(d);
    }

    #[test]
    fn the_stand_in_keeps_the_jobs_time_limit_only_where_slurm_enforces_maxwall() {
        use StandInTime::*;
        let no = u64::from(slurm::NO_VAL);
        for (given, time, want) in [
            (90, Proxy, no),
            (90, Job { default_time: None }, 90),
            // Its own --time wins over its partition's DefaultTime.
            (90, Job { default_time: Some(5) }, 90),
            (no, Job { default_time: Some(5) }, 5),
            // None: Slurm gives it MaxWall, as a native job.
            (no, Job { default_time: None }, no),
            (no, Proxy, no),
        ] {
            let mut d = JobDesc::test_descriptor();
            {
                let mut jd = JobDesc::from_box(&mut d);
                jd.set_num(NumField::TimeLimit, given);
                jd.set_num(NumField::TimeMin, 30);
                rewrite(&mut jd, &plan(), time);
                assert_eq!(jd.num(NumField::TimeLimit), want, "{given} {time:?}");
                assert_eq!(jd.num(NumField::TimeMin), u64::from(slurm::NO_VAL));
            }
            free_test_descriptor(d);
        }
    }

    /// Which limit the stand-in keeps: its partition's DefaultTime only
    /// where Slurm enforces limits and the partition has one.
    #[test]
    fn a_stand_in_without_time_gets_its_partitions_default_time_where_limits_are_enforced() {
        let sc = slurm_conf::slurm::SlurmConf::parse_str(
            "NodeName=n1 CPUs=4\n\
             PartitionName=gpu Nodes=n1 Default=YES MaxTime=INFINITE\n\
             PartitionName=short Nodes=n1 DefaultTime=30 MaxTime=120\n\
             PartitionName=open Nodes=n1 DefaultTime=UNLIMITED\n",
            "slurm.conf",
        )
        .unwrap()
        .conf;
        let mut cfg = PluginConfig::for_tests("beta");
        cfg.partition_limits = config::PartitionLimits::from_conf(&sc);
        let of = |cfg: &PluginConfig, p: Option<&str>| {
            StandInTime::of(cfg, &fleet_api::JobRequest { partition: p.map(str::to_string), ..Default::default() })
        };
        assert_eq!(of(&cfg, Some("short")), StandInTime::Proxy, "limits not enforced");
        cfg.enforces_limits = true;
        assert_eq!(of(&cfg, Some("short")), StandInTime::Job { default_time: Some(30) });
        assert_eq!(of(&cfg, Some("open")), StandInTime::Job { default_time: Some(slurm::INFINITE) });
        assert_eq!(of(&cfg, None), StandInTime::Job { default_time: None });
        assert_eq!(of(&cfg, Some("nowhere")), StandInTime::Job { default_time: None });
    }

    #[test]
    fn a_deferred_stand_in_carries_the_whole_request_and_stays_an_array() {
        let mut cfg = PluginConfig::for_tests("beta");
        cfg.proxy_path = "/opt/it's/fleet-proxy".into();
        let req = fleet_api::JobRequest {
            origin: "beta".into(),
            user_id: 1001,
            is_array: true,
            script: Some(b"#!/bin/sh\nFLEET-DEFERRED-END\n\0echo $SLURM_ARRAY_TASK_ID\n".to_vec()),
            env: vec!["A=1".into()],
            ..Default::default()
        };
        let plan = deferred_plan(&cfg, &req, "alpha", "test").unwrap();
        assert!(plan.proxy_script.contains("exec '/opt/it'\\''s/fleet-proxy' --deferred --agent-socket"));
        let p = fleet_api::deferred::parse(plan.proxy_script.as_bytes()).unwrap();
        assert_eq!(
            (p.fleet_job_id.as_str(), p.target.as_str(), &p.request),
            (plan.fleet_job_id.as_str(), "alpha", &req)
        );
        assert!(plan.fleet_job_id.starts_with("beta-") && plan.fleet_job_id.len() == "beta-".len() + 12);
        assert_ne!(deferred_plan(&cfg, &req, "alpha", "t").unwrap().fleet_job_id, plan.fleet_job_id);
        // BEGIN mail: an array's stays Slurm's; a single job's proxy sends
        // it when the job begins at its target, unless a --mail-user gets it there.
        let with_mail = |is_array, mail_user: Option<&str>| {
            let r = fleet_api::JobRequest {
                is_array,
                mail_type: Some("BEGIN,END".into()),
                mail_user: mail_user.map(str::to_string),
                ..req.clone()
            };
            let plan = deferred_plan(&cfg, &r, "alpha", "t").unwrap();
            let flag = plan.proxy_script.lines().any(|l| l.starts_with("exec ") && l.ends_with(" --mail-type=BEGIN"));
            assert_eq!(flag, plan.proxy_mail == 1, "{}", plan.proxy_script);
            plan.proxy_mail
        };
        assert_eq!(with_mail(true, None), 0);
        assert_eq!(with_mail(false, None), 1);
        assert_eq!(with_mail(false, Some("me@example.org")), 0);
        let mut d = JobDesc::test_descriptor();
        {
            let mut jd = JobDesc::from_box(&mut d);
            jd.set(StrField::ArrayInx, Some("0-5%2"));
            jd.set(StrField::TresPerNode, Some("gres:gpu:h100:8"));
            rewrite(&mut jd, &plan, StandInTime::Proxy);
            assert_eq!(jd.get(StrField::ArrayInx).as_deref(), Some("0-5%2"), "the stand-in is the array");
            assert_eq!(jd.get(StrField::TresPerNode), None);
            let admin = jd.get(StrField::AdminComment).unwrap().into_owned();
            assert_eq!(fleet_api::wire::parse_admin_tag(&admin), Some(plan.fleet_job_id.as_str()));
        }
        free_test_descriptor(d);
        // What cannot leave is not deferred.
        let big = fleet_api::JobRequest { script: None, script_len: Some(9 << 20), ..req.clone() };
        assert!(deferred_plan(&cfg, &big, "alpha", "t").unwrap_err().contains("MaxScriptBytes"));
        // A stand-in Slurm would refuse after this hook (over its
        // max_script_size: the request rides in it) is not made.
        let env_heavy = fleet_api::JobRequest { env: vec![format!("BIG={}", "\"".repeat(3 << 20))], ..req.clone() };
        let e = deferred_plan(&cfg, &env_heavy, "alpha", "t").unwrap_err();
        assert!(e.contains("over Slurm's max_script_size=4194304"), "{e}");
        cfg.slurm_max_script_size = 64 << 20;
        assert!(deferred_plan(&cfg, &env_heavy, "alpha", "t").is_ok(), "a site that raised it");
        // A target that is no cluster name never reaches the script.
        let e = deferred_plan(&cfg, &req, "alpha\nrm -rf ~", "t").unwrap_err();
        assert!(e.contains("no cluster name"), "{e}");
        cfg.metasched_url = None;
        assert!(deferred_plan(&cfg, &req, "alpha", "t").unwrap_err().contains("MetaSchedulerUrl"));
    }
}

#[cfg(test)]
mod hook_tests {
    use super::*;
    use slurm::job_desc::free_test_descriptor;
    use std::time::Duration;

    fn view(free_a100: u32) -> String {
        let c = |name: &str, ty: &str, free: u32| {
            format!(
                r#"{{"name":"{name}","region":"r","provider":"onprem","scheduler":"slurm","healthy":true,"heartbeat_age_s":0.5,"queue_pending":0,"queue_running":0,"gpus":[{{"gpu_type":"{ty}","total":16,"free":{free},"max_per_node":8,"nodes":2}}]}}"#
            )
        };
        format!(r#"{{"generated_at":0,"clusters":[{},{}]}}"#, c("alpha", "h100", 16), c("beta", "a100", free_a100))
    }

    /// One `job_submit` of an sbatch job asking for `gres`: the outcome
    /// counters after it and the partition it ends in.
    fn submit(plugin: &FleetSubmit, gres: &str) -> (String, Option<String>) {
        let mut d = JobDesc::test_descriptor();
        let part = {
            let mut jd = JobDesc::from_box(&mut d);
            jd.set(StrField::Script, Some("#!/bin/sh\ntrue\n"));
            jd.set(StrField::TresPerNode, Some(gres));
            jd.set(StrField::Partition, Some("gpu"));
            jd.set_num(NumField::UserId, slurm::process_uid().into());
            assert_eq!(plugin.submit(&mut jd, slurm::process_uid()), Ok(()));
            jd.get(StrField::Partition).map(|p| p.into_owned())
        };
        free_test_descriptor(d);
        (plugin.stats.lock().unwrap().summary().unwrap(), part)
    }

    /// A site beta in `dir`: an agent spool (`dir/agent`) and fleet.conf
    /// (`dir/fleet.conf`); no agent serves the socket, a view ages out
    /// after 1 s.
    struct Site {
        spool: std::path::PathBuf,
        conf: std::path::PathBuf,
        sock: std::path::PathBuf,
    }

    impl Site {
        fn new(dir: &std::path::Path) -> Site {
            let site = Site { spool: dir.join("agent"), conf: dir.join("fleet.conf"), sock: dir.join("none.sock") };
            std::fs::create_dir_all(&site.spool).unwrap();
            site.write_conf("");
            site
        }

        /// fleet.conf, with `extra` lines.
        fn write_conf(&self, extra: &str) {
            let text = format!(
                "SiteName=beta\nMetaSchedulerUrl=https://m.example:8443\nAgentSocket={}\nAgentSpoolDir={}\nViewMaxAgeMs=1000\nForwardMode=deferred\n{extra}",
                self.sock.display(),
                self.spool.display()
            );
            std::fs::write(&self.conf, text).unwrap();
        }

        /// The agent publishes a view with `free` a100 GPUs at beta.
        fn publish(&self, free: u32) {
            let tmp = self.spool.join("view.json.tmp");
            std::fs::write(&tmp, view(free)).unwrap();
            std::fs::rename(&tmp, self.spool.join("view.json")).unwrap();
        }
    }

    #[test]
    fn jobs_that_stay_home_never_ask_the_agent_while_the_view_is_republished() {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::new(dir.path());
        let (spool, conf, publish) = (&site.spool, &site.conf, |free| site.publish(free));
        publish(16);
        serde_json::from_str::<fleet_api::api::FleetView>(&view(16)).expect("a view the agent would publish");
        std::env::set_var("FLEET_CONF", conf);
        let plugin = FleetSubmit::init().unwrap();
        let (line, part) = submit(&plugin, "gres:gpu:a100:1");
        assert!(line.contains(" local=1 ") && line.ends_with(" asked=0 remembered=0"), "{line}");
        assert_eq!(part.as_deref(), Some("gpu"));
        // That job taught the watcher its submitter's name (resolved off
        // the hook), which placement reads with ForwardMode=deferred.
        let me = slurm::process_uid();
        let t0 = std::time::Instant::now();
        while plugin.view.user_name(me).is_none() {
            assert!(t0.elapsed() < Duration::from_secs(5), "uid {me} was not resolved");
            std::thread::sleep(Duration::from_millis(10));
        }
        // The agent republishes the view (as every heartbeat) for longer
        // than ViewMaxAgeMs: the plugin's watcher keeps up, so the next
        // jobs are still answered from the view, without a round trip.
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(300));
            publish(16);
        }
        std::thread::sleep(view::POLL * 3);
        let (line, _) = submit(&plugin, "gres:gpu:a100:1");
        assert!(line.contains(" local=2 ") && line.ends_with(" asked=0 remembered=0"), "{line}");
        // A job the view sends away becomes a deferred stand-in, no round
        // trip; the agent's wake-up socket gets one datagram (here a test
        // socket stands in for the agent's).
        let wake = std::os::unix::net::UnixDatagram::bind(spool.join(slurm_conf::fleet::PICKUP_SOCKET)).unwrap();
        wake.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 16];
        assert!(wake.recv(&mut buf).is_err(), "nothing sent for the jobs that stayed home");
        let (line, part) = submit(&plugin, "gres:gpu:h100:8");
        assert!(line.contains(" deferred=1 ") && line.ends_with(" asked=0 remembered=0"), "{line}");
        assert_eq!(part.as_deref(), Some("fleet"));
        assert!(wake.recv(&mut buf).is_ok(), "the agent was woken");
        assert!(wake.recv(&mut buf).is_err(), "once");
        drop(wake);
        // No agent listening: the next deferred stand-in is made all the same.
        let (line, _) = submit(&plugin, "gres:gpu:h100:8");
        assert!(line.contains(" deferred=2 ") && line.ends_with(" asked=0 remembered=0"), "{line}");
        // Without fresh views (the agent stopped publishing) a job that
        // could leave asks the agent, which is not there: it stays (fail open).
        std::thread::sleep(Duration::from_millis(1100));
        let (line, part) = submit(&plugin, "gres:gpu:a100:1");
        assert!(line.contains(" failopen=1 ") && line.contains(" asked=1 remembered=0 ask_p50_us="), "{line}");
        assert_eq!(part.as_deref(), Some("gpu"));
        plugin.fini();
    }

    /// An agent that accepts and never answers costs one deadline, not one
    /// per submission: for `client::QUIET` after its timeout the plugin
    /// does not ask it (each job fails open at once).
    #[test]
    fn a_hung_agent_is_not_asked_again_until_the_quiet_interval_passes() {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::new(dir.path());
        site.write_conf("SubmitTimeoutMs=300\n");
        let listener = std::os::unix::net::UnixListener::bind(&site.sock).unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming().flatten() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(s); // never answered
            }
        });
        std::env::set_var("FLEET_CONF", &site.conf);
        let plugin = FleetSubmit::init().unwrap();
        // No view: a GPU job asks the agent.
        let t0 = std::time::Instant::now();
        let (line, part) = submit(&plugin, "gres:gpu:a100:1");
        assert!(t0.elapsed() >= Duration::from_millis(300), "the first waits the deadline");
        assert!(line.contains(" failopen=1 "), "{line}");
        assert_eq!(part.as_deref(), Some("gpu"));
        let t1 = std::time::Instant::now();
        for n in 2..=5 {
            let (line, _) = submit(&plugin, "gres:gpu:a100:1");
            assert!(line.contains(&format!(" failopen={n} ")), "{line}");
        }
        assert!(t1.elapsed() < Duration::from_millis(300), "four more at once: {:?}", t1.elapsed());
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "asked once");
        plugin.fini();
    }

    /// `(local, remembered)` of a stats line.
    fn local_remembered(line: &str) -> (u64, u64) {
        let field = |name: &str| {
            let v = line.split(' ').find_map(|w| w.strip_prefix(name)).unwrap_or_else(|| panic!("{name} in {line}"));
            v.parse::<u64>().unwrap()
        };
        (field("local="), field("remembered="))
    }

    #[test]
    fn a_shape_placed_home_is_remembered_for_that_view_and_fleet_conf_only() {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::new(dir.path());
        let (conf, publish, write_conf) = (&site.conf, |free| site.publish(free), |extra: &str| site.write_conf(extra));
        // The watcher has the view published last (it polls every POLL).
        let settle = || std::thread::sleep(view::POLL * 3);
        publish(16);
        std::env::set_var("FLEET_CONF", conf);
        let plugin = FleetSubmit::init().unwrap();
        let local = |gres: &str| {
            let (line, part) = submit(&plugin, gres);
            assert_eq!(part.as_deref(), Some("gpu"), "{gres} stays as submitted: {line}");
            local_remembered(&line)
        };
        // Placed once, then remembered; another shape is placed first.
        assert_eq!(local("gres:gpu:a100:1"), (1, 0));
        assert_eq!(local("gres:gpu:a100:1"), (2, 1));
        assert_eq!(local("gres:gpu:a100:2"), (3, 1));
        assert_eq!(local("gres:gpu:a100:2"), (4, 2));
        assert_eq!(local("gres:gpu:a100:1"), (5, 3));
        // A GPU type home does not have is never taken for a remembered shape.
        let (line, part) = submit(&plugin, "gres:gpu:h100:1");
        assert_eq!(part.as_deref(), Some("fleet"), "{line}");
        assert_eq!(local_remembered(&line), (5, 3));
        // A new view with beta's GPUs all busy: the shape is placed again
        // (it waits at home, the only a100 cluster), not remembered.
        publish(0);
        settle();
        assert_eq!(local("gres:gpu:a100:1"), (6, 3));
        assert_eq!(local("gres:gpu:a100:1"), (7, 3), "a shape that waits at home is not remembered");
        // Free again: placed once more under the new view, then remembered.
        publish(16);
        settle();
        assert_eq!(local("gres:gpu:a100:1"), (8, 3));
        assert_eq!(local("gres:gpu:a100:1"), (9, 4));
        // A changed fleet.conf (any change) starts the memo over.
        write_conf("# changed\n");
        let t0 = std::time::Instant::now();
        while plugin.config.get().1.is_none() {
            assert!(t0.elapsed() < Duration::from_secs(5), "the change was not seen");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(local("gres:gpu:a100:1"), (10, 4));
        assert_eq!(local("gres:gpu:a100:1"), (11, 5));
        // A view older than ViewMaxAgeMs answers nothing, remembered or
        // not: the job asks the agent (absent here: it stays, fail open).
        std::thread::sleep(Duration::from_millis(1100));
        let (line, part) = submit(&plugin, "gres:gpu:a100:1");
        assert_eq!(part.as_deref(), Some("gpu"));
        assert!(line.contains(" failopen=1 "), "{line}");
        assert_eq!(local_remembered(&line), (11, 5));
        plugin.fini();
    }
}
