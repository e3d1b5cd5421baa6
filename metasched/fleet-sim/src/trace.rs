//! Job traces: the Philly job table (`timestamp,duration,num_gpus,gpu_time,cluster`).
//!
//! The reader never panics on bad input. A bad row is an error naming its
//! `file:line`; with [`ReadOptions::skip_invalid`] it is skipped instead and
//! reported, each one, in [`Trace::diagnostics`]. An empty trace is an error.

use std::io::Read;
use std::path::Path;

/// One job of a trace, in simulator units (seconds since the first submission).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    /// Index in the trace after sorting (stable, 0-based).
    pub id: usize,
    /// Submission time, seconds since the trace epoch (first submission = 0).
    pub submit_s: f64,
    /// Run time in seconds as recorded in the trace.
    pub duration_s: f64,
    /// GPUs requested (gang: all must be free at once); a fractional request
    /// holds one whole GPU.
    pub gpus: u32,
    /// The trace's home label (Philly: the hashed virtual-cluster id).
    pub home_label: String,
    /// Extra fields of the generic format (empty for Philly).
    pub extra: JobExtra,
}

/// What the generic trace format adds to a job (all optional).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobExtra {
    /// The exact GPU request (e.g. 0.25 of a GPU); 0 = `gpus`.
    pub gpu_share: f64,
    /// Acceptable GPU models (normalized); empty = any.
    pub gpu_models: Vec<String>,
    /// The model the duration was measured on; `None` = the fleet's reference GPU.
    pub duration_gpu: Option<String>,
    /// Slowest acceptable model.
    pub min_gpu: Option<String>,
    pub interruptible: Option<bool>,
    pub checkpoint_s: Option<f64>,
    /// (name, GB): datasets at the team's home, shared by jobs naming the same one.
    pub datasets: Vec<(String, f64)>,
}

/// A parsed trace plus the rows that could not be read.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
    /// Unix time (UTC seconds) of the first submission; used to place the trace on the
    /// carbon/price calendars.
    pub epoch_unix: i64,
    /// One line per skipped row (`file:line: why`), under `--skip-invalid`.
    pub diagnostics: Vec<String>,
    /// Rows skipped under `--skip-invalid`.
    pub skipped: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: missing column `{column}` in header")]
    MissingColumn { path: String, column: &'static str },
    #[error("{path}: {source}")]
    Csv {
        path: String,
        #[source]
        source: csv::Error,
    },
    /// A row that cannot be read (without `--skip-invalid`).
    #[error("{path}:{line}: {msg} (use --skip-invalid to skip such rows)")]
    Row { path: String, line: u64, msg: String },
    #[error("{path}: no jobs in the trace")]
    Empty { path: String },
}

/// How strict the reader is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadOptions {
    /// Skip bad rows (each reported in [`Trace::diagnostics`]) instead of failing.
    pub skip_invalid: bool,
    /// Longest run time accepted (s); longer rows are errors.
    pub max_duration_s: f64,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { skip_invalid: false, max_duration_s: 365.0 * 86_400.0 }
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Days in month `m` of year `y`.
pub fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Parse `YYYY-MM-DD HH:MM:SS` (treated as UTC) into Unix seconds. Dates
/// that do not exist (2017-02-30) are `None`.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let s = s.trim();
    let (date, time) = s.split_once(' ').or_else(|| s.split_once('T'))?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    if d.next().is_some()
        || !(1..=9999).contains(&y)
        || !(1..=12).contains(&m)
        || !(1..=days_in_month(y, m)).contains(&day)
    {
        return None;
    }
    let mut t = time.split(':');
    let hh: i64 = t.next()?.parse().ok()?;
    let mm: i64 = t.next()?.parse().ok()?;
    let ss: f64 = t.next().unwrap_or("0").parse().ok()?;
    if t.next().is_some() || !(0..24).contains(&hh) || !(0..60).contains(&mm) || !(0.0..61.0).contains(&ss) {
        return None;
    }
    Some(days_from_civil(y, m, day) * 86_400 + hh * 3600 + mm * 60 + ss as i64)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Read a Philly-format trace from a file.
pub fn read_philly_file(path: &Path, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let f = std::fs::File::open(path).map_err(|source| TraceError::Io { path: path.display().to_string(), source })?;
    read_philly(f, &path.display().to_string(), opts)
}

/// Collects rows and bad-row diagnostics; fails on the first bad row unless
/// `skip_invalid`.
struct Rows<'a> {
    name: &'a str,
    opts: &'a ReadOptions,
    diagnostics: Vec<String>,
    skipped: usize,
}

impl Rows<'_> {
    fn bad(&mut self, line: u64, msg: String) -> Result<(), TraceError> {
        if !self.opts.skip_invalid {
            return Err(TraceError::Row { path: self.name.into(), line, msg });
        }
        self.skipped += 1;
        self.diagnostics.push(format!("{}:{line}: {msg}", self.name));
        Ok(())
    }

    /// Reads the next well-formed record (as wide as the header) into
    /// `rec` and returns its line; unreadable or ragged rows go through
    /// [`Rows::bad`]. `None` at the end of the input.
    fn next<R: std::io::Read>(
        &mut self,
        rdr: &mut csv::Reader<R>,
        rec: &mut csv::StringRecord,
        width: usize,
    ) -> Result<Option<u64>, TraceError> {
        loop {
            match rdr.read_record(rec) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(e) => {
                    let line = e.position().map(|p| p.line()).unwrap_or(0);
                    self.bad(line, e.to_string())?;
                    continue;
                }
            }
            let line = rec.position().map(|p| p.line()).unwrap_or(0);
            if rec.len() != width {
                self.bad(line, format!("{} fields, the header has {}", rec.len(), width))?;
                continue;
            }
            return Ok(Some(line));
        }
    }
}

/// A strictly positive, finite run time no longer than the limit.
fn duration(v: &str, what: &str, max_s: f64) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(d) if d.is_finite() && d > 0.0 && d <= max_s => Ok(d),
        Ok(d) if d.is_finite() && d > max_s => {
            Err(format!("{what} {v} s is longer than the longest accepted ({max_s} s; --max-duration-days)"))
        }
        Ok(_) => Err(format!("{what} must be > 0 s, got `{v}`")),
        Err(_) => Err(format!("{what} is not a number: `{v}`")),
    }
}

/// Read a Philly-format trace (`timestamp,duration,num_gpus,gpu_time,cluster`; extra
/// columns are ignored, `gpu_time` is optional). Rows are stably sorted by
/// submission. Every row must have every column of the header; GPUs are whole
/// (Philly has no fractional GPUs).
pub fn read_philly<R: Read>(r: R, name: &str, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let mut rdr = csv::ReaderBuilder::new().flexible(true).trim(csv::Trim::All).from_reader(r);
    let headers = rdr.headers().map_err(|source| TraceError::Csv { path: name.into(), source })?.clone();
    let col = |c: &'static str| {
        headers.iter().position(|h| h == c).ok_or(TraceError::MissingColumn { path: name.into(), column: c })
    };
    let (c_ts, c_dur, c_gpus, c_cl) = (col("timestamp")?, col("duration")?, col("num_gpus")?, col("cluster")?);
    let mut raw: Vec<(i64, f64, u32, String)> = Vec::new();
    let mut rows = Rows { name, opts, diagnostics: Vec::new(), skipped: 0 };
    let mut rec = csv::StringRecord::new();
    while let Some(line) = rows.next(&mut rdr, &mut rec, headers.len())? {
        let get = |c: usize| rec.get(c).unwrap_or("");
        let Some(ts) = parse_timestamp(get(c_ts)) else {
            rows.bad(line, format!("bad timestamp `{}` (YYYY-MM-DD HH:MM:SS, a real date)", get(c_ts)))?;
            continue;
        };
        let dur = match duration(get(c_dur), "duration", opts.max_duration_s) {
            Ok(d) => d,
            Err(msg) => {
                rows.bad(line, msg)?;
                continue;
            }
        };
        let gpus: u32 = match get(c_gpus).parse::<f64>() {
            Ok(g) if g.fract() == 0.0 && (1.0..=1e6).contains(&g) => g as u32,
            Ok(g) if g.is_finite() && g.fract() != 0.0 => {
                rows.bad(line, format!("num_gpus `{}` is fractional; Philly jobs hold whole GPUs", get(c_gpus)))?;
                continue;
            }
            _ => {
                rows.bad(line, format!("bad num_gpus `{}` (a whole number 1..1000000)", get(c_gpus)))?;
                continue;
            }
        };
        if get(c_cl).is_empty() {
            rows.bad(line, "empty cluster (the team label)".into())?;
            continue;
        }
        raw.push((ts, dur, gpus, get(c_cl).to_string()));
    }
    if raw.is_empty() {
        return Err(TraceError::Empty { path: name.into() });
    }
    raw.sort_by_key(|r| r.0); // stable: ties keep file order
    let epoch_unix = raw.first().map(|r| r.0).unwrap_or(0);
    let jobs = raw
        .into_iter()
        .enumerate()
        .map(|(id, (ts, dur, gpus, home))| TraceJob {
            id,
            submit_s: (ts - epoch_unix) as f64,
            duration_s: dur,
            gpus,
            home_label: home,
            extra: JobExtra::default(),
        })
        .collect();
    Ok(Trace { jobs, epoch_unix, diagnostics: rows.diagnostics, skipped: rows.skipped })
}

/// Columns of the generic trace format, in order (docs/simulator.md, "Generic
/// trace format").
pub const GENERIC_COLUMNS: [&str; 10] = [
    "submit_time",
    "duration_s",
    "gpus",
    "gpu_models",
    "duration_gpu",
    "min_gpu",
    "team",
    "interruptible",
    "checkpoint_s",
    "datasets",
];

/// Read a trace file in the format its header names: the generic format
/// (`submit_time,...`) or Philly's table (`timestamp,...`).
pub fn read_file(path: &Path, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let text = std::fs::read(path).map_err(|source| TraceError::Io { path: path.display().to_string(), source })?;
    let name = path.display().to_string();
    let first = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
    if String::from_utf8_lossy(first).trim_start_matches('\u{feff}').starts_with("submit_time") {
        read_generic(&text[..], &name, opts)
    } else {
        read_philly(&text[..], &name, opts)
    }
}

/// A GPU model name as traces write it: letters, digits, `-` and `_`, 1 to
/// 32 of them (the converters check what they write against it).
pub fn is_model_name(m: &str) -> bool {
    !m.is_empty() && m.len() <= 32 && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn models(v: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for m in v.split('|').map(str::trim).filter(|m| !m.is_empty()) {
        if !is_model_name(m) {
            return Err(format!("bad GPU model `{m}`"));
        }
        out.push(m.to_ascii_uppercase());
    }
    Ok(out)
}

fn one_model(v: &str, what: &str) -> Result<Option<String>, String> {
    let m = models(v)?;
    match m.len() {
        0 => Ok(None),
        1 => Ok(m.into_iter().next()),
        _ => Err(format!("{what} names one GPU model, got `{v}`")),
    }
}

/// Where each of `columns` is in a CSV header (a byte-order mark before the
/// first name ignored); `Err` names the first one missing.
pub fn column_indexes<const N: usize>(
    headers: &csv::StringRecord,
    columns: &[&'static str; N],
) -> Result<[usize; N], &'static str> {
    let mut idx = [0usize; N];
    for (k, c) in columns.iter().enumerate() {
        idx[k] = headers.iter().position(|h| h.trim_start_matches('\u{feff}') == *c).ok_or(*c)?;
    }
    Ok(idx)
}

/// Read a trace in the generic format: every column of [`GENERIC_COLUMNS`] in the
/// header (any order, extra columns ignored). Rows are stably sorted by submission.
pub fn read_generic<R: Read>(r: R, name: &str, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let mut rdr = csv::ReaderBuilder::new().flexible(true).trim(csv::Trim::All).from_reader(r);
    let headers = rdr.headers().map_err(|source| TraceError::Csv { path: name.into(), source })?.clone();
    let idx = column_indexes(&headers, &GENERIC_COLUMNS)
        .map_err(|column| TraceError::MissingColumn { path: name.into(), column })?;
    let mut raw: Vec<(i64, f64, u32, String, JobExtra)> = Vec::new();
    let mut rows = Rows { name, opts, diagnostics: Vec::new(), skipped: 0 };
    let mut rec = csv::StringRecord::new();
    while let Some(line) = rows.next(&mut rdr, &mut rec, headers.len())? {
        let get = |k: usize| rec.get(idx[k]).unwrap_or("");
        match generic_row(&get, opts) {
            Ok(row) => raw.push(row),
            Err(msg) => rows.bad(line, msg)?,
        }
    }
    if raw.is_empty() {
        return Err(TraceError::Empty { path: name.into() });
    }
    raw.sort_by_key(|r| r.0);
    let epoch_unix = raw.first().map(|r| r.0).unwrap_or(0);
    let jobs = raw
        .into_iter()
        .enumerate()
        .map(|(id, (ts, dur, gpus, team, extra))| TraceJob {
            id,
            submit_s: (ts - epoch_unix) as f64,
            duration_s: dur,
            gpus,
            home_label: team,
            extra,
        })
        .collect();
    Ok(Trace { jobs, epoch_unix, diagnostics: rows.diagnostics, skipped: rows.skipped })
}

type GenericRow = (i64, f64, u32, String, JobExtra);

fn generic_row<'a>(get: &dyn Fn(usize) -> &'a str, opts: &ReadOptions) -> Result<GenericRow, String> {
    let ts = parse_timestamp(get(0))
        .ok_or_else(|| format!("bad submit_time `{}` (YYYY-MM-DD HH:MM:SS, a real date)", get(0)))?;
    let dur = duration(get(1), "duration_s", opts.max_duration_s)?;
    let share: f64 = match get(2).parse::<f64>() {
        Ok(g) if g.is_finite() && g > 0.0 && g <= 1e6 => g,
        _ => return Err(format!("bad gpus `{}` (a number > 0)", get(2))),
    };
    if share > 1.0 && share.fract() != 0.0 {
        return Err(format!("gpus `{}`: only requests below one GPU may be fractional", get(2)));
    }
    let gpu_models = models(get(3)).map_err(|e| format!("gpu_models: {e}"))?;
    let duration_gpu = one_model(get(4), "duration_gpu")?;
    let min_gpu = one_model(get(5), "min_gpu")?;
    let team = get(6).to_string();
    if team.is_empty() {
        return Err("empty team".into());
    }
    let interruptible = match get(7).to_ascii_lowercase().as_str() {
        "" => None,
        "1" | "true" | "yes" => Some(true),
        "0" | "false" | "no" => Some(false),
        v => return Err(format!("interruptible `{v}` (0/1, true/false or empty)")),
    };
    let checkpoint_s = match get(8) {
        "" => None,
        v => match v.parse::<f64>() {
            Ok(c) if c.is_finite() && c >= 0.0 => Some(c),
            _ => return Err(format!("bad checkpoint_s `{v}` (seconds >= 0 or empty)")),
        },
    };
    let mut datasets = Vec::new();
    for d in get(9).split('|').map(str::trim).filter(|d| !d.is_empty()) {
        let (n, gb) = d.rsplit_once(':').ok_or_else(|| format!("dataset `{d}`: expected name:GB"))?;
        match gb.parse::<f64>() {
            Ok(g) if g.is_finite() && g >= 0.0 && !n.is_empty() => datasets.push((n.to_string(), g)),
            _ => return Err(format!("dataset `{d}`: expected name:GB with GB >= 0")),
        }
    }
    let gpus = share.ceil() as u32;
    let extra = JobExtra { gpu_share: share, gpu_models, duration_gpu, min_gpu, interruptible, checkpoint_s, datasets };
    Ok((ts, dur, gpus, team, extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "timestamp,duration,num_gpus,gpu_time,cluster\n";

    fn check(input: &str, expected: &[(f64, f64, u32, &str)]) {
        let t = read_philly(input.as_bytes(), "t.csv", &ReadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<_> = t.jobs.iter().map(|j| (j.submit_s, j.duration_s, j.gpus, j.home_label.as_str())).collect();
        assert_eq!(got, expected);
        assert!(t.diagnostics.is_empty());
    }

    /// A bad row is an error with file:line; with skip_invalid it is skipped and reported.
    fn check_bad(row: &str, frag: &str) {
        let input = format!("{H}2017-09-04 10:30:41,100,1,100,a\n{row}\n");
        match read_philly(input.as_bytes(), "t.csv", &ReadOptions::default()) {
            Err(e) => assert!(e.to_string().contains(&format!("t.csv:3: {frag}")), "{row}: {e}"),
            Ok(t) => panic!("{row}: accepted as {:?}", t.jobs),
        }
        let opts = ReadOptions { skip_invalid: true, ..ReadOptions::default() };
        let t = read_philly(input.as_bytes(), "t.csv", &opts).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((t.jobs.len(), t.skipped), (1, 1), "{row}");
        assert!(t.diagnostics[0].starts_with("t.csv:3: "), "{:?}", t.diagnostics);
    }

    #[test]
    fn philly_rows() {
        check(&format!("{H}2017-09-04 10:30:41,100.0,8,800.0,aa\n"), &[(0.0, 100.0, 8, "aa")]);
        // sorted by time, ties stable
        check(
            &format!("{H}2017-09-04 10:31:41,1,1,1,b\n2017-09-04 10:30:41,2,2,4,a\n2017-09-04 10:31:41,3,1,3,c\n"),
            &[(0.0, 2.0, 2, "a"), (60.0, 1.0, 1, "b"), (60.0, 3.0, 1, "c")],
        );
    }

    #[test]
    fn bad_rows_are_errors_with_file_and_line() {
        check_bad("nope,1,1,1,a", "bad timestamp `nope`");
        check_bad("2017-02-30 10:00:00,1,1,1,a", "bad timestamp `2017-02-30 10:00:00`");
        check_bad("2017-09-04 10:30:41,-1,1,1,a", "duration must be > 0 s, got `-1`");
        check_bad("2017-09-04 10:30:41,0,1,1,a", "duration must be > 0 s");
        check_bad("2017-09-04 10:30:41,1e12,1,1,a", "duration 1e12 s is longer than the longest accepted");
        check_bad("2017-09-04 10:30:41,NaN,1,1,a", "duration must be > 0 s");
        check_bad("2017-09-04 10:30:41,1,0,1,a", "bad num_gpus `0`");
        check_bad("2017-09-04 10:30:41,1,1.4,1,a", "num_gpus `1.4` is fractional");
        check_bad("2017-09-04 10:30:41,1,1,1", "4 fields, the header has 5");
        check_bad("2017-09-04 10:30:41,1,1,1,a,extra", "6 fields, the header has 5");
        check_bad("2017-09-04 10:30:41,1,1,1,", "empty cluster");
    }

    #[test]
    fn empty_trace_and_missing_column_are_errors() {
        assert!(read_philly("timestamp,duration\n".as_bytes(), "x", &ReadOptions::default()).is_err());
        let e = read_philly(H.as_bytes(), "x", &ReadOptions::default()).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("x: no jobs in the trace"));
        let opts = ReadOptions { skip_invalid: true, ..ReadOptions::default() };
        let all_bad = format!("{H}nope,1,1,1,a\n");
        assert!(read_philly(all_bad.as_bytes(), "x", &opts).is_err(), "nothing left is still empty");
    }

    const G: &str =
        "submit_time,duration_s,gpus,gpu_models,duration_gpu,min_gpu,team,interruptible,checkpoint_s,datasets\n";

    #[test]
    fn generic_rows() {
        let t = read_generic(
            format!("{G}2020-07-01 08:00:10,600,0.25,T4|v100,T4,,u1,1,300,pai/u1:20|shared:5\n2020-07-01 08:00:00,60,8,,,A100,u2,,,\n").as_bytes(),
            "g.csv",
            &ReadOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.jobs.len(), 2);
        let (a, b) = (&t.jobs[1], &t.jobs[0]);
        assert_eq!((a.submit_s, a.duration_s, a.gpus, a.home_label.as_str()), (10.0, 600.0, 1, "u1"));
        assert_eq!(a.extra.gpu_share, 0.25);
        assert_eq!(a.extra.gpu_models, ["T4", "V100"]);
        assert_eq!(a.extra.duration_gpu.as_deref(), Some("T4"));
        assert_eq!((a.extra.interruptible, a.extra.checkpoint_s), (Some(true), Some(300.0)));
        assert_eq!(a.extra.datasets, [("pai/u1".to_string(), 20.0), ("shared".to_string(), 5.0)]);
        assert_eq!((b.gpus, b.extra.min_gpu.as_deref(), b.extra.interruptible), (8, Some("A100"), None));
        // the format is recognised from its header
        let dir = std::env::temp_dir().join(format!("fleet-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("g.csv");
        std::fs::write(&p, format!("{G}2020-07-01 08:00:00,60,1,,,,u,,,\n")).unwrap();
        assert_eq!(read_file(&p, &ReadOptions::default()).unwrap().jobs.len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn generic_bad_rows_are_errors_with_file_and_line() {
        let bad = |row: &str, frag: &str| {
            let input = format!("{G}2020-07-01 08:00:00,60,1,,,,u,,,\n{row}\n");
            match read_generic(input.as_bytes(), "g.csv", &ReadOptions::default()) {
                Err(e) => assert!(e.to_string().contains(&format!("g.csv:3: {frag}")), "{row}: {e}"),
                Ok(_) => panic!("{row} accepted"),
            }
        };
        bad("2020-02-30 08:00:00,60,1,,,,u,,,", "bad submit_time");
        bad("2020-07-01 08:00:00,0,1,,,,u,,,", "duration_s must be > 0 s");
        bad("2020-07-01 08:00:00,60,1.5,,,,u,,,", "gpus `1.5`: only requests below one GPU may be fractional");
        bad("2020-07-01 08:00:00,60,0,,,,u,,,", "bad gpus `0`");
        bad("2020-07-01 08:00:00,60,1,T4;rm,,,u,,,", "gpu_models: bad GPU model");
        bad("2020-07-01 08:00:00,60,1,,T4|V100,,u,,,", "duration_gpu names one GPU model");
        bad("2020-07-01 08:00:00,60,1,,,,,,,", "empty team");
        bad("2020-07-01 08:00:00,60,1,,,,u,maybe,,", "interruptible `maybe`");
        bad("2020-07-01 08:00:00,60,1,,,,u,,-5,", "bad checkpoint_s `-5`");
        bad("2020-07-01 08:00:00,60,1,,,,u,,,data", "dataset `data`: expected name:GB");
        bad("2020-07-01 08:00:00,60,1,,,,u,,", "9 fields, the header has 10");
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_timestamp("2017-09-04 10:30:41"), Some(1_504_521_041));
        assert_eq!(parse_timestamp("2016-02-29 00:00:00"), Some(1_456_704_000));
        assert_eq!(parse_timestamp("2017-02-29 00:00:00"), None);
        assert_eq!(parse_timestamp("2017-04-31 00:00:00"), None);
        assert_eq!(parse_timestamp("2017-13-04 10:30:41"), None);
        assert_eq!(parse_timestamp("2017-09-04 10:30:41:5"), None);
        assert_eq!(parse_timestamp(""), None);
    }
}
