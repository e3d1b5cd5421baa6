//! Converters to the generic trace format ([`crate::trace::GENERIC_COLUMNS`]):
//! from Philly's job table, from Alibaba PAI's `cluster-trace-gpu-v2020`
//! (`pai_job_table.csv` + `pai_task_table.csv`, as published in
//! `alibaba/clusterdata`, `cluster-trace-gpu-v2020/README.md`: the CSV files have
//! no header; the columns are those of the `.header` files), from Alibaba's
//! `cluster-trace-gpu-v2023` pod lists ([`openb_to_generic`]) and from a
//! site's own Slurm accounting ([`sacct_to_generic`]).
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

use crate::trace::{column_indexes, days_from_civil, is_model_name, parse_timestamp, GENERIC_COLUMNS};

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
    #[error("{file}: {msg}")]
    File { file: String, msg: String },
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

fn header_row(w: &mut csv::Writer<impl Write>) -> Result<(), ConvertError> {
    w.write_record(GENERIC_COLUMNS).map_err(|e| ConvertError::Write(e.into()))
}

/// A row of the generic format, in [`GENERIC_COLUMNS`] order.
type GenericRecord = [String; 10];

/// Write `rows` (Unix submission time, record) as a generic trace, stably
/// sorted by submission; returns how many.
fn write_generic(mut rows: Vec<(i64, GenericRecord)>, out: impl Write) -> Result<usize, ConvertError> {
    rows.sort_by_key(|r| r.0);
    let mut w = csv::Writer::from_writer(out);
    header_row(&mut w)?;
    for (_, r) in &rows {
        w.write_record(r).map_err(|e| ConvertError::Write(e.into()))?;
    }
    w.flush().map_err(ConvertError::Write)?;
    Ok(rows.len())
}

/// Philly (`timestamp,duration,num_gpus,gpu_time,cluster`) → generic. Strict like
/// the simulator's Philly reader (a bad row is an error).
pub fn philly_to_generic(input: impl Read, name: &str, out: impl Write) -> Result<usize, ConvertError> {
    let t = crate::trace::read_philly(input, name, &crate::trace::ReadOptions::default())
        .map_err(|e| ConvertError::Row { file: name.into(), line: 0, msg: e.to_string() })?;
    let mut w = csv::Writer::from_writer(out);
    header_row(&mut w)?;
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
    let mut rows: Vec<(i64, GenericRecord)> = Vec::new();
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
    Ok((write_generic(rows, out)?, left_out))
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

/// Columns of Alibaba's `cluster-trace-gpu-v2023` pod lists
/// (`csv/openb_pod_list_*.csv`, alibaba/clusterdata
/// `cluster-trace-gpu-v2023/README.md`), which have a header line.
pub const OPENB_COLUMNS: [&str; 11] = [
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
];

/// The openb trace's times are seconds from its start, with no date: they
/// are placed from 2023-01-02 00:00:00 UTC (a Monday; the carbon series of
/// `shared/data` are of 2023).
pub fn openb_epoch_unix() -> i64 {
    days_from_civil(2023, 1, 2) * 86_400
}

/// A `gpu_spec` entry as the fleet's model name: `V100M16` is the 16 GB
/// V100 (`V100`), `V100M32` the 32 GB one (`V100-32GB`, as for PAI); the
/// others (`T4`, `P100`, `A10`, and the undisclosed `G1`, `G2`, `G3`) as
/// written, upper case.
fn openb_model(m: &str) -> String {
    match m {
        "V100M16" => "V100".into(),
        "V100M32" => "V100-32GB".into(),
        other => other.to_ascii_uppercase(),
    }
}

/// Alibaba openb pod list (`cluster-trace-gpu-v2023`) → generic. One row per
/// pod that asked for GPUs and was scheduled: submitted at `creation_time`,
/// run from `scheduled_time` to `deletion_time` (the trace gives no run
/// model: the duration is read at the fleet's reference GPU, or on the one
/// model `gpu_spec` allows), `num_gpu` GPUs, or `gpu_milli / 1000` of one
/// GPU for a sharing pod (`num_gpu == 1`, `gpu_milli < 1000`), limited to
/// the models of `gpu_spec` (empty or `nan`: any), interruptible where its
/// `qos` is `BE` (best effort), one team `openb`. Pods without GPUs, never
/// scheduled, or deleted when scheduled are left out and counted (returned
/// as reason → pods); a row that cannot be read is an error with `file:line`.
pub fn openb_to_generic(
    input: impl Read,
    name: &str,
    out: impl Write,
) -> Result<(usize, BTreeMap<&'static str, usize>), ConvertError> {
    let mut rdr = csv::ReaderBuilder::new().flexible(true).trim(csv::Trim::All).from_reader(input);
    let headers = rdr.headers().map_err(|source| ConvertError::Csv { file: name.into(), source })?.clone();
    let idx = column_indexes(&headers, &OPENB_COLUMNS).map_err(|c| ConvertError::File {
        file: name.into(),
        msg: format!("no `{c}` column in the header (openb_pod_list: {})", OPENB_COLUMNS.join(",")),
    })?;
    let epoch = openb_epoch_unix();
    let mut left: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut rows: Vec<(i64, GenericRecord)> = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|source| ConvertError::Csv { file: name.into(), source })?;
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        let err = |msg: String| ConvertError::Row { file: name.into(), line, msg };
        if rec.len() != headers.len() {
            return Err(err(format!("{} fields, the header has {}", rec.len(), headers.len())));
        }
        let get = |k: usize| rec.get(idx[k]).unwrap_or("");
        let whole = |k: usize| -> Result<Option<i64>, ConvertError> {
            match get(k) {
                "" => Ok(None),
                v => match v.parse::<i64>() {
                    // Up to 1000 years of seconds.
                    Ok(x) if (0..=31_536_000_000).contains(&x) => Ok(Some(x)),
                    _ => Err(err(format!("bad {} `{v}` (whole seconds >= 0)", OPENB_COLUMNS[k]))),
                },
            }
        };
        let (num_gpu, gpu_milli) = (whole(3)?.unwrap_or(0), whole(4)?.unwrap_or(0));
        let (created, deleted, scheduled) = (whole(8)?, whole(9)?, whole(10)?);
        let Some(created) = created else {
            return Err(err("empty creation_time".into()));
        };
        if num_gpu == 0 {
            *left.entry("no GPU").or_default() += 1;
            continue;
        }
        if num_gpu > 1_000_000 || gpu_milli > 1000 {
            return Err(err(format!("num_gpu {num_gpu}, gpu_milli {gpu_milli}: at most 1000 milli of a GPU")));
        }
        let Some(scheduled) = scheduled else {
            *left.entry("never scheduled").or_default() += 1;
            continue;
        };
        let run = match deleted {
            Some(d) if d > scheduled => d - scheduled,
            Some(_) => {
                *left.entry("deleted when scheduled (0 s)").or_default() += 1;
                continue;
            }
            None => return Err(err("scheduled but no deletion_time".into())),
        };
        // A sharing pod holds a share of one GPU; gpu_milli 0 with GPUs asked
        // for is a whole one.
        let gpus = if num_gpu == 1 && (1..1000).contains(&gpu_milli) {
            format!("{}", gpu_milli as f64 / 1000.0)
        } else {
            num_gpu.to_string()
        };
        let spec = get(5);
        let mut models: Vec<String> = Vec::new();
        if !spec.is_empty() && !spec.eq_ignore_ascii_case("nan") {
            for m in spec.split('|').map(str::trim).filter(|m| !m.is_empty()) {
                let m = openb_model(m);
                if !is_model_name(&m) {
                    return Err(err(format!("gpu_spec `{spec}`: `{m}` is not a GPU model name")));
                }
                if !models.contains(&m) {
                    models.push(m);
                }
            }
        }
        let duration_gpu = if models.len() == 1 { models[0].clone() } else { String::new() };
        let interruptible = if get(6).eq_ignore_ascii_case("BE") { "1" } else { "0" };
        let unix = epoch + created;
        rows.push((
            unix,
            [
                fmt_time(unix),
                run.to_string(),
                gpus,
                models.join("|"),
                duration_gpu,
                String::new(),
                "openb".into(),
                interruptible.into(),
                String::new(),
                String::new(),
            ],
        ));
    }
    if rows.is_empty() {
        return Err(ConvertError::File { file: name.into(), msg: format!("no GPU pod that ran; left out: {left:?}") });
    }
    Ok((write_generic(rows, out)?, left))
}

/// A synthetic pod list in openb's published layout (header included; not
/// real data) that exercises what the converter maps: sharing pods
/// (`gpu_milli` below 1000), gangs of 2–8 GPUs, `gpu_spec` lists with the
/// fleet's models and the undisclosed `G2`/`G3` (only beside known ones, so
/// every pod can be placed on a fleet of T4, P100, V100 and A100 GPUs), every
/// `qos` and `pod_phase`, CPU-only pods and pods never scheduled.
/// Deterministic for a seed.
pub fn openb_sample(n_pods: usize, seed: u64) -> String {
    let mut rng = fleet_engine::synth::Rng::new(seed);
    let specs =
        ["", "", "", "", "T4", "P100", "V100M16|V100M32", "G2|P100|T4|V100M16|V100M32", "G3|V100M32", "V100M32"];
    let qos = ["LS", "LS", "BE", "BE", "BE", "Burstable", "Guaranteed"];
    let mut out = OPENB_COLUMNS.join(",");
    out.push('\n');
    let mut t = 0i64;
    for i in 0..n_pods {
        t += (rng.unit() * 600.0).floor() as i64;
        let q = qos[rng.below(qos.len() as u64) as usize];
        let (num_gpu, milli) = match rng.below(10) {
            0 => (0, 0),
            1..=3 => (1, [110, 220, 320, 460, 470, 650, 810][rng.below(7) as usize]),
            4..=7 => (1, 1000),
            8 => (2 << rng.below(2), 1000),
            _ => (8, 1000),
        };
        let spec = specs[rng.below(specs.len() as u64) as usize];
        let run = 60 + (rng.unit().powi(3) * 86_400.0).floor() as i64;
        let wait = if rng.below(4) == 0 { (rng.unit() * 900.0).floor() as i64 } else { 0 };
        let (phase, scheduled, deleted) = match rng.below(20) {
            0 => ("Pending", String::new(), t + 60),
            1..=4 => ("Failed", (t + wait).to_string(), t + wait + run / 20 + 1),
            5..=8 => ("Succeeded", (t + wait).to_string(), t + wait + run),
            _ => ("Running", (t + wait).to_string(), t + wait + run),
        };
        out.push_str(&format!(
            "openb-pod-{i:04},{},{},{num_gpu},{milli},{spec},{q},{phase},{t},{deleted},{scheduled}\n",
            4000 * (1 + rng.below(8)),
            8192 * (1 + rng.below(8)),
        ));
    }
    out
}

/// The columns `fleet-trace slurm` asks `sacct` for. None of them is text a
/// user sets: a job name, comment or working directory may hold `|` or a
/// newline and so forge fields or whole rows of `--parsable2` output.
/// (`AdminComment` is set only by operators and Fleet's plugin.)
pub const SACCT_FORMAT: &str =
    "Cluster,JobIDRaw,Account,User,Submit,Start,ElapsedRaw,State,AllocTRES,ReqTRES,AdminComment";

/// Which column of an accounting row names the job's team (its home comes
/// from the fleet's `[[teams]]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TeamKey {
    /// The Slurm account charged (`Account`).
    Account,
    /// The user (`User`).
    User,
    /// The cluster the job ran on (`Cluster`).
    Cluster,
    /// `cluster/account`.
    ClusterAccount,
}

/// How [`sacct_to_generic`] reads accounting rows.
#[derive(Clone, Debug)]
pub struct SacctOptions {
    pub team: TeamKey,
    /// Slurm GRES type (lower case) → the fleet's GPU model name; a type not
    /// named here is written in upper case (`h100` → `H100`).
    pub models: BTreeMap<String, String>,
    /// The model of jobs whose `AllocTRES` names no GPU type (a site that
    /// accounts only `gres/gpu`); without it their durations are read as
    /// the fleet's reference GPU's.
    pub untyped_gpu: Option<String>,
}

impl Default for SacctOptions {
    fn default() -> Self {
        SacctOptions { team: TeamKey::Account, models: BTreeMap::new(), untyped_gpu: None }
    }
}

/// What [`sacct_to_generic`] wrote and why it left the other rows out.
#[derive(Debug, Default, PartialEq)]
pub struct SacctSummary {
    pub written: usize,
    /// Reason → rows.
    pub left_out: BTreeMap<&'static str, usize>,
}

const LEFT_NOT_ENDED: &str = "not ended when sacct ran (pending, running or suspended)";
const LEFT_NEVER_STARTED: &str = "never started";
const LEFT_ZERO_RUN: &str = "ran 0 s";
const LEFT_NO_GPU: &str = "no GPU in AllocTRES";
const LEFT_SHARES: &str = "GPU shares only (gres/shard, gres/mps; not modelled)";
const LEFT_STAND_IN: &str = "Fleet stand-in (its job is counted where it ran)";

/// Job states of a job that has not ended (its run time is not known yet).
const NOT_ENDED: [&str; 10] = [
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "CONFIGURING",
    "COMPLETING",
    "SIGNALING",
    "STAGE_OUT",
];

/// A time of sacct's output: Unix seconds (`SLURM_TIME_FORMAT=%s`, as
/// `fleet-trace slurm` asks) or `YYYY-MM-DDTHH:MM:SS` read as UTC (run
/// sacct with `TZ=UTC`); `None` for `Unknown`, `None` or empty.
fn sacct_time(v: &str) -> Result<Option<i64>, String> {
    let v = v.trim();
    if v.is_empty() || v == "Unknown" || v == "None" {
        return Ok(None);
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        // Up to 9999-12-31 23:59:59, as the generic format writes years.
        return match v.parse::<i64>() {
            Ok(t) if t <= 253_402_300_799 => Ok(Some(t)),
            _ => Err(format!("bad time `{v}` (Unix seconds up to the year 9999)")),
        };
    }
    parse_timestamp(&v.replacen('T', " ", 1))
        .map(Some)
        .ok_or_else(|| format!("bad time `{v}` (Unix seconds or YYYY-MM-DDTHH:MM:SS)"))
}

/// The GPUs of a TRES list (`cpu=8,gres/gpu:h100=8,gres/gpu=8,...`).
struct TresGpus {
    total: u64,
    /// Count per GRES type (those above 0).
    typed: Vec<(String, u64)>,
    /// It holds GPU shares (MPS, shards).
    shares: bool,
}

fn tres_gpus(tres: &str) -> Result<TresGpus, String> {
    let (mut total, mut typed, mut shares) = (None, Vec::new(), false);
    for entry in tres.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((k, v)) = entry.split_once('=') else {
            return Err(format!("TRES entry `{entry}` is not name=count"));
        };
        let count = || v.parse::<u64>().map_err(|_| format!("TRES `{entry}`: the count is not a whole number"));
        if k == "gres/gpu" {
            total = Some(count()?);
        } else if let Some(t) = k.strip_prefix("gres/gpu:") {
            typed.push((t.to_string(), count()?));
        } else if ["gres/shard", "gres/mps"].iter().any(|s| k == *s || k.starts_with(&format!("{s}:"))) {
            shares |= count()? > 0;
        }
    }
    typed.retain(|t| t.1 > 0);
    let total = total.unwrap_or_else(|| typed.iter().map(|t| t.1).sum());
    Ok(TresGpus { total, typed, shares })
}

fn check_model(m: &str, slurm_type: &str) -> Result<(), String> {
    if !is_model_name(m) {
        return Err(format!(
            "GPU type `{slurm_type}` gives the model name `{m}`, which is not one (letters, digits, - and _, at most 32): map it with --gpu-model {slurm_type}=MODEL"
        ));
    }
    Ok(())
}

/// Slurm accounting (`sacct --allusers --allocations --parsable2` with a
/// header line and at least the columns `Submit,Start,ElapsedRaw,State,
/// AllocTRES` and the team's; [`SACCT_FORMAT`] has every column read) →
/// generic. One row per job allocation that ran and held GPUs: submitted at
/// `Submit`, run for `ElapsedRaw` seconds on the GPU type of `AllocTRES`
/// (`gres/gpu:<type>`; the type holding most of its GPUs if several), limited
/// to the types `ReqTRES` names (a job that asked for `gpu:h100` runs only on
/// H100s; one that asked for `gpu` on any). Fleet's stand-ins (an
/// `AdminComment` starting `fleet:<id>`) are left out: the job they stand
/// in for is the row of the cluster it ran on. Jobs that did not end, never
/// started, ran 0 s or held no GPU (a site whose `AccountingStorageTRES` has
/// no `gres/gpu` accounts none) are left out and counted; a row that cannot
/// be read is an error with `file:line`.
pub fn sacct_to_generic(
    mut input: impl Read,
    name: &str,
    opts: &SacctOptions,
    out: impl Write,
) -> Result<SacctSummary, ConvertError> {
    let mut text = String::new();
    input.read_to_string(&mut text).map_err(|e| ConvertError::Row {
        file: name.into(),
        line: 0,
        msg: format!("cannot read it as UTF-8 text: {e}"),
    })?;
    let err = |line: usize, msg: String| ConvertError::Row { file: name.into(), line: line as u64, msg };
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l)).filter(|(_, l)| !l.trim().is_empty());
    let Some((hline, header)) = lines.next() else {
        return Err(ConvertError::File {
            file: name.into(),
            msg: "empty: expected sacct --parsable2 output with its header line".into(),
        });
    };
    let header: Vec<&str> = header.trim_start_matches('\u{feff}').split('|').map(str::trim).collect();
    let col = |c: &str| header.iter().position(|h| *h == c);
    let need = |c: &str| {
        col(c).ok_or_else(|| {
            err(hline, format!("no `{c}` column in the header (sacct --parsable2 --format={SACCT_FORMAT})"))
        })
    };
    let (submit_c, start_c, elapsed_c, state_c, alloc_c) =
        (need("Submit")?, need("Start")?, need("ElapsedRaw")?, need("State")?, need("AllocTRES")?);
    let team_c: Vec<usize> = match opts.team {
        TeamKey::Account => vec![need("Account")?],
        TeamKey::User => vec![need("User")?],
        TeamKey::Cluster => vec![need("Cluster")?],
        TeamKey::ClusterAccount => vec![need("Cluster")?, need("Account")?],
    };
    let (req_c, admin_c) = (col("ReqTRES"), col("AdminComment"));
    let model_of = |t: &str| -> Result<String, String> {
        let m = match opts.models.get(&t.to_ascii_lowercase()) {
            Some(m) => m.to_ascii_uppercase(),
            None => t.to_ascii_uppercase(),
        };
        check_model(&m, t)?;
        Ok(m)
    };
    let mut summary = SacctSummary::default();
    let mut rows: Vec<(i64, GenericRecord)> = Vec::new();
    for (n, line) in lines {
        let f: Vec<&str> = line.split('|').collect();
        if f.len() != header.len() {
            return Err(err(
                n,
                format!(
                    "{} fields, the header has {} (a column a user sets, such as JobName, Comment or WorkDir, may hold `|` or a newline: leave it out of --format)",
                    f.len(),
                    header.len()
                ),
            ));
        }
        let get = |c: usize| f[c].trim();
        let stand_in = admin_c.is_some_and(|c| fleet_api::wire::parse_admin_tag(get(c)).is_some());
        let state = get(state_c).split_whitespace().next().unwrap_or("");
        let skip = if stand_in { Some(LEFT_STAND_IN) } else { NOT_ENDED.contains(&state).then_some(LEFT_NOT_ENDED) };
        if let Some(why) = skip {
            *summary.left_out.entry(why).or_default() += 1;
            continue;
        }
        let submit = sacct_time(get(submit_c)).map_err(|e| err(n, format!("Submit: {e}")))?;
        let start = sacct_time(get(start_c)).map_err(|e| err(n, format!("Start: {e}")))?;
        let (Some(submit), Some(_)) = (submit, start) else {
            *summary.left_out.entry(LEFT_NEVER_STARTED).or_default() += 1;
            continue;
        };
        let elapsed: u64 = get(elapsed_c)
            .parse()
            .map_err(|_| err(n, format!("ElapsedRaw `{}` is not a whole number of seconds", get(elapsed_c))))?;
        let TresGpus { total: gpus, typed, shares } =
            tres_gpus(get(alloc_c)).map_err(|e| err(n, format!("AllocTRES: {e}")))?;
        if gpus > 1_000_000 {
            return Err(err(n, format!("AllocTRES: {gpus} GPUs in one job")));
        }
        let why = match (elapsed, gpus, shares) {
            (0, _, _) => Some(LEFT_ZERO_RUN),
            (_, 0, true) => Some(LEFT_SHARES),
            (_, 0, false) => Some(LEFT_NO_GPU),
            _ => None,
        };
        if let Some(why) = why {
            *summary.left_out.entry(why).or_default() += 1;
            continue;
        }
        // The model it ran on: the type holding most of its GPUs (the
        // first by name on a tie).
        let mut ran = typed;
        ran.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let duration_gpu = match ran.first() {
            Some((t, _)) => model_of(t).map_err(|e| err(n, e))?,
            None => opts.untyped_gpu.clone().unwrap_or_default(),
        };
        let mut allowed = Vec::new();
        if let Some(c) = req_c {
            let asked = tres_gpus(get(c)).map_err(|e| err(n, format!("ReqTRES: {e}")))?;
            for (t, _) in asked.typed {
                let m = model_of(&t).map_err(|e| err(n, e))?;
                if !allowed.contains(&m) {
                    allowed.push(m);
                }
            }
        }
        if let Some(&c) = team_c.iter().find(|&&c| get(c).is_empty()) {
            return Err(err(n, format!("empty {} (the team, --team)", header[c])));
        }
        let team = team_c.iter().map(|&c| get(c)).collect::<Vec<_>>().join("/");
        rows.push((
            submit,
            [
                fmt_time(submit),
                elapsed.to_string(),
                gpus.to_string(),
                allowed.join("|"),
                duration_gpu,
                String::new(),
                team,
                String::new(),
                String::new(),
                String::new(),
            ],
        ));
    }
    if rows.is_empty() {
        let msg = if summary.left_out.is_empty() {
            "no job in it (sacct's -M, -S and -E choose the clusters and the period; where PrivateData=jobs, only operators see every user's jobs)".to_string()
        } else {
            let left: Vec<String> = summary.left_out.iter().map(|(w, k)| format!("{k} {w}")).collect();
            let hint = if summary.left_out.contains_key(LEFT_NO_GPU) {
                " (does slurm.conf's AccountingStorageTRES list gres/gpu and gres/gpu:<type>? Without it accounting records no GPUs)"
            } else {
                ""
            };
            format!("no job that ran with GPUs; left out: {}{hint}", left.join(", "))
        };
        return Err(ConvertError::File { file: name.into(), msg });
    }
    summary.written = write_generic(rows, out)?;
    Ok(summary)
}
