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
    #[error("fleet TOML: {0}")]
    Toml(#[from] toml::de::Error),
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

/// USD per GPU-hour, per pricing model. `None` = not offered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    #[serde(default)]
    pub on_demand: Option<f64>,
    #[serde(default)]
    pub spot: Option<f64>,
    /// Amortized on-prem cost (hardware + power + ops over the lifetime).
    #[serde(default)]
    pub onprem: Option<f64>,
}

// ---------------------------------------------------------------------------
// Configuration (serde, the TOML shape)
// ---------------------------------------------------------------------------

/// The TOML file: `[overheads]`, `[[clusters]]` with `[[clusters.pools]]`,
/// `[[datasets]]`, `[[links]]`. See `conf/fleet-sample.toml`.
///
/// Other top-level keys are kept in `extra` (serde cannot combine
/// `deny_unknown_fields` with a flattened catch-all); the nested tables
/// do deny unknown keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetConfig {
    #[serde(default)]
    pub overheads: Overheads,
    #[serde(default)]
    pub clusters: Vec<ClusterConfig>,
    #[serde(default)]
    pub datasets: Vec<DatasetConfig>,
    #[serde(default)]
    pub links: Vec<LinkConfig>,
    /// Free-form tables other tools keep in the same file (e.g. the
    /// simulator's `[home_map]`); ignored by the engine.
    #[serde(default, flatten)]
    pub extra: BTreeMap<String, toml::Value>,
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
        let cfg: FleetConfig = toml::from_str(s)?;
        FleetModel::build(cfg)
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

        let intern_region = |regions: &mut Interner,
                                 providers: &mut Interner,
                                 region_provider: &mut Vec<u32>,
                                 q: &str| {
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
            let prices: BTreeMap<String, Prices> =
                c.prices.iter().map(|(k, v)| (normalize_gpu_type(k), *v)).collect();
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
                let ib_island_gpus = if p.ib_fabric.is_some() {
                    island_nodes.saturating_mul(p.gpus_per_node)
                } else {
                    0
                };
                let pr = p.prices.or_else(|| prices.get(&gt).copied()).unwrap_or_default();
                for v in [pr.on_demand, pr.spot, pr.onprem].into_iter().flatten() {
                    if !finite_nonneg(v) {
                        return Err(err(format!("pool {pi}: prices must be finite and >= 0")));
                    }
                }
                if pr.on_demand.is_none() && pr.spot.is_none() && pr.onprem.is_none() {
                    return Err(err(format!("no price for GPU type {gt}")));
                }
                let gpu_power_w = p.gpu_power_w.unwrap_or_else(|| default_gpu_power_w(&gt));
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
            let (Some(&f), Some(&t)) = (regions.ids.get(&l.from), regions.ids.get(&l.to)) else { continue };
            let (f, t) = (f as usize, t as usize);
            if let Some(u) = l.usd_per_gb {
                if !finite_nonneg(u) {
                    return Err(ModelError::Link { from: l.from.clone(), to: l.to.clone(), msg: "usd_per_gb must be >= 0".into() });
                }
                egress[f * n + t] = u;
            }
            if let Some(g) = l.gbps {
                if !(g.is_finite() && g > 0.0) {
                    return Err(ModelError::Link { from: l.from.clone(), to: l.to.clone(), msg: "gbps must be > 0".into() });
                }
                gbps[f * n + t] = g;
            }
        }

        Ok(FleetModel {
            clusters,
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
        })
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
        self.datasets
            .iter()
            .filter(|d| uri.starts_with(d.uri.as_str()))
            .max_by_key(|d| d.uri.len())
    }

    /// A copy of this model with one egress table applied: every pair of
    /// `provider:<matrix region>` that the model knows gets the matrix price.
    pub fn with_egress(&self, m: &crate::feeds::EgressMatrix) -> FleetModel {
        let mut out = self.clone();
        let n = out.regions.len();
        for (i, src) in m.regions.iter().enumerate() {
            let Some(si) = out.region_id(&qualify_region(&m.provider, src)) else { continue };
            for (j, dst) in m.regions.iter().enumerate() {
                let Some(dj) = out.region_id(&qualify_region(&m.provider, dst)) else { continue };
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
        out
    }
}
