//! `--tune`: a policy's weights for one fleet, chosen on the trace's past and
//! checked on its future.
//!
//! A policy's weights are prices (USD per GPU-hour or per job-hour of delay,
//! USD per kg of CO2); what a planner is asked for is a budget ("−20 % kgCO2
//! for at most +5 % USD", "no slower on average than greedy-spot"). No one set of weights
//! turns the budget into the best schedule on every fleet (docs/simulator.md:
//! the carbon price that meets the sample's green target costs onprem-heavy
//! +20 %), so the planner tunes them per fleet. This replays a grid of weights
//! over the first `split` of the jobs (by submission), picks the best that keeps
//! the budget there, and replays it on the rest of the jobs, beside the
//! built-in policy and the reference, so that the figure a planner reads is one
//! the weights were not chosen on. The held-out replay starts with an empty
//! fleet at the first held-out submission (jobs of the tuning part still
//! running then are not carried over). With `--tune-folds K` the tuning part is
//! replayed as K consecutive folds in the same way, and weights are kept only
//! if they keep the limit on every fold: a choice at the edge of the budget over
//! the whole part may be far over it in one period. With `--tune-size-slack S`
//! the built-in policy is replayed on each fold too, and weights are kept only
//! if no job size (`report::SIZE_CLASSES`, classes of at least
//! [`SIZE_GUARD_MIN_JOBS`] jobs) completes more than S later on average than
//! under it: a mean completion over jobs can be bought with the large jobs'
//! waits (docs/simulator.md, nineteenth round).

use anyhow::{bail, Context, Result};
use fleet_engine::policy::Policy;

use crate::cli::{replay, sim_config, sim_jobs, Loaded, SimulateArgs};
use crate::engine_model::{EngineModel, EngineSetup};
use crate::report::{by_size_class, PolicyReport, SIZE_CLASSES};
use crate::sim::{SimConfig, SimJob, Strategy};

/// Time values (USD per GPU-hour) tried when `--tune-time-values` is not given.
pub const TIME_VALUES: [f64; 5] = [2.0, 1.0, 0.5, 0.2, 0.1];
/// Carbon prices (USD per kg) tried by `--tune green` when `--tune-carbon-prices`
/// is not given.
pub const CARBON_PRICES: [f64; 11] = [0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0];
/// Time values (USD per GPU-hour) tried by `--tune cost` when
/// `--tune-time-values` is not given (each with every per-job time value and
/// with and without the spot queue).
pub const COST_TIME_VALUES: [f64; 7] = [0.0, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0];
/// Time values per job-hour (USD) tried by `--tune cost` when
/// `--tune-job-time-values` is not given (docs/simulator.md, eighteenth round:
/// the weight a mean completion over jobs counts).
pub const COST_JOB_TIME_VALUES: [f64; 5] = [0.0, 1.0, 3.0, 10.0, 40.0];
/// Least jobs of a size class that `--tune-size-slack` holds to the built-in's.
pub const SIZE_GUARD_MIN_JOBS: usize = 20;

/// The weights `--tune` chooses among (the rest of the policy is the tuned
/// policy's own).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Weights {
    pub time_value_usd_per_gpu_hour: f64,
    pub time_value_usd_per_job_hour: f64,
    pub carbon_usd_per_kg: f64,
    pub spot_queue: bool,
}

impl Weights {
    /// `base` with these weights.
    pub fn apply(&self, base: &Policy) -> Policy {
        Policy {
            time_value_usd_per_gpu_hour: self.time_value_usd_per_gpu_hour,
            time_value_usd_per_job_hour: self.time_value_usd_per_job_hour,
            carbon_usd_per_kg: self.carbon_usd_per_kg,
            spot_queue: self.spot_queue,
            ..base.clone()
        }
    }

    /// "tv 2 carbon 0 queue true", with "+ 3/job" after the time value where
    /// a per-job time value is set.
    pub fn label(&self) -> String {
        let job = if self.time_value_usd_per_job_hour != 0.0 {
            format!(" + {}/job", self.time_value_usd_per_job_hour)
        } else {
            String::new()
        };
        format!(
            "tv {}{job} carbon {} queue {}",
            self.time_value_usd_per_gpu_hour, self.carbon_usd_per_kg, self.spot_queue
        )
    }
}

/// What the weights are tuned for.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Goal {
    /// The least kgCO2 at a USD of at most (1 + budget) × the cost policy's.
    Green { budget: f64 },
    /// The least USD at a mean completion no worse than greedy-spot's.
    Cost,
}

impl Goal {
    /// The replay the goal's figures are read against.
    pub(crate) fn reference(self) -> &'static str {
        match self {
            Goal::Green { .. } => "cost",
            Goal::Cost => "greedy-spot",
        }
    }

    /// The unit of the goal's limit: USD (green) or hours of mean completion.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Goal::Green { .. } => "USD",
            Goal::Cost => "h",
        }
    }

    pub(crate) fn base(self) -> &'static str {
        match self {
            Goal::Green { .. } => "green",
            Goal::Cost => "cost",
        }
    }
}

/// One replay's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Figures {
    pub name: String,
    pub usd: f64,
    pub kg_co2: f64,
    pub mean_completion_h: f64,
    pub unplaced: usize,
    /// Jobs replayed (what a mean completion over parts is weighted by).
    pub jobs: usize,
    /// The completed jobs by size (`report::SIZE_CLASSES`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_size: Vec<SizeFigures>,
}

/// One size class of [`Figures`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SizeFigures {
    /// GPUs asked for, as in `report::SIZE_CLASSES`.
    pub gpus: String,
    pub jobs: usize,
    pub mean_completion_h: f64,
}

impl From<&PolicyReport> for Figures {
    fn from(p: &PolicyReport) -> Figures {
        Figures {
            name: p.policy.clone(),
            usd: p.total_usd,
            kg_co2: p.kg_co2,
            mean_completion_h: p.completion_mean_s / 3600.0,
            unplaced: p.unplaced,
            jobs: p.jobs,
            by_size: p
                .by_size
                .iter()
                .map(|c| SizeFigures {
                    gpus: c.gpus.clone(),
                    jobs: c.jobs,
                    mean_completion_h: c.completion_mean_s / 3600.0,
                })
                .collect(),
        }
    }
}

impl Figures {
    /// Its size class `gpus`, if it has jobs there.
    fn size(&self, gpus: &str) -> Option<&SizeFigures> {
        self.by_size.iter().find(|c| c.gpus == gpus)
    }

    /// The size class (of at least [`SIZE_GUARD_MIN_JOBS`] jobs here) whose
    /// mean completion is the most above `base`'s, as (class, ratio);
    /// `None` where no class has both.
    pub fn worst_size_ratio(&self, base: &Figures) -> Option<(&str, f64)> {
        self.by_size
            .iter()
            .filter(|c| c.jobs >= SIZE_GUARD_MIN_JOBS)
            .filter_map(|c| {
                let b = base.size(&c.gpus).filter(|b| b.mean_completion_h > 0.0)?;
                Some((c.gpus.as_str(), c.mean_completion_h / b.mean_completion_h))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// Size classes (`report::SIZE_CLASSES`) of completed jobs given as (GPUs,
/// completion hours); empty classes left out.
pub(crate) fn sizes_of(done: &[(u32, f64)]) -> Vec<SizeFigures> {
    by_size_class(done, |d| d.0)
        .into_iter()
        .zip(SIZE_CLASSES)
        .filter_map(|(of, (gpus, _, _))| {
            (!of.is_empty()).then(|| SizeFigures {
                gpus: gpus.to_string(),
                jobs: of.len(),
                mean_completion_h: of.iter().map(|d| d.1).sum::<f64>() / of.len() as f64,
            })
        })
        .collect()
}

/// The figures of replays of consecutive parts of a trace, together: sums,
/// and the mean completion over all their jobs.
fn merge(parts: &[&Figures]) -> Figures {
    let jobs: usize = parts.iter().map(|p| p.jobs).sum();
    Figures {
        name: parts.first().map(|p| p.name.clone()).unwrap_or_default(),
        usd: parts.iter().map(|p| p.usd).sum(),
        kg_co2: parts.iter().map(|p| p.kg_co2).sum(),
        mean_completion_h: parts.iter().map(|p| p.mean_completion_h * p.jobs as f64).sum::<f64>() / jobs.max(1) as f64,
        unplaced: parts.iter().map(|p| p.unplaced).sum(),
        jobs,
        by_size: SIZE_CLASSES
            .iter()
            .filter_map(|&(gpus, _, _)| {
                let of: Vec<&SizeFigures> = parts.iter().filter_map(|p| p.size(gpus)).collect();
                let n: usize = of.iter().map(|c| c.jobs).sum();
                (n > 0).then(|| SizeFigures {
                    gpus: gpus.to_string(),
                    jobs: n,
                    mean_completion_h: of.iter().map(|c| c.mean_completion_h * c.jobs as f64).sum::<f64>() / n as f64,
                })
            })
            .collect(),
    }
}

/// One set of weights tried, and its replay over the tuning part.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Trial {
    #[serde(flatten)]
    pub weights: Weights,
    pub figures: Figures,
    /// Within the limit on every fold of the tuning part.
    pub within: bool,
    /// Folds of the tuning part on which it kept the limit.
    pub folds_within: usize,
}

/// The outcome of `--tune`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Tuned {
    pub goal: Goal,
    /// Jobs of the tuning part and of the held-out part.
    pub tuning_jobs: usize,
    pub held_out_jobs: usize,
    /// The first held-out submission, hours after the first submission.
    pub split_h: f64,
    /// Consecutive folds the tuning part was replayed in (`--tune-folds`).
    pub folds: usize,
    /// The budget on the tuning part, over all its folds: a USD cap (green) or a
    /// mean completion cap in hours (cost). Each fold is held to its own.
    pub tuning_limit: f64,
    /// The reference policies on the tuning part (cost; or greedy-spot and greedy).
    pub tuning_reference: Vec<Figures>,
    pub trials: Vec<Trial>,
    /// Index in `trials` of the weights chosen (`None`: none kept the budget).
    pub chosen: Option<usize>,
    /// On the held-out part: the references, the built-in policy, and the tuned
    /// weights (named `tuned`) when some were chosen.
    pub held_out: Vec<Figures>,
    /// The held-out budget: as `tuning_limit`, from the held-out references.
    pub held_out_limit: f64,
    /// The chosen weights as a `[policies.<name>]` table for metasched.toml.
    pub policy_toml: Option<String>,
    /// `--tune-size-slack`: the share by which a size class may complete later
    /// than under the built-in policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_slack: Option<f64>,
}

/// The goal the flags ask for.
pub fn goal(args: &SimulateArgs) -> Result<Option<Goal>> {
    let b = args.tune_budget;
    if !(b.is_finite() && b >= 0.0) {
        bail!("--tune-budget must be a finite share >= 0, got {b}");
    }
    let s = args.tune_split;
    if !(s.is_finite() && s > 0.0 && s < 1.0) {
        bail!("--tune-split must be between 0 and 1 (exclusive), got {s}");
    }
    for (flag, v) in [
        ("--tune-time-values", &args.tune_time_values),
        ("--tune-job-time-values", &args.tune_job_time_values),
        ("--tune-carbon-prices", &args.tune_carbon_prices),
    ] {
        if let Some(x) = v.iter().find(|x| !(x.is_finite() && **x >= 0.0)) {
            bail!("{flag}: every value must be finite and >= 0, got {x}");
        }
    }
    if let Some(x) = args.tune_size_slack {
        if !(x.is_finite() && x >= 0.0) {
            bail!("--tune-size-slack must be a finite share >= 0, got {x}");
        }
    }
    Ok(match args.tune.as_deref() {
        None => None,
        Some("green") => Some(Goal::Green { budget: b }),
        Some("cost") => Some(Goal::Cost),
        Some(other) => bail!("--tune {other:?}: expected `green` or `cost`"),
    })
}

/// The weights to try, time value by time value (per GPU-hour, then per
/// job-hour), then carbon price, then the spot queue.
pub(crate) fn grid(goal: Goal, args: &SimulateArgs, base: &Policy) -> Vec<Weights> {
    let or = |v: &[f64], d: &[f64]| if v.is_empty() { d.to_vec() } else { v.to_vec() };
    let (tvs, jobs, cps, queues) = match goal {
        Goal::Green { .. } => (
            or(&args.tune_time_values, &TIME_VALUES),
            or(&args.tune_job_time_values, &[base.time_value_usd_per_job_hour]),
            or(&args.tune_carbon_prices, &CARBON_PRICES),
            vec![base.spot_queue],
        ),
        Goal::Cost => (
            or(&args.tune_time_values, &COST_TIME_VALUES),
            or(&args.tune_job_time_values, &COST_JOB_TIME_VALUES),
            or(&args.tune_carbon_prices, &[base.carbon_usd_per_kg]),
            vec![true, false],
        ),
    };
    let mut out = Vec::with_capacity(tvs.len() * jobs.len() * cps.len() * queues.len());
    for &time_value_usd_per_gpu_hour in &tvs {
        for &time_value_usd_per_job_hour in &jobs {
            for &carbon_usd_per_kg in &cps {
                for &spot_queue in &queues {
                    out.push(Weights {
                        time_value_usd_per_gpu_hour,
                        time_value_usd_per_job_hour,
                        carbon_usd_per_kg,
                        spot_queue,
                    });
                }
            }
        }
    }
    out
}

/// `base` with the trial's weights, as a policies table named `name`.
pub(crate) fn table(name: &str, base: &Policy, w: Weights) -> Result<String> {
    Ok(format!("[policies.{name}]\n{}", toml::to_string(&w.apply(base)).context("policy as TOML")?))
}

/// The budget on one part, from its reference replays' figures.
pub(crate) fn limit(goal: Goal, refs: &[Figures]) -> Result<f64> {
    let name = goal.reference();
    let r = refs.iter().find(|f| f.name == name).with_context(|| format!("no replay of {name}"))?;
    Ok(match goal {
        Goal::Green { budget } => (1.0 + budget) * r.usd,
        Goal::Cost => r.mean_completion_h,
    })
}

/// Within the goal's limit and, with `guard` = (the built-in's figures on the
/// same part, `--tune-size-slack`), no size class more than the slack later
/// than the built-in's.
fn within(goal: Goal, f: &Figures, limit: f64, guard: Option<(&Figures, f64)>) -> bool {
    f.unplaced == 0
        && match goal {
            Goal::Green { .. } => f.usd <= limit,
            Goal::Cost => f.mean_completion_h <= limit,
        }
        && guard.is_none_or(|(base, slack)| f.worst_size_ratio(base).is_none_or(|(_, r)| r <= 1.0 + slack))
}

/// The engine set up from `loaded` with every weight of `grid` as a policy
/// `tune_<i>` of `base`.
pub(crate) fn grid_setup(loaded: &Loaded, base: &Policy, grid: &[Weights]) -> Result<EngineSetup> {
    let mut extra = loaded.setup.policies_toml.clone().unwrap_or_default();
    for (i, &w) in grid.iter().enumerate() {
        extra.push('\n');
        extra.push_str(&table(&format!("tune_{i}"), base, w)?);
    }
    Ok(EngineSetup { policies_toml: Some(extra), ..loaded.setup.clone() })
}

/// The replays a goal's limit is taken from.
pub(crate) fn references(goal: Goal) -> Vec<Strategy> {
    match goal {
        Goal::Green { .. } => vec![Strategy::Engine("cost".into())],
        Goal::Cost => vec![Strategy::GreedySpot, Strategy::Greedy],
    }
}

/// What the weights of a grid did over the folds of a tuning part.
pub(crate) struct Tried {
    /// The references over all the folds.
    pub reference: Vec<Figures>,
    /// The limit over all the folds (each fold is held to its own).
    pub limit: f64,
    pub trials: Vec<Trial>,
    /// The best trial within the limit on every fold.
    pub chosen: Option<usize>,
}

/// The replays a tuning part holds weights to: the goal's references, then
/// with a size guard (`--tune-size-slack`) the built-in policy.
pub(crate) fn held_to(goal: Goal, guard: Option<f64>) -> Vec<Strategy> {
    let mut out = references(goal);
    if guard.is_some() {
        out.push(Strategy::Engine(goal.base().into()));
    }
    out
}

/// The replays of a tuning part: [`held_to`], then every weight of the grid
/// (`tune_<i>`).
fn tuning_strategies(goal: Goal, guard: Option<f64>, grid: &[Weights]) -> Vec<Strategy> {
    let mut out = held_to(goal, guard);
    out.extend((0..grid.len()).map(|i| Strategy::Engine(format!("tune_{i}"))));
    out
}

/// Replays the references and every weight of `grid` (policies `tune_<i>` of
/// `setup`) over each fold, each from an empty fleet, and chooses the best that
/// keeps the limit on every fold.
pub(crate) fn try_grid(
    args: &SimulateArgs,
    loaded: &Loaded,
    setup: &EngineSetup,
    goal: Goal,
    grid: &[Weights],
    folds: &[&[SimJob]],
    cfg: &SimConfig,
) -> Result<Tried> {
    let guard = args.tune_size_slack;
    let strategies = tuning_strategies(goal, guard, grid);
    let mut runs = Vec::with_capacity(folds.len());
    for part in folds {
        runs.push(replay(args, loaded, setup, &strategies, part, cfg)?.iter().map(Figures::from).collect());
    }
    decide(goal, grid, &runs, 0.0, guard)
}

/// Chooses among the weights of `grid` from their figures on each fold,
/// `runs[fold]`: [`held_to`] first, then one per weight.
/// `carry` per job loosens each limit (tightens, if negative): by `carry` ×
/// the part's jobs USD for `green`, by `carry` hours of mean completion for
/// `cost`. With `guard` (`--tune-size-slack`) a weight is within only where
/// no size class is more than the slack later than the built-in's.
pub(crate) fn decide(
    goal: Goal,
    grid: &[Weights],
    runs: &[Vec<Figures>],
    carry: f64,
    guard: Option<f64>,
) -> Result<Tried> {
    let nrefs = held_to(goal, guard).len();
    fn guarded(r: &[Figures], nrefs: usize, guard: Option<f64>) -> Option<(&Figures, f64)> {
        guard.map(|slack| (&r[nrefs - 1], slack))
    }
    let carried = |refs: &[Figures]| -> Result<f64> {
        let jobs = refs.first().map_or(0, |f| f.jobs) as f64;
        Ok(limit(goal, refs)?
            + match goal {
                Goal::Green { .. } => carry * jobs,
                Goal::Cost => carry,
            })
    };
    let limits: Vec<f64> = runs.iter().map(|r| carried(&r[..nrefs])).collect::<Result<_>>()?;
    let merged = |k: usize| merge(&runs.iter().map(|r| &r[k]).collect::<Vec<_>>());
    let reference: Vec<Figures> = (0..nrefs).map(merged).collect();
    let limit = carried(&reference)?;
    let trials: Vec<Trial> = grid
        .iter()
        .enumerate()
        .map(|(i, &weights)| {
            let k = nrefs + i;
            let folds_within = runs
                .iter()
                .zip(&limits)
                .filter(|(r, lim)| within(goal, &r[k], **lim, guarded(r, nrefs, guard)))
                .count();
            Trial { weights, figures: merged(k), within: folds_within == runs.len(), folds_within }
        })
        .collect();
    // The best within the limit; ties go to the lower USD (green) or the shorter
    // mean completion (cost), then to the grid's order.
    let key = |t: &Trial| match goal {
        Goal::Green { .. } => (t.figures.kg_co2, t.figures.usd),
        Goal::Cost => (t.figures.usd, t.figures.mean_completion_h),
    };
    let chosen = trials
        .iter()
        .enumerate()
        .filter(|(_, t)| t.within)
        .min_by(|a, b| key(a.1).partial_cmp(&key(b.1)).unwrap_or(std::cmp::Ordering::Equal).then(a.0.cmp(&b.0)))
        .map(|(i, _)| i);
    Ok(Tried { reference, limit, trials, chosen })
}

/// Tunes the weights of `goal`'s policy over `loaded` (see the module docs).
pub fn tune(args: &SimulateArgs, loaded: &Loaded, goal: Goal) -> Result<Tuned> {
    let mut model = EngineModel::new(&loaded.setup, loaded.trace.epoch_unix as f64)?;
    let jobs = sim_jobs(&loaded.trace, &mut model, args)?;
    if jobs.len() < 2 {
        bail!("--tune needs at least two jobs (a tuning part and a held-out part), got {}", jobs.len());
    }
    let k = ((jobs.len() as f64 * args.tune_split).round() as usize).clamp(1, jobs.len() - 1);
    let (past, future) = jobs.split_at(k);
    let base = model.policy(goal.base()).with_context(|| format!("no `{}` policy", goal.base()))?;
    let grid = grid(goal, args, &base);
    let setup = grid_setup(loaded, &base, &grid)?;
    let cfg = sim_config(args, &model)?;
    let folds = args.tune_folds;
    if folds == 0 || folds > past.len() {
        bail!("--tune-folds must be between 1 and the {} jobs of the tuning part, got {folds}", past.len());
    }
    let parts: Vec<&[SimJob]> =
        (0..folds).map(|f| &past[f * past.len() / folds..(f + 1) * past.len() / folds]).collect();
    let tried = try_grid(args, loaded, &setup, goal, &grid, &parts, &cfg)?;
    let mut held: Vec<Strategy> = references(goal);
    held.push(Strategy::Engine(goal.base().into()));
    if let Some(i) = tried.chosen {
        held.push(Strategy::Engine(format!("tune_{i}")));
    }
    let held_runs = replay(args, loaded, &setup, &held, future, &cfg)?;
    let held_out: Vec<Figures> = held_runs
        .iter()
        .map(|r| {
            let mut f = Figures::from(r);
            if f.name.starts_with("tune_") {
                f.name = "tuned".into();
            }
            f
        })
        .collect();
    let held_out_limit = limit(goal, &held_out)?;
    let policy_toml = tried.chosen.map(|i| table(goal.base(), &base, grid[i])).transpose()?;
    Ok(Tuned {
        goal,
        tuning_jobs: past.len(),
        held_out_jobs: future.len(),
        split_h: (future[0].submit_s - past[0].submit_s) / 3600.0,
        tuning_limit: tried.limit,
        folds,
        tuning_reference: tried.reference,
        trials: tried.trials,
        chosen: tried.chosen,
        held_out,
        held_out_limit,
        policy_toml,
        size_slack: args.tune_size_slack,
    })
}

impl Tuned {
    /// The plain-text result (`fleet-sim --tune`).
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let unit = self.goal.unit();
        let what = match self.goal {
            Goal::Green { budget } => format!("least kgCO2 at USD ≤ {:.1} % above the cost policy's", budget * 100.0),
            Goal::Cost => "least USD at mean completion ≤ greedy-spot's".to_string(),
        };
        let _ = writeln!(
            s,
            "tuning `{}` for the {what}: weights chosen on the first {} jobs, checked on the last {} (from {:.1} h on)",
            self.goal.base(),
            self.tuning_jobs,
            self.held_out_jobs,
            self.split_h
        );
        let folds =
            if self.folds > 1 { format!(", in {} folds each held to its own", self.folds) } else { String::new() };
        let guard = guard_note(self.goal, self.size_slack);
        let _ = writeln!(s, "\ntuning part (limit {:.3} {unit}{folds}{guard}):", self.tuning_limit);
        let base = self.size_slack.and(self.tuning_reference.iter().find(|f| f.name == self.goal.base()));
        for f in &self.tuning_reference {
            row(&mut s, &f.name, f, "");
        }
        for (i, t) in self.trials.iter().enumerate() {
            let label = t.weights.label();
            let mark = match (Some(i) == self.chosen, t.within) {
                (true, _) => "  ← chosen".to_string(),
                (false, true) => String::new(),
                (false, false) if self.folds > 1 => {
                    format!("  (over the limit on {} of {} folds)", self.folds - t.folds_within, self.folds)
                }
                (false, false) => "  (over the limit)".to_string(),
            };
            let sizes = base.map(|b| size_mark(&t.figures, b)).unwrap_or_default();
            row(&mut s, &label, &t.figures, &(sizes + &mark));
        }
        let _ = writeln!(s, "\nheld-out part (limit {:.3} {unit}{guard}):", self.held_out_limit);
        compared(&mut s, self.goal, &self.held_out, self.held_out_limit, self.size_slack);
        match &self.policy_toml {
            Some(t) => {
                let _ = writeln!(s, "\nchosen weights (for metasched.toml):\n{t}");
            }
            None => {
                let _ = writeln!(s, "\nno weights of the grid kept the limit on the tuning part");
            }
        }
        s
    }
}

/// One replay's figures as a line of `--tune`'s text.
fn row(s: &mut String, label: &str, f: &Figures, mark: &str) {
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "  {label:<40} {:>12.0} USD {:>12.0} kgCO2 {:>8.2} h mean completion{}{mark}",
        f.usd,
        f.kg_co2,
        f.mean_completion_h,
        if f.unplaced > 0 { format!("  {} unplaced", f.unplaced) } else { String::new() }
    );
}

/// "; no job size more than 10 % later than `cost`" with a size guard, else "".
pub(crate) fn guard_note(goal: Goal, size_slack: Option<f64>) -> String {
    size_slack
        .map(|x| format!("; no job size more than {:.0} % later than `{}`", x * 100.0, goal.base()))
        .unwrap_or_default()
}

/// "  worst size 5-8 +12.0 %": the size class furthest behind `base`'s.
fn size_mark(f: &Figures, base: &Figures) -> String {
    f.worst_size_ratio(base).map(|(c, r)| format!("  worst size {c} {:+.1} %", (r - 1.0) * 100.0)).unwrap_or_default()
}

/// Replays of one part as lines, each against the goal's reference (the cost
/// policy, or greedy-spot) and marked where over `limit` (and, with a size
/// guard, where a size class is more than `size_slack` later than the built-in
/// policy's, which is in `figs`).
pub(crate) fn compared(s: &mut String, goal: Goal, figs: &[Figures], limit: f64, size_slack: Option<f64>) {
    let r = goal.reference();
    let reference = figs.iter().find(|c| c.name == r);
    let base = figs.iter().find(|c| c.name == goal.base());
    let guard = size_slack.zip(base).map(|(x, b)| (b, x));
    // The references set the limit; every other replay is held to it.
    let refs: Vec<String> = references(goal).iter().map(Strategy::name).collect();
    for f in figs {
        let mark = reference.filter(|_| f.name != r).map(|c| match goal {
            Goal::Green { .. } => format!(
                "  kgCO2 {:+.1} %, USD {:+.1} % vs {r}",
                (f.kg_co2 / c.kg_co2 - 1.0) * 100.0,
                (f.usd / c.usd - 1.0) * 100.0
            ),
            Goal::Cost => format!(
                "  USD {:+.1} %, mean completion {:+.2} h vs {r}",
                (f.usd / c.usd - 1.0) * 100.0,
                f.mean_completion_h - c.mean_completion_h
            ),
        });
        let over = if refs.contains(&f.name) || within(goal, f, limit, guard) { "" } else { "  (over the limit)" };
        let sizes = guard.filter(|(b, _)| b.name != f.name).map(|(b, _)| size_mark(f, b)).unwrap_or_default();
        row(s, &f.name, f, &(mark.unwrap_or_default() + &sizes + over));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> SimulateArgs {
        let argv = ["x", "--trace", "t", "--fleet", "f"].iter().chain(extra).map(|s| s.to_string());
        crate::cli::parse_from(argv).expect("flags parse")
    }

    #[test]
    fn the_cost_grid_tries_a_time_value_per_job_hour_and_green_keeps_its_own() {
        let cost = grid(Goal::Cost, &args(&[]), &Policy::cost());
        assert_eq!(cost.len(), COST_TIME_VALUES.len() * COST_JOB_TIME_VALUES.len() * 2);
        for (tv, job) in [(0.0, 0.0), (0.2, 40.0), (8.0, 3.0)] {
            for q in [true, false] {
                let w = Weights {
                    time_value_usd_per_gpu_hour: tv,
                    time_value_usd_per_job_hour: job,
                    carbon_usd_per_kg: 0.0,
                    spot_queue: q,
                };
                assert!(cost.contains(&w), "{w:?}");
            }
        }
        let base = Policy { time_value_usd_per_job_hour: 7.0, ..Policy::green() };
        let green = grid(Goal::Green { budget: 0.05 }, &args(&[]), &base);
        assert_eq!(green.len(), TIME_VALUES.len() * CARBON_PRICES.len());
        assert!(green.iter().all(|w| w.time_value_usd_per_job_hour == 7.0 && w.spot_queue));
        let set = grid(Goal::Green { budget: 0.05 }, &args(&["--tune-job-time-values", "0,5"]), &base);
        assert_eq!(set.len(), 2 * green.len());
        // the table written for metasched.toml carries both time values, and
        // the label names the per-job one only where it is set
        let w = set.iter().find(|w| w.time_value_usd_per_job_hour == 5.0).copied().expect("a per-job value of 5");
        let t = table("green", &base, w).expect("a table");
        let back = fleet_engine::policy::Policies::from_toml_str(&t).expect("the table parses");
        assert_eq!(back.get("green").cloned(), Some(Policy { name: "green".into(), ..w.apply(&base) }));
        assert!(
            w.label().starts_with(&format!("tv {} + 5/job carbon", w.time_value_usd_per_gpu_hour)),
            "{}",
            w.label()
        );
        let none = Weights { time_value_usd_per_job_hour: 0.0, ..w };
        assert!(!none.label().contains("/job"), "{}", none.label());
        let bad = goal(&args(&["--tune", "cost", "--tune-job-time-values", "1,-3"])).unwrap_err().to_string();
        assert!(bad.contains("--tune-job-time-values"), "{bad}");
    }

    /// Figures of a replay named `name`: USD, mean completion (h) and its jobs
    /// by size as (class, jobs, mean completion h).
    fn figs(name: &str, usd: f64, sizes: &[(&str, usize, f64)]) -> Figures {
        let jobs: usize = sizes.iter().map(|c| c.1).sum();
        let mean = sizes.iter().map(|c| c.1 as f64 * c.2).sum::<f64>() / jobs as f64;
        Figures {
            name: name.into(),
            usd,
            kg_co2: 0.0,
            mean_completion_h: mean,
            unplaced: 0,
            jobs,
            by_size: sizes
                .iter()
                .map(|&(gpus, jobs, h)| SizeFigures { gpus: gpus.into(), jobs, mean_completion_h: h })
                .collect(),
        }
    }

    #[test]
    fn a_size_guard_keeps_weights_from_buying_the_mean_with_large_jobs_waits() {
        let w = |job: f64| Weights {
            time_value_usd_per_gpu_hour: 2.0,
            time_value_usd_per_job_hour: job,
            carbon_usd_per_kg: 0.0,
            spot_queue: true,
        };
        let grid = [w(0.0), w(3.0)];
        // 900 one-GPU, 100 eight-GPU jobs and 5 of 16 GPUs. greedy-spot's mean
        // completion: (900 × 2 + 100 × 20 + 5 × 2) / 1005 = 3.79 h. Weights 0:
        // 3.29 h at 95 USD, its large jobs 20 % sooner than the built-in's.
        // Weights 1: (900 × 0.4 + 100 × 33 + 5 × 3) / 1005 = 3.66 h at 85 USD,
        // its 8-GPU jobs 10 % later than the built-in's, its 16-GPU ones 50 %
        // (too few to count).
        let part = || {
            vec![
                figs("greedy-spot", 100.0, &[("1", 900, 2.0), ("5-8", 100, 20.0), ("9-32", 5, 2.0)]),
                figs("greedy", 120.0, &[("1", 900, 1.5), ("5-8", 100, 25.0), ("9-32", 5, 2.0)]),
                figs("cost", 90.0, &[("1", 900, 1.0), ("5-8", 100, 30.0), ("9-32", 5, 2.0)]),
                figs("tune_0", 95.0, &[("1", 900, 1.0), ("5-8", 100, 24.0), ("9-32", 5, 2.0)]),
                figs("tune_1", 85.0, &[("1", 900, 0.4), ("5-8", 100, 33.0), ("9-32", 5, 3.0)]),
            ]
        };
        // Without the guard the built-in is no reference: drop it.
        let plain: Vec<Figures> = part().into_iter().filter(|f| f.name != "cost").collect();
        let t = decide(Goal::Cost, &grid, &[plain], 0.0, None).expect("decides");
        assert_eq!(t.chosen, Some(1), "the cheapest within the mean: {:?}", t.trials);
        // 10 % later than the built-in is within a slack of 0.1 (a class of
        // fewer than SIZE_GUARD_MIN_JOBS jobs, 9-32, is not held to it) ...
        let t = decide(Goal::Cost, &grid, &[part()], 0.0, Some(0.1)).expect("decides");
        assert_eq!(t.chosen, Some(1), "{:?}", t.trials);
        assert_eq!(t.reference.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["greedy-spot", "greedy", "cost"]);
        let (class, r) = t.trials[1].figures.worst_size_ratio(&t.reference[2]).expect("a ratio");
        assert_eq!(class, "5-8");
        assert!((r - 1.1).abs() < 1e-12, "{r}");
        // ... not within 0.05: the dearer weights are chosen
        let t = decide(Goal::Cost, &grid, &[part()], 0.0, Some(0.05)).expect("decides");
        assert_eq!((t.chosen, t.trials[1].within), (Some(0), false), "{:?}", t.trials);
        // Two folds: the classes of the merged figures are the job-weighted
        // means of the folds', and each fold is held to its own built-in.
        let mut second = part();
        second[4] = figs("tune_1", 85.0, &[("1", 900, 0.4), ("5-8", 105, 30.0), ("9-32", 5, 3.0)]);
        let t = decide(Goal::Cost, &grid, &[part(), second], 0.0, Some(0.1)).expect("decides");
        let merged = &t.trials[1].figures;
        let large = merged.by_size.iter().find(|c| c.gpus == "5-8").expect("5-8");
        assert_eq!(large.jobs, 205);
        assert!((large.mean_completion_h - (100.0 * 33.0 + 105.0 * 30.0) / 205.0).abs() < 1e-9, "{large:?}");
        assert_eq!(t.trials[1].folds_within, 2, "{:?}", t.trials[1]);
        // A bad slack: an error naming the flag.
        for flags in
            [vec!["--tune", "cost", "--tune-size-slack=-0.1"], vec!["--tune", "cost", "--tune-size-slack", "inf"]]
        {
            let e = goal(&args(&flags)).unwrap_err().to_string();
            assert!(e.contains("--tune-size-slack"), "{flags:?}: {e}");
        }
    }
}
