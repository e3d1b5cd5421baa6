//! The job as the origin site saw it, and its lifecycle across the fleet.

use serde::{Deserialize, Serialize};

/// Where a GPU count applies, mirroring Slurm's `tres_per_*` fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuScope {
    /// `--gres=gpu:…`, `--gpus-per-node=…`
    Node,
    /// `--gpus=…`, `-G …`
    Job,
    /// `--gpus-per-task=…`
    Task,
    /// `--gpus-per-socket=…`
    Socket,
}

/// One GPU request as the user typed it (after Slurm's own normalisation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRequest {
    /// `None` = any type (`--gres=gpu:8`).
    pub gpu_type: Option<String>,
    pub count: u32,
    pub scope: GpuScope,
}

/// `--fleet=auto|local|remote`
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetMode {
    #[default]
    Auto,
    Local,
    Remote,
}

/// The `--fleet-*` options (SPANK) plus `#FLEET` script directives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetOptions {
    pub mode: FleetMode,
    /// `--fleet-to=a,b`: the only clusters the job may run on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<String>,
    /// `--fleet-max-price`: USD per GPU-hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price: Option<f64>,
    /// `--fleet-data=<uri>` (may repeat, comma separated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<String>,
    /// `--fleet-ckpt=<uri>`. In an assignment to a target, the job's
    /// checkpoint prefix there (this, or the site default of the target's
    /// region), which the target agent passes as `FLEET_CKPT_URL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ckpt: Option<String>,
    /// Set by the meta-scheduler in an assignment: the checkpoint the job
    /// resumes from, readable at the target (`FLEET_RESUME_FROM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<String>,
    /// `--fleet-interruptible`
    #[serde(default)]
    pub interruptible: bool,
    /// Set by the target's agent in the request it submits (never on the
    /// wire from a user): the run's placement epoch, which the run's
    /// in-job lease watchdog names when it renews (`FLEET_EPOCH`).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub epoch: u64,
    /// `--fleet-image`: the container image at a Kubernetes target (checked
    /// by `options::check_image`); wins over the script's `#FLEET image=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Set by the meta-scheduler in an assignment of a job placed early
    /// (before its origin confirmed the stand-in runs): the target submits
    /// it only under its in-job lease (`fleet-ckpt lease-exec`), whose first
    /// lease waits for that confirmation, or not at all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_gated: bool,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Most bytes of environment a forwarded job carries.
pub const MAX_ENV_BYTES: usize = 1 << 20;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What slurmctld handed `job_submit`, reduced to what Fleet needs.
///
/// Byte strings that may not be UTF-8 (the script, paths) travel as
/// base64 so that nothing is lost on the way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRequest {
    /// Site (cluster) name where the user submitted.
    pub origin: String,
    pub user_id: u32,
    #[serde(default)]
    pub group_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Slurm's `min_nodes`; `None` when unset (NO_VAL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_tasks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntasks_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    /// Minutes; `None` = partition default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_min: Option<u32>,
    /// `--time=UNLIMITED` (or 0): no limit asked for, unlike no `--time`
    /// at all (the partition's DefaultTime). The target gives the longest
    /// its partition allows (`None` in `time_limit_min`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub time_unlimited: bool,
    /// The script's arguments (`sbatch [options] script args...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script_args: Vec<String>,
    /// `--requeue` (`Some(true)`) or `--no-requeue` (`Some(false)`); `None`:
    /// the cluster's `JobRequeue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue: Option<bool>,
    /// `-k/--no-kill`: a node failure does not end the job.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_kill: bool,
    /// All GPU requests found in `tres_per_{job,node,task,socket}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuRequest>,
    /// The raw TRES strings, kept for the admin comment and for re-submission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tres_raw: Vec<(String, String)>,
    /// Batch script (base64 on the wire). `None` for salloc/srun.
    #[serde(default, with = "b64_opt", skip_serializing_if = "Option::is_none")]
    pub script: Option<Vec<u8>>,
    /// Length of the script when it was too large to send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script_len: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std_out: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std_err: Option<String>,
    /// The environment sbatch captured at the origin (`NAME=value`), which
    /// the target submits the job with, as sbatch would have. Entries that
    /// are not UTF-8, and any beyond [`MAX_ENV_BYTES`], are left out
    /// (`env_dropped` counts them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub env_dropped: u32,
    /// `--array=…` present (at the origin: a GPU array that leaves is
    /// forwarded element by element, see [`crate::deferred`]).
    #[serde(default)]
    pub is_array: bool,
    /// For one element of an origin job array: the `SLURM_ARRAY_*`
    /// variables Slurm set for it there (`NAME=decimal`, names of
    /// [`crate::deferred::ARRAY_VARS`]), which the target sets for the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub array_env: Vec<String>,
    /// Fields whose bytes were not UTF-8 (they were read lossily).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub non_utf8_fields: Vec<String>,
    #[serde(default)]
    pub fleet: FleetOptions,

    // ---- What the target needs to reproduce the job (see `sbatch`). ----
    /// `--mem` in MiB per node (`Some(0)`: all of each node's memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_node_mb: Option<u64>,
    /// `--mem-per-cpu` in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_cpu_mb: Option<u64>,
    /// `--mem-per-gpu` in MiB (`mem_per_tres` `gres:gpu:N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_gpu_mb: Option<u64>,
    /// `--cpus-per-gpu` (`cpus_per_tres` `gres:gpu:N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_gpu: Option<u32>,
    /// `--exclusive[=user|mcs]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<Exclusive>,
    /// `--oversubscribe`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oversubscribe: bool,
    /// `--contiguous`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub contiguous: bool,
    /// `--constraint` as typed (Slurm's `features`): a hard placement
    /// constraint against each cluster's node features.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// `--signal=[R|B:]num[@time]`: the signal number (`warn_signal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn_signal: Option<u16>,
    /// Seconds before the time limit the signal is sent (`warn_time`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn_time: Option<u16>,
    /// `B:` in `--signal`: signal the batch shell only (`KILL_JOB_BATCH`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warn_batch_only: bool,
    /// `R:` in `--signal`: the job may run in a reservation's last minutes
    /// (`KILL_JOB_RESV`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warn_resv: bool,
    /// The user's own `--comment`, as they set it. Fleet's tag lives in
    /// `admin_comment` (`fleet:<fleet_job_id>`), never here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// `--mail-type` as sbatch spells it (`BEGIN,END,FAIL,...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail_user: Option<String>,
    /// `--time-min` in minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_min: Option<u32>,
    /// `--export` as sbatch sent it: `None` = ALL (the default); else the
    /// value of `SLURM_EXPORT_ENV` in the job's environment (`NONE`,
    /// `NIL`, or a list such as `PATH,FOO=bar`, possibly led by `ALL,`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// `--licenses` (site-local: a job with licenses never leaves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licenses: Option<String>,
    /// `--begin`, Unix seconds (honoured at the origin by the stand-in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_time: Option<i64>,
    /// `--dependency` as given (honoured at the origin by the stand-in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
    /// `--hold` (submitted with priority 0; released at the origin).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// Options present on the job that no other cluster can honour
    /// (`--licenses`, `--reservation`, `--nodelist`, ...), each as
    /// `--option` or `--option=value`. A job with any stays home, or is
    /// refused naming them when home cannot run it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_carried: Vec<String>,
}

/// `--exclusive` modes (Slurm's `shared` field: 0, 2, 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exclusive {
    /// `--exclusive`: whole nodes.
    Node,
    /// `--exclusive=user`
    User,
    /// `--exclusive=mcs`
    Mcs,
}

/// `--export`'s meaning, from [`JobRequest::export_env`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportMode {
    /// The whole submission environment (the default).
    All,
    /// Only `SLURM_*` variables (and, for `NONE`, the user's login
    /// environment loaded on the node).
    None,
    /// `NIL`: only `SLURM_*`, no login environment.
    Nil,
    /// The named variables (and `NAME=value` settings); `all` when the
    /// list started with `ALL,`.
    List { all: bool, items: Vec<String> },
}

impl JobRequest {
    /// The GPU request expressed as (type, GPUs per node, nodes) when it
    /// can be: per-node forms multiply by the node count, per-job forms
    /// stand alone, per-task forms multiply by the task count.
    pub fn total_gpus(&self) -> u32 {
        let nodes = self.min_nodes.unwrap_or(1).max(1);
        let tasks = self.num_tasks.unwrap_or(1).max(1);
        self.gpus
            .iter()
            .map(|g| match g.scope {
                GpuScope::Job => g.count,
                GpuScope::Node | GpuScope::Socket => g.count.saturating_mul(nodes),
                GpuScope::Task => g.count.saturating_mul(tasks),
            })
            .fold(0u32, u32::saturating_add)
    }

    /// `--export`'s mode.
    pub fn export_mode(&self) -> ExportMode {
        let Some(v) = self.export_env.as_deref().map(str::trim) else {
            return ExportMode::All;
        };
        match v.to_ascii_uppercase().as_str() {
            "" | "ALL" => ExportMode::All,
            "NONE" => ExportMode::None,
            "NIL" => ExportMode::Nil,
            _ => {
                let mut items: Vec<String> =
                    v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
                let all = items.first().is_some_and(|f| f.eq_ignore_ascii_case("ALL"));
                if all {
                    items.remove(0);
                }
                ExportMode::List { all, items }
            }
        }
    }

    /// The one GPU type named, if any (`None` = untyped or no GPUs).
    pub fn gpu_type(&self) -> Option<&str> {
        self.gpus.iter().find_map(|g| g.gpu_type.as_deref())
    }

    /// GPUs each node must hold: the per-node count, or the whole job's
    /// count spread over its nodes.
    pub fn gpus_per_node(&self) -> u32 {
        let nodes = self.min_nodes.unwrap_or(1).max(1);
        let total = self.total_gpus();
        if let Some(g) = self.gpus.iter().find(|g| g.scope == GpuScope::Node) {
            return g.count;
        }
        total.div_ceil(nodes)
    }
}

/// Lifecycle of a forwarded job, as the meta-scheduler tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Accepted at the origin; waiting for the stand-in job to start there
    /// (the origin's own dependencies, holds and begin times gate it).
    Held,
    /// Released by the stand-in, not yet given to a target.
    Queued,
    /// Given to a target agent, not yet submitted there.
    Assigned,
    /// Submitted at the target, pending in its queue.
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    /// The target lost track of it (its records expired, node failure).
    Lost,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Completed | JobState::Failed | JobState::Cancelled | JobState::Lost)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Held => "held",
            JobState::Queued => "queued",
            JobState::Assigned => "assigned",
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Lost => "lost",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Serde helper: `Option<Vec<u8>>` as base64 text.
pub mod b64_opt {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| base64::engine::general_purpose::STANDARD.decode(s.as_bytes()).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Serde helper: `Vec<u8>` as base64 text.
pub mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(s.as_bytes()).map_err(serde::de::Error::custom)
    }
}
