//! Hook latency statistics, logged every [`WINDOW`] calls so the
//! benchmark (and an admin) can read the plugin's own cost from
//! slurmctld.log: `job_submit/fleet: stats ...`.

use std::time::{Duration, Instant};

pub const WINDOW: usize = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Left alone without asking the agent.
    Skip,
    Local,
    Forward,
    Reject,
    /// Agent unavailable; left alone.
    FailOpen,
    /// Rewritten into a deferred stand-in (no agent round trip, or the
    /// agent did not answer).
    Deferred,
    /// Left alone as [`Outcome::Local`], the view's answer for the same
    /// shape remembered (counted in `local=` and in `remembered=`).
    Remembered,
}

#[derive(Default)]
pub struct Stats {
    window: Vec<u64>,
    counts: [u64; 7],
    /// Calls that asked the agent over its socket, whatever the outcome
    /// (a LOCAL job answered from the view does not; one the agent kept
    /// home does): `asked=N` in the line.
    asked: u64,
    /// The agent round trips' own durations in this window (µs): the
    /// part of a FORWARD hook spent on the socket and in the agent,
    /// `ask_p50_us=` / `ask_p99_us=` in the line.
    ask_window: Vec<u64>,
    total: u64,
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl Stats {
    /// Record one call (`ask_us`: it made the agent round trip, which took
    /// that long); returns a log line when a window is complete.
    pub fn record(&mut self, o: Outcome, ask_us: Option<u64>, us: u64) -> Option<String> {
        if self.window.capacity() == 0 {
            self.window.reserve_exact(WINDOW);
        }
        self.window.push(us);
        self.counts[o as usize] += 1;
        self.asked += u64::from(ask_us.is_some());
        self.ask_window.extend(ask_us);
        self.total += 1;
        if self.window.len() < WINDOW {
            return None;
        }
        let line = self.line();
        self.window.clear();
        self.ask_window.clear();
        Some(line)
    }

    fn line(&self) -> String {
        let mut w = self.window.clone();
        w.sort_unstable();
        let [skip, local, forward, reject, failopen, deferred, remembered] = self.counts;
        let mean = w.iter().sum::<u64>() as f64 / w.len().max(1) as f64;
        let mut line = format!(
            "job_submit/fleet: stats last={} p50_us={} p99_us={} max_us={} mean_us={mean:.1} total={} skip={skip} local={} forward={forward} reject={reject} failopen={failopen} deferred={deferred} asked={} remembered={remembered}",
            w.len(),
            pct(&w, 0.50),
            pct(&w, 0.99),
            w.last().copied().unwrap_or(0),
            self.total,
            local + remembered,
            self.asked
        );
        if !self.ask_window.is_empty() {
            let mut a = self.ask_window.clone();
            a.sort_unstable();
            line.push_str(&format!(" ask_p50_us={} ask_p99_us={}", pct(&a, 0.50), pct(&a, 0.99)));
        }
        line
    }

    pub fn summary(&self) -> Option<String> {
        (self.total > 0).then(|| self.line())
    }
}

/// One warning per interval; counts what it suppressed.
pub struct RateLimit {
    last: Option<Instant>,
    suppressed: u64,
    interval: Duration,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit { last: None, suppressed: 0, interval: Duration::from_secs(60) }
    }
}

impl RateLimit {
    /// `Some(suppressed)` when a warning may be written now.
    pub fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < self.interval) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_line_has_percentiles() {
        let mut s = Stats::default();
        let mut line = None;
        for i in 0..WINDOW as u64 {
            // Every fifth call asked the agent, which took a tenth of it.
            line = s.record(Outcome::Local, (i % 5 == 0).then_some((i + 1) / 10), i + 1);
        }
        let line = line.expect("a full window logs");
        assert!(line.contains(" p50_us=251") && line.contains(" p99_us=495") && line.contains("max_us=500"), "{line}");
        assert!(line.contains(" mean_us=250.5 "), "{line}");
        assert!(line.contains("local=500") && line.contains(" asked=100 remembered=0 "), "{line}");
        // The asked calls were 1, 6, ..., 496 µs long: a tenth is 0..49.
        assert!(line.ends_with(" ask_p50_us=25 ask_p99_us=49"), "{line}");
        // The next window starts empty: no round trip, no ask figures.
        // Remembered answers count as LOCAL too.
        let mut next = None;
        for i in 0..WINDOW as u64 {
            next = s.record(if i % 2 == 0 { Outcome::Local } else { Outcome::Remembered }, None, i + 1);
        }
        let next = next.expect("a full window logs");
        assert!(next.contains(" local=1000 "), "{next}");
        assert!(next.ends_with(" asked=100 remembered=250"), "{next}");
    }

    #[test]
    fn rate_limit_counts_suppressed() {
        let mut r = RateLimit::default();
        assert_eq!(r.allow(), Some(0));
        assert_eq!(r.allow(), None);
        assert_eq!(r.allow(), None);
        r.last = Some(Instant::now() - Duration::from_secs(61));
        assert_eq!(r.allow(), Some(2));
    }
}
