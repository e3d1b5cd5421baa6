//! The static fleet model: clusters, node pools, prices, topology, power,
//! datasets and the network between regions.
//!
//! The model is built once from a [`FleetConfig`] (usually parsed from TOML)
//! and is immutable afterwards; reloading feeds builds a new model (wrap it
//! in an `Arc` and swap). Building interns GPU types, regions, providers and
//! carbon zones into small integer ids and precomputes per-cluster indexes so
//! that the decision path never compares strings.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Most distinct GPU types a model may hold (job type sets are a `u64` mask).
pub const MAX_GPU_TYPES: usize = 64;

/// Index of a cluster in [`FleetModel::clusters`].
pub type ClusterId = u32;
/// Index of a pool in [`Cluster::pools`].
pub type PoolId = u16;
/// Index of an interned GPU type in [`FleetModel::gpu_types`].
pub type GpuTypeId = u16;
/// Index of an interned `provider:region` in [`FleetModel::regions`].
pub type RegionId = u32;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A TOML syntax or shape error (unknown key, wrong type), with its
    /// position in the file (1-based line and column).
    #[error("{file}:{line}:{col}: {msg}")]
    Toml { file: String, line: usize, col: usize, msg: String },
    /// A validation error of the built model, at the line of the cluster
    /// (or team, dataset) it concerns when that line is known.
    #[error("{file}:{line}: {source}")]
    At {
        file: String,
        line: usize,
        #[source]
        source: Box<ModelError>,
    },
    #[error("fleet has no clusters (the table is `[[clusters]]`)")]
    NoClusters,
    #[error("team {team}: {msg}")]
    Team { team: String, msg: String },
    #[error("GPU model {model}: {msg}")]
    GpuModel { model: String, msg: String },
    #[error("cluster {cluster}: {msg}")]
    Cluster { cluster: String, msg: String },
    #[error("dataset {uri}: {msg}")]
    Dataset { uri: String, msg: String },
    #[error("network link {from} -> {to}: {msg}")]
    Link { from: String, to: String, msg: String },
    #[error("more than {MAX_GPU_TYPES} distinct GPU types")]
    TooManyGpuTypes,
    #[error("duplicate cluster name {0}")]
    DuplicateCluster(String),
}

/// `slurm` or `kubernetes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedulerKind {
    #[default]
    Slurm,
    Kubernetes,
}

/// How a rack is cooled; sets the default PUE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cooling {
    #[default]
    Air,
    Liquid,
}

impl Cooling {
    /// Default power usage effectiveness for the class (air 1.4, liquid 1.15).
    pub fn default_pue(self) -> f64 {
        match self {
            Cooling::Air => 1.4,
            Cooling::Liquid => 1.15,
        }
    }
}

/// Static health as the admin configured it (live health is in the state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    #[default]
    Up,
    /// Usable; placement adds the configured degraded wait.
    Degraded,
    /// Drained by the admin: never a candidate.
    Down,
}

/// USD per GPU-hour, per pricing model. `None` = not offered. Strict like
/// every table of the fleet file: a misspelt key (`on_demnad`) is an error,
/// not a price left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    #[serde(default)]
    pub on_demand: Option<f64>,
    #[serde(default)]
    pub spot: Option<f64>,
    /// Amortized on-prem cost (hardware + power + ops over the lifetime).
    #[serde(default)]
    pub onprem: Option<f64>,
    /// Of `onprem`, what an owned GPU costs only while it is used (power and
    /// cooling): the rest is the hardware's share, paid whether it is used or
    /// not. Only beside `onprem` on an owned cluster, at most `onprem`. A
    /// policy with `owned_at_running_cost` scores owned GPUs at it; the
    /// simulator reports each policy's cash spend with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<f64>,
}

impl Prices {
    /// An owned pool's price per GPU-hour as it is billed: its amortized
    /// `onprem` price, else its `on_demand` one (an owned pool priced so).
    pub fn amortized(&self) -> Option<f64> {
        self.onprem.or(self.on_demand)
    }
}

// ---------------------------------------------------------------------------
// Configuration (serde, the TOML shape)
// ---------------------------------------------------------------------------

/// The TOML file: `[overheads]`, `[gpu_models.<TYPE>]`, `[[clusters]]` with
/// `[[clusters.pools]]`, `[[datasets]]`, `[[links]]`, `[[teams]]`. See
/// `conf/fleet-sample.toml`. Every table denies unknown keys: a typo is an
/// error with its file:line, never a silent default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    #[serde(default)]
    pub overheads: Overheads,
    #[serde(default)]
    pub clusters: Vec<ClusterConfig>,
    #[serde(default)]
    pub datasets: Vec<DatasetConfig>,
    #[serde(default)]
    pub links: Vec<LinkConfig>,
    /// Per GPU type (as named in pools): relative training throughput and
    /// board power; overrides [`default_gpu_model`].
    #[serde(default)]
    pub gpu_models: BTreeMap<String, GpuModelConfig>,
    /// GPU type whose speed job durations are measured on (default `A100`,
    /// relative throughput 1.0 in the built-in table).
    #[serde(default)]
    pub reference_gpu: Option<String>,
    /// Teams (the trace's / accounting's team label) and their home cluster.
    #[serde(default)]
    pub teams: Vec<TeamConfig>,
}

/// `[gpu_models.H100]`: speed and power of one GPU type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuModelConfig {
    /// Training throughput relative to the A100 (= 1.0).
    #[serde(default)]
    pub relative_throughput: Option<f64>,
    /// Board power at full load (W).
    #[serde(default)]
    pub power_w: Option<f64>,
}

/// `[[teams]]`: a team and the cluster it runs on today (its home).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamConfig {
    pub name: String,
    pub home: String,
}

/// Fixed costs of running a job away from home and of moving data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Overheads {
    /// Stand-in start at the origin + meta-scheduler hop + remote sbatch (s).
    pub remote_submit_s: f64,
    /// Latency to start staging each dataset (listing, auth, first byte) (s).
    pub staging_latency_s: f64,
    /// Time to restore a checkpoint on a new cluster (s).
    pub restore_s: f64,
    /// Checkpoint size when the job does not say (GB).
    pub default_ckpt_size_gb: f64,
    /// Internet egress USD/GB charged by the source provider when data
    /// crosses providers, per provider; `default` for the others.
    pub internet_egress_usd_per_gb: BTreeMap<String, f64>,
    /// Egress USD/GB between two regions of the same provider when no
    /// link or matrix says otherwise.
    pub intra_provider_egress_usd_per_gb: f64,
    /// Bandwidth (Gbps): same region, same provider, across providers.
    pub same_region_gbps: f64,
    pub intra_provider_gbps: f64,
    pub cross_provider_gbps: f64,
    /// Carbon intensity used when no feed covers a zone (gCO2/kWh).
    pub default_carbon_g_per_kwh: f64,
    /// Extra expected wait on a `degraded` cluster (s).
    pub degraded_wait_s: f64,
}

impl Default for Overheads {
    fn default() -> Self {
        let mut internet = BTreeMap::new();
        internet.insert("default".to_string(), 0.09);
        Overheads {
            remote_submit_s: 120.0,
            staging_latency_s: 60.0,
            restore_s: 300.0,
            default_ckpt_size_gb: 50.0,
            internet_egress_usd_per_gb: internet,
            intra_provider_egress_usd_per_gb: 0.02,
            same_region_gbps: 100.0,
            intra_provider_gbps: 25.0,
            cross_provider_gbps: 10.0,
            default_carbon_g_per_kwh: 400.0,
            degraded_wait_s: 1800.0,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub name: String,
    pub provider: String,
    pub region: String,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub scheduler: SchedulerKind,
    /// Electricity Maps zone name (e.g. `US-CAL-CISO`).
    #[serde(default)]
    pub carbon_zone: Option<String>,
    /// Owned hardware: priced by `onprem`, never billed for provisioning.
    #[serde(default)]
    pub onprem: bool,
    /// Power usage effectiveness; default from the pools' cooling class.
    #[serde(default)]
    pub pue: Option<f64>,
    /// Cloud node boot + image pull before a job starts (s); billed.
    #[serde(default)]
    pub provision_s: f64,
    #[serde(default)]
    pub health: Health,
    /// Longest time limit the cluster accepts (s).
    #[serde(default)]
    pub max_time_limit_s: Option<f64>,
    /// Expected spot preemptions per hour of spot run time.
    #[serde(default)]
    pub spot_preemptions_per_hour: f64,
    /// Per GPU type (as named in the pools): USD per GPU-hour.
    #[serde(default)]
    pub prices: BTreeMap<String, Prices>,
    /// Per GPU type: mean queue wait of jobs that did not start at once (s),
    /// from the cluster's accounting history.
    #[serde(default)]
    pub wait_history_s: BTreeMap<String, f64>,
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    #[serde(default)]
    pub name: Option<String>,
    pub gpu_type: String,
    pub gpus_per_node: u32,
    pub nodes: u32,
    /// GPUs per NVLink domain (8 for an HGX node, 72 for an NVL72 rack);
    /// default `gpus_per_node`.
    #[serde(default)]
    pub nvlink_domain_gpus: Option<u32>,
    /// InfiniBand fabric the pool's nodes sit on (None = Ethernet only).
    #[serde(default)]
    pub ib_fabric: Option<String>,
    /// Nodes per non-blocking IB island (default: the whole pool).
    #[serde(default)]
    pub ib_island_nodes: Option<u32>,
    #[serde(default)]
    pub rack_power_cap_w: Option<f64>,
    #[serde(default)]
    pub nodes_per_rack: Option<u32>,
    /// Board power per GPU at full load (default by type).
    #[serde(default)]
    pub gpu_power_w: Option<f64>,
    /// CPU, memory, NICs, fans per node at full load (default 1500 W).
    #[serde(default)]
    pub node_overhead_w: Option<f64>,
    #[serde(default)]
    pub cooling: Cooling,
    /// Overrides the cluster's price for this pool.
    #[serde(default)]
    pub prices: Option<Prices>,
}

/// A dataset (or a checkpoint bucket: URIs match by longest prefix).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetConfig {
    pub uri: String,
    /// `provider:region` where a replica lives.
    pub locations: Vec<String>,
    #[serde(default)]
    pub size_gb: f64,
}

/// An explicit link between two `provider:region`s (one direction).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub usd_per_gb: Option<f64>,
    #[serde(default)]
    pub gbps: Option<f64>,
}

// ---------------------------------------------------------------------------
// The built model
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub struct NodePool {
    pub name: String,
    pub gpu_type: GpuTypeId,
    pub gpus_per_node: u32,
    pub nodes: u32,
    pub total_gpus: u32,
    pub nvlink_domain_gpus: u32,
    pub ib_fabric: Option<String>,
    /// GPUs in one IB island (0 when the pool has no IB).
    pub ib_island_gpus: u32,
    pub rack_power_cap_w: Option<f64>,
    pub nodes_per_rack: u32,
    pub gpu_power_w: f64,
    pub node_overhead_w: f64,
    pub cooling: Cooling,
    pub prices: Prices,
    /// Mean wait when the job does not fit at once (s).
    pub mean_wait_s: f64,
    /// Training throughput of the pool's GPU type relative to the
    /// reference GPU: a job's run time here is its duration ÷ this.
    pub speed: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub provider: String,
    pub provider_id: u32,
    /// `provider:region`
    pub region: String,
    pub region_id: RegionId,
    pub zone: Option<String>,
    pub scheduler: SchedulerKind,
    pub carbon_zone: Option<String>,
    pub carbon_zone_id: Option<u32>,
    pub onprem: bool,
    pub pue: f64,
    pub provision_s: f64,
    pub health: Health,
    pub max_time_limit_s: Option<f64>,
    pub spot_preemptions_per_hour: f64,
    pub pools: Vec<NodePool>,
    /// Bit `t` set when some pool has GPU type `t`.
    pub type_mask: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub uri: String,
    pub locations: Vec<RegionId>,
    pub size_gb: f64,
}

/// The immutable fleet model. Build with [`FleetModel::from_toml_str`] or
/// [`FleetModel::build`].
#[derive(Clone, Debug)]
pub struct FleetModel {
    pub clusters: Vec<Cluster>,
    pub gpu_types: Vec<String>,
    /// `provider:region` names.
    pub regions: Vec<String>,
    /// Provider of each region.
    pub region_provider: Vec<u32>,
    pub providers: Vec<String>,
    pub carbon_zones: Vec<String>,
    pub datasets: Vec<Dataset>,
    pub overheads: Overheads,
    /// Dense `regions × regions` tables (row = source).
    egress: Vec<f64>,
    gbps: Vec<f64>,
    by_name: HashMap<String, ClusterId>,
    /// Relative throughput of each interned GPU type (reference = 1.0).
    pub gpu_speed: Vec<f64>,
    /// Declared teams: (name, home cluster).
    pub teams: Vec<(String, ClusterId)>,
    /// Every cluster with the lowest USD per unit of work any of its pools
    /// sells (price ÷ speed, any pricing), cheapest first: [`crate::decide`]
    /// scores clusters in this order and stops when the rest cannot win.
    pub cheapest_per_work: Vec<(f64, ClusterId)>,
    /// The same with owned pools at their running cost where the fleet gives
    /// one (`Prices::running`): the order for policies with
    /// `owned_at_running_cost` (see [`FleetModel::cheapest_for`]).
    pub cheapest_per_work_running: Vec<(f64, ClusterId)>,
    /// The config it was built from (kept to rebuild with new feeds).
    pub config: FleetConfig,
}

/// Canonical GPU type name: trimmed, upper case (`h100` → `H100`).
pub fn normalize_gpu_type(s: &str) -> String {
    s.trim().to_ascii_uppercase()
}

/// Full-load board power of common GPU types (W); 400 for unknown ones.
pub fn default_gpu_power_w(gpu_type: &str) -> f64 {
    match gpu_type {
        "H100" | "H100-MEGA" | "H200" | "GH200" => 700.0,
        "B200" => 1000.0,
        "A100" | "A100-80GB" => 400.0,
        "L40S" => 350.0,
        "V100" | "V100-32GB" => 300.0,
        "A10G" | "A10" => 150.0,
        "L4" => 72.0,
        "T4" | "T4G" => 70.0,
        _ => 400.0,
    }
}

/// Built-in speed and power of common GPU types: (training throughput
/// relative to the A100, board power W). `None` for unknown types (the
/// fleet file must then give `[gpu_models.<TYPE>]`).
///
/// Sources (docs/placement.md, "GPU performance model"): H100 1.9 is the mean
/// per-GPU speed-up over the A100 across the eight MLPerf Training v2.1
/// workloads (NVIDIA, as reported by EE Times, Nov 2022); MLPerf Training
/// v3.0 Dell pairs of identical systems give 1.4–2.0 (ResNet-50 1.8,
/// 3D-UNet 1.4, DLRM 2.0). The others are scaled from vendor data sheets
/// (dense FP16/BF16 tensor throughput and memory bandwidth) and are
/// assumptions to override: H200 = H100 × 1.1 (same compute, 1.4× memory
/// bandwidth), B200 = H100 × 2.2 (NVIDIA's MLPerf Training v4.1 claim),
/// V100 0.5, P100 0.3, P40 0.25, T4 0.15, L4 0.3, A10/A10G 0.35, L40S 0.75,
/// K80/M60 0.1.
/// Power: vendor TDP of the SXM/PCIe board.
pub fn default_gpu_model(gpu_type: &str) -> Option<(f64, f64)> {
    Some(match gpu_type {
        "H100" | "H100-MEGA" => (1.9, 700.0),
        "H200" | "GH200" => (2.1, 700.0),
        "B200" => (4.2, 1000.0),
        "A100" | "A100-80GB" => (1.0, 400.0),
        "L40S" => (0.75, 350.0),
        "A10G" | "A10" => (0.35, 150.0),
        "L4" => (0.3, 72.0),
        "V100" | "V100-32GB" => (0.5, 300.0),
        "P100" => (0.3, 250.0),
        "P40" => (0.25, 250.0),
        "T4" | "T4G" => (0.15, 70.0),
        "K80" | "M60" => (0.1, 300.0),
        _ => return None,
    })
}

/// `provider:region`; a region already qualified is kept.
pub fn qualify_region(provider: &str, region: &str) -> String {
    if region.contains(':') {
        region.to_string()
    } else {
        format!("{provider}:{region}")
    }
}

fn finite_nonneg(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

/// 1-based (line, column) of byte offset `at` in `s`.
pub fn line_col(s: &str, at: usize) -> (usize, usize) {
    let at = at.min(s.len());
    let before = s.get(..at).unwrap_or("");
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

/// The fleet TOML as a typed config; errors carry `file:line:col`.
pub fn parse_config(s: &str, file: &str) -> Result<FleetConfig, ModelError> {
    toml::from_str::<FleetConfig>(s).map_err(|e| {
        let (line, col) = e.span().map(|r| line_col(s, r.start)).unwrap_or((0, 0));
        ModelError::Toml { file: file.to_string(), line, col, msg: e.message().trim().to_string() }
    })
}

/// Line of the first `name = "<name>"` (the table that declares it).
fn line_of_name(s: &str, name: &str) -> Option<usize> {
    s.lines()
        .position(|l| {
            let t = l.trim_start();
            t.strip_prefix("name").map(str::trim_start).and_then(|r| r.strip_prefix('=')).is_some_and(|v| {
                let v = v.trim();
                let v = v.split('#').next().unwrap_or("").trim();
                v.trim_matches('"').trim_matches('\'') == name
            })
        })
        .map(|i| i + 1)
}

/// Gives a build error the `file:line` of what it is about (see
/// [`FleetModel::from_toml_named`]); for callers that build a parsed config.
pub fn locate(e: ModelError, s: &str, file: &str) -> ModelError {
    let line = match &e {
        ModelError::Cluster { cluster, .. } | ModelError::DuplicateCluster(cluster) => line_of_name(s, cluster),
        ModelError::Team { team, .. } => line_of_name(s, team),
        ModelError::GpuModel { model, .. } => {
            s.lines().position(|l| l.contains(&format!("gpu_models.{model}"))).map(|i| i + 1)
        }
        _ => None,
    };
    match line {
        Some(line) => ModelError::At { file: file.to_string(), line, source: Box::new(e) },
        None => e,
    }
}

struct Interner {
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Interner {
    fn new() -> Self {
        Interner { names: Vec::new(), ids: HashMap::new() }
    }
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(s.to_string());
        self.ids.insert(s.to_string(), i);
        i
    }
}

impl FleetModel {
    pub fn from_toml_str(s: &str) -> Result<FleetModel, ModelError> {
        FleetModel::from_toml_named(s, "fleet TOML")
    }

    /// Parses and builds; every error names `file` and the line it is
    /// about (unknown keys and tables, nested ones too, wrong types, and
    /// validation errors at the line of their cluster or team).
    pub fn from_toml_named(s: &str, file: &str) -> Result<FleetModel, ModelError> {
        let cfg = parse_config(s, file)?;
        FleetModel::build(cfg).map_err(|e| locate(e, s, file))
    }

    /// Validates the config and builds the indexed model.
    pub fn build(cfg: FleetConfig) -> Result<FleetModel, ModelError> {
        let mut types = Interner::new();
        let mut regions = Interner::new();
        let mut providers = Interner::new();
        let mut zones = Interner::new();
        let mut region_provider: Vec<u32> = Vec::new();
        let mut by_name = HashMap::new();
        let mut clusters = Vec::with_capacity(cfg.clusters.len());
        let ov = &cfg.overheads;
        if cfg.clusters.is_empty() {
            return Err(ModelError::NoClusters);
        }
        let mut gpu_models: BTreeMap<String, GpuModelConfig> = BTreeMap::new();
        for (k, g) in &cfg.gpu_models {
            let name = normalize_gpu_type(k);
            let gerr = |msg: &str| ModelError::GpuModel { model: k.clone(), msg: msg.to_string() };
            if g.relative_throughput.is_some_and(|x| !(x.is_finite() && x > 0.0)) {
                return Err(gerr("relative_throughput must be > 0"));
            }
            if g.power_w.is_some_and(|x| !finite_nonneg(x)) {
                return Err(gerr("power_w must be finite and >= 0"));
            }
            gpu_models.insert(name, *g);
        }
        let ref_name = normalize_gpu_type(cfg.reference_gpu.as_deref().unwrap_or("A100"));
        let ref_speed = gpu_models
            .get(&ref_name)
            .and_then(|g| g.relative_throughput)
            .or_else(|| default_gpu_model(&ref_name).map(|x| x.0))
            .ok_or_else(|| ModelError::GpuModel {
                model: ref_name.clone(),
                msg: "reference_gpu has no known speed".into(),
            })?;

        let intern_region =
            |regions: &mut Interner, providers: &mut Interner, region_provider: &mut Vec<u32>, q: &str| {
                let id = regions.id(q);
                if id as usize == region_provider.len() {
                    let prov = q.split(':').next().unwrap_or("");
                    region_provider.push(providers.id(prov));
                }
                id
            };

        for c in &cfg.clusters {
            let err = |msg: String| ModelError::Cluster { cluster: c.name.clone(), msg };
            if c.name.trim().is_empty() {
                return Err(err("empty name".into()));
            }
            if by_name.contains_key(&c.name) {
                return Err(ModelError::DuplicateCluster(c.name.clone()));
            }
            if c.provider.trim().is_empty() || c.region.trim().is_empty() {
                return Err(err("provider and region are required".into()));
            }
            if !finite_nonneg(c.provision_s) || !finite_nonneg(c.spot_preemptions_per_hour) {
                return Err(err("provision_s and spot_preemptions_per_hour must be finite and >= 0".into()));
            }
            let region = qualify_region(&c.provider, &c.region);
            let region_id = intern_region(&mut regions, &mut providers, &mut region_provider, &region);
            let provider_id = providers.id(&c.provider);
            let prices: BTreeMap<String, Prices> = c.prices.iter().map(|(k, v)| (normalize_gpu_type(k), *v)).collect();
            let waits: BTreeMap<String, f64> =
                c.wait_history_s.iter().map(|(k, v)| (normalize_gpu_type(k), *v)).collect();
            let mut pools = Vec::with_capacity(c.pools.len());
            let mut type_mask = 0u64;
            let mut cooling_pue = 1.0f64;
            for (pi, p) in c.pools.iter().enumerate() {
                let gt = normalize_gpu_type(&p.gpu_type);
                if gt.is_empty() {
                    return Err(err(format!("pool {pi}: empty gpu_type")));
                }
                if p.gpus_per_node == 0 || p.nodes == 0 {
                    return Err(err(format!("pool {pi}: gpus_per_node and nodes must be > 0")));
                }
                let tid = types.id(&gt);
                if tid as usize >= MAX_GPU_TYPES {
                    return Err(ModelError::TooManyGpuTypes);
                }
                type_mask |= 1u64 << tid;
                let total = p.gpus_per_node.saturating_mul(p.nodes);
                let nvl = p.nvlink_domain_gpus.unwrap_or(p.gpus_per_node).max(1);
                let island_nodes = p.ib_island_nodes.unwrap_or(p.nodes).min(p.nodes);
                let ib_island_gpus =
                    if p.ib_fabric.is_some() { island_nodes.saturating_mul(p.gpus_per_node) } else { 0 };
                let pr = p.prices.or_else(|| prices.get(&gt).copied()).unwrap_or_default();
                for v in [pr.on_demand, pr.spot, pr.onprem, pr.running].into_iter().flatten() {
                    if !finite_nonneg(v) {
                        return Err(err(format!("pool {pi}: prices must be finite and >= 0")));
                    }
                }
                if let Some(r) = pr.running {
                    match pr.onprem {
                        _ if !c.onprem => {
                            return Err(err(format!(
                                "pool {pi}: prices: running is the running cost of owned GPUs (onprem = true)"
                            )))
                        }
                        None => return Err(err(format!("pool {pi}: prices: running needs onprem, the amortized price"))),
                        Some(o) if r > o => {
                            return Err(err(format!(
                                "pool {pi}: prices: running {r} is above onprem {o} (it is the part of onprem that using a GPU adds)"
                            )))
                        }
                        Some(_) => {}
                    }
                }
                if pr.on_demand.is_none() && pr.spot.is_none() && pr.onprem.is_none() {
                    return Err(err(format!("no price for GPU type {gt}")));
                }
                let gm = gpu_models.get(&gt).copied().unwrap_or_default();
                let gpu_power_w = p.gpu_power_w.or(gm.power_w).unwrap_or_else(|| default_gpu_power_w(&gt));
                let Some(speed) = gm.relative_throughput.or_else(|| default_gpu_model(&gt).map(|x| x.0)) else {
                    return Err(err(format!(
                        "pool {pi}: GPU type {gt} has no built-in speed; give [gpu_models.{gt}] relative_throughput"
                    )));
                };
                let node_overhead_w = p.node_overhead_w.unwrap_or(1500.0);
                if let Some(cap) = p.rack_power_cap_w {
                    if !finite_nonneg(cap) {
                        return Err(err(format!("pool {pi}: rack_power_cap_w must be finite and >= 0")));
                    }
                }
                if !finite_nonneg(gpu_power_w) || !finite_nonneg(node_overhead_w) {
                    return Err(err(format!("pool {pi}: power must be finite and >= 0")));
                }
                let mean_wait_s = waits.get(&gt).copied().unwrap_or(3600.0);
                if !finite_nonneg(mean_wait_s) {
                    return Err(err(format!("wait_history_s for {gt} must be finite and >= 0")));
                }
                cooling_pue = cooling_pue.max(p.cooling.default_pue());
                pools.push(NodePool {
                    name: p.name.clone().unwrap_or_else(|| format!("{}-{}", gt.to_ascii_lowercase(), pi)),
                    gpu_type: tid as GpuTypeId,
                    gpus_per_node: p.gpus_per_node,
                    nodes: p.nodes,
                    total_gpus: total,
                    nvlink_domain_gpus: nvl,
                    ib_fabric: p.ib_fabric.clone(),
                    ib_island_gpus,
                    rack_power_cap_w: p.rack_power_cap_w,
                    nodes_per_rack: p.nodes_per_rack.unwrap_or(4).max(1),
                    gpu_power_w,
                    node_overhead_w,
                    cooling: p.cooling,
                    prices: pr,
                    mean_wait_s,
                    speed: speed / ref_speed,
                });
            }
            if pools.len() > PoolId::MAX as usize {
                return Err(err("too many pools".into()));
            }
            let pue = c.pue.unwrap_or(if pools.is_empty() { 1.4 } else { cooling_pue });
            if !(pue.is_finite() && pue >= 1.0) {
                return Err(err("pue must be >= 1".into()));
            }
            let carbon_zone_id = c.carbon_zone.as_deref().map(|z| zones.id(z));
            by_name.insert(c.name.clone(), clusters.len() as ClusterId);
            clusters.push(Cluster {
                name: c.name.clone(),
                provider: c.provider.clone(),
                provider_id,
                region,
                region_id,
                zone: c.zone.clone(),
                scheduler: c.scheduler,
                carbon_zone: c.carbon_zone.clone(),
                carbon_zone_id,
                onprem: c.onprem,
                pue,
                provision_s: c.provision_s,
                health: c.health,
                max_time_limit_s: c.max_time_limit_s,
                spot_preemptions_per_hour: c.spot_preemptions_per_hour,
                pools,
                type_mask,
            });
        }

        let mut datasets = Vec::with_capacity(cfg.datasets.len());
        for d in &cfg.datasets {
            if !finite_nonneg(d.size_gb) {
                return Err(ModelError::Dataset { uri: d.uri.clone(), msg: "size_gb must be finite and >= 0".into() });
            }
            if d.locations.is_empty() {
                return Err(ModelError::Dataset { uri: d.uri.clone(), msg: "no locations".into() });
            }
            let mut locs = Vec::new();
            for l in &d.locations {
                if !l.contains(':') {
                    return Err(ModelError::Dataset {
                        uri: d.uri.clone(),
                        msg: format!("location {l:?} must be provider:region"),
                    });
                }
                locs.push(intern_region(&mut regions, &mut providers, &mut region_provider, l));
            }
            datasets.push(Dataset { uri: d.uri.clone(), locations: locs, size_gb: d.size_gb });
        }
        for l in &cfg.links {
            for r in [&l.from, &l.to] {
                if !r.contains(':') {
                    return Err(ModelError::Link {
                        from: l.from.clone(),
                        to: l.to.clone(),
                        msg: "regions must be provider:region".into(),
                    });
                }
                intern_region(&mut regions, &mut providers, &mut region_provider, r);
            }
        }

        let n = regions.names.len();
        let mut egress = vec![0.0; n * n];
        let mut gbps = vec![0.0; n * n];
        let internet_default = ov.internet_egress_usd_per_gb.get("default").copied().unwrap_or(0.09);
        for i in 0..n {
            for j in 0..n {
                let (pi, pj) = (region_provider[i], region_provider[j]);
                let (e, b) = if i == j {
                    (0.0, ov.same_region_gbps)
                } else if pi == pj {
                    (ov.intra_provider_egress_usd_per_gb, ov.intra_provider_gbps)
                } else {
                    let prov = &providers.names[pi as usize];
                    (
                        ov.internet_egress_usd_per_gb.get(prov).copied().unwrap_or(internet_default),
                        ov.cross_provider_gbps,
                    )
                };
                egress[i * n + j] = e;
                gbps[i * n + j] = b;
            }
        }
        for l in &cfg.links {
            let (Some(&f), Some(&t)) = (regions.ids.get(&l.from), regions.ids.get(&l.to)) else {
                continue;
            };
            let (f, t) = (f as usize, t as usize);
            if let Some(u) = l.usd_per_gb {
                if !finite_nonneg(u) {
                    return Err(ModelError::Link {
                        from: l.from.clone(),
                        to: l.to.clone(),
                        msg: "usd_per_gb must be >= 0".into(),
                    });
                }
                egress[f * n + t] = u;
            }
            if let Some(g) = l.gbps {
                if !(g.is_finite() && g > 0.0) {
                    return Err(ModelError::Link {
                        from: l.from.clone(),
                        to: l.to.clone(),
                        msg: "gbps must be > 0".into(),
                    });
                }
                gbps[f * n + t] = g;
            }
        }

        let mut teams = Vec::with_capacity(cfg.teams.len());
        let mut seen = std::collections::BTreeSet::new();
        for t in &cfg.teams {
            let terr = |msg: String| ModelError::Team { team: t.name.clone(), msg };
            if t.name.trim().is_empty() {
                return Err(terr("empty team name".into()));
            }
            if !seen.insert(t.name.as_str()) {
                return Err(terr("declared twice".into()));
            }
            let Some(&c) = by_name.get(&t.home) else {
                return Err(terr(format!("home {:?} is not a cluster of this fleet", t.home)));
            };
            teams.push((t.name.clone(), c));
        }
        let gpu_speed = {
            let mut v = vec![1.0; types.names.len()];
            for c in &clusters {
                for p in &c.pools {
                    v[p.gpu_type as usize] = p.speed;
                }
            }
            v
        };

        let mut out = FleetModel {
            clusters,
            gpu_speed,
            teams,
            cheapest_per_work: Vec::new(),
            cheapest_per_work_running: Vec::new(),
            gpu_types: types.names,
            regions: regions.names,
            region_provider,
            providers: providers.names,
            carbon_zones: zones.names,
            datasets,
            overheads: cfg.overheads.clone(),
            egress,
            gbps,
            by_name,
            config: cfg,
        };
        out.reindex();
        Ok(out)
    }

    /// Recomputes [`FleetModel::cheapest_per_work`] (after prices change).
    fn reindex(&mut self) {
        let order = |running: bool| {
            let mut v: Vec<(f64, ClusterId)> = self
                .clusters
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let floor = c
                        .pools
                        .iter()
                        .flat_map(|p| {
                            let running = if running && c.onprem { p.prices.running } else { None };
                            [p.prices.on_demand, p.prices.spot, p.prices.onprem, running]
                                .into_iter()
                                .flatten()
                                .map(move |x| x / p.speed.max(1e-9))
                        })
                        .fold(f64::INFINITY, f64::min);
                    (if floor.is_finite() { floor } else { 0.0 }, i as ClusterId)
                })
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            v
        };
        self.cheapest_per_work = order(false);
        self.cheapest_per_work_running = order(true);
    }

    /// Clusters cheapest first per unit of work as `policy` prices them (owned
    /// GPUs at their running cost or amortized): the order
    /// [`crate::decide`] and the rebalancing scan stop in.
    pub fn cheapest_for(&self, policy: &crate::policy::Policy) -> &[(f64, ClusterId)] {
        if policy.owned_at_running_cost {
            &self.cheapest_per_work_running
        } else {
            &self.cheapest_per_work
        }
    }

    pub fn cluster_id(&self, name: &str) -> Option<ClusterId> {
        self.by_name.get(name).copied()
    }

    pub fn cluster(&self, id: ClusterId) -> Option<&Cluster> {
        self.clusters.get(id as usize)
    }

    pub fn gpu_type_id(&self, name: &str) -> Option<GpuTypeId> {
        let n = normalize_gpu_type(name);
        self.gpu_types.iter().position(|t| *t == n).map(|i| i as GpuTypeId)
    }

    /// Relative speed of a GPU type by name (reference = 1.0): the fleet's
    /// own pools first, else the built-in table; `None` when unknown.
    pub fn speed_of(&self, name: &str) -> Option<f64> {
        let n = normalize_gpu_type(name);
        if let Some(id) = self.gpu_type_id(&n) {
            return self.gpu_speed.get(id as usize).copied();
        }
        let ref_name = normalize_gpu_type(self.config.reference_gpu.as_deref().unwrap_or("A100"));
        let r = self
            .config
            .gpu_models
            .iter()
            .find(|(k, _)| normalize_gpu_type(k) == ref_name)
            .and_then(|(_, g)| g.relative_throughput)
            .or_else(|| default_gpu_model(&ref_name).map(|x| x.0))?;
        let own = self
            .config
            .gpu_models
            .iter()
            .find(|(k, _)| normalize_gpu_type(k) == n)
            .and_then(|(_, g)| g.relative_throughput)
            .or_else(|| default_gpu_model(&n).map(|x| x.0))?;
        Some(own / r)
    }

    /// The declared home cluster of a team.
    pub fn team_home(&self, team: &str) -> Option<ClusterId> {
        self.teams.iter().find(|(n, _)| n == team).map(|x| x.1)
    }

    pub fn gpu_type_name(&self, id: GpuTypeId) -> &str {
        self.gpu_types.get(id as usize).map(String::as_str).unwrap_or("?")
    }

    pub fn region_id(&self, qualified: &str) -> Option<RegionId> {
        self.regions.iter().position(|r| r == qualified).map(|i| i as RegionId)
    }

    /// USD/GB from `from` to `to` (0 for unknown ids).
    #[inline]
    pub fn egress_usd_per_gb(&self, from: RegionId, to: RegionId) -> f64 {
        let n = self.regions.len();
        self.egress.get(from as usize * n + to as usize).copied().unwrap_or(0.0)
    }

    /// Bandwidth in Gbps from `from` to `to` (same-region default for unknown ids).
    #[inline]
    pub fn bandwidth_gbps(&self, from: RegionId, to: RegionId) -> f64 {
        let n = self.regions.len();
        self.gbps.get(from as usize * n + to as usize).copied().unwrap_or(self.overheads.same_region_gbps)
    }

    /// The catalog entry whose URI is the longest prefix of `uri`.
    pub fn dataset_for(&self, uri: &str) -> Option<&Dataset> {
        self.datasets.iter().filter(|d| uri.starts_with(d.uri.as_str())).max_by_key(|d| d.uri.len())
    }

    /// A copy of this model with one egress table applied: every pair of
    /// `provider:<matrix region>` that the model knows gets the matrix price.
    pub fn with_egress(&self, m: &crate::feeds::EgressMatrix) -> FleetModel {
        let mut out = self.clone();
        let n = out.regions.len();
        for (i, src) in m.regions.iter().enumerate() {
            let Some(si) = out.region_id(&qualify_region(&m.provider, src)) else {
                continue;
            };
            for (j, dst) in m.regions.iter().enumerate() {
                let Some(dj) = out.region_id(&qualify_region(&m.provider, dst)) else {
                    continue;
                };
                if let Some(v) = m.get(i, j) {
                    out.egress[si as usize * n + dj as usize] = v;
                }
            }
        }
        out
    }

    /// A copy of this model with cloud prices replaced by a price table
    /// (per-GPU-hour), for every cloud pool whose `(provider, region, type)`
    /// the table has (instances with the pool's GPUs per node preferred).
    /// On-prem prices are left alone. Accelerator-only rows (GCP: host VM
    /// not included) are applied only with `include_accelerator_only`.
    pub fn with_prices(&self, t: &crate::feeds::PriceTable, include_accelerator_only: bool) -> FleetModel {
        let mut out = self.clone();
        for c in &mut out.clusters {
            if c.onprem {
                continue;
            }
            let region = c.region.split_once(':').map(|x| x.1).unwrap_or(&c.region).to_string();
            for p in &mut c.pools {
                let gt = self.gpu_type_name(p.gpu_type).to_string();
                if let Some(q) = t.get(&c.provider, &region, &gt, p.gpus_per_node) {
                    if q.accelerator_only && !include_accelerator_only {
                        continue;
                    }
                    if q.on_demand.is_some() {
                        p.prices.on_demand = q.on_demand;
                    }
                    if q.spot.is_some() {
                        p.prices.spot = q.spot;
                    }
                }
            }
        }
        out.reindex();
        out
    }
}
