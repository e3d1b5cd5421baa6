//! `fleetctl simulate` / `fleet-sim`: flags and the driver.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::engine_model::{EngineModel, EngineSetup};
use crate::report::Report;
use crate::sim::{self, SimConfig, SimJob, Strategy};
use crate::spot::SpotTrace;
use crate::trace::{self, Trace};

/// Replay a job trace over a fleet with the placement engine and the baselines.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Job trace: Philly's table (`timestamp,duration,num_gpus,gpu_time,cluster`;
    /// `cluster` is the team) or the generic format (header starting `submit_time`,
    /// docs/simulator.md). A bad row is an error with its file:line (see --skip-invalid).
    #[arg(long)]
    pub trace: PathBuf,
    /// Skip trace rows that cannot be read instead of failing; every skipped row is
    /// reported on stderr and in the report's notes, with the totals.
    #[arg(long)]
    pub skip_invalid: bool,
    /// Longest job run time accepted in the trace (days); longer rows are invalid.
    #[arg(long, default_value_t = 365.0)]
    pub max_duration_days: f64,
    /// Fleet TOML (the engine's format, e.g. `conf/fleet-sample.toml`); strict: unknown
    /// keys are errors. Its `[[teams]]` give each trace team label its home cluster.
    #[arg(long)]
    pub fleet: PathBuf,
    /// Assign teams that the fleet file does not declare to clusters by load
    /// (largest team to the emptiest cluster per GPU); without it they are an error.
    #[arg(long)]
    pub auto_homes: bool,
    /// Engine policy to replay (`cost`, `time`, `green`, or one defined in
    /// --policies), a baseline (`home-only`, `greedy`, `random`), or `all` for every
    /// engine policy plus the baselines.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Also run the baselines (home-only, greedy, greedy-spot, first-start, random) for a
    /// single --policy.
    #[arg(long)]
    pub baselines: bool,
    /// `metasched.toml` (or any TOML) with `[policies.<name>]` weight tables.
    #[arg(long)]
    pub policies: Option<PathBuf>,
    /// Seed of every random choice (random baseline); same inputs + seed = same report.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay only the first N jobs (after sorting by submission).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Write `report.json`, `cost.svg` and `util-<policy>.svg` here.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// Shared data folder; sets --carbon-dir, --spot-dir and --network-dir to its
    /// `carbon/`, `spot/` and `network/` subfolders unless those are given.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Folder of `<ZONE>_*.csv` carbon series (engine feed format).
    #[arg(long)]
    pub carbon_dir: Option<PathBuf>,
    /// Folder of spot traces (`*.json`, SkyPilot spot-traces format). Without one,
    /// spot capacity never shrinks and is never preempted.
    #[arg(long)]
    pub spot_dir: Option<PathBuf>,
    /// Folder of `<provider>_transmission_cost_matrix.csv` egress matrices.
    #[arg(long)]
    pub network_dir: Option<PathBuf>,
    /// GPU price table (`gpu-prices.csv` format) applied over the fleet's cloud prices.
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// Cluster outage `NAME:START_H:DURATION_H` (hours since the first submission);
    /// repeatable.
    #[arg(long = "outage")]
    pub outages: Vec<String>,
    /// Checkpoint interval of every trace job (seconds; 0 = jobs never checkpoint).
    #[arg(long, default_value_t = 3600.0)]
    pub checkpoint_interval_s: f64,
    /// Share of jobs that are interruptible (may use spot and be migrated); chosen
    /// deterministically by job index.
    #[arg(long, default_value_t = 1.0)]
    pub interruptible_share: f64,
    /// Size of the dataset each job reads, stored in its home cluster's region (GB).
    /// Moving a job away from home pays its egress and transfer time.
    #[arg(long, default_value_t = 50.0)]
    pub dataset_gb: f64,
    /// Period of the engine's rebalancing pass (seconds; 0 = off).
    #[arg(long, default_value_t = 3600.0)]
    pub rebalance_every_s: f64,
    /// Width of the plot buckets (hours).
    #[arg(long, default_value_t = 6.0)]
    pub bucket_hours: f64,
    /// Longest carbon hold or pause of the `green` policy (hours, at most 24: the
    /// day-ahead carbon forecast; 0 = off, the default): interruptible jobs may be
    /// held back, or paused at a checkpoint, to run in the cleaner hours of the next day.
    #[arg(long, default_value_t = 0.0)]
    pub carbon_hold_h: f64,
    /// Completion budget of a carbon hold: at most this × the job's run time.
    #[arg(long, default_value_t = 1.0)]
    pub carbon_hold_slack: f64,
    /// A carbon hold or pause is taken only if it cuts the forecast kgCO2 of the
    /// job's next day (or run, if shorter) by at least this share.
    #[arg(long, default_value_t = 0.05)]
    pub carbon_hold_min_saving: f64,
    /// Also pause running jobs at a checkpoint through dirty hours (`false` = start
    /// holds only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub carbon_pause: bool,
    /// An experiment, not a policy: tell the engine policies the spot trace
    /// ahead of the clock (when the window they are in ends, when a shortfall
    /// ends) on all-or-nothing spot pools, to measure what hindsight is worth.
    #[arg(long)]
    pub spot_oracle: bool,
    /// Largest LP for the lower bound (variables; the time slots grow until it
    /// fits). 0 = only the cheap capacity-relaxed bound (for huge runs).
    #[arg(long, default_value_t = 30_000)]
    pub lp_max_vars: usize,
    /// Longest one LP solve may take, seconds, each solver (an LP not solved in
    /// time leaves its bound out, with a note; the cheap bound stays).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::lp::DEFAULT_TIME_LIMIT_S)]
    pub lp_time_limit: f64,
    /// Take the LP solver's point as the bound without proving it from the
    /// LP's dual (faster: no clarabel solve after each microlp answer; the
    /// report and the planner's page then say "not certified").
    #[arg(long)]
    pub lp_uncertified: bool,
    /// Also solve the LP for the least cost of any schedule with a mean completion
    /// of at most H hours (repeatable; needs the LP: not with `--lp-max-vars 0`).
    #[arg(long = "bound-completion-h", value_name = "H")]
    pub bound_completion_h: Vec<f64>,
    /// Print the report as JSON on stdout (the same document as `report.json`)
    /// instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Print the one-page summary for a capacity planner (the Markdown of
    /// `summary.md`) instead of the table.
    #[arg(long, conflicts_with = "json")]
    pub summary: bool,
    /// Tune a policy's weights for this fleet instead of the report: `green`, the
    /// least kgCO2 within --tune-budget more USD than the cost policy; `cost`, the
    /// least USD at a mean completion no worse than greedy-spot's. Chosen on the
    /// first --tune-split of the jobs, checked on the rest.
    #[arg(long, value_name = "POLICY", value_parser = ["green", "cost"], conflicts_with = "summary")]
    pub tune: Option<String>,
    /// Extra USD --tune green may spend over the cost policy (a share).
    #[arg(long, default_value_t = 0.05)]
    pub tune_budget: f64,
    /// Share of the jobs (by submission) that --tune chooses the weights on.
    #[arg(long, default_value_t = 0.5)]
    pub tune_split: f64,
    /// Consecutive folds --tune replays the tuning part in, each from an empty
    /// fleet: weights are kept only if they keep the limit on every fold (with
    /// --tune-walk: the periods before each that it is tuned on, one fold each).
    #[arg(long, default_value_t = 1)]
    pub tune_folds: usize,
    /// Walk forward instead of one split: cut the jobs into N consecutive
    /// periods (by submission) and run each with the weights chosen on the
    /// periods before it (the last --tune-folds of them, as folds; their jobs
    /// whose run could have ended by then, replayed on the fleet the earlier
    /// jobs left); the first runs the built-in weights (or --tune-walk-start).
    /// Reports each period and the whole trace so run against the references.
    #[arg(long, value_name = "N", requires = "tune")]
    pub tune_walk: Option<usize>,
    /// The policy --tune-walk runs until there is something to tune on (the
    /// first period) [default: the tuned policy's built-in weights].
    #[arg(long, value_name = "POLICY", requires = "tune_walk")]
    pub tune_walk_start: Option<String>,
    /// Carry the balance of the limit forward: what the walk's periods so far
    /// were ahead of (or behind) the limit (green: on what every earlier job
    /// paid until now; cost: on the jobs whose run could have ended) loosens
    /// (or tightens) the limit of the periods to come, spread over their
    /// jobs, so that the whole trace keeps it.
    #[arg(long, requires = "tune_walk")]
    pub tune_walk_carry: bool,
    /// Time values (USD per GPU-hour) --tune tries, comma-separated [default:
    /// green 2,1,0.5,0.2,0.1; cost 0,0.2,0.5,1,2,4,8, each with every per-job
    /// time value and with and without the spot queue].
    #[arg(long, value_delimiter = ',')]
    pub tune_time_values: Vec<f64>,
    /// Time values per job-hour (USD per hour a job waits, whatever its GPUs)
    /// --tune tries, comma-separated [default: green the green policy's own;
    /// cost 0,1,3,10,40].
    #[arg(long, value_delimiter = ',')]
    pub tune_job_time_values: Vec<f64>,
    /// Keep only weights under which no job size (GPUs asked for: 1, 2-4, 5-8,
    /// 9-32, 33+; classes of at least 20 jobs) completes on average more than
    /// this share later than under the built-in policy, on every fold (with
    /// --tune-walk: the built-in replayed over the same jobs): tuning for a
    /// mean over jobs must not buy it with the large jobs' waits.
    #[arg(long, value_name = "SHARE")]
    pub tune_size_slack: Option<f64>,
    /// Carbon prices (USD per kg) --tune tries, comma-separated [default: green
    /// 0.5,1,1.25,1.5,1.75,2,2.5,3,4,5,6; cost the cost policy's own].
    #[arg(long, value_delimiter = ',')]
    pub tune_carbon_prices: Vec<f64>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Policies replayed, and LPs solved, in parallel (default: the number of
    /// CPUs; with 2 or more, an LP's two solvers may run at once). The report
    /// does not depend on it.
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The simulator's own command line (`fleet-sim`, `fleetctl simulate`).
#[derive(Debug, clap::Parser)]
#[command(about = "Replay a job trace over a fleet with the placement engine, the baselines and the lower bounds")]
struct SimCli {
    #[command(flatten)]
    args: SimulateArgs,
}

/// Parses the simulator's flags; `argv[0]` is the program name shown in usage.
pub fn parse_from<I: IntoIterator<Item = String>>(argv: I) -> Result<SimulateArgs, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let v: Vec<String> = argv.into_iter().collect();
    let name = v.first().cloned().unwrap_or_else(|| "fleet-sim".into());
    let cmd = SimCli::command().bin_name(name);
    let m = cmd.try_get_matches_from(v)?;
    SimCli::from_arg_matches(&m).map(|c| c.args)
}

/// Everything a run needs, read from files; [`run_loaded`] is pure of I/O apart from
/// the progress bar.
pub struct Loaded {
    pub trace: Trace,
    pub trace_name: String,
    pub fleet_name: String,
    pub setup: EngineSetup,
    pub spot: Vec<SpotTrace>,
}

fn dir_or(explicit: &Option<PathBuf>, data: &Option<PathBuf>, sub: &str) -> Option<PathBuf> {
    explicit.clone().or_else(|| data.as_ref().map(|d| d.join(sub)))
}

fn sorted_files(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    Ok(v)
}

/// Read every input named by the flags.
pub fn load(args: &SimulateArgs) -> Result<Loaded> {
    if !(args.max_duration_days.is_finite() && args.max_duration_days > 0.0) {
        bail!("--max-duration-days must be > 0");
    }
    let opts =
        trace::ReadOptions { skip_invalid: args.skip_invalid, max_duration_s: args.max_duration_days * 86_400.0 };
    let trace = trace::read_file(&args.trace, &opts)?;
    for d in &trace.diagnostics {
        eprintln!("skipped {d}");
    }
    if trace.skipped > 0 {
        eprintln!("skipped {} invalid trace rows; {} jobs read", trace.skipped, trace.jobs.len());
    }
    let fleet_text =
        std::fs::read_to_string(&args.fleet).with_context(|| format!("reading {}", args.fleet.display()))?;
    let policies_text = match &args.policies {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let mut carbon = Vec::new();
    if let Some(d) = dir_or(&args.carbon_dir, &args.data_dir, "carbon") {
        for f in sorted_files(&d, "csv")? {
            carbon.push((f.display().to_string(), std::fs::read_to_string(&f)?));
        }
    }
    let mut egress = Vec::new();
    if let Some(d) = dir_or(&args.network_dir, &args.data_dir, "network") {
        for f in sorted_files(&d, "csv")? {
            let name = f.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let provider = name.split('_').next().unwrap_or("").to_string();
            egress.push((provider, std::fs::read_to_string(&f)?));
        }
    }
    let prices = match &args.prices {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let mut spot = Vec::new();
    if let Some(d) = dir_or(&args.spot_dir, &args.data_dir, "spot") {
        for f in sorted_files(&d, "json")? {
            spot.push(SpotTrace::read(&f)?);
        }
    }
    let setup = EngineSetup {
        fleet_toml: fleet_text,
        fleet_name: args.fleet.display().to_string(),
        policies_toml: policies_text,
        policies_name: args.policies.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        carbon_csvs: carbon,
        egress_csvs: egress,
        prices_csv: prices,
        dataset_gb: args.dataset_gb,
    };
    Ok(Loaded {
        trace,
        trace_name: args.trace.display().to_string(),
        fleet_name: args.fleet.display().to_string(),
        setup,
        spot,
    })
}

/// The replay settings the flags give.
pub(crate) fn sim_config(args: &SimulateArgs, model: &EngineModel) -> Result<SimConfig> {
    let outages: Vec<(usize, f64, f64)> = args.outages.iter().map(|s| parse_outage(s, model)).collect::<Result<_>>()?;
    Ok(SimConfig {
        seed: args.seed,
        outages,
        rebalance_every_s: args.rebalance_every_s.max(0.0),
        bucket_s: (args.bucket_hours * 3600.0).max(60.0),
        full_rebuild: false,
        hold: carbon_hold(args)?,
        spot_oracle: args.spot_oracle,
        switches: Vec::new(),
        per_job: false,
    })
}

/// Replays each strategy over `jobs` with the engine set up from `setup` (the
/// loaded inputs, or those with more policies), in report order.
pub(crate) fn replay(
    args: &SimulateArgs,
    loaded: &Loaded,
    setup: &EngineSetup,
    strategies: &[Strategy],
    jobs: &[SimJob],
    cfg: &SimConfig,
) -> Result<Vec<crate::report::PolicyReport>> {
    // Each strategy runs on its own copy of a fresh model (built and given its
    // spot traces once: cloning is cheaper than parsing the inputs per strategy).
    let mut template = EngineModel::new(setup, loaded.trace.epoch_unix as f64)?;
    template.assign_spot_traces(&loaded.spot);
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        // Draws only when stderr is a terminal.
        let b = indicatif::ProgressBar::new((jobs.len() * strategies.len()) as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} jobs ({elapsed})")
        {
            b.set_style(style.progress_chars("=> "));
        }
        b
    };
    // One thread per strategy (at most --threads at a time), each with its own
    // engine model: runs are independent, so the report does not depend on the
    // thread count or on scheduling.
    let threads = threads(args);
    let mut policies: Vec<Option<crate::report::PolicyReport>> = vec![None; strategies.len()];
    for chunk in (0..strategies.len()).collect::<Vec<_>>().chunks(threads) {
        let results: Vec<(usize, Result<crate::report::PolicyReport>)> = std::thread::scope(|sc| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|&k| {
                    let s = strategies[k].clone();
                    let (bar, loaded) = (&bar, loaded);
                    let spot_traces = &loaded.spot;
                    let template = &template;
                    sc.spawn(move || {
                        let mut m = template.clone();
                        let last = std::cell::Cell::new(0u64);
                        let tick = |n: u64| {
                            bar.inc(n.saturating_sub(last.get()));
                            last.set(n);
                        };
                        Ok(sim::simulate(&mut m, s, jobs, spot_traces, cfg, &tick))
                    })
                })
                .collect();
            chunk
                .iter()
                .zip(handles)
                .map(|(&k, h)| (k, h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("simulation thread panicked")))))
                .collect()
        });
        for (k, r) in results {
            policies[k] = Some(r?);
        }
    }
    bar.finish_and_clear();
    Ok(policies.into_iter().flatten().collect())
}

/// `--threads`, else the number of CPUs; at least 1.
fn threads(args: &SimulateArgs) -> usize {
    args.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1)
}

/// One of a report's LPs after the plain one; none depends on another's answer.
enum LpTask {
    /// A policy's own-end LP: done by its last job's end (seconds).
    OwnEnd(f64),
    /// The cost policy's completion LP at its own schedule: horizon, caps.
    CostCompletion(f64, crate::lp::Caps),
    /// The carbon LP within this USD.
    Carbon(f64),
    /// A capped LP at the report's horizon.
    Capped(crate::lp::Caps),
}

/// An [`LpTask`]'s answer.
enum LpDone {
    Usd(Option<f64>),
    Capped(std::result::Result<crate::lp::CappedBound, String>),
    Carbon(std::result::Result<crate::lp::CarbonBound, String>),
}

/// Solves `tasks`, answers in their order: one after another on `model`, or
/// by up to `threads` workers, each on its own copy of `model`, taking the
/// next task when done. An LP's two solvers (microlp, and clarabel for its
/// certificate) run at once where there are two threads per worker (microlp
/// is the quick one: 1–4 s where clarabel takes 5–25 s on cloud-spot's, so
/// LPs side by side gain more than solvers side by side). Every LP is solved
/// the same whatever the thread count, so the report does not depend on it.
fn solve_lps(
    model: &mut EngineModel,
    jobs: &[SimJob],
    spot: &[SpotTrace],
    tasks: &[LpTask],
    (horizon, bound, limits): (f64, f64, crate::lp::LpLimits),
    threads: usize,
) -> Vec<LpDone> {
    let one = |m: &mut EngineModel, task: &LpTask, limits: crate::lp::LpLimits| -> LpDone {
        match *task {
            // Solved first without a certificate: a solver's point at or below
            // the bound cannot raise the policy's ratio (the LP's optimum is at
            // most any point's cost), so only a point above it is certified.
            LpTask::OwnEnd(h) => {
                let quick = crate::lp::LpLimits { certify: false, ..limits };
                LpDone::Usd(match crate::lp::lp_bound_per_option(m, jobs, spot, h, quick) {
                    Ok(b) if b.usd <= bound || b.is_certified() || !limits.certify => Some(b.usd),
                    Ok(_) => crate::lp::lp_bound_per_option(m, jobs, spot, h, limits).ok().map(|b| b.usd),
                    Err(_) => None,
                })
            }
            LpTask::CostCompletion(h, caps) => LpDone::Capped(crate::lp::capped_bound(m, jobs, spot, h, limits, caps)),
            LpTask::Carbon(usd) => LpDone::Carbon(crate::lp::carbon_bound(m, jobs, spot, horizon, limits, usd)),
            LpTask::Capped(caps) => LpDone::Capped(crate::lp::capped_bound(m, jobs, spot, horizon, limits, caps)),
        }
    };
    let workers = threads.min(tasks.len()).max(1);
    let limits = crate::lp::LpLimits { solvers_at_once: 2 * workers <= threads, ..limits };
    if workers == 1 {
        return tasks.iter().map(|t| one(model, t, limits)).collect();
    }
    // Each worker takes the next task when it is done with its last (the LPs'
    // times differ by 10×: chunks of `workers` would wait for each chunk's
    // slowest).
    let (model, next) = (&*model, std::sync::atomic::AtomicUsize::new(0));
    let mut out: Vec<(usize, LpDone)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                sc.spawn(|| {
                    let mut m = model.clone();
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(t) = tasks.get(i) else { break mine };
                        mine.push((i, one(&mut m, t, limits)));
                    }
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    out.sort_by_key(|d| d.0);
    // (a task whose worker panicked has no answer: as an LP not solved)
    let mut out = out.into_iter().peekable();
    tasks
        .iter()
        .enumerate()
        .map(|(i, t)| match out.next_if(|d| d.0 == i) {
            Some((_, d)) => d,
            None => match t {
                LpTask::OwnEnd(_) => LpDone::Usd(None),
                LpTask::Carbon(_) => LpDone::Carbon(Err("LP thread panicked".into())),
                _ => LpDone::Capped(Err("LP thread panicked".into())),
            },
        })
        .collect()
}

/// Parse `NAME:START_H:DURATION_H`.
fn parse_outage(s: &str, model: &EngineModel) -> Result<(usize, f64, f64)> {
    let parts: Vec<&str> = s.rsplitn(3, ':').collect();
    let [dur, start, name] = parts.as_slice() else { bail!("--outage {s:?}: expected NAME:START_H:DURATION_H") };
    let c = model.cluster_index(name).with_context(|| format!("--outage {s:?}: no cluster {name:?}"))?;
    let start: f64 = start.parse().with_context(|| format!("--outage {s:?}: bad start"))?;
    let dur: f64 = dur.parse().with_context(|| format!("--outage {s:?}: bad duration"))?;
    if !(start.is_finite() && dur.is_finite() && start >= 0.0 && dur > 0.0) {
        bail!("--outage {s:?}: start must be >= 0 and duration > 0");
    }
    Ok((c, start * 3600.0, (start + dur) * 3600.0))
}

/// Turn trace rows into simulator jobs over `model` (home mapping, checkpoints,
/// interruptibility).
pub fn sim_jobs(trace: &Trace, model: &mut EngineModel, args: &SimulateArgs) -> Result<Vec<SimJob>> {
    let limit = args.limit.unwrap_or(usize::MAX);
    let rows = &trace.jobs[..trace.jobs.len().min(limit)];
    let homes = model.home_map(rows, args.auto_homes)?;
    let share = args.interruptible_share.clamp(0.0, 1.0);
    Ok(rows
        .iter()
        .map(|r| SimJob {
            id: r.id,
            submit_s: r.submit_s,
            // Work at the reference GPU: a duration measured on another model
            // scales by its speed (unknown models count as the reference).
            duration_s: r.duration_s
                * r.extra.duration_gpu.as_deref().and_then(|g| model.fleet.speed_of(g)).unwrap_or(1.0),
            gpus: r.gpus,
            home: homes.get(&r.home_label).copied().unwrap_or(0),
            // The trace's own flag, else a Bresenham-style spread: exactly
            // round(share × n) jobs, evenly.
            interruptible: r
                .extra
                .interruptible
                .unwrap_or(((r.id + 1) as f64 * share).floor() > (r.id as f64 * share).floor()),
            checkpoint_s: r.extra.checkpoint_s.unwrap_or(args.checkpoint_interval_s).max(0.0),
            writes_no_checkpoints: false,
            extra: r.extra.clone(),
            team: r.home_label.clone(),
        })
        .collect())
}

/// The baselines, in report order.
pub const BASELINES: [Strategy; 5] =
    [Strategy::HomeOnly, Strategy::Greedy, Strategy::GreedySpot, Strategy::FirstStart, Strategy::Random];

/// The strategies a run replays.
pub fn strategies(args: &SimulateArgs, model: &EngineModel) -> Result<Vec<Strategy>> {
    let mut v = Vec::new();
    if args.policy == "all" {
        for p in ["cost", "time", "green"] {
            v.push(Strategy::Engine(p.into()));
        }
        for p in model.policy_names() {
            if !["cost", "time", "green"].contains(&p.as_str()) {
                v.push(Strategy::Engine(p));
            }
        }
    } else if let Some(b) = BASELINES.into_iter().find(|b| b.name() == args.policy) {
        v.push(b);
        return Ok(v);
    } else {
        if !model.policy_names().contains(&args.policy) {
            bail!("unknown policy {:?} (known: {})", args.policy, model.policy_names().join(", "));
        }
        v.push(Strategy::Engine(args.policy.clone()));
    }
    if args.policy == "all" || args.baselines {
        v.extend(BASELINES);
    }
    Ok(v)
}

/// Run every strategy over the loaded inputs and build the report.
pub fn run_loaded(args: &SimulateArgs, loaded: &Loaded) -> Result<Report> {
    if let Some(h) = args.bound_completion_h.iter().find(|h| !(h.is_finite() && **h > 0.0)) {
        bail!("--bound-completion-h must be a finite number of hours > 0, got {h}");
    }
    if !(args.lp_time_limit.is_finite() && args.lp_time_limit > 0.0) {
        bail!("--lp-time-limit must be a finite number of seconds > 0, got {}", args.lp_time_limit);
    }
    let threads = threads(args);
    let limits = crate::lp::LpLimits {
        max_vars: args.lp_max_vars,
        time_limit_s: args.lp_time_limit,
        certify: !args.lp_uncertified,
        solvers_at_once: threads > 1,
    };
    let mut model = EngineModel::new(&loaded.setup, loaded.trace.epoch_unix as f64)?;
    let jobs = sim_jobs(&loaded.trace, &mut model, args)?;
    model.assign_spot_traces(&loaded.spot);
    let cfg = sim_config(args, &model)?;
    let strategies = strategies(args, &model)?;
    let mut policies = replay(args, loaded, &loaded.setup, &strategies, &jobs, &cfg)?;
    let (lb_usd, lb_co2) = sim::lower_bound(&mut model, &jobs);
    // The LP bound must hold for every policy compared: all jobs done by the latest
    // end among them.
    let horizon = policies.iter().map(|p| p.makespan_s).fold(0.0, f64::max);
    let (lp_bound, bound_used) = if args.lp_max_vars == 0 {
        (None, "cheap (--lp-max-vars 0)".to_string())
    } else {
        match crate::lp::lp_bound(&mut model, &jobs, &loaded.spot, horizon, limits) {
            // (a certified bound sits up to the solvers' tolerance below the
            // optimum: an LP equal to the cheap bound is still the LP's)
            Ok(b) if b.usd >= lb_usd - 1e-9 * (1.0 + lb_usd) => (Some(b), "lp".to_string()),
            Ok(b) => (Some(b), "cheap (higher than the LP here)".to_string()),
            Err(e) => (None, format!("cheap (LP not solved: {e})")),
        }
    };
    let bound = lp_bound.as_ref().map(|b| b.usd).unwrap_or(0.0).max(lb_usd);
    // The other LPs, each independent of the others' answers: listed here,
    // solved together, read back below in this order.
    let mut tasks = Vec::new();
    // Each policy's own bound: the LP with its own last job end as the horizon
    // (a bound for that policy alone, tighter when it ends before the slowest).
    // (each distinct end solved once; per policy, the index of its LP)
    let mut own: BTreeMap<u64, usize> = BTreeMap::new();
    let mut own_task: Vec<Option<usize>> = vec![None; policies.len()];
    // (the cost policy's index, and its completion LP's)
    let mut cost_completion = None;
    let cost_usd = policies.iter().find(|p| p.policy == "cost").map(|p| p.total_usd);
    let (mut carbon_task, mut completion_task, mut carbon_cap_task) = (None, None, None);
    let mut check_tasks = Vec::new();
    if lp_bound.is_some() {
        for (k, p) in policies.iter().enumerate() {
            if p.makespan_s > 0.0 && p.makespan_s < horizon && p.unplaced == 0 {
                own_task[k] = Some(*own.entry(p.makespan_s.to_bits()).or_insert_with(|| {
                    tasks.push(LpTask::OwnEnd(p.makespan_s));
                    tasks.len() - 1
                }));
            }
            // The cost policy's schedule ends by its makespan with its mean
            // completion: every schedule doing that costs at least the
            // completion-capped LP.
            if p.policy == "cost" && p.unplaced == 0 && p.completed > 0 && p.makespan_s > 0.0 {
                let caps = crate::lp::Caps { mean_completion_h: Some(p.completion_mean_s / 3600.0), kg_co2: None };
                tasks.push(LpTask::CostCompletion(p.makespan_s.min(horizon), caps));
                cost_completion = Some((k, tasks.len() - 1));
            }
        }
        // The carbon LP: can any schedule cut the cost policy's kgCO2 by 20 %
        // for at most 5 % more USD?
        if let Some(u) = cost_usd {
            tasks.push(LpTask::Carbon(1.05 * u));
            carbon_task = Some(tasks.len() - 1);
        }
        // The targets' side constraints as bounds: the least cost at
        // greedy-spot's mean completion (cost ahead of greedy-spot at no worse
        // completion), and at 0.8 × the cost policy's kgCO2 (green: −20 % for
        // ≤ +5 % USD).
        let gs = policies.iter().find(|p| p.policy == "greedy-spot" && p.unplaced == 0 && p.completed > 0);
        if let (Some(gs), Some(_)) = (gs, cost_usd) {
            let caps = crate::lp::Caps { mean_completion_h: Some(gs.completion_mean_s / 3600.0), kg_co2: None };
            tasks.push(LpTask::Capped(caps));
            completion_task = Some(tasks.len() - 1);
        }
        if let Some(c) = policies.iter().find(|p| p.policy == "cost") {
            let caps = crate::lp::Caps { mean_completion_h: None, kg_co2: Some(0.8 * c.kg_co2) };
            tasks.push(LpTask::Capped(caps));
            carbon_cap_task = Some(tasks.len() - 1);
        }
        for &h in &args.bound_completion_h {
            let caps = crate::lp::Caps { mean_completion_h: Some(h), kg_co2: None };
            tasks.push(LpTask::Capped(caps));
            check_tasks.push(tasks.len() - 1);
        }
    }
    let mut done: Vec<Option<LpDone>> =
        solve_lps(&mut model, &jobs, &loaded.spot, &tasks, (horizon, bound, limits), threads)
            .into_iter()
            .map(Some)
            .collect();
    let mut own_notes = Vec::new();
    for (k, p) in policies.iter_mut().enumerate() {
        if let Some(LpDone::Usd(b)) = own_task[k].and_then(|i| done[i].as_ref()) {
            p.own_lp_bound_usd = *b;
        }
        if let Some((_, i)) = cost_completion.filter(|c| c.0 == k) {
            if let Some(LpDone::Capped(r)) = done[i].take() {
                match r {
                    Ok(b) if b.usd.is_none() => own_notes
                        .push("cost policy's completion LP infeasible at its own schedule: a bound is wrong".into()),
                    Ok(b) => p.own_completion_lp_usd = b.usd,
                    Err(e) => own_notes.push(format!("cost policy's completion LP not solved: {e}")),
                }
            }
        }
        let mine = p.own_lp_bound_usd.unwrap_or(0.0).max(p.own_completion_lp_usd.unwrap_or(0.0)).max(bound);
        p.ratio_to_lower_bound = if mine > 0.0 { p.total_usd / mine } else { 0.0 };
    }
    let mut notes = model.notes();
    if args.spot_oracle {
        notes.push(
            "--spot-oracle: the engine policies were told the spot traces ahead of the clock (an experiment, \
             not a policy: no real system knows when spot is reclaimed)"
                .into(),
        );
    }
    notes.extend(own_notes);
    let carbon_lp = match carbon_task.and_then(|i| done[i].take()) {
        Some(LpDone::Carbon(Ok(c))) => Some(c),
        Some(LpDone::Carbon(Err(e))) => {
            notes.push(format!("carbon LP not solved: {e}"));
            None
        }
        _ => None,
    };
    let mut capped = |i: Option<usize>, what: &str, notes: &mut Vec<String>| match i.and_then(|i| done[i].take()) {
        Some(LpDone::Capped(Ok(b))) => Some(b),
        Some(LpDone::Capped(Err(e))) => {
            notes.push(format!("{what} LP not solved: {e}"));
            None
        }
        _ => None,
    };
    let completion_lp = capped(completion_task, "completion", &mut notes);
    let carbon_cap_lp = capped(carbon_cap_task, "carbon-capped", &mut notes);
    let bound_checks: Vec<_> =
        check_tasks.iter().filter_map(|&i| capped(Some(i), "--bound-completion-h", &mut notes)).collect();
    if lp_bound.is_none() && !args.bound_completion_h.is_empty() {
        notes.push("--bound-completion-h needs the LP (not solved or --lp-max-vars 0)".into());
    }
    let span = jobs.iter().map(|j| j.submit_s).fold(0.0, f64::max) / 3600.0;
    if loaded.trace.skipped > 0 {
        notes.push(format!(
            "--skip-invalid: {} trace rows skipped, {} jobs read",
            loaded.trace.skipped,
            loaded.trace.jobs.len()
        ));
        notes.extend(loaded.trace.diagnostics.iter().map(|d| format!("skipped {d}")));
    }
    let mut report = Report {
        trace: loaded.trace_name.clone(),
        fleet: loaded.fleet_name.clone(),
        seed: args.seed,
        jobs: jobs.len(),
        span_hours: span,
        lower_bound_usd: lb_usd,
        lp_bound,
        carbon_lp,
        completion_lp,
        carbon_cap_lp,
        bound_checks,
        bound_used,
        lower_bound_kg_co2: lb_co2,
        policies,
        targets: Vec::new(),
        notes,
    };
    report.evaluate_targets();
    Ok(report)
}

/// The `green` policy's carbon hold from `--carbon-hold-h` and `--carbon-hold-slack`.
fn carbon_hold(args: &SimulateArgs) -> Result<sim::CarbonHold> {
    let base = sim::CarbonHold::default();
    let h = args.carbon_hold_h;
    if !(h.is_finite() && (0.0..=base.forecast_s / 3600.0).contains(&h)) {
        bail!("--carbon-hold-h must be between 0 and {} (the forecast horizon), got {h}", base.forecast_s / 3600.0);
    }
    let k = args.carbon_hold_slack;
    if !(k.is_finite() && k >= 0.0) {
        bail!("--carbon-hold-slack must be finite and >= 0, got {k}");
    }
    let m = args.carbon_hold_min_saving;
    if !(m.is_finite() && (0.0..=1.0).contains(&m)) {
        bail!("--carbon-hold-min-saving must be between 0 and 1, got {m}");
    }
    if h == 0.0 {
        return Ok(sim::CarbonHold::off());
    }
    Ok(sim::CarbonHold { max_s: h * 3600.0, slack: k, min_saving: m, pause: args.carbon_pause, ..base })
}

/// Writes the tuned weights (if any) to `tuned-policy.toml` in `--out-dir`.
fn write_tuned(args: &SimulateArgs, table: Option<&str>) -> Result<()> {
    if let (Some(dir), Some(t)) = (&args.out_dir, table) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let f = dir.join("tuned-policy.toml");
        std::fs::write(&f, t).with_context(|| format!("writing {}", f.display()))?;
        eprintln!("wrote {}", f.display());
    }
    Ok(())
}

/// `fleetctl simulate`: load, replay, print the table, write the outputs.
pub fn run(args: SimulateArgs) -> Result<()> {
    let t0 = std::time::Instant::now();
    let loaded = load(&args)?;
    if let Some(goal) = crate::tune::goal(&args)? {
        if let Some(n) = args.tune_walk {
            let walked = crate::walk::walk(&args, &loaded, goal, n)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&walked).context("walk as JSON")?);
            } else {
                print!("{}", walked.text());
            }
            write_tuned(&args, walked.policy_toml.as_deref())?;
            eprintln!("walked over {} periods in {:.2} s", n, t0.elapsed().as_secs_f64());
            return Ok(());
        }
        let tuned = crate::tune::tune(&args, &loaded, goal)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&tuned).context("tuning as JSON")?);
        } else {
            print!("{}", tuned.text());
        }
        write_tuned(&args, tuned.policy_toml.as_deref())?;
        eprintln!("tuned over {} jobs in {:.2} s", tuned.tuning_jobs + tuned.held_out_jobs, t0.elapsed().as_secs_f64());
        return Ok(());
    }
    let report = run_loaded(&args, &loaded)?;
    if args.json {
        let text = serde_json::to_string_pretty(&report).context("report as JSON")?;
        println!("{text}");
    } else if args.summary {
        print!("{}", report.summary());
    } else {
        print!("{}", report.table());
    }
    if let Some(dir) = &args.out_dir {
        let files = crate::report::write_outputs(&report, dir)
            .with_context(|| format!("writing outputs to {}", dir.display()))?;
        for f in files {
            eprintln!("wrote {}", f.display());
        }
    }
    eprintln!("simulated {} jobs × {} runs in {:.2} s", report.jobs, report.policies.len(), t0.elapsed().as_secs_f64());
    Ok(())
}

/// Home labels of `rows` by total GPU-hours, largest first (ties by label).
pub fn labels_by_load(rows: &[crate::trace::TraceJob]) -> Vec<(String, f64)> {
    let mut m: BTreeMap<&str, f64> = BTreeMap::new();
    for r in rows {
        *m.entry(r.home_label.as_str()).or_default() += r.duration_s * r.gpus as f64 / 3600.0;
    }
    let mut v: Vec<(String, f64)> = m.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}
