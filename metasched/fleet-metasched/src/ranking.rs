//! Optional cost-engine ranking (`[placement] policy = "<engine policy>"`).
//!
//! The shared first rule (`fleet_api::placement::place`) still decides what
//! is possible at all; the engine only ranks the clusters that rule allows.

use std::sync::Arc;

use fleet_api::api::FleetView;
use fleet_api::JobRequest;
use fleet_engine::{Decision, FleetModel, FleetState, JobSpec, MigrationMargin, Policies, Policy, Pricing};
use serde::{Deserialize, Serialize};

use crate::config::{Config, ConfigError};
use crate::feeds::Feeds;

/// One immutable snapshot of what the engine decides with: the model
/// (configured, repriced, egress applied), the carbon series, the policy.
/// Price imports and feed reloads build a new one and swap the `Arc`.
pub struct Ranker {
    /// The model as configured, before any price feed.
    base: FleetModel,
    /// `base` repriced by the price table, before the egress feed.
    priced: FleetModel,
    /// `priced` with the egress matrices applied: what the engine sees.
    model: FleetModel,
    feeds: Arc<Feeds>,
    /// Per cluster of `model`: the spot series of `feeds` it follows (a cloud
    /// cluster with a spot-priced pool whose region a series' name holds).
    spot_of: Vec<Option<usize>>,
    policy: Policy,
}

impl Ranker {
    /// USD per GPU-hour of `gpu_type` at `cluster` in the engine's model
    /// (after the price feed): the owned-hardware price at an on-prem
    /// cluster, the on-demand price elsewhere (spot is only for jobs that
    /// accept interruption; `--fleet-max-price` bounds what a job pays
    /// when it is not interrupted). The cheapest pool of that type wins.
    /// `None` when the model does not know the cluster or the type.
    pub fn price_per_gpu_hour(&self, cluster: &str, gpu_type: &str) -> Option<f64> {
        let c = self.model.cluster(self.model.cluster_id(cluster)?)?;
        let want = fleet_engine::model::normalize_gpu_type(gpu_type);
        c.pools
            .iter()
            .filter(|p| self.model.gpu_type_name(p.gpu_type) == want)
            .filter_map(|p| if c.onprem { p.prices.amortized() } else { p.prices.on_demand })
            .fold(None, |m: Option<f64>, p| Some(m.map_or(p, |m| m.min(p))))
    }
}

/// A running job as the rebalancing pass sees it.
pub struct RunningInput<'a> {
    pub id: &'a str,
    pub request: &'a JobRequest,
    /// The cluster it runs on.
    pub cluster: &'a str,
    /// Seconds since it started running.
    pub elapsed_s: f64,
}

/// One proposed migration (`GET /v1/rebalance`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RebalanceProposal {
    /// `<fleet job id>-e<epoch>`: what `fleetctl rebalance approve` names;
    /// stable across passes while the job stays where it is.
    #[serde(default)]
    pub id: String,
    pub fleet_job_id: String,
    pub from: String,
    pub to: String,
    /// Pool and GPU type at the destination.
    pub pool: String,
    pub pricing: String,
    /// Engine score of staying for the remaining run (USD).
    pub stay_usd: f64,
    /// Engine score of running the remainder at `to` (USD).
    pub move_usd: f64,
    /// Restore, checkpoint transfer and redone work, valued (USD).
    pub migration_usd: f64,
    /// stay − move − migration.
    pub saving_usd: f64,
    /// Expected seconds still to run.
    pub remaining_s: f64,
}

/// Where `fleetctl prices import` keeps the last imported table; it wins
/// over the configured `prices` feed at start-up.
pub fn imported_prices_path(state_dir: &std::path::Path) -> std::path::PathBuf {
    state_dir.join("prices.csv")
}

/// What the job's own history tells the engine (`PreparedJob::spot_reclaims`,
/// `spot_lost_h`): the policy's spot caps apply to it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JobHistory {
    /// Runs of the job that were taken away from it (died or requeued at
    /// their target): the live store cannot tell a spot reclaim from
    /// another loss, so every one counts.
    pub spot_reclaims: u32,
    /// Hours of run time those losses cost (0: not recorded by the store).
    pub spot_lost_h: f64,
}

/// The engine's pick among allowed clusters.
pub struct Pick {
    pub cluster: String,
    pub reason: String,
}

/// What the engine makes of the clusters the first rule allows.
pub enum Choice {
    /// The best-ranked allowed cluster.
    Pick(Pick),
    /// The engine ranks none of them but does not know them all either
    /// (clusters outside the fleet model): the first rule's pick stands.
    FirstRule,
    /// The engine knows every allowed cluster and excludes each one
    /// (topology, `--min-gpu` speed, power): the reasons, and whether they
    /// all last (true) or one may end by itself (health, prices).
    Excluded { reason: String, lasting: bool },
}

impl Ranker {
    /// `None` when the configuration asks for the first rule only.
    pub fn load(config: &Config, feeds: Arc<Feeds>) -> Result<Option<Ranker>, ConfigError> {
        let Some(pc) = &config.placement else { return Ok(None) };
        let Some(name) = pc.engine_policy() else { return Ok(None) };
        let Some(model_path) = &pc.fleet_model else {
            return Err(ConfigError::Invalid("[placement] fleet_model is required for an engine policy".into()));
        };
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.to_path_buf(), source })
        };
        let base = FleetModel::from_toml_str(&read(model_path)?)
            .map_err(|e| ConfigError::Invalid(format!("fleet model {}: {e}", model_path.display())))?;
        let imported = imported_prices_path(&config.state_dir);
        let feed = if imported.exists() { Some(imported) } else { config.prices.clone() };
        let priced = match &feed {
            Some(prices) => {
                let table = fleet_engine::parse_prices(&read(prices)?)
                    .map_err(|e| ConfigError::Invalid(format!("price feed {}: {e}", prices.display())))?;
                base.with_prices(&table, false)
            }
            None => base.clone(),
        };
        let policies = match &config.policies {
            None => Policies::builtin(),
            Some(t) => {
                // `Config::parse` has already read these tables from the
                // user's file (its errors carry that file:line:col); this
                // reads the kept table again, for a `Config` built in code.
                let mut doc = toml::Table::new();
                doc.insert("policies".into(), toml::Value::Table(t.clone()));
                let text = toml::to_string(&doc).map_err(|e| ConfigError::Invalid(format!("[policies]: {e}")))?;
                Policies::from_toml_str(&text).map_err(|e| ConfigError::Invalid(e.to_string()))?
            }
        };
        let Some(policy) = policies.get(name).cloned() else {
            let known = policies.names().collect::<Vec<_>>().join(", ");
            return Err(ConfigError::Invalid(format!("[placement] policy {name:?} is unknown (first-fit, {known})")));
        };
        let model = with_egress(&priced, &feeds);
        let spot_of = spot_follow(&model, &feeds);
        Ok(Some(Ranker { base, priced, model, feeds, spot_of, policy }))
    }

    /// This ranker with the configured model repriced by `table`.
    pub fn with_prices(&self, table: &fleet_engine::PriceTable) -> Ranker {
        let priced = self.base.with_prices(table, false);
        Ranker {
            base: self.base.clone(),
            model: with_egress(&priced, &self.feeds),
            priced,
            feeds: self.feeds.clone(),
            spot_of: self.spot_of.clone(),
            policy: self.policy.clone(),
        }
    }

    /// This ranker with a new feed snapshot (carbon series, egress).
    pub fn with_feeds(&self, feeds: Arc<Feeds>) -> Ranker {
        let model = with_egress(&self.priced, &feeds);
        Ranker {
            base: self.base.clone(),
            priced: self.priced.clone(),
            spot_of: spot_follow(&model, &feeds),
            model,
            feeds,
            policy: self.policy.clone(),
        }
    }

    /// The engine's state for `view`, with the carbon series attached and
    /// the spot pools of cloud clusters set from the spot series their region
    /// follows (at the view's time; a stale or not yet started series leaves
    /// the pool as configured).
    fn state(&self, view: &FleetView) -> FleetState {
        let mut state = FleetState::from_view(&self.model, view);
        for s in &self.feeds.carbon {
            // A series for a zone no cluster uses is simply not attached.
            state.set_carbon_series(&self.model, s.clone());
        }
        for ((c, cs), k) in self.model.clusters.iter().zip(state.clusters.iter_mut()).zip(&self.spot_of) {
            let Some(now) = k.and_then(|k| self.feeds.spot[k].1.at(state.now_unix)) else {
                continue;
            };
            for (p, ps) in c.pools.iter().zip(cs.pools.iter_mut()) {
                if p.prices.spot.is_some() {
                    now.apply(ps);
                }
            }
        }
        state
    }

    /// Each spot series of the feeds, the cloud clusters it sets, and
    /// whether it covers `now` (started and not stale); then the cloud
    /// clusters selling spot that no series follows.
    pub fn spot_status(&self, now: f64) -> (Vec<SpotFeedStatus>, Vec<String>) {
        let mut out: Vec<SpotFeedStatus> = self
            .feeds
            .spot
            .iter()
            .map(|(n, s)| SpotFeedStatus { series: n.clone(), clusters: Vec::new(), current: s.covers(now) })
            .collect();
        let mut unfollowed = Vec::new();
        for (c, k) in self.model.clusters.iter().zip(&self.spot_of) {
            match k {
                Some(k) => out[*k].clusters.push(c.name.clone()),
                None if !c.onprem && c.pools.iter().any(|p| p.prices.spot.is_some()) => unfollowed.push(c.name.clone()),
                None => {}
            }
        }
        (out, unfollowed)
    }

    pub fn policy_name(&self) -> &str {
        &self.policy.name
    }

    /// The engine's ranked explanation of `req` on `view`, with the
    /// provisioning-SLA penalty of SLA-degraded clusters added to their
    /// scores (and the ranking sorted again): the penalties by cluster.
    pub fn explain(
        &self,
        view: &FleetView,
        req: &JobRequest,
        id: &str,
        history: &JobHistory,
    ) -> (Decision, Vec<String>, Vec<(String, f64)>) {
        let (mut spec, errs) = JobSpec::from_request_script(req);
        spec.id = id.to_string();
        let state = self.state(view);
        let mut job = fleet_engine::prepare(&self.model, &spec);
        job.spot_reclaims = history.spot_reclaims;
        job.spot_lost_h = history.spot_lost_h;
        let mut d = fleet_engine::explain_prepared(&self.model, &state, &job, &self.policy);
        let mut errs: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        let mut penalties = Vec::new();
        for c in &mut d.ranked {
            let Some(sla) = view.clusters.iter().find(|v| v.name == c.cluster).and_then(|v| v.sla.as_ref()) else {
                continue;
            };
            let p = sla_penalty_usd(sla, c.breakdown.total, self.policy.time_value(spec.gpus), spec.gpus);
            if p > 0.0 {
                c.breakdown.total += p;
                errs.push(format!("{} is SLA-degraded ({}): score +{p:.2} USD", c.cluster, sla.why));
                penalties.push((c.cluster.clone(), p));
            }
        }
        // Stable: equal scores keep the engine's order (home first).
        d.ranked.sort_by(|a, b| a.breakdown.total.total_cmp(&b.breakdown.total));
        (d, errs, penalties)
    }

    /// The best-ranked cluster among `allowed`, or why there is none.
    pub fn pick(
        &self,
        view: &FleetView,
        req: &JobRequest,
        id: &str,
        history: &JobHistory,
        allowed: &[String],
    ) -> Choice {
        let (d, _, _) = self.explain(view, req, id, history);
        let n = d.ranked.len();
        let best = d.ranked.iter().enumerate().find(|(_, c)| allowed.contains(&c.cluster));
        let Some((i, c)) = best else {
            let out: Vec<_> = allowed.iter().filter_map(|a| d.excluded.iter().find(|e| &e.cluster == a)).collect();
            if allowed.is_empty() || out.len() < allowed.len() {
                return Choice::FirstRule;
            }
            return Choice::Excluded {
                reason: out.iter().map(|e| format!("{}: {}", e.cluster, e.reason)).collect::<Vec<_>>().join("; "),
                lasting: out.iter().all(|e| e.lasting),
            };
        };
        Choice::Pick(Pick {
            cluster: c.cluster.clone(),
            reason: format!(
                "policy {}: {} ranked {} of {n} ({} {} {}, {:.2} USD/GPU-h, score {:.2}{})",
                self.policy.name,
                c.cluster,
                i + 1,
                c.pool,
                c.gpu_type,
                c.pricing.as_str(),
                c.breakdown.price_per_gpu_hour,
                c.breakdown.total,
                if c.fits_now { "" } else { ", waits" }
            ),
        })
    }
}

/// The score an SLA-degraded cluster pays on top of `total`:
/// `penalty_frac × total + time value × GPUs × max(p90, deadline)` (hours),
/// its expected provisioning delay valued as the engine values waiting.
/// 0 for a cluster that is not degraded.
pub fn sla_penalty_usd(sla: &fleet_api::api::ClusterSla, total: f64, time_value: f64, gpus: u32) -> f64 {
    if !sla.degraded() {
        return 0.0;
    }
    let delay_h = sla.p90_s.unwrap_or(0.0).max(sla.deadline_s) / 3600.0;
    let p = sla.penalty_frac * total.max(0.0) + time_value.max(0.0) * f64::from(gpus) * delay_h;
    if p.is_finite() {
        p
    } else {
        0.0
    }
}

/// A spot series of the live feeds, as [`Ranker::spot_status`] reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct SpotFeedStatus {
    /// The file's stem.
    pub series: String,
    /// The cloud clusters whose spot pools it sets.
    pub clusters: Vec<String>,
    /// It covers the time asked about (else those pools are scored as configured).
    pub current: bool,
}

/// Per cluster of `model`: the spot series of `feeds` it follows, for the cloud
/// clusters selling spot ([`fleet_engine::series_for_region`]).
fn spot_follow(model: &FleetModel, feeds: &Feeds) -> Vec<Option<usize>> {
    model
        .clusters
        .iter()
        .map(|c| {
            let sells = !c.onprem && c.pools.iter().any(|p| p.prices.spot.is_some());
            sells
                .then(|| fleet_engine::series_for_region(&c.region, feeds.spot.iter().map(|(n, _)| n.as_str())))
                .flatten()
        })
        .collect()
}

/// `priced` with every egress matrix of `feeds` applied, in order.
fn with_egress(priced: &FleetModel, feeds: &Feeds) -> FleetModel {
    feeds.egress.iter().fold(priced.clone(), |m, e| m.with_egress(e))
}

impl Ranker {
    /// The engine's migration proposals for `running` on `view`
    /// (`fleet_engine::propose_migrations`), restricted to destinations in
    /// `allowed(job index, cluster)` (the hard rule of
    /// `fleet_api::placement`). Jobs on clusters the model does not know,
    /// or without a GPU pool of theirs there, are skipped.
    pub fn propose(
        &self,
        view: &FleetView,
        running: &[RunningInput<'_>],
        margin: &MigrationMargin,
        allowed: impl Fn(usize, &str) -> bool,
    ) -> Vec<RebalanceProposal> {
        let state = self.state(view);
        let mut inputs = Vec::new();
        let mut back = Vec::new();
        for (i, r) in running.iter().enumerate() {
            let Some(cid) = self.model.cluster_id(r.cluster) else { continue };
            let Some(cluster) = self.model.cluster(cid) else { continue };
            let (mut spec, _) = JobSpec::from_request_script(r.request);
            spec.id = r.id.to_string();
            let job = fleet_engine::prepare(&self.model, &spec);
            let Some(pool) = cluster.pools.iter().position(|p| job.type_mask & (1u64 << (p.gpu_type % 64)) != 0) else {
                continue;
            };
            let elapsed = r.elapsed_s.max(0.0);
            // At least a minute left: a job past its estimate still runs.
            let remaining_s = (spec.duration_s - elapsed).max(60.0);
            let since_ckpt_s = match spec.ckpt_interval_s {
                Some(iv) if iv > 0.0 => elapsed % iv,
                _ => elapsed,
            };
            let pricing = if cluster.onprem { Pricing::Onprem } else { Pricing::OnDemand };
            inputs.push(fleet_engine::RunningJob {
                job,
                cluster: cid,
                pool: pool as fleet_engine::PoolId,
                pricing,
                remaining_s,
                since_ckpt_s,
            });
            back.push(i);
        }
        fleet_engine::propose_migrations(&self.model, &state, &inputs, &self.policy, margin)
            .into_iter()
            .filter_map(|p| {
                let i = *back.get(p.index)?;
                let r = running.get(i)?;
                let to = self.model.cluster(p.to.cluster)?;
                if !allowed(i, &to.name) {
                    return None;
                }
                let pool = to.pools.get(p.to.pool as usize)?;
                Some(RebalanceProposal {
                    id: String::new(),
                    fleet_job_id: p.job_id,
                    from: r.cluster.to_string(),
                    to: to.name.clone(),
                    pool: format!("{} ({})", pool.name, self.model.gpu_type_name(pool.gpu_type)),
                    pricing: p.to.pricing.as_str().to_string(),
                    stay_usd: p.stay_usd,
                    move_usd: p.move_usd,
                    migration_usd: p.migration_usd,
                    saving_usd: p.saving_usd,
                    remaining_s: inputs.get(p.index).map_or(0.0, |j| j.remaining_s),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::sla_penalty_usd;
    use fleet_api::api::ClusterSla;

    #[test]
    fn the_sla_penalty() {
        let sla = |state: &str, p90: Option<f64>| ClusterSla {
            state: state.into(),
            deadline_s: 360.0,
            p90_s: p90,
            penalty_frac: 1.0,
            ..Default::default()
        };
        // (state, p90, total, time value, GPUs) → penalty
        let table = [
            ("ok", Some(7200.0), 10.0, 2.0, 4, 0.0),
            ("off", Some(7200.0), 10.0, 2.0, 4, 0.0),
            // 10 + 2 × 4 × 2 h
            ("degraded", Some(7200.0), 10.0, 2.0, 4, 26.0),
            // p90 below the deadline: the deadline (0.1 h) counts
            ("degraded", Some(60.0), 10.0, 2.0, 4, 10.8),
            ("degraded", None, 10.0, 0.0, 4, 10.0),
            ("degraded", Some(f64::INFINITY), 10.0, 2.0, 4, 0.0),
        ];
        for (state, p90, total, tv, g, want) in table {
            let got = sla_penalty_usd(&sla(state, p90), total, tv, g);
            assert!((got - want).abs() < 1e-9, "{state} {p90:?}: {got} != {want}");
        }
    }
}
