//! `--tune --tune-walk N`: the weights re-chosen period by period, each
//! period run with what the periods before it said (walk-forward).
//!
//! One split (`--tune`) says how weights chosen on the past hold on one
//! future. A planner who re-tunes every week wants to know what the whole
//! trace would have cost so run. This cuts the jobs into `N` consecutive
//! periods of as many jobs (by submission). The first period runs the
//! built-in weights; period `p` runs the weights chosen (as `--tune` chooses:
//! the best of the grid that keeps the limit on every fold) over the last
//! `--tune-folds` periods before it, each a fold replayed from an empty fleet.
//! Only jobs whose run could have ended by the period's start (submission plus
//! run time at reference speed) are tuned on: a longer one's run time is not
//! known yet then. Where no weights keep the limit the period keeps the
//! built-in ones. The whole trace is then replayed once, continuously, with
//! the policy switching at each period's first submission
//! (`SimConfig::switches`), beside the references and the built-in policy.

use anyhow::{bail, Context, Result};

use crate::cli::{replay, sim_config, sim_jobs, Loaded, SimulateArgs};
use crate::engine_model::EngineModel;
use crate::sim::{SimJob, Strategy};
use crate::tune::{compared, grid, grid_setup, limit, references, table, try_grid, Figures, Goal};

/// The weights one period ran with.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Weights {
    pub time_value_usd_per_gpu_hour: f64,
    pub carbon_usd_per_kg: f64,
    pub spot_queue: bool,
}

/// One period of the walk.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Period {
    /// Its first submission, hours after the trace's first.
    pub start_h: f64,
    pub jobs: usize,
    /// Jobs of the earlier periods its weights were chosen on.
    pub tuned_on_jobs: usize,
    /// The limit over those jobs (`None`: nothing to tune on).
    pub limit: Option<f64>,
    /// The weights chosen for it (`None`: the built-in ones).
    pub weights: Option<Weights>,
}

/// The outcome of `--tune-walk`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Walked {
    pub goal: Goal,
    /// Earlier periods each choice is made on (`--tune-folds`).
    pub folds: usize,
    pub periods: Vec<Period>,
    /// The weights chosen on the last periods, for the jobs to come.
    pub next: Period,
    /// Over the whole trace: the references, the built-in policy, and the walk
    /// (named `walk`).
    pub whole: Vec<Figures>,
    /// The limit over the whole trace, from its references.
    pub limit: f64,
    /// `next`'s weights as a `[policies.<name>]` table for metasched.toml.
    pub policy_toml: Option<String>,
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
    let grid = grid(goal, args, &base);
    let setup = grid_setup(loaded, &base, &grid)?;
    let cfg = sim_config(args, &model)?;
    let parts: Vec<&[SimJob]> = (0..n).map(|p| &jobs[p * jobs.len() / n..(p + 1) * jobs.len() / n]).collect();
    let t0 = jobs[0].submit_s;
    // Period p (p = n: the jobs to come, from the last submission on) and the
    // weights chosen for it.
    let choose = |p: usize| -> Result<(Period, Option<usize>)> {
        let (start_s, count) = match parts.get(p) {
            Some(part) => (part[0].submit_s, part.len()),
            None => (jobs[jobs.len() - 1].submit_s, 0),
        };
        let known: Vec<Vec<SimJob>> = parts[p.saturating_sub(folds)..p]
            .iter()
            .map(|part| part.iter().filter(|j| j.submit_s + j.duration_s <= start_s).cloned().collect::<Vec<_>>())
            .filter(|v| !v.is_empty())
            .collect();
        let mut period = Period {
            start_h: (start_s - t0) / 3600.0,
            jobs: count,
            tuned_on_jobs: known.iter().map(Vec::len).sum(),
            limit: None,
            weights: None,
        };
        if known.is_empty() {
            return Ok((period, None));
        }
        let fold_refs: Vec<&[SimJob]> = known.iter().map(Vec::as_slice).collect();
        let tried = try_grid(args, loaded, &setup, goal, &grid, &fold_refs, &cfg)?;
        period.limit = Some(tried.limit);
        period.weights = tried.chosen.map(|i| {
            let (tv, cp, q) = grid[i];
            Weights { time_value_usd_per_gpu_hour: tv, carbon_usd_per_kg: cp, spot_queue: q }
        });
        Ok((period, tried.chosen))
    };
    let mut periods = Vec::with_capacity(n);
    let mut switches = Vec::with_capacity(n - 1);
    for p in 0..n {
        let (period, chosen) = if p == 0 {
            let first = Period { start_h: 0.0, jobs: parts[0].len(), tuned_on_jobs: 0, limit: None, weights: None };
            (first, None)
        } else {
            choose(p)?
        };
        if p > 0 {
            let name = chosen.map_or_else(|| goal.base().to_string(), |i| format!("tune_{i}"));
            switches.push((parts[p][0].submit_s, name));
        }
        periods.push(period);
    }
    let (next, next_chosen) = choose(n)?;
    let mut whole_strategies = references(goal);
    whole_strategies.push(Strategy::Engine(goal.base().into()));
    let mut whole: Vec<Figures> =
        replay(args, loaded, &setup, &whole_strategies, &jobs, &cfg)?.iter().map(Figures::from).collect();
    let walk_cfg = crate::sim::SimConfig { switches, ..cfg.clone() };
    let walked = replay(args, loaded, &setup, &[Strategy::Engine(goal.base().into())], &jobs, &walk_cfg)?;
    let mut w = Figures::from(&walked[0]);
    w.name = "walk".into();
    whole.push(w);
    let limit = limit(goal, &whole)?;
    let policy_toml = next_chosen.map(|i| table(goal.base(), &base, grid[i])).transpose()?;
    Ok(Walked { goal, folds, periods, next, whole, limit, policy_toml })
}

impl Walked {
    /// The plain-text result (`fleet-sim --tune ... --tune-walk N`).
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let unit = match self.goal {
            Goal::Green { .. } => "USD",
            Goal::Cost => "h",
        };
        let _ = writeln!(
            s,
            "walking `{}` forward over {} periods: each runs the weights chosen on the {} period(s) before it",
            self.goal.base(),
            self.periods.len(),
            self.folds
        );
        let line = |s: &mut String, label: &str, p: &Period| {
            let w = match (&p.weights, p.limit) {
                (Some(w), _) => format!(
                    "tv {} carbon {} queue {}",
                    w.time_value_usd_per_gpu_hour, w.carbon_usd_per_kg, w.spot_queue
                ),
                (None, None) => "built-in (nothing to tune on)".into(),
                (None, Some(_)) => "built-in (no weights kept the limit)".into(),
            };
            let lim = p.limit.map(|l| format!(", limit {l:.3} {unit}")).unwrap_or_default();
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
        let _ = writeln!(s, "\nwhole trace (limit {:.3} {unit}):", self.limit);
        compared(&mut s, self.goal, &self.whole, self.limit);
        match &self.policy_toml {
            Some(t) => {
                let _ = writeln!(s, "\nweights for the jobs to come (for metasched.toml):\n{t}");
            }
            None => {
                let _ = writeln!(s, "\nno weights of the grid kept the limit on the last period(s)");
            }
        }
        s
    }
}
