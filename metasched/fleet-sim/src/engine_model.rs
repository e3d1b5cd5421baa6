//! The simulator's [`Model`] backed by `fleet-engine`: every engine-policy placement
//! is `fleet_engine::decide` on a [`FleetState`] built from the simulator's queues,
//! rebalancing is `fleet_engine::propose_migrations`, and the baselines rank
//! `fleet_engine::evaluate_all` (the same hard filters) by their own rule.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use fleet_engine::engine::PreparedData;
use fleet_engine::model::qualify_region;
use fleet_engine::{
    decide, evaluate_cluster, parse_carbon, parse_egress, parse_prices, prepare, FleetConfig, FleetModel, FleetState,
    JobSpec, MigrationMargin, Placement, Policies, Policy, PreparedJob, Pricing,
};

use crate::sim::{ClusterLoad, Model, Move, Offer, RunningJob, SimCluster, SimJob, SimPool};
use crate::spot::SpotTrace;
use crate::trace::TraceJob;

/// The raw inputs of an engine model (file contents, so tests can build them inline).
#[derive(Debug, Clone, Default)]
pub struct EngineSetup {
    pub fleet_toml: String,
    /// The fleet file's name, for `file:line` in errors.
    pub fleet_name: String,
    /// `[policies.<name>]` tables; `None` = the engine's built-ins.
    pub policies_toml: Option<String>,
    /// The policies file's name, for `file:line` in errors.
    pub policies_name: String,
    /// (name, text) of carbon series CSVs.
    pub carbon_csvs: Vec<(String, String)>,
    /// (provider, text) of egress matrices.
    pub egress_csvs: Vec<(String, String)>,
    pub prices_csv: Option<String>,
    /// Each job reads one dataset of this size stored in its home cluster's region.
    pub dataset_gb: f64,
}

/// Policy names the simulator uses internally for the baselines.
pub use crate::sim::{FIRST_START, GREEDY, GREEDY_SPOT, HOME_ONLY, RANDOM};
pub const LOWER_BOUND: &str = "lower-bound";

/// A pool's fixed spot facts ([`EngineModel::pool_static`]).
#[derive(Clone, Copy, Debug)]
struct PoolStatic {
    /// Sells spot.
    has_spot: bool,
    /// Has a spot trace.
    traced: bool,
    /// That trace's preemption rate (per hour).
    rate: Option<f64>,
    /// That trace is all-or-nothing (its windows are handed to the engine).
    all_or_nothing: bool,
}

/// Cloning gives an independent model in the same state (one per simulated
/// strategy, without parsing the inputs again).
#[derive(Clone)]
pub struct EngineModel {
    pub fleet: FleetModel,
    policies: Policies,
    baseline_policies: BTreeMap<&'static str, Policy>,
    clusters: Vec<SimCluster>,
    state: FleetState,
    /// Prepared job per trace job id (built lazily; prepare allocates).
    prepared: Vec<Option<PreparedJob>>,
    epoch_unix: f64,
    /// Empirical preemption rate (per hour) of each spot trace.
    spot_rates: Vec<f64>,
    /// Whether each spot trace is all-or-nothing (every tick 0 or its full
    /// size: a drop reclaims every spot job, so the windows the replay has seen
    /// end tell a job on spot how long it keeps it, [`fleet_engine::SpotWindows`]).
    spot_all_or_nothing: Vec<bool>,
    /// Spot trace of each (cluster, pool) that sells spot.
    pool_spot: Vec<Vec<Option<usize>>>,
    /// Per (cluster, pool): what `sync_state` needs besides the load, kept flat.
    pool_static: Vec<Vec<PoolStatic>>,
    /// `state` holds the idle fleet as synced for a job of this many GPUs.
    idle_synced: Option<u32>,
    /// Per cluster: the load version last copied into `state` (0 = none), and the
    /// job size it was copied for.
    synced: Vec<u64>,
    synced_gpus: Option<u32>,
    notes: Vec<String>,
    /// Regions holding a copy of each named (shared) dataset.
    staged: BTreeMap<String, Vec<fleet_engine::model::RegionId>>,
    /// The load of the idle fleet (bounds), built once.
    idle: Vec<ClusterLoad>,
    /// Per cluster: its synthetic dataset resolved against the catalog.
    sim_data: Vec<Option<PreparedData>>,
    /// The fleet file names `sim://` datasets itself (then every job's dataset
    /// goes through the catalog lookup).
    own_sim_uris: bool,
    pub margin: MigrationMargin,
}

fn sim_dataset_uri(cluster: &str) -> String {
    format!("sim://{cluster}/")
}

/// A job of `gpus` GPUs may start on the pool's spot capacity now.
#[inline]
fn spot_free_for(st: &PoolStatic, pl: &crate::sim::PoolLoad, gpus: u32) -> bool {
    st.has_spot && pl.start_free > 0 && pl.spot_free >= gpus.max(1) && (!st.traced || pl.spot_fraction > 0.0)
}

impl EngineModel {
    /// Build from file contents. `epoch_unix` is the trace's first submission, used to
    /// look up carbon intensity (series repeat yearly).
    pub fn new(setup: &EngineSetup, epoch_unix: f64) -> Result<EngineModel> {
        // The engine's own strict reader: unknown keys anywhere are errors with
        // file:line:col.
        let fleet_name = if setup.fleet_name.is_empty() { "fleet TOML" } else { setup.fleet_name.as_str() };
        let mut cfg: FleetConfig = fleet_engine::model::parse_config(&setup.fleet_toml, fleet_name)?;
        let mut notes = Vec::new();
        // The simulator's synthetic datasets: one per cluster, in its region.
        // The fleet file's own catalog may not use the simulator's scheme: then
        // a job's dataset is resolved by the catalog's longest-prefix lookup.
        let own_sim_uris = cfg.datasets.iter().any(|d| d.uri.starts_with("sim://"));
        if setup.dataset_gb > 0.0 {
            for c in &cfg.clusters {
                cfg.datasets.push(fleet_engine::model::DatasetConfig {
                    uri: sim_dataset_uri(&c.name),
                    locations: vec![qualify_region(&c.provider, &c.region)],
                    size_gb: setup.dataset_gb,
                });
            }
        }
        let mut fleet =
            FleetModel::build(cfg).map_err(|e| fleet_engine::model::locate(e, &setup.fleet_toml, fleet_name))?;
        if let Some(p) = &setup.prices_csv {
            let t = parse_prices(p).map_err(|e| anyhow::anyhow!("price table: {e}"))?;
            // GCP rows are accelerator-only (no host VM): not comparable, left out.
            fleet = fleet.with_prices(&t, false);
        }
        for (provider, text) in &setup.egress_csvs {
            match parse_egress(provider, text) {
                Ok(m) => fleet = fleet.with_egress(&m),
                Err(e) => notes.push(format!("egress matrix {provider}: {e}; skipped")),
            }
        }
        let policies = match &setup.policies_toml {
            Some(t) => {
                let name = if setup.policies_name.is_empty() { "<policies>" } else { &setup.policies_name };
                Policies::from_toml_named(t, name)?
            }
            None => Policies::builtin(),
        };
        let mut state = FleetState::idle(&fleet);
        for (name, text) in &setup.carbon_csvs {
            match parse_carbon(text) {
                Ok(s) => {
                    let zone = s.zone.clone();
                    if !state.set_carbon_series(&fleet, Arc::new(s)) {
                        notes.push(format!("carbon series {zone} ({name}) matches no cluster"));
                    }
                }
                Err(e) => notes.push(format!("carbon series {name}: {e}; skipped")),
            }
        }
        for (i, z) in fleet.carbon_zones.iter().enumerate() {
            if state.carbon.get(i).is_none_or(|s| s.is_none()) {
                notes.push(format!(
                    "no carbon series for zone {z}: {} gCO2/kWh assumed",
                    fleet.overheads.default_carbon_g_per_kwh
                ));
            }
        }
        let clusters: Vec<SimCluster> = fleet
            .clusters
            .iter()
            .map(|c| SimCluster {
                name: c.name.clone(),
                pools: c
                    .pools
                    .iter()
                    .map(|p| SimPool {
                        name: p.name.clone(),
                        gpu_type: fleet.gpu_type_name(p.gpu_type).to_string(),
                        gpus: p.total_gpus,
                        spot_trace: None,
                        sells_spot: !c.onprem && p.prices.spot.is_some(),
                        owned_usd_per_gpu_hour: if c.onprem { p.prices.amortized() } else { None },
                        owned_running_usd_per_gpu_hour: if c.onprem { p.prices.running } else { None },
                    })
                    .collect(),
            })
            .collect();
        let no_spot = |p: &Policy| Policy { allow_spot: false, ..p.clone() };
        let mut baseline_policies = BTreeMap::new();
        let pure_price = Policy {
            name: GREEDY.into(),
            time_value_usd_per_gpu_hour: 0.0,
            time_value_usd_per_job_hour: 0.0,
            carbon_usd_per_kg: 0.0,
            egress_weight: 1.0,
            allow_spot: false,
            spot_queue: false,
            // The baselines relaunch on spot after every reclaim (managed-spot
            // tools have no cap).
            spot_max_reclaims: 0,
            spot_max_lost_h: 0.0,
            use_lca: false,
            owned_at_running_cost: false,
        };
        baseline_policies.insert(HOME_ONLY, Policy { name: HOME_ONLY.into(), ..no_spot(&pure_price) });
        baseline_policies.insert(GREEDY, pure_price.clone());
        baseline_policies
            .insert(GREEDY_SPOT, Policy { name: GREEDY_SPOT.into(), allow_spot: true, ..pure_price.clone() });
        baseline_policies.insert(FIRST_START, Policy { name: FIRST_START.into(), ..pure_price.clone() });
        baseline_policies.insert(
            LOWER_BOUND,
            Policy { name: LOWER_BOUND.into(), egress_weight: 0.0, allow_spot: true, ..pure_price },
        );
        let pool_spot = fleet.clusters.iter().map(|c| vec![None; c.pools.len()]).collect();
        let idle = crate::sim::idle_load(&clusters);
        // Each cluster's synthetic dataset (`sim://<cluster>/`) as the catalog
        // resolves it, looked up once (the catalog lookup scans every entry).
        let sim_data = fleet
            .clusters
            .iter()
            .map(|c| {
                fleet.dataset_for(&sim_dataset_uri(&c.name)).map(|d| PreparedData {
                    uri: String::new(),
                    locations: d.locations.clone(),
                    size_gb: d.size_gb,
                    known: true,
                })
            })
            .collect();
        let mut m = EngineModel {
            fleet,
            policies,
            baseline_policies,
            clusters,
            state,
            prepared: Vec::new(),
            epoch_unix,
            spot_rates: Vec::new(),
            spot_all_or_nothing: Vec::new(),
            pool_spot,
            notes,
            staged: BTreeMap::new(),
            idle,
            sim_data,
            own_sim_uris,
            margin: MigrationMargin::default(),
            pool_static: Vec::new(),
            idle_synced: None,
            synced: Vec::new(),
            synced_gpus: None,
        };
        m.reindex_pools();
        Ok(m)
    }

    pub fn cluster_index(&self, name: &str) -> Option<usize> {
        self.fleet.cluster_id(name).map(|i| i as usize)
    }

    pub fn policy_names(&self) -> Vec<String> {
        self.policies.names().map(str::to_string).collect()
    }

    pub fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    /// Map trace team labels to their home clusters: the fleet's `[[teams]]`
    /// (a team named `*` is the home of every label not declared). A label
    /// without a declared home is an error, unless `auto`: then labels, by
    /// decreasing GPU-hours, go to the cluster with the lowest assigned GPU-hours
    /// per GPU of capacity (ties: lower index), and the map is printed.
    pub fn home_map(&mut self, rows: &[TraceJob], auto: bool) -> Result<BTreeMap<String, usize>> {
        let cap: Vec<f64> =
            self.clusters.iter().map(|c| c.pools.iter().map(|p| p.gpus as f64).sum::<f64>().max(1.0)).collect();
        let mut load = vec![0.0; cap.len()];
        let mut out = BTreeMap::new();
        let labels = crate::cli::labels_by_load(rows);
        let fallback = self.fleet.team_home("*");
        let mut missing = Vec::new();
        for (label, gpu_h) in &labels {
            match self.fleet.team_home(label).or(fallback) {
                Some(c) => {
                    out.insert(label.clone(), c as usize);
                    load[c as usize] += gpu_h;
                }
                None => missing.push(label.clone()),
            }
        }
        if !missing.is_empty() && !auto {
            let n = missing.len();
            missing.truncate(10);
            anyhow::bail!(
                "{n} team(s) of the trace have no declared home in the fleet file: {}{} \
                 (add [[teams]] name = \"<label>\" home = \"<cluster>\", a team \"*\" for all others, or pass --auto-homes)",
                missing.join(", "),
                if n > 10 { ", ..." } else { "" }
            );
        }
        let mut auto_assigned = 0;
        for (label, gpu_h) in &labels {
            if out.contains_key(label) || cap.is_empty() {
                continue;
            }
            let mut best = 0;
            for c in 1..cap.len() {
                if load[c] / cap[c] < load[best] / cap[best] {
                    best = c;
                }
            }
            load[best] += gpu_h;
            out.insert(label.clone(), best);
            auto_assigned += 1;
        }
        let mut desc: Vec<String> = out.iter().map(|(l, c)| format!("{l}→{}", self.clusters[*c].name)).collect();
        desc.sort();
        self.notes.push(format!(
            "home map ({} declared, {auto_assigned} assigned by --auto-homes): {}",
            out.len() - auto_assigned,
            desc.join(", ")
        ));
        Ok(out)
    }

    /// Give every pool that sells spot a spot trace: first a trace whose name holds
    /// the cluster's region (e.g. `us-west-2`), else round-robin over all traces, in
    /// cluster order. Also derives each trace's preemption rate for the engine.
    pub fn assign_spot_traces(&mut self, traces: &[SpotTrace]) {
        // The rate a job *running on spot* sees: reclaimed capacity (drops, as a
        // fraction of the trace's full size) per hour of capacity available (Σ
        // fraction × tick). Per wall-clock hour instead would understate it by the
        // share of time spot is unavailable (e.g. ×1/6 for a trace up 17 % of the time).
        self.spot_rates = traces
            .iter()
            .map(|t| {
                let max = t.max.max(1) as f64;
                let avail_h: f64 = t.data.iter().map(|&d| d as f64 / max).sum::<f64>() * t.gap_s / 3600.0;
                let lost: f64 = t.data.windows(2).map(|w| w[0].saturating_sub(w[1]) as f64 / max).sum();
                if avail_h > 0.0 {
                    lost / avail_h
                } else {
                    0.0
                }
            })
            .collect();
        self.spot_all_or_nothing = traces.iter().map(SpotTrace::is_all_or_nothing).collect();
        if traces.is_empty() {
            self.notes.push("no spot traces: spot capacity is never reclaimed".into());
            self.reindex_pools();
            return;
        }
        let mut rr = 0usize;
        let mut used = Vec::new();
        for (ci, c) in self.fleet.clusters.iter().enumerate() {
            if c.onprem {
                continue;
            }
            let by_region = fleet_engine::series_for_region(&c.region, traces.iter().map(|t| t.name.as_str()));
            for (pi, p) in c.pools.iter().enumerate() {
                if p.prices.spot.is_none() {
                    continue;
                }
                let k = by_region.unwrap_or_else(|| {
                    let k = rr % traces.len();
                    rr += 1;
                    k
                });
                self.pool_spot[ci][pi] = Some(k);
                self.clusters[ci].pools[pi].spot_trace = Some(k);
                used.push(format!("{}/{}→{} ({:.3}/h)", c.name, p.name, traces[k].name, self.spot_rates[k]));
            }
        }
        self.notes.push(format!("spot traces: {}", used.join(", ")));
        self.idle = crate::sim::idle_load(&self.clusters);
        self.reindex_pools();
    }

    fn spec_for(&self, job: &SimJob) -> JobSpec {
        let home = self.clusters.get(job.home).map(|c| c.name.clone()).unwrap_or_default();
        JobSpec {
            id: job.id.to_string(),
            gpus: job.gpus,
            gang: true,
            duration_s: job.duration_s,
            interruptible: job.interruptible,
            ckpt_interval_s: (job.checkpoint_s > 0.0).then_some(job.checkpoint_s),
            // Each job reads a dataset of its own, stored at its home (the
            // catalog entry `sim://<home>/` gives its size and location).
            datasets: if self.sim_data.get(job.home).is_some_and(|d| d.is_some()) {
                vec![format!("{}job-{}", sim_dataset_uri(&home), job.id)]
            } else {
                Vec::new()
            },
            gpu_types: job.extra.gpu_models.clone(),
            min_gpu: job.extra.min_gpu.clone(),
            // `duration_s` is already work at the reference GPU.
            duration_gpu: Some(self.fleet.config.reference_gpu.clone().unwrap_or_else(|| "A100".into())),
            home,
            ..JobSpec::default()
        }
    }

    fn prepared(&mut self, job: &SimJob) -> &PreparedJob {
        if self.prepared.len() <= job.id {
            self.prepared.resize(job.id + 1, None);
        }
        if self.prepared[job.id].is_none() {
            let spec = self.spec_for(job);
            let synthetic = self.sim_data.get(job.home).cloned().flatten().filter(|_| !self.own_sim_uris);
            let mut pj = match (synthetic, spec.datasets.first()) {
                // The job's own dataset under `sim://<home>/`: what the catalog
                // lookup would give, without the lookup.
                (Some(mut d), Some(uri)) if spec.datasets.len() == 1 => {
                    d.uri = uri.clone();
                    let bare = JobSpec { datasets: Vec::new(), ..spec.clone() };
                    let mut pj = prepare(&self.fleet, &bare);
                    pj.spec = spec;
                    pj.datasets = vec![d];
                    pj
                }
                _ => prepare(&self.fleet, &spec),
            };
            // Named datasets of the trace live at the team's home.
            if !job.extra.datasets.is_empty() {
                let home = self.fleet.clusters.get(job.home).map(|c| c.region_id);
                pj.datasets = job
                    .extra
                    .datasets
                    .iter()
                    .map(|(n, gb)| PreparedData {
                        uri: n.clone(),
                        locations: home.into_iter().collect(),
                        size_gb: *gb,
                        known: true,
                    })
                    .collect();
            }
            self.prepared[job.id] = Some(pj);
        }
        // Copies of shared datasets staged by other jobs are reused.
        if !job.extra.datasets.is_empty() {
            if let Some(Some(pj)) = self.prepared.get_mut(job.id) {
                for d in &mut pj.datasets {
                    for r in self.staged.get(&d.uri).into_iter().flatten() {
                        if !d.locations.contains(r) {
                            d.locations.push(*r);
                        }
                    }
                }
            }
        }
        // Filled just above.
        self.prepared[job.id].as_ref().unwrap_or_else(|| unreachable!())
    }

    /// Copy the simulator's load into the engine state. `gpus`: the job being placed
    /// (spot is offered only when that many spot GPUs are free right now).
    ///
    /// The pools' fixed facts (sells spot, spot trace, its preemption rate) come from
    /// `pool_static`, a flat copy, so the pass reads only the load and the state.
    ///
    /// Incremental: a cluster whose load carries the version copied last time, for
    /// a job of the same size, is left as it is ([`ClusterLoad::version`]).
    fn sync_state(&mut self, now: f64, load: &[ClusterLoad], gpus: u32) {
        self.idle_synced = None;
        self.state.now_unix = self.epoch_unix + now;
        let same_size = self.synced_gpus == Some(gpus);
        self.synced_gpus = Some(gpus);
        self.synced.resize(load.len(), 0);
        for (((cs, l), st), seen) in
            self.state.clusters.iter_mut().zip(load).zip(&self.pool_static).zip(&mut self.synced)
        {
            if l.version != 0 && *seen == l.version {
                if !same_size {
                    // Only whether spot is free for the job depends on its size.
                    for ((ps, pl), st) in cs.pools.iter_mut().zip(&l.pools).zip(st) {
                        ps.spot_available = spot_free_for(st, pl, gpus);
                    }
                }
                continue;
            }
            *seen = l.version;
            cs.healthy = l.up;
            let mut pending = 0u32;
            for ((ps, pl), ps_static) in cs.pools.iter_mut().zip(&l.pools).zip(st) {
                let PoolStatic { has_spot, rate, all_or_nothing, .. } = *ps_static;
                pending += pl.queued_jobs as u32;
                // A pool with a queue starts a newcomer at once only in the GPUs its
                // head has not reserved (FIFO with a reservation for the head).
                let free = pl.start_free;
                ps.free_gpus = free;
                ps.expected_wait_s = Some(pl.est_wait_s);
                ps.spot_available = spot_free_for(ps_static, pl, gpus);
                ps.spot_wait_s =
                    (has_spot && !ps.spot_available && pl.spot_wait_s.is_finite()).then_some(pl.spot_wait_s);
                ps.spot_recovery_s = (has_spot && pl.spot_recovery_s > 0.0).then_some(pl.spot_recovery_s);
                ps.spot_preemptions_per_hour = rate;
                // Windows ended so far, and the age of the one open now.
                ps.spot_windows = if has_spot && all_or_nothing { pl.spot_windows.clone() } else { None };
                ps.spot_window_since_unix =
                    pl.spot_full_since.is_finite().then_some(self.epoch_unix + pl.spot_full_since);
            }
            cs.queue_pending = pending;
        }
    }

    /// The state of the idle fleet for a job of `gpus` GPUs at `now` (bounds): synced
    /// once and kept while only bound queries of the same size follow.
    fn sync_idle(&mut self, now: f64, gpus: u32) {
        if self.idle_synced != Some(gpus) {
            let idle = std::mem::take(&mut self.idle);
            self.sync_state(now, &idle, gpus);
            self.idle = idle;
            self.idle_synced = Some(gpus);
        }
        self.state.now_unix = self.epoch_unix + now;
    }

    /// Rebuilds `pool_static` from the fleet and the spot-trace assignment.
    fn reindex_pools(&mut self) {
        self.pool_static = self
            .fleet
            .clusters
            .iter()
            .zip(&self.pool_spot)
            .map(|(c, spot)| {
                c.pools
                    .iter()
                    .zip(spot)
                    .map(|(p, t)| PoolStatic {
                        has_spot: p.prices.spot.is_some(),
                        traced: t.is_some(),
                        rate: t.and_then(|k| self.spot_rates.get(k).copied()),
                        all_or_nothing: t.and_then(|k| self.spot_all_or_nothing.get(k).copied()).unwrap_or(false),
                    })
                    .collect()
            })
            .collect();
        self.idle_synced = None;
        self.synced_gpus = None;
    }

    /// The simulator's offer for an engine placement. The engine's overhead hours
    /// split into setup (provisioning on cloud, checkpoint restore: GPUs held and
    /// billed) and delay before queueing (remote submission), plus the transfer
    /// hours (staging, checkpoint move), also before queueing.
    fn offer(&self, p: &Placement, resuming: bool) -> Offer {
        let c = &self.fleet.clusters[p.cluster as usize];
        let ov = &self.fleet.overheads;
        let provision = if c.onprem { 0.0 } else { c.provision_s };
        let restore = if resuming { ov.restore_s } else { 0.0 };
        let overhead_s = p.breakdown.overhead_h * 3600.0;
        // Owned GPUs are billed at their amortized price, whatever price the
        // policy scored them at (`owned_at_running_cost`): the report's USD is
        // the same money for every policy, and the running cost is reported
        // beside it (`owned_running_usd`).
        let usd_per_gpu_hour = match (p.pricing, c.pools.get(p.pool as usize)) {
            (Pricing::Onprem, Some(pool)) => pool.prices.amortized().unwrap_or(p.breakdown.price_per_gpu_hour),
            _ => p.breakdown.price_per_gpu_hour,
        };
        Offer {
            cluster: p.cluster as usize,
            pool: p.pool as usize,
            spot: p.pricing == Pricing::Spot,
            usd_per_gpu_hour,
            egress_usd: p.breakdown.egress_usd,
            score: p.breakdown.total,
            speed: c.pools.get(p.pool as usize).map(|x| x.speed).unwrap_or(1.0),
            setup_s: provision + restore,
            delay_s: (overhead_s - provision - restore).max(0.0) + p.breakdown.transfer_h * 3600.0,
            estimate: Some(crate::sim::Estimate { wait_h: p.breakdown.wait_h, delay_h: p.breakdown.delay_h() }),
        }
    }

    /// The policy of that name (an engine policy, built-in or as the policies
    /// file sets it, or a baseline's).
    pub fn policy(&self, name: &str) -> Option<Policy> {
        let name = if name == RANDOM { "cost" } else { name };
        self.baseline_policies.get(name).cloned().or_else(|| self.policies.get(name).cloned())
    }
}

impl Model for EngineModel {
    fn clusters(&self) -> &[SimCluster] {
        &self.clusters
    }

    /// Engine policies: the engine's one decision (`decide`). Baseline names: every
    /// feasible cluster's best pool under the baseline's pure-price policy, ranked by
    /// score (ties: home first, then cluster order).
    fn offers(&mut self, policy: &str, job: &SimJob, now: f64, load: &[ClusterLoad]) -> Vec<Offer> {
        let Some(pol) = self.policy(policy) else {
            return Vec::new();
        };
        self.sync_state(now, load, job.gpus);
        self.prepared(job);
        let Some(pj) = self.prepared.get(job.id).and_then(|p| p.as_ref()) else {
            return Vec::new();
        };
        let resuming = pj.done_fraction > 0.0;
        if !self.baseline_policies.contains_key(policy) && policy != RANDOM {
            return decide(&self.fleet, &self.state, pj, &pol)
                .map(|p| vec![self.offer(&p, resuming)])
                .unwrap_or_default();
        }
        // The baselines' policies do not price carbon: no carbon terms needed.
        // Home-only takes nothing but the home cluster's offer.
        let ids = match (policy, pj.home) {
            (HOME_ONLY, Some(h)) => h..h + 1,
            (HOME_ONLY, None) => 0..0,
            _ => 0..self.fleet.clusters.len() as fleet_engine::ClusterId,
        };
        let mut ok: Vec<Placement> =
            ids.filter_map(|cid| evaluate_cluster(&self.fleet, &self.state, pj, &pol, cid, false).ok()).collect();
        let home = pj.home;
        // A strict total order (one offer per cluster): unstable sorting gives
        // the same order.
        ok.sort_unstable_by(|a, b| {
            a.breakdown
                .total
                .total_cmp(&b.breakdown.total)
                .then((Some(b.cluster) == home).cmp(&(Some(a.cluster) == home)))
                .then(a.cluster.cmp(&b.cluster))
        });
        ok.iter().map(|p| self.offer(p, resuming)).collect()
    }

    /// The baselines' offers without ranking them: clusters in increasing order of
    /// their cheapest unit of work (`cheapest_per_work`, a floor of every offer's
    /// price ÷ speed there), each cluster's best pool as [`Model::offers`] gives it.
    /// Live spot prices could undercut the floors (never set here): then every
    /// floor is given as 0.
    fn scan(
        &mut self,
        policy: &str,
        job: &SimJob,
        now: f64,
        load: &[ClusterLoad],
        visit: &mut dyn FnMut(f64, Offer) -> bool,
    ) {
        if policy == HOME_ONLY || !(self.baseline_policies.contains_key(policy) || policy == RANDOM) {
            for o in self.offers(policy, job, now, load) {
                if !visit(0.0, o) {
                    break;
                }
            }
            return;
        }
        let Some(pol) = self.policy(policy) else {
            return;
        };
        self.sync_state(now, load, job.gpus);
        self.prepared(job);
        let Some(pj) = self.prepared.get(job.id).and_then(|p| p.as_ref()) else {
            return;
        };
        let resuming = pj.done_fraction > 0.0;
        let floors_hold = !self.state.clusters.iter().any(|c| c.pools.iter().any(|p| p.spot_price.is_some()));
        for &(floor, cid) in self.fleet.cheapest_for(&pol) {
            let Ok(p) = evaluate_cluster(&self.fleet, &self.state, pj, &pol, cid, false) else {
                continue;
            };
            if !visit(if floors_hold { floor } else { 0.0 }, self.offer(&p, resuming)) {
                break;
            }
        }
    }

    /// The cheap bound's offer without ranking every cluster: clusters in
    /// increasing order of their cheapest unit of work (`cheapest_per_work`), which
    /// no offer of theirs can undercut, so the scan stops at the first cluster whose
    /// floor is above the best found. Every offer at the lowest USD per unit of work
    /// is kept and the first of them in the offers' order (score, home first,
    /// cluster) wins: the same offer as the default scan of every cluster.
    fn cheapest(&mut self, job: &SimJob) -> Option<Offer> {
        let pol = self.policy(LOWER_BOUND)?;
        self.sync_idle(job.submit_s, job.gpus);
        self.prepared(job);
        let pj = self.prepared.get(job.id)?.as_ref()?;
        // Live spot prices could undercut the model's floors (never set here).
        let can_stop = !self.state.clusters.iter().any(|c| c.pools.iter().any(|p| p.spot_price.is_some()));
        let mut best_pw = f64::INFINITY;
        let mut ties: Vec<Placement> = Vec::new();
        for &(floor, cid) in &self.fleet.cheapest_per_work {
            if can_stop && floor > best_pw {
                break;
            }
            let Ok(p) = evaluate_cluster(&self.fleet, &self.state, pj, &pol, cid, false) else {
                continue;
            };
            let speed = self.fleet.clusters[cid as usize].pools.get(p.pool as usize).map(|x| x.speed).unwrap_or(1.0);
            let pw = p.breakdown.price_per_gpu_hour / speed.max(1e-9);
            if pw < best_pw {
                best_pw = pw;
                ties.clear();
            }
            if pw == best_pw {
                ties.push(p);
            }
        }
        let home = pj.home;
        let first = ties.iter().min_by(|a, b| {
            a.breakdown
                .total
                .total_cmp(&b.breakdown.total)
                .then((Some(b.cluster) == home).cmp(&(Some(a.cluster) == home)))
                .then(a.cluster.cmp(&b.cluster))
        })?;
        Some(self.offer(first, pj.done_fraction > 0.0))
    }

    /// Every feasible pool and pricing on an idle fleet (`fleet_engine::all_options`
    /// under the lower-bound policy: spot for interruptible jobs).
    fn options(&mut self, job: &SimJob) -> Vec<Offer> {
        let Some(pol) = self.policy(LOWER_BOUND) else {
            return Vec::new();
        };
        let empty = crate::sim::idle_load(&self.clusters);
        self.sync_state(job.submit_s, &empty, job.gpus);
        self.resume(job, 0.0, None);
        let Some(Some(pj)) = self.prepared.get(job.id) else {
            return Vec::new();
        };
        let opts = fleet_engine::all_options(&self.fleet, &self.state, pj, &pol);
        opts.iter().map(|p| self.offer(p, false)).collect()
    }

    /// The job's datasets are staged at the offer's region from now on: later
    /// placements there (or in that region) pay no egress or staging for them.
    fn landed(&mut self, job: &SimJob, offer: &Offer) {
        let Some(region) = self.fleet.clusters.get(offer.cluster).map(|c| c.region_id) else {
            return;
        };
        self.prepared(job);
        if let Some(Some(pj)) = self.prepared.get_mut(job.id) {
            for d in &mut pj.datasets {
                if d.known && !d.locations.contains(&region) {
                    d.locations.push(region);
                }
                if !job.extra.datasets.is_empty() {
                    let v = self.staged.entry(d.uri.clone()).or_default();
                    if !v.contains(&region) {
                        v.push(region);
                    }
                }
            }
        }
    }

    fn resume(&mut self, job: &SimJob, done_fraction: f64, ckpt_at: Option<usize>) {
        let region = ckpt_at.and_then(|c| self.fleet.clusters.get(c)).map(|c| c.region_id);
        self.prepared(job);
        if let Some(Some(pj)) = self.prepared.get_mut(job.id) {
            pj.done_fraction = done_fraction.clamp(0.0, 1.0);
            pj.resume_from = region;
        }
    }

    fn spot_history(&mut self, job: &SimJob, reclaims: u32, lost_h: f64) {
        self.prepared(job);
        if let Some(Some(pj)) = self.prepared.get_mut(job.id) {
            pj.spot_reclaims = reclaims;
            pj.spot_lost_h = lost_h;
        }
    }

    /// kgCO2 as the engine scores it: zone intensity over the run window × GPU
    /// board power × GPUs × hours × PUE.
    fn kg_co2(&self, cluster: usize, pool: usize, gpus: u32, t0: f64, t1: f64) -> f64 {
        let Some(c) = self.fleet.clusters.get(cluster) else {
            return 0.0;
        };
        let Some(p) = c.pools.get(pool) else {
            return 0.0;
        };
        let (a, b) = (self.epoch_unix + t0, self.epoch_unix + t1);
        let ci = c
            .carbon_zone_id
            .and_then(|z| self.state.carbon.get(z as usize).cloned().flatten())
            .map(|s| s.mean_between(a, b, false))
            .unwrap_or(self.fleet.overheads.default_carbon_g_per_kwh);
        ci * p.gpu_power_w * gpus as f64 * (t1 - t0) / 3600.0 * c.pue / 1e6
    }

    fn rebalance(
        &mut self,
        policy: &str,
        now: f64,
        jobs: &[SimJob],
        running: &[RunningJob],
        load: &[ClusterLoad],
    ) -> Vec<Move> {
        let Some(pol) = self.policies.get(policy).cloned() else {
            return Vec::new();
        };
        self.sync_state(now, load, 1);
        // Moving pays a restore and redone work; only jobs with hours left can win.
        let mut rj = Vec::new();
        for r in running.iter().filter(|r| r.remaining_s >= 2.0 * 3600.0) {
            let Some(job) = jobs.get(r.job) else { continue };
            let pj = self.prepared(job).clone();
            rj.push(fleet_engine::RunningJob {
                job: pj,
                cluster: r.cluster as u32,
                pool: r.pool as u16,
                pricing: if r.spot {
                    Pricing::Spot
                } else if self.fleet.clusters[r.cluster].onprem {
                    Pricing::Onprem
                } else {
                    Pricing::OnDemand
                },
                remaining_s: r.remaining_s,
                since_ckpt_s: r.since_checkpoint_s,
            });
        }
        let idx: Vec<usize> = running.iter().filter(|r| r.remaining_s >= 2.0 * 3600.0).map(|r| r.job).collect();
        fleet_engine::propose_migrations_with(&self.fleet, &self.state, &rj, &pol, &self.margin, true)
            .into_iter()
            .filter_map(|m| {
                let from = rj.get(m.index)?;
                let mut to = self.offer(&m.to, true);
                // The checkpoint moves with the job: its egress and transfer time.
                let (src, dst) =
                    (self.fleet.clusters[from.cluster as usize].region_id, self.fleet.clusters[to.cluster].region_id);
                if src != dst {
                    let gb = from.job.ckpt_size_gb;
                    to.egress_usd += gb * self.fleet.egress_usd_per_gb(src, dst);
                    to.delay_s += gb * 8.0 / self.fleet.bandwidth_gbps(src, dst).max(1e-3);
                }
                Some(Move { job: *idx.get(m.index)?, to })
            })
            .collect()
    }
}
