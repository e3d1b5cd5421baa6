//! The fleet view as the agent last published it (`AgentSpoolDir/view.json`),
//! kept in memory by a watcher thread of the plugin.
//!
//! Only a "stays home" answer is taken from it; anything else goes to the
//! agent, which journals forwards. A missing, unreadable, stale (older than
//! `ViewMaxAgeMs`) or unparsable view simply means "ask the agent".
//!
//! The submit hook never reads or parses the file: it runs under
//! slurmctld's job and partition write locks, and the agent rewrites the
//! view every heartbeat, so a hook that parsed it on change paid a read and
//! a JSON parse about once a second, which set the LOCAL path's p99. The
//! watcher ([`ViewCache::start`]) stats the file every [`POLL`] and parses it
//! when its mtime or size changed; the hook takes the parsed view (an `Arc`)
//! under a mutex held for a pointer copy. Its age is judged from the mtime
//! of the copy it has, so a watcher that is behind only makes the view look
//! older (the job asks the agent), never fresher.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use fleet_api::api::FleetView;
use fleet_api::placement::{home_starts_now, origin_fits, origin_verdict, place, place_or_wait, Placement};
use fleet_api::JobRequest;

use crate::PluginConfig;

/// Largest view file read (a fleet of thousands of clusters fits).
const MAX_VIEW_BYTES: u64 = 8 << 20;

/// How often the watcher looks at the view file.
pub const POLL: Duration = Duration::from_millis(100);

/// A parsed view and the file it came from.
struct Loaded {
    path: PathBuf,
    mtime: SystemTime,
    len: u64,
    view: Arc<FleetView>,
}

/// Largest stand-ins list read (a million ids).
const MAX_STAND_INS_BYTES: u64 = 16 << 20;

/// The stand-ins list read from `path`.
struct StandIns {
    path: PathBuf,
    stamp: (SystemTime, u64),
    ids: Arc<std::collections::HashSet<u32>>,
}

/// Submitters' names, resolved by the watcher thread (NSS may block; the
/// hook never calls it): placement reads the name against each cluster's
/// published identities.
#[derive(Default)]
struct Names {
    known: std::collections::HashMap<u32, String>,
    /// Asked for by the hook, not resolved yet.
    wanted: std::collections::BTreeSet<u32>,
}

/// Most names kept (then the cache starts over) and most waiting.
const MAX_NAMES: usize = 100_000;
const MAX_WANTED: usize = 1024;

#[derive(Default)]
struct Shared {
    names: Mutex<Names>,
    /// The file to watch (from fleet.conf; the hook sets it when it changes).
    path: Mutex<Option<PathBuf>>,
    /// The last view parsed (`None`: no usable file).
    loaded: Mutex<Option<Loaded>>,
    /// The agent's list of the stand-ins here
    /// ([`fleet_api::wire::STAND_INS_FILE`] beside the view), as last read.
    stand_ins: Mutex<Option<StandIns>>,
    /// Set by [`ViewCache::stop`]; `wake` cuts the watcher's sleep short.
    stop: Mutex<bool>,
    wake: Condvar,
    /// The files the watcher could not read, and why: each logged once
    /// until it is read again or fails otherwise.
    read_errors: Mutex<Vec<(PathBuf, String)>>,
}

#[derive(Default)]
pub struct ViewCache {
    shared: Arc<Shared>,
    watcher: Mutex<Option<JoinHandle<()>>>,
    memo: Mutex<Memo>,
}

/// Shapes ([`crate::request::ShapeKey`]) that one view, with one
/// fleet.conf, placed home with their GPUs free: the same shape again,
/// while that view is held and fresh, is answered by comparing bytes
/// ([`ViewCache::remembered_home`]) instead of reading and placing it.
/// A new view or fleet.conf starts it over.
#[derive(Default)]
struct Memo {
    of: Option<(Arc<FleetView>, Arc<PluginConfig>)>,
    keys: Vec<Box<[u8]>>,
    /// The slot the next shape takes once [`MEMO_KEYS`] are kept.
    next: usize,
}

/// Shapes remembered per view (a site's GPU jobs come in a few shapes).
const MEMO_KEYS: usize = 16;

impl ViewCache {
    /// A cache watching `path` from a thread of its own, which reads it at
    /// once (so the first submissions have the view). [`stop`](Self::stop)
    /// must join it before the plugin is unloaded.
    pub fn start(path: PathBuf) -> Self {
        let cache = ViewCache::default();
        *lock(&cache.shared.path) = Some(path);
        cache.poll_once();
        let shared = cache.shared.clone();
        let spawned = std::thread::Builder::new().name("fleet-view".into()).spawn(move || watch(&shared));
        // Without the thread (none could be made) the view stays as read
        // now and ages out: every job that may leave then asks the agent.
        *lock(&cache.watcher) = spawned.ok();
        cache
    }

    /// Stops and joins the watcher (from the plugin's `fini`), waiting at
    /// most `STOP_WAIT` (1 s).
    pub fn stop(&self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(h) = lock(&self.watcher).take() {
            crate::join_within(h, crate::STOP_WAIT);
        }
    }

    /// One look at the file: parse it when it differs from the copy held.
    /// The watcher's loop body; tests call it directly.
    pub fn poll_once(&self) {
        poll(&self.shared);
    }

    /// The name of `uid` if the watcher has resolved it; otherwise `None`,
    /// and the watcher resolves it within a [`POLL`] (no I/O here).
    pub fn user_name(&self, uid: u32) -> Option<String> {
        let mut n = lock(&self.shared.names);
        if let Some(name) = n.known.get(&uid) {
            return Some(name.clone());
        }
        if n.wanted.len() < MAX_WANTED && n.wanted.insert(uid) {
            self.shared.wake.notify_all();
        }
        None
    }

    /// True when a fresh published view places `job` at its origin.
    pub fn stays_home(&self, cfg: &PluginConfig, job: &JobRequest) -> bool {
        self.with_view(cfg, |v| matches!(place(v, job).0, Placement::Home { .. })).unwrap_or(false)
    }

    /// True when a fresh published view says the origin can run `job` and
    /// has its GPUs free now ([`fleet_api::placement::home_starts_now`]):
    /// [`stays_home`](Self::stays_home)'s common case, for less work.
    /// With `key` (the job's [`crate::request::ShapeKey`]), a true answer
    /// is remembered for that view and `cfg`.
    pub fn home_starts_now(&self, cfg: &Arc<PluginConfig>, job: &JobRequest, key: Option<&[u8]>) -> bool {
        self.with_view_aged(cfg, false, |v, _| {
            let home = home_starts_now(v, job);
            if let (true, Some(key)) = (home, key) {
                self.remember(v, cfg, key);
            }
            home
        })
        .unwrap_or(false)
    }

    /// True when a job of shape `key` was placed home (with its GPUs free)
    /// by the view held now, still fresh, with this `cfg`: what
    /// [`home_starts_now`](Self::home_starts_now) would answer again.
    pub fn remembered_home(&self, cfg: &Arc<PluginConfig>, key: &[u8]) -> bool {
        let memo = lock(&self.memo);
        let Some((view, c)) = &memo.of else { return false };
        if !Arc::ptr_eq(c, cfg) || !memo.keys.iter().any(|k| **k == *key) {
            return false;
        }
        // The memo's view is the one held now (so read from `cfg.view_path`,
        // as it was when remembered) and still fresh. The memo's lock is
        // held: its view cannot be dropped and its address reused meanwhile
        // (the only place both locks are taken, in this order).
        let loaded = lock(&self.shared.loaded);
        loaded.as_ref().is_some_and(|l| Arc::ptr_eq(&l.view, view) && fresh(l.mtime, cfg))
    }

    fn remember(&self, view: &Arc<FleetView>, cfg: &Arc<PluginConfig>, key: &[u8]) {
        let mut memo = lock(&self.memo);
        if !memo.of.as_ref().is_some_and(|(v, c)| Arc::ptr_eq(v, view) && Arc::ptr_eq(c, cfg)) {
            *memo = Memo { of: Some((view.clone(), cfg.clone())), keys: Vec::with_capacity(MEMO_KEYS), next: 0 };
        }
        if memo.keys.iter().any(|k| **k == *key) {
            return;
        }
        if memo.keys.len() < MEMO_KEYS {
            memo.keys.push(key.into());
        } else {
            let i = memo.next;
            memo.keys[i] = key.into();
            memo.next = (i + 1) % MEMO_KEYS;
        }
    }

    /// The cluster the published view sends `job` to, when it must leave
    /// (`None`: it stays, cannot run anywhere, or there is no view). A
    /// view older than `ViewMaxAgeMs` (the agent is down) still answers for
    /// a job the origin cannot run at all by its node shapes, which do not
    /// age; the agent places the job again, on a fresh view, when it
    /// forwards it.
    pub fn leaving_to(&self, cfg: &PluginConfig, job: &JobRequest) -> Option<String> {
        self.with_view_aged(cfg, true, |v, fresh| match place_or_wait(v, job).0 {
            Placement::Remote { target, .. } if fresh || !origin_fits(v, job) => Some(target),
            _ => None,
        })
        .flatten()
    }

    /// True when the published view (fresh or not: node shapes do not
    /// age) says the origin cannot run `job` natively. False without a
    /// view or with the origin missing from it (Slurm judges alone).
    pub fn origin_cannot_run(&self, cfg: &PluginConfig, job: &JobRequest) -> bool {
        self.with_view_aged(cfg, true, |v, _| !origin_fits(v, job)).unwrap_or(false)
    }

    /// `Some(Err(why))` when a fresh view says the origin cannot run `job`
    /// natively; `Some(Ok)` when it can; `None` without a fresh view or
    /// with the origin missing from it (Slurm then judges alone).
    pub fn origin_verdict(&self, cfg: &PluginConfig, job: &JobRequest) -> Option<Result<(), String>> {
        self.with_view(cfg, |v| origin_verdict(v, job)).flatten()
    }

    fn with_view<T>(&self, cfg: &PluginConfig, f: impl FnOnce(&FleetView) -> T) -> Option<T> {
        self.with_view_aged(cfg, false, |v, _| f(v))
    }

    /// `f(view, fresh)`; a stale view only when `stale_too`. No I/O: the
    /// view is the watcher's copy (a fleet.conf that names another file
    /// is handed to the watcher, and answers "no view" until it read it).
    fn with_view_aged<T>(
        &self,
        cfg: &PluginConfig,
        stale_too: bool,
        f: impl FnOnce(&Arc<FleetView>, bool) -> T,
    ) -> Option<T> {
        let (mtime, view) = {
            let loaded = lock(&self.shared.loaded);
            match loaded.as_ref() {
                Some(l) if l.path == cfg.view_path => (l.mtime, l.view.clone()),
                _ => {
                    drop(loaded);
                    self.watch_path(&cfg.view_path);
                    return None;
                }
            }
        };
        let fresh = fresh(mtime, cfg);
        if !fresh && !stale_too {
            return None;
        }
        Some(f(&view, fresh))
    }

    /// Is job `id` one of this cluster's stand-ins, by the list the agent
    /// published beside `cfg`'s view? False without a list (Slurm then
    /// judges an update alone). The list is the agent's every few seconds:
    /// a stand-in made since is not in it yet. No I/O.
    pub fn is_stand_in(&self, cfg: &PluginConfig, id: u32) -> bool {
        let list = lock(&self.shared.stand_ins);
        list.as_ref().is_some_and(|l| l.path == stand_ins_path(&cfg.view_path) && l.ids.contains(&id))
    }

    /// Points the watcher at `path` when fleet.conf moved the view.
    fn watch_path(&self, path: &std::path::Path) {
        let mut p = lock(&self.shared.path);
        if p.as_deref() != Some(path) {
            *p = Some(path.to_path_buf());
            self.shared.wake.notify_all();
        }
    }
}

/// Is a view written at `mtime` young enough for `cfg` (`ViewMaxAgeMs`)?
fn fresh(mtime: SystemTime, cfg: &PluginConfig) -> bool {
    SystemTime::now().duration_since(mtime).unwrap_or_default() <= cfg.view_max_age
}

/// A cache dropped without [`ViewCache::stop`] (the plugin's `init` failed
/// half way) still stops its watcher: no thread of this library outlives
/// the plugin.
impl Drop for ViewCache {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A poisoned lock (a panic elsewhere while held; none is known) still
/// guards consistent data here: every critical section is a single store.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watcher thread: poll every [`POLL`] until stopped.
fn watch(shared: &Shared) {
    loop {
        poll(shared);
        let stop = lock(&shared.stop);
        if *stop {
            return;
        }
        let (stop, _) = shared.wake.wait_timeout(stop, POLL).unwrap_or_else(|e| e.into_inner());
        if *stop {
            return;
        }
    }
}

fn poll(shared: &Shared) {
    resolve_names(shared);
    poll_view(shared);
    poll_stand_ins(shared);
}

/// A file's modification time and length (`None`: no such file), which
/// tell the watcher whether to read it again.
fn stamp_of(path: &std::path::Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Reads `path`. A failure other than its absence (SlurmUser without the
/// right to read what the agent publishes, say) is logged once, until the
/// file is read again or fails otherwise: the plugin then asks the agent
/// about every job, and checks no update of a stand-in.
fn read_noting(shared: &Shared, path: &std::path::Path) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(bytes) => {
            lock(&shared.read_errors).retain(|(p, _)| p != path);
            Some(bytes)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            let why = e.to_string();
            let mut seen = lock(&shared.read_errors);
            if !seen.iter().any(|(p, w)| p == path && *w == why) {
                seen.retain(|(p, _)| p != path);
                seen.push((path.to_path_buf(), why.clone()));
                drop(seen);
                slurm::log::error(&format!(
                    "job_submit/fleet: cannot read {}: {why} (the agent lets SlurmUser read it through an ACL entry; \
                     until it can, every job asks the agent and stand-in updates are not checked)",
                    path.display()
                ));
            }
            None
        }
    }
}

/// The stand-ins list beside the view file `view`.
fn stand_ins_path(view: &std::path::Path) -> PathBuf {
    view.with_file_name(fleet_api::wire::STAND_INS_FILE)
}

/// Reads the stand-ins list again when it changed; lines that are no job
/// id are left out.
fn poll_stand_ins(shared: &Shared) {
    let Some(path) = lock(&shared.path).as_deref().map(stand_ins_path) else { return };
    let stamp = stamp_of(&path);
    let same = lock(&shared.stand_ins).as_ref().is_some_and(|l| l.path == path && Some(l.stamp) == stamp);
    if same {
        return;
    }
    let parsed = stamp.filter(|&(_, len)| len <= MAX_STAND_INS_BYTES).and_then(|stamp| {
        let text = String::from_utf8(read_noting(shared, &path)?).ok()?;
        let ids = text.lines().filter_map(|l| l.trim().parse::<u32>().ok()).collect();
        Some(StandIns { path: path.clone(), stamp, ids: Arc::new(ids) })
    });
    *lock(&shared.stand_ins) = parsed;
}

/// Resolve the names the hook asked for, outside its lock.
fn resolve_names(shared: &Shared) {
    let wanted = std::mem::take(&mut lock(&shared.names).wanted);
    for uid in wanted {
        // Each lookup may wait on NSS (LDAP): stop between them.
        if *lock(&shared.stop) {
            return;
        }
        if let Some(name) = slurm::user_name_of(uid) {
            let mut n = lock(&shared.names);
            if n.known.len() >= MAX_NAMES {
                n.known.clear();
            }
            n.known.insert(uid, name);
        }
    }
}

fn poll_view(shared: &Shared) {
    let Some(path) = lock(&shared.path).clone() else { return };
    let stamp = stamp_of(&path);
    let same = lock(&shared.loaded).as_ref().is_some_and(|l| l.path == path && Some((l.mtime, l.len)) == stamp);
    if same {
        return;
    }
    let parsed = stamp.filter(|&(_, len)| len <= MAX_VIEW_BYTES).and_then(|(mtime, len)| {
        let bytes = read_noting(shared, &path)?;
        let view = serde_json::from_slice::<FleetView>(&bytes).ok()?;
        Some(Loaded { path: path.clone(), mtime, len, view: Arc::new(view) })
    });
    *lock(&shared.loaded) = parsed;
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api::api::{ClusterSummary, GpuPool};
    use fleet_api::{GpuRequest, GpuScope};

    fn view() -> FleetView {
        let c = |name: &str, ty: &str| ClusterSummary {
            name: name.into(),
            healthy: true,
            gpus: vec![GpuPool {
                gpu_type: ty.into(),
                total: 16,
                free: 16,
                max_per_node: 8,
                nodes: 2,
                ..GpuPool::default()
            }],
            ..Default::default()
        };
        FleetView { generated_at: 0.0, clusters: vec![c("alpha", "h100"), c("beta", "a100")] }
    }

    fn job(ty: &str) -> JobRequest {
        JobRequest {
            origin: "beta".into(),
            gpus: vec![GpuRequest { gpu_type: Some(ty.into()), count: 4, scope: GpuScope::Node }],
            ..Default::default()
        }
    }

    #[test]
    fn home_jobs_answered_from_a_fresh_view_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = PluginConfig::for_tests("beta");
        cfg.view_path = dir.path().join("view.json");
        let cache = ViewCache::default();
        assert!(!cache.stays_home(&cfg, &job("a100")), "no view: ask the agent");
        std::fs::write(&cfg.view_path, serde_json::to_vec(&view()).unwrap()).unwrap();
        assert!(!cache.stays_home(&cfg, &job("a100")), "the hook never reads the file itself");
        cache.poll_once();
        assert!(cache.stays_home(&cfg, &job("a100")));
        assert!(!cache.stays_home(&cfg, &job("h100")), "leaving jobs go to the agent");
        assert_eq!(cache.leaving_to(&cfg, &job("h100")).as_deref(), Some("alpha"));
        assert_eq!(cache.leaving_to(&cfg, &job("a100")), None);
        cfg.view_max_age = Duration::ZERO;
        std::thread::sleep(Duration::from_millis(5));
        assert!(!cache.stays_home(&cfg, &job("a100")), "stale view: ask the agent");
        // A stale view still says that a job the origin cannot run leaves.
        assert_eq!(cache.leaving_to(&cfg, &job("h100")).as_deref(), Some("alpha"));
        cfg.view_max_age = Duration::from_secs(10);
        std::fs::write(&cfg.view_path, b"{ not json").unwrap();
        cache.poll_once();
        assert!(!cache.stays_home(&cfg, &job("a100")), "garbage view: ask the agent");
        // Another file named by a reloaded fleet.conf: no answer until read.
        std::fs::write(dir.path().join("other.json"), serde_json::to_vec(&view()).unwrap()).unwrap();
        cfg.view_path = dir.path().join("other.json");
        assert!(!cache.stays_home(&cfg, &job("a100")));
        cache.poll_once();
        assert!(cache.stays_home(&cfg, &job("a100")));
    }

    /// The agent's stand-ins list beside the view: read by the watcher,
    /// again when it changes, dropped when it goes; one beside another
    /// view path does not answer for this one.
    #[test]
    fn stand_ins_come_from_the_agents_list_beside_the_view() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = PluginConfig::for_tests("beta");
        cfg.view_path = dir.path().join("view.json");
        let cache = ViewCache::start(cfg.view_path.clone());
        cache.stop();
        assert!(!cache.is_stand_in(&cfg, 7), "no list");
        let list = dir.path().join(fleet_api::wire::STAND_INS_FILE);
        std::fs::write(&list, "7\n9\nnot-an-id\n").unwrap();
        assert!(!cache.is_stand_in(&cfg, 7), "the hook never reads the file itself");
        cache.poll_once();
        assert!(cache.is_stand_in(&cfg, 7) && cache.is_stand_in(&cfg, 9));
        assert!(!cache.is_stand_in(&cfg, 8));
        std::fs::write(&list, "8\n").unwrap();
        let f = std::fs::File::options().write(true).open(&list).unwrap();
        f.set_modified(SystemTime::now() + Duration::from_secs(1)).unwrap();
        cache.poll_once();
        assert!(cache.is_stand_in(&cfg, 8) && !cache.is_stand_in(&cfg, 7));
        let mut other = cfg.clone();
        other.view_path = dir.path().join("elsewhere").join("view.json");
        assert!(!cache.is_stand_in(&other, 8), "another agent's list");
        std::fs::remove_file(&list).unwrap();
        cache.poll_once();
        assert!(!cache.is_stand_in(&cfg, 8), "a removed list");
    }

    /// A published file the watcher cannot read (here a directory in its
    /// place; in a site, SlurmUser without the ACL entry) is noted once,
    /// and forgotten once it reads again.
    #[test]
    fn a_file_that_cannot_be_read_is_noted_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("view.json");
        let shared = Shared::default();
        assert_eq!(read_noting(&shared, &path), None);
        assert!(lock(&shared.read_errors).is_empty(), "a missing file is no error");
        std::fs::create_dir(&path).unwrap();
        for _ in 0..3 {
            assert_eq!(read_noting(&shared, &path), None);
        }
        let noted = lock(&shared.read_errors).clone();
        assert_eq!(noted.len(), 1, "{noted:?}");
        assert_eq!(noted[0].0, path);
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, "{}").unwrap();
        assert_eq!(read_noting(&shared, &path).as_deref(), Some(&b"{}"[..]));
        assert!(lock(&shared.read_errors).is_empty());
    }

    #[test]
    fn the_watcher_follows_the_file_and_stops_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = PluginConfig::for_tests("beta");
        cfg.view_path = dir.path().join("view.json");
        let cache = ViewCache::start(cfg.view_path.clone());
        assert!(!cache.stays_home(&cfg, &job("a100")), "no file yet");
        // Written the way the agent publishes it: a new file renamed over.
        let tmp = dir.path().join("view.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&view()).unwrap()).unwrap();
        std::fs::rename(&tmp, &cfg.view_path).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while !cache.stays_home(&cfg, &job("a100")) {
            assert!(std::time::Instant::now() < until, "the watcher never read the view");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Gone: the watcher drops it.
        std::fs::remove_file(&cfg.view_path).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while cache.stays_home(&cfg, &job("a100")) {
            assert!(std::time::Instant::now() < until, "the watcher kept a removed view");
            std::thread::sleep(Duration::from_millis(10));
        }
        let t = std::time::Instant::now();
        cache.stop();
        assert!(t.elapsed() < POLL * 5, "stop waited {:?}", t.elapsed());
        assert!(lock(&cache.watcher).is_none(), "joined");
    }
}
