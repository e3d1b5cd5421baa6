//! Spot availability traces (SkyPilot "Can't Be Late" format):
//! `{"metadata": {"gap_seconds": N}, "data": [v0, v1, ...]}`.
//!
//! Mapping to the simulator (documented in `docs/simulator.md`):
//! - `data[i]` is the number of spot instances available (or still alive, for the
//!   preemption traces) during tick `i`, i.e. `[i*gap, (i+1)*gap)`. `max(data)` is the
//!   trace's full size. The trace is replayed cyclically so it covers any horizon.
//! - The available fraction `data[i] / max` scales the cluster's spot GPU pool: a cluster
//!   with 512 spot GPUs and a tick value of 3/4 offers 384 spot GPUs during that tick.
//! - A drop `data[i] < data[i-1]` is a preemption event: running spot jobs are evicted
//!   until the GPUs they hold fit the reduced pool (newest first, so the longest-running
//!   jobs survive, as with real reclaim of the newest capacity). Evicted jobs lose the
//!   work done since their last checkpoint and go back to placement.

use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct SpotTrace {
    pub name: String,
    pub gap_s: f64,
    pub data: Vec<u32>,
    pub max: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum SpotError {
    #[error("cannot read spot trace {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a spot trace: {msg}")]
    Format { path: String, msg: String },
}

impl SpotTrace {
    /// Parses a trace with the engine's reader (the live feed's format; the
    /// replay ignores `metadata.start_unix`).
    pub fn parse(text: &str, name: &str) -> Result<Self, SpotError> {
        let s = fleet_engine::parse_spot(text).map_err(|e| SpotError::Format { path: name.into(), msg: e.msg })?;
        Ok(SpotTrace { name: name.into(), gap_s: s.gap_s, data: s.data, max: s.max })
    }

    pub fn read(path: &Path) -> Result<Self, SpotError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SpotError::Io { path: path.display().to_string(), source })?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Self::parse(&text, &name)
    }

    /// Every tick is 0 or the trace's full size (> 0): a drop reclaims every
    /// spot job, so a run on spot lies inside one window of availability.
    pub fn is_all_or_nothing(&self) -> bool {
        self.max > 0 && self.data.iter().all(|&d| d == 0 || d == self.max)
    }

    /// Fraction of the spot pool available at tick `i` (cyclic).
    pub fn fraction_at_tick(&self, i: usize) -> f64 {
        if self.max == 0 {
            return 0.0;
        }
        self.data[i % self.data.len()] as f64 / self.max as f64
    }

    /// Fraction available at simulated time `t` (seconds, offset by `phase_s`).
    pub fn fraction_at(&self, t: f64) -> f64 {
        let i = (t.max(0.0) / self.gap_s) as usize;
        self.fraction_at_tick(i)
    }

    /// The first tick boundary after `t` where the fraction changes, with the new
    /// fraction; `None` when it never changes. At most one cycle of the trace is
    /// scanned, so events are generated as the clock advances (no precomputation
    /// proportional to the simulated span).
    pub fn next_change(&self, t: f64) -> Option<(f64, f64)> {
        if self.max == 0 || !t.is_finite() {
            return None;
        }
        let i = (t.max(0.0) / self.gap_s).floor() as usize;
        let cur = self.fraction_at_tick(i);
        (1..=self.data.len()).map(|k| i + k).find_map(|k| {
            let f = self.fraction_at_tick(k);
            (f != cur).then_some((k as f64 * self.gap_s, f))
        })
    }

    /// All tick boundaries in `[0, horizon)` where the fraction changes, with the new
    /// fraction. Consecutive equal values are merged.
    pub fn changes(&self, horizon_s: f64) -> Vec<(f64, f64)> {
        let mut out = Vec::new();
        if self.max == 0 {
            return out;
        }
        let n_ticks = (horizon_s / self.gap_s).ceil() as usize;
        let mut prev = self.fraction_at_tick(0);
        out.push((0.0, prev));
        for i in 1..n_ticks {
            let f = self.fraction_at_tick(i);
            if f != prev {
                out.push((i as f64 * self.gap_s, f));
                prev = f;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str, horizon: f64, expected: &[(f64, f64)]) {
        let t = SpotTrace::parse(json, "t").unwrap();
        assert_eq!(t.changes(horizon), expected);
    }

    #[test]
    fn changes_are_cyclic_and_merged() {
        check(
            r#"{"metadata":{"gap_seconds":10},"data":[4,4,2,4]}"#,
            80.0,
            &[(0.0, 1.0), (20.0, 0.5), (30.0, 1.0), (60.0, 0.5), (70.0, 1.0)],
        );
        check(r#"{"metadata":{"gap_seconds":10},"data":[1]}"#, 50.0, &[(0.0, 1.0)]);
        check(r#"{"metadata":{"gap_seconds":10},"data":[0,0]}"#, 50.0, &[]);
    }

    #[test]
    fn next_change_walks_the_same_changes_lazily() {
        let t = SpotTrace::parse(r#"{"metadata":{"gap_seconds":10},"data":[4,4,2,4]}"#, "t").unwrap();
        let mut got = vec![(0.0, t.fraction_at(0.0))];
        while let Some(c) = t.next_change(got.last().map(|x| x.0).unwrap_or(0.0)) {
            if c.0 >= 80.0 {
                break;
            }
            got.push(c);
        }
        assert_eq!(got, t.changes(80.0));
        let flat = SpotTrace::parse(r#"{"metadata":{"gap_seconds":10},"data":[3,3]}"#, "t").unwrap();
        assert_eq!(flat.next_change(1e15), None);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(SpotTrace::parse("{}", "x").is_err());
        assert!(SpotTrace::parse(r#"{"metadata":{"gap_seconds":0},"data":[1]}"#, "x").is_err());
        assert!(SpotTrace::parse(r#"{"metadata":{"gap_seconds":5},"data":[]}"#, "x").is_err());
    }
}
