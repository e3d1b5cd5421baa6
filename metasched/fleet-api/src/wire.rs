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
    Local {
        reason: String,
    },
    /// Rewrite the job into a stand-in for a job run elsewhere.
    Forward(Box<ForwardPlan>),
    /// Refuse the submission; `message` is shown by sbatch.
    Reject {
        message: String,
    },
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
    /// Summary of the original request for `admin_comment`; the plugin
    /// stores `fleet:<fleet_job_id> <admin_comment>` (see [`admin_tag`]).
    pub admin_comment: String,
    /// Shown by `squeue -O comment` (where the job really runs), stored
    /// only when the user left the comment empty: theirs is never replaced.
    pub comment: String,
    /// Mails the stand-in's proxy sends (`--mail-type` in `proxy_script`),
    /// as `MAIL_JOB_*` bits ([`crate::sbatch::proxy_mail_bits`]): the
    /// plugin takes them out of the stand-in's mail type, so that Slurm
    /// does not send them for the stand-in.
    #[serde(default)]
    pub proxy_mail: u16,
}

/// The stand-in's Fleet tag, the first word of its `admin_comment`
/// (which only Slurm operators and admins can change):
/// `fleet:<fleet_job_id>`, then a space and a free-form summary.
pub fn admin_tag(fleet_job_id: &str, summary: &str) -> String {
    if summary.is_empty() {
        format!("fleet:{fleet_job_id}")
    } else {
        format!("fleet:{fleet_job_id} {summary}")
    }
}

/// The fleet job id in an `admin_comment` written by [`admin_tag`].
pub fn parse_admin_tag(admin_comment: &str) -> Option<&str> {
    let first = admin_comment.split_whitespace().next()?;
    first.strip_prefix("fleet:").filter(|id| !id.is_empty())
}

/// File name of the agent's second socket, in `AgentSpoolDir`: where a
/// deferred stand-in's `fleet-proxy` (running as the job's user) asks the
/// agent to forward the job now ([`crate::deferred`]).
pub const DEFERRED_SOCKET: &str = "deferred.sock";

/// File name of the list of a cluster's stand-ins (their Slurm job ids,
/// one per line) its agent publishes in `AgentSpoolDir`, and which the
/// plugin's `job_modify` reads (through its view watcher) to refuse a
/// change of a stand-in's resources.
pub const STAND_INS_FILE: &str = "stand-ins";

/// Upper bound on one request line on the deferred socket.
pub const MAX_DEFERRED_REQUEST_BYTES: usize = 64 << 10;

/// A deferred stand-in started: forward its job. The agent takes the job's
/// script and request from Slurm, not from here; the caller's uid
/// (SO_PEERCRED) must own the stand-in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeferredRequest {
    pub v: u32,
    /// `SLURM_JOB_ID` of the stand-in (an array element's own id).
    pub slurm_job_id: u64,
    /// The proxy's `SLURM_ARRAY_*` variables (only those names, decimal
    /// values, are used: [`crate::deferred::array_vars`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum DeferredReply {
    /// Journaled (or already was): relay `fleet_job_id` with `token`.
    Forwarded { fleet_job_id: String, token: String },
    /// Never: not this caller's stand-in, not a deferred stand-in, ...
    Refused { message: String },
    /// Not now (Slurm did not answer, no fleet view yet): ask again.
    Retry { message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_tags_round_trip() {
        let t = admin_tag("beta-00ab12cd34ef", "forwarded beta -> alpha: gpu:h100:8 on 1 node(s)");
        assert_eq!(t, "fleet:beta-00ab12cd34ef forwarded beta -> alpha: gpu:h100:8 on 1 node(s)");
        assert_eq!(parse_admin_tag(&t), Some("beta-00ab12cd34ef"));
        assert_eq!(parse_admin_tag(&admin_tag("x-1", "")), Some("x-1"));
        assert_eq!(parse_admin_tag("fleet: forwarded (old format)"), None);
        assert_eq!(parse_admin_tag("site note"), None);
        assert_eq!(parse_admin_tag(""), None);
    }
}
