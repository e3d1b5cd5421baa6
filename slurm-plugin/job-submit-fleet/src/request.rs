//! From `job_desc_msg_t` to a [`JobRequest`] for the agent, and the
//! origin's own rules that no option can bypass.

use fleet_api::{Exclusive, FleetMode, FleetOptions, JobRequest};
use slurm::job_desc::{JobDesc, NumField, StrField};
use slurm::job_submit::Reject;
use slurm::{sys, NO_VAL, NO_VAL16, NO_VAL64};

use crate::config::TimeLimit;
use crate::PluginConfig;

/// What the plugin does with a submission before asking anyone.
#[derive(Debug, PartialEq)]
pub enum Prepared {
    /// Leave it exactly as submitted; the agent is not asked.
    Untouched,
    /// Ask the agent about this request.
    Ask(Box<JobRequest>),
    /// Component `offset` of a heterogeneous job: it stays local (a
    /// hetjob is never split); refused only when home surely cannot run it.
    Hetjob(Box<JobRequest>, u64),
}

/// The environment variable the target agent submits forwarded jobs
/// with (`FLEET_FORWARDED_JOB=<fleet_job_id>`): such a job is never
/// forwarded again. A user who sets it merely keeps their own job local.
pub const FORWARDED_ENV: &str = "FLEET_FORWARDED_JOB";

/// `job_desc.pn_min_memory` flag: the value is per CPU.
const MEM_PER_CPU: u64 = 1 << 63;
/// `warn_flags`: signal the batch shell only / may use a reservation's end.
const KILL_JOB_BATCH: u64 = 1 << 0;
const KILL_JOB_RESV: u64 = 1 << 8;
/// `bitflags`: `--gres-flags=enforce-binding|disable-binding`, `--spread-job`, `--use-min-nodes`.
const GRES_ENFORCE_BIND: u64 = 1 << 4;
const GRES_DISABLE_BIND: u64 = 1 << 19;
const SPREAD_JOB: u64 = 1 << 8;
const USE_MIN_NODES: u64 = 1 << 9;
/// `task_dist` when `-m` was not given.
const SLURM_DIST_UNKNOWN: u64 = 0x2000;

fn opt_u32(v: u64, no_val: u64) -> Option<u32> {
    (v != no_val && v != 0).then_some(v as u32)
}

fn reject(message: String) -> Reject {
    Reject { code: slurm::SLURM_ERROR, message }
}

/// Root and slurmctld's own user (SlurmUser) may do what users may not.
fn privileged(uid: u32) -> bool {
    // slurmctld takes its user before it serves any request, and keeps it:
    // asked once (`getuid` is a system call, a few µs in the hook's cold caches).
    static SLURM_USER: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    uid == 0 || uid == *SLURM_USER.get_or_init(slurm::process_uid)
}

/// Does a partition list (`a,b`) name the proxy partition?
fn names_partition(list: &str, proxy: &str) -> bool {
    list.split(',').any(|p| p.trim().eq_ignore_ascii_case(proxy))
}

/// The origin's rules for a submission by `uid`: the proxy partition
/// takes only stand-ins ([`proxy_partition_rule`]), and `admin_comment`
/// tags (`fleet:<id>`) are Fleet's.
pub fn origin_rules(job: &mut JobDesc<'_>, config: &PluginConfig, uid: u32) -> Result<(), Reject> {
    proxy_partition_rule(job, &config.proxy_partition, uid)?;
    if !privileged(uid)
        && job.get(StrField::AdminComment).is_some_and(|c| fleet_api::wire::parse_admin_tag(&c).is_some())
    {
        return Err(reject("fleet: an admin comment starting with \"fleet:\" is Fleet's own tag".into()));
    }
    Ok(())
}

/// Only root and SlurmUser may put a job into the proxy partition, at
/// submission (`job_submit`) or later (`scontrol update`, `job_modify`).
pub fn proxy_partition_rule(job: &mut JobDesc<'_>, proxy_partition: &str, uid: u32) -> Result<(), Reject> {
    if privileged(uid) {
        return Ok(());
    }
    if let Some(p) = job.get(StrField::Partition) {
        if names_partition(&p, proxy_partition) {
            return Err(Reject {
                code: sys::ESLURM_INVALID_PARTITION_NAME as i32,
                message: format!(
                    "fleet: partition {proxy_partition} holds only Fleet's stand-ins for jobs that run at other clusters; submit to another partition (Fleet decides where a job runs)"
                ),
            });
        }
    }
    Ok(())
}

/// What a stand-in was given in place of its job's request
/// ([`crate::rewrite`]), as `scontrol update` names it: a change of any of
/// them would reach only the placeholder (moving it out of the proxy
/// partition, or asking resources there it can never get), never the job
/// at its target.
const STAND_IN_STRINGS: [(StrField, &str); 12] = [
    (StrField::Partition, "Partition"),
    (StrField::TresPerJob, "TresPerJob (--gpus)"),
    (StrField::TresPerNode, "Gres/TresPerNode"),
    (StrField::TresPerSocket, "TresPerSocket"),
    (StrField::TresPerTask, "TresPerTask"),
    (StrField::CpusPerTres, "CpusPerTres"),
    (StrField::MemPerTres, "MemPerTres"),
    (StrField::TresBind, "TresBind"),
    (StrField::TresFreq, "TresFreq"),
    (StrField::ReqNodes, "ReqNodeList"),
    (StrField::ExcNodes, "ExcNodeList"),
    (StrField::Features, "Features"),
];

/// The numeric ones, with the value an update leaves them at when it does
/// not change them (`slurm_init_job_desc_msg`).
const STAND_IN_NUMBERS: [(NumField, u64, &str); 18] = [
    (NumField::MinNodes, NO_VAL as u64, "NumNodes"),
    (NumField::MaxNodes, NO_VAL as u64, "NumNodes"),
    (NumField::NumTasks, NO_VAL as u64, "NumTasks"),
    (NumField::MinCpus, NO_VAL as u64, "NumCPUs"),
    (NumField::CpusPerTask, NO_VAL16 as u64, "CPUsPerTask"),
    (NumField::NtasksPerNode, NO_VAL16 as u64, "NTasksPerNode"),
    (NumField::NtasksPerSocket, NO_VAL16 as u64, "NTasksPerSocket"),
    (NumField::NtasksPerCore, NO_VAL16 as u64, "NTasksPerCore"),
    (NumField::NtasksPerTres, NO_VAL16 as u64, "NTasksPerTRES"),
    (NumField::SocketsPerNode, NO_VAL16 as u64, "SocketsPerNode"),
    (NumField::CoresPerSocket, NO_VAL16 as u64, "CoresPerSocket"),
    (NumField::ThreadsPerCore, NO_VAL16 as u64, "ThreadsPerCore"),
    (NumField::PnMinCpus, NO_VAL16 as u64, "MinCPUsNode"),
    (NumField::PnMinMemory, NO_VAL64, "MinMemoryNode/MinMemoryCPU"),
    (NumField::PnMinTmpDisk, NO_VAL as u64, "MinTmpDiskNode"),
    (NumField::Shared, NO_VAL16 as u64, "OverSubscribe"),
    (NumField::Contiguous, NO_VAL16 as u64, "Contiguous"),
    (NumField::CoreSpec, NO_VAL16 as u64, "CoreSpec"),
];

/// `scontrol update` of stand-in `id` (the plugin's `job_modify`), by
/// anyone: its resources stand for its job's, which runs elsewhere, so a
/// change of them is refused, naming them; everything Slurm does at home
/// to the stand-in as to a native job (time limit, hold and release,
/// dependency, priority, name, account, QOS, comment, mail) goes through.
pub fn stand_in_update_rule(job: &mut JobDesc<'_>, id: u32) -> Result<(), Reject> {
    let mut changed: Vec<&str> = Vec::new();
    for (f, name) in STAND_IN_STRINGS {
        if job.bytes(f).is_some() {
            changed.push(name);
        }
    }
    for (f, unset, name) in STAND_IN_NUMBERS {
        if job.num(f) != unset && !changed.contains(&name) {
            changed.push(name);
        }
    }
    if changed.is_empty() {
        return Ok(());
    }
    Err(Reject {
        code: sys::ESLURM_NOT_SUPPORTED as i32,
        message: format!(
            "fleet: job {id} runs at another cluster through Fleet (this job is its stand-in here): its {} cannot \
             be changed once it is submitted; cancel it and submit it again with the new request",
            changed.join(", ")
        ),
    })
}

/// `sbatch --test-only`: slurmctld runs job_submit for it too (the
/// will-run RPC validates the request first), but nothing may be
/// created. sbatch sends its command line in `submit_line`.
fn is_test_only(job: &mut JobDesc<'_>) -> bool {
    // A byte search first: most command lines do not hold the text at all
    // (each `-` compared further, not each window).
    const NEEDLE: &[u8] = b"--test-only";
    let holds = |b: &[u8]| b.iter().enumerate().any(|(i, &c)| c == b'-' && b[i..].starts_with(NEEDLE));
    let Some(line) = job.bytes(StrField::SubmitLine).filter(|b| holds(b)) else {
        return false;
    };
    // Any word of the command line: a script argument spelled
    // --test-only only keeps that job home, where Slurm alone answers.
    String::from_utf8_lossy(line).split_whitespace().any(|w| w == "--test-only" || w.starts_with("--test-only="))
}

/// Read the submission. Errors are the user's: bad `--fleet*` values or a
/// GPU request that does not parse; they reject the job with a message.
/// The whole request: [`prepare`] then [`complete`].
pub fn build_request(job: &mut JobDesc<'_>, config: &PluginConfig, uid: u32) -> Result<Prepared, Reject> {
    let mut prepared = prepare(job, config, uid)?;
    if let Prepared::Ask(req) | Prepared::Hetjob(req, _) = &mut prepared {
        complete(job, config, req);
    }
    Ok(prepared)
}

/// The origin's rules and the part of the request placement reads
/// ([`fleet_api::placement`]: GPUs, nodes, tasks, CPUs, memory,
/// constraint, the `--fleet*` options, what no other cluster can honour),
/// without copying the script, the environment or the other text fields:
/// enough to tell that a job stays home. [`complete`] adds the rest for a
/// job that may leave. [`read_shape`] then [`finish_shape`].
pub fn prepare(job: &mut JobDesc<'_>, config: &PluginConfig, uid: u32) -> Result<Prepared, Reject> {
    Ok(match read_shape(job, config, uid)? {
        None => Prepared::Untouched,
        Some(shape) => finish_shape(job, shape),
    })
}

/// A GPU job's (or a `--fleet*` job's) shape, as [`read_shape`] read it:
/// enough for placement at its origin, before the environment is read.
#[derive(Debug)]
pub struct Shape {
    /// The request so far: no `not_carried` yet ([`finish_shape`]).
    pub req: Box<JobRequest>,
    /// `Some(offset)`: a heterogeneous job's component.
    pub het_offset: Option<u64>,
    /// `tres_per_node` as submitted (for the other GRES no cluster but home knows).
    tres_per_node: Option<String>,
}

impl Shape {
    /// No `--fleet*` options and not part of a heterogeneous job: the
    /// jobs that [`fleet_api::placement::home_starts_now`] may answer.
    pub fn is_plain(&self) -> bool {
        self.het_offset.is_none() && self.req.fleet == Default::default()
    }
}

/// What [`read_pre`] read before the shape: the job's `--fleet*`
/// options, and whether it is a hetjob component or an array.
#[derive(Debug)]
pub struct Pre {
    fleet: FleetOptions,
    /// `fleet` is the default (no `--fleet*` options given).
    no_options: bool,
    het_offset: Option<u64>,
    is_array: bool,
}

impl Pre {
    /// No `--fleet*` options and not part of a heterogeneous job (as
    /// [`Shape::is_plain`]).
    pub fn is_plain(&self) -> bool {
        self.het_offset.is_none() && self.no_options
    }
}

/// [`prepare`]'s first half, the whole of the LOCAL path's reading: the
/// origin's rules and the job's shape, with no pass over its environment
/// (80 strings, each in its own allocation, is the costliest read here
/// in slurmctld's cold caches). `None`: leave the job untouched (no
/// script, `--fleet=local`, `--test-only`, no GPUs and no `--fleet*`
/// options, or a job Fleet forwarded here whose options do not parse).
/// A shape placed home stays as submitted; any other goes through
/// [`finish_shape`], which also leaves a job Fleet forwarded here alone.
pub fn read_shape(job: &mut JobDesc<'_>, config: &PluginConfig, uid: u32) -> Result<Option<Shape>, Reject> {
    match read_pre(job, config, uid)? {
        Some(pre) => shape_of(job, config, pre),
        None => Ok(None),
    }
}

/// A job Fleet forwarded here is never refused for what it carries (its
/// origin read the same options): it is left alone.
fn refuse<T>(job: &JobDesc<'_>, code: i32, message: String) -> Result<Option<T>, Reject> {
    if forwarded_here(job) {
        Ok(None)
    } else {
        Err(Reject { code, message })
    }
}

/// [`read_shape`]'s first half: the origin's rules, then what decides
/// whether the job is read at all. No allocation for a job without
/// `--fleet*` options (the common case: its SPANK environment is only
/// looked through for the options' prefix).
pub fn read_pre(job: &mut JobDesc<'_>, config: &PluginConfig, uid: u32) -> Result<Option<Pre>, Reject> {
    origin_rules(job, config, uid)?;
    // salloc / srun allocations carry no batch script: left alone.
    if !job.is_batch() {
        return Ok(None);
    }
    let prefix = fleet_api::options::SPANK_ENV_PREFIX.as_bytes();
    // Entries without the (ASCII) prefix are skipped by the parser, so a
    // job with none has the default options (`None` here).
    let fleet = if job.spank_env_iter().any(|e| e.starts_with(prefix)) {
        match spank_options(job) {
            Ok(f) => Some(f),
            Err(m) => return refuse(job, slurm::SLURM_ERROR, format!("fleet: {m}")),
        }
    } else {
        None
    };
    if fleet.as_ref().is_some_and(|f| f.mode == FleetMode::Local) {
        return Ok(None);
    }
    let no_options = fleet.as_ref().is_none_or(|f| *f == FleetOptions::default());
    let fleet = fleet.unwrap_or_default();
    if is_test_only(job) {
        slurm::log::verbose(
            "job_submit/fleet: sbatch --test-only: answered by this cluster alone, no fleet job created",
        );
        return Ok(None);
    }
    // A heterogeneous job is never half forwarded: every component stays
    // (read in full, so that one home cannot run is refused with the reason).
    let het_offset = Some(job.num(NumField::HetJobOffset)).filter(|&o| o != u64::from(NO_VAL));
    // A job array is read like any job: its elements are forwarded one by
    // one as deferred stand-ins when the published view sends it away.
    let is_array = job.bytes(StrField::ArrayInx).is_some_and(|b| !b.is_empty());
    Ok(Some(Pre { fleet, no_options, het_offset, is_array }))
}

/// The `--fleet*` options of a job that gave some (out of the hook's
/// common path: the SPANK environment is copied).
#[cold]
fn spank_options(job: &JobDesc<'_>) -> Result<FleetOptions, String> {
    let spank = job.spank_env();
    fleet_api::options::from_spank_env(spank.iter().map(String::as_str))
}

/// The string fields a job's shape is read from ([`shape_of`]).
const SHAPE_STRS: [StrField; 7] = [
    StrField::TresPerJob,
    StrField::TresPerNode,
    StrField::TresPerTask,
    StrField::TresPerSocket,
    StrField::Features,
    StrField::MemPerTres,
    StrField::CpusPerTres,
];
/// The numeric fields a job's shape is read from, besides the
/// submitter's ids (which no placement at the origin reads).
const SHAPE_NUMS: [NumField; 6] = [
    NumField::PnMinMemory,
    NumField::MinNodes,
    NumField::MaxNodes,
    NumField::NumTasks,
    NumField::NtasksPerNode,
    NumField::CpusPerTask,
];

/// Longest [`ShapeKey`] kept (a job whose shape fields are longer is
/// simply not remembered): 7 lengths and 6 numbers take 76 bytes.
const SHAPE_KEY_MAX: usize = 256;

/// The raw fields a plain job's shape is read from, packed for
/// comparison ([`SHAPE_STRS`], [`SHAPE_NUMS`]): two plain jobs with
/// the same key have the same shape but for the submitter's ids, so
/// the same LOCAL answer from the same view and fleet.conf. Made on
/// the stack, no allocation.
pub struct ShapeKey {
    len: usize,
    buf: [u8; SHAPE_KEY_MAX],
}

impl Default for ShapeKey {
    fn default() -> Self {
        ShapeKey { len: 0, buf: [0; SHAPE_KEY_MAX] }
    }
}

impl ShapeKey {
    /// `None` when the fields do not fit in [`SHAPE_KEY_MAX`] bytes.
    #[cfg(test)]
    fn of(job: &mut JobDesc<'_>) -> Option<ShapeKey> {
        let mut k = ShapeKey::default();
        k.read(job).then_some(k)
    }

    /// Read the key from `job` in place (a key is not moved: it is a
    /// few cache lines): false when the fields do not fit.
    pub fn read(&mut self, job: &mut JobDesc<'_>) -> bool {
        self.len = 0;
        self.read_fields(job).is_some()
    }

    fn read_fields(&mut self, job: &mut JobDesc<'_>) -> Option<()> {
        let k = self;
        for f in SHAPE_STRS {
            match job.bytes(f) {
                // A length that no string has marks NULL (apart from "").
                None => k.push(&u32::MAX.to_le_bytes())?,
                Some(b) => {
                    k.push(&u32::try_from(b.len()).ok()?.to_le_bytes())?;
                    k.push(b)?;
                }
            }
        }
        for f in SHAPE_NUMS {
            k.push(&job.num(f).to_le_bytes())?;
        }
        Some(())
    }

    fn push(&mut self, b: &[u8]) -> Option<()> {
        let end = self.len.checked_add(b.len()).filter(|&e| e <= SHAPE_KEY_MAX)?;
        self.buf[self.len..end].copy_from_slice(b);
        self.len = end;
        Some(())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// [`read_shape`]'s second half: the shape of a job [`read_pre`] let
/// through, from [`SHAPE_STRS`] and [`SHAPE_NUMS`] (and the submitter's ids).
pub fn shape_of(job: &mut JobDesc<'_>, config: &PluginConfig, pre: Pre) -> Result<Option<Shape>, Reject> {
    let Pre { fleet, no_options, het_offset, is_array } = pre;
    let [per_job, per_node, per_task, per_socket] = TRES_FIELDS.map(|f| job.get(f).map(|s| s.into_owned()));
    let gpus = match slurm_conf::tres::parse_job_tres(
        per_job.as_deref(),
        per_node.as_deref(),
        per_task.as_deref(),
        per_socket.as_deref(),
    ) {
        Ok(g) => g,
        Err(e) => return refuse(job, sys::ESLURM_INVALID_GRES as i32, format!("fleet: {e}")),
    };
    if gpus.is_empty() && no_options {
        return Ok(None);
    }

    let constraint = job.get(StrField::Features).map(|s| s.into_owned()).filter(|s| !s.is_empty());
    let mem = job.num(NumField::PnMinMemory);
    let (mem_per_node_mb, mem_per_cpu_mb) = match mem {
        m if m == NO_VAL64 => (None, None),
        m if m & MEM_PER_CPU != 0 => (None, Some(m & !MEM_PER_CPU)),
        m => (Some(m), None),
    };
    let per_gpu = |job: &mut JobDesc<'_>, f: StrField| -> Option<u64> {
        let v = job.get(f)?;
        slurm_conf::tres::parse_tres(&v, fleet_api::GpuScope::Node).ok()?.first().map(|g| u64::from(g.count))
    };
    let mem_per_gpu_mb = per_gpu(job, StrField::MemPerTres);
    let cpus_per_gpu = per_gpu(job, StrField::CpusPerTres).map(|c| c as u32);

    let req = Box::new(JobRequest {
        origin: config.site.clone(),
        user_id: job.num(NumField::UserId) as u32,
        group_id: job.num(NumField::GroupId) as u32,
        min_nodes: opt_u32(job.num(NumField::MinNodes), NO_VAL.into()),
        max_nodes: opt_u32(job.num(NumField::MaxNodes), NO_VAL.into()),
        num_tasks: opt_u32(job.num(NumField::NumTasks), NO_VAL.into()),
        ntasks_per_node: opt_u32(job.num(NumField::NtasksPerNode), NO_VAL16.into()),
        cpus_per_task: opt_u32(job.num(NumField::CpusPerTask), NO_VAL16.into()),
        gpus,
        is_array,
        fleet,
        mem_per_node_mb,
        mem_per_cpu_mb,
        mem_per_gpu_mb,
        cpus_per_gpu,
        constraint,
        ..JobRequest::default()
    });
    Ok(Some(Shape { req, het_offset, tres_per_node: per_node }))
}

/// [`prepare`]'s second half: a job Fleet forwarded here is never
/// forwarded again (untouched); otherwise what no other cluster can
/// honour is added to the shape's request (`not_carried`, which
/// placement reads), and the job is to be asked about.
pub fn finish_shape(job: &mut JobDesc<'_>, shape: Shape) -> Prepared {
    if forwarded_here(job) {
        return Prepared::Untouched;
    }
    let Shape { mut req, het_offset, tres_per_node } = shape;
    let mut not_carried = not_carried(job, tres_per_node.as_deref());
    // Options sbatch passes in the job's environment only.
    let mut export_env = false;
    let (mut propagate, mut get_user_env) = (false, false);
    carried_env(job, |e| {
        if let Some(name) = e.strip_prefix("SLURM_") {
            export_env |= name.starts_with("EXPORT_ENV=");
            propagate |= name.starts_with("RLIMIT_") && e.split_once('=').is_some_and(|(_, v)| v.starts_with('U'));
            get_user_env |= name == "GET_USER_ENV=1";
        }
    });
    if propagate {
        not_carried.push("--propagate".into());
    }
    if !export_env && get_user_env {
        not_carried.push("--get-user-env".into());
    }
    req.not_carried = not_carried;
    match het_offset {
        Some(o) => Prepared::Hetjob(req, o),
        None => Prepared::Ask(req),
    }
}

/// Was the job submitted by a Fleet agent for a job forwarded here
/// (`FLEET_FORWARDED_JOB=` in its environment)?
fn forwarded_here(job: &JobDesc<'_>) -> bool {
    job.environment_iter().any(|e| e.starts_with(FORWARDED_ENV.as_bytes()) && e.get(FORWARDED_ENV.len()) == Some(&b'='))
}

/// The GPU request fields, in [`slurm_conf::tres::parse_job_tres`]'s order.
const TRES_FIELDS: [StrField; 4] =
    [StrField::TresPerJob, StrField::TresPerNode, StrField::TresPerTask, StrField::TresPerSocket];

/// The rest of a request [`prepare`] read: the script, the environment,
/// the text fields and the other options, for the agent or a deferred
/// stand-in.
pub fn complete(job: &mut JobDesc<'_>, config: &PluginConfig, req: &mut JobRequest) {
    let mut non_utf8 = Vec::new();
    let mut text = |job: &mut JobDesc<'_>, f: StrField| -> Option<String> {
        if !job.is_utf8(f) {
            non_utf8.push(f.name().to_string());
        }
        job.get(f).map(|s| s.into_owned()).filter(|s| !s.is_empty())
    };
    req.account = text(job, StrField::Account);
    req.partition = text(job, StrField::Partition);
    req.name = text(job, StrField::Name);
    req.work_dir = text(job, StrField::WorkDir);
    req.std_out = text(job, StrField::StdOut);
    req.std_err = text(job, StrField::StdErr);
    req.comment = text(job, StrField::Comment);
    // Read by `prepare`; checked here, in its place among the fields.
    let _ = text(job, StrField::Features);
    req.mail_user = text(job, StrField::MailUser);
    req.qos = text(job, StrField::Qos);
    req.licenses = text(job, StrField::Licenses);
    req.dependency = text(job, StrField::Dependency);
    req.non_utf8_fields = non_utf8;
    let script = job.bytes(StrField::Script).unwrap_or_default();
    (req.script, req.script_len) = if script.len() as u64 > config.max_script_bytes {
        (None, Some(script.len() as u64))
    } else {
        (Some(script.to_vec()), None)
    };
    let (env, env_dropped) = environment(job);
    req.export_env = env.iter().find_map(|e| e.strip_prefix("SLURM_EXPORT_ENV=")).map(str::to_string);
    req.env = env;
    req.env_dropped = env_dropped;
    req.tres_raw =
        TRES_FIELDS.into_iter().filter_map(|f| job.get(f).map(|v| (f.name().to_string(), v.into_owned()))).collect();

    let shared = job.num(NumField::Shared);
    let warn_signal = opt_u32(job.num(NumField::WarnSignal), NO_VAL16.into()).map(|s| s as u16);
    let warn_flags = job.num(NumField::WarnFlags);
    let warn_flags = if warn_flags == u64::from(NO_VAL16) { 0 } else { warn_flags };
    let begin = job.num(NumField::BeginTime) as i64;
    let time_limit = opt_u32(job.num(NumField::TimeLimit), NO_VAL.into());
    req.time_unlimited = time_limit == Some(slurm::INFINITE);
    req.time_limit_min = time_limit.filter(|&t| t != slurm::INFINITE);
    if time_limit.is_none() {
        // No --time: the finite limit its partition here would give it
        // (Slurm's own, applied after this hook), not its target's default.
        // An unlimited one leaves the target's default: --time=UNLIMITED
        // there would pend for good under a QOS with a MaxWall.
        if let Some(TimeLimit::Minutes(m)) = config.partition_limits.implied(req.partition.as_deref()).map(|i| i.limit)
        {
            req.time_limit_min = Some(m);
        }
    }
    req.exclusive = match shared {
        0 => Some(Exclusive::Node),
        2 => Some(Exclusive::User),
        3 => Some(Exclusive::Mcs),
        _ => None,
    };
    req.oversubscribe = shared == 1;
    req.contiguous = job.num(NumField::Contiguous) == 1;
    req.warn_signal = warn_signal;
    req.warn_time = warn_signal.and(opt_u32(job.num(NumField::WarnTime), NO_VAL16.into()).map(|t| t as u16));
    req.warn_batch_only = warn_signal.is_some() && warn_flags & KILL_JOB_BATCH != 0;
    req.warn_resv = warn_signal.is_some() && warn_flags & KILL_JOB_RESV != 0;
    req.mail_type = fleet_api::sbatch::mail_type_names(job.num(NumField::MailType) as u16);
    req.time_min = opt_u32(job.num(NumField::TimeMin), NO_VAL.into()).filter(|&t| t != slurm::INFINITE);
    req.begin_time = (begin > 0).then_some(begin);
    req.hold = job.num(NumField::Priority) == 0;
    req.requeue = match job.num(NumField::Requeue) {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    };
    req.no_kill = job.num(NumField::KillOnNodeFail) == 0;
    // (Not UTF-8 or too long: kept home by `not_carried`.)
    req.script_args = job.script_args().iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect();
}

/// The script's arguments a forwarded job carries at most (in all, one
/// byte per argument more): beyond, it stays home.
pub const MAX_SCRIPT_ARGS_BYTES: usize = 64 << 10;

/// Options on the job that no other cluster can honour, as
/// `--option[=value]`: the job stays home (or is refused naming them).
fn not_carried(job: &mut JobDesc<'_>, tres_per_node: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for (f, opt) in [
        (StrField::Licenses, "--licenses"),
        (StrField::Reservation, "--reservation"),
        (StrField::ReqNodes, "--nodelist"),
        (StrField::ExcNodes, "--exclude"),
        (StrField::BurstBuffer, "--bb"),
        (StrField::Container, "--container"),
        (StrField::Network, "--network"),
        (StrField::TresBind, "--gpu-bind"),
        (StrField::TresFreq, "--gpu-freq"),
        (StrField::McsLabel, "--mcs-label"),
        (StrField::Prefer, "--prefer"),
        (StrField::AcctgFreq, "--acctg-freq"),
        (StrField::MemBind, "--mem-bind"),
    ] {
        if let Some(v) = job.get(f).filter(|v| !v.is_empty()) {
            out.push(format!("{opt}={v}"));
        }
    }
    // `sbatch script args...` travel as text, within a bound.
    let args = job.script_args();
    if args.iter().any(|a| std::str::from_utf8(a).is_err()) {
        out.push("script arguments that are not UTF-8".into());
    } else if args.iter().map(|a| a.len() + 1).sum::<usize>() > MAX_SCRIPT_ARGS_BYTES {
        out.push(format!("script arguments beyond {MAX_SCRIPT_ARGS_BYTES} bytes"));
    }
    if job.has_batch_features() {
        out.push("--batch".into());
    }
    if let Some(v) = job.get(StrField::StdIn).filter(|v| !v.is_empty() && v != "/dev/null") {
        out.push(format!("--input={v}"));
    }
    // Other generic resources than GPUs: the fleet view knows only GPUs.
    for item in tres_per_node.unwrap_or("").split([',', ';']).map(str::trim).filter(|i| !i.is_empty()) {
        let body = item.strip_prefix("gres:").or_else(|| item.strip_prefix("gres/")).unwrap_or(item);
        let name = body.split([':', '=']).next().unwrap_or("");
        if !name.eq_ignore_ascii_case("gpu") {
            out.push(format!("--gres={body}"));
        }
    }
    let set16 = |v: u64| v != u64::from(NO_VAL16) && v != 0;
    let set32 = |v: u64| v != u64::from(NO_VAL) && v != 0;
    for (f, opt) in [
        (NumField::CoreSpec, "--core-spec/--thread-spec"),
        (NumField::SocketsPerNode, "--sockets-per-node"),
        (NumField::CoresPerSocket, "--cores-per-socket"),
        (NumField::ThreadsPerCore, "--threads-per-core"),
        (NumField::NtasksPerSocket, "--ntasks-per-socket"),
        (NumField::NtasksPerCore, "--ntasks-per-core"),
        (NumField::NtasksPerTres, "--ntasks-per-gpu"),
        (NumField::Reboot, "--reboot"),
        (NumField::WaitAllNodes, "--wait-all-nodes"),
    ] {
        let v = job.num(f);
        if set16(v) {
            out.push(format!("{opt}={v}"));
        }
    }
    for (f, opt) in [
        (NumField::ReqSwitch, "--switches"),
        (NumField::PnMinTmpDisk, "--tmp"),
        (NumField::CpuFreqMin, "--cpu-freq"),
        (NumField::CpuFreqMax, "--cpu-freq"),
        (NumField::CpuFreqGov, "--cpu-freq"),
        (NumField::DelayBoot, "--delay-boot"),
    ] {
        if set32(job.num(f)) && !out.iter().any(|o| o == opt) {
            out.push(opt.to_string());
        }
    }
    let dist = job.num(NumField::TaskDist);
    if dist != 0 && dist != u64::from(NO_VAL) && dist != SLURM_DIST_UNKNOWN {
        out.push("--distribution".into());
    }
    if job.num(NumField::Deadline) != 0 {
        out.push("--deadline".into());
    }
    if job.num(NumField::PowerFlags) != 0 {
        out.push("--power".into());
    }
    let profile = job.num(NumField::Profile);
    if profile != 0 && profile != u64::from(NO_VAL) {
        out.push("--profile".into());
    }
    if job.num(NumField::Overcommit) == 1 {
        out.push("--overcommit".into());
    }
    let flags = job.num(NumField::Bitflags);
    for (bit, opt) in [
        (GRES_ENFORCE_BIND, "--gres-flags=enforce-binding"),
        (GRES_DISABLE_BIND, "--gres-flags=disable-binding"),
        (SPREAD_JOB, "--spread-job"),
        (USE_MIN_NODES, "--use-min-nodes"),
    ] {
        if flags & bit != 0 {
            out.push(opt.to_string());
        }
    }
    // --mincpus beyond what the tasks already ask for.
    let mincpus = job.num(NumField::PnMinCpus);
    let cpt = opt_u32(job.num(NumField::CpusPerTask), NO_VAL16.into()).unwrap_or(1);
    let tpn = opt_u32(job.num(NumField::NtasksPerNode), NO_VAL16.into()).unwrap_or(1);
    if set16(mincpus) && mincpus > u64::from(cpt) * u64::from(tpn) {
        out.push(format!("--mincpus={mincpus}"));
    }
    out
}

/// Calls `f` with each entry of the job's environment the target gets
/// (UTF-8 entries, up to `MAX_ENV_BYTES` in all, in order); returns how
/// many were left out. Copies nothing.
fn carried_env(job: &JobDesc<'_>, mut f: impl FnMut(&str)) -> u32 {
    let (mut dropped, mut bytes) = (0u32, 0usize);
    for entry in job.environment_iter() {
        match std::str::from_utf8(entry) {
            Ok(s) if bytes + s.len() <= fleet_api::job::MAX_ENV_BYTES => {
                bytes += s.len();
                f(s);
            }
            _ => dropped += 1,
        }
    }
    dropped
}

/// The job's environment as the target will need it ([`carried_env`]);
/// the number left out is the second value.
fn environment(job: &JobDesc<'_>) -> (Vec<String>, u32) {
    let mut env = Vec::with_capacity(job.environment_len());
    let dropped = carried_env(job, |s| env.push(s.to_string()));
    (env, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api::{GpuRequest, GpuScope};
    use slurm::job_desc::free_test_descriptor;

    fn config() -> PluginConfig {
        PluginConfig::for_tests("beta")
    }

    /// Build a descriptor from (field, value) pairs and run `build_request`.
    fn run(fields: &[(StrField, &str)], spank: &[&str]) -> Result<Prepared, Reject> {
        run_full(fields, &[], spank, &[], 1000)
    }

    fn cstrings(v: &[&str]) -> Vec<std::ffi::CString> {
        v.iter().map(|s| std::ffi::CString::new(*s).unwrap()).collect()
    }

    /// As `run`, with numeric fields, the job's environment and the submitting uid.
    fn run_full(
        fields: &[(StrField, &str)],
        nums: &[(NumField, u64)],
        spank: &[&str],
        env: &[&str],
        uid: u32,
    ) -> Result<Prepared, Reject> {
        with_descriptor(fields, nums, spank, env, |jd| build_request(jd, &config(), uid))
    }

    /// `f` on a descriptor made of these fields, spank options and environment.
    fn with_descriptor<T>(
        fields: &[(StrField, &str)],
        nums: &[(NumField, u64)],
        spank: &[&str],
        env: &[&str],
        f: impl FnOnce(&mut JobDesc<'_>) -> T,
    ) -> T {
        let mut d = JobDesc::test_descriptor();
        let spank = cstrings(spank);
        let mut sptrs: Vec<*mut std::ffi::c_char> = spank.iter().map(|c| c.as_ptr() as *mut _).collect();
        d.spank_job_env = if sptrs.is_empty() { std::ptr::null_mut() } else { sptrs.as_mut_ptr() };
        d.spank_job_env_size = sptrs.len() as u32;
        let env = cstrings(env);
        let mut eptrs: Vec<*mut std::ffi::c_char> = env.iter().map(|c| c.as_ptr() as *mut _).collect();
        d.environment = if eptrs.is_empty() { std::ptr::null_mut() } else { eptrs.as_mut_ptr() };
        d.env_size = eptrs.len() as u32;
        let out = {
            let mut jd = JobDesc::from_box(&mut d);
            for (f, v) in fields {
                jd.set(*f, Some(v));
            }
            for (f, v) in nums {
                jd.set_num(*f, *v);
            }
            f(&mut jd)
        };
        d.spank_job_env = std::ptr::null_mut();
        d.spank_job_env_size = 0;
        d.environment = std::ptr::null_mut();
        d.env_size = 0;
        free_test_descriptor(d);
        out
    }

    fn ask(out: Result<Prepared, Reject>) -> JobRequest {
        match out {
            Ok(Prepared::Ask(r)) => *r,
            other => panic!("expected Ask, got {other:?}"),
        }
    }

    fn gpus(p: &Prepared) -> Vec<GpuRequest> {
        match p {
            Prepared::Ask(r) | Prepared::Hetjob(r, _) => r.gpus.clone(),
            Prepared::Untouched => vec![],
        }
    }

    const SCRIPT: (StrField, &str) = (StrField::Script, "#!/bin/sh\ntrue\n");
    const H100: (StrField, &str) = (StrField::TresPerNode, "gres:gpu:h100:8");

    /// `scontrol update` of a stand-in: what Slurm does at home to a
    /// native job passes; a change of the resources the stand-in holds in
    /// place of its job's is refused, naming each.
    #[test]
    fn a_stand_ins_resources_cannot_be_updated_the_rest_can() {
        let update = |f: &dyn Fn(&mut JobDesc<'_>)| {
            let mut d = JobDesc::test_descriptor();
            // As slurm_init_job_desc_msg leaves them (checked against 22.05).
            d.min_cpus = NO_VAL;
            d.pn_min_cpus = NO_VAL16;
            d.job_id_str = c"4242".as_ptr() as *mut _;
            let out = {
                let mut jd = JobDesc::from_box(&mut d);
                f(&mut jd);
                assert_eq!(jd.job_id(), Some(4242));
                stand_in_update_rule(&mut jd, 4242)
            };
            d.job_id_str = std::ptr::null_mut();
            free_test_descriptor(d);
            out.map_err(|r| (r.code, r.message))
        };
        assert_eq!(update(&|_| {}), Ok(()));
        assert_eq!(update(&|j| j.set_num(NumField::TimeLimit, 30)), Ok(()));
        assert_eq!(update(&|j| j.set_num(NumField::Priority, 0)), Ok(()), "hold");
        assert_eq!(update(&|j| j.set(StrField::Dependency, Some("afterok:1"))), Ok(()));
        assert_eq!(update(&|j| j.set(StrField::Name, Some("renamed"))), Ok(()));
        assert_eq!(update(&|j| j.set(StrField::Qos, Some("high"))), Ok(()));
        let (code, msg) = update(&|j| j.set(StrField::TresPerNode, Some("gres:gpu:a100:2"))).unwrap_err();
        assert_eq!(code, sys::ESLURM_NOT_SUPPORTED as i32);
        assert_eq!(
            msg,
            "fleet: job 4242 runs at another cluster through Fleet (this job is its stand-in here): its \
             Gres/TresPerNode cannot be changed once it is submitted; cancel it and submit it again with the new request"
        );
        let (_, msg) = update(&|j| {
            j.set(StrField::Partition, Some("short"));
            j.set_num(NumField::MinNodes, 2);
            j.set_num(NumField::MaxNodes, 2);
            j.set_num(NumField::PnMinMemory, 4096);
        })
        .unwrap_err();
        assert!(msg.contains("its Partition, NumNodes, MinMemoryNode/MinMemoryCPU cannot"), "{msg}");
        for f in [NumField::NumTasks, NumField::MinCpus, NumField::CpusPerTask, NumField::Shared, NumField::PnMinCpus] {
            assert!(update(&|j| j.set_num(f, 1)).is_err(), "{f:?}");
        }
        assert!(update(&|j| j.set(StrField::Features, Some("fast"))).is_err());
    }

    #[test]
    fn the_environment_travels_utf8_and_bounded() {
        let big = format!("BIG={}", "x".repeat(fleet_api::job::MAX_ENV_BYTES));
        let entries: Vec<Vec<u8>> =
            vec![b"PATH=/usr/bin".to_vec(), b"BAD=\xff\xfe".to_vec(), big.into_bytes(), b"LAST=1".to_vec()];
        let env: Vec<std::ffi::CString> = entries.into_iter().map(|e| std::ffi::CString::new(e).unwrap()).collect();
        let mut ptrs: Vec<*mut std::ffi::c_char> = env.iter().map(|c| c.as_ptr() as *mut _).collect();
        let mut d = JobDesc::test_descriptor();
        d.environment = ptrs.as_mut_ptr();
        d.env_size = ptrs.len() as u32;
        let out = {
            let mut jd = JobDesc::from_box(&mut d);
            jd.set(SCRIPT.0, Some(SCRIPT.1));
            jd.set(StrField::TresPerNode, Some("gres:gpu:h100:8"));
            build_request(&mut jd, &config(), 1000)
        };
        d.environment = std::ptr::null_mut();
        d.env_size = 0;
        free_test_descriptor(d);
        let Ok(Prepared::Ask(r)) = out else { panic!("{out:?}") };
        assert_eq!(r.env, ["PATH=/usr/bin", "LAST=1"]);
        assert_eq!(r.env_dropped, 2, "the non-UTF-8 entry and the one past the cap");
    }

    #[test]
    fn prepare_reads_what_placement_needs_and_copies_nothing_else() {
        let fields = [
            SCRIPT,
            (StrField::TresPerNode, "gres:gpu:a100:2"),
            (StrField::Features, "ib"),
            (StrField::MemPerTres, "gres:gpu:4096"),
            (StrField::Name, "train"),
            (StrField::Licenses, "matlab:1"),
        ];
        let nums = [(NumField::MinNodes, 2), (NumField::NumTasks, 4), (NumField::PnMinMemory, 8000)];
        let env = ["PATH=/usr/bin", "SLURM_RLIMIT_CORE=U0", "SLURM_GET_USER_ENV=1"];
        let (light, mut done, full) = with_descriptor(&fields, &nums, &[], &env, |jd| {
            let light = ask(prepare(jd, &config(), 1000));
            let mut done = light.clone();
            complete(jd, &config(), &mut done);
            (light, done, ask(build_request(jd, &config(), 1000)))
        });
        assert_eq!(done, full, "prepare + complete is the whole request");
        // What placement reads is there already; the script, environment
        // and other text are not copied.
        assert_eq!((light.gpus.clone(), light.min_nodes, light.num_tasks), (full.gpus.clone(), Some(2), Some(4)));
        assert_eq!(
            (light.mem_per_node_mb, light.mem_per_gpu_mb, light.constraint.as_deref()),
            (Some(8000), Some(4096), Some("ib"))
        );
        assert_eq!(light.not_carried, ["--licenses=matlab:1", "--propagate", "--get-user-env"]);
        assert_eq!(light.not_carried, full.not_carried);
        assert_eq!((light.script.as_deref(), light.env.len(), light.name.as_deref()), (None, 0, None));
        assert_eq!(
            (full.script.as_deref(), full.env.len(), full.name.as_deref()),
            (Some(SCRIPT.1.as_bytes()), 3, Some("train"))
        );
        done.script = None;
        assert_ne!(done, full);
    }

    #[test]
    fn what_is_left_alone() {
        // No script: salloc/srun.
        assert_eq!(run(&[(StrField::TresPerNode, "gres:gpu:h100:8")], &[]), Ok(Prepared::Untouched));
        // No GPUs, no options.
        assert_eq!(run(&[SCRIPT], &[]), Ok(Prepared::Untouched));
        // --fleet=local.
        assert_eq!(
            run(&[SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:8")], &["_SLURM_SPANK_OPTION_fleet_fleet=local"]),
            Ok(Prepared::Untouched)
        );
        // Arrays without GPUs or options stay untouched; GPU arrays are read
        // (and may be deferred element by element).
        assert_eq!(run(&[SCRIPT, (StrField::ArrayInx, "1-4")], &[]), Ok(Prepared::Untouched));
        match run(&[SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:8"), (StrField::ArrayInx, "1-4%2")], &[]) {
            Ok(Prepared::Ask(r)) => assert!(r.is_array),
            other => panic!("a GPU array is read: {other:?}"),
        }
    }

    #[test]
    fn gpu_forms_are_read() {
        let node = GpuRequest { gpu_type: Some("h100".into()), count: 8, scope: GpuScope::Node };
        assert_eq!(gpus(&run(&[SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:8")], &[]).unwrap()), vec![node.clone()]);
        assert_eq!(gpus(&run(&[SCRIPT, (StrField::TresPerNode, "gres/gpu:h100:8")], &[]).unwrap()), vec![node]);
        assert_eq!(
            gpus(&run(&[SCRIPT, (StrField::TresPerJob, "gres:gpu:8")], &[]).unwrap()),
            vec![GpuRequest { gpu_type: None, count: 8, scope: GpuScope::Job }]
        );
        assert_eq!(
            gpus(&run(&[SCRIPT, (StrField::TresPerTask, "gres:gpu:1")], &[]).unwrap()),
            vec![GpuRequest { gpu_type: None, count: 1, scope: GpuScope::Task }]
        );
    }

    #[test]
    fn user_errors_reject_with_a_message() {
        let e = run(&[SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:x")], &[]).unwrap_err();
        assert!(e.message.starts_with("fleet: bad GPU request \"gres:gpu:h100:x\""), "{}", e.message);
        assert_eq!(e.code, sys::ESLURM_INVALID_GRES as i32);
        let e = run(&[SCRIPT], &["_SLURM_SPANK_OPTION_fleet_fleet=sideways"]).unwrap_err();
        assert_eq!(e.message, "fleet: --fleet=sideways: expected auto, local or remote");
        // A job Fleet forwarded here is left alone, never refused for what
        // it carries (its origin read it), though the environment that says
        // so is read only after the options and the GPU request.
        let forwarded = ["FLEET_FORWARDED_JOB=alpha-00ab"];
        for (fields, spank) in [
            (vec![SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:x")], vec![]),
            (vec![SCRIPT, H100], vec!["_SLURM_SPANK_OPTION_fleet_fleet=sideways"]),
        ] {
            assert_eq!(run_full(&fields, &[], &spank, &forwarded, 1000), Ok(Prepared::Untouched));
        }
    }

    /// The LOCAL path reads the shape alone: `not_carried` (which placement
    /// reads away from home) and the forwarded mark come with
    /// `finish_shape`, and `prepare` is the two together.
    #[test]
    fn the_shape_is_read_first_and_finished_for_jobs_that_may_leave() {
        let fields = [SCRIPT, H100, (StrField::Licenses, "matlab:1")];
        let env = ["SLURM_GET_USER_ENV=1"];
        let shape = with_descriptor(&fields, &[], &[], &env, |jd| read_shape(jd, &config(), 1000)).unwrap().unwrap();
        assert!(shape.is_plain() && shape.req.not_carried.is_empty() && shape.req.gpus.len() == 1, "{shape:?}");
        let finished = with_descriptor(&fields, &[], &[], &env, |jd| finish_shape(jd, shape));
        let Prepared::Ask(req) = finished else { panic!("{finished:?}") };
        assert_eq!(req.not_carried, ["--licenses=matlab:1", "--get-user-env"]);
        let Ok(Prepared::Ask(whole)) = run_full(&fields, &[], &[], &env, 1000) else { panic!() };
        assert_eq!(whole.not_carried, req.not_carried);
        // Options or a hetjob component: not plain (placement decides them).
        let shape = with_descriptor(&[SCRIPT, H100], &[], &["_SLURM_SPANK_OPTION_fleet_fleet_to=alpha"], &[], |jd| {
            read_shape(jd, &config(), 1000)
        });
        assert!(!shape.unwrap().unwrap().is_plain());
        let shape = with_descriptor(&[SCRIPT, H100], &[(NumField::HetJobOffset, 0)], &[], &[], |jd| {
            read_shape(jd, &config(), 1000)
        });
        assert!(!shape.unwrap().unwrap().is_plain());
        // A job Fleet forwarded here: a shape, then left alone.
        let fwd = ["FLEET_FORWARDED_JOB=alpha-00ab"];
        let shape = with_descriptor(&[SCRIPT, H100], &[], &[], &fwd, |jd| read_shape(jd, &config(), 1000));
        let finished = with_descriptor(&[SCRIPT, H100], &[], &[], &fwd, |jd| finish_shape(jd, shape.unwrap().unwrap()));
        assert_eq!(finished, Prepared::Untouched);
    }

    /// Two plain jobs with the same [`ShapeKey`] have the same shape but
    /// for the submitter's ids (what the LOCAL memo relies on), whatever
    /// their other fields; any shape field that differs makes another key.
    #[test]
    fn the_shape_key_holds_every_field_the_shape_is_read_from() {
        let strs: [&[Option<&str>]; 7] = [
            &[None, Some(""), Some("gres:gpu:16"), Some("gres:gpu:h100:16")],
            &[None, Some("gres:gpu:a100:1"), Some("gres:gpu:h100:8"), Some("gres:gpu:2,gres:shard:1")],
            &[None, Some("gres:gpu:1"), Some("gres:gpu:h100:2")],
            &[None, Some("gres:gpu:1")],
            &[None, Some(""), Some("ib&nvlink"), Some("a100|h100")],
            &[None, Some("gres:gpu:40960"), Some("gres:gpu:4096")],
            &[None, Some("gres:gpu:4"), Some("gres:gpu:8")],
        ];
        let nums: [&[u64]; 6] = [
            &[NO_VAL64, 4096, MEM_PER_CPU | 2048, 0],
            &[NO_VAL as u64, 1, 2],
            &[NO_VAL as u64, 2, 4],
            &[NO_VAL as u64, 8, 16],
            &[NO_VAL16 as u64, 4, 8],
            &[NO_VAL16 as u64, 2, 8],
        ];
        // A small xorshift: the same cases every run.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let others = [
            (StrField::Name, ["a", "train"]),
            (StrField::Comment, ["", "run 7"]),
            (StrField::Partition, ["gpu", "debug"]),
            (StrField::WorkDir, ["/tmp", "/home/x"]),
            (StrField::Account, ["a", "b"]),
            (StrField::SubmitLine, ["sbatch job.sh", "sbatch -J x job.sh"]),
            (StrField::Licenses, ["matlab:1", "x:2"]),
            (StrField::ArrayInx, ["", "0-3"]),
        ];
        let mut shapes_seen = 0;
        for _ in 0..400 {
            let chosen: Vec<(StrField, Option<&str>)> =
                SHAPE_STRS.iter().zip(strs).map(|(&f, pool)| (f, pool[next(pool.len())])).collect();
            let chosen_nums: Vec<(NumField, u64)> =
                SHAPE_NUMS.iter().zip(nums).map(|(&f, pool)| (f, pool[next(pool.len())])).collect();
            let read = |seed: usize, uid: u64| {
                let mut fields: Vec<(StrField, &str)> = chosen.iter().filter_map(|(f, v)| Some((*f, (*v)?))).collect();
                fields.push(SCRIPT);
                fields.extend(others.iter().map(|(f, v)| (*f, v[seed % 2])));
                let mut n = chosen_nums.clone();
                n.extend([
                    (NumField::UserId, uid),
                    (NumField::GroupId, uid + 1),
                    (NumField::TimeLimit, seed as u64 + 1),
                ]);
                with_descriptor(&fields, &n, &[], &[], |jd| {
                    let key = ShapeKey::of(jd).expect("short fields fit").as_bytes().to_vec();
                    (key, read_shape(jd, &config(), 1000))
                })
            };
            let (k1, s1) = read(0, 1000);
            let (k2, s2) = read(1, 2000);
            assert_eq!(k1, k2, "{chosen:?} {chosen_nums:?}");
            let norm = |s: Result<Option<Shape>, Reject>| {
                s.map(|o| {
                    o.map(|mut s| {
                        (s.req.user_id, s.req.group_id) = (0, 0);
                        // An array is read (`is_array`) but decides nothing at home.
                        s.req.is_array = false;
                        (s.req, s.het_offset, s.tres_per_node)
                    })
                })
            };
            let (s1, s2) = (norm(s1), norm(s2));
            shapes_seen += usize::from(matches!(s1, Ok(Some(_))));
            assert_eq!(s1, s2, "{chosen:?} {chosen_nums:?}");
            // Each shape field changed alone changes the key.
            for (i, (f, v)) in chosen.iter().enumerate() {
                let other = strs[i].iter().find(|o| *o != v).copied().unwrap();
                let mut fields: Vec<(StrField, &str)> = chosen.iter().filter_map(|(f, v)| Some((*f, (*v)?))).collect();
                fields.retain(|(g, _)| g != f);
                fields.extend(other.map(|o| (*f, o)));
                let k = with_descriptor(&fields, &chosen_nums, &[], &[], |jd| {
                    ShapeKey::of(jd).unwrap().as_bytes().to_vec()
                });
                assert_ne!(k, k1, "{f:?}: {v:?} -> {other:?}");
            }
            for (i, (f, v)) in chosen_nums.iter().enumerate() {
                let other = *nums[i].iter().find(|o| *o != v).unwrap();
                let mut n = chosen_nums.clone();
                n[i] = (*f, other);
                let fields: Vec<(StrField, &str)> = chosen.iter().filter_map(|(f, v)| Some((*f, (*v)?))).collect();
                let k = with_descriptor(&fields, &n, &[], &[], |jd| ShapeKey::of(jd).unwrap().as_bytes().to_vec());
                assert_ne!(k, k1, "{f:?}: {v} -> {other}");
            }
        }
        assert!(shapes_seen > 200, "most cases are GPU jobs: {shapes_seen}");
        // Fields too long for the key: no key (the job is placed, not remembered).
        let long = format!("gres:gpu:{}", "x".repeat(SHAPE_KEY_MAX));
        assert!(with_descriptor(&[(StrField::Features, &long)], &[], &[], &[], |jd| ShapeKey::of(jd).is_none()));
    }

    #[test]
    fn options_alone_ask_the_agent_and_large_scripts_are_not_sent() {
        let big = format!("#!/bin/sh\n{}", "x".repeat(2 << 20));
        let p = run(&[(StrField::Script, &big)], &["_SLURM_SPANK_OPTION_fleet_fleet_to=alpha"]).unwrap();
        let Prepared::Ask(r) = p else { panic!("expected Ask") };
        assert_eq!(r.fleet.to, vec!["alpha".to_string()]);
        assert_eq!(r.script, None);
        assert_eq!(r.script_len, Some(big.len() as u64));
        assert_eq!(r.origin, "beta");
    }

    /// `not_carried` and the request of a descriptor whose argv is `argv`.
    fn with_argv(
        argv: &[&[u8]],
        batch_features: Option<&std::ffi::CStr>,
        prep: impl FnOnce(&mut JobDesc<'_>),
    ) -> (Vec<String>, Vec<String>) {
        let mut d = JobDesc::test_descriptor();
        d.batch_features = batch_features.map_or(std::ptr::null_mut(), |f| f.as_ptr() as *mut _);
        let owned: Vec<std::ffi::CString> = argv.iter().map(|a| std::ffi::CString::new(*a).unwrap()).collect();
        let mut ptrs: Vec<*mut std::ffi::c_char> = owned.iter().map(|c| c.as_ptr() as *mut _).collect();
        d.argv = ptrs.as_mut_ptr();
        d.argc = ptrs.len() as u32;
        let out = {
            let mut jd = JobDesc::from_box(&mut d);
            prep(&mut jd);
            let mut req = JobRequest::default();
            complete(&mut jd, &config(), &mut req);
            (not_carried(&mut jd, None), req.script_args)
        };
        d.argv = std::ptr::null_mut();
        d.argc = 0;
        d.batch_features = std::ptr::null_mut();
        free_test_descriptor(d);
        out
    }

    #[test]
    fn script_arguments_travel_and_options_no_target_gets_keep_the_job_home() {
        let features = std::ffi::CString::new("knl").unwrap();
        let (out, args) = with_argv(&[b"train.sh", b"--lr", b"0.1", b"a b;$(x)"], Some(&features), |jd| {
            jd.set(StrField::MemBind, Some("local"));
            jd.set_num(NumField::WaitAllNodes, 1);
        });
        assert_eq!(out, ["--mem-bind=local", "--batch", "--wait-all-nodes=1"]);
        assert_eq!(args, ["--lr", "0.1", "a b;$(x)"]);
        // A script without arguments (argv[0] alone) and the defaults: nothing.
        assert_eq!(with_argv(&[b"train.sh"], None, |_| {}), (vec![], vec![]));
        assert_eq!(with_argv(&[], None, |_| {}), (vec![], vec![]));
        // What cannot travel as text, or is too long, keeps the job home.
        let (out, _) = with_argv(&[b"train.sh", b"\xff"], None, |_| {});
        assert_eq!(out, ["script arguments that are not UTF-8"]);
        let long = vec![b'x'; MAX_SCRIPT_ARGS_BYTES];
        let (out, _) = with_argv(&[b"train.sh", &long], None, |_| {});
        assert_eq!(out, [format!("script arguments beyond {MAX_SCRIPT_ARGS_BYTES} bytes")]);
    }

    #[test]
    fn the_whole_request_is_read() {
        let r = ask(run_full(
            &[
                SCRIPT,
                (StrField::TresPerJob, "gres:gpu:h100:16"),
                (StrField::MemPerTres, "gres:gpu:40960"),
                (StrField::CpusPerTres, "gres:gpu:4"),
                (StrField::Features, "ib&nvlink"),
                (StrField::Comment, "my run 7"),
                (StrField::MailUser, "me@example.org"),
                (StrField::Qos, "high"),
                (StrField::Dependency, "afterok:12"),
            ],
            &[
                (NumField::Priority, 0),
                (NumField::MinNodes, 1),
                (NumField::MaxNodes, 2),
                (NumField::NumTasks, 16),
                (NumField::PnMinMemory, MEM_PER_CPU | 2048),
                (NumField::Shared, 0),
                (NumField::WarnSignal, 10),
                (NumField::WarnTime, 90),
                (NumField::WarnFlags, KILL_JOB_BATCH),
                (NumField::MailType, 0b11),
                (NumField::TimeLimit, 120),
                (NumField::TimeMin, 30),
                (NumField::BeginTime, 1_900_000_000),
            ],
            &[],
            &["PATH=/usr/bin", "SLURM_EXPORT_ENV=NONE"],
            1000,
        ));
        assert_eq!((r.min_nodes, r.max_nodes, r.num_tasks), (Some(1), Some(2), Some(16)));
        assert_eq!(
            (r.mem_per_node_mb, r.mem_per_cpu_mb, r.mem_per_gpu_mb, r.cpus_per_gpu),
            (None, Some(2048), Some(40960), Some(4))
        );
        assert_eq!(r.exclusive, Some(Exclusive::Node));
        assert_eq!(r.constraint.as_deref(), Some("ib&nvlink"));
        assert_eq!((r.warn_signal, r.warn_time, r.warn_batch_only, r.warn_resv), (Some(10), Some(90), true, false));
        assert_eq!(r.comment.as_deref(), Some("my run 7"));
        assert_eq!((r.mail_type.as_deref(), r.mail_user.as_deref()), (Some("BEGIN,END"), Some("me@example.org")));
        assert_eq!((r.time_limit_min, r.time_min), (Some(120), Some(30)));
        assert_eq!(r.export_env.as_deref(), Some("NONE"));
        assert_eq!(r.qos.as_deref(), Some("high"));
        assert_eq!(r.begin_time, Some(1_900_000_000));
        // What decides when the stand-in starts at the origin (early placement).
        assert_eq!((r.dependency.as_deref(), r.hold), (Some("afterok:12"), true));
        assert!(r.not_carried.is_empty(), "{:?}", r.not_carried);
        assert!(!r.time_unlimited);
        // --time=UNLIMITED is not "no --time" (the partition's DefaultTime).
        let limits = |t: u64| {
            let r = ask(run_full(&[SCRIPT, H100], &[(NumField::TimeLimit, t)], &[], &[], 1000));
            (r.time_limit_min, r.time_unlimited)
        };
        assert_eq!(limits(u64::from(slurm::INFINITE)), (None, true));
        assert_eq!(limits(u64::from(NO_VAL)), (None, false));
        assert_eq!(limits(90), (Some(90), false));
        // Without --time, the limit its partition here would give it, which
        // its target gives it then (Slurm applies it after this hook).
        let sc = slurm_conf::slurm::SlurmConf::parse_str(
            "NodeName=n1 CPUs=4\n\
             PartitionName=gpu Nodes=n1 Default=YES\n\
             PartitionName=short Nodes=n1 DefaultTime=30 MaxTime=120\n\
             PartitionName=capped Nodes=n1 MaxTime=2:00:00\n",
            "slurm.conf",
        )
        .unwrap()
        .conf;
        let mut cfg = config();
        cfg.partition_limits = crate::config::PartitionLimits::from_conf(&sc);
        let implied = |part: Option<&str>, t: u64| {
            let mut fields = vec![SCRIPT, H100];
            fields.extend(part.map(|p| (StrField::Partition, p)));
            let got = with_descriptor(&fields, &[(NumField::TimeLimit, t)], &[], &[], |jd| {
                let got = build_request(jd, &cfg, 1000);
                // The job itself is left for Slurm to judge.
                assert_eq!(jd.num(NumField::TimeLimit), t);
                got
            });
            let r = ask(got);
            (r.time_limit_min, r.time_unlimited)
        };
        assert_eq!(implied(Some("short"), u64::from(NO_VAL)), (Some(30), false));
        assert_eq!(implied(Some("capped"), u64::from(NO_VAL)), (Some(120), false));
        assert_eq!(implied(None, u64::from(NO_VAL)), (None, false), "unlimited here: the target's default");
        assert_eq!(implied(Some("nowhere,capped,short"), u64::from(NO_VAL)), (Some(120), false));
        assert_eq!(implied(Some("nowhere"), u64::from(NO_VAL)), (None, false), "unknown: the target's default");
        assert_eq!(implied(Some("short"), 45), (Some(45), false), "its own --time wins");
        // --requeue / --no-requeue / -k act at the target as at home.
        let node_failure = |nums: &[(NumField, u64)]| {
            let r = ask(run_full(&[SCRIPT, H100], nums, &[], &[], 1000));
            (r.requeue, r.no_kill)
        };
        assert_eq!(node_failure(&[]), (None, false));
        assert_eq!(node_failure(&[(NumField::Requeue, 0), (NumField::KillOnNodeFail, 0)]), (Some(false), true));
        assert_eq!(node_failure(&[(NumField::Requeue, 1), (NumField::KillOnNodeFail, 1)]), (Some(true), false));
        // --export=NONE implies SLURM_GET_USER_ENV; so does --get-user-env alone (not carried).
        let none = ask(run_full(
            &[SCRIPT, H100],
            &[],
            &[],
            &["SLURM_EXPORT_ENV=NONE", "SLURM_GET_USER_ENV=1", "SLURM_RLIMIT_CORE=0"],
            1000,
        ));
        assert!(none.not_carried.is_empty(), "{:?}", none.not_carried);
        let user_env =
            ask(run_full(&[SCRIPT, H100], &[], &[], &["SLURM_GET_USER_ENV=1", "SLURM_RLIMIT_CORE=U0"], 1000));
        assert_eq!(user_env.not_carried, ["--propagate", "--get-user-env"]);
        assert_eq!(
            fleet_api::sbatch::sbatch_options(&r),
            [
                "--gpus=h100:16",
                "--nodes=1-2",
                "--ntasks=16",
                "--cpus-per-gpu=4",
                "--mem-per-cpu=2048M",
                "--mem-per-gpu=40960M",
                "--exclusive",
                "--constraint=ib&nvlink",
                "--signal=B:10@90",
                "--comment=my run 7",
                "--mail-type=BEGIN,END",
                "--mail-user=me@example.org",
                "--time=120",
                "--time-min=30",
                "--export=NONE",
            ]
        );
        // Unset markers read as unset; --mem per node; --oversubscribe.
        let r = ask(run_full(&[SCRIPT, H100], &[(NumField::PnMinMemory, 8000), (NumField::Shared, 1)], &[], &[], 1000));
        assert_eq!((r.mem_per_node_mb, r.mem_per_cpu_mb, r.exclusive, r.oversubscribe), (Some(8000), None, None, true));
        assert_eq!(
            (r.warn_signal, r.mail_type.as_deref(), r.time_min, r.export_env.as_deref(), r.begin_time),
            (None, None, None, None, None)
        );
        assert_eq!((r.dependency.as_deref(), r.hold), (None, false));
    }

    #[test]
    fn options_no_other_cluster_can_honour_are_listed() {
        let check = |fields: &[(StrField, &str)], nums: &[(NumField, u64)], expected: &[&str]| {
            let mut f = vec![SCRIPT, H100];
            f.extend_from_slice(fields);
            let r = ask(run_full(&f, nums, &[], &[], 1000));
            assert_eq!(r.not_carried, expected, "{fields:?} {nums:?}");
        };
        check(&[(StrField::Licenses, "matlab:1")], &[], &["--licenses=matlab:1"]);
        check(&[(StrField::Reservation, "maint")], &[], &["--reservation=maint"]);
        check(&[(StrField::ReqNodes, "alpha1")], &[], &["--nodelist=alpha1"]);
        check(&[(StrField::ExcNodes, "alpha2")], &[], &["--exclude=alpha2"]);
        check(&[(StrField::TresBind, "gres/gpu:closest")], &[], &["--gpu-bind=gres/gpu:closest"]);
        check(&[(StrField::TresPerNode, "gres:gpu:h100:8,gres:shard:2")], &[], &["--gres=shard:2"]);
        check(&[(StrField::StdIn, "/dev/null")], &[], &[]);
        check(&[(StrField::StdIn, "/home/u/in.txt")], &[], &["--input=/home/u/in.txt"]);
        check(&[], &[(NumField::CoreSpec, 2)], &["--core-spec/--thread-spec=2"]);
        check(&[], &[(NumField::ThreadsPerCore, 1)], &["--threads-per-core=1"]);
        check(&[], &[(NumField::PnMinTmpDisk, 1000)], &["--tmp"]);
        check(&[], &[(NumField::Bitflags, SPREAD_JOB)], &["--spread-job"]);
        check(&[], &[(NumField::Overcommit, 1)], &["--overcommit"]);
        check(&[], &[(NumField::TaskDist, SLURM_DIST_UNKNOWN)], &[]);
        check(&[], &[(NumField::TaskDist, 1)], &["--distribution"]);
        check(&[], &[(NumField::PnMinCpus, 4), (NumField::CpusPerTask, 4)], &[]);
        check(&[], &[(NumField::PnMinCpus, 16), (NumField::CpusPerTask, 4)], &["--mincpus=16"]);
    }

    #[test]
    fn origin_rules_cannot_be_bypassed() {
        // The proxy partition takes stand-ins only: sbatch, salloc, --fleet=local alike.
        for (fields, spank) in [
            (vec![SCRIPT, (StrField::Partition, "fleet")], vec![]),
            (vec![(StrField::Partition, "gpu,FLEET")], vec![]),
            (vec![SCRIPT, (StrField::Partition, "fleet")], vec!["_SLURM_SPANK_OPTION_fleet_fleet=local"]),
        ] {
            let e = run_full(&fields, &[], &spank, &[], 1000).unwrap_err();
            assert!(e.message.starts_with("fleet: partition fleet holds only Fleet's stand-ins"), "{}", e.message);
            assert_eq!(e.code, sys::ESLURM_INVALID_PARTITION_NAME as i32);
        }
        // Root may (an admin repairing a stand-in).
        assert_eq!(run_full(&[SCRIPT, (StrField::Partition, "fleet")], &[], &[], &[], 0), Ok(Prepared::Untouched));
        // A forged Fleet tag.
        let e = run_full(&[SCRIPT, (StrField::AdminComment, "fleet:beta-1")], &[], &[], &[], 1000).unwrap_err();
        assert_eq!(e.message, "fleet: an admin comment starting with \"fleet:\" is Fleet's own tag");
        // A job Fleet forwarded here is never forwarded again, without asking the agent.
        assert_eq!(
            run_full(&[SCRIPT, H100], &[], &[], &["A=1", "FLEET_FORWARDED_JOB=beta-00ab"], 1000),
            Ok(Prepared::Untouched)
        );
        assert!(matches!(run_full(&[SCRIPT, H100], &[], &[], &["FLEET_FORWARDED_JOBS=x"], 1000), Ok(Prepared::Ask(_))));
        // A heterogeneous job's components are never asked about (they stay).
        for offset in [0, 1] {
            let out = run_full(&[SCRIPT, H100], &[(NumField::HetJobOffset, offset)], &[], &[], 1000);
            assert!(matches!(&out, Ok(Prepared::Hetjob(r, o)) if *o == offset && r.gpus.len() == 1), "{out:?}");
        }
        // sbatch --test-only creates nothing.
        assert_eq!(
            run_full(
                &[SCRIPT, H100, (StrField::SubmitLine, "sbatch --test-only --gpus=8 job.sh")],
                &[],
                &[],
                &[],
                1000
            ),
            Ok(Prepared::Untouched)
        );
        assert_eq!(
            run_full(&[SCRIPT, H100, (StrField::SubmitLine, "sbatch -G 8 --test-only job.sh")], &[], &[], &[], 1000),
            Ok(Prepared::Untouched)
        );
        assert!(matches!(
            run_full(
                &[SCRIPT, H100, (StrField::SubmitLine, "sbatch --gpus=8 --test-onlyx job.sh")],
                &[],
                &[],
                &[],
                1000
            ),
            Ok(Prepared::Ask(_))
        ));
    }

    #[test]
    fn fleet_interruptible_as_slurm_hands_it_over() {
        let r = ask(run(&[SCRIPT, H100], &["_SLURM_SPANK_OPTION_fleet_fleet_interruptible=(null)"]));
        assert!(r.fleet.interruptible);
    }
}
