//! Live feeds of the cost engine: carbon-intensity series, egress matrices
//! and spot availability series, read from directories named in the
//! configuration.
//!
//! Parsing is the engine's own ([`fleet_engine::parse_carbon`],
//! [`fleet_engine::parse_egress`], [`fleet_engine::parse_spot`]), the same
//! code the simulator runs; this
//! module only finds the files, reads them and remembers their mtimes. A
//! load builds a new immutable [`Feeds`] snapshot; the daemon swaps it in
//! (an `Arc`) only when every file parsed, so a broken file keeps the old
//! snapshot. Errors name the file and line (`path:line: message`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use fleet_engine::{CarbonSeries, EgressMatrix, SpotSeries};

/// Suffix of the egress matrix files; the provider is what precedes it.
pub const EGRESS_SUFFIX: &str = "_transmission_cost_matrix.csv";

/// One immutable snapshot of the feeds.
#[derive(Clone, Debug, Default)]
pub struct Feeds {
    /// One series per file (`<ZONE>_<year>_hourly.csv`), file-name order.
    pub carbon: Vec<Arc<CarbonSeries>>,
    /// One matrix per provider file, file-name order.
    pub egress: Vec<EgressMatrix>,
    /// Spot availability series by file stem (`*.json`, file-name order),
    /// each with its start time (`metadata.start_unix`).
    pub spot: Vec<(String, Arc<SpotSeries>)>,
    /// The files read, for logs.
    pub files: Vec<PathBuf>,
}

impl Feeds {
    pub fn is_empty(&self) -> bool {
        self.carbon.is_empty() && self.egress.is_empty() && self.spot.is_empty()
    }
}

/// Which directories to read (`carbon`, `egress` of the configuration).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FeedDirs {
    pub carbon: Option<PathBuf>,
    pub egress: Option<PathBuf>,
    pub spot: Option<PathBuf>,
}

/// The feed files of each kind: carbon, egress, spot.
type FeedFiles = (Vec<PathBuf>, Vec<PathBuf>, Vec<PathBuf>);

/// What the files looked like when last read: (path, mtime, length).
type Fingerprint = Vec<(PathBuf, Option<SystemTime>, u64)>;

fn matching(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(&keep))
        .collect();
    v.sort();
    Ok(v)
}

fn carbon_file(name: &str) -> bool {
    name.ends_with(".csv") && !name.starts_with('.')
}

fn egress_file(name: &str) -> bool {
    name.ends_with(EGRESS_SUFFIX) && !name.starts_with('.')
}

fn spot_file(name: &str) -> bool {
    name.ends_with(".json") && !name.starts_with('.')
}

impl FeedDirs {
    pub fn any(&self) -> bool {
        self.carbon.is_some() || self.egress.is_some() || self.spot.is_some()
    }

    fn files(&self) -> Result<FeedFiles, String> {
        let list = |dir: &Option<PathBuf>, keep: fn(&str) -> bool| match dir {
            Some(d) => matching(d, keep),
            None => Ok(Vec::new()),
        };
        Ok((list(&self.carbon, carbon_file)?, list(&self.egress, egress_file)?, list(&self.spot, spot_file)?))
    }

    fn fingerprint(&self) -> Result<Fingerprint, String> {
        let (c, e, s) = self.files()?;
        Ok(c.into_iter()
            .chain(e)
            .chain(s)
            .map(|p| {
                let md = std::fs::metadata(&p).ok();
                let mtime = md.as_ref().and_then(|m| m.modified().ok());
                (p, mtime, md.map_or(0, |m| m.len()))
            })
            .collect())
    }

    /// Reads and parses every feed file. The first bad file fails the
    /// whole load with `path:line: message`.
    pub fn load(&self) -> Result<Feeds, String> {
        let (carbon_files, egress_files, spot_files) = self.files()?;
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
        let mut feeds = Feeds::default();
        for p in carbon_files {
            let s =
                fleet_engine::parse_carbon(&read(&p)?).map_err(|e| format!("{}:{}: {}", p.display(), e.line, e.msg))?;
            feeds.carbon.push(Arc::new(s));
            feeds.files.push(p);
        }
        for p in egress_files {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let provider = name.strip_suffix(EGRESS_SUFFIX).unwrap_or(name).to_string();
            let m = fleet_engine::parse_egress(&provider, &read(&p)?)
                .map_err(|e| format!("{}:{}: {}", p.display(), e.line, e.msg))?;
            feeds.egress.push(m);
            feeds.files.push(p);
        }
        for p in spot_files {
            let name = p.file_stem().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            let s =
                fleet_engine::parse_spot(&read(&p)?).map_err(|e| format!("{}:{}: {}", p.display(), e.line, e.msg))?;
            if s.start_unix.is_none() {
                return Err(format!(
                    "{}:1: no metadata.start_unix: a live spot feed needs the time (unix seconds) of its first tick",
                    p.display()
                ));
            }
            feeds.spot.push((name, Arc::new(s)));
            feeds.files.push(p);
        }
        Ok(feeds)
    }
}

/// Watches the feed files for changes (mtime, length, files added or
/// removed).
#[derive(Debug)]
pub struct FeedWatcher {
    dirs: FeedDirs,
    /// The files as last tried, good or bad: a broken file is reported
    /// once, not at every check, and retried when it changes again.
    seen: Fingerprint,
    /// The last directory error, reported once as well.
    dir_error: Option<String>,
}

/// Outcome of [`FeedWatcher::check`].
#[derive(Debug)]
pub enum FeedCheck {
    Unchanged,
    Reloaded(Feeds),
    /// The old snapshot stays; the message names file and line.
    Failed(String),
}

impl FeedWatcher {
    /// Loads the feeds once (start-up): an error here is a configuration
    /// error.
    pub fn start(dirs: FeedDirs) -> Result<(FeedWatcher, Feeds), String> {
        let seen = dirs.fingerprint()?;
        let feeds = dirs.load()?;
        Ok((FeedWatcher { dirs, seen, dir_error: None }, feeds))
    }

    /// Reloads when any file changed since the last check. Blocking I/O.
    pub fn check(&mut self) -> FeedCheck {
        let now = match self.dirs.fingerprint() {
            Ok(f) => f,
            Err(e) if self.dir_error.as_ref() == Some(&e) => return FeedCheck::Unchanged,
            Err(e) => {
                self.dir_error = Some(e.clone());
                return FeedCheck::Failed(e);
            }
        };
        if self.dir_error.take().is_some() {
            // The directory is back: reload whatever it holds.
            self.seen.clear();
            self.seen.push((PathBuf::new(), None, u64::MAX));
        }
        if now == self.seen {
            return FeedCheck::Unchanged;
        }
        self.seen = now;
        match self.dirs.load() {
            Ok(f) => FeedCheck::Reloaded(f),
            Err(e) => FeedCheck::Failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARBON: &str = "datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh\n2023-01-01 00:00:00,ZA,10,20\n";

    fn outcome(c: FeedCheck) -> String {
        match c {
            FeedCheck::Unchanged => "unchanged".into(),
            FeedCheck::Reloaded(f) => format!("reloaded {} carbon, {} egress", f.carbon.len(), f.egress.len()),
            FeedCheck::Failed(e) => format!("failed {}", e.rsplit('/').next().unwrap_or("")),
        }
    }

    #[test]
    fn watcher_table() {
        let tmp = tempfile::tempdir().unwrap();
        let (c, e) = (tmp.path().join("c"), tmp.path().join("e"));
        std::fs::create_dir_all(&c).unwrap();
        std::fs::create_dir_all(&e).unwrap();
        std::fs::write(c.join("ZA_2023_hourly.csv"), CARBON).unwrap();
        std::fs::write(c.join("README"), "not a feed").unwrap();
        std::fs::write(e.join("aws_transmission_cost_matrix.csv"), ",r1\nr1,0\n").unwrap();
        std::fs::write(e.join("notes.csv"), "not an egress matrix").unwrap();
        let dirs = FeedDirs { carbon: Some(c.clone()), egress: Some(e.clone()), spot: None };
        let (mut w, f) = FeedWatcher::start(dirs.clone()).unwrap();
        assert_eq!((f.carbon.len(), f.egress.len(), f.egress[0].provider.as_str()), (1, 1, "aws"));
        let steps: [(&dyn Fn(), &str); 6] = [
            (&|| {}, "unchanged"),
            (&|| std::fs::write(c.join("ZB_2023_hourly.csv"), CARBON.replace("ZA", "ZB")).unwrap(), "reloaded 2 carbon, 1 egress"),
            (&|| std::fs::write(c.join("ZB_2023_hourly.csv"), "bad\n").unwrap(), "failed ZB_2023_hourly.csv:1: expected header \"datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh\", got \"bad\""),
            (&|| {}, "unchanged"),
            (&|| std::fs::remove_file(c.join("ZB_2023_hourly.csv")).unwrap(), "reloaded 1 carbon, 1 egress"),
            (&|| std::fs::remove_dir_all(&e).unwrap(), "failed e: No such file or directory (os error 2)"),
        ];
        for (i, (act, want)) in steps.iter().enumerate() {
            act();
            assert_eq!(outcome(w.check()), *want, "step {i}");
        }
        assert_eq!(outcome(w.check()), "unchanged", "a missing directory is reported once");
        std::fs::create_dir_all(&e).unwrap();
        assert_eq!(outcome(w.check()), "reloaded 1 carbon, 0 egress");
        assert!(
            FeedWatcher::start(FeedDirs { carbon: Some(tmp.path().join("nope")), egress: None, spot: None }).is_err()
        );
    }
}
