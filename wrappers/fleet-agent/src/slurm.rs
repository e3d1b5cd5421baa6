//! [`Backend`] on Slurm's own commands (sinfo, squeue, sacct, sbatch,
//! scancel), run as the agent's unprivileged user with `SLURM_CONF` set;
//! sbatch, scancel and `scontrol update` (a lowered time limit) run as the
//! job's user through sudo.
//!
//! Job state is read from `squeue --json` in one call per pass, never from
//! text a user can shape (job names, comments). A job is known by its Slurm
//! id *and* its submit time and owner, so an id that slurmctld reuses after
//! a crash never lends another job's result (see `lib.rs`, `track`).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fleet_api::api::NodeCapacity;
use fleet_api::{JobRequest, JobState};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::backend::{Backend, Capacity, NativeJob};
use crate::identity::LocalUser;

pub struct SlurmBackend {
    pub bin: PathBuf,
    pub slurm_conf: PathBuf,
    pub spool: PathBuf,
    pub site: String,
    /// What each run gets for its checkpoints (token file, report settings).
    pub ckpt: crate::ckpt::JobCkpt,
    /// [`Backend::max_time_min`] as last read, with slurm.conf's identity
    /// then: read again only when the file changed.
    pub max_time: parking_lot::Mutex<Option<(Option<crate::identity::Stamp>, Option<u32>)>>,
}

/// The umask the job was submitted with at home (`SLURM_UMASK`, which
/// sbatch sets from its own and slurmstepd applies), if it carries one.
pub fn submit_umask(req: &JobRequest) -> Option<libc::mode_t> {
    let v = req.env.iter().find_map(|e| e.strip_prefix("SLURM_UMASK="))?;
    libc::mode_t::from_str_radix(v, 8).ok().filter(|m| *m <= 0o777)
}

/// The resource limits Slurm propagates (`PropagateResourceLimits`): the
/// name sbatch gives each in `SLURM_RLIMIT_<NAME>`, the resource, and
/// bash's `ulimit` flag for it with the unit its number is in (getrlimit's
/// bytes or bash's 1024-byte blocks).
const PROPAGATED_RLIMITS: [(&str, libc::__rlimit_resource_t, char, u64); 10] = [
    ("CPU", libc::RLIMIT_CPU, 't', 1),
    ("FSIZE", libc::RLIMIT_FSIZE, 'f', 1024),
    ("DATA", libc::RLIMIT_DATA, 'd', 1024),
    ("STACK", libc::RLIMIT_STACK, 's', 1024),
    ("CORE", libc::RLIMIT_CORE, 'c', 1024),
    ("RSS", libc::RLIMIT_RSS, 'm', 1024),
    ("NPROC", libc::RLIMIT_NPROC, 'u', 1),
    ("NOFILE", libc::RLIMIT_NOFILE, 'n', 1),
    ("MEMLOCK", libc::RLIMIT_MEMLOCK, 'l', 1024),
    ("AS", libc::RLIMIT_AS, 'v', 1024),
];

/// One limit the job had at home: the soft limit sbatch runs with here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmitLimit {
    pub name: &'static str,
    pub resource: libc::__rlimit_resource_t,
    /// bash's `ulimit` flag for it and the unit of its number.
    pub ulimit: (char, u64),
    /// The soft limit sbatch had at home (`RLIM_INFINITY`: unlimited).
    pub wanted: u64,
}

/// The soft limits sbatch had at home (`SLURM_RLIMIT_<NAME>`, read by
/// getrlimit and sent in the job's environment), which slurmstepd gives
/// the job's tasks. An explicit `--propagate` (a value marked `U`) keeps the
/// job home, so every value here is sbatch's own default capture.
pub fn submit_limits(req: &JobRequest) -> Vec<SubmitLimit> {
    req.env
        .iter()
        .filter_map(|e| {
            let (name, v) = e.strip_prefix("SLURM_RLIMIT_")?.split_once('=')?;
            let &(name, resource, flag, unit) = PROPAGATED_RLIMITS.iter().find(|l| l.0 == name)?;
            let wanted = v.strip_prefix('U').unwrap_or(v).parse().ok()?;
            Some(SubmitLimit { name, resource, ulimit: (flag, unit), wanted })
        })
        .collect()
}

/// The job's soft limits that reach sbatch through sudo only in part: a
/// stack above 8 MiB (the kernel resets a setuid program's to 8 MiB) and
/// the core size (sudo sets it to 0), as `lease-exec` reads them
/// (`FLEET_RLIMIT_<NAME>`, bytes) to set them in the job.
pub fn in_job_limits(limits: &[SubmitLimit]) -> Vec<(&'static str, String)> {
    limits
        .iter()
        .filter_map(|l| match l.name {
            "STACK" => Some(("FLEET_RLIMIT_STACK", l.wanted.to_string())),
            "CORE" => Some(("FLEET_RLIMIT_CORE", l.wanted.to_string())),
            _ => None,
        })
        .collect()
}

/// The limits the target's sbatch is to run with, so that it captures the
/// submitter's (sbatch reads its own with getrlimit): each soft limit as it
/// was at home, but no higher than the agent's hard limit, which an
/// unprivileged process cannot raise (such a limit is named in `clamped`).
/// The hard limits stay the agent's: slurmstepd sets only the soft one.
pub fn limits_for_sbatch(wanted: &[SubmitLimit]) -> (Vec<(libc::__rlimit_resource_t, libc::rlimit)>, Vec<String>) {
    let mut set = Vec::new();
    let mut clamped = Vec::new();
    for w in wanted {
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one rlimit into `now`, which outlives the call.
        if unsafe { libc::getrlimit(w.resource, &mut now) } != 0 {
            continue;
        }
        // RLIM_INFINITY is the largest value: an unlimited hard limit caps nothing.
        let soft = w.wanted.min(now.rlim_max);
        if soft != w.wanted {
            clamped.push(format!("{} {} (wanted {})", w.name, soft, w.wanted));
        }
        set.push((w.resource, libc::rlimit { rlim_cur: soft, rlim_max: now.rlim_max }));
    }
    (set, clamped)
}

/// The `--time` that gives a job submitted here with `--time=UNLIMITED` at
/// home as long as this cluster lets it run: the default partition's
/// MaxTime (UNLIMITED where it has none). Without `--time` its DefaultTime
/// would apply instead; an UNLIMITED beyond a finite MaxTime would leave
/// it pending for good (PartitionTimeLimit). `None`: no default partition.
pub fn unlimited_time(sc: &slurm_conf::slurm::SlurmConf) -> Option<String> {
    Some(default_max_time(sc)?.map_or_else(|| "UNLIMITED".into(), |m| m.to_string()))
}

/// The default partition's `MaxTime` in minutes, where forwarded jobs run:
/// `Some(None)` unlimited (none set), `None` no default partition.
pub fn default_max_time(sc: &slurm_conf::slurm::SlurmConf) -> Option<Option<u32>> {
    use slurm_conf::slurm::TimeLimit;
    Some(match sc.default_partition()?.max_time {
        None | Some(TimeLimit::Unlimited) => None,
        Some(TimeLimit::Minutes(m)) => Some(m),
    })
}

/// sudo, by absolute path: the command's PATH is the job's.
const SUDO: &str = "/usr/bin/sudo";

/// The environment of a command the agent runs as a user: nothing of the
/// agent's own (`SLURM_CONF` is set beside it).
const MINIMAL_ENV: [(&str, &str); 2] = [("PATH", "/usr/local/bin:/usr/bin:/bin"), ("LANG", "C.UTF-8")];

const CMD_TIMEOUT: Duration = Duration::from_secs(30);

impl SlurmBackend {
    async fn run(&self, cmd: &str, args: &[String], stdin: Option<&[u8]>) -> Result<String> {
        let out = self.run_in(cmd, args, stdin, None, None, |_| {}).await?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Runs Slurm command `cmd`, as `as_user` through sudo when given, with
    /// the environment `env` (`None`: a minimal one as a user, the agent's
    /// own otherwise) and `setup` applied to the command last; returns its
    /// stdout.
    async fn run_in(
        &self,
        cmd: &str,
        args: &[String],
        stdin: Option<&[u8]>,
        env: Option<&[(String, String)]>,
        as_user: Option<&str>,
        setup: impl FnOnce(&mut Command),
    ) -> Result<Vec<u8>> {
        let mut c = match as_user {
            // -E keeps the environment (sudoers: SETENV); sudo still drops
            // the dangerous variables (LD_PRELOAD and the like), which is
            // why the job's own environment travels in --export-file.
            Some(u) => {
                let mut c = Command::new(SUDO);
                c.args(["-n", "-E", "-u", u, "--"]).arg(self.bin.join(cmd));
                c
            }
            None => Command::new(self.bin.join(cmd)),
        };
        match (env, as_user) {
            (Some(env), _) => {
                c.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
            }
            // As a user, never with the agent's own environment (its
            // object-store credentials, say): the command runs as that
            // user, who could read it from the process.
            (None, Some(_)) => {
                c.env_clear().envs(MINIMAL_ENV);
            }
            (None, None) => {}
        }
        c.args(args)
            .env("SLURM_CONF", &self.slurm_conf)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        setup(&mut c);
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
        Ok(out.stdout)
    }

    /// Can the agent submit as `user` (its sudo rule)? Used at start with a
    /// probe user and by `--check`.
    pub async fn check_sudo(&self, user: &str) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let me = std::fs::metadata("/proc/self").map(|m| m.uid()).context("reading /proc/self")?;
        let bin = self.bin.display();
        self.run_in("sbatch", &["--version".into()], None, None, Some(user), |_| {}).await.with_context(|| {
            format!(
                "sudo does not let the agent (uid {me}) run sbatch as {user}; it needs the sudoers rule \
                 `<agent user> ALL=(%<JobUserGroup>) NOPASSWD:SETENV: {bin}/sbatch, {bin}/scancel, {bin}/scontrol`"
            )
        })?;
        Ok(())
    }

    /// Whether the agent's user must be a Slurm operator here, and is:
    /// * under `PrivateData=jobs` (or `all`) only operators, administrators,
    ///   SlurmUser and root see other users' jobs, and the agent must see
    ///   every stand-in and every job it submitted as a user;
    /// * where `AccountingStorageEnforce` applies QOS and association limits,
    ///   stand-ins keep their job's time limit until they start (the plugin:
    ///   Slurm judges them against `MaxWall` as native jobs), and the agent
    ///   then lifts it (`lift_stand_in_limit`), which only an operator may.
    ///
    /// `AdminLevel=Operator` in accounting is the least Slurm role for both
    /// (it could also hold or cancel jobs, see ARCHITECTURE.md's threat
    /// model). `Ok(None)`: nothing needs it; `Ok(Some(note))`: fine, for
    /// the log; `Err`: what to change.
    pub async fn check_operator_role(&self, agent_user: &str) -> Result<Option<String>> {
        let conf = slurm_conf::slurm::SlurmConf::load(&self.slurm_conf)
            .map_err(|e| anyhow!("reading {}: {e}", self.slurm_conf.display()))?;
        let conf = conf.conf;
        let private = conf.get("PrivateData").unwrap_or("");
        let enforce = conf.get("AccountingStorageEnforce").unwrap_or("");
        let mut needs = Vec::new();
        if private_hides_jobs(private) {
            needs.push(format!(
                "PrivateData={private} hides other users' jobs from the agent ({agent_user}): \
                 it would lose track of stand-ins and forwarded jobs"
            ));
        }
        if slurm_conf::slurm::enforces_limits(enforce) {
            needs.push(format!(
                "AccountingStorageEnforce={enforce} gives stand-ins their job's time limit (MaxWall), \
                 which the agent ({agent_user}) must lift once the job is placed, or the job's wait at its \
                 target ends it"
            ));
        }
        if needs.is_empty() {
            return Ok(None);
        }
        let why = needs.join("; ");
        let slurm_user = conf.slurm_user.clone().unwrap_or_else(|| "root".into());
        if agent_user == "root" || agent_user == slurm_user {
            return Ok(Some(format!("{why}: the agent runs as {agent_user}, who may")));
        }
        let accounting = conf.get("AccountingStorageType").unwrap_or("accounting_storage/none");
        let hint = format!("sacctmgr -i modify user {agent_user} set AdminLevel=Operator");
        if accounting.ends_with("/none") {
            bail!(
                "{why}, and without accounting (AccountingStorageType={accounting}) no role can let it: \
                 enable accounting and run `{hint}`"
            );
        }
        let out = self
            .run(
                "sacctmgr",
                &[
                    "-n".into(),
                    "-P".into(),
                    "show".into(),
                    "user".into(),
                    agent_user.into(),
                    "format=AdminLevel".into(),
                ],
                None,
            )
            .await
            .with_context(|| format!("{why}: asking accounting for {agent_user}'s AdminLevel"))?;
        let level = out.lines().next().unwrap_or("").trim().to_ascii_lowercase();
        if level == "operator" || level == "administrator" {
            Ok(Some(format!("{why}: {agent_user} has AdminLevel={level}")))
        } else {
            bail!(
                "{why}, and {agent_user} has AdminLevel={}: run `{hint}`",
                if level.is_empty() { "none" } else { level.as_str() }
            )
        }
    }

    /// `squeue --json` for `args`, parsed.
    async fn squeue_json(&self, args: &[String]) -> Result<Vec<NativeJob>> {
        let mut a = vec!["--json".to_string()];
        a.extend_from_slice(args);
        let out = self.run_in("squeue", &a, None, None, None, |_| {}).await?;
        parse_jobs_json(&out)
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
            // An unbalanced ')' must not hide the commas after it.
            ')' => depth = (depth - 1).max(0),
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

/// The `sinfo -N -h -O` fields [`parse_sinfo`] reads.
pub const SINFO_FIELDS: &str =
    "NodeList:64,Partition:32,StateCompact:16,Gres:128,GresUsed:160,CPUs:8,Memory:16,Features:256,AllocMem:16";

/// Does a job in Slurm state `s` (squeue's long name) hold its
/// allocation? Those Fleet counts running ([`map_state`]: started,
/// stopped, ending), and two it counts waiting that hold one all the
/// same: configuring (its nodes booting) and suspended (it keeps its GRES).
fn holds_allocation(s: &str) -> bool {
    map_state(s) == JobState::Running || matches!(s, "CONFIGURING" | "SUSPENDED")
}

/// `squeue -h -o '%A %T'`: (pending, running, the ids of the jobs that
/// hold an allocation). Lines that do not parse are skipped.
pub fn parse_queue(out: &str) -> (u32, u32, Vec<u64>) {
    let (mut pending, mut running, mut holding) = (0u32, 0u32, Vec::new());
    for l in out.lines() {
        let mut f = l.split_whitespace();
        let (Some(id), Some(state)) = (f.next(), f.next()) else { continue };
        match state {
            "PENDING" => pending += 1,
            "RUNNING" => running += 1,
            _ => {}
        }
        if holds_allocation(state) {
            if let Ok(id) = id.parse() {
                holding.push(id);
            }
        }
    }
    holding.sort_unstable();
    holding.dedup();
    (pending, running, holding)
}

/// `sinfo -N -h -O` [`SINFO_FIELDS`] → nodes (node shapes for the
/// placement rule: CPUs, memory, features). `Memory` is the node's
/// `RealMemory`; `AllocMem` (last, absent from older field lists) what
/// jobs hold of it, which gives `memory_free_mb` (see [`memory_view`]).
pub fn parse_sinfo(out: &str) -> Vec<NodeCapacity> {
    let mut nodes: Vec<NodeCapacity> = Vec::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (name, part, state, gres, used, cpus, mem, features, alloc) = match f.as_slice() {
            [n, p, s, g, u] => (n, p, s, g, u, None, None, None, None),
            [n, p, s, g, u, c, m] => (n, p, s, g, u, Some(c), Some(m), Some(&"(null)"), None),
            [n, p, s, g, u, c, m, feat] => (n, p, s, g, u, Some(c), Some(m), Some(feat), None),
            [n, p, s, g, u, c, m, feat, a] => (n, p, s, g, u, Some(c), Some(m), Some(feat), Some(a)),
            _ => continue,
        };
        let memory_mb: u64 = mem.and_then(|m| m.trim_end_matches('+').parse().ok()).unwrap_or(0);
        let alloc_mb: Option<u64> = alloc.and_then(|a| a.parse().ok());
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
            cpus: cpus.and_then(|c| c.parse().ok()).unwrap_or(0),
            memory_mb,
            memory_free_mb: alloc_mb.filter(|_| memory_mb > 0).map(|a| memory_mb.saturating_sub(a)),
            features: features.map(|f| {
                if *f == "(null)" {
                    Vec::new()
                } else {
                    f.split(',').filter(|x| !x.is_empty()).map(str::to_string).collect()
                }
            }),
        });
    }
    nodes
}

/// What a heartbeat says of the nodes' memory: each node's `RealMemory`
/// always (slurmctld checks `--mem` against it when it selects nodes, also
/// under `CR_Core`, so a job larger than every node there would be refused
/// or pend forever), and memory free of jobs only where it is allocated
/// (`memory_scheduled`: `SelectTypeParameters=CR_*_Memory`): elsewhere
/// Slurm allocates none, and `AllocMem` says nothing.
pub fn memory_view(nodes: &mut [NodeCapacity], memory_scheduled: bool) {
    if !memory_scheduled {
        nodes.iter_mut().for_each(|n| n.memory_free_mb = None);
    }
}

/// Slurm's job state name → Fleet's.
pub fn map_state(s: &str) -> JobState {
    match s.split_whitespace().next().unwrap_or("") {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" | "SUSPENDED" => {
            JobState::Pending
        }
        "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" | "RESIZING" | "STOPPED" => JobState::Running,
        "COMPLETED" => JobState::Completed,
        "CANCELLED" => JobState::Cancelled,
        "FAILED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE" | "PREEMPTED" => {
            JobState::Failed
        }
        _ => JobState::Pending,
    }
}

/// Slurm's pending reasons (`state_reason`, `job_state_reason_string` of
/// 22.05) that do not clear while the job and the site's limits stay as
/// they are: a per-job (or per-node) maximum or minimum of the job's QOS or
/// association there, its partition's time limit, an account or QOS not
/// valid there. A native job with one of them waits until an admin changes
/// the limit; the counts that clear as other jobs end (`…PerUser…`,
/// `…PerAccount…`, `AssocGrp…`, `QOSGrp…`, `…JobsLimit`) are not among
/// them, and neither is `PartitionNodeLimit`, which Slurm also shows while
/// the nodes a job needs are down. What the limit is, in words; `None` for
/// every other reason.
pub fn held_by_limit(reason: &str) -> Option<&'static str> {
    let per = |r: &str| r.contains("PerJob") || r.contains("PerNode");
    match reason.trim() {
        "PartitionTimeLimit" => Some("its time limit is above its partition's there"),
        "InvalidAccount" => Some("its account is not valid there"),
        "InvalidQOS" => Some("its QOS is not valid there"),
        r if r.starts_with("QOSMax") && per(r) => Some("it asks for more than a per-job limit of its QOS there"),
        r if r.starts_with("AssocMax") && per(r) => {
            Some("it asks for more than a per-job limit of its association there")
        }
        r if r.starts_with("QOSMin") => Some("it asks for less than its QOS's per-job minimum there"),
        _ => None,
    }
}

/// Why Slurm refuses the agent a raise of a running job's limit, and the fix.
const RAISE_NEEDS_OPERATOR: &str =
    "raising a running job's limit needs a Slurm operator: sacctmgr modify user <agent user> set AdminLevel=Operator";

/// Largest JSON document read from a Slurm command.
pub const MAX_JSON_BYTES: usize = 64 << 20;

/// A number in any of Slurm's JSON dialects (`fleet_api::slurm_json::number`).
fn num(v: Option<&serde_json::Value>) -> Option<i64> {
    fleet_api::slurm_json::number(v?)
}

/// A state: a string (22.05) or a list of flags, base state first (23.02+).
fn state_of(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(a)) => a.first().and_then(|s| s.as_str()).unwrap_or("").to_string(),
        _ => String::new(),
    }
}

fn text(v: Option<&serde_json::Value>) -> String {
    v.and_then(|v| v.as_str()).unwrap_or("").to_string()
}

/// (exit code, signal) from Slurm's `exit_code`: a wait(2) status in
/// 22.05 (`code << 8 | signal`), an object with `return_code` and
/// `signal` in 23.02+.
fn exit_of(v: Option<&serde_json::Value>) -> (Option<i32>, Option<i32>) {
    match v {
        Some(serde_json::Value::Object(o)) => {
            let code = num(o.get("return_code")).and_then(|n| i32::try_from(n).ok());
            let sig = o
                .get("signal")
                .and_then(|s| num(s.get("id")).or_else(|| num(Some(s))))
                .and_then(|n| i32::try_from(n).ok());
            (code, sig)
        }
        other => match num(other) {
            Some(w) if (0..=0xffff).contains(&w) => (Some(((w >> 8) & 0xff) as i32), Some((w & 0x7f) as i32)),
            _ => (None, None),
        },
    }
}

/// `squeue --json` / `scontrol show job --json` → jobs. Every field comes
/// from a typed JSON member, so a job name or comment holding
/// `JobState=COMPLETED` or a newline changes nothing. Elements of arrays
/// and heterogeneous jobs are skipped (Fleet never creates them).
pub fn parse_jobs_json(doc: &[u8]) -> Result<Vec<NativeJob>> {
    parse_jobs_json_with(doc, false)
}

/// [`parse_jobs_json`], with job array elements (each with its own job id,
/// `array_job_id` and `array_task_id`) when `arrays`: the stand-ins of a
/// deferred array are such elements.
pub fn parse_jobs_json_with(doc: &[u8], arrays: bool) -> Result<Vec<NativeJob>> {
    if doc.len() > MAX_JSON_BYTES {
        bail!("Slurm's JSON is {} bytes, more than the {} accepted", doc.len(), MAX_JSON_BYTES);
    }
    let v: serde_json::Value = serde_json::from_slice(doc).context("Slurm printed invalid JSON")?;
    let Some(jobs) = v.get("jobs").and_then(|j| j.as_array()) else {
        bail!("Slurm's JSON has no `jobs` list");
    };
    let mut out = Vec::with_capacity(jobs.len());
    for j in jobs {
        let Some(id) = num(j.get("job_id")).and_then(|n| u64::try_from(n).ok()) else {
            continue;
        };
        let array_task = num(j.get("array_task_id")).and_then(|n| u32::try_from(n).ok());
        if (array_task.is_some() && !arrays) || num(j.get("het_job_id")).is_some_and(|h| h != 0) {
            continue;
        }
        let raw_state = state_of(j.get("job_state"));
        if raw_state.is_empty() {
            continue;
        }
        let mut job = NativeJob::new(id, &raw_state);
        if job.state.is_terminal() {
            let (code, sig) = exit_of(j.get("exit_code"));
            job.exit_code = code;
            job.signal = sig.filter(|&s| s != 0);
        }
        job.node_list = text(j.get("nodes"));
        job.reason = text(j.get("state_reason")).trim_start_matches("None").to_string();
        job.description = text(j.get("state_description"));
        job.submit_time = num(j.get("submit_time"));
        job.user_id = num(j.get("user_id")).and_then(|n| u32::try_from(n).ok());
        job.restarts = num(j.get("restart_cnt")).and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
        // A pending job's start time is the scheduler's estimate: only a
        // started one's is a start.
        if job.state != JobState::Pending {
            job.start_time = num(j.get("start_time")).filter(|&t| t > 0);
        }
        job.partition = text(j.get("partition"));
        job.admin_comment = text(j.get("admin_comment"));
        job.work_dir = text(j.get("current_working_directory"));
        // Minutes; absent (22.05) or not a number (23.02+'s `infinite`) when unlimited.
        job.time_limit_min =
            num(j.get("time_limit")).and_then(|n| u32::try_from(n).ok()).filter(|n| (1..u32::MAX - 1).contains(n));
        if let Some(t) = array_task {
            job.array_task_id = Some(t);
            job.array_job_id = num(j.get("array_job_id")).and_then(|n| u64::try_from(n).ok()).filter(|&n| n != 0);
        }
        out.push(job);
    }
    Ok(out)
}

/// `sacct -X -n -P -D -o JobIDRaw,State,ExitCode,Submit,UID[,WorkDir]` →
/// finished jobs. None of the first five columns can hold user text; the
/// working directory, which can, is last and taken whole (a `|` in it
/// splits nothing). With `-D` a requeued job has one row per run, oldest
/// first, each but the last `REQUEUED` (with the submit time of that run):
/// a row's `restarts` is the number of `REQUEUED` rows of its id before
/// it, as squeue's `restart_cnt`.
pub fn parse_sacct(out: &str) -> Vec<NativeJob> {
    parse_sacct_rows(out).into_iter().map(|(_, j)| j).collect()
}

/// Accounting rows a user cannot forge: `trusted` is sacct's answer
/// without WorkDir (no column a user controls), `with_dirs` the same query
/// with it. A newline in a WorkDir (which an owner may set on a pending
/// job) makes `with_dirs` hold lines of the user's choosing, rows of other
/// jobs included; so every row comes from `trusted`, and takes the
/// directories of the `with_dirs` lines whose first five columns are that
/// row's, byte for byte. Several directories (a forged line beside the real
/// one): one row per directory, each with the trusted state, so a forged
/// line can neither add a row nor change what a row says.
pub fn parse_sacct_checked(trusted: &str, with_dirs: &str) -> Vec<NativeJob> {
    let mut dirs: std::collections::HashMap<&str, Vec<String>> = std::collections::HashMap::new();
    for (key, j) in parse_sacct_rows(with_dirs) {
        let d = dirs.entry(key).or_default();
        if !d.contains(&j.work_dir) {
            d.push(j.work_dir);
        }
    }
    let mut out = Vec::new();
    for (key, j) in parse_sacct_rows(trusted) {
        match dirs.get(key).map(Vec::as_slice) {
            None | Some([]) => out.push(j),
            Some(ds) => out.extend(ds.iter().map(|d| NativeJob { work_dir: d.clone(), ..j.clone() })),
        }
    }
    out
}

/// The rows of `out` with the text of each one's first five columns.
fn parse_sacct_rows(out: &str) -> Vec<(&str, NativeJob)> {
    let mut requeues: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(6, '|').collect();
            let (id, state, exit, submit, uid, work_dir) = match f.as_slice() {
                [id, state, exit, submit, uid] => (id, state, exit, submit, uid, ""),
                [id, state, exit, submit, uid, wd] => (id, state, exit, submit, uid, *wd),
                _ => return None,
            };
            let key = if f.len() == 6 { &l[..l.len() - work_dir.len() - 1] } else { l };
            let native_id = id.parse().ok()?;
            let mut j = NativeJob::new(native_id, state);
            let (code, sig) = exit.split_once(':')?;
            if j.state.is_terminal() {
                j.exit_code = code.parse().ok();
                j.signal = sig.parse().ok().filter(|&s: &i32| s != 0);
            }
            j.submit_time = parse_slurm_time(submit);
            j.user_id = uid.parse().ok();
            j.work_dir = work_dir.to_string();
            let n = requeues.entry(native_id).or_default();
            j.restarts = *n;
            if j.raw_state == "REQUEUED" {
                *n = n.saturating_add(1);
            }
            Some((key, j))
        })
        .collect()
}

/// `2026-12-01T14:53:07` (the controller's local time) → epoch seconds.
pub fn parse_slurm_time(s: &str) -> Option<i64> {
    let (d, t) = s.split_once('T')?;
    let d: Vec<i64> = d.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let t: Vec<i64> = t.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let ([y, m, day], [hh, mm, ss]) = (d.as_slice(), t.as_slice()) else {
        return None;
    };
    // A real date and time (leap second included); anything else, e.g. a
    // year whose seconds overflow, is no time at all.
    if !((1970..=9999).contains(y)
        && (1..=12).contains(m)
        && (1..=31).contains(day)
        && (0..=23).contains(hh)
        && (0..=59).contains(mm)
        && (0..=60).contains(ss))
    {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm), then the local offset.
    let (y, m) = if *m <= 2 { (y - 1, m + 9) } else { (*y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let local = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(local - local_utc_offset(local))
}

/// The local time zone's offset from UTC (seconds) around `t`.
fn local_utc_offset(t: i64) -> i64 {
    let tt = t as libc::time_t;
    // SAFETY: `tm` is plain data written by localtime_r; both pointers are
    // valid for the call.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&tt, &mut tm).is_null() {
            return 0;
        }
        tm.tm_gmtoff
    }
}

/// The environment sbatch runs with at the target, so that the job gets the
/// one it had at the origin (sbatch's default `--export=ALL` captures it):
/// the origin's, less what names the origin's host and user or steers
/// Slurm commands there (`SLURM_*`, `SBATCH_*`, ...), with `HOME` set to
/// the job's directory here. `None` when the origin sent no environment.
/// HOME of a job submitted for `user`: their home here as `Policy::resolve`
/// read it with the account (no second look at /etc/passwd), or the job
/// directory `dir` where they have none.
pub fn job_home(user: &LocalUser, dir: &std::path::Path) -> PathBuf {
    user.home.clone().filter(|h| h.is_dir()).unwrap_or_else(|| dir.to_path_buf())
}

pub fn submit_env(req: &JobRequest, home: &std::path::Path) -> Option<Vec<(String, String)>> {
    const DROP: &[&str] = &[
        "HOME",
        "USER",
        "LOGNAME",
        "MAIL",
        "SHELL",
        "PWD",
        "OLDPWD",
        "HOSTNAME",
        "SHLVL",
        "_",
        "TMPDIR",
        "XDG_RUNTIME_DIR",
        "XDG_SESSION_ID",
        "DISPLAY",
        "KRB5CCNAME",
        "SSH_AUTH_SOCK",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "SSH_TTY",
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
    env.push(("HOME".into(), home.display().to_string()));
    Some(env)
}

/// Does the job's stderr go where its stdout goes at home (no `-e`, or the
/// same pattern as `-o`), so that sbatch there gave both one file?
pub fn stderr_merged(req: &JobRequest) -> bool {
    match req.std_err.as_deref() {
        None | Some("") => true,
        Some(e) => req.std_out.as_deref() == Some(e),
    }
}

/// sbatch options that reproduce the job's resources at this cluster.
/// The sbatch arguments of a run, and Fleet's variables that travel in
/// the job's environment instead of in `--export` (see below).
pub fn sbatch_args(
    id: &str,
    req: &JobRequest,
    dir: &std::path::Path,
    paths: &crate::backend::OutputPaths,
    ckpt_env: &[(&'static str, String)],
) -> (Vec<String>, Vec<(String, String)>) {
    let mut a = vec![
        "--parsable".to_string(),
        format!("--job-name={}", req.name.as_deref().unwrap_or(id)),
        format!("--chdir={}", dir.display()),
        format!("--output={}", paths.stdout.display()),
    ];
    // Without its own `-e` at home, the job's stderr is its stdout file
    // there (one descriptor: the lines interleave as written): the same
    // here, relayed as stdout. Otherwise a file of its own.
    if !stderr_merged(req) {
        a.push(format!("--error={}", paths.stderr.display()));
    }
    // The job's resources and options as the user gave them, `--export` in
    // the job's own mode plus Fleet's variables (FLEET_FORWARDED_JOB: this
    // cluster's plugin never forwards the job again).
    // FLEET_CKPT_URL / FLEET_RESUME_FROM: where it checkpoints and what it resumes from.
    let mut env = vec![("FLEET_JOB_ID", id), ("FLEET_ORIGIN", &req.origin), ("FLEET_FORWARDED_JOB", id)];
    env.extend(fleet_api::sbatch::checkpoint_env(req));
    // Where the run's checkpoint token and the stores are (crate::ckpt).
    env.extend(ckpt_env.iter().map(|(k, v)| (*k, v.as_str())));
    // An element of an origin job array: the SLURM_ARRAY_* variables Slurm
    // set for it there (checked names, decimal values).
    for e in &req.array_env {
        if let Some((k, v)) = e.split_once('=') {
            if fleet_api::deferred::ARRAY_VARS.contains(&k) && !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                env.push((k, v));
            }
        }
    }
    // `--export=ALL` (the default) stays plain ALL: Slurm's sbatch reads any
    // `--export=ALL,<vars>` as a list, which sets SLURM_GET_USER_ENV, and
    // slurmd then loads the user's login environment before it starts the
    // job (0.1 s, at times over 1 s, and variables the origin's job never
    // had). Fleet's variables then travel where sbatch takes the job's
    // environment from: the export file or sbatch's own environment. Any
    // other mode names its variables as natively (Slurm loads the login
    // environment there too).
    if matches!(req.export_mode(), fleet_api::ExportMode::All) {
        a.extend(fleet_api::sbatch::sbatch_options(req));
        return (a, env.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    }
    a.extend(fleet_api::sbatch::sbatch_options_with_env(req, &env));
    (a, Vec::new())
}

/// Does the job's `--export` mode carry the submission environment?
pub fn exports_environment(req: &JobRequest) -> bool {
    matches!(req.export_mode(), fleet_api::ExportMode::All | fleet_api::ExportMode::List { all: true, .. })
}

impl Backend for SlurmBackend {
    fn start_gate(&self) -> bool {
        self.ckpt.gates_runs()
    }

    /// slurm.conf's, read again when the file changed (a heartbeat every
    /// second must not parse it every second; a partition changed with
    /// `scontrol update` alone is not seen).
    fn max_time_min(&self) -> Option<u32> {
        let now = crate::identity::stamp(&self.slurm_conf);
        let mut cached = self.max_time.lock();
        if let Some((_, max)) = cached.as_ref().filter(|(stamp, _)| *stamp == now) {
            return *max;
        }
        let max = slurm_conf::slurm::SlurmConf::load(&self.slurm_conf)
            .ok()
            .and_then(|sc| default_max_time(&sc.conf).flatten());
        *cached = Some((now, max));
        max
    }

    async fn capacity(&self) -> Result<Capacity> {
        // The queue first: a job that starts between the two reads is
        // counted taken by sinfo and not named holding, so its GPUs are
        // counted twice for a moment, never free when they are not.
        let squeue = self.run("squeue", &["-h".into(), "-o".into(), "%A %T".into()], None).await?;
        let sinfo = self.run("sinfo", &["-N".into(), "-h".into(), "-O".into(), SINFO_FIELDS.into()], None).await?;
        let (pending, running, holding) = parse_queue(&squeue);
        Ok(Capacity { nodes: parse_sinfo(&sinfo), pending, running, holding })
    }

    async fn submit(&self, id: &str, req: &JobRequest, user: &LocalUser) -> Result<u64> {
        let script = req.script.as_deref().ok_or_else(|| anyhow!("job {id} carries no script"))?;
        let dir = self.job_dir(id);
        if let Some(parent) = dir.parent() {
            tokio::fs::create_dir_all(parent).await.with_context(|| format!("creating {}", parent.display()))?;
        }
        crate::jobdir::create(&dir, user.uid)?;
        let paths = self.output_paths(id);
        let mut ckpt_env = self.ckpt.prepare(id, &dir, &user.name)?;
        // The run under its in-job lease (docs/failover.md): a watchdog in
        // the allocation stops it once the meta-scheduler stops vouching for it.
        let wrapped = self.ckpt.wrap(&dir, script, req.fleet.epoch, &mut ckpt_env)?;
        if req.fleet.start_gated && wrapped.is_none() {
            // Placed before its origin confirmed the stand-in runs: without
            // the lease that holds its script, it must not be submitted.
            anyhow::bail!("job {id} was placed early and must start under its in-job lease, which this run cannot have (JobLeaseMs, CkptHelper, the script's #! line)");
        }
        // The job's soft limits at home: with an export file, in it (sbatch
        // then sends no SLURM_RLIMIT_* of its own, and slurmstepd, root,
        // sets them all); without one, sbatch reads its own, set below, and
        // those sudo cannot hand it are set by the run's `lease-exec`.
        let home_limits = submit_limits(req);
        let home = job_home(user, &dir);
        let mut env = submit_env(req, &home).filter(|_| exports_environment(req));
        if wrapped.is_some() && env.is_none() {
            ckpt_env.extend(in_job_limits(&home_limits));
        }
        let script = wrapped.as_deref().unwrap_or(script);
        // The script's own directives were read by sbatch at the origin:
        // here they are comments, so that only what the request carries
        // acts (fleet_api::sbatch::without_directives).
        let neutral = fleet_api::sbatch::without_directives(script);
        let script = neutral.as_deref().unwrap_or(script);
        let (mut args, fleet_env) = sbatch_args(id, req, &dir, &paths, &ckpt_env);
        if let Some(a) = &user.account {
            args.push(format!("--account={a}"));
        }
        if req.time_unlimited && req.time_limit_min.is_none() {
            // `--time=UNLIMITED` at home: the longest this cluster allows.
            match slurm_conf::slurm::SlurmConf::load(&self.slurm_conf) {
                Ok(sc) => args.extend(unlimited_time(&sc.conf).map(|t| format!("--time={t}"))),
                Err(e) => tracing::warn!(%id, "--time=UNLIMITED gets this cluster's DefaultTime: {e}"),
            }
        }
        // The job's environment as sbatch captured it at the origin, read by
        // sbatch itself (sudo would strip LD_*, PYTHONPATH and the like).
        // HOME is the user's home here, as for a job they submitted here
        // themselves (the job directory where they have none).
        if let Some(env) = &mut env {
            // With an export file sbatch takes nothing from its own
            // environment: the soft limits the job had at home (as sbatch
            // sent them there) and Fleet's variables (if not in --export)
            // go in it, after the job's (which holds no SLURM_* or FLEET_*).
            env.extend(home_limits.iter().map(|l| (format!("SLURM_RLIMIT_{}", l.name), l.wanted.to_string())));
            env.extend(fleet_env.iter().cloned());
            let f = dir.join(".fleet-env");
            crate::jobdir::write_private(&f, &crate::jobdir::export_file_bytes(env))?;
            args.push(format!("--export-file={}", f.display()));
        }
        // sbatch itself runs in a minimal environment: nothing of the agent's
        // reaches the job (but Fleet's variables, without an export file).
        let mut base_env: Vec<(String, String)> =
            MINIMAL_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        base_env.push(("HOME".to_string(), home.display().to_string()));
        if env.is_none() {
            base_env.extend(fleet_env);
            // The names of an --export list whose values could not be
            // given in it: sbatch looks them up in its own environment, as
            // it did in the submitter's at home (not sbatch's own options).
            for (k, v) in fleet_api::sbatch::export_lookups(req) {
                let sbatch_reads = ["SBATCH_", "SALLOC_", "SRUN_", "SLURM_"].iter().any(|p| k.starts_with(p));
                if !sbatch_reads && !base_env.iter().any(|(b, _)| *b == k) {
                    base_env.push((k, v));
                }
            }
        }
        // sbatch runs where the job does (its SLURM_SUBMIT_DIR: `cd
        // $SLURM_SUBMIT_DIR` finds the job's directory, not the agent's),
        // with the umask it had at home, which it gives the job (the
        // sudoers rule keeps it: `Defaults:fleet umask=0777`).
        // Without an export file, its soft resource limits too (`ulimit -n
        // 4096` and the like), which sbatch reads and slurmstepd gives the
        // job's tasks.
        let umask = submit_umask(req);
        let (limits, clamped) = if env.is_some() { (Vec::new(), Vec::new()) } else { limits_for_sbatch(&home_limits) };
        if !clamped.is_empty() {
            tracing::warn!(%id, "the job's limits are above the agent's hard limits and run at those: {}", clamped.join(", "));
        }
        let setup = |c: &mut Command| {
            c.current_dir(&dir);
            if umask.is_some() || !limits.is_empty() {
                // SAFETY: umask(2) and setrlimit(2) are async-signal-safe and
                // touch only the child; `limits` is moved in, nothing allocates.
                unsafe {
                    c.pre_exec(move || {
                        if let Some(m) = umask {
                            libc::umask(m);
                        }
                        for (resource, l) in &limits {
                            // Lowering a soft limit, or raising it up to the
                            // hard one, cannot fail: nothing to report.
                            libc::setrlimit(*resource, l);
                        }
                        Ok(())
                    });
                }
            }
        };
        // The script's arguments: sbatch takes them after a script file
        // (on its standard input it takes none), written for the user to read.
        let stdin = if req.script_args.is_empty() {
            Some(script)
        } else {
            let f = dir.join(".fleet-batch");
            crate::jobdir::write_private(&f, script)?;
            args.push(f.display().to_string());
            args.extend(req.script_args.iter().cloned());
            None
        };
        let out = self.run_in("sbatch", &args, stdin, Some(&base_env), Some(&user.name), setup).await?;
        let out = String::from_utf8_lossy(&out);
        let first = out.trim().split(';').next().unwrap_or("");
        first.parse().with_context(|| format!("sbatch printed {:?}, expected a job id", out.trim()))
    }

    async fn status(&self, ids: &[u64]) -> Result<Vec<NativeJob>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        // -t all: finished jobs too, while slurmctld still holds them.
        let jobs = self.squeue_json(&["-a".into(), "-t".into(), "all".into(), "-j".into(), list]).await;
        match jobs {
            Ok(j) => Ok(j),
            // squeue -j with only unknown ids fails ("Invalid job id").
            Err(e) if format!("{e:#}").contains("Invalid job id") => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    async fn accounting(&self, ids: &[u64]) -> Result<Vec<NativeJob>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let args = ["-X", "-n", "-P", "-D", "-j", &list].map(String::from);
        match self.sacct_checked(&args).await {
            Ok(rows) => Ok(rows),
            // No accounting at this site: nothing to learn there.
            Err(e)
                if format!("{e:#}").contains("accounting_storage/none")
                    || format!("{e:#}").contains("not running a supported accounting_storage") =>
            {
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }

    async fn find_submitted(&self, id: &str, uid: u32, since: f64) -> Result<Vec<NativeJob>> {
        let dir = self.job_dir(id).display().to_string();
        let mine = |j: &NativeJob| j.user_id == Some(uid) && j.work_dir == dir;
        let queued = self.squeue_json(&["-a".into(), "-t".into(), "all".into(), "-u".into(), uid.to_string()]).await?;
        let found: Vec<NativeJob> = queued.into_iter().filter(mine).collect();
        if !found.is_empty() {
            return Ok(found);
        }
        // Finished and already gone from the queue: accounting, from a
        // little before the agent accepted the job.
        let back = (crate::now() - since).max(0.0) as u64 + 300;
        let args = ["-X", "-n", "-P", "-D", "-u", &uid.to_string(), "-S", &format!("now-{back}")].map(String::from);
        match self.sacct_checked(&args).await {
            Ok(rows) => Ok(rows.into_iter().filter(mine).collect()),
            Err(e) if format!("{e:#}").contains("accounting_storage") => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    async fn stand_ins(&self, partition: &str) -> Result<Vec<NativeJob>> {
        // Array elements too: a deferred GPU array's stand-ins are its elements.
        let args = ["--json", "-a", "-t", "all", "-p", partition].map(String::from);
        let out = self.run_in("squeue", &args, None, None, None, |_| {}).await?;
        parse_jobs_json_with(&out, true)
    }

    async fn stand_ins_by_id(&self, partition: &str, ids: &[u64]) -> Result<Vec<NativeJob>> {
        // One slurm_load_job RPC per id (see libslurm.rs); the JSON dump of
        // every job when the library is not of this release or a call fails.
        let want = ids.to_vec();
        let fast = tokio::task::spawn_blocking(move || {
            want.iter().map(|&id| crate::libslurm::load_job(id)).collect::<Option<Vec<_>>>()
        })
        .await
        .ok()
        .flatten();
        match fast {
            // Whatever their partition, as the JSON path: the caller checks it.
            Some(jobs) => Ok(jobs),
            None => {
                let all = self.stand_ins(partition).await?;
                Ok(all.into_iter().filter(|j| ids.contains(&j.native_id)).collect())
            }
        }
    }

    async fn stand_ins_brief(&self, partition: &str) -> Result<Vec<NativeJob>> {
        // One slurm_load_jobs RPC (see libslurm.rs) instead of a squeue
        // process and its JSON; the JSON when the library is off or fails.
        match tokio::task::spawn_blocking(crate::libslurm::load_jobs).await.ok().flatten() {
            Some(jobs) => Ok(jobs),
            None => self.stand_ins(partition).await,
        }
    }

    async fn batch_script(&self, native_id: u64, user: &str) -> Result<Vec<u8>> {
        // As the agent through libslurm first (no process); an agent that
        // is not an operator (or a failed call) goes on to scontrol below.
        if let Some(out) =
            tokio::task::spawn_blocking(move || crate::libslurm::batch_script(native_id)).await.ok().flatten()
        {
            return Ok(out);
        }
        let args = ["write".to_string(), "batch_script".to_string(), native_id.to_string(), "-".to_string()];
        // An operator (or root) reads any job's script; otherwise the job's
        // owner can, through the agent's sudo rule.
        // (22.05's scontrol exits 0 with nothing on stdout when refused.)
        let direct = match self.run_in("scontrol", &args, None, None, None, |_| {}).await {
            Ok(out) if !out.is_empty() => return Ok(out),
            Ok(_) => anyhow!("no script printed"),
            Err(e) => e,
        };
        let out = self
            .run_in("scontrol", &args, None, None, Some(user), |_| {})
            .await
            .with_context(|| format!("as the agent: {direct:#}; as {user}"))?;
        if out.is_empty() {
            bail!("scontrol printed no script for job {native_id}, as the agent or as {user}");
        }
        Ok(out)
    }

    async fn cancel(&self, native_id: u64, user: &str) -> Result<()> {
        self.run_in("scancel", &[native_id.to_string()], None, None, Some(user), |_| {}).await?;
        Ok(())
    }

    async fn signal(&self, native_id: u64, user: &str, signal: &str, scope: crate::backend::SignalScope) -> Result<()> {
        if fleet_api::api::check_signal_name(signal).is_err() {
            bail!("refusing to send signal {signal:?}");
        }
        let mut args = vec![format!("--signal={signal}")];
        args.extend(scope.scancel_flag().map(str::to_string));
        args.push(native_id.to_string());
        self.run_in("scancel", &args, None, None, Some(user), |_| {}).await?;
        Ok(())
    }

    async fn set_time_limit(&self, native_id: u64, user: &str, minutes: u32, raise: bool) -> Result<()> {
        let args = vec!["update".to_string(), format!("JobId={native_id}"), format!("TimeLimit={minutes}")];
        // As the job's user first (an owner may lower a limit, and raise a
        // pending job's up to MaxTime); what Slurm refuses the owner (a
        // running job's raise) as the agent itself, which Slurm allows an
        // operator (the role the agent holds where PrivateData hides jobs),
        // but only for a raise an operator made at home: the owner's own
        // update of a stand-in (which has no limit, so Slurm at home lets
        // them set any) must not borrow the agent's rights here.
        let as_user = match self.run_in("scontrol", &args, None, None, Some(user), |_| {}).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if !raise {
            bail!("as {user}: {as_user:#} (the job's owner asked for it at home: not set with the agent's rights)");
        }
        // An operator at home is none here: with the agent's rights, never
        // past the job's partition's MaxTime at this cluster.
        let max_time = self.partition_max_time(native_id).await.with_context(|| {
            format!("as {user}: {as_user:#}; not raised with the agent's rights: its partition's MaxTime is unknown")
        })?;
        let capped = raise_within(minutes, &max_time).map_err(|e| anyhow!("partition MaxTime: {e}"))?;
        if capped < minutes {
            tracing::warn!(native_id, asked = minutes, max_time = %max_time,
                "a raise from the origin is capped at the partition's MaxTime here");
        }
        let args = vec!["update".to_string(), format!("JobId={native_id}"), format!("TimeLimit={capped}")];
        self.run_in("scontrol", &args, None, None, None, |_| {})
            .await
            .map(drop)
            .map_err(|e| anyhow!("as {user}: {as_user:#}; as the agent: {e:#} ({RAISE_NEEDS_OPERATOR})"))
    }

    async fn lift_stand_in_limit(&self, native_id: u64) -> Result<()> {
        let args = vec!["update".to_string(), format!("JobId={native_id}"), "TimeLimit=UNLIMITED".to_string()];
        self.run_in("scontrol", &args, None, None, None, |_| {})
            .await
            .map(drop)
            .map_err(|e| anyhow!("{e:#} ({RAISE_NEEDS_OPERATOR})"))
    }

    fn job_dir(&self, id: &str) -> PathBuf {
        crate::jobdir::dir_of(&self.spool, id)
    }
}

impl SlurmBackend {
    /// `sacct <args>` read as [`parse_sacct_checked`]: once without the
    /// WorkDir column and once with it.
    async fn sacct_checked(&self, args: &[String]) -> Result<Vec<NativeJob>> {
        let with = |cols: &str| args.iter().cloned().chain(["-o".to_string(), cols.to_string()]).collect::<Vec<_>>();
        let trusted = self.run("sacct", &with("JobIDRaw,State,ExitCode,Submit,UID"), None).await?;
        let with_dirs = self.run("sacct", &with("JobIDRaw,State,ExitCode,Submit,UID,WorkDir"), None).await?;
        Ok(parse_sacct_checked(&trusted, &with_dirs))
    }

    /// `MaxTime` of the partition job `native_id` runs in (as scontrol
    /// prints it: `UNLIMITED`, `2-00:00:00`, ...).
    async fn partition_max_time(&self, native_id: u64) -> Result<String> {
        let field = |text: &str, key: &str| {
            text.split_whitespace().find_map(|w| w.strip_prefix(key)).map(str::to_string).filter(|v| !v.is_empty())
        };
        let job =
            self.run("scontrol", &["-o".into(), "show".into(), "job".into(), native_id.to_string()], None).await?;
        let part = field(&job, "Partition=").ok_or_else(|| anyhow!("job {native_id} names no partition"))?;
        let p = self.run("scontrol", &["-o".into(), "show".into(), "partition".into(), part.clone()], None).await?;
        field(&p, "MaxTime=").ok_or_else(|| anyhow!("partition {part} shows no MaxTime"))
    }
}

/// A raise to `minutes` carried out with the agent's operator rights, within
/// the partition's `max_time` (pure).
pub fn raise_within(minutes: u32, max_time: &str) -> std::result::Result<u32, String> {
    Ok(match slurm_conf::parse_time_minutes(max_time)? {
        Some(max) => minutes.min(max),
        None => minutes,
    })
}

/// Does slurm.conf's `PrivateData` value hide other users' jobs?
pub fn private_hides_jobs(value: &str) -> bool {
    value.split(',').map(|v| v.trim().to_ascii_lowercase()).any(|v| v == "jobs" || v == "all")
}

#[cfg(test)]
mod tests {
    /// The reasons a native job waits on until an admin changes a limit,
    /// as Slurm 22.05 names them, against those that clear as other jobs
    /// end or nodes come back.
    #[test]
    fn only_per_job_limits_hold_a_job_for_good() {
        use super::held_by_limit;
        for r in [
            "PartitionTimeLimit",
            "QOSMaxWallDurationPerJobLimit",
            "AssocMaxWallDurationPerJobLimit",
            "QOSMaxGRESPerJob",
            "AssocMaxGRESPerNode",
            "QOSMaxCpuMinutesPerJobLimit",
            "AssocMaxNodePerJobLimit",
            "QOSMinGRES",
            "QOSMinCpuNotSatisfied",
            "InvalidAccount",
            "InvalidQOS",
        ] {
            assert!(held_by_limit(r).is_some(), "{r}");
        }
        assert_eq!(
            held_by_limit(" AssocMaxMemPerJob"),
            Some("it asks for more than a per-job limit of its association there")
        );
        for r in [
            "",
            "None",
            "Resources",
            "Priority",
            "Dependency",
            "JobHeldUser",
            "JobHeldAdmin",
            "PartitionNodeLimit",
            "PartitionDown",
            "ReqNodeNotAvail, UnavailableNodes:alpha1",
            "QOSMaxJobsPerUserLimit",
            "QOSMaxSubmitJobPerUserLimit",
            "QOSMaxGRESPerUser",
            "QOSMaxGRESPerAccount",
            "AssocMaxJobsLimit",
            "AssocGrpGRES",
            "QOSGrpGRESRunMinutes",
        ] {
            assert_eq!(held_by_limit(r), None, "{r}");
        }
    }

    /// A command run as a user gets none of the agent's environment (its
    /// object-store keys, say): the user could read it from the process.
    /// Runs through the real sudo as root (as CI does); elsewhere it says
    /// so and checks nothing.
    #[test]
    fn a_command_run_as_a_user_gets_none_of_the_agents_environment() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 || !std::path::Path::new(super::SUDO).exists() {
            eprintln!("skipped: needs root and {}", super::SUDO);
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let seen = tmp.path().join("env.txt");
        let cmd = tmp.path().join("scancel");
        std::fs::write(&cmd, format!("#!/bin/sh\nenv > {}\n", seen.display())).unwrap();
        std::fs::set_permissions(&cmd, std::fs::Permissions::from_mode(0o755)).unwrap();
        let b = super::SlurmBackend {
            bin: tmp.path().to_path_buf(),
            slurm_conf: "/etc/slurm/slurm.conf".into(),
            spool: tmp.path().to_path_buf(),
            site: "alpha".into(),
            ckpt: Default::default(),
            max_time: Default::default(),
        };
        // The agent's own secret, as its unit's Environment= would set it
        // (a name no other test reads).
        std::env::set_var("FLEET_TEST_AGENT_SECRET", "agent-secret");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(b.run_in("scancel", &[], None, None, Some("root"), |_| {})).unwrap();
        let env = std::fs::read_to_string(&seen).unwrap();
        assert!(!env.contains("agent-secret"), "{env}");
        assert!(env.contains("SLURM_CONF=/etc/slurm/slurm.conf\n"), "{env}");
    }

    #[test]
    fn a_raise_with_the_agents_rights_stays_within_the_partitions_max_time() {
        use super::raise_within;
        assert_eq!(raise_within(600, "UNLIMITED"), Ok(600));
        assert_eq!(raise_within(600, "02:00:00"), Ok(120));
        assert_eq!(raise_within(600, "1-00:00:00"), Ok(600));
        assert_eq!(raise_within(2000, "1-00:00:00"), Ok(1440));
        assert!(raise_within(600, "soon").is_err());
    }

    #[test]
    fn the_submitters_umask_is_read_from_the_job_environment() {
        let with = |env: &[&str]| {
            let req = fleet_api::JobRequest { env: env.iter().map(|e| e.to_string()).collect(), ..Default::default() };
            super::submit_umask(&req)
        };
        assert_eq!(with(&["PATH=/bin", "SLURM_UMASK=0077"]), Some(0o077));
        assert_eq!(with(&["SLURM_UMASK=0002"]), Some(0o002));
        assert_eq!(with(&["SLURM_UMASK=9"]), None);
        assert_eq!(with(&["SLURM_UMASK=01777"]), None);
        assert_eq!(with(&["XSLURM_UMASK=0077"]), None);
        assert_eq!(with(&[]), None);
    }

    #[test]
    fn the_submitters_soft_limits_are_read_and_kept_below_the_agents_hard_ones() {
        let env = [
            "SLURM_RLIMIT_NOFILE=777",
            "SLURM_RLIMIT_STACK=18446744073709551615",
            "SLURM_RLIMIT_CORE=U0",
            "SLURM_RLIMIT_BOGUS=1",
            "SLURM_RLIMIT_AS=lots",
            "XSLURM_RLIMIT_CPU=1",
        ];
        let req = fleet_api::JobRequest { env: env.iter().map(|e| e.to_string()).collect(), ..Default::default() };
        let got = super::submit_limits(&req);
        let named: Vec<_> = got.iter().map(|l| (l.name, l.wanted)).collect();
        assert_eq!(named, [("NOFILE", 777), ("STACK", libc::RLIM_INFINITY), ("CORE", 0)]);
        // What sudo cannot carry goes to the job's lease-exec.
        assert_eq!(
            super::in_job_limits(&got),
            [("FLEET_RLIMIT_STACK", libc::RLIM_INFINITY.to_string()), ("FLEET_RLIMIT_CORE", "0".to_string())]
        );

        // Against this process's own hard limits: below them as wanted,
        // above them at them, and named.
        let hard = |r| {
            let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: one rlimit written into `l`.
            assert_eq!(unsafe { libc::getrlimit(r, &mut l) }, 0);
            l.rlim_max
        };
        let nofile = hard(libc::RLIMIT_NOFILE);
        let over = super::SubmitLimit { wanted: nofile.saturating_add(1), ..got[0] };
        let (set, clamped) = super::limits_for_sbatch(&[got[0], over]);
        assert_eq!((set[0].1.rlim_cur, set[0].1.rlim_max), (777.min(nofile), nofile));
        assert_eq!(set[1].1.rlim_cur, nofile, "never above the hard limit");
        if nofile != libc::RLIM_INFINITY {
            assert_eq!(clamped, [format!("NOFILE {nofile} (wanted {})", nofile + 1)]);
        }
    }

    #[test]
    fn an_unlimited_job_gets_the_default_partitions_max_time() {
        let at = |parts: &str| {
            let conf = format!("ClusterName=alpha\nNodeName=a1 CPUs=4\n{parts}");
            super::unlimited_time(&slurm_conf::slurm::SlurmConf::parse_str(&conf, "slurm.conf").unwrap().conf)
        };
        let unlimited = Some("UNLIMITED".to_string());
        assert_eq!(at("PartitionName=gpu Nodes=a1 Default=YES MaxTime=INFINITE DefaultTime=60"), unlimited);
        assert_eq!(at("PartitionName=gpu Nodes=a1 Default=YES DefaultTime=60"), unlimited);
        assert_eq!(
            at("PartitionName=gpu Nodes=a1 Default=YES MaxTime=2-00:00:00 DefaultTime=60\nPartitionName=x Nodes=a1"),
            Some("2880".to_string())
        );
        assert_eq!(at("PartitionName=gpu Nodes=a1 MaxTime=30"), None);
    }

    /// What each heartbeat reports as the longest limit a forwarded job may
    /// have here: the default partition's MaxTime, read from slurm.conf.
    #[test]
    fn heartbeats_report_the_default_partitions_max_time() {
        let dir = tempfile::tempdir().unwrap();
        let backend = SlurmBackend {
            bin: "/nonexistent".into(),
            slurm_conf: dir.path().join("slurm.conf"),
            spool: dir.path().into(),
            site: "alpha".into(),
            ckpt: Default::default(),
            max_time: Default::default(),
        };
        assert_eq!(backend.max_time_min(), None, "no slurm.conf: not known");
        let write = |parts: &str| {
            std::fs::write(&backend.slurm_conf, format!("ClusterName=alpha\nNodeName=a1 CPUs=4\n{parts}\n")).unwrap()
        };
        write("PartitionName=gpu Nodes=a1 Default=YES MaxTime=1-00:00:00\nPartitionName=long Nodes=a1");
        assert_eq!(backend.max_time_min(), Some(1440));
        assert_eq!(backend.max_time_min(), Some(1440), "from the cache, the file unchanged");
        write("PartitionName=gpu Nodes=a1 Default=YES MaxTime=INFINITE");
        assert_eq!(backend.max_time_min(), None, "unlimited");
        write("PartitionName=gpu Nodes=a1 MaxTime=30");
        assert_eq!(backend.max_time_min(), None, "no default partition");
    }

    #[test]
    fn private_data_that_hides_jobs() {
        for (v, hides) in [
            ("", false),
            ("usage,users", false),
            ("jobs", true),
            ("accounts,Jobs,usage", true),
            ("all", true),
            ("jobsx", false),
        ] {
            assert_eq!(super::private_hides_jobs(v), hides, "{v}");
        }
    }

    use super::*;

    #[test]
    fn the_queue_counts_pending_and_running_and_names_what_holds_an_allocation() {
        let out = "12 PENDING\n13 RUNNING\n14 COMPLETING\n15_3 RUNNING\n16 SUSPENDED\n17 COMPLETED\n\
                   18 CONFIGURING\nx RUNNING\n19\n13 RUNNING\n20 CANCELLED\n";
        let (pending, running, holding) = parse_queue(out);
        assert_eq!((pending, running), (1, 4));
        // 15_3 and x are no numbers (%A prints an array task's own id).
        assert_eq!(holding, vec![13, 14, 16, 18]);
        assert_eq!(parse_queue(""), (0, 0, vec![]));
    }

    #[test]
    fn job_home_is_the_resolved_home_or_the_job_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("job");
        let user = |home: Option<&std::path::Path>| LocalUser {
            name: "alice".into(),
            uid: 1001,
            gid: 1001,
            account: None,
            mapped_account: None,
            home: home.map(|h| h.to_path_buf()),
        };
        assert_eq!(job_home(&user(Some(tmp.path())), &dir), tmp.path());
        assert_eq!(job_home(&user(Some(&tmp.path().join("gone"))), &dir), dir, "a home that is no directory");
        assert_eq!(job_home(&user(None), &dir), dir);
    }

    #[test]
    fn gres_fields() {
        assert_eq!(parse_gres_field("gpu:h100:8(S:0-1)"), vec![(Some("h100".into()), 8)]);
        assert_eq!(parse_gres_field("gpu:a100:3(IDX:0-2,5)"), vec![(Some("a100".into()), 3)]);
        assert_eq!(parse_gres_field("gpu:4,gpu:h100:2"), vec![(None, 4), (Some("h100".into()), 2)]);
        assert_eq!(parse_gres_field("(null)"), vec![]);
        assert_eq!(parse_gres_field("shard:2,gpu:x:y"), vec![]);
        // An unbalanced ')' (e.g. a truncated sinfo column) splits as usual:
        // no GPU type ever holds a ',' or ':'.
        assert_eq!(parse_gres_field("gpu:a)x,gpu:b:3"), vec![(Some("b".into()), 3)]);
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

    /// Each node's RealMemory is reported under both select types (Slurm
    /// checks `--mem` against it either way); memory free of jobs only
    /// where memory is consumable.
    #[test]
    fn node_memory_under_both_select_types() {
        let out = "a1 gpu* mix gpu:h100:4 gpu:h100:1(IDX:0) 32 64000+ (null) 16000\n\
                   a2 gpu* idle gpu:h100:4 gpu:h100:0(IDX:N/A) 32 128000 nvlink 0\n\
                   a3 gpu* idle gpu:h100:4 gpu:h100:0(IDX:N/A) 32 96000 nvlink\n\
                   a4 gpu* idle gpu:h100:4 gpu:h100:0(IDX:N/A) 32 bad nvlink 5\n";
        for (memory_scheduled, free) in [(true, [Some(48000), Some(128000), None, None]), (false, [None; 4])] {
            let mut n = parse_sinfo(out);
            memory_view(&mut n, memory_scheduled);
            let got: Vec<(u64, Option<u64>)> = n.iter().map(|n| (n.memory_mb, n.memory_free_mb)).collect();
            let want: Vec<(u64, Option<u64>)> = [64000, 128000, 96000, 0].into_iter().zip(free).collect();
            assert_eq!(got, want, "memory_scheduled={memory_scheduled}");
        }
        // The shape placement reads: the largest node's RealMemory, known
        // under CR_Core too.
        let mut n = parse_sinfo(out);
        memory_view(&mut n, false);
        let shapes = fleet_api::placement::node_shapes(
            n.iter().map(|n| (n.gpu_type.as_deref(), n.gpus_total, n.cpus, n.memory_mb, n.features.as_deref())),
        );
        assert_eq!(shapes.iter().map(|s| s.memory_mb).max(), Some(128000));
    }

    #[test]
    fn the_origin_environment_less_what_names_the_origin() {
        let req = JobRequest {
            env: [
                "PATH=/opt/conda/bin:/usr/bin",
                "RESEARCH=x=y",
                "SLURM_CONF=/etc/slurm-beta/slurm.conf",
                "SBATCH_PARTITION=a100",
                "HOME=/home/alice",
                "HOSTNAME=login1",
                "FLEET_JOB_ID=spoof",
                "WANDB_MODE=offline",
                "no-equals-sign",
            ]
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
        assert!(submit_env(&req, std::path::Path::new("/d"))
            .unwrap()
            .iter()
            .any(|(k, v)| k == "PATH" && v.contains("/usr/bin")));
    }

    #[test]
    fn sbatch_reproduces_resources() {
        let req = JobRequest {
            origin: "beta".into(),
            name: Some("train".into()),
            gpus: vec![fleet_api::GpuRequest {
                gpu_type: Some("h100".into()),
                count: 8,
                scope: fleet_api::GpuScope::Node,
            }],
            min_nodes: Some(2),
            time_limit_min: Some(60),
            ..Default::default()
        };
        let p = crate::backend::OutputPaths { stdout: "/s/o".into(), stderr: "/s/e".into() };
        let (a, _) = sbatch_args("beta-1", &req, std::path::Path::new("/s"), &p, &[]);
        assert!(!a.iter().any(|x| x.starts_with("--comment")), "the user's comment is theirs: {a:?}");
        for want in ["--job-name=train", "--gres=gpu:h100:8", "--nodes=2", "--time=60", "--output=/s/o"] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        // No -e at home (or -e as -o): one file, as there; else its own.
        assert!(!a.iter().any(|x| x.starts_with("--error")), "{a:?}");
        let mut req = req;
        for (out, err, merged) in [
            (None, Some("e.txt"), false),
            (Some("o.txt"), Some("o.txt"), true),
            (Some("o.txt"), Some(""), true),
            (Some("slurm-%j.out"), Some("slurm-%j.err"), false),
        ] {
            req.std_out = out.map(str::to_string);
            req.std_err = err.map(str::to_string);
            let (a, _) = sbatch_args("beta-1", &req, std::path::Path::new("/s"), &p, &[]);
            assert_eq!(a.iter().any(|x| x == "--error=/s/e"), !merged, "{out:?} {err:?}: {a:?}");
        }
        req.fleet.ckpt = Some("s3://ckpt-east/fleet/beta-1".into());
        req.fleet.resume_from = Some("s3://ckpt-east/fleet/beta-1/ckpt-000000000002".into());
        req.export_env = Some("ALL,WANDB_MODE".into());
        let (a, env) = sbatch_args("beta-1", &req, std::path::Path::new("/s"), &p, &[]);
        let export = a.iter().find(|x| x.starts_with("--export=")).unwrap();
        assert!(
            export.ends_with(",FLEET_CKPT_URL=s3://ckpt-east/fleet/beta-1,FLEET_RESUME_FROM=s3://ckpt-east/fleet/beta-1/ckpt-000000000002"),
            "{export}"
        );
        assert!(env.is_empty(), "a list names Fleet's variables itself: {env:?}");
    }

    /// The default `--export=ALL` stays exactly that at the target: sbatch
    /// turns `ALL,<vars>` into a list with SLURM_GET_USER_ENV set, which
    /// makes slurmd load the user's login environment before the job
    /// starts (a native `--export=ALL` job never pays that). Fleet's
    /// variables come back beside the arguments, for the environment.
    #[test]
    fn plain_export_all_stays_plain_and_fleet_variables_travel_apart() {
        let p = crate::backend::OutputPaths { stdout: "/s/o".into(), stderr: "/s/e".into() };
        let ckpt = [("FLEET_EPOCH", "3".to_string())];
        for export_env in [None, Some("ALL"), Some(" all ")] {
            let req = JobRequest {
                origin: "beta".into(),
                export_env: export_env.map(String::from),
                fleet: fleet_api::FleetOptions { ckpt: Some("s3://b/fleet/beta-1".into()), ..Default::default() },
                ..Default::default()
            };
            let (a, env) = sbatch_args("beta-1", &req, std::path::Path::new("/s"), &p, &ckpt);
            let exports: Vec<_> = a.iter().filter(|x| x.starts_with("--export")).collect();
            assert_eq!(exports, ["--export=ALL"], "{export_env:?}: {a:?}");
            assert!(!a.iter().any(|x| x.contains("FLEET_")), "{a:?}");
            let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                names,
                ["FLEET_JOB_ID", "FLEET_ORIGIN", "FLEET_FORWARDED_JOB", "FLEET_CKPT_URL", "FLEET_EPOCH"],
                "{export_env:?}"
            );
            assert!(env.contains(&("FLEET_CKPT_URL".into(), "s3://b/fleet/beta-1".into())), "{env:?}");
        }
        // NONE and NIL name (or cannot name) their variables as natively.
        for (mode, want) in [("NONE", "--export=FLEET_JOB_ID=beta-1,"), ("NIL", "--export=NIL")] {
            let req = JobRequest { origin: "beta".into(), export_env: Some(mode.into()), ..Default::default() };
            let (a, env) = sbatch_args("beta-1", &req, std::path::Path::new("/s"), &p, &ckpt);
            assert!(a.iter().any(|x| x.starts_with(want)), "{mode}: {a:?}");
            assert!(env.is_empty(), "{mode}: {env:?}");
        }
    }

    #[test]
    fn squeue_json_of_both_dialects() {
        // 22.05 (openapi v0.0.38): plain numbers, a wait(2) status, a state string.
        let old =
            br#"{"jobs":[{"job_id":7,"job_state":"FAILED","exit_code":768,"submit_time":1700000000,"user_id":1001,
            "nodes":"alpha1","state_reason":"NonZeroExitCode","restart_cnt":1,"partition":"gpu","admin_comment":"",
            "name":"x JobState=COMPLETED ExitCode=0:0"},{"job_id":8,"array_task_id":3,"job_state":"RUNNING"}]}"#;
        let j = parse_jobs_json(old).unwrap();
        assert_eq!(j.len(), 1, "array elements are skipped");
        let with = parse_jobs_json_with(old, true).unwrap();
        assert_eq!(with.len(), 2, "unless asked for (stand-ins)");
        assert_eq!((with[1].native_id, with[1].array_task_id, with[1].array_job_id), (8, Some(3), None));
        assert_eq!((j[0].native_id, j[0].state, j[0].exit_code, j[0].signal), (7, JobState::Failed, Some(3), None));
        assert_eq!((j[0].submit_time, j[0].user_id, j[0].restarts), (Some(1_700_000_000), Some(1001), 1));
        // 23.02+ (v0.0.39+): state lists, {set, number} numbers, exit_code objects.
        let new = br#"{"jobs":[{"job_id":9,"job_state":["TIMEOUT"],"exit_code":{"status":["SIGNALED"],
            "return_code":{"set":true,"number":0},"signal":{"id":{"set":true,"number":15},"name":"TERM"}},
            "submit_time":{"set":true,"infinite":false,"number":1700000001},"user_id":1002,"nodes":"a2"}]}"#;
        let j = parse_jobs_json(new).unwrap();
        assert_eq!(
            (j[0].state, j[0].raw_state.as_str(), j[0].exit_code, j[0].signal),
            (JobState::Failed, "TIMEOUT", Some(0), Some(15))
        );
        assert_eq!(j[0].submit_time, Some(1_700_000_001));
        // The start time of a started job, in both dialects; a pending
        // job's is the scheduler's estimate, not a start.
        let starts = br#"{"jobs":[{"job_id":1,"job_state":"RUNNING","start_time":1700000100},
            {"job_id":2,"job_state":["RUNNING"],"start_time":{"set":true,"infinite":false,"number":1700000200}},
            {"job_id":3,"job_state":"PENDING","start_time":1700009999},
            {"job_id":4,"job_state":"COMPLETED","start_time":1700000300},
            {"job_id":5,"job_state":"RUNNING","start_time":0}]}"#;
        let got: Vec<Option<i64>> = parse_jobs_json(starts).unwrap().iter().map(|j| j.start_time).collect();
        assert_eq!(got, [Some(1_700_000_100), Some(1_700_000_200), None, Some(1_700_000_300), None]);
        for bad in [&b"not json"[..], b"{}", b"{\"jobs\": 3}"] {
            assert!(parse_jobs_json(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn sacct_rows() {
        let j = parse_sacct(
            "100|COMPLETED|0:0|2026-12-01T14:00:00|1001\n101|CANCELLED by 0|0:15|2026-12-01T14:00:01|1002\nbad\n",
        );
        assert_eq!(j.len(), 2);
        assert_eq!((j[0].state, j[0].exit_code, j[0].user_id), (JobState::Completed, Some(0), Some(1001)));
        assert_eq!((j[1].state, j[1].signal), (JobState::Cancelled, Some(15)));
        assert!(j[0].submit_time.is_some());
        // sacct -D: one row per run of a requeued job, oldest first; each
        // row counts the requeues before it (squeue's restart_cnt).
        let j = parse_sacct(
            "8|REQUEUED|0:0|2026-12-01T18:05:51|1001\n8|REQUEUED|0:0|2026-12-01T18:05:54|1001\n\
             8|COMPLETED|0:0|2026-12-01T18:06:00|1001\n9|PENDING|0:0|2026-12-01T18:06:01|1001\n",
        );
        let got: Vec<(u64, &str, u32)> = j.iter().map(|j| (j.native_id, j.raw_state.as_str(), j.restarts)).collect();
        assert_eq!(got, [(8, "REQUEUED", 0), (8, "REQUEUED", 1), (8, "COMPLETED", 2), (9, "PENDING", 0)]);
    }

    #[test]
    fn slurm_times() {
        // Found by fuzz/fuzz_targets/sacct.rs: a huge year overflowed (a
        // panic in debug builds, a wrong time in release).
        assert_eq!(parse_slurm_time("99999999999999999-01-01T00:00:00"), None);
        assert_eq!(parse_slurm_time("2026-13-01T00:00:00"), None);
        assert_eq!(parse_slurm_time("2026-12-01T24:00:00"), None);
        assert_eq!(parse_slurm_time("2026-12-01T00:00:-1"), None);
        assert_eq!(parse_slurm_time("Unknown"), None);
        let t = parse_slurm_time("2026-12-01T18:22:16").unwrap();
        assert_eq!(t - parse_slurm_time("2026-12-01T18:22:15").unwrap(), 1);
        assert_eq!(
            parse_slurm_time("2026-12-02T00:00:00").unwrap() - parse_slurm_time("2026-12-01T00:00:00").unwrap(),
            86_400
        );
    }

    #[test]
    fn sacct_work_dir_is_the_whole_last_column() {
        let j = parse_sacct("7|FAILED|3:0|2026-12-01T14:00:00|1001|/s/jobs/beta-1|COMPLETED|0:0\n");
        assert_eq!(j.len(), 1);
        assert_eq!((j[0].native_id, j[0].state, j[0].exit_code), (7, JobState::Failed, Some(3)));
        assert_eq!(j[0].work_dir, "/s/jobs/beta-1|COMPLETED|0:0");
    }

    /// A WorkDir with newlines (an owner may set it on a pending job) makes
    /// sacct print lines of the user's choosing: rows of another user's
    /// job included. Rows come only from the query without WorkDir.
    #[test]
    fn a_newline_in_a_work_dir_forges_no_accounting_row() {
        let t = "2026-12-01T14:00:00";
        let later = "2026-12-01T15:00:00";
        // 7 is the attacker's job, 9 the victim's (uid 1002), still running
        // as far as accounting knows (no terminal row).
        let trusted = format!("7|COMPLETED|0:0|{t}|1001\n9|RUNNING|0:0|{t}|1002\n");
        let with_dirs = format!(
            "7|COMPLETED|0:0|{t}|1001|/x\n9|FAILED|1:0|{later}|1002|/s/jobs/beta-9\n\
             9|RUNNING|0:0|{t}|1002|/s/jobs/beta-9\n"
        );
        // What one query with WorkDir would have believed: a FAILED run 9.
        assert!(parse_sacct(&with_dirs).iter().any(|j| j.native_id == 9 && j.state == JobState::Failed));
        let rows = parse_sacct_checked(&trusted, &with_dirs);
        let nine: Vec<_> = rows.iter().filter(|j| j.native_id == 9).collect();
        assert_eq!(nine.len(), 1, "{rows:?}");
        assert_eq!((nine[0].state, nine[0].work_dir.as_str()), (JobState::Running, "/s/jobs/beta-9"));
        // The attacker's own row keeps the first line of its directory.
        let seven: Vec<_> = rows.iter().filter(|j| j.native_id == 7).collect();
        assert_eq!((seven.len(), seven[0].work_dir.as_str()), (1, "/x"));
        // A forged line that copies a real row's columns but names another
        // directory: one row per directory, each with the real state.
        let with_dirs = format!("9|RUNNING|0:0|{t}|1002|/evil\n9|RUNNING|0:0|{t}|1002|/s/jobs/beta-9\n");
        let rows = parse_sacct_checked(&format!("9|RUNNING|0:0|{t}|1002\n"), &with_dirs);
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|j| j.state == JobState::Running && j.native_id == 9));
        assert!(rows.iter().any(|j| j.work_dir == "/s/jobs/beta-9"));
        // The two queries disagree (a job moved on in between): the row
        // stands, without a directory.
        let rows = parse_sacct_checked(&format!("9|COMPLETED|0:0|{t}|1002\n"), &with_dirs);
        assert_eq!((rows.len(), rows[0].state, rows[0].work_dir.as_str()), (1, JobState::Completed, ""));
    }

    proptest::proptest! {
        /// Whatever a Slurm command prints (or a hostile field makes it
        /// print), the parsers return; they never panic.
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512), text in "\\PC{0,256}") {
            let _ = parse_jobs_json(&bytes);
            let _ = parse_sacct(&String::from_utf8_lossy(&bytes));
            let _ = parse_sacct(&text);
            let _ = parse_slurm_time(&text);
            let _ = parse_sinfo(&text);
        }

        #[test]
        fn json_with_arbitrary_field_values_never_panics(id in proptest::prelude::any::<i64>(), state in "\\PC{0,40}", code in proptest::prelude::any::<i64>()) {
            let doc = serde_json::json!({"jobs": [{"job_id": id, "job_state": state, "exit_code": code, "submit_time": code, "user_id": id}]});
            let _ = parse_jobs_json(doc.to_string().as_bytes());
        }
    }
}
