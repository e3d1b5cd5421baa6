//! The placement engine: hard filters, the scoring model, ranked
//! explanations.
//!
//! Score of placing job `j` on pool `p` of cluster `c` with pricing `k`
//! (all in USD; `G` = GPUs, `D` = expected duration in hours):
//!
//! ```text
//! R       = D ÷ speed(pool)     (D: work at the reference GPU; speed from the
//!                                 fleet's GPU performance model)
//! compute = price_k × G × (R + lost + provision + restore)  (provision: cloud only;
//!                                 restore: resuming from a checkpoint elsewhere)
//! egress  = Σ datasets min_replica(size × egress(replica → c))
//!         + ckpt_size × ckpts(D) × egress(c → ckpt location)
//! delay_h = wait + transfer + overhead + lost
//!           wait     = 0 if the pool has G free GPUs, else the expected wait;
//!                      spot not free now (queued for, `Policy::spot_queue`):
//!                      the state's expected spot wait
//!           transfer = Σ datasets (size × 8 / Gbps + staging latency) for data not in c's region
//!           overhead = remote submission (away from home) + provisioning (cloud)
//!           lost     = spot: preemptions/h × D × (ckpt_interval/2 + restore)
//!           requeue  = spot: preemptions/h × D × the pool's spot recovery time
//!                      (waiting for spot to come back after a reclaim), or,
//!                      when cheaper, × setup: the job goes on demand at once
//!                      and `compute` pays the premium until spot is back or
//!                      the job ends, plus that setup (docs/placement.md)
//! time    = (time_value × G + job_time_value) × delay_h
//! kgCO2   = intensity(zone, run window) × GPU power × G × (R + lost) × PUE
//! total   = compute + egress_weight × egress + time + carbon_price × kgCO2
//! ```
//!
//! Nothing here allocates on the [`decide`] path once a job is
//! [`prepare`]d.

use std::fmt;

use fleet_api::FleetMode;

use crate::job::{JobSpec, Parallelism};
use crate::model::{Cluster, ClusterId, FleetModel, GpuTypeId, Health, NodePool, PoolId, RegionId};
use crate::policy::Policy;
use crate::state::{ClusterState, FleetState, PoolState};

/// Which price a candidate pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pricing {
    Onprem,
    OnDemand,
    Spot,
}

impl Pricing {
    pub fn as_str(self) -> &'static str {
        match self {
            Pricing::Onprem => "onprem",
            Pricing::OnDemand => "on-demand",
            Pricing::Spot => "spot",
        }
    }
}

/// The full cost breakdown of one candidate.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Breakdown {
    pub price_per_gpu_hour: f64,
    pub compute_usd: f64,
    pub egress_usd: f64,
    pub wait_h: f64,
    pub transfer_h: f64,
    pub overhead_h: f64,
    pub lost_work_h: f64,
    /// Spot: expected hours waiting for spot to come back after reclaims
    /// (preemptions/h × run × the pool's spot recovery time); a delay, not
    /// billed.
    #[serde(default)]
    pub requeue_h: f64,
    /// time value × GPUs × (wait + transfer + overhead + lost + requeue).
    pub time_usd: f64,
    pub carbon_g_per_kwh: f64,
    pub kg_co2: f64,
    pub carbon_usd: f64,
    /// The score (lower is better).
    pub total: f64,
}

impl Breakdown {
    /// Money actually spent: compute + egress.
    pub fn spend_usd(&self) -> f64 {
        self.compute_usd + self.egress_usd
    }
    pub fn delay_h(&self) -> f64 {
        self.wait_h + self.transfer_h + self.overhead_h + self.lost_work_h + self.requeue_h
    }
}

/// The chosen (or a ranked) placement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Placement {
    pub cluster: ClusterId,
    pub pool: PoolId,
    pub pricing: Pricing,
    /// The pool has the GPUs free now.
    pub fits_now: bool,
    pub breakdown: Breakdown,
}

/// Why a cluster (or its best pool) cannot take the job. Ordered by how
/// far the check got: for a cluster with several pools the reason of the
/// pool that came closest is reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Exclusion {
    Down,
    Unhealthy,
    LocalOnly,
    RemoteOnly,
    NotInToList,
    RegionDenied,
    RegionNotAllowed,
    TimeLimit {
        max_s: f64,
        need_s: f64,
    },
    NoGpuType,
    /// Every acceptable pool's GPUs are slower than the job's minimum.
    TooSlow {
        gpu_type: GpuTypeId,
        speed: f64,
        need: f64,
    },
    NotEnoughGpus {
        gpu_type: GpuTypeId,
        have: u32,
        need: u32,
    },
    TooFewNodes {
        gpu_type: GpuTypeId,
        have: u32,
        need: u32,
    },
    NodeShape {
        gpu_type: GpuTypeId,
        per_node: u32,
        need_per_node: u32,
    },
    NvlinkDomain {
        gpu_type: GpuTypeId,
        domain: u32,
        need: u32,
    },
    NoIbFabric {
        gpu_type: GpuTypeId,
        domain: u32,
        need: u32,
    },
    IbIsland {
        gpu_type: GpuTypeId,
        island: u32,
        need: u32,
    },
    PowerCap {
        gpu_type: GpuTypeId,
        need_w: f64,
        cap_w: f64,
        gpus_in_rack: u32,
    },
    NoPrice {
        gpu_type: GpuTypeId,
    },
    MaxPrice {
        cheapest: f64,
        max: f64,
    },
    BadInput,
}

impl Exclusion {
    fn rank(&self) -> u8 {
        match self {
            Exclusion::Down => 0,
            Exclusion::Unhealthy => 1,
            Exclusion::LocalOnly => 2,
            Exclusion::RemoteOnly => 3,
            Exclusion::NotInToList => 4,
            Exclusion::RegionDenied => 5,
            Exclusion::RegionNotAllowed => 6,
            Exclusion::TimeLimit { .. } => 7,
            Exclusion::NoGpuType => 8,
            Exclusion::TooSlow { .. } => 9,
            Exclusion::NotEnoughGpus { .. } => 10,
            Exclusion::TooFewNodes { .. } => 11,
            Exclusion::NodeShape { .. } => 12,
            Exclusion::NvlinkDomain { .. } => 13,
            Exclusion::NoIbFabric { .. } => 14,
            Exclusion::IbIsland { .. } => 15,
            Exclusion::PowerCap { .. } => 16,
            Exclusion::NoPrice { .. } => 17,
            Exclusion::MaxPrice { .. } => 18,
            Exclusion::BadInput => 19,
        }
    }

    /// The human-readable reason.
    /// True unless the exclusion can end by itself: health comes back,
    /// prices change.
    pub fn lasting(&self) -> bool {
        !matches!(
            self,
            Exclusion::Down
                | Exclusion::Unhealthy
                | Exclusion::NoPrice { .. }
                | Exclusion::MaxPrice { .. }
                | Exclusion::BadInput
        )
    }

    pub fn describe(&self, model: &FleetModel, cluster: &Cluster, job: &PreparedJob) -> String {
        let t = |id: &GpuTypeId| model.gpu_type_name(*id).to_string();
        match self {
            Exclusion::Down => "drained by the admin (health = down)".into(),
            Exclusion::Unhealthy => "no recent heartbeat (unhealthy)".into(),
            Exclusion::LocalOnly => format!("job is --fleet=local; only its home {} may run it", job.spec.home),
            Exclusion::RemoteOnly => "job is --fleet=remote; its home cluster is excluded".into(),
            Exclusion::NotInToList => format!("not in --fleet-to ({})", job.spec.to.join(",")),
            Exclusion::RegionDenied => format!("region {} is denied by the job", cluster.region),
            Exclusion::RegionNotAllowed => {
                format!("region {} is not in the job's allowed regions ({})", cluster.region, job.spec.region_allow.join(","))
            }
            Exclusion::TimeLimit { max_s, need_s } => {
                format!("time limit {:.1} h exceeds the cluster's maximum {:.1} h", need_s / 3600.0, max_s / 3600.0)
            }
            Exclusion::NoGpuType => {
                let have: Vec<&str> = cluster.pools.iter().map(|p| model.gpu_type_name(p.gpu_type)).collect();
                format!(
                    "no pool with an acceptable GPU type (job accepts {}; cluster has {})",
                    if job.spec.gpu_types.is_empty() { "any".to_string() } else { job.spec.gpu_types.join(",") },
                    if have.is_empty() { "none".to_string() } else { have.join(",") }
                )
            }
            Exclusion::TooSlow { gpu_type, speed, need } => format!(
                "{} runs at {speed:.2}× the reference GPU; the job needs at least {need:.2}× (--min-gpu / #FLEET min-gpu)",
                t(gpu_type)
            ),
            Exclusion::NotEnoughGpus { gpu_type, have, need } => {
                format!("needs {need} {} GPUs; the largest pool has {have}", t(gpu_type))
            }
            Exclusion::TooFewNodes { gpu_type, have, need } => {
                format!("needs {need} nodes; the {} pool has {have}", t(gpu_type))
            }
            Exclusion::NodeShape { gpu_type, per_node, need_per_node } => {
                format!("needs {need_per_node} GPUs per node; {} nodes have {per_node}", t(gpu_type))
            }
            Exclusion::NvlinkDomain { gpu_type, domain, need } => format!(
                "{} job needs {need} GPUs in one NVLink domain; {} domains hold {domain}",
                job.spec.parallelism.as_str(),
                t(gpu_type)
            ),
            Exclusion::NoIbFabric { gpu_type, domain, need } => format!(
                "{} job of {need} GPUs spans NVLink domains ({domain} GPUs) and the {} pool has no InfiniBand fabric",
                job.spec.parallelism.as_str(),
                t(gpu_type)
            ),
            Exclusion::IbIsland { gpu_type, island, need } => format!(
                "{} job needs {need} GPUs in one InfiniBand island; {} islands hold {island}",
                job.spec.parallelism.as_str(),
                t(gpu_type)
            ),
            Exclusion::PowerCap { gpu_type, need_w, cap_w, gpus_in_rack } => format!(
                "rack power cap {:.1} kW cannot sustain {gpus_in_rack} {} GPUs of this job in one rack ({:.1} kW)",
                cap_w / 1000.0,
                t(gpu_type),
                need_w / 1000.0
            ),
            Exclusion::NoPrice { gpu_type } => format!("no usable price for {}", t(gpu_type)),
            Exclusion::MaxPrice { cheapest, max } => {
                format!("cheapest option {cheapest:.2} USD/GPU-h is above --fleet-max-price {max:.2}")
            }
            Exclusion::BadInput => "inputs give a non-finite score (check durations and prices)".into(),
        }
    }
}

/// A dataset resolved against the catalog.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedData {
    pub uri: String,
    pub locations: Vec<RegionId>,
    pub size_gb: f64,
    /// Found in the catalog (unknown datasets cost nothing and are listed).
    pub known: bool,
}

/// A job resolved against one model: ids instead of names. Build with
/// [`prepare`]; reuse for every decision about the job.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedJob {
    pub spec: JobSpec,
    /// Acceptable GPU types as a bit mask over the model's types.
    pub type_mask: u64,
    pub home: Option<ClusterId>,
    /// `None` = any cluster; else sorted ids (names not in the model dropped).
    pub to: Option<Vec<ClusterId>>,
    /// Per region id: 0 = ok, 1 = denied, 2 = not in the allow list.
    /// Empty = all ok.
    pub region_rule: Vec<u8>,
    pub datasets: Vec<PreparedData>,
    pub ckpt_region: Option<Vec<RegionId>>,
    pub ckpt_size_gb: f64,
    pub gpus: u32,
    /// Work in hours at the reference GPU's speed (a pool of speed `s` runs
    /// it in `duration_h / s` hours).
    pub duration_h: f64,
    /// Lowest acceptable pool speed (0 = any).
    pub min_speed: f64,
    /// Share of the work already done and checkpointed (a job being placed
    /// again after a preemption); the rest is what is scored, plus a restore.
    pub done_fraction: f64,
    /// Region holding the job's last checkpoint when it resumes: a cluster
    /// elsewhere pays its transfer (egress and time).
    pub resume_from: Option<RegionId>,
    /// Times the job has been reclaimed from spot so far, and the hours of
    /// run time those reclaims lost (work since the last checkpoint). Past
    /// the policy's caps ([`Policy::spot_max_reclaims`],
    /// [`Policy::spot_max_lost_h`]) the job is offered no more spot. Filled
    /// by the caller: the simulator counts reclaims and lost run time; the
    /// meta-scheduler counts the job's runs that died or were requeued at
    /// their target (it cannot tell a reclaim from another loss) and knows
    /// no lost hours; 0 = none known.
    pub spot_reclaims: u32,
    pub spot_lost_h: f64,
}

impl PreparedJob {
    /// Dataset URIs not found in the catalog.
    pub fn unknown_datasets(&self) -> impl Iterator<Item = &str> {
        self.datasets.iter().filter(|d| !d.known).map(|d| d.uri.as_str())
    }
}

fn region_matches(pattern: &str, qualified: &str) -> bool {
    let p = pattern.trim();
    let (prov, reg) = qualified.split_once(':').unwrap_or(("", qualified));
    if p == qualified || p == reg || p == prov {
        return true;
    }
    if let Some(pre) = p.strip_suffix('*') {
        let pre = pre.strip_suffix(':').unwrap_or(pre);
        return qualified.starts_with(pre) || reg.starts_with(pre) || (prov == pre);
    }
    false
}

/// Resolves a job against the model (GPU types, regions, clusters,
/// datasets). Allocates; do it once per job.
pub fn prepare(model: &FleetModel, spec: &JobSpec) -> PreparedJob {
    let type_mask = if spec.gpu_types.is_empty() {
        u64::MAX
    } else {
        spec.gpu_types.iter().filter_map(|t| model.gpu_type_id(t)).fold(0u64, |m, id| m | (1u64 << id))
    };
    let to = if spec.to.is_empty() {
        None
    } else {
        let mut v: Vec<ClusterId> = spec.to.iter().filter_map(|n| model.cluster_id(n.trim())).collect();
        v.sort_unstable();
        v.dedup();
        Some(v)
    };
    let region_rule = if spec.region_allow.is_empty() && spec.region_deny.is_empty() {
        Vec::new()
    } else {
        model
            .regions
            .iter()
            .map(|r| {
                if spec.region_deny.iter().any(|p| region_matches(p, r)) {
                    1
                } else if !spec.region_allow.is_empty() && !spec.region_allow.iter().any(|p| region_matches(p, r)) {
                    2
                } else {
                    0
                }
            })
            .collect()
    };
    let datasets = spec
        .datasets
        .iter()
        .map(|uri| match model.dataset_for(uri) {
            Some(d) => {
                PreparedData { uri: uri.clone(), locations: d.locations.clone(), size_gb: d.size_gb, known: true }
            }
            None => PreparedData { uri: uri.clone(), locations: Vec::new(), size_gb: 0.0, known: false },
        })
        .collect();
    let ckpt_region = spec.ckpt_location.as_deref().and_then(|u| model.dataset_for(u)).map(|d| d.locations.clone());
    let ckpt_size_gb =
        spec.ckpt_size_gb.filter(|x| x.is_finite() && *x >= 0.0).unwrap_or(model.overheads.default_ckpt_size_gb);
    let wall_h = if spec.duration_s.is_finite() && spec.duration_s > 0.0 { spec.duration_s / 3600.0 } else { 0.0 };
    // The estimate was made on the GPU the job asked for when it asked for
    // exactly one type (a time limit for `--gres=gpu:h100` is H100 time);
    // otherwise, or when `duration_gpu` names it, on that GPU; else on the
    // reference GPU.
    let measured_on =
        spec.duration_gpu.clone().or_else(|| (spec.gpu_types.len() == 1).then(|| spec.gpu_types[0].clone()));
    let duration_h = wall_h * measured_on.and_then(|t| model.speed_of(&t)).unwrap_or(1.0);
    let min_speed = spec.min_gpu.as_deref().and_then(|t| model.speed_of(t)).unwrap_or(0.0);
    PreparedJob {
        spec: spec.clone(),
        type_mask,
        home: model.cluster_id(&spec.home),
        to,
        region_rule,
        datasets,
        ckpt_region,
        ckpt_size_gb,
        gpus: spec.gpus,
        duration_h,
        min_speed,
        done_fraction: 0.0,
        resume_from: None,
        spot_reclaims: 0,
        spot_lost_h: 0.0,
    }
}

/// Knobs for scoring a job that is already running somewhere.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct EvalCtx {
    /// Work still to do, in hours at the reference GPU's speed.
    pub duration_h: f64,
    /// The job already runs here: no wait, no overheads, data in place.
    pub in_place: bool,
    /// Only consider candidates with the GPUs free now.
    pub require_free: bool,
    /// Skip options whose compute cost alone exceeds this (pruning in
    /// [`decide`]; `INFINITY` elsewhere).
    pub bound: f64,
    /// Score only this pool with this pricing (a running job staying where it
    /// is; its spot GPUs are held, so spot needs no availability).
    pub stay: Option<(PoolId, Pricing)>,
    /// Score only this pool with this pricing, as a new placement would
    /// (`decide` when the cluster floor already names the cluster's best
    /// option).
    pub only: Option<(PoolId, Pricing)>,
    /// The job resumes from a checkpoint: a new cluster pays the restore.
    pub resume: bool,
    /// Compute the carbon terms even when the policy does not price carbon
    /// (explanations show kgCO2; `decide` skips it when it cannot change the
    /// ranking).
    pub carbon: bool,
}

fn cluster_gate(
    model: &FleetModel,
    st: Option<&ClusterState>,
    job: &PreparedJob,
    cid: ClusterId,
    c: &Cluster,
    in_place: bool,
) -> Result<(), Exclusion> {
    if c.health == Health::Down {
        return Err(Exclusion::Down);
    }
    if !st.is_some_and(|s| s.healthy) {
        return Err(Exclusion::Unhealthy);
    }
    let is_home = job.home == Some(cid);
    if !in_place {
        match job.spec.mode {
            FleetMode::Local if !is_home => return Err(Exclusion::LocalOnly),
            FleetMode::Remote if is_home => return Err(Exclusion::RemoteOnly),
            _ => {}
        }
    }
    if let Some(to) = &job.to {
        if to.binary_search(&cid).is_err() {
            return Err(Exclusion::NotInToList);
        }
    }
    match job.region_rule.get(c.region_id as usize) {
        Some(1) => return Err(Exclusion::RegionDenied),
        Some(2) => return Err(Exclusion::RegionNotAllowed),
        _ => {}
    }
    if let Some(max_s) = c.max_time_limit_s {
        let need_s = job.spec.time_limit_s.unwrap_or(job.spec.duration_s);
        if need_s > max_s {
            return Err(Exclusion::TimeLimit { max_s, need_s });
        }
    }
    let _ = model;
    Ok(())
}

/// Topology and power checks of one pool.
fn pool_fits(job: &PreparedJob, p: &NodePool) -> Result<(), Exclusion> {
    let g = job.gpus;
    let t = p.gpu_type;
    if p.speed < job.min_speed {
        return Err(Exclusion::TooSlow { gpu_type: t, speed: p.speed, need: job.min_speed });
    }
    if g > p.total_gpus {
        return Err(Exclusion::NotEnoughGpus { gpu_type: t, have: p.total_gpus, need: g });
    }
    if let Some(n) = job.spec.nodes.filter(|n| *n > 0) {
        if n > p.nodes {
            return Err(Exclusion::TooFewNodes { gpu_type: t, have: p.nodes, need: n });
        }
        let per = g.div_ceil(n);
        if per > p.gpus_per_node {
            return Err(Exclusion::NodeShape { gpu_type: t, per_node: p.gpus_per_node, need_per_node: per });
        }
    }
    // GPUs that must sit together in one NVLink domain (and so one rack).
    let mut in_domain = g.min(p.gpus_per_node);
    match job.spec.parallelism {
        Parallelism::Tp => {
            if g > p.nvlink_domain_gpus {
                return Err(Exclusion::NvlinkDomain { gpu_type: t, domain: p.nvlink_domain_gpus, need: g });
            }
            in_domain = g;
        }
        Parallelism::Fsdp => {
            if g <= p.nvlink_domain_gpus {
                in_domain = g;
            } else if p.ib_island_gpus == 0 {
                return Err(Exclusion::NoIbFabric { gpu_type: t, domain: p.nvlink_domain_gpus, need: g });
            } else if g > p.ib_island_gpus {
                return Err(Exclusion::IbIsland { gpu_type: t, island: p.ib_island_gpus, need: g });
            }
        }
        Parallelism::Data => {}
    }
    if let Some(cap) = p.rack_power_cap_w {
        // A gang job's GPUs in one NVLink domain draw full power together in
        // one rack; other jobs may be spread node by node across racks.
        let nodes_in_rack = in_domain.div_ceil(p.gpus_per_node.max(1)).max(1);
        let need_w = f64::from(in_domain) * p.gpu_power_w + f64::from(nodes_in_rack) * p.node_overhead_w;
        if g > 0 && need_w > cap {
            return Err(Exclusion::PowerCap { gpu_type: t, need_w, cap_w: cap, gpus_in_rack: in_domain });
        }
    }
    Ok(())
}

/// Carbon intensity for cluster `c` over `[t0, t1)`.
#[inline]
fn intensity(
    model: &FleetModel,
    state: &FleetState,
    c: &Cluster,
    cs: &ClusterState,
    t0: f64,
    t1: f64,
    lca: bool,
) -> f64 {
    if let Some(z) = c.carbon_zone_id {
        if let Some(Some(s)) = state.carbon.get(z as usize) {
            return s.mean_between(t0, t1, lca);
        }
    }
    cs.carbon_g_per_kwh.unwrap_or(model.overheads.default_carbon_g_per_kwh)
}

/// Data egress USD and transfer hours to bring the job's datasets to `c`.
#[inline]
fn data_cost(model: &FleetModel, job: &PreparedJob, c: &Cluster) -> (f64, f64) {
    let (mut usd, mut hours) = (0.0, 0.0);
    for d in &job.datasets {
        if d.size_gb <= 0.0 || d.locations.is_empty() || d.locations.contains(&c.region_id) {
            continue;
        }
        let mut best = (f64::INFINITY, 0.0);
        for &l in &d.locations {
            let e = d.size_gb * model.egress_usd_per_gb(l, c.region_id);
            let gbps = model.bandwidth_gbps(l, c.region_id).max(1e-3);
            let h = (d.size_gb * 8.0 / gbps + model.overheads.staging_latency_s) / 3600.0;
            if e < best.0 || (e == best.0 && h < best.1) {
                best = (e, h);
            }
        }
        usd += best.0;
        hours += best.1;
    }
    (usd, hours)
}

/// The terms of a score that need no data transfer or carbon: run time,
/// wait, overheads, spot losses and compute. [`score`] and the pruning floor
/// of [`decide`] share them, so the floor is the score's own arithmetic with
/// the remaining (non-negative) terms left out.
struct CoreTerms {
    g: f64,
    d_h: f64,
    wait_h: f64,
    restore_h: f64,
    overhead_h: f64,
    interval_h: Option<f64>,
    lost_h: f64,
    requeue_h: f64,
    compute_usd: f64,
}

#[allow(clippy::too_many_arguments)]
#[inline]
fn core_terms(
    model: &FleetModel,
    job: &PreparedJob,
    cid: ClusterId,
    c: &Cluster,
    p: &NodePool,
    ps: &PoolState,
    pricing: Pricing,
    price: f64,
    tv: f64,
    now_unix: f64,
    ctx: &EvalCtx,
    spot_losses: bool,
) -> CoreTerms {
    let g = f64::from(job.gpus);
    // Run time on this pool's GPUs.
    let d_h = ctx.duration_h / p.speed.max(1e-6);
    let ov = &model.overheads;
    let fits_now = ps.free_gpus >= job.gpus;
    // Queueing for spot capacity that is not free now: the state's expected
    // spot wait (see `spot_queued`).
    let queued_spot_wait =
        if pricing == Pricing::Spot && !ctx.in_place && !ps.spot_available { spot_wait_s(ps) } else { None };
    let wait_h = if ctx.in_place || (fits_now && queued_spot_wait.is_none()) {
        0.0
    } else {
        let mut w = queued_spot_wait.unwrap_or_else(|| ps.expected_wait_s.unwrap_or(p.mean_wait_s));
        if c.health == Health::Degraded {
            w += ov.degraded_wait_s;
        }
        w.max(0.0) / 3600.0
    };
    let remote = !ctx.in_place && job.home != Some(cid);
    let provision_h = if !ctx.in_place && !c.onprem { c.provision_s / 3600.0 } else { 0.0 };
    // Resuming: the checkpoint is restored before work goes on.
    let restore_h = if ctx.resume && !ctx.in_place { ov.restore_s / 3600.0 } else { 0.0 };
    let overhead_h = provision_h + restore_h + if remote { ov.remote_submit_s / 3600.0 } else { 0.0 };
    let interval_h = job.spec.ckpt_interval_s.filter(|x| x.is_finite() && *x > 0.0).map(|x| x / 3600.0);
    let (lost_h, requeue_h, fallback_usd) = if pricing == Pricing::Spot && spot_losses {
        let rate = ps.spot_preemptions_per_hour.unwrap_or(c.spot_preemptions_per_hour).max(0.0);
        let per = interval_h.map(|i| i.min(d_h) / 2.0).unwrap_or(d_h / 2.0) + ov.restore_s / 3600.0;
        // After each reclaim the job waits for spot to come back (the pool's
        // recovery time `back`) and its whole run is on spot: `rate` reclaims
        // per hour of it. Or, when cheaper, it goes on demand at once (what a
        // new placement does when queueing for spot costs more) and back onto
        // spot once spot is back: one more setup per reclaim (billed on demand
        // and waited), no wait, the on-demand premium for the part of the run
        // off spot, and no reclaim in that part. The part on spot is at least
        // the first spot stretch (E[min(R, D)], R the time to the first
        // reclaim: from the pool's windows when known, else exponential at
        // `rate`; one reclaim with P(R ≤ D)) and at least the long-run share of
        // alternating stretches of 1/rate on spot and `back` on demand (D ÷ (1
        // + rate × back), `rate` reclaims per hour of it); the larger is taken.
        let back_h = ps.spot_recovery_s.filter(|x| x.is_finite() && *x > 0.0).map_or(0.0, |x| x / 3600.0);
        let n_wait = rate * d_h;
        let (first_h, first_p) = match &ps.spot_windows {
            Some(w) => w.first_stretch(d_h, ps.spot_window_since_unix.map(|t| (now_unix - t).max(0.0) / 3600.0)),
            None if rate > 0.0 => {
                let p = -(-rate * d_h).exp_m1();
                (p / rate, p)
            }
            None => (d_h, 0.0),
        };
        let long_h = d_h / (1.0 + rate * back_h);
        let (on_spot_h, n_fb) = if first_h >= long_h { (first_h, first_p) } else { (long_h, rate * long_h) };
        let on_spot_h = on_spot_h.min(d_h);
        let setup_h = c.provision_s / 3600.0 + ov.restore_s / 3600.0;
        let fallback = p.prices.on_demand.filter(|od| od.is_finite() && *od >= price).map(|od| {
            let usd = g * ((od - price) * (d_h - on_spot_h) + n_fb * od * setup_h);
            (usd, usd + tv * g * n_fb * setup_h)
        });
        // The cheaper way, counting the work lost at its reclaims (billed and
        // waited) too.
        let lost_usd = (price + tv) * g * per;
        match fallback {
            Some((usd, all)) if all + n_fb * lost_usd < n_wait * (tv * g * back_h + lost_usd) => {
                (n_fb * per, n_fb * setup_h, usd)
            }
            _ => (n_wait * per, n_wait * back_h, 0.0),
        }
    } else {
        (0.0, 0.0, 0.0)
    };
    let compute_usd = price * g * (d_h + lost_h + provision_h + restore_h) + fallback_usd;
    CoreTerms { g, d_h, wait_h, restore_h, overhead_h, interval_h, lost_h, requeue_h, compute_usd }
}

/// The state's expected wait for the pool's spot capacity, when it gives a
/// usable one.
#[inline]
fn spot_wait_s(ps: &PoolState) -> Option<f64> {
    ps.spot_wait_s.filter(|w| w.is_finite() && *w >= 0.0)
}

/// USD per GPU-hour of an owned pool as `policy` scores it: its running cost
/// (`Prices::running`) where the policy asks for it and the fleet gives one,
/// else its amortized price (or its on-demand price, for an owned pool priced
/// so).
fn owned_price(p: &NodePool, policy: &Policy) -> Option<f64> {
    let amortized = p.prices.amortized();
    if policy.owned_at_running_cost {
        p.prices.running.or(amortized)
    } else {
        amortized
    }
}

/// Spot is on offer to a new placement of `job` on a pool in state `ps`: the
/// job is interruptible, the policy allows spot, and the job's GPUs are free
/// on the pool's spot capacity now or (a policy that queues for spot) the
/// state says how long until they are and the job can make progress there
/// ([`spot_queue_makes_progress`]).
#[inline]
fn spot_offered(
    model: &FleetModel,
    job: &PreparedJob,
    policy: &Policy,
    c: &Cluster,
    ps: &PoolState,
    ctx: &EvalCtx,
) -> bool {
    job.spec.interruptible
        && policy.allow_spot
        && !spot_capped(job, policy)
        && (ps.spot_available
            || (policy.spot_queue
                && !ctx.in_place
                && spot_wait_s(ps).is_some()
                && spot_queue_makes_progress(model, job, c, ps)))
}

/// The job has used up the policy's spot allowance: reclaimed
/// [`Policy::spot_max_reclaims`] times, or lost [`Policy::spot_max_lost_h`]
/// hours of run time to reclaims (a job that says it checkpoints but writes
/// nothing loses all its run each time). It goes on-demand from then on, so
/// that no job cycles between a spot queue and reclaims without end.
#[inline]
pub fn spot_capped(job: &PreparedJob, policy: &Policy) -> bool {
    (policy.spot_max_reclaims > 0 && job.spot_reclaims >= policy.spot_max_reclaims)
        || (policy.spot_max_lost_h > 0.0 && job.spot_lost_h >= policy.spot_max_lost_h)
}

/// Queueing for spot only pays for a job that checkpoints and whose setup
/// (provisioning, restore) plus one checkpoint interval fits in the pool's
/// expected spot window (1 ÷ its preemption rate): otherwise each window
/// may end before anything is kept, and a job that waits for spot again
/// after every reclaim would never finish.
#[inline]
fn spot_queue_makes_progress(model: &FleetModel, job: &PreparedJob, c: &Cluster, ps: &PoolState) -> bool {
    let Some(interval_s) = job.spec.ckpt_interval_s.filter(|x| x.is_finite() && *x > 0.0) else {
        return false;
    };
    let rate = ps.spot_preemptions_per_hour.unwrap_or(c.spot_preemptions_per_hour);
    if !(rate.is_finite() && rate > 0.0) {
        return true;
    }
    let setup_s = if c.onprem { 0.0 } else { c.provision_s } + model.overheads.restore_s;
    (interval_s + setup_s) / 3600.0 < 1.0 / rate
}

/// Egress USD and transfer hours of the job's data to `c` (`data`, from
/// [`data_cost`]), plus a resumed job's checkpoint when it moves region.
#[inline]
fn data_terms(
    model: &FleetModel,
    job: &PreparedJob,
    c: &Cluster,
    restore_h: f64,
    data: (f64, f64),
    ctx: &EvalCtx,
) -> (f64, f64) {
    let (data_usd, transfer_h) = if ctx.in_place { (0.0, 0.0) } else { data };
    // A resumed job's checkpoint moves to a cluster in another region.
    match job.resume_from {
        Some(src) if restore_h > 0.0 && src != c.region_id => (
            data_usd + job.ckpt_size_gb * model.egress_usd_per_gb(src, c.region_id),
            transfer_h + job.ckpt_size_gb * 8.0 / model.bandwidth_gbps(src, c.region_id).max(1e-3) / 3600.0,
        ),
        _ => (data_usd, transfer_h),
    }
}

/// Whether cluster `c` may offer a new placement of `job` a score of at most
/// `bound`, judged by what every option there pays: its cheapest compute
/// (`compute`: the cluster's price ÷ speed floor times the job's work, shaded
/// as in [`decide`]), the time value of provisioning and remote submission,
/// and the egress and transfer of the job's data. `None` when even that is
/// above `bound`; else the data's egress USD and transfer hours
/// ([`data_cost`]). These sums round differently from a score's, so the last
/// comparison is shaded by a relative 1e-9 too.
#[inline]
pub(crate) fn cluster_bound(
    model: &FleetModel,
    job: &PreparedJob,
    policy: &Policy,
    cid: ClusterId,
    c: &Cluster,
    compute: f64,
    bound: f64,
) -> Option<(f64, f64)> {
    let tv = policy.time_value(job.gpus);
    let g = f64::from(job.gpus);
    let prov_h = if c.onprem { 0.0 } else { c.provision_s / 3600.0 };
    let away_h = if job.home == Some(cid) { 0.0 } else { model.overheads.remote_submit_s / 3600.0 };
    let lb = compute + tv * g * (prov_h + away_h);
    if lb > bound {
        return None;
    }
    let (usd, h) = data_cost(model, job, c);
    if (lb + policy.egress_weight * usd + tv * g * h) * (1.0 - 1e-9) > bound {
        return None;
    }
    Some((usd, h))
}

/// A floor of the best score cluster `cid` can offer a job (INFINITY when no
/// pool of it could take the job): for each option [`eval_cluster`] would
/// score, its score by the same arithmetic ([`core_terms`], [`data_terms`])
/// without checkpoint egress and carbon. With non-negative policy weights
/// those are >= 0 and IEEE rounding is monotone, so the floor is never above
/// the score, bit for bit (and equal to it when the job writes no
/// checkpoints elsewhere and the policy does not price carbon).
///
/// Also the option that gives it (the first minimum in [`eval_cluster`]'s
/// order). A spot option whose score without its reclaim terms is already no
/// lower than the floor so far, or above `ctx.bound`, is not finished: it
/// cannot lower the floor, or the floor is then above the bound anyway. So the
/// value is the exact floor whenever it is at most `ctx.bound`.
///
/// `data`: the job's [`data_cost`] to the cluster, when the caller has it.
fn score_floor(
    model: &FleetModel,
    state: &FleetState,
    job: &PreparedJob,
    policy: &Policy,
    cid: ClusterId,
    ctx: &EvalCtx,
    mut data: Option<(f64, f64)>,
) -> (f64, Option<(PoolId, Pricing)>) {
    let (Some(c), Some(cs)) = (model.clusters.get(cid as usize), state.clusters.get(cid as usize)) else {
        return (f64::INFINITY, None);
    };
    if c.type_mask & job.type_mask == 0 {
        return (f64::INFINITY, None);
    }
    let tv = policy.time_value(job.gpus);
    let mut floor = f64::INFINITY;
    let mut arg = None;
    for (pi, p) in c.pools.iter().enumerate() {
        if job.type_mask & (1u64 << p.gpu_type) == 0 || p.speed < job.min_speed || job.gpus > p.total_gpus {
            continue;
        }
        let Some(ps) = cs.pools.get(pi) else { continue };
        let options: [(Pricing, Option<f64>); 2] = if c.onprem {
            [(Pricing::Onprem, owned_price(p, policy)), (Pricing::Spot, None)]
        } else {
            let spot =
                if spot_offered(model, job, policy, c, ps, ctx) { ps.spot_price.or(p.prices.spot) } else { None };
            [(Pricing::OnDemand, p.prices.on_demand), (Pricing::Spot, spot)]
        };
        for (pricing, price) in options {
            let Some(price) = price.filter(|x| x.is_finite() && *x >= 0.0) else {
                continue;
            };
            let mut terms = |spot_losses| {
                let t = core_terms(model, job, cid, c, p, ps, pricing, price, tv, state.now_unix, ctx, spot_losses);
                let d = *data.get_or_insert_with(|| data_cost(model, job, c));
                let (data_usd, transfer_h) = data_terms(model, job, c, t.restore_h, d, ctx);
                let delay_h = t.wait_h + transfer_h + t.overhead_h + t.lost_h + t.requeue_h;
                t.compute_usd + policy.egress_weight * data_usd + tv * t.g * delay_h
            };
            // A spot option's losses at reclaims (lost work, the wait or the
            // on-demand time after them) only add to its score: without them it
            // is already no lower than the floor so far, or above the best score
            // found, then it changes neither the floor nor the verdict.
            if pricing == Pricing::Spot {
                let base = terms(false);
                if base >= floor || base > ctx.bound {
                    continue;
                }
            }
            let x = terms(true);
            if x < floor {
                floor = x;
                arg = Some((pi as PoolId, pricing));
            }
        }
    }
    (floor, arg)
}

/// The floor is the cluster's score, option by option and bit for bit: the
/// policy prices no carbon and the job writes no checkpoints outside the
/// cluster's region (the two terms [`score_floor`] leaves out).
#[inline]
fn floor_is_exact(job: &PreparedJob, policy: &Policy, c: &Cluster) -> bool {
    policy.carbon_usd_per_kg == 0.0
        && match &job.ckpt_region {
            Some(locs) => locs.is_empty() || locs.contains(&c.region_id),
            None => true,
        }
}

/// Scores one pool of one cluster with one pricing. `None` when the price
/// is missing or the score is not finite.
#[allow(clippy::too_many_arguments)]
#[inline]
fn score(
    model: &FleetModel,
    state: &FleetState,
    job: &PreparedJob,
    policy: &Policy,
    cid: ClusterId,
    c: &Cluster,
    cs: &ClusterState,
    p: &NodePool,
    ps: &PoolState,
    pricing: Pricing,
    price: f64,
    data: (f64, f64),
    ctx: &EvalCtx,
) -> Breakdown {
    let tv = policy.time_value(job.gpus);
    let CoreTerms { g, d_h, wait_h, restore_h, overhead_h, interval_h, lost_h, requeue_h, compute_usd } =
        core_terms(model, job, cid, c, p, ps, pricing, price, tv, state.now_unix, ctx, true);
    let (data_usd, transfer_h) = data_terms(model, job, c, restore_h, data, ctx);
    let ckpt_usd = match &job.ckpt_region {
        Some(locs) if !locs.is_empty() && !locs.contains(&c.region_id) => {
            let n = interval_h.map(|i| (d_h / i).ceil().max(1.0)).unwrap_or(1.0);
            let e = locs.iter().map(|&l| model.egress_usd_per_gb(c.region_id, l)).fold(f64::INFINITY, f64::min);
            job.ckpt_size_gb * n * e
        }
        _ => 0.0,
    };
    let egress_usd = data_usd + ckpt_usd;
    let before_h = wait_h + transfer_h + overhead_h + lost_h;
    let delay_h = before_h + requeue_h;
    let time_usd = tv * g * delay_h;
    let start = state.now_unix + before_h * 3600.0;
    let ci = if ctx.carbon || policy.carbon_usd_per_kg != 0.0 {
        intensity(model, state, c, cs, start, start + (d_h + lost_h) * 3600.0, policy.use_lca)
    } else {
        0.0
    };
    let kg_co2 = ci * p.gpu_power_w * g * (d_h + lost_h) * c.pue / 1e6;
    let carbon_usd = policy.carbon_usd_per_kg * kg_co2;
    let total = compute_usd + policy.egress_weight * egress_usd + time_usd + carbon_usd;
    Breakdown {
        price_per_gpu_hour: price,
        compute_usd,
        egress_usd,
        wait_h,
        transfer_h,
        overhead_h,
        lost_work_h: lost_h,
        requeue_h,
        time_usd,
        carbon_g_per_kwh: ci,
        kg_co2,
        carbon_usd,
        total,
    }
}

/// The best placement on one cluster, or why there is none.
pub(crate) fn eval_cluster(
    model: &FleetModel,
    state: &FleetState,
    job: &PreparedJob,
    policy: &Policy,
    cid: ClusterId,
    ctx: &EvalCtx,
) -> Result<Placement, Exclusion> {
    let Some(c) = model.clusters.get(cid as usize) else {
        return Err(Exclusion::BadInput);
    };
    let cs = state.clusters.get(cid as usize);
    cluster_gate(model, cs, job, cid, c, ctx.in_place)?;
    let Some(cs) = cs else {
        return Err(Exclusion::Unhealthy);
    };
    if c.type_mask & job.type_mask == 0 {
        return Err(Exclusion::NoGpuType);
    }
    let mut best: Option<Placement> = None;
    let mut why = Exclusion::NoGpuType;
    let mut cheapest_over = f64::INFINITY;
    let mut data: Option<(f64, f64)> = None;
    let better = |why: &mut Exclusion, e: Exclusion| {
        if e.rank() >= why.rank() {
            *why = e;
        }
    };
    for (pi, p) in c.pools.iter().enumerate() {
        let other_pool = |o: Option<(PoolId, Pricing)>| o.is_some_and(|(sp, _)| usize::from(sp) != pi);
        if job.type_mask & (1u64 << p.gpu_type) == 0 || other_pool(ctx.stay) || other_pool(ctx.only) {
            continue;
        }
        let Some(ps) = cs.pools.get(pi) else { continue };
        if let Err(e) = pool_fits(job, p) {
            better(&mut why, e);
            continue;
        }
        let fits_now = ps.free_gpus >= job.gpus;
        if ctx.require_free && !fits_now {
            continue;
        }
        let options: [(Pricing, Option<f64>); 2] = if c.onprem {
            [(Pricing::Onprem, owned_price(p, policy)), (Pricing::Spot, None)]
        } else {
            let on_spot = ctx.stay.is_some_and(|(_, k)| k == Pricing::Spot);
            let spot = if on_spot || spot_offered(model, job, policy, c, ps, ctx) {
                ps.spot_price.or(p.prices.spot)
            } else {
                None
            };
            [(Pricing::OnDemand, p.prices.on_demand), (Pricing::Spot, spot)]
        };
        let mut priced = false;
        for (pricing, price) in options {
            let Some(price) = price.filter(|x| x.is_finite() && *x >= 0.0) else {
                continue;
            };
            priced = true;
            if ctx.stay.is_some_and(|(_, k)| k != pricing) || ctx.only.is_some_and(|(_, k)| k != pricing) {
                continue;
            }
            // Spot not free now, queued for (the job waits for the pool's spot
            // capacity): never a move that must start now.
            let queued_spot = pricing == Pricing::Spot && ctx.stay.is_none() && !ps.spot_available;
            if queued_spot && ctx.require_free {
                continue;
            }
            // Compute alone is a lower bound of the score: an option whose
            // compute already exceeds the best score so far cannot win.
            if price * f64::from(job.gpus) * ctx.duration_h / p.speed.max(1e-6) > ctx.bound {
                continue;
            }
            // A user's most per GPU-hour is against what the GPU is billed at:
            // an owned one at its amortized price, even where the policy
            // scores it at its running cost.
            if let Some(max) = job.spec.max_price {
                let billed = if pricing == Pricing::Onprem { p.prices.amortized() } else { None };
                let billed = billed.unwrap_or(price);
                if billed > max {
                    cheapest_over = cheapest_over.min(billed);
                    continue;
                }
            }
            let d = *data.get_or_insert_with(|| data_cost(model, job, c));
            let b = score(model, state, job, policy, cid, c, cs, p, ps, pricing, price, d, ctx);
            if !b.total.is_finite() {
                better(&mut why, Exclusion::BadInput);
                continue;
            }
            if best.is_none_or(|x| b.total < x.breakdown.total) {
                let fits_now = fits_now && !queued_spot;
                best = Some(Placement { cluster: cid, pool: pi as PoolId, pricing, fits_now, breakdown: b });
            }
        }
        if !priced {
            better(&mut why, Exclusion::NoPrice { gpu_type: p.gpu_type });
        }
    }
    if let Some(b) = best {
        return Ok(b);
    }
    if cheapest_over.is_finite() {
        better(&mut why, Exclusion::MaxPrice { cheapest: cheapest_over, max: job.spec.max_price.unwrap_or(0.0) });
    }
    Err(why)
}

fn ctx_for(job: &PreparedJob) -> EvalCtx {
    EvalCtx {
        duration_h: job.duration_h * (1.0 - job.done_fraction).clamp(0.0, 1.0),
        in_place: false,
        require_free: false,
        bound: f64::INFINITY,
        stay: None,
        only: None,
        resume: job.done_fraction > 0.0,
        carbon: true,
    }
}

/// `a` ranks before `b`: lower total; ties go home first, then lower id.
#[inline]
fn ranks_before(job: &PreparedJob, a: &Placement, b: &Placement) -> bool {
    if a.breakdown.total != b.breakdown.total {
        return a.breakdown.total < b.breakdown.total;
    }
    let (ah, bh) = (job.home == Some(a.cluster), job.home == Some(b.cluster));
    if ah != bh {
        return ah;
    }
    a.cluster < b.cluster
}

/// The best placement for a prepared job, or `None` when every cluster is
/// excluded. Allocation-free.
pub fn decide(model: &FleetModel, state: &FleetState, job: &PreparedJob, policy: &Policy) -> Option<Placement> {
    let mut ctx = ctx_for(job);
    let mut best: Option<Placement> = None;
    // Clusters in increasing order of their cheapest unit of work: once that
    // alone costs more than the best score found, no later cluster can win
    // (every term of the score is >= 0). Live spot prices in the state may
    // undercut the model's, so then every cluster is scored.
    let can_stop = policy.time_value(job.gpus) >= 0.0
        && policy.carbon_usd_per_kg >= 0.0
        && policy.egress_weight >= 0.0
        && !state.clusters.iter().any(|c| c.pools.iter().any(|p| p.spot_price.is_some()));
    // GPU-hours of work, shaded by a relative 1e-9: the cluster floor below is
    // price ÷ speed times the work, a score's compute is price times the run
    // (work ÷ speed), and the two roundings may differ in the last bits; the
    // shade keeps floor × work under any score it bounds, so an exact tie is
    // never cut off.
    let work = f64::from(job.gpus) * ctx.duration_h * (1.0 - 1e-9);
    // The decision needs kgCO2 only when the policy prices it.
    ctx.carbon = false;
    // The home cluster first: often the best or close to it, its score
    // prunes most of the scan below (the result does not depend on the order:
    // `ranks_before` is a total order).
    let seed = if can_stop { job.home } else { None };
    if let Some(h) = seed {
        if let Ok(p) = eval_cluster(model, state, job, policy, h, &ctx) {
            ctx.bound = p.breakdown.total;
            best = Some(p);
        }
    }
    for &(floor, cid) in model.cheapest_for(policy) {
        if seed == Some(cid) {
            continue;
        }
        // The floor's best option, when it alone needs scoring.
        let mut pick = None;
        if can_stop && best.is_some() {
            if floor * work > ctx.bound {
                break;
            }
            // (An id not in the model scores nothing: `eval_cluster` says so.)
            let Some(c) = model.clusters.get(cid as usize) else {
                continue;
            };
            let Some(data) = cluster_bound(model, job, policy, cid, c, floor * work, ctx.bound) else {
                continue;
            };
            // The cluster's own floor for this job and state (spot losses,
            // waits and setup included): a cluster whose floor is above the
            // best score cannot win, not even a tie.
            let (f, arg) = score_floor(model, state, job, policy, cid, &ctx, Some(data));
            if f > ctx.bound {
                continue;
            }
            // At best a tie, which goes home first, then to the lower id.
            if f == ctx.bound
                && job.home != Some(cid)
                && best.as_ref().is_some_and(|b| job.home == Some(b.cluster) || b.cluster < cid)
            {
                continue;
            }
            pick = arg.filter(|_| floor_is_exact(job, policy, c));
        }
        // The floor's option is the cluster's best whenever `eval_cluster` scores
        // it at all; when it does not (a check the floor does not make), the
        // whole cluster is scored.
        let verdict = pick
            .and_then(|o| eval_cluster(model, state, job, policy, cid, &EvalCtx { only: Some(o), ..ctx }).ok())
            .map_or_else(|| eval_cluster(model, state, job, policy, cid, &ctx), Ok);
        if let Ok(p) = verdict {
            if best.as_ref().is_none_or(|b| ranks_before(job, &p, b)) {
                ctx.bound = p.breakdown.total;
                best = Some(p);
            }
        }
    }
    best
}

/// Every feasible (cluster, pool, pricing) for a job, each scored as if
/// it were the only option, regardless of free GPUs or current spot
/// availability (spot only for interruptible jobs under a policy that
/// allows it). For optimisation bounds that need every option, not the
/// best per cluster.
pub fn all_options(model: &FleetModel, state: &FleetState, job: &PreparedJob, policy: &Policy) -> Vec<Placement> {
    let mut out = Vec::new();
    for (cid, c) in model.clusters.iter().enumerate() {
        let cid = cid as ClusterId;
        for pi in 0..c.pools.len() {
            let kinds: &[Pricing] = match (c.onprem, job.spec.interruptible && policy.allow_spot) {
                (true, _) => &[Pricing::Onprem],
                (false, true) => &[Pricing::OnDemand, Pricing::Spot],
                (false, false) => &[Pricing::OnDemand],
            };
            for &k in kinds {
                let ctx = EvalCtx { stay: Some((pi as PoolId, k)), ..ctx_for(job) };
                if let Ok(p) = eval_cluster(model, state, job, policy, cid, &ctx) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// Every cluster's verdict for a prepared job, unsorted, without strings
/// (for the simulator's baselines and callers that rank themselves).
pub fn evaluate_all<'a>(
    model: &'a FleetModel,
    state: &'a FleetState,
    job: &'a PreparedJob,
    policy: &'a Policy,
) -> impl Iterator<Item = (ClusterId, Result<Placement, Exclusion>)> + 'a {
    let ctx = ctx_for(job);
    (0..model.clusters.len() as ClusterId).map(move |cid| (cid, eval_cluster(model, state, job, policy, cid, &ctx)))
}

/// One cluster's verdict for a prepared job (its best pool and pricing), as
/// [`evaluate_all`] gives it. `with_carbon = false` leaves the carbon terms
/// out (kgCO2 0 in the breakdown) when the policy does not price carbon, which
/// changes no score; a policy that prices carbon always gets them.
pub fn evaluate_cluster(
    model: &FleetModel,
    state: &FleetState,
    job: &PreparedJob,
    policy: &Policy,
    cid: ClusterId,
    with_carbon: bool,
) -> Result<Placement, Exclusion> {
    let ctx = EvalCtx { carbon: with_carbon, ..ctx_for(job) };
    eval_cluster(model, state, job, policy, cid, &ctx)
}

/// One ranked candidate in an explanation.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Candidate {
    pub cluster: String,
    pub pool: String,
    pub gpu_type: String,
    pub pricing: Pricing,
    pub fits_now: bool,
    pub home: bool,
    pub breakdown: Breakdown,
}

/// One excluded cluster and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Excluded {
    pub cluster: String,
    pub reason: String,
    /// The reason lasts as long as the model and the job do (shape,
    /// topology, speed, rules); false for what changes by itself (health,
    /// prices).
    #[serde(skip)]
    pub lasting: bool,
}

/// The explained decision: ranked candidates with their breakdowns and
/// every excluded cluster with its reason. `Display` prints the table
/// `fleetctl job explain` shows.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Decision {
    pub job: String,
    pub policy: String,
    pub summary: String,
    /// Best first.
    pub ranked: Vec<Candidate>,
    pub excluded: Vec<Excluded>,
    /// Notes (unknown datasets, …).
    pub notes: Vec<String>,
}

/// Alias used by `fleetctl job explain`.
pub type Explanation = Decision;

impl Decision {
    pub fn chosen(&self) -> Option<&Candidate> {
        self.ranked.first()
    }
}

/// Explains the decision for a job: ranks every feasible cluster and gives
/// each excluded one its reason. The first candidate is what [`decide`]
/// returns.
pub fn explain(model: &FleetModel, state: &FleetState, spec: &JobSpec, policy: &Policy) -> Decision {
    let job = prepare(model, spec);
    explain_prepared(model, state, &job, policy)
}

pub fn explain_prepared(model: &FleetModel, state: &FleetState, job: &PreparedJob, policy: &Policy) -> Decision {
    let mut ok: Vec<Placement> = Vec::new();
    let mut excluded = Vec::new();
    for (cid, r) in evaluate_all(model, state, job, policy) {
        let Some(c) = model.cluster(cid) else {
            continue;
        };
        match r {
            Ok(p) => ok.push(p),
            Err(e) => excluded.push(Excluded {
                cluster: c.name.clone(),
                reason: e.describe(model, c, job),
                lasting: e.lasting(),
            }),
        }
    }
    ok.sort_by(|a, b| {
        if ranks_before(job, a, b) {
            std::cmp::Ordering::Less
        } else if ranks_before(job, b, a) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
    let ranked = ok
        .iter()
        .filter_map(|p| {
            let c = model.cluster(p.cluster)?;
            let pool = c.pools.get(p.pool as usize)?;
            Some(Candidate {
                cluster: c.name.clone(),
                pool: pool.name.clone(),
                gpu_type: model.gpu_type_name(pool.gpu_type).to_string(),
                pricing: p.pricing,
                fits_now: p.fits_now,
                home: job.home == Some(p.cluster),
                breakdown: p.breakdown,
            })
        })
        .collect();
    let mut notes: Vec<String> =
        job.unknown_datasets().map(|u| format!("dataset {u} is not in the catalog; counted as 0 GB")).collect();
    if job.home.is_none() && !job.spec.home.is_empty() {
        notes.push(format!("home cluster {} is not in the fleet model", job.spec.home));
    }
    let s = &job.spec;
    let summary = format!(
        "{} × {} GPU, {}, {:.2} h expected{}{}, home {}",
        s.gpus,
        if s.gpu_types.is_empty() { "any".to_string() } else { s.gpu_types.join("|") },
        s.parallelism.as_str(),
        job.duration_h,
        if s.interruptible { ", interruptible" } else { "" },
        s.max_price.map(|m| format!(", max {m:.2} USD/GPU-h")).unwrap_or_default(),
        if s.home.is_empty() { "-" } else { &s.home },
    );
    Decision { job: s.id.clone(), policy: policy.name.clone(), summary, ranked, excluded, notes }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "job {}: {} — policy {}",
            if self.job.is_empty() { "-" } else { &self.job },
            self.summary,
            self.policy
        )?;
        match self.chosen() {
            Some(c) => writeln!(f, "placed on {} ({} {}, {})", c.cluster, c.pool, c.gpu_type, c.pricing.as_str())?,
            None => writeln!(f, "no feasible cluster")?,
        }
        if !self.ranked.is_empty() {
            writeln!(
                f,
                "{:>4}  {:<16} {:<10} {:<9} {:>7} {:>10} {:>8} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>10}",
                "rank",
                "cluster",
                "pool",
                "pricing",
                "$/GPUh",
                "compute$",
                "egress$",
                "wait",
                "xfer",
                "ovhd",
                "lost",
                "time$",
                "kgCO2",
                "carbon$",
                "total$"
            )?;
            for (i, c) in self.ranked.iter().enumerate() {
                let b = &c.breakdown;
                let name = if c.home { format!("{} (home)", c.cluster) } else { c.cluster.clone() };
                writeln!(
                    f,
                    "{:>4}  {:<16} {:<10} {:<9} {:>7.2} {:>10.2} {:>8.2} {:>5.2}h {:>5.2}h {:>5.2}h {:>5.2}h {:>8.2} {:>8.1} {:>8.2} {:>10.2}",
                    i + 1,
                    name,
                    c.pool,
                    c.pricing.as_str(),
                    b.price_per_gpu_hour,
                    b.compute_usd,
                    b.egress_usd,
                    b.wait_h,
                    b.transfer_h,
                    b.overhead_h,
                    b.lost_work_h,
                    b.time_usd,
                    b.kg_co2,
                    b.carbon_usd,
                    b.total
                )?;
            }
        }
        if !self.excluded.is_empty() {
            writeln!(f, "excluded:")?;
            for e in &self.excluded {
                writeln!(f, "  {:<16} {}", e.cluster, e.reason)?;
            }
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}
