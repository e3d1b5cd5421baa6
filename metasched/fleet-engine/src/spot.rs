//! Spot availability series: the SkyPilot spot-trace format the simulator
//! replays, and the same files as a live feed of the meta-scheduler.
//!
//! A series is `{"metadata": {"gap_seconds": N, "start_unix": T}, "data":
//! [v0, v1, ...]}`: `data[i]` spot instances available during `[T + i·N, T +
//! (i+1)·N)`, `max(data)` the full level. The simulator replays a series from
//! its first tick at the trace's first submission (cyclically) and ignores
//! `start_unix`; a live feed needs it, to know which tick is now.
//!
//! What the engine reads from a series at a moment ([`SpotSeries::at`]) is
//! what the simulator hands it from the replay's clock (`fleet_sim`'s spot
//! markets), from the past only: whether spot is there now, the preemption
//! rate so far, the windows at full level ended so far and the age of the one
//! open now, and how long a shortfall lasts given its age
//! ([`SpotSpells::mean_remaining_s`], shared with the simulator).

use std::sync::Arc;

use crate::feeds::FeedError;
use crate::state::{PoolState, SpotWindows};

/// One spot availability series.
#[derive(Clone, Debug, PartialEq)]
pub struct SpotSeries {
    pub gap_s: f64,
    /// Instances available per tick (negative or non-finite values read as 0).
    pub data: Vec<u32>,
    /// The full level: `max(data)`.
    pub max: u32,
    /// Unix time of the start of `data[0]` (`metadata.start_unix`), if given.
    pub start_unix: Option<f64>,
    /// Level changes as runs: (first tick, ticks, at full level), in order;
    /// only for series read with a start (live feeds), as `cum`.
    runs: Vec<(usize, usize, bool)>,
    /// Through each tick: (hours of spot available, as a share of the full
    /// level; drops, as a share of it), so that a ranking reads them at once.
    cum: Vec<(f64, f64)>,
}

#[derive(serde::Deserialize)]
struct Raw {
    metadata: RawMeta,
    data: Vec<f64>,
}

#[derive(serde::Deserialize)]
struct RawMeta {
    gap_seconds: f64,
    #[serde(default)]
    start_unix: Option<f64>,
}

/// Parses a spot series. Errors carry serde's line (1-based) and what is wrong.
pub fn parse_spot(text: &str) -> Result<SpotSeries, FeedError> {
    let raw: Raw = serde_json::from_str(text).map_err(|e| FeedError { line: e.line(), msg: e.to_string() })?;
    if !(raw.metadata.gap_seconds.is_finite() && raw.metadata.gap_seconds > 0.0) {
        return Err(FeedError { line: 1, msg: "metadata.gap_seconds must be > 0".into() });
    }
    if raw.data.is_empty() {
        return Err(FeedError { line: 1, msg: "empty data".into() });
    }
    if let Some(t) = raw.metadata.start_unix.filter(|t| !(t.is_finite() && *t >= 0.0)) {
        return Err(FeedError { line: 1, msg: format!("metadata.start_unix must be a time (unix seconds), not {t}") });
    }
    let data: Vec<u32> =
        raw.data.iter().map(|v| if v.is_finite() && *v > 0.0 { v.round() as u32 } else { 0 }).collect();
    let max = data.iter().copied().max().unwrap_or(0);
    let mut s = SpotSeries {
        gap_s: raw.metadata.gap_seconds,
        data,
        max,
        start_unix: raw.metadata.start_unix,
        runs: Vec::new(),
        cum: Vec::new(),
    };
    if s.start_unix.is_some() && s.max > 0 {
        s.runs = s.level_runs();
        let max = s.max as f64;
        let (mut avail_h, mut drops) = (0.0, 0.0);
        s.cum = (0..s.data.len())
            .map(|i| {
                let d = s.data[i] as f64;
                avail_h += d / max * s.gap_s / 3600.0;
                if i > 0 {
                    drops += (s.data[i - 1] as f64 - d).max(0.0) / max;
                }
                (avail_h, drops)
            })
            .collect();
    }
    Ok(s)
}

/// The series a cloud cluster's spot pools follow: the first (in `names`'
/// order) whose name holds the cluster's region without its provider (e.g.
/// `us-west-2` for `aws:us-west-2`). The simulator and the live feed match
/// alike; the simulator then deals unmatched pools the traces in turn.
pub fn series_for_region<'a>(region: &str, names: impl IntoIterator<Item = &'a str>) -> Option<usize> {
    let region = region.split_once(':').map_or(region, |x| x.1);
    if region.is_empty() {
        return None;
    }
    names.into_iter().position(|n| n.contains(region))
}

/// What a live feed says of a spot pool at a moment (see [`SpotSeries::at`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SpotNow {
    /// Some spot capacity is there now.
    pub available: bool,
    /// Reclaimed capacity (drops, as a share of the full level) per hour of
    /// capacity available, so far; `None` before any availability.
    pub preemptions_per_hour: Option<f64>,
    /// The windows at full level ended so far (the first is left out when it
    /// was open at the series' first tick: its start is unknown).
    pub windows: Option<Arc<SpotWindows>>,
    /// At full level now: when the window began, if known.
    pub window_since_unix: Option<f64>,
    /// The expected rest of a shortfall at the age of the one open now (0 at
    /// full: a shortfall starting now), from the shortfalls ended so far;
    /// `None` before one has ended.
    pub recovery_s: Option<f64>,
}

impl SpotNow {
    /// Writes what the feed says into a pool's state: spot available or not,
    /// its rate, windows and recovery time; when spot is gone, the wait for
    /// it is the expected rest of the shortfall.
    pub fn apply(&self, pool: &mut PoolState) {
        pool.spot_available = self.available;
        if let Some(r) = self.preemptions_per_hour {
            pool.spot_preemptions_per_hour = Some(r);
        }
        pool.spot_windows = self.windows.clone();
        pool.spot_window_since_unix = self.window_since_unix;
        pool.spot_recovery_s = self.recovery_s;
        pool.spot_wait_s = if self.available { None } else { self.recovery_s };
    }
}

/// How long a live feed may run behind the clock before it is ignored: its
/// last tick plus this many ticks.
pub const STALE_TICKS: f64 = 2.0;

impl SpotSeries {
    fn level_runs(&self) -> Vec<(usize, usize, bool)> {
        let mut runs: Vec<(usize, usize, bool)> = Vec::new();
        for (i, &d) in self.data.iter().enumerate() {
            let full = self.max > 0 && d == self.max;
            match runs.last_mut() {
                Some(r) if r.2 == full => r.1 += 1,
                _ => runs.push((i, 1, full)),
            }
        }
        runs
    }

    /// The series covers `now_unix`: it has started and is not stale (see
    /// [`SpotSeries::at`]).
    pub fn covers(&self, now_unix: f64) -> bool {
        self.start_unix.is_some_and(|start| {
            now_unix >= start && now_unix < start + (self.data.len() as f64 + STALE_TICKS) * self.gap_s
        })
    }

    /// What the series says at `now_unix`, from its ticks up to now only.
    /// `None` without a start, before it, or once the series is stale (more
    /// than [`STALE_TICKS`] ticks past its last): the pool is then scored as
    /// configured.
    pub fn at(&self, now_unix: f64) -> Option<SpotNow> {
        let start = self.start_unix?;
        if !now_unix.is_finite() || now_unix < start || self.max == 0 {
            return None;
        }
        let end = start + self.data.len() as f64 * self.gap_s;
        if now_unix >= end + STALE_TICKS * self.gap_s {
            return None;
        }
        let tick = (((now_unix - start) / self.gap_s) as usize).min(self.data.len() - 1);
        let t = |i: usize| start + i as f64 * self.gap_s;
        let (mut windows, mut spells) = (Vec::new(), Vec::new());
        let (avail_h, drops) = self.cum[tick];
        // The run (stretch at or below full) open now, and those ended before it.
        let k = self.runs.partition_point(|r| r.0 <= tick) - 1;
        let mut below_since: Option<usize> = None;
        for (j, &(first, len, full)) in self.runs[..k].iter().enumerate() {
            if full {
                if j > 0 {
                    windows.push(len as f64 * self.gap_s / 3600.0);
                }
                if let Some(b) = below_since.take() {
                    spells.push((first - b) as f64 * self.gap_s);
                }
            } else {
                below_since.get_or_insert(first);
            }
        }
        let (first, _, full) = self.runs[k];
        let available = self.data[tick] > 0;
        let (window_since_unix, age_s) = if full {
            if let Some(b) = below_since.take() {
                spells.push((first - b) as f64 * self.gap_s);
            }
            ((k > 0).then(|| t(first)), 0.0)
        } else {
            (None, now_unix - t(below_since.unwrap_or(first)))
        };
        Some(SpotNow {
            available,
            preemptions_per_hour: (avail_h > 0.0).then(|| drops / avail_h),
            windows: SpotWindows::new(windows).map(Arc::new),
            window_since_unix,
            recovery_s: (!spells.is_empty()).then(|| SpotSpells::from_lengths(spells).mean_remaining_s(age_s)),
        })
    }
}

/// The lengths of the shortfalls (spells below the full level) ended so far,
/// for the expected rest of the one open now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpotSpells {
    /// Seconds, ascending; `tail[i]` = Σ `lens[i..]`.
    lens: Vec<f64>,
    tail: Vec<f64>,
}

impl SpotSpells {
    /// A shortfall of `len_s` seconds ended.
    pub fn push(&mut self, len_s: f64) {
        let i = self.lens.partition_point(|&l| l <= len_s);
        self.lens.insert(i, len_s);
        self.tail.insert(i, 0.0);
        let mut acc = 0.0;
        for k in (0..self.lens.len()).rev() {
            acc += self.lens[k];
            self.tail[k] = acc;
        }
    }

    /// From the lengths (s) of shortfalls ended, in any order: the same as
    /// pushing them one by one.
    pub fn from_lengths(mut lens: Vec<f64>) -> SpotSpells {
        lens.sort_by(f64::total_cmp);
        let mut tail = vec![0.0; lens.len()];
        let mut acc = 0.0;
        for k in (0..lens.len()).rev() {
            acc += lens[k];
            tail[k] = acc;
        }
        SpotSpells { lens, tail }
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// How long a shortfall that has lasted `age_s` should take to end: the
    /// mean of `L − age` over the ended shortfalls longer than the age.
    /// Shortfalls have a falling hazard (most are short, a few last many
    /// hours), so the longer one has lasted, the longer it is expected to
    /// last. With none that long, the age itself (a lower bound known now); 0
    /// when there is neither.
    pub fn mean_remaining_s(&self, age_s: f64) -> f64 {
        let i = self.lens.partition_point(|&l| l <= age_s);
        match self.tail.get(i) {
            Some(&sum) => sum / (self.lens.len() - i) as f64 - age_s,
            None => age_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(data: &str, start: Option<f64>) -> SpotSeries {
        let start = start.map_or(String::new(), |s| format!(",\"start_unix\":{s}"));
        parse_spot(&format!("{{\"metadata\":{{\"gap_seconds\":100{start}}},\"data\":[{data}]}}")).unwrap()
    }

    #[test]
    fn bad_series_are_errors_naming_the_problem() {
        let err = |t: &str| parse_spot(t).unwrap_err().to_string();
        assert!(err("{}").contains("missing field `metadata`"), "{}", err("{}"));
        assert!(err("{\"metadata\":{\"gap_seconds\":0},\"data\":[1]}").contains("gap_seconds must be > 0"));
        assert!(err("{\"metadata\":{\"gap_seconds\":5},\"data\":[]}").contains("empty data"));
        let e = parse_spot("{\"metadata\":{\"gap_seconds\":5,\n\"start_unix\":-3},\"data\":[1]}").unwrap_err();
        assert!(e.msg.contains("start_unix must be a time"), "{e}");
        let e = parse_spot("{\"metadata\":{\"gap_seconds\":5},\n\"data\":[1,\"x\"]}").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
    }

    #[test]
    fn a_series_without_a_start_or_past_its_end_says_nothing() {
        assert_eq!(series("2,2", None).at(50.0), None);
        let s = series("2,0,2", Some(1000.0));
        assert_eq!(s.at(999.0), None);
        assert!(s.at(1000.0).is_some());
        // Last tick [1200, 1300); stale from 1300 + 2 ticks.
        assert!(s.at(1499.0).is_some() && s.covers(1499.0));
        assert_eq!(s.at(1500.0), None);
        assert!(!s.covers(1500.0) && !s.covers(999.0) && s.covers(1000.0));
        assert_eq!(series("0,0", Some(0.0)).at(10.0), None, "never any spot: no level to speak of");
    }

    /// Worked by hand: ticks of 100 s from t = 0,
    /// levels 4 4 | 0 0 0 | 4 | 2 | 4 4 4 | 0 | 4.
    #[test]
    fn the_state_at_a_moment_comes_from_the_ticks_before_it() {
        let s = series("4,4,0,0,0,4,2,4,4,4,0,4", Some(0.0));
        // t = 250: in the first shortfall (since 200, age 50 s); none ended yet.
        let n = s.at(250.0).unwrap();
        assert!(!n.available);
        assert_eq!((n.recovery_s, n.windows.clone(), n.window_since_unix), (None, None, None));
        // Up 2 ticks (200 s = 1/18 h) at full, one full drop.
        assert_eq!(n.preemptions_per_hour, Some(18.0));
        // t = 650: at half level since 600 (a shortfall of 50 s so far); the first
        // shortfall (300 s) ended; the window [500, 600) ended (the first window,
        // open at tick 0, is left out).
        let n = s.at(650.0).unwrap();
        assert!(n.available, "half the level is still spot");
        assert_eq!(n.windows.as_ref().map(|w| w.lengths_h().to_vec()), Some(vec![100.0 / 3600.0]));
        assert_eq!(n.window_since_unix, None);
        assert_eq!(n.recovery_s, Some(300.0 - 50.0), "mean of L − age over longer spells");
        let mut p = PoolState {
            free_gpus: 8,
            expected_wait_s: None,
            spot_available: false,
            spot_wait_s: Some(1.0),
            spot_price: None,
            spot_recovery_s: None,
            spot_preemptions_per_hour: None,
            spot_windows: None,
            spot_window_since_unix: None,
        };
        n.apply(&mut p);
        assert!(p.spot_available && p.spot_wait_s.is_none());
        // t = 850: at full since 700; shortfalls of 300 and 100 s ended; recovery
        // at age 0 = their mean.
        let n = s.at(850.0).unwrap();
        assert_eq!(n.window_since_unix, Some(700.0));
        assert_eq!(n.recovery_s, Some(200.0));
        // t = 1050: gone since 1000 (age 50): the spells longer than 50 s are
        // both: mean 200 − 50. The window [700, 1000) ended.
        let n = s.at(1050.0).unwrap();
        assert!(!n.available);
        let w: Vec<f64> = n.windows.as_ref().unwrap().lengths_h().iter().map(|h| (h * 3600.0).round()).collect();
        assert_eq!(w, vec![100.0, 300.0]);
        assert_eq!(n.recovery_s, Some(150.0));
        n.apply(&mut p);
        assert_eq!((p.spot_available, p.spot_wait_s, p.spot_recovery_s), (false, Some(150.0), Some(150.0)));
        // Drops: 4→0 (1), 4→2 (½), 4→0 (1) by tick 10; available 4·1 + ½ + 3 ticks.
        let avail_h = (2.0 + 1.0 + 0.5 + 3.0) * 100.0 / 3600.0;
        let rate = n.preemptions_per_hour.unwrap();
        assert!((rate - 2.5 / avail_h).abs() < 1e-12, "{rate}");
    }

    proptest::proptest! {
        /// Whatever the text, the reader answers (never panics); whatever the
        /// series and the moment, what it says is in range and from the past.
        #[test]
        fn any_series_at_any_moment_says_something_sane(
            text in ".{0,80}",
            data in proptest::collection::vec(0u32..4, 1..40),
            start in 0.0f64..1000.0,
            gap in 1.0f64..500.0,
            now in proptest::prop_oneof![-1e3f64..3e4, proptest::strategy::Just(f64::NAN), proptest::strategy::Just(f64::INFINITY)],
        ) {
            let _ = parse_spot(&text);
            let body: Vec<String> = data.iter().map(u32::to_string).collect();
            let json = format!("{{\"metadata\":{{\"gap_seconds\":{gap},\"start_unix\":{start}}},\"data\":[{}]}}", body.join(","));
            let s = parse_spot(&json).unwrap();
            let Some(n) = s.at(now) else {
                proptest::prop_assert!(!(now >= start && s.max > 0 && s.covers(now)));
                return Ok(());
            };
            proptest::prop_assert!(s.covers(now));
            let tick = (((now - start) / gap) as usize).min(data.len() - 1);
            proptest::prop_assert_eq!(n.available, data[tick] > 0);
            let rate = n.preemptions_per_hour.unwrap_or(0.0);
            proptest::prop_assert!(rate.is_finite() && rate >= 0.0);
            let r = n.recovery_s.unwrap_or(0.0);
            proptest::prop_assert!(r.is_finite() && r >= 0.0);
            if let Some(since) = n.window_since_unix {
                proptest::prop_assert!(since > start && since <= now && data[tick] == s.max);
            }
            // Windows ended by now: each a whole number of ticks, within the ticks seen.
            let seen_h = (tick + 1) as f64 * gap / 3600.0;
            let total: f64 = n.windows.as_ref().map_or(0.0, |w| w.lengths_h().iter().sum());
            proptest::prop_assert!(total <= seen_h * (1.0 + 1e-9));
        }
    }

    #[test]
    fn a_series_follows_the_clusters_whose_region_its_name_holds() {
        let names = ["aws-02-15-2023__us-east-1a_v100_1", "aws__us-west-2a"];
        assert_eq!(series_for_region("aws:us-west-2", names), Some(1));
        assert_eq!(series_for_region("us-east-1", names), Some(0));
        assert_eq!(series_for_region("gcp:europe-west4", names), None);
        assert_eq!(series_for_region("aws:", names), None);
    }

    #[test]
    fn the_rest_of_a_shortfall_is_the_mean_over_longer_ones() {
        let mut s = SpotSpells::default();
        assert_eq!(s.mean_remaining_s(30.0), 30.0);
        for l in [1200.0, 100.0, 200.0] {
            s.push(l);
        }
        assert_eq!(s.mean_remaining_s(0.0), 500.0);
        assert_eq!(s.mean_remaining_s(150.0), (200.0 + 1200.0) / 2.0 - 150.0);
        assert_eq!(s.mean_remaining_s(2000.0), 2000.0);
        assert_eq!(SpotSpells::from_lengths(vec![200.0, 1200.0, 100.0]), s);
    }
}
