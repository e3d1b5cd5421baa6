//! Job traces: the Philly job table (`timestamp,duration,num_gpus,gpu_time,cluster`).
//!
//! The reader never panics on bad input: malformed rows are skipped and reported as
//! diagnostics carrying `file:line`.

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
    pub diagnostics: Vec<String>,
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
}

/// Parse `YYYY-MM-DD HH:MM:SS` (treated as UTC) into Unix seconds.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let s = s.trim();
    let (date, time) = s.split_once(' ').or_else(|| s.split_once('T'))?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut t = time.split(':');
    let hh: i64 = t.next()?.parse().ok()?;
    let mm: i64 = t.next()?.parse().ok()?;
    let ss: f64 = t.next().unwrap_or("0").parse().ok()?;
    if !(0..24).contains(&hh) || !(0..60).contains(&mm) || !(0.0..61.0).contains(&ss) {
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
pub fn read_philly_file(path: &Path) -> Result<Trace, TraceError> {
    let f = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    read_philly(f, &path.display().to_string())
}

/// Read a Philly-format trace (`timestamp,duration,num_gpus,gpu_time,cluster`; extra
/// columns are ignored, `gpu_time` is optional). Rows are stably sorted by submission.
pub fn read_philly<R: Read>(r: R, name: &str) -> Result<Trace, TraceError> {
    let mut rdr = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(r);
    let headers = rdr
        .headers()
        .map_err(|source| TraceError::Csv { path: name.into(), source })?
        .clone();
    let col = |c: &'static str| {
        headers
            .iter()
            .position(|h| h == c)
            .ok_or(TraceError::MissingColumn { path: name.into(), column: c })
    };
    let (c_ts, c_dur, c_gpus, c_cl) =
        (col("timestamp")?, col("duration")?, col("num_gpus")?, col("cluster")?);
    let mut raw: Vec<(i64, f64, u32, String)> = Vec::new();
    let mut diagnostics = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 2;
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                diagnostics.push(format!("{name}:{line}: {e}"));
                continue;
            }
        };
        let get = |c: usize| rec.get(c).unwrap_or("");
        let Some(ts) = parse_timestamp(get(c_ts)) else {
            diagnostics.push(format!("{name}:{line}: bad timestamp `{}`", get(c_ts)));
            continue;
        };
        let dur: f64 = match get(c_dur).parse() {
            Ok(d) if f64::is_finite(d) && d >= 0.0 => d,
            _ => {
                diagnostics.push(format!("{name}:{line}: bad duration `{}`", get(c_dur)));
                continue;
            }
        };
        let gpus: u32 = match get(c_gpus).parse::<f64>() {
            Ok(g) if (1.0..=1e6).contains(&g) => g.round() as u32,
            _ => {
                diagnostics.push(format!("{name}:{line}: bad num_gpus `{}`", get(c_gpus)));
                continue;
            }
        };
        raw.push((ts, dur, gpus, get(c_cl).to_string()));
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
    Ok(Trace { jobs, epoch_unix, diagnostics })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: &[(f64, f64, u32, &str)], n_diag: usize) {
        let t = read_philly(input.as_bytes(), "t.csv").unwrap();
        let got: Vec<_> = t
            .jobs
            .iter()
            .map(|j| (j.submit_s, j.duration_s, j.gpus, j.home_label.as_str()))
            .collect();
        assert_eq!(got, expected);
        assert_eq!(t.diagnostics.len(), n_diag, "{:?}", t.diagnostics);
    }

    #[test]
    fn philly_rows() {
        let h = "timestamp,duration,num_gpus,gpu_time,cluster\n";
        check(&format!("{h}2017-09-04 10:30:41,100.0,8,800.0,aa\n"), &[(0.0, 100.0, 8, "aa")], 0);
        // sorted by time, ties stable
        check(
            &format!("{h}2017-09-04 10:31:41,1,1,1,b\n2017-09-04 10:30:41,2,2,4,a\n2017-09-04 10:31:41,3,1,3,c\n"),
            &[(0.0, 2.0, 2, "a"), (60.0, 1.0, 1, "b"), (60.0, 3.0, 1, "c")],
            0,
        );
        // bad rows are skipped with a diagnostic
        check(&format!("{h}nope,1,1,1,a\n2017-09-04 10:30:41,-1,1,1,a\n2017-09-04 10:30:41,1,0,1,a\n"), &[], 3);
    }

    #[test]
    fn missing_column_is_an_error() {
        assert!(read_philly("timestamp,duration\n".as_bytes(), "x").is_err());
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_timestamp("2017-09-04 10:30:41"), Some(1_504_521_041));
        assert_eq!(parse_timestamp("2017-13-04 10:30:41"), None);
        assert_eq!(parse_timestamp(""), None);
    }
}
