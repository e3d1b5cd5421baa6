//! Time-indexed LP relaxations: a lower bound on the cost of any schedule, and a
//! lower bound on the kgCO2 of any schedule within a cost budget.
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
//!   the bound holds for each of them);
//! * a job holds its own GPUs and no more at any time, and none before its
//!   submission: a group's GPU-hours per slot are at most its jobs' GPUs × the
//!   slot's length (× the part after each job's submission, in its release slot).
//!   Without it (before 2026-12-02) a group could do a week-long job's work in one
//!   slot on many pools at once, or use its release slot from its start.
//!
//! Cost: `x × price_o` plus, per group and option, the **one-off charges** of the
//! jobs that run there: the egress of moving a job's data there and one
//! provisioning of its GPUs there (`price × GPUs × provision_s`). A job doing a
//! share `φ > 0` of its work on option `o` landed there at least once and paid
//! them at least once (the simulator bills provisioning at *every* start and
//! egress at the first landing on a cluster), so `φ × (egress + setup)` is a valid
//! charge. Per unit of work that is `F_j,o / W_j`: a short job's fixed charges
//! weigh far more per GPU-hour than a long one's. A group mixes jobs, so the LP
//! charges the group's work on `o` by a convex piecewise-linear function: the
//! cheapest jobs per unit of work first (fractional knapsack: the least any split
//! of the group's jobs could pay for that much work there), with jobs bucketed by
//! their charge per unit of work (each bucket charged at its cheapest member, so
//! it stays a lower bound). Until 2026-12-02 the group paid its cheapest member's
//! charge for all its work: a group holds every team's jobs, so the egress of any
//! cluster that was some team's home was 0 for all, and the longest job's
//! provisioning stood for the short ones'.
//!
//! A dataset named by several jobs of the generic format is staged once per
//! cluster and reused: its egress is divided among the jobs naming it (if any of
//! the `n` jobs runs there, one transfer of `E` was paid, `≥ E × Σφ / n`).
//!
//! Restores, staging delays and work lost at reclaims are still left out: a
//! schedule that knew every reclaim in advance could end or checkpoint its spot
//! jobs exactly before it, so no loss per reclaim can be charged without
//! assuming the policy is online. Every other simplification makes the LP easier,
//! so its optimum is a lower bound of every schedule that finishes by the horizon
//! (the CLI also solves it with each policy's own last job end as the horizon: a
//! bound for that policy alone). Jobs are grouped by (release slot, set of
//! feasible options) so the LP stays small; the slot length grows until the LP
//! has at most `max_vars` variables.
//!
//! The **carbon LP** ([`carbon_bound`]) keeps every constraint, adds "cost ≤ a
//! budget" (the cost LP's objective, itself a lower bound of what a schedule
//! pays, so every schedule within the budget is feasible) and minimises kgCO2:
//! per pool and slot, the GPU-hours run are charged at the slot's cleanest
//! quarter-hours first (a schedule may run only then, within the pool's GPUs);
//! provisioning and lost work emit nothing. Its optimum is the least kgCO2 of any
//! schedule that pays at most the budget and finishes by the horizon.
//!
//! The **capped LP** ([`capped_bound`]) minimises cost under side constraints:
//! kgCO2 at most a cap (the carbon LP's question from the cost side), and/or mean
//! completion at most a cap. Completion is bounded per job from below by
//! quantities linear in the LP's variables (see [`capped_bound`]), so every
//! schedule meeting the cap maps to a feasible point and the optimum bounds its
//! cost. The completion bound is weak inside a slot (a job may do its work
//! anywhere in its release slot at no completion cost beyond its own run time):
//! it binds on work moved to later slots.

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
    /// The optimum's GPU-hours and USD by `cluster/pool pricing` (`spot` or
    /// `std`), as the policies' `spend`; one-off charges (egress, provisioning)
    /// are in `one_off_usd`.
    pub spend: BTreeMap<String, (f64, f64)>,
    pub one_off_usd: f64,
}

/// The carbon LP: the least kgCO2 of a schedule that costs at most `usd_cap`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CarbonBound {
    /// The budget (USD) the LP's cost was held to.
    pub usd_cap: f64,
    /// The least kgCO2 (work only: provisioning and lost work emit nothing here).
    pub kg_co2: f64,
    /// The LP cost at that optimum (≤ `usd_cap`).
    pub usd: f64,
    /// The optimum's GPU-hours and USD by `cluster/pool pricing` (as `LpBound::spend`).
    pub spend: BTreeMap<String, (f64, f64)>,
    pub slot_hours: f64,
    pub horizon_hours: f64,
    pub variables: usize,
    pub constraints: usize,
}

/// Buckets of one-off charge per unit of work, per group and option.
const MAX_SEGMENTS: usize = 12;
/// Buckets of carbon intensity per pool and slot.
const CARBON_SEGMENTS: usize = 6;

#[derive(Clone, Copy)]
struct Opt {
    cluster: usize,
    pool: usize,
    spot: bool,
    speed: f64,
}

struct GroupOpt {
    k: usize,
    /// USD per GPU-hour on this option (price; the cheapest among the group's jobs).
    price: f64,
    /// Extra USD per reference GPU-hour of work, cheapest first: (slope, work cap).
    segs: Vec<(f64, f64)>,
}

struct Group {
    release: usize,
    /// Jobs in the group.
    jobs: usize,
    work_h: f64,
    /// Σ of the jobs' GPUs (a gang runs on its GPUs, no more, at any time).
    gpus: f64,
    /// Σ GPUs × time from each job's submission to the end of its release slot.
    first_slot_gpu_h: f64,
    opts: Vec<GroupOpt>,
    /// Σ of each job's least completion: its least setup + work ÷ its fastest rate (h).
    compl_floor_h: f64,
    /// Σ of each job's work ÷ (2 × its fastest rate) (h): completion ≥ mean busy time + this.
    compl_half_h: f64,
    /// Hours of completion per unit of work moved past the release slot (each job's
    /// time from submission to the end of that slot ÷ its work), cheapest first.
    delay_segs: Vec<(f64, f64)>,
    /// Hours per unit of Σ_t (t − release − 1) × work in slot t (a slot ÷ each job's
    /// work), cheapest first.
    later_segs: Vec<(f64, f64)>,
}

struct Built {
    opts: Vec<Opt>,
    groups: Vec<Group>,
    n_slots: usize,
    slot_s: f64,
    horizon_s: f64,
}

/// A job for the LP.
struct JobLp {
    submit_s: f64,
    /// Work, reference GPU-hours.
    work_h: f64,
    gpus: f64,
    /// Its least setup over its options (provisioning, billed and waited at every
    /// start), hours.
    setup_h: f64,
    /// Reference GPU-hours of work per hour at its fastest: GPUs × the fastest speed.
    rate: f64,
    /// (option, price, one-off USD per reference GPU-hour of work).
    opts: Vec<(usize, f64, f64)>,
}

/// Per-unit-of-work charges of a group's jobs on one option → convex segments.
fn segments(mut cw: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    cw.sort_by(|a, b| a.0.total_cmp(&b.0));
    let Some(&(lo, _)) = cw.first() else {
        return Vec::new();
    };
    let hi = cw.last().map(|x| x.0).unwrap_or(lo);
    let mut out: Vec<(f64, f64)> = Vec::new();
    if hi <= lo * (1.0 + 1e-9) + 1e-12 {
        return vec![(lo, cw.iter().map(|x| x.1).sum())];
    }
    // Geometric buckets of the positive charges; zeros in their own bucket.
    let pos_lo = cw.iter().map(|x| x.0).find(|&c| c > 1e-12).unwrap_or(hi);
    let ratio = (hi / pos_lo).powf(1.0 / (MAX_SEGMENTS - 2) as f64).max(1.05);
    let mut cur: Option<(i64, f64, f64)> = None; // bucket, slope (its cheapest), cap
    for (c, w) in cw {
        let b = if c <= 1e-12 { -1 } else { ((c / pos_lo).ln() / ratio.ln()).floor() as i64 };
        match &mut cur {
            Some((cb, _, cap)) if *cb == b => *cap += w,
            _ => {
                if let Some((_, s, cap)) = cur.take() {
                    out.push((s, cap));
                }
                cur = Some((b, c.max(0.0), w));
            }
        }
    }
    if let Some((_, s, cap)) = cur {
        out.push((s, cap));
    }
    out
}

fn build<M: Model>(model: &mut M, jobs: &[SimJob], horizon_s: f64, max_vars: usize) -> Result<Built, String> {
    if jobs.is_empty() || !(horizon_s.is_finite() && horizon_s > 0.0) {
        return Err("no jobs or no horizon".into());
    }
    // Jobs naming each shared dataset (generic format): its egress is paid once per cluster.
    let mut sharing: BTreeMap<&str, usize> = BTreeMap::new();
    for j in jobs {
        for (name, _) in &j.extra.datasets {
            *sharing.entry(name.as_str()).or_default() += 1;
        }
    }
    let mut opt_index: BTreeMap<(usize, usize, bool), usize> = BTreeMap::new();
    let mut opts: Vec<Opt> = Vec::new();
    let mut per_job: Vec<JobLp> = Vec::with_capacity(jobs.len());
    for j in jobs {
        let offers = model.options(j);
        if offers.is_empty() {
            return Err(format!("job {} has no feasible option", j.id));
        }
        let share =
            j.extra.datasets.iter().map(|(n, _)| sharing.get(n.as_str()).copied().unwrap_or(1)).max().unwrap_or(1);
        let work_h = (j.duration_s * j.gpus as f64 / 3600.0).max(1e-9);
        let mut v = Vec::with_capacity(offers.len());
        let gpus = j.gpus.max(1) as f64;
        let setup_h = offers.iter().map(|o| o.setup_s.max(0.0)).fold(f64::INFINITY, f64::min) / 3600.0;
        let rate = gpus * offers.iter().map(|o| o.speed.max(1e-9)).fold(0.0, f64::max);
        for o in offers {
            let k = *opt_index.entry((o.cluster, o.pool, o.spot)).or_insert_with(|| {
                opts.push(Opt { cluster: o.cluster, pool: o.pool, spot: o.spot, speed: o.speed.max(1e-9) });
                opts.len() - 1
            });
            let setup_usd = o.usd_per_gpu_hour * j.gpus as f64 * o.setup_s.max(0.0) / 3600.0;
            let fixed = o.egress_usd.max(0.0) / share as f64 + setup_usd;
            v.push((k, o.usd_per_gpu_hour, fixed / work_h));
        }
        v.sort_by_key(|x| x.0);
        v.dedup_by_key(|x| x.0);
        per_job.push(JobLp { submit_s: j.submit_s, work_h, gpus, setup_h, rate, opts: v });
    }
    // A group being built: release slot, jobs, work, GPUs, first-slot GPU-hours,
    // per option (price, (charge, work) of each job), completion terms.
    #[derive(Default)]
    struct Acc {
        release: usize,
        jobs: usize,
        work_h: f64,
        gpus: f64,
        first_slot_gpu_h: f64,
        per_opt: Vec<(f64, Vec<(f64, f64)>)>,
        compl_floor_h: f64,
        compl_half_h: f64,
        delay: Vec<(f64, f64)>,
        later: Vec<(f64, f64)>,
    }
    // Pick the slot length: 6 h, doubled until the LP is small enough.
    let mut slot_s = 6.0 * 3600.0;
    loop {
        let n_slots = (horizon_s / slot_s).ceil().max(1.0) as usize;
        let slot_h = slot_s / 3600.0;
        let mut acc: BTreeMap<(usize, Vec<usize>), Acc> = BTreeMap::new();
        for j in &per_job {
            let r = ((j.submit_s / slot_s).floor() as usize).min(n_slots - 1);
            let key = (r, j.opts.iter().map(|x| x.0).collect::<Vec<_>>());
            let g = acc.entry(key).or_insert_with(|| Acc {
                release: r,
                per_opt: vec![(f64::INFINITY, Vec::new()); j.opts.len()],
                ..Acc::default()
            });
            let to_slot_end_h = (((r + 1) as f64 * slot_s).min(horizon_s) - j.submit_s).max(0.0) / 3600.0;
            g.jobs += 1;
            g.work_h += j.work_h;
            g.gpus += j.gpus;
            g.first_slot_gpu_h += j.gpus * to_slot_end_h;
            g.compl_floor_h += j.setup_h + j.work_h / j.rate;
            g.compl_half_h += j.work_h / (2.0 * j.rate);
            g.delay.push((to_slot_end_h / j.work_h, j.work_h));
            g.later.push((slot_h / j.work_h, j.work_h * (n_slots - r) as f64));
            for (slot, &(_, price, charge)) in g.per_opt.iter_mut().zip(&j.opts) {
                slot.0 = slot.0.min(price);
                slot.1.push((charge, j.work_h));
            }
        }
        let groups: Vec<Group> = acc
            .into_iter()
            .map(|((_, ks), a)| Group {
                release: a.release,
                jobs: a.jobs,
                work_h: a.work_h,
                gpus: a.gpus,
                first_slot_gpu_h: a.first_slot_gpu_h,
                opts: ks
                    .into_iter()
                    .zip(a.per_opt)
                    .map(|(k, (price, cw))| GroupOpt { k, price, segs: segments(cw) })
                    .collect(),
                compl_floor_h: a.compl_floor_h,
                compl_half_h: a.compl_half_h,
                delay_segs: segments(a.delay),
                later_segs: segments(a.later),
            })
            .collect();
        let vars: usize = groups.iter().map(|g| g.opts.len() * (n_slots - g.release)).sum();
        // (the few segment variables, at most MAX_SEGMENTS per group and option,
        // are not counted: they do not grow with the slots)
        if vars <= max_vars || slot_s >= horizon_s {
            return Ok(Built { opts, groups, n_slots, slot_s, horizon_s });
        }
        slot_s *= 2.0;
    }
}

/// Solves the cost LP. `Err` with the reason when it cannot (no option for a job,
/// infeasible horizon, solver failure).
pub fn lp_bound<M: Model>(
    model: &mut M,
    jobs: &[SimJob],
    spot: &[SpotTrace],
    horizon_s: f64,
    max_vars: usize,
) -> Result<LpBound, String> {
    let b = build(model, jobs, horizon_s, max_vars)?;
    let s = solve(&b, model, spot, Goal::default())?;
    Ok(LpBound {
        usd: s.usd,
        slot_hours: b.slot_s / 3600.0,
        horizon_hours: b.horizon_s / 3600.0,
        groups: b.groups.len(),
        variables: s.variables,
        constraints: s.constraints,
        spend: s.spend,
        one_off_usd: s.usd - s.price_usd,
    })
}

/// Solves the carbon LP: the least kgCO2 of any schedule that finishes by
/// `horizon_s` and whose cost (as the cost LP counts it, a lower bound of what it
/// pays) is at most `usd_cap`.
pub fn carbon_bound<M: Model>(
    model: &mut M,
    jobs: &[SimJob],
    spot: &[SpotTrace],
    horizon_s: f64,
    max_vars: usize,
    usd_cap: f64,
) -> Result<CarbonBound, String> {
    if !(usd_cap.is_finite() && usd_cap > 0.0) {
        return Err("no cost budget".into());
    }
    let b = build(model, jobs, horizon_s, max_vars)?;
    let s = solve(&b, model, spot, Goal { usd_cap: Some(usd_cap), ..Goal::default() })?;
    Ok(CarbonBound {
        usd_cap,
        kg_co2: s.kg,
        usd: s.usd,
        spend: s.spend,
        slot_hours: b.slot_s / 3600.0,
        horizon_hours: b.horizon_s / 3600.0,
        variables: s.variables,
        constraints: s.constraints,
    })
}

/// Side constraints of [`capped_bound`].
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Caps {
    /// Mean completion (submission → end) over all jobs at most this, hours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_completion_h: Option<f64>,
    /// kgCO2 at most this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kg_co2: Option<f64>,
}

/// The least cost of a schedule that finishes by the horizon and meets `caps`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CappedBound {
    pub caps: Caps,
    /// The least LP cost; `None` when no point of the LP meets the caps (then no
    /// schedule does).
    pub usd: Option<f64>,
    /// kgCO2 of the optimum, when a kgCO2 cap was set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kg_co2: Option<f64>,
    pub spend: BTreeMap<String, (f64, f64)>,
    pub slot_hours: f64,
    pub horizon_hours: f64,
    pub variables: usize,
    pub constraints: usize,
}

impl CappedBound {
    /// "min cost at mean completion ≤ X h: Y USD (LP)" and the like.
    pub fn describe(&self) -> String {
        let mut what = Vec::new();
        if let Some(h) = self.caps.mean_completion_h {
            what.push(format!("mean completion ≤ {h:.2} h"));
        }
        if let Some(k) = self.caps.kg_co2 {
            what.push(format!("kgCO2 ≤ {k:.0}"));
        }
        let usd = match self.usd {
            Some(u) => format!("{u:.0} USD"),
            None => "infeasible (no schedule meets it)".into(),
        };
        format!(
            "min cost at {} (done by {:.0} h): {usd} (LP, {:.0} h slots)",
            what.join(", "),
            self.horizon_hours,
            self.slot_hours
        )
    }
}

/// Solves the cost LP with side constraints: mean completion at most
/// `caps.mean_completion_h` and/or kgCO2 at most `caps.kg_co2`.
///
/// Mean completion is bounded per job, so the optimum stays a lower bound of the
/// cost of every schedule that finishes by `horizon_s` and meets the caps, with
/// preemption, spot reclaims, setups and lost work (each only adds time): a job
/// of work `W` (reference GPU-hours) on `g` GPUs runs at most `R = g × its fastest
/// speed` units of work per hour, so its completion is at least (a) its least
/// setup + `W / R` after its submission, and (b) its mean busy time (the mean over
/// its units of work of when they were done) + `W / (2R)` (the most the mean busy
/// time can be is with all work packed at rate `R` just before the end). Work the
/// LP puts in a slot `t` after the job's release slot was done after the slot's
/// start, so the mean busy time is at least the submission + Σ_t (work in `t` ÷
/// `W`) × (slot start − submission). A group's jobs share their rows: its work
/// moved past the release slot is charged to its jobs cheapest first (the least
/// any split among them could add), each slot start counted from the end of the
/// release slot plus whole slots after it.
pub fn capped_bound<M: Model>(
    model: &mut M,
    jobs: &[SimJob],
    spot: &[SpotTrace],
    horizon_s: f64,
    max_vars: usize,
    caps: Caps,
) -> Result<CappedBound, String> {
    for v in [caps.mean_completion_h, caps.kg_co2].into_iter().flatten() {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("cap {v} is not a finite value >= 0"));
        }
    }
    let b = build(model, jobs, horizon_s, max_vars)?;
    let goal = Goal { usd_cap: None, kg_cap: caps.kg_co2, mean_completion_h: caps.mean_completion_h };
    let (usd, kg, spend, variables, constraints) = match solve(&b, model, spot, goal) {
        Ok(s) => (Some(s.usd), caps.kg_co2.map(|_| s.kg), s.spend, s.variables, s.constraints),
        Err(SolveError::Infeasible) => (None, None, BTreeMap::new(), 0, 0),
        Err(e) => return Err(e.into()),
    };
    Ok(CappedBound {
        caps,
        usd,
        kg_co2: kg,
        spend,
        slot_hours: b.slot_s / 3600.0,
        horizon_hours: b.horizon_s / 3600.0,
        variables,
        constraints,
    })
}

struct Solved {
    usd: f64,
    /// USD of GPU-hours at their price (the rest of `usd` is one-off charges).
    price_usd: f64,
    spend: BTreeMap<String, (f64, f64)>,
    kg: f64,
    variables: usize,
    constraints: usize,
}

/// What an LP solve optimises and under which side constraints.
#[derive(Default, Clone, Copy)]
struct Goal {
    /// Minimise kgCO2 with the LP cost at most this; `None`: minimise cost.
    usd_cap: Option<f64>,
    /// kgCO2 (work only, cleanest quarter-hours of each slot first) at most this.
    kg_cap: Option<f64>,
    /// Mean completion (submission → end) over all jobs at most this, hours.
    mean_completion_h: Option<f64>,
}

#[derive(Debug)]
enum SolveError {
    /// No point meets the constraints: no schedule does.
    Infeasible,
    Other(String),
}

impl From<SolveError> for String {
    fn from(e: SolveError) -> String {
        match e {
            SolveError::Infeasible => "LP: infeasible".into(),
            SolveError::Other(s) => s,
        }
    }
}

fn solve<M: Model>(b: &Built, model: &M, spot: &[SpotTrace], goal: Goal) -> Result<Solved, SolveError> {
    let usd_cap = goal.usd_cap;
    let need_kg = usd_cap.is_some() || goal.kg_cap.is_some();
    let (slot_s, horizon_s, n_slots) = (b.slot_s, b.horizon_s, b.n_slots);
    let clusters = model.clusters().to_vec();
    let slot_len_h = |t: usize| ((horizon_s - t as f64 * slot_s).min(slot_s)).max(0.0) / 3600.0;
    // Mean spot fraction of a pool in slot t.
    let spot_frac = |c: usize, p: usize, t: usize| -> f64 {
        let pool = &clusters[c].pools[p];
        match pool.spot_trace.and_then(|i| spot.get(i)) {
            Some(tr) => {
                let (a, e) = (t as f64 * slot_s, ((t + 1) as f64 * slot_s).min(horizon_s));
                let n = ((e - a) / tr.gap_s).ceil().max(1.0) as usize;
                (0..n).map(|i| tr.fraction_at(a + i as f64 * tr.gap_s)).sum::<f64>() / n as f64
            }
            None if pool.sells_spot => 1.0,
            None => 0.0,
        }
    };
    let mut vars = ProblemVariables::new();
    let mut cost = Expression::default();
    let mut by_opt_slot: BTreeMap<(usize, usize), Vec<Variable>> = BTreeMap::new();
    let mut rows: Vec<(Expression, f64, bool)> = Vec::new(); // (lhs, rhs, equality)
    let mut n_vars = 0;
    let mut priced: Vec<(usize, f64, Variable)> = Vec::new();
    // Σ over groups of the lower bound of their jobs' completion times (hours).
    let mut completion = Expression::default();
    for g in &b.groups {
        let mut done = Expression::default();
        // work past the release slot, and Σ_t (t − release − 1) × work in slot t
        let (mut late, mut later) = (Expression::default(), Expression::default());
        // the group's GPU-hours per slot, all options
        let mut per_slot: Vec<Expression> = (g.release..n_slots).map(|_| Expression::default()).collect();
        for o in &g.opts {
            let speed = b.opts[o.k].speed;
            let base = o.segs.first().map(|s| s.0).unwrap_or(0.0);
            let mut on_o = Expression::default();
            for t in g.release..n_slots {
                let x = vars.add(variable().min(0.0));
                n_vars += 1;
                // price per GPU-hour + the cheapest one-off charge per unit of work
                cost += (o.price + base * speed) * x;
                done += speed * x;
                on_o += speed * x;
                if goal.mean_completion_h.is_some() && t > g.release {
                    late += speed * x;
                    later += ((t - g.release - 1) as f64 * speed) * x;
                }
                per_slot[t - g.release] += x;
                by_opt_slot.entry((o.k, t)).or_default().push(x);
                priced.push((o.k, o.price, x));
            }
            if o.segs.len() > 1 {
                // work on o ≤ Σ segments, each at its extra charge above the cheapest
                let mut cover = Expression::default();
                for &(slope, cap) in &o.segs {
                    let s = vars.add(variable().min(0.0).max(cap));
                    n_vars += 1;
                    cost += (slope - base) * s;
                    cover += s;
                }
                rows.push((on_o - cover, 0.0, false));
            }
        }
        rows.push((done, g.work_h, true));
        if goal.mean_completion_h.is_some() {
            // Σ_j completion_j ≥ Σ_j (least setup + work ÷ fastest rate), and
            // ≥ Σ_j (mean busy time − submission + work ÷ (2 × fastest rate)),
            // where work done in slot t > release was done after the slot's start:
            // ≥ (slot end − submission) + (t − release − 1) × slot per unit of work
            // ÷ the job's work; the group's split among its jobs is the cheapest
            // (fractional knapsack by segments, as the one-off charges).
            let c = vars.add(variable().min(g.compl_floor_h));
            n_vars += 1;
            let mut busy = Expression::default();
            for (segs, moved) in [(&g.delay_segs, late), (&g.later_segs, later)] {
                if n_slots <= g.release + 1 || segs.is_empty() {
                    continue;
                }
                let mut cover = Expression::default();
                for &(slope, cap) in segs {
                    let s = vars.add(variable().min(0.0).max(cap));
                    n_vars += 1;
                    busy += slope * s;
                    cover += s;
                }
                rows.push((moved - cover, 0.0, false));
            }
            rows.push((busy - c, -g.compl_half_h, false));
            completion += c;
        }
        // A job runs on its own GPUs, never more at once, and not before its
        // submission: its GPU-hours in a slot are at most its GPUs × the part of
        // the slot after its submission.
        for (i, e) in per_slot.into_iter().enumerate() {
            let t = g.release + i;
            let cap = if i == 0 { g.first_slot_gpu_h } else { g.gpus * slot_len_h(t) };
            rows.push((e, cap, false));
        }
    }
    // Capacity per pool and slot (all pricings), and spot per pool and slot.
    let mut pool_slot: BTreeMap<(usize, usize, usize), (Expression, Expression, bool)> = BTreeMap::new();
    for (&(k, t), xs) in &by_opt_slot {
        let o = b.opts[k];
        let e = pool_slot
            .entry((o.cluster, o.pool, t))
            .or_insert_with(|| (Expression::default(), Expression::default(), false));
        for &x in xs {
            e.0 += x;
            if o.spot {
                e.1 += x;
                e.2 = true;
            }
        }
    }
    let mut kg = Expression::default();
    for ((c, p, t), (all, spot_e, has_spot)) in pool_slot {
        let cap = clusters[c].pools[p].gpus as f64 * slot_len_h(t);
        if has_spot {
            rows.push((spot_e, spot_frac(c, p, t) * cap, false));
        }
        if need_kg {
            // GPU-hours of the slot at its cleanest quarter-hours first.
            let (a, e) = (t as f64 * slot_s, ((t + 1) as f64 * slot_s).min(horizon_s));
            let n = ((e - a) / 900.0).ceil().max(1.0) as usize;
            let mut q: Vec<(f64, f64)> = (0..n)
                .map(|i| {
                    let (q0, q1) = (a + i as f64 * 900.0, (a + (i + 1) as f64 * 900.0).min(e));
                    let h = (q1 - q0).max(0.0) / 3600.0;
                    let per = if h > 0.0 { model.kg_co2(c, p, 1, q0, q1) / h } else { 0.0 };
                    (per, h)
                })
                .collect();
            q.sort_by(|x, y| x.0.total_cmp(&y.0));
            let per_seg = q.len().div_ceil(CARBON_SEGMENTS).max(1);
            let gpus = clusters[c].pools[p].gpus as f64;
            let mut cover = Expression::default();
            for chunk in q.chunks(per_seg) {
                let hours: f64 = chunk.iter().map(|x| x.1).sum();
                let z = vars.add(variable().min(0.0).max(gpus * hours));
                n_vars += 1;
                kg += chunk[0].0 * z;
                cover += z;
            }
            rows.push((all - cover, 0.0, false));
        } else {
            rows.push((all, cap, false));
        }
    }
    if let Some(u) = usd_cap {
        rows.push((cost.clone(), u, false));
    }
    if let Some(k) = goal.kg_cap {
        rows.push((kg.clone(), k, false));
    }
    if let Some(h) = goal.mean_completion_h {
        let n: usize = b.groups.iter().map(|g| g.jobs).sum();
        rows.push((completion, h * n as f64, false));
    }
    let objective = if usd_cap.is_some() { kg.clone() } else { cost.clone() };
    let mut problem = vars.minimise(objective).using(good_lp::microlp);
    let n_cons = rows.len();
    for (lhs, rhs, eq) in rows {
        problem = if eq { problem.with(constraint!(lhs == rhs)) } else { problem.with(constraint!(lhs <= rhs)) };
    }
    let sol = problem.solve().map_err(|e| match e {
        good_lp::ResolutionError::Infeasible => SolveError::Infeasible,
        e => SolveError::Other(format!("LP: {e}")),
    })?;
    let mut spend: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut price_usd = 0.0;
    for (k, price, x) in priced {
        let v = sol.value(x);
        if v > 1e-9 {
            let o = b.opts[k];
            let c = &clusters[o.cluster];
            let key = format!("{}/{} {}", c.name, c.pools[o.pool].name, if o.spot { "spot" } else { "std" });
            let e = spend.entry(key).or_default();
            e.0 += v;
            e.1 += v * price;
            price_usd += v * price;
        }
    }
    Ok(Solved { usd: sol.eval(&cost), price_usd, spend, kg: sol.eval(&kg), variables: n_vars, constraints: n_cons })
}
