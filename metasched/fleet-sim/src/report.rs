//! The simulation report: per-policy figures, a text table, JSON and SVG plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// One job's figures in a replay.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobFigures {
    /// Compute and egress charged to it.
    pub usd: f64,
    pub kg_co2: f64,
    /// From its submission to its end (`None`: it never ran to its end).
    pub completion_s: Option<f64>,
    /// GPUs it asked for.
    pub gpus: u32,
}

/// Figures of one policy (or baseline) over one trace.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PolicyReport {
    pub policy: String,
    /// Each job's figures, in job order (only with `SimConfig::per_job`; not in
    /// the report's JSON).
    #[serde(skip)]
    pub per_job: Vec<JobFigures>,
    pub jobs: usize,
    pub completed: usize,
    /// Jobs no cluster could ever run (hard constraints or larger than any cluster).
    pub unplaced: usize,
    pub total_usd: f64,
    pub compute_usd: f64,
    pub egress_usd: f64,
    /// Part of `compute_usd` billed while jobs held GPUs for setup (cloud
    /// provisioning, checkpoint restore) instead of working.
    pub setup_usd: f64,
    /// Part of `compute_usd` paid for work thrown away at evictions (spot
    /// reclaims, outages, migrations) and done again: the rework.
    pub rework_usd: f64,
    /// USD per GPU-hour of useful work (trace GPU-hours of completed jobs).
    pub usd_per_gpu_hour: f64,
    pub useful_gpu_hours: f64,
    pub kg_co2: f64,
    /// GPU-hours of work thrown away by preemptions, outages and migrations.
    pub lost_gpu_hours: f64,
    pub preemptions: u64,
    /// Most spot reclaims any one job went through (absent when none).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub max_reclaims_per_job: usize,
    pub outage_kills: u64,
    pub migrations: u64,
    /// Jobs that ran away from their home cluster.
    pub moved_jobs: usize,
    pub wait_mean_s: f64,
    pub wait_p95_s: f64,
    pub completion_mean_s: f64,
    pub completion_p95_s: f64,
    /// Time-averaged busy GPUs / capacity, over the simulated span.
    pub utilization: BTreeMap<String, f64>,
    /// total_usd / this policy's bound: the highest of the report's bound
    /// (`Report::bound_used`), `own_lp_bound_usd` and `own_completion_lp_usd`.
    pub ratio_to_lower_bound: f64,
    /// The LP bound solved with this policy's own last job end as the horizon
    /// (valid for this policy alone; tighter than the report's when it ends
    /// earlier than the slowest policy). `None` when not solved. Certified
    /// (`fleet_sim::certify`) when above the report's bound; at or below it,
    /// the solver's point (which cannot raise the ratio: the LP's optimum is
    /// at most any point's cost).
    #[serde(default)]
    pub own_lp_bound_usd: Option<f64>,
    /// The least cost of any schedule that ends by this policy's last job end with
    /// a mean completion no worse than this policy's (`crate::lp::capped_bound`):
    /// a bound for this policy alone, used in its ratio when higher. Solved for
    /// the `cost` policy only (the issue's target); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_completion_lp_usd: Option<f64>,
    /// Latest job end (s since the first submission).
    pub makespan_s: f64,
    /// USD (compute + egress) per team of the trace.
    pub cost_by_team: BTreeMap<String, f64>,
    /// Owned hardware's amortized cost over the run (all its GPUs × makespan ×
    /// amortized price), paid whether used or not; `total_usd` counts only the used part.
    pub owned_fixed_usd: f64,
    /// Share of owned GPU-hours over the run that no job paid for.
    pub owned_idle_share: f64,
    /// The part of `total_usd` paid for owned hardware (its busy GPU-hours, each
    /// pool at its own amortized price); the rest is cloud compute and egress.
    pub owned_used_usd: f64,
    /// Of `owned_used_usd`, what running the owned GPUs cost over those busy
    /// hours (each pool at the fleet file's `running` price); given when every
    /// owned pool of the fleet has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_running_usd: Option<f64>,
    /// What the policy adds to the bill, owned hardware being paid for either
    /// way: `total_usd − owned_used_usd + owned_running_usd` (cloud compute,
    /// egress, the owned GPUs' running cost). With `owned_running_usd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cash_usd: Option<f64>,
    /// Cumulative USD sampled at each plot bucket (hours since the epoch, USD).
    pub cost_series: Vec<(f64, f64)>,
    /// Per cluster: busy fraction per plot bucket.
    pub util_series: BTreeMap<String, Vec<f64>>,
    pub bucket_hours: f64,
    /// Compute spend by `cluster/pool pricing` (pricing: `spot` or `std` = on-demand /
    /// on-prem): GPU-hours paid (lost work included) and USD.
    pub spend: BTreeMap<String, Spend>,
    /// Jobs held back for cleaner hours (`sim::CarbonHold`) and their hours of hold
    /// (absent when none, so policies that never hold report as before).
    #[serde(skip_serializing_if = "is_zero_usize")]
    pub held_jobs: usize,
    #[serde(skip_serializing_if = "is_zero_f64")]
    pub held_hours: f64,
    /// The engine's estimates at each job's first placement against what the
    /// replay then did, per pricing of that placement and for all jobs (engine
    /// policies only; absent for the baselines, which do not use them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub estimates: Vec<EstimateCheck>,
    /// The completed jobs by GPUs asked for ([`SIZE_CLASSES`]; classes without
    /// jobs left out): how a policy's waits fall on small and large jobs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_size: Vec<SizeClass>,
}

/// The job sizes of [`PolicyReport::by_size`]: (label, least GPUs, most GPUs).
pub const SIZE_CLASSES: [(&str, u32, u32); 5] =
    [("1", 1, 1), ("2-4", 2, 4), ("5-8", 5, 8), ("9-32", 9, 32), ("33+", 33, u32::MAX)];

/// The completed jobs of one size class in a replay.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SizeClass {
    /// GPUs asked for, as in [`SIZE_CLASSES`].
    pub gpus: String,
    pub jobs: usize,
    /// Their GPU-hours of work (the trace's, at reference speed).
    pub gpu_hours: f64,
    /// Compute and egress charged to them.
    pub usd: f64,
    pub wait_mean_s: f64,
    pub completion_mean_s: f64,
    pub completion_p95_s: f64,
}

/// Which of [`SIZE_CLASSES`] a job of `gpus` GPUs is in (`None` for 0).
pub fn size_class(gpus: u32) -> Option<usize> {
    SIZE_CLASSES.iter().position(|&(_, lo, hi)| (lo..=hi).contains(&gpus))
}

/// `items` by the size class of `gpus(item)`, in [`SIZE_CLASSES`] order, each
/// class in the items' order (so sums over a class add up as before).
pub fn by_size_class<T>(items: &[T], gpus: impl Fn(&T) -> u32) -> [Vec<&T>; SIZE_CLASSES.len()] {
    let mut classes: [Vec<&T>; SIZE_CLASSES.len()] = Default::default();
    for item in items {
        if let Some(c) = size_class(gpus(item)) {
            classes[c].push(item);
        }
    }
    classes
}

impl SizeClass {
    /// The classes of completed jobs given as (GPUs, work GPU-hours, USD, wait
    /// s, completion s), in [`SIZE_CLASSES`] order, empty ones left out.
    pub fn of(jobs: &[(u32, f64, f64, f64, f64)]) -> Vec<SizeClass> {
        by_size_class(jobs, |j| j.0)
            .into_iter()
            .zip(SIZE_CLASSES)
            .filter_map(|(mine, (label, _, _))| {
                if mine.is_empty() {
                    return None;
                }
                let waits: Vec<f64> = mine.iter().map(|j| j.3).collect();
                let compl: Vec<f64> = mine.iter().map(|j| j.4).collect();
                Some(SizeClass {
                    gpus: label.to_string(),
                    jobs: mine.len(),
                    gpu_hours: mine.iter().map(|j| j.1).sum(),
                    usd: mine.iter().map(|j| j.2).sum(),
                    wait_mean_s: mean(&waits),
                    completion_mean_s: mean(&compl),
                    completion_p95_s: percentile(&compl, 95.0),
                })
            })
            .collect()
    }
}

/// How well the engine's expectations at a job's first placement held in the
/// replay, over the completed jobs first placed one way (`class`: `on-prem`, `on
/// demand`, `spot`, or `all`). Times in seconds from each job's submission.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct EstimateCheck {
    pub class: String,
    pub jobs: usize,
    /// Mean expected first wait (queue, remote submission, staging, carbon hold)
    /// and the mean realized one (submission → first start).
    pub expected_wait_mean_s: f64,
    pub wait_mean_s: f64,
    /// Mean expected completion (the wait, setups, the run at the pool's speed,
    /// the work lost at spot reclaims and the waits for spot again) and the mean
    /// realized one (submission → end).
    pub expected_completion_mean_s: f64,
    pub completion_mean_s: f64,
    /// Mean of |realized − expected completion| over the jobs.
    pub completion_abs_error_mean_s: f64,
    /// Share of the jobs whose realized completion is within 25 % of the expected.
    pub within_25pct: f64,
}

fn is_zero_usize(x: &usize) -> bool {
    *x == 0
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

/// GPU-hours paid and USD spent on one pool with one pricing, and the GPU-hours of
/// that work thrown away by evictions (preemptions, outages, migrations).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Spend {
    pub gpu_hours: f64,
    pub usd: f64,
    pub lost_gpu_hours: f64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    pub trace: String,
    pub fleet: String,
    pub seed: u64,
    pub jobs: usize,
    pub span_hours: f64,
    /// Each job at its cheapest feasible price, capacity relaxed, no waiting, no egress.
    pub lower_bound_usd: f64,
    pub lower_bound_kg_co2: f64,
    /// The time-indexed LP relaxation bound (`crate::lp`), when it was solved.
    pub lp_bound: Option<crate::lp::LpBound>,
    /// The carbon LP (`crate::lp::carbon_bound`): the least kgCO2 of any schedule
    /// that finishes by the LP's horizon and costs at most 1.05 × the cost
    /// policy's USD; `None` when not solved (no cost policy, `--lp-max-vars 0`).
    pub carbon_lp: Option<crate::lp::CarbonBound>,
    /// The least cost of any schedule done by the LP's horizon with a mean
    /// completion no worse than greedy-spot's (`crate::lp::capped_bound`); above
    /// greedy-spot's USD it proves "cost ahead of greedy-spot at no worse mean
    /// completion" unreachable.
    pub completion_lp: Option<crate::lp::CappedBound>,
    /// The least cost of any schedule done by the LP's horizon emitting at most
    /// 0.8 × the cost policy's kgCO2; above 1.05 × the cost policy's USD it proves
    /// the green target unreachable (the same proof as `carbon_lp`, seen from cost).
    pub carbon_cap_lp: Option<crate::lp::CappedBound>,
    /// `--bound-completion-h`: the least cost at each mean completion asked for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bound_checks: Vec<crate::lp::CappedBound>,
    /// Which bound the ratios and gaps use: `lp` or `cheap` (and why).
    pub bound_used: String,
    pub policies: Vec<PolicyReport>,
    pub targets: Vec<TargetCheck>,
    pub notes: Vec<String>,
}

/// One of the issue's acceptance targets, evaluated on this run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TargetCheck {
    pub target: String,
    pub value: f64,
    pub threshold: f64,
    pub met: bool,
    /// When missed: the bound's inequality that makes the target unreachable for
    /// every schedule finishing by the LP horizon (`None`: not proven).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
}

/// The lines of an LP's spend above 0.5 % of its USD, dearest first.
fn spend_cells(spend: &BTreeMap<String, (f64, f64)>, usd: f64) -> String {
    let mut v: Vec<(&String, &(f64, f64))> = spend.iter().collect();
    v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1).then(a.0.cmp(b.0)));
    let cells: Vec<String> =
        v.iter().filter(|(_, x)| x.1 >= 0.005 * usd).map(|(k, x)| format!("{k} {:.0}/{:.0}", x.0, x.1)).collect();
    cells.join(", ")
}

/// Percentile (nearest-rank) of an unsorted sample; 0 for an empty one.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

impl Report {
    fn find(&self, name: &str) -> Option<&PolicyReport> {
        self.policies.iter().find(|p| p.policy == name)
    }

    /// Evaluate the issue's targets where the needed policies are present.
    /// The bound the ratios use: the LP bound when solved and higher, else the cheap one.
    pub fn bound_usd(&self) -> f64 {
        self.lp_bound.as_ref().map(|b| b.usd).unwrap_or(0.0).max(self.lower_bound_usd)
    }

    pub fn evaluate_targets(&mut self) {
        let mut t = Vec::new();
        let saving = |a: &PolicyReport, b: &PolicyReport| {
            if b.total_usd > 0.0 {
                1.0 - a.total_usd / b.total_usd
            } else {
                0.0
            }
        };
        let bound = self.bound_usd();
        let horizon_h = self.lp_bound.as_ref().map(|b| b.horizon_hours).unwrap_or(0.0);
        if let Some(cost) = self.find("cost") {
            if let Some(home) = self.find("home-only") {
                let s = saving(cost, home);
                t.push(TargetCheck {
                    target: "cost vs home-only: saving".into(),
                    value: s,
                    threshold: 0.40,
                    met: s >= 0.40,
                    unreachable: None,
                });
                let worse = if home.completion_mean_s > 0.0 {
                    cost.completion_mean_s / home.completion_mean_s - 1.0
                } else {
                    0.0
                };
                t.push(TargetCheck {
                    target: "cost vs home-only: mean completion worse by".into(),
                    value: worse,
                    threshold: 0.10,
                    met: worse <= 0.10,
                    unreachable: None,
                });
            }
            if let Some(greedy) = self.find("greedy") {
                let s = saving(cost, greedy);
                let goal = 0.85 * greedy.total_usd;
                t.push(TargetCheck {
                    target: "cost vs greedy: saving".into(),
                    value: s,
                    threshold: 0.15,
                    met: s >= 0.15,
                    unreachable: (s < 0.15 && bound > goal).then(|| {
                        format!(
                            "bound {bound:.0} > 0.85 × greedy {:.0} = {goal:.0}: no schedule done by {horizon_h:.0} h costs that little",
                            greedy.total_usd
                        )
                    }),
                });
            }
            // Issue 9: ahead of greedy-with-spot at no worse mean completion.
            if let Some(gs) = self.find("greedy-spot") {
                let s = saving(cost, gs);
                let worse =
                    if gs.completion_mean_s > 0.0 { cost.completion_mean_s / gs.completion_mean_s - 1.0 } else { 0.0 };
                // The pair is out of reach when the least cost of any schedule as
                // fast as greedy-spot on average is at least greedy-spot's.
                let pair = self.completion_lp.as_ref().and_then(|c| {
                    let h = c.caps.mean_completion_h?;
                    match c.usd {
                        Some(u) if u >= gs.total_usd => Some(format!(
                            "completion LP: every schedule done by {:.0} h with mean completion ≤ greedy-spot's {h:.2} h costs ≥ {u:.0} ≥ greedy-spot's {:.0} USD",
                            c.horizon_hours, gs.total_usd
                        )),
                        None => Some(format!(
                            "completion LP: no schedule done by {:.0} h has a mean completion ≤ {h:.2} h",
                            c.horizon_hours
                        )),
                        _ => None,
                    }
                });
                let missed = s <= 0.0 || worse > 0.0;
                t.push(TargetCheck {
                    target: "cost vs greedy-spot: saving".into(),
                    value: s,
                    threshold: 0.0,
                    met: s > 0.0,
                    unreachable: (s <= 0.0 && bound >= gs.total_usd)
                        .then(|| {
                            format!(
                                "bound {bound:.0} ≥ greedy-spot {:.0}: nothing done by {horizon_h:.0} h is cheaper",
                                gs.total_usd
                            )
                        })
                        .or_else(|| pair.clone().filter(|_| s <= 0.0)),
                });
                t.push(TargetCheck {
                    target: "cost vs greedy-spot: mean completion worse by".into(),
                    value: worse,
                    threshold: 0.0,
                    met: worse <= 0.0,
                    unreachable: pair.filter(|_| missed && worse > 0.0),
                });
            }
            let r = cost.ratio_to_lower_bound;
            t.push(TargetCheck {
                target: format!("cost / lower bound ({}) - 1", self.bound_used),
                value: r - 1.0,
                threshold: 0.10,
                met: r - 1.0 <= 0.10,
                unreachable: None,
            });
            if let Some(green) = self.find("green") {
                let cut = if cost.kg_co2 > 0.0 { 1.0 - green.kg_co2 / cost.kg_co2 } else { 0.0 };
                let more = if cost.total_usd > 0.0 { green.total_usd / cost.total_usd - 1.0 } else { 0.0 };
                let goal = 0.8 * cost.kg_co2;
                t.push(TargetCheck {
                    target: "green vs cost: kgCO2 cut".into(),
                    value: cut,
                    threshold: 0.20,
                    met: cut >= 0.20,
                    unreachable: None,
                });
                t.push(TargetCheck {
                    target: "green vs cost: extra cost".into(),
                    value: more,
                    threshold: 0.05,
                    met: more <= 0.05,
                    unreachable: None,
                });
                // The target is the pair: −20 % kgCO2 for at most +5 % USD.
                let both = cut >= 0.20 && more <= 0.05;
                t.push(TargetCheck {
                    target: "green: kgCO2 cut at <= +5 % USD".into(),
                    value: if more <= 0.05 { cut } else { 0.0 },
                    threshold: 0.20,
                    met: both,
                    unreachable: self
                        .carbon_lp
                        .as_ref()
                        .filter(|c| !both && c.kg_co2 > goal)
                        .map(|c| {
                            format!(
                                "carbon LP: every schedule done by {:.0} h costing ≤ {:.0} USD (1.05 × cost) emits ≥ {:.0} kg > 0.8 × cost's {:.0} = {goal:.0} kg (best cut {:.1}%)",
                                c.horizon_hours,
                                c.usd_cap,
                                c.kg_co2,
                                cost.kg_co2,
                                100.0 * (1.0 - c.kg_co2 / cost.kg_co2)
                            )
                        })
                        .or_else(|| {
                            let c = self.carbon_cap_lp.as_ref().filter(|_| !both)?;
                            let limit = 1.05 * cost.total_usd;
                            match c.usd {
                                Some(u) if u > limit => Some(format!(
                                    "carbon-capped LP: every schedule done by {:.0} h emitting ≤ {goal:.0} kg (0.8 × cost) costs ≥ {u:.0} > 1.05 × cost's {:.0} = {limit:.0} USD",
                                    c.horizon_hours, cost.total_usd
                                )),
                                None => Some(format!(
                                    "carbon-capped LP: no schedule done by {:.0} h emits ≤ {goal:.0} kg",
                                    c.horizon_hours
                                )),
                                _ => None,
                            }
                        }),
                });
            }
        }
        self.targets = t;
    }

    /// One page for a capacity planner (Markdown, `summary.md`): what each way of
    /// placing the trace's jobs costs and how fast it is, what the engine's `cost`
    /// policy saves against the baselines and how far it is from the bound, where
    /// its money goes, the targets, and how far its estimates held in the replay.
    /// The full table and `report.json` carry everything else.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let pct = |a: f64, b: f64| if b > 0.0 { format!("{:+.1} %", 100.0 * (a / b - 1.0)) } else { "-".into() };
        let h = |secs: f64| format!("{:.2} h", secs / 3600.0);
        let _ = writeln!(s, "# Simulation summary: {} on {}\n", self.trace, self.fleet);
        let _ = writeln!(
            s,
            "{} jobs submitted over {:.0} h (seed {}). Bound: {} = {:.0} USD, below what any schedule could pay (the ratios use it){}.\n",
            self.jobs,
            self.span_hours,
            self.seed,
            self.bound_used,
            self.bound_usd(),
            match &self.lp_bound {
                Some(lp) if self.bound_used == "lp" && lp.is_certified() => {
                    "; proven from the LP's dual, not taken on the solver's word".to_string()
                }
                Some(lp) if self.bound_used == "lp" => format!("; {}", lp.certificate),
                _ => String::new(),
            }
        );
        let home = self.find("home-only");
        let greedy = self.find("greedy");
        let _ = writeln!(s, "## Each way of placing the jobs\n");
        let _ = writeln!(
            s,
            "| policy | USD | vs home-only | vs greedy | mean completion | p95 completion | kgCO2 | ÷ bound | not placed |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for p in &self.policies {
            let _ = writeln!(
                s,
                "| {} | {:.0} | {} | {} | {} | {} | {:.0} | {:.3} | {} |",
                p.policy,
                p.total_usd,
                home.map_or("-".into(), |b| pct(p.total_usd, b.total_usd)),
                greedy.map_or("-".into(), |b| pct(p.total_usd, b.total_usd)),
                h(p.completion_mean_s),
                h(p.completion_p95_s),
                p.kg_co2,
                p.ratio_to_lower_bound,
                p.unplaced
            );
        }
        let _ = writeln!(
            s,
            "\nhome-only: every job at its team's declared home (today); greedy: cheapest on demand at submission; \
             greedy-spot: the same with spot and relaunch (managed-spot tools); first-start: sibling submission; \
             cost, time, green: Fleet's engine policies.\n"
        );
        let short: Vec<String> = self
            .policies
            .iter()
            .filter(|p| p.unplaced > 0)
            .map(|p| format!("{} ({} jobs)", p.policy, p.unplaced))
            .collect();
        if !short.is_empty() {
            let _ = writeln!(
                s,
                "Not placed: {}. Those jobs could run nowhere that policy may use; they cost it nothing, so its \
                 USD and completion cover fewer jobs than the others'.\n",
                short.join(", ")
            );
        }
        if let Some(c) = self.find("cost") {
            let _ = writeln!(s, "## The `cost` policy\n");
            let vs = |name: &str| {
                self.find(name).map(|b| {
                    let unplaced = if b.unplaced > 0 {
                        format!(", which could not place {} of the {} jobs", b.unplaced, b.jobs)
                    } else {
                        String::new()
                    };
                    format!(
                        "{} than {name} ({:.0} USD, {}{unplaced})",
                        if c.total_usd <= b.total_usd {
                            format!("{:.1} % cheaper", 100.0 * (1.0 - c.total_usd / b.total_usd.max(1e-9)))
                        } else {
                            format!("{:.1} % dearer", 100.0 * (c.total_usd / b.total_usd.max(1e-9) - 1.0))
                        },
                        b.total_usd,
                        h(b.completion_mean_s)
                    )
                })
            };
            let against: Vec<String> = ["home-only", "greedy", "greedy-spot"].iter().filter_map(|n| vs(n)).collect();
            let _ = writeln!(s, "- Pays {:.0} USD at a mean completion of {}.", c.total_usd, h(c.completion_mean_s));
            if !against.is_empty() {
                let _ = writeln!(s, "- {}.", against.join("; "));
            }
            let _ = writeln!(
                s,
                "- {:.1} % above the bound: no schedule of these jobs on this fleet costs less than {:.0} USD.",
                100.0 * (c.ratio_to_lower_bound - 1.0),
                c.total_usd / c.ratio_to_lower_bound.max(1e-9)
            );
            let mut v: Vec<(&String, &Spend)> = c.spend.iter().collect();
            v.sort_by(|a, b| b.1.usd.total_cmp(&a.1.usd).then(a.0.cmp(b.0)));
            let compute: f64 = v.iter().map(|x| x.1.usd).sum::<f64>().max(1e-9);
            let top: Vec<String> = v
                .iter()
                .take(4)
                .map(|(k, x)| format!("{k} {:.0} USD ({:.0} %)", x.usd, 100.0 * x.usd / compute))
                .collect();
            let _ = writeln!(s, "- Compute by pool: {}; egress {:.0} USD.", top.join(", "), c.egress_usd);
            if c.owned_fixed_usd > 0.0 {
                let _ = writeln!(
                    s,
                    "- Owned hardware: {:.0} USD amortized over the run whether used or not, {:.0} % of its GPU-hours idle; \
                     cloud and egress {:.0} USD.",
                    c.owned_fixed_usd,
                    100.0 * c.owned_idle_share,
                    c.total_usd - c.owned_used_usd
                );
                if let (Some(run), Some(cash)) = (c.owned_running_usd, c.cash_usd) {
                    let _ = writeln!(
                        s,
                        "- Cash: {cash:.0} USD added to the bill (cloud, egress and {run:.0} USD of running the owned GPUs, \
                         at the fleet's `running` prices); the rest of the owned hardware's price is paid either way."
                    );
                }
            }
            if c.lost_gpu_hours > 0.0 || c.migrations > 0 {
                let _ = writeln!(
                    s,
                    "- {} spot reclaims and outage kills, {:.0} GPU-hours of work lost and redone, {} migrations.",
                    c.preemptions + c.outage_kills,
                    c.lost_gpu_hours,
                    c.migrations
                );
            }
            if let Some(all) = c.estimates.iter().find(|e| e.class == "all") {
                let _ = writeln!(s, "\n## How far the engine's estimates held\n");
                let _ = writeln!(
                    s,
                    "At each job's first placement the engine expected a mean completion of {}; the replay gave {} ({}); \
                     per job off by {} on average, {:.0} % within 25 %.",
                    h(all.expected_completion_mean_s),
                    h(all.completion_mean_s),
                    pct(all.completion_mean_s, all.expected_completion_mean_s),
                    h(all.completion_abs_error_mean_s),
                    100.0 * all.within_25pct
                );
                for e in c.estimates.iter().filter(|e| e.class != "all") {
                    let _ = writeln!(
                        s,
                        "- first placed {}: {} jobs, expected {}, replayed {} ({})",
                        e.class,
                        e.jobs,
                        h(e.expected_completion_mean_s),
                        h(e.completion_mean_s),
                        pct(e.completion_mean_s, e.expected_completion_mean_s)
                    );
                }
            }
        }
        if !self.targets.is_empty() {
            let _ = writeln!(s, "\n## Targets\n");
            for t in &self.targets {
                let proof = if t.unreachable.is_some() { " — proved unreachable by the bound" } else { "" };
                let _ = writeln!(
                    s,
                    "- {} {}: {:.1} % (threshold {:.0} %){proof}",
                    if t.met { "met" } else { "**missed**" },
                    t.target.split_whitespace().collect::<Vec<_>>().join(" "),
                    100.0 * t.value,
                    100.0 * t.threshold
                );
            }
        }
        if !self.notes.is_empty() {
            let _ = writeln!(s, "\n{} notes (inputs matched or skipped) are in the full report.", self.notes.len());
        }
        s
    }

    /// A fixed-width table for stdout.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<10} {:>13} {:>7} {:>11} {:>11} {:>11} {:>11} {:>10} {:>11} {:>9} {:>7} {:>6} {:>6} {:>6}",
            "policy",
            "total USD",
            "$/GPUh",
            "wait mean",
            "wait p95",
            "compl mean",
            "compl p95",
            "egress $",
            "kgCO2",
            "lost GPUh",
            "unplcd",
            "moved%",
            "preem",
            "migr"
        );
        for p in &self.policies {
            let _ = writeln!(
                s,
                "{:<10} {:>13.0} {:>7.3} {:>11} {:>11} {:>11} {:>11} {:>10.0} {:>11.0} {:>9.0} {:>7} {:>6.1} {:>6} {:>6}",
                p.policy, p.total_usd, p.usd_per_gpu_hour, hms(p.wait_mean_s), hms(p.wait_p95_s),
                hms(p.completion_mean_s), hms(p.completion_p95_s), p.egress_usd, p.kg_co2,
                p.lost_gpu_hours, p.unplaced,
                if p.jobs > 0 { 100.0 * p.moved_jobs as f64 / p.jobs as f64 } else { 0.0 },
                p.preemptions + p.outage_kills, p.migrations
            );
        }
        let _ = writeln!(
            s,
            "{:<10} {:>13.0}   (cheap bound: each job at its cheapest feasible price per unit of work, capacity relaxed)",
            "lower-bd", self.lower_bound_usd
        );
        if let Some(lp) = &self.lp_bound {
            let _ = writeln!(
                s,
                "{:<10} {:>13.0}   (LP relaxation: pool capacities and spot availability per {:.0} h slot and {:.0} h cell near releases, spot windows, egress, all done by {:.0} h; {} groups, {} variables; {}; {})",
                "lp-bound", lp.usd, lp.slot_hours, lp.cell_hours, lp.horizon_hours, lp.groups, lp.variables, lp.solver, lp.certificate
            );
            let _ = writeln!(
                s,
                "{:<10} {:>13}   LP spend (GPU-hours / USD): {}; one-off {:.0}",
                "",
                "",
                spend_cells(&lp.spend, lp.usd),
                lp.one_off_usd
            );
        }
        if let Some(c) = &self.carbon_lp {
            let _ = writeln!(
                s,
                "{:<10} {:>13.0}   (carbon LP: least kgCO2 of a schedule done by {:.0} h costing ≤ {:.0} USD = 1.05 × the cost policy; {:.0} h slots, {:.0} h cells; {}; {})",
                "lp-kgCO2", c.kg_co2, c.horizon_hours, c.usd_cap, c.slot_hours, c.cell_hours, c.solver, c.certificate
            );
            let _ = writeln!(
                s,
                "{:<10} {:>13}   carbon LP spend (GPU-hours / USD): {}",
                "",
                "",
                spend_cells(&c.spend, c.usd)
            );
        }
        for c in self.completion_lp.iter().chain(&self.carbon_cap_lp).chain(&self.bound_checks) {
            let _ = writeln!(s, "{:<10} {:>13}   {}", "lp-capped", "", c.describe());
        }
        let _ = writeln!(
            s,
            "\ncost components (USD; work = GPU time of work kept, setup = provisioning and restores billed, rework = GPU time of work lost at evictions):"
        );
        for p in &self.policies {
            let _ = writeln!(
                s,
                "  {:<10} work {:>10.0}   setup {:>8.0}   rework {:>8.0}   egress {:>8.0}",
                p.policy,
                p.compute_usd - p.setup_usd - p.rework_usd,
                p.setup_usd,
                p.rework_usd,
                p.egress_usd
            );
        }
        if let Some(lp) = &self.lp_bound {
            let _ = writeln!(
                s,
                "  {:<10} work {:>10.0}   one-off (egress + one provisioning per job and option) {:.0}; no rework",
                "LP bound",
                lp.usd - lp.one_off_usd,
                lp.one_off_usd
            );
        }
        let _ = writeln!(
            s,
            "\nratio to lower bound ({}; own = the LP with the policy's own last job end as the horizon):",
            self.bound_used
        );
        for p in &self.policies {
            let own = p.own_lp_bound_usd.map(|b| format!("   (own LP bound {b:.0})")).unwrap_or_default();
            let mine = p
                .own_completion_lp_usd
                .map(|b| format!("   (own completion LP {b:.0}: done by its end at its mean completion)"))
                .unwrap_or_default();
            let _ = writeln!(s, "  {:<10} {:.3}{own}{mine}", p.policy, p.ratio_to_lower_bound);
        }
        if self.policies.iter().any(|p| !p.estimates.is_empty()) {
            let _ = writeln!(
                s,
                "\nengine estimates at each job's first placement against the replay (means from submission; |err| = mean absolute error of completion):"
            );
            for p in self.policies.iter().filter(|p| !p.estimates.is_empty()) {
                for e in &p.estimates {
                    let bias = if e.expected_completion_mean_s > 0.0 {
                        format!("{:+.1}%", 100.0 * (e.completion_mean_s / e.expected_completion_mean_s - 1.0))
                    } else {
                        "-".into()
                    };
                    let _ = writeln!(
                        s,
                        "  {:<10} {:<9} jobs {:>7}  wait {:>7} / {:>7}  completion {:>7} / {:>7} ({:>7})  |err| {:>7}  within 25% {:>5.1}%",
                        p.policy,
                        e.class,
                        e.jobs,
                        hms(e.expected_wait_mean_s),
                        hms(e.wait_mean_s),
                        hms(e.expected_completion_mean_s),
                        hms(e.completion_mean_s),
                        bias,
                        hms(e.completion_abs_error_mean_s),
                        100.0 * e.within_25pct
                    );
                }
            }
            let _ = writeln!(s, "  (each pair: expected / replayed)");
        }
        if self.policies.iter().any(|p| !p.by_size.is_empty()) {
            let _ = writeln!(s, "\nmean completion by job size (GPUs asked for: mean completion, jobs):");
            for p in self.policies.iter().filter(|p| !p.by_size.is_empty()) {
                let cells: Vec<String> = p
                    .by_size
                    .iter()
                    .map(|c| format!("{:>4}: {:>7} ({})", c.gpus, hms(c.completion_mean_s), c.jobs))
                    .collect();
                let _ = writeln!(s, "  {:<12} {}", p.policy, cells.join("  "));
            }
        }
        {
            if self.policies.iter().any(|p| p.owned_fixed_usd > 0.0) {
                let _ = writeln!(s, "\nowned hardware over the run (amortized, paid whether used or not; totals above count the used part{}):",
                    if self.policies.iter().any(|p| p.cash_usd.is_some()) { "; cash = cloud + egress + running the owned GPUs" } else { "" });
                for p in &self.policies {
                    let cash = match (p.owned_running_usd, p.cash_usd) {
                        (Some(run), Some(cash)) => format!(", running {run:>10.0} USD, cash {cash:>12.0} USD"),
                        _ => String::new(),
                    };
                    let _ = writeln!(
                        s,
                        "  {:<12} fixed {:>12.0} USD, idle {:>5.1}%, cloud + egress {:>12.0} USD{cash}",
                        p.policy,
                        p.owned_fixed_usd,
                        100.0 * p.owned_idle_share,
                        p.total_usd - p.owned_used_usd
                    );
                }
            }
            let _ = writeln!(s, "\ncost by team (USD; largest five):");
            for p in &self.policies {
                let mut v: Vec<(&String, &f64)> = p.cost_by_team.iter().collect();
                v.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
                let top: Vec<String> = v.iter().take(5).map(|(t, u)| format!("{t} {u:.0}")).collect();
                let _ = writeln!(s, "  {:<12} {}", p.policy, top.join(", "));
            }
        }
        let _ = writeln!(s, "\nutilization per cluster (time-averaged busy GPUs / GPUs):");
        if let Some(first) = self.policies.first() {
            let _ = write!(s, "  {:<10}", "");
            for c in first.utilization.keys() {
                let _ = write!(s, " {:>12}", truncate(c, 12));
            }
            let _ = writeln!(s);
        }
        for p in &self.policies {
            let _ = write!(s, "  {:<10}", p.policy);
            for u in p.utilization.values() {
                let _ = write!(s, " {:>11.1}%", 100.0 * u + 0.0);
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s, "\ncompute spend by pool (GPU-hours paid / USD; std = on-demand or on-prem):");
        for p in &self.policies {
            let mut v: Vec<(&String, &Spend)> = p.spend.iter().collect();
            v.sort_by(|a, b| b.1.usd.total_cmp(&a.1.usd).then(a.0.cmp(b.0)));
            let cells: Vec<String> = v
                .iter()
                .filter(|(_, x)| x.usd >= 0.005 * p.compute_usd)
                .map(|(k, x)| format!("{k} {:.0}/{:.0}", x.gpu_hours, x.usd))
                .collect();
            let _ = writeln!(s, "  {:<10} {}", p.policy, cells.join(", "));
        }
        if !self.targets.is_empty() {
            let _ = writeln!(s, "\ntargets:");
            for t in &self.targets {
                let _ = writeln!(
                    s,
                    "  [{}] {:<45} {:>7.1}% (threshold {:.0}%)",
                    if t.met { "met " } else { "MISS" },
                    t.target,
                    100.0 * t.value,
                    100.0 * t.threshold
                );
                if let Some(u) = &t.unreachable {
                    let _ = writeln!(s, "         unreachable: {u}");
                }
            }
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn hms(s: f64) -> String {
    if s >= 86_400.0 {
        format!("{:.1}d", s / 86_400.0)
    } else if s >= 3600.0 {
        format!("{:.1}h", s / 3600.0)
    } else if s >= 60.0 {
        format!("{:.1}m", s / 60.0)
    } else {
        format!("{:.0}s", s)
    }
}

const COLORS: [&str; 10] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A round axis step for `max` over about `n` ticks: 1, 2 or 5 × 10^k.
pub fn nice_step(max: f64, n: f64) -> f64 {
    if !(max.is_finite() && max > 0.0) {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    mag * if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// A minimal line chart: each series is (label, points); `hline` draws a dashed
/// horizontal reference (label, y), e.g. the lower bound of a cumulative cost.
/// Axes end at a round value with ticks at round steps.
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    hline: Option<(&str, f64)>,
) -> String {
    let (w, h) = (900.0, 500.0);
    let (ml, mr, mt, mb) = (80.0, 180.0, 40.0, 50.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let mut xmax: f64 = 0.0;
    let mut ymax: f64 = 0.0;
    for (_, pts) in series {
        for &(x, y) in pts {
            xmax = xmax.max(x);
            ymax = ymax.max(y);
        }
    }
    if xmax <= 0.0 {
        xmax = 1.0;
    }
    if let Some((_, y)) = hline {
        if y.is_finite() {
            ymax = ymax.max(y);
        }
    }
    if ymax <= 0.0 {
        ymax = 1.0;
    }
    let (xstep, ystep) = (nice_step(xmax, 6.0), nice_step(ymax, 5.0));
    let (xmax, ymax) = ((xmax / xstep).ceil() * xstep, (ymax / ystep).ceil() * ystep);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ =
        writeln!(s, r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#, ml + pw / 2.0, esc(title));
    let _ = writeln!(s, r#"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, mt + ph, ml + pw, mt + ph);
    let _ = writeln!(s, r#"<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="black"/>"#, mt + ph);
    let ny = (ymax / ystep).round() as usize;
    for i in 0..=ny {
        let v = i as f64 * ystep;
        let y = mt + ph - v / ymax * ph;
        let _ = writeln!(
            s,
            r#"<line x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="gray" stroke-opacity="0.3"/>"#,
            ml + pw
        );
        let _ = writeln!(s, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, ml - 5.0, y + 4.0, fmt_num(v));
    }
    let nx = (xmax / xstep).round() as usize;
    for i in 0..=nx {
        let v = i as f64 * xstep;
        let x = ml + v / xmax * pw;
        let _ = writeln!(s, r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#, mt + ph + 16.0, fmt_num(v));
    }
    if let Some((label, yv)) = hline.filter(|h| h.1.is_finite() && h.1 > 0.0) {
        let y = mt + ph - yv / ymax * ph;
        let _ = writeln!(
            s,
            r#"<line x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="black" stroke-dasharray="6 4"/>"#,
            ml + pw
        );
        let _ = writeln!(s, r#"<text x="{}" y="{:.1}">{}</text>"#, ml + 6.0, y - 4.0, esc(label));
    }
    let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, ml + pw / 2.0, h - 10.0, esc(x_label));
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        mt + ph / 2.0,
        mt + ph / 2.0,
        esc(y_label)
    );
    for (i, (label, pts)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let mut d = String::new();
        for (k, &(x, y)) in pts.iter().enumerate() {
            let px = ml + x / xmax * pw;
            let py = mt + ph - y / ymax * ph;
            let _ = write!(d, "{}{px:.1},{py:.1} ", if k == 0 { "M" } else { "L" });
        }
        let _ = writeln!(s, r#"<path d="{}" fill="none" stroke="{c}" stroke-width="1.5"/>"#, d.trim_end());
        let ly = mt + 14.0 * i as f64 + 6.0;
        let _ = writeln!(s, r#"<rect x="{}" y="{}" width="12" height="3" fill="{c}"/>"#, ml + pw + 10.0, ly);
        let _ = writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, ml + pw + 26.0, ly + 5.0, esc(label));
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Write `report.json`, `summary.md`, `cost.svg` and `util-<policy>.svg` into `dir`.
pub fn write_outputs(report: &Report, dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let json = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    let p = dir.join("report.json");
    std::fs::write(&p, json + "\n")?;
    written.push(p);
    let p = dir.join("summary.md");
    std::fs::write(&p, report.summary())?;
    written.push(p);
    let series: Vec<_> = report.policies.iter().map(|p| (p.policy.clone(), p.cost_series.clone())).collect();
    let p = dir.join("cost.svg");
    std::fs::write(
        &p,
        line_chart_svg(
            "Cumulative cost",
            "hours since first submission",
            "USD",
            &series,
            Some((&format!("lower bound ({}) {:.0} USD", report.bound_used, report.bound_usd()), report.bound_usd())),
        ),
    )?;
    written.push(p);
    for pol in &report.policies {
        let series: Vec<_> = pol
            .util_series
            .iter()
            .map(|(c, v)| {
                (c.clone(), v.iter().enumerate().map(|(i, u)| (i as f64 * pol.bucket_hours, 100.0 * u)).collect())
            })
            .collect();
        let p = dir.join(format!("util-{}.svg", pol.policy));
        std::fs::write(
            &p,
            line_chart_svg(
                &format!("Utilization per cluster: {}", pol.policy),
                "hours since first submission",
                "busy GPUs %",
                &series,
                None,
            ),
        )?;
        written.push(p);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(xs: &[f64], p: f64, expected: f64) {
        assert_eq!(percentile(xs, p), expected);
    }

    #[test]
    fn percentiles() {
        check(&[], 95.0, 0.0);
        check(&[3.0], 95.0, 3.0);
        check(&[5.0, 1.0, 4.0, 2.0, 3.0], 50.0, 3.0);
        check(&(1..=100).map(f64::from).collect::<Vec<_>>(), 95.0, 95.0);
    }

    #[test]
    fn size_classes_split_jobs_by_gpus() {
        // (GPUs, work GPU-h, USD, wait s, completion s)
        let jobs = [
            (1, 1.0, 2.0, 0.0, 3600.0),
            (1, 2.0, 4.0, 600.0, 9000.0),
            (4, 4.0, 8.0, 0.0, 3600.0),
            (8, 8.0, 16.0, 60.0, 3660.0),
            (64, 128.0, 200.0, 7200.0, 14400.0),
        ];
        let c = SizeClass::of(&jobs);
        let labels: Vec<(&str, usize)> = c.iter().map(|x| (x.gpus.as_str(), x.jobs)).collect();
        assert_eq!(labels, [("1", 2), ("2-4", 1), ("5-8", 1), ("33+", 1)], "the empty 9-32 class is left out");
        assert_eq!((c[0].gpu_hours, c[0].usd, c[0].wait_mean_s, c[0].completion_mean_s), (3.0, 6.0, 300.0, 6300.0));
        assert_eq!(c[0].completion_p95_s, 9000.0);
        assert_eq!((c[3].usd, c[3].completion_mean_s), (200.0, 14400.0));
        assert!(SizeClass::of(&[]).is_empty());
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let s = line_chart_svg("t<", "x", "y", &[("a".into(), vec![(0.0, 0.0), (1.0, 2.0)])], Some(("lb", 1.5)));
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains("t&lt;"));
        assert!(s.contains("M80.0,450.0 L720.0,40.0"));
        // the bound is a dashed line at 1.5 of 2 (y = 40 + 410 × 0.25), ticks are round
        assert!(s.contains(r#"y1="142.5" x2="720" y2="142.5" stroke="black" stroke-dasharray"#), "{s}");
        assert!(s.contains(">0.50</text>") && s.contains(">1.50</text>"), "{s}");
        assert_eq!((nice_step(1904.0, 6.0), nice_step(670_013.0, 5.0), nice_step(0.9, 5.0)), (500.0, 200_000.0, 0.2));
    }
}
