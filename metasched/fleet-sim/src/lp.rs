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
//! **Linked one-offs** (2026-12-06): the split above is made per option on its
//! own, so one job's cheap work could stand for the work on several options at
//! once (a long job at home covers the egress-free work there and the cheapest
//! work on a cloud). Each group's jobs are also sorted into at most `MAX_TYPES`
//! types of like charges per unit of work on every option (bands a factor 1.25
//! wide, widened until the types fit; each type charged at its least member's
//! charge on each option), and a type's work on all options together is at most
//! its work (`Σ_o z[τ,o] ≤ W_τ`, the work on each option covered by the
//! types'). The group pays the larger of the two charges; both are lower
//! bounds of what its jobs pay, so the optimum stays a lower bound. On the
//! PAI-layout sample the bound rose 11.4 %, on the sample 1.3 %
//! (docs/simulator.md, fourteenth round). Only the plain cost LP at the latest
//! end links them (the capped and carbon LPs and each policy's own-end LP keep
//! the per-option split: see `solve`).
//!
//! A dataset named by several jobs of the generic format is staged once per
//! cluster and reused: its egress is divided among the jobs naming it (if any of
//! the `n` jobs runs there, one transfer of `E` was paid, `≥ E × Σφ / n`).
//!
//! **Fine cells** (2026-12-03): each group's release slot, and the first
//! `EXT_HOURS` of the next slot, are cut into cells of 1–12 h (the shortest that
//! keeps the LP within `max_vars` after the coarse slot is chosen as before); a
//! group's variables cover its cells, the rest of the next slot, then whole
//! slots. Rows: pool GPU-hours and spot GPU-hours per cell (the variables on that
//! cell: every group's work there, other groups' coarse variables left out, which
//! only loosens), per coarse slot (every variable inside it, cells included), and
//! the gang row per cell (GPUs × the part of the cell after each submission), and
//! the group's work done by each cell's end ≤ Σ over its jobs of min(work, GPUs ×
//! fastest speed × time since submission) (the group pools its jobs, so without
//! it an early job's hours stood for a later one's work). A schedule's GPU-hours in each cell and slot map to a feasible point, so the
//! optimum stays a lower bound; it is higher when jobs arrive together inside a
//! slot (a slot let the pool's idle hours before their submission stand for them).
//!
//! **Spot windows** (2026-12-03): on a pool whose spot trace is all-or-nothing
//! (every tick 0 or its full size) a drop evicts every spot job, so each run
//! segment on spot lies inside one window of availability, and it holds its GPUs
//! for its setup first (provisioning at every start, billed, no progress; the
//! least setup of any job's offer there): no spot work is done in the first
//! `setup` seconds of a window. Spot rows use that time, not the trace's mean.
//! And the simulator keeps a stopped segment's work only at whole checkpoints
//! (`floor(worked / ck) × ck`, for evictions, migrations and outages alike; a
//! carbon pause stops at a checkpoint), so when all jobs write the same interval
//! `ck` the spot work of a pool is at most its GPUs × Σ over windows of whole
//! intervals of work time (segments one after another on a GPU keep at most
//! `floor(Σ work ÷ ck) × ck`) plus, per job, one last segment of at most its run
//! time there and the longest window's work time.
//!
//! Restores, staging delays and work lost at reclaims are otherwise still left
//! out: charging the work since the last checkpoint at each reclaim per job is not
//! done (a schedule may end or place its jobs so that little is lost), and every
//! other simplification makes the LP easier, so its optimum is a lower bound of
//! every schedule that finishes by the horizon (the CLI also solves it with each
//! policy's own last job end as the horizon: a bound for that policy alone). Jobs are grouped by (release slot, set of
//! feasible options) so the LP stays small; the slot length grows until the
//! coarse LP has at most `max_vars` variables.
//!
//! The **carbon LP** ([`carbon_bound`]) keeps every constraint, adds "cost ≤ a
//! budget" (the cost LP's objective, itself a lower bound of what a schedule
//! pays, so every schedule within the budget is feasible) and minimises kgCO2:
//! per pool and slot, the GPU-hours run are charged at the slot's cleanest
//! quarter-hours first (a schedule may run only then, within the pool's GPUs;
//! fine cells are counted in their slot's buckets); provisioning and lost work
//! emit nothing. Its optimum is the least kgCO2 of any
//! schedule that pays at most the budget and finishes by the horizon.
//!
//! **Solvers** (2026-12-03): every LP is solved by one of two pure-Rust solvers
//! behind good_lp, microlp (simplex) and clarabel (interior point), and checked by
//! the other when the first fails or finds the LP infeasible. The carbon LP goes
//! to clarabel first (on the sample microlp needed 610 s or failed with
//! "Singular matrix"; clarabel 22 s), the others to microlp (1.5 s against 9.5 s
//! on the sample's cost LP). The report names the solver of each bound
//! (`solver`). An answer that breaks a row (beyond 1e-5 of 1 + |rhs|) is that
//! solver's failure (`Lp::check`): microlp has returned such points as optima
//! (onprem-heavy's completion-capped LPs), clarabel too (cloud-spot's, when
//! tried first). Each solve stops at a time limit (`LpLimits::time_limit_s`,
//! `--lp-time-limit`; microlp has stalled in its feasibility phase for over 16
//! minutes on the openb-layout sample); a point microlp has not proven optimal
//! is no answer.
//!
//! **Certified bounds** (2026-12-07): a bound is not the solver's word that its
//! point is optimal. From clarabel's row multipliers (its own solve, or one
//! asked for after microlp's) [`crate::certify::dual_bound`] computes a lower
//! bound of the LP's optimum from the LP's own numbers (weak duality with the
//! box kept); that is the bound the report uses (`usd`, `kg_co2`), beside the
//! solver's point (`solver_usd`, `solver_kg_co2`) and what proves it
//! (`certificate`). An "infeasible" from clarabel comes with a Farkas vector,
//! checked the same way ([`crate::certify::proves_infeasible`]); one so proven
//! needs no second solver. It found clarabel's "optimum" of onprem-heavy's
//! completion-capped LP 49.1 USD above the LP's optimum at its default
//! tolerances (clarabel now runs at 1e-10 and up to 1000 iterations). One
//! clarabel solve serves both as the second solver and for the certificate;
//! with [`LpLimits::solvers_at_once`] it runs on its own thread beside
//! microlp's (the same two solves: the answer does not change, the wall time
//! is the slower solve's instead of both); without [`LpLimits::certify`] it
//! runs only if microlp fails.

//! The **capped LP** ([`capped_bound`]) minimises cost under side constraints:
//! kgCO2 at most a cap (the carbon LP's question from the cost side), and/or mean
//! completion at most a cap. Completion is bounded per job from below by
//! quantities linear in the LP's variables (see [`capped_bound`]), so every
//! schedule meeting the cap maps to a feasible point and the optimum bounds its
//! cost. Work in a fine cell of the release slot adds (cell start − submission)
//! per unit ÷ the job's work, for the jobs submitted before the cell (the group's
//! split cheapest first, each job at most its GPUs × fastest speed × its part of
//! the cell); work past the release slot adds (slot end − submission) + (piece
//! start − slot end).

use std::cell::OnceCell;
use std::collections::BTreeMap;

use std::collections::HashMap;

use clarabel::solver::{IPSolver, SolverStatus};
use good_lp::solvers::{SolutionStatus, WithTimeLimit};
use good_lp::{
    constraint, variable, Expression, IntoAffineExpression, ProblemVariables, Solution, SolverModel, Variable,
};

use crate::sim::{Model, SimJob};
use crate::spot::SpotTrace;

/// The LP bound and how it was computed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LpBound {
    /// The bound: the least cost any point of the LP has, as its dual
    /// certifies (`certificate`); the solver's optimum where none was found.
    pub usd: f64,
    /// The cost of the solver's optimal point (at least `usd`; within the
    /// solvers' tolerance of it when certified).
    pub solver_usd: f64,
    pub slot_hours: f64,
    /// Length of the fine cells of each release slot and of the first hours after
    /// it (= `slot_hours` when the LP has none).
    pub cell_hours: f64,
    pub horizon_hours: f64,
    pub groups: usize,
    pub variables: usize,
    pub constraints: usize,
    /// The optimum's GPU-hours and USD by `cluster/pool pricing` (`spot` or
    /// `std`), as the policies' `spend`; one-off charges (egress, provisioning)
    /// are in `one_off_usd`.
    pub spend: BTreeMap<String, (f64, f64)>,
    pub one_off_usd: f64,
    /// The solver whose optimum this is (microlp or clarabel), and why when it
    /// was not the first choice.
    pub solver: String,
    /// What proves the bound (see [`crate::certify`]): "certified: clarabel's
    /// dual bound is … below the solver's point", or why it is only the
    /// solver's word ("not certified: …").
    pub certificate: String,
}

impl LpBound {
    /// Whether `usd` is proven (`certificate`), not the solver's word.
    pub fn is_certified(&self) -> bool {
        self.certificate.starts_with(CERTIFIED)
    }
}

/// How a `certificate` that proves its bound begins.
const CERTIFIED: &str = "certified:";

/// The carbon LP: the least kgCO2 of a schedule that costs at most `usd_cap`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CarbonBound {
    /// The budget (USD) the LP's cost was held to.
    pub usd_cap: f64,
    /// The least kgCO2 (work only: provisioning and lost work emit nothing
    /// here), as the dual certifies (`certificate`).
    pub kg_co2: f64,
    /// The kgCO2 of the solver's optimal point (at least `kg_co2`).
    pub solver_kg_co2: f64,
    /// The LP cost at that optimum (≤ `usd_cap`).
    pub usd: f64,
    /// The optimum's GPU-hours and USD by `cluster/pool pricing` (as `LpBound::spend`).
    pub spend: BTreeMap<String, (f64, f64)>,
    pub slot_hours: f64,
    /// Length of the fine cells of each release slot and of the first hours after
    /// it (= `slot_hours` when the LP has none).
    pub cell_hours: f64,
    pub horizon_hours: f64,
    pub variables: usize,
    pub constraints: usize,
    /// The solver whose optimum this is (microlp or clarabel), and why when it
    /// was not the first choice.
    pub solver: String,
    /// What proves the bound (as `LpBound::certificate`).
    pub certificate: String,
}

/// How long one LP solve may take, each solver, unless told otherwise.
pub const DEFAULT_TIME_LIMIT_S: f64 = 600.0;

/// The size and time an LP may take: the coarse LP's variables at most
/// `max_vars` (the slots grow until it fits), each solver's solve at most
/// `time_limit_s`; with `certify`, a microlp answer is certified by a clarabel
/// solve for the dual (clarabel's own answers always are). With
/// `solvers_at_once`, that clarabel solve runs on a second thread beside
/// microlp's instead of after it (the answer is the same: the same two solves,
/// each single-threaded). A bare `usize` is `max_vars` with the default time,
/// certified, one solver at a time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LpLimits {
    pub max_vars: usize,
    pub time_limit_s: f64,
    pub certify: bool,
    pub solvers_at_once: bool,
}

impl From<usize> for LpLimits {
    fn from(max_vars: usize) -> LpLimits {
        LpLimits { max_vars, time_limit_s: DEFAULT_TIME_LIMIT_S, certify: true, solvers_at_once: false }
    }
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
    /// The least setup (provisioning, restore) of any job's offer on it, seconds.
    setup_s: f64,
}

struct GroupOpt {
    k: usize,
    /// USD per GPU-hour on this option (price; the cheapest among the group's jobs).
    price: f64,
    /// Extra USD per reference GPU-hour of work, cheapest first: (slope, work cap).
    segs: Vec<(f64, f64)>,
}

/// A stretch of time that a group's variables cover: a fine cell of the release
/// slot or of the first hours after it, the rest of the slot after those, or a
/// whole coarse slot.
#[derive(Clone)]
struct Piece {
    start_s: f64,
    /// The coarse slot holding it.
    slot: usize,
    /// Its fine cell (global index), for pieces of the fine grid.
    cell: Option<usize>,
    /// GPU-hours the group's jobs can hold in it: Σ GPUs × its part after each
    /// job's submission.
    gang_gpu_h: f64,
    /// For fine cells: the most work the group's jobs can have done by the
    /// cell's end, Σ min(work, GPUs × fastest speed × time since submission).
    done_by: Option<f64>,
    /// Hours of completion per unit of work done in it (the piece's start − each
    /// job's submission, ÷ its work), cheapest first, capped per job by what it can
    /// do in the piece; only for pieces of the release slot that start after some
    /// job's submission.
    delay_segs: Vec<(f64, f64)>,
}

struct Group {
    release: usize,
    /// Jobs in the group.
    jobs: usize,
    work_h: f64,
    opts: Vec<GroupOpt>,
    /// The group's jobs in types of like one-off charges: (work, per option in
    /// `opts`' order the least charge per unit of work of its members). Each
    /// job's work is done once over all options, so a type's work on the
    /// options adds up to its work (see `linked_one_offs`).
    types: Vec<(f64, Vec<f64>)>,
    /// The times its variables cover, in order, disjoint.
    pieces: Vec<Piece>,
    /// Each job's (work, GPUs).
    members: Vec<(f64, f64)>,
    /// Σ of each job's least completion: its least setup + work ÷ its fastest rate (h).
    compl_floor_h: f64,
    /// Σ of each job's work ÷ (2 × its fastest rate) (h): completion ≥ mean busy time + this.
    compl_half_h: f64,
    /// Hours of completion per unit of work moved past the release slot (each job's
    /// time from submission to the end of that slot ÷ its work), cheapest first.
    delay_segs: Vec<(f64, f64)>,
    /// Hours per unit of Σ_pieces (piece start − release slot end, h) × work in it
    /// (1 ÷ each job's work), cheapest first.
    later_segs: Vec<(f64, f64)>,
}

struct Built {
    opts: Vec<Opt>,
    groups: Vec<Group>,
    slot_s: f64,
    /// Length of the fine cells (= `slot_s` when there are none).
    cell_s: f64,
    horizon_s: f64,
    /// The checkpoint interval every job writes, if they share one (∞: none
    /// writes checkpoints; `None`: intervals differ).
    ck_s: Option<f64>,
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
fn segments(cw: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    segments_n(cw, MAX_SEGMENTS)
}

/// As [`segments`], with at most `max` buckets (≥ 3).
fn segments_n(mut cw: Vec<(f64, f64)>, max: usize) -> Vec<(f64, f64)> {
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
    let ratio = (hi / pos_lo).powf(1.0 / (max.max(3) - 2) as f64).max(1.05);
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

/// Most types of like one-off charges per group.
const MAX_TYPES: usize = 24;
/// A type's work on all options may exceed its work by this share: without it
/// microlp found the onprem-heavy case infeasible (clarabel solved it, to the
/// bound of the unlinked LP); a looser row only lowers the bound.
const LINK_SLACK: f64 = 1e-7;

/// The jobs of a group (same options, in the same order) in at most
/// `MAX_TYPES` types: jobs whose charges per unit of work on every option lie
/// in the same band (a factor `f` wide, on a log scale; `f` grows until the
/// types fit) form one type, charged on each option at its least member's
/// charge (so the type's charge is a lower bound of each member's).
fn charge_types(members: &[&JobLp]) -> Vec<(f64, Vec<f64>)> {
    let n_opts = members.first().map_or(0, |j| j.opts.len());
    let mut f: f64 = 1.25;
    loop {
        let band = |c: f64| -> i64 {
            if c <= 0.0 {
                i64::MIN
            } else {
                (c.ln() / f.ln()).floor() as i64
            }
        };
        let mut types: BTreeMap<Vec<i64>, (f64, Vec<f64>)> = BTreeMap::new();
        for j in members {
            let key: Vec<i64> = j.opts.iter().map(|o| band(o.2)).collect();
            let t = types.entry(key).or_insert_with(|| (0.0, vec![f64::INFINITY; n_opts]));
            t.0 += j.work_h;
            for (least, o) in t.1.iter_mut().zip(&j.opts) {
                *least = least.min(o.2);
            }
        }
        if types.len() <= MAX_TYPES || f > 1e6 {
            return types.into_values().collect();
        }
        f = f * f;
    }
}

/// The pieces of a group released in coarse slot `r`: `m` fine cells of length
/// `cell_s` covering the slot, `ext` more at the start of the next slot, the rest of
/// that slot, then whole slots; all cut at the horizon (empty ones left out).
fn layout(
    r: usize,
    n_slots: usize,
    slot_s: f64,
    m: usize,
    ext: usize,
    horizon_s: f64,
) -> Vec<(f64, f64, usize, Option<usize>)> {
    let cell_s = slot_s / m as f64;
    let mut v = Vec::new();
    let mut push = |a: f64, e: f64, slot: usize, cell: Option<usize>| {
        let e = e.min(horizon_s);
        if e > a + 1e-9 {
            v.push((a, e, slot, cell));
        }
    };
    let r0 = r as f64 * slot_s;
    if m <= 1 {
        push(r0, r0 + slot_s, r, None);
    } else {
        for k in 0..m {
            push(r0 + k as f64 * cell_s, r0 + (k + 1) as f64 * cell_s, r, Some(r * m + k));
        }
    }
    if r + 1 < n_slots {
        let r1 = (r + 1) as f64 * slot_s;
        let ext = if m <= 1 { 0 } else { ext.min(m) };
        for k in 0..ext {
            push(r1 + k as f64 * cell_s, r1 + (k + 1) as f64 * cell_s, r + 1, Some((r + 1) * m + k));
        }
        push(r1 + ext as f64 * cell_s, r1 + slot_s, r + 1, None);
    }
    for t in r + 2..n_slots {
        push(t as f64 * slot_s, (t + 1) as f64 * slot_s, t, None);
    }
    v
}

/// Fine cell lengths tried, shortest first (each divides every coarse slot length).
const CELL_HOURS: [f64; 5] = [1.0, 2.0, 3.0, 6.0, 12.0];
/// The fine grid goes on this far into the slot after the release slot.
const EXT_HOURS: f64 = 6.0;
/// Buckets of completion per unit of work per fine cell.
const CELL_SEGMENTS: usize = 4;

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
                opts.push(Opt {
                    cluster: o.cluster,
                    pool: o.pool,
                    spot: o.spot,
                    speed: o.speed.max(1e-9),
                    setup_s: f64::INFINITY,
                });
                opts.len() - 1
            });
            opts[k].setup_s = opts[k].setup_s.min(o.setup_s.max(0.0));
            let setup_usd = o.usd_per_gpu_hour * j.gpus as f64 * o.setup_s.max(0.0) / 3600.0;
            let fixed = o.egress_usd.max(0.0) / share as f64 + setup_usd;
            v.push((k, o.usd_per_gpu_hour, fixed / work_h));
        }
        v.sort_by_key(|x| x.0);
        v.dedup_by_key(|x| x.0);
        per_job.push(JobLp { submit_s: j.submit_s, work_h, gpus, setup_h, rate, opts: v });
    }
    // A group being built: release slot, its jobs, per option (price, (charge, work)
    // of each job).
    #[derive(Default)]
    struct Acc {
        members: Vec<usize>,
        per_opt: Vec<(f64, Vec<(f64, f64)>)>,
    }
    // The coarse slot: 6 h, doubled until the coarse grid alone fits the budget
    // (as before the fine cells); then the finest cells that still fit.
    let mut slot_s = 6.0 * 3600.0;
    let (n_slots, accs) = loop {
        let n_slots = (horizon_s / slot_s).ceil().max(1.0) as usize;
        let mut acc: BTreeMap<(usize, Vec<usize>), Acc> = BTreeMap::new();
        for (i, j) in per_job.iter().enumerate() {
            let r = ((j.submit_s / slot_s).floor() as usize).min(n_slots - 1);
            let key = (r, j.opts.iter().map(|x| x.0).collect::<Vec<_>>());
            let g = acc
                .entry(key)
                .or_insert_with(|| Acc { per_opt: vec![(f64::INFINITY, Vec::new()); j.opts.len()], ..Acc::default() });
            g.members.push(i);
            for (slot, &(_, price, charge)) in g.per_opt.iter_mut().zip(&j.opts) {
                slot.0 = slot.0.min(price);
                slot.1.push((charge, j.work_h));
            }
        }
        let vars: usize = acc.iter().map(|((r, ks), _)| ks.len() * (n_slots - r)).sum();
        // (the few segment variables, at most MAX_SEGMENTS per group and option,
        // are not counted: they do not grow with the slots)
        if vars <= max_vars || slot_s >= horizon_s {
            break (n_slots, acc);
        }
        slot_s *= 2.0;
    };
    // Each group's types of like one-off charges, and the variables linking them
    // (none for a group of one type: the per-option split charges it as much).
    let types: Vec<Vec<(f64, Vec<f64>)>> = accs
        .values()
        .map(|a| {
            let t = charge_types(&a.members.iter().map(|&i| &per_job[i]).collect::<Vec<_>>());
            if t.len() > 1 {
                t
            } else {
                Vec::new()
            }
        })
        .collect();
    // (their variables, at most MAX_TYPES × options + 1 per group, are not
    // counted in the budget, as the segments' are not)
    let count = |m: usize, ext: usize| -> usize {
        accs.iter().map(|((r, ks), _)| ks.len() * layout(*r, n_slots, slot_s, m, ext, horizon_s).len()).sum()
    };
    let (mut m, mut ext) = (1, 0);
    for h in CELL_HOURS {
        let cell_s = h * 3600.0;
        let mm = (slot_s / cell_s).round() as usize;
        if mm < 2 || (mm as f64 * cell_s - slot_s).abs() > 1e-6 {
            continue;
        }
        let e = (EXT_HOURS * 3600.0 / cell_s).ceil() as usize;
        if count(mm, e) <= max_vars {
            (m, ext) = (mm, e);
            break;
        }
    }
    let cell_s = slot_s / m as f64;
    let groups: Vec<Group> = accs
        .into_iter()
        .zip(types)
        .map(|(((r, ks), a), types)| {
            let members: Vec<&JobLp> = a.members.iter().map(|&i| &per_job[i]).collect();
            let max_speed = ks.iter().map(|&k| opts[k].speed).fold(0.0, f64::max);
            let release_end = (r + 1) as f64 * slot_s;
            let pieces = layout(r, n_slots, slot_s, m, ext, horizon_s)
                .into_iter()
                .map(|(a0, e0, slot, cell)| {
                    let (mut gang, mut delay, mut upto) = (0.0, Vec::new(), 0.0);
                    for j in &members {
                        upto += j.work_h.min(j.gpus * max_speed * (e0 - j.submit_s).max(0.0) / 3600.0);
                        let part_h = (e0 - a0.max(j.submit_s)).max(0.0) / 3600.0;
                        gang += j.gpus * part_h;
                        if slot == r && a0 > j.submit_s && part_h > 0.0 {
                            delay.push(((a0 - j.submit_s) / 3600.0 / j.work_h, j.gpus * max_speed * part_h));
                        } else if slot == r && part_h > 0.0 {
                            delay.push((0.0, j.gpus * max_speed * part_h));
                        }
                    }
                    let delay_segs = if slot == r && cell.is_some() && delay.iter().any(|d| d.0 > 0.0) {
                        segments_n(delay, CELL_SEGMENTS)
                    } else {
                        Vec::new()
                    };
                    Piece { start_s: a0, slot, cell, gang_gpu_h: gang, done_by: cell.map(|_| upto), delay_segs }
                })
                .collect();
            let span_h = (horizon_s - release_end).max(0.0) / 3600.0;
            Group {
                release: r,
                jobs: members.len(),
                work_h: members.iter().map(|j| j.work_h).sum(),
                types,
                opts: ks
                    .into_iter()
                    .zip(a.per_opt)
                    .map(|(k, (price, cw))| GroupOpt { k, price, segs: segments(cw) })
                    .collect(),
                pieces,
                members: members.iter().map(|j| (j.work_h, j.gpus)).collect(),
                compl_floor_h: members.iter().map(|j| j.setup_h + j.work_h / j.rate).sum(),
                compl_half_h: members.iter().map(|j| j.work_h / (2.0 * j.rate)).sum(),
                delay_segs: segments(
                    members
                        .iter()
                        .map(|j| ((release_end - j.submit_s).max(0.0) / 3600.0 / j.work_h, j.work_h))
                        .collect(),
                ),
                later_segs: segments(members.iter().map(|j| (1.0 / j.work_h, j.work_h * span_h)).collect()),
            }
        })
        .collect();
    let mut cks: Vec<f64> = jobs.iter().map(|j| j.written_checkpoint_s()).filter(|&c| c > 0.0).collect();
    cks.sort_by(f64::total_cmp);
    cks.dedup();
    let ck_s = match cks.as_slice() {
        [] => Some(f64::INFINITY),
        [c] => Some(*c),
        _ => None,
    };
    Ok(Built { opts, groups, slot_s, cell_s, horizon_s, ck_s })
}

/// Solves the cost LP. `Err` with the reason when it cannot (no option for a job,
/// infeasible horizon, solver failure).
pub fn lp_bound<M: Model>(
    model: &mut M,
    jobs: &[SimJob],
    spot: &[SpotTrace],
    horizon_s: f64,
    limits: impl Into<LpLimits>,
) -> Result<LpBound, String> {
    plain_bound(model, jobs, spot, horizon_s, limits.into(), Goal::default())
}

/// [`lp_bound`] with the one-off charges split per option only (not also
/// linked over the options): looser, and solved fast where the linked LP is
/// slow (each policy's own-end LP).
pub fn lp_bound_per_option<M: Model>(
    model: &mut M,
    jobs: &[SimJob],
    spot: &[SpotTrace],
    horizon_s: f64,
    limits: impl Into<LpLimits>,
) -> Result<LpBound, String> {
    plain_bound(model, jobs, spot, horizon_s, limits.into(), Goal { per_option_only: true, ..Goal::default() })
}

fn plain_bound<M: Model>(
    model: &mut M,
    jobs: &[SimJob],
    spot: &[SpotTrace],
    horizon_s: f64,
    limits: LpLimits,
    goal: Goal,
) -> Result<LpBound, String> {
    let b = build(model, jobs, horizon_s, limits.max_vars)?;
    let s = solve(&b, model, spot, goal, limits)?;
    Ok(LpBound {
        usd: s.bound,
        solver_usd: s.usd,
        slot_hours: b.slot_s / 3600.0,
        cell_hours: b.cell_s / 3600.0,
        horizon_hours: b.horizon_s / 3600.0,
        groups: b.groups.len(),
        variables: s.variables,
        constraints: s.constraints,
        spend: s.spend,
        one_off_usd: s.usd - s.price_usd,
        solver: s.solver,
        certificate: s.certificate,
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
    limits: impl Into<LpLimits>,
    usd_cap: f64,
) -> Result<CarbonBound, String> {
    if !(usd_cap.is_finite() && usd_cap > 0.0) {
        return Err("no cost budget".into());
    }
    let limits = limits.into();
    let b = build(model, jobs, horizon_s, limits.max_vars)?;
    let s = solve(&b, model, spot, Goal { usd_cap: Some(usd_cap), ..Goal::default() }, limits)?;
    Ok(CarbonBound {
        usd_cap,
        kg_co2: s.bound,
        solver_kg_co2: s.kg,
        usd: s.usd,
        spend: s.spend,
        slot_hours: b.slot_s / 3600.0,
        cell_hours: b.cell_s / 3600.0,
        horizon_hours: b.horizon_s / 3600.0,
        variables: s.variables,
        constraints: s.constraints,
        solver: s.solver,
        certificate: s.certificate,
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
    /// The least LP cost, as the dual certifies (`certificate`); `None` when no
    /// point of the LP meets the caps (then no schedule does).
    pub usd: Option<f64>,
    /// kgCO2 of the optimum, when a kgCO2 cap was set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kg_co2: Option<f64>,
    pub spend: BTreeMap<String, (f64, f64)>,
    pub slot_hours: f64,
    /// Length of the fine cells of each release slot and of the first hours after
    /// it (= `slot_hours` when the LP has none).
    pub cell_hours: f64,
    pub horizon_hours: f64,
    pub variables: usize,
    pub constraints: usize,
    /// The solver whose optimum this is (microlp or clarabel), and why when it
    /// was not the first choice; for an infeasible capped LP, the two solvers
    /// that both found it infeasible.
    pub solver: String,
    /// What proves the bound or the infeasibility (as `LpBound::certificate`).
    pub certificate: String,
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
            "min cost at {} (done by {:.0} h): {usd} (LP, {:.0} h slots, {:.0} h cells; {}; {})",
            what.join(", "),
            self.horizon_hours,
            self.slot_hours,
            self.cell_hours,
            self.solver,
            self.certificate
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
    limits: impl Into<LpLimits>,
    caps: Caps,
) -> Result<CappedBound, String> {
    for v in [caps.mean_completion_h, caps.kg_co2].into_iter().flatten() {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("cap {v} is not a finite value >= 0"));
        }
    }
    let limits = limits.into();
    let b = build(model, jobs, horizon_s, limits.max_vars)?;
    let goal = Goal { kg_cap: caps.kg_co2, mean_completion_h: caps.mean_completion_h, ..Goal::default() };
    let (usd, kg, spend, variables, constraints, solver, certificate) = match solve(&b, model, spot, goal, limits) {
        Ok(s) => {
            (Some(s.bound), caps.kg_co2.map(|_| s.kg), s.spend, s.variables, s.constraints, s.solver, s.certificate)
        }
        Err(SolveError::Infeasible(by, proof)) => {
            (None, None, BTreeMap::new(), 0, 0, format!("infeasible by {by}"), proof)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(CappedBound {
        caps,
        usd,
        kg_co2: kg,
        spend,
        slot_hours: b.slot_s / 3600.0,
        cell_hours: b.cell_s / 3600.0,
        horizon_hours: b.horizon_s / 3600.0,
        variables,
        constraints,
        solver,
        certificate,
    })
}

struct Solved {
    /// The cost of the solver's point.
    usd: f64,
    /// USD of GPU-hours at their price (the rest of `usd` is one-off charges).
    price_usd: f64,
    spend: BTreeMap<String, (f64, f64)>,
    /// The kgCO2 of the solver's point.
    kg: f64,
    /// The least value of the objective (cost, or kgCO2 in the carbon LP) any
    /// point of the LP has, as certified; the solver's point's where no
    /// certificate was found.
    bound: f64,
    /// What proves `bound` (see [`crate::certify`]).
    certificate: String,
    variables: usize,
    constraints: usize,
    /// The solver whose optimum this is, and why when not the first choice.
    solver: String,
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
    /// One-off charges split per option only, not also linked over the options.
    per_option_only: bool,
}

#[derive(Debug)]
enum SolveError {
    /// No point meets the constraints: no schedule does (the solvers that
    /// said so, and what proves it: empty when only their word).
    Infeasible(String, String),
    Other(String),
}

impl SolveError {
    fn text(&self) -> String {
        match self {
            SolveError::Infeasible(..) => "infeasible".into(),
            SolveError::Other(m) => m.clone(),
        }
    }
}

/// The LP solvers, both pure Rust through good_lp: microlp (simplex) and
/// clarabel (interior point). Neither's word that a point is optimal is taken:
/// the bound is certified (`crate::certify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Solver {
    Microlp,
    Clarabel,
}

impl Solver {
    fn name(self) -> &'static str {
        match self {
            Solver::Microlp => "microlp",
            Solver::Clarabel => "clarabel",
        }
    }

    fn other(self) -> Solver {
        match self {
            Solver::Microlp => Solver::Clarabel,
            Solver::Clarabel => Solver::Microlp,
        }
    }
}

impl From<SolveError> for String {
    fn from(e: SolveError) -> String {
        match e {
            SolveError::Infeasible(by, _) => format!("LP: infeasible ({by})"),
            SolveError::Other(s) => format!("LP: {s}"),
        }
    }
}

/// Times spot work can be done on a pool, `[start, end)`, with the hours before each.
type Windows = (Vec<(f64, f64)>, Vec<f64>);

/// Variables by (option, slot or cell) summed per (cluster, pool, slot or
/// cell): all pricings, the spot ones, and whether there are any spot ones.
fn per_pool(
    opts: &[Opt],
    by_opt: &BTreeMap<(usize, usize), Vec<Variable>>,
) -> BTreeMap<(usize, usize, usize), (Expression, Expression, bool)> {
    let mut out: BTreeMap<(usize, usize, usize), (Expression, Expression, bool)> = BTreeMap::new();
    for (&(k, t), xs) in by_opt {
        let o = opts[k];
        let e = out.entry((o.cluster, o.pool, t)).or_default();
        for &x in xs {
            e.0 += x;
            if o.spot {
                e.1 += x;
                e.2 = true;
            }
        }
    }
    out
}

/// The one-off charges of group `g` with each job's work done once over all
/// options: per type `τ` and option `o` the work `z[τ,o] ≥ 0` it does there,
/// `Σ_o z[τ,o] ≤ W_τ` (an equality at any optimum, since the group's work is
/// done; written as `≤`, microlp found the onprem-heavy case infeasible with
/// `=`), the work on each option covered by the types'
/// (`work_on[o] ≤ Σ_τ z[τ,o]`), charged `Σ c[τ,o] × z[τ,o]`. The per-option
/// split alone may charge one cheap job's work on every option at once (a
/// team at home on one cluster stands for the egress-free work of all).
fn linked_one_offs(
    g: &Group,
    work_on: &[Expression],
    vars: &mut ProblemVariables,
    rows: &mut Vec<(Expression, f64, bool)>,
    n_vars: &mut usize,
) -> Expression {
    let mut charge = Expression::default();
    let mut cover: Vec<Expression> = work_on.iter().map(|_| Expression::default()).collect();
    for (work, least) in &g.types {
        let mut all = Expression::default();
        for (cv, &price) in cover.iter_mut().zip(least) {
            let z = vars.add(variable().min(0.0));
            *n_vars += 1;
            charge += price * z;
            *cv += z;
            all += z;
        }
        rows.push((all, *work * (1.0 + LINK_SLACK), false));
    }
    for (on, cv) in work_on.iter().zip(cover) {
        rows.push((on.clone() - cv, 0.0, false));
    }
    charge
}

fn solve<M: Model>(
    b: &Built,
    model: &M,
    spot: &[SpotTrace],
    goal: Goal,
    limits: LpLimits,
) -> Result<Solved, SolveError> {
    let time_limit_s = limits.time_limit_s;
    let usd_cap = goal.usd_cap;
    let need_kg = usd_cap.is_some() || goal.kg_cap.is_some();
    let (slot_s, cell_s, horizon_s) = (b.slot_s, b.cell_s, b.horizon_s);
    let clusters = model.clusters().to_vec();
    // Start and end of coarse slot t and of fine cell i, cut at the horizon.
    let slot_span = |t: usize| (t as f64 * slot_s, ((t + 1) as f64 * slot_s).min(horizon_s));
    let cell_span = |i: usize| (i as f64 * cell_s, ((i + 1) as f64 * cell_s).min(horizon_s));
    // Where a pool's spot trace is all-or-nothing (every tick 0 or its full size),
    // a drop evicts every spot job, so each run segment on spot lies inside one
    // window of availability and holds its GPUs for its setup (provisioning, billed,
    // no progress) first: no spot work is done in the first `setup` seconds of a
    // window. Per pool: the times spot work can be done, as [start, end) with the
    // running total of hours before each.
    let mut work_windows: BTreeMap<(usize, usize), Windows> = BTreeMap::new();
    // Per such pool: (hours of work a spot GPU can keep at checkpoints over the
    // horizon, hours of work of the longest window).
    let mut ckpt_caps: BTreeMap<(usize, usize), (f64, f64)> = BTreeMap::new();
    // Per such pool: Σ spot GPU-hours − Σ of each group's last-segment share.
    let mut ckpt_rows: BTreeMap<(usize, usize), Expression> = BTreeMap::new();
    for o in b.opts.iter().filter(|o| o.spot && o.setup_s.is_finite() && o.setup_s > 0.0) {
        let Some(tr) = clusters[o.cluster].pools[o.pool].spot_trace.and_then(|i| spot.get(i)) else {
            continue;
        };
        if !tr.is_all_or_nothing() {
            continue;
        }
        let setup = b.opts.iter().filter(|q| q.spot && q.cluster == o.cluster && q.pool == o.pool);
        let setup = setup.map(|q| q.setup_s).fold(f64::INFINITY, f64::min);
        if work_windows.contains_key(&(o.cluster, o.pool)) || !setup.is_finite() {
            continue;
        }
        let mut wins: Vec<(f64, f64)> = Vec::new();
        let (mut i, mut open) = (0usize, None);
        while (i as f64 * tr.gap_s) < horizon_s {
            let up = tr.fraction_at_tick(i) > 0.0;
            match (up, open) {
                (true, None) => open = Some(i as f64 * tr.gap_s),
                (false, Some(w)) => {
                    wins.push((w, i as f64 * tr.gap_s));
                    open = None;
                }
                _ => {}
            }
            i += 1;
        }
        if let Some(w) = open {
            wins.push((w, f64::INFINITY));
        }
        // Kept work outside a job's last segment: whole checkpoint intervals of
        // each window's work time (all jobs write the same interval `ck`, so the
        // segments one after another on a GPU keep at most floor(Σ work ÷ ck) ×
        // ck); a last segment: at most the longest window's work time.
        if let Some(ck) = b.ck_s {
            let lens = wins.iter().map(|&(a, e)| (e.min(horizon_s) - a - setup).max(0.0));
            let kept_h: f64 =
                lens.clone().map(|l| if ck.is_finite() { (l / ck).floor() * ck } else { 0.0 }).sum::<f64>() / 3600.0;
            let longest_h = lens.fold(0.0, f64::max) / 3600.0;
            ckpt_caps.insert((o.cluster, o.pool), (kept_h, longest_h));
        }
        let wins: Vec<(f64, f64)> = wins.into_iter().map(|(a, e)| (a + setup, e)).filter(|(a, e)| e > a).collect();
        let mut before = Vec::with_capacity(wins.len());
        let mut sum = 0.0;
        for &(a, e) in &wins {
            before.push(sum);
            sum += (e.min(horizon_s) - a).max(0.0) / 3600.0;
        }
        work_windows.insert((o.cluster, o.pool), (wins, before));
    }
    // Spot GPU-hours a pool offers for work over [a, e): its GPUs × the integral of
    // the spot trace's available fraction (the simulator offers floor(fraction ×
    // GPUs)), less the setups above.
    let spot_gpu_h = |c: usize, p: usize, (a, e): (f64, f64)| -> f64 {
        let pool = &clusters[c].pools[p];
        if let Some((wins, before)) = work_windows.get(&(c, p)) {
            // hours of work windows before time t
            let upto = |t: f64| -> f64 {
                let k = wins.partition_point(|w| w.0 < t);
                if k == 0 {
                    return 0.0;
                }
                let (wa, we) = wins[k - 1];
                before[k - 1] + (t.min(we) - wa).max(0.0) / 3600.0
            };
            return pool.gpus as f64 * (upto(e) - upto(a)).max(0.0);
        }
        let frac_h = match pool.spot_trace.and_then(|i| spot.get(i)) {
            Some(tr) => {
                let mut i = (a / tr.gap_s).floor().max(0.0) as usize;
                let mut sum = 0.0;
                while (i as f64 * tr.gap_s) < e {
                    let (t0, t1) = ((i as f64 * tr.gap_s).max(a), ((i + 1) as f64 * tr.gap_s).min(e));
                    sum += tr.fraction_at_tick(i) * (t1 - t0).max(0.0);
                    i += 1;
                }
                sum / 3600.0
            }
            None if pool.sells_spot => (e - a).max(0.0) / 3600.0,
            None => 0.0,
        };
        pool.gpus as f64 * frac_h
    };
    // kgCO2 of one GPU-hour on a pool over [a, e) at its quarter-hours, (intensity, hours).
    let quarters = |c: usize, p: usize, (a, e): (f64, f64)| -> Vec<(f64, f64)> {
        let n = ((e - a) / 900.0).ceil().max(1.0) as usize;
        (0..n)
            .map(|i| {
                let (q0, q1) = (a + i as f64 * 900.0, (a + (i + 1) as f64 * 900.0).min(e));
                let h = (q1 - q0).max(0.0) / 3600.0;
                let per = if h > 0.0 { model.kg_co2(c, p, 1, q0, q1) / h } else { 0.0 };
                (per, h)
            })
            .collect()
    };
    let mut vars = ProblemVariables::new();
    let mut cost = Expression::default();
    // Variables per (option, coarse slot), fine cells included.
    let mut by_opt_slot: BTreeMap<(usize, usize), Vec<Variable>> = BTreeMap::new();
    // Variables per (option, fine cell), and the most GPU-hours each group may put there.
    let mut by_opt_cell: BTreeMap<(usize, usize), Vec<Variable>> = BTreeMap::new();
    let mut cell_gang: BTreeMap<(usize, usize, usize), f64> = BTreeMap::new(); // (cluster, pool, cell)
    let mut rows: Vec<(Expression, f64, bool)> = Vec::new(); // (lhs, rhs, equality)
    let mut n_vars = 0;
    let mut priced: Vec<(usize, f64, Variable)> = Vec::new();
    let mut kg = Expression::default();
    // Σ over groups of the lower bound of their jobs' completion times (hours).
    let mut completion = Expression::default();
    let with_compl = goal.mean_completion_h.is_some();
    // One-off charges linked over the options only in the plain cost LP
    // ([`lp_bound`]): with them microlp failed ("Singular matrix") on the
    // sample's kgCO2-capped LP, which clarabel then took 320 s to solve (7 s
    // unlinked), and on cloud-spot's LPs at some policies' own ends (30–46 s
    // each, 2 s unlinked). The capped and carbon LPs and the policies' own-end
    // LPs ([`lp_bound_per_option`]) keep the per-option split (looser, still
    // bounds).
    let link = goal.usd_cap.is_none() && goal.kg_cap.is_none() && !with_compl && !goal.per_option_only;
    for g in &b.groups {
        let mut done = Expression::default();
        let release_end = (g.release + 1) as f64 * slot_s;
        // work past the release slot, and Σ (piece start − release slot end) × work
        let (mut late, mut later) = (Expression::default(), Expression::default());
        // the group's GPU-hours and work per piece, all options
        let mut per_piece: Vec<Expression> = g.pieces.iter().map(|_| Expression::default()).collect();
        let mut work_piece: Vec<Expression> = g.pieces.iter().map(|_| Expression::default()).collect();
        let mut cum_work: Vec<Expression> = g.pieces.iter().map(|_| Expression::default()).collect();
        let mut pools_seen: Vec<(usize, usize)> = Vec::new();
        // one-off charges as split per option, and the work on each option
        let mut per_option_one_off = Expression::default();
        let mut work_on: Vec<Expression> = Vec::with_capacity(g.opts.len());
        for o in &g.opts {
            let opt = b.opts[o.k];
            let speed = opt.speed;
            if !pools_seen.contains(&(opt.cluster, opt.pool)) {
                pools_seen.push((opt.cluster, opt.pool));
            }
            let base = o.segs.first().map(|s| s.0).unwrap_or(0.0);
            let mut on_o = Expression::default();
            let mut on_spot_gpu_h = Expression::default();
            for (i, pc) in g.pieces.iter().enumerate() {
                let x = vars.add(variable().min(0.0));
                n_vars += 1;
                // price per GPU-hour; the cheapest one-off charge per unit of work
                cost += o.price * x;
                per_option_one_off += (base * speed) * x;
                done += speed * x;
                on_o += speed * x;
                on_spot_gpu_h += x;
                if pc.cell.is_some() {
                    cum_work[i] += speed * x;
                }
                if with_compl {
                    if pc.slot > g.release {
                        late += speed * x;
                        later += ((pc.start_s - release_end).max(0.0) / 3600.0 * speed) * x;
                    } else if !pc.delay_segs.is_empty() {
                        work_piece[i] += speed * x;
                    }
                }
                per_piece[i] += x;
                by_opt_slot.entry((o.k, pc.slot)).or_default().push(x);
                if let Some(cell) = pc.cell {
                    by_opt_cell.entry((o.k, cell)).or_default().push(x);
                }
                priced.push((o.k, o.price, x));
            }
            if let (true, Some(&(_, longest_h))) = (opt.spot, ckpt_caps.get(&(opt.cluster, opt.pool))) {
                // The group's spot GPU-hours here = last segments (each job at most
                // its run time here and the longest window) + work kept at
                // checkpoints (bounded for the pool as a whole below).
                let last: f64 = g.members.iter().map(|&(w, gp)| (w / speed).min(gp * longest_h)).sum();
                let f = vars.add(variable().min(0.0).max(last));
                n_vars += 1;
                rows.push((f - on_spot_gpu_h.clone(), 0.0, false));
                *ckpt_rows.entry((opt.cluster, opt.pool)).or_default() += on_spot_gpu_h - f;
            }
            if o.segs.len() > 1 {
                // work on o ≤ Σ segments, each at its extra charge above the cheapest
                let mut cover = Expression::default();
                for &(slope, cap) in &o.segs {
                    let s = vars.add(variable().min(0.0).max(cap));
                    n_vars += 1;
                    per_option_one_off += (slope - base) * s;
                    cover += s;
                }
                rows.push((on_o.clone() - cover, 0.0, false));
            }
            work_on.push(on_o);
        }
        // The one-off charges: the larger of the per-option split above (each
        // option's work charged cheapest jobs first, on its own) and the split
        // linked over the options (each job's work done once in all).
        if g.types.is_empty() || !link {
            cost += per_option_one_off;
        } else {
            let linked = linked_one_offs(g, &work_on, &mut vars, &mut rows, &mut n_vars);
            let y = vars.add(variable().min(0.0));
            n_vars += 1;
            rows.push((per_option_one_off - y, 0.0, false));
            rows.push((linked - y, 0.0, false));
            cost += y;
        }
        for pc in &g.pieces {
            if let Some(cell) = pc.cell {
                for &(c, p) in &pools_seen {
                    *cell_gang.entry((c, p, cell)).or_default() += pc.gang_gpu_h;
                }
            }
        }
        rows.push((done, g.work_h, true));
        if with_compl {
            // Σ_j completion_j ≥ Σ_j (least setup + work ÷ fastest rate), and
            // ≥ Σ_j (mean busy time − submission + work ÷ (2 × fastest rate)),
            // where work done in a piece was done after the piece's start: in a
            // fine cell of the release slot (cell start − submission) per unit of
            // work ÷ the job's work, for jobs submitted before the cell; past the
            // release slot (slot end − submission) + (piece start − slot end) per
            // unit ÷ the job's work. The group's split among its jobs is the
            // cheapest (fractional knapsack by segments, as the one-off charges).
            let c = vars.add(variable().min(g.compl_floor_h));
            n_vars += 1;
            let mut busy = Expression::default();
            let has_late = g.pieces.iter().any(|p| p.slot > g.release);
            let mut parts: Vec<(&Vec<(f64, f64)>, Expression)> = Vec::new();
            if has_late {
                parts.push((&g.delay_segs, late));
                parts.push((&g.later_segs, later));
            }
            for (pc, w) in g.pieces.iter().zip(work_piece) {
                if !pc.delay_segs.is_empty() {
                    parts.push((&pc.delay_segs, w));
                }
            }
            for (segs, moved) in parts {
                if segs.is_empty() {
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
        // submission: its GPU-hours in a piece are at most its GPUs × the part of
        // the piece after its submission.
        for (e, pc) in per_piece.into_iter().zip(&g.pieces) {
            rows.push((e, pc.gang_gpu_h, false));
        }
        // Nor can the jobs have done more work by a cell's end than their work, or
        // their fastest rate × the time since their submission.
        let mut so_far = Expression::default();
        for (w, pc) in cum_work.into_iter().zip(&g.pieces) {
            so_far += w;
            if let Some(d) = pc.done_by {
                if d < g.work_h * (1.0 - 1e-12) {
                    rows.push((so_far.clone(), d, false));
                }
            }
        }
    }
    for ((c, p), e) in ckpt_rows {
        if let Some(&(kept_h, _)) = ckpt_caps.get(&(c, p)) {
            rows.push((e, clusters[c].pools[p].gpus as f64 * kept_h, false));
        }
    }
    // Capacity per pool and coarse slot (all pricings), and spot per pool and slot.
    for ((c, p, t), (all, spot_e, has_spot)) in per_pool(&b.opts, &by_opt_slot) {
        let (a, e) = slot_span(t);
        let gpus = clusters[c].pools[p].gpus as f64;
        let cap = gpus * (e - a).max(0.0) / 3600.0;
        if has_spot {
            rows.push((spot_e, spot_gpu_h(c, p, (a, e)), false));
        }
        if need_kg {
            // GPU-hours of the slot at its cleanest quarter-hours first (their
            // buckets' hours add up to the slot: the capacity row).
            let mut q = quarters(c, p, (a, e));
            q.sort_by(|x, y| x.0.total_cmp(&y.0));
            let per_seg = q.len().div_ceil(CARBON_SEGMENTS).max(1);
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
    // Capacity and spot per pool and fine cell, where the groups there could
    // exceed it.
    for ((c, p, cell), (all, spot_e, has_spot)) in per_pool(&b.opts, &by_opt_cell) {
        let (a, e) = cell_span(cell);
        let most = cell_gang.get(&(c, p, cell)).copied().unwrap_or(f64::INFINITY);
        let cap = clusters[c].pools[p].gpus as f64 * (e - a).max(0.0) / 3600.0;
        if most > cap * (1.0 - 1e-12) {
            rows.push((all, cap, false));
        }
        if has_spot {
            let sc = spot_gpu_h(c, p, (a, e));
            if most > sc * (1.0 - 1e-12) {
                rows.push((spot_e, sc, false));
            }
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
    let n_cons = rows.len();
    let lp = Lp::new(&vars, &objective, &rows);
    // The carbon LP goes to clarabel first (measured on the sample: microlp
    // took 610 s or failed with "Singular matrix", clarabel 22 s), the others to
    // microlp (1.5 s against clarabel's 9.5 s on the sample's cost LP). A
    // failure, or "infeasible" that clarabel's Farkas vector does not prove,
    // is checked with the other solver.
    let first = if usd_cap.is_some() { Solver::Clarabel } else { Solver::Microlp };
    let second = first.other();
    // Clarabel's answer serves twice: as the second solver's when microlp
    // fails, and for the multipliers that certify microlp's point. Solved
    // once, when first needed, or beside microlp with `solvers_at_once` where
    // it will be needed anyway (a certified microlp LP).
    let clarabel: OnceCell<Result<Answer, String>> = OnceCell::new();
    let mut microlp_first = if first == Solver::Microlp && limits.certify && limits.solvers_at_once {
        let (m, c) = std::thread::scope(|sc| {
            let c = sc.spawn(|| clarabel_solve(&lp, time_limit_s));
            let m = run_microlp(&lp, time_limit_s);
            (m, c.join())
        });
        let _ = clarabel.set(c.unwrap_or_else(|_| Err("clarabel's thread panicked".into())));
        Some(m)
    } else {
        None
    };
    let clarabel_answer = || clarabel.get_or_init(|| clarabel_solve(&lp, time_limit_s));
    let mut run = |solver: Solver| match solver {
        Solver::Microlp => microlp_first.take().unwrap_or_else(|| run_microlp(&lp, time_limit_s)),
        Solver::Clarabel => clarabel_point(&lp, clarabel_answer(), time_limit_s),
    };
    let (point, solver) = match run(first) {
        Ok(v) => (v, first.name().to_string()),
        Err(SolveError::Infeasible(by, proof)) if !proof.is_empty() => return Err(SolveError::Infeasible(by, proof)),
        Err(e1) => match (run(second), e1) {
            (Ok(v), SolveError::Infeasible(..)) => (v, format!("{} ({} said infeasible)", second.name(), first.name())),
            (Ok(v), SolveError::Other(m)) => (v, format!("{} ({} failed: {m})", second.name(), first.name())),
            (Err(SolveError::Infeasible(_, proof)), SolveError::Infeasible(..)) => {
                let proof = if proof.is_empty() { "not certified: both solvers' word".to_string() } else { proof };
                return Err(SolveError::Infeasible(format!("{} and {}", first.name(), second.name()), proof));
            }
            (Err(SolveError::Infeasible(by, proof)), SolveError::Other(_)) if !proof.is_empty() => {
                return Err(SolveError::Infeasible(by, proof));
            }
            (Err(e2), e1) => {
                return Err(SolveError::Other(format!(
                    "{}: {}; {}: {}",
                    first.name(),
                    e1.text(),
                    second.name(),
                    e2.text()
                )));
            }
        },
    };
    // The bound is what a dual certifies (crate::certify), not the solver's
    // word that its point is optimal: clarabel's own dual where it answered,
    // else clarabel is asked for one.
    let at_point = lp.eval(&objective, &point.x);
    let duals = match point.duals {
        Some(z) => Some(Ok(z)),
        None if limits.certify => Some(clarabel_duals(clarabel_answer(), time_limit_s)),
        None => None,
    };
    let (bound, certificate) = match duals.map(|d| d.map(|z| crate::certify::dual_bound(&lp.form, &z, true))) {
        None => (at_point, "not certified: not asked (--lp-uncertified)".to_string()),
        Some(Ok(Some(v))) => {
            let below = (at_point - v).max(0.0);
            let rel = below / at_point.abs().max(1e-300);
            let what = format!(
                "{CERTIFIED} clarabel's dual bound is {below:.3} ({rel:.1e}) below the solver's point; the optimum lies between"
            );
            (v.min(at_point), what)
        }
        Some(Ok(None)) => (at_point, "not certified: clarabel's dual gives no finite bound".to_string()),
        Some(Err(e)) => (at_point, format!("not certified: no dual from clarabel ({})", e.text())),
    };
    let values: Vec<f64> = priced.iter().map(|p| point.x[lp.index[&p.2]]).collect();
    let (usd, kg_v) = (lp.eval(&cost, &point.x), lp.eval(&kg, &point.x));
    let mut spend: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut price_usd = 0.0;
    for ((k, price, _), v) in priced.into_iter().zip(values) {
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
    Ok(Solved { usd, price_usd, spend, kg: kg_v, bound, certificate, variables: n_vars, constraints: n_cons, solver })
}

/// An LP as the solvers and its certificate see it: its variables, objective
/// and rows, the variables' index, and the objective, bounds and rows as
/// numbers.
struct Lp<'a> {
    vars: &'a ProblemVariables,
    objective: &'a Expression,
    rows: &'a [(Expression, f64, bool)],
    index: HashMap<Variable, usize>,
    form: crate::certify::Form,
}

impl<'a> Lp<'a> {
    fn new(vars: &'a ProblemVariables, objective: &'a Expression, rows: &'a [(Expression, f64, bool)]) -> Lp<'a> {
        let mut index = HashMap::with_capacity(vars.len());
        let (mut lo, mut hi) = (Vec::with_capacity(vars.len()), Vec::with_capacity(vars.len()));
        for (i, (v, def)) in vars.iter_variables_with_def().enumerate() {
            index.insert(v, i);
            lo.push(def.get_min());
            hi.push(def.get_max());
        }
        let linear =
            |e: &Expression| -> Vec<(usize, f64)> { e.linear_coefficients().map(|(v, a)| (index[&v], a)).collect() };
        let mut c = vec![0.0; lo.len()];
        for (j, a) in linear(objective) {
            c[j] += a;
        }
        let form_rows = rows.iter().map(|(lhs, rhs, eq)| (linear(lhs), rhs - lhs.constant(), *eq)).collect();
        let form = crate::certify::Form { c, c0: objective.constant(), lo, hi, rows: form_rows };
        Lp { vars, objective, rows, index, form }
    }

    fn eval(&self, e: &Expression, x: &[f64]) -> f64 {
        e.linear_coefficients().map(|(v, a)| a * x[self.index[&v]]).sum::<f64>() + e.constant()
    }

    /// A solver's point, if it keeps every row (see [`violated_rows`]):
    /// clarabel has returned points far outside the rows as optima
    /// (cloud-spot's completion-capped LP, when clarabel was tried first: -34
    /// USD, every job's work undone), and microlp points that break rows by
    /// 5 % (onprem-heavy's completion-capped LPs). Such an answer is a
    /// failure, and the other solver is asked.
    fn check(&self, x: Vec<f64>, duals: Option<Vec<f64>>) -> Result<Point, SolveError> {
        let at = |a: &[(usize, f64)]| a.iter().map(|&(j, c)| c * x[j]).sum::<f64>();
        let rows_at: Vec<(f64, f64, bool)> = self.form.rows.iter().map(|(a, b, eq)| (at(a), *b, *eq)).collect();
        if let Some((n, worst)) = violated_rows(&rows_at) {
            return Err(SolveError::Other(format!(
                "its answer breaks {n} rows (by up to {worst:.3e}): not a solution"
            )));
        }
        Ok(Point { x, duals })
    }

    /// The model with the LP's rows, for solver `using`.
    fn model<S: good_lp::Solver>(&self, using: S) -> S::Model {
        let mut problem = self.vars.clone().minimise(self.objective.clone()).using(using);
        for (lhs, rhs, eq) in self.rows.iter().cloned() {
            problem.add_constraint(if eq { constraint!(lhs == rhs) } else { constraint!(lhs <= rhs) });
        }
        problem
    }
}

/// A solver's answer that keeps the rows: every variable's value, and the
/// rows' multipliers where the solver gives them (clarabel).
struct Point {
    x: Vec<f64>,
    duals: Option<Vec<f64>>,
}

/// Solves with microlp (simplex), stopped after `time_limit_s`; only a point
/// it proved optimal is an answer.
fn run_microlp(lp: &Lp, time_limit_s: f64) -> Result<Point, SolveError> {
    let problem = lp.model(good_lp::microlp).with_time_limit(time_limit_s);
    let sol = problem.solve().map_err(|e| match e {
        good_lp::ResolutionError::Infeasible => SolveError::Infeasible("microlp".into(), String::new()),
        e => SolveError::Other(e.to_string()),
    })?;
    if !matches!(sol.status(), SolutionStatus::Optimal) {
        return Err(time_limit_reached(time_limit_s));
    }
    let x = lp.vars.iter_variables_with_def().map(|(v, _)| sol.value(v)).collect();
    lp.check(x, None)
}

/// Clarabel's answer (interior point, stopped after `time_limit_s`) as a
/// point. Its dual comes with the point; its "infeasible" comes with a Farkas
/// vector, which is checked ([`crate::certify::proves_infeasible`]).
fn clarabel_point(lp: &Lp, answer: &Result<Answer, String>, time_limit_s: f64) -> Result<Point, SolveError> {
    let (status, x, duals) = answer.as_ref().map_err(|e| SolveError::Other(e.clone()))?;
    match status {
        SolverStatus::Solved | SolverStatus::AlmostSolved => lp.check(x.clone(), duals.clone()),
        SolverStatus::PrimalInfeasible | SolverStatus::AlmostPrimalInfeasible => {
            let proof = match duals {
                Some(z) if crate::certify::proves_infeasible(&lp.form, z) => {
                    format!("{CERTIFIED} clarabel's Farkas vector proves no point meets the rows")
                }
                _ => String::new(),
            };
            Err(SolveError::Infeasible("clarabel".into(), proof))
        }
        &other => Err(clarabel_stopped(other, time_limit_s)),
    }
}

/// Clarabel's multipliers of the rows, for the certificate of another
/// solver's answer: any multipliers give a valid bound, so its point need
/// not keep the rows; it must have ended "solved" or "almost solved".
fn clarabel_duals(answer: &Result<Answer, String>, time_limit_s: f64) -> Result<Vec<f64>, SolveError> {
    match answer.as_ref().map_err(|e| SolveError::Other(e.clone()))? {
        (SolverStatus::Solved | SolverStatus::AlmostSolved, _, Some(z)) => Ok(z.clone()),
        (SolverStatus::Solved | SolverStatus::AlmostSolved, _, None) => Err(SolveError::Other("no dual".into())),
        (SolverStatus::PrimalInfeasible | SolverStatus::AlmostPrimalInfeasible, ..) => {
            Err(SolveError::Other("it said infeasible".into()))
        }
        &(other, ..) => Err(clarabel_stopped(other, time_limit_s)),
    }
}

fn clarabel_stopped(status: SolverStatus, time_limit_s: f64) -> SolveError {
    match status {
        SolverStatus::MaxTime => time_limit_reached(time_limit_s),
        other => SolveError::Other(format!("{other:?}")),
    }
}

/// Either solver stopped at `--lp-time-limit` without an optimum.
fn time_limit_reached(time_limit_s: f64) -> SolveError {
    SolveError::Other(format!("stopped at its time limit ({time_limit_s:.0} s) before an optimum"))
}

/// Clarabel's status, point and row multipliers.
type Answer = (SolverStatus, Vec<f64>, Option<Vec<f64>>);

/// Solves with clarabel: its [`Answer`], or why it could not start.
fn clarabel_solve(lp: &Lp, time_limit_s: f64) -> Result<Answer, String> {
    let mut problem = lp.model(good_lp::clarabel);
    problem.settings().time_limit(time_limit_s);
    // Tighter than clarabel's defaults (gaps 1e-8, 200 iterations): at those,
    // onprem-heavy's completion-capped LP stopped "almost solved" at 489,185.70
    // USD, and with more iterations "solved" at 489,137.27 with its dual
    // objective beside it, yet the optimum is 489,136.60 (at 1e-10 and 1e-12
    // alike; the dual check found the gap).
    problem.settings().max_iter(1000).tol_gap_abs(1e-10).tol_gap_rel(1e-10).tol_feas(1e-10).tol_ktratio(1e-10);
    let mut solver = problem.try_into_solver().map_err(|e| e.to_string())?;
    solver.solve();
    let sol = &solver.solution;
    // good_lp puts the variables' own bounds first, then the rows in order.
    let n = lp.form.rows.len();
    let duals = sol.z.get(sol.z.len().saturating_sub(n)..).filter(|z| z.len() == n).map(<[f64]>::to_vec);
    Ok((sol.status, sol.x.clone(), duals))
}

/// Rows (value at a point, right-hand side, equality) the point breaks by
/// more than 1e-5 of (1 + |rhs|): how many, and the worst breach so
/// measured. `None` when it keeps them all. (clarabel's interior points keep
/// their rows to a few 1e-6 on the four cases of docs/simulator.md; microlp
/// has returned points that break rows by 5 %: onprem-heavy's
/// completion-capped LPs.)
fn violated_rows(rows: &[(f64, f64, bool)]) -> Option<(usize, f64)> {
    let breach = |&(v, rhs, eq): &(f64, f64, bool)| {
        let over = if eq { (v - rhs).abs() } else { v - rhs };
        if over.is_nan() {
            f64::INFINITY
        } else {
            over / (1.0 + rhs.abs())
        }
    };
    let bad: Vec<f64> = rows.iter().map(breach).filter(|&b| b > 1e-5).collect();
    (!bad.is_empty()).then(|| (bad.len(), bad.iter().copied().fold(0.0, f64::max)))
}

#[cfg(test)]
mod tests {
    use super::violated_rows;

    /// A solver's point is kept only if it keeps every row: `≤` rows within
    /// 1e-5 of (1 + |rhs|) above, `=` rows within that either side; a NaN
    /// breaks its row.
    #[test]
    fn a_point_that_breaks_a_row_is_not_a_solution() {
        assert_eq!(violated_rows(&[(5.0, 5.0, false), (-3.0, 5.0, false), (2.0, 2.0, true)]), None);
        // rounding: 1e-7 over a row of 100 is kept, 1e-4 is not
        assert_eq!(violated_rows(&[(100.00001, 100.0, false), (99.99999, 100.0, true)]), None);
        assert_eq!(violated_rows(&[(100.01, 100.0, false)]).map(|v| v.0), Some(1));
        // cloud-spot's clarabel answer: work rows of 1 left at 0
        let (n, worst) = violated_rows(&[(0.0, 1.0, true), (0.0, 1.0, true), (3.0, 5.0, false)]).unwrap();
        assert_eq!(n, 2);
        assert!((worst - 0.5).abs() < 1e-12, "{worst}");
        // over a ≤ row by 1 % of it
        assert_eq!(violated_rows(&[(1010.0, 1000.0, false)]).map(|v| v.0), Some(1));
        assert_eq!(violated_rows(&[(f64::NAN, 1.0, false)]).map(|v| v.1), Some(f64::INFINITY));
    }
}
