//! The plugin's view of `fleet.conf`, read at `init()` and again whenever
//! the file changes.
//!
//! `fleet.conf` sits beside slurm.conf: the directory of `$SLURM_CONF`
//! (slurmctld's environment), else `/etc/slurm`. `$FLEET_CONF` overrides.
//!
//! Slurm 22.05 re-inits job_submit plugins at `scontrol reconfigure` only
//! when `JobSubmitPlugins` itself changed (`job_submit_plugin_reconfig`),
//! so a plugin that read fleet.conf in `init()` alone would keep the old
//! file until slurmctld restarts. [`LiveConfig`] instead reads it again
//! when it changed: the next submission after an edit uses it, with or
//! without `scontrol reconfigure`; Slurm releases that re-init plugins at
//! reconfigure (23.11 on: slurmctld restarts itself) read it at `init()`
//! as before. A changed file that does not load is logged once and the
//! last good settings are kept.
//!
//! Noticing the change costs the submit hook no system call: a watcher
//! thread ([`Watcher`]) waits on inotify for fleet.conf's directory (a
//! write, a rename over it, a removal) and bumps a generation counter the
//! hook compares with one atomic load; only then does the hook `stat` the
//! file (inode, size, mtime) and read it if it changed. In slurmctld's
//! cold caches a `stat` per submission cost 8–16 µs, the largest single
//! part of the LOCAL path (`benches/hook.rs`, `local, cold caches`). The
//! watcher also `stat`s the file itself every [`BACKSTOP`], for what
//! inotify on the directory does not see (fleet.conf a symbolic link
//! whose target is edited, a directory above it swapped); without inotify
//! (no instance left for the user, no directory) or without the thread,
//! the hook `stat`s on every submission, as job_submit/lua does with its
//! script.
//!
//! A few settings come from slurm.conf (`$SLURM_CONF`, else beside
//! fleet.conf): `max_script_size`, `AccountingStorageEnforce` and each
//! partition's `DefaultTime` and `MaxTime` ([`PartitionLimits`]). They are
//! read with fleet.conf, and again when slurm.conf changes (its identity is
//! part of the [`Stamp`]; in fleet.conf's directory, as Slurm keeps them,
//! inotify sees the edit, elsewhere the watcher's backstop). A partition
//! changed with `scontrol update` alone is not seen.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

pub use slurm_conf::slurm::TimeLimit;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    pub site: String,
    pub socket: PathBuf,
    pub timeout: Duration,
    pub fail_open: bool,
    pub max_script_bytes: u64,
    /// The fleet view the agent publishes (`AgentSpoolDir/view.json`).
    pub view_path: PathBuf,
    pub view_max_age: Duration,
    /// `ProxyPartition`: only stand-ins may be in it.
    pub proxy_partition: String,
    /// `ForwardMode=deferred` (the default): a job that must leave always
    /// becomes a deferred stand-in, without asking the agent.
    pub always_defer: bool,
    /// What a deferred stand-in's script runs: `ProxyPath`, the agent's
    /// deferred socket (`AgentSpoolDir/deferred.sock`), `MetaSchedulerUrl`
    /// (none: nothing is deferred), `MetaSchedulerCaFile`, `SlurmBinDir`.
    pub proxy_path: PathBuf,
    pub deferred_socket: PathBuf,
    /// The agent's wake-up socket (`AgentSpoolDir/pickup.sock`): one
    /// datagram per deferred stand-in, never waited on.
    pub pickup_socket: PathBuf,
    pub metasched_url: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub slurm_bin: PathBuf,
    /// Slurm's `max_script_size` (slurm.conf `SchedulerParameters`; 4 MiB
    /// by default): the largest stand-in script slurmctld accepts.
    pub slurm_max_script_size: u64,
    /// slurm.conf's `AccountingStorageEnforce` applies QOS and association
    /// limits (`limits`, `qos`, `safe` or `all`): a stand-in then keeps its
    /// job's time limit, so that Slurm here judges it against its QOS's
    /// and association's `MaxWall` as it judges a native job (see
    /// [`crate::rewrite`]).
    pub enforces_limits: bool,
    /// What each partition here gives a job without `--time` (slurm.conf):
    /// a forwarded job takes that to its target, as it would have had it
    /// here.
    pub partition_limits: PartitionLimits,
}

/// Each partition's `DefaultTime` and `MaxTime` as slurm.conf sets them,
/// and the default partition: the limit Slurm gives a job that asks for
/// none ([`PartitionLimits::implied`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionLimits {
    parts: Vec<(String, Option<TimeLimit>, Option<TimeLimit>)>,
    default: Option<String>,
}

/// The time limit a job without `--time` gets in its partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImpliedLimit {
    pub limit: TimeLimit,
    /// From the partition's `DefaultTime` (else its `MaxTime`, which a
    /// QOS's or association's `MaxWall` lowers where limits are enforced).
    pub default_time: bool,
}

impl PartitionLimits {
    pub fn from_conf(sc: &slurm_conf::slurm::SlurmConf) -> Self {
        PartitionLimits {
            parts: sc.partitions.iter().map(|p| (p.name.clone(), p.default_time, p.max_time)).collect(),
            default: sc.default_partition().map(|p| p.name.clone()),
        }
    }

    /// What Slurm 22.05 gives a job without `--time` submitted to
    /// `partition` (a list `a,b`: the first one defined here, whose limits
    /// Slurm shows while the job pends; none: the default partition): its
    /// `DefaultTime`, else its `MaxTime` (`UNLIMITED` where slurm.conf sets
    /// none). `None` where the partition is not in slurm.conf.
    pub fn implied(&self, partition: Option<&str>) -> Option<ImpliedLimit> {
        let name = match partition {
            Some(list) => list.split(',').map(str::trim).find(|n| self.parts.iter().any(|p| p.0 == *n))?,
            None => self.default.as_deref()?,
        };
        let (_, default_time, max_time) = self.parts.iter().find(|p| p.0 == name)?;
        Some(match default_time {
            Some(t) => ImpliedLimit { limit: *t, default_time: true },
            None => ImpliedLimit { limit: max_time.unwrap_or(TimeLimit::Unlimited), default_time: false },
        })
    }
}

/// Slurm's default `max_script_size` (slurm.conf(5)).
pub const DEFAULT_MAX_SCRIPT_SIZE: u64 = 4 << 20;

/// `max_script_size` of slurm.conf's (last) `SchedulerParameters`, else
/// Slurm's default.
pub fn max_script_size(slurm_conf: &slurm_conf::raw::Parsed) -> u64 {
    slurm_conf
        .entries
        .iter()
        .filter_map(|e| e.get("SchedulerParameters"))
        .next_back()
        .and_then(|v| v.split(',').find_map(|p| p.trim().strip_prefix("max_script_size=")?.parse().ok()))
        .unwrap_or(DEFAULT_MAX_SCRIPT_SIZE)
}

/// Whether slurm.conf's (last) `AccountingStorageEnforce` makes slurmctld
/// apply QOS or association limits (a `MaxWall` among them) to jobs.
pub fn enforces_limits(slurm_conf: &slurm_conf::raw::Parsed) -> bool {
    slurm_conf
        .entries
        .iter()
        .filter_map(|e| e.get("AccountingStorageEnforce"))
        .next_back()
        .is_some_and(slurm_conf::slurm::enforces_limits)
}

/// slurm.conf: `$SLURM_CONF`, else beside fleet.conf.
fn slurm_conf_path(fleet_conf: &Path) -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| fleet_conf.parent().unwrap_or(Path::new("/etc/slurm")).join("slurm.conf"))
}

/// Where fleet.conf is looked for.
pub fn conf_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLEET_CONF") {
        return PathBuf::from(p);
    }
    let dir = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("/etc/slurm"));
    dir.join("fleet.conf")
}

impl PluginConfig {
    /// Reads `path`: the settings and the file's warnings.
    pub fn load_from(path: &Path) -> Result<(Self, Vec<String>), String> {
        Self::load_with(path, &slurm_conf_path(path))
    }

    /// [`load_from`](Self::load_from) with slurm.conf at `slurm_conf`.
    pub fn load_with(path: &Path, slurm_conf: &Path) -> Result<(Self, Vec<String>), String> {
        let loaded = slurm_conf::fleet::FleetConf::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut cfg = Self::from_conf(&loaded.conf);
        // Read with fleet.conf (never per submission); unreadable: Slurm's default.
        let mut lines: Vec<String> = loaded.warnings.iter().map(|w| w.to_string()).collect();
        if let Ok(parsed) = slurm_conf::raw::load_file(slurm_conf) {
            cfg.slurm_max_script_size = max_script_size(&parsed);
            cfg.enforces_limits = enforces_limits(&parsed);
            match slurm_conf::slurm::SlurmConf::from_parsed(parsed) {
                Ok(sc) => cfg.partition_limits = PartitionLimits::from_conf(&sc.conf),
                Err(e) => lines.push(format!(
                    "{}: partitions not read ({e}); a forwarded job without --time gets its target's default limit, not this cluster's",
                    slurm_conf.display()
                )),
            }
        }
        Ok((cfg, lines))
    }

    /// One line for slurmctld's log.
    pub fn describe(&self) -> String {
        format!(
            "site {} agent {} deadline {} ms fail-open {} forward {}{}",
            self.site,
            self.socket.display(),
            self.timeout.as_millis(),
            self.fail_open,
            if self.always_defer { "deferred" } else { "sync (deferred when the agent does not answer)" },
            if self.enforces_limits {
                "; stand-ins keep their job's time limit until they start (MaxWall)"
            } else {
                ""
            }
        )
    }

    pub fn from_conf(c: &slurm_conf::fleet::FleetConf) -> Self {
        PluginConfig {
            site: c.site_name.clone(),
            socket: c.agent_socket.clone(),
            timeout: Duration::from_millis(c.submit_timeout_ms.into()),
            fail_open: c.fail_open,
            max_script_bytes: c.max_script_bytes,
            view_path: c.agent_spool_dir.join("view.json"),
            view_max_age: Duration::from_millis(c.view_max_age_ms),
            proxy_partition: c.proxy_partition.clone(),
            always_defer: c.forward_mode == slurm_conf::fleet::ForwardMode::Deferred,
            proxy_path: c.proxy_path.clone(),
            deferred_socket: c.agent_spool_dir.join(fleet_api::wire::DEFERRED_SOCKET),
            pickup_socket: c.agent_spool_dir.join(slurm_conf::fleet::PICKUP_SOCKET),
            metasched_url: c.meta_scheduler_url.clone(),
            ca_file: c.meta_scheduler_ca_file.clone(),
            slurm_bin: c.slurm_bin_dir.clone(),
            slurm_max_script_size: DEFAULT_MAX_SCRIPT_SIZE,
            enforces_limits: false,
            partition_limits: PartitionLimits::default(),
        }
    }

    pub fn for_tests(site: &str) -> Self {
        PluginConfig {
            site: site.into(),
            socket: PathBuf::from("/nonexistent/agent.sock"),
            timeout: Duration::from_millis(50),
            fail_open: true,
            max_script_bytes: 1 << 20,
            view_path: PathBuf::from("/nonexistent/view.json"),
            view_max_age: Duration::from_secs(10),
            proxy_partition: "fleet".into(),
            always_defer: false,
            proxy_path: PathBuf::from("/usr/libexec/fleet/fleet-proxy"),
            deferred_socket: PathBuf::from("/var/spool/fleet/deferred.sock"),
            pickup_socket: PathBuf::from("/nonexistent/pickup.sock"),
            metasched_url: Some("https://meta.example:16900".into()),
            ca_file: None,
            slurm_bin: PathBuf::from("/usr/bin"),
            slurm_max_script_size: DEFAULT_MAX_SCRIPT_SIZE,
            enforces_limits: false,
            partition_limits: PartitionLimits::default(),
        }
    }
}

/// A file's identity: a rewrite in place changes mtime or size, a
/// replacement by rename the inode.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileId {
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
}

fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(FileId { ino: m.ino(), len: m.len(), mtime: m.modified().ok() })
}

/// fleet.conf's identity, and slurm.conf's: the settings read from it
/// (partitions' limits, `AccountingStorageEnforce`, `max_script_size`) are
/// read again with fleet.conf when either changes. `None`: no fleet.conf.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    fleet: FileId,
    slurm: Option<FileId>,
}

fn stamp(path: &Path, slurm_conf: &Path) -> Option<Stamp> {
    Some(Stamp { fleet: file_id(path)?, slurm: file_id(slurm_conf) })
}

/// fleet.conf as last read, read again when the file changes.
pub struct LiveConfig {
    path: PathBuf,
    /// slurm.conf, read with it.
    slurm_conf: PathBuf,
    // std Mutex: held for a stat() at most, never across the agent round trip.
    inner: Mutex<Live>,
    /// `None`: no watcher, the file is `stat`ed on every call.
    watcher: Option<Watcher>,
}

struct Live {
    /// `None` until fleet.conf first loads (missing or broken at start).
    cfg: Option<Arc<PluginConfig>>,
    stamp: Option<Stamp>,
    /// The stamp of a changed file that did not load, `Some(None)` for a
    /// file gone (said once each).
    failed: Option<Option<Stamp>>,
    /// The watcher's generation when the file was last looked at.
    seen: u64,
}

/// What a look at fleet.conf found, for slurmctld's log.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Read again; the lines to log (the new settings, the file's warnings).
    Reloaded(Vec<String>),
    /// Changed but unusable: the error (once per change); the old settings stay.
    Failed(String),
}

impl LiveConfig {
    /// Reads `path` and starts its [`Watcher`]. A file that does not load
    /// (missing, broken) is `Err` beside the live config, which has no
    /// settings until the file loads: slurmctld runs `init` once, so the
    /// plugin must pick up a fleet.conf written after it started.
    pub fn load(path: &Path) -> (Self, Result<Vec<String>, String>) {
        Self::load_watched(path, true)
    }

    /// [`load`](Self::load), with or without the watcher (tests compare both).
    pub fn load_watched(path: &Path, watch: bool) -> (Self, Result<Vec<String>, String>) {
        Self::load_beside(path, &slurm_conf_path(path), watch)
    }

    /// [`load_watched`](Self::load_watched) with slurm.conf at `slurm_conf`.
    pub fn load_beside(path: &Path, slurm_conf: &Path, watch: bool) -> (Self, Result<Vec<String>, String>) {
        // Watching first: a change between the read and the watch's start
        // is then seen (a generation after the one the read is stamped with).
        let watcher = if watch { Watcher::start(path, slurm_conf) } else { None };
        let seen = watcher.as_ref().map_or(0, Watcher::generation);
        let st = stamp(path, slurm_conf);
        let (cfg, failed, read) = match PluginConfig::load_with(path, slurm_conf) {
            Ok((cfg, warnings)) => (Some(Arc::new(cfg)), None, Ok(warnings)),
            Err(e) => (None, Some(st.clone()), Err(e)),
        };
        let live = Live { cfg, stamp: st, failed, seen };
        let (path, slurm_conf) = (path.to_path_buf(), slurm_conf.to_path_buf());
        (LiveConfig { path, slurm_conf, inner: Mutex::new(live), watcher }, read)
    }

    /// Whether a watcher spares the hook its `stat` (false: one per call).
    pub fn watched(&self) -> bool {
        self.watcher.as_ref().is_some_and(Watcher::alive)
    }

    /// The settings for this submission, read again first when the file
    /// changed since the last look.
    pub fn get(&self) -> (Option<Arc<PluginConfig>>, Option<Change>) {
        // A panic under the lock elsewhere (none is known) leaves the
        // settings as they were: keep serving them.
        let mut live = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = self.watcher.as_ref().filter(|w| w.alive()) {
            // Taken before the stat: a change after it bumps it again.
            let generation = w.generation();
            if generation == live.seen {
                return (live.cfg.clone(), None);
            }
            live.seen = generation;
        }
        let st = stamp(&self.path, &self.slurm_conf);
        if st == live.stamp || live.failed.as_ref() == Some(&st) {
            return (live.cfg.clone(), None);
        }
        match PluginConfig::load_with(&self.path, &self.slurm_conf) {
            Ok((cfg, mut lines)) => {
                lines.insert(0, format!("fleet.conf {} changed: {}", self.path.display(), cfg.describe()));
                live.cfg = Some(Arc::new(cfg));
                live.stamp = st;
                live.failed = None;
                (live.cfg.clone(), Some(Change::Reloaded(lines)))
            }
            Err(e) => {
                live.failed = Some(st);
                let keeping = if live.cfg.is_some() {
                    "keeping the settings read before"
                } else {
                    "still passing every job through untouched"
                };
                (live.cfg.clone(), Some(Change::Failed(format!("{e}; {keeping}"))))
            }
        }
    }

    /// Stops and joins the watcher (the plugin's `fini`: no thread of this
    /// library outlives it).
    pub fn stop(&self) {
        if let Some(w) = &self.watcher {
            w.stop();
        }
    }
}

/// How often the watcher `stat`s fleet.conf itself, whatever inotify says.
pub const BACKSTOP: Duration = Duration::from_secs(1);

/// How long the watcher waits on inotify at a time: the most [`Watcher::stop`] waits.
const WAIT: Duration = Duration::from_millis(100);

/// What the hook and the watcher thread share.
#[derive(Default)]
struct WatchShared {
    /// Bumped whenever fleet.conf may have changed.
    generation: AtomicU64,
    /// Cleared when the thread ends by itself (the directory went away):
    /// the hook then `stat`s on every call.
    alive: AtomicBool,
    stop: AtomicBool,
}

/// A thread waiting on inotify for fleet.conf's directory; see the module
/// documentation.
pub struct Watcher {
    shared: Arc<WatchShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Watcher {
    /// `None` when inotify or the thread is not available.
    fn start(path: &Path, slurm_conf: &Path) -> Option<Watcher> {
        use rustix::fs::inotify;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).ok()?;
        let mask = inotify::WatchFlags::CLOSE_WRITE
            | inotify::WatchFlags::MODIFY
            | inotify::WatchFlags::ATTRIB
            | inotify::WatchFlags::CREATE
            | inotify::WatchFlags::DELETE
            | inotify::WatchFlags::MOVED_FROM
            | inotify::WatchFlags::MOVED_TO
            | inotify::WatchFlags::DELETE_SELF
            | inotify::WatchFlags::MOVE_SELF
            | inotify::WatchFlags::ONLYDIR;
        inotify::add_watch(&fd, dir, mask).ok()?;
        let shared = Arc::new(WatchShared { alive: AtomicBool::new(true), ..WatchShared::default() });
        // Stamped before the thread runs: a change made before it first
        // looks is a change for its backstop too.
        let first = stamp(path, slurm_conf);
        let (s, p, sc) = (shared.clone(), path.to_path_buf(), slurm_conf.to_path_buf());
        let thread =
            std::thread::Builder::new().name("fleet-conf".into()).spawn(move || watch(&s, &fd, &p, &sc, first)).ok()?;
        Some(Watcher { shared, thread: Mutex::new(Some(thread)) })
    }

    fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    fn alive(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire)
    }

    /// Stops and joins the thread (within [`WAIT`]).
    fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            crate::join_within(t, crate::STOP_WAIT);
        }
    }
}

/// A watcher dropped without [`Watcher::stop`] (the plugin's `init` failed
/// half way) still stops its thread.
impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The watcher thread: every inotify event on the directory bumps the
/// generation; so does a changed [`stamp`] at each [`BACKSTOP`].
fn watch(shared: &WatchShared, fd: &rustix::fd::OwnedFd, path: &Path, slurm_conf: &Path, first: Option<Stamp>) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let bump = || shared.generation.fetch_add(1, Ordering::AcqRel);
    let wait = Timespec { tv_sec: 0, tv_nsec: WAIT.as_nanos() as _ };
    let mut last = first;
    let mut looked = Instant::now();
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    while !shared.stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        let ready = poll(&mut fds, Some(&wait)).unwrap_or(0) > 0;
        if ready {
            // Drain the queue (non-blocking: it ends on EAGAIN); the events'
            // names are not read: any change in the directory costs the
            // hook one stat. IN_IGNORED: the watch is gone.
            let mut gone = false;
            let mut events = rustix::fs::inotify::Reader::new(fd, &mut buf);
            while let Ok(e) = events.next() {
                gone |= e.events().contains(rustix::fs::inotify::ReadFlags::IGNORED);
            }
            bump();
            if gone {
                // The directory itself went away (removed, unmounted): no
                // more events will come; the hook stats on every call.
                shared.alive.store(false, Ordering::Release);
                return;
            }
        }
        if ready || looked.elapsed() >= BACKSTOP {
            let now = stamp(path, slurm_conf);
            if now != last && !ready {
                bump();
            }
            last = now;
            looked = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurms_enforcement_of_qos_and_association_limits_is_read() {
        let of = |text: &str| enforces_limits(&slurm_conf::raw::parse_str(text, "slurm.conf"));
        assert!(!of(""));
        assert!(!of("AccountingStorageEnforce=associations,wckeys\n"));
        assert!(!of("AccountingStorageEnforce=nojobs\n"));
        for v in ["limits", "associations,limits,qos", "QOS", "safe", "all"] {
            assert!(of(&format!("AccountingStorageEnforce={v}\n")), "{v}");
        }
        assert!(!of("AccountingStorageEnforce=qos\naccountingstorageenforce=associations\n"), "the last one counts");
    }

    #[test]
    fn slurms_max_script_size_is_read_from_scheduler_parameters() {
        let of = |text: &str| max_script_size(&slurm_conf::raw::parse_str(text, "slurm.conf"));
        assert_eq!(of("ClusterName=beta\n"), DEFAULT_MAX_SCRIPT_SIZE);
        assert_eq!(of("SchedulerParameters=batch_sched_delay=0,max_script_size=10485760\n"), 10 << 20);
        // The last line wins, as in Slurm; a bad number is Slurm's default.
        assert_eq!(of("SchedulerParameters=max_script_size=1\nschedulerparameters=bf_interval=30\n"), 4 << 20);
        assert_eq!(of("SchedulerParameters=max_script_size=lots\n"), DEFAULT_MAX_SCRIPT_SIZE);
    }

    #[test]
    fn a_job_without_time_gets_its_partitions_default_time_else_its_max_time() {
        let limits = |text: &str| {
            PartitionLimits::from_conf(&slurm_conf::slurm::SlurmConf::parse_str(text, "slurm.conf").unwrap().conf)
        };
        let l = limits(
            "NodeName=n[1-2] CPUs=4\n\
             PartitionName=DEFAULT MaxTime=1-00:00:00\n\
             PartitionName=gpu Nodes=n1 Default=YES DefaultTime=4:00:00\n\
             PartitionName=long Nodes=n2 MaxTime=UNLIMITED\n\
             PartitionName=day Nodes=n2\n",
        );
        let got = |p: Option<&str>| l.implied(p).map(|i| (i.limit, i.default_time));
        assert_eq!(got(None), Some((TimeLimit::Minutes(240), true)));
        assert_eq!(got(Some("gpu")), Some((TimeLimit::Minutes(240), true)));
        assert_eq!(got(Some("long")), Some((TimeLimit::Unlimited, false)));
        assert_eq!(got(Some("day")), Some((TimeLimit::Minutes(1440), false)), "DEFAULT's MaxTime");
        // A list: the first partition defined here, as Slurm shows it pending.
        assert_eq!(got(Some("day,gpu")), Some((TimeLimit::Minutes(1440), false)));
        assert_eq!(got(Some("gone, gpu")), Some((TimeLimit::Minutes(240), true)));
        assert_eq!(got(Some("gone")), None);
        // No MaxTime anywhere: Slurm's UNLIMITED; no default partition: none.
        let l = limits("NodeName=n1 CPUs=4\nPartitionName=p Nodes=n1\n");
        assert_eq!(l.implied(Some("p")).map(|i| i.limit), Some(TimeLimit::Unlimited));
        assert_eq!(l.implied(None), None);
    }

    /// slurm.conf's partition limits are read with fleet.conf, and again
    /// when slurm.conf changes (beside it, as Slurm keeps them).
    #[test]
    fn partition_limits_are_read_from_slurm_conf_and_again_when_it_changes() {
        for watched in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("fleet.conf");
            std::fs::write(&path, conf("beta", 50)).unwrap();
            let sc = dir.path().join("slurm.conf");
            let part = |default_time: &str| {
                format!("NodeName=n1 CPUs=4\nPartitionName=gpu Nodes=n1 Default=YES DefaultTime={default_time}\n")
            };
            std::fs::write(&sc, part("30")).unwrap();
            let (live, read) = LiveConfig::load_beside(&path, &sc, watched);
            read.unwrap();
            let minutes = |c: &PluginConfig| c.partition_limits.implied(None).map(|i| i.limit);
            assert_eq!(minutes(&live.get().0.unwrap()), Some(TimeLimit::Minutes(30)));
            std::fs::write(&sc, part("45")).unwrap();
            let (c, change) = next_change(&live);
            assert!(matches!(change, Some(Change::Reloaded(_))), "watched {watched}: {change:?}");
            assert_eq!(minutes(&c), Some(TimeLimit::Minutes(45)));
            // One slurm.conf cannot be read: said, and none implied.
            std::fs::write(&sc, "PartitionName=gpu Nodes=n1 DefaultTime=soon\n").unwrap();
            let (c, change) = next_change(&live);
            assert!(
                matches!(&change, Some(Change::Reloaded(l)) if l.iter().any(|l| l.contains("partitions not read"))),
                "{change:?}"
            );
            assert_eq!(minutes(&c), None);
            live.stop();
        }
    }

    fn conf(site: &str, timeout_ms: u32) -> String {
        format!(
            "SiteName={site}\nMetaSchedulerUrl=https://m.example:8443\nAgentTokenFile=/etc/slurm/t\nSubmitTimeoutMs={timeout_ms}\n"
        )
    }

    /// `live.get()` until it reports a change (at once without a watcher;
    /// with one, once its thread saw the event: well within 5 s).
    fn next_change(live: &LiveConfig) -> (Arc<PluginConfig>, Option<Change>) {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let got = live.get();
            if got.1.is_some() || !live.watched() || Instant::now() > until {
                return (got.0.expect("settings"), got.1);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_changed_fleet_conf_is_read_again_and_a_broken_one_ignored() {
        for watched in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("fleet.conf");
            std::fs::write(&path, conf("beta", 50)).unwrap();
            let (live, read) = LiveConfig::load_watched(&path, watched);
            read.unwrap();
            assert_eq!(live.watched(), watched);
            let (c, change) = live.get();
            let c = c.unwrap();
            assert_eq!((c.site.as_str(), c.timeout, change), ("beta", Duration::from_millis(50), None));

            std::fs::write(&path, conf("beta", 75)).unwrap();
            let (c, change) = next_change(&live);
            assert_eq!(c.timeout, Duration::from_millis(75), "watched {watched}");
            assert!(matches!(&change, Some(Change::Reloaded(l)) if l[0].contains("deadline 75 ms")), "{change:?}");
            // Unchanged: no new line.
            assert_eq!(live.get().1, None);

            // A half-written file: said once, the last good settings kept.
            std::fs::write(&path, "SiteName=beta\nSubmitTimeoutMs=fast\n").unwrap();
            let (c, change) = next_change(&live);
            assert_eq!(c.timeout, Duration::from_millis(75));
            assert!(matches!(&change, Some(Change::Failed(e)) if e.contains("fleet.conf")), "{change:?}");
            assert_eq!(live.get(), (Some(c.clone()), None));
            // Gone (an editor's rename in flight): the last good settings.
            std::fs::remove_file(&path).unwrap();
            let (c, change) = next_change(&live);
            assert_eq!(c.timeout, Duration::from_millis(75));
            assert!(matches!(&change, Some(Change::Failed(e)) if e.contains("fleet.conf")), "{change:?}");
            assert_eq!(live.get().1, None, "said once");

            // Written whole again, replaced by rename.
            let tmp = dir.path().join("fleet.conf.new");
            std::fs::write(&tmp, conf("beta", 20)).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
            let (c, change) = next_change(&live);
            assert_eq!(c.timeout, Duration::from_millis(20));
            assert!(matches!(change, Some(Change::Reloaded(_))));
            live.stop();
        }
    }

    /// slurmctld calls `init` once: a fleet.conf missing or broken then
    /// is read once it is written whole, with or without the watcher.
    #[test]
    fn a_fleet_conf_missing_at_start_is_read_once_written() {
        for watched in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("fleet.conf");
            let (live, read) = LiveConfig::load_watched(&path, watched);
            assert!(read.unwrap_err().contains("fleet.conf"), "names the file");
            assert_eq!(live.get(), (None, None), "no settings, nothing new");
            std::fs::write(&path, "SiteName=beta\nSubmitTimeoutMs=fast\n").unwrap();
            let (c, change) = {
                let until = Instant::now() + Duration::from_secs(5);
                loop {
                    let got = live.get();
                    if got.1.is_some() || Instant::now() > until {
                        break got;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            };
            assert!(c.is_none());
            assert!(
                matches!(&change, Some(Change::Failed(e)) if e.contains("still passing every job through")),
                "{change:?}"
            );
            std::fs::write(&path, conf("beta", 40)).unwrap();
            let (c, change) = next_change(&live);
            assert_eq!(c.timeout, Duration::from_millis(40), "watched {watched}");
            assert!(matches!(change, Some(Change::Reloaded(_))), "{change:?}");
            live.stop();
        }
    }

    /// The watcher spares the hook its stat, and still sees what inotify
    /// on the directory cannot: a symbolic link's target edited elsewhere
    /// (its backstop stat). Its directory removed, the hook stats again.
    #[test]
    fn the_watcher_sees_edits_through_a_symlink_and_stops_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join("fleet.conf");
        std::fs::write(&target, conf("beta", 50)).unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        let path = etc.join("fleet.conf");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let (live, read) = LiveConfig::load(&path);
        read.unwrap();
        assert!(live.watched());
        std::fs::write(&target, conf("beta", 60)).unwrap();
        let t = Instant::now();
        let (c, change) = next_change(&live);
        assert!(matches!(change, Some(Change::Reloaded(_))), "never seen");
        assert_eq!(c.timeout, Duration::from_millis(60));
        assert!(t.elapsed() < BACKSTOP * 3, "seen after {:?}", t.elapsed());

        // The directory goes: the watcher ends, the hook stats every call.
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_dir(&etc).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while live.watched() {
            assert!(Instant::now() < until, "the watcher kept watching a removed directory");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(&path, conf("beta", 70)).unwrap();
        assert_eq!(live.get().0.unwrap().timeout, Duration::from_millis(70), "read at once, stat per call");

        let (live, _) = LiveConfig::load(&path);
        let t = Instant::now();
        live.stop();
        assert!(t.elapsed() < WAIT * 5, "stop waited {:?}", t.elapsed());
    }
}
