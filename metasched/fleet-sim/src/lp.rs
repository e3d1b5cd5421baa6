//! A time-indexed LP relaxation lower bound on the cost of any schedule.
//!
//! Work is divisible and preemptible at will; time is cut into slots of
//! `slot_s`. Variables `x[g, o, t]` are the GPU-hours that job group `g` uses on
//! option `o` (a pool with a pricing) in slot `t`. Constraints:
//!
//! * every group's work is done: `Σ_{o,t} x[g,o,t] × speed_o = W_g` (reference
//!   GPU-hours), only in slots from the group's release slot on (a job submitted
//!   during slot `r` may use all of slot `r`: the release is rounded down);
//! * a pool's GPU-hours per slot: `Σ_{g,o∈pool} x ≤ GPUs × slot length`;
//! * spot GPU-hours per slot: `Σ_{g,o spot∈pool} x ≤ mean spot fraction × GPUs ×
//!   slot length` (the spot trace's availability averaged over the slot);
//! * every job done by `horizon_s` (the latest end among the policies compared, so
//!   the bound holds for each of them).
//!
//! Cost: `x × (price_o + (egress_o + setup_o) × speed_o)` where `egress_o` is the
//! egress of moving the job's data there and `setup_o` one provisioning of the
//! job's GPUs there (`price × GPUs × provision_s`), each per reference GPU-hour of
//! its work (the cheapest per unit of work among the group's jobs).
//!
//! Why the setup charge keeps it a lower bound: the simulator bills a cloud pool's
//! provisioning at *every* start of a job there (first start, restart after a
//! spot reclaim, migration). If a schedule does a share `φ_o > 0` of job `j`'s
//! work on option `o`, `j` started on `o` at least once and paid at least one
//! setup `S_o`; since `φ_o ≤ 1`, that payment is `≥ φ_o × S_o`, which is what the
//! LP charges (`S_o / W_j` per unit of work). Restores, staging delays and work
//! lost at reclaims are still left out: a schedule that knew every reclaim in
//! advance could end or checkpoint its spot jobs exactly before it, so no loss
//! per reclaim can be charged without assuming the policy is online. Every
//! other simplification makes the LP easier, so its optimum is a lower bound of
//! every schedule that finishes by the horizon (the CLI also solves it with each
//! policy's own last job end as the horizon: a bound for that policy alone). Jobs are grouped by
//! (release slot, set of feasible options) so the LP stays small; the slot length
//! grows until the LP has at most `max_vars` variables.

use std::collections::BTreeMap;

use good_lp::{constraint, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};

use crate::sim::{Model, SimJob};
use crate::spot::SpotTrace;

/// The LP bound and how it was computed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LpBound {
    pub usd: f64,
    pub slot_hours: f64,
    pub horizon_hours: f64,
    pub groups: usize,
    pub variables: usize,
    pub constraints: usize,
}

/// A job for the LP: release (s), work (reference GPU-hours), (option, cost per work).
type JobOptions = (f64, f64, Vec<(usize, f64)>);

#[derive(Default)]
struct Group {
    release: usize,
    /// (option index, cost per reference GPU-hour of work)
    opts: Vec<(usize, f64)>,
    work_h: f64,
}

/// Solves the LP. `Err` with the reason when it cannot (no option for a job,
/// infeasible horizon, solver failure).
pub fn lp_bound<M: Model>(
    model: &mut M,
    jobs: &[SimJob],
    spot: &[SpotTrace],
    horizon_s: f64,
    max_vars: usize,
) -> Result<LpBound, String> {
    if jobs.is_empty() || !(horizon_s.is_finite() && horizon_s > 0.0) {
        return Err("no jobs or no horizon".into());
    }
    // Options: (cluster, pool, spot) with speed and price, indexed.
    let mut opt_index: BTreeMap<(usize, usize, bool), usize> = BTreeMap::new();
    let mut opt_info: Vec<(usize, usize, bool, f64, f64)> = Vec::new(); // cluster, pool, spot, price, speed
                                                                        // Per job: release time, work (reference GPU-hours), options with cost per work.
    let mut per_job: Vec<JobOptions> = Vec::with_capacity(jobs.len());
    for j in jobs {
        let offers = model.options(j);
        if offers.is_empty() {
            return Err(format!("job {} has no feasible option", j.id));
        }
        let work_h = j.duration_s * j.gpus as f64 / 3600.0;
        let mut v = Vec::with_capacity(offers.len());
        for o in offers {
            let key = (o.cluster, o.pool, o.spot);
            let k = *opt_index.entry(key).or_insert_with(|| {
                opt_info.push((o.cluster, o.pool, o.spot, o.usd_per_gpu_hour, o.speed.max(1e-9)));
                opt_info.len() - 1
            });
            // Setup (cloud provisioning) is billed at every start on a pool; a job
            // doing a share φ ≤ 1 of its work on an option started there at least
            // once, so φ × one setup is a valid charge per unit of work.
            let setup_usd = o.usd_per_gpu_hour * j.gpus as f64 * o.setup_s.max(0.0) / 3600.0;
            let per_work = o.usd_per_gpu_hour / o.speed.max(1e-9) + (o.egress_usd + setup_usd) / work_h.max(1e-9);
            v.push((k, per_work));
        }
        v.sort_by_key(|x| x.0);
        v.dedup_by_key(|x| x.0);
        per_job.push((j.submit_s, work_h, v));
    }
    // Pick the slot length: 6 h, doubled until the LP is small enough.
    let mut slot_s = 6.0 * 3600.0;
    let (groups, n_slots) = loop {
        let n_slots = (horizon_s / slot_s).ceil().max(1.0) as usize;
        let mut groups: BTreeMap<(usize, Vec<usize>), Group> = BTreeMap::new();
        for (submit, work, opts) in &per_job {
            let r = ((submit / slot_s).floor() as usize).min(n_slots - 1);
            let key = (r, opts.iter().map(|x| x.0).collect::<Vec<_>>());
            let g = groups.entry(key).or_insert_with(|| Group {
                release: r,
                opts: opts.iter().map(|&(k, _)| (k, f64::INFINITY)).collect(),
                work_h: 0.0,
            });
            g.work_h += work;
            for (slot, &(_, c)) in g.opts.iter_mut().zip(opts) {
                slot.1 = slot.1.min(c);
            }
        }
        let vars: usize = groups.values().map(|g| g.opts.len() * (n_slots - g.release)).sum();
        if vars <= max_vars || slot_s >= horizon_s {
            break (groups, n_slots);
        }
        slot_s *= 2.0;
    };
    let clusters = model.clusters().to_vec();
    let slot_len_h = |t: usize| ((horizon_s - t as f64 * slot_s).min(slot_s)).max(0.0) / 3600.0;
    // Mean spot fraction of a pool in slot t.
    let spot_frac = |c: usize, p: usize, t: usize| -> f64 {
        let pool = &clusters[c].pools[p];
        match pool.spot_trace.and_then(|i| spot.get(i)) {
            Some(tr) => {
                let (a, b) = (t as f64 * slot_s, ((t + 1) as f64 * slot_s).min(horizon_s));
                let n = ((b - a) / tr.gap_s).ceil().max(1.0) as usize;
                (0..n).map(|i| tr.fraction_at(a + i as f64 * tr.gap_s)).sum::<f64>() / n as f64
            }
            None if pool.sells_spot => 1.0,
            None => 0.0,
        }
    };
    let mut vars = ProblemVariables::new();
    let mut objective = Expression::default();
    // Per (option, slot): the variables using it.
    let mut by_opt_slot: BTreeMap<(usize, usize), Vec<Variable>> = BTreeMap::new();
    let mut demand: Vec<(Expression, f64)> = Vec::with_capacity(groups.len());
    let mut n_vars = 0;
    for g in groups.values() {
        let mut done = Expression::default();
        for &(k, per_work) in &g.opts {
            let speed = opt_info[k].4;
            for t in g.release..n_slots {
                let x = vars.add(variable().min(0.0));
                n_vars += 1;
                objective += per_work * speed * x;
                done += speed * x;
                by_opt_slot.entry((k, t)).or_default().push(x);
            }
        }
        demand.push((done, g.work_h));
    }
    let mut problem = vars.minimise(objective.clone()).using(good_lp::microlp);
    let mut n_cons = 0;
    for (done, w) in demand {
        problem = problem.with(constraint!(done == w));
        n_cons += 1;
    }
    // Capacity per pool and slot (all pricings), and spot per pool and slot.
    let mut pool_slot: BTreeMap<(usize, usize, usize), (Expression, Expression, bool)> = BTreeMap::new();
    for (&(k, t), xs) in &by_opt_slot {
        let (c, p, is_spot, _, _) = opt_info[k];
        let e = pool_slot.entry((c, p, t)).or_insert_with(|| (Expression::default(), Expression::default(), false));
        for &x in xs {
            e.0 += x;
            if is_spot {
                e.1 += x;
                e.2 = true;
            }
        }
    }
    for ((c, p, t), (all, spot_e, has_spot)) in pool_slot {
        let cap = clusters[c].pools[p].gpus as f64 * slot_len_h(t);
        problem = problem.with(constraint!(all <= cap));
        n_cons += 1;
        if has_spot {
            let sc = spot_frac(c, p, t) * cap;
            problem = problem.with(constraint!(spot_e <= sc));
            n_cons += 1;
        }
    }
    let sol = problem.solve().map_err(|e| format!("LP: {e}"))?;
    Ok(LpBound {
        usd: sol.eval(&objective),
        slot_hours: slot_s / 3600.0,
        horizon_hours: horizon_s / 3600.0,
        groups: groups.len(),
        variables: n_vars,
        constraints: n_cons,
    })
}
