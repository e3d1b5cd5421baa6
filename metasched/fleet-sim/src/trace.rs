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
    /// GPUs requested (gang: all must be free at once).
    pub gpus: u32,
    /// The trace's home label (Philly: the hashed virtual-cluster id).
    pub home_label: String,
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
    Row {
        path: String,
        line: u64,
        msg: String,
    },
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
        ReadOptions {
            skip_invalid: false,
            max_duration_s: 365.0 * 86_400.0,
        }
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
    if t.next().is_some()
        || !(0..24).contains(&hh)
        || !(0..60).contains(&mm)
        || !(0.0..61.0).contains(&ss)
    {
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
    let f = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
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
            return Err(TraceError::Row {
                path: self.name.into(),
                line,
                msg,
            });
        }
        self.skipped += 1;
        self.diagnostics
            .push(format!("{}:{line}: {msg}", self.name));
        Ok(())
    }
}

/// A strictly positive, finite run time no longer than the limit.
fn duration(v: &str, what: &str, max_s: f64) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(d) if d.is_finite() && d > 0.0 && d <= max_s => Ok(d),
        Ok(d) if d.is_finite() && d > max_s => Err(format!(
            "{what} {v} s is longer than the longest accepted ({max_s} s; --max-duration-days)"
        )),
        Ok(_) => Err(format!("{what} must be > 0 s, got `{v}`")),
        Err(_) => Err(format!("{what} is not a number: `{v}`")),
    }
}

/// Read a Philly-format trace (`timestamp,duration,num_gpus,gpu_time,cluster`; extra
/// columns are ignored, `gpu_time` is optional). Rows are stably sorted by
/// submission. Every row must have every column of the header; GPUs are whole
/// (Philly has no fractional GPUs).
pub fn read_philly<R: Read>(r: R, name: &str, opts: &ReadOptions) -> Result<Trace, TraceError> {
    let mut rdr = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(r);
    let headers = rdr
        .headers()
        .map_err(|source| TraceError::Csv {
            path: name.into(),
            source,
        })?
        .clone();
    let col = |c: &'static str| {
        headers
            .iter()
            .position(|h| h == c)
            .ok_or(TraceError::MissingColumn {
                path: name.into(),
                column: c,
            })
    };
    let (c_ts, c_dur, c_gpus, c_cl) = (
        col("timestamp")?,
        col("duration")?,
        col("num_gpus")?,
        col("cluster")?,
    );
    let mut raw: Vec<(i64, f64, u32, String)> = Vec::new();
    let mut rows = Rows {
        name,
        opts,
        diagnostics: Vec::new(),
        skipped: 0,
    };
    let mut rec = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut rec) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                let line = e.position().map(|p| p.line()).unwrap_or(0);
                rows.bad(line, e.to_string())?;
                continue;
            }
        }
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        if rec.len() != headers.len() {
            rows.bad(
                line,
                format!("{} fields, the header has {}", rec.len(), headers.len()),
            )?;
            continue;
        }
        let get = |c: usize| rec.get(c).unwrap_or("");
        let Some(ts) = parse_timestamp(get(c_ts)) else {
            rows.bad(
                line,
                format!(
                    "bad timestamp `{}` (YYYY-MM-DD HH:MM:SS, a real date)",
                    get(c_ts)
                ),
            )?;
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
                rows.bad(
                    line,
                    format!(
                        "num_gpus `{}` is fractional; Philly jobs hold whole GPUs",
                        get(c_gpus)
                    ),
                )?;
                continue;
            }
            _ => {
                rows.bad(
                    line,
                    format!("bad num_gpus `{}` (a whole number 1..1000000)", get(c_gpus)),
                )?;
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
        })
        .collect();
    Ok(Trace {
        jobs,
        epoch_unix,
        diagnostics: rows.diagnostics,
        skipped: rows.skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "timestamp,duration,num_gpus,gpu_time,cluster\n";

    fn check(input: &str, expected: &[(f64, f64, u32, &str)]) {
        let t = read_philly(input.as_bytes(), "t.csv", &ReadOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<_> = t
            .jobs
            .iter()
            .map(|j| (j.submit_s, j.duration_s, j.gpus, j.home_label.as_str()))
            .collect();
        assert_eq!(got, expected);
        assert!(t.diagnostics.is_empty());
    }

    /// A bad row is an error with file:line; with skip_invalid it is skipped and reported.
    fn check_bad(row: &str, frag: &str) {
        let input = format!("{H}2017-09-04 10:30:41,100,1,100,a\n{row}\n");
        match read_philly(input.as_bytes(), "t.csv", &ReadOptions::default()) {
            Err(e) => assert!(
                e.to_string().contains(&format!("t.csv:3: {frag}")),
                "{row}: {e}"
            ),
            Ok(t) => panic!("{row}: accepted as {:?}", t.jobs),
        }
        let opts = ReadOptions {
            skip_invalid: true,
            ..ReadOptions::default()
        };
        let t = read_philly(input.as_bytes(), "t.csv", &opts).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((t.jobs.len(), t.skipped), (1, 1), "{row}");
        assert!(
            t.diagnostics[0].starts_with("t.csv:3: "),
            "{:?}",
            t.diagnostics
        );
    }

    #[test]
    fn philly_rows() {
        check(
            &format!("{H}2017-09-04 10:30:41,100.0,8,800.0,aa\n"),
            &[(0.0, 100.0, 8, "aa")],
        );
        // sorted by time, ties stable
        check(
            &format!("{H}2017-09-04 10:31:41,1,1,1,b\n2017-09-04 10:30:41,2,2,4,a\n2017-09-04 10:31:41,3,1,3,c\n"),
            &[(0.0, 2.0, 2, "a"), (60.0, 1.0, 1, "b"), (60.0, 3.0, 1, "c")],
        );
    }

    #[test]
    fn bad_rows_are_errors_with_file_and_line() {
        check_bad("nope,1,1,1,a", "bad timestamp `nope`");
        check_bad(
            "2017-02-30 10:00:00,1,1,1,a",
            "bad timestamp `2017-02-30 10:00:00`",
        );
        check_bad(
            "2017-09-04 10:30:41,-1,1,1,a",
            "duration must be > 0 s, got `-1`",
        );
        check_bad("2017-09-04 10:30:41,0,1,1,a", "duration must be > 0 s");
        check_bad(
            "2017-09-04 10:30:41,1e12,1,1,a",
            "duration 1e12 s is longer than the longest accepted",
        );
        check_bad("2017-09-04 10:30:41,NaN,1,1,a", "duration must be > 0 s");
        check_bad("2017-09-04 10:30:41,1,0,1,a", "bad num_gpus `0`");
        check_bad(
            "2017-09-04 10:30:41,1,1.4,1,a",
            "num_gpus `1.4` is fractional",
        );
        check_bad("2017-09-04 10:30:41,1,1,1", "4 fields, the header has 5");
        check_bad(
            "2017-09-04 10:30:41,1,1,1,a,extra",
            "6 fields, the header has 5",
        );
        check_bad("2017-09-04 10:30:41,1,1,1,", "empty cluster");
    }

    #[test]
    fn empty_trace_and_missing_column_are_errors() {
        assert!(read_philly(
            "timestamp,duration\n".as_bytes(),
            "x",
            &ReadOptions::default()
        )
        .is_err());
        let e = read_philly(H.as_bytes(), "x", &ReadOptions::default())
            .err()
            .map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("x: no jobs in the trace"));
        let opts = ReadOptions {
            skip_invalid: true,
            ..ReadOptions::default()
        };
        let all_bad = format!("{H}nope,1,1,1,a\n");
        assert!(
            read_philly(all_bad.as_bytes(), "x", &opts).is_err(),
            "nothing left is still empty"
        );
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
