//! `--tune --tune-walk N`: the weights re-chosen period by period, each
//! period run with what the periods before it said (walk-forward).
//!
//! One split (`--tune`) says how weights chosen on the past hold on one
//! future. A planner who re-tunes every week wants to know what the whole
//! trace would have cost so run. This cuts the jobs into `N` consecutive
//! periods of as many jobs (by submission). The first period runs the
//! built-in weights (or the policy named by `--tune-walk-start`, say weights
//! tuned before); period `p` runs the best weights of the grid that kept the
//! limit on each of the last `--tune-folds` periods before it (each a fold,
//! held to its own limit), as they stood at `p`'s start: every weight is
//! replayed over all the jobs submitted before `p`, continuously from the
//! trace's start, running the walk's own weights until the folds begin and
//! its weights from then on, each job cut off where `p` starts (what is known
//! of it then); the folds count only their jobs whose run could have ended by
//! `p`'s start (their run time is known), so each candidate meets the queues and
//! spot the walk left behind. Where no weights keep the limit the period runs
//! those nearest to it (the shortest mean completion for `cost`, the least USD
//! for `green`). The whole trace is then replayed once, continuously, with
//! the policy switching at each period's first submission
//! (`SimConfig::switches`), beside the references and the built-in policy.
//!
//! With `--tune-walk-carry` the limit is the whole trace's, not each period's:
//! how far the walk so far was ahead of the limit (or behind it) by `p`'s
//! start (`balance`, the walk's own weights replayed over the same prefix:
//! for `green` the USD left of the budget over what the cost policy would
//! have paid, every earlier job run until then; for `cost` the job-hours of
//! completion saved against greedy-spot on the earlier jobs whose run could
//! have ended by then) is spread over the jobs to come and added to each
//! fold's limit (a fold of `k` jobs gets `k / rest` of the USD; every job the
//! same share of the hours), so a period that spent less leaves the next
//! more, and one that spent more is made up.
//!
//! With `--tune-size-slack` the built-in policy is replayed over each prefix
//! beside the references, and a weight keeps a fold only if no job size there
//! completes more than the slack later than under it (`tune::decide`).

use anyhow::{bail, Context, Result};

use crate::cli::{replay, sim_config, sim_jobs, Loaded, SimulateArgs};
use crate::engine_model::EngineModel;
use crate::report::PolicyReport;
use crate::sim::{SimConfig, SimJob, Strategy};
use crate::tune::{
    compared, decide, grid, grid_setup, guard_note, held_to, limit, references, sizes_of, table, Figures, Goal, Trial,
    Weights,
};

/// One period of the walk.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Period {
    /// Its first submission, hours after the trace's first.
    pub start_h: f64,
    pub jobs: usize,
    /// Jobs of the earlier periods its weights were chosen on.
    pub tuned_on_jobs: usize,
    /// The limit over those jobs (`None`: nothing to tune on), with the
    /// balance carried in.
    pub limit: Option<f64>,
    /// With `--tune-walk-carry`: how far the walk's earlier periods were ahead
    /// of the limit (positive) or behind it by this period's start: USD left
    /// of the budget on what every earlier job paid until then (`green`),
    /// job-hours of completion on the jobs whose run could have ended
    /// (`cost`).
    pub carried: Option<f64>,
    /// The weights chosen for it (`None`: nothing to tune on, the walk's start
    /// policy).
    pub weights: Option<Weights>,
    /// `weights` kept the limit on every fold; where none did, the period runs
    /// the weights nearest to it (the shortest mean completion for `cost`, the
    /// least USD for `green`).
    pub kept_limit: bool,
    /// Its jobs' figures in the whole-trace replays: the references, the
    /// built-in policy and the walk (empty for the jobs to come).
    pub ran: Vec<Figures>,
}

/// The outcome of `--tune-walk`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Walked {
    pub goal: Goal,
    /// Earlier periods each choice is made on (`--tune-folds`).
    pub folds: usize,
    /// The policy run where there is nothing to tune on (`--tune-walk-start`).
    pub start: String,
    pub periods: Vec<Period>,
    /// The weights chosen on the last periods, for the jobs to come.
    pub next: Period,
    /// Over the whole trace: the references, the built-in policy, and the walk
    /// (named `walk`).
    pub whole: Vec<Figures>,
    /// The limit over the whole trace, from its references.
    pub limit: f64,
    /// `next`'s weights as a `[policies.<name>]` table for metasched.toml
    /// (`None`: no jobs to tune on).
    pub policy_toml: Option<String>,
    /// `--tune-size-slack`, as in `tune::Tuned::size_slack`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_slack: Option<f64>,
}

/// Walks `goal`'s weights forward over `loaded` in `n` periods (module docs).
pub fn walk(args: &SimulateArgs, loaded: &Loaded, goal: Goal, n: usize) -> Result<Walked> {
    let mut model = EngineModel::new(&loaded.setup, loaded.trace.epoch_unix as f64)?;
    let jobs = sim_jobs(&loaded.trace, &mut model, args)?;
    if n < 2 || n > jobs.len() {
        bail!("--tune-walk must be between 2 and the {} jobs, got {n}", jobs.len());
    }
    let folds = args.tune_folds;
    if folds == 0 || folds >= n {
        bail!("--tune-folds with --tune-walk {n} must be between 1 and {}, got {folds}", n - 1);
    }
    let base = model.policy(goal.base()).with_context(|| format!("no `{}` policy", goal.base()))?;
    // What runs until there is something to tune on.
    let start = args.tune_walk_start.clone().unwrap_or_else(|| goal.base().to_string());
    if model.policy(&start).is_none() {
        bail!("--tune-walk-start: no policy `{start}` (the engine's own, or one of --policies)");
    }
    let grid = grid(goal, args, &base);
    let setup = grid_setup(loaded, &base, &grid)?;
    let cfg = sim_config(args, &model)?;
    // Period p's jobs are jobs[bounds[p]..bounds[p + 1]].
    let bounds: Vec<usize> = (0..=n).map(|p| p * jobs.len() / n).collect();
    let t0 = jobs[0].submit_s;
    let guard = args.tune_size_slack;
    let refs = held_to(goal, guard);
    let candidates: Vec<Strategy> = (0..grid.len()).map(|i| Strategy::Engine(format!("tune_{i}"))).collect();
    // The walk's switches so far: (period's first submission, policy).
    let mut switches: Vec<(f64, String)> = Vec::with_capacity(n - 1);
    // The walk's policy from the trace's start: its start, then `switches`.
    let walking = |switches: &[(f64, String)]| [&[(t0, start.clone())][..], switches].concat();
    let mut periods = Vec::with_capacity(n);
    periods.push(Period { jobs: bounds[1], ..Period::default() });
    let mut next = None;
    for p in 1..=n {
        // Period n: the jobs to come, from the last submission on.
        let start_s = if p < n { jobs[bounds[p]].submit_s } else { jobs[jobs.len() - 1].submit_s };
        let from = p.saturating_sub(folds);
        // What is known at the period's start: the jobs submitted before it, each
        // run at most until then; the folds count only jobs whose run could have
        // ended by then (their run time is known).
        let prefix: Vec<SimJob> = jobs[..bounds[p]]
            .iter()
            .map(|j| SimJob { duration_s: j.duration_s.min((start_s - j.submit_s).max(1.0)), ..j.clone() })
            .collect();
        // A job whose run could have ended by then: its run time is known.
        let known = |j: &usize| jobs[*j].submit_s + jobs[*j].duration_s <= start_s;
        let fold_jobs: Vec<Vec<usize>> = (from..p)
            .map(|q| (bounds[q]..bounds[q + 1]).filter(known).collect())
            .filter(|v: &Vec<usize>| !v.is_empty())
            .collect();
        let mut period = Period {
            start_h: (start_s - t0) / 3600.0,
            jobs: if p < n { bounds[p + 1] - bounds[p] } else { 0 },
            tuned_on_jobs: fold_jobs.iter().map(Vec::len).sum(),
            ..Period::default()
        };
        let mut chosen = None;
        if !fold_jobs.is_empty() {
            // The references as they are; each candidate runs the walk's weights
            // until the folds begin and its own from then on.
            let per_job = SimConfig { per_job: true, ..cfg.clone() };
            let ref_runs = replay(args, loaded, &setup, &refs, &prefix, &per_job)?;
            let mut own: Vec<(f64, String)> = Vec::new();
            if from > 0 {
                own.extend(walking(&switches[..from - 1]));
                own.push((jobs[bounds[from]].submit_s, String::new()));
            }
            let cand_cfg = SimConfig { switches: own, ..per_job };
            let cand_runs = replay(args, loaded, &setup, &candidates, &prefix, &cand_cfg)?;
            let runs: Vec<Vec<Figures>> = fold_jobs
                .iter()
                .map(|idx| ref_runs.iter().chain(&cand_runs).map(|r| figures_of(r, idx)).collect())
                .collect();
            let mut carry = 0.0;
            if args.tune_walk_carry && p < n {
                // The walk so far over the same prefix, against the reference.
                let walked_cfg = SimConfig { switches: walking(&switches), ..cand_cfg.clone() };
                let walked =
                    replay(args, loaded, &setup, &[Strategy::Engine(goal.base().into())], &prefix, &walked_cfg)?;
                let reference = ref_runs.iter().find(|r| r.policy == goal.reference()).context("no reference")?;
                // What was paid so far is known for every job (each runs until
                // the period's start); a completion only where the run could
                // have ended.
                let ahead = match goal {
                    Goal::Green { .. } => balance(goal, reference, &walked[0], 0..bounds[p]),
                    Goal::Cost => balance(goal, reference, &walked[0], (0..bounds[p]).filter(known)),
                };
                // spread over the jobs to come
                carry = ahead / (jobs.len() - bounds[p]) as f64;
                period.carried = Some(ahead);
            }
            let tried = decide(goal, &grid, &runs, carry, guard)?;
            period.limit = Some(tried.limit);
            period.kept_limit = tried.chosen.is_some();
            chosen = tried.chosen.or_else(|| nearest(goal, &tried.trials));
            period.weights = chosen.map(|i| grid[i]);
        }
        if p < n {
            switches.push((start_s, chosen.map_or_else(|| start.clone(), |i| format!("tune_{i}"))));
            periods.push(period);
        } else {
            next = Some((period, chosen));
        }
    }
    let (next, next_chosen) = next.context("no period to come")?;
    let mut whole_strategies = references(goal);
    whole_strategies.push(Strategy::Engine(goal.base().into()));
    let per_job = SimConfig { per_job: true, ..cfg.clone() };
    let mut runs = replay(args, loaded, &setup, &whole_strategies, &jobs, &per_job)?;
    let walk_cfg = SimConfig { switches: walking(&switches), ..per_job };
    let mut walked = replay(args, loaded, &setup, &[Strategy::Engine(goal.base().into())], &jobs, &walk_cfg)?;
    walked[0].policy = "walk".into();
    runs.append(&mut walked);
    let whole: Vec<Figures> = runs.iter().map(Figures::from).collect();
    for (p, period) in periods.iter_mut().enumerate() {
        let idx: Vec<usize> = (bounds[p]..bounds[p + 1]).collect();
        period.ran = runs.iter().map(|r| figures_of(r, &idx)).collect();
    }
    let limit = limit(goal, &whole)?;
    let policy_toml = next_chosen.map(|i| table(goal.base(), &base, grid[i])).transpose()?;
    Ok(Walked { goal, folds, start, periods, next, whole, limit, policy_toml, size_slack: guard })
}

/// How the text marks weights run though none kept the limit.
const NEAREST: &str = " (none kept the limit: the nearest)";

impl Walked {
    /// The plain-text result (`fleet-sim --tune ... --tune-walk N`).
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let unit = self.goal.unit();
        let _ = writeln!(
            s,
            "walking `{}` forward over {} periods: each runs the weights chosen on the {} period(s) before it",
            self.goal.base(),
            self.periods.len(),
            self.folds
        );
        let line = |s: &mut String, label: &str, p: &Period| {
            let w = match &p.weights {
                Some(w) => format!("{}{}", w.label(), if p.kept_limit { "" } else { NEAREST }),
                None => format!("`{}` (nothing to tune on)", self.start),
            };
            let carried = match (p.carried, self.goal) {
                (Some(c), Goal::Green { .. }) => format!(" (carried {c:+.2} USD)"),
                (Some(c), Goal::Cost) => format!(" (carried {c:+.1} job-h)"),
                (None, _) => String::new(),
            };
            let lim = p.limit.map(|l| format!(", limit {l:.3} {unit}{carried}")).unwrap_or_default();
            let _ = writeln!(
                s,
                "  {label:<8} from {:>8.1} h  {:>6} jobs  tuned on {:>6} jobs{lim}: {w}",
                p.start_h, p.jobs, p.tuned_on_jobs
            );
        };
        for (i, p) in self.periods.iter().enumerate() {
            line(&mut s, &format!("period {i}"), p);
        }
        line(&mut s, "next", &self.next);
        let _ =
            writeln!(s, "\neach period's jobs in the whole-trace replay, the walk against {}:", self.goal.reference());
        for (i, p) in self.periods.iter().enumerate() {
            let (Some(r), Some(w)) =
                (p.ran.iter().find(|f| f.name == self.goal.reference()), p.ran.iter().find(|f| f.name == "walk"))
            else {
                continue;
            };
            let _ = writeln!(
                s,
                "  period {i:<3} USD {:+6.1} %  kgCO2 {:+6.1} %  mean completion {:6.2} h against {:6.2} h",
                (w.usd / r.usd - 1.0) * 100.0,
                (w.kg_co2 / r.kg_co2 - 1.0) * 100.0,
                w.mean_completion_h,
                r.mean_completion_h
            );
        }
        let guard = guard_note(self.goal, self.size_slack);
        let _ = writeln!(s, "\nwhole trace (limit {:.3} {unit}{guard}):", self.limit);
        compared(&mut s, self.goal, &self.whole, self.limit, self.size_slack);
        match &self.policy_toml {
            Some(t) => {
                let nearest = if self.next.kept_limit { "" } else { NEAREST };
                let _ = writeln!(s, "\nweights for the jobs to come{nearest} (for metasched.toml):\n{t}");
            }
            None => {
                let _ = writeln!(s, "\nno jobs of the last period(s) to tune on");
            }
        }
        s
    }
}

/// The trial nearest to the goal's limit: the shortest mean completion
/// (`cost`), the least USD (`green`); among those placing every job if any do.
fn nearest(goal: Goal, trials: &[Trial]) -> Option<usize> {
    let key = |t: &Trial| {
        let f = &t.figures;
        let v = match goal {
            Goal::Green { .. } => f.usd,
            Goal::Cost => f.mean_completion_h,
        };
        (f.unplaced, v)
    };
    (0..trials.len()).min_by(|&a, &b| {
        let (ka, kb) = (key(&trials[a]), key(&trials[b]));
        ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(a.cmp(&b))
    })
}

/// How far `walked` was ahead of the goal's limit over the jobs `idx` (needs
/// `SimConfig::per_job`): USD left of the budget over `reference` (the cost
/// policy) for `green`, job-hours of completion saved against `reference`
/// (greedy-spot) for `cost`, over the jobs both completed.
fn balance(goal: Goal, reference: &PolicyReport, walked: &PolicyReport, idx: impl Iterator<Item = usize>) -> f64 {
    idx.map(|j| {
        let (r, w) = (&reference.per_job[j], &walked.per_job[j]);
        match goal {
            Goal::Green { budget } => (1.0 + budget) * r.usd - w.usd,
            Goal::Cost => match (r.completion_s, w.completion_s) {
                (Some(a), Some(b)) => (a - b) / 3600.0,
                _ => 0.0,
            },
        }
    })
    .sum()
}

/// `r`'s figures over the jobs `idx` (needs `SimConfig::per_job`).
fn figures_of(r: &PolicyReport, idx: &[usize]) -> Figures {
    let done: Vec<f64> = idx.iter().filter_map(|&j| r.per_job[j].completion_s).collect();
    let sized: Vec<(u32, f64)> =
        idx.iter().filter_map(|&j| r.per_job[j].completion_s.map(|c| (r.per_job[j].gpus, c / 3600.0))).collect();
    Figures {
        name: r.policy.clone(),
        usd: idx.iter().map(|&j| r.per_job[j].usd).sum(),
        kg_co2: idx.iter().map(|&j| r.per_job[j].kg_co2).sum(),
        mean_completion_h: done.iter().sum::<f64>() / done.len().max(1) as f64 / 3600.0,
        unplaced: idx.len() - done.len(),
        jobs: idx.len(),
        by_size: sizes_of(&sized),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::JobFigures;

    fn run(jobs: &[(f64, Option<f64>)]) -> PolicyReport {
        let per_job =
            jobs.iter().map(|&(usd, completion_s)| JobFigures { usd, kg_co2: 0.0, completion_s, gpus: 1 }).collect();
        PolicyReport { per_job, ..PolicyReport::default() }
    }

    /// The balance counts only the jobs asked for: for `cost` the hours of
    /// completion saved on jobs both replays completed (a job the walk left
    /// unfinished counts nothing), for `green` the budget left over the cost
    /// policy's USD.
    #[test]
    fn the_balance_is_what_the_walk_was_ahead_of_the_limit() {
        let reference = run(&[(10.0, Some(3600.0)), (20.0, Some(7200.0)), (5.0, Some(60.0)), (1.0, None)]);
        let walked = run(&[(10.0, Some(1800.0)), (22.0, Some(10800.0)), (5.0, None), (1.0, Some(60.0))]);
        let cost = balance(Goal::Cost, &reference, &walked, 0..4);
        assert!((cost - (0.5 - 1.0)).abs() < 1e-12, "{cost}");
        assert!((balance(Goal::Cost, &reference, &walked, [0].into_iter()) - 0.5).abs() < 1e-12);
        let green = balance(Goal::Green { budget: 0.05 }, &reference, &walked, 0..2);
        assert!((green - (0.5 + (21.0 - 22.0))).abs() < 1e-12, "{green}");
    }

    /// A period's figures keep its completed jobs by size, for
    /// `--tune-size-slack`: jobs 0–3 of 1, 1, 8 and 16 GPUs, the third unfinished.
    #[test]
    fn a_periods_figures_keep_its_jobs_by_size() {
        let mut r = run(&[(1.0, Some(3600.0)), (1.0, Some(10800.0)), (8.0, None), (16.0, Some(36000.0))]);
        for (j, g) in [1, 1, 8, 16].into_iter().enumerate() {
            r.per_job[j].gpus = g;
        }
        let f = figures_of(&r, &[0, 1, 2, 3]);
        let sizes: Vec<(&str, usize, f64)> =
            f.by_size.iter().map(|c| (c.gpus.as_str(), c.jobs, c.mean_completion_h)).collect();
        assert_eq!(sizes, [("1", 2, 2.0), ("9-32", 1, 10.0)]);
        assert_eq!((f.jobs, f.unplaced), (4, 1));
        assert!((f.mean_completion_h - 14.0 / 3.0).abs() < 1e-12, "{f:?}");
        assert_eq!(figures_of(&r, &[2]).by_size, []);
    }
}
