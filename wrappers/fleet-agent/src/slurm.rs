//! [`Backend`] on Slurm's own commands (sinfo, squeue, scontrol, sbatch,
//! scancel), run as the agent's unprivileged user with `SLURM_CONF` set.
//!
//! Jobs are submitted with `--comment=fleet:<id>`; before cancelling, the
//! agent checks that the native job still carries that tag, so a recycled
//! job id can never make it touch someone else's job.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fleet_api::api::NodeCapacity;
use fleet_api::{GpuScope, JobRequest, JobState};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::backend::{Backend, NativeStatus, OutputPaths, StandIn};
use crate::config::RunAs;

pub struct SlurmBackend {
    pub bin: PathBuf,
    pub slurm_conf: PathBuf,
    pub spool: PathBuf,
    pub site: String,
    /// Submit and cancel as this user, through sudo (`RunAsUser`).
    pub run_as: Option<RunAs>,
}

/// sudo, by absolute path: the command's PATH is the job's.
const SUDO: &str = "/usr/bin/sudo";

const CMD_TIMEOUT: Duration = Duration::from_secs(30);

impl SlurmBackend {
    async fn run(&self, cmd: &str, args: &[String], stdin: Option<&[u8]>) -> Result<String> {
        self.run_in(cmd, args, stdin, None, false).await
    }

    /// [`SlurmBackend::run`] with the command's whole environment given
    /// (`None`: the agent's own), as the `RunAsUser` when `as_job_user`.
    async fn run_in(
        &self,
        cmd: &str,
        args: &[String],
        stdin: Option<&[u8]>,
        env: Option<&[(String, String)]>,
        as_job_user: bool,
    ) -> Result<String> {
        let mut c = match self.run_as.as_ref().filter(|_| as_job_user) {
            // -E keeps the environment (sudoers: SETENV); sudo still drops
            // the dangerous variables (LD_PRELOAD and the like).
            Some(u) => {
                let mut c = Command::new(SUDO);
                c.args(["-n", "-E", "-u", &u.name, "--"]).arg(self.bin.join(cmd));
                c
            }
            None => Command::new(self.bin.join(cmd)),
        };
        if let Some(env) = env {
            c.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
        }
        c.args(args)
            .env("SLURM_CONF", &self.slurm_conf)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = c.spawn().with_context(|| format!("running {cmd}"))?;
        if let (Some(data), Some(mut w)) = (stdin, child.stdin.take()) {
            w.write_all(data).await.with_context(|| format!("writing to {cmd}"))?;
            drop(w);
        }
        let out = tokio::time::timeout(CMD_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| anyhow!("{cmd} did not finish within {}s", CMD_TIMEOUT.as_secs()))??;
        if !out.status.success() {
            bail!("{cmd} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Is `RunAsUser` usable? It must be another user than the agent's, and
    /// sudo must let the agent run sbatch as it without a password.
    pub async fn check_run_as(&self, u: &RunAs) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let me = std::fs::metadata("/proc/self").map(|m| m.uid()).context("reading /proc/self")?;
        if u.uid == me || u.uid == 0 {
            bail!("RunAsUser={} (uid {}) must be neither root nor the agent's own user: job code could read the agent's token", u.name, u.uid);
        }
        let bin = self.bin.display();
        self.run_in("sbatch", &["--version".into()], None, None, true).await.with_context(|| {
            format!(
                "RunAsUser={0}: sudo does not let the agent (uid {me}) run sbatch as {0}; it needs the sudoers rule \
                 `<agent user> ALL=({0}) NOPASSWD:SETENV: {bin}/sbatch, {bin}/scancel`",
                u.name
            )
        })?;
        Ok(())
    }

    fn job_dir(&self, id: &str) -> PathBuf {
        self.spool.join("jobs").join(id)
    }
}

/// `gpu:h100:8(S:0-1)` / `gpu:h100:3(IDX:0-2)` / `gpu:8` → (type, count) per item.
pub fn parse_gres_field(s: &str) -> Vec<(Option<String>, u32)> {
    // Split on commas outside parentheses.
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, ch) in s.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&s[start..]);
    items
        .into_iter()
        .filter_map(|item| {
            let item = item.split('(').next()?.trim();
            let mut parts = item.split(':');
            if parts.next()? != "gpu" {
                return None;
            }
            let rest: Vec<&str> = parts.collect();
            match rest.as_slice() {
                [n] => Some((None, n.parse().ok()?)),
                [t, n] => Some((Some(t.to_string()), n.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

/// `sinfo -N -h -O NodeList:..,Partition:..,StateCompact:..,Gres:..,GresUsed:..` → nodes.
pub fn parse_sinfo(out: &str) -> Vec<NodeCapacity> {
    let mut nodes: Vec<NodeCapacity> = Vec::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [name, part, state, gres, used] = f.as_slice() else { continue };
        let part = part.trim_end_matches('*').to_string();
        if let Some(n) = nodes.iter_mut().find(|n| n.name == *name) {
            if !n.partitions.contains(&part) {
                n.partitions.push(part);
            }
            continue;
        }
        let total = parse_gres_field(gres);
        let used = parse_gres_field(used);
        let gpu_type = total.iter().find_map(|(t, _)| t.clone());
        let gpus_total: u32 = total.iter().map(|(_, n)| n).sum();
        let gpus_used: u32 = used.iter().map(|(_, n)| n).sum();
        let state = state.trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-']).to_ascii_lowercase();
        nodes.push(NodeCapacity {
            name: name.to_string(),
            partitions: vec![part],
            gpu_type,
            gpus_total,
            gpus_free: gpus_total.saturating_sub(gpus_used),
            state: match state.as_str() {
                "mix" => "mixed".into(),
                "alloc" => "allocated".into(),
                "drng" => "draining".into(),
                "drain" => "drained".into(),
                other => other.into(),
            },
            switch: None,
        });
    }
    nodes
}

/// Slurm's job state name → Fleet's.
pub fn map_state(s: &str) -> JobState {
    match s.split_whitespace().next().unwrap_or("") {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" | "SUSPENDED" => JobState::Pending,
        "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" | "STOPPED" => JobState::Running,
        "COMPLETED" => JobState::Completed,
        "CANCELLED" => JobState::Cancelled,
        "FAILED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE" | "PREEMPTED" => JobState::Failed,
        _ => JobState::Pending,
    }
}

/// `scontrol show job -o` → (JobState, ExitCode, NodeList, Reason).
pub fn parse_scontrol(line: &str) -> Option<NativeStatus> {
    let get = |k: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
    };
    let state_raw = get("JobState")?;
    let mut state = map_state(state_raw);
    let (code, sig) = get("ExitCode")
        .and_then(|e| e.split_once(':'))
        .map(|(c, s)| (c.parse::<i32>().ok(), s.parse::<i32>().ok()))
        .unwrap_or((None, None));
    // A batch job that completed with a non-zero code is FAILED in Slurm;
    // both are terminal here, the exit code tells them apart.
    if state == JobState::Failed && state_raw == "FAILED" && code.is_some_and(|c| c != 0) {
        state = JobState::Failed;
    }
    Some(NativeStatus {
        state,
        exit_code: if state.is_terminal() { code } else { None },
        signal: if state.is_terminal() { sig.filter(|&s| s != 0) } else { None },
        node_list: get("NodeList").filter(|n| *n != "(null)").unwrap_or("").to_string(),
        reason: get("Reason").filter(|r| *r != "None").unwrap_or("").to_string(),
    })
}

/// `squeue -h -o %i|%T|%k` → stand-ins (array elements and garbage skipped).
pub fn parse_stand_ins(out: &str) -> Vec<StandIn> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '|');
            let native_id = f.next()?.trim().parse().ok()?;
            let raw_state = f.next()?.trim().to_string();
            if raw_state.is_empty() {
                return None;
            }
            Some(StandIn { native_id, state: map_state(&raw_state), raw_state, comment: f.next().unwrap_or("").to_string() })
        })
        .collect()
}

/// The environment sbatch runs with at the target, so that the job gets the
/// one it had at the origin (sbatch's default `--export=ALL` captures it):
/// the origin's, less what names the origin's host and user or steers
/// Slurm commands there (`SLURM_*`, `SBATCH_*`, ...), with `HOME` set to
/// the job's directory here. `None` when the origin sent no environment.
pub fn submit_env(req: &JobRequest, job_dir: &std::path::Path) -> Option<Vec<(String, String)>> {
    const DROP: &[&str] = &[
        "HOME", "USER", "LOGNAME", "MAIL", "SHELL", "PWD", "OLDPWD", "HOSTNAME", "SHLVL", "_", "TMPDIR",
        "XDG_RUNTIME_DIR", "XDG_SESSION_ID", "DISPLAY", "KRB5CCNAME", "SSH_AUTH_SOCK", "SSH_CLIENT",
        "SSH_CONNECTION", "SSH_TTY",
    ];
    const DROP_PREFIX: &[&str] = &["SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SPANK_", "_SLURM_", "FLEET_"];
    let mut env: Vec<(String, String)> = req
        .env
        .iter()
        .filter_map(|e| e.split_once('='))
        .filter(|(k, _)| !k.is_empty() && !DROP.contains(k) && !DROP_PREFIX.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if env.is_empty() {
        return None;
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
    }
    env.push(("HOME".into(), job_dir.display().to_string()));
    Some(env)
}

/// sbatch options that reproduce the job's resources at this cluster.
pub fn sbatch_args(id: &str, req: &JobRequest, dir: &std::path::Path, paths: &OutputPaths) -> Vec<String> {
    let mut a = vec![
        "--parsable".to_string(),
        format!("--comment=fleet:{id}"),
        format!("--job-name={}", req.name.as_deref().unwrap_or(id)),
        format!("--chdir={}", dir.display()),
        format!("--output={}", paths.stdout.display()),
        format!("--error={}", paths.stderr.display()),
        format!("--export=ALL,FLEET_JOB_ID={id},FLEET_ORIGIN={}", req.origin),
    ];
    for g in &req.gpus {
        let spec = match &g.gpu_type {
            Some(t) => format!("{t}:{}", g.count),
            None => g.count.to_string(),
        };
        a.push(match g.scope {
            GpuScope::Node => format!("--gres=gpu:{spec}"),
            GpuScope::Job => format!("--gpus={spec}"),
            GpuScope::Task => format!("--gpus-per-task={spec}"),
            GpuScope::Socket => format!("--gpus-per-socket={spec}"),
        });
    }
    if let Some(n) = req.min_nodes {
        match req.max_nodes.filter(|&m| m > n) {
            Some(m) => a.push(format!("--nodes={n}-{m}")),
            None => a.push(format!("--nodes={n}")),
        }
    }
    if let Some(n) = req.num_tasks {
        a.push(format!("--ntasks={n}"));
    }
    if let Some(n) = req.ntasks_per_node {
        a.push(format!("--ntasks-per-node={n}"));
    }
    if let Some(n) = req.cpus_per_task {
        a.push(format!("--cpus-per-task={n}"));
    }
    if let Some(t) = req.time_limit_min {
        a.push(format!("--time={t}"));
    }
    a
}

impl Backend for SlurmBackend {
    async fn capacity(&self) -> Result<(Vec<NodeCapacity>, u32, u32)> {
        let sinfo = self
            .run(
                "sinfo",
                &["-N".into(), "-h".into(), "-O".into(), "NodeList:64,Partition:32,StateCompact:16,Gres:128,GresUsed:160".into()],
                None,
            )
            .await?;
        let squeue = self.run("squeue", &["-h".into(), "-o".into(), "%T".into()], None).await?;
        let pending = squeue.lines().filter(|l| l.trim() == "PENDING").count() as u32;
        let running = squeue.lines().filter(|l| l.trim() == "RUNNING").count() as u32;
        Ok((parse_sinfo(&sinfo), pending, running))
    }

    async fn submit(&self, id: &str, req: &JobRequest) -> Result<u64> {
        let script = req.script.as_deref().ok_or_else(|| anyhow!("job {id} carries no script"))?;
        let dir = self.job_dir(id);
        tokio::fs::create_dir_all(&dir).await.with_context(|| format!("creating {}", dir.display()))?;
        let paths = self.output_paths(id);
        if let Some(u) = &self.run_as {
            // The job (RunAsUser) writes its output here, the agent reads it.
            use std::os::unix::fs::PermissionsExt;
            std::os::unix::fs::chown(&dir, None, Some(u.gid)).with_context(|| format!("giving {} to group {}", dir.display(), u.gid))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2770))?;
        }
        let env = submit_env(req, &dir);
        let out = self.run_in("sbatch", &sbatch_args(id, req, &dir, &paths), Some(script), env.as_deref(), true).await?;
        let first = out.trim().split(';').next().unwrap_or("");
        first.parse().with_context(|| format!("sbatch printed {:?}, expected a job id", out.trim()))
    }

    async fn status(&self, ids: &[u64]) -> Result<Vec<(u64, Option<NativeStatus>)>> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let res = self.run("scontrol", &["-o".into(), "show".into(), "job".into(), id.to_string()], None).await;
            match res {
                Ok(text) => out.push((id, text.lines().next().and_then(parse_scontrol))),
                Err(e) if e.to_string().contains("Invalid job id") => out.push((id, None)),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn stand_ins(&self, partition: &str) -> Result<Vec<StandIn>> {
        let args = ["-h", "-a", "-p", partition, "-t", "all", "-o", "%i|%T|%k"].map(String::from);
        Ok(parse_stand_ins(&self.run("squeue", &args, None).await?))
    }

    async fn cancel(&self, id: &str, native_id: u64) -> Result<()> {
        let text = self.run("scontrol", &["-o".into(), "show".into(), "job".into(), native_id.to_string()], None).await?;
        let tag = format!("Comment=fleet:{id}");
        if !text.split_whitespace().any(|kv| kv == tag) {
            bail!("refusing to cancel Slurm job {native_id}: it does not carry {tag}");
        }
        self.run_in("scancel", &[native_id.to_string()], None, None, true).await?;
        Ok(())
    }

    fn output_paths(&self, id: &str) -> OutputPaths {
        let d = self.job_dir(id);
        OutputPaths { stdout: d.join("stdout"), stderr: d.join("stderr") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gres_fields() {
        assert_eq!(parse_gres_field("gpu:h100:8(S:0-1)"), vec![(Some("h100".into()), 8)]);
        assert_eq!(parse_gres_field("gpu:a100:3(IDX:0-2,5)"), vec![(Some("a100".into()), 3)]);
        assert_eq!(parse_gres_field("gpu:4,gpu:h100:2"), vec![(None, 4), (Some("h100".into()), 2)]);
        assert_eq!(parse_gres_field("(null)"), vec![]);
        assert_eq!(parse_gres_field("shard:2,gpu:x:y"), vec![]);
    }

    #[test]
    fn sinfo_nodes_merge_partitions() {
        let out = "beta1 gpu* mix gpu:a100:8 gpu:a100:3(IDX:0-2)\nbeta1 fleet mix gpu:a100:8 gpu:a100:3(IDX:0-2)\nbeta2 gpu* drain* gpu:a100:8 gpu:a100:0(IDX:N/A)\n";
        let n = parse_sinfo(out);
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].partitions, vec!["gpu".to_string(), "fleet".to_string()]);
        assert_eq!((n[0].gpus_total, n[0].gpus_free, n[0].state.as_str()), (8, 5, "mixed"));
        assert_eq!(n[1].state, "drained");
        assert_eq!(n[1].gpu_type.as_deref(), Some("a100"));
    }

    #[test]
    fn scontrol_lines() {
        let l = "JobId=100003 JobName=t UserId=fleet(999) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=3:0 NodeList=alpha1 Comment=fleet:beta-1";
        let s = parse_scontrol(l).unwrap();
        assert_eq!((s.state, s.exit_code, s.signal), (JobState::Failed, Some(3), None));
        assert_eq!(s.node_list, "alpha1");
        let l = "JobId=1 JobState=CANCELLED Reason=None ExitCode=0:15 NodeList=alpha2";
        let s = parse_scontrol(l).unwrap();
        assert_eq!((s.state, s.exit_code, s.signal), (JobState::Cancelled, Some(0), Some(15)));
        let l = "JobId=1 JobState=RUNNING Reason=None ExitCode=0:0 NodeList=alpha2";
        assert_eq!(parse_scontrol(l).unwrap().exit_code, None);
        assert_eq!(parse_scontrol("garbage"), None);
    }

    #[test]
    fn squeue_stand_ins() {
        let out = "100007|RUNNING|fleet: alpha job 3 running\n100008|CANCELLED|fleet: alpha (waiting) beta-1|x\n100009_2|PENDING|\nboom\n100010|PENDING|\n";
        let s = parse_stand_ins(out);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].native_id, s[0].state), (100007, JobState::Running));
        assert_eq!((s[1].state, s[1].raw_state.as_str(), s[1].comment.as_str()), (JobState::Cancelled, "CANCELLED", "fleet: alpha (waiting) beta-1|x"));
        assert_eq!((s[2].native_id, s[2].comment.as_str()), (100010, ""));
    }

    #[test]
    fn the_origin_environment_less_what_names_the_origin() {
        let req = JobRequest {
            env: ["PATH=/opt/conda/bin:/usr/bin", "RESEARCH=x=y", "SLURM_CONF=/etc/slurm-beta/slurm.conf", "SBATCH_PARTITION=a100",
                "HOME=/home/alice", "HOSTNAME=login1", "FLEET_JOB_ID=spoof", "WANDB_MODE=offline", "no-equals-sign"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        };
        let env = submit_env(&req, std::path::Path::new("/spool/jobs/beta-1")).unwrap();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "RESEARCH", "WANDB_MODE", "HOME"]);
        assert_eq!(env[1].1, "x=y");
        assert_eq!(env[3].1, "/spool/jobs/beta-1");
        // Only origin-specific variables: nothing to carry, the agent's own env is used.
        let req = JobRequest { env: vec!["SLURM_JOB_NAME=x".into()], ..Default::default() };
        assert_eq!(submit_env(&req, std::path::Path::new("/d")), None);
        // No PATH from the origin: a sane default.
        let req = JobRequest { env: vec!["A=1".into()], ..Default::default() };
        assert!(submit_env(&req, std::path::Path::new("/d")).unwrap().iter().any(|(k, v)| k == "PATH" && v.contains("/usr/bin")));
    }

    #[test]
    fn sbatch_reproduces_resources() {
        let req = JobRequest {
            origin: "beta".into(),
            name: Some("train".into()),
            gpus: vec![fleet_api::GpuRequest { gpu_type: Some("h100".into()), count: 8, scope: GpuScope::Node }],
            min_nodes: Some(2),
            time_limit_min: Some(60),
            ..Default::default()
        };
        let p = OutputPaths { stdout: "/s/o".into(), stderr: "/s/e".into() };
        let a = sbatch_args("beta-1", &req, std::path::Path::new("/s"), &p);
        for want in ["--comment=fleet:beta-1", "--job-name=train", "--gres=gpu:h100:8", "--nodes=2", "--time=60", "--output=/s/o"] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
    }
}
