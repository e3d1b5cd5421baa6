//! The discrete-event replay.
//!
//! The simulator owns time, capacity and accounting; every placement choice of the
//! engine policies comes from a [`Model`] (in production: [`crate::engine_model`], a thin
//! adapter over `fleet-engine`). Baselines reuse the model's feasible offers and only
//! change how one is picked, so they obey the very same hard constraints.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;

use fleet_engine::Pricing;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::report::{mean, percentile, JobFigures, PolicyReport};

/// A node pool of a cluster as the simulator sees it: a fixed number of GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimPool {
    pub name: String,
    pub gpu_type: String,
    pub gpus: u32,
    /// Index into the spot traces when this pool sells spot capacity.
    pub spot_trace: Option<usize>,
    /// The pool sells spot capacity (with no trace: always available, never reclaimed).
    pub sells_spot: bool,
    /// Owned hardware: its amortized USD per GPU-hour, a fixed cost whether used or not.
    pub owned_usd_per_gpu_hour: Option<f64>,
    /// Owned hardware: of that price, what a GPU costs only while used (power
    /// and cooling), where the fleet file gives it.
    pub owned_running_usd_per_gpu_hour: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimCluster {
    pub name: String,
    pub pools: Vec<SimPool>,
}

/// A job as replayed. `duration_s` is the trace run time, also given to the engine as
/// the user's estimate (the trace has no separate estimate).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimJob {
    pub id: usize,
    pub submit_s: f64,
    /// Work in seconds at the reference GPU's speed.
    pub duration_s: f64,
    pub gpus: u32,
    pub home: usize,
    pub interruptible: bool,
    /// 0 = never checkpoints (an eviction loses everything).
    pub checkpoint_s: f64,
    /// The job declares `checkpoint_s` (the engine is told it checkpoints) but
    /// writes none: every eviction loses all its work (a broken job; tests).
    pub writes_no_checkpoints: bool,
    /// GPU-model constraints and datasets of the generic trace format.
    pub extra: crate::trace::JobExtra,
    /// The trace's team label (cost per team in the report).
    pub team: String,
}

impl SimJob {
    /// The interval of the checkpoints the job really writes (0 = none).
    pub fn written_checkpoint_s(&self) -> f64 {
        if self.writes_no_checkpoints {
            0.0
        } else {
            self.checkpoint_s
        }
    }
}

/// The dynamic state of a pool handed to the model when it ranks offers.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolLoad {
    pub capacity: u32,
    pub free: u32,
    /// GPUs a job arriving now could start on at once: `free` less what the queue's
    /// head has reserved.
    pub start_free: u32,
    /// Spot GPUs available right now (spot trace fraction × capacity − spot GPUs in use).
    pub spot_free: u32,
    pub spot_fraction: f64,
    pub queued_jobs: usize,
    /// Estimated queue wait (s) of the job being placed if it joins this pool's queue
    /// now (0 when it fits in `start_free`); see `start_estimate`.
    pub est_wait_s: f64,
    /// Estimated wait (s) of the job being placed until it could start on this pool's
    /// spot capacity, when it cannot now (`spot_start_estimate`); infinite = none
    /// (no spot, not estimated, or the job fits on spot now).
    pub spot_wait_s: f64,
    /// The pool's spot recovery time (s): how long a job reclaimed from spot waits
    /// for it again — the mean of the waits after reclaims realized on this pool so
    /// far, with the spells below the trace's full level (times
    /// `PoolState::reclaim_wait_ratio`) as its prior (`PoolState::wait_after_reclaim_s`);
    /// 0 = none (no trace, none seen yet, or not handed to this strategy).
    pub spot_recovery_s: f64,
    /// While the pool's spot level is full: when it came back to full (the
    /// start of the window it is in, replay seconds); NaN otherwise.
    pub spot_full_since: f64,
    /// The pool's spot windows (at full) ended so far in the replay.
    pub spot_windows: Option<Arc<fleet_engine::SpotWindows>>,
}

impl Default for PoolLoad {
    fn default() -> Self {
        PoolLoad {
            capacity: 0,
            free: 0,
            start_free: 0,
            spot_free: 0,
            spot_fraction: 0.0,
            queued_jobs: 0,
            est_wait_s: 0.0,
            spot_wait_s: f64::INFINITY,
            spot_recovery_s: 0.0,
            spot_full_since: f64::NAN,
            spot_windows: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterLoad {
    pub up: bool,
    pub pools: Vec<PoolLoad>,
    /// Changes (to a number never used before in this process) whenever `up` or
    /// any of the pools' load, wait estimates included, may have changed: a model
    /// that copies the load may skip a cluster whose version it has copied for a
    /// job of the same size. 0 = unversioned, always read.
    pub version: u64,
}

/// A fresh [`ClusterLoad::version`].
fn next_version() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, AtomicOrdering::Relaxed)
}

/// One feasible placement for a job, as ranked by the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub cluster: usize,
    pub pool: usize,
    pub spot: bool,
    pub usd_per_gpu_hour: f64,
    /// One-off USD when the job lands there (dataset staging not yet done there,
    /// checkpoint transfer of a resumed job).
    pub egress_usd: f64,
    /// The model's score (lower is better); informative only.
    pub score: f64,
    /// Speed of the pool's GPUs relative to the reference GPU: the job's remaining
    /// work (reference seconds) runs in `work / speed` seconds here.
    pub speed: f64,
    /// Seconds the job holds its GPUs before doing work (node provisioning on
    /// cloud, checkpoint restore when resuming): billed, not progress.
    pub setup_s: f64,
    /// Seconds between the decision and joining the pool's queue (remote
    /// submission, dataset staging, checkpoint transfer): delay, not billed.
    pub delay_s: f64,
    /// What the engine expected of this placement when it ranked it (`None`
    /// for offers not scored by the engine).
    pub estimate: Option<Estimate>,
}

/// The engine's expectation of a placement beyond its run time, from its score's
/// breakdown (`fleet_engine::Breakdown`): the replay checks it against what the
/// job then went through (`report::EstimateCheck`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Hours of queue wait before the job starts (on spot: until spot is free).
    pub wait_h: f64,
    /// Every hour of delay the engine expects: the wait, remote submission,
    /// staging, setups, work lost at spot reclaims and waits for spot again.
    pub delay_h: f64,
}

impl Default for Offer {
    fn default() -> Self {
        Offer {
            cluster: 0,
            pool: 0,
            spot: false,
            usd_per_gpu_hour: 0.0,
            egress_usd: 0.0,
            score: 0.0,
            speed: 1.0,
            setup_s: 0.0,
            delay_s: 0.0,
            estimate: None,
        }
    }
}

/// A running job offered to the rebalancing pass.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningJob {
    pub job: usize,
    pub cluster: usize,
    pub pool: usize,
    pub spot: bool,
    pub gpus: u32,
    pub usd_per_gpu_hour: f64,
    pub remaining_s: f64,
    pub since_checkpoint_s: f64,
}

/// A migration proposal: stop `job` (losing work since its last checkpoint) and move
/// it to `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub job: usize,
    pub to: Offer,
}

/// What the simulator needs from the placement engine.
pub trait Model {
    fn clusters(&self) -> &[SimCluster];
    /// Feasible offers, best first, under `policy` (under `HOME_ONLY` a model may
    /// give only the home cluster's offers: the baseline takes no other).
    fn offers(&mut self, policy: &str, job: &SimJob, now: f64, load: &[ClusterLoad]) -> Vec<Offer>;
    /// kgCO2 of `gpus` GPUs of pool (`cluster`, `pool`) running over `[t0, t1)`.
    fn kg_co2(&self, cluster: usize, pool: usize, gpus: u32, t0: f64, t1: f64) -> f64;
    /// Every feasible option of a job (each pool and pricing) on an idle fleet,
    /// for the LP bound. Default: the lower-bound offers.
    fn options(&mut self, job: &SimJob) -> Vec<Offer> {
        let empty = idle_load(self.clusters());
        self.offers("lower-bound", job, job.submit_s, &empty)
    }
    /// The offer of the cheap lower bound: among the lower-bound offers on an idle
    /// fleet at the job's submission, the one with the lowest USD per unit of work
    /// (price ÷ speed); ties go to the first in the offers' order. Default: exactly
    /// that scan; a model may find the same offer faster.
    fn cheapest(&mut self, job: &SimJob) -> Option<Offer> {
        let empty = idle_load(self.clusters());
        let offers = self.offers("lower-bound", job, job.submit_s, &empty);
        offers.into_iter().min_by(|a, b| per_work(a).total_cmp(&per_work(b)))
    }
    /// The feasible offers under a baseline `policy` (one per cluster, as
    /// [`Model::offers`] gives them), unsorted, each with a floor of its USD per
    /// unit of work (price ÷ speed never below it). Offers come in nondecreasing
    /// order of their floors, so a caller that knows what it pays per unit of work
    /// may stop early: `visit` returns false to end the scan. Default: the sorted
    /// offers with floor 0 (no early stop).
    fn scan(
        &mut self,
        policy: &str,
        job: &SimJob,
        now: f64,
        load: &[ClusterLoad],
        visit: &mut dyn FnMut(f64, Offer) -> bool,
    ) {
        for o in self.offers(policy, job, now, load) {
            if !visit(0.0, o) {
                break;
            }
        }
    }
    /// The job lands on `offer` (its datasets are staged there from now on).
    fn landed(&mut self, _job: &SimJob, _offer: &Offer) {}
    /// Progress of a job about to be placed again: the share of its work saved in
    /// a checkpoint and the cluster that holds it (`None`: a fresh start).
    fn resume(&mut self, _job: &SimJob, _done_fraction: f64, _ckpt_at: Option<usize>) {}
    /// The job's spot history before it is placed again: times reclaimed from
    /// spot and hours of run time those reclaims lost (the engine's policies
    /// stop offering spot past their caps, `Policy::spot_max_reclaims`).
    fn spot_history(&mut self, _job: &SimJob, _reclaims: u32, _lost_h: f64) {}
    /// Migration proposals for running interruptible jobs.
    fn rebalance(
        &mut self,
        policy: &str,
        now: f64,
        jobs: &[SimJob],
        running: &[RunningJob],
        load: &[ClusterLoad],
    ) -> Vec<Move>;
}

/// How a run picks among the model's offers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Strategy {
    /// The engine's top-ranked offer under a named policy; rebalancing on.
    Engine(String),
    /// Only the job's home cluster, on-demand/on-prem (what users do today).
    HomeOnly,
    /// SkyPilot-like: cheapest compute price at submit among offers with free capacity
    /// now, else cheapest overall; on-demand only; no rebalancing.
    Greedy,
    /// Uniformly random feasible offer (seeded).
    Random,
    /// Greedy with spot for interruptible jobs; a preempted job is relaunched
    /// the same way from its last checkpoint (managed-spot tools).
    GreedySpot,
    /// Sibling submission to every feasible cluster; runs where it starts first.
    FirstStart,
}

/// Policy names the baselines ask the model for.
pub const HOME_ONLY: &str = "home-only";
pub const GREEDY: &str = "greedy";
pub const GREEDY_SPOT: &str = "greedy-spot";
pub const FIRST_START: &str = "first-start";
pub const RANDOM: &str = "random";

impl Strategy {
    pub fn name(&self) -> String {
        match self {
            Strategy::Engine(p) => p.clone(),
            Strategy::HomeOnly => "home-only".into(),
            Strategy::Greedy => "greedy".into(),
            Strategy::Random => "random".into(),
            Strategy::GreedySpot => GREEDY_SPOT.into(),
            Strategy::FirstStart => FIRST_START.into(),
        }
    }
}

/// Configurable simulation knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub seed: u64,
    /// Planned outages: (cluster index, start s, end s).
    pub outages: Vec<(usize, f64, f64)>,
    /// Rebalancing period for engine policies (0 = off).
    pub rebalance_every_s: f64,
    /// Plot bucket width.
    pub bucket_s: f64,
    /// Recompute every pool's load at every decision and rank the baselines' offers
    /// by sorting them all (the path before incremental pool state). The report is
    /// the same either way; kept so tests can prove it.
    pub full_rebuild: bool,
    /// Carbon-aware hold of flexible jobs (temporal shifting) for some engine policies.
    pub hold: CarbonHold,
    /// An experiment, not a policy (`--spot-oracle`): the engine policies are
    /// told the spot trace ahead of the clock on all-or-nothing pools (when the
    /// window they are in ends, when a shortfall ends, how long the shortfall
    /// after the window lasts) instead of estimates from the past. What that
    /// buys is what knowing the future is worth to them; the LP knows it all.
    pub spot_oracle: bool,
    /// An engine strategy's policy from a time on (seconds, policy name), in
    /// time order: the walk-forward of `--tune-walk` switches to the weights
    /// chosen for each period at its first submission. Baselines ignore it.
    /// An empty name switches back to the strategy's own policy.
    pub switches: Vec<(f64, String)>,
    /// Fill `PolicyReport::per_job`.
    pub per_job: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            outages: Vec::new(),
            rebalance_every_s: 3600.0,
            bucket_s: 6.0 * 3600.0,
            full_rebuild: false,
            hold: CarbonHold::off(),
            spot_oracle: false,
            switches: Vec::new(),
            per_job: false,
        }
    }
}

/// Carbon-aware hold (opt-in: `--carbon-hold-h`): at its first placement an
/// interruptible job of one of `policies` may be held back (as with Slurm's `--begin`) to start in the cleaner
/// hours of the next day, within a completion budget. The decision reads the zone's
/// carbon intensity only inside `[now, now + forecast_s]` (a day-ahead forecast; the
/// simulator takes the carbon series itself as that forecast); a run reaching past
/// the forecast is charged as if the forecast window repeated. When the hold ends
/// the job is placed afresh (the engine may pick another pool then).
#[derive(Debug, Clone, PartialEq)]
pub struct CarbonHold {
    /// Engine policies that hold jobs (empty = none).
    pub policies: Vec<String>,
    /// Longest single hold or pause, seconds (at most `forecast_s`).
    pub max_s: f64,
    /// Completion budget: a job's holds and pauses together last at most this × its
    /// run time on the pool the engine chose at its first placement.
    pub slack: f64,
    /// Forecast horizon the decision may read, seconds.
    pub forecast_s: f64,
    /// Candidate holds are multiples of this, seconds.
    pub step_s: f64,
    /// Hold only if the forecast kgCO2 of the run falls by at least this share of
    /// its forecast emissions over the next `forecast_s` (or its run, if shorter).
    pub min_saving: f64,
    /// Also pause running jobs at their next checkpoint when the coming hours are
    /// dirtier than later ones (the same rule as the start hold, within the same
    /// budget); they are placed afresh when the pause ends.
    pub pause: bool,
}

impl Default for CarbonHold {
    fn default() -> Self {
        CarbonHold {
            policies: vec!["green".into()],
            max_s: 24.0 * 3600.0,
            slack: 1.0,
            forecast_s: 24.0 * 3600.0,
            step_s: 3600.0,
            min_saving: 0.05,
            pause: true,
        }
    }
}

impl CarbonHold {
    /// No policy holds (the default: measured on 2026-12-02 it did not pay, see
    /// docs/simulator.md).
    pub fn off() -> CarbonHold {
        CarbonHold { policies: Vec::new(), ..CarbonHold::default() }
    }

    /// The completion budget of a run of `run_s` seconds: all its holds and pauses
    /// together last at most `slack × run_s` (each one at most `max_s`).
    pub fn budget_s(&self, run_s: f64) -> f64 {
        let b = self.slack * run_s;
        if b.is_finite() {
            b.max(0.0)
        } else {
            0.0
        }
    }

    /// kgCO2 of running over `[a, b]` (`a >= now`) by the forecast made at `now`:
    /// `kg(t0, t1)` is read only for `now <= t0 <= t1 <= now + forecast_s`; time past
    /// the horizon is charged as the same offset of the forecast window (it repeats).
    pub fn forecast_kg(&self, now: f64, a: f64, b: f64, kg: &mut dyn FnMut(f64, f64) -> f64) -> f64 {
        let f = self.forecast_s;
        // (NaN fails every `>`: also nothing to forecast.)
        if f.partial_cmp(&0.0) != Some(Ordering::Greater) || b.partial_cmp(&a) != Some(Ordering::Greater) {
            return 0.0;
        }
        let a = a.max(now);
        let mut day: Option<f64> = None;
        let mut sum = 0.0;
        let mut t = a;
        // Each pass ends a period or reaches b; the guard only bounds rounding.
        for _ in 0..64 {
            if t >= b {
                break;
            }
            let k = ((t - now) / f).floor().max(0.0);
            let base = now + k * f;
            let end = b.min(base + f);
            if t <= base && end >= base + f {
                // Whole periods at once.
                let n = ((b - base) / f).floor().max(1.0);
                let d = *day.get_or_insert_with(|| kg(now, now + f));
                sum += n * d;
                t = base + n * f;
                continue;
            }
            let (o0, o1) = ((t - base).clamp(0.0, f), (end - base).clamp(0.0, f));
            if o1 > o0 {
                sum += kg(now + o0, now + o1);
            }
            if end <= t {
                break;
            }
            t = end;
        }
        sum
    }

    /// The hold (seconds, a multiple of `step_s`, 0 = start now) that minimises the
    /// forecast kgCO2 of a run of `run_s` seconds that would start `lead_s` after
    /// `now`, within `budget` (and `max_s`, `forecast_s`); 0 unless it saves
    /// `min_saving`.
    pub fn hold_for(&self, now: f64, lead_s: f64, run_s: f64, budget: f64, kg: &mut dyn FnMut(f64, f64) -> f64) -> f64 {
        let budget = budget.min(self.max_s).min(self.forecast_s);
        let pos = |x: f64| x.partial_cmp(&0.0) == Some(Ordering::Greater);
        if !pos(self.step_s) || budget < self.step_s || !pos(run_s) {
            return 0.0;
        }
        let start = now + lead_s.max(0.0);
        let kg0 = self.forecast_kg(now, start, start + run_s, kg);
        let day = self.forecast_kg(now, start, start + run_s.min(self.forecast_s), kg);
        let (mut best_d, mut best) = (0.0, kg0);
        let steps = (budget / self.step_s).floor() as usize;
        for i in 1..=steps {
            let d = i as f64 * self.step_s;
            let v = self.forecast_kg(now, start + d, start + d + run_s, kg);
            if v < best {
                (best_d, best) = (d, v);
            }
        }
        if best_d > 0.0 && kg0 - best >= self.min_saving * day {
            best_d
        } else {
            0.0
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Ev {
    Arrival(usize),
    /// A held job's hold ends: it is placed now.
    Release(usize),
    /// A running job stops at its checkpoint for a carbon pause until `until`.
    Pause {
        job: usize,
        epoch: u32,
        until: f64,
    },
    /// The job joins its chosen pool's queue (after remote submission and staging).
    Ready {
        job: usize,
        gen: u32,
    },
    Finish {
        job: usize,
        epoch: u32,
    },
    /// Spot trace `trace` changes to `fraction` of its full level.
    Spot {
        trace: usize,
        fraction: f64,
    },
    OutageStart(usize),
    OutageEnd(usize),
    /// `SimConfig::switches[k]` takes effect.
    Switch(usize),
    Rebalance,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    t: f64,
    seq: u64,
    ev: Ev,
}
impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    // Min-heap on (t, seq) inside std's max-heap.
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

/// See `Sim::quick`.
#[derive(Debug, Clone, Copy, Default)]
struct Quick {
    /// `PoolLoad::start_free`, `spot_free` and `spot_fraction > 0` as last
    /// written.
    start_free: u32,
    spot_free: u32,
    spot_up: bool,
    has_spot: bool,
    /// The pool's entry in `Sim::markets`.
    market: u32,
    /// `PoolLoad::est_wait_s` is 0 (and, without spot, the spot wait infinite
    /// and the recovery 0, as they always are then).
    no_wait: bool,
    /// `PoolLoad::spot_wait_s` is infinite.
    no_spot_wait: bool,
    /// What `PoolLoad::spot_recovery_s` was computed from: 0 = it is 0 (reset,
    /// or not estimated), else the `SpotMarket::recovery_epoch` of the pool's market
    /// (the pool's own reclaim waits change only when it is touched, which
    /// resets this to 0).
    recovery_from: u64,
}

impl Quick {
    fn of(p: &PoolState, l: &PoolLoad) -> Quick {
        Quick {
            start_free: l.start_free,
            spot_free: l.spot_free,
            spot_up: l.spot_fraction > 0.0,
            has_spot: p.has_spot,
            market: p.market as u32,
            no_wait: true,
            no_spot_wait: true,
            recovery_from: 0,
        }
    }
}

/// What the replay's clock has shown of one spot trace so far (the pools that
/// follow the same trace see the same spells and windows, so they share it:
/// one copy to keep and to read per decision, however many pools use it).
#[derive(Debug, Clone, Default)]
struct SpotMarket {
    /// Start of the spell below the trace's full level it is in now (`None`:
    /// at full), as the replay's clock shows it (never the trace ahead).
    spell_since: Option<f64>,
    /// When the trace's spot level last came back to full (0 = the replay's
    /// start): the start of the spot window it is in while at full.
    full_since: f64,
    /// The windows at full ended so far (the first, open at the replay's
    /// start, is left out: its start is unknown), for the engine
    /// (`PoolLoad::spot_windows`).
    windows: Option<Arc<fleet_engine::SpotWindows>>,
    /// `full_since` is a window's real start (not the replay's).
    full_since_known: bool,
    /// The spells below full ended so far.
    spells: fleet_engine::SpotSpells,
    /// The pools (cluster, pool) that follow the trace.
    pools: Vec<(usize, usize)>,
    /// `recovery_s` at the decision being made (set by `Sim::load`), and a
    /// version of it, new whenever it changes (0 = not computed yet).
    recovery_now: f64,
    recovery_epoch: u64,
    /// With `SimConfig::spot_oracle`, what the trace says ahead of the clock
    /// (an experiment, not something a policy can know): the next change of
    /// level, and while at full the length of the shortfall after it.
    oracle: Option<SpotOracle>,
}

/// The trace ahead of the clock, for `SimConfig::spot_oracle`.
#[derive(Debug, Clone)]
struct SpotOracle {
    /// When the level changes next (the window ends, or the shortfall does).
    next_s: f64,
    /// While at full: how long the shortfall after this window lasts.
    gap_after_s: f64,
    /// While at full: the window it is in, its whole length (one window of
    /// exactly that length, so the engine's time to the first reclaim is exact).
    window: Option<Arc<fleet_engine::SpotWindows>>,
}

impl SpotMarket {
    /// How long spot that is short now should take to come back, from the
    /// spells below full ended so far (the replay's past only), conditional on
    /// the age of the spell the trace is in now (0 at full, or right at a
    /// reclaim): [`fleet_engine::SpotSpells::mean_remaining_s`].
    fn recovery_s(&self, now: f64) -> f64 {
        if let Some(o) = &self.oracle {
            return if self.spell_since.is_some() { (o.next_s - now).max(0.0) } else { o.gap_after_s };
        }
        let age = self.spell_since.map_or(0.0, |t0| (now - t0).max(0.0));
        self.spells.mean_remaining_s(age)
    }
}

/// `x.round() as u64` (half away from zero) without the libm call, which the
/// FIFO estimates make millions of times: exact for `0 ≤ x < 2^53` (where
/// `x as u64` is the floor and `x − floor` is exact), `round` itself elsewhere.
#[inline]
fn round_ms(x: f64) -> u64 {
    if (0.0..9_007_199_254_740_992.0).contains(&x) {
        let r = x as u64;
        r + u64::from(x - r as f64 >= 0.5)
    } else {
        x.round() as u64
    }
}

#[derive(Debug, Clone, Default)]
struct PoolState {
    cap: u32,
    used: u32,
    spot_used: u32,
    spot_fraction: f64,
    has_spot: bool,
    /// Index in `Sim::markets` of the spot trace the pool's spot follows (the
    /// last entry, never changed, for a pool without a trace).
    market: usize,
    /// Waits for spot after a reclaim ended so far on this pool (the job
    /// started on its spot capacity): count, Σ realized seconds, Σ estimated
    /// seconds (the uncalibrated estimate at the decision).
    reclaim_waits: (u32, f64, f64),
    queue: VecDeque<usize>,
    /// Jobs placed here that join the queue after their delay (remote
    /// submission, staging, checkpoint transfer), in placement order. The load
    /// counts them as queued ahead of the next job: without them a burst of
    /// placements at one instant (a spot market's drop re-places every job it
    /// reclaimed) saw the same free GPUs, each job was told it would start at
    /// once, and most then queued behind the others for days.
    inbound: Vec<usize>,
    /// Running spot jobs in start order (eviction takes the newest).
    running_spot: Vec<usize>,
    running: Vec<usize>,
}

/// Weight of the prior (realized = estimated) in [`PoolState::reclaim_wait_ratio`],
/// in waits of [`RECLAIM_PRIOR_S`] each.
const RECLAIM_PRIOR_WAITS: f64 = 5.0;
const RECLAIM_PRIOR_S: f64 = 3600.0;

impl PoolState {
    /// Realized ÷ estimated wait for spot after a reclaim on this pool, from the
    /// waits that ended so far (the prior: 1, worth [`RECLAIM_PRIOR_WAITS`] waits
    /// of an hour). Calibrates the post-reclaim spot wait and the recovery time
    /// the engine is given: an estimate from the trace alone misses the on-demand
    /// jobs that take the pool's GPUs while spot is away and the other reclaimed
    /// jobs queued ahead.
    fn reclaim_wait_ratio(&self) -> f64 {
        let (_, real, est) = self.reclaim_waits;
        let prior = RECLAIM_PRIOR_WAITS * RECLAIM_PRIOR_S;
        (real + prior) / (est + prior)
    }

    /// How long a job reclaimed from this pool's spot should expect to wait for
    /// it: the mean of the waits after reclaims realized here so far, with the
    /// trace's estimate (`recovery_s × ratio`) as a prior worth
    /// [`RECLAIM_PRIOR_WAITS`] waits. The trace's spells alone say how long
    /// spot stays short; a reclaimed job also waits behind the others reclaimed
    /// at the same drop (on the all-or-nothing traces every spot job of the pool
    /// is) and behind on-demand jobs that took the GPUs meanwhile: on cloud-spot's
    /// nebius-eun1 the realized waits after reclaims were 10,081 s on average
    /// where the spells (2,986 s, calibrated 3,700 s) said an hour.
    fn wait_after_reclaim_s(&self, recovery_s: f64, ratio: f64) -> f64 {
        let prior = recovery_s * ratio;
        let (n, real, _) = self.reclaim_waits;
        (real + RECLAIM_PRIOR_WAITS * prior) / (f64::from(n) + RECLAIM_PRIOR_WAITS)
    }

    fn spot_limit(&self) -> u32 {
        if !self.has_spot {
            return 0;
        }
        (self.spot_fraction * self.cap as f64 + 1e-9).floor() as u32
    }
}

#[derive(Debug, Clone, Default)]
struct JobState {
    at: Option<Offer>,
    progress_s: f64,
    run_start: Option<f64>,
    epoch: u32,
    first_start: Option<f64>,
    finish: Option<f64>,
    unplaced: bool,
    moved: bool,
    parked: bool,
    planned_end: f64,
    /// Placement generation (a Ready event of an older placement is stale).
    gen: u32,
    /// Setup seconds of the current run segment (provisioning, restore).
    setup_s: f64,
    /// Cluster holding the job's last checkpoint.
    ckpt_at: Option<usize>,
    /// Seconds the job was held or paused for carbon (`CarbonHold`), all told.
    held_s: Option<f64>,
    /// Its hold budget (`CarbonHold::budget_s` of its run at the first placement).
    hold_budget_s: f64,
    /// Epoch of the run segment a carbon pause is pending for.
    pause_epoch: Option<u32>,
    /// Times reclaimed from spot, and the run seconds those reclaims lost.
    spot_reclaims: u32,
    spot_lost_s: f64,
    /// Being placed right after a spot reclaim (set by `spot_change`).
    just_reclaimed: bool,
    /// Queued for spot after a reclaim: (decision time, cluster, pool,
    /// uncalibrated estimated wait s); measured when it starts there.
    reclaim_wait: Option<(f64, usize, usize, f64)>,
    /// USD (compute and egress) and kgCO2 charged to it so far.
    usd: f64,
    kg_co2: f64,
    /// At its first placement by an engine policy: the engine's expected first
    /// wait and completion (seconds from submission) and how it was placed.
    expected: Option<Expected>,
}

/// What the engine expected of a job at its first placement (seconds from its
/// submission), and the pricing of that placement.
#[derive(Debug, Clone, Copy)]
struct Expected {
    wait_s: f64,
    completion_s: f64,
    class: Pricing,
}

/// The estimate check's classes, in report order, and their labels.
const PRICINGS: [(Pricing, &str); 3] =
    [(Pricing::Onprem, "on-prem"), (Pricing::OnDemand, "on demand"), (Pricing::Spot, "spot")];

struct Sim<'a, M: Model> {
    model: &'a mut M,
    strategy: Strategy,
    cfg: &'a SimConfig,
    jobs: &'a [SimJob],
    js: Vec<JobState>,
    pools: Vec<Vec<PoolState>>,
    /// One per spot trace, then one (never changed) for pools without a trace.
    markets: Vec<SpotMarket>,
    /// Per pool, what `load` reads first to tell whether the pool's estimates
    /// can change at this decision (a few bytes per pool, so the pools that
    /// cannot are passed over without reading their state).
    quick: Vec<Vec<Quick>>,
    /// The heap buffer of `start_estimate` and `spot_start_estimate`, reused.
    ends_buf: std::cell::RefCell<Vec<std::cmp::Reverse<(u64, u32)>>>,
    up: Vec<bool>,
    heap: BinaryHeap<Event>,
    seq: u64,
    rng: ChaCha8Rng,
    parked: Vec<usize>,
    // accounting
    compute_usd: f64,
    egress_usd: f64,
    kg_co2: f64,
    lost_gpu_s: f64,
    setup_usd: f64,
    rework_usd: f64,
    preemptions: u64,
    outage_kills: u64,
    migrations: u64,
    /// One-off costs (egress) at their time.
    cost_events: Vec<(f64, f64)>,
    /// Compute USD per plot bucket, accrued while running.
    cost_buckets: Vec<f64>,
    /// Compute spend by (cluster, pool, spot).
    spend: BTreeMap<(usize, usize, bool), crate::report::Spend>,
    busy: Vec<Vec<f64>>, // per cluster, per bucket: GPU-seconds
    /// Reused buffer of the pools' load handed to the model, kept up to date
    /// incrementally (see `load`).
    load_buf: Vec<ClusterLoad>,
    /// The job being placed was just reclaimed from spot: its spot waits are
    /// calibrated by each pool's [`PoolState::reclaim_wait_ratio`].
    placing_reclaimed: bool,
    /// Pools changed since `load_buf` was computed, and the same as flags.
    dirty: Vec<(usize, usize)>,
    is_dirty: Vec<Vec<bool>>,
    /// USD (compute + egress) per team.
    team_usd: BTreeMap<String, f64>,
    /// GPU-seconds paid on owned pools.
    owned_busy_gpu_s: f64,
    /// USD of that busy time (each owned pool at its own amortized price).
    owned_used_usd: f64,
    /// The running cost of that busy time, where the pool gives one.
    owned_running_usd: f64,
    last_t: f64,
    arrivals_left: usize,
    settled: usize,
}

/// Seed of one run: the user seed mixed with the strategy name, so adding a policy to
/// a run does not change the others' random streams.
fn run_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Replay `jobs` (sorted by submit time) under `strategy`.
pub fn simulate<M: Model>(
    model: &mut M,
    strategy: Strategy,
    jobs: &[SimJob],
    spot: &[crate::spot::SpotTrace],
    cfg: &SimConfig,
    progress: &dyn Fn(u64),
) -> PolicyReport {
    let clusters = model.clusters().to_vec();
    let pools: Vec<Vec<PoolState>> = clusters
        .iter()
        .map(|c| {
            c.pools
                .iter()
                .map(|p| PoolState {
                    cap: p.gpus,
                    spot_fraction: if p.spot_trace.is_some() || p.sells_spot { 1.0 } else { 0.0 },
                    has_spot: p.spot_trace.is_some() || p.sells_spot,
                    market: p.spot_trace.filter(|&i| i < spot.len()).unwrap_or(spot.len()),
                    ..Default::default()
                })
                .collect()
        })
        .collect();
    let name = strategy.name();
    let mut sim = Sim {
        model,
        strategy,
        cfg,
        jobs,
        js: vec![JobState::default(); jobs.len()],
        pools,
        markets: vec![SpotMarket::default(); spot.len() + 1],
        quick: clusters.iter().map(|c| vec![Quick::default(); c.pools.len()]).collect(),
        ends_buf: Default::default(),
        up: vec![true; clusters.len()],
        heap: BinaryHeap::new(),
        seq: 0,
        rng: ChaCha8Rng::seed_from_u64(run_seed(cfg.seed, &name)),
        parked: Vec::new(),
        compute_usd: 0.0,
        egress_usd: 0.0,
        kg_co2: 0.0,
        lost_gpu_s: 0.0,
        setup_usd: 0.0,
        rework_usd: 0.0,
        preemptions: 0,
        outage_kills: 0,
        migrations: 0,
        cost_events: Vec::new(),
        cost_buckets: Vec::new(),
        spend: BTreeMap::new(),
        busy: vec![Vec::new(); clusters.len()],
        load_buf: Vec::new(),
        placing_reclaimed: false,
        dirty: Vec::new(),
        is_dirty: clusters.iter().map(|c| vec![false; c.pools.len()]).collect(),
        team_usd: BTreeMap::new(),
        owned_busy_gpu_s: 0.0,
        owned_used_usd: 0.0,
        owned_running_usd: 0.0,
        last_t: 0.0,
        arrivals_left: jobs.len(),
        settled: 0,
    };
    // Pushed before the arrivals: a switch at a job's submission applies to it.
    if matches!(sim.strategy, Strategy::Engine(_)) {
        for (k, (t, _)) in cfg.switches.iter().enumerate() {
            sim.push(*t, Ev::Switch(k));
        }
    }
    for (i, j) in jobs.iter().enumerate() {
        sim.push(j.submit_s, Ev::Arrival(i));
    }
    // Spot changes are generated one at a time as the clock reaches them, one
    // event per trace for all the pools that follow it.
    for (ci, c) in clusters.iter().enumerate() {
        for (pi, p) in c.pools.iter().enumerate() {
            if let Some(k) = p.spot_trace.filter(|&k| spot.get(k).is_some_and(|tr| tr.max > 0)) {
                sim.markets[k].pools.push((ci, pi));
            }
        }
    }
    for (k, tr) in spot.iter().enumerate() {
        if !sim.markets[k].pools.is_empty() {
            sim.push(0.0, Ev::Spot { trace: k, fraction: tr.fraction_at(0.0) });
        }
    }
    for &(c, s, e) in &cfg.outages {
        if c < clusters.len() && e > s {
            sim.push(s, Ev::OutageStart(c));
            sim.push(e, Ev::OutageEnd(c));
        }
    }
    if matches!(sim.strategy, Strategy::Engine(_)) && cfg.rebalance_every_s > 0.0 {
        sim.push(cfg.rebalance_every_s, Ev::Rebalance);
    }
    let mut done_arrivals = 0u64;
    while let Some(Event { t, ev, .. }) = sim.heap.pop() {
        // Stop once all jobs are done or unplaceable; spot/outage events alone do not
        // keep the clock running.
        if sim.arrivals_left == 0 && sim.all_settled() {
            break;
        }
        sim.last_t = t;
        match ev {
            Ev::Ready { job, gen } => {
                if sim.js[job].gen == gen && sim.js[job].run_start.is_none() {
                    sim.join_queue(job, t);
                }
            }
            Ev::Arrival(j) => {
                sim.arrivals_left -= 1;
                done_arrivals += 1;
                if done_arrivals & 1023 == 0 {
                    progress(done_arrivals);
                }
                sim.place(j, t);
            }
            Ev::Release(j) => sim.place(j, t),
            Ev::Pause { job, epoch, until } => {
                if sim.js[job].epoch == epoch && sim.js[job].run_start.is_some() {
                    sim.pause(job, t, until);
                }
            }
            Ev::Finish { job, epoch } => {
                if sim.js[job].epoch == epoch && sim.js[job].run_start.is_some() {
                    sim.finish(job, t);
                }
            }
            Ev::Spot { trace, fraction } => {
                if cfg.spot_oracle {
                    sim.markets[trace].oracle = spot.get(trace).and_then(|tr| spot_oracle(tr, fraction, t));
                }
                sim.spot_change(trace, fraction, t);
                if let Some((t2, f)) = spot.get(trace).and_then(|tr| tr.next_change(t)) {
                    sim.push(t2, Ev::Spot { trace, fraction: f });
                }
            }
            Ev::OutageStart(c) => sim.outage_start(c, t),
            Ev::OutageEnd(c) => sim.outage_end(c, t),
            Ev::Switch(k) => {
                let to = &cfg.switches[k].1;
                sim.strategy = Strategy::Engine(if to.is_empty() { name.clone() } else { to.clone() });
            }
            Ev::Rebalance => {
                sim.rebalance(t);
                sim.carbon_pauses(t);
                if !(sim.arrivals_left == 0 && sim.all_settled()) {
                    sim.push(t + cfg.rebalance_every_s, Ev::Rebalance);
                }
            }
        }
    }
    progress(jobs.len() as u64);
    // Jobs still waiting (e.g. parked after every feasible cluster went down for good).
    for s in sim.js.iter_mut() {
        if s.finish.is_none() && !s.unplaced {
            s.unplaced = true;
        }
    }
    sim.report(&clusters, name)
}

/// What `SimConfig::spot_oracle` hands the engine of trace `tr` at a change to
/// level `f` at `now`: the next change, and at full the shortfall after it.
/// Only all-or-nothing traces (a drop reclaims every spot job, so the window's
/// end is each job's reclaim); `None` for the others.
fn spot_oracle(tr: &crate::spot::SpotTrace, f: f64, now: f64) -> Option<SpotOracle> {
    if !tr.is_all_or_nothing() {
        return None;
    }
    let next_s = tr.next_change(now).map_or(f64::INFINITY, |c| c.0);
    let gap_after_s = if f >= 1.0 && next_s.is_finite() {
        tr.next_change(next_s).map_or(f64::INFINITY, |c| c.0 - next_s)
    } else {
        0.0
    };
    Some(SpotOracle { next_s, gap_after_s, window: None })
}

impl<M: Model> Sim<'_, M> {
    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Event { t, seq: self.seq, ev });
    }

    fn all_settled(&self) -> bool {
        self.settled == self.jobs.len()
    }

    /// The pools' load as a job of `gpus` GPUs arriving at `now` sees it. `estimate`:
    /// fill in `est_wait_s` (left 0 for the baselines that put no value on time).
    ///
    /// Incremental: the buffer handed out last time is kept (`load_buf`) and only the
    /// pools changed since (`touch`) are recomputed; the wait estimate, which depends
    /// on the job's size and the time, is redone for the pools the job does not fit
    /// in now. A missing buffer (or `SimConfig::full_rebuild`) recomputes every pool.
    fn load(&mut self, now: f64, gpus: u32, estimate: bool) -> Vec<ClusterLoad> {
        // One buffer reused for every decision (no allocation per placement).
        let mut buf = std::mem::take(&mut self.load_buf);
        if self.cfg.full_rebuild || buf.len() != self.pools.len() {
            buf.resize_with(self.pools.len(), ClusterLoad::default);
            for (ci, (ps, cl)) in self.pools.iter().zip(buf.iter_mut()).enumerate() {
                cl.pools.resize_with(ps.len(), PoolLoad::default);
                for (pi, p) in ps.iter().enumerate() {
                    self.pool_load(ci, pi, cl);
                    self.quick[ci][pi] = Quick::of(p, &cl.pools[pi]);
                }
            }
            for &(c, p) in &self.dirty {
                self.is_dirty[c][p] = false;
            }
            self.dirty.clear();
        } else {
            for &(c, p) in &self.dirty {
                self.is_dirty[c][p] = false;
                self.pool_load(c, p, &mut buf[c]);
                self.quick[c][p] = Quick::of(&self.pools[c][p], &buf[c].pools[p]);
            }
            self.dirty.clear();
        }
        // Only the engine policies may queue for spot (the baselines launch on spot
        // when it is free, else fail over).
        let spot_estimate = estimate && matches!(self.strategy, Strategy::Engine(_));
        let reclaimed = self.placing_reclaimed;
        if spot_estimate {
            for m in &mut self.markets {
                let x = m.recovery_s(now);
                if x.to_bits() != m.recovery_now.to_bits() || m.recovery_epoch == 0 {
                    m.recovery_now = x;
                    m.recovery_epoch = next_version();
                }
            }
        }
        let mut quick = std::mem::take(&mut self.quick);
        for ((ps, cl), qs) in self.pools.iter().zip(buf.iter_mut()).zip(quick.iter_mut()) {
            let mut changed = false;
            for ((p, pl), q) in ps.iter().zip(cl.pools.iter_mut()).zip(qs.iter_mut()) {
                // Nothing to estimate and nothing that would change: the job fits
                // now (or no estimate is asked for) where no wait is written, and
                // the pool has no spot, or the job fits on its spot now where no
                // spot wait is written (or none is estimated) and the recovery
                // written is from the market's latest.
                let fits = gpus <= q.start_free;
                if q.no_wait && (fits || !estimate) {
                    if !q.has_spot {
                        continue;
                    }
                    let spot_now = fits && gpus <= q.spot_free && q.spot_up;
                    let from = if spot_estimate { self.markets[q.market as usize].recovery_epoch } else { 0 };
                    if q.no_spot_wait && (spot_now || !spot_estimate) && q.recovery_from == from {
                        continue;
                    }
                }
                let w = if gpus <= pl.start_free || !estimate { 0.0 } else { self.start_estimate(p, now, gpus) - now };
                if w.to_bits() != pl.est_wait_s.to_bits() {
                    pl.est_wait_s = w;
                    changed = true;
                }
                q.no_wait = w.to_bits() == 0f64.to_bits();
                let m = &self.markets[p.market];
                let spot_now = gpus <= pl.start_free && gpus <= pl.spot_free && pl.spot_fraction > 0.0;
                let ratio = if spot_estimate { p.reclaim_wait_ratio() } else { 1.0 };
                let sw = if spot_estimate && p.has_spot && !spot_now {
                    let raw = self.spot_start_estimate(p, now, gpus, m.recovery_now) - now;
                    if reclaimed {
                        raw * ratio
                    } else {
                        raw
                    }
                } else {
                    f64::INFINITY
                };
                if sw.to_bits() != pl.spot_wait_s.to_bits() {
                    pl.spot_wait_s = sw;
                    changed = true;
                }
                // Every spot option pays the waits for spot after its expected
                // reclaims: the waits after reclaims realized so far, the spells
                // seen so far (calibrated) as their prior.
                let back = if spot_estimate { p.wait_after_reclaim_s(m.recovery_now, ratio) } else { 0.0 };
                if back.to_bits() != pl.spot_recovery_s.to_bits() {
                    pl.spot_recovery_s = back;
                    changed = true;
                }
                q.no_spot_wait = sw == f64::INFINITY;
                q.recovery_from = if spot_estimate { m.recovery_epoch } else { 0 };
            }
            if changed {
                cl.version = next_version();
            }
        }
        self.quick = quick;
        buf
    }

    /// The load of pool (`ci`, `pi`) but its wait estimate, written into `cl`.
    fn pool_load(&self, ci: usize, pi: usize, cl: &mut ClusterLoad) {
        let p = &self.pools[ci][pi];
        let m = &self.markets[p.market];
        cl.up = self.up[ci];
        cl.version = next_version();
        let free = if self.up[ci] { p.cap.saturating_sub(p.used) } else { 0 };
        // GPUs of the jobs on their way here (all, and those bound for spot):
        // they take free GPUs before a job placed now.
        let (inbound, inbound_spot) = p.inbound.iter().fold((0u32, 0u32), |(a, s), &j| {
            let g = self.jobs[j].gpus;
            let spot = self.js[j].at.as_ref().is_some_and(|o| o.spot);
            (a.saturating_add(g), if spot { s.saturating_add(g) } else { s })
        });
        let spot_free =
            free.saturating_sub(inbound).min(p.spot_limit().saturating_sub(p.spot_used).saturating_sub(inbound_spot));
        // GPUs a newcomer may take now: what the queue's head has not
        // reserved (the others could not start in it, see `try_start`) and
        // the jobs on their way will not take.
        let start_free = match p.queue.front() {
            Some(&h) => free - free.min(self.jobs[h].gpus),
            None => free,
        }
        .saturating_sub(inbound);
        cl.pools[pi] = PoolLoad {
            capacity: p.cap,
            free,
            start_free,
            spot_free,
            spot_fraction: p.spot_fraction,
            queued_jobs: p.queue.len(),
            est_wait_s: 0.0,
            spot_wait_s: f64::INFINITY,
            spot_recovery_s: 0.0,
            spot_full_since: if p.has_spot && p.spot_fraction >= 1.0 { m.full_since } else { f64::NAN },
            spot_windows: match m.oracle.as_ref().and_then(|o| o.window.as_ref()) {
                Some(w) if p.spot_fraction >= 1.0 => Some(w.clone()),
                _ => m.windows.clone(),
            },
        };
    }

    /// Pool (`c`, `p`) changed (GPUs in use, queue, spot capacity, health): its load
    /// is recomputed at the next decision.
    fn touch(&mut self, c: usize, p: usize) {
        if !std::mem::replace(&mut self.is_dirty[c][p], true) {
            self.dirty.push((c, p));
        }
    }

    /// When a job of `gpus` GPUs joining the back of `p`'s queue now would start, the
    /// way Slurm estimates start times: running jobs end at their planned ends (time
    /// limits there; the trace's run times here), queued jobs start in FIFO order as
    /// soon as their GPUs are free and then hold them for their remaining run time.
    /// Backfill is ignored (it can only make the start earlier).
    fn start_estimate(&self, p: &PoolState, now: f64, gpus: u32) -> f64 {
        let queued = p.queue.iter().chain(&p.inbound).map(|&j| self.queued_hold(j));
        self.fifo_start(&p.running, queued, p.cap.saturating_sub(p.used), u32::MAX, now, now, gpus)
    }

    /// A queued job's GPUs and how long it holds them: its setup and the rest
    /// of its work at the speed of the pool it queues for.
    fn queued_hold(&self, j: usize) -> (u32, f64) {
        let (speed, setup) =
            self.js[j].at.as_ref().map(|o| (o.speed.max(1e-9), o.setup_s.max(0.0))).unwrap_or((1.0, 0.0));
        (self.jobs[j].gpus, setup + (self.jobs[j].duration_s - self.js[j].progress_s) / speed)
    }

    /// When a job of `gpus` GPUs would start behind `queued` ((GPUs, hold
    /// seconds) in queue order, each starting as soon as its GPUs are free) with
    /// `free` GPUs free now, never more than `level` at once, and `running`
    /// releasing theirs at their planned ends; not before `from`. Infinite when
    /// it never fits. The heap of ends lives in a buffer reused across calls.
    #[allow(clippy::too_many_arguments)]
    fn fifo_start(
        &self,
        running: &[usize],
        queued: impl Iterator<Item = (u32, f64)>,
        mut free: u32,
        level: u32,
        now: f64,
        from: f64,
        gpus: u32,
    ) -> f64 {
        use std::cmp::Reverse;
        // (end in ms, GPUs released), earliest first. Integer ms keep the heap total.
        let key = |t: f64| round_ms(t.max(now) * 1000.0);
        let mut v = self.ends_buf.take();
        v.clear();
        v.extend(running.iter().map(|&j| Reverse((key(self.js[j].planned_end), self.jobs[j].gpus))));
        let mut ends = BinaryHeap::from(v);
        let mut t = key(from);
        let start = || {
            for (g, run_s) in queued.chain(std::iter::once((gpus, 0.0))) {
                if g > level {
                    return f64::INFINITY;
                }
                while free < g {
                    let Some(Reverse((end, r))) = ends.pop() else {
                        return f64::INFINITY;
                    };
                    free += r;
                    t = t.max(end);
                }
                free -= g;
                ends.push(Reverse((t + round_ms(run_s.max(0.0) * 1000.0), g)));
            }
            t as f64 / 1000.0
        };
        let r = start();
        self.ends_buf.replace(ends.into_vec());
        r
    }

    /// When a spot job of `gpus` GPUs joining `p`'s queue now would start on the
    /// pool's spot capacity: the later of [`Sim::start_estimate`] (GPUs of the pool)
    /// and the same FIFO estimate over the spot capacity alone (running spot jobs end
    /// at their planned ends, queued spot jobs start first). When the spot level now
    /// is below the job's GPUs, the level is taken to come back in full after the
    /// mean spell below full seen so far ([`SpotMarket::recovery_s`]: the replay's
    /// past only). Infinite when the job can never run on spot here.
    fn spot_start_estimate(&self, p: &PoolState, now: f64, gpus: u32, recovery: f64) -> f64 {
        if !p.has_spot || gpus > p.cap {
            return f64::INFINITY;
        }
        let limit = p.spot_limit();
        let (level, back) = if limit >= gpus { (limit, now) } else { (p.cap, now + recovery) };
        if limit < gpus && recovery <= 0.0 {
            return f64::INFINITY;
        }
        let queued = p
            .queue
            .iter()
            .chain(&p.inbound)
            .filter(|&&j| self.js[j].at.as_ref().is_some_and(|o| o.spot))
            .map(|&j| self.queued_hold(j));
        let spot_t =
            self.fifo_start(&p.running_spot, queued, level.saturating_sub(p.spot_used), level, now, back, gpus);
        spot_t.max(self.start_estimate(p, now, gpus))
    }

    /// What running the rest of job `j` on `o` costs: compute for the remaining
    /// work at the pool's speed plus setup, and the one-off egress.
    fn job_cost(&self, j: usize, o: &Offer) -> f64 {
        let job = &self.jobs[j];
        let run_s = (job.duration_s - self.js[j].progress_s).max(0.0) / o.speed.max(1e-9) + o.setup_s;
        o.usd_per_gpu_hour * job.gpus as f64 * run_s / 3600.0 + o.egress_usd
    }

    fn choose(&mut self, j: usize, now: f64) -> Option<Offer> {
        let estimate = !matches!(self.strategy, Strategy::HomeOnly | Strategy::Greedy | Strategy::GreedySpot);
        let load = self.load(now, self.jobs[j].gpus, estimate);
        let r = if self.cfg.full_rebuild { self.choose_full(j, now, &load) } else { self.choose_with(j, now, &load) };
        self.load_buf = load;
        r
    }

    /// The baselines' choice from one unsorted scan of the offers, the same offer as
    /// [`Sim::choose_full`] (which sorts every offer first): each rule's minimum is
    /// taken with ties broken by the offers' order ([`offer_order`]), which is what
    /// `min_by` over the sorted list keeps (its first minimum). Greedy stops the scan
    /// once a cluster's floor of USD per unit of work × the job's work exceeds the
    /// cheapest launch with capacity now (nothing later can be as cheap).
    fn choose_with(&mut self, j: usize, now: f64, load: &[ClusterLoad]) -> Option<Offer> {
        let jobs = self.jobs;
        let job = &jobs[j];
        let home = job.home;
        let left_s = (job.duration_s - self.js[j].progress_s).max(0.0);
        // Same arithmetic as `job_cost`.
        let cost = |o: &Offer| {
            let run_s = left_s / o.speed.max(1e-9) + o.setup_s;
            o.usd_per_gpu_hour * job.gpus as f64 * run_s / 3600.0 + o.egress_usd
        };
        // Keeps `best` the first minimum under `by`, the offers' order breaking ties.
        let keep = |best: &mut Option<Offer>, o: &Offer, by: &dyn Fn(&Offer, &Offer) -> Ordering| {
            let better = best.as_ref().is_none_or(|b| by(o, b).then_with(|| offer_order(home, o, b)) == Ordering::Less);
            if better {
                *best = Some(o.clone());
            }
        };
        match self.strategy.clone() {
            Strategy::Engine(_) | Strategy::HomeOnly => self.choose_full(j, now, load),
            Strategy::Greedy | Strategy::GreedySpot => {
                let spot_ok = self.strategy == Strategy::GreedySpot;
                let name = if spot_ok { GREEDY_SPOT } else { GREEDY };
                // A lower bound of any offer's cost per unit of floor (its compute for
                // the work left), with room for rounding: the floor is price ÷ speed
                // rounded once, the cost a few more operations.
                let work_gpu_h = job.gpus as f64 * left_s / 3600.0 * (1.0 - 1e-9);
                let by_cost = |a: &Offer, b: &Offer| cost(a).total_cmp(&cost(b));
                let (mut free_now, mut any): (Option<Offer>, Option<Offer>) = (None, None);
                self.model.scan(name, job, now, load, &mut |floor, o| {
                    if let Some(f) = &free_now {
                        if floor * work_gpu_h > cost(f) {
                            return false;
                        }
                    }
                    if !spot_ok && o.spot {
                        return true;
                    }
                    let p = &load[o.cluster].pools[o.pool];
                    let have = if o.spot { p.spot_free.min(p.start_free) } else { p.start_free };
                    if have >= job.gpus && p.queued_jobs == 0 {
                        keep(&mut free_now, &o, &by_cost);
                    }
                    if free_now.is_none() {
                        keep(&mut any, &o, &by_cost);
                    }
                    true
                });
                free_now.or(any)
            }
            Strategy::FirstStart => {
                let start = |o: &Offer| o.delay_s + load[o.cluster].pools[o.pool].est_wait_s;
                let by = |a: &Offer, b: &Offer| start(a).total_cmp(&start(b)).then(cost(a).total_cmp(&cost(b)));
                let mut best = None;
                self.model.scan(FIRST_START, job, now, load, &mut |_, o| {
                    keep(&mut best, &o, &by);
                    true
                });
                best
            }
            Strategy::Random => {
                let mut offers = Vec::new();
                self.model.scan(RANDOM, job, now, load, &mut |_, o| {
                    offers.push(o);
                    true
                });
                if offers.is_empty() {
                    None
                } else {
                    // The k-th in the offers' order (a strict total order: one offer
                    // per cluster), as the sorted list would give it.
                    let k = self.rng.gen_range(0..offers.len());
                    let (_, kth, _) = offers.select_nth_unstable_by(k, |a, b| offer_order(home, a, b));
                    Some(kth.clone())
                }
            }
        }
    }

    /// The choice as made before the incremental path: every offer of the model,
    /// sorted, then picked by the strategy's rule. Kept as the reference the fast
    /// path is tested against (`SimConfig::full_rebuild`).
    fn choose_full(&mut self, j: usize, now: f64, load: &[ClusterLoad]) -> Option<Offer> {
        let job = &self.jobs[j];
        let cheapest = |sim: &Self, offers: &mut dyn Iterator<Item = &Offer>| {
            offers.min_by(|a, b| sim.job_cost(j, a).total_cmp(&sim.job_cost(j, b))).cloned()
        };
        match self.strategy.clone() {
            Strategy::Engine(p) => self.model.offers(&p, job, now, load).into_iter().next(),
            Strategy::HomeOnly => {
                let offers = self.model.offers(HOME_ONLY, job, now, load);
                cheapest(self, &mut offers.iter().filter(|o| o.cluster == job.home && !o.spot))
            }
            Strategy::Greedy | Strategy::GreedySpot => {
                // SkyPilot-like: the cheapest launch that has capacity now, else the
                // cheapest overall (failover). Spot only for greedy-spot and only for
                // interruptible jobs (the model offers spot only then).
                let spot_ok = self.strategy == Strategy::GreedySpot;
                let name = if spot_ok { GREEDY_SPOT } else { GREEDY };
                let offers: Vec<Offer> =
                    self.model.offers(name, job, now, load).into_iter().filter(|o| spot_ok || !o.spot).collect();
                let free_now = cheapest(
                    self,
                    &mut offers.iter().filter(|o| {
                        let p = &load[o.cluster].pools[o.pool];
                        let have = if o.spot { p.spot_free.min(p.start_free) } else { p.start_free };
                        have >= job.gpus && p.queued_jobs == 0
                    }),
                );
                free_now.or_else(|| cheapest(self, &mut offers.iter()))
            }
            Strategy::FirstStart => {
                // Sibling submission (Slurm federation): the job is queued everywhere
                // it may run and runs where it starts first; modelled as the offer
                // with the earliest estimated start (delay + FIFO start estimate),
                // cheaper first on ties.
                let offers = self.model.offers(FIRST_START, job, now, load);
                offers
                    .iter()
                    .min_by(|a, b| {
                        let sa = a.delay_s + load[a.cluster].pools[a.pool].est_wait_s;
                        let sb = b.delay_s + load[b.cluster].pools[b.pool].est_wait_s;
                        sa.total_cmp(&sb).then(self.job_cost(j, a).total_cmp(&self.job_cost(j, b)))
                    })
                    .cloned()
            }
            Strategy::Random => {
                let offers = self.model.offers(RANDOM, job, now, load);
                if offers.is_empty() {
                    None
                } else {
                    let k = self.rng.gen_range(0..offers.len());
                    offers.into_iter().nth(k)
                }
            }
        }
    }

    fn place(&mut self, j: usize, now: f64) {
        let reclaimed = std::mem::take(&mut self.js[j].just_reclaimed);
        self.js[j].reclaim_wait = None;
        let done = self.js[j].progress_s / self.jobs[j].duration_s.max(1e-9);
        self.model.resume(&self.jobs[j], done, self.js[j].ckpt_at);
        if self.js[j].spot_reclaims > 0 {
            let s = &self.js[j];
            self.model.spot_history(&self.jobs[j], s.spot_reclaims, s.spot_lost_s / 3600.0);
        }
        self.placing_reclaimed = reclaimed;
        let chosen = self.choose(j, now);
        self.placing_reclaimed = false;
        match chosen {
            Some(o) => {
                // Queued for spot after a reclaim: its wait is measured when it
                // starts, against the estimate before calibration.
                if reclaimed && o.spot {
                    let w = self.load_buf.get(o.cluster).and_then(|c| c.pools.get(o.pool)).map(|p| p.spot_wait_s);
                    if let Some(w) = w.filter(|w| w.is_finite()) {
                        let est = w / self.pools[o.cluster][o.pool].reclaim_wait_ratio();
                        self.js[j].reclaim_wait = Some((now, o.cluster, o.pool, est));
                    }
                }
                let d = self.carbon_hold(j, &o, now);
                self.expect(j, &o, now, d);
                if d > 0.0 {
                    self.js[j].held_s = Some(d);
                    self.push(now + d, Ev::Release(j));
                } else {
                    self.enqueue(j, o, now)
                }
            }
            None => {
                if self.up.iter().any(|u| !u) {
                    self.js[j].parked = true;
                    self.parked.push(j);
                } else {
                    self.js[j].unplaced = true;
                    self.settled += 1;
                }
            }
        }
    }

    /// Pool `p` of cluster `c` is owned hardware (amortized, not rented).
    fn owned(&self, c: usize, p: usize) -> bool {
        self.model.clusters().get(c).and_then(|x| x.pools.get(p)).is_some_and(|x| x.owned_usd_per_gpu_hour.is_some())
    }

    /// Keep what the engine expects of job `j`'s first placement `o` (held `hold_s`
    /// for carbon before it goes), for the report's estimate check: its first
    /// wait and its completion, from its submission. Engine policies only (the
    /// baselines do not read the engine's estimates).
    fn expect(&mut self, j: usize, o: &Offer, now: f64, hold_s: f64) {
        let (Strategy::Engine(_), Some(e), None) = (&self.strategy, o.estimate, self.js[j].expected) else {
            return;
        };
        let job = &self.jobs[j];
        let before = now - job.submit_s + hold_s;
        let run_s = (job.duration_s - self.js[j].progress_s).max(0.0) / o.speed.max(1e-9);
        let owned = self.owned(o.cluster, o.pool);
        let class = if o.spot {
            Pricing::Spot
        } else if owned {
            Pricing::Onprem
        } else {
            Pricing::OnDemand
        };
        self.js[j].expected = Some(Expected {
            wait_s: before + o.delay_s + e.wait_h * 3600.0,
            completion_s: before + e.delay_h * 3600.0 + run_s,
            class,
        });
    }

    /// Seconds to hold job `j` (first placement of an interruptible job under a
    /// policy of `cfg.hold`), judged on the pool the engine chose now.
    fn carbon_hold(&mut self, j: usize, o: &Offer, now: f64) -> f64 {
        let job = &self.jobs[j];
        let s = &self.js[j];
        let Strategy::Engine(p) = &self.strategy else {
            return 0.0;
        };
        let rule = &self.cfg.hold;
        if !job.interruptible || s.held_s.is_some() || s.progress_s > 0.0 || !rule.policies.iter().any(|x| x == p) {
            return 0.0;
        }
        let run_s = job.duration_s / o.speed.max(1e-9) + o.setup_s.max(0.0);
        let model = &*self.model;
        let (c, pool, g) = (o.cluster, o.pool, job.gpus);
        let budget = rule.budget_s(run_s);
        let d = rule.hold_for(now, o.delay_s, run_s, budget, &mut |a, b| model.kg_co2(c, pool, g, a, b));
        debug_assert!(d <= budget);
        self.js[j].hold_budget_s = budget;
        d
    }

    /// The carbon pause pass (hourly, with rebalancing): a running interruptible job
    /// of a holding policy stops at its next checkpoint if the forecast says its
    /// remaining run emits less when started `d` later, within what is left of its
    /// hold budget. Jobs that never checkpoint are not paused.
    fn carbon_pauses(&mut self, now: f64) {
        let Strategy::Engine(p) = &self.strategy else {
            return;
        };
        let rule = &self.cfg.hold;
        if !rule.pause || !rule.policies.iter().any(|x| x == p) {
            return;
        }
        let mut pauses = Vec::new();
        for ps in &self.pools {
            for pool in ps {
                for &j in &pool.running {
                    let job = &self.jobs[j];
                    let s = &self.js[j];
                    let ck = job.checkpoint_s;
                    if !job.interruptible || ck.is_nan() || ck <= 0.0 || s.pause_epoch == Some(s.epoch) {
                        continue;
                    }
                    let (Some(start), Some(o)) = (s.run_start, s.at.as_ref()) else { continue };
                    let left = s.hold_budget_s - s.held_s.unwrap_or(0.0);
                    if left < rule.step_s {
                        continue;
                    }
                    let worked = (now - start - s.setup_s).max(0.0);
                    let speed = o.speed.max(1e-9);
                    // The next checkpoint (not yet working: the first one after setup).
                    let to_ck = if now < start + s.setup_s { start + s.setup_s - now + ck } else { ck - worked % ck };
                    let remaining = ((job.duration_s - s.progress_s) / speed - worked - to_ck).max(0.0);
                    if remaining < rule.step_s {
                        continue;
                    }
                    let model = &*self.model;
                    let (c, pl, g) = (o.cluster, o.pool, job.gpus);
                    let d = rule.hold_for(now, to_ck, remaining, left, &mut |a, b| model.kg_co2(c, pl, g, a, b));
                    if d > 0.0 {
                        pauses.push((j, now + to_ck, now + to_ck + d, s.epoch));
                    }
                }
            }
        }
        pauses.sort_by_key(|x| x.0);
        for (j, at, until, epoch) in pauses {
            self.js[j].pause_epoch = Some(epoch);
            self.push(at, Ev::Pause { job: j, epoch, until });
        }
    }

    /// Stop job `j` at its checkpoint (no work lost) and place it again at `until`.
    fn pause(&mut self, j: usize, now: f64, until: f64) {
        let Some(o) = self.js[j].at.clone() else {
            return;
        };
        let speed = o.speed.max(1e-9);
        let seg = self.stop(j, now);
        let worked = (seg - self.js[j].setup_s).max(0.0);
        let s = &mut self.js[j];
        s.progress_s = (s.progress_s + worked * speed).min(self.jobs[j].duration_s);
        s.ckpt_at = Some(o.cluster);
        *s.held_s.get_or_insert(0.0) += until - now;
        debug_assert!(s.held_s.unwrap_or(0.0) <= s.hold_budget_s + 1e-6);
        self.push(until, Ev::Release(j));
        self.try_start(o.cluster, o.pool, now);
    }

    /// The job is sent to `o`: egress is paid now (data staged there is kept for
    /// later placements), and it joins the pool's queue after `o.delay_s`.
    fn enqueue(&mut self, j: usize, o: Offer, now: f64) {
        let job = &self.jobs[j];
        if o.cluster != job.home {
            self.js[j].moved = true;
        }
        if o.egress_usd > 0.0 {
            self.egress_usd += o.egress_usd;
            self.js[j].usd += o.egress_usd;
            *self.team_usd.entry(job.team.clone()).or_default() += o.egress_usd;
            self.cost_events.push((now, o.egress_usd));
        }
        self.model.landed(job, &o);
        let delay = o.delay_s.max(0.0);
        self.leave_inbound(j);
        let (c, p) = (o.cluster, o.pool);
        self.js[j].at = Some(o);
        self.js[j].gen += 1;
        if delay > 0.0 {
            let gen = self.js[j].gen;
            self.pools[c][p].inbound.push(j);
            self.touch(c, p);
            self.push(now + delay, Ev::Ready { job: j, gen });
        } else {
            self.join_queue(j, now);
        }
    }

    /// Job `j` is no longer on its way to the pool of its placement (it joins
    /// the queue there, or is placed elsewhere first).
    fn leave_inbound(&mut self, j: usize) {
        let Some((c, p)) = self.js[j].at.as_ref().map(|o| (o.cluster, o.pool)) else {
            return;
        };
        let inbound = &mut self.pools[c][p].inbound;
        if let Some(k) = inbound.iter().position(|&x| x == j) {
            inbound.remove(k);
            self.touch(c, p);
        }
    }

    fn join_queue(&mut self, j: usize, now: f64) {
        self.leave_inbound(j);
        let Some((c, p)) = self.js[j].at.as_ref().map(|o| (o.cluster, o.pool)) else {
            return;
        };
        self.pools[c][p].queue.push_back(j);
        self.touch(c, p);
        self.try_start(c, p, now);
    }

    /// Start queued jobs in FIFO order; the first job that does not fit gets its GPUs
    /// reserved (so it cannot be starved by smaller jobs behind it); later jobs may
    /// backfill only into GPUs beyond that reservation. Gang: a job starts only when all
    /// of its GPUs are free at once.
    fn try_start(&mut self, c: usize, p: usize, now: f64) {
        if !self.up[c] {
            return;
        }
        let ps = &self.pools[c][p];
        let mut avail = ps.cap.saturating_sub(ps.used);
        let mut avail_spot = ps.spot_limit().saturating_sub(ps.spot_used);
        let mut reserved = false;
        let mut starting = Vec::new();
        for &j in ps.queue.iter() {
            if avail == 0 {
                break;
            }
            let g = self.jobs[j].gpus;
            let spot = self.js[j].at.as_ref().is_some_and(|o| o.spot);
            let a = if spot { avail.min(avail_spot) } else { avail };
            if g <= a {
                starting.push(j);
                avail -= g;
                if spot {
                    avail_spot -= g;
                }
            } else if !reserved {
                reserved = true;
                avail -= avail.min(g);
                if spot {
                    avail_spot -= avail_spot.min(g);
                }
            }
        }
        if starting.is_empty() {
            return;
        }
        let ps = &mut self.pools[c][p];
        ps.queue.retain(|j| !starting.contains(j));
        for j in starting {
            self.start(j, c, p, now);
        }
    }

    fn start(&mut self, j: usize, c: usize, p: usize, now: f64) {
        let job = &self.jobs[j];
        let g = job.gpus;
        let (speed, setup) =
            self.js[j].at.as_ref().map(|o| (o.speed.max(1e-9), o.setup_s.max(0.0))).unwrap_or((1.0, 0.0));
        // Wall time here: setup (billed, no progress), then the rest of the work at
        // this pool's speed.
        let remaining = setup + (job.duration_s - self.js[j].progress_s).max(0.0) / speed;
        let spot = self.js[j].at.as_ref().is_some_and(|o| o.spot);
        if let Some((t0, wc, wp, est)) = self.js[j].reclaim_wait.take() {
            if spot && (wc, wp) == (c, p) {
                let w = &mut self.pools[c][p].reclaim_waits;
                w.0 += 1;
                w.1 += (now - t0).max(0.0);
                w.2 += est;
            }
        }
        self.touch(c, p);
        let ps = &mut self.pools[c][p];
        ps.used += g;
        ps.running.push(j);
        if spot {
            ps.spot_used += g;
            ps.running_spot.push(j);
        }
        let s = &mut self.js[j];
        s.setup_s = setup;
        s.planned_end = now + remaining;
        s.run_start = Some(now);
        s.first_start.get_or_insert(now);
        s.epoch += 1;
        let epoch = s.epoch;
        self.push(now + remaining, Ev::Finish { job: j, epoch });
    }

    /// Stop a running job at `now`: account its segment, free its GPUs. Returns the
    /// seconds it ran in this segment.
    fn stop(&mut self, j: usize, now: f64) -> f64 {
        let Some(start) = self.js[j].run_start.take() else {
            return 0.0;
        };
        let Some(o) = self.js[j].at.clone() else {
            return 0.0;
        };
        let g = self.jobs[j].gpus;
        let seg = (now - start).max(0.0);
        let usd = o.usd_per_gpu_hour * g as f64 * seg / 3600.0;
        self.compute_usd += usd;
        self.setup_usd += o.usd_per_gpu_hour * g as f64 * seg.min(self.js[j].setup_s.max(0.0)) / 3600.0;
        *self.team_usd.entry(self.jobs[j].team.clone()).or_default() += usd;
        // Owned hardware (the pool looked up once): its busy time, what that
        // time is billed, and its running cost where the fleet gives one.
        let pool = self.model.clusters().get(o.cluster).and_then(|x| x.pools.get(o.pool));
        let owned = pool.is_some_and(|x| x.owned_usd_per_gpu_hour.is_some());
        let running = pool.and_then(|x| x.owned_running_usd_per_gpu_hour);
        if owned {
            self.owned_busy_gpu_s += g as f64 * seg;
            self.owned_used_usd += usd;
            self.owned_running_usd += running.map_or(0.0, |r| r * g as f64 * seg / 3600.0);
        }
        let sp = self.spend.entry((o.cluster, o.pool, o.spot)).or_default();
        sp.gpu_hours += g as f64 * seg / 3600.0;
        sp.usd += usd;
        let kg = self.model.kg_co2(o.cluster, o.pool, g, start, now);
        self.kg_co2 += kg;
        self.js[j].usd += usd;
        self.js[j].kg_co2 += kg;
        self.add_busy(o.cluster, g, start, now, o.usd_per_gpu_hour / 3600.0);
        self.touch(o.cluster, o.pool);
        let ps = &mut self.pools[o.cluster][o.pool];
        ps.used -= g;
        if let Some(k) = ps.running.iter().position(|&x| x == j) {
            ps.running.swap_remove(k);
        }
        if o.spot {
            ps.spot_used -= g;
            if let Some(k) = ps.running_spot.iter().position(|&x| x == j) {
                ps.running_spot.remove(k);
            }
        }
        self.js[j].epoch += 1;
        seg
    }

    /// Spread a run segment over the plot buckets: busy GPU-seconds of cluster `c`,
    /// and its cost (`usd_per_gpu_s`) in the bucket where it was incurred.
    fn add_busy(&mut self, c: usize, g: u32, t0: f64, t1: f64, usd_per_gpu_s: f64) {
        let b = self.cfg.bucket_s;
        let mut t = t0;
        while t < t1 {
            let k = (t / b) as usize;
            let end = ((k + 1) as f64 * b).min(t1);
            let gs = (end - t) * g as f64;
            let v = &mut self.busy[c];
            if v.len() <= k {
                v.resize(k + 1, 0.0);
            }
            v[k] += gs;
            if self.cost_buckets.len() <= k {
                self.cost_buckets.resize(k + 1, 0.0);
            }
            self.cost_buckets[k] += gs * usd_per_gpu_s;
            t = end;
        }
    }

    fn finish(&mut self, j: usize, now: f64) {
        let o = self.js[j].at.clone();
        self.stop(j, now);
        self.js[j].progress_s = self.jobs[j].duration_s;
        self.js[j].finish = Some(now);
        self.settled += 1;
        if let Some(o) = o {
            self.try_start(o.cluster, o.pool, now);
        }
    }

    /// Evict a running job: it keeps the work up to its last checkpoint. Returns
    /// the run seconds lost (worked since that checkpoint).
    fn evict(&mut self, j: usize, now: f64) -> f64 {
        let at = self.js[j].at.as_ref().map(|o| (o.cluster, o.pool, o.spot));
        let speed = self.js[j].at.as_ref().map(|o| o.speed.max(1e-9)).unwrap_or(1.0);
        let price = self.js[j].at.as_ref().map(|o| o.usd_per_gpu_hour).unwrap_or(0.0);
        let seg = self.stop(j, now);
        // Work time of the segment (after setup); checkpoints every
        // `checkpoint_s` of it, each saving `checkpoint_s × speed` of work.
        let worked = (seg - self.js[j].setup_s).max(0.0);
        let ck = self.jobs[j].written_checkpoint_s();
        let saved = if ck > 0.0 { (worked / ck).floor() * ck } else { 0.0 };
        if saved > 0.0 {
            self.js[j].progress_s = (self.js[j].progress_s + saved * speed).min(self.jobs[j].duration_s);
            self.js[j].ckpt_at = at.map(|x| x.0);
        }
        let lost = (worked - saved) * self.jobs[j].gpus as f64;
        self.lost_gpu_s += lost;
        self.rework_usd += price * lost / 3600.0;
        if let Some(k) = at {
            self.spend.entry(k).or_default().lost_gpu_hours += lost / 3600.0;
        }
        worked - saved
    }

    /// Spot trace `k` changed to `f` of its full level: every pool that follows
    /// it changes at once (spot jobs beyond a pool's new level are reclaimed,
    /// newest first, and placed again).
    fn spot_change(&mut self, k: usize, f: f64, now: f64) {
        // The spells below full and the windows, as the clock shows them.
        let m = &mut self.markets[k];
        match (f < 1.0, m.spell_since) {
            (true, None) => {
                m.spell_since = Some(now);
                if m.full_since_known && now > m.full_since {
                    let mut lens = m.windows.as_ref().map_or_else(Vec::new, |w| w.lengths_h().to_vec());
                    lens.push((now - m.full_since) / 3600.0);
                    m.windows = fleet_engine::SpotWindows::new(lens).map(Arc::new);
                }
            }
            (false, Some(t0)) => {
                m.spell_since = None;
                m.full_since = now;
                m.full_since_known = true;
                m.spells.push(now - t0);
            }
            _ => {}
        }
        if let Some(o) = m.oracle.as_mut().filter(|_| f >= 1.0) {
            let len_h = if o.next_s.is_finite() { (o.next_s - m.full_since) / 3600.0 } else { 1e9 };
            o.window = fleet_engine::SpotWindows::new(vec![len_h]).map(Arc::new);
        }
        let pools = std::mem::take(&mut self.markets[k].pools);
        let mut evicted = Vec::new();
        for &(c, p) in &pools {
            self.pools[c][p].spot_fraction = f;
            self.touch(c, p);
            let limit = self.pools[c][p].spot_limit();
            while self.pools[c][p].spot_used > limit {
                let Some(&j) = self.pools[c][p].running_spot.last() else {
                    break;
                };
                let lost_s = self.evict(j, now);
                let s = &mut self.js[j];
                s.spot_reclaims += 1;
                s.spot_lost_s += lost_s;
                s.just_reclaimed = true;
                evicted.push(j);
            }
        }
        self.preemptions += evicted.len() as u64;
        for j in evicted {
            self.place(j, now);
        }
        for &(c, p) in &pools {
            self.try_start(c, p, now);
        }
        self.markets[k].pools = pools;
    }

    fn outage_start(&mut self, c: usize, now: f64) {
        self.up[c] = false;
        let mut displaced = Vec::new();
        for p in 0..self.pools[c].len() {
            self.touch(c, p);
            let running = self.pools[c][p].running.clone();
            for j in running {
                self.evict(j, now);
                self.outage_kills += 1;
                displaced.push(j);
            }
            let queued: Vec<usize> = self.pools[c][p].queue.drain(..).collect();
            displaced.extend(queued);
        }
        displaced.sort_unstable();
        for j in displaced {
            self.place(j, now);
        }
    }

    fn outage_end(&mut self, c: usize, now: f64) {
        self.up[c] = true;
        for p in 0..self.pools[c].len() {
            self.touch(c, p);
        }
        let parked = std::mem::take(&mut self.parked);
        for j in parked {
            self.js[j].parked = false;
            self.place(j, now);
        }
        for p in 0..self.pools[c].len() {
            self.try_start(c, p, now);
        }
    }

    fn rebalance(&mut self, now: f64) {
        let Strategy::Engine(policy) = self.strategy.clone() else {
            return;
        };
        let mut running = Vec::new();
        for (ci, ps) in self.pools.iter().enumerate() {
            for (pi, p) in ps.iter().enumerate() {
                for &j in &p.running {
                    let job = &self.jobs[j];
                    if !job.interruptible {
                        continue;
                    }
                    let s = &self.js[j];
                    let Some(start) = s.run_start else { continue };
                    let Some(o) = s.at.as_ref() else { continue };
                    let worked = (now - start - s.setup_s).max(0.0);
                    let speed = o.speed.max(1e-9);
                    let since = if job.written_checkpoint_s() > 0.0 {
                        worked % job.checkpoint_s
                    } else {
                        worked + s.progress_s / speed
                    };
                    running.push(RunningJob {
                        job: j,
                        cluster: ci,
                        pool: pi,
                        spot: o.spot,
                        gpus: job.gpus,
                        usd_per_gpu_hour: o.usd_per_gpu_hour,
                        remaining_s: ((job.duration_s - s.progress_s) / speed - worked).max(0.0),
                        since_checkpoint_s: since,
                    });
                }
            }
        }
        if running.is_empty() {
            return;
        }
        running.sort_by_key(|r| r.job);
        let load = self.load(now, 1, true);
        let moves = self.model.rebalance(&policy, now, self.jobs, &running, &load);
        // Carry out only moves whose target can start the job right away, and never
        // more than the target's free GPUs (the proposals are made on one snapshot).
        let mut free: Vec<Vec<(u32, u32)>> =
            load.iter().map(|c| c.pools.iter().map(|p| (p.free, p.spot_free)).collect()).collect();
        for m in moves {
            let j = m.job;
            if self.js[j].run_start.is_none() {
                continue;
            }
            let g = self.jobs[j].gpus;
            let Some(slot) = free.get_mut(m.to.cluster).and_then(|c| c.get_mut(m.to.pool)) else {
                continue;
            };
            let have = if m.to.spot { slot.0.min(slot.1) } else { slot.0 };
            if g > have || !self.up[m.to.cluster] {
                continue;
            }
            slot.0 -= g;
            if m.to.spot {
                slot.1 -= g;
            }
            let from = self.js[j].at.clone();
            self.evict(j, now);
            self.migrations += 1;
            self.enqueue(j, m.to, now);
            if let Some(f) = from {
                self.try_start(f.cluster, f.pool, now);
            }
        }
    }

    fn report(&self, clusters: &[SimCluster], policy: String) -> PolicyReport {
        let mut waits = Vec::new();
        let mut compl = Vec::new();
        let mut useful = 0.0;
        let mut completed = 0;
        let mut unplaced = 0;
        let mut moved = 0;
        let mut sized = Vec::new();
        for (j, s) in self.js.iter().enumerate() {
            let job = &self.jobs[j];
            if s.moved {
                moved += 1;
            }
            if s.unplaced || s.finish.is_none() {
                unplaced += 1;
                continue;
            }
            completed += 1;
            let work_h = job.duration_s * job.gpus as f64 / 3600.0;
            useful += work_h;
            let wait = s.first_start.unwrap_or(job.submit_s) - job.submit_s;
            let done = s.finish.unwrap_or(job.submit_s) - job.submit_s;
            waits.push(wait);
            compl.push(done);
            sized.push((job.gpus, work_h, s.usd, wait, done));
        }
        let total = self.compute_usd + self.egress_usd;
        // Owned hardware over the run: (GPU-hours available, fixed USD of them).
        let makespan_s = self.js.iter().filter_map(|s| s.finish).fold(0.0, f64::max);
        let owned_cap_h =
            clusters.iter().flat_map(|c| c.pools.iter()).fold((0.0, 0.0), |acc, p| match p.owned_usd_per_gpu_hour {
                Some(price) => {
                    let h = p.gpus as f64 * makespan_s / 3600.0;
                    (acc.0 + h, acc.1 + h * price)
                }
                None => acc,
            });
        // The cash view needs a running cost for every owned pool.
        let mut owned_pools =
            clusters.iter().flat_map(|c| c.pools.iter()).filter(|p| p.owned_usd_per_gpu_hour.is_some());
        let running_known =
            owned_pools.clone().next().is_some() && owned_pools.all(|p| p.owned_running_usd_per_gpu_hour.is_some());
        let span = self.last_t.max(1.0);
        let b = self.cfg.bucket_s;
        let n_buckets = (span / b).ceil() as usize;
        let mut utilization = BTreeMap::new();
        let mut util_series = BTreeMap::new();
        for (ci, c) in clusters.iter().enumerate() {
            let cap: f64 = c.pools.iter().map(|p| p.gpus as f64).sum::<f64>().max(1.0);
            let busy: f64 = self.busy[ci].iter().sum();
            utilization.insert(c.name.clone(), busy / (cap * span));
            let series: Vec<f64> =
                (0..n_buckets).map(|k| self.busy[ci].get(k).copied().unwrap_or(0.0) / (cap * b)).collect();
            util_series.insert(c.name.clone(), series);
        }
        // Cumulative cost per bucket.
        let mut per_bucket = vec![0.0; n_buckets + 1];
        for (k, usd) in self.cost_buckets.iter().enumerate() {
            per_bucket[k.min(n_buckets)] += usd;
        }
        for &(t, usd) in &self.cost_events {
            let k = ((t / b) as usize).min(n_buckets);
            per_bucket[k] += usd;
        }
        let mut acc = 0.0;
        let cost_series = per_bucket
            .iter()
            .enumerate()
            .map(|(k, usd)| {
                acc += usd;
                ((k + 1) as f64 * b / 3600.0, acc)
            })
            .collect();
        let per_job = if self.cfg.per_job {
            let end = |j: usize, s: &JobState| s.finish.filter(|_| !s.unplaced).map(|f| f - self.jobs[j].submit_s);
            self.js
                .iter()
                .enumerate()
                .map(|(j, s)| JobFigures {
                    usd: s.usd,
                    kg_co2: s.kg_co2,
                    completion_s: end(j, s),
                    gpus: self.jobs[j].gpus,
                })
                .collect()
        } else {
            Vec::new()
        };
        PolicyReport {
            policy,
            per_job,
            jobs: self.jobs.len(),
            completed,
            unplaced,
            total_usd: total,
            compute_usd: self.compute_usd,
            egress_usd: self.egress_usd,
            setup_usd: self.setup_usd,
            rework_usd: self.rework_usd,
            usd_per_gpu_hour: if useful > 0.0 { total / useful } else { 0.0 },
            useful_gpu_hours: useful,
            kg_co2: self.kg_co2,
            lost_gpu_hours: self.lost_gpu_s / 3600.0,
            preemptions: self.preemptions,
            max_reclaims_per_job: self.js.iter().map(|s| s.spot_reclaims as usize).max().unwrap_or(0),
            outage_kills: self.outage_kills,
            migrations: self.migrations,
            moved_jobs: moved,
            wait_mean_s: mean(&waits),
            wait_p95_s: percentile(&waits, 95.0),
            completion_mean_s: mean(&compl),
            completion_p95_s: percentile(&compl, 95.0),
            makespan_s,
            cost_by_team: self.team_usd.clone(),
            owned_fixed_usd: owned_cap_h.1,
            owned_used_usd: self.owned_used_usd,
            owned_running_usd: running_known.then_some(self.owned_running_usd),
            cash_usd: running_known.then_some(total - self.owned_used_usd + self.owned_running_usd),
            owned_idle_share: if owned_cap_h.0 > 0.0 {
                (1.0 - self.owned_busy_gpu_s / 3600.0 / owned_cap_h.0).max(0.0)
            } else {
                0.0
            },
            utilization,
            ratio_to_lower_bound: 0.0,
            own_lp_bound_usd: None,
            own_completion_lp_usd: None,
            cost_series,
            util_series,
            bucket_hours: b / 3600.0,
            held_jobs: self.js.iter().filter(|s| s.held_s.is_some()).count(),
            held_hours: self.js.iter().filter_map(|s| s.held_s).fold(0.0, |a, b| a + b) / 3600.0,
            estimates: self.estimate_checks(),
            by_size: crate::report::SizeClass::of(&sized),
            spend: self
                .spend
                .iter()
                .map(|(&(c, p, spot), x)| {
                    let pool = clusters.get(c).and_then(|cl| cl.pools.get(p));
                    let name = format!(
                        "{}/{} {}",
                        clusters.get(c).map(|cl| cl.name.as_str()).unwrap_or("?"),
                        pool.map(|p| p.name.as_str()).unwrap_or("?"),
                        if spot { "spot" } else { "std" }
                    );
                    (name, *x)
                })
                .collect(),
        }
    }

    /// The engine's expectations at first placement against the replay, per
    /// pricing of that placement (classes without jobs left out) and for all
    /// jobs; empty when no job has one (baselines).
    fn estimate_checks(&self) -> Vec<crate::report::EstimateCheck> {
        let done: Vec<(Expected, f64, f64)> = self
            .js
            .iter()
            .zip(self.jobs)
            .filter_map(|(s, job)| {
                let (e, first, end) = (s.expected?, s.first_start?, s.finish?);
                Some((e, first - job.submit_s, end - job.submit_s))
            })
            .collect();
        if done.is_empty() {
            return Vec::new();
        }
        let check = |class: &str, pick: &dyn Fn(&Expected) -> bool| {
            let v: Vec<&(Expected, f64, f64)> = done.iter().filter(|x| pick(&x.0)).collect();
            let n = v.len() as f64;
            let sum = |f: &dyn Fn(&(Expected, f64, f64)) -> f64| v.iter().map(|x| f(x)).sum::<f64>() / n;
            crate::report::EstimateCheck {
                class: class.to_string(),
                jobs: v.len(),
                expected_wait_mean_s: sum(&|x| x.0.wait_s),
                wait_mean_s: sum(&|x| x.1),
                expected_completion_mean_s: sum(&|x| x.0.completion_s),
                completion_mean_s: sum(&|x| x.2),
                completion_abs_error_mean_s: sum(&|x| (x.2 - x.0.completion_s).abs()),
                within_25pct: sum(&|x| f64::from(u8::from((x.2 - x.0.completion_s).abs() <= 0.25 * x.0.completion_s))),
            }
        };
        let mut out: Vec<_> = PRICINGS
            .iter()
            .filter(|(c, _)| done.iter().any(|x| x.0.class == *c))
            .map(|(c, label)| check(label, &|e| e.class == *c))
            .collect();
        out.push(check("all", &|_| true));
        out
    }
}

/// The load of an idle fleet (every GPU free, spot fully available).
pub fn idle_load(clusters: &[SimCluster]) -> Vec<ClusterLoad> {
    clusters
        .iter()
        .map(|c| ClusterLoad {
            up: true,
            version: 0,
            pools: c
                .pools
                .iter()
                .map(|p| PoolLoad {
                    capacity: p.gpus,
                    free: p.gpus,
                    start_free: p.gpus,
                    spot_free: if p.spot_trace.is_some() || p.sells_spot { p.gpus } else { 0 },
                    spot_fraction: if p.spot_trace.is_some() || p.sells_spot { 1.0 } else { 0.0 },
                    queued_jobs: 0,
                    est_wait_s: 0.0,
                    spot_wait_s: f64::INFINITY,
                    spot_recovery_s: 0.0,
                    spot_full_since: f64::NAN,
                    spot_windows: None,
                })
                .collect(),
        })
        .collect()
}

/// Lower bound: each job at its cheapest feasible price with capacity relaxed (an
/// empty fleet), no waiting, no egress, no lost work. Returns (USD, kgCO2 of those
/// placements run at submission).
pub fn lower_bound<M: Model>(model: &mut M, jobs: &[SimJob]) -> (f64, f64) {
    let mut usd = 0.0;
    let mut co2 = 0.0;
    for j in jobs {
        model.resume(j, 0.0, None);
        if let Some(o) = model.cheapest(j) {
            let run_s = j.duration_s / o.speed.max(1e-9);
            usd += o.usd_per_gpu_hour * j.gpus as f64 * run_s / 3600.0;
            co2 += model.kg_co2(o.cluster, o.pool, j.gpus, j.submit_s, j.submit_s + run_s);
        }
    }
    (usd, co2)
}

/// The order of [`Model::offers`] for the baselines: lower score, home first, then
/// lower cluster index (a strict total order: one offer per cluster).
pub fn offer_order(home: usize, a: &Offer, b: &Offer) -> Ordering {
    a.score.total_cmp(&b.score).then((b.cluster == home).cmp(&(a.cluster == home))).then(a.cluster.cmp(&b.cluster))
}

/// USD per unit of work of an offer: price per GPU-hour ÷ the pool's speed.
pub fn per_work(o: &Offer) -> f64 {
    o.usd_per_gpu_hour / o.speed.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spot::SpotTrace;

    #[test]
    fn round_ms_rounds_half_away_from_zero_as_round_does() {
        let cases = [
            0.0,
            0.49999999999999994,
            0.5,
            1.5,
            2.5,
            1234.4999,
            1234.5,
            4503599627370495.5,
            9007199254740991.0,
            9007199254740992.0,
            1e300,
            -0.4,
            -0.5,
            -3.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for x in cases {
            assert_eq!(round_ms(x), x.round() as u64, "{x}");
        }
        let mut x = 0.0f64;
        while x < 5e6 {
            for y in [x, x + 0.5, x + 0.25, x + 0.75, x * 1.0000001] {
                assert_eq!(round_ms(y), y.round() as u64, "{y}");
            }
            x = x * 1.37 + 0.013;
        }
    }

    /// A stand-in for the engine: every pool big enough is feasible, ranked by price
    /// (spot first for interruptible jobs when the pool sells spot).
    #[derive(Default)]
    struct Stub {
        clusters: Vec<SimCluster>,
        /// Speed per cluster (default 1).
        speed: Vec<f64>,
        setup_s: f64,
        delay_s: f64,
        egress: f64,
        /// (on-demand, spot) USD/GPU-h per cluster.
        price: Vec<(f64, f64)>,
        /// Carbon by time of day (`diurnal_integral`) instead of constant per cluster.
        diurnal: bool,
    }

    /// ∫₀ᵗ of an intensity of 3 outside 08:00–16:00 of each day and 1 inside (hours × intensity).
    fn diurnal_integral(t: f64) -> f64 {
        let day = 86_400.0;
        let (n, r) = ((t / day).floor(), t.rem_euclid(day) / 3600.0);
        n * 56.0 + 3.0 * r.min(8.0) + (r - 8.0).clamp(0.0, 8.0) + 3.0 * (r - 16.0).max(0.0)
    }

    impl Model for Stub {
        fn clusters(&self) -> &[SimCluster] {
            &self.clusters
        }
        fn offers(&mut self, _policy: &str, job: &SimJob, _now: f64, load: &[ClusterLoad]) -> Vec<Offer> {
            let mut v = Vec::new();
            for (ci, c) in self.clusters.iter().enumerate() {
                if !load[ci].up {
                    continue;
                }
                for (pi, p) in c.pools.iter().enumerate() {
                    if p.gpus < job.gpus {
                        continue;
                    }
                    let spot = job.interruptible && p.spot_trace.is_some();
                    let usd = if spot { self.price[ci].1 } else { self.price[ci].0 };
                    let speed = self.speed.get(ci).copied().unwrap_or(1.0);
                    v.push(Offer {
                        cluster: ci,
                        pool: pi,
                        spot,
                        usd_per_gpu_hour: usd,
                        egress_usd: self.egress,
                        score: usd / speed,
                        speed,
                        setup_s: self.setup_s,
                        delay_s: self.delay_s,
                        ..Offer::default()
                    });
                }
            }
            v.sort_by(|a, b| a.score.total_cmp(&b.score));
            v
        }
        fn kg_co2(&self, cluster: usize, _pool: usize, gpus: u32, t0: f64, t1: f64) -> f64 {
            if self.diurnal {
                return gpus as f64 * (diurnal_integral(t1) - diurnal_integral(t0));
            }
            (cluster + 1) as f64 * gpus as f64 * (t1 - t0) / 3600.0
        }
        fn rebalance(&mut self, _: &str, _: f64, _: &[SimJob], _: &[RunningJob], _: &[ClusterLoad]) -> Vec<Move> {
            Vec::new()
        }
    }

    /// The carbon hold reads the intensity only inside the forecast window of the
    /// decision, never holds past its budget, and finds the clean hours.
    #[test]
    fn carbon_hold_uses_only_the_forecast_and_keeps_its_budget() {
        let rule = CarbonHold::default();
        let h = 3600.0;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..2000 {
            let now = (rng.gen::<f64>() * 30.0 * 24.0 * h).floor();
            let lead = rng.gen::<f64>() * 2.0 * h;
            let run = rng.gen::<f64>() * 5.0 * 24.0 * h;
            let budget = rule.budget_s(run) * rng.gen::<f64>();
            let mut reads = 0;
            let d = rule.hold_for(now, lead, run, budget, &mut |a, b| {
                reads += 1;
                assert!(now <= a && a <= b && b <= now + rule.forecast_s + 1e-6, "read {a}..{b} at {now}");
                diurnal_integral(b) - diurnal_integral(a)
            });
            assert!(reads > 0 || budget < rule.step_s);
            assert!(d >= 0.0 && d <= budget + 1e-9 && d <= rule.max_s, "hold {d} budget {budget}");
            assert_eq!(d % rule.step_s, 0.0);
        }
        // Forecast of a whole number of days = that many forecast days.
        let mut kg = |a: f64, b: f64| diurnal_integral(b) - diurnal_integral(a);
        assert!((rule.forecast_kg(5.0 * h, 5.0 * h, 5.0 * h + 3.0 * 86_400.0, &mut kg) - 168.0).abs() < 1e-9);
        // Past the horizon the forecast repeats: hours 24–26 after now read as 0–2.
        let f = rule.forecast_kg(0.0, 24.0 * h, 26.0 * h, &mut kg);
        assert!((f - 6.0).abs() < 1e-9, "{f}");
        // A 2 h job submitted at midnight waits until 08:00 (budget 8 h: slack 4)...
        let wide = CarbonHold { slack: 4.0, ..CarbonHold::default() };
        assert_eq!(wide.hold_for(0.0, 0.0, 2.0 * h, wide.budget_s(2.0 * h), &mut kg), 8.0 * h);
        // ...as far as its budget lets it (slack 1: 2 h, no cleaner start within it).
        assert_eq!(rule.hold_for(0.0, 0.0, 2.0 * h, rule.budget_s(2.0 * h), &mut kg), 0.0);
        // Submitted at 07:00 it waits 1 h; at 09:00 it starts at once.
        assert_eq!(rule.hold_for(7.0 * h, 0.0, 2.0 * h, rule.budget_s(2.0 * h), &mut kg), h);
        assert_eq!(rule.hold_for(9.0 * h, 0.0, 2.0 * h, rule.budget_s(2.0 * h), &mut kg), 0.0);
    }

    /// Green holds and pauses interruptible jobs into the clean hours: less CO2 than
    /// without, every job done within its budget (submission + run × (1 + slack)),
    /// the cost policy untouched.
    #[test]
    fn green_holds_and_pauses_within_the_completion_budget() {
        let h = 3600.0;
        let jobs: Vec<SimJob> = (0..40)
            .map(|i| job(i, (i as f64 * 1.7 * h) % (48.0 * h), (1.0 + (i % 7) as f64 * 3.0) * h, 1, i % 5 != 0, h))
            .collect();
        let run = |policy: &str, hold: CarbonHold| {
            let mut m = Stub {
                clusters: vec![cluster("a", 64, None)],
                price: vec![(2.0, 1.0)],
                diurnal: true,
                ..Default::default()
            };
            let cfg = SimConfig { hold, ..SimConfig::default() };
            simulate(&mut m, Strategy::Engine(policy.into()), &jobs, &[], &cfg, &quiet)
        };
        let off = CarbonHold::off();
        let (green, plain) = (run("green", CarbonHold::default()), run("green", off.clone()));
        assert_eq!(green.completed, jobs.len());
        assert!(green.held_jobs > 0 && green.held_hours > 0.0);
        assert!(green.kg_co2 < 0.9 * plain.kg_co2, "held {} plain {}", green.kg_co2, plain.kg_co2);
        // The pool never queues, so each job ends by submission + run + its budget.
        let budget = |j: &SimJob| j.duration_s * (1.0 + CarbonHold::default().slack);
        let latest = jobs.iter().map(|j| j.submit_s + budget(j)).fold(0.0, f64::max);
        assert!(green.makespan_s <= latest + 1e-6, "{} > {latest}", green.makespan_s);
        assert!(green.completion_mean_s <= jobs.iter().map(budget).sum::<f64>() / jobs.len() as f64 + 1e-6);
        // Same work paid; non-interruptible jobs are never held.
        assert!((green.useful_gpu_hours - plain.useful_gpu_hours).abs() < 1e-9);
        // The cost policy does not hold: the same report with or without the rule.
        assert_eq!(run("cost", CarbonHold::default()), run("cost", off));
    }

    fn cluster(name: &str, gpus: u32, spot_trace: Option<usize>) -> SimCluster {
        SimCluster {
            name: name.into(),
            pools: vec![SimPool {
                name: "p".into(),
                gpu_type: "H100".into(),
                gpus,
                spot_trace,
                sells_spot: spot_trace.is_some(),
                owned_usd_per_gpu_hour: None,
                owned_running_usd_per_gpu_hour: None,
            }],
        }
    }

    fn job(id: usize, submit_s: f64, duration_s: f64, gpus: u32, interruptible: bool, checkpoint_s: f64) -> SimJob {
        SimJob { id, submit_s, duration_s, gpus, home: 0, interruptible, checkpoint_s, ..SimJob::default() }
    }

    fn quiet(_: u64) {}

    #[test]
    fn capacity_and_gang_fifo() {
        let mut m = Stub { clusters: vec![cluster("a", 4, None)], price: vec![(2.0, 1.0)], ..Default::default() };
        let jobs = vec![
            job(0, 0.0, 100.0, 2, false, 0.0),
            // needs all 4 GPUs at once: waits for job 0 to end (gang)
            job(1, 1.0, 100.0, 4, false, 0.0),
            // 1 GPU would fit at t=2 but job 1's reservation holds the 2 free GPUs
            job(2, 2.0, 10.0, 1, false, 0.0),
            // larger than any pool: unplaceable
            job(3, 3.0, 10.0, 8, false, 0.0),
        ];
        let r = simulate(&mut m, Strategy::Engine("cost".into()), &jobs, &[], &SimConfig::default(), &quiet);
        assert_eq!(r.completed, 3);
        assert_eq!(r.unplaced, 1);
        // waits: 0, 99, 198 ; completions: 100, 199, 208
        assert_eq!(r.wait_mean_s, (0.0 + 99.0 + 198.0) / 3.0);
        assert_eq!(r.completion_mean_s, (100.0 + 199.0 + 208.0) / 3.0);
        // 2*100 + 4*100 + 1*10 GPU-s at 2 USD/GPU-h
        assert!((r.total_usd - 610.0 * 2.0 / 3600.0).abs() < 1e-9);
        // never above capacity: busy GPU-s over the 210 s span <= 4 GPUs
        assert!(r.utilization["a"] <= 1.0);
        assert!((r.utilization["a"] - 610.0 / (4.0 * 210.0)).abs() < 1e-9, "{:?}", r.utilization);
        // the cost plot ends at the total
        assert!((r.cost_series.last().map(|x| x.1).unwrap_or(0.0) - r.total_usd).abs() < 1e-9);
    }

    #[test]
    fn small_jobs_backfill_beside_a_reservation() {
        let mut m = Stub { clusters: vec![cluster("a", 4, None)], price: vec![(1.0, 1.0)], ..Default::default() };
        let jobs = vec![
            job(0, 0.0, 100.0, 1, false, 0.0),
            job(1, 1.0, 100.0, 4, false, 0.0), // reserves 3 free GPUs
            job(2, 2.0, 10.0, 1, false, 0.0),  // nothing left beyond the reservation
        ];
        let r = simulate(&mut m, Strategy::Engine("cost".into()), &jobs, &[], &SimConfig::default(), &quiet);
        assert_eq!(r.wait_p95_s, 198.0);
        let jobs = vec![
            job(0, 0.0, 100.0, 1, false, 0.0),
            job(1, 1.0, 100.0, 2, false, 0.0),
            job(2, 2.0, 10.0, 1, false, 0.0),
        ];
        let r = simulate(&mut m, Strategy::Engine("cost".into()), &jobs, &[], &SimConfig::default(), &quiet);
        assert_eq!(r.wait_mean_s, 0.0, "everything fits side by side");
    }

    #[test]
    fn spot_drop_preempts_newest_and_loses_work_since_checkpoint() {
        let trace = SpotTrace::parse(r#"{"metadata":{"gap_seconds":1000},"data":[2,1]}"#, "t").unwrap();
        let mut m = Stub { clusters: vec![cluster("a", 2, Some(0))], price: vec![(3.0, 1.0)], ..Default::default() };
        let jobs = vec![job(0, 0.0, 1500.0, 1, true, 300.0), job(1, 10.0, 1500.0, 1, true, 300.0)];
        let r = simulate(&mut m, Strategy::Engine("cost".into()), &jobs, &[trace], &SimConfig::default(), &quiet);
        assert_eq!(r.preemptions, 1);
        // job 1 ran 990 s, checkpointed at 900: 90 GPU-s lost
        assert!((r.lost_gpu_hours - 90.0 / 3600.0).abs() < 1e-9);
        assert_eq!(r.completed, 2);
        // job 1 restarts when job 0 frees the single spot GPU at 1500 and runs the
        // remaining 600 s: completion 2100 - 10
        assert_eq!(r.completion_p95_s, 2090.0);
        // paid: 1500 + 990 + 600 spot GPU-s at 1 USD/GPU-h
        assert!((r.total_usd - 3090.0 / 3600.0).abs() < 1e-9);
    }

    /// Two pools that follow one spot trace lose their spot at the same moment:
    /// a job reclaimed from the first is not started on the second's spot (as it
    /// was when each pool's change was a separate event at the same time, and
    /// the second reclaimed it again at once).
    #[test]
    fn pools_following_one_spot_trace_are_reclaimed_together() {
        let trace = SpotTrace::parse(r#"{"metadata":{"gap_seconds":1000},"data":[2,0]}"#, "t").unwrap();
        let mut m = Stub {
            clusters: vec![cluster("a", 1, Some(0)), cluster("b", 1, Some(0)), cluster("c", 1, None)],
            price: vec![(3.0, 1.0), (3.0, 1.5), (3.0, 3.0)],
            ..Default::default()
        };
        let jobs = vec![job(0, 0.0, 1500.0, 1, true, 300.0)];
        let r = simulate(&mut m, Strategy::GreedySpot, &jobs, &[trace], &SimConfig::default(), &quiet);
        assert_eq!(r.preemptions, 1, "reclaimed once, from a");
        // 1000 s on a's spot (checkpointed at 900), then the 600 s left on c (no
        // spot; the traced pools offer this job only their spot)
        assert_eq!(r.completion_mean_s, 1600.0);
        assert!((r.lost_gpu_hours - 100.0 / 3600.0).abs() < 1e-9);
        assert!((r.total_usd - (1000.0 * 1.0 + 600.0 * 3.0) / 3600.0).abs() < 1e-9, "{}", r.total_usd);
    }

    #[test]
    fn outage_moves_work_and_counts_lost_work() {
        let mut m = Stub {
            clusters: vec![cluster("a", 1, None), cluster("b", 1, None)],
            price: vec![(1.0, 1.0), (2.0, 2.0)],
            ..Default::default()
        };
        let jobs = vec![job(0, 0.0, 200.0, 1, true, 30.0)];
        let cfg = SimConfig { outages: vec![(0, 50.0, 500.0)], ..SimConfig::default() };
        let r = simulate(&mut m, Strategy::Engine("cost".into()), &jobs, &[], &cfg, &quiet);
        assert_eq!(r.outage_kills, 1);
        assert!((r.lost_gpu_hours - 20.0 / 3600.0).abs() < 1e-9);
        // 50 s on a, then the remaining 170 s on b
        assert_eq!(r.completion_mean_s, 220.0);
        assert!((r.total_usd - (50.0 * 1.0 + 170.0 * 2.0) / 3600.0).abs() < 1e-9);
        assert_eq!(r.moved_jobs, 1, "job 0 finished away from its home a");
    }

    /// Records, for each placement, what `pick` reads from the job and the load
    /// of cluster 0, pool 0.
    struct Recorder<T> {
        inner: Stub,
        pick: fn(&SimJob, &PoolLoad) -> T,
        seen: Vec<T>,
    }

    impl<T> Recorder<T> {
        fn new(inner: Stub, pick: fn(&SimJob, &PoolLoad) -> T) -> Self {
            Recorder { inner, pick, seen: Vec::new() }
        }
    }

    impl<T> Model for Recorder<T> {
        fn clusters(&self) -> &[SimCluster] {
            self.inner.clusters()
        }
        fn offers(&mut self, policy: &str, job: &SimJob, now: f64, load: &[ClusterLoad]) -> Vec<Offer> {
            self.seen.push((self.pick)(job, &load[0].pools[0]));
            self.inner.offers(policy, job, now, load)
        }
        fn kg_co2(&self, cluster: usize, pool: usize, gpus: u32, t0: f64, t1: f64) -> f64 {
            self.inner.kg_co2(cluster, pool, gpus, t0, t1)
        }
        fn rebalance(&mut self, _: &str, _: f64, _: &[SimJob], _: &[RunningJob], _: &[ClusterLoad]) -> Vec<Move> {
            Vec::new()
        }
    }

    #[test]
    fn wait_estimate_is_the_fifo_start_time_of_the_jobs_size() {
        let mut m = Recorder::new(
            Stub { clusters: vec![cluster("a", 8, None)], price: vec![(1.0, 1.0)], ..Default::default() },
            |j, p| (j.id, p.start_free, p.est_wait_s),
        );
        let jobs = vec![
            job(0, 0.0, 100.0, 4, false, 0.0),
            job(1, 0.0, 300.0, 4, false, 0.0),
            // needs all 8: GPUs free at 100 (4) and 300 (8): starts at 300
            job(2, 1.0, 1000.0, 8, false, 0.0),
            // behind job 2, which holds all 8 GPUs from 300 to 1300
            job(3, 2.0, 100.0, 4, false, 0.0),
            // 4 GPUs are free at 150 but job 2 has them reserved; job 3 starts at 1300
            // on 4 of the 8 freed GPUs, so a 1-GPU job fits beside it then
            job(4, 150.0, 10.0, 1, false, 0.0),
        ];
        let r = simulate(&mut m, Strategy::Engine("cost".into()), &jobs, &[], &SimConfig::default(), &quiet);
        assert_eq!(r.completed, 5);
        let seen: Vec<(usize, u32, f64)> = m.seen.clone();
        assert_eq!(seen[0], (0, 8, 0.0));
        assert_eq!(seen[1], (1, 4, 0.0));
        assert_eq!(seen[2], (2, 0, 299.0));
        assert_eq!(seen[3], (3, 0, 1298.0));
        assert_eq!(seen[4], (4, 0, 1150.0));
        // and the estimates were right: job 4 waited exactly 1150 s
        assert_eq!(r.wait_p95_s, 1298.0);
        assert_eq!(r.wait_mean_s, (0.0 + 0.0 + 299.0 + 1298.0 + 1150.0) / 5.0);
    }

    /// The spot wait handed to the engine: the FIFO start on the spot capacity when
    /// spot jobs hold it, the remaining spell seen so far when the level is below
    /// the job's GPUs; and a job queued on spot starts when spot comes back.
    #[test]
    fn spot_wait_estimate_is_the_spot_fifo_or_the_spells_seen_so_far() {
        // 2 GPUs; spot level 2 during [0, 10000), 1 during [10000, 20000), then
        // cyclic (2 again; short again during [30000, 40000)).
        let trace = SpotTrace::parse(r#"{"metadata":{"gap_seconds":10000},"data":[2,1]}"#, "t").unwrap();
        let stub = Stub { clusters: vec![cluster("a", 2, Some(0))], price: vec![(3.0, 1.0)], ..Default::default() };
        let mut m = Recorder::new(stub, |j, p| (j.id, p.spot_wait_s));
        let jobs = vec![
            // spot free: no spot wait
            job(0, 0.0, 500.0, 2, true, 100.0),
            // both spot GPUs held by job 0 until 500
            job(1, 10.0, 100.0, 1, true, 100.0),
            // at 10010 the level is 1 < 2 GPUs and no spell has ended yet: the
            // open spell's age (10 s), not the trace ahead
            job(2, 10_010.0, 100.0, 2, true, 100.0),
            // at 30010 one spell of 10000 s has ended: 10000 − the age
            job(3, 30_010.0, 100.0, 2, true, 100.0),
        ];
        let r = simulate(
            &mut m,
            Strategy::Engine("cost".into()),
            &jobs,
            std::slice::from_ref(&trace),
            &SimConfig::default(),
            &quiet,
        );
        assert_eq!(r.completed, 4);
        assert_eq!(m.seen, vec![(0, f64::INFINITY), (1, 490.0), (2, 10.0), (3, 9_990.0)]);
        // job 2 queued on spot and started when the level came back at 20000
        assert_eq!(r.wait_p95_s, 20_000.0 - 10_010.0);
        // the baselines are never given a spot wait
        let mut b = Recorder::new(
            Stub { clusters: vec![cluster("a", 2, Some(0))], price: vec![(3.0, 1.0)], ..Default::default() },
            |j, p| (j.id, p.spot_wait_s),
        );
        simulate(&mut b, Strategy::FirstStart, &jobs, &[trace], &SimConfig::default(), &quiet);
        assert!(b.seen.iter().all(|&(_, w)| w == f64::INFINITY), "{:?}", b.seen);
    }

    /// The spot windows handed to the engine are those ended so far in the
    /// replay (never the trace ahead), without the one open at the replay's
    /// start (its start is unknown), and the open window's start while spot is
    /// at full.
    #[test]
    fn spot_windows_are_the_ones_ended_so_far() {
        // Full in [0, 2000), gone [2000, 3000), full [3000, 4000), gone [4000,
        // 6000), full from 6000 and, cyclically (7000 s), to 9000.
        let trace = SpotTrace::parse(r#"{"metadata":{"gap_seconds":1000},"data":[2,2,0,2,0,0,2]}"#, "t").unwrap();
        let stub = Stub { clusters: vec![cluster("a", 2, Some(0))], price: vec![(3.0, 1.0)], ..Default::default() };
        let mut m = Recorder::new(stub, |j, p| {
            let w = p.spot_windows.as_ref().map(|w| w.lengths_h().to_vec()).unwrap_or_default();
            (j.id, p.spot_full_since.is_finite().then_some(p.spot_full_since), w)
        });
        let jobs = vec![
            job(0, 10.0, 10.0, 1, true, 0.0),
            job(1, 3_500.0, 10.0, 1, true, 0.0),
            job(2, 6_500.0, 10.0, 1, true, 0.0),
            job(3, 9_500.0, 10.0, 1, true, 0.0),
            job(4, 10_500.0, 10.0, 1, true, 0.0),
        ];
        let r = simulate(&mut m, Strategy::Engine("cost".into()), &jobs, &[trace], &SimConfig::default(), &quiet);
        assert_eq!(r.completed, 5);
        let h = |s: f64| s / 3600.0;
        assert_eq!(
            m.seen,
            vec![
                (0, Some(0.0), vec![]),
                (1, Some(3_000.0), vec![]),
                (2, Some(6_000.0), vec![h(1_000.0)]),
                (3, None, vec![h(1_000.0), h(3_000.0)]),
                (4, Some(10_000.0), vec![h(1_000.0), h(3_000.0)]),
            ]
        );
    }

    /// `--spot-oracle` hands the engine the trace ahead of the clock: the window
    /// a job would start in as one window of its exact length (so the time to
    /// its first reclaim is exact), the exact end of a shortfall, and the
    /// shortfall after the window as the wait after a reclaim. Without it the
    /// same run sees only the past (`spot_windows_are_the_ones_ended_so_far`).
    #[test]
    fn the_spot_oracle_tells_the_engine_the_trace_ahead() {
        // Full [0, 2000), gone [2000, 3000), full [3000, 4000), gone [4000,
        // 6000), full [6000, 9000) (cyclic: 7000 s), gone [9000, 10000).
        let trace = SpotTrace::parse(r#"{"metadata":{"gap_seconds":1000},"data":[2,2,0,2,0,0,2]}"#, "t").unwrap();
        let stub = || Stub { clusters: vec![cluster("a", 2, Some(0))], price: vec![(3.0, 1.0)], ..Default::default() };
        let seen = |j: &SimJob, p: &PoolLoad| {
            let w = p.spot_windows.as_ref().map(|w| w.lengths_h().to_vec()).unwrap_or_default();
            (j.id, w, p.spot_wait_s, p.spot_recovery_s)
        };
        let jobs = vec![
            job(0, 10.0, 10.0, 1, true, 0.0),
            job(1, 3_500.0, 10.0, 1, true, 0.0),
            job(2, 6_500.0, 10.0, 1, true, 0.0),
            job(3, 9_500.0, 10.0, 1, true, 0.0),
        ];
        let cfg = SimConfig { spot_oracle: true, ..SimConfig::default() };
        let mut m = Recorder::new(stub(), seen);
        let r = simulate(&mut m, Strategy::Engine("cost".into()), &jobs, std::slice::from_ref(&trace), &cfg, &quiet);
        assert_eq!(r.completed, 4);
        let h = |s: f64| s / 3600.0;
        assert_eq!(
            m.seen,
            vec![
                (0, vec![h(2_000.0)], f64::INFINITY, 1_000.0),
                (1, vec![h(1_000.0)], f64::INFINITY, 2_000.0),
                (2, vec![h(3_000.0)], f64::INFINITY, 1_000.0),
                // gone: the windows seen so far, and spot is back in 500 s
                (3, vec![h(1_000.0), h(3_000.0)], 500.0, 500.0),
            ]
        );
        // Without it, the past only: no wait after a reclaim is known before
        // a shortfall has ended, and the windows are those ended so far.
        let mut m = Recorder::new(stub(), seen);
        simulate(&mut m, Strategy::Engine("cost".into()), &jobs, &[trace], &SimConfig::default(), &quiet);
        assert_eq!(m.seen[0], (0, vec![], f64::INFINITY, 0.0));
        assert_eq!(m.seen[2].1, vec![h(1_000.0)]);
    }

    fn spells_ended(lens: &[f64], since: Option<f64>) -> SpotMarket {
        let mut p = SpotMarket { spell_since: since, ..Default::default() };
        for &l in lens {
            p.spells.push(l);
        }
        p
    }

    /// The expected rest of a spot shortfall: the mean of `L − age` over the
    /// ended spells longer than the open spell's age.
    #[test]
    fn recovery_is_the_mean_remaining_spell_at_its_age() {
        // (ended spells, open since, now) → expected seconds until spot is back
        let table: &[(&[f64], Option<f64>, f64, f64)] = &[
            (&[], None, 50.0, 0.0),
            (&[], Some(20.0), 50.0, 30.0),
            (&[1200.0, 100.0, 200.0], None, 50.0, 500.0),
            (&[1200.0, 100.0, 200.0], Some(0.0), 0.0, 500.0),
            (&[1200.0, 100.0, 200.0], Some(0.0), 150.0, 550.0),
            (&[1200.0, 100.0, 200.0], Some(1000.0), 1500.0, 700.0),
            (&[1200.0, 100.0, 200.0], Some(0.0), 2000.0, 2000.0),
        ];
        for &(lens, since, now, want) in table {
            assert_eq!(spells_ended(lens, since).recovery_s(now), want, "{lens:?} {since:?} {now}");
        }
    }

    /// The wait after a reclaim handed to every spot option: the realized waits'
    /// mean, with the spells' estimate as a prior worth five waits.
    #[test]
    fn the_wait_after_a_reclaim_is_the_realized_mean_with_a_prior() {
        // (realized waits: count, Σ seconds; calibration ratio) → seconds, with
        // ended spells of 500 s on average (the prior is 500 × ratio)
        let table: &[((u32, f64), f64, f64)] = &[
            ((0, 0.0), 1.0, 500.0),
            ((0, 0.0), 1.5, 750.0),
            ((5, 5.0 * 1500.0), 1.0, 1000.0),
            ((45, 45.0 * 1500.0), 1.0, 1400.0),
        ];
        for &((n, real), ratio, want) in table {
            let recovery = spells_ended(&[1200.0, 100.0, 200.0], None).recovery_s(0.0);
            let p = PoolState { reclaim_waits: (n, real, 0.0), ..Default::default() };
            assert_eq!(p.wait_after_reclaim_s(recovery, ratio), want, "{n} {real} {ratio}");
        }
    }

    /// A job reclaimed from spot is handed the wait for spot times the pool's
    /// realized ÷ estimated waits after reclaims so far; the others, and every
    /// wait before any was seen, are not.
    #[test]
    fn the_wait_after_a_reclaim_is_calibrated_by_the_waits_seen() {
        // 1 GPU; spot up [0, 1000), down [1000, 3000), up [3000, 4000), down
        // [4000, 8000), up [8000, 10000) (cyclic), down [10000, 12000), …
        let trace = SpotTrace::parse(r#"{"metadata":{"gap_seconds":1000},"data":[1,0,0,1,0,0,0,0,1]}"#, "t").unwrap();
        let stub = Stub { clusters: vec![cluster("a", 1, Some(0))], price: vec![(3.0, 1.0)], ..Default::default() };
        let mut m = Recorder::new(stub, |j, p| (j.id, p.spot_wait_s));
        let jobs = vec![job(0, 0.0, 5000.0, 1, true, 100.0)];
        let r = simulate(
            &mut m,
            Strategy::Engine("cost".into()),
            &jobs,
            std::slice::from_ref(&trace),
            &SimConfig { rebalance_every_s: 0.0, ..SimConfig::default() },
            &quiet,
        );
        assert_eq!((r.completed, r.preemptions), (1, 3));
        // Placed at 0 (spot free); reclaimed at 1000 (no spell ended: the open
        // one's age, 0, gives no estimate); at 4000 (one spell of 2000 s ended,
        // nothing calibrated yet: 2000; it then waited 4000); at 10000 (spells
        // of 2000 and 4000: 3000, × (4000 + 5 h) ÷ (2000 + 5 h) = 1.1).
        let waits: Vec<f64> = m.seen.iter().map(|s| s.1).collect();
        assert_eq!(waits[..3], [f64::INFINITY, f64::INFINITY, 2000.0]);
        assert!((waits[3] - 3300.0).abs() < 1e-6, "{waits:?}");
        assert_eq!(waits.len(), 4);
        // Started again at 12000 with 1000 s of work left.
        assert_eq!(r.completion_mean_s, 13_000.0);
    }

    #[test]
    fn random_is_seeded() {
        let mk = || Stub {
            clusters: (0..5).map(|i| cluster(&format!("c{i}"), 8, None)).collect(),
            price: (0..5).map(|i| (1.0 + i as f64, 1.0)).collect(),
            ..Default::default()
        };
        let jobs: Vec<SimJob> = (0..200)
            .map(|i| job(i, i as f64 * 7.0, 100.0 + (i % 13) as f64 * 50.0, 1 + (i % 3) as u32, false, 0.0))
            .collect();
        let run = |seed| {
            let cfg = SimConfig { seed, ..SimConfig::default() };
            simulate(&mut mk(), Strategy::Random, &jobs, &[], &cfg, &quiet)
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7).total_usd, run(8).total_usd);
    }
}
