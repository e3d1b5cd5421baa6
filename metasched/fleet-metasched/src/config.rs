//! The daemon's TOML configuration (see `conf/metasched.toml`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration in {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// `[placement]`: which rule picks among the clusters that can run a job.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// `first-fit` (default): the shared rule of `fleet_api::placement`
    /// alone. Any other name is a cost-engine policy (`cost`, `time`,
    /// `green`, or one defined in `[policies.<name>]`) that ranks the
    /// clusters the shared rule allows; it needs `fleet_model`.
    #[serde(default)]
    pub policy: Option<String>,
    /// The engine's fleet model (TOML, e.g. `conf/fleet-sample.toml`).
    #[serde(default)]
    pub fleet_model: Option<PathBuf>,
}

impl PlacementConfig {
    /// The engine policy to use, if any.
    pub fn engine_policy(&self) -> Option<&str> {
        self.policy.as_deref().filter(|p| *p != "first-fit")
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub name: String,
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub provider: String,
    /// File holding the agent's bearer token(s): one per non-empty line,
    /// each accepted (rotation: add the new one, move the agent, remove
    /// the old one). Re-read on SIGHUP and when its mtime changes.
    pub token_file: PathBuf,
    /// More token files, each read like `token_file`.
    #[serde(default)]
    pub token_files: Vec<PathBuf>,
    /// The most nodes a heartbeat may report (absent: no check).
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// GPU type → the most GPUs of that type a heartbeat may report;
    /// with it, a type not listed is not allowed either (absent: no check).
    #[serde(default)]
    pub max_gpus: Option<BTreeMap<String, u32>>,
    /// Site default checkpoint location of this cluster's region
    /// (`s3://bucket/prefix` or `file:///dir`): a job without
    /// `--fleet-ckpt` checkpoints under `<ckpt_url>/<origin>/<user>/<fleet
    /// job id>` there (`store::catalog::site_prefix`). Clusters of one
    /// region share one store, so one URL.
    #[serde(default)]
    pub ckpt_url: Option<String>,
    /// Seconds this cluster may stay Degraded (silent) before its fleet
    /// jobs are moved elsewhere (default: `[health] grace_s`).
    #[serde(default)]
    pub grace_s: Option<f64>,
    /// Provisioning deadline of this cluster (seconds from assignment to
    /// running); wins over `[sla] provider_deadline_s` and `deadline_s`.
    #[serde(default)]
    pub sla_deadline_s: Option<f64>,
}

/// `[limits]`: what one client can hold of the meta-scheduler.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Open connections in all (default 4096); more are closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Open connections from one peer address (default 512: a node's
    /// stand-ins keep one each).
    #[serde(default = "default_max_connections_per_ip")]
    pub max_connections_per_ip: usize,
    /// Seconds for a connection's first byte and for a request head (default 10).
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout_s: f64,
    /// Seconds without a byte either way before a connection is closed
    /// (default 90; more than the 30 s long-poll).
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_s: f64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: default_max_connections(),
            max_connections_per_ip: default_max_connections_per_ip(),
            header_read_timeout_s: default_header_read_timeout(),
            idle_timeout_s: default_idle_timeout(),
        }
    }
}

impl LimitsConfig {
    pub fn resolve(&self) -> crate::conn::Limits {
        crate::conn::Limits {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            header_read_timeout: std::time::Duration::from_secs_f64(self.header_read_timeout_s),
            idle_timeout: std::time::Duration::from_secs_f64(self.idle_timeout_s),
        }
    }
}

fn default_max_connections() -> usize {
    4096
}

fn default_max_connections_per_ip() -> usize {
    512
}

fn default_header_read_timeout() -> f64 {
    10.0
}

fn default_idle_timeout() -> f64 {
    90.0
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: SocketAddr,
    /// SQLite database (`metasched.db`) and `output/<id>.stdout|stderr`.
    pub state_dir: PathBuf,
    pub admin_token_file: PathBuf,
    /// A cluster without a heartbeat for this long is unhealthy.
    #[serde(default = "default_heartbeat_timeout")]
    pub heartbeat_timeout_s: f64,
    #[serde(default)]
    pub clusters: Vec<ClusterConfig>,
    #[serde(default)]
    pub placement: Option<PlacementConfig>,
    /// Price feed (CSV) for the cost engine; unused until it lands.
    #[serde(default)]
    pub prices: Option<PathBuf>,
    /// Directory of carbon-intensity series for the cost engine
    /// (`<ZONE>_<year>_hourly.csv`, header
    /// `datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh`); every
    /// `*.csv` in it is read at start and re-read when files change.
    #[serde(default)]
    pub carbon: Option<PathBuf>,
    /// Directory of egress price matrices for the cost engine
    /// (`<provider>_transmission_cost_matrix.csv`); re-read when they change.
    #[serde(default)]
    pub egress: Option<PathBuf>,
    /// Directory of spot availability series for the cost engine (`*.json`,
    /// the SkyPilot spot-trace format with `metadata.start_unix`); each
    /// follows the cloud clusters whose region its file name holds.
    #[serde(default)]
    pub spot: Option<PathBuf>,
    /// `[rebalance]`: the periodic pass proposing migrations.
    #[serde(default)]
    pub rebalance: Option<RebalanceConfig>,
    /// `[policies.<name>]` weight tables of the cost engine
    /// (`fleet_engine::policy`); kept raw here, read by the engine.
    #[serde(default)]
    pub policies: Option<toml::Table>,
    /// Relayed output of a finished job is deleted this many days after
    /// it finished (default 14; 0 keeps it forever). The job's record stays.
    #[serde(default = "default_output_retention_days")]
    pub output_retention_days: f64,
    /// The most output kept per stream of one job (bytes; default 16 GiB,
    /// 0: no cap). A job whose stdout or stderr passes it is cancelled
    /// and the rest is not kept: one user's runaway output must not fill
    /// the disk every other job's output and the job database share.
    #[serde(default = "default_output_max_job_bytes")]
    pub output_max_job_bytes: u64,
    /// Output is refused (the agents keep it and send it again later)
    /// while the file system of `state_dir` has less than this free
    /// (bytes; default 1 GiB, 0: never refused), so that the job database
    /// can still be written.
    #[serde(default = "default_output_min_free_bytes")]
    pub output_min_free_bytes: u64,
    /// `[tls]`: serve HTTPS with this certificate. Without it the API is
    /// plain HTTP, fit only for loopback or a trusted network: the bearer
    /// and job tokens cross the wire in the clear.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Serve plain HTTP on an address other than loopback (a trusted
    /// network or a TLS-terminating proxy in front). Without `[tls]` and
    /// without this, such a `listen` is refused at start.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// `[limits]`: connection caps and timeouts.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// `[health]`: when a silent cluster is Degraded and when its jobs move.
    #[serde(default)]
    pub health: Option<HealthConfig>,
    /// `[sla]`: the provisioning SLA (assignment to running). Without it
    /// the times are measured and shown, nothing is re-placed.
    #[serde(default)]
    pub sla: Option<SlaConfig>,
    /// `[start]`: how a forwarded job starts (early placement).
    #[serde(default)]
    pub start: StartConfig,
}

/// `[start]`: early placement (docs/failover.md, "Start latency"). A job
/// forwarded at sbatch time without a dependency, hold or later begin time
/// is placed at once on a cluster whose runs start under their in-job
/// lease (with `[health] job_lease_s` > 0); its script waits at its first
/// lease until the origin confirms the stand-in runs. Unconfirmed after
/// `early_submit_wait_s`, the early run is withdrawn and the job starts
/// the ordinary way.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartConfig {
    /// Seconds an early run may wait for its stand-in (default 30; 0: no
    /// early placement). It holds its target's resources meanwhile.
    #[serde(default = "default_early_wait")]
    pub early_submit_wait_s: f64,
}

impl Default for StartConfig {
    fn default() -> Self {
        StartConfig { early_submit_wait_s: default_early_wait() }
    }
}

fn default_early_wait() -> f64 {
    crate::store::DEFAULT_EARLY_WAIT_S
}

/// `[sla]`: a fleet job assigned to a cluster must run there within its
/// provisioning deadline (per cluster `[[clusters]] sla_deadline_s`, else
/// per provider `[sla.provider_deadline_s]`, else `deadline_s`). One that
/// does not is re-placed elsewhere when another cluster can run it, and
/// the cluster is SLA-degraded (scored down) until `recover_runs` runs in
/// a row started within their deadline there, or `cooldown_s` passed
/// since its last miss. docs/failover.md ("Provisioning SLA").
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlaConfig {
    /// Default provisioning deadline, seconds (default 300).
    #[serde(default = "default_sla_deadline")]
    pub deadline_s: f64,
    /// Provider name → its deadline (seconds).
    #[serde(default)]
    pub provider_deadline_s: BTreeMap<String, f64>,
    /// Samples (runs and misses) kept per cluster: the rolling window of
    /// p50/p90 and of the miss count (default 20).
    #[serde(default = "default_sla_window")]
    pub window: u32,
    /// Runs in a row within their deadline that end SLA-degraded (default 3).
    #[serde(default = "default_sla_recover_runs")]
    pub recover_runs: u32,
    /// Seconds without a miss that end SLA-degraded (default 900).
    #[serde(default = "default_sla_cooldown")]
    pub cooldown_s: f64,
    /// The engine's penalty on an SLA-degraded cluster: this fraction of
    /// its score, plus its expected provisioning delay (p90, at least the
    /// deadline) at the policy's time value (default 1.0).
    #[serde(default = "default_sla_penalty_frac")]
    pub penalty_frac: f64,
}

impl Default for SlaConfig {
    fn default() -> Self {
        SlaConfig {
            deadline_s: default_sla_deadline(),
            provider_deadline_s: BTreeMap::new(),
            window: default_sla_window(),
            recover_runs: default_sla_recover_runs(),
            cooldown_s: default_sla_cooldown(),
            penalty_frac: default_sla_penalty_frac(),
        }
    }
}

fn default_sla_deadline() -> f64 {
    300.0
}

fn default_sla_window() -> u32 {
    20
}

fn default_sla_recover_runs() -> u32 {
    3
}

fn default_sla_cooldown() -> f64 {
    900.0
}

fn default_sla_penalty_frac() -> f64 {
    1.0
}

/// What the store needs of `[sla]`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Sla {
    /// Deadlines are enforced (an `[sla]` section exists).
    pub enforced: bool,
    pub deadline_s: f64,
    /// Cluster name → its deadline, where it differs from `deadline_s`.
    pub cluster_deadline_s: BTreeMap<String, f64>,
    pub provider_deadline_s: BTreeMap<String, f64>,
    pub window: usize,
    pub recover_runs: usize,
    pub cooldown_s: f64,
    pub penalty_frac: f64,
}

impl Default for Sla {
    /// Measured and shown, not enforced.
    fn default() -> Self {
        Sla::from_config(None, &[])
    }
}

impl Sla {
    pub fn from_config(c: Option<&SlaConfig>, clusters: &[ClusterConfig]) -> Sla {
        let d = SlaConfig::default();
        let s = c.unwrap_or(&d);
        Sla {
            enforced: c.is_some(),
            deadline_s: s.deadline_s,
            cluster_deadline_s: clusters.iter().filter_map(|c| c.sla_deadline_s.map(|d| (c.name.clone(), d))).collect(),
            provider_deadline_s: s.provider_deadline_s.clone(),
            window: s.window as usize,
            recover_runs: s.recover_runs as usize,
            cooldown_s: s.cooldown_s,
            penalty_frac: s.penalty_frac,
        }
    }

    /// The deadline of `cluster` (of provider `provider`).
    pub fn deadline(&self, cluster: &str, provider: &str) -> f64 {
        self.cluster_deadline_s
            .get(cluster)
            .or_else(|| self.provider_deadline_s.get(provider))
            .copied()
            .unwrap_or(self.deadline_s)
    }
}

/// `[health]`: a cluster that misses `missed_heartbeats` beats of
/// `heartbeat_interval_s` is Degraded (no new work); Degraded for
/// `grace_s` more (per cluster: `[[clusters]] grace_s`), its active fleet
/// jobs are re-placed on healthy clusters. Without this section a cluster
/// is Degraded after `heartbeat_timeout_s` and the grace period is 60 s.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// The agents' `HeartbeatIntervalMs`, in seconds (default 1).
    #[serde(default = "default_heartbeat_interval")]
    pub heartbeat_interval_s: f64,
    /// Beats missed before the cluster is Degraded (default 3).
    #[serde(default = "default_missed_heartbeats")]
    pub missed_heartbeats: u32,
    /// Seconds Degraded before its jobs move (default 60). Never shorter,
    /// in effect, than the lease its agent announces (`LeaseS`): by then
    /// the agent has stopped those jobs itself if it is alive but cut off.
    #[serde(default = "default_grace")]
    pub grace_s: f64,
    /// Re-placements of one job after failures before it fails (default 3).
    #[serde(default = "default_max_migrations")]
    pub max_migrations: u32,
    /// The longest job lease granted to a run's in-job watchdog (default
    /// 30; 0: no job leases, the watchdogs leave their runs alone). A site
    /// may ask for less (`JobLeaseMs`). Every cluster's
    /// `missed × interval + grace_s` must be at least this plus
    /// `job_lease_margin_s`: a silent cluster's jobs move only after the
    /// leases of their old runs there have certainly run out.
    #[serde(default = "default_job_lease")]
    pub job_lease_s: f64,
    /// Seconds between the end of the last lease a run could hold and the
    /// move of its job (default 5): the watchdog's kill and its slack.
    #[serde(default = "default_job_lease_margin")]
    pub job_lease_margin_s: f64,
    /// Seconds a run under its in-job lease may report running without
    /// ever asking for its first lease before it counts as dead: its
    /// script never started (a launch Slurm lost while reporting the job
    /// running). Default: 3 × `job_lease_s`; 0: off. At least
    /// `job_lease_s` (a run tries for a whole lease before it gives up).
    #[serde(default)]
    pub first_lease_s: Option<f64>,
    /// Seconds past its grace period that a silent cluster's run which
    /// claimed its own end (`fleet-ckpt lease-exec`, `POST /end`) waits
    /// for its agent's report before the job ends as claimed (default
    /// 300; 0: at once). Such a run is never moved.
    #[serde(default)]
    pub end_wait_s: Option<f64>,
    /// Seconds a fleet job may wait at a cluster that answers but whose
    /// usable nodes cannot run it (every node that could is drained, down
    /// or not responding) before it is cancelled there and placed where
    /// nodes can (default 300; 0: off, it waits as a native job would).
    /// Only a job that never started in that placement moves. The same
    /// holds for a job its target keeps pending for a per-job limit there
    /// (`StatusUpdate::held_by_limit`).
    #[serde(default)]
    pub stranded_s: Option<f64>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            heartbeat_interval_s: default_heartbeat_interval(),
            missed_heartbeats: default_missed_heartbeats(),
            grace_s: default_grace(),
            max_migrations: default_max_migrations(),
            job_lease_s: default_job_lease(),
            job_lease_margin_s: default_job_lease_margin(),
            first_lease_s: None,
            end_wait_s: None,
            stranded_s: None,
        }
    }
}

/// `[health] end_wait_s` when not set.
pub const DEFAULT_END_WAIT_S: f64 = 300.0;

/// `[health] stranded_s` when not set: long enough for a slurmd or a
/// node to come back from a restart, short against a drain.
pub const DEFAULT_STRANDED_S: f64 = 300.0;

fn default_job_lease() -> f64 {
    30.0
}

fn default_job_lease_margin() -> f64 {
    5.0
}

fn default_heartbeat_interval() -> f64 {
    1.0
}

fn default_missed_heartbeats() -> u32 {
    3
}

fn default_grace() -> f64 {
    60.0
}

fn default_max_migrations() -> u32 {
    3
}

/// What the store needs of `[health]`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    /// Silent this long: Degraded.
    pub degraded_after_s: f64,
    pub grace_s: f64,
    pub max_migrations: u32,
    /// `[health] job_lease_s` (0: off) and its margin.
    pub job_lease_s: f64,
    pub job_lease_margin_s: f64,
    /// `[health] first_lease_s` resolved (0: off): a run under its lease
    /// that reports running this long without asking for one died.
    pub first_lease_s: f64,
}

/// `[tls]`: PEM files of the server certificate (chain) and its private key.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// `[rebalance]`: how often the rebalancing pass runs and how much a move
/// must save (`fleet_engine::MigrationMargin`), and what becomes of a
/// proposal (`mode`) and of the move it starts.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebalanceConfig {
    /// Seconds between passes (default 300).
    #[serde(default = "default_rebalance_interval")]
    pub rebalance_interval_s: f64,
    /// A move must save more than this many USD (default 10) ...
    #[serde(default = "default_margin_usd")]
    pub margin_usd: f64,
    /// ... and more than this fraction of the cost of staying (default 0.10).
    #[serde(default = "default_margin_frac")]
    pub margin_frac: f64,
    /// What happens to proposals (default `propose`: listed only).
    #[serde(default)]
    pub mode: RebalanceMode,
    /// How long a planned move waits for a new valid checkpoint (default 120 s).
    #[serde(default = "default_checkpoint_deadline")]
    pub checkpoint_deadline_s: f64,
    /// No new checkpoint by the deadline: `stay` (default: the move is
    /// abandoned) or `resume-previous` (moved anyway, resuming from the
    /// previous valid checkpoint, or from the start when restartable).
    #[serde(default)]
    pub missed_checkpoint: MissedCheckpoint,
    /// How long the source has to confirm that the run stopped before the
    /// run is treated as dead there (default 60 s; the move goes on, the
    /// stale copy is fenced by its epoch).
    #[serde(default = "default_stop_deadline")]
    pub stop_deadline_s: f64,
    /// `auto`: at most this many moves started per pass (default 1).
    #[serde(default = "default_moves_per_pass")]
    pub max_moves_per_pass: u32,
    /// A job is not moved again within this many seconds of its last
    /// placement (default 600). Per-job totals: `[health] max_migrations`.
    #[serde(default = "default_min_move_interval")]
    pub min_move_interval_s: f64,
}

/// `[rebalance] mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RebalanceMode {
    /// No pass runs.
    Off,
    /// Proposals are listed (`fleetctl rebalance`), never carried out.
    #[default]
    Propose,
    /// Proposals are carried out when the admin approves one
    /// (`fleetctl rebalance approve <id>`).
    Approve,
    /// Proposals are carried out by the pass itself.
    Auto,
}

impl RebalanceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RebalanceMode::Off => "off",
            RebalanceMode::Propose => "propose",
            RebalanceMode::Approve => "approve",
            RebalanceMode::Auto => "auto",
        }
    }
}

impl std::str::FromStr for RebalanceMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(RebalanceMode::Off),
            "propose" => Ok(RebalanceMode::Propose),
            "approve" => Ok(RebalanceMode::Approve),
            "auto" => Ok(RebalanceMode::Auto),
            _ => {
                let shown: String = s.chars().take(32).flat_map(char::escape_default).collect();
                Err(format!("unknown rebalance mode \"{shown}\": expected off, propose, approve or auto"))
            }
        }
    }
}

/// `[rebalance] missed_checkpoint`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MissedCheckpoint {
    #[default]
    Stay,
    ResumePrevious,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        RebalanceConfig {
            rebalance_interval_s: default_rebalance_interval(),
            margin_usd: default_margin_usd(),
            margin_frac: default_margin_frac(),
            mode: RebalanceMode::default(),
            checkpoint_deadline_s: default_checkpoint_deadline(),
            missed_checkpoint: MissedCheckpoint::default(),
            stop_deadline_s: default_stop_deadline(),
            max_moves_per_pass: default_moves_per_pass(),
            min_move_interval_s: default_min_move_interval(),
        }
    }
}

fn default_checkpoint_deadline() -> f64 {
    120.0
}

fn default_stop_deadline() -> f64 {
    60.0
}

fn default_moves_per_pass() -> u32 {
    1
}

fn default_min_move_interval() -> f64 {
    600.0
}

fn default_rebalance_interval() -> f64 {
    300.0
}

fn default_margin_usd() -> f64 {
    fleet_engine::MigrationMargin::default().min_saving_usd
}

fn default_margin_frac() -> f64 {
    fleet_engine::MigrationMargin::default().min_saving_fraction
}

impl RebalanceConfig {
    pub fn margin(&self) -> fleet_engine::MigrationMargin {
        fleet_engine::MigrationMargin { min_saving_usd: self.margin_usd, min_saving_fraction: self.margin_frac }
    }
}

fn default_output_max_job_bytes() -> u64 {
    16 << 30
}

fn default_output_min_free_bytes() -> u64 {
    1 << 30
}

fn default_output_retention_days() -> f64 {
    14.0
}

fn default_heartbeat_timeout() -> f64 {
    10.0
}

impl Config {
    /// The smallest configuration: no clusters, no engine, no feeds, plain
    /// HTTP; fill in the rest with struct update syntax.
    pub fn new(listen: SocketAddr, state_dir: PathBuf, admin_token_file: PathBuf) -> Config {
        Config {
            listen,
            state_dir,
            admin_token_file,
            heartbeat_timeout_s: default_heartbeat_timeout(),
            output_retention_days: default_output_retention_days(),
            output_max_job_bytes: default_output_max_job_bytes(),
            output_min_free_bytes: default_output_min_free_bytes(),
            clusters: Vec::new(),
            placement: None,
            prices: None,
            carbon: None,
            egress: None,
            spot: None,
            rebalance: None,
            policies: None,
            tls: None,
            allow_plaintext: false,
            limits: LimitsConfig::default(),
            health: None,
            sla: None,
            start: StartConfig::default(),
        }
    }

    /// Why serving on `addr` must be refused, if it must: plain HTTP on an
    /// address other than loopback sends the bearer, job and checkpoint
    /// tokens in the clear, unless `allow_plaintext` says the network is
    /// trusted.
    pub fn plaintext_refusal(&self, addr: SocketAddr) -> Option<String> {
        (self.tls.is_none() && !self.allow_plaintext && !addr.ip().is_loopback()).then(|| {
            format!(
                "listen = {addr} is not a loopback address and [tls] is not set: every token would cross the \
                 network in the clear; set [tls] (cert_file, key_file), or allow_plaintext = true where the \
                 network is trusted or a TLS proxy is in front"
            )
        })
    }

    /// `[health]` resolved: Degraded after the missed beats (or
    /// `heartbeat_timeout_s` without the section), the grace period, the cap.
    pub fn health(&self) -> Health {
        match &self.health {
            Some(h) => Health {
                degraded_after_s: h.heartbeat_interval_s * f64::from(h.missed_heartbeats),
                grace_s: h.grace_s,
                max_migrations: h.max_migrations,
                job_lease_s: h.job_lease_s,
                job_lease_margin_s: h.job_lease_margin_s,
                first_lease_s: h.first_lease_s.unwrap_or(3.0 * h.job_lease_s),
            },
            None => Health {
                degraded_after_s: self.heartbeat_timeout_s,
                grace_s: default_grace(),
                max_migrations: default_max_migrations(),
                job_lease_s: default_job_lease(),
                job_lease_margin_s: default_job_lease_margin(),
                first_lease_s: 3.0 * default_job_lease(),
            },
        }
    }

    /// `[health] end_wait_s` resolved (see `store/ends.rs`).
    pub fn end_wait_s(&self) -> f64 {
        self.health.as_ref().and_then(|h| h.end_wait_s).unwrap_or(DEFAULT_END_WAIT_S)
    }

    /// `[health] stranded_s` resolved (0: off; see `Store::check_stranded`).
    pub fn stranded_s(&self) -> f64 {
        self.health.as_ref().and_then(|h| h.stranded_s).unwrap_or(DEFAULT_STRANDED_S)
    }

    /// `[sla]` resolved (not enforced without the section).
    pub fn sla(&self) -> Sla {
        Sla::from_config(self.sla.as_ref(), &self.clusters)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let c: Config =
            toml::from_str(text).map_err(|source| ConfigError::Parse { path: path.to_path_buf(), source })?;
        c.validate()?;
        // `[policies.*]` read from this very text, so a typo or a bad value is
        // reported at its place in the user's file (`file:line:col`), not in
        // the text the ranker builds from the kept table.
        if c.policies.is_some() {
            fleet_engine::Policies::from_toml_named(text, &path.display().to_string())
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        Ok(c)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Config::parse(&text, path)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::BTreeSet::new();
        for c in &self.clusters {
            if c.name.is_empty() {
                return Err(ConfigError::Invalid("a [[clusters]] entry has an empty name".into()));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(ConfigError::Invalid(format!("cluster {:?} is configured twice", c.name)));
            }
        }
        let mut region_ckpt: BTreeMap<&str, &str> = BTreeMap::new();
        for c in &self.clusters {
            if let Some(u) = &c.ckpt_url {
                if let Err(why) = check_ckpt_url(u) {
                    return Err(ConfigError::Invalid(format!("cluster {:?}: ckpt_url {u:?}: {why}", c.name)));
                }
                if let Some(other) = region_ckpt.insert(&c.region, u.trim_end_matches('/')) {
                    if other != u.trim_end_matches('/') {
                        return Err(ConfigError::Invalid(format!(
                            "cluster {:?}: ckpt_url {u:?} differs from {other:?} of another cluster in region {:?} \
                             (one region, one checkpoint store)",
                            c.name, c.region
                        )));
                    }
                }
            }
        }
        for c in &self.clusters {
            if let Some(g) = &c.max_gpus {
                if let Some(ty) = g.keys().find(|t| t.is_empty()) {
                    return Err(ConfigError::Invalid(format!(
                        "cluster {:?}: max_gpus has an empty GPU type {ty:?}",
                        c.name
                    )));
                }
            }
        }
        let l = &self.limits;
        if l.max_connections == 0 || l.max_connections_per_ip == 0 {
            return Err(ConfigError::Invalid(
                "[limits] max_connections and max_connections_per_ip must be >= 1".into(),
            ));
        }
        if !(l.header_read_timeout_s.is_finite() && l.header_read_timeout_s > 0.0 && l.header_read_timeout_s <= 3600.0)
        {
            return Err(ConfigError::Invalid("[limits] header_read_timeout_s must be in (0, 3600]".into()));
        }
        let min_idle = crate::MAX_WAIT_MS as f64 / 1000.0;
        if !(l.idle_timeout_s.is_finite() && l.idle_timeout_s > min_idle && l.idle_timeout_s <= 86_400.0) {
            return Err(ConfigError::Invalid(format!(
                "[limits] idle_timeout_s must be more than {min_idle} (the longest long-poll of an agent) and at most 86400"
            )));
        }
        if self.output_max_job_bytes > crate::store::MAX_OUTPUT_OFFSET {
            return Err(ConfigError::Invalid(format!(
                "output_max_job_bytes = {} is above the 1 TiB a job's stream may hold (0: no cap below that)",
                self.output_max_job_bytes
            )));
        }
        if self.output_retention_days.is_nan() || self.output_retention_days < 0.0 {
            return Err(ConfigError::Invalid("output_retention_days must be >= 0 (0 keeps output forever)".into()));
        }
        if self.heartbeat_timeout_s.is_nan() || self.heartbeat_timeout_s <= 0.0 {
            return Err(ConfigError::Invalid("heartbeat_timeout_s must be > 0".into()));
        }
        if let Some(h) = &self.health {
            if !(h.heartbeat_interval_s.is_finite() && h.heartbeat_interval_s > 0.0 && h.heartbeat_interval_s <= 3600.0)
            {
                return Err(ConfigError::Invalid("[health] heartbeat_interval_s must be in (0, 3600]".into()));
            }
            if !(1..=1000).contains(&h.missed_heartbeats) {
                return Err(ConfigError::Invalid("[health] missed_heartbeats must be in [1, 1000]".into()));
            }
            if !(h.grace_s.is_finite() && (0.0..=86_400.0).contains(&h.grace_s)) {
                return Err(ConfigError::Invalid("[health] grace_s must be in [0, 86400]".into()));
            }
        }
        for c in &self.clusters {
            if let Some(g) = c.grace_s.filter(|g| !(g.is_finite() && (0.0..=86_400.0).contains(g))) {
                return Err(ConfigError::Invalid(format!("cluster {:?}: grace_s = {g} must be in [0, 86400]", c.name)));
            }
        }
        let w = self.start.early_submit_wait_s;
        if !(w.is_finite() && (0.0..=3600.0).contains(&w)) {
            return Err(ConfigError::Invalid(format!("[start] early_submit_wait_s = {w} must be in [0, 3600]")));
        }
        if let Some(h) = &self.health {
            if !(h.job_lease_s.is_finite() && (0.0..=3600.0).contains(&h.job_lease_s)) {
                return Err(ConfigError::Invalid("[health] job_lease_s must be in [0, 3600]".into()));
            }
            if !(h.job_lease_margin_s.is_finite() && (1.0..=600.0).contains(&h.job_lease_margin_s)) {
                return Err(ConfigError::Invalid("[health] job_lease_margin_s must be in [1, 600]".into()));
            }
            if let Some(f) = h.first_lease_s {
                let ok = f.is_finite() && (f == 0.0 || (f >= h.job_lease_s && f <= 86_400.0));
                if !ok {
                    return Err(ConfigError::Invalid(format!(
                        "[health] first_lease_s = {f} must be 0 (off) or in [job_lease_s ({}), 86400]: a run asks for its first lease for up to a whole lease",
                        h.job_lease_s
                    )));
                }
            }
            if let Some(w) = h.end_wait_s.filter(|w| !(w.is_finite() && (0.0..=604_800.0).contains(w))) {
                return Err(ConfigError::Invalid(format!("[health] end_wait_s = {w} must be in [0, 604800]")));
            }
            if let Some(w) = h.stranded_s.filter(|w| !(w.is_finite() && (0.0..=604_800.0).contains(w))) {
                return Err(ConfigError::Invalid(format!("[health] stranded_s = {w} must be in [0, 604800] (0: off)")));
            }
        }
        // A silent cluster's jobs move only after every job lease a run
        // there could hold has run out, even across a restart of the
        // meta-scheduler (which forgets nothing it granted: the grants are
        // bounded by these numbers alone).
        let h = self.health();
        if h.job_lease_s > 0.0 {
            let need = h.job_lease_s + h.job_lease_margin_s;
            let (global, named) =
                if self.health.is_some() { ("[health]", "grace_s") } else { ("", "the default grace period") };
            if h.degraded_after_s + h.grace_s < need {
                return Err(ConfigError::Invalid(
                    format!(
                        "{global} {named} = {}: a silent cluster's jobs would move after {} s, before the job lease \
                     ({} s) plus its margin ({} s) has run out; raise grace_s or lower job_lease_s",
                        h.grace_s,
                        h.degraded_after_s + h.grace_s,
                        h.job_lease_s,
                        h.job_lease_margin_s
                    )
                    .trim_start()
                    .to_string(),
                ));
            }
            for c in &self.clusters {
                if let Some(g) = c.grace_s.filter(|g| h.degraded_after_s + g < need) {
                    return Err(ConfigError::Invalid(format!(
                        "cluster {:?}: grace_s = {g}: its jobs would move after {} s of silence, before the job \
                         lease ({} s) plus its margin ({} s) has run out; raise grace_s or lower [health] job_lease_s",
                        c.name,
                        h.degraded_after_s + g,
                        h.job_lease_s,
                        h.job_lease_margin_s
                    )));
                }
            }
        }
        let deadline_ok = |v: f64| v.is_finite() && (1.0..=604_800.0).contains(&v);
        for c in &self.clusters {
            if let Some(d) = c.sla_deadline_s.filter(|d| !deadline_ok(*d)) {
                return Err(ConfigError::Invalid(format!(
                    "cluster {:?}: sla_deadline_s = {d} must be in [1, 604800]",
                    c.name
                )));
            }
        }
        if let Some(s) = &self.sla {
            if !deadline_ok(s.deadline_s) {
                return Err(ConfigError::Invalid(format!(
                    "[sla] deadline_s = {} must be in [1, 604800]",
                    s.deadline_s
                )));
            }
            for (p, d) in &s.provider_deadline_s {
                if p.is_empty() || p.chars().any(char::is_control) {
                    return Err(ConfigError::Invalid(format!(
                        "[sla.provider_deadline_s] has a bad provider name {p:?}"
                    )));
                }
                if !deadline_ok(*d) {
                    return Err(ConfigError::Invalid(format!(
                        "[sla.provider_deadline_s] {p:?} = {d} must be in [1, 604800]"
                    )));
                }
            }
            if !(1..=1000).contains(&s.window) {
                return Err(ConfigError::Invalid("[sla] window must be in [1, 1000]".into()));
            }
            if !(1..=s.window).contains(&s.recover_runs) {
                return Err(ConfigError::Invalid(format!(
                    "[sla] recover_runs = {} must be in [1, window = {}]",
                    s.recover_runs, s.window
                )));
            }
            if !(s.cooldown_s.is_finite() && (0.0..=604_800.0).contains(&s.cooldown_s)) {
                return Err(ConfigError::Invalid("[sla] cooldown_s must be in [0, 604800]".into()));
            }
            if !(s.penalty_frac.is_finite() && (0.0..=100.0).contains(&s.penalty_frac)) {
                return Err(ConfigError::Invalid("[sla] penalty_frac must be in [0, 100]".into()));
            }
        }
        if let Some(r) = &self.rebalance {
            // At most a day: `run` turns it into a Duration, which a huge
            // value overflowed (a panic at start).
            if !(r.rebalance_interval_s.is_finite()
                && r.rebalance_interval_s >= 1.0
                && r.rebalance_interval_s <= 86_400.0)
            {
                return Err(ConfigError::Invalid("[rebalance] rebalance_interval_s must be in [1, 86400]".into()));
            }
            if !(r.margin_usd.is_finite() && r.margin_usd >= 0.0 && r.margin_frac.is_finite() && r.margin_frac >= 0.0) {
                return Err(ConfigError::Invalid("[rebalance] margin_usd and margin_frac must be >= 0".into()));
            }
            for (name, v) in
                [("checkpoint_deadline_s", r.checkpoint_deadline_s), ("stop_deadline_s", r.stop_deadline_s)]
            {
                if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
                    return Err(ConfigError::Invalid(format!("[rebalance] {name} = {v} must be in (0, 86400]")));
                }
            }
            if !(r.min_move_interval_s.is_finite() && (0.0..=31_536_000.0).contains(&r.min_move_interval_s)) {
                return Err(ConfigError::Invalid("[rebalance] min_move_interval_s must be in [0, 31536000]".into()));
            }
            if !(1..=10_000).contains(&r.max_moves_per_pass) {
                return Err(ConfigError::Invalid("[rebalance] max_moves_per_pass must be in [1, 10000]".into()));
            }
        }
        if let Some(p) = &self.placement {
            if p.policy.as_deref() == Some("") {
                return Err(ConfigError::Invalid("[placement] policy is empty".into()));
            }
            if let (Some(policy), None) = (p.engine_policy(), &p.fleet_model) {
                return Err(ConfigError::Invalid(format!(
                    "[placement] policy {policy:?} is a cost-engine policy: set [placement] fleet_model"
                )));
            }
        }
        Ok(())
    }

    /// The site default checkpoint location of `region`, if one is set.
    pub fn region_ckpt_url(&self, region: &str) -> Option<&str> {
        self.clusters.iter().filter(|c| c.region == region).find_map(|c| c.ckpt_url.as_deref())
    }

    /// Every token file, admin first, for change detection.
    pub fn token_paths(&self) -> Vec<PathBuf> {
        let mut v = vec![self.admin_token_file.clone()];
        for c in &self.clusters {
            v.push(c.token_file.clone());
            v.extend(c.token_files.iter().cloned());
        }
        v
    }

    /// Read the admin and cluster tokens from their files: each non-empty
    /// line of a file is one accepted token (surrounding whitespace
    /// trimmed). A file without any token, or one token shared by two
    /// principals, is an error.
    pub fn read_tokens(&self) -> Result<Tokens, ConfigError> {
        let read = |p: &Path, out: &mut Vec<Secret>| -> Result<(), ConfigError> {
            let t = std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.to_path_buf(), source })?;
            let before = out.len();
            out.extend(t.lines().map(str::trim).filter(|l| !l.is_empty()).map(|l| Secret(l.to_string())));
            if out.len() == before {
                return Err(ConfigError::Invalid(format!("token file {} is empty", p.display())));
            }
            Ok(())
        };
        let mut admin = Vec::new();
        read(&self.admin_token_file, &mut admin)?;
        let mut clusters = BTreeMap::new();
        for c in &self.clusters {
            let mut ts = Vec::new();
            read(&c.token_file, &mut ts)?;
            for p in &c.token_files {
                read(p, &mut ts)?;
            }
            clusters.insert(c.name.clone(), ts);
        }
        let mut owner: BTreeMap<&str, &str> = admin.iter().map(|t| (t.0.as_str(), "the admin")).collect();
        for (name, ts) in &clusters {
            for t in ts {
                if let Some(other) = owner.insert(t.0.as_str(), name.as_str()) {
                    if other != name {
                        return Err(ConfigError::Invalid(format!(
                            "cluster {name:?} and {other} share a token: each principal needs its own"
                        )));
                    }
                }
            }
        }
        Ok(Tokens { admin, clusters })
    }
}

/// A secret string whose `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

/// The accepted tokens (several per principal during a rotation).
#[derive(Clone)]
pub struct Tokens {
    pub admin: Vec<Secret>,
    /// Cluster name → its agent's tokens.
    pub clusters: BTreeMap<String, Vec<Secret>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let counts: BTreeMap<&str, usize> = self.clusters.iter().map(|(n, t)| (n.as_str(), t.len())).collect();
        f.debug_struct("Tokens").field("admin", &self.admin.len()).field("clusters", &counts).finish()
    }
}

/// A checkpoint location Fleet can hand a job: `s3://bucket[/prefix]` or
/// `file:///dir`, no whitespace, control characters or commas (it travels
/// in sbatch's comma-separated `--export`), at most 1024 bytes.
pub fn check_ckpt_url(u: &str) -> Result<(), &'static str> {
    if u.len() > 1024 {
        return Err("longer than 1024 bytes");
    }
    if u.chars().any(|c| c.is_whitespace() || c.is_control() || c == ',') {
        return Err("has whitespace, a control character or a comma");
    }
    let rest = match (u.strip_prefix("s3://"), u.strip_prefix("file:///")) {
        (Some(r), _) => r,
        (_, Some(r)) => r,
        _ => return Err("expected s3://bucket/prefix or file:///dir"),
    };
    if rest.split('/').next().unwrap_or("").is_empty() {
        return Err("no bucket or directory");
    }
    if rest.split('/').any(|p| p == "." || p == "..") {
        return Err("'.' and '..' are not allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Result<&str, &str>) {
        let got = Config::parse(input, Path::new("t.toml"));
        match (got, expected) {
            (Ok(c), Ok(name)) => assert_eq!(c.clusters.first().map(|c| c.name.as_str()).unwrap_or(""), name),
            (Err(e), Err(msg)) => {
                let s = format!("{e}: {}", std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default());
                assert!(s.contains(msg), "error {s:?} does not contain {msg:?}")
            }
            (got, expected) => panic!("got {got:?}, expected {expected:?}"),
        }
    }

    const BASE: &str = "listen = \"127.0.0.1:16900\"\nstate_dir = \"/tmp/x\"\nadmin_token_file = \"/tmp/a\"\n";

    #[test]
    fn sla_deadlines_cluster_then_provider_then_default() {
        let text = format!(
            "{BASE}[[clusters]]\nname = \"a\"\nprovider = \"aws\"\ntoken_file = \"/t\"\nsla_deadline_s = 60\n\
             [[clusters]]\nname = \"b\"\nprovider = \"aws\"\ntoken_file = \"/t\"\n\
             [[clusters]]\nname = \"c\"\nprovider = \"onprem\"\ntoken_file = \"/t\"\n\
             [sla]\ndeadline_s = 300\n[sla.provider_deadline_s]\naws = 600\n"
        );
        let sla = Config::parse(&text, Path::new("t.toml")).unwrap().sla();
        assert!(sla.enforced);
        let got: Vec<f64> =
            [("a", "aws"), ("b", "aws"), ("c", "onprem")].iter().map(|(c, p)| sla.deadline(c, p)).collect();
        assert_eq!(got, [60.0, 600.0, 300.0]);
        // Without [sla]: measured against the default, not enforced.
        let off = Config::parse(BASE, Path::new("t.toml")).unwrap().sla();
        assert_eq!((off.enforced, off.deadline("x", "y"), off.window, off.recover_runs), (false, 300.0, 20, 3));
    }

    #[test]
    fn plain_http_off_loopback_is_refused_unless_allowed() {
        let plain = Config::parse(BASE, Path::new("t.toml")).unwrap();
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        for ok in ["127.0.0.1:16900", "[::1]:16900", "127.0.0.2:1"] {
            assert_eq!(plain.plaintext_refusal(at(ok)), None, "{ok}");
        }
        for off in ["0.0.0.0:16900", "10.0.0.5:16900", "[::]:16900"] {
            let why = plain.plaintext_refusal(at(off)).unwrap();
            assert!(why.contains(&format!("listen = {off} is not a loopback address")), "{why}");
        }
        let allowed = Config::parse(&format!("allow_plaintext = true\n{BASE}"), Path::new("t.toml")).unwrap();
        assert_eq!(allowed.plaintext_refusal(at("0.0.0.0:16900")), None);
        let tls = Config::parse(&format!("{BASE}[tls]\ncert_file = \"/c\"\nkey_file = \"/k\"\n"), Path::new("t.toml"))
            .unwrap();
        assert_eq!(tls.plaintext_refusal(at("0.0.0.0:16900")), None);
    }

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../../conf/metasched.toml");
        let c = Config::parse(text, Path::new("conf/metasched.toml")).unwrap();
        assert_eq!(c.output_retention_days, 14.0);
        assert!(c.tls.is_none(), "the example's [tls] is commented out");
    }

    #[test]
    fn table() {
        check(BASE, Ok(""));
        check(
            &format!(
                "{BASE}[[clusters]]\nname = \"alpha\"\nregion = \"r\"\nprovider = \"onprem\"\ntoken_file = \"/t\"\n"
            ),
            Ok("alpha"),
        );
        check(&format!("{BASE}bogus = 1\n"), Err("unknown field `bogus`"));
        check(
            &format!("{BASE}[[clusters]]\nname = \"a\"\ntoken_file = \"/t\"\ncolour = 1\n"),
            Err("unknown field `colour`"),
        );
        check(
            &format!("{BASE}[[clusters]]\nname = \"a\"\ntoken_file = \"/t\"\n[[clusters]]\nname = \"a\"\ntoken_file = \"/t\"\n"),
            Err("configured twice"),
        );
        check(&format!("{BASE}[placement]\npolicy = \"first-fit\"\n"), Ok(""));
        check(&format!("{BASE}[placement]\npolicy = \"cost\"\nfleet_model = \"/f.toml\"\n"), Ok(""));
        check(&format!("{BASE}[placement]\npolicy = \"cost\"\n"), Err("set [placement] fleet_model"));
        check(&format!("{BASE}[placement]\npolicy = \"\"\n"), Err("empty"));
        check(&format!("{BASE}heartbeat_timeout_s = 0\n"), Err("must be > 0"));
        check(&format!("{BASE}output_retention_days = 0\n"), Ok(""));
        check(&format!("{BASE}output_retention_days = -1\n"), Err("output_retention_days must be >= 0"));
        check(&format!("{BASE}[tls]\ncert_file = \"/c.pem\"\nkey_file = \"/k.pem\"\n"), Ok(""));
        let ck = |a: &str, b: &str| {
            format!(
                "{BASE}[[clusters]]\nname = \"a\"\nregion = \"east\"\ntoken_file = \"/t\"\nckpt_url = \"{a}\"\n\
                 [[clusters]]\nname = \"b\"\nregion = \"east\"\ntoken_file = \"/t\"\nckpt_url = \"{b}\"\n"
            )
        };
        check(&ck("s3://ckpt-east/fleet", "s3://ckpt-east/fleet/"), Ok("a"));
        check(&ck("s3://ckpt-east/fleet", "s3://other/fleet"), Err("one region, one checkpoint store"));
        check(&ck("s3://ckpt-east/a,b", "s3://ckpt-east/a,b"), Err("comma"));
        check(&ck("gs://x", "gs://x"), Err("expected s3://"));
        check(&ck("s3://b/../x", "s3://b/../x"), Err("'..'"));
        check(&ck("file:///srv/ckpt", "file:///srv/ckpt"), Ok("a"));
        check(&format!("{BASE}[tls]\ncert_file = \"/c.pem\"\n"), Err("missing field `key_file`"));
        check("listen = \"nope\"\n", Err("t.toml"));
        check(&format!("{BASE}prices = \"/p.csv\"\ncarbon = \"/c.csv\"\n"), Ok(""));
        check(&format!("{BASE}[policies.cheap]\ntime_value_usd_per_gpu_hour = 1.0\n"), Ok(""));
        // Policy errors point at the user's file: line 5 is `price = 1.0`.
        check(&format!("{BASE}[policies.cheap]\nprice = 1.0\n"), Err("t.toml:5:1: unknown field `price`"));
        check(
            &format!("{BASE}\n[policies.cheap]\ntime_value_usd_per_gpu_hour = \"x\"\n"),
            Err("t.toml:6:31: invalid type"),
        );
        check(&format!("{BASE}[policies.cheap]\nspot_max_lost_h = -1.0\n"), Err("t.toml:4:1: policy cheap"));
        check(&format!("{BASE}carbon = \"/c\"\negress = \"/n\"\nspot = \"/s\"\n"), Ok(""));
        check(&format!("{BASE}[rebalance]\n"), Ok(""));
        check(&format!("{BASE}[sla]\n"), Ok(""));
        check(
            &format!(
                "{BASE}[[clusters]]\nname = \"a\"\ntoken_file = \"/t\"\nsla_deadline_s = 60\n\
                 [sla]\ndeadline_s = 300\nwindow = 10\nrecover_runs = 2\ncooldown_s = 0\npenalty_frac = 0.5\n\
                 [sla.provider_deadline_s]\naws = 600\n"
            ),
            Ok("a"),
        );
        check(&format!("{BASE}[sla]\ndeadline = 300\n"), Err("unknown field `deadline`"));
        check(&format!("{BASE}[sla]\ndeadline_s = 0\n"), Err("[sla] deadline_s = 0 must be in [1, 604800]"));
        check(&format!("{BASE}[sla]\ndeadline_s = nan\n"), Err("deadline_s = NaN must be in"));
        check(&format!("{BASE}[sla]\ndeadline_s = \"5m\"\n"), Err("t.toml"));
        check(&format!("{BASE}[start]\nearly_submit_wait_s = 0\n"), Ok(""));
        check(&format!("{BASE}[start]\nearly_submit_wait_s = 45\n"), Ok(""));
        check(
            &format!("{BASE}[start]\nearly_submit_wait_s = -1\n"),
            Err("early_submit_wait_s = -1 must be in [0, 3600]"),
        );
        check(&format!("{BASE}[start]\nearly_submit_wait_s = nan\n"), Err("early_submit_wait_s = NaN"));
        check(&format!("{BASE}[start]\nearly_wait = 5\n"), Err("unknown field"));
        assert_eq!(Config::parse(BASE, Path::new("t.toml")).unwrap().start.early_submit_wait_s, 30.0);
        check(&format!("{BASE}[sla]\nwindow = 0\n"), Err("window must be in [1, 1000]"));
        check(
            &format!("{BASE}[sla]\nwindow = 5\nrecover_runs = 6\n"),
            Err("recover_runs = 6 must be in [1, window = 5]"),
        );
        check(&format!("{BASE}[sla]\nrecover_runs = 0\n"), Err("recover_runs = 0"));
        check(&format!("{BASE}[sla]\ncooldown_s = -1\n"), Err("cooldown_s must be in [0, 604800]"));
        check(&format!("{BASE}[sla]\npenalty_frac = inf\n"), Err("penalty_frac must be in [0, 100]"));
        check(&format!("{BASE}[sla.provider_deadline_s]\naws = -5\n"), Err("\"aws\" = -5 must be in [1, 604800]"));
        check(&format!("{BASE}[sla.provider_deadline_s]\n\"\" = 5\n"), Err("bad provider name"));
        check(&format!("{BASE}[sla.provider_deadline_s]\naws = \"x\"\n"), Err("t.toml"));
        check(
            &format!("{BASE}[[clusters]]\nname = \"a\"\ntoken_file = \"/t\"\nsla_deadline_s = 0.5\n"),
            Err("cluster \"a\": sla_deadline_s = 0.5 must be in [1, 604800]"),
        );
        check(&format!("{BASE}[health]\n"), Ok(""));
        check(
            &format!(
                "{BASE}[health]\nheartbeat_interval_s = 2\nmissed_heartbeats = 5\ngrace_s = 10\njob_lease_s = 10\n"
            ),
            Ok(""),
        );
        check(&format!("{BASE}[health]\nheartbeat_interval_s = 0\n"), Err("heartbeat_interval_s must be in (0, 3600]"));
        check(&format!("{BASE}[health]\nheartbeat_interval_s = nan\n"), Err("heartbeat_interval_s must be in"));
        check(&format!("{BASE}[health]\nmissed_heartbeats = 0\n"), Err("missed_heartbeats must be in [1, 1000]"));
        check(&format!("{BASE}[health]\ngrace_s = -1\n"), Err("grace_s must be in [0, 86400]"));
        check(&format!("{BASE}[health]\ngrace_s = inf\n"), Err("grace_s must be in [0, 86400]"));
        check(&format!("{BASE}[health]\ngrace = 1\n"), Err("unknown field `grace`"));
        // The job lease: bounded, and a silent cluster's jobs never move
        // before the lease plus its margin has run out (3 × 1 s + grace).
        check(&format!("{BASE}[health]\ngrace_s = 10\njob_lease_s = 8\njob_lease_margin_s = 4\n"), Ok(""));
        check(&format!("{BASE}[health]\ngrace_s = 10\njob_lease_s = 0\n"), Ok(""));
        check(
            &format!("{BASE}[health]\ngrace_s = 10\njob_lease_s = 8\njob_lease_margin_s = 6\n"),
            Err("[health] grace_s = 10: a silent cluster's jobs would move after 13 s, before the job lease (8 s) plus its margin (6 s)"),
        );
        check(&format!("{BASE}[health]\njob_lease_s = -1\n"), Err("job_lease_s must be in [0, 3600]"));
        check(&format!("{BASE}[health]\njob_lease_margin_s = 0\n"), Err("job_lease_margin_s must be in [1, 600]"));
        check(
            &format!("{BASE}[health]\ngrace_s = 10\njob_lease_s = 8\njob_lease_margin_s = 4\nfirst_lease_s = 0\n"),
            Ok(""),
        );
        check(
            &format!("{BASE}[health]\ngrace_s = 10\njob_lease_s = 8\njob_lease_margin_s = 4\nfirst_lease_s = 24\n"),
            Ok(""),
        );
        check(
            &format!("{BASE}[health]\ngrace_s = 10\njob_lease_s = 8\njob_lease_margin_s = 4\nfirst_lease_s = 5\n"),
            Err("first_lease_s = 5 must be 0 (off) or in [job_lease_s (8), 86400]"),
        );
        check(&format!("{BASE}[health]\nfirst_lease_s = nan\n"), Err("first_lease_s"));
        check(&format!("{BASE}[health]\nend_wait_s = 0\n"), Ok(""));
        check(&format!("{BASE}[health]\nend_wait_s = -1\n"), Err("end_wait_s = -1 must be in [0, 604800]"));
        check(&format!("{BASE}[health]\nend_wait_s = inf\n"), Err("end_wait_s = inf must be in"));
        check(&format!("{BASE}[health]\nstranded_s = 0\n"), Ok(""));
        check(&format!("{BASE}[health]\nstranded_s = -5\n"), Err("stranded_s = -5 must be in [0, 604800] (0: off)"));
        check(&format!("{BASE}[health]\nstranded_s = nan\n"), Err("stranded_s = NaN must be in"));
        check(&format!("{BASE}[health]\njob_lease_margin_s = nan\n"), Err("job_lease_margin_s must be in [1, 600]"));
        check(&format!("{BASE}[rebalance]\nrebalance_interval_s = 60\nmargin_usd = 1\nmargin_frac = 0\n"), Ok(""));
        check(&format!("{BASE}[rebalance]\nrebalance_interval_s = 0\n"), Err("must be in [1, 86400]"));
        // A period no Duration holds was accepted and panicked at start.
        check(&format!("{BASE}[rebalance]\nrebalance_interval_s = 1e20\n"), Err("must be in [1, 86400]"));
        check(&format!("{BASE}[rebalance]\nmargin_usd = -1\n"), Err("must be >= 0"));
        check(&format!("{BASE}[rebalance]\nevery = 1\n"), Err("unknown field `every`"));
        check(&format!("{BASE}[rebalance]\nmode = \"auto\"\nmissed_checkpoint = \"resume-previous\"\n"), Ok(""));
        check(&format!("{BASE}[rebalance]\nmode = \"approve\"\ncheckpoint_deadline_s = 30\n"), Ok(""));
        check(&format!("{BASE}[rebalance]\nmode = \"off\"\nmax_moves_per_pass = 5\n"), Ok(""));
        check(&format!("{BASE}[rebalance]\nmode = \"yes\"\n"), Err("unknown variant `yes`"));
        check(&format!("{BASE}[rebalance]\nmode = 1\n"), Err("line 5, column 8"));
        check(&format!("{BASE}[rebalance]\nmissed_checkpoint = \"retry\"\n"), Err("unknown variant `retry`"));
        check(
            &format!("{BASE}[rebalance]\ncheckpoint_deadline_s = 0\n"),
            Err("checkpoint_deadline_s = 0 must be in (0, 86400]"),
        );
        check(&format!("{BASE}[rebalance]\nstop_deadline_s = -5\n"), Err("stop_deadline_s = -5 must be in (0, 86400]"));
        check(&format!("{BASE}[rebalance]\nmax_moves_per_pass = 0\n"), Err("max_moves_per_pass must be in [1, 10000]"));
        check(&format!("{BASE}[rebalance]\nmin_move_interval_s = nan\n"), Err("min_move_interval_s must be in"));
        let c = "[[clusters]]\nname = \"a\"\ntoken_file = \"/t\"\n";
        check(&format!("{BASE}{c}token_files = [\"/t2\"]\nmax_nodes = 2\nmax_gpus = {{ h100 = 16 }}\n"), Ok("a"));
        check(&format!("{BASE}{c}max_gpus = {{ \"\" = 1 }}\n"), Err("empty GPU type"));
        check(&format!("{BASE}{c}max_gpus = {{ h100 = -1 }}\n"), Err("t.toml"));
        check(&format!("{BASE}[limits]\nmax_connections = 10\nheader_read_timeout_s = 2\n"), Ok(""));
        check(&format!("{BASE}[limits]\nmax_connections = 0\n"), Err("must be >= 1"));
        check(&format!("{BASE}[limits]\nheader_read_timeout_s = 0\n"), Err("header_read_timeout_s"));
        check(&format!("{BASE}[limits]\nidle_timeout_s = 30\n"), Err("longest long-poll"));
        check(&format!("{BASE}[limits]\nmax_conns = 1\n"), Err("unknown field `max_conns`"));
    }

    #[test]
    fn tokens_several_per_file_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("admin"), "  admin-secret-1\n\nadmin-secret-2\n").unwrap();
        std::fs::write(p("a"), "alpha-secret\n").unwrap();
        std::fs::write(p("a2"), "alpha-secret-2").unwrap();
        let mut c = Config::new("127.0.0.1:1".parse().unwrap(), p("state"), p("admin"));
        c.clusters.push(ClusterConfig {
            name: "a".into(),
            token_file: p("a"),
            token_files: vec![p("a2")],
            ..Default::default()
        });
        let t = c.read_tokens().unwrap();
        let names = |v: &[Secret]| v.iter().map(|s| s.expose().to_string()).collect::<Vec<_>>();
        assert_eq!(names(&t.admin), ["admin-secret-1", "admin-secret-2"]);
        assert_eq!(names(&t.clusters["a"]), ["alpha-secret", "alpha-secret-2"]);
        let shown = format!("{t:?} {:?} {:#?}", t.admin[0], t);
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("redacted") && shown.contains("\"a\": 2"), "{shown}");
        std::fs::write(p("a2"), "admin-secret-2\n").unwrap();
        assert!(c.read_tokens().unwrap_err().to_string().contains("share a token"));
        std::fs::write(p("a2"), "\n").unwrap();
        assert!(c.read_tokens().unwrap_err().to_string().contains("is empty"));
    }
}
