//! The meta-scheduler's state: jobs and cluster heartbeats in SQLite,
//! output bytes in files, and the job state machine.
//!
//! Everything here is synchronous; the HTTP layer calls it from
//! `spawn_blocking` with the store behind one `parking_lot::Mutex` (see
//! `lib.rs` for why).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleet_api::api::{
    AgentWork, Assignment, ClusterSummary, FleetView, ForwardRequest, GpuPool, Heartbeat, JobRecord, NodeCapacity,
    OutputChunk, StatusUpdate, Stream,
};
use fleet_api::placement::{self, Placement};
use fleet_api::{JobRequest, JobState};
use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::config::ClusterConfig;
use crate::metrics::Metrics;
use crate::feeds::Feeds;
use crate::ranking::{Ranker, RebalanceProposal, RunningInput};
use crate::Clock;

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
    /// `expected_offset` is set for output gaps.
    #[error("{msg}")]
    Conflict { msg: String, expected_offset: Option<u64> },
    #[error("database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("output file: {0}")]
    Io(#[from] std::io::Error),
    #[error("stored record: {0}")]
    Json(#[from] serde_json::Error),
}

fn conflict(msg: impl Into<String>) -> StoreError {
    StoreError::Conflict { msg: msg.into(), expected_offset: None }
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

/// `GET /v1/rebalance`: the latest rebalancing pass. Proposals only: the
/// meta-scheduler does not carry migrations out (yet).
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
    metrics: Arc<Metrics>,
    ranker: Option<Arc<Ranker>>,
}

/// `GET /v1/rebalance`'s reason when no engine is configured.
pub const NO_ENGINE: &str =
    "no cost-engine policy configured ([placement] policy and fleet_model): rebalancing is off";

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
pub fn gpu_pools(nodes: &[NodeCapacity]) -> Vec<GpuPool> {
    let mut pools: BTreeMap<String, GpuPool> = BTreeMap::new();
    for n in nodes {
        let Some(ty) = &n.gpu_type else { continue };
        if !node_usable(&n.state) || n.gpus_total == 0 {
            continue;
        }
        let p = pools.entry(ty.clone()).or_insert_with(|| GpuPool { gpu_type: ty.clone(), ..Default::default() });
        p.total += n.gpus_total;
        p.free += n.gpus_free.min(n.gpus_total);
        p.max_per_node = p.max_per_node.max(n.gpus_total);
        p.nodes += 1;
    }
    pools.into_values().collect()
}

/// Ids become file names: keep them to a safe alphabet.
fn valid_job_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn rank(s: JobState) -> u8 {
    match s {
        JobState::Held => 0,
        JobState::Queued => 1,
        JobState::Assigned => 2,
        JobState::Pending => 3,
        JobState::Running => 4,
        _ => 5,
    }
}

fn summary(req: &JobRequest) -> String {
    let limit = match req.time_limit_min {
        Some(m) => format!("{m} min"),
        None => "partition default time".to_string(),
    };
    format!("{}, {limit}", placement::describe(req))
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
        std::fs::create_dir_all(state_dir)?;
        let out_dir = state_dir.join("output");
        std::fs::create_dir_all(&out_dir)?;
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
             CREATE TABLE IF NOT EXISTS clusters (
                 name TEXT PRIMARY KEY,
                 last_seen REAL NOT NULL,
                 heartbeat TEXT NOT NULL
             );",
        )?;
        // `active` (the job may still be some agent's work) came after the
        // first schema: add it to older databases.
        let has_active: bool =
            conn.prepare("SELECT 1 FROM pragma_table_info('jobs') WHERE name = 'active'")?.exists([])?;
        if !has_active {
            conn.execute_batch("ALTER TABLE jobs ADD COLUMN active INTEGER NOT NULL DEFAULT 1;")?;
        }
        conn.execute_batch("CREATE INDEX IF NOT EXISTS jobs_active ON jobs(target, active);")?;
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
            map.insert(c.name.clone(), ClusterState { cfg: c.clone(), last });
        }
        let mut store = Store {
            conn,
            state_dir: state_dir.to_path_buf(),
            out_dir,
            clusters: map,
            order: clusters.iter().map(|c| c.name.clone()).collect(),
            heartbeat_timeout_s,
            started_at: clock.now(),
            metrics,
            ranker,
        };
        store.reconcile_output_lengths()?;
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
        Ok(())
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
        let clusters = self
            .order
            .iter()
            .filter_map(|n| self.clusters.get(n))
            .map(|c| {
                let pick = |cfg: &str, hb: &str| if cfg.is_empty() { hb.to_string() } else { cfg.to_string() };
                match &c.last {
                    Some((hb, t)) => {
                        let age = (now - t).max(0.0);
                        ClusterSummary {
                            name: c.cfg.name.clone(),
                            region: pick(&c.cfg.region, &hb.region),
                            provider: pick(&c.cfg.provider, &hb.provider),
                            scheduler: hb.scheduler.clone(),
                            healthy: age <= self.heartbeat_timeout_s,
                            heartbeat_age_s: age,
                            gpus: gpu_pools(&hb.nodes),
                            queue_pending: hb.queue_pending,
                            queue_running: hb.queue_running,
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
                    },
                }
            })
            .collect();
        FleetView { generated_at: now, clusters }
    }

    fn healthy(&self, cluster: &str, now: f64) -> bool {
        self.clusters
            .get(cluster)
            .and_then(|c| c.last.as_ref())
            .is_some_and(|(_, t)| now - t <= self.heartbeat_timeout_s)
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
            user: fwd.request.user_name.clone(),
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
        };
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
        }
        Ok(job)
    }

    pub fn explain(&self, caller: &Caller, id: &str, now: f64) -> Result<Explanation, StoreError> {
        let job = self.get(caller, id)?;
        let view = self.view(now);
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
            notes: Vec::new(),
            view_generated_at: view.generated_at,
        };
        if let Some(r) = &self.ranker {
            let (d, errs) = r.explain(&view, &job.request, &out.fleet_job_id);
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
            out.notes = d.notes.iter().cloned().chain(errs).collect();
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

    pub fn start(&mut self, caller: &Caller, id: &str, origin_job_id: u64, now: f64) -> Result<JobRecord, StoreError> {
        let mut job = self.load_for_origin(caller, id, "start")?;
        if job.record.origin_job_id.is_none() && origin_job_id != 0 {
            job.record.origin_job_id = Some(origin_job_id);
            job.record.updated_at = now;
        }
        if job.record.state == JobState::Held {
            job.record.state = JobState::Queued;
            job.record.updated_at = now;
            self.assign(&mut job, now);
        }
        self.save(&job)?;
        Ok(job.record)
    }

    /// Place a `Queued` job on the current view.
    fn assign(&self, job: &mut Job, now: f64) {
        let view = self.view(now);
        let (mut p, excluded) = placement::place(&view, &job.request);
        let previous = job.record.reason.clone();
        // The engine ranks the clusters the first rule allows.
        if let (Some(r), Placement::Home { .. } | Placement::Remote { .. }) = (&self.ranker, &p) {
            let allowed: Vec<String> = view
                .clusters
                .iter()
                .filter(|c| c.healthy && !excluded.iter().any(|e| e.cluster == c.name))
                .map(|c| c.name.clone())
                .collect();
            if let Some(pick) = r.pick(&view, &job.request, &job.record.fleet_job_id, &allowed) {
                p = if pick.cluster == job.record.origin {
                    Placement::Home { reason: pick.reason }
                } else {
                    Placement::Remote { target: pick.cluster, reason: pick.reason }
                };
            }
        }
        match p {
            Placement::Home { reason } => {
                self.metrics.placement("home");
                job.record.target = Some(job.record.origin.clone());
                job.record.state = JobState::Assigned;
                job.record.reason = format!("placed at the origin {}: {reason}", job.record.origin);
            }
            Placement::Remote { target, reason } => {
                self.metrics.placement("remote");
                job.record.reason = format!("placed at {target}: {reason}");
                job.record.target = Some(target);
                job.record.state = JobState::Assigned;
            }
            Placement::Impossible { reason } => {
                // Impossible only because clusters are silent right now?
                // Then wait for them rather than fail the job.
                if matches!(placement::place(&placement::all_healthy(&view), &job.request).0, Placement::Impossible { .. }) {
                    self.metrics.placement("impossible");
                    job.record.state = JobState::Failed;
                    job.record.target = None;
                    job.record.reason = reason;
                    refresh_complete(job);
                } else {
                    self.metrics.placement("waiting");
                    job.record.state = JobState::Queued;
                    job.record.target = None;
                    job.record.reason = format!("waiting for a healthy cluster: {reason}");
                }
            }
        }
        if previous.starts_with("re-placing") {
            job.record.reason = format!("{previous}; {}", job.record.reason);
        }
        job.record.updated_at = now;
    }

    /// Periodic work: place waiting jobs, re-place jobs whose target went
    /// silent before submitting them.
    pub fn sweep(&mut self, now: f64) -> Result<(), StoreError> {
        let jobs = self.query("SELECT data FROM jobs WHERE state IN ('queued', 'assigned')", [])?;
        for mut job in jobs {
            let before = (job.record.state, job.record.target.clone());
            match job.record.state {
                JobState::Queued => self.assign(&mut job, now),
                JobState::Assigned if !job.submitted => {
                    let target = job.record.target.clone().unwrap_or_default();
                    if self.healthy(&target, now) {
                        continue;
                    }
                    self.metrics.placement("re-place");
                    job.record.reason = format!("re-placing: {target} became unhealthy before submitting it");
                    job.record.state = JobState::Queued;
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
        if job.record.state.is_terminal() {
            return Ok(job.record);
        }
        job.record.cancel_requested = true;
        job.record.updated_at = now;
        let not_submitted = matches!(job.record.state, JobState::Held | JobState::Queued)
            || (job.record.state == JobState::Assigned && !job.submitted);
        if not_submitted {
            job.record.state = JobState::Cancelled;
            job.record.reason = "cancelled before it was submitted anywhere".into();
            refresh_complete(&mut job);
        }
        self.save(&job)?;
        Ok(job.record)
    }

    fn load_for_target(&self, caller: &Caller, id: &str) -> Result<Job, StoreError> {
        let job = self.load(id)?;
        match caller {
            Caller::Cluster(c) if job.record.target.as_deref() == Some(c.as_str()) => Ok(job),
            Caller::Cluster(c) => Err(StoreError::Forbidden(format!(
                "cluster {c:?} is not the target of {id} (target: {})",
                job.record.target.as_deref().unwrap_or("none")
            ))),
            _ => Err(StoreError::Forbidden("only the target cluster's agent reports on a job".into())),
        }
    }

    pub fn status(&mut self, caller: &Caller, id: &str, upd: StatusUpdate, now: f64) -> Result<JobRecord, StoreError> {
        let mut job = self.load_for_target(caller, id)?;
        let cur = job.record.state;
        if let Some(new) = upd.state {
            if rank(new) <= rank(JobState::Assigned) {
                return Err(StoreError::BadRequest(format!("a target agent cannot report state {new}")));
            }
        }
        // Cancelled here before the agent reported a submission: record the
        // remote id so that the agent is told to cancel it.
        if cur == JobState::Cancelled && !job.submitted && upd.state.is_none_or(|s| !s.is_terminal()) {
            if let Some(rid) = upd.remote_job_id {
                job.record.remote_job_id = Some(rid);
                job.submitted = true;
                job.remote_cancel_pending = true;
                job.record.updated_at = now;
                self.save(&job)?;
            }
            return Err(conflict(format!("job {id} was cancelled before it was submitted; cancel it at the target")));
        }
        if let Some(new) = upd.state {
            if cur.is_terminal() && new != cur {
                return Err(conflict(format!("job {id} is already {cur}; {new} is not allowed")));
            }
            if rank(new) < rank(cur) {
                return Err(conflict(format!("job {id} is {cur}; it cannot go back to {new}")));
            }
        }
        job.submitted = true;
        if cur.is_terminal() && job.remote_cancel_pending && upd.state == Some(cur) {
            job.remote_cancel_pending = false;
        }
        if let Some(rid) = upd.remote_job_id {
            job.record.remote_job_id = Some(rid);
        }
        if !upd.node_list.is_empty() {
            job.record.node_list = upd.node_list;
        }
        if !upd.reason.is_empty() {
            job.record.reason = upd.reason;
        } else if let Some(new) = upd.state.filter(|n| n.is_terminal() && !cur.is_terminal()) {
            // The placement reason no longer says why the job is where it is.
            let how = match (upd.signal.filter(|s| *s > 0), upd.exit_code) {
                (Some(s), _) => format!(" (signal {s})"),
                (None, Some(c)) => format!(" (exit code {c})"),
                (None, None) => String::new(),
            };
            job.record.reason = format!("{new} at {}{how}", job.record.target.as_deref().unwrap_or("?"));
        }
        if let Some(new) = upd.state {
            if !cur.is_terminal() {
                if new == JobState::Running && job.running_since.is_none() {
                    job.running_since = Some(now);
                }
                job.record.state = new;
                if new.is_terminal() {
                    job.record.exit_code = upd.exit_code;
                    job.record.signal = upd.signal;
                }
            }
            if new.is_terminal() {
                job.final_stdout_len = job.final_stdout_len.or(upd.final_stdout_len);
                job.final_stderr_len = job.final_stderr_len.or(upd.final_stderr_len);
                if job.record.exit_code.is_none() {
                    job.record.exit_code = upd.exit_code;
                }
                if job.record.signal.is_none() {
                    job.record.signal = upd.signal;
                }
            }
        }
        job.record.updated_at = now;
        refresh_complete(&mut job);
        self.save(&job)?;
        Ok(job.record)
    }

    pub fn write_output(&mut self, caller: &Caller, id: &str, chunk: OutputChunk, now: f64) -> Result<(), StoreError> {
        let mut job = self.load_for_target(caller, id)?;
        let path = self.out_path(id, chunk.stream);
        let held = self.file_len(id, chunk.stream)?;
        if chunk.offset > held {
            return Err(StoreError::Conflict {
                msg: format!(
                    "output gap on {}: chunk at offset {} but {held} bytes held; expected offset {held}",
                    chunk.stream.as_str(),
                    chunk.offset
                ),
                expected_offset: Some(held),
            });
        }
        let skip = (held - chunk.offset) as usize;
        if skip < chunk.data.len() {
            let mut f = OpenOptions::new().create(true).append(true).open(&path)?;
            f.write_all(&chunk.data[skip..])?;
        }
        let len = held.max(chunk.offset + chunk.data.len() as u64);
        match chunk.stream {
            Stream::Stdout => job.record.stdout_len = len,
            Stream::Stderr => job.record.stderr_len = len,
        }
        if skip < chunk.data.len() {
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
        let job = self.get(caller, id)?;
        if let Some(t) = job.output_purged_at {
            return Err(StoreError::Gone(format!("the output of {id} was deleted at {t:.0} (Unix time) by the retention policy (output_retention_days)")));
        }
        let mut f = match std::fs::File::open(self.out_path(id, stream)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = Vec::new();
        f.take(max).read_to_end(&mut buf)?;
        Ok(buf)
    }

    pub fn list(&self, caller: &Caller, filter: &JobFilter) -> Result<Vec<JobRecord>, StoreError> {
        let only = match caller {
            Caller::Admin => None,
            Caller::Cluster(c) => Some(c.clone()),
            Caller::Job { .. } => return Err(StoreError::Forbidden("a job token cannot list jobs".into())),
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
        const SQL: &str = "SELECT data FROM jobs
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
        let jobs = self.query(
            &sql,
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
        )?;
        Ok(jobs
            .into_iter()
            .map(|j| {
                let mut r = j.record;
                r.user = r.user.or(j.request.user_name);
                r
            })
            .collect())
    }

    pub fn work(&mut self, caller: &Caller, now: f64) -> Result<AgentWork, StoreError> {
        let Caller::Cluster(c) = caller else {
            return Err(StoreError::Forbidden("only a cluster's agent asks for work".into()));
        };
        self.sweep(now)?;
        let mut work = AgentWork::default();
        let sql = "SELECT data FROM jobs WHERE target = ?1 AND active = 1 ORDER BY submitted_at, id";
        for job in self.query(sql, [c])? {
            let r = &job.record;
            if r.state == JobState::Assigned && !job.submitted && !r.cancel_requested {
                work.submit.push(Assignment { fleet_job_id: r.fleet_job_id.clone(), request: job.request.clone() });
            } else if (r.cancel_requested && !r.state.is_terminal()) || job.remote_cancel_pending {
                work.cancel.push(r.fleet_job_id.clone());
            }
        }
        Ok(work)
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
        std::fs::write(&tmp, csv)?;
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
        let jobs: Vec<Job> =
            jobs.into_iter().filter(|j| j.request.fleet.interruptible && j.record.target.is_some()).collect();
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
        let excluded: Vec<Vec<String>> =
            jobs.iter().map(|j| placement::place(&view, &j.request).1.into_iter().map(|e| e.cluster).collect()).collect();
        let proposals =
            r.propose(&view, &running, margin, |i, c| excluded.get(i).is_some_and(|ex| !ex.iter().any(|x| x == c)));
        Ok(Rebalance {
            policy: r.policy_name().to_string(),
            computed_at: Some(now),
            considered: running.len(),
            proposals,
            reason: None,
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

    fn node(ty: Option<&str>, total: u32, free: u32, state: &str) -> NodeCapacity {
        NodeCapacity {
            name: "n".into(),
            partitions: vec![],
            gpu_type: ty.map(Into::into),
            gpus_total: total,
            gpus_free: free,
            state: state.into(),
            switch: None,
        }
    }

    fn check(nodes: Vec<NodeCapacity>, expected: &[(&str, u32, u32, u32, u32)]) {
        let got: Vec<_> =
            gpu_pools(&nodes).into_iter().map(|p| (p.gpu_type, p.total, p.free, p.max_per_node, p.nodes)).collect();
        let want: Vec<_> = expected.iter().map(|e| (e.0.to_string(), e.1, e.2, e.3, e.4)).collect();
        assert_eq!(got, want);
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
