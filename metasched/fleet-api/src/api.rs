//! The meta-scheduler's HTTP/JSON API (documented in README.md).
//!
//! | method | path | who | body → reply |
//! |---|---|---|---|
//! | POST | `/v1/heartbeat` | agent | [`Heartbeat`] → [`FleetView`] |
//! | POST | `/v1/jobs` | origin agent | [`ForwardRequest`] → [`JobRecord`] |
//! | GET | `/v1/agent/work?wait_ms=N` | agent | → [`AgentWork`] (long-poll up to N ≤ 30000 ms) |
//! | POST | `/v1/jobs/{id}/status` | target agent | [`StatusUpdate`] → [`JobRecord`] |
//! | POST | `/v1/jobs/{id}/output` | target agent | [`OutputChunk`] → `{}` |
//! | POST | `/v1/jobs/{id}/start` | proxy, origin agent | [`StartRequest`] → [`JobRecord`] (202 while held: a start *request*) |
//! | POST | `/v1/jobs/{id}/confirm_start` | origin agent only | [`StartConfirmation`] → [`JobRecord`] |
//! | GET | `/v1/jobs/{id}` | proxy, agents, admin | → [`JobRecord`] |
//! | GET | `/v1/jobs/{id}/output?stream=stdout&offset=N&max=M` | proxy, admin | → raw bytes |
//! | POST | `/v1/jobs/{id}/cancel` | proxy, origin agent, admin | → [`JobRecord`] |
//! | POST | `/v1/jobs/{id}/signal` | proxy, origin agent, admin | [`SignalRequest`] → 202 + [`JobRecord`] (queued as a [`SignalOrder`] in the target's [`AgentWork`]) |
//! | POST | `/v1/jobs/{id}/time_limit` | origin agent, admin | [`TimeLimitRequest`] → 202 + [`JobRecord`] (queued as a [`TimeLimitOrder`]) |
//! | GET | `/v1/jobs?state=&origin=&target=&user=&origin_job=&since=&active=&order=&limit=&offset=` | admin (agents: their own jobs) | → `Vec<JobRecord>` |
//! | GET | `/v1/clusters` | admin, agents | → [`FleetView`] |
//! | GET | `/health`, `/metrics` | anyone | text |
//!
//! Errors are `{"error": "..."}` with a 4xx/5xx status.

use serde::{Deserialize, Serialize};

use crate::{JobRequest, JobState};

/// Capacity of one node as its cluster reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeCapacity {
    pub name: String,
    pub partitions: Vec<String>,
    /// `None` for nodes without GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    pub gpus_total: u32,
    pub gpus_free: u32,
    /// Slurm node state, lower case (`idle`, `mixed`, `allocated`, `down`, `drained`, …).
    pub state: String,
    /// Interconnect domain (switch name from topology.conf), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<String>,
    /// CPUs Slurm schedules on the node; 0 = unknown (an older agent).
    #[serde(default)]
    pub cpus: u32,
    /// `RealMemory` in MiB; 0 = unknown. Reported whatever the select
    /// type: Slurm checks `--mem` against it when it picks nodes even where
    /// memory is not consumable (`CR_Core`), so it bounds placement there too.
    #[serde(default)]
    pub memory_mb: u64,
    /// Memory not allocated to jobs (`RealMemory - AllocMem`), in MiB: only
    /// where the scheduler allocates memory (`CR_*_Memory`, Kubernetes);
    /// `None` elsewhere (nothing is allocated) or unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_free_mb: Option<u64>,
    /// Node features (for `--constraint`); `None` = unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
}

/// What an agent reports about its cluster every heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub cluster: String,
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub provider: String,
    /// `slurm` or `kubernetes`.
    pub scheduler: String,
    pub nodes: Vec<NodeCapacity>,
    /// Jobs pending in the cluster's own queue.
    pub queue_pending: u32,
    pub queue_running: u32,
    pub agent_version: String,
    /// Whose jobs the cluster will run (its identity mapping); `None` from
    /// an older agent: unknown, not checked before placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identities: Option<Identities>,
    /// The agent's lease (`LeaseS` in fleet.conf): it stops the fleet jobs
    /// it runs when it cannot reach the meta-scheduler for this long, so
    /// the meta-scheduler never re-places them sooner. `None`: an older
    /// agent without a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_s: Option<f64>,
    /// Every run submitted here starts under its in-job lease (`fleet-ckpt
    /// lease-exec`: a Slurm backend with `CkptHelper` and `JobLeaseMs` >
    /// 0), and a run whose assignment says `start_gated` is never submitted
    /// without it: its script can be held until the origin confirms the
    /// start. `false` (or an older agent): never placed early.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_gate: bool,
    /// The cluster's scheduler did not answer its agent (slurmctld killed
    /// or restarting, the Kubernetes API unreachable): why. The agent is
    /// alive and the cluster's jobs run on (Slurm's outlive a restart of
    /// slurmctld), so the cluster is not silent: its fleet jobs are not
    /// moved and their in-job leases are renewed as usual. It gets no new
    /// work (`nodes` is empty) and counts as degraded until its scheduler
    /// answers again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_error: Option<String>,
    /// The runs of fleet jobs whose GPUs `nodes` shows taken: the runs
    /// the scheduler had started (or not yet let go of) when the agent
    /// read its capacity. The meta-scheduler takes from the free GPUs of
    /// this heartbeat the jobs it placed here that are not among them
    /// (still with the agent or in the queue), and only those: a job
    /// whose start the agent has not reported yet is already counted in
    /// `nodes` once its scheduler gave it its GPUs. `None` (an older
    /// agent, or a scheduler that did not answer): judged by when each
    /// job was reported running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding: Option<Vec<RunRef>>,
    /// GPU quotas that bound what a submitter may take here beside the free
    /// GPUs of `nodes` (a Kubernetes namespace's ResourceQuota on
    /// `requests.nvidia.com/gpu`), with whose jobs each binds. `None`: the
    /// cluster has none (a Slurm cluster, a namespace without one, an
    /// older agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_quotas: Option<Vec<GpuQuota>>,
    /// The longest time limit, in minutes, a job may have where forwarded
    /// jobs run here (a Slurm cluster's default partition's `MaxTime`): a
    /// job with a longer limit would pend there for good
    /// (`PartitionTimeLimit`), so it is not sent here. `None`: unlimited,
    /// or not known (an older agent, a Kubernetes cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_time_min: Option<u32>,
}

/// A GPU quota at a cluster and the submitters whose jobs it binds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuQuota {
    /// Where it applies (the Kubernetes namespace), for messages.
    pub scope: String,
    /// `origin:user` pairs whose jobs it binds, as in [`Identities::users`]
    /// (`*` for any origin or user). The first quota of a cluster that
    /// names a job's submitter binds it.
    pub users: Vec<String>,
    /// GPUs it allows in all, and those taken now.
    pub hard: u64,
    pub used: u64,
}

impl GpuQuota {
    /// Does this quota bind jobs of `user` from `origin`?
    pub fn binds(&self, origin: &str, user: &str) -> bool {
        pair_matches(&self.users, origin, user)
    }

    /// GPUs a job it binds may still take.
    pub fn headroom(&self) -> u64 {
        self.hard.saturating_sub(self.used)
    }
}

/// Does one of `pairs` (`origin:user`, `*` for any) name `user` from `origin`?
fn pair_matches(pairs: &[String], origin: &str, user: &str) -> bool {
    pairs.iter().any(|u| match u.split_once(':') {
        Some((o, n)) => (o == "*" || o == origin) && (n == "*" || n == user),
        None => false,
    })
}

/// One run of a fleet job: the job and the placement epoch it runs in.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunRef {
    pub job: String,
    pub epoch: u64,
}

/// The submitters a cluster has a local identity for: what lets an origin
/// refuse, at sbatch, a job whose user could run nowhere it may go.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Identities {
    /// The cluster's mapping, as its admin wrote it (`JobUserMap=same`,
    /// `JobUserMap=/etc/slurm/fleet-users.map`, `RunAsUser=fleetjob`): named
    /// in refusals.
    pub mapping: String,
    /// `origin:user` pairs it admits; `*` as the origin for any origin,
    /// `*:*` for anyone (a shared `RunAsUser`).
    pub users: Vec<String>,
}

impl Identities {
    /// Does the cluster have an identity for `user` from `origin`?
    pub fn admits(&self, origin: &str, user: &str) -> bool {
        pair_matches(&self.users, origin, user)
    }
}

/// GPUs of one type in one cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuPool {
    pub gpu_type: String,
    pub total: u32,
    pub free: u32,
    /// Most GPUs of this type on a single node.
    pub max_per_node: u32,
    /// Nodes that carry this type (and are usable: not down/drained).
    pub nodes: u32,
    /// USD per GPU-hour of this type at this cluster, when known
    /// (`--fleet-max-price` excludes pools above it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_gpu_hour: Option<f64>,
}

/// Identical usable nodes of one cluster, `count` of them: what the
/// placement rule checks a request against node by node, as slurmctld
/// would. Built from heartbeats by [`crate::placement::node_shapes`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeShape {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    pub gpus: u32,
    /// 0 = unknown.
    #[serde(default)]
    pub cpus: u32,
    /// MiB; 0 = unknown.
    #[serde(default)]
    pub memory_mb: u64,
    /// `None` = unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    pub count: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterSummary {
    pub name: String,
    pub region: String,
    pub provider: String,
    pub scheduler: String,
    /// Heartbeat seen recently.
    pub healthy: bool,
    /// Seconds since the last heartbeat.
    pub heartbeat_age_s: f64,
    pub gpus: Vec<GpuPool>,
    pub queue_pending: u32,
    pub queue_running: u32,
    /// Usable nodes by shape (GPUs, CPUs, memory, features). Empty from an
    /// older meta-scheduler: the rule then works from `gpus` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeShape>,
    /// Why the cluster is unhealthy when it is for another reason than a
    /// missed heartbeat (quarantine: a heartbeat beyond its declared
    /// inventory).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unhealthy_reason: String,
    /// From the cluster's heartbeat: whose jobs it will run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identities: Option<Identities>,
    /// `healthy`, `degraded` (missed heartbeats: no new work; its jobs
    /// move once its grace period ends), `quarantined`, or empty from an
    /// older meta-scheduler.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health: String,
    /// Every node of the cluster by shape, usable or not, when some are
    /// not (drained, down): installed capacity a job may wait for, never
    /// taken for capacity that does not exist. Empty when every node is
    /// usable (then `nodes` is all of it) or from an older meta-scheduler.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub installed: Vec<NodeShape>,
    /// The provisioning SLA (assignment to running) as measured here;
    /// absent from an older meta-scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla: Option<ClusterSla>,
    /// From the cluster's heartbeat: the GPU quotas that bound what a
    /// submitter may take there (`Heartbeat::gpu_quotas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_quotas: Option<Vec<GpuQuota>>,
    /// From the cluster's heartbeat: the longest time limit a forwarded job
    /// may have there, minutes (`Heartbeat::max_time_min`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_time_min: Option<u32>,
}

/// A cluster's provisioning times (assignment → running) over its last
/// runs, and its SLA state (docs/failover.md, "Provisioning SLA").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterSla {
    /// `ok`, `degraded` (missed its deadline recently: scored down, its
    /// late pending jobs re-placed), `off` (measured, not enforced).
    pub state: String,
    /// This cluster's deadline in seconds.
    pub deadline_s: f64,
    /// Samples in the window: runs that started, and misses.
    #[serde(default)]
    pub samples: u32,
    /// Of those, how many missed the deadline.
    #[serde(default)]
    pub missed: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90_s: Option<f64>,
    /// The same over the last runs of every cluster of its provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_p50_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_p90_s: Option<f64>,
    #[serde(default)]
    pub provider_samples: u32,
    /// While degraded, the engine adds this fraction of the cluster's
    /// score (plus its expected provisioning delay at the policy's time
    /// value) to it.
    #[serde(default)]
    pub penalty_frac: f64,
    /// Why it is in that state (`missed 3 of last 5, p90 412 s > 300 s`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

impl ClusterSla {
    /// SLA-degraded: scored down by the engine, avoided by the first rule
    /// while another cluster can take the job.
    pub fn degraded(&self) -> bool {
        self.state == "degraded"
    }
}

/// The fleet as the meta-scheduler sees it; agents cache it to answer the
/// plugin without a round trip.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetView {
    /// Unix seconds when the view was made.
    pub generated_at: f64,
    pub clusters: Vec<ClusterSummary>,
}

/// Origin agent → meta-scheduler: a job accepted for forwarding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForwardRequest {
    pub fleet_job_id: String,
    pub request: JobRequest,
    /// The agent's own pick from its cached view.
    pub tentative_target: String,
    /// Forwarded at sbatch time (the plugin's round trip), so its stand-in
    /// is still to be scheduled at the origin: the meta-scheduler may place
    /// it at once and the target submit it while the stand-in waits for
    /// its turn, the run's script gated by its in-job lease until the
    /// origin confirms the stand-in runs (early placement, docs/failover.md
    /// "Start latency"). `false` (a deferred stand-in, already running, or
    /// an older agent): placed when the stand-in starts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub early_start: bool,
}

/// The stand-in started at the origin: the job may now run remotely.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StartRequest {
    /// Slurm job id of the stand-in at the origin.
    pub origin_job_id: u64,
    /// The stand-in's restart count (`SLURM_RESTART_COUNT`, 0 on its first
    /// run). A count above the job's `origin_restart` asks for a rerun:
    /// Slurm requeued the stand-in, so the job runs again from the start.
    #[serde(default)]
    pub restart: u32,
}

/// Origin agent → meta-scheduler (`POST /v1/jobs/{id}/confirm_start`):
/// whether the stand-in `origin_job_id` really runs in Slurm at the origin
/// (and is the one the agent journaled). Only `started = true` with the
/// requested `origin_job_id` releases a held job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StartConfirmation {
    pub origin_job_id: u64,
    pub started: bool,
    /// Why not (with `started = false`), for the log.
    #[serde(default)]
    pub reason: String,
    /// The stand-in's time limit in minutes as Slurm holds it now (`None`:
    /// unlimited or unknown). It may have been changed with `scontrol
    /// update TimeLimit=` while the stand-in was pending: the job takes it
    /// before it is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_min: Option<u32>,
}

/// A held job whose stand-in asked to start; the origin agent checks it
/// in Slurm and answers with a [`StartConfirmation`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartCheck {
    pub fleet_job_id: String,
    /// The stand-in's Slurm job id as the start request gave it.
    pub origin_job_id: u64,
    /// The stand-in's restart count the request names: Slurm must show
    /// the stand-in RUNNING with this many restarts.
    #[serde(default)]
    pub restart: u32,
}

/// Everything the meta-scheduler knows about one forwarded job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub fleet_job_id: String,
    pub origin: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_job_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_job_id: Option<u64>,
    pub state: JobState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal that ended the job, if any (Slurm's `ExitCode=x:SIG`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default)]
    pub cancel_requested: bool,
    /// Why it is where it is (placement explanation, failure reason).
    #[serde(default)]
    pub reason: String,
    /// Bytes of stdout/stderr the meta-scheduler holds.
    #[serde(default)]
    pub stdout_len: u64,
    #[serde(default)]
    pub stderr_len: u64,
    /// Set with a terminal state: all output has been delivered.
    #[serde(default)]
    pub output_complete: bool,
    #[serde(default)]
    pub node_list: String,
    /// Unix seconds.
    pub submitted_at: f64,
    pub updated_at: f64,
    /// The request summary (GPU type × count, time limit).
    #[serde(default)]
    pub summary: String,
    /// When the stand-in asked to start (Unix seconds); the job stays
    /// `held` until the origin agent confirms the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_requested_at: Option<f64>,
    /// Times the target reported the job back to pending after it ran
    /// (Slurm requeued it).
    #[serde(default)]
    pub requeues: u32,
    /// Who submitted it: the Slurm user name at the origin
    /// (`JobRequest::user_name`), when the origin said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The stand-in's restart count this run belongs to (0: its first
    /// run). Each requeue of the stand-in at the origin reruns the job.
    #[serde(default)]
    pub origin_restart: u32,
    /// Where this run's output begins in the job's streams: earlier runs'
    /// output comes first (the streams only grow), and the stand-in of a
    /// rerun relays from here, so Slurm's `--open-mode` at the origin
    /// decides whether its file keeps the earlier runs, as natively.
    #[serde(default)]
    pub stdout_base: u64,
    #[serde(default)]
    pub stderr_base: u64,
    /// The current placement's epoch: 1 for the first placement, one more
    /// for each re-placement (migration, rerun). 0: never placed. Only the
    /// cluster holding this epoch may report on the job.
    #[serde(default)]
    pub epoch: u64,
    /// Times the job was moved off a failed cluster (or one its run died on).
    #[serde(default)]
    pub migrations: u32,
    /// One line per requeue counted in `requeues`, oldest first (the last
    /// [`MAX_REQUEUE_NOTES`]): when, where, and how it was seen
    /// (`Slurm at alpha re-ran it …`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requeue_notes: Vec<String>,
    /// The run's time limit at its target now, in minutes, as its agent
    /// last reported it (`StatusUpdate::time_limit_min`): the job's
    /// `--time`, the target's default limit without one, or the limit an
    /// update there set since. `None`: unlimited, not reported yet, or an
    /// older agent. The stand-in's `fleet-proxy` sends the job's
    /// TIME_LIMIT_50/80/90 mails at those shares of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_min: Option<u32>,
}

/// Most [`JobRecord::requeue_notes`] kept (the newest).
pub const MAX_REQUEUE_NOTES: usize = 16;

/// One job the target agent must submit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub fleet_job_id: String,
    pub request: JobRequest,
    /// A rerun (the stand-in's restart count, 0 for a first run): a target
    /// that ran the job before submits it again.
    #[serde(default)]
    pub origin_restart: u32,
    /// Offsets at which this run's output continues the job's streams.
    #[serde(default)]
    pub stdout_base: u64,
    #[serde(default)]
    pub stderr_base: u64,
    /// The placement's epoch (see [`JobRecord::epoch`]); the agent sends it
    /// with every status and output post of this run. 0 from an older
    /// meta-scheduler.
    #[serde(default)]
    pub epoch: u64,
    /// The checkpoint this run resumes from: the catalog's newest valid
    /// one (`Store::resume_point`), wherever it lies. `None`: the job has
    /// none (it starts from scratch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<String>,
    /// Set when `resume_from` lies only in another region's store: the
    /// job's prefix in this target's region. The target agent copies the
    /// checkpoint there before it submits (`fleet-ckpt copy`), reports the
    /// copy, and the job's `FLEET_RESUME_FROM` names the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_copy_to: Option<String>,
    /// Bytes of `resume_from` (what a copy moves).
    #[serde(default)]
    pub resume_bytes: u64,
}

/// A target agent's to-do list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentWork {
    pub submit: Vec<Assignment>,
    /// Fleet job ids to cancel at this cluster.
    pub cancel: Vec<String>,
    /// Held jobs originating at this cluster whose stand-in asked to start:
    /// confirm each with `POST /v1/jobs/{id}/confirm_start`.
    #[serde(default)]
    pub confirm_start: Vec<StartCheck>,
    /// Signals to deliver to jobs running (or pending) at this cluster,
    /// oldest first. Each order is handed out once: an agent that gets it
    /// owns its delivery (`scancel --signal=<signal>` plus the scope's flag).
    #[serde(default)]
    pub signal: Vec<SignalOrder>,
    /// New time limits for jobs running (or pending) at this cluster, set
    /// at home with `scontrol update TimeLimit=` on a running stand-in
    /// (`scontrol update` as the job's user there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub time_limit: Vec<TimeLimitOrder>,
}

impl AgentWork {
    pub fn is_empty(&self) -> bool {
        self.submit.is_empty()
            && self.cancel.is_empty()
            && self.confirm_start.is_empty()
            && self.signal.is_empty()
            && self.time_limit.is_empty()
    }
}

/// Origin agent or admin → meta-scheduler (`POST /v1/jobs/{id}/time_limit`):
/// the job's stand-in now has this limit; the job where it runs gets it
/// too, as far as Slurm lets its owner there (lowering).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeLimitRequest {
    /// Minutes, 1 to [`MAX_TIME_LIMIT_MIN`].
    pub minutes: u32,
    /// A raise only an operator could make at home: a running stand-in's
    /// finite limit raised (Slurm refuses that to its owner). Only then
    /// may the target agent set it with its own operator rights where
    /// Slurm refuses the job's user; otherwise the target's Slurm judges
    /// it as the user's own update. A stand-in has no limit of its own, so
    /// its first change, whoever made it, is not a raise: the owner may
    /// make it at home.
    #[serde(default)]
    pub raise: bool,
}

/// The largest time limit carried (a year; Slurm's own ceiling is higher,
/// but anything beyond is a typo).
pub const MAX_TIME_LIMIT_MIN: u32 = 366 * 24 * 60;

/// One time limit for the target agent to set on a job of its cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeLimitOrder {
    pub fleet_job_id: String,
    pub minutes: u32,
    /// [`TimeLimitRequest::raise`]: the agent may set it as itself.
    #[serde(default)]
    pub raise: bool,
}

/// Which processes of the remote job a signal reaches, as `scancel` at the
/// target names them (Slurm 22.05 `scancel(1)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalScope {
    /// `scancel --batch`: the batch shell alone (not its children, not steps).
    Batch,
    /// `scancel --full`: the batch shell, its children and every step.
    Full,
    /// `scancel` without either flag: the job's steps only (`srun`), not
    /// the batch shell.
    Steps,
}

impl SignalScope {
    pub fn as_str(self) -> &'static str {
        match self {
            SignalScope::Batch => "batch",
            SignalScope::Full => "full",
            SignalScope::Steps => "steps",
        }
    }

    /// The `scancel` flag that selects this scope (none for `Steps`).
    pub fn scancel_flag(self) -> Option<&'static str> {
        match self {
            SignalScope::Batch => Some("--batch"),
            SignalScope::Full => Some("--full"),
            SignalScope::Steps => None,
        }
    }
}

impl std::str::FromStr for SignalScope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "batch" => Ok(SignalScope::Batch),
            "full" => Ok(SignalScope::Full),
            "steps" => Ok(SignalScope::Steps),
            _ => Err(format!("unknown signal scope {s:?} (expected batch, full or steps)")),
        }
    }
}

/// Signals that may be sent to a forwarded job, by name without `SIG`
/// (what `scancel --signal=` takes). Anything else is refused.
pub const SIGNAL_NAMES: &[&str] = &[
    "HUP", "INT", "QUIT", "ABRT", "KILL", "USR1", "USR2", "ALRM", "TERM", "CONT", "STOP", "TSTP", "TTIN", "TTOU",
    "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "PWR",
];

/// `name` if it is one of [`SIGNAL_NAMES`] (exactly: upper case, no `SIG`
/// prefix); otherwise an error naming it and what is accepted.
pub fn check_signal_name(name: &str) -> Result<&'static str, String> {
    if let Some(n) = SIGNAL_NAMES.iter().find(|n| **n == name) {
        return Ok(n);
    }
    let shown: String = name.chars().take(32).flat_map(char::escape_default).collect();
    let hint = match name.strip_prefix("SIG").filter(|r| SIGNAL_NAMES.contains(r)) {
        Some(r) => format!(" (write {r}, without SIG)"),
        None if SIGNAL_NAMES.contains(&name.to_ascii_uppercase().as_str()) => {
            format!(" (write {}, in upper case)", name.to_ascii_uppercase())
        }
        None => String::new(),
    };
    Err(format!("unknown signal \"{shown}\"{hint}; expected one of {}", SIGNAL_NAMES.join(", ")))
}

/// Stand-in, origin agent or admin → meta-scheduler
/// (`POST /v1/jobs/{id}/signal`): deliver `signal` to the job where it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    /// A name of [`SIGNAL_NAMES`], e.g. `USR1`.
    pub signal: String,
    pub scope: SignalScope,
}

/// One signal for the target agent to deliver to a job of its cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalOrder {
    pub fleet_job_id: String,
    /// A name of [`SIGNAL_NAMES`] (checked by the meta-scheduler).
    pub signal: String,
    pub scope: SignalScope,
}

/// Target agent → meta-scheduler: what its scheduler says about the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusUpdate {
    pub remote_job_id: Option<u64>,
    pub state: Option<JobState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub node_list: String,
    /// With a terminal state: final sizes of stdout/stderr, so the proxy
    /// knows when it has everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_stdout_len: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_stderr_len: Option<u64>,
    /// The placement epoch the report is about (the assignment's); `None`
    /// from an older agent: accepted from the current target only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The run died with (part of) its cluster and did not end by itself
    /// (NODE_FAIL, PREEMPTED, held by Slurm after a failed launch, stopped
    /// by the agent's own lease): why. The meta-scheduler re-places the job
    /// (or fails it when it can neither resume nor restart) instead of
    /// ending it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub died: Option<String>,
    /// The run was submitted under its in-job lease (`fleet-ckpt
    /// lease-exec`): the first thing its script does is ask for a lease, so
    /// a run that reports running for long without ever asking never
    /// started (`[health] first_lease_s`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub job_lease: bool,
    /// `died` says the run's in-job lease stopped it (its watchdog's note,
    /// which the job itself could have written): the meta-scheduler
    /// believes it only when no lease it granted still covered the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lease_stopped: bool,
    /// With `died`: nothing of the run ever started (Slurm held it after a
    /// failed launch before its script began: no start note of its
    /// `lease-exec`, no output), so placing it again runs nothing twice,
    /// whatever the job's restart policy. The meta-scheduler believes it
    /// only when the run never asked for its job lease in this epoch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub never_started: bool,
    /// With `died`: Slurm at the target requeued the run after its script
    /// had started (it held the job after a launch it took for failed,
    /// typically across a restart of its slurmctld), and the script did
    /// not end by itself: no end noted, or an end by a signal its user
    /// did not send (Slurm's kill of the job it requeued). Native Slurm
    /// runs such a job again: the meta-scheduler places it again whatever
    /// its restart policy and counts the re-run in `requeues`. A run whose
    /// script claimed an end by an exit code in this epoch ends as claimed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slurm_requeued: bool,
    /// With `died`: the run died with its node (`NODE_FAIL`, `PREEMPTED`,
    /// `BOOT_FAIL`; at a Kubernetes target a pod's `DisruptionTarget`:
    /// evicted by `kubectl drain`, preempted), and its agent delivered no
    /// signal to it on its user's request in this epoch. A drain or a
    /// preemption stops the script with SIGTERM before the report, so the
    /// end its `lease-exec` claimed by a signal was the cluster's kill,
    /// not the script's own end: the meta-scheduler handles the run as
    /// died (moved when it has a checkpoint or is interruptible, else
    /// failed with the report's reason). An end claimed by an exit code
    /// still stands.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disrupted: bool,
    /// Times Slurm at the target ran this run again, as its agent saw it:
    /// a higher `RestartCnt` (`scontrol requeue`, a requeue after a node
    /// failure), and re-runs Slurm does not count (the run back to pending
    /// after it ran, a later start time, its output files restarted), as
    /// after a slurmctld crash recovered from older state. Cumulative for
    /// the run's placement (epoch) and journaled, so a repeated report or
    /// an agent restart counts nothing twice; the meta-scheduler adds what
    /// it has not counted yet to the job's `requeues`. `None`: an older
    /// agent (then only running → pending counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reruns: Option<u32>,
    /// How the agent saw the last of `reruns` (for `fleetctl job`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rerun_why: String,
    /// The run's time limit at the target, in minutes, as its scheduler
    /// says now (Slurm's `TimeLimit`, a Kubernetes Job's
    /// `activeDeadlineSeconds`); `None`: unlimited, or an older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_min: Option<u32>,
    /// With `Pending`: its scheduler keeps the run pending for a reason
    /// that does not clear by itself, a per-job limit of the partition,
    /// QOS or association it runs under there (Slurm's
    /// `PartitionTimeLimit`, `QOSMax…PerJob…`, `AssocMax…PerNode`,
    /// `QOSMin…`, `InvalidAccount`, `InvalidQOS`): why, in words. A native
    /// job waits for an admin to change the limit; the meta-scheduler
    /// places it where it can run (`[health] stranded_s`). `None`: a wait
    /// that clears, or an older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by_limit: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Target agent → meta-scheduler: output bytes at `offset` of `stream`.
/// Chunks are idempotent: a chunk that overlaps what is held is trimmed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub stream: Stream,
    pub offset: u64,
    #[serde(with = "crate::b64")]
    pub data: Vec<u8>,
    /// The placement epoch of the run that wrote it; `None` from an older
    /// agent (accepted from the current target only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

/// `POST /v1/agent/fence`: the runs an agent holds, by placement epoch,
/// asked about before it reports anything after a start or a partition.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FenceRequest {
    pub runs: Vec<RunEpoch>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunEpoch {
    pub fleet_job_id: String,
    /// 0: unknown (journaled by an older agent).
    #[serde(default)]
    pub epoch: u64,
}

/// The reply: the runs that are stale (the job was placed again elsewhere
/// or in a newer epoch, or is unknown): the agent cancels each and never
/// reports on it again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FenceReply {
    pub stale: Vec<StaleRun>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StaleRun {
    pub fleet_job_id: String,
    pub epoch: u64,
    pub reason: String,
}

/// `POST /v1/jobs/{id}/lease`: the in-job watchdog of a run at a target
/// renews the run's job lease (docs/failover.md, "The in-job lease"),
/// with the run's checkpoint token (`FleetCkpt`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobLeaseRequest {
    /// The run's placement epoch (`FLEET_EPOCH`).
    pub epoch: u64,
    /// The lease the site asks for (`JobLeaseMs`); the meta-scheduler
    /// grants at most this and at most its own `[health] job_lease_s`.
    #[serde(default)]
    pub lease_ms: u64,
}

/// The answer. `stale`: this run no longer counts (another epoch, another
/// cluster, the job ended): stop it now. Otherwise the run may go on for
/// `valid_ms` from when the request was sent (0: not renewed this time,
/// the previous grant stands). `off`: the meta-scheduler grants no job
/// leases (`job_lease_s = 0`): the watchdog leaves the run alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobLeaseReply {
    #[serde(default)]
    pub valid_ms: u64,
    #[serde(default)]
    pub stale: bool,
    #[serde(default)]
    pub off: bool,
    #[serde(default)]
    pub reason: String,
    /// Not yet: the job was placed early and its origin has not confirmed
    /// that its stand-in runs. The run's script must not start; ask again
    /// shortly (the meta-scheduler bounds the wait: it then says `stale`).
    /// Never set with a grant.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait: bool,
}

/// `POST /v1/jobs/{id}/end`: a run's in-job lease client (`fleet-ckpt
/// lease-exec`) says the job's script ended, with its exit status. Only
/// a claim: the target agent's report stays authoritative for the final
/// state and output; the meta-scheduler keeps such a run from being moved
/// while its cluster is silent (docs/failover.md, "A run that ended").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunEndClaim {
    /// The run's placement epoch (`FLEET_EPOCH`).
    pub epoch: u64,
    /// The script's exit code (0..=255), when it exited.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Whose end it was, as `lease-exec` knows it: `script` (the script
    /// exited, or a signal it did not get from the run's lease watchdog
    /// ended it) or `lease` (the watchdog stopped the run). Absent (a
    /// client before this field): unknown, and an end claimed from a
    /// second before the run's lease ran out is then not taken as the
    /// script's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<EndCause>,
    /// A signal Slurm sent to every process of the batch step before the
    /// script ended (`lease-exec` knows it from its sentinel): SIGTERM,
    /// the first signal of Slurm's kill of a job (a requeue, a node
    /// failure, an orphan killed as its node registers). A script that
    /// catches it and exits, or whose child it killed, ended by that
    /// kill, not on its own; whether a user had it sent decides the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_signal: Option<i32>,
}

/// Who ended a run, in its end claim ([`RunEndClaim::cause`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndCause {
    /// The script's own end: its exit, or a signal not sent by the run's
    /// lease watchdog (a user's, Slurm's).
    Script,
    /// The run's lease watchdog stopped it (stale, or its lease ran out).
    Lease,
}

/// The answer: `recorded` when the claim was taken for the job's current
/// run; otherwise `reason` says why not (the job ended already, another
/// epoch counts).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunEndReply {
    #[serde(default)]
    pub recorded: bool,
    #[serde(default)]
    pub reason: String,
}

/// `{"error": "..."}`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

/// `POST /v1/jobs/{id}/checkpoints`: a checkpoint of the job is complete
/// (its manifest, `fleet-ckpt.json`, was written last: see
/// docs/checkpoints.md), or, with `valid: false`, one found torn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointReport {
    /// The manifest's `seq`.
    pub seq: u64,
    /// The checkpoint's URL (`<FLEET_CKPT_URL>/ckpt-<seq>`).
    pub url: String,
    /// Bytes of its files.
    pub bytes: u64,
    /// SHA-256 (hex) of the manifest's bytes: copies in other regions
    /// carry the same manifest, so the same digest.
    pub manifest_sha256: String,
    /// The framework's step, when the manifest has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(default = "yes")]
    pub valid: bool,
    /// A copy made for a resume: the checkpoint it was copied from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_from: Option<String>,
    /// A copy: how long it took (seconds), for egress and transfer-time accounting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_seconds: Option<f64>,
}

fn yes() -> bool {
    true
}

/// A checkpoint as the catalog holds it (`GET /v1/jobs/{id}/checkpoints`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub fleet_job_id: String,
    pub seq: u64,
    pub url: String,
    /// The region whose store holds it (the site default whose URL is a
    /// prefix of `url`, else the reporting cluster's region).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub bytes: u64,
    pub manifest_sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// When it was reported (Unix seconds).
    pub reported_at: f64,
    /// Who reported it: `job` or the cluster's name.
    pub reported_by: String,
    pub valid: bool,
    /// A copy made for a resume: the checkpoint it was copied from (its
    /// `bytes` crossed regions, in `copy_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_seconds: Option<f64>,
}

/// What resuming a job in `target_region` needs (the failover's plan).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestorePlan {
    /// The checkpoint to resume from, in the region it is read from.
    pub checkpoint: Checkpoint,
    /// It is in another region only: copy it first (`fleet-ckpt copy`).
    pub copy_needed: bool,
    /// Bytes to copy (0 when no copy is needed).
    pub copy_bytes: u64,
    /// Where the copy goes: the job's prefix in the target region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_to: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, expected: Result<&str, &str>) {
        match (check_signal_name(name), expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{name:?}"),
            (Err(got), Err(want)) => {
                assert!(got.contains(want), "{name:?}: {got:?} lacks {want:?}")
            }
            (got, want) => panic!("{name:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn signal_names() {
        check("USR1", Ok("USR1"));
        check("PWR", Ok("PWR"));
        check("SIGUSR1", Err("write USR1, without SIG"));
        check("usr1", Err("write USR1, in upper case"));
        check("Usr1", Err("write USR1, in upper case"));
        check("SIGSEGV", Err("unknown signal \"SIGSEGV\"; expected one of HUP"));
        check("10", Err("unknown signal \"10\""));
        check("", Err("unknown signal \"\""));
        check(" USR1", Err("unknown signal \" USR1\""));
        check("USR1\n", Err("unknown signal \"USR1\\n\""));
        // A hostile name is cut and escaped in the message.
        let long = format!("{}\u{1b}[31m", "X".repeat(1000));
        let e = check_signal_name(&long).unwrap_err();
        assert!(e.len() < 400 && !e.contains('\u{1b}'), "{e}");
        for n in SIGNAL_NAMES {
            check(n, Ok(n));
        }
    }

    #[test]
    fn signal_wire_forms() {
        let o = SignalOrder { fleet_job_id: "j".into(), signal: "USR1".into(), scope: SignalScope::Full };
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v, serde_json::json!({"fleet_job_id": "j", "signal": "USR1", "scope": "full"}));
        for (scope, text, flag) in [
            (SignalScope::Batch, "batch", Some("--batch")),
            (SignalScope::Full, "full", Some("--full")),
            (SignalScope::Steps, "steps", None),
        ] {
            assert_eq!(serde_json::to_value(scope).unwrap(), serde_json::json!(text));
            assert_eq!(text.parse::<SignalScope>(), Ok(scope));
            assert_eq!((scope.as_str(), scope.scancel_flag()), (text, flag));
        }
        assert!("Full".parse::<SignalScope>().unwrap_err().contains("expected batch, full or steps"));
        // An older meta-scheduler's work has no `signal`: none to deliver.
        let w: AgentWork = serde_json::from_str(r#"{"submit": [], "cancel": []}"#).unwrap();
        assert!(w.signal.is_empty() && w.is_empty());
        let w = AgentWork { signal: vec![o], ..Default::default() };
        assert!(!w.is_empty());
    }

    #[test]
    fn an_end_claim_says_whose_end_it_was_and_older_ones_do_not() {
        // An older lease-exec's claim has no `cause`: unknown.
        let c: RunEndClaim = serde_json::from_str(r#"{"epoch": 2, "exit_code": 0}"#).unwrap();
        assert_eq!(c, RunEndClaim { epoch: 2, exit_code: Some(0), ..Default::default() });
        // Unknown is sent as an older client sent it: without the field.
        assert_eq!(serde_json::to_value(&c).unwrap(), serde_json::json!({"epoch": 2, "exit_code": 0, "signal": null}));
        for (cause, text) in [(EndCause::Script, "script"), (EndCause::Lease, "lease")] {
            let c = RunEndClaim { epoch: 1, signal: Some(15), cause: Some(cause), ..Default::default() };
            let v = serde_json::to_value(&c).unwrap();
            assert_eq!(v["cause"], text);
            assert_eq!(serde_json::from_value::<RunEndClaim>(v).unwrap(), c);
        }
        assert!(serde_json::from_str::<RunEndClaim>(r#"{"epoch": 1, "cause": "user"}"#).is_err());
        // An exit after Slurm's kill of the step says so; none: no field.
        let c = RunEndClaim { epoch: 1, exit_code: Some(5), after_signal: Some(15), ..Default::default() };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["after_signal"], 15);
        assert_eq!(serde_json::from_value::<RunEndClaim>(v).unwrap(), c);
        assert!(serde_json::from_str::<RunEndClaim>(r#"{"epoch": 1}"#).unwrap().after_signal.is_none());
    }
}
