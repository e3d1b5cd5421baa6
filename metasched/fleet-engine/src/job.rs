//! The job model: what the engine needs to know about one job, filled from
//! what the plugin sees (GPU request, time limit, `--fleet-*` options) and
//! from `#FLEET key=value` directives in the batch script.

use fleet_api::{FleetMode, JobRequest};
use serde::{Deserialize, Serialize};

use crate::model::normalize_gpu_type;

/// How the job's GPUs talk to each other; decides the topology it needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Parallelism {
    /// Data-parallel (or independent GPUs): one cluster, any nodes of the
    /// pool, Ethernet is enough; never split across clusters.
    #[default]
    Data,
    /// Tensor parallel: every GPU inside one NVLink domain.
    Tp,
    /// Fully-sharded data parallel: one NVLink domain if it fits, else one
    /// InfiniBand island.
    Fsdp,
}

impl Parallelism {
    pub fn as_str(self) -> &'static str {
        match self {
            Parallelism::Data => "dp",
            Parallelism::Tp => "tp",
            Parallelism::Fsdp => "fsdp",
        }
    }
}

/// Everything the engine knows about a job. All durations in seconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Fleet job id (or any label); shown in explanations.
    pub id: String,
    /// Acceptable GPU types (normalized upper case); empty = any.
    pub gpu_types: Vec<String>,
    pub gpus: u32,
    /// Nodes the user asked for (`-N`); `None` = the scheduler chooses.
    pub nodes: Option<u32>,
    /// All GPUs must start together (every Slurm job is a gang).
    pub gang: bool,
    pub parallelism: Parallelism,
    /// Expected run time: the user's estimate, else the time limit.
    pub duration_s: f64,
    /// Slurm time limit, if known.
    pub time_limit_s: Option<f64>,
    /// May run on spot capacity and be migrated.
    pub interruptible: bool,
    pub ckpt_interval_s: Option<f64>,
    /// Checkpoint location URI (matched against the dataset catalog).
    pub ckpt_location: Option<String>,
    /// Checkpoint size (GB); `None` = the model default.
    pub ckpt_size_gb: Option<f64>,
    /// Dataset URIs read by the job.
    pub datasets: Vec<String>,
    /// USD per GPU-hour.
    pub max_price: Option<f64>,
    /// Region patterns: `provider:region`, `region`, `provider:*`, `eu-*`.
    pub region_allow: Vec<String>,
    pub region_deny: Vec<String>,
    /// `--fleet-to`: the only clusters the job may run on (empty = any).
    pub to: Vec<String>,
    /// Origin cluster.
    pub home: String,
    pub mode: FleetMode,
    pub priority: i32,
    pub account: Option<String>,
    /// Slowest acceptable GPU type (`#FLEET min-gpu=A100`): pools whose GPUs
    /// are slower than this one's are excluded.
    #[serde(default)]
    pub min_gpu: Option<String>,
    /// GPU type the duration estimate was measured on (default: the only
    /// type the job accepts, else the fleet's reference GPU).
    #[serde(default)]
    pub duration_gpu: Option<String>,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            id: String::new(),
            gpu_types: Vec::new(),
            gpus: 1,
            nodes: None,
            gang: true,
            parallelism: Parallelism::Data,
            duration_s: DEFAULT_DURATION_S,
            time_limit_s: None,
            interruptible: false,
            ckpt_interval_s: None,
            ckpt_location: None,
            ckpt_size_gb: None,
            datasets: Vec::new(),
            max_price: None,
            region_allow: Vec::new(),
            region_deny: Vec::new(),
            to: Vec::new(),
            home: String::new(),
            mode: FleetMode::Auto,
            priority: 0,
            account: None,
            min_gpu: None,
            duration_gpu: None,
        }
    }
}

/// Duration assumed when a job has neither a time limit nor an estimate.
pub const DEFAULT_DURATION_S: f64 = 3600.0;

/// `#FLEET` directives found in a script. Fields left `None`/empty were not given.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Directives {
    pub parallelism: Option<Parallelism>,
    pub estimate_s: Option<f64>,
    pub ckpt_interval_s: Option<f64>,
    pub ckpt: Option<String>,
    pub ckpt_size_gb: Option<f64>,
    pub datasets: Vec<String>,
    pub gpu_types: Vec<String>,
    pub region_allow: Vec<String>,
    pub region_deny: Vec<String>,
    pub max_price: Option<f64>,
    pub interruptible: Option<bool>,
    pub to: Vec<String>,
    pub priority: Option<i32>,
    pub gang: Option<bool>,
    pub mode: Option<FleetMode>,
    #[serde(default)]
    pub min_gpu: Option<String>,
    /// `#FLEET ckpt-signal=USR1`: the signal that asks the job for a
    /// checkpoint now (a planned migration sends it), upper case without
    /// `SIG`; the meta-scheduler checks the name.
    #[serde(default)]
    pub ckpt_signal: Option<String>,
}

/// One directive that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct DirectiveError {
    pub line: usize,
    pub msg: String,
}

/// Parses a duration: `90s`, `30m`, `2h`, `1d`, `1h30m`, `HH:MM:SS`,
/// `MM:SS`, `D-HH:MM:SS`; a bare number is minutes (as Slurm's `--time`).
pub fn parse_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if s.contains(':') || s.contains('-') {
        let (days, rest) = match s.split_once('-') {
            Some((d, r)) => (d.parse::<u32>().ok()?, r),
            None => (0, s),
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let nums: Option<Vec<f64>> = parts.iter().map(|p| p.parse::<u32>().ok().map(f64::from)).collect();
        let nums = nums?;
        let secs = match nums.as_slice() {
            [h] if days > 0 => h * 3600.0,
            [m, s] if days == 0 => m * 60.0 + s,
            [h, m] => h * 3600.0 + m * 60.0,
            [h, m, s] => h * 3600.0 + m * 60.0 + s,
            _ => return None,
        };
        return Some(f64::from(days) * 86400.0 + secs);
    }
    if let Ok(m) = s.parse::<f64>() {
        return (m.is_finite() && m >= 0.0).then_some(m * 60.0);
    }
    let mut total = 0.0;
    let mut num = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() || ch == '.' {
            num.push(ch);
            continue;
        }
        let unit = match ch {
            's' | 'S' => 1.0,
            'm' | 'M' => 60.0,
            'h' | 'H' => 3600.0,
            'd' | 'D' => 86400.0,
            _ => return None,
        };
        let v: f64 = num.parse().ok()?;
        total += v * unit;
        num.clear();
    }
    if !num.is_empty() {
        return None;
    }
    (total.is_finite()).then_some(total)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "" | "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn split_list(v: &str) -> impl Iterator<Item = String> + '_ {
    v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

impl Directives {
    /// Reads every line that starts with `#FLEET` (after leading blanks).
    /// Each such line holds one or more `key=value` words (or bare flags).
    /// Unknown keys and bad values are reported, with their line number,
    /// and skipped; the rest is kept.
    pub fn parse(script: &str) -> (Directives, Vec<DirectiveError>) {
        let mut d = Directives::default();
        let mut errs = Vec::new();
        for (i, line) in script.lines().enumerate() {
            let lineno = i + 1;
            let t = line.trim_start();
            let Some(rest) = t.strip_prefix("#FLEET") else {
                continue;
            };
            if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
                continue;
            }
            for word in rest.split_whitespace() {
                let (k, v) = word.split_once('=').unwrap_or((word, ""));
                if let Err(msg) = d.set(&k.to_ascii_lowercase(), v) {
                    errs.push(DirectiveError { line: lineno, msg });
                }
            }
        }
        (d, errs)
    }

    /// Same as [`Directives::parse`] on raw script bytes (read lossily).
    pub fn parse_bytes(script: &[u8]) -> (Directives, Vec<DirectiveError>) {
        Directives::parse(&String::from_utf8_lossy(script))
    }

    fn set(&mut self, k: &str, v: &str) -> Result<(), String> {
        let need = |v: &str| {
            if v.is_empty() {
                Err(format!("{k} needs a value"))
            } else {
                Ok(())
            }
        };
        let dur = |v: &str| parse_duration(v).ok_or_else(|| format!("{k}: bad duration {v:?}"));
        let num = |v: &str| match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err(format!("{k}: bad number {v:?}")),
        };
        match k {
            "parallelism" => {
                self.parallelism = Some(match v.to_ascii_lowercase().as_str() {
                    "tp" | "tensor" => Parallelism::Tp,
                    "fsdp" | "zero" => Parallelism::Fsdp,
                    "dp" | "ddp" | "data" | "none" => Parallelism::Data,
                    _ => return Err(format!("parallelism: expected tp, fsdp or dp, got {v:?}")),
                })
            }
            "estimate" | "duration" => self.estimate_s = Some(dur(v)?),
            "ckpt-interval" => self.ckpt_interval_s = Some(dur(v)?),
            "ckpt" | "ckpt-location" => {
                need(v)?;
                self.ckpt = Some(v.to_string())
            }
            "ckpt-size" | "ckpt-size-gb" => self.ckpt_size_gb = Some(num(v)?),
            "ckpt-signal" => {
                need(v)?;
                let name = v.to_ascii_uppercase();
                let name = name.strip_prefix("SIG").unwrap_or(&name);
                if name.len() > 8 || !name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()) {
                    return Err(format!("ckpt-signal: bad signal name {v:?}"));
                }
                self.ckpt_signal = Some(name.to_string())
            }
            "dataset" | "data" => {
                need(v)?;
                self.datasets.extend(split_list(v))
            }
            "gpu-types" | "gpu-type" => {
                need(v)?;
                self.gpu_types.extend(split_list(v).map(|t| normalize_gpu_type(&t)))
            }
            "region-allow" | "regions" => {
                need(v)?;
                self.region_allow.extend(split_list(v))
            }
            "region-deny" => {
                need(v)?;
                self.region_deny.extend(split_list(v))
            }
            "max-price" => self.max_price = Some(num(v)?),
            "interruptible" => {
                self.interruptible = Some(parse_bool(v).ok_or_else(|| format!("interruptible: bad bool {v:?}"))?)
            }
            "min-gpu" => {
                need(v)?;
                self.min_gpu = Some(normalize_gpu_type(v))
            }
            "gang" => self.gang = Some(parse_bool(v).ok_or_else(|| format!("gang: bad bool {v:?}"))?),
            "to" => {
                need(v)?;
                self.to.extend(split_list(v))
            }
            "priority" => self.priority = Some(v.parse().map_err(|_| format!("priority: bad integer {v:?}"))?),
            "mode" => {
                self.mode = Some(match v.to_ascii_lowercase().as_str() {
                    "auto" => FleetMode::Auto,
                    "local" => FleetMode::Local,
                    "remote" => FleetMode::Remote,
                    _ => return Err(format!("mode: expected auto, local or remote, got {v:?}")),
                })
            }
            _ => return Err(format!("unknown #FLEET key {k:?}")),
        }
        Ok(())
    }
}

impl JobSpec {
    /// Fills a spec from what the plugin saw. Command-line `--fleet-*`
    /// options win over `#FLEET` directives (as sbatch options win over
    /// `#SBATCH` lines); list options given in both places are merged.
    pub fn from_request(req: &JobRequest, d: &Directives) -> JobSpec {
        let mut gpu_types: Vec<String> = if !d.gpu_types.is_empty() {
            d.gpu_types.clone()
        } else {
            req.gpus.iter().filter_map(|g| g.gpu_type.as_deref()).map(normalize_gpu_type).collect()
        };
        gpu_types.dedup();
        let time_limit_s = req.time_limit_min.map(|m| f64::from(m) * 60.0);
        let duration_s = d.estimate_s.or(time_limit_s).unwrap_or(DEFAULT_DURATION_S);
        // An estimate longer than the limit cannot happen: Slurm kills the job.
        let duration_s = match time_limit_s {
            Some(t) if t > 0.0 => duration_s.min(t),
            _ => duration_s,
        };
        let mut datasets = req.fleet.data.clone();
        for x in &d.datasets {
            if !datasets.contains(x) {
                datasets.push(x.clone());
            }
        }
        let to = if req.fleet.to.is_empty() { d.to.clone() } else { req.fleet.to.clone() };
        let mode = if req.fleet.mode != FleetMode::Auto { req.fleet.mode } else { d.mode.unwrap_or_default() };
        JobSpec {
            id: req.name.clone().unwrap_or_default(),
            gpu_types,
            gpus: req.total_gpus(),
            nodes: req.min_nodes,
            gang: d.gang.unwrap_or(true),
            parallelism: d.parallelism.unwrap_or_default(),
            duration_s,
            time_limit_s,
            interruptible: req.fleet.interruptible || d.interruptible.unwrap_or(false),
            ckpt_interval_s: d.ckpt_interval_s,
            ckpt_location: req.fleet.ckpt.clone().or_else(|| d.ckpt.clone()),
            ckpt_size_gb: d.ckpt_size_gb,
            datasets,
            max_price: req.fleet.max_price.or(d.max_price),
            region_allow: d.region_allow.clone(),
            region_deny: d.region_deny.clone(),
            to,
            home: req.origin.clone(),
            mode,
            priority: d.priority.unwrap_or(0),
            account: req.account.clone(),
            min_gpu: d.min_gpu.clone(),
            duration_gpu: None,
        }
    }

    /// [`JobSpec::from_request`] with the directives read from the request's
    /// own script; returns the directive errors too.
    pub fn from_request_script(req: &JobRequest) -> (JobSpec, Vec<DirectiveError>) {
        let (d, errs) = match &req.script {
            Some(s) => Directives::parse_bytes(s),
            None => (Directives::default(), Vec::new()),
        };
        (JobSpec::from_request(req, &d), errs)
    }
}
