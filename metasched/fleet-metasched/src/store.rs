//! The meta-scheduler's state: jobs and cluster heartbeats in SQLite,
//! output bytes in files, and the job state machine.
//!
//! Everything here is synchronous; the HTTP layer calls it from
//! `spawn_blocking` with the store behind one `parking_lot::Mutex` (see
//! `lib.rs` for why).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleet_api::api::{
    AgentWork, Assignment, ClusterSummary, FenceReply, FenceRequest, FleetView, ForwardRequest, GpuPool, Heartbeat,
    JobLeaseReply, JobLeaseRequest, JobRecord, NodeCapacity, OutputChunk, SignalOrder, SignalRequest, SignalScope,
    StaleRun, StartCheck, StartConfirmation, StatusUpdate, Stream, TimeLimitOrder, TimeLimitRequest,
};
use fleet_api::placement::{self, Placement};
use fleet_api::{JobRequest, JobState};
use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::config::{ClusterConfig, Health, Sla};
use crate::feeds::Feeds;
use crate::lifecycle::{self, transition, Early, Effect, Event, Life, Moving, Reply};
use crate::metrics::Metrics;
use crate::ranking::{JobHistory, Ranker, RebalanceProposal, RunningInput};
use crate::Clock;

/// The checkpoint catalog (its table and every query of it).
mod catalog;
mod early;
mod ends;
/// Planned migrations (rebalancing moves) carried out.
mod moves;
mod sla;

pub use early::{not_early, EarlyStart, DEFAULT_EARLY_WAIT_S};
pub use moves::{MoveFigures, MovePolicy, MoveStatus, PlannedMove};

/// Who is calling, after authentication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    Admin,
    /// An agent, by cluster name.
    Cluster(String),
    /// A stand-in (`fleet-proxy`) holding the job token of `id`, minted
    /// with the token of cluster `origin`.
    Job {
        id: String,
        origin: String,
    },
    /// A job at its target holding the checkpoint token of `id`, minted
    /// with the token of cluster `cluster`: it may report checkpoints of
    /// that job while `cluster` runs it, and nothing else.
    Checkpointer {
        id: String,
        cluster: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// Existed, deleted by the retention policy.
    #[error("{0}")]
    Gone(String),
    /// Out of room for output (the state directory's file system is
    /// nearly full): 507, sent again later.
    #[error("{0}")]
    Full(String),
    /// `expected_offset` is set for output gaps; `terminal` when the job
    /// is already finished here and the update cannot apply any more.
    #[error("{msg}")]
    Conflict { msg: String, expected_offset: Option<u64>, terminal: bool },
    #[error("database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("output file: {0}")]
    Io(#[from] std::io::Error),
    #[error("stored record: {0}")]
    Json(#[from] serde_json::Error),
}

fn conflict(msg: impl Into<String>) -> StoreError {
    StoreError::Conflict { msg: msg.into(), expected_offset: None, terminal: false }
}

/// A non-terminal update for a job that is terminal here (409 with
/// `"terminal": true`: the agent stops reporting on it).
fn terminal_conflict(msg: impl Into<String>) -> StoreError {
    StoreError::Conflict { msg: msg.into(), expected_offset: None, terminal: true }
}

/// Largest output offset accepted (1 TiB): beyond it a chunk or a read is
/// a client error, not an I/O error.
pub const MAX_OUTPUT_OFFSET: u64 = 1 << 40;

/// Longest `reason` of a refused start kept in the record.
const MAX_REASON: usize = 512;
/// The longest node list a report sets (a hostlist expression).
const MAX_NODE_LIST: usize = 4096;

/// `s` without control characters, at most `max` characters.
fn printable(s: &str, max: usize) -> String {
    s.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// One `watch` channel per configured cluster; a change means "there may
/// be new work for this cluster" and wakes its agent's long-poll
/// (`GET /v1/agent/work?wait_ms=`). `send_modify` works without
/// receivers and never blocks, so the synchronous store can call it
/// under its lock.
#[derive(Debug, Default)]
pub struct Wakers {
    by_cluster: BTreeMap<String, tokio::sync::watch::Sender<u64>>,
}

impl Wakers {
    fn new<'a>(names: impl Iterator<Item = &'a str>) -> Wakers {
        Wakers { by_cluster: names.map(|n| (n.to_string(), tokio::sync::watch::channel(0).0)).collect() }
    }

    pub fn wake(&self, cluster: &str) {
        if let Some(tx) = self.by_cluster.get(cluster) {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// A receiver that sees every wake from now on.
    pub fn subscribe(&self, cluster: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.by_cluster.get(cluster).map(|tx| tx.subscribe())
    }
}

/// A job as stored: the public record plus what only the meta-scheduler needs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub record: JobRecord,
    pub request: JobRequest,
    #[serde(default)]
    pub tentative_target: String,
    /// The target agent has reported on it (it was submitted there).
    #[serde(default)]
    pub submitted: bool,
    #[serde(default)]
    pub final_stdout_len: Option<u64>,
    #[serde(default)]
    pub final_stderr_len: Option<u64>,
    /// Cancelled here before it was submitted, but the target reported a
    /// submission afterwards: the target must still cancel it.
    #[serde(default)]
    pub remote_cancel_pending: bool,
    /// When the target first reported it running (Unix seconds); the
    /// rebalancing pass estimates the remaining run from it.
    #[serde(default)]
    pub running_since: Option<f64>,
    /// Its output files were deleted by the retention policy (when).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_purged_at: Option<f64>,
    /// Why its output stopped being kept: a stream passed
    /// `output_max_job_bytes` and the job was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_capped: Option<String>,
    /// Placements that ended because their run died there: (epoch,
    /// cluster). Those clusters' reports are stale (409 naming the epoch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<(u64, String)>,
    /// The cluster the last run died on: the next placement avoids it
    /// while another cluster can take the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avoid: Option<String>,
    /// A planned migration under way (rebalancing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned: Option<PlannedMove>,
    /// The next placement goes here when it can (a planned move's target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<String>,
    /// The last planned move's figures (decision, checkpoint, running again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_move: Option<moves::MoveFigures>,
    /// The epoch whose run its target reported submitted under its in-job
    /// lease (`StatusUpdate.job_lease`; 0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lease_run_epoch: u64,
    /// The epoch whose run last asked for (and got) its first in-job lease
    /// (0: none). Reset by a requeue at the target (a new launch).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub leased_epoch: u64,
    /// When the current placement was made: the provisioning SLA's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_at: Option<f64>,
    /// The epoch whose start was recorded for the SLA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla_started: Option<u64>,
    /// The epoch whose provisioning deadline passed (recorded as a miss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla_missed: Option<u64>,
    /// Re-runs at the target counted in the current epoch (the
    /// lifecycle's `target_reruns`).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub target_reruns: u32,
    /// The run's own claim that its script ended (`POST /end`,
    /// `store/ends.rs`): keeps it from being moved off a silent cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_claim: Option<ends::EndClaim>,
    /// Placed early, before its origin confirmed the stand-in runs
    /// (`store/early.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early: Option<EarlyStart>,
    /// Why the run of an epoch waits at its target, as the target last
    /// said (a pod the scheduler cannot place, Slurm's `Resources`): it
    /// says so once, so the meta-scheduler's own notes on a job placed
    /// early (its stand-in's start request, the origin's confirmation)
    /// follow it in the reason instead of replacing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_waits: Option<(u64, String)>,
    /// The epoch in which a signal was queued for the run on its user's
    /// (or the admin's) request (`POST /signal`) or by a planned move's
    /// checkpoint: an end its run claims after a signal to the whole step
    /// may then be that signal's, not Slurm's kill (`ends::killed_end`,
    /// `ends::killed_success`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signalled: Option<u64>,
    /// The job as it was before a rerun request (a start naming a higher
    /// restart) reset it, until the origin agent answers that request:
    /// a refused rerun (no requeue of the stand-in happened; the job token
    /// alone asked) leaves the job as it was, its outcome included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_rerun: Option<Box<Job>>,
    /// The epoch whose run its target keeps pending for a limit that does
    /// not clear by itself (`StatusUpdate.held_by_limit`), and why:
    /// re-placed after `[health] stranded_s` (`Store::check_stranded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by_limit: Option<(u64, String)>,
    /// Clusters whose limits held it for good, with why: no later
    /// placement, re-placement or planned move sends it back there while
    /// another cluster can take it (a limit changes only by its admin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_at: Vec<(String, String)>,
}

/// `view` with the clusters `names` marked unhealthy: what placement sees
/// without them.
pub(crate) fn without_clusters(view: &FleetView, names: &[&str]) -> FleetView {
    let mut without = view.clone();
    without.clusters.iter_mut().filter(|c| names.contains(&c.name.as_str())).for_each(|c| c.healthy = false);
    without
}

/// `note`, after why `job`'s current run waits at its target if it does.
fn after_target_wait(job: &Job, note: String) -> String {
    match &job.target_waits {
        Some((epoch, why)) if *epoch == job.record.epoch && job.record.state == JobState::Pending => {
            format!("{why}; {note}")
        }
        _ => note,
    }
}

/// The job's history as the engine's spot caps read it: every run that died
/// (`left`) or was requeued at its target (`requeues`) counts as a reclaim.
fn history_of(job: &Job) -> JobHistory {
    let lost = u32::try_from(job.left.len()).unwrap_or(u32::MAX);
    JobHistory { spot_reclaims: lost.saturating_add(job.record.requeues), spot_lost_h: 0.0 }
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// Why a dead run's job may run again whatever its restart policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rerun {
    /// It may not (only a checkpoint or its restart policy moves it).
    No,
    /// Its script never started: a new placement runs nothing twice.
    NothingRan,
    /// Slurm at the target requeued the run after its script started
    /// (`StatusUpdate::slurm_requeued`): it runs again as native Slurm
    /// would run it, a re-run counted in `requeues`.
    SlurmRequeued,
}

/// Notes a requeue counted in `requeues` (see [`JobRecord::requeue_notes`]).
fn note_requeue(record: &mut JobRecord, line: String) {
    let notes = &mut record.requeue_notes;
    notes.push(line);
    if notes.len() > fleet_api::api::MAX_REQUEUE_NOTES {
        let extra = notes.len() - fleet_api::api::MAX_REQUEUE_NOTES;
        notes.drain(..extra);
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// `GET /v1/jobs/{id}/explain`: why the job is (or would be) where it is.
///
/// Computed on the *current* view, so it can differ from the decision
/// taken when the job started (that one is in `reason`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub fleet_job_id: String,
    pub state: Option<JobState>,
    pub target: Option<String>,
    /// The record's `reason` (the decision actually taken).
    pub reason: String,
    pub summary: String,
    /// `home`, `remote` or `impossible`: the first rule on the current view.
    pub placement: String,
    pub placement_target: Option<String>,
    pub placement_reason: String,
    /// Clusters the hard constraints rule out, and why.
    pub exclusions: Vec<ExclusionView>,
    /// Engine policy that ranks (empty: the first rule alone).
    #[serde(default)]
    pub policy: String,
    /// Clusters ranked by the cost engine, best first (empty without one).
    #[serde(default)]
    pub ranked: Vec<RankedCandidate>,
    /// Clusters the engine rules out, and why.
    #[serde(default)]
    pub engine_exclusions: Vec<ExclusionView>,
    /// Engine notes (unknown datasets, bad `#FLEET` directives, …).
    #[serde(default)]
    pub notes: Vec<String>,
    pub view_generated_at: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExclusionView {
    pub cluster: String,
    pub reason: String,
}

/// One cluster as the cost engine scores it (placeholder for the engine).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankedCandidate {
    pub cluster: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub pricing: String,
    #[serde(default)]
    pub fits_now: bool,
    pub score: f64,
    /// Named cost terms (price, wait, egress, carbon, …).
    #[serde(default)]
    pub terms: Vec<(String, f64)>,
}

/// Reply of `POST /v1/prices`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PriceImport {
    /// (provider, region, GPU type, GPUs per instance) price entries read.
    pub entries: usize,
    /// Rows skipped because they sell a fraction of a GPU.
    pub skipped_fractional: usize,
    /// The engine's model was repriced (false: no engine policy configured;
    /// the table is kept and used once one is).
    pub applied: bool,
}

/// `GET /v1/rebalance`: the latest rebalancing pass, the mode (which says
/// whether its proposals are carried out) and the planned moves under way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rebalance {
    /// Engine policy of the pass (empty: no engine configured).
    #[serde(default)]
    pub policy: String,
    /// Unix seconds of the pass (absent: none ran yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub computed_at: Option<f64>,
    /// Running interruptible jobs the pass considered.
    #[serde(default)]
    pub considered: usize,
    /// Best saving first.
    #[serde(default)]
    pub proposals: Vec<RebalanceProposal>,
    /// Why there are no proposals when no pass can run (no engine policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `[rebalance] mode` in force (or as set at run time by the admin).
    #[serde(default)]
    pub mode: String,
    /// Planned moves under way or recently done.
    #[serde(default)]
    pub moves: Vec<MoveStatus>,
    /// Proposal ids the pass itself started (`auto`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub started: Vec<String>,
}

/// Filter and page of `GET /v1/jobs` (query parameters). Without `limit`
/// every matching job comes back, oldest first, as agents expect.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFilter {
    pub state: Option<JobState>,
    /// Only jobs submitted at this cluster.
    pub origin: Option<String>,
    /// Only jobs that may still run somewhere (`true`) or only finished ones.
    pub active: Option<bool>,
    /// Only jobs placed on this cluster.
    pub target: Option<String>,
    /// Only jobs of this user (Slurm user name at the origin).
    pub user: Option<String>,
    /// Only the job whose stand-in has this Slurm job id at its origin.
    pub origin_job: Option<u64>,
    /// Only jobs submitted at or after this time (Unix seconds).
    pub since: Option<f64>,
    /// `asc` (oldest first, the default) or `desc` (newest first).
    pub order: Option<ListOrder>,
    /// At most this many jobs (1..=10000).
    pub limit: Option<u32>,
    /// Skip this many matching jobs first (paging with `limit`).
    pub offset: Option<u32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListOrder {
    #[default]
    Asc,
    Desc,
}

/// Most jobs one `GET /v1/jobs` page may ask for.
pub const MAX_LIST_LIMIT: u32 = 10_000;

struct ClusterState {
    cfg: ClusterConfig,
    /// Last heartbeat and when it arrived (Unix seconds).
    last: Option<(Heartbeat, f64)>,
    /// Set by a heartbeat beyond the declared inventory: no new work until
    /// the meta-scheduler restarts (kept across valid heartbeats, so a
    /// forger cannot alternate).
    quarantine: Option<String>,
}

/// Why `hb` cannot be true of a cluster declared as `cfg`, if it cannot.
pub fn inventory_violation(cfg: &ClusterConfig, hb: &Heartbeat) -> Option<String> {
    if let Some(max) = cfg.max_nodes {
        if hb.nodes.len() as u64 > u64::from(max) {
            return Some(format!("heartbeat reports {} nodes, max_nodes is {max}", hb.nodes.len()));
        }
    }
    if let Some(node) = hb.nodes.iter().find(|n| n.gpus_free > n.gpus_total) {
        return Some(format!(
            "heartbeat reports node {:?} with {} free of {} GPUs",
            node.name, node.gpus_free, node.gpus_total
        ));
    }
    let declared = cfg.max_gpus.as_ref()?;
    let mut reported: BTreeMap<&str, u64> = BTreeMap::new();
    for n in &hb.nodes {
        if n.gpus_total == 0 {
            continue;
        }
        let ty = n.gpu_type.as_deref().unwrap_or("");
        *reported.entry(ty).or_default() += u64::from(n.gpus_total);
    }
    for (ty, count) in reported {
        match declared.get(ty) {
            None => {
                let names: Vec<&str> = declared.keys().map(String::as_str).collect();
                return Some(format!(
                    "heartbeat reports {count} GPUs of type {ty:?}, not in max_gpus ({})",
                    names.join(", ")
                ));
            }
            Some(max) if count > u64::from(*max) => {
                return Some(format!("heartbeat reports {count} {ty} GPUs, max_gpus allows {max}"));
            }
            Some(_) => {}
        }
    }
    None
}

/// A gap between two sweeps (monotonic clock) longer than this is a time
/// the meta-scheduler was not listening. Sweeps run every second.
const DEAF_AFTER_S: f64 = 5.0;
/// Deaf spells remembered (the oldest go first): only recent ones overlap a
/// silence or deadline still being judged.
const DEAF_KEPT: usize = 64;

/// The spells the meta-scheduler was not listening, on the store's clock.
#[derive(Debug, Default)]
struct Deafness {
    /// The previous sweep, on the monotonic clock.
    last: Option<std::time::Instant>,
    /// (start, end), oldest first.
    spells: std::collections::VecDeque<(f64, f64)>,
}

impl Deafness {
    /// A sweep at `mono` (monotonic) and `now` (the store's clock): the gap
    /// since the previous sweep, if it was a deaf spell (then remembered as
    /// ending at `now`).
    fn tick(&mut self, mono: std::time::Instant, now: f64) -> Option<f64> {
        let m0 = self.last.replace(mono)?;
        let gap = mono.saturating_duration_since(m0).as_secs_f64();
        if gap <= DEAF_AFTER_S {
            return None;
        }
        self.add(now - gap, now);
        Some(gap)
    }

    fn add(&mut self, start: f64, end: f64) {
        if self.spells.len() == DEAF_KEPT {
            self.spells.pop_front();
        }
        self.spells.push_back((start, end));
    }

    /// Seconds of deaf spells within `[t0, t1]`.
    fn within(&self, t0: f64, t1: f64) -> f64 {
        self.spells.iter().map(|&(a, b)| (b.min(t1) - a.max(t0)).max(0.0)).sum()
    }
}

pub struct Store {
    conn: rusqlite::Connection,
    state_dir: PathBuf,
    out_dir: PathBuf,
    clusters: BTreeMap<String, ClusterState>,
    /// Configured order, for stable views.
    order: Vec<String>,
    heartbeat_timeout_s: f64,
    started_at: f64,
    /// The times the meta-scheduler itself was not listening (paused host,
    /// stopped or starved process; see [`Store::note_deafness`]): no cluster
    /// is held to a silence, and no deadline to time, spent then.
    deaf: Deafness,
    clock: crate::Clock,
    metrics: Arc<Metrics>,
    ranker: Option<Arc<Ranker>>,
    wakers: Arc<Wakers>,
    health: Health,
    /// Running jobs whose run, under its in-job lease, has not asked for
    /// one yet (`[health] first_lease_s`): filled at start from the
    /// database, then by reports; checked by `sweep`.
    awaiting_lease: BTreeSet<String>,
    /// The end of the latest job lease granted to each job's run (epoch,
    /// Unix seconds), in memory: what a run's claim that its lease stopped
    /// it is checked against.
    lease_until: HashMap<String, (u64, f64)>,
    /// What `lease_until` was before its last extension: the end of the
    /// lease a run's watchdog holds when the reply to its last renewal was
    /// lost (a meta-scheduler answering after the watchdog gave up).
    lease_prev_until: HashMap<String, (u64, f64)>,
    /// `[sla]` and the provisioning samples (`store/sla.rs`).
    sla: Sla,
    sla_book: sla::SlaBook,
    /// `[health] end_wait_s`: how long past its grace period a silent
    /// cluster's run that claimed its end waits for its agent's report.
    end_wait_s: f64,
    /// `[health] stranded_s` (0: off) and, per waiting job, since when
    /// (epoch, Unix seconds) its target's usable nodes cannot run it: in
    /// memory, so a restart of the meta-scheduler starts the wait again.
    stranded_s: f64,
    stranded_since: BTreeMap<String, (u64, f64)>,
    /// Waiting jobs whose target keeps their run pending for a limit that
    /// does not clear (`Job::held_by_limit`) and since when (epoch, Unix
    /// seconds): filled by reports, and at start from the database with
    /// no time (the wait starts again at the first sweep).
    held_since: BTreeMap<String, (u64, Option<f64>)>,
    /// `[start] early_submit_wait_s` (0: no early placement).
    early_wait_s: f64,
    /// `output_max_job_bytes` (0: no cap) and `output_min_free_bytes`.
    output_max_job_bytes: u64,
    output_min_free_bytes: u64,
    /// The jobs placed at a cluster that hold or will take its GPUs (given to
    /// its agent, pending in its queue, or running), by fleet job id: kept by
    /// [`Store::save`], read by [`Store::view`], which takes from a cluster's
    /// free GPUs those its last heartbeat cannot show taken yet. Ordered by
    /// id, so that which pool gives way never depends on a map's order.
    placed: parking_lot::Mutex<BTreeMap<String, Placed>>,
}

/// A job placed at `target` and what it takes there (see `Store::placed`).
#[derive(Clone, Debug, PartialEq)]
struct Placed {
    target: String,
    /// Placed at its own origin (MIG slices count there, as Slurm would).
    home: bool,
    gpu_type: Option<String>,
    gpus: u32,
    /// The placement epoch its run at `target` has.
    epoch: u64,
    /// When its target first reported it running; `None` while it waits.
    running_since: Option<f64>,
    /// Its origin and user name (whose GPU quota at `target` it counts in).
    submitter: Option<(String, String)>,
}

impl Placed {
    /// What `job` holds or is about to take at its target, if anything.
    fn of(job: &Job) -> Option<Placed> {
        let r = &job.record;
        let target = r.target.as_ref()?;
        if !matches!(r.state, JobState::Assigned | JobState::Pending | JobState::Running) {
            return None;
        }
        let gpus = job.request.total_gpus();
        (gpus > 0).then(|| Placed {
            target: target.clone(),
            home: *target == r.origin,
            gpu_type: job.request.gpu_type().map(str::to_string),
            gpus,
            epoch: r.epoch,
            running_since: if r.state == JobState::Running { job.running_since } else { None },
            submitter: job.request.user_name.clone().map(|u| (r.origin.clone(), u)),
        })
    }

    /// Its GPUs (job `id`'s) are not in heartbeat `hb`, which arrived at
    /// `heard`: its run is not among those the heartbeat names as holding
    /// GPUs (still with the agent or in the queue: it takes free GPUs
    /// before a job placed now). From an agent that names none: it had
    /// not been reported running before the heartbeat arrived.
    fn unseen_in(&self, id: &str, hb: &Heartbeat, heard: f64) -> bool {
        match &hb.holding {
            Some(runs) => !runs.iter().any(|r| r.job == id && r.epoch == self.epoch),
            None => self.running_since.is_none_or(|t| t >= heard),
        }
    }
}

/// Take `placed`'s GPUs from the view's free GPUs of the pools it can use
/// (its type; any type but MIG slices away from its origin), in order.
fn take_free(pools: &mut [fleet_api::api::GpuPool], placed: &Placed) {
    let mut left = placed.gpus;
    for p in pools.iter_mut() {
        let usable = match &placed.gpu_type {
            Some(t) => t.eq_ignore_ascii_case(&p.gpu_type),
            None => placed.home || !fleet_api::placement::is_mig_profile(&p.gpu_type),
        };
        if usable && left > 0 {
            let take = left.min(p.free);
            p.free -= take;
            left -= take;
        }
    }
}

/// Seconds a granted lease may still cover a run whose claim that its
/// lease stopped it is believed (request latency; the kill takes longer).
const LEASE_CLAIM_SLACK_S: f64 = 1.0;

/// `GET /v1/rebalance`'s reason when no engine is configured.
pub const NO_ENGINE: &str = "no cost-engine policy configured ([placement] policy and fleet_model): rebalancing is off";

/// Slurm node states that take a node's GPUs out of the pool.
fn node_usable(state: &str) -> bool {
    let s = state.to_ascii_lowercase();
    !(s.contains("down")
        || s.contains("drain")
        || s.contains("fail")
        || s.contains("not_responding")
        || s.contains("maint")
        || s.ends_with('*'))
}

/// Aggregate node capacities into one pool per GPU type.
/// The usable nodes of a heartbeat by shape (GPUs, CPUs, memory,
/// features), for the placement rule's node-by-node check.
pub fn node_shapes(nodes: &[NodeCapacity]) -> Vec<fleet_api::api::NodeShape> {
    placement::node_shapes(
        nodes
            .iter()
            .filter(|n| node_usable(&n.state))
            .map(|n| (n.gpu_type.as_deref(), n.gpus_total, n.cpus, n.memory_mb, n.features.as_deref())),
    )
}

/// Every node of a heartbeat by shape, usable or not: installed capacity
/// (a job waits for it rather than being refused).
pub fn installed_shapes(nodes: &[NodeCapacity]) -> Vec<fleet_api::api::NodeShape> {
    placement::node_shapes(
        nodes.iter().map(|n| (n.gpu_type.as_deref(), n.gpus_total, n.cpus, n.memory_mb, n.features.as_deref())),
    )
}

pub fn gpu_pools(nodes: &[NodeCapacity]) -> Vec<GpuPool> {
    let mut pools: BTreeMap<String, GpuPool> = BTreeMap::new();
    for n in nodes {
        let Some(ty) = &n.gpu_type else { continue };
        if !node_usable(&n.state) || n.gpus_total == 0 {
            continue;
        }
        let p = pools.entry(ty.clone()).or_insert_with(|| GpuPool { gpu_type: ty.clone(), ..Default::default() });
        // Saturating: a heartbeat's counts are the agent's word (an overflow
        // panicked in debug builds and wrapped in release ones).
        p.total = p.total.saturating_add(n.gpus_total);
        p.free = p.free.saturating_add(n.gpus_free.min(n.gpus_total));
        p.max_per_node = p.max_per_node.max(n.gpus_total);
        p.nodes = p.nodes.saturating_add(1);
    }
    pools.into_values().collect()
}

/// Ids become file names: keep them to a safe alphabet.
/// The grant of a job lease: what the run asked for (`asked_ms`, 0: the
/// most), at most `max_s`, and never more than `room_s`, the seconds left
/// before its job could move off its cluster, less the margin. No room:
/// not renewed (`valid_ms` 0), the run's previous grant stands.
pub fn lease_grant(max_s: f64, asked_ms: u64, room_s: f64) -> JobLeaseReply {
    let max_ms = (max_s * 1000.0) as u64;
    let asked = if asked_ms == 0 { max_ms } else { asked_ms.min(max_ms) };
    let room_ms = if room_s.is_finite() && room_s > 0.0 { (room_s * 1000.0) as u64 } else { 0 };
    let valid_ms = asked.min(room_ms);
    let reason = if valid_ms == asked {
        String::new()
    } else if valid_ms == 0 {
        "not renewed: the cluster has been silent too long (its jobs move soon)".to_string()
    } else {
        format!("shortened to {} ms: the cluster is silent and its jobs may move", valid_ms)
    };
    JobLeaseReply { valid_ms, reason, ..JobLeaseReply::default() }
}

fn valid_job_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The state holds every job's script, environment and output: the
/// directories are 0700 and every file in them 0600, created so, and
/// existing ones (an older version's 0644) fixed at start. The database
/// file is created 0600 before SQLite opens it; SQLite gives its WAL and
/// SHM files the database's mode.
fn private_state(state_dir: &Path, out_dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let private_dir = |d: &Path| -> std::io::Result<()> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d)?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
    };
    private_dir(state_dir)?;
    private_dir(out_dir)?;
    let db = state_dir.join("metasched.db");
    OpenOptions::new().create(true).append(true).mode(0o600).open(&db)?;
    for dir in [state_dir, out_dir] {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            // Never follow a link planted here; only plain files are ours.
            if entry.file_type()?.is_file() {
                let mode = entry.metadata()?.permissions().mode() & 0o777;
                if mode != 0o600 {
                    std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))?;
                }
            }
        }
    }
    Ok(())
}

fn summary(req: &JobRequest) -> String {
    let limit = match req.time_limit_min {
        Some(m) => format!("{m} min"),
        None => "partition default time".to_string(),
    };
    format!("{}, {limit}", placement::describe(req))
}

enum TargetWork {
    Submit,
    Cancel,
}

/// What the target cluster must do about `job`, if anything.
fn target_work(job: &Job) -> Option<TargetWork> {
    let r = &job.record;
    if r.state == JobState::Assigned && !job.submitted && !r.cancel_requested {
        Some(TargetWork::Submit)
    } else if ((r.cancel_requested
        || job.planned.as_ref().is_some_and(|m| m.phase == Moving::Stopping)
        || job.early.as_ref().is_some_and(|e| e.phase == Early::Withdrawing))
        && !r.state.is_terminal())
        || job.remote_cancel_pending
    {
        Some(TargetWork::Cancel)
    } else {
        None
    }
}

/// The lifecycle's view of a stored job.
fn life_of(job: &Job) -> Life {
    let r = &job.record;
    let early = job.early.as_ref().map_or(Early::No, |e| e.phase);
    Life {
        state: r.state,
        origin_job_id: r.origin_job_id,
        start_requested: (r.state == JobState::Held || early != Early::No) && r.start_requested_at.is_some(),
        submitted: job.submitted,
        cancel_requested: r.cancel_requested,
        remote_cancel_pending: job.remote_cancel_pending,
        restart: r.origin_restart,
        epoch: r.epoch,
        moving: job.planned.as_ref().map_or(Moving::No, |m| m.phase),
        target_reruns: job.target_reruns,
        early,
    }
}

/// Store what the lifecycle decided (`start_requested_at` is the store's:
/// it is set and cleared with the effects that say so).
fn set_life(job: &mut Job, life: &Life) {
    job.record.state = life.state;
    job.record.origin_job_id = life.origin_job_id;
    job.submitted = life.submitted;
    job.record.cancel_requested = life.cancel_requested;
    job.remote_cancel_pending = life.remote_cancel_pending;
    job.record.origin_restart = life.restart;
    job.record.epoch = life.epoch;
    job.target_reruns = life.target_reruns;
    match (life.moving, &mut job.planned) {
        (Moving::No, p) => *p = None,
        (phase, Some(m)) => m.phase = phase,
        (_, None) => {}
    }
    match (life.early, &mut job.early) {
        (Early::No, e) => *e = None,
        (phase, Some(e)) => e.phase = phase,
        // Placed early: `place_early` notes when.
        (phase, e @ None) => *e = Some(EarlyStart { phase, placed_at: job.record.updated_at }),
    }
}

/// A refusal of the lifecycle as the store's error.
fn reply_result(id: &str, reply: &Reply) -> Result<(), StoreError> {
    match reply {
        Reply::Ok => Ok(()),
        Reply::BadRequest(m) => Err(StoreError::BadRequest(m.clone())),
        Reply::Conflict(m) => Err(conflict(format!("job {id}: {m}"))),
        Reply::TerminalConflict(m) => Err(terminal_conflict(format!("job {id}: {m}"))),
    }
}

/// Up to `max` bytes of the output file `path` from `offset` (nothing when
/// it does not exist).
pub fn read_range(path: &Path, offset: u64, max: u64) -> Result<Vec<u8>, StoreError> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

fn refresh_complete(job: &mut Job) {
    let r = &job.record;
    job.record.output_complete = r.state.is_terminal()
        && job.final_stdout_len.is_none_or(|f| r.stdout_len >= f)
        && job.final_stderr_len.is_none_or(|f| r.stderr_len >= f);
}

impl Store {
    pub fn open(
        state_dir: &Path,
        clusters: &[ClusterConfig],
        heartbeat_timeout_s: f64,
        clock: &Clock,
        metrics: Arc<Metrics>,
        ranker: Option<Arc<Ranker>>,
    ) -> Result<Store, StoreError> {
        let out_dir = state_dir.join("output");
        private_state(state_dir, &out_dir)?;
        let conn = rusqlite::Connection::open(state_dir.join("metasched.db"))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS jobs (
                 id TEXT PRIMARY KEY,
                 origin TEXT NOT NULL,
                 state TEXT NOT NULL,
                 target TEXT,
                 submitted_at REAL NOT NULL,
                 data TEXT NOT NULL,
                 active INTEGER NOT NULL DEFAULT 1
             );
             CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
             CREATE INDEX IF NOT EXISTS jobs_target ON jobs(target);
             -- Jobs placed early (store/early.rs), found by every sweep.
             CREATE INDEX IF NOT EXISTS jobs_early ON jobs(json_extract(data, '$.early.phase'));
             CREATE TABLE IF NOT EXISTS clusters (
                 name TEXT PRIMARY KEY,
                 last_seen REAL NOT NULL,
                 heartbeat TEXT NOT NULL
             );
             -- Signals waiting for the target agent (POST /signal), deleted
             -- when handed out. One per (job, signal, scope): a signal sent
             -- again before delivery is one delivery, as for a Unix process.
             CREATE TABLE IF NOT EXISTS signal_orders (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 job_id TEXT NOT NULL,
                 target TEXT NOT NULL,
                 signal TEXT NOT NULL,
                 scope TEXT NOT NULL,
                 requested_at REAL NOT NULL,
                 epoch INTEGER,
                 UNIQUE (job_id, signal, scope)
             );
             CREATE INDEX IF NOT EXISTS signal_orders_target ON signal_orders(target);
             -- Time limits waiting for the target agent (POST /time_limit):
             -- the latest per job wins, deleted when handed out.
             CREATE TABLE IF NOT EXISTS time_limit_orders (
                 job_id TEXT PRIMARY KEY,
                 target TEXT NOT NULL,
                 minutes INTEGER NOT NULL,
                 requested_at REAL NOT NULL,
                 operator_raise INTEGER NOT NULL DEFAULT 0
             );",
        )?;
        // `operator_raise` (TimeLimitRequest::raise) came later too.
        let has_raise: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('time_limit_orders') WHERE name = 'operator_raise'")?
            .exists([])?;
        if !has_raise {
            conn.execute_batch("ALTER TABLE time_limit_orders ADD COLUMN operator_raise INTEGER NOT NULL DEFAULT 0;")?;
        }
        // A signal order's `epoch` (the run it was sent to) came later too:
        // older orders (NULL) go to whichever run the job has.
        let has_epoch: bool =
            conn.prepare("SELECT 1 FROM pragma_table_info('signal_orders') WHERE name = 'epoch'")?.exists([])?;
        if !has_epoch {
            conn.execute_batch("ALTER TABLE signal_orders ADD COLUMN epoch INTEGER;")?;
        }
        // `active` (the job may still be some agent's work) came after the
        // first schema: add it to older databases.
        let has_active: bool =
            conn.prepare("SELECT 1 FROM pragma_table_info('jobs') WHERE name = 'active'")?.exists([])?;
        if !has_active {
            conn.execute_batch("ALTER TABLE jobs ADD COLUMN active INTEGER NOT NULL DEFAULT 1;")?;
        }
        conn.execute_batch("CREATE INDEX IF NOT EXISTS jobs_active ON jobs(target, active);")?;
        catalog::init(&conn)?;
        sla::init(&conn)?;
        let sla = Sla::default();
        let sla_book = sla::SlaBook::load(&conn, sla.window)?;
        let mut map = BTreeMap::new();
        for c in clusters {
            let last: Option<(String, f64)> = conn
                .query_row("SELECT heartbeat, last_seen FROM clusters WHERE name = ?1", [&c.name], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let last = match last {
                Some((hb, t)) => Some((serde_json::from_str::<Heartbeat>(&hb)?, t)),
                None => None,
            };
            map.insert(c.name.clone(), ClusterState { cfg: c.clone(), last, quarantine: None });
        }
        let mut store = Store {
            conn,
            state_dir: state_dir.to_path_buf(),
            out_dir,
            clusters: map,
            order: clusters.iter().map(|c| c.name.clone()).collect(),
            heartbeat_timeout_s,
            started_at: clock.now(),
            deaf: Deafness::default(),
            clock: clock.clone(),
            metrics,
            ranker,
            wakers: Arc::new(Wakers::new(clusters.iter().map(|c| c.name.as_str()))),
            health: Health {
                degraded_after_s: heartbeat_timeout_s,
                grace_s: 60.0,
                max_migrations: 3,
                job_lease_s: 30.0,
                job_lease_margin_s: 5.0,
                first_lease_s: 0.0,
            },
            awaiting_lease: BTreeSet::new(),
            lease_until: HashMap::new(),
            lease_prev_until: HashMap::new(),
            sla,
            sla_book,
            end_wait_s: crate::config::DEFAULT_END_WAIT_S,
            stranded_s: crate::config::DEFAULT_STRANDED_S,
            stranded_since: BTreeMap::new(),
            held_since: BTreeMap::new(),
            early_wait_s: DEFAULT_EARLY_WAIT_S,
            output_max_job_bytes: 0,
            output_min_free_bytes: 0,
            placed: parking_lot::Mutex::new(BTreeMap::new()),
        };
        store.reconcile_output_lengths()?;
        for job in
            store.query("SELECT data FROM jobs WHERE state IN ('assigned', 'pending', 'running') AND active = 1", [])?
        {
            if let Some(p) = Placed::of(&job) {
                store.placed.lock().insert(job.record.fleet_job_id.clone(), p);
            }
            if Self::awaits_lease(&job) {
                store.awaiting_lease.insert(job.record.fleet_job_id.clone());
            }
            if let Some((epoch, _)) = job.held_by_limit.as_ref().filter(|(e, _)| *e == job.record.epoch) {
                store.held_since.insert(job.record.fleet_job_id.clone(), (*epoch, None));
            }
        }
        Ok(store)
    }

    /// The output files are the truth for lengths (a crash between the file
    /// write and the row update must not lose or duplicate bytes).
    fn reconcile_output_lengths(&mut self) -> Result<(), StoreError> {
        for mut job in self.query("SELECT data FROM jobs", [])? {
            let out = self.file_len(&job.record.fleet_job_id, Stream::Stdout)?;
            let err = self.file_len(&job.record.fleet_job_id, Stream::Stderr)?;
            if out != job.record.stdout_len || err != job.record.stderr_len {
                job.record.stdout_len = out;
                job.record.stderr_len = err;
                refresh_complete(&mut job);
                self.save(&job)?;
            }
        }
        Ok(())
    }

    fn out_path(&self, id: &str, s: Stream) -> PathBuf {
        self.out_dir.join(format!("{id}.{}", s.as_str()))
    }

    fn file_len(&self, id: &str, s: Stream) -> Result<u64, StoreError> {
        match std::fs::metadata(self.out_path(id, s)) {
            Ok(m) => Ok(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    fn query<P: rusqlite::Params>(&self, sql: &str, p: P) -> Result<Vec<Job>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map(p, |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?)?);
        }
        Ok(out)
    }

    fn save(&self, job: &Job) -> Result<(), StoreError> {
        let r = &job.record;
        self.conn.execute(
            "INSERT OR REPLACE INTO jobs (id, origin, state, target, submitted_at, data, active)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                r.fleet_job_id,
                r.origin,
                r.state.as_str(),
                r.target,
                r.submitted_at,
                serde_json::to_string(job)?,
                !r.state.is_terminal() || job.remote_cancel_pending
            ],
        )?;
        match Placed::of(job) {
            Some(p) => self.placed.lock().insert(r.fleet_job_id.clone(), p),
            None => self.placed.lock().remove(&r.fleet_job_id),
        };
        self.wake_for(job);
        Ok(())
    }

    /// The wakers the HTTP layer's long-poll waits on.
    pub fn wakers(&self) -> Arc<Wakers> {
        self.wakers.clone()
    }

    /// Wake the agents for which `job` is work (see [`Store::work`]).
    fn wake_for(&self, job: &Job) {
        let r = &job.record;
        if life_of(job).start_requested {
            self.wakers.wake(&r.origin);
        }
        if let Some(t) = &r.target {
            if target_work(job).is_some() {
                self.wakers.wake(t);
            }
        }
    }

    fn load(&self, id: &str) -> Result<Job, StoreError> {
        if !valid_job_id(id) {
            return Err(StoreError::NotFound(format!("unknown job {id:?}")));
        }
        self.query("SELECT data FROM jobs WHERE id = ?1", [id])?
            .pop()
            .ok_or_else(|| StoreError::NotFound(format!("unknown job {id:?}")))
    }

    // ---- clusters -------------------------------------------------------

    pub fn view(&self, now: f64) -> FleetView {
        let providers = self.sla_book.by_provider(self.sla.window);
        // The placed jobs by target, each list in job id order.
        let all = self.placed.lock();
        let mut placed: HashMap<&str, Vec<(&str, &Placed)>> = HashMap::new();
        for (id, p) in all.iter() {
            placed.entry(p.target.as_str()).or_default().push((id, p));
        }
        let clusters = self
            .order
            .iter()
            .filter_map(|n| self.clusters.get(n))
            .map(|c| {
                let pick = |cfg: &str, hb: &str| {
                    if cfg.is_empty() {
                        hb.to_string()
                    } else {
                        cfg.to_string()
                    }
                };
                let mut summary = match &c.last {
                    Some((hb, t)) => {
                        let age = (now - t).max(0.0);
                        // Health by the silence heard (`Store::healthy`); the
                        // age shown is the heartbeat's.
                        let heard = self.heard(*t, now);
                        ClusterSummary {
                            name: c.cfg.name.clone(),
                            region: pick(&c.cfg.region, &hb.region),
                            provider: pick(&c.cfg.provider, &hb.provider),
                            scheduler: hb.scheduler.clone(),
                            healthy: heard <= self.heartbeat_timeout_s,
                            heartbeat_age_s: age,
                            gpus: gpu_pools(&hb.nodes),
                            queue_pending: hb.queue_pending,
                            queue_running: hb.queue_running,
                            nodes: node_shapes(&hb.nodes),
                            unhealthy_reason: String::new(),
                            identities: hb.identities.clone(),
                            health: String::new(),
                            sla: None,
                            gpu_quotas: hb.gpu_quotas.clone(),
                            max_time_min: hb.max_time_min,
                            installed: {
                                let all = installed_shapes(&hb.nodes);
                                // Only when some are unusable: views stay small.
                                if all == node_shapes(&hb.nodes) {
                                    Vec::new()
                                } else {
                                    all
                                }
                            },
                        }
                    }
                    // Never heard from: the age is counted from our own start.
                    None => ClusterSummary {
                        name: c.cfg.name.clone(),
                        region: c.cfg.region.clone(),
                        provider: c.cfg.provider.clone(),
                        scheduler: String::new(),
                        healthy: false,
                        heartbeat_age_s: (now - self.started_at).max(0.0),
                        gpus: Vec::new(),
                        queue_pending: 0,
                        queue_running: 0,
                        nodes: Vec::new(),
                        unhealthy_reason: String::new(),
                        identities: None,
                        health: String::new(),
                        installed: Vec::new(),
                        sla: None,
                        gpu_quotas: None,
                        max_time_min: None,
                    },
                };
                summary.sla = Some(self.sla_summary(&summary.name, &summary.provider, &providers, now));
                summary.health = if summary.healthy { "healthy" } else { "degraded" }.into();
                if !summary.healthy {
                    let age = summary.heartbeat_age_s;
                    let moves = self.move_after(&c.cfg.name);
                    summary.unhealthy_reason = if c.last.is_none() {
                        format!("no heartbeat since the meta-scheduler started {age:.0} s ago")
                    } else {
                        format!("no heartbeat for {age:.0} s")
                    };
                    summary.unhealthy_reason += &if self.silent_for(&c.cfg.name, now) > moves {
                        format!(
                            "; past its grace period ({moves:.0} s silent): its fleet jobs were moved to other clusters"
                        )
                    } else {
                        format!("; no new work; its fleet jobs move after {moves:.0} s of silence")
                    };
                }
                if let Some(err) = c.last.as_ref().and_then(|(hb, _)| hb.scheduler_error.as_ref()) {
                    if summary.healthy {
                        summary.healthy = false;
                        summary.health = "degraded".into();
                        let err: String = err.chars().filter(|c| !c.is_control()).take(300).collect();
                        summary.unhealthy_reason = format!(
                            "its scheduler does not answer its agent ({err}): no new work; its fleet jobs run on"
                        );
                    }
                }
                if let Some(q) = &c.quarantine {
                    summary.healthy = false;
                    summary.health = "quarantined".into();
                    summary.unhealthy_reason = format!("quarantined: {q}");
                }
                // The GPUs of jobs placed here that its last heartbeat does
                // not show taken: without this, every placement between two
                // heartbeats saw the same free GPUs, and a burst of jobs all
                // went to one cluster to queue there.
                if let (Some((hb, heard)), Some(mine)) = (&c.last, placed.get(c.cfg.name.as_str())) {
                    for (_, p) in mine.iter().filter(|(id, p)| p.unseen_in(id, hb, *heard)) {
                        take_free(&mut summary.gpus, p);
                        // And from the headroom of the quota that binds it
                        // (its pod may not exist yet).
                        if let Some((o, u)) = &p.submitter {
                            if let Some(q) = summary.gpu_quotas.iter_mut().flatten().find(|q| q.binds(o, u)) {
                                q.used = q.used.saturating_add(u64::from(p.gpus));
                            }
                        }
                    }
                }
                // Prices from the engine's model, for --fleet-max-price.
                if let Some(r) = &self.ranker {
                    for p in &mut summary.gpus {
                        p.price_per_gpu_hour = r.price_per_gpu_hour(&summary.name, &p.gpu_type);
                    }
                }
                summary
            })
            .collect();
        FleetView { generated_at: now, clusters }
    }

    /// `[health]` as configured (the store opens with the defaults).
    pub fn set_health(&mut self, h: Health) {
        self.heartbeat_timeout_s = h.degraded_after_s;
        self.health = h;
    }

    /// `[health] end_wait_s` (see `store/ends.rs`).
    pub fn set_end_wait(&mut self, s: f64) {
        self.end_wait_s = s;
    }

    /// `output_max_job_bytes` (0: no cap) and `output_min_free_bytes` (0:
    /// output never refused for room).
    pub fn set_output_limits(&mut self, max_job_bytes: u64, min_free_bytes: u64) {
        self.output_max_job_bytes = max_job_bytes;
        self.output_min_free_bytes = min_free_bytes;
    }

    /// Room for `n` more bytes of output: the state directory's file
    /// system keeps `output_min_free_bytes` free after them, for the job
    /// database. Refused output stays with the target agent, which sends it
    /// again on its next pass.
    fn output_room(&self, n: u64) -> Result<(), StoreError> {
        if self.output_min_free_bytes == 0 {
            return Ok(());
        }
        let st = rustix::fs::statvfs(&self.out_dir).map_err(std::io::Error::from)?;
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        if free < self.output_min_free_bytes.saturating_add(n) {
            self.metrics.output_refused("room");
            return Err(StoreError::Full(format!(
                "no room for output: {} has {free} bytes free, output_min_free_bytes is {}; \
                 the agent keeps the output and sends it again",
                self.out_dir.display(),
                self.output_min_free_bytes
            )));
        }
        Ok(())
    }

    /// `id`'s `stream` passed `output_max_job_bytes`: the job is cancelled
    /// as `fleetctl cancel` would (its stand-in ends `CANCELLED` at home)
    /// and the rest of its output is not kept. Does not save.
    fn cap_output(&mut self, job: &mut Job, stream: Stream, now: f64) {
        let id = job.record.fleet_job_id.clone();
        let why = format!(
            "its {} passed output_max_job_bytes ({} bytes), the most the fleet keeps per stream of a job; \
             cancelled, and the rest of its output was not kept",
            stream.as_str(),
            self.output_max_job_bytes
        );
        tracing::warn!(job = %id, target = ?job.record.target, "{why}");
        self.metrics.output_refused("cap");
        let before = life_of(job);
        let o = transition(&before, &Event::Cancel);
        if o.reply == Reply::Ok && o.life != before {
            set_life(job, &o.life);
            if let Some(t) = &job.record.target {
                self.wakers.wake(t);
            }
        }
        job.record.reason = why.clone();
        job.output_capped = Some(why);
        job.record.updated_at = now;
    }

    /// `[health] stranded_s` (0: off; see `Store::check_stranded`).
    pub fn set_stranded(&mut self, s: f64) {
        self.stranded_s = s;
    }

    /// Seconds of silence after which `cluster`'s fleet jobs move: Degraded
    /// plus its grace period, which is never shorter than the lease its
    /// agent announced (an agent cut off stops its jobs by then).
    fn move_after(&self, cluster: &str) -> f64 {
        let Some(c) = self.clusters.get(cluster) else { return self.health.degraded_after_s + self.health.grace_s };
        let grace = c.cfg.grace_s.unwrap_or(self.health.grace_s);
        let lease = c.last.as_ref().and_then(|(hb, _)| hb.lease_s).filter(|l| l.is_finite()).unwrap_or(0.0);
        self.health.degraded_after_s + grace.max(lease)
    }

    /// How long `cluster` has been silent (since our own start if never heard).
    fn silent_for(&self, cluster: &str, now: f64) -> f64 {
        match self.clusters.get(cluster).and_then(|c| c.last.as_ref()) {
            // Silence while the meta-scheduler itself was down or deaf is not
            // the cluster's: count from our start at the earliest, and
            // without the times we were not listening.
            Some((_, t)) => self.listened(*t, now),
            None => self.listened(self.started_at, now),
        }
    }

    /// Seconds from `t0` to `now` during which the meta-scheduler was running
    /// and listening: after its start, less the times it was deaf.
    fn listened(&self, t0: f64, now: f64) -> f64 {
        self.heard(t0.max(self.started_at), now)
    }

    /// Seconds from `t0` to `now` less the times the meta-scheduler was deaf
    /// (not clamped to its start: a heartbeat from before it is as old as it is).
    fn heard(&self, t0: f64, now: f64) -> f64 {
        (now - t0 - self.deaf.within(t0, now)).max(0.0)
    }

    /// Called by every [`Store::sweep`], which runs every second: a longer
    /// gap between two sweeps, on the monotonic clock, means the
    /// meta-scheduler itself did not run (its host paused or suspended, the
    /// process stopped or starved, the store held): heartbeats, reports and
    /// lease renewals sent meanwhile were not heard, so that time is not
    /// counted against any cluster or run.
    fn note_deafness(&mut self, now: f64) {
        if let Some(gap) = self.deaf.tick(self.clock.mono(), now) {
            tracing::warn!(
                seconds = format!("{gap:.1}"),
                "the meta-scheduler did not run for a while (host paused, process stopped or starved): no cluster is held to its silence, and no run to a deadline, over that time"
            );
        }
    }

    fn healthy(&self, cluster: &str, now: f64) -> bool {
        self.clusters.get(cluster).is_some_and(|c| {
            c.quarantine.is_none()
                && c.last.as_ref().is_some_and(|(hb, t)| {
                    // Not `listened`: a cluster last heard before our own start
                    // is not healthy until it beats again.
                    self.heard(*t, now) <= self.heartbeat_timeout_s && hb.scheduler_error.is_none()
                })
        })
    }

    pub fn heartbeat(&mut self, caller: &Caller, hb: Heartbeat, now: f64) -> Result<FleetView, StoreError> {
        match caller {
            Caller::Cluster(c) if *c == hb.cluster => {}
            Caller::Cluster(c) => {
                return Err(StoreError::Forbidden(format!(
                    "cluster {c:?} cannot send a heartbeat for {:?}",
                    hb.cluster
                )))
            }
            _ => return Err(StoreError::Forbidden("only a cluster's agent sends heartbeats".into())),
        }
        let Some(state) = self.clusters.get_mut(&hb.cluster) else {
            return Err(StoreError::Forbidden(format!("cluster {:?} is not configured", hb.cluster)));
        };
        if let Some(why) = inventory_violation(&state.cfg, &hb) {
            // Its capacity is not believed (the previous heartbeat stays)
            // and it gets no new work; its jobs not yet submitted move.
            if state.quarantine.is_none() {
                tracing::warn!(cluster = %hb.cluster, reason = %why,
                    "cluster quarantined: a heartbeat beyond its declared inventory (metasched.toml max_nodes/max_gpus)");
            }
            self.metrics.heartbeat(&hb.cluster);
            state.quarantine = Some(why);
            self.sweep(now)?;
            return Ok(self.view(now));
        }
        self.conn.execute(
            "INSERT OR REPLACE INTO clusters (name, last_seen, heartbeat) VALUES (?1, ?2, ?3)",
            params![hb.cluster, now, serde_json::to_string(&hb)?],
        )?;
        self.metrics.heartbeat(&hb.cluster);
        state.last = Some((hb, now));
        self.sweep(now)?;
        Ok(self.view(now))
    }

    // ---- jobs -----------------------------------------------------------

    pub fn forward(&mut self, caller: &Caller, fwd: ForwardRequest, now: f64) -> Result<JobRecord, StoreError> {
        let Caller::Cluster(c) = caller else {
            return Err(StoreError::Forbidden("only an origin agent forwards jobs".into()));
        };
        if fwd.request.origin != *c {
            return Err(StoreError::Forbidden(format!(
                "cluster {c:?} cannot forward a job whose origin is {:?}",
                fwd.request.origin
            )));
        }
        if !valid_job_id(&fwd.fleet_job_id) {
            return Err(StoreError::BadRequest(format!(
                "fleet_job_id {:?} is invalid (1-128 characters of A-Z a-z 0-9 . _ -, not starting with '.')",
                fwd.fleet_job_id
            )));
        }
        if let Some(existing) = self.query("SELECT data FROM jobs WHERE id = ?1", [&fwd.fleet_job_id])?.pop() {
            if existing.record.origin == *c {
                return Ok(existing.record); // idempotent repeat
            }
            return Err(conflict(format!(
                "job {} already exists with origin {}",
                fwd.fleet_job_id, existing.record.origin
            )));
        }
        let record = JobRecord {
            fleet_job_id: fwd.fleet_job_id.clone(),
            origin: c.clone(),
            origin_job_id: None,
            target: None,
            remote_job_id: None,
            state: JobState::Held,
            exit_code: None,
            signal: None,
            cancel_requested: false,
            reason: format!("held at {c} until the stand-in starts (agent suggested {})", fwd.tentative_target),
            stdout_len: 0,
            stderr_len: 0,
            output_complete: false,
            node_list: String::new(),
            submitted_at: now,
            updated_at: now,
            summary: summary(&fwd.request),
            start_requested_at: None,
            requeues: 0,
            user: fwd.request.user_name.clone(),
            origin_restart: 0,
            stdout_base: 0,
            stderr_base: 0,
            epoch: 0,
            migrations: 0,
            requeue_notes: Vec::new(),
            time_limit_min: None,
        };
        let job = Job {
            record,
            request: fwd.request,
            tentative_target: fwd.tentative_target,
            submitted: false,
            final_stdout_len: None,
            final_stderr_len: None,
            remote_cancel_pending: false,
            running_since: None,
            output_purged_at: None,
            output_capped: None,
            left: Vec::new(),
            avoid: None,
            planned: None,
            prefer: None,
            last_move: None,
            lease_run_epoch: 0,
            leased_epoch: 0,
            assigned_at: None,
            sla_started: None,
            sla_missed: None,
            target_reruns: 0,
            end_claim: None,
            early: None,
            target_waits: None,
            signalled: None,
            before_rerun: None,
            held_by_limit: None,
            refused_at: Vec::new(),
        };
        let mut job = job;
        if fwd.early_start {
            self.place_early(&mut job, now);
        }
        self.save(&job)?;
        Ok(job.record)
    }

    /// Load a job that `caller` may read.
    pub fn get(&self, caller: &Caller, id: &str) -> Result<Job, StoreError> {
        let job = self.load(id)?;
        match caller {
            Caller::Admin => {}
            Caller::Job { id: jid, origin } if jid == id && *origin == job.record.origin => {}
            Caller::Job { .. } => return Err(StoreError::Unauthorized("job token does not match this job".into())),
            Caller::Cluster(c) if *c == job.record.origin || job.record.target.as_deref() == Some(c) => {}
            Caller::Cluster(c) => {
                return Err(StoreError::Forbidden(format!("cluster {c:?} is neither origin nor target of {id}")))
            }
            Caller::Checkpointer { .. } => {
                return Err(StoreError::Forbidden("a checkpoint token only reports checkpoints".into()))
            }
        }
        Ok(job)
    }

    pub fn explain(&self, caller: &Caller, id: &str, now: f64) -> Result<Explanation, StoreError> {
        let job = self.get(caller, id)?;
        let history = history_of(&job);
        // The view its placement sees: its submitter's GPU quotas applied.
        let full = self.view(now);
        let quota_notes: Vec<String> = full
            .clusters
            .iter()
            .filter_map(|c| {
                let q = placement::quota_of(c, &job.request)?;
                Some(format!(
                    "{}: {} binds this job's submitter: {} of {} GPUs left (its free GPUs there count at most that)",
                    c.name,
                    q.scope,
                    q.headroom(),
                    q.hard
                ))
            })
            .collect();
        let mut notes = quota_notes;
        notes.extend(job.refused_at.iter().map(|(c, why)| {
            format!("{c}: avoided while another cluster can take the job, as its limits there held it for good ({why})")
        }));
        let view = placement::within_quotas(full, &job.request);
        let (p, excluded) = placement::place(&view, &job.request);
        let (kind, target, why) = match p {
            Placement::Home { reason } => ("home", Some(job.record.origin.clone()), reason),
            Placement::Remote { target, reason } => ("remote", Some(target), reason),
            Placement::Impossible { reason } => ("impossible", None, reason),
        };
        let mut out = Explanation {
            fleet_job_id: job.record.fleet_job_id,
            state: Some(job.record.state),
            target: job.record.target,
            reason: job.record.reason,
            summary: job.record.summary,
            placement: kind.into(),
            placement_target: target,
            placement_reason: why,
            exclusions: excluded.into_iter().map(|e| ExclusionView { cluster: e.cluster, reason: e.reason }).collect(),
            policy: String::new(),
            ranked: Vec::new(),
            engine_exclusions: Vec::new(),
            notes,
            view_generated_at: view.generated_at,
        };
        if let Some(r) = &self.ranker {
            let (d, errs, penalties) = r.explain(&view, &job.request, &out.fleet_job_id, &history);
            out.policy = d.policy.clone();
            out.ranked = d
                .ranked
                .iter()
                .map(|c| {
                    let b = &c.breakdown;
                    RankedCandidate {
                        cluster: c.cluster.clone(),
                        pool: format!("{} ({})", c.pool, c.gpu_type),
                        pricing: c.pricing.as_str().to_string(),
                        fits_now: c.fits_now,
                        score: b.total,
                        terms: vec![
                            ("usd_per_gpu_h".into(), b.price_per_gpu_hour),
                            ("compute_usd".into(), b.compute_usd),
                            ("egress_usd".into(), b.egress_usd),
                            ("wait_h".into(), b.wait_h),
                            ("time_usd".into(), b.time_usd),
                            ("carbon_usd".into(), b.carbon_usd),
                            ("carbon_g_per_kwh".into(), b.carbon_g_per_kwh),
                            (
                                "sla_usd".into(),
                                penalties.iter().find(|(n, _)| *n == c.cluster).map_or(0.0, |(_, p)| *p),
                            ),
                        ],
                    }
                })
                .collect();
            out.engine_exclusions = d
                .excluded
                .iter()
                .map(|e| ExclusionView {
                    cluster: e.cluster.clone(),
                    reason: if self.clusters.contains_key(&e.cluster) {
                        e.reason.clone()
                    } else {
                        "in the fleet model only: not a cluster of this meta-scheduler".into()
                    },
                })
                .collect();
            out.notes.extend(d.notes.iter().cloned().chain(errs));
        }
        Ok(out)
    }

    /// Origin-side control (start, cancel): the job token, the origin agent, the admin.
    fn load_for_origin(&self, caller: &Caller, id: &str, what: &str) -> Result<Job, StoreError> {
        let job = self.get(caller, id)?;
        if let Caller::Cluster(c) = caller {
            if *c != job.record.origin {
                return Err(StoreError::Forbidden(format!("only the origin ({}) may {what} {id}", job.record.origin)));
            }
        }
        Ok(job)
    }

    /// `POST /v1/jobs/{id}/start`: the stand-in says it runs. A held job
    /// only records the request (the job's owner can read the job token,
    /// so the token alone must not release the job): it stays held until
    /// the origin agent confirms in Slurm that stand-in `origin_job_id`
    /// runs ([`Store::confirm_start`]). Returns the record and whether it
    /// is still held (HTTP 202) or past that (200). Idempotent; the first
    /// request stands until it is confirmed or refused.
    pub fn start(
        &mut self,
        caller: &Caller,
        id: &str,
        origin_job_id: u64,
        restart: u32,
        now: f64,
    ) -> Result<(JobRecord, bool), StoreError> {
        let mut job = self.load_for_origin(caller, id, "start")?;
        let life = life_of(&job);
        if life.start_requested && life.origin_job_id != Some(origin_job_id) {
            tracing::warn!(job = id, requested = ?life.origin_job_id, again = origin_job_id,
                "a second start request names another stand-in; the first stands until the origin agent answers it");
        }
        let o = transition(&life, &Event::RequestStart { origin_job_id, restart });
        if o.effects.contains(&Effect::WakeTarget) {
            // A rerun while the previous run still goes: cancel it there first.
            tracing::info!(
                job = id,
                stand_in = origin_job_id,
                restart,
                "the stand-in was requeued; cancelling the previous run before the job runs again"
            );
            set_life(&mut job, &o.life);
            job.record.updated_at = now;
            self.save(&job)?;
        }
        reply_result(id, &o.reply)?;
        if o.effects.contains(&Effect::Rerun) {
            // Kept until the origin agent confirms the requeue (see `before_rerun`).
            let mut before = job.clone();
            before.before_rerun = None;
            job.before_rerun = Some(Box::new(before));
            let r = &mut job.record;
            tracing::info!(job = id, stand_in = origin_job_id, restart, previous = %r.state,
                "the stand-in was requeued at its origin: the job runs again");
            r.target = None;
            r.remote_job_id = None;
            r.exit_code = None;
            r.signal = None;
            r.node_list.clear();
            r.output_complete = false;
            r.requeues += 1;
            r.stdout_base = r.stdout_len;
            r.stderr_base = r.stderr_len;
            job.final_stdout_len = None;
            job.final_stderr_len = None;
            job.running_since = None;
            job.remote_cancel_pending = false;
        }
        if o.effects.contains(&Effect::RecordStartRequest) {
            set_life(&mut job, &o.life);
            job.record.start_requested_at = Some(now);
            let note = format!(
                "held at {}: stand-in {origin_job_id} asked to start; waiting for the origin agent to confirm",
                job.record.origin
            );
            job.record.reason = after_target_wait(&job, note);
            job.record.updated_at = now;
            self.save(&job)?;
        }
        // Placed early, it is still held for the stand-in until confirmed.
        Ok((job.record, o.life.state == JobState::Held || o.life.early != Early::No))
    }

    /// `POST /v1/jobs/{id}/confirm_start`, by the origin cluster's agent
    /// only: the stand-in of the start request runs (place the job) or
    /// does not (drop the request; the job stays held).
    pub fn confirm_start(
        &mut self,
        caller: &Caller,
        id: &str,
        c: StartConfirmation,
        now: f64,
    ) -> Result<JobRecord, StoreError> {
        let mut job = self.load(id)?;
        match caller {
            Caller::Cluster(name) if *name == job.record.origin => {}
            _ => {
                return Err(StoreError::Forbidden(format!(
                    "only the origin cluster's agent ({}) confirms the start of {id}",
                    job.record.origin
                )))
            }
        }
        let o = transition(&life_of(&job), &Event::ConfirmStart { origin_job_id: c.origin_job_id, started: c.started });
        reply_result(id, &o.reply)?;
        if o.effects.is_empty() {
            return Ok(job.record); // a repeat, or nothing left to do
        }
        // `scontrol update TimeLimit=` of the stand-in while it was pending:
        // the job takes the stand-in's limit before it is placed. Slurm
        // lets a user lower a pending job's limit, and raise it up to the
        // partition's MaxTime, so both directions are the user's to make.
        // A stand-in has no limit of its own (`None`: nothing was changed;
        // the agent warns about a DefaultTime on the proxy partition).
        let changed = c.time_limit_min.is_some() && c.time_limit_min != job.request.time_limit_min;
        let early_at = job.early.as_ref().map(|e| e.placed_at);
        if o.effects.contains(&Effect::Place) && changed {
            tracing::info!(job = id, from = ?job.request.time_limit_min, to = ?c.time_limit_min,
                "the stand-in's time limit changed while it was pending; the job takes it");
            job.request.time_limit_min = c.time_limit_min;
            job.record.summary = summary(&job.request);
        }
        set_life(&mut job, &o.life);
        job.record.updated_at = now;
        if o.effects.contains(&Effect::DropStartRequest) {
            let why = printable(&c.reason, MAX_REASON);
            if let Some(before) = job.before_rerun.take() {
                // No requeue of the stand-in happened: the request changed nothing.
                tracing::warn!(job = id, stand_in = c.origin_job_id, reason = %why, state = %before.record.state,
                    "the origin agent refused a rerun; the job stays as it was");
                let mut before = *before;
                before.record.start_requested_at = None;
                before.record.updated_at = now;
                self.save(&before)?;
                return Ok(before.record);
            }
            tracing::warn!(job = id, stand_in = c.origin_job_id, reason = %why,
                "the origin agent refused a start request; the job stays held");
            job.record.start_requested_at = None;
            job.record.reason = format!(
                "held at {}: the origin agent refused the start of stand-in {} ({why})",
                job.record.origin, c.origin_job_id
            );
        }
        if o.effects.contains(&Effect::Place) || o.effects.contains(&Effect::OpenGate) {
            job.before_rerun = None;
        }
        if o.effects.contains(&Effect::Place) {
            self.assign(&mut job, now);
        }
        if o.effects.contains(&Effect::OpenGate) {
            // Its script starts now: the first-lease clock too.
            if job.running_since.is_some() {
                job.running_since = Some(now);
            }
            if let (true, Some(minutes)) = (changed, c.time_limit_min) {
                // The stand-in's limit changed while it was pending: an
                // assignment not yet taken carries it; a submitted run gets
                // it as a time-limit order (set there as at a running
                // stand-in's change).
                tracing::info!(job = id, from = ?job.request.time_limit_min, to = minutes,
                    "the stand-in's time limit changed while it was pending; the early run takes it");
                job.request.time_limit_min = Some(minutes);
                job.record.summary = summary(&job.request);
                if job.submitted {
                    // Its owner's own update (a pending job's limit), never
                    // set with the target agent's operator rights.
                    let target = job.record.target.clone().unwrap_or_default();
                    self.conn.execute(
                        "INSERT OR REPLACE INTO time_limit_orders (job_id, target, minutes, requested_at, operator_raise)
                         VALUES (?1, ?2, ?3, ?4, 0)",
                        params![id, target, minutes, now],
                    )?;
                }
            }
            let waited = early_at.map_or(0.0, |t| now - t);
            tracing::info!(job = id, stand_in = c.origin_job_id, target = ?job.record.target, waited_s = waited,
                "the origin confirmed the stand-in of a job placed early: its run starts");
            // Its run's lease request, held back while it waited, is answered now.
            if let Some(t) = &job.record.target {
                self.wakers.wake(t);
            }
            let confirmed = format!(
                "placed early at {}; the origin confirmed stand-in {}",
                job.record.target.as_deref().unwrap_or("?"),
                c.origin_job_id
            );
            // A reason its target reported while the run waited (a pod
            // the scheduler cannot place, ...) still holds: it stays,
            // ahead of the confirmation; the placement's own gives way.
            job.record.reason = after_target_wait(&job, confirmed);
        }
        self.save(&job)?;
        Ok(job.record)
    }

    /// Place a `Queued` job on the current view. A job whose run died on a
    /// cluster avoids it while another can take the job.
    fn assign(&self, job: &mut Job, now: f64) {
        self.place_job(job, now, false);
    }

    /// [`Store::assign`] on a copy that may be thrown away (early
    /// placement's trial): the same decision, silent — no placement metric,
    /// no "placed" log line; whoever keeps the result says so.
    pub(super) fn trial_assign(&self, job: &mut Job, now: f64) {
        self.place_job(job, now, true);
    }

    fn place_job(&self, job: &mut Job, now: f64, trial: bool) {
        let count = |outcome: &str| {
            if !trial {
                self.metrics.placement(outcome);
            }
        };
        // What the job may take: its submitter's GPU quota at a cluster
        // bounds the GPUs free there for it (the engine's view too).
        let mut view = placement::within_quotas(self.view(now), &job.request);
        // Avoided while another cluster can take the job: those whose
        // limits held it for good and the one its last run died on, else
        // the first alone.
        let refused: Vec<&str> = job.refused_at.iter().map(|(c, _)| c.as_str()).collect();
        let mut both = refused.clone();
        both.extend(job.avoid.as_deref());
        for names in [both, refused] {
            if names.is_empty() {
                continue;
            }
            let without = without_clusters(&view, &names);
            if !matches!(placement::place(&without, &job.request).0, Placement::Impossible { .. }) {
                view = without;
                break;
            }
        }
        // Without the engine (which scores them down), SLA-degraded
        // clusters are avoided while another can take the job.
        let slow = Self::sla_degraded(&view);
        if self.ranker.is_none() && !slow.is_empty() {
            let mut without = view.clone();
            without.clusters.iter_mut().filter(|c| slow.contains(&c.name)).for_each(|c| c.healthy = false);
            if !matches!(placement::place(&without, &job.request).0, Placement::Impossible { .. }) {
                view = without;
            }
        }
        let (mut p, excluded) = placement::place(&view, &job.request);
        let previous = job.record.reason.clone();
        // A planned move's target first, when the first rule lets it take the job now.
        let preferred =
            job.prefer.take().and_then(|want| moves::place_at(&view, &job.request, &job.record.origin, &want));
        // The engine excludes every cluster the first rule allows, for a job
        // that must leave its origin: its reasons, and whether they last.
        let mut engine_refuses = None;
        if let Some(pp) = preferred {
            p = pp;
        } else if let (Some(r), Placement::Home { .. } | Placement::Remote { .. }) = (&self.ranker, &p) {
            // The engine ranks the clusters the first rule allows.
            let allowed: Vec<String> = view
                .clusters
                .iter()
                .filter(|c| c.healthy && !excluded.iter().any(|e| e.cluster == c.name))
                .map(|c| c.name.clone())
                .collect();
            match r.pick(&view, &job.request, &job.record.fleet_job_id, &history_of(job), &allowed) {
                crate::ranking::Choice::Pick(pick) => {
                    p = if pick.cluster == job.record.origin {
                        Placement::Home { reason: pick.reason }
                    } else {
                        Placement::Remote { target: pick.cluster, reason: pick.reason }
                    };
                }
                crate::ranking::Choice::FirstRule => {}
                // A job its origin can run stays there, as without Fleet;
                // one that must leave never goes where the engine's hard
                // constraints (topology, --min-gpu) say it cannot run.
                crate::ranking::Choice::Excluded { .. } if matches!(p, Placement::Home { .. }) => {}
                crate::ranking::Choice::Excluded { reason, lasting } => engine_refuses = Some((reason, lasting)),
            }
        }
        let event = match (engine_refuses, p) {
            (Some((why, true)), _) => {
                count("impossible");
                job.record.target = None;
                job.record.reason = format!("no cluster in the fleet can run it (placement engine): {why}");
                Event::PlacementImpossible
            }
            (Some((why, false)), _) => {
                count("waiting");
                job.record.target = None;
                job.record.reason = format!("waiting: the placement engine excludes every cluster for now: {why}");
                Event::PlacementWaits
            }
            (None, p) => match p {
                Placement::Home { reason } => {
                    count("home");
                    job.record.target = Some(job.record.origin.clone());
                    job.record.reason = format!("placed at the origin {}: {reason}", job.record.origin);
                    Event::Placed
                }
                Placement::Remote { target, reason } => {
                    count("remote");
                    job.record.reason = format!("placed at {target}: {reason}");
                    job.record.target = Some(target);
                    Event::Placed
                }
                Placement::Impossible { reason } => {
                    job.record.target = None;
                    // Impossible only because clusters are silent right now?
                    // Then wait for them rather than fail the job.
                    if matches!(
                        placement::place(&placement::all_healthy(&view), &job.request).0,
                        Placement::Impossible { .. }
                    ) {
                        count("impossible");
                        job.record.reason = reason;
                        Event::PlacementImpossible
                    } else {
                        count("waiting");
                        job.record.reason = format!("waiting for a healthy cluster: {reason}");
                        Event::PlacementWaits
                    }
                }
            },
        };
        let o = transition(&life_of(job), &event);
        set_life(job, &o.life);
        refresh_complete(job);
        if o.effects.contains(&Effect::NewEpoch) {
            job.avoid = None;
            job.assigned_at = Some(now);
            if !trial {
                tracing::info!(job = %job.record.fleet_job_id, epoch = job.record.epoch, target = ?job.record.target,
                    "placed (new epoch)");
            }
        }
        if previous.starts_with("re-placing") || previous.starts_with("moved off") {
            job.record.reason = format!("{previous}; {}", job.record.reason);
        }
        job.record.updated_at = now;
    }

    /// Periodic work: place waiting jobs, re-place jobs whose target went
    /// silent before submitting them.
    pub fn sweep(&mut self, now: f64) -> Result<(), StoreError> {
        self.note_deafness(now);
        self.advance_moves(now)?;
        self.check_sla(now)?;
        self.check_stranded(now)?;
        self.early_timeouts(now)?;
        let jobs = self.query("SELECT data FROM jobs WHERE state IN ('queued', 'assigned')", [])?;
        for mut job in jobs {
            let before = (job.record.state, job.record.target.clone());
            match job.record.state {
                JobState::Queued => self.assign(&mut job, now),
                JobState::Assigned if !job.submitted => {
                    let target = job.record.target.clone().unwrap_or_default();
                    if self.healthy(&target, now) || ends::claimed(&job) {
                        // A run that said it ended was submitted there:
                        // the silent-cluster path below decides.
                        continue;
                    }
                    let o = transition(&life_of(&job), &Event::TargetLost);
                    if !o.effects.contains(&Effect::Place) {
                        continue;
                    }
                    self.metrics.placement("re-place");
                    job.record.reason = format!("re-placing: {target} became unhealthy before submitting it");
                    set_life(&mut job, &o.life);
                    job.record.target = None;
                    self.assign(&mut job, now);
                }
                _ => continue,
            }
            if before != (job.record.state, job.record.target.clone()) {
                tracing::info!(job = %job.record.fleet_job_id, state = %job.record.state,
                    target = ?job.record.target, reason = %job.record.reason, "placement changed");
                self.save(&job)?;
            }
        }
        self.lost_launches(now)?;
        // Clusters silent past their grace period: their jobs move.
        let gone: Vec<(String, f64)> = self
            .order
            .iter()
            .map(|c| (c.clone(), self.silent_for(c, now)))
            .filter(|(c, silent)| *silent > self.move_after(c))
            .collect();
        for (cluster, silent) in gone {
            let sql = "SELECT data FROM jobs WHERE target = ?1 AND active = 1
                       AND state IN ('assigned', 'pending', 'running') ORDER BY submitted_at, id";
            for mut job in self.query(sql, [&cluster])? {
                if job.record.state == JobState::Assigned && !job.submitted && !ends::claimed(&job) {
                    continue; // the first loop re-places those
                }
                let why = format!("{cluster} has sent no heartbeat for {silent:.0} s (past its grace period)");
                let past = silent - self.move_after(&cluster);
                self.silent_past_grace(&mut job, &why, past, now)?;
            }
        }
        Ok(())
    }

    /// Whether `job`'s current run is under its in-job lease and has not
    /// asked for it yet (a candidate for [`lifecycle::launch_lost`]).
    fn awaits_lease(job: &Job) -> bool {
        job.record.state == JobState::Running
            && job.lease_run_epoch == job.record.epoch
            && job.leased_epoch != job.record.epoch
    }

    /// Runs that report running under their in-job lease but never asked
    /// for it within `[health] first_lease_s`: their script never started
    /// (Slurm lost the launch and keeps the job RUNNING with no process).
    /// They died: the ordinary dead-run path (moved when resumable, failed
    /// with the reason otherwise).
    fn lost_launches(&mut self, now: f64) -> Result<(), StoreError> {
        let limit = self.health.first_lease_s;
        for id in self.awaiting_lease.clone() {
            let Ok(mut job) = self.load(&id) else {
                self.awaiting_lease.remove(&id);
                continue;
            };
            if !Self::awaits_lease(&job) {
                self.awaiting_lease.remove(&id);
                continue;
            }
            let f = lifecycle::FirstLease {
                under_lease: true,
                asked: false,
                running_for_s: job.running_since.map(|t| self.listened(t, now)),
            };
            if !lifecycle::launch_lost(&life_of(&job), f, limit) {
                continue;
            }
            self.awaiting_lease.remove(&id);
            let target = job.record.target.clone().unwrap_or_default();
            let why = format!(
                "{target} has reported it running for {:.0} s, but its script never asked for its job lease: it never started there (a launch the cluster lost; [health] first_lease_s = {limit})",
                f.running_for_s.unwrap_or(0.0)
            );
            let epoch = Some(job.record.epoch);
            // Its script never asked for its lease: it never started.
            self.died(&mut job, &why, epoch, true, now)?;
        }
        Ok(())
    }

    /// Can `job` run again from the start? When it tolerates being stopped:
    /// `--fleet-interruptible` or `#FLEET interruptible` (Slurm's own
    /// `--requeue` is not carried in the request yet).
    fn restartable(job: &Job) -> bool {
        job.request.fleet.interruptible
            || job
                .request
                .script
                .as_deref()
                .is_some_and(|s| fleet_engine::job::Directives::parse_bytes(s).0.interruptible.unwrap_or(false))
    }

    /// The run of `job` at its target is dead (`why`): move the job (a new
    /// placement resumes it from its newest valid checkpoint, or restarts
    /// it when it may), or fail it with the reason. `epoch`: the report's,
    /// when the target said so itself. `nothing_ran`: the run's script
    /// never started (a launch Slurm or the cluster lost), so a new
    /// placement runs nothing twice and the job restarts whatever its
    /// restart policy. Saves the job.
    fn died(
        &mut self,
        job: &mut Job,
        why: &str,
        epoch: Option<u64>,
        nothing_ran: bool,
        now: f64,
    ) -> Result<Reply, StoreError> {
        let rerun = if nothing_ran { Rerun::NothingRan } else { Rerun::No };
        self.died_rerun(job, why, epoch, rerun, now)
    }

    /// [`Store::died`], with why the job may run again whatever its restart
    /// policy: its script never started, or Slurm at the target requeued
    /// the run after it started (a re-run Slurm made: counted in `requeues`).
    fn died_rerun(
        &mut self,
        job: &mut Job,
        why: &str,
        epoch: Option<u64>,
        rerun: Rerun,
        now: f64,
    ) -> Result<Reply, StoreError> {
        let nothing_ran = rerun == Rerun::NothingRan;
        let id = job.record.fleet_job_id.clone();
        let checkpoint = self.latest_valid_checkpoint(&id)?;
        let may_restart = Self::restartable(job) || rerun != Rerun::No;
        let capped = job.record.migrations >= self.health.max_migrations;
        let resumable = (checkpoint.is_some() || may_restart) && !capped;
        let o = transition(&life_of(job), &Event::Died { resumable, epoch });
        if o.life == life_of(job) {
            return Ok(o.reply);
        }
        if o.effects.contains(&Effect::EarlyFallback) {
            self.early_fallback(job, &o.life, &format!("its run died before it started: {why}"), now);
            self.save(job)?;
            return Ok(o.reply);
        }
        let from = job.record.target.clone().unwrap_or_default();
        let old_epoch = job.record.epoch;
        self.lease_until.remove(&id);
        self.lease_prev_until.remove(&id);
        self.awaiting_lease.remove(&id);
        set_life(job, &o.life);
        job.left.push((old_epoch, from.clone()));
        job.record.remote_job_id = None;
        job.record.node_list.clear();
        job.running_since = None;
        job.record.updated_at = now;
        let (note, reason) = if o.effects.contains(&Effect::Migrate) {
            job.record.migrations += 1;
            job.record.target = None;
            job.record.exit_code = None;
            job.record.signal = None;
            job.avoid = Some(from.clone());
            let how = match &checkpoint {
                Some(c) => format!("resuming from checkpoint {} ({})", c.seq, c.url),
                None if nothing_ran && !Self::restartable(job) => {
                    "starting it again (its script never started there; no valid checkpoint)".into()
                }
                None if rerun == Rerun::SlurmRequeued && !Self::restartable(job) => {
                    format!("running it again from the start, as Slurm at {from} requeued it (no valid checkpoint)")
                }
                None => "restarting from the start (no valid checkpoint; the job is interruptible)".into(),
            };
            self.metrics.placement("migrate");
            (
                format!("fleet: run {old_epoch} of job {id} at {from} died ({why}); moving it elsewhere, {how}"),
                format!("moved off {from} (epoch {old_epoch}): {why}; {how}"),
            )
        } else if o.effects.contains(&Effect::FailUnresumable) {
            let cause = if capped {
                format!("it was already moved {} times ([health] max_migrations)", job.record.migrations)
            } else {
                "it has no valid checkpoint and is not restartable (--fleet-interruptible or #FLEET interruptible)"
                    .to_string()
            };
            let text = format!("its run at {from} died ({why}) and {cause}");
            (format!("fleet: job {id} failed: {text}"), format!("failed: {text}"))
        } else {
            (
                format!("fleet: job {id} was being cancelled when its run at {from} died ({why})"),
                format!("cancelled; its run at {from} died ({why})"),
            )
        };
        if rerun == Rerun::SlurmRequeued && o.effects.contains(&Effect::Migrate) {
            // A re-run Slurm made (its script had run there): a requeue.
            job.record.requeues = job.record.requeues.saturating_add(1);
            let line = format!("Slurm at {from} requeued run {old_epoch} after it started (at {now:.0}): {why}");
            note_requeue(&mut job.record, line);
        }
        tracing::warn!(job = %id, from = %from, epoch = old_epoch, "{reason}");
        self.note_stderr(job, &note)?;
        job.record.reason = reason;
        // The next run's output continues the streams after the note.
        job.record.stdout_base = job.record.stdout_len;
        job.record.stderr_base = job.record.stderr_len;
        job.final_stdout_len = None;
        job.final_stderr_len = None;
        if job.record.state.is_terminal() {
            job.final_stdout_len = Some(job.record.stdout_len);
            job.final_stderr_len = Some(job.record.stderr_len);
        }
        if o.effects.contains(&Effect::Place) {
            self.assign(job, now);
        }
        refresh_complete(job);
        self.save(job)?;
        Ok(o.reply)
    }

    /// One line on the job's stderr stream, relayed by its stand-in like
    /// the job's own output (the documented migration note).
    fn note_stderr(&self, job: &mut Job, line: &str) -> Result<(), StoreError> {
        let id = &job.record.fleet_job_id;
        let clean: String = line.chars().filter(|c| !c.is_control()).collect();
        let mut f = OpenOptions::new().create(true).append(true).mode(0o600).open(self.out_path(id, Stream::Stderr))?;
        f.write_all(format!("{clean}\n").as_bytes())?;
        job.record.stderr_len = self.file_len(id, Stream::Stderr)?;
        Ok(())
    }

    /// Delete the output of jobs that finished more than `retention_s` ago;
    /// returns how many jobs' output went. Their records stay.
    pub fn purge_output(&mut self, now: f64, retention_s: f64) -> Result<usize, StoreError> {
        let cutoff = now - retention_s;
        let sql = "SELECT data FROM jobs WHERE active = 0 AND submitted_at < ?1
                   AND json_extract(data, '$.output_purged_at') IS NULL";
        let mut purged = 0;
        for mut job in self.query(sql, [cutoff])? {
            if job.record.updated_at >= cutoff {
                continue;
            }
            for s in [Stream::Stdout, Stream::Stderr] {
                match std::fs::remove_file(self.out_path(&job.record.fleet_job_id, s)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
            }
            job.output_purged_at = Some(now);
            self.save(&job)?;
            purged += 1;
        }
        Ok(purged)
    }

    pub fn cancel(&mut self, caller: &Caller, id: &str, now: f64) -> Result<JobRecord, StoreError> {
        let mut job = self.load_for_origin(caller, id, "cancel")?;
        let before = life_of(&job);
        let o = transition(&before, &Event::Cancel);
        reply_result(id, &o.reply)?;
        if o.life == before {
            return Ok(job.record);
        }
        set_life(&mut job, &o.life);
        job.record.updated_at = now;
        if o.life.state == JobState::Cancelled {
            job.record.reason = "cancelled before it was submitted anywhere".into();
            refresh_complete(&mut job);
        }
        self.save(&job)?;
        Ok(job.record)
    }

    /// `POST /v1/jobs/{id}/signal` (the job token, the origin agent, the
    /// admin): queue `req.signal` for the agent of the cluster where the
    /// job is pending or running, and wake its long-poll. The job's record
    /// does not change (the job keeps the epoch signalled, `Job::signalled`).
    /// A job that no cluster runs yet is a conflict, a finished one a
    /// `terminal` conflict; an unknown signal name a bad request. The same signal and scope queued again before the agent
    /// took it is one order (Unix does not queue a pending signal either).
    pub fn signal(
        &mut self,
        caller: &Caller,
        id: &str,
        req: &SignalRequest,
        now: f64,
    ) -> Result<JobRecord, StoreError> {
        let job = self.load_for_origin(caller, id, "signal")?;
        let name = fleet_api::api::check_signal_name(&req.signal).map_err(StoreError::BadRequest)?;
        let o = transition(&life_of(&job), &Event::Signal);
        reply_result(id, &o.reply)?;
        let target = job.record.target.clone().unwrap_or_default();
        if o.effects.contains(&Effect::QueueSignal) {
            // For the run it was sent to: an order still waiting when the job
            // runs again (a new epoch, even at the same cluster) is not that
            // run's. Sent again before delivery: one order, for the newest run.
            self.conn.execute(
                "INSERT INTO signal_orders (job_id, target, signal, scope, requested_at, epoch)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (job_id, signal, scope) DO UPDATE SET target = excluded.target, epoch = excluded.epoch",
                params![id, target, name, req.scope.as_str(), now, job.record.epoch],
            )?;
            tracing::info!(job = id, signal = name, scope = req.scope.as_str(), target = %target, by = ?caller,
                "signal queued for the target agent");
            if job.signalled != Some(job.record.epoch) {
                let mut job = job.clone();
                job.signalled = Some(job.record.epoch);
                self.save(&job)?;
            }
        }
        if o.effects.contains(&Effect::WakeTarget) {
            self.wakers.wake(&target);
        }
        Ok(job.record)
    }

    /// `POST /v1/jobs/{id}/time_limit` (the origin agent, the admin): queue
    /// the stand-in's new time limit for the agent of the cluster where the
    /// job is pending or running, as a signal is queued (same states, same
    /// conflicts); a later limit replaces one not yet handed out.
    pub fn time_limit(
        &mut self,
        caller: &Caller,
        id: &str,
        req: &TimeLimitRequest,
        now: f64,
    ) -> Result<JobRecord, StoreError> {
        if matches!(caller, Caller::Job { .. }) {
            return Err(StoreError::Forbidden("only the origin agent or the admin sets a job's time limit".into()));
        }
        if !(1..=fleet_api::api::MAX_TIME_LIMIT_MIN).contains(&req.minutes) {
            return Err(StoreError::BadRequest(format!(
                "time limit {} min: expected 1 to {}",
                req.minutes,
                fleet_api::api::MAX_TIME_LIMIT_MIN
            )));
        }
        let job = self.load_for_origin(caller, id, "time_limit")?;
        let o = transition(&life_of(&job), &Event::Signal);
        reply_result(id, &o.reply)?;
        let target = job.record.target.clone().unwrap_or_default();
        if o.effects.contains(&Effect::QueueSignal) {
            self.conn.execute(
                "INSERT OR REPLACE INTO time_limit_orders (job_id, target, minutes, requested_at, operator_raise)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, target, req.minutes, now, req.raise],
            )?;
            tracing::info!(job = id, minutes = req.minutes, raise = req.raise, target = %target, by = ?caller,
                "time limit queued for the target agent");
        }
        if o.effects.contains(&Effect::WakeTarget) {
            self.wakers.wake(&target);
        }
        Ok(job.record)
    }

    /// Take the time limits waiting for cluster `c` (deleted as handed
    /// out); those of jobs since finished or gone from `c` are dropped.
    fn take_time_limit_orders(&mut self, c: &str) -> Result<Vec<TimeLimitOrder>, StoreError> {
        let taken: Vec<(String, u32, bool)> = {
            let mut stmt = self.conn.prepare_cached(
                "DELETE FROM time_limit_orders WHERE target = ?1 RETURNING job_id, minutes, operator_raise",
            )?;
            let rows = stmt.query_map([c], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut orders = Vec::new();
        for (job_id, minutes, raise) in taken {
            let live = self.query("SELECT data FROM jobs WHERE id = ?1", [&job_id])?.pop().is_some_and(|j| {
                j.record.target.as_deref() == Some(c)
                    && matches!(j.record.state, JobState::Assigned | JobState::Pending | JobState::Running)
            });
            if live {
                orders.push(TimeLimitOrder { fleet_job_id: job_id, minutes, raise });
            }
        }
        Ok(orders)
    }

    /// Take the signal orders waiting for cluster `c` (deleted as they are
    /// handed out), oldest first. Orders whose job has since finished or
    /// left `c` are dropped.
    fn take_signal_orders(&mut self, c: &str) -> Result<Vec<SignalOrder>, StoreError> {
        type Taken = (i64, String, String, String, Option<u64>);
        let mut taken: Vec<Taken> = {
            let mut stmt = self.conn.prepare_cached(
                "DELETE FROM signal_orders WHERE target = ?1 RETURNING seq, job_id, signal, scope, epoch",
            )?;
            let rows = stmt.query_map([c], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        taken.sort_by_key(|t| t.0);
        let mut orders = Vec::new();
        for (_, job_id, signal, scope, epoch) in taken {
            let Ok(scope) = scope.parse::<SignalScope>() else { continue };
            let live = self.query("SELECT data FROM jobs WHERE id = ?1", [&job_id])?.pop().is_some_and(|j| {
                j.record.target.as_deref() == Some(c)
                    && matches!(j.record.state, JobState::Assigned | JobState::Pending | JobState::Running)
                    && epoch.is_none_or(|e| e == j.record.epoch)
            });
            if live {
                orders.push(SignalOrder { fleet_job_id: job_id, signal, scope });
            } else {
                tracing::info!(job = %job_id, signal = %signal, "signal dropped: the run it was sent to no longer runs at {c}");
            }
        }
        Ok(orders)
    }

    fn load_for_target(&self, caller: &Caller, id: &str) -> Result<Job, StoreError> {
        let job = self.load(id)?;
        match caller {
            Caller::Cluster(c) if job.record.target.as_deref() == Some(c.as_str()) => Ok(job),
            // A cluster the job was moved off: its copy is stale, and a
            // `terminal` conflict makes its agent stop it.
            Caller::Cluster(c) if job.left.iter().any(|(_, l)| l == c) => {
                let epochs: Vec<String> = job.left.iter().filter(|(_, l)| l == c).map(|(e, _)| e.to_string()).collect();
                Err(terminal_conflict(format!(
                    "job {id}: epoch {} at {c} is stale: the job is now epoch {} ({}{}); stop this copy",
                    epochs.join(", "),
                    job.record.epoch,
                    job.record.state,
                    job.record.target.as_deref().map(|t| format!(" at {t}")).unwrap_or_default()
                )))
            }
            Caller::Cluster(c) => Err(StoreError::Forbidden(format!(
                "cluster {c:?} is not the target of {id} (target: {})",
                job.record.target.as_deref().unwrap_or("none")
            ))),
            _ => Err(StoreError::Forbidden("only the target cluster's agent reports on a job".into())),
        }
    }

    /// `POST /v1/jobs/{id}/status` from the job's target agent.
    ///
    /// * Forward moves, repeats, and running → pending (a Slurm requeue at
    ///   the target, counted in `requeues`) apply.
    /// * Once the job is terminal here, a terminal update is answered with
    ///   the stored record unchanged (a disagreeing one is logged) and a
    ///   non-terminal one is a conflict marked `terminal`: the agent stops
    ///   reporting on the job, nothing wedges.
    /// * Once the record has a `remote_job_id`, an update naming another
    ///   one is a conflict: it is about some other Slurm job.
    pub fn status(
        &mut self,
        caller: &Caller,
        id: &str,
        mut upd: StatusUpdate,
        now: f64,
    ) -> Result<JobRecord, StoreError> {
        let mut job = self.load_for_target(caller, id)?;
        if upd.died.is_some() && upd.lease_stopped {
            // The watchdog's note lies in the run's directory, which the
            // job may write: a run its lease stopped had no grant covering
            // it (its watchdog counts each grant from before it was sent).
            // The reply to its last renewal may have been lost (answered
            // after the watchdog gave up, on a loaded host): the lease it
            // held before that renewal is what the claim is checked against.
            let epoch = upd.epoch.unwrap_or(job.record.epoch);
            let held = self.lease_prev_until.get(id).or_else(|| self.lease_until.get(id)).copied();
            if let Some((e, until)) = held {
                if e == epoch && until > now + LEASE_CLAIM_SLACK_S {
                    tracing::warn!(job = id, epoch, covered_for_s = until - now,
                        "a run claims its job lease stopped it, but a lease granted to it still covers it: taken as its own end");
                    upd.died = None;
                    upd.lease_stopped = false;
                    upd.reason = format!(
                        "{} at {} (it claimed its job lease stopped it, but its lease still held for {:.0} s)",
                        upd.state.unwrap_or(JobState::Failed),
                        job.record.target.as_deref().unwrap_or("?"),
                        until - now
                    );
                }
            }
        }
        if let (None, Some(JobState::Completed), Some(k)) =
            (&upd.died, upd.state, ends::killed_success(&job, upd.epoch))
        {
            // Its script exited 0 only once a kill of its whole step
            // began, which no one here asked for, and its target calls that
            // a completion (Kubernetes, for a pod that caught an eviction's
            // SIGTERM, when the agent did not see the eviction): the run
            // was taken away with its node, not done.
            tracing::warn!(job = id, epoch = ?upd.epoch, signal = k,
                "its target reports it completed, but its script ended only once a kill of its whole step began: taken as a run that died with its node");
            upd.died = Some(format!(
                "it reports the run completed, but its script exited 0 only once a kill of its whole step by signal {k} \
                 began, which no user asked for (its node or pod was taken away)"
            ));
            upd.disrupted = true;
        }
        if upd.died.is_some() && upd.slurm_requeued && ends::claimed_signal(&job, upd.epoch) {
            // Slurm at the target requeued the run and killed what ran of
            // it (the signal its script claimed as its end, which no user
            // sent, says its agent): it runs again, as under native Slurm.
            tracing::info!(job = id, epoch = ?upd.epoch, "its script claimed an end by a signal, sent by Slurm as it requeued the run: not its own end");
        } else if let (true, Some(minutes)) = (
            upd.died.is_some() && upd.disrupted && ends::claimed_signal(&job, upd.epoch),
            ends::timed_out(&job, upd.epoch),
        ) {
            // The kill its script ended after was Slurm's at its time
            // limit (the controller lost it, or the agent did not see it):
            // the job timed out, as Slurm would have said.
            let why: String = upd.died.take().unwrap_or_default().chars().filter(|c| !c.is_control()).collect();
            let at = job.record.target.clone().unwrap_or_default();
            let claim = job.end_claim.clone();
            let how = claim.as_ref().map(|c| c.describe()).unwrap_or_default();
            tracing::warn!(job = id, at = %at, end = %how, minutes,
                "the target reports its run died, but its script ended after the kill at its time limit: timed out ({why})");
            upd.disrupted = false;
            upd.state = Some(JobState::Failed);
            upd.exit_code = claim.as_ref().and_then(|c| c.exit_code);
            upd.signal = claim.as_ref().and_then(|c| c.signal);
            upd.reason =
                format!("TIMEOUT at {at}: its script ended ({how}) at its time limit of {minutes} min; then {why}")
                    .chars()
                    .take(MAX_REASON)
                    .collect();
        } else if upd.died.is_some() && upd.disrupted && ends::claimed_signal(&job, upd.epoch) {
            // The run died with its node (a drain's eviction, a
            // preemption), which stopped the script with a signal no user
            // sent before the agent's report: that kill, not its own end.
            tracing::info!(job = id, epoch = ?upd.epoch, "its script claimed an end by a signal, sent as its node was taken away: not its own end");
        } else if upd.died.is_some() && !upd.lease_stopped {
            if let Some((state, how)) = ends::claimed_end(&job, upd.epoch) {
                // Its script said it ended, in this epoch, before what the
                // target reports (Slurm held the job after a launch it took
                // for failed, a node failed in its epilog): the script's
                // own end is the run's result, and nothing runs again.
                let why: String = upd.died.take().unwrap_or_default().chars().filter(|c| !c.is_control()).collect();
                let at = job.record.target.clone().unwrap_or_default();
                tracing::warn!(job = id, at = %at, end = %how, "the target reports its run died, but its script claimed its end first: ended as claimed ({why})");
                let claim = job.end_claim.clone();
                upd.never_started = false;
                upd.slurm_requeued = false;
                upd.state = Some(state);
                upd.exit_code = claim.as_ref().and_then(|c| c.exit_code);
                upd.signal = claim.as_ref().and_then(|c| c.signal);
                upd.reason = format!("{state} at {at} ({how}), as its script claimed; then {why}")
                    .chars()
                    .take(MAX_REASON)
                    .collect();
            }
        }
        let cur = job.record.state;
        if let (Some(have), Some(got)) = (job.record.remote_job_id, upd.remote_job_id) {
            if have != got
                && upd.state.is_none_or(|s| !matches!(s, JobState::Held | JobState::Queued | JobState::Assigned))
            {
                return Err(conflict(format!(
                    "job {id} is remote job {have} at {}; an update for remote job {got} does not apply",
                    job.record.target.as_deref().unwrap_or("?")
                )));
            }
        }
        if let Some(why) = &upd.died {
            let why = printable(why, MAX_REASON);
            let target = job.record.target.clone().unwrap_or_default();
            let epoch = upd.epoch.or(Some(job.record.epoch));
            // Nothing of it started, says its agent; a run that asked for
            // its job lease in this epoch did start, whatever it says.
            let nothing_ran = upd.never_started && epoch.is_none_or(|e| job.leased_epoch != e);
            if upd.never_started && !nothing_ran {
                tracing::warn!(job = id, epoch = ?epoch, "its target says its run never started, but the run asked for its job lease: taken as started");
            }
            let rerun = if nothing_ran {
                Rerun::NothingRan
            } else if upd.slurm_requeued {
                Rerun::SlurmRequeued
            } else {
                Rerun::No
            };
            let reply = self.died_rerun(&mut job, &format!("{target} reports: {why}"), epoch, rerun, now)?;
            reply_result(id, &reply)?;
            return Ok(job.record);
        }
        let before = life_of(&job);
        let planned = job.planned.clone();
        let o = transition(
            &before,
            &Event::Report { state: upd.state, remote_job_id: upd.remote_job_id, epoch: upd.epoch },
        );
        if o.effects.contains(&Effect::EarlyFallback) {
            let why = match upd.state {
                Some(s) if !upd.reason.is_empty() => {
                    let r = printable(&upd.reason, MAX_REASON);
                    format!("it ended {s} before it started: {r}")
                }
                Some(s) => format!("it ended {s} before it started"),
                None => "it ended before it started".into(),
            };
            self.early_fallback(&mut job, &o.life, &why, now);
            self.save(&job)?;
            reply_result(id, &o.reply)?;
            return Ok(job.record);
        }
        let changed = o.life != before;
        set_life(&mut job, &o.life);
        for effect in &o.effects {
            match effect {
                Effect::TakeReport => {
                    // What reaches squeue at the origin and fleetctl: no
                    // control characters (terminal escapes), bounded.
                    let reason = printable(&upd.reason, MAX_REASON);
                    let node_list = printable(&upd.node_list, MAX_NODE_LIST);
                    if let Some(rid) = upd.remote_job_id {
                        job.record.remote_job_id = Some(rid);
                    }
                    if !node_list.is_empty() {
                        job.record.node_list = node_list;
                    }
                    if upd.time_limit_min.is_some() {
                        // The run's limit there now (its stand-in's proxy
                        // mails the job's TIME_LIMIT_* shares of it).
                        job.record.time_limit_min = upd.time_limit_min;
                    }
                    match upd.state {
                        Some(JobState::Pending) if !reason.is_empty() && reason != "None" => {
                            job.target_waits = Some((job.record.epoch, reason.clone()));
                        }
                        Some(JobState::Pending) | None => {}
                        Some(_) => {
                            // It no longer waits there: the reason stops saying so.
                            if let Some((_, why)) = job.target_waits.take() {
                                if let Some(rest) = job.record.reason.strip_prefix(why.as_str()) {
                                    job.record.reason = rest.trim_start_matches("; ").to_string();
                                }
                            }
                        }
                    }
                    // Held there by a limit that never clears: placed
                    // elsewhere after `[health] stranded_s` from the first
                    // such report of the epoch (`check_stranded`).
                    match (upd.state, &upd.held_by_limit) {
                        (Some(JobState::Pending), Some(why)) => {
                            let epoch = job.record.epoch;
                            if self.held_since.get(id).is_none_or(|(e, _)| *e != epoch) {
                                self.held_since.insert(id.to_string(), (epoch, Some(now)));
                            }
                            job.held_by_limit = Some((epoch, printable(why, MAX_REASON)));
                        }
                        (None, _) => {}
                        _ => {
                            job.held_by_limit = None;
                            self.held_since.remove(id);
                        }
                    }
                    if !reason.is_empty() {
                        job.record.reason = reason;
                    } else if let Some(new) = upd.state.filter(|n| n.is_terminal()) {
                        // The placement reason no longer says why the job is where it is.
                        let how = match (upd.signal.filter(|s| *s > 0), upd.exit_code) {
                            (Some(s), _) => format!(" (signal {s})"),
                            (None, Some(c)) => format!(" (exit code {c})"),
                            (None, None) => String::new(),
                        };
                        job.record.reason = format!("{new} at {}{how}", job.record.target.as_deref().unwrap_or("?"));
                    }
                }
                Effect::Requeue => {
                    job.record.requeues = job.record.requeues.saturating_add(1);
                    job.running_since = None;
                    // A new launch: it asks for its lease again, and an
                    // end its previous launch claimed is over.
                    job.leased_epoch = 0;
                    job.end_claim = None;
                    tracing::info!(job = id, requeues = job.record.requeues, "requeued at the target");
                    let at = job.record.target.clone().unwrap_or_else(|| "?".into());
                    let how = match upd.rerun_why.as_str() {
                        "" => "it went back to pending after it ran".to_string(),
                        why => printable(why, MAX_REASON),
                    };
                    let line = format!("Slurm at {at} re-ran it (epoch {}, at {now:.0}): {how}", job.record.epoch);
                    note_requeue(&mut job.record, line);
                }
                Effect::MarkRunning => {
                    job.running_since.get_or_insert(now);
                    if upd.job_lease && upd.epoch.is_none_or(|e| e == job.record.epoch) {
                        job.lease_run_epoch = job.record.epoch;
                        if Self::awaits_lease(&job) {
                            self.awaiting_lease.insert(id.to_string());
                        }
                    }
                    self.sla_started(&mut job, now)?;
                    let here = job.record.target.clone();
                    if let Some(f) = job.last_move.as_mut().filter(|f| f.stopped_at.is_some() && f.running_at.is_none())
                    {
                        f.running_at = Some(now);
                        tracing::info!(job = id, from = %f.from, at = ?here, decision_to_running_s = now - f.decided_at,
                            checkpoint_wait_s = ?f.checkpoint_wait_s, "planned move done: running again");
                    }
                }
                Effect::RecordOutcome => {
                    job.record.exit_code = upd.exit_code;
                    job.record.signal = upd.signal;
                    // The fleet's streams never hold more than the cap.
                    let kept =
                        |n: u64| if self.output_max_job_bytes > 0 { n.min(self.output_max_job_bytes) } else { n };
                    job.final_stdout_len = upd.final_stdout_len.map(kept);
                    job.final_stderr_len = upd.final_stderr_len.map(kept);
                }
                Effect::CompareOutcome => {
                    if upd.state != Some(cur) || (upd.exit_code.is_some() && upd.exit_code != job.record.exit_code) {
                        tracing::warn!(job = id, stored = %cur, exit_code = ?job.record.exit_code,
                            reported = ?upd.state, reported_exit_code = ?upd.exit_code,
                            "a terminal report disagrees with the stored outcome; the stored one stands");
                    }
                }
                Effect::Place
                | Effect::RecordStartRequest
                | Effect::DropStartRequest
                | Effect::WakeOrigin
                | Effect::WakeTarget
                | Effect::QueueSignal
                | Effect::Rerun
                | Effect::NewEpoch
                | Effect::Migrate
                | Effect::FailUnresumable
                | Effect::SignalCheckpoint
                | Effect::StopRun
                | Effect::AbandonMove
                | Effect::PlannedMove
                | Effect::SlaReplace
                | Effect::CountReruns
                | Effect::RecordEndClaim
                | Effect::FinishFromClaim
                | Effect::EarlyPlaced
                | Effect::OpenGate
                | Effect::EarlyFallback => {}
            }
        }
        // Slurm ran it again there (the agent's count for this epoch).
        let reran = o.reply == Reply::Ok
            && !o.effects.contains(&Effect::PlannedMove)
            && upd.reruns.is_some_and(|seen| Self::target_reran(&mut job, seen, &upd, now));
        if o.effects.contains(&Effect::PlannedMove) {
            self.carry_planned_move(&mut job, planned, before.epoch, upd.final_stdout_len, now)?;
            reply_result(id, &o.reply)?;
            return Ok(job.record);
        }
        if let Some(why) = job.output_capped.as_deref().filter(|_| job.record.state.is_terminal()) {
            // Why it was cancelled, before what its target said of its end.
            if !job.record.reason.starts_with(why) {
                job.record.reason = format!("{why} ({})", job.record.reason);
            }
        }
        let takes = o.effects.iter().any(|e| *e != Effect::CompareOutcome);
        if takes {
            job.record.updated_at = now;
            refresh_complete(&mut job);
        }
        if changed || takes || reran {
            self.save(&job)?;
        }
        if job.record.state.is_terminal() {
            self.lease_until.remove(id);
            self.lease_prev_until.remove(id);
            self.awaiting_lease.remove(id);
        }
        reply_result(id, &o.reply)?;
        Ok(job.record)
    }

    /// The target agent's count of re-runs in this epoch (`reruns` of a
    /// report the lifecycle took): what it has not counted yet is added
    /// to `requeues`, each with a note naming the cluster.
    /// Returns whether it counted any.
    fn target_reran(job: &mut Job, seen: u32, upd: &StatusUpdate, now: f64) -> bool {
        let id = job.record.fleet_job_id.clone();
        let before = life_of(job);
        let o = transition(&before, &Event::TargetReran { seen, epoch: upd.epoch });
        if !o.effects.contains(&Effect::CountReruns) {
            return false;
        }
        let new = o.life.target_reruns.saturating_sub(before.target_reruns);
        set_life(job, &o.life);
        job.record.requeues = job.record.requeues.saturating_add(new);
        let at = job.record.target.clone().unwrap_or_else(|| "?".into());
        let how = match upd.rerun_why.as_str() {
            "" => "its agent saw it run again".to_string(),
            why => printable(why, MAX_REASON),
        };
        let times = if new == 1 { String::new() } else { format!(" {new} more times") };
        let line = format!("Slurm at {at} re-ran it{times} (epoch {}, at {now:.0}): {how}", job.record.epoch);
        tracing::info!(job = %id, requeues = job.record.requeues, at = %at, "{line}");
        note_requeue(&mut job.record, line);
        job.record.updated_at = now;
        true
    }

    pub fn write_output(&mut self, caller: &Caller, id: &str, chunk: OutputChunk, now: f64) -> Result<(), StoreError> {
        let mut job = self.load_for_target(caller, id)?;
        if let Some(e) = chunk.epoch.filter(|e| job.record.epoch != 0 && *e != job.record.epoch) {
            return Err(terminal_conflict(format!(
                "job {id}: output of epoch {e} is stale: the job's current placement is epoch {}; stop this copy",
                job.record.epoch
            )));
        }
        let end = chunk.offset.checked_add(chunk.data.len() as u64).filter(|e| *e <= MAX_OUTPUT_OFFSET);
        let Some(end) = end else {
            return Err(StoreError::BadRequest(format!(
                "output chunk at offset {} with {} bytes ends beyond the 1 TiB limit of a job's {}",
                chunk.offset,
                chunk.data.len(),
                chunk.stream.as_str()
            )));
        };
        let path = self.out_path(id, chunk.stream);
        let held = self.file_len(id, chunk.stream)?;
        let cap = self.output_max_job_bytes;
        if cap > 0 && held >= cap && chunk.offset >= held {
            // Past the cap (the job was cancelled when it passed it): taken
            // and dropped, so that the agent moves on.
            return Ok(());
        }
        if chunk.offset > held {
            return Err(StoreError::Conflict {
                msg: format!(
                    "output gap on {}: chunk at offset {} but {held} bytes held; expected offset {held}",
                    chunk.stream.as_str(),
                    chunk.offset
                ),
                expected_offset: Some(held),
                terminal: false,
            });
        }
        let skip = (held - chunk.offset) as usize;
        // What this chunk adds, up to the cap.
        let keep =
            if cap > 0 { chunk.data.len().min((cap - chunk.offset.min(cap)) as usize) } else { chunk.data.len() };
        let capped = cap > 0 && end > cap;
        if skip < keep {
            self.output_room((keep - skip) as u64)?;
            let mut f = OpenOptions::new().create(true).append(true).mode(0o600).open(&path)?;
            f.write_all(&chunk.data[skip..keep])?;
        }
        let len = held.max(if capped { cap } else { end });
        match chunk.stream {
            Stream::Stdout => job.record.stdout_len = len,
            Stream::Stderr => job.record.stderr_len = len,
        }
        if capped && job.output_capped.is_none() {
            self.cap_output(&mut job, chunk.stream, now);
        }
        if skip < keep || capped {
            job.record.updated_at = now;
            refresh_complete(&mut job);
            self.save(&job)?;
        }
        Ok(())
    }

    pub fn read_output(
        &self,
        caller: &Caller,
        id: &str,
        stream: Stream,
        offset: u64,
        max: u64,
    ) -> Result<Vec<u8>, StoreError> {
        read_range(&self.output_file(caller, id, stream, offset)?, offset, max)
    }

    /// Where `caller` may read `id`'s `stream` from `offset` (checked: the
    /// caller's access, the offset, the retention policy). The read itself
    /// ([`read_range`]) needs no store lock: output files only grow until
    /// the retention pass deletes them (a read then finds nothing).
    pub fn output_file(&self, caller: &Caller, id: &str, stream: Stream, offset: u64) -> Result<PathBuf, StoreError> {
        let job = self.get(caller, id)?;
        if offset > MAX_OUTPUT_OFFSET {
            return Err(StoreError::BadRequest(format!(
                "offset {offset} is beyond the 1 TiB limit of a job's {}",
                stream.as_str()
            )));
        }
        if let Some(t) = job.output_purged_at {
            return Err(StoreError::Gone(format!(
                "the output of {id} was deleted at {t:.0} (Unix time) by the retention policy (output_retention_days)"
            )));
        }
        Ok(self.out_path(id, stream))
    }

    pub fn list(&self, caller: &Caller, filter: &JobFilter) -> Result<Vec<JobRecord>, StoreError> {
        let only = match caller {
            Caller::Admin => None,
            Caller::Cluster(c) => Some(c.clone()),
            Caller::Job { .. } | Caller::Checkpointer { .. } => {
                return Err(StoreError::Forbidden("a job token cannot list jobs".into()))
            }
        };
        if let Some(n) = filter.limit.filter(|n| !(1..=MAX_LIST_LIMIT).contains(n)) {
            return Err(StoreError::BadRequest(format!("limit={n}: must be 1..={MAX_LIST_LIMIT}")));
        }
        if let Some(t) = filter.since.filter(|t| !t.is_finite()) {
            return Err(StoreError::BadRequest(format!("since={t}: must be a finite Unix time in seconds")));
        }
        if filter.offset.is_some() && filter.limit.is_none() {
            return Err(StoreError::BadRequest("offset needs a limit".into()));
        }
        // Jobs stored before `record.user` existed carry the name in their request only.
        // Only the record (and the user's name) leaves SQLite: not every
        // job's script and environment, decoded and held at once.
        const SQL: &str = "SELECT json_extract(data, '$.record'),
                    COALESCE(json_extract(data, '$.record.user'), json_extract(data, '$.request.user_name'))
             FROM jobs
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR origin = ?2)
               AND (?3 IS NULL OR origin = ?3 OR target = ?3)
               AND (?4 IS NULL OR active = ?4)
               AND (?5 IS NULL OR target = ?5)
               AND (?6 IS NULL OR COALESCE(json_extract(data, '$.record.user'),
                                           json_extract(data, '$.request.user_name')) = ?6)
               AND (?7 IS NULL OR json_extract(data, '$.record.origin_job_id') = ?7)
               AND (?8 IS NULL OR submitted_at >= ?8)";
        let sql = match filter.order.unwrap_or_default() {
            ListOrder::Asc => format!("{SQL} ORDER BY submitted_at, id LIMIT ?9 OFFSET ?10"),
            ListOrder::Desc => format!("{SQL} ORDER BY submitted_at DESC, id DESC LIMIT ?9 OFFSET ?10"),
        };
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(
            params![
                filter.state.map(JobState::as_str),
                filter.origin,
                only,
                filter.active,
                filter.target,
                filter.user,
                filter.origin_job.map(|n| n as i64),
                filter.since,
                filter.limit.map_or(-1, i64::from),
                filter.offset.unwrap_or(0),
            ],
            |row| Ok((row.get::<_, String>(0)?, row.get::<_, Option<String>>(1)?)),
        )?;
        let mut out = Vec::new();
        for row in rows {
            let (record, user) = row?;
            let mut r: JobRecord = serde_json::from_str(&record)?;
            r.user = r.user.or(user);
            out.push(r);
        }
        Ok(out)
    }

    pub fn work(&mut self, caller: &Caller, now: f64) -> Result<AgentWork, StoreError> {
        let Caller::Cluster(c) = caller else {
            return Err(StoreError::Forbidden("only a cluster's agent asks for work".into()));
        };
        self.sweep(now)?;
        let mut work = AgentWork::default();
        let sql = "SELECT data FROM jobs WHERE target = ?1 AND active = 1 ORDER BY submitted_at, id";
        for job in self.query(sql, [c])? {
            match target_work(&job) {
                Some(TargetWork::Submit) => {
                    let request = self.assignment_request(&job)?;
                    let (resume_from, resume_copy_to, resume_bytes) = self.assignment_resume(&job)?;
                    work.submit.push(Assignment {
                        fleet_job_id: job.record.fleet_job_id.clone(),
                        epoch: job.record.epoch,
                        request,
                        origin_restart: job.record.origin_restart,
                        stdout_base: job.record.stdout_base,
                        stderr_base: job.record.stderr_base,
                        resume_from,
                        resume_copy_to,
                        resume_bytes,
                    })
                }
                Some(TargetWork::Cancel) => work.cancel.push(job.record.fleet_job_id),
                None => {}
            }
        }
        // Held, or placed early and still waiting for the confirmation.
        let sql = "SELECT data FROM jobs WHERE origin = ?1 AND active = 1
                   AND (state = 'held' OR json_extract(data, '$.early.phase') = 'waiting')
                   AND json_extract(data, '$.record.start_requested_at') IS NOT NULL ORDER BY submitted_at, id";
        for job in self.query(sql, [c])? {
            if let Some(origin_job_id) = job.record.origin_job_id {
                work.confirm_start.push(StartCheck {
                    fleet_job_id: job.record.fleet_job_id,
                    origin_job_id,
                    restart: job.record.origin_restart,
                });
            }
        }
        work.signal = self.take_signal_orders(c)?;
        work.time_limit = self.take_time_limit_orders(c)?;
        Ok(work)
    }

    /// `POST /v1/agent/fence`: which of the runs the calling agent holds
    /// are stale: the job is unknown, finished with another placement, or
    /// placed elsewhere or in another epoch since (the reason names the
    /// job's epoch only where it is placed at the caller). The agent cancels those
    /// before it reports anything (after its start or a partition).
    /// Epoch 0 (an older agent's run) is stale only where the job is no
    /// longer placed at the caller.
    pub fn fence(&self, caller: &Caller, req: &FenceRequest) -> Result<FenceReply, StoreError> {
        let Caller::Cluster(c) = caller else {
            return Err(StoreError::Forbidden("only a cluster's agent asks which of its runs are stale".into()));
        };
        if req.runs.len() > 100_000 {
            return Err(StoreError::BadRequest(format!(
                "{} runs in one fence request: at most 100000",
                req.runs.len()
            )));
        }
        let mut stale = Vec::new();
        for r in &req.runs {
            let job = if valid_job_id(&r.fleet_job_id) {
                self.query("SELECT data FROM jobs WHERE id = ?1", [&r.fleet_job_id])?.pop()
            } else {
                None
            };
            // A job not placed at the caller, or unknown, gets one answer:
            // an agent learns nothing of another cluster's jobs (whether
            // one exists, its epoch, state or cluster) by naming its id.
            let reason = match job.filter(|j| j.record.target.as_deref() == Some(c.as_str())) {
                None => Some(format!("the job is not placed at {c}")),
                Some(j) if r.epoch != 0 && j.record.epoch != 0 && r.epoch != j.record.epoch => {
                    Some(format!("the job is now epoch {} ({} at {c})", j.record.epoch, j.record.state))
                }
                Some(_) => None,
            };
            if let Some(reason) = reason {
                stale.push(StaleRun { fleet_job_id: r.fleet_job_id.clone(), epoch: r.epoch, reason });
            }
        }
        Ok(FenceReply { stale })
    }

    /// `POST /v1/jobs/{id}/lease`: the in-job watchdog of a run renews the
    /// run's job lease, with the run's checkpoint token (or, for tests and
    /// tools, the target's own token). A run that no longer counts (the job
    /// is held by another cluster or epoch, or has ended) is told it is
    /// stale: it stops itself at once. A run that counts is granted the
    /// lease asked for, at most `job_lease_s`, and never past the moment
    /// its job could move off its cluster less the margin: the silent
    /// cluster's grace period minus how long it has been silent. So a
    /// silent cluster's runs keep running through an outage shorter than
    /// that, and are certainly dead when their jobs move, whoever else
    /// is dead there (agent, slurmctld).
    pub fn job_lease(
        &mut self,
        caller: &Caller,
        id: &str,
        req: &JobLeaseRequest,
        now: f64,
    ) -> Result<JobLeaseReply, StoreError> {
        // A renewal may be the first thing heard after a deaf spell: note it
        // before judging the cluster's silence.
        self.note_deafness(now);
        let cluster = match caller {
            Caller::Checkpointer { id: jid, cluster } if jid == id => cluster,
            Caller::Cluster(c) => c,
            Caller::Checkpointer { .. } => {
                return Err(StoreError::Unauthorized("checkpoint token does not match this job".into()))
            }
            _ => {
                return Err(StoreError::Forbidden(
                    "only a run (its checkpoint token) or its cluster renews its lease".into(),
                ))
            }
        };
        let job = self.load(id)?;
        let r = &job.record;
        let stale = |reason: String| Ok(JobLeaseReply { stale: true, reason, ..JobLeaseReply::default() });
        if r.target.as_deref() != Some(cluster.as_str()) {
            return stale(format!(
                "the job is now epoch {} ({}{})",
                r.epoch,
                r.state,
                r.target.as_deref().map(|t| format!(" at {t}")).unwrap_or_default()
            ));
        }
        if req.epoch != r.epoch {
            return stale(format!(
                "this run is epoch {}; the job is now epoch {} ({} at {cluster})",
                req.epoch, r.epoch, r.state
            ));
        }
        if r.state.is_terminal() {
            return stale(format!("the job has ended ({})", r.state));
        }
        if let Some(reply) = Self::early_lease(&job) {
            return Ok(reply);
        }
        if self.health.job_lease_s <= 0.0 {
            return Ok(JobLeaseReply {
                off: true,
                reason: "job leases are off ([health] job_lease_s = 0)".into(),
                ..JobLeaseReply::default()
            });
        }
        let grant = lease_grant(
            self.health.job_lease_s,
            req.lease_ms,
            self.move_after(cluster) - self.health.job_lease_margin_s - self.silent_for(cluster, now).max(0.0),
        );
        if grant.valid_ms > 0 {
            let until = now + grant.valid_ms as f64 / 1000.0;
            match self.lease_until.get(id).copied() {
                Some((e, held)) if e == r.epoch => {
                    if until > held {
                        self.lease_prev_until.insert(id.to_string(), (e, held));
                        self.lease_until.insert(id.to_string(), (e, until));
                    }
                }
                _ => {
                    self.lease_prev_until.remove(id);
                    self.lease_until.insert(id.to_string(), (r.epoch, until));
                }
            }
        }
        if job.leased_epoch != r.epoch && grant.valid_ms > 0 {
            // Its script started: it is no candidate for a lost launch.
            let mut job = job;
            job.leased_epoch = job.record.epoch;
            self.awaiting_lease.remove(id);
            self.save(&job)?;
        }
        Ok(grant)
    }

    /// `POST /v1/prices` (admin): keep the price table in the state
    /// directory and reprice the engine's model with it.
    pub fn import_prices(&mut self, caller: &Caller, csv: &str) -> Result<PriceImport, StoreError> {
        if *caller != Caller::Admin {
            return Err(StoreError::Forbidden("only the admin imports prices".into()));
        }
        let table = fleet_engine::parse_prices(csv).map_err(|e| StoreError::BadRequest(format!("price table: {e}")))?;
        let path = crate::ranking::imported_prices_path(&self.state_dir);
        let tmp = path.with_extension("csv.tmp");
        let mut f = OpenOptions::new().create(true).write(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(csv.as_bytes())?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        let applied = match &self.ranker {
            Some(r) => {
                self.ranker = Some(Arc::new(r.with_prices(&table)));
                true
            }
            None => false,
        };
        Ok(PriceImport { entries: table.entries.len(), skipped_fractional: table.skipped_fractional, applied })
    }

    /// A new feed snapshot for the engine (no-op without one).
    pub fn set_feeds(&mut self, feeds: Arc<Feeds>) {
        if let Some(r) = &self.ranker {
            self.ranker = Some(Arc::new(r.with_feeds(feeds)));
        }
    }

    /// The spot series of the engine's feeds at `now` ([`Ranker::spot_status`]);
    /// empty without an engine.
    pub fn spot_status(&self, now: f64) -> (Vec<crate::ranking::SpotFeedStatus>, Vec<String>) {
        self.ranker.as_ref().map(|r| r.spot_status(now)).unwrap_or_default()
    }

    pub fn has_engine(&self) -> bool {
        self.ranker.is_some()
    }

    /// One rebalancing pass: the engine's migration proposals for the
    /// running jobs with an interruptible request, on the current view.
    /// Destinations the hard rule (`fleet_api::placement`) excludes for a
    /// job are dropped.
    pub fn rebalance(&self, margin: &fleet_engine::MigrationMargin, now: f64) -> Result<Rebalance, StoreError> {
        let Some(r) = self.ranker.clone() else {
            return Ok(Rebalance { reason: Some(NO_ENGINE.into()), ..Default::default() });
        };
        let jobs = self.query(
            "SELECT data FROM jobs WHERE state = ?1 AND active = 1 ORDER BY submitted_at, id",
            [JobState::Running.as_str()],
        )?;
        let jobs: Vec<Job> = jobs
            .into_iter()
            .filter(|j| Self::restartable(j) && j.record.target.is_some() && j.planned.is_none())
            .collect();
        let view = self.view(now);
        let running: Vec<RunningInput<'_>> = jobs
            .iter()
            .map(|j| RunningInput {
                id: &j.record.fleet_job_id,
                request: &j.request,
                cluster: j.record.target.as_deref().unwrap_or_default(),
                elapsed_s: now - j.running_since.unwrap_or(j.record.updated_at),
            })
            .collect();
        // Per job: the clusters the first rule excludes, and those where the
        // GPU quota binding its submitter has no room for it (a move there
        // would wait for the quota, not save).
        let excluded: Vec<Vec<String>> = jobs
            .iter()
            .map(|j| {
                let mut out: Vec<String> =
                    placement::place(&view, &j.request).1.into_iter().map(|e| e.cluster).collect();
                // Where its limits would hold it for good.
                out.extend(j.refused_at.iter().map(|(c, _)| c.clone()));
                let need = u64::from(j.request.total_gpus());
                out.extend(
                    view.clusters
                        .iter()
                        .filter(|c| placement::quota_of(c, &j.request).is_some_and(|q| q.headroom() < need))
                        .map(|c| c.name.clone()),
                );
                out
            })
            .collect();
        let mut proposals =
            r.propose(&view, &running, margin, |i, c| excluded.get(i).is_some_and(|ex| !ex.iter().any(|x| x == c)));
        for p in &mut proposals {
            let epoch = jobs.iter().find(|j| j.record.fleet_job_id == p.fleet_job_id).map_or(0, |j| j.record.epoch);
            p.id = format!("{}-e{epoch}", p.fleet_job_id);
        }
        Ok(Rebalance {
            policy: r.policy_name().to_string(),
            computed_at: Some(now),
            considered: running.len(),
            proposals,
            reason: None,
            ..Default::default()
        })
    }

    /// Jobs per state, for the metrics.
    pub fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let mut stmt = self.conn.prepare_cached("SELECT state, COUNT(*) FROM jobs GROUP BY state")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_between_sweeps_is_a_deaf_spell_and_only_its_overlap_counts() {
        use std::time::{Duration, Instant};
        let mut d = Deafness::default();
        let m0 = Instant::now();
        assert_eq!(d.tick(m0, 100.0), None, "the first sweep");
        assert_eq!(d.tick(m0 + Duration::from_secs(1), 101.0), None);
        assert_eq!(d.tick(m0 + Duration::from_secs(6), 106.0), None, "5 s is still a sweep late, not deaf");
        assert_eq!(d.tick(m0 + Duration::from_secs(36), 136.0), Some(30.0));
        assert_eq!(d.spells.iter().copied().collect::<Vec<_>>(), [(106.0, 136.0)]);
        // A jump of the store's clock alone (tests, a clock step) is no spell.
        assert_eq!(d.tick(m0 + Duration::from_secs(37), 5000.0), None);
        assert_eq!(
            (d.within(0.0, 200.0), d.within(120.0, 125.0), d.within(130.0, 140.0), d.within(140.0, 150.0)),
            (30.0, 5.0, 6.0, 0.0)
        );
        for k in 0..(DEAF_KEPT as u64 + 3) {
            let m = m0 + Duration::from_secs(100 + 10 * k);
            let _ = d.tick(m, 6000.0 + 10.0 * k as f64);
        }
        assert_eq!(d.spells.len(), DEAF_KEPT, "only the latest spells are kept");
    }

    fn node(ty: Option<&str>, total: u32, free: u32, state: &str) -> NodeCapacity {
        NodeCapacity {
            name: "n".into(),
            partitions: vec![],
            gpu_type: ty.map(Into::into),
            gpus_total: total,
            gpus_free: free,
            state: state.into(),
            switch: None,
            ..Default::default()
        }
    }

    fn check(nodes: Vec<NodeCapacity>, expected: &[(&str, u32, u32, u32, u32)]) {
        let got: Vec<_> =
            gpu_pools(&nodes).into_iter().map(|p| (p.gpu_type, p.total, p.free, p.max_per_node, p.nodes)).collect();
        let want: Vec<_> = expected.iter().map(|e| (e.0.to_string(), e.1, e.2, e.3, e.4)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_job_lease_never_outlasts_the_time_before_its_job_can_move() {
        // (max s, asked ms, room s) -> valid ms
        let cases: &[(f64, u64, f64, u64)] = &[
            (30.0, 0, 100.0, 30_000),      // beating: the most
            (30.0, 8_000, 100.0, 8_000),   // the site asks less
            (30.0, 60_000, 100.0, 30_000), // never more than the meta-scheduler's
            (30.0, 8_000, 5.5, 5_500),     // silent: only until the move less the margin
            (30.0, 8_000, 0.0, 0),         // no room: not renewed
            (30.0, 8_000, -3.0, 0),
            (30.0, 8_000, f64::NAN, 0),
        ];
        for &(max, asked, room, want) in cases {
            let g = lease_grant(max, asked, room);
            assert_eq!(g.valid_ms, want, "max {max} asked {asked} room {room}: {g:?}");
            assert!(!g.stale && !g.off);
        }
        assert_eq!(lease_grant(30.0, 8_000, 100.0).reason, "");
        assert!(lease_grant(30.0, 8_000, 0.0).reason.starts_with("not renewed"), "the reason says why");
        assert!(lease_grant(30.0, 8_000, 5.5).reason.starts_with("shortened to 5500 ms"));
    }

    #[test]
    fn pools_table() {
        check(vec![], &[]);
        check(vec![node(None, 0, 0, "idle")], &[]);
        check(vec![node(Some("h100"), 8, 8, "idle"), node(Some("h100"), 4, 1, "mixed")], &[("h100", 12, 9, 8, 2)]);
        check(
            vec![
                node(Some("h100"), 8, 8, "down"),
                node(Some("h100"), 8, 8, "drained"),
                node(Some("h100"), 8, 8, "mixed+drain"),
                node(Some("h100"), 8, 8, "idle*"),
                node(Some("a100"), 4, 0, "allocated"),
            ],
            &[("a100", 4, 0, 4, 1)],
        );
        // free is clamped to total
        check(vec![node(Some("h100"), 2, 9, "idle")], &[("h100", 2, 2, 2, 1)]);
        // Counts no cluster has saturate instead of overflowing.
        check(
            vec![node(Some("h100"), u32::MAX, u32::MAX, "idle"), node(Some("h100"), 8, 8, "idle")],
            &[("h100", u32::MAX, u32::MAX, u32::MAX, 2)],
        );
    }

    #[test]
    fn inventory_table() {
        let cfg = ClusterConfig {
            name: "a".into(),
            max_nodes: Some(2),
            max_gpus: Some([("h100".to_string(), 16)].into_iter().collect()),
            ..Default::default()
        };
        let hb = |nodes: Vec<NodeCapacity>| Heartbeat { cluster: "a".into(), nodes, ..Default::default() };
        let table: Vec<(Vec<NodeCapacity>, Option<&str>)> = vec![
            (vec![], None),
            (vec![node(Some("h100"), 8, 8, "idle"), node(Some("h100"), 8, 0, "down")], None),
            (vec![node(None, 0, 0, "idle"), node(Some("h100"), 16, 1, "idle")], None),
            (vec![node(None, 0, 0, "idle"); 3], Some("3 nodes, max_nodes is 2")),
            (
                vec![node(Some("h100"), 9, 0, "idle"), node(Some("h100"), 8, 0, "idle")],
                Some("17 h100 GPUs, max_gpus allows 16"),
            ),
            (vec![node(Some("a100"), 1, 1, "idle")], Some("type \"a100\", not in max_gpus (h100)")),
            (vec![node(None, 2, 2, "idle")], Some("type \"\", not in max_gpus")),
            (vec![node(Some("h100"), 2, 3, "idle")], Some("3 free of 2 GPUs")),
        ];
        for (nodes, want) in table {
            let got = inventory_violation(&cfg, &hb(nodes.clone()));
            match (got.as_deref(), want) {
                (None, None) => {}
                (Some(g), Some(w)) => assert!(g.contains(w), "{g:?} lacks {w:?}"),
                (g, w) => panic!("{nodes:?}: got {g:?}, want {w:?}"),
            }
        }
        // Nothing declared: only the impossible node is refused.
        let open = ClusterConfig { name: "a".into(), ..Default::default() };
        assert_eq!(inventory_violation(&open, &hb(vec![node(Some("x"), 999, 0, "idle"); 50])), None);
    }

    #[test]
    fn job_ids() {
        for (id, ok) in
            [("j-1", true), ("abc.DEF_9", true), ("", false), ("../x", false), (".x", false), ("a/b", false)]
        {
            assert_eq!(valid_job_id(id), ok, "{id}");
        }
        assert!(!valid_job_id(&"x".repeat(129)));
    }
}
