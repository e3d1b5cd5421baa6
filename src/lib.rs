//! The lab harness: the one place that knows how to reach the local
//! federation that `tests/lab/lab.sh` runs (real slurmctld/slurmd per
//! cluster, fleet-metasched, one fleet-agent per cluster), used by the
//! integration tests in `tests/`.
//!
//! `make test` brings the lab up before `cargo test` and down after it;
//! [`Lab::get`] brings it up itself when it finds it down (running a
//! single test by hand).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The researcher the tests submit as (a lab user in `fleetusers`).
pub const USER: &str = "alice";
/// A second researcher, for isolation tests.
pub const OTHER_USER: &str = "bob";
/// The lab's Kubernetes cluster (`FLEET_LAB_KUBE=1`, the harness's default).
pub const KUBE: &str = "kube-gamma";
/// The namespace kube-gamma's agent works in.
pub const KUBE_NAMESPACE: &str = "fleet";

/// Whether the lab the harness starts includes kube-gamma: `FLEET_LAB_KUBE`,
/// `1` unless set otherwise (`make test` exports it too).
fn kube_wanted() -> bool {
    std::env::var("FLEET_LAB_KUBE").map_or(true, |v| v == "1")
}

pub struct Lab {
    pub root: PathBuf,
    pub repo: PathBuf,
}

/// A job record from `scontrol show job -o`.
pub type JobRecord = HashMap<String, String>;

impl Lab {
    /// The running lab (started on first use when it is not up).
    pub fn get() -> &'static Lab {
        static LAB: OnceLock<Lab> = OnceLock::new();
        LAB.get_or_init(|| {
            let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let root = PathBuf::from(std::env::var("FLEET_LAB_DIR").unwrap_or_else(|_| "/tmp/fleet-lab".into()));
            let lab = Lab { root, repo };
            if !lab.is_up() {
                let out = lab.lab_sh(&["up"]).expect("running tests/lab/lab.sh up");
                assert!(out.status.success(), "lab.sh up failed:\n{}", String::from_utf8_lossy(&out.stderr));
            }
            lab
        })
    }

    /// The lab, held exclusively by the calling test until the guard drops:
    /// tests stop and replace services, and must not see each other's effects.
    pub fn lock() -> (&'static Lab, MutexGuard<'static, ()>) {
        static M: Mutex<()> = Mutex::new(());
        let g = M.lock().unwrap_or_else(|p| p.into_inner());
        let lab = Lab::get();
        lab.settle(Duration::from_secs(30));
        (lab, g)
    }

    /// Waits, at most `limit`, until nothing of an earlier test (of this
    /// suite or the one before it) still runs or waits in the lab, as Slurm
    /// and the meta-scheduler's view both say: a test whose jobs are still
    /// being cancelled as the next one submits would otherwise push the
    /// next one's job to another cluster. Goes on (saying so) when the lab
    /// stays busy: the test then fails, or not, on its own terms.
    pub fn settle(&self, limit: Duration) {
        let t0 = Instant::now();
        let mut first = true;
        let said = loop {
            let busy = self.busy();
            if busy.is_empty() {
                if first {
                    return;
                }
                break format!("waited {:.1} s for earlier jobs to end", t0.elapsed().as_secs_f64());
            }
            if t0.elapsed() > limit {
                break format!("still busy after {limit:?}, going on: {}", busy.join("; "));
            }
            first = false;
            std::thread::sleep(Duration::from_millis(500));
        };
        // Also kept in the lab's log, for a run whose tests all passed.
        let who = std::thread::current().name().unwrap_or("?").to_string();
        eprintln!("[lab] {who}: {said}");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.root.join("log/settle.log"));
        if let Ok(mut f) = log {
            use std::io::Write;
            let _ = writeln!(f, "{who}: {said}");
        }
    }

    /// Waits, at most `limit`, until the meta-scheduler sees `cluster`
    /// healthy with at least `n` `gpu_type` GPUs free (after a test
    /// restarted its slurmctld, say: a job placed before its agent's next
    /// heartbeat says so goes elsewhere).
    pub fn wait_gpus_free(&self, cluster: &str, gpu_type: &str, n: u64, limit: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            let view = self.fleetctl_json(&["clusters"]).unwrap_or_default();
            let c = view["clusters"].as_array().into_iter().flatten().find(|c| c["name"] == cluster);
            let free: u64 = c
                .filter(|c| c["healthy"].as_bool() == Some(true))
                .and_then(|c| c["gpus"].as_array())
                .into_iter()
                .flatten()
                .filter(|p| p["gpu_type"] == gpu_type)
                .map(|p| p["free"].as_u64().unwrap_or(0))
                .sum();
            if free >= n {
                return Ok(());
            }
            if t0.elapsed() > limit {
                bail!("{cluster}: the meta-scheduler sees {free} {gpu_type} GPUs free after {limit:?}, not {n}: {c:?}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// What runs or waits in the lab now: each Slurm cluster's jobs that
    /// are not over and nodes still completing a job, and each cluster the
    /// meta-scheduler sees with queued or running jobs or GPUs in use.
    fn busy(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in ["alpha", "beta", "delta"] {
            let Ok(o) = self.cmd(c, "squeue", &["-h", "-o", "%i %T"]) else { continue };
            for l in String::from_utf8_lossy(&o.stdout).lines() {
                if !l.split_whitespace().nth(1).is_some_and(is_terminal) {
                    out.push(format!("{c}: job {l}"));
                }
            }
            // A job Slurm shows ended (CANCELLED) may still hold its node
            // while slurmd finishes it: the node is still COMPLETING.
            let Ok(o) = self.cmd(c, "sinfo", &["-h", "-N", "-o", "%N %T"]) else { continue };
            for l in String::from_utf8_lossy(&o.stdout).lines() {
                if l.contains("completing") {
                    out.push(format!("{c}: node {l}"));
                }
            }
        }
        let view = self.fleetctl_json(&["clusters"]).unwrap_or_default();
        for c in view["clusters"].as_array().into_iter().flatten() {
            let n = |k: &str| c[k].as_u64().unwrap_or(0);
            let in_use: u64 = c["gpus"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| p["total"].as_u64().unwrap_or(0).saturating_sub(p["free"].as_u64().unwrap_or(0)))
                .sum();
            if n("queue_running") + n("queue_pending") + in_use > 0 {
                out.push(format!(
                    "{} (the meta-scheduler's view): {} running, {} pending, {in_use} GPUs in use",
                    c["name"].as_str().unwrap_or("?"),
                    n("queue_running"),
                    n("queue_pending")
                ));
            }
        }
        out
    }

    /// The Slurm clusters answer. A lab that is up without kube-gamma is
    /// left as it is (never torn down for it): the Kubernetes tests then
    /// fail in [`Lab::require_kube`], saying how to bring it up.
    fn is_up(&self) -> bool {
        ["alpha", "beta", "delta"].iter().all(|c| self.root.join(c).join("agent.sock").exists())
            && self.cmd("beta", "sinfo", &["-h"]).map(|o| o.status.success()).unwrap_or(false)
    }

    pub fn lab_sh(&self, args: &[&str]) -> Result<Output> {
        self.lab_sh_env(&[], args)
    }

    /// [`Lab::lab_sh`] with extra environment (e.g. an agent fault point).
    pub fn lab_sh_env(&self, env: &[(&str, &str)], args: &[&str]) -> Result<Output> {
        Command::new(self.repo.join("tests/lab/lab.sh"))
            .args(args)
            .env("FLEET_LAB_DIR", &self.root)
            .env("FLEET_LAB_KUBE", if kube_wanted() { "1" } else { "0" })
            .envs(env.iter().copied())
            .output()
            .context("running lab.sh")
    }

    /// The kubeconfig of kube-gamma's administrator (every namespace).
    pub fn kube_admin_config(&self) -> PathBuf {
        self.root.join(KUBE).join("admin.kubeconfig")
    }

    /// Fails the calling test (never skips it) unless the lab has kube-gamma
    /// with its agent running.
    pub fn require_kube(&self) {
        let pid = std::fs::read_to_string(self.root.join(KUBE).join("run/agent.pid")).unwrap_or_default();
        let agent_up = !pid.trim().is_empty() && Path::new(&format!("/proc/{}", pid.trim())).exists();
        assert!(
            self.kube_admin_config().exists() && agent_up,
            "the lab at {} has no {KUBE} (or its agent is down): bring it up with FLEET_LAB_KUBE=1 \
             (tests/lab/run-tests.sh and the harness do by default)",
            self.root.display()
        );
    }

    /// `kubectl <args>` against kube-gamma as its administrator:
    /// (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        match Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.kube_admin_config())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .output()
        {
            Ok(o) => (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            ),
            Err(e) => (false, String::new(), format!("cannot run kubectl: {e}")),
        }
    }

    pub fn slurm_conf(&self, cluster: &str) -> PathBuf {
        self.root.join(cluster).join("slurm.conf")
    }

    /// Run a Slurm command against `cluster` as `user`.
    pub fn cmd_as(&self, user: &str, cluster: &str, prog: &str, args: &[&str]) -> Result<Output> {
        Command::new("setpriv")
            .args([&format!("--reuid={user}"), &format!("--regid={user}"), "--init-groups", prog])
            .args(args)
            .env("SLURM_CONF", self.slurm_conf(cluster))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {prog} as {user}"))
    }

    /// Run a Slurm command against `cluster`.
    pub fn cmd(&self, cluster: &str, prog: &str, args: &[&str]) -> Result<Output> {
        Command::new(prog)
            .args(args)
            .env("SLURM_CONF", self.slurm_conf(cluster))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {prog}"))
    }

    /// A fresh working directory for one test, owned by [`USER`] (who
    /// submits the tests' jobs) and readable by everyone.
    pub fn workdir(&self, name: &str) -> PathBuf {
        let d = self.root.join("work").join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("creating a test work dir");
        let _ = Command::new("chown").arg(format!("{USER}:{USER}")).arg(&d).status();
        let _ = Command::new("chmod").arg("0755").arg(self.root.join("work")).status();
        d
    }

    /// `sbatch --parsable` at `cluster` as [`USER`] with `script` on stdin;
    /// `Err` holds sbatch's stderr.
    pub fn sbatch(&self, cluster: &str, args: &[&str], script: &[u8]) -> Result<u64, String> {
        self.sbatch_as(USER, cluster, args, script).0
    }

    /// As [`Lab::sbatch`], with the time sbatch took.
    pub fn sbatch_timed(&self, cluster: &str, args: &[&str], script: &[u8]) -> (Result<u64, String>, Duration) {
        self.sbatch_as(USER, cluster, args, script)
    }

    /// `sbatch --parsable` as `user` (a lab researcher, or `root`).
    pub fn sbatch_as(
        &self,
        user: &str,
        cluster: &str,
        args: &[&str],
        script: &[u8],
    ) -> (Result<u64, String>, Duration) {
        self.sbatch_env(user, cluster, args, script, &[])
    }

    /// [`Lab::sbatch_as`] with `env` added to sbatch's environment (which
    /// the job is submitted with).
    pub fn sbatch_env(
        &self,
        user: &str,
        cluster: &str,
        args: &[&str],
        script: &[u8],
        env: &[(String, String)],
    ) -> (Result<u64, String>, Duration) {
        use std::io::Write;
        let t0 = Instant::now();
        let mut cmd = if user == "root" {
            Command::new("sbatch")
        } else {
            let mut c = Command::new("setpriv");
            c.args([&format!("--reuid={user}"), &format!("--regid={user}"), "--init-groups", "sbatch"]);
            c.env("HOME", format!("/home/{user}")).env("USER", user).env("LOGNAME", user);
            c
        };
        let child = cmd
            .arg("--parsable")
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("SLURM_CONF", self.slurm_conf(cluster))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => return (Err(format!("cannot run sbatch: {e}")), t0.elapsed()),
        };
        if let Some(mut w) = child.stdin.take() {
            let _ = w.write_all(script);
        }
        let out = match child.wait_with_output() {
            Ok(o) => o,
            Err(e) => return (Err(format!("sbatch: {e}")), t0.elapsed()),
        };
        let took = t0.elapsed();
        if !out.status.success() {
            return (Err(String::from_utf8_lossy(&out.stderr).into_owned()), took);
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let id = text.trim().split(';').next().unwrap_or("").parse().map_err(|_| format!("sbatch printed {text:?}"));
        (id, took)
    }

    /// `scontrol show job -o <id>` at `cluster`, parsed; `None` when unknown.
    pub fn job(&self, cluster: &str, id: u64) -> Option<JobRecord> {
        let out = self.cmd(cluster, "scontrol", &["-o", "show", "job", &id.to_string()]).ok()?;
        if !out.status.success() {
            return None;
        }
        Some(parse_record(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Wait until the job reaches a terminal state; returns its record.
    pub fn wait_done(&self, cluster: &str, id: u64, timeout: Duration) -> Result<JobRecord> {
        self.wait_for(cluster, id, timeout, |r| is_terminal(&r["JobState"]))
    }

    /// Wait until `pred` holds for the job's record.
    pub fn wait_for(
        &self,
        cluster: &str,
        id: u64,
        timeout: Duration,
        pred: impl Fn(&JobRecord) -> bool,
    ) -> Result<JobRecord> {
        let t0 = Instant::now();
        loop {
            if let Some(r) = self.job(cluster, id) {
                if r.contains_key("JobState") && pred(&r) {
                    return Ok(r);
                }
                if t0.elapsed() > timeout {
                    bail!("job {id} at {cluster}: condition not met within {timeout:?}; last record: {r:?}");
                }
            } else if t0.elapsed() > timeout {
                bail!("job {id} unknown at {cluster}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `fleetctl --json <args>` with the lab's admin token, parsed.
    pub fn fleetctl_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut cmd = Command::new(self.root.join("bin/fleetctl"));
        if let Some(ca) = self.ca_file() {
            cmd.arg("--ca-file").arg(ca);
        }
        let out = cmd
            .arg("--url")
            .arg(self.metasched_url())
            .arg("--token-file")
            .arg(self.root.join("secrets/admin.token"))
            .arg("--json")
            .args(args)
            .output()
            .context("running fleetctl")?;
        if !out.status.success() {
            bail!("fleetctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        serde_json::from_slice(&out.stdout).context("fleetctl --json output")
    }

    pub fn metasched_url(&self) -> String {
        let toml = std::fs::read_to_string(self.root.join("metasched.toml")).unwrap_or_default();
        let listen = toml
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("listen")
                    .map(|r| r.trim_start_matches([' ', '=']).trim().trim_matches('"').to_string())
            })
            .unwrap_or_else(|| "127.0.0.1:16900".into());
        let scheme = if self.ca_file().is_some() { "https" } else { "http" };
        format!("{scheme}://{listen}")
    }

    /// The lab CA's certificate when the meta-scheduler serves HTTPS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        Some(self.root.join("ca.pem")).filter(|p| p.exists())
    }

    /// slurmctld of `cluster` answers.
    pub fn ctld_alive(&self, cluster: &str) -> bool {
        self.cmd(cluster, "scontrol", &["ping"])
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("is UP"))
            .unwrap_or(false)
    }

    /// For tests that stop services: whatever happens (a failing test
    /// unwinds too), the agent of `cluster` and the meta-scheduler are
    /// running again when the guard drops, so the next test finds them.
    pub fn restart_services_on_drop(&self, cluster: &str) -> OnDrop<impl FnMut() + '_> {
        let cluster = cluster.to_string();
        OnDrop(move || {
            let _ = self.lab_sh(&["start-agent", &cluster]);
            let _ = self.lab_sh(&["start-metasched"]);
        })
    }

    /// What `fleet-agent --check` prints for the agent of `cluster`, run
    /// as the agent's user (`fleet`) with that cluster's slurm.conf.
    pub fn agent_check(&self, cluster: &str) -> String {
        let d = self.root.join(cluster);
        let out = Command::new("setpriv")
            .args(["--reuid=fleet", "--regid=fleet", "--init-groups", "env"])
            .arg(format!("SLURM_CONF={}", d.join("slurm.conf").display()))
            .arg(self.root.join("bin/fleet-agent"))
            .arg("--conf")
            .arg(d.join("fleet.conf"))
            .arg("--check")
            .output()
            .expect("running fleet-agent --check");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Log file of the agent of `cluster`.
    pub fn agent_log(&self, cluster: &str) -> PathBuf {
        self.root.join(cluster).join("log/agent.log")
    }

    /// Every line of the meta-scheduler's and the agents' logs that names
    /// `what` (a fleet job id), each under its file's name: what a failing
    /// assertion prints, so that a race seen once in CI can be read after.
    pub fn trail(&self, what: &str) -> String {
        let mut logs = vec![self.root.join("log/metasched.log")];
        if let Ok(dirs) = std::fs::read_dir(&self.root) {
            let mut agents: Vec<PathBuf> =
                dirs.flatten().map(|d| d.path().join("log/agent.log")).filter(|p| p.exists()).collect();
            agents.sort();
            logs.extend(agents);
        }
        let mut out = String::new();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(what)).collect();
            if !lines.is_empty() {
                out.push_str(&format!("--- {}\n{}\n", log.display(), lines.join("\n")));
            }
        }
        out
    }
}

/// Runs a closure when dropped (also while a failing test unwinds).
pub struct OnDrop<F: FnMut()>(pub F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}
/// Samples `f` on a thread of its own every `every` until [`Sampler::finish`]
/// (or drop): each sample with the time since the sampler started. What
/// the failover tests use to show that a job never runs twice.
pub struct Sampler<T: Send + 'static> {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    samples: std::sync::Arc<std::sync::Mutex<Vec<(Duration, T)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<T: Send + 'static> Sampler<T> {
    pub fn start(every: Duration, mut f: impl FnMut() -> T + Send + 'static) -> Sampler<T> {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let (stop, samples) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let (st, sa) = (stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            while !st.load(Ordering::Relaxed) {
                let v = f();
                sa.lock().unwrap().push((t0.elapsed(), v));
                std::thread::sleep(every);
            }
        });
        Sampler { stop, samples, thread: Some(thread) }
    }

    /// The samples so far (the sampler goes on).
    pub fn snapshot(&self) -> Vec<(Duration, T)>
    where
        T: Clone,
    {
        self.samples.lock().unwrap().clone()
    }

    /// Stops the sampler and returns every sample.
    pub fn finish(mut self) -> Vec<(Duration, T)> {
        self.halt();
        std::mem::take(&mut *self.samples.lock().unwrap())
    }

    fn halt(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<T: Send + 'static> Drop for Sampler<T> {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The clusters where a process of fleet job `fid` runs now: every process
/// with `FLEET_JOB_ID=<fid>` in its environment (the lab's clusters and
/// kube-gamma's pods share this host), by its `SLURM_CLUSTER_NAME`; the
/// lease watchdog (`fleet-ckpt`) is not the job. What the failover tests
/// sample to show that a job never runs twice.
pub fn copies(fid: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let want = format!("FLEET_JOB_ID={fid}");
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if !e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        if std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "fleet-ckpt") {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        if !vars.contains(&want.as_bytes()) {
            continue;
        }
        if let Some(c) = vars.iter().find_map(|v| v.strip_prefix(b"SLURM_CLUSTER_NAME=")) {
            out.insert(String::from_utf8_lossy(c).into_owned());
        }
    }
    out
}

/// A bash batch script running `body`.
pub fn script(body: &str) -> Vec<u8> {
    format!("#!/bin/bash\n{body}\n").into_bytes()
}

/// `--output=<dir>/<name>`.
pub fn out_arg(dir: &Path, name: &str) -> String {
    format!("--output={}/{name}", dir.display())
}

/// The meta-scheduler's record of the forwarded beta job `beta_id`.
pub fn fleet_record(lab: &Lab, beta_id: u64) -> Option<serde_json::Value> {
    let jobs = lab.fleetctl_json(&["jobs"]).ok()?;
    jobs.as_array()?.iter().find(|j| j["origin_job_id"].as_u64() == Some(beta_id)).cloned()
}

/// (target, Slurm job id there) behind a forwarded beta job.
pub fn remote_of(lab: &Lab, beta_id: u64) -> Option<(String, u64)> {
    let j = fleet_record(lab, beta_id)?;
    Some((j["target"].as_str().unwrap_or("").to_string(), j["remote_job_id"].as_u64().unwrap_or(0)))
}

/// The fleet job id of a forwarded beta job.
pub fn fleet_job_of(lab: &Lab, beta_id: u64) -> Option<String> {
    fleet_record(lab, beta_id).map(|j| j["fleet_job_id"].as_str().unwrap_or("").to_string())
}

pub fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "COMPLETED"
            | "FAILED"
            | "CANCELLED"
            | "TIMEOUT"
            | "NODE_FAIL"
            | "OUT_OF_MEMORY"
            | "BOOT_FAIL"
            | "DEADLINE"
            | "PREEMPTED"
    )
}

/// Parse one `scontrol -o` line into key → value. Values may contain
/// spaces (Command=, Comment=): a token without `Key=` continues the value before it.
pub fn parse_record(line: &str) -> JobRecord {
    let mut rec = JobRecord::new();
    let mut last: Option<String> = None;
    for tok in line.split_whitespace() {
        match tok.split_once('=') {
            Some((k, v))
                if !k.is_empty()
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == ':' || c == '/' || c == '_') =>
            {
                rec.insert(k.to_string(), v.to_string());
                last = Some(k.to_string());
            }
            _ => {
                if let Some(k) = &last {
                    if let Some(v) = rec.get_mut(k) {
                        v.push(' ');
                        v.push_str(tok);
                    }
                }
            }
        }
    }
    rec
}

/// Read a file, waiting up to `timeout` until `pred` holds for its bytes.
pub fn wait_file(path: &Path, timeout: Duration, pred: impl Fn(&[u8]) -> bool) -> Result<Vec<u8>> {
    let t0 = Instant::now();
    loop {
        let data = std::fs::read(path).unwrap_or_default();
        if pred(&data) {
            return Ok(data);
        }
        if t0.elapsed() > timeout {
            bail!(
                "{}: condition not met within {timeout:?}; content: {:?}",
                path.display(),
                String::from_utf8_lossy(&data)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Writes `text` as `path` the way an editor or config management does
/// (a new file renamed over the old one), readable by SlurmUser.
pub fn replace_file(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("conf.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_with_spaces() {
        let r = parse_record("JobId=5 JobName=a b JobState=COMPLETED Comment=fleet: alpha job 7 ExitCode=3:0");
        assert_eq!(r["JobName"], "a b");
        assert_eq!(r["Comment"], "fleet: alpha job 7");
        assert_eq!(r["ExitCode"], "3:0");
    }
}
