//! The in-job lease (docs/failover.md, "The in-job lease"): the part of a
//! run that lives inside its allocation at the target and stops the run
//! when the meta-scheduler no longer vouches for it, so that a job never
//! has two running copies even when its old cluster's agent *and*
//! slurmctld are dead (only slurmd and the job's own processes survive).
//!
//! The target's agent submits the job with a first line that makes
//! `fleet-ckpt lease-exec` its interpreter (the user's script itself lies in
//! the run's private directory, `FLEET_JOB_SCRIPT`). `lease-exec` obtains
//! the run's first job lease, starts the watchdog (`lease-watch`, detached:
//! not a child of the job's shell, so a `wait` in the script never waits
//! for it), then `exec`s the script's own interpreter: the batch process
//! *is* the job's script, with its environment, exit code, signals and
//! output untouched.
//!
//! The watchdog renews the lease (`POST /v1/jobs/{id}/lease` with the
//! run's epoch and its checkpoint token) every quarter of the lease. It
//! stops the run (its whole process tree and the rest of its Slurm job's
//! cgroup: SIGTERM, then SIGKILL) when the answer is "stale", or when no
//! grant covers the present any more. Each grant counts from when its
//! request was *sent* (the watchdog's own monotonic clock: no clock sync
//! with the meta-scheduler), and the meta-scheduler never grants past the
//! moment the job could move elsewhere less a margin, so the old run is
//! dead before the new one is placed.
//!
//! [`Watch`] is the rule, pure (the caller passes the time).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleet_api::api::JobLeaseReply;

/// The state of one run's lease.
#[derive(Debug)]
pub struct Watch {
    lease: Duration,
    /// The run may go on until then (the end of the latest grant).
    deadline: Instant,
}

/// The shortest pause between two renewals of one run's lease.
pub const MIN_RENEWAL: Duration = Duration::from_millis(250);

/// What the watchdog must do after a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on (the grant, if any, is recorded).
    Go,
    /// The meta-scheduler grants no job leases: leave the run alone.
    Off,
    /// Stop the run now, for this reason.
    Stop(String),
}

impl Watch {
    /// A run whose first grant of `valid` was asked for at `sent`.
    pub fn new(lease: Duration, sent: Instant, valid: Duration) -> Watch {
        Watch { lease, deadline: sent + valid }
    }

    /// How often the lease is renewed: a quarter of it (0.5 s to 10 s),
    /// so that three renewals in a row may fail before it runs out.
    pub fn renew_every(&self) -> Duration {
        (self.lease / 4).clamp(Duration::from_millis(500), Duration::from_secs(10))
    }

    /// When to renew next, at `now`: every [`Watch::renew_every`], but
    /// before half of what is left of the grant held has passed, so that a
    /// short grant (the meta-scheduler shortens them while the run's
    /// cluster is silent: it must stop before its job could move) is
    /// renewed while it still covers the run, once the cluster is back.
    /// Never more often than every [`MIN_RENEWAL`].
    pub fn next_renewal(&self, now: Instant) -> Duration {
        self.renew_every().min(self.left(now) / 2).max(MIN_RENEWAL)
    }

    /// The answer to the renewal sent at `sent`. A grant never shortens
    /// one already held: each ends before the job could move.
    pub fn on_reply(&mut self, sent: Instant, r: &JobLeaseReply) -> Verdict {
        if r.stale {
            return Verdict::Stop(format!("this run is stale: {}", r.reason));
        }
        if r.off {
            return Verdict::Off;
        }
        let valid = Duration::from_millis(r.valid_ms.min(self.lease.as_millis() as u64));
        self.deadline = self.deadline.max(sent + valid);
        Verdict::Go
    }

    /// `Some(why)` once no grant covers `now`.
    pub fn expired(&self, now: Instant) -> Option<String> {
        (now >= self.deadline).then(|| {
            format!("its job lease ran out ({} ms without a renewal from the meta-scheduler)", self.lease.as_millis())
        })
    }

    /// Time left on the lease at `now` (zero when it has run out).
    pub fn left(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now)
    }
}

/// The pause before `lease-exec` asks again after a "wait" (a job placed
/// early whose origin has not confirmed the stand-in). The meta-scheduler
/// holds a wait answer back (up to 0.8 s) and answers as soon as the gate
/// opens, so this is no polling interval, only a breather.
pub const WAIT_POLL: Duration = Duration::from_millis(50);

/// What `lease-exec` does after an answer to its first lease request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum First {
    /// Granted for this long (from when the request was sent): start.
    Start(Duration),
    /// Job leases are off: start without a watchdog.
    Off,
    /// Never start the script, for this reason.
    Refuse(String),
    /// Ask again after this long.
    AskAgain(Duration),
}

/// The rule of the first lease, pure (the caller passes the time). A run
/// asks for a whole lease's length; a "wait" (the job was placed early,
/// its origin has not confirmed the stand-in) is not a refusal: the run
/// keeps asking, often, for as long as the meta-scheduler says so (it
/// bounds the wait and then answers "stale"), and gives up only a whole
/// lease after the last answer it got.
#[derive(Debug)]
pub struct FirstLease {
    lease: Duration,
    deadline: Instant,
    last: String,
}

impl FirstLease {
    pub fn new(lease: Duration, t0: Instant) -> FirstLease {
        FirstLease { lease, deadline: t0 + lease, last: String::new() }
    }

    /// The answer `r` came at `now`.
    pub fn on_reply(&mut self, now: Instant, r: &JobLeaseReply) -> First {
        if r.stale {
            return First::Refuse(format!("this run is stale: {}", r.reason));
        }
        if r.off {
            return First::Off;
        }
        if r.valid_ms > 0 {
            return First::Start(Duration::from_millis(r.valid_ms).min(self.lease));
        }
        self.last = r.reason.clone();
        if r.wait {
            self.deadline = now + self.lease;
            return First::AskAgain(WAIT_POLL);
        }
        self.again(now)
    }

    /// The request failed at `now` (`e`: why).
    pub fn on_error(&mut self, now: Instant, e: String) -> First {
        self.last = e;
        self.again(now)
    }

    fn again(&self, now: Instant) -> First {
        if now >= self.deadline {
            return First::Refuse(format!(
                "no job lease from the meta-scheduler within {} ms ({})",
                self.lease.as_millis(),
                self.last
            ));
        }
        First::AskAgain(Duration::from_secs(1).min(self.deadline - now))
    }
}

/// What the watchdog needs, from the job's environment (set by the agent).
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseEnv {
    pub job_id: String,
    pub epoch: u64,
    pub lease: Duration,
    pub metasched: String,
    pub token_file: PathBuf,
    pub ca_file: Option<PathBuf>,
}

impl LeaseEnv {
    /// `None`: no lease for this run (`FLEET_JOB_LEASE_MS` absent or 0).
    /// A lease asked for without the means to renew it is an error.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<LeaseEnv>> {
        use anyhow::Context;
        let Some(ms) = get("FLEET_JOB_LEASE_MS") else { return Ok(None) };
        let ms: u64 = ms.trim().parse().with_context(|| format!("FLEET_JOB_LEASE_MS = {ms:?} is not a number"))?;
        if ms == 0 {
            return Ok(None);
        }
        if !(1000..=3_600_000).contains(&ms) {
            anyhow::bail!("FLEET_JOB_LEASE_MS = {ms} must be in [1000, 3600000]");
        }
        let need = |k: &str| get(k).filter(|v| !v.is_empty()).with_context(|| format!("{k} is not set"));
        let epoch = need("FLEET_EPOCH")?;
        let epoch = epoch.parse().with_context(|| format!("FLEET_EPOCH = {epoch:?} is not a number"))?;
        let job_id = need("FLEET_JOB_ID")?;
        if job_id.len() > 128 || !job_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            anyhow::bail!("FLEET_JOB_ID = {job_id:?} is not a fleet job id");
        }
        Ok(Some(LeaseEnv {
            job_id,
            epoch,
            lease: Duration::from_millis(ms),
            metasched: need("FLEET_METASCHED_URL")?,
            token_file: need("FLEET_CKPT_TOKEN_FILE")?.into(),
            ca_file: get("FLEET_METASCHED_CA").filter(|v| !v.is_empty()).map(PathBuf::from),
        }))
    }
}

/// The HTTP client of a run's renewals (one for the watchdog's life:
/// one TLS session, not a handshake per renewal).
pub fn client(env: &LeaseEnv) -> anyhow::Result<reqwest::Client> {
    use anyhow::Context;
    let mut b = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
    if let Some(ca) = &env.ca_file {
        let pem = fleet_api::client::read_ca_bundle(ca).map_err(|e| anyhow::anyhow!(e))?;
        for c in reqwest::Certificate::from_pem_bundle(&pem).context("reading the CA bundle")? {
            b = b.add_root_certificate(c);
        }
    }
    Ok(b.build()?)
}

/// One renewal, bounded by `timeout`.
pub async fn renew(http: &reqwest::Client, env: &LeaseEnv, timeout: Duration) -> anyhow::Result<JobLeaseReply> {
    use anyhow::Context;
    let token = crate::read_token_file(&env.token_file)?;
    let url = format!("{}/v1/jobs/{}/lease", env.metasched.trim_end_matches('/'), env.job_id);
    let body = fleet_api::api::JobLeaseRequest { epoch: env.epoch, lease_ms: env.lease.as_millis() as u64 };
    let resp = http
        .post(&url)
        .timeout(timeout)
        .header(reqwest::header::AUTHORIZATION, format!("{} {token}", fleet_api::auth::CKPT_TOKEN_SCHEME))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = resp.status();
    let bytes = resp.bytes().await.with_context(|| format!("POST {url}: reading the reply"))?;
    // The job is gone from the meta-scheduler, or its token is spent at
    // this cluster: this run does not count.
    if status == reqwest::StatusCode::NOT_FOUND || status == reqwest::StatusCode::FORBIDDEN {
        let msg = serde_json::from_slice::<fleet_api::api::ApiError>(&bytes).map(|e| e.error).unwrap_or_default();
        return Ok(JobLeaseReply { stale: true, reason: format!("{status}: {msg}"), ..JobLeaseReply::default() });
    }
    if !status.is_success() {
        anyhow::bail!(
            "POST {url}: {status}: {}",
            String::from_utf8_lossy(&bytes).chars().take(300).collect::<String>()
        );
    }
    serde_json::from_slice(&bytes).with_context(|| format!("POST {url}: the reply is not a lease"))
}

/// The interpreter line of a script: `#!/bin/bash -l` → (`/bin/bash`,
/// `Some("-l")`), as the kernel reads it (one optional argument: the rest
/// of the line).
pub fn shebang(script: &[u8]) -> Option<(String, Option<String>)> {
    let line = script.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let line = std::str::from_utf8(line).ok()?.trim_matches(|c: char| c == ' ' || c == '\t' || c == '\r');
    let (interp, arg) = match line.find([' ', '\t']) {
        Some(i) => (&line[..i], Some(line[i..].trim_matches([' ', '\t']).to_string()).filter(|a| !a.is_empty())),
        None => (line, None),
    };
    (!interp.is_empty()).then(|| (interp.to_string(), arg))
}

/// `(ppid, start time in clock ticks, uid)` of `pid`, from `/proc`.
pub fn proc_info(proc_root: &Path, pid: i32) -> Option<(i32, u64, u32)> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // The command name may hold anything, ')' included: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ppid = f.get(1)?.parse().ok()?;
    let start = f.get(19)?.parse().ok()?;
    let status = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()?;
    Some((ppid, start, uid))
}

/// `root` and every process descending from it.
pub fn tree(proc_root: &Path, root: i32) -> BTreeSet<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(proc_root) {
        for e in rd.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
                if let Some((ppid, _, _)) = proc_info(proc_root, pid) {
                    children.entry(ppid).or_default().push(pid);
                }
            }
        }
    }
    let mut out = BTreeSet::from([root]);
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if out.insert(c) {
                todo.push(c);
            }
        }
    }
    out
}

/// The processes of `pid`'s Slurm job by its cgroup (`.../job_<id>/...`,
/// every step: srun's tasks are not descendants of the batch script),
/// under cgroup v2 or any v1 hierarchy. Empty when not in a job cgroup.
pub fn job_cgroup_pids(proc_root: &Path, cgroup_root: &Path, pid: i32) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    let Ok(text) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")) else { return out };
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let segs: Vec<&str> = path.split('/').collect();
        let Some(i) = segs.iter().position(|s| s.starts_with("job_") && s[4..].bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let rel = segs[..=i].join("/");
        let rel = rel.trim_start_matches('/');
        let base = if ctrl.is_empty() {
            cgroup_root.join(rel)
        } else {
            cgroup_root.join(ctrl.split(',').next().unwrap_or(ctrl).trim_start_matches("name=")).join(rel)
        };
        collect_procs(&base, &mut out, 0);
    }
    out
}

fn collect_procs(dir: &Path, out: &mut BTreeSet<i32>, depth: u32) {
    if depth > 8 {
        return;
    }
    if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_procs(&e.path(), out, depth + 1);
            }
        }
    }
}

/// The variable naming the run's own writable directory, where the
/// watchdog keeps its log (`.fleet-lease.log`) and leaves its note that
/// the lease stopped the run (`.fleet-lease-stopped`), which `lease-exec`
/// reads before it reports an end. Unset: the directory of the job's script
/// (`FLEET_JOB_SCRIPT`), the run's private directory at a Slurm target. In a
/// pod that directory is a read-only ConfigMap volume: the Kubernetes
/// target's agent mounts an emptyDir and names it here.
pub const DIR_VAR: &str = "FLEET_LEASE_DIR";

/// The variable naming the container's termination message file
/// (`terminationMessagePath`, set by a Kubernetes target's agent): the
/// watchdog writes its stop line there too, so that the pod's status says
/// why its container ended when the log relay missed the line.
pub const TERMINATION_VAR: &str = "FLEET_TERMINATION_LOG";

/// How the watchdog's line (on the job's stderr and in the termination
/// message) starts; the agents recognise it.
pub const STOP_LINE: &str = "fleet: stopping this run of job ";

/// The watchdog's one line on a stopped run: `STOP_LINE` + the job's id.
pub fn stop_line(job_id: &str, why: &str) -> String {
    format!("{STOP_LINE}{job_id} at this cluster: {why}")
}

/// The run's writable directory ([`DIR_VAR`], an absolute path, else the
/// script's directory), from the environment as `var` reads it.
pub fn run_dir(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    var(DIR_VAR)
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| var("FLEET_JOB_SCRIPT").and_then(|s| Path::new(&s).parent().map(Path::to_path_buf)))
}

/// The variable (set by a Kubernetes target's agent) that says the run is
/// a pod's container whose PID namespace is the pod's own
/// (`shareProcessNamespace`): `FLEET_LEASE_SCOPE=pod`.
pub const SCOPE_VAR: &str = "FLEET_LEASE_SCOPE";

/// The inode of the kernel's initial PID namespace (`PROC_PID_INIT_INO`,
/// include/linux/proc_ns.h): a host's, never a pod's.
const INITIAL_PID_NS: &str = "pid:[4026531836]";

/// The PID namespace of `pid` (`pid:[<inode>]`), as `/proc` shows it.
fn pid_ns(proc_root: &Path, pid: &str) -> Option<String> {
    std::fs::read_link(proc_root.join(pid).join("ns/pid")).ok().and_then(|l| l.to_str().map(str::to_string))
}

/// The processes of a pod's PID namespace, when `me` (the watchdog) runs in
/// one that is not the host's: every live process in `me`'s own PID
/// namespace but its init (the pod's `pause`, PID 1 there) and `me`. With
/// `shareProcessNamespace`, a process the job double-forks (a daemon) is
/// re-parented to that init, out of the job's process tree, and a pod has
/// no Slurm job cgroup: the namespace is what holds all of the run. Empty
/// in the host's namespace (never sweep a host) or when it cannot be read.
pub fn pod_namespace_pids(proc_root: &Path, me: i32) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    let Some(own) = pid_ns(proc_root, &me.to_string()).filter(|ns| ns != INITIAL_PID_NS) else { return out };
    let Ok(rd) = std::fs::read_dir(proc_root) else { return out };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if pid == me || pid_ns(proc_root, &pid.to_string()).as_deref() != Some(own.as_str()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else { continue };
        // Its number inside the namespace (the last of NSpid: the /proc may
        // be the host's); 1 is the namespace's init. A zombie is dead.
        let ns_pid = status.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|l| l.split_whitespace().last());
        let zombie = status.lines().find_map(|l| l.strip_prefix("State:")).is_some_and(|s| s.trim().starts_with('Z'));
        if ns_pid.is_some_and(|n| n != "1") && !zombie {
            out.insert(pid);
        }
    }
    out
}

/// Every process of the run: `root`'s tree and its Slurm job's cgroup —
/// in a pod (`FLEET_LEASE_SCOPE=pod`), every process of its PID namespace
/// instead of the cgroup —, owned by `uid` (the job's user: nothing else
/// can be signalled anyway), the watchdog itself excluded.
pub fn run_processes(root: i32, uid: u32) -> BTreeSet<i32> {
    let proc_root = Path::new("/proc");
    let me = std::process::id() as i32;
    let mut all = tree(proc_root, root);
    if std::env::var(SCOPE_VAR).is_ok_and(|v| v == "pod") {
        all.extend(pod_namespace_pids(proc_root, me));
    } else {
        all.extend(job_cgroup_pids(proc_root, Path::new("/sys/fs/cgroup"), root));
    }
    all.into_iter().filter(|&p| p != me && p > 1 && proc_info(proc_root, p).is_some_and(|(_, _, u)| u == uid)).collect()
}

/// Stops the run: SIGTERM to every process of it (SIGCONT too, for a
/// stopped one), then SIGKILL to whatever is left after `grace`. With
/// `spare_root`, all of it but `root` (a `lease-exec` whose script
/// already ended on its own, still reporting that end: it exits by itself).
pub fn stop_run(root: i32, uid: u32, grace: Duration, spare_root: bool) {
    let procs = || {
        let mut all = run_processes(root, uid);
        if spare_root {
            all.remove(&root);
        }
        all
    };
    let pids = procs();
    for &p in &pids {
        // SAFETY: kill(2) with a pid and a signal number; no memory involved.
        unsafe {
            libc::kill(p, libc::SIGTERM);
            libc::kill(p, libc::SIGCONT);
        }
    }
    let t0 = Instant::now();
    while t0.elapsed() < grace && !procs().is_empty() {
        std::thread::sleep(Duration::from_millis(100));
    }
    for p in procs().into_iter().chain(pids) {
        // SAFETY: as above.
        unsafe {
            libc::kill(p, libc::SIGKILL);
        }
    }
}

/// The soft limits a target agent passes to the run for `lease-exec` to
/// set (`FLEET_RLIMIT_<NAME>`, in bytes): those sudo cannot hand the
/// target's sbatch, which reads its own: a stack above 8 MiB (the kernel
/// resets it for a setuid program) and the core size (sudo sets 0).
pub const HOME_LIMITS: [(&str, libc::__rlimit_resource_t); 2] =
    [("FLEET_RLIMIT_STACK", libc::RLIMIT_STACK), ("FLEET_RLIMIT_CORE", libc::RLIMIT_CORE)];

/// The [`HOME_LIMITS`] set in the environment `get` reads, as numbers.
pub fn home_limits(get: impl Fn(&str) -> Option<String>) -> Vec<(libc::__rlimit_resource_t, u64)> {
    HOME_LIMITS.iter().filter_map(|(name, r)| Some((*r, get(name)?.trim().parse().ok()?))).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_home_limits_are_read_from_the_environment() {
        let env = |k: &str| match k {
            "FLEET_RLIMIT_STACK" => Some("18446744073709551615".to_string()),
            "FLEET_RLIMIT_CORE" => Some("lots".to_string()),
            _ => None,
        };
        assert_eq!(super::home_limits(env), [(libc::RLIMIT_STACK, libc::RLIM_INFINITY)]);
        assert!(super::home_limits(|_| None).is_empty());
    }

    use super::*;

    fn reply(valid_ms: u64) -> JobLeaseReply {
        JobLeaseReply { valid_ms, ..JobLeaseReply::default() }
    }

    #[test]
    fn the_runs_directory_is_the_named_one_else_the_scripts() {
        let check = |vars: &[(&str, &str)], want: Option<&str>| {
            let got = run_dir(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()));
            assert_eq!(got.as_deref(), want.map(Path::new), "{vars:?}");
        };
        check(&[("FLEET_JOB_SCRIPT", "/spool/jobs/beta-1/.fleet-script")], Some("/spool/jobs/beta-1"));
        check(&[("FLEET_LEASE_DIR", "/fleet/run"), ("FLEET_JOB_SCRIPT", "/fleet/job/entry")], Some("/fleet/run"));
        // A relative directory would depend on the script's working directory: not taken.
        check(&[("FLEET_LEASE_DIR", "run"), ("FLEET_JOB_SCRIPT", "/fleet/job/entry")], Some("/fleet/job"));
        check(&[], None);
        assert_eq!(
            stop_line("beta-7", "its job lease ran out"),
            "fleet: stopping this run of job beta-7 at this cluster: its job lease ran out"
        );
    }

    #[test]
    fn a_run_goes_on_only_while_a_grant_covers_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = Watch::new(s(8), t0, s(8));
        assert_eq!(w.renew_every(), s(2));
        assert_eq!(w.expired(t0 + s(7)), None);
        // Renewed at 2 s (the grant counts from the request's sending).
        assert_eq!(w.on_reply(t0 + s(2), &reply(8000)), Verdict::Go);
        assert_eq!(w.expired(t0 + s(9)), None);
        assert_eq!(w.left(t0 + s(9)), s(1));
        // A shorter grant (its cluster is silent) never shortens one held.
        assert_eq!(w.on_reply(t0 + s(3), &reply(1000)), Verdict::Go);
        assert_eq!(w.expired(t0 + s(9)), None);
        // Not renewed (0) and then nothing: it runs out at 10 s.
        assert_eq!(w.on_reply(t0 + s(4), &reply(0)), Verdict::Go);
        assert!(w.expired(t0 + s(10)).unwrap().contains("job lease ran out"));
        // A grant above the lease is cut to the lease.
        let mut w = Watch::new(s(8), t0, s(0));
        assert!(w.expired(t0).is_some());
        w.on_reply(t0, &reply(3_600_000));
        assert_eq!(w.left(t0), s(8));
    }

    #[test]
    fn a_short_grant_is_renewed_before_it_runs_out() {
        let t0 = Instant::now();
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        // A whole grant: every quarter of the lease.
        let mut w = Watch::new(s(8), t0, s(8));
        assert_eq!(w.next_renewal(t0), s(2));
        // Its cluster silent a while: 1.5 s granted at 7 s. Renewed in
        // 0.75 s (half of what is left), not in 2 s, when it would have
        // run out: that renewal, answered 8 s again, keeps the run going.
        assert_eq!(w.on_reply(t0 + s(7), &reply(1500)), Verdict::Go);
        assert_eq!(w.next_renewal(t0 + s(7)), ms(750));
        assert_eq!(w.on_reply(t0 + ms(7750), &reply(8000)), Verdict::Go);
        assert_eq!(w.expired(t0 + s(10)), None);
        assert_eq!(w.next_renewal(t0 + ms(7750)), s(2));
        // Nothing left: at most every 250 ms.
        let w = Watch::new(s(8), t0, ms(100));
        assert_eq!(w.next_renewal(t0), MIN_RENEWAL);
        assert_eq!(w.next_renewal(t0 + s(1)), MIN_RENEWAL);
    }

    #[test]
    fn stale_stops_at_once_and_off_leaves_the_run_alone() {
        let t0 = Instant::now();
        let mut w = Watch::new(Duration::from_secs(30), t0, Duration::from_secs(30));
        let stale =
            JobLeaseReply { stale: true, reason: "the job is now epoch 2 (running at delta)".into(), ..reply(0) };
        assert_eq!(
            w.on_reply(t0, &stale),
            Verdict::Stop("this run is stale: the job is now epoch 2 (running at delta)".into())
        );
        assert_eq!(w.on_reply(t0, &JobLeaseReply { off: true, ..reply(0) }), Verdict::Off);
        // Renewals: a quarter of the lease, within bounds.
        assert_eq!(Watch::new(Duration::from_secs(600), t0, Duration::ZERO).renew_every(), Duration::from_secs(10));
        assert_eq!(Watch::new(Duration::from_secs(1), t0, Duration::ZERO).renew_every(), Duration::from_millis(500));
    }

    #[test]
    fn the_first_lease_waits_for_the_origin_then_starts_or_gives_up() {
        let lease = Duration::from_secs(8);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let wait = JobLeaseReply { wait: true, reason: "waiting for beta to confirm".into(), ..reply(0) };
        let stale = JobLeaseReply { stale: true, reason: "the early run is withdrawn".into(), ..reply(0) };
        let off = JobLeaseReply { off: true, ..reply(0) };
        // Answers at seconds after t0: a reply, or `None` for an error.
        type Answers = Vec<(u64, Option<JobLeaseReply>)>;
        let cases: Vec<(Answers, First)> = vec![
            (vec![(0, Some(reply(8000)))], First::Start(s(8))),
            (vec![(0, Some(reply(60_000)))], First::Start(s(8))),
            (vec![(0, Some(off.clone()))], First::Off),
            (vec![(0, Some(stale.clone()))], First::Refuse("this run is stale: the early run is withdrawn".into())),
            // Waiting is asked again soon, for as long as it lasts.
            (vec![(0, Some(wait.clone()))], First::AskAgain(WAIT_POLL)),
            (
                vec![(0, Some(wait.clone())), (20, Some(wait.clone())), (27, Some(wait.clone()))],
                First::AskAgain(WAIT_POLL),
            ),
            (vec![(0, Some(wait.clone())), (29, Some(reply(8000)))], First::Start(s(8))),
            (
                vec![(0, Some(wait.clone())), (29, Some(stale.clone()))],
                First::Refuse("this run is stale: the early run is withdrawn".into()),
            ),
            // Errors: asked again within a lease of the last answer, then refused.
            (vec![(0, None)], First::AskAgain(s(1))),
            (vec![(0, None), (7, None)], First::AskAgain(s(1))),
            (
                vec![(0, None), (8, None)],
                First::Refuse("no job lease from the meta-scheduler within 8000 ms (down)".into()),
            ),
            (vec![(0, Some(wait.clone())), (20, Some(wait.clone())), (25, None)], First::AskAgain(s(1))),
            (
                vec![(0, Some(wait.clone())), (20, Some(wait.clone())), (25, None), (28, None)],
                First::Refuse("no job lease from the meta-scheduler within 8000 ms (down)".into()),
            ),
            // No grant and no wait: not renewed; asked again within the lease.
            (vec![(0, Some(reply(0)))], First::AskAgain(s(1))),
            (
                vec![(0, Some(reply(0))), (9, Some(reply(0)))],
                First::Refuse("no job lease from the meta-scheduler within 8000 ms ()".into()),
            ),
        ];
        for (answers, want) in cases {
            let mut f = FirstLease::new(lease, t0);
            let mut got = None;
            for (at, r) in &answers {
                let now = t0 + s(*at);
                got = Some(match r {
                    Some(r) => f.on_reply(now, r),
                    None => f.on_error(now, "down".into()),
                });
            }
            assert_eq!(got, Some(want), "{answers:?}");
        }
    }

    #[test]
    fn the_interpreter_line_is_read_as_the_kernel_reads_it() {
        let c = |s: &str| shebang(s.as_bytes());
        let p = |i: &str, a: Option<&str>| Some((i.to_string(), a.map(String::from)));
        assert_eq!(c("#!/bin/bash\necho"), p("/bin/bash", None));
        assert_eq!(c("#! /bin/bash -l \necho"), p("/bin/bash", Some("-l")));
        assert_eq!(c("#!/usr/bin/env python3 -u\n"), p("/usr/bin/env", Some("python3 -u")));
        assert_eq!(c("#!/bin/sh\r\n"), p("/bin/sh", None));
        assert_eq!(c("#!\n"), None);
        assert_eq!(c("echo hi\n"), None);
        assert_eq!(shebang(b"#!/bin/\xff\n"), None, "not UTF-8: no interpreter");
    }

    #[test]
    fn the_lease_environment_is_all_or_nothing() {
        let vars = |extra: &[(&str, &str)]| {
            let mut m: BTreeMap<String, String> = [
                ("FLEET_JOB_LEASE_MS", "8000"),
                ("FLEET_EPOCH", "2"),
                ("FLEET_JOB_ID", "beta-1f"),
                ("FLEET_METASCHED_URL", "https://ms:8443"),
                ("FLEET_CKPT_TOKEN_FILE", "/spool/jobs/beta-1f/.fleet-ckpt-token"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            for (k, v) in extra {
                if v.is_empty() {
                    m.remove(*k);
                } else {
                    m.insert(k.to_string(), v.to_string());
                }
            }
            move |k: &str| m.get(k).cloned()
        };
        let e = LeaseEnv::from_vars(vars(&[])).unwrap().unwrap();
        assert_eq!((e.epoch, e.lease, e.job_id.as_str()), (2, Duration::from_secs(8), "beta-1f"));
        assert_eq!(LeaseEnv::from_vars(vars(&[("FLEET_JOB_LEASE_MS", "")])).unwrap(), None);
        assert_eq!(LeaseEnv::from_vars(vars(&[("FLEET_JOB_LEASE_MS", "0")])).unwrap(), None);
        for (k, v, msg) in [
            ("FLEET_JOB_LEASE_MS", "ten", "is not a number"),
            ("FLEET_JOB_LEASE_MS", "10", "must be in [1000, 3600000]"),
            ("FLEET_EPOCH", "", "FLEET_EPOCH is not set"),
            ("FLEET_EPOCH", "-1", "FLEET_EPOCH = \"-1\" is not a number"),
            ("FLEET_JOB_ID", "../x", "is not a fleet job id"),
            ("FLEET_CKPT_TOKEN_FILE", "", "FLEET_CKPT_TOKEN_FILE is not set"),
        ] {
            let e = LeaseEnv::from_vars(vars(&[(k, v)])).unwrap_err().to_string();
            assert!(e.contains(msg), "{k}={v:?}: {e}");
        }
    }

    #[test]
    fn in_a_pod_the_run_is_its_pid_namespace_but_its_init() {
        // A fake /proc seen from the host: the pod's namespace holds its
        // pause (NSpid 1), the job (2), a daemon it double-forked (5, now
        // pause's child), a zombie (6) and the watchdog (7); 40 is elsewhere.
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path();
        let mk = |pid: i32, ns: &str, nspid: &str, state: &str| {
            let d = proc_root.join(pid.to_string());
            std::fs::create_dir_all(d.join("ns")).unwrap();
            std::os::unix::fs::symlink(ns, d.join("ns/pid")).unwrap();
            std::fs::write(d.join("status"), format!("Name:\ta\nState:\t{state}\nNSpid:\t{nspid}\n")).unwrap();
        };
        let pod = "pid:[4026532999]";
        mk(100, pod, "100 1", "S (sleeping)");
        mk(101, pod, "101 2", "S (sleeping)");
        mk(105, pod, "105 5", "S (sleeping)");
        mk(106, pod, "106 6", "Z (zombie)");
        mk(107, pod, "107 7", "R (running)");
        mk(140, "pid:[4026532000]", "140 3", "S (sleeping)");
        mk(150, INITIAL_PID_NS, "150", "S (sleeping)");
        assert_eq!(pod_namespace_pids(proc_root, 107), BTreeSet::from([101, 105]));
        // Inside the pod (its own /proc: one NSpid each) the same.
        let inner = tempfile::tempdir().unwrap();
        for (pid, nspid) in [(1, "1"), (2, "2"), (5, "5")] {
            let d = inner.path().join(pid.to_string());
            std::fs::create_dir_all(d.join("ns")).unwrap();
            std::os::unix::fs::symlink(pod, d.join("ns/pid")).unwrap();
            std::fs::write(d.join("status"), format!("State:\tS (sleeping)\nNSpid:\t{nspid}\n")).unwrap();
        }
        assert_eq!(pod_namespace_pids(inner.path(), 5), BTreeSet::from([2]));
        // The host's namespace is never swept, nor one that cannot be read.
        assert_eq!(pod_namespace_pids(proc_root, 150), BTreeSet::new());
        assert_eq!(pod_namespace_pids(proc_root, 999), BTreeSet::new());
    }

    #[test]
    fn a_run_is_its_process_tree_and_its_job_cgroup() {
        // A fake /proc: 10 (the batch script) -> 11 -> 12, 20 unrelated,
        // 30 in the job's cgroup (an srun step), 31 another job's.
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        let cg = tmp.path().join("cgroup");
        let mk = |pid: i32, ppid: i32, cgroup: &str| {
            let d = proc_root.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            // The command name holds ") " (read past the last ')').
            let zeros = vec!["0"; 17].join(" ");
            std::fs::write(d.join("stat"), format!("{pid} (a) b) c) S {ppid} {zeros} 4242 0 0")).unwrap();
            std::fs::write(d.join("status"), "Name:\ta\nUid:\t1001\t1001\t1001\t1001\n").unwrap();
            std::fs::write(d.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
        };
        mk(10, 1, "/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0");
        mk(11, 10, "/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0");
        mk(12, 11, "/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0");
        mk(20, 1, "/user.slice");
        mk(30, 1, "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0");
        mk(31, 1, "/system.slice/slurmstepd.scope/job_71/step_0/user/task_0");
        assert_eq!(proc_info(&proc_root, 12), Some((11, 4242, 1001)));
        assert_eq!(tree(&proc_root, 10), BTreeSet::from([10, 11, 12]));
        for (dir, pids) in [
            ("system.slice/slurmstepd.scope/job_7/step_batch/user/task_0", "10\n11\n12\n"),
            ("system.slice/slurmstepd.scope/job_7/step_0/user/task_0", "30\n"),
            ("system.slice/slurmstepd.scope/job_71/step_0/user/task_0", "31\n"),
        ] {
            std::fs::create_dir_all(cg.join(dir)).unwrap();
            std::fs::write(cg.join(dir).join("cgroup.procs"), pids).unwrap();
        }
        assert_eq!(job_cgroup_pids(&proc_root, &cg, 10), BTreeSet::from([10, 11, 12, 30]));
        assert_eq!(job_cgroup_pids(&proc_root, &cg, 20), BTreeSet::new());
    }
}
