//! Plugin ↔ agent protocol on the agent's Unix socket.
//!
//! The plugin (inside slurmctld, under its locks) writes one
//! [`PluginRequest`] as a JSON line and reads one [`PluginReply`] line,
//! all under a hard deadline (`SubmitTimeoutMs`). Anything else — no
//! agent, a slow agent, a reply that does not parse — is treated by the
//! plugin as "stay local" (fail open).

use serde::{Deserialize, Serialize};

use crate::JobRequest;

/// Protocol version; an agent answers `Local` to versions it does not know.
pub const WIRE_VERSION: u32 = 1;

/// Upper bound on one reply line; a longer line is a protocol error.
pub const MAX_REPLY_BYTES: usize = 1 << 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PluginRequest {
    /// A new batch or interactive submission.
    Submit { v: u32, job: Box<JobRequest> },
    /// Liveness probe (used by tests and `fleet-agent --check`).
    Ping { v: u32 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum PluginReply {
    /// Leave the job exactly as submitted.
    Local { reason: String },
    /// Rewrite the job into a stand-in for a job run elsewhere.
    Forward(Box<ForwardPlan>),
    /// Refuse the submission; `message` is shown by sbatch.
    Reject { message: String },
    Pong,
}

/// How the plugin rewrites a forwarded job into its stand-in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForwardPlan {
    pub fleet_job_id: String,
    /// Cluster the agent expects the job to run on (the meta-scheduler has
    /// the last word when the stand-in starts).
    pub target: String,
    /// Partition of the stand-in job at the origin.
    pub proxy_partition: String,
    /// The stand-in's batch script: a `fleet-proxy` call.
    pub proxy_script: String,
    /// Summary of the original request for `admin_comment`.
    pub admin_comment: String,
    /// Shown by `squeue -O comment`: where the job really runs.
    pub comment: String,
}
