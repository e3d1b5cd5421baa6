//! Converters to the generic trace format ([`crate::trace::GENERIC_COLUMNS`]):
//! from Philly's job table and from Alibaba PAI's `cluster-trace-gpu-v2020`
//! (`pai_job_table.csv` + `pai_task_table.csv`, as published in
//! `alibaba/clusterdata`, `cluster-trace-gpu-v2020/README.md`: the CSV files have
//! no header; the columns are those of the `.header` files).
//!
//! PAI mapping (docs/simulator.md, "Generic trace format"):
//! * `pai_job_table`: `job_name,inst_id,user,status,start_time,end_time`; only
//!   `status == Terminated` jobs are kept (the only successful ones). `start_time`
//!   is the submission, in seconds with a constant subtracted; read as Unix seconds
//!   in UTC+8 it has the original time of day and day of week, so it is shifted by
//!   a whole number of weeks to 2020 (`PAI_SHIFT_S`) and written in UTC.
//! * `pai_task_table`: `job_name,task_name,inst_num,status,start_time,end_time,
//!   plan_cpu,plan_mem,plan_gpu,gpu_type`; a job's GPUs are Σ `plan_gpu / 100 ×
//!   inst_num` over its tasks with `plan_gpu > 0` (`plan_gpu` is percent of one GPU
//!   per instance), fractional below one GPU, rounded up above; its run time is
//!   the latest task end − the earliest task start; `gpu_type` is the model it ran
//!   on (the duration's model) and its constraint; `MISC` (older K40m/K80/M60) is
//!   written as `K80` with no constraint; `V100M32` is `V100-32GB`.
//! * team = `user`; no datasets, checkpoints or interruptibility in the trace
//!   (the simulator's flags apply).

use std::collections::BTreeMap;
use std::io::{Read, Write};

use crate::trace::{days_from_civil, parse_timestamp, GENERIC_COLUMNS};

/// Shift of PAI times: 2,609 weeks (1970-01-01 + 2609 weeks = 2020-01-02, the
/// same weekday as the trace's day 0), so dates land in 2020.
pub const PAI_SHIFT_S: i64 = 2609 * 7 * 86_400;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{file}:{line}: {msg}")]
    Row { file: String, line: u64, msg: String },
    #[error("{file}: {source}")]
    Csv {
        file: String,
        #[source]
        source: csv::Error,
    },
    #[error("writing the converted trace")]
    Write(#[source] std::io::Error),
}

fn fmt_time(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // civil from days (inverse of days_from_civil), H. Hinnant's algorithm
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    debug_assert_eq!(days_from_civil(y, m, d), days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", secs / 3600, secs % 3600 / 60, secs % 60)
}

fn header(w: &mut csv::Writer<impl Write>) -> Result<(), ConvertError> {
    w.write_record(GENERIC_COLUMNS).map_err(|e| ConvertError::Write(e.into()))
}

/// Philly (`timestamp,duration,num_gpus,gpu_time,cluster`) → generic. Strict like
/// the simulator's Philly reader (a bad row is an error).
pub fn philly_to_generic(input: impl Read, name: &str, out: impl Write) -> Result<usize, ConvertError> {
    let t = crate::trace::read_philly(input, name, &crate::trace::ReadOptions::default())
        .map_err(|e| ConvertError::Row { file: name.into(), line: 0, msg: e.to_string() })?;
    let mut w = csv::Writer::from_writer(out);
    header(&mut w)?;
    for j in &t.jobs {
        let ts = fmt_time(t.epoch_unix + j.submit_s as i64);
        let rec = [
            ts,
            format!("{}", j.duration_s),
            j.gpus.to_string(),
            String::new(),
            String::new(),
            String::new(),
            j.home_label.clone(),
            String::new(),
            String::new(),
            String::new(),
        ];
        w.write_record(&rec).map_err(|e| ConvertError::Write(e.into()))?;
    }
    w.flush().map_err(ConvertError::Write)?;
    Ok(t.jobs.len())
}

fn pai_model(t: &str) -> (String, bool) {
    match t.trim() {
        "MISC" | "" => ("K80".into(), false),
        "V100M32" => ("V100-32GB".into(), true),
        other => (other.to_ascii_uppercase(), true),
    }
}

#[derive(Default)]
struct PaiTask {
    gpus: f64,
    start: f64,
    end: f64,
    models: Vec<(String, bool)>,
}

/// PAI job table + task table → generic. Rows that cannot be read are errors
/// with `file:line`; jobs that are not `Terminated` or use no GPU are left out
/// (counted in the returned `(written, left out)`).
pub fn pai_to_generic(
    jobs: impl Read,
    jobs_name: &str,
    tasks: impl Read,
    tasks_name: &str,
    out: impl Write,
) -> Result<(usize, usize), ConvertError> {
    let num = |v: &str, file: &str, line: u64, what: &str| -> Result<f64, ConvertError> {
        match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err(ConvertError::Row { file: file.into(), line, msg: format!("bad {what} `{v}`") }),
        }
    };
    let mut per_job: BTreeMap<String, PaiTask> = BTreeMap::new();
    let mut rdr = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(tasks);
    for rec in rdr.records() {
        let rec = rec.map_err(|source| ConvertError::Csv { file: tasks_name.into(), source })?;
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        if rec.len() != 10 {
            return Err(ConvertError::Row {
                file: tasks_name.into(),
                line,
                msg: format!("{} fields, pai_task_table has 10", rec.len()),
            });
        }
        let g = |i: usize| rec.get(i).unwrap_or("");
        if g(3) != "Terminated" {
            continue;
        }
        let plan_gpu = if g(8).is_empty() { 0.0 } else { num(g(8), tasks_name, line, "plan_gpu")? };
        if plan_gpu <= 0.0 {
            continue;
        }
        let inst = num(g(2), tasks_name, line, "inst_num")?;
        let (s, e) = (num(g(4), tasks_name, line, "start_time")?, num(g(5), tasks_name, line, "end_time")?);
        let t = per_job.entry(g(0).to_string()).or_insert(PaiTask { start: f64::INFINITY, ..PaiTask::default() });
        t.gpus += plan_gpu / 100.0 * inst;
        t.start = t.start.min(s);
        t.end = t.end.max(e);
        let m = pai_model(g(9));
        if !t.models.contains(&m) {
            t.models.push(m);
        }
    }
    let mut rows: Vec<(i64, [String; 10])> = Vec::new();
    let mut left_out = 0;
    let mut rdr = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(jobs);
    for rec in rdr.records() {
        let rec = rec.map_err(|source| ConvertError::Csv { file: jobs_name.into(), source })?;
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        if rec.len() != 6 {
            return Err(ConvertError::Row {
                file: jobs_name.into(),
                line,
                msg: format!("{} fields, pai_job_table has 6", rec.len()),
            });
        }
        let g = |i: usize| rec.get(i).unwrap_or("");
        let Some(t) = per_job.get(g(0)).filter(|_| g(3) == "Terminated") else {
            left_out += 1;
            continue;
        };
        let submit = num(g(4), jobs_name, line, "start_time")?;
        let run = t.end - t.start;
        if run.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            left_out += 1;
            continue;
        }
        let gpus = if t.gpus < 1.0 { t.gpus } else { t.gpus.ceil() };
        let constrained: Vec<&str> = t.models.iter().filter(|m| m.1).map(|m| m.0.as_str()).collect();
        let duration_gpu = if t.models.len() == 1 { t.models[0].0.clone() } else { String::new() };
        let unix = submit as i64 + PAI_SHIFT_S;
        let team = if g(2).is_empty() { "unknown".to_string() } else { g(2).to_string() };
        rows.push((
            unix,
            [
                fmt_time(unix),
                format!("{run}"),
                format!("{}", (gpus * 100.0).round() / 100.0),
                if constrained.len() == t.models.len() { constrained.join("|") } else { String::new() },
                duration_gpu,
                String::new(),
                team,
                String::new(),
                String::new(),
                String::new(),
            ],
        ));
    }
    rows.sort_by_key(|r| r.0);
    let mut w = csv::Writer::from_writer(out);
    header(&mut w)?;
    for (_, r) in &rows {
        w.write_record(r).map_err(|e| ConvertError::Write(e.into()))?;
    }
    w.flush().map_err(ConvertError::Write)?;
    Ok((rows.len(), left_out))
}

/// A synthetic sample in PAI's published layout (no headers) that exercises what
/// the converter maps: fractional GPUs (25/50 % instances), multi-instance gangs,
/// every `gpu_type` (T4, P100, V100, V100M32, MISC), non-Terminated jobs and CPU-only
/// tasks. Deterministic for a seed. Not real data: it tests the path, not the fleet.
pub fn pai_sample(n_jobs: usize, seed: u64) -> (String, String) {
    let mut rng = fleet_engine::synth::Rng::new(seed);
    let types = ["T4", "T4", "P100", "V100", "V100", "V100M32", "MISC", "MISC"];
    let users = ["a1b2c3", "d4e5f6", "0718aa", "bb9c21", "5e5e5e"];
    let (mut jobs, mut tasks) = (String::new(), String::new());
    let mut t = 1_000_000.0;
    for i in 0..n_jobs {
        t += (rng.unit() * 900.0).floor();
        let name = format!("job{i:06}");
        let status = if rng.below(10) == 0 { "Failed" } else { "Terminated" };
        let run = 60.0 + (rng.unit().powi(3) * 86_400.0).floor();
        let wait = (rng.unit() * 600.0).floor();
        let user = users[rng.below(users.len() as u64) as usize];
        jobs.push_str(&format!("{name},inst{i},{user},{status},{t:.1},{:.1}\n", t + wait + run));
        let ty = types[rng.below(types.len() as u64) as usize];
        let (plan_gpu, inst) = match rng.below(4) {
            0 => (25.0, 1.0),
            1 => (50.0, 1.0),
            2 => (100.0, 1.0 + rng.below(8) as f64),
            _ => (100.0, 8.0),
        };
        tasks.push_str(&format!(
            "{name},worker,{inst:.1},{status},{:.1},{:.1},600.0,29.3,{plan_gpu:.1},{ty}\n",
            t + wait,
            t + wait + run
        ));
        if rng.below(3) == 0 {
            tasks.push_str(&format!("{name},ps,1.0,{status},{:.1},{:.1},400.0,10.0,,MISC\n", t + wait, t + wait + run));
        }
    }
    (jobs, tasks)
}

/// `parse_timestamp` ∘ `fmt_time` is the identity (used by tests).
pub fn roundtrip(unix: i64) -> Option<i64> {
    parse_timestamp(&fmt_time(unix))
}
