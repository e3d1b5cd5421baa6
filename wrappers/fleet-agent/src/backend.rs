//! The native scheduler behind the agent: Slurm (through its own commands
//! and their JSON output, `slurm`) or Kubernetes (`batch/v1` Jobs through
//! the API, `kube`).

use std::future::Future;
use std::path::PathBuf;

use anyhow::Result;
use fleet_api::api::NodeCapacity;
pub use fleet_api::api::SignalScope;
use fleet_api::{JobRequest, JobState};

use crate::identity::LocalUser;

/// What the native scheduler says about one job, from its structured
/// output only: no field here can be set by the job's user except through
/// the scheduler's own rules (a job name or comment is never read).
#[derive(Clone, Debug, PartialEq)]
pub struct NativeJob {
    pub native_id: u64,
    pub state: JobState,
    /// The scheduler's own state name (`TIMEOUT`, `NODE_FAIL`, ...).
    pub raw_state: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub node_list: String,
    pub reason: String,
    /// Submission time (epoch s): with the id, what tells a job from a
    /// later one that reused its id after a controller crash.
    pub submit_time: Option<i64>,
    pub user_id: Option<u32>,
    /// Times the scheduler requeued it.
    pub restarts: u32,
    /// When the current run started (epoch s), for a job that runs or ran
    /// (`None`: not started, or not said; a pending job's start time is
    /// Slurm's estimate and is not read).
    pub start_time: Option<i64>,
    pub partition: String,
    /// `AdminComment`, which only operators and the plugin can set: the
    /// Fleet tag of a stand-in (`fleet:<id>`).
    pub admin_comment: String,
    /// The job's working directory (`--chdir`): for the jobs the agent
    /// submits, the fleet job's private directory, which names the fleet
    /// job (see `Backend::find_submitted`).
    pub work_dir: String,
    /// The time limit in minutes (`None`: unlimited or not said).
    pub time_limit_min: Option<u32>,
    /// Slurm's own description of the state (`state_description`), which
    /// only slurmctld sets (e.g. `launch failed requeued held`).
    pub description: String,
    /// An array element: its array's job id and its task id.
    pub array_job_id: Option<u64>,
    pub array_task_id: Option<u32>,
}

impl NativeJob {
    pub fn new(native_id: u64, raw_state: &str) -> NativeJob {
        NativeJob {
            native_id,
            state: crate::slurm::map_state(raw_state),
            raw_state: raw_state.to_string(),
            exit_code: None,
            signal: None,
            node_list: String::new(),
            reason: String::new(),
            submit_time: None,
            user_id: None,
            restarts: 0,
            start_time: None,
            partition: String::new(),
            admin_comment: String::new(),
            work_dir: String::new(),
            time_limit_min: None,
            description: String::new(),
            array_job_id: None,
            array_task_id: None,
        }
    }
}

/// What one capacity query found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Capacity {
    pub nodes: Vec<NodeCapacity>,
    /// Jobs pending and running in the scheduler's queue (every user's).
    pub pending: u32,
    pub running: u32,
    /// The native ids of the jobs whose resources `nodes` shows taken
    /// (started, or ending and not yet let go of them), read in the same
    /// query: which of Fleet's runs the heartbeat's free GPUs already
    /// count (`Heartbeat::holding`).
    pub holding: Vec<u64>,
}

/// Where a job's output is written at this cluster.
#[derive(Clone, Debug)]
pub struct OutputPaths {
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

/// Every future is `Send`: the agent drives a backend from spawned tasks.
pub trait Backend: Send + Sync + 'static {
    /// Per-node capacity, the queue depth, and which jobs hold what the
    /// nodes show taken.
    fn capacity(&self) -> impl Future<Output = Result<Capacity>> + Send;
    /// Submit `req` as fleet job `id`, as `user`; returns the native job id.
    fn submit(&self, id: &str, req: &JobRequest, user: &LocalUser) -> impl Future<Output = Result<u64>> + Send;
    /// The jobs among `native_ids` the scheduler still knows, in one call.
    fn status(&self, native_ids: &[u64]) -> impl Future<Output = Result<Vec<NativeJob>>> + Send;
    /// Finished jobs the scheduler's queue forgot, from its accounting
    /// (empty where the site keeps none).
    fn accounting(&self, native_ids: &[u64]) -> impl Future<Output = Result<Vec<NativeJob>>> + Send;
    /// The jobs of `uid` submitted since `since` (epoch s) whose working
    /// directory is fleet job `id`'s directory, in the queue or in
    /// accounting: what a submission whose answer the agent never journaled
    /// (a crash in between) left behind. Only that user, or an agent
    /// acting as them, can have made such a job.
    fn find_submitted(&self, id: &str, uid: u32, since: f64) -> impl Future<Output = Result<Vec<NativeJob>>> + Send;
    /// Every job the scheduler still knows in the proxy partition, in any
    /// state (the stand-ins of jobs forwarded from here). Read-only.
    fn stand_ins(&self, partition: &str) -> impl Future<Output = Result<Vec<NativeJob>>> + Send;
    /// The jobs among `ids`, as [`Backend::stand_ins`] shows them (the
    /// start check: latency here is start latency). Like `stand_ins` on
    /// 22.05 (whose `squeue --json` ignores `-p`), jobs of other partitions
    /// may be among them: callers check `partition`. Read-only; by default
    /// a filter of `stand_ins`.
    fn stand_ins_by_id(&self, partition: &str, ids: &[u64]) -> impl Future<Output = Result<Vec<NativeJob>>> + Send {
        async move {
            let all = self.stand_ins(partition).await?;
            Ok(all.into_iter().filter(|j| ids.contains(&j.native_id)).collect())
        }
    }
    /// What the deferred pickup scans: the jobs of [`Backend::stand_ins`]
    /// (those of other partitions may be among them: callers check
    /// `partition`), of which only the id, state, partition, owner,
    /// `AdminComment`, restarts, time limit, exit and array ids need be
    /// filled. Read-only; by default `stand_ins`.
    fn stand_ins_brief(&self, partition: &str) -> impl Future<Output = Result<Vec<NativeJob>>> + Send {
        self.stand_ins(partition)
    }
    /// The batch script Slurm stores for job `native_id` (owned by
    /// `user`): what a deferred stand-in carries. Backends without
    /// stand-ins refuse.
    fn batch_script(&self, native_id: u64, user: &str) -> impl Future<Output = Result<Vec<u8>>> + Send {
        let _ = (native_id, user);
        async { anyhow::bail!("this backend keeps no stand-ins") }
    }
    /// Cancel (or signal) native job `native_id`, as `user` (the caller
    /// checked the journal and the job's identity).
    fn cancel(&self, native_id: u64, user: &str) -> impl Future<Output = Result<()>> + Send;
    /// Send `signal` (a name without `SIG`, checked by the caller) to
    /// native job `native_id`, as `user`.
    fn signal(
        &self,
        native_id: u64,
        user: &str,
        signal: &str,
        scope: SignalScope,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Set native job `native_id`'s time limit to `minutes` as `user`,
    /// where Slurm lets the owner (lowering; raising a pending job up to
    /// its partition's MaxTime). Only a `raise` an operator made at home
    /// (`TimeLimitOrder::raise`) is then set as the agent, which Slurm lets
    /// an operator do (raising a running job); anything else Slurm refuses
    /// the owner stays refused. Backends without the notion refuse.
    fn set_time_limit(
        &self,
        native_id: u64,
        user: &str,
        minutes: u32,
        raise: bool,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (native_id, user, minutes, raise);
        async { anyhow::bail!("this backend cannot change a running job's time limit") }
    }
    /// Lift the time limit of stand-in `native_id` (running, checked by
    /// the caller) to UNLIMITED, as the agent (a Slurm operator): its job's
    /// limit runs at its target from its start there, and the stand-in
    /// must outlive the job's wait there. Backends without stand-ins refuse.
    fn lift_stand_in_limit(&self, native_id: u64) -> impl Future<Output = Result<()>> + Send {
        let _ = native_id;
        async { anyhow::bail!("this backend has no stand-ins") }
    }
    /// The scheduler's name in heartbeats (`slurm`, `kubernetes`).
    fn scheduler(&self) -> &'static str {
        "slurm"
    }
    /// Every run submitted here starts under its in-job lease, so a run
    /// placed early can be held at its first lease until the origin
    /// confirms the start (`Heartbeat::start_gate`).
    fn start_gate(&self) -> bool {
        false
    }
    /// The GPU quotas that bound what a submitter may take here beside the
    /// free GPUs (`Heartbeat::gpu_quotas`), each with the admitted
    /// `origin:user` pairs among `users` it binds (`accounts`: the account
    /// each pair's map line names). `None`: none.
    fn gpu_quotas(&self, _users: &[String], _accounts: &[(String, String)]) -> Option<Vec<fleet_api::api::GpuQuota>> {
        None
    }
    /// The longest time limit a job forwarded here may have
    /// (`Heartbeat::max_time_min`). `None`: unlimited, or not known.
    fn max_time_min(&self) -> Option<u32> {
        None
    }
    /// Who must own a job's output files for the relay to read them: the
    /// job's user where the job writes them (Slurm), the agent itself where
    /// the backend writes them (Kubernetes: pod logs).
    fn output_owner(&self, job_uid: Option<u32>) -> Option<u32> {
        job_uid
    }
    /// The job's private directory (working directory, HOME, output).
    fn job_dir(&self, id: &str) -> PathBuf;
    fn output_paths(&self, id: &str) -> OutputPaths {
        let d = self.job_dir(id);
        OutputPaths { stdout: d.join("stdout"), stderr: d.join("stderr") }
    }
}
