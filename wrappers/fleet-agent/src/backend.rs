//! The native scheduler behind the agent. Slurm today (through its own
//! commands, as the unprivileged agent user); a Kubernetes backend will
//! implement the same trait.

use std::path::PathBuf;

use anyhow::Result;
use fleet_api::api::NodeCapacity;
use fleet_api::{JobRequest, JobState};

/// What the native scheduler says about one job the agent created.
#[derive(Clone, Debug, PartialEq)]
pub struct NativeStatus {
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub node_list: String,
    pub reason: String,
}

/// A stand-in job at this cluster (the origin side of a forwarded job).
#[derive(Clone, Debug, PartialEq)]
pub struct StandIn {
    pub native_id: u64,
    pub state: JobState,
    /// The scheduler's own state name, for messages.
    pub raw_state: String,
    pub comment: String,
}

/// Where a job's output is written at this cluster.
#[derive(Clone, Debug)]
pub struct OutputPaths {
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

#[allow(async_fn_in_trait)]
pub trait Backend: Send + Sync + 'static {
    /// Per-node capacity and the queue depth (pending, running).
    async fn capacity(&self) -> Result<(Vec<NodeCapacity>, u32, u32)>;
    /// Submit `req` as fleet job `id`; returns the native job id.
    async fn submit(&self, id: &str, req: &JobRequest) -> Result<u64>;
    /// Status of jobs this agent created; `None` = the scheduler no longer knows it.
    async fn status(&self, native_ids: &[u64]) -> Result<Vec<(u64, Option<NativeStatus>)>>;
    /// Every job the scheduler still knows in the proxy partition, in any
    /// state (the stand-ins of jobs forwarded from here). Read-only.
    async fn stand_ins(&self, partition: &str) -> Result<Vec<StandIn>>;
    /// Cancel a job this agent created (the caller checked the journal).
    async fn cancel(&self, id: &str, native_id: u64) -> Result<()>;
    fn output_paths(&self, id: &str) -> OutputPaths;
}
