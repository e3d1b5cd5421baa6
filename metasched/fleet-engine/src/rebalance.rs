//! The periodic rebalancing pass: propose moving running interruptible jobs
//! when the saving over their remaining run beats the cost of moving them
//! (checkpoint restore, checkpoint transfer, work since the last checkpoint)
//! by a margin. The federation core carries the migrations out.

use crate::engine::{cluster_bound, eval_cluster, EvalCtx, Placement, PreparedJob, Pricing};
use crate::model::{ClusterId, FleetModel, PoolId};
use crate::policy::Policy;
use crate::state::FleetState;

/// A job running now.
#[derive(Clone, Debug, PartialEq)]
pub struct RunningJob {
    pub job: PreparedJob,
    pub cluster: ClusterId,
    pub pool: PoolId,
    pub pricing: Pricing,
    /// Expected seconds still to run on the pool it runs on now.
    pub remaining_s: f64,
    /// Seconds of work since the last checkpoint (lost by moving).
    pub since_ckpt_s: f64,
}

/// How much better a move must be: saving > max(min_saving_usd,
/// min_saving_fraction × cost of staying).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MigrationMargin {
    pub min_saving_usd: f64,
    pub min_saving_fraction: f64,
}

impl Default for MigrationMargin {
    fn default() -> Self {
        MigrationMargin { min_saving_usd: 10.0, min_saving_fraction: 0.10 }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MigrationProposal {
    /// Index into the `running` slice.
    pub index: usize,
    pub job_id: String,
    pub from: ClusterId,
    pub to: Placement,
    /// Score of staying for the remaining run (USD).
    pub stay_usd: f64,
    /// Score of the new placement for the remaining run (USD).
    pub move_usd: f64,
    /// Restore + transfer + redone work, valued (USD).
    pub migration_usd: f64,
    /// stay − move − migration.
    pub saving_usd: f64,
}

/// Proposals, best saving first; at most one per job, and never more jobs
/// into a pool than it has free GPUs. Moves go to other clusters only (see
/// [`propose_migrations_with`]).
pub fn propose_migrations(
    model: &FleetModel,
    state: &FleetState,
    running: &[RunningJob],
    policy: &Policy,
    margin: &MigrationMargin,
) -> Vec<MigrationProposal> {
    propose_migrations_with(model, state, running, policy, margin, false)
}

/// As [`propose_migrations`]; with `same_cluster`, a job may also be restarted
/// on its own cluster in another pool or pricing (an on-demand job back onto
/// spot once spot capacity returns), paying the same restore, setup and redone
/// work as any move.
pub fn propose_migrations_with(
    model: &FleetModel,
    state: &FleetState,
    running: &[RunningJob],
    policy: &Policy,
    margin: &MigrationMargin,
    same_cluster: bool,
) -> Vec<MigrationProposal> {
    propose(model, state, running, policy, margin, same_cluster, true)
}

/// [`propose_migrations_with`] by a plain scan of every cluster, every option
/// scored in full: what its pruning must give, bit for bit (the property
/// tests compare the two).
#[doc(hidden)]
pub fn propose_migrations_unpruned(
    model: &FleetModel,
    state: &FleetState,
    running: &[RunningJob],
    policy: &Policy,
    margin: &MigrationMargin,
    same_cluster: bool,
) -> Vec<MigrationProposal> {
    propose(model, state, running, policy, margin, same_cluster, false)
}

fn propose(
    model: &FleetModel,
    state: &FleetState,
    running: &[RunningJob],
    policy: &Policy,
    margin: &MigrationMargin,
    same_cluster: bool,
    prune: bool,
) -> Vec<MigrationProposal> {
    let mut out = Vec::new();
    // Free GPUs left per (cluster, pool) as proposals claim them.
    let mut free: Vec<Vec<u32>> =
        state.clusters.iter().map(|c| c.pools.iter().map(|p| p.free_gpus).collect()).collect();
    let ov = &model.overheads;
    let mut cands: Vec<MigrationProposal> = Vec::new();
    for (i, r) in running.iter().enumerate() {
        if !(r.job.spec.interruptible && r.remaining_s.is_finite() && r.remaining_s > 0.0) {
            continue;
        }
        let Some(cur) = model.cluster(r.cluster) else {
            continue;
        };
        // Remaining work at the reference speed (the engine's unit).
        let cur_speed = cur.pools.get(r.pool as usize).map(|p| p.speed).unwrap_or(1.0);
        let rem_h = r.remaining_s / 3600.0 * cur_speed;
        let stay_ctx = EvalCtx {
            duration_h: rem_h,
            in_place: true,
            require_free: false,
            bound: f64::INFINITY,
            stay: Some((r.pool, r.pricing)),
            only: None,
            resume: false,
            // kgCO2 only where the policy prices it (the chosen move gets its
            // kgCO2 below): it changes no score otherwise.
            carbon: !prune || policy.carbon_usd_per_kg != 0.0,
        };
        // Staying: the job's own pool at the price it pays there; if that pool or
        // pricing is not in the model, the cluster's best option.
        let stay = eval_cluster(model, state, &r.job, policy, r.cluster, &stay_ctx)
            .or_else(|_| eval_cluster(model, state, &r.job, policy, r.cluster, &EvalCtx { stay: None, ..stay_ctx }));
        let stay = match stay {
            Ok(p) => p.breakdown.total,
            Err(_) => f64::INFINITY, // the cluster can no longer hold it: moving is free of "stay" value
        };
        // A move is proposed only when it saves more than the margin asks
        // (`need`) and more than the best move found so far: its score is below
        // staying by at least that much, since the migration's own cost is
        // >= 0. Options and clusters that cannot score below that bound are
        // skipped (the bound is loosened by a relative 1e-9 against the
        // roundings of the saving's arithmetic).
        let need = margin.min_saving_usd.max(margin.min_saving_fraction * if stay.is_finite() { stay } else { 0.0 });
        let bound_for = |best_saving: f64| {
            if prune && stay.is_finite() {
                stay - need.max(best_saving) + 1e-9 * stay.abs()
            } else {
                f64::INFINITY
            }
        };
        let mut move_ctx = EvalCtx {
            duration_h: rem_h,
            in_place: false,
            require_free: true,
            bound: bound_for(f64::NEG_INFINITY),
            stay: None,
            only: None,
            resume: false,
            carbon: !prune || policy.carbon_usd_per_kg != 0.0,
        };
        let g = f64::from(r.job.gpus);
        let mut best: Option<MigrationProposal> = None;
        // Clusters cheapest unit of work first: once that alone reaches the
        // bound, no later cluster can give a move worth proposing.
        let can_stop = prune
            && stay.is_finite()
            && policy.time_value(r.job.gpus) >= 0.0
            && policy.carbon_usd_per_kg >= 0.0
            && policy.egress_weight >= 0.0
            && !state.clusters.iter().any(|c| c.pools.iter().any(|p| p.spot_price.is_some()));
        // GPU-hours of work, shaded by 1e-9 against rounding, as in `decide`.
        let work = g * rem_h * (1.0 - 1e-9);
        for &(floor, cid) in model.cheapest_for(policy) {
            if can_stop && floor * work >= move_ctx.bound {
                break;
            }
            if cid == r.cluster && !same_cluster {
                continue;
            }
            let Some(c) = model.cluster(cid) else {
                continue;
            };
            // What every option there pays already reaches the bound.
            if can_stop && cluster_bound(model, &r.job, policy, cid, c, floor * work, move_ctx.bound).is_none() {
                continue;
            }
            let Ok(p) = eval_cluster(model, state, &r.job, policy, cid, &move_ctx) else {
                continue;
            };
            // Restarting in the very option it runs on saves nothing.
            if cid == r.cluster && p.pool == r.pool && p.pricing == r.pricing {
                continue;
            }
            let ckpt_gb = r.job.ckpt_size_gb;
            let src = r.job.ckpt_region.as_ref().and_then(|l| l.first().copied()).unwrap_or(cur.region_id);
            let transfer_h = if src == c.region_id {
                0.0
            } else {
                ckpt_gb * 8.0 / model.bandwidth_gbps(src, c.region_id).max(1e-3) / 3600.0
            };
            let egress = if src == c.region_id { 0.0 } else { ckpt_gb * model.egress_usd_per_gb(src, c.region_id) };
            let restore_h = ov.restore_s / 3600.0;
            let new_speed = c.pools.get(p.pool as usize).map(|x| x.speed).unwrap_or(1.0).max(1e-6);
            let redo_h = r.since_ckpt_s.max(0.0) / 3600.0 * cur_speed / new_speed;
            let price = p.breakdown.price_per_gpu_hour;
            let migration_usd = price * g * (restore_h + redo_h)
                + policy.time_value(r.job.gpus) * g * (restore_h + transfer_h + redo_h)
                + policy.egress_weight * egress;
            let saving = stay - p.breakdown.total - migration_usd;
            if !saving.is_finite() && stay.is_finite() {
                continue;
            }
            // Ties: the lower cluster index (the order of a plain scan).
            if best.as_ref().is_none_or(|b| saving > b.saving_usd || (saving == b.saving_usd && cid < b.to.cluster)) {
                move_ctx.bound = bound_for(saving);
                best = Some(MigrationProposal {
                    index: i,
                    job_id: r.job.spec.id.clone(),
                    from: r.cluster,
                    to: p,
                    stay_usd: stay,
                    move_usd: p.breakdown.total,
                    migration_usd,
                    saving_usd: saving,
                });
            }
        }
        if let Some(mut b) = best.filter(|b| b.saving_usd > need) {
            if !move_ctx.carbon {
                // The chosen move's kgCO2, which the scan left out.
                let only =
                    EvalCtx { carbon: true, bound: f64::INFINITY, only: Some((b.to.pool, b.to.pricing)), ..move_ctx };
                if let Ok(p) = eval_cluster(model, state, &r.job, policy, b.to.cluster, &only) {
                    b.to = p;
                }
            }
            cands.push(b);
        }
    }
    cands.sort_by(|a, b| {
        b.saving_usd.partial_cmp(&a.saving_usd).unwrap_or(std::cmp::Ordering::Equal).then(a.index.cmp(&b.index))
    });
    for c in cands {
        let g = running.get(c.index).map(|r| r.job.gpus).unwrap_or(0);
        let Some(slot) = free.get_mut(c.to.cluster as usize).and_then(|v| v.get_mut(c.to.pool as usize)) else {
            continue;
        };
        if *slot >= g {
            *slot -= g;
            out.push(c);
        }
    }
    out
}
