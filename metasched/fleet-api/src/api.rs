//! The meta-scheduler's HTTP/JSON API (documented in README.md).
//!
//! | method | path | who | body → reply |
//! |---|---|---|---|
//! | POST | `/v1/heartbeat` | agent | [`Heartbeat`] → [`FleetView`] |
//! | POST | `/v1/jobs` | origin agent | [`ForwardRequest`] → [`JobRecord`] |
//! | GET | `/v1/agent/work` | target agent | → [`AgentWork`] |
//! | POST | `/v1/jobs/{id}/status` | target agent | [`StatusUpdate`] → [`JobRecord`] |
//! | POST | `/v1/jobs/{id}/output` | target agent | [`OutputChunk`] → `{}` |
//! | POST | `/v1/jobs/{id}/start` | proxy, origin agent | [`StartRequest`] → [`JobRecord`] |
//! | GET | `/v1/jobs/{id}` | proxy, agents, admin | → [`JobRecord`] |
//! | GET | `/v1/jobs/{id}/output?stream=stdout&offset=N&max=M` | proxy, admin | → raw bytes |
//! | POST | `/v1/jobs/{id}/cancel` | proxy, origin agent, admin | → [`JobRecord`] |
//! | GET | `/v1/jobs` | admin | → `Vec<JobRecord>` |
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
}

/// The stand-in started at the origin: the job may now run remotely.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StartRequest {
    /// Slurm job id of the stand-in at the origin.
    pub origin_job_id: u64,
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
}

/// One job the target agent must submit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub fleet_job_id: String,
    pub request: JobRequest,
}

/// A target agent's to-do list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentWork {
    pub submit: Vec<Assignment>,
    /// Fleet job ids to cancel at this cluster.
    pub cancel: Vec<String>,
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
}

/// `{"error": "..."}`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}
