//! `fleetctl`: the administrator's client of fleet-metasched.
//!
//! Exit status: 0 on success, 1 on errors (the cause chain is printed),
//! 2 on usage errors; a closed stdout (`fleetctl jobs | head`) ends quietly.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use fleet_api::api::{Checkpoint, FleetView, JobRecord};
use fleet_api::JobState;
use serde::Deserialize;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, OffsetDateTime, PrimitiveDateTime, Time, UtcOffset};

/// Command-line client of the Fleet meta-scheduler (fleet-metasched).
///
/// Shows the clusters of the fleet and the forwarded jobs, cancels jobs,
/// explains placements, and replays traces through the simulator.
#[derive(Parser, Debug)]
#[command(version, propagate_version = true)]
struct Cli {
    /// Base URL of fleet-metasched.
    #[arg(long, global = true, env = "FLEET_URL", default_value = "http://127.0.0.1:16900")]
    url: String,
    /// File holding the admin token (or an agent's token); whitespace is trimmed.
    /// Required by every command that talks to the meta-scheduler.
    #[arg(long, global = true, env = "FLEET_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// PEM bundle of the CA(s) trusted for an https --url (besides the
    /// system's roots).
    #[arg(long, global = true, env = "FLEET_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Print the meta-scheduler's JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Show and read times in UTC instead of the local time zone.
    #[arg(long, global = true)]
    utc: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Clusters: region, provider, health, heartbeat age, GPUs free/total per type, queue,
    /// provisioning SLA (ok, degraded, off; p50/p90 of assignment to running over the last
    /// runs, per cluster and per provider) and why (drained nodes, SLA, GPU quotas).
    Clusters,
    /// Forwarded jobs, newest first, a page of --limit at a time: id, user,
    /// origin and its stand-in's job id, target and remote job id, state,
    /// exit code (`-` for a job that never ran, with the reason), submission
    /// time and age, request. Filters combine (AND).
    Jobs(JobsArgs),
    /// One job: `fleetctl job <id>` shows every field; `job cancel <id>`, `job explain <id>`.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Job {
        /// Fleet job id to show.
        #[arg(required = true)]
        id: Option<String>,
        #[command(subcommand)]
        action: Option<JobAction>,
    },
    /// The cost engine's price table.
    Prices {
        #[command(subcommand)]
        action: PricesAction,
    },
    /// Migrations the meta-scheduler's latest rebalancing pass proposes for
    /// running interruptible jobs: proposal id, from, to, remaining run, and
    /// the engine's USD figures (stay, move, migration cost, saving); the
    /// mode (`[rebalance] mode`: off, propose, approve, auto) and the planned
    /// moves under way (phase, checkpoint wait, decision to running).
    /// `--json` prints the reply.
    Rebalance {
        #[command(subcommand)]
        action: Option<RebalanceAction>,
    },
    /// Replay a job trace over a fleet model with the placement engine (offline; no token needed).
    /// `fleetctl simulate --help` lists its own flags.
    #[command(disable_help_flag = true)]
    Simulate {
        /// The simulator's flags (see `fleetctl simulate --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Convert job traces to the simulator's generic format (offline; no
    /// token needed), this site's own Slurm accounting included: `fleetctl
    /// trace slurm -- -M all -S 2026-11-01` replays in `fleetctl simulate
    /// --trace`. `fleetctl trace --help` lists its own commands.
    #[command(disable_help_flag = true)]
    Trace {
        /// The converter's commands and flags (see `fleetctl trace --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(clap::Args, Debug)]
struct JobsArgs {
    /// Only jobs in this state (held, queued, assigned, pending, running,
    /// completed, failed, cancelled, lost).
    #[arg(long)]
    state: Option<String>,
    /// Only jobs submitted at this cluster (their origin).
    #[arg(long, value_name = "CLUSTER")]
    origin: Option<String>,
    /// Only jobs placed on this cluster (their target).
    #[arg(long, value_name = "CLUSTER")]
    cluster: Option<String>,
    /// Only jobs of this user (the Slurm user name at the origin).
    #[arg(long)]
    user: Option<String>,
    /// Only the job whose stand-in has this Slurm job id at its origin
    /// (`squeue`'s JOBID there); add --origin when several clusters could
    /// have used the same id.
    #[arg(long, value_name = "JOBID")]
    origin_job: Option<u64>,
    /// Only jobs submitted since WHEN: a duration back from now (90s, 30m,
    /// 2h, 3d, 1w, 1h30m), a date (2026-12-01, midnight), a date and time
    /// (2026-12-01T14:30, 2026-12-01 14:30:05, with Z or +01:00 for another
    /// zone than the local one, or --utc), or @UNIX-SECONDS.
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
    /// Only jobs that may still run somewhere.
    #[arg(long, conflicts_with = "finished")]
    active: bool,
    /// Only jobs that have ended.
    #[arg(long)]
    finished: bool,
    /// Jobs per page (newest first); 0 lists every match.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    limit: u32,
    /// Which page of --limit jobs: 1 is the newest.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    page: u32,
}

#[derive(Subcommand, Debug)]
enum RebalanceAction {
    /// Carry out proposal ID of the latest pass (mode `approve` or `auto`;
    /// admin token): the job is asked for a checkpoint, stopped and resumed
    /// at the proposal's target (docs/failover.md, "Planned migration").
    Approve {
        /// The proposal's id, as `fleetctl rebalance` lists it.
        id: String,
    },
    /// Set the mode until the meta-scheduler restarts (its file's
    /// `[rebalance] mode` applies again then): off, propose, approve, auto.
    Mode {
        /// off, propose, approve or auto.
        mode: String,
    },
}

#[derive(Subcommand, Debug)]
enum PricesAction {
    /// Upload a price table (CSV with the header of
    /// /work/shared/data/prices/gpu-prices.csv: provider,region,zone,
    /// instance_type,gpu_type,gpu_count,vcpus,memory_gib,
    /// price_ondemand_usd_hr,price_spot_usd_hr). The meta-scheduler keeps it
    /// and reprices the cloud pools of its fleet model at once.
    Import {
        /// The CSV file.
        csv: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum JobAction {
    /// Cancel a job: before it is submitted anywhere it ends at once; otherwise
    /// the target agent cancels it and the stand-in reports `cancelled`.
    Cancel {
        /// Fleet job id.
        id: String,
    },
    /// Why the job is where it is: the decision taken (reason), and the
    /// placement rule re-run on the current fleet view with every excluded
    /// cluster and its reason.
    Explain {
        /// Fleet job id.
        id: String,
    },
    /// Send a signal to a job where it runs: the target cluster's agent
    /// delivers it with `scancel --signal=<SIG>` (plus the scope's flag).
    /// Refused while no cluster runs the job yet, and once it has finished.
    Signal {
        /// Fleet job id.
        id: String,
        /// Signal name: USR1, USR2, HUP, INT, QUIT, ABRT, ALRM, TERM, KILL,
        /// CONT, STOP, TSTP, TTIN, TTOU, URG, XCPU, XFSZ, VTALRM, PROF,
        /// WINCH, PWR (a `SIG` prefix and lower case are accepted).
        signal: String,
        /// Which processes of the job: `batch` (the batch shell alone, as
        /// `scancel --batch`), `full` (the shell, its children and every
        /// step, as `scancel --full`; what a stand-in forwards) or `steps`
        /// (the job's steps only, as `scancel` without either flag).
        #[arg(long, default_value = "full", value_parser = ["batch", "full", "steps"])]
        scope: String,
    },
    /// The job's checkpoints in the catalog, newest first: sequence number,
    /// the framework's step, valid or torn, the region whose store holds
    /// it, size, age, URL (a copy in another region is a row of its own).
    Checkpoints {
        /// Fleet job id.
        id: String,
    },
}

/// Mirror of the daemon's `GET /v1/jobs/{id}/explain` reply
/// (`fleet_metasched::store::Explanation`); unknown fields are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Explanation {
    fleet_job_id: String,
    state: Option<JobState>,
    target: Option<String>,
    reason: String,
    summary: String,
    placement: String,
    placement_target: Option<String>,
    placement_reason: String,
    exclusions: Vec<Exclusion>,
    policy: String,
    ranked: Vec<Ranked>,
    engine_exclusions: Vec<Exclusion>,
    notes: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Exclusion {
    cluster: String,
    reason: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Ranked {
    cluster: String,
    pool: String,
    pricing: String,
    fits_now: bool,
    score: f64,
    terms: Vec<(String, f64)>,
}

/// Mirror of the daemon's `GET /v1/rebalance` reply
/// (`fleet_metasched::store::Rebalance`); unknown fields are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Rebalance {
    policy: String,
    computed_at: Option<f64>,
    considered: usize,
    proposals: Vec<Proposal>,
    reason: Option<String>,
    mode: String,
    moves: Vec<MoveStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MoveStatus {
    fleet_job_id: String,
    from: String,
    to: String,
    phase: String,
    decided_at: f64,
    checkpoint_wait_s: Option<f64>,
    decision_to_running_s: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Proposal {
    id: String,
    fleet_job_id: String,
    from: String,
    to: String,
    pool: String,
    pricing: String,
    stay_usd: f64,
    move_usd: f64,
    migration_usd: f64,
    saving_usd: f64,
    remaining_s: f64,
}

struct Client {
    http: reqwest::blocking::Client,
    base: String,
    token: String,
}

/// What to say when `url` sends the token in `token_file` over the
/// network in the clear (plain HTTP to a host that is not this one).
fn cleartext_warning(url: &str, token_file: &std::path::Path) -> Option<String> {
    fleet_api::client::cleartext_off_host(url).then(|| {
        format!(
            "{url} is plain HTTP to another host: the token in {} crosses the network in the clear \
             (give fleet-metasched a certificate, [tls] in metasched.toml, and use an https:// --url)",
            token_file.display()
        )
    })
}

impl Client {
    fn new(cli: &Cli) -> anyhow::Result<Client> {
        let Some(path) = &cli.token_file else {
            bail!("no token: pass --token-file or set FLEET_TOKEN_FILE");
        };
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading the token from {}", path.display()))?
            .trim()
            .to_string();
        if token.is_empty() {
            bail!("the token file {} is empty", path.display());
        }
        let mut builder = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(30));
        if let Some(path) = &cli.ca_file {
            let pem = fleet_api::client::read_ca_bundle(path).map_err(anyhow::Error::msg)?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("parsing the CA bundle {}", path.display()))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().context("building the HTTP client")?;
        if let Some(w) = cleartext_warning(&cli.url, path) {
            // Said, not refused: a site may run it on a trusted network.
            let _ = writeln!(std::io::stderr(), "fleetctl: warning: {w}");
        }
        Ok(Client { http, base: cli.url.trim_end_matches('/').to_string(), token })
    }

    fn call(&self, method: reqwest::Method, path: &str) -> anyhow::Result<serde_json::Value> {
        self.call_with(method, path, None)
    }

    /// A call with a JSON body.
    fn call_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .with_context(|| format!("{method} {url}"))?;
        let status = resp.status();
        let text = resp.text().with_context(|| format!("reading the reply of {method} {url}"))?;
        if !status.is_success() {
            let msg = serde_json::from_str::<fleet_api::api::ApiError>(&text).map(|e| e.error).unwrap_or(text);
            bail!("{method} {url}: HTTP {}: {msg}", status.as_u16());
        }
        serde_json::from_str(&text).with_context(|| format!("{method} {url}: reply is not JSON"))
    }

    fn call_with(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<serde_json::Value> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method.clone(), &url).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.header("Content-Type", "text/csv").body(b);
        }
        let resp = req.send().with_context(|| format!("{method} {url}"))?;
        let status = resp.status();
        let text = resp.text().with_context(|| format!("reading the reply of {method} {url}"))?;
        if !status.is_success() {
            let msg = serde_json::from_str::<fleet_api::api::ApiError>(&text).map(|e| e.error).unwrap_or(text);
            bail!("{method} {url}: HTTP {}: {msg}", status.as_u16());
        }
        serde_json::from_str(&text).with_context(|| format!("{method} {url}: reply is not JSON"))
    }
}

/// `fleetctl job signal`'s request: the name as `POST /signal` takes it
/// (upper case, no `SIG`), checked here so a typo is named before any call.
fn signal_request(signal: &str, scope: &str) -> anyhow::Result<fleet_api::api::SignalRequest> {
    let upper = signal.trim().to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    let name = fleet_api::api::check_signal_name(name).map_err(anyhow::Error::msg)?;
    let scope = scope.parse().map_err(anyhow::Error::msg)?;
    Ok(fleet_api::api::SignalRequest { signal: name.to_string(), scope })
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn age(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 120.0 {
        format!("{s:.0}s")
    } else if s < 7200.0 {
        format!("{:.0}m", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.0}h", s / 3600.0)
    } else {
        format!("{:.0}d", s / 86400.0)
    }
}

/// How times are shown and read: the local zone's offset (found once, at
/// start, while the process is single-threaded) or UTC.
#[derive(Clone, Copy, Debug)]
struct Zone(UtcOffset);

impl Zone {
    fn at(self, t: f64) -> Option<OffsetDateTime> {
        if !t.is_finite() {
            return None;
        }
        OffsetDateTime::from_unix_timestamp(t.floor() as i64).ok().map(|d| d.to_offset(self.0))
    }

    /// `2026-12-01 14:55:44`, in this zone.
    fn short(self, t: f64) -> String {
        let f = format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
        self.at(t).and_then(|d| d.format(&f).ok()).unwrap_or_else(|| "-".into())
    }

    /// `2026-12-01T14:55:44+01:00` (`Z` in UTC).
    fn iso(self, t: f64) -> String {
        self.at(t).and_then(|d| d.format(&Rfc3339).ok()).unwrap_or_else(|| "-".into())
    }

    /// `UTC` or `+01:00`, for column headers.
    fn name(self) -> String {
        if self.0.is_utc() {
            return "UTC".into();
        }
        let f = format_description!("[offset_hour sign:mandatory]:[offset_minute]");
        self.0.format(&f).unwrap_or_else(|_| "?".into())
    }
}

/// `--since WHEN` → Unix seconds. See [`JobsArgs::since`] for the forms.
fn parse_since(s: &str, now: f64, zone: Zone) -> Result<f64, String> {
    let bad = || {
        format!(
            "--since {s:?}: expected a duration back from now (90s, 30m, 2h, 3d, 1w), a date (2026-12-01), \
             a date and time (2026-12-01T14:30[:05][Z|+01:00]) or @UNIX-SECONDS"
        )
    };
    let s = s.trim();
    if let Some(n) = s.strip_prefix('@') {
        return n.parse::<f64>().ok().filter(|t| t.is_finite() && *t >= 0.0).ok_or_else(bad);
    }
    if s.starts_with(|c: char| c.is_ascii_digit()) && s.ends_with(['s', 'm', 'h', 'd', 'w']) {
        let mut total: u64 = 0;
        let mut num = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                num.push(c);
                continue;
            }
            let unit: u64 = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                'w' => 604_800,
                _ => return Err(bad()),
            };
            let n: u64 = num.parse().map_err(|_| bad())?;
            num.clear();
            total = n.checked_mul(unit).and_then(|v| total.checked_add(v)).ok_or_else(bad)?;
        }
        return Ok(now - total as f64);
    }
    // A date, then optionally [T ]HH:MM[:SS] and a zone.
    let date_part = s.get(..10).ok_or_else(bad)?;
    let date = Date::parse(date_part, format_description!("[year]-[month]-[day]")).map_err(|_| bad())?;
    let mut rest = &s[10..];
    let mut t = Time::MIDNIGHT;
    if let Some(r) = rest.strip_prefix(['T', 't', ' ']) {
        let len = r.find(['Z', 'z', '+', '-']).unwrap_or(r.len());
        let (clock, zone_part) = r.split_at(len);
        t = Time::parse(clock, format_description!("[hour]:[minute]:[second]"))
            .or_else(|_| Time::parse(clock, format_description!("[hour]:[minute]")))
            .map_err(|_| bad())?;
        rest = zone_part;
    }
    let offset = match rest {
        "" => zone.0,
        "Z" | "z" => UtcOffset::UTC,
        z => UtcOffset::parse(z, format_description!("[offset_hour sign:mandatory]:[offset_minute]"))
            .map_err(|_| bad())?,
    };
    Ok(PrimitiveDateTime::new(date, t).assume_offset(offset).unix_timestamp() as f64)
}

/// The EXIT column: Slurm's `code` or `code:signal` for a job that ran;
/// `-` for one that did not end yet or never ran: never submitted at a
/// target (no remote job id), or ended failed/cancelled/lost with 0:0,
/// which is what Slurm reports for a job that never started its script.
fn exit_text(j: &JobRecord) -> String {
    if !j.state.is_terminal() || !ran(j) {
        return "-".into();
    }
    match (j.exit_code, j.signal.filter(|s| *s > 0)) {
        (c, Some(sig)) => format!("{}:{sig}", c.unwrap_or(0)),
        (Some(c), None) => c.to_string(),
        (None, None) => "-".into(),
    }
}

/// Did the job's script run (as far as its record tells)? See [`exit_text`].
fn ran(j: &JobRecord) -> bool {
    j.remote_job_id.is_some()
        && (j.state == JobState::Completed || j.exit_code.unwrap_or(0) != 0 || j.signal.unwrap_or(0) != 0)
}

/// Left-aligned columns separated by two spaces.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let n = cells.len();
        for (i, c) in cells.into_iter().enumerate() {
            out.push_str(c);
            if i + 1 < n {
                out.push_str(&" ".repeat(w[i] - c.chars().count() + 2));
            }
        }
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for r in rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

fn clusters_table(v: &FleetView) -> String {
    let rows: Vec<Vec<String>> = v
        .clusters
        .iter()
        .map(|c| {
            let gpus = if c.gpus.is_empty() {
                "-".to_string()
            } else {
                c.gpus.iter().map(|p| format!("{}:{}/{}", p.gpu_type, p.free, p.total)).collect::<Vec<_>>().join(" ")
            };
            vec![
                c.name.clone(),
                c.region.clone(),
                c.provider.clone(),
                match (c.health.as_str(), c.healthy) {
                    ("", true) => "healthy".into(),
                    ("", false) => "degraded".into(),
                    (h, _) => h.to_string(),
                },
                // A cluster never heard from has no scheduler name.
                if c.scheduler.is_empty() { "never".into() } else { age(c.heartbeat_age_s) },
                gpus,
                c.queue_pending.to_string(),
                c.queue_running.to_string(),
                sla_cell(c.sla.as_ref()),
                why_cluster(c),
            ]
        })
        .collect();
    table(
        &["NAME", "REGION", "PROVIDER", "HEALTH", "HEARTBEAT", "GPUS(free/total)", "PENDING", "RUNNING", "SLA", "WHY"],
        &rows,
    )
}

/// `ok p50 12s p90 40s (n=7)`; the provider's figures when the cluster has none.
fn sla_cell(sla: Option<&fleet_api::api::ClusterSla>) -> String {
    let Some(s) = sla else { return "-".into() };
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}s"));
    let state = if s.state.is_empty() { "-".to_string() } else { one_line(&s.state) };
    if s.samples > 0 {
        format!("{state} p50 {} p90 {} (n={})", secs(s.p50_s), secs(s.p90_s), s.samples)
    } else if s.provider_samples > 0 {
        format!(
            "{state} provider p50 {} p90 {} (n={})",
            secs(s.provider_p50_s),
            secs(s.provider_p90_s),
            s.provider_samples
        )
    } else {
        state
    }
}

/// Why a cluster is not (fully) available: its health reason, and installed
/// nodes that cannot run jobs now (drained, down).
fn why_cluster(c: &fleet_api::api::ClusterSummary) -> String {
    let mut why = one_line(&c.unhealthy_reason);
    let installed: u32 = c.installed.iter().map(|s| s.count).sum();
    let usable: u32 = c.nodes.iter().map(|s| s.count).sum();
    if installed > usable {
        let n = installed - usable;
        why = if why.is_empty() {
            format!("{n} of {installed} nodes drained or down")
        } else {
            format!("{why}; {n} of {installed} nodes drained or down")
        };
    }
    if let Some(s) = c.sla.as_ref().filter(|s| s.state == "degraded") {
        let sla = format!("sla: {}", one_line(&s.why));
        why = if why.is_empty() { sla } else { format!("{why}; {sla}") };
    }
    // GPU quotas bound what their submitters' jobs may take there.
    for q in c.gpu_quotas.iter().flatten() {
        let full = if q.headroom() == 0 { " full" } else { "" };
        let quota = format!("gpu quota{full}: {} {}/{} used", one_line(&q.scope), q.used, q.hard);
        why = if why.is_empty() { quota } else { format!("{why}; {quota}") };
    }
    if why.is_empty() {
        "-".into()
    } else {
        why
    }
}

fn jobs_table(jobs: &[JobRecord], now: f64, zone: Zone) -> String {
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            // Why it ended as it did, for jobs that did not complete.
            let why = match j.state {
                JobState::Failed | JobState::Lost | JobState::Cancelled => one_line(&j.reason),
                _ => String::new(),
            };
            vec![
                j.fleet_job_id.clone(),
                dash(j.user.clone()),
                j.origin.clone(),
                dash(j.origin_job_id.map(|i| i.to_string())),
                dash(j.target.clone()),
                dash(j.remote_job_id.map(|i| i.to_string())),
                j.state.to_string(),
                exit_text(j),
                zone.short(j.submitted_at),
                age(now - j.submitted_at),
                j.summary.clone(),
                why,
            ]
        })
        .collect();
    let submitted = format!("SUBMITTED({})", zone.name());
    let t = table(
        &[
            "ID",
            "USER",
            "ORIGIN",
            "ORIGIN_JOB",
            "TARGET",
            "REMOTE",
            "STATE",
            "EXIT",
            &submitted,
            "AGE",
            "REQUEST",
            "REASON",
        ],
        &rows,
    );
    // No trailing blanks where the last column is empty.
    t.lines().map(|l| format!("{}\n", l.trim_end())).collect()
}

/// Control characters (a reason may quote a remote error) as spaces.
fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

fn job_fields(j: &JobRecord, now: f64, zone: Zone) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let when = |t: f64| format!("{} ({} ago; {t:.3})", zone.iso(t), age(now - t));
    let exit = match exit_text(j).as_str() {
        "-" if j.state.is_terminal() => "- (never ran; see reason)".to_string(),
        e => e.to_string(),
    };
    let fields: Vec<(&str, String)> = vec![
        ("fleet_job_id", j.fleet_job_id.clone()),
        ("state", j.state.to_string()),
        ("user", opt(j.user.clone())),
        ("origin", j.origin.clone()),
        ("origin_job_id", opt(j.origin_job_id.map(|v| v.to_string()))),
        ("target", opt(j.target.clone())),
        ("remote_job_id", opt(j.remote_job_id.map(|v| v.to_string()))),
        ("exit", exit),
        ("exit_code", opt(j.exit_code.map(|v| v.to_string()))),
        ("signal", opt(j.signal.map(|v| v.to_string()))),
        ("cancel_requested", j.cancel_requested.to_string()),
        ("summary", j.summary.clone()),
        // The run's limit at its target as its agent reports it (the
        // job's --time, else that cluster's default; updates there).
        ("time_limit", opt(j.time_limit_min.map(|m| format!("{m} min at the target")))),
        ("reason", one_line(&j.reason)),
        ("node_list", if j.node_list.is_empty() { "-".into() } else { j.node_list.clone() }),
        ("stdout_len", j.stdout_len.to_string()),
        ("stderr_len", j.stderr_len.to_string()),
        ("output_complete", j.output_complete.to_string()),
        ("submitted_at", when(j.submitted_at)),
        ("updated_at", when(j.updated_at)),
        // Times Slurm ran it again at a target (requeued, or re-run after
        // a failure without counting it) and times Fleet moved it.
        ("requeues", j.requeues.to_string()),
        ("migrations", j.migrations.to_string()),
    ];
    let notes = j.requeue_notes.iter().map(|n| ("requeued", one_line(n)));
    fields.into_iter().chain(notes).map(|(k, v)| format!("{k:<17} {v}\n")).collect()
}

/// `fleetctl job <id>`'s checkpoint lines: the last valid checkpoint, its
/// age, and for a running job the work at risk (run time since it, or since
/// the start when there is none).
fn checkpoint_fields(j: &JobRecord, rows: &[Checkpoint], now: f64) -> String {
    let last = rows.iter().find(|c| c.valid);
    let mut s = match last {
        Some(c) => format!(
            "{:<17} seq {} ({} ago, {:.1} MB): {}\n",
            "last_checkpoint",
            c.seq,
            age(now - c.reported_at),
            c.bytes as f64 / 1e6,
            one_line(&c.url)
        ),
        None => format!("{:<17} -\n", "last_checkpoint"),
    };
    if j.state == JobState::Running {
        let risk = match last {
            Some(c) => format!("{} (since the last checkpoint)", age(now - c.reported_at)),
            None => "all of it (no checkpoint)".to_string(),
        };
        s.push_str(&format!("{:<17} {risk}\n", "work_at_risk"));
    }
    s
}

/// `fleetctl job checkpoints <id>`: the catalog's rows, newest first.
fn checkpoints_table(id: &str, rows: &[Checkpoint], now: f64, zone: Zone) -> String {
    if rows.is_empty() {
        return format!("{id}: no checkpoint reported\n");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|c| {
            vec![
                c.seq.to_string(),
                c.step.map_or("-".into(), |s| s.to_string()),
                if c.valid { "valid".into() } else { "torn".into() },
                c.region.clone().unwrap_or_else(|| "(job's own)".into()),
                format!("{:.1} MB", c.bytes as f64 / 1e6),
                format!("{} ({} ago)", zone.iso(c.reported_at), age(now - c.reported_at)),
                c.reported_by.clone(),
                one_line(&c.url),
            ]
        })
        .collect();
    let mut s = table(&["SEQ", "STEP", "STATE", "REGION", "SIZE", "REPORTED", "BY", "URL"], &cells);
    // Copies made for a resume: what crossed regions, and how fast.
    for c in rows {
        if let Some(from) = &c.copied_from {
            let secs = c.copy_seconds.unwrap_or(0.0);
            s.push_str(&format!(
                "copy: seq {} into {} from {} ({:.1} MB in {secs:.1} s, {:.1} MB/s)\n",
                c.seq,
                c.region.as_deref().unwrap_or("(job's own)"),
                one_line(from),
                c.bytes as f64 / 1e6,
                c.bytes as f64 / 1e6 / secs.max(1e-3)
            ));
        }
    }
    match rows.iter().find(|c| c.valid) {
        Some(c) => {
            s.push_str(&format!("last valid: seq {} ({} ago): {}\n", c.seq, age(now - c.reported_at), one_line(&c.url)))
        }
        None => s.push_str("no valid checkpoint: the job would start from scratch\n"),
    }
    s
}

/// The query of `GET /v1/jobs` for `fleetctl jobs`: newest first, one more
/// than a page so that the CLI knows whether another page follows.
fn jobs_query(a: &JobsArgs, now: f64, zone: Zone) -> anyhow::Result<String> {
    let mut q = vec!["order=desc".to_string()];
    if let Some(s) = &a.state {
        let parsed: JobState = serde_json::from_value(serde_json::Value::String(s.to_ascii_lowercase())).map_err(|_| {
            anyhow::anyhow!(
                "--state {s:?}: unknown state (held, queued, assigned, pending, running, completed, failed, cancelled, lost)"
            )
        })?;
        q.push(format!("state={parsed}"));
    }
    for (key, v) in [("origin", &a.origin), ("target", &a.cluster), ("user", &a.user)] {
        if let Some(v) = v {
            q.push(format!("{key}={}", query_escape(v)));
        }
    }
    if let Some(n) = a.origin_job {
        q.push(format!("origin_job={n}"));
    }
    if let Some(w) = &a.since {
        q.push(format!("since={}", parse_since(w, now, zone).map_err(anyhow::Error::msg)?));
    }
    if a.active || a.finished {
        q.push(format!("active={}", a.active));
    }
    if a.limit > 0 {
        // One more than asked, to tell whether another page follows (the
        // meta-scheduler's own cap is 10,000 rows).
        q.push(format!("limit={}", (a.limit + 1).min(10_000)));
        q.push(format!("offset={}", u64::from(a.page - 1) * u64::from(a.limit)));
    } else if a.page > 1 {
        bail!("--page needs a --limit above 0");
    }
    Ok(format!("/v1/jobs?{}", q.join("&")))
}

fn explain_text(e: &Explanation) -> String {
    let mut s = String::new();
    let state = e.state.map_or("-".to_string(), |s| s.to_string());
    s.push_str(&format!("job {} ({}): {}\n", e.fleet_job_id, e.summary, state));
    s.push_str(&format!("target:    {}\n", e.target.as_deref().unwrap_or("-")));
    s.push_str(&format!("decision:  {}\n", e.reason));
    let now_target = e.placement_target.as_deref().map(|t| format!(" → {t}")).unwrap_or_default();
    s.push_str(&format!("rule now:  {}{now_target}: {}\n", e.placement, e.placement_reason));
    if e.policy.is_empty() {
        s.push_str("ranking:   first rule only (no cost-engine policy configured)\n");
    } else {
        s.push_str(&format!("ranked by policy {} (lower score is better):\n", e.policy));
        let rows: Vec<Vec<String>> = e
            .ranked
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut row = vec![
                    format!("{}.", i + 1),
                    r.cluster.clone(),
                    r.pool.clone(),
                    r.pricing.clone(),
                    if r.fits_now { "now".into() } else { "waits".into() },
                    format!("{:.3}", r.score),
                ];
                row.push(r.terms.iter().map(|(k, v)| format!("{k}={v:.3}")).collect::<Vec<_>>().join(" "));
                row
            })
            .collect();
        for line in table(&["#", "CLUSTER", "POOL", "PRICING", "FITS", "SCORE", "TERMS"], &rows).lines() {
            s.push_str(&format!("  {line}\n"));
        }
        for x in &e.engine_exclusions {
            s.push_str(&format!("  engine excludes {}: {}\n", x.cluster, x.reason));
        }
        for n in &e.notes {
            s.push_str(&format!("  note: {n}\n"));
        }
    }
    if e.exclusions.is_empty() {
        s.push_str("excluded:  none\n");
    } else {
        s.push_str("excluded:\n");
        for x in &e.exclusions {
            s.push_str(&format!("  {}: {}\n", x.cluster, x.reason));
        }
    }
    s
}

fn rebalance_text(r: &Rebalance, now: f64) -> String {
    let mut s = String::new();
    if let Some(why) = &r.reason {
        s.push_str(&format!("{why}\n"));
    }
    if let Some(t) = r.computed_at {
        s.push_str(&format!(
            "pass {} ago, policy {}: {} running interruptible job(s) considered, {} proposal(s)\n",
            age(now - t),
            r.policy,
            r.considered,
            r.proposals.len()
        ));
    }
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}s"));
    if !r.moves.is_empty() {
        let rows: Vec<Vec<String>> = r
            .moves
            .iter()
            .map(|m| {
                vec![
                    m.fleet_job_id.clone(),
                    m.from.clone(),
                    m.to.clone(),
                    m.phase.clone(),
                    age(now - m.decided_at),
                    secs(m.checkpoint_wait_s),
                    secs(m.decision_to_running_s),
                ]
            })
            .collect();
        s.push_str("moves:\n");
        s.push_str(&table(&["JOB", "FROM", "TO", "PHASE", "DECIDED", "CKPT-WAIT", "TO-RUNNING"], &rows));
    }
    if r.proposals.is_empty() {
        return s;
    }
    let rows: Vec<Vec<String>> = r
        .proposals
        .iter()
        .map(|p| {
            vec![
                p.id.clone(),
                p.fleet_job_id.clone(),
                p.from.clone(),
                p.to.clone(),
                p.pool.clone(),
                p.pricing.clone(),
                age(p.remaining_s),
                format!("{:.2}", p.stay_usd),
                format!("{:.2}", p.move_usd),
                format!("{:.2}", p.migration_usd),
                format!("{:.2}", p.saving_usd),
            ]
        })
        .collect();
    s.push_str(&table(
        &["ID", "JOB", "FROM", "TO", "POOL", "PRICING", "LEFT", "STAY$", "MOVE$", "MIGRATE$", "SAVING$"],
        &rows,
    ));
    s.push_str(match r.mode.as_str() {
        "approve" => "mode approve: carry one out with fleetctl rebalance approve <ID>\n",
        "auto" => "mode auto: the meta-scheduler carries the best ones out itself\n",
        _ => "mode propose: proposals only, none is carried out\n",
    });
    s
}

fn print(text: &str) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())?;
    o.flush()?;
    Ok(())
}

fn print_json(v: &serde_json::Value) -> anyhow::Result<()> {
    print(&format!("{}\n", serde_json::to_string_pretty(v)?))
}

/// A job id as one path segment. An empty id, `.` or `..` (even escaped,
/// `%2E`) would be a dot segment that the URL parser folds away, asking
/// for another path (`job explain .` as `GET /v1/jobs/explain`).
fn job_segment(id: &str) -> anyhow::Result<String> {
    if id.bytes().all(|b| b == b'.') {
        bail!("{id:?} is not a job id");
    }
    Ok(query_escape(id))
}

fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn run(cli: Cli, local: UtcOffset) -> anyhow::Result<()> {
    let zone = Zone(if cli.utc { UtcOffset::UTC } else { local });
    if let Command::Simulate { args } = &cli.command {
        // The simulator parses its own flags, so its --help shows only them.
        let mut argv = vec!["fleetctl simulate".to_string()];
        argv.extend(args.iter().cloned());
        if cli.json && !args.iter().any(|a| a == "--json") {
            argv.push("--json".into());
        }
        return match fleet_sim::cli::parse_from(argv) {
            Ok(a) => fleet_sim::cli::run(a),
            Err(e) => e.exit(),
        };
    }
    if let Command::Trace { args } = &cli.command {
        let argv = std::iter::once("fleetctl trace".to_string()).chain(args.iter().cloned());
        return match fleet_sim::trace_cli::parse_from(argv) {
            Ok(a) => fleet_sim::trace_cli::run(a),
            Err(e) => e.exit(),
        };
    }
    let client = Client::new(&cli)?;
    match &cli.command {
        Command::Simulate { .. } | Command::Trace { .. } => unreachable!("handled above"),
        Command::Prices { action: PricesAction::Import { csv } } => {
            let text = std::fs::read_to_string(csv).with_context(|| format!("reading {}", csv.display()))?;
            let v = client.call_with(reqwest::Method::POST, "/v1/prices", Some(text))?;
            if cli.json {
                return print_json(&v);
            }
            let n = v["entries"].as_u64().unwrap_or(0);
            let skipped = v["skipped_fractional"].as_u64().unwrap_or(0);
            let applied = if v["applied"].as_bool().unwrap_or(false) {
                "applied to the fleet model"
            } else {
                "stored; no cost-engine policy is configured, so it is not used yet"
            };
            print(&format!("{n} price entries ({skipped} fractional-GPU rows skipped), {applied}\n"))
        }
        Command::Rebalance { action: Some(RebalanceAction::Approve { id }) } => {
            let path = format!("/v1/rebalance/approve/{}", query_escape(id));
            let v = client.call(reqwest::Method::POST, &path)?;
            if cli.json {
                return print_json(&v);
            }
            let target = v["target"].as_str().unwrap_or("?");
            let reason = v["reason"].as_str().unwrap_or("");
            print(&format!("{id}: planned move started (the job still runs at {target}): {reason}\n"))
        }
        Command::Rebalance { action: Some(RebalanceAction::Mode { mode }) } => {
            let v =
                client.call_json(reqwest::Method::POST, "/v1/rebalance/mode", &serde_json::json!({ "mode": mode }))?;
            if cli.json {
                return print_json(&v);
            }
            print(&format!(
                "rebalancing mode {} (was {}) until the meta-scheduler restarts\n",
                v["mode"].as_str().unwrap_or("?"),
                v["was"].as_str().unwrap_or("?")
            ))
        }
        Command::Rebalance { action: None } => {
            let v = client.call(reqwest::Method::GET, "/v1/rebalance")?;
            if cli.json {
                return print_json(&v);
            }
            let r: Rebalance = serde_json::from_value(v).context("decoding the rebalancing proposals")?;
            print(&rebalance_text(&r, now()))
        }
        Command::Clusters => {
            let v = client.call(reqwest::Method::GET, "/v1/clusters")?;
            if cli.json {
                return print_json(&v);
            }
            let view: FleetView = serde_json::from_value(v).context("decoding the fleet view")?;
            print(&clusters_table(&view))
        }
        Command::Jobs(a) => {
            let v = client.call(reqwest::Method::GET, &jobs_query(a, now(), zone)?)?;
            let mut jobs: Vec<JobRecord> = serde_json::from_value(v).context("decoding the job list")?;
            let more = a.limit > 0 && jobs.len() > a.limit as usize;
            jobs.truncate(if a.limit > 0 { a.limit as usize } else { jobs.len() });
            if cli.json {
                print_json(&serde_json::to_value(&jobs)?)?;
            } else {
                print(&jobs_table(&jobs, now(), zone))?;
            }
            if more {
                // On stderr, so that a pipe reads the table alone.
                let first = u64::from(a.page - 1) * u64::from(a.limit) + 1;
                eprintln!(
                    "fleetctl: jobs {first}-{} (newest first); more on --page {}",
                    first + jobs.len() as u64 - 1,
                    a.page + 1
                );
            }
            Ok(())
        }
        Command::Job { id, action } => {
            let (method, path) = match (action, id) {
                (Some(JobAction::Cancel { id }), _) => {
                    (reqwest::Method::POST, format!("/v1/jobs/{}/cancel", job_segment(id)?))
                }
                (Some(JobAction::Explain { id }), _) => {
                    (reqwest::Method::GET, format!("/v1/jobs/{}/explain", job_segment(id)?))
                }
                (Some(JobAction::Signal { id, signal, scope }), _) => {
                    return job_signal(&client, cli.json, id, signal, scope);
                }
                (Some(JobAction::Checkpoints { id }), _) => {
                    (reqwest::Method::GET, format!("/v1/jobs/{}/checkpoints", job_segment(id)?))
                }
                (None, Some(id)) => (reqwest::Method::GET, format!("/v1/jobs/{}", job_segment(id)?)),
                (None, None) => bail!("missing job id"),
            };
            let v = client.call(method, &path)?;
            if cli.json {
                return print_json(&v);
            }
            match action {
                Some(JobAction::Signal { .. }) => unreachable!("answered above"),
                Some(JobAction::Checkpoints { id }) => {
                    let c: Vec<Checkpoint> = serde_json::from_value(v).context("decoding the checkpoints")?;
                    print(&checkpoints_table(id, &c, now(), zone))
                }
                Some(JobAction::Explain { .. }) => {
                    let e: Explanation = serde_json::from_value(v).context("decoding the explanation")?;
                    print(&explain_text(&e))
                }
                Some(JobAction::Cancel { id }) => {
                    let r: JobRecord = serde_json::from_value(v).context("decoding the job")?;
                    if r.state == JobState::Cancelled {
                        print(&format!("{id}: cancelled\n"))
                    } else if r.state.is_terminal() {
                        print(&format!("{id}: already {}\n", r.state))
                    } else {
                        print(&format!(
                            "{id}: cancel requested (now {} at {})\n",
                            r.state,
                            r.target.as_deref().unwrap_or("-")
                        ))
                    }
                }
                None => {
                    let r: JobRecord = serde_json::from_value(v).context("decoding the job")?;
                    // The catalog's view; a daemon without it (older) adds nothing.
                    let ckpts: Vec<Checkpoint> = client
                        .call(reqwest::Method::GET, &format!("/v1/jobs/{}/checkpoints", query_escape(&r.fleet_job_id)))
                        .ok()
                        .and_then(|v| serde_json::from_value(v).ok())
                        .unwrap_or_default();
                    print(&format!("{}{}", job_fields(&r, now(), zone), checkpoint_fields(&r, &ckpts, now())))
                }
            }
        }
    }
}

/// `fleetctl job signal <id> <SIG> [--scope]`.
fn job_signal(client: &Client, json: bool, id: &str, signal: &str, scope: &str) -> anyhow::Result<()> {
    let req = signal_request(signal, scope)?;
    let path = format!("/v1/jobs/{}/signal", job_segment(id)?);
    let v = client.call_json(reqwest::Method::POST, &path, &serde_json::to_value(&req)?)?;
    if json {
        return print_json(&v);
    }
    let r: JobRecord = serde_json::from_value(v).context("decoding the job")?;
    let flag = req.scope.scancel_flag().map(|f| format!(" {f}")).unwrap_or_default();
    print(&format!(
        "{id}: SIG{sig} queued for {target} ({state} there as job {remote}; its agent runs scancel --signal={sig}{flag})\n",
        sig = req.signal,
        target = r.target.as_deref().unwrap_or("-"),
        state = r.state,
        remote = r.remote_job_id.map_or("-".to_string(), |i| i.to_string()),
    ))
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

fn main() -> ExitCode {
    // Before any thread starts: `time` reads the local offset only then.
    let local = UtcOffset::current_local_offset().unwrap_or(UtcOffset::UTC);
    let cli = Cli::parse(); // usage errors exit 2, --help/--version exit 0
    match run(cli, local) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "fleetctl: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str], expected: &str) {
        let got = match Cli::try_parse_from(std::iter::once("fleetctl").chain(args.iter().copied())) {
            Ok(c) => format!("{:?}", c.command),
            Err(e) => format!("error {}", e.exit_code()),
        };
        assert!(got.starts_with(expected), "{args:?}: got {got}, expected {expected}");
    }

    #[test]
    fn plain_http_to_another_host_is_warned_about() {
        let t = std::path::Path::new("/etc/fleet/admin.token");
        let w = cleartext_warning("http://meta.example:16900", t).unwrap();
        assert!(w.contains("the token in /etc/fleet/admin.token crosses the network in the clear"), "{w}");
        assert_eq!(cleartext_warning("http://127.0.0.1:16900", t), None);
        assert_eq!(cleartext_warning("https://meta.example", t), None);
    }

    #[test]
    fn parse_table() {
        check(&["clusters"], "Clusters");
        check(&["jobs", "--state", "running"], "Jobs(JobsArgs { state: Some(\"running\")");
        check(&["jobs", "--limit", "10001"], "error 2");
        check(&["jobs", "--page", "0"], "error 2");
        check(&["jobs", "--active", "--finished"], "error 2");
        check(&["jobs", "--origin-job", "x"], "error 2");
        // the simulator's flags pass through to its own parser, --help included
        check(&["simulate", "--help"], "Simulate { args: [\"--help\"] }");
        check(&["simulate", "--trace", "t", "--json"], "Simulate { args: [\"--trace\", \"t\", \"--json\"] }");
        // and the trace converter's, `--` before sacct's own arguments included
        check(
            &["trace", "slurm", "--team", "user", "--", "-M", "all"],
            "Trace { args: [\"slurm\", \"--team\", \"user\", \"--\", \"-M\", \"all\"] }",
        );
        check(&["trace", "--help"], "Trace { args: [\"--help\"] }");
        check(&["job", "abc"], "Job { id: Some(\"abc\"), action: None }");
        check(&["job", "cancel", "abc"], "Job { id: None, action: Some(Cancel { id: \"abc\" }) }");
        check(&["job", "explain", "abc"], "Job { id: None, action: Some(Explain { id: \"abc\" }) }");
        check(
            &["job", "signal", "abc", "USR1"],
            "Job { id: None, action: Some(Signal { id: \"abc\", signal: \"USR1\", scope: \"full\" }) }",
        );
        check(
            &["job", "signal", "abc", "usr1", "--scope", "batch"],
            "Job { id: None, action: Some(Signal { id: \"abc\", signal: \"usr1\", scope: \"batch\" }) }",
        );
        check(&["job", "signal", "abc", "USR1", "--scope", "all"], "error 2");
        check(&["job", "signal", "abc"], "error 2");
        check(&["job", "checkpoints", "abc"], "Job { id: None, action: Some(Checkpoints { id: \"abc\" }) }");
        check(&["job", "checkpoints"], "error 2");
        check(&["rebalance"], "Rebalance");
        check(&["rebalance", "--json"], "Rebalance");
        check(&["rebalance", "x"], "error 2");
        check(&["rebalance", "approve", "j1-e1"], "Rebalance { action: Some(Approve { id: \"j1-e1\" }) }");
        check(&["rebalance", "approve"], "error 2");
        check(&["rebalance", "mode", "auto"], "Rebalance { action: Some(Mode { mode: \"auto\" }) }");
        check(&["job"], "error 2");
        check(&["bogus"], "error 2");
        check(&["--json", "clusters", "--url", "http://x:1"], "Clusters");
    }

    #[test]
    fn signal_requests() {
        use fleet_api::api::SignalScope;
        for (sig, scope, want) in [
            ("USR1", "full", Ok(("USR1", SignalScope::Full))),
            ("SIGusr2", "batch", Ok(("USR2", SignalScope::Batch))),
            (" hup ", "steps", Ok(("HUP", SignalScope::Steps))),
            ("SIGSEGV", "full", Err("unknown signal \"SEGV\"")),
            ("9", "full", Err("unknown signal \"9\"")),
            ("USR1", "all", Err("unknown signal scope \"all\"")),
        ] {
            match (signal_request(sig, scope), want) {
                (Ok(r), Ok((name, sc))) => assert_eq!((r.signal.as_str(), r.scope), (name, sc), "{sig}"),
                (Err(e), Err(needle)) => assert!(format!("{e:#}").contains(needle), "{sig}: {e:#}"),
                (got, want) => panic!("{sig} {scope}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn ages_and_tables() {
        for (s, want) in [(-3.0, "0s"), (5.4, "5s"), (300.0, "5m"), (7200.0, "2h"), (200_000.0, "2d")] {
            assert_eq!(age(s), want);
        }
        assert_eq!(table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]), "A    BB\nxyz  1\n");
        assert_eq!(query_escape("a b/c"), "a%20b%2Fc");
        assert_eq!(job_segment("beta-12.x").unwrap(), "beta-12.x");
        for dots in ["", ".", ".."] {
            assert!(job_segment(dots).is_err(), "{dots:?}");
        }
        let r = Rebalance { reason: Some("off".into()), ..Default::default() };
        assert_eq!(rebalance_text(&r, 0.0), "off\n");
        let r = Rebalance {
            policy: "cost".into(),
            computed_at: Some(100.0),
            considered: 1,
            mode: "approve".into(),
            moves: vec![MoveStatus {
                fleet_job_id: "j0".into(),
                from: "a".into(),
                to: "b".into(),
                phase: "running".into(),
                decided_at: 90.0,
                checkpoint_wait_s: Some(2.5),
                decision_to_running_s: Some(7.25),
            }],
            proposals: vec![Proposal {
                id: "j1-e1".into(),
                fleet_job_id: "j1".into(),
                from: "a".into(),
                to: "b".into(),
                saving_usd: 12.345,
                remaining_s: 3600.0,
                ..Default::default()
            }],
            reason: None,
        };
        let t = rebalance_text(&r, 105.0);
        assert!(
            t.starts_with("pass 5s ago, policy cost: 1 running interruptible job(s) considered, 1 proposal(s)\n"),
            "{t}"
        );
        assert!(t.contains("j1-e1  j1   a     b"), "{t}");
        assert!(t.contains("12.35"), "{t}");
        assert!(t.contains("j0   a     b   running  15s      2.5s       7.2s"), "{t}");
        assert!(t.ends_with("mode approve: carry one out with fleetctl rebalance approve <ID>\n"), "{t}");
    }

    fn record(state: JobState, remote: Option<u64>, exit_code: Option<i32>, signal: Option<i32>) -> JobRecord {
        serde_json::from_value(serde_json::json!({
            "fleet_job_id": "j1", "origin": "beta", "state": state, "submitted_at": 0.0, "updated_at": 0.0,
            "remote_job_id": remote, "exit_code": exit_code, "signal": signal,
        }))
        .unwrap()
    }

    #[test]
    fn exit_column() {
        use JobState::*;
        for (state, remote, code, sig, want) in [
            (Running, Some(7), None, None, "-"),
            (Completed, Some(7), Some(0), None, "0"),
            (Failed, Some(7), Some(3), None, "3"),
            (Failed, Some(7), Some(0), Some(9), "0:9"),
            (Cancelled, Some(7), Some(0), Some(15), "0:15"),
            // Never ran: sbatch refused it at the target (no remote id),
            // or Slurm's FAILED/CANCELLED 0:0 of a job that never started.
            (Failed, None, Some(1), None, "-"),
            (Failed, None, None, None, "-"),
            (Failed, Some(7), Some(0), None, "-"),
            (Cancelled, Some(7), Some(0), Some(0), "-"),
            (Lost, Some(7), None, None, "-"),
        ] {
            assert_eq!(exit_text(&record(state, remote, code, sig)), want, "{state} {remote:?} {code:?} {sig:?}");
        }
    }

    #[test]
    fn since_forms() {
        let utc = Zone(UtcOffset::UTC);
        let plus1 = Zone(UtcOffset::from_hms(1, 0, 0).unwrap());
        let now = 1_764_600_000.0; // 2025-12-01T14:40:00Z
        let ok = [
            ("90s", utc, now - 90.0),
            ("30m", utc, now - 1800.0),
            ("2h", utc, now - 7200.0),
            ("1h30m", utc, now - 5400.0),
            ("3d", utc, now - 259_200.0),
            ("1w", utc, now - 604_800.0),
            ("@1700000000", utc, 1_700_000_000.0),
            ("2025-12-01", utc, 1_764_547_200.0),
            ("2025-12-01", plus1, 1_764_547_200.0 - 3600.0),
            ("2025-12-01T14:40", utc, now),
            ("2025-12-01 14:40:05", utc, now + 5.0),
            ("2025-12-01T14:40:00Z", plus1, now),
            ("2025-12-01T15:40:00+01:00", utc, now),
            ("2025-12-01T14:40", plus1, now - 3600.0),
        ];
        for (s, zone, want) in ok {
            assert_eq!(parse_since(s, now, zone), Ok(want), "{s}");
        }
        for bad in [
            "",
            "yesterday",
            "2h3",
            "h",
            "5x",
            "-5m",
            "2025-13-01",
            "2025-12-01T25:00",
            "2025-12-01T14:40+1",
            "@",
            "@-1",
            "@nan",
            "99999999999999999999w",
            "2025-12-0",
            "2025-12-01Tx",
        ] {
            let e = parse_since(bad, now, utc).unwrap_err();
            assert!(e.contains("--since") && e.contains("duration"), "{bad}: {e}");
        }
    }

    #[test]
    fn clusters_table_shows_the_sla() {
        use fleet_api::api::{ClusterSla, ClusterSummary};
        let sla = |state: &str, samples: u32, why: &str| ClusterSla {
            state: state.into(),
            deadline_s: 300.0,
            samples,
            missed: 3,
            p50_s: (samples > 0).then_some(150.4),
            p90_s: (samples > 0).then_some(412.0),
            provider_p50_s: Some(20.0),
            provider_p90_s: Some(30.0),
            provider_samples: 9,
            why: why.into(),
            ..Default::default()
        };
        let c = |name: &str, s: Option<ClusterSla>| ClusterSummary {
            name: name.into(),
            healthy: true,
            scheduler: "slurm".into(),
            sla: s,
            ..Default::default()
        };
        let v = FleetView {
            generated_at: 0.0,
            clusters: vec![
                c("alpha", Some(sla("degraded", 5, "missed 3 of last 5, p90 412 s > 300 s; degraded until …"))),
                c("beta", Some(sla("ok", 0, "no runs yet"))),
                c("gamma", None),
            ],
        };
        let t = clusters_table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("  SLA  ") && lines[0].ends_with("WHY"), "{t}");
        assert!(lines[1].contains("degraded p50 150s p90 412s (n=5)"), "{t}");
        assert!(lines[1].ends_with("sla: missed 3 of last 5, p90 412 s > 300 s; degraded until …"), "{t}");
        assert!(lines[2].contains("ok provider p50 20s p90 30s (n=9)") && lines[2].ends_with('-'), "{t}");
        let cells: Vec<&str> = lines[3].split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
        assert_eq!(cells[cells.len() - 2..], ["-", "-"], "{t}");
        // A cluster's GPU quotas are in WHY, a full one said so.
        let q = |scope: &str, hard, used| fleet_api::api::GpuQuota {
            scope: scope.into(),
            users: vec!["*:alice".into()],
            hard,
            used,
        };
        let mut kube = c("kube", None);
        kube.gpu_quotas = Some(vec![q("namespace fleet", 2, 2), q("namespace team-vision", 8, 3)]);
        let t = clusters_table(&FleetView { generated_at: 0.0, clusters: vec![kube] });
        let row = t.lines().nth(1).unwrap();
        assert!(
            row.ends_with("gpu quota full: namespace fleet 2/2 used; gpu quota: namespace team-vision 3/8 used"),
            "{t}"
        );
    }

    #[test]
    fn checkpoints_table_rows_and_summary() {
        let c = |seq: u64, valid: bool, region: Option<&str>| Checkpoint {
            fleet_job_id: "j1".into(),
            seq,
            url: format!("s3://ckpt-east/fleet/j1/ckpt-{seq:012}"),
            region: region.map(Into::into),
            bytes: 200_000_000,
            manifest_sha256: "a".repeat(64),
            step: Some(seq * 10),
            reported_at: 1_764_600_000.0,
            reported_by: "alpha".into(),
            valid,
            copied_from: None,
            copy_seconds: None,
        };
        let t = checkpoints_table(
            "j1",
            &[c(2, false, Some("east")), c(1, true, None)],
            1_764_600_090.0,
            Zone(UtcOffset::UTC),
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("SEQ  STEP  STATE  REGION"), "{t}");
        let cells =
            |l: &str| l.split("  ").filter(|c| !c.is_empty()).map(str::trim).map(String::from).collect::<Vec<_>>();
        assert_eq!(cells(lines[1])[..5], ["2", "20", "torn", "east", "200.0 MB"], "{t}");
        assert_eq!(cells(lines[2])[..5], ["1", "10", "valid", "(job's own)", "200.0 MB"], "{t}");
        assert!(lines[2].contains("90s ago") && lines[2].ends_with("s3://ckpt-east/fleet/j1/ckpt-000000000001"), "{t}");
        assert_eq!(lines[3], "last valid: seq 1 (90s ago): s3://ckpt-east/fleet/j1/ckpt-000000000001");
        let t = checkpoints_table("j1", &[c(2, false, None)], 1_764_600_090.0, Zone(UtcOffset::UTC));
        assert!(t.ends_with("no valid checkpoint: the job would start from scratch\n"), "{t}");
        assert_eq!(checkpoints_table("j9", &[], 0.0, Zone(UtcOffset::UTC)), "j9: no checkpoint reported\n");
        let copied = Checkpoint {
            url: "s3://ckpt-south/fleet/j1/ckpt-000000000001".into(),
            region: Some("south".into()),
            copied_from: Some("s3://ckpt-east/fleet/j1/ckpt-000000000001".into()),
            copy_seconds: Some(4.0),
            ..c(1, true, Some("south"))
        };
        let t = checkpoints_table("j1", &[copied], 1_764_600_090.0, Zone(UtcOffset::UTC));
        assert!(
            t.contains("copy: seq 1 into south from s3://ckpt-east/fleet/j1/ckpt-000000000001 (200.0 MB in 4.0 s, 50.0 MB/s)\n"),
            "{t}"
        );
        let mut j = record(JobState::Running, None, None, None);
        let rows = [c(2, false, Some("east")), c(1, true, None)];
        assert_eq!(
            checkpoint_fields(&j, &rows, 1_764_600_300.0),
            "last_checkpoint   seq 1 (5m ago, 200.0 MB): s3://ckpt-east/fleet/j1/ckpt-000000000001\n\
             work_at_risk      5m (since the last checkpoint)\n"
        );
        assert_eq!(
            checkpoint_fields(&j, &[], 0.0),
            "last_checkpoint   -\nwork_at_risk      all of it (no checkpoint)\n"
        );
        j.state = JobState::Completed;
        assert_eq!(checkpoint_fields(&j, &[], 0.0), "last_checkpoint   -\n");
    }

    #[test]
    fn jobs_table_and_query() {
        let mut j = record(JobState::Failed, None, Some(1), None);
        j.user = Some("ann".into());
        j.origin_job_id = Some(101);
        j.submitted_at = 1_764_600_000.0;
        j.reason = "sbatch at alpha: error: Invalid\naccount".into();
        j.summary = "h100x8 60m".into();
        let t = jobs_table(&[j.clone()], 1_764_600_300.0, Zone(UtcOffset::UTC));
        let mut lines = t.lines();
        let header = lines.next().unwrap();
        assert!(
            header.starts_with("ID  USER  ORIGIN  ORIGIN_JOB  TARGET  REMOTE  STATE   EXIT  SUBMITTED(UTC)"),
            "{t}"
        );
        let row = lines.next().unwrap();
        let cells: Vec<&str> = row.split("  ").filter(|c| !c.is_empty()).map(str::trim).collect();
        assert_eq!(
            cells,
            [
                "j1",
                "ann",
                "beta",
                "101",
                "-",
                "-",
                "failed",
                "-",
                "2025-12-01 14:40:00",
                "5m",
                "h100x8 60m",
                "sbatch at alpha: error: Invalid account"
            ],
            "{t}"
        );
        let f = job_fields(&j, 1_764_600_300.0, Zone(UtcOffset::from_hms(1, 0, 0).unwrap()));
        assert!(f.contains("submitted_at      2025-12-01T15:40:00+01:00 (5m ago; 1764600000.000)"), "{f}");
        assert!(f.contains("exit              - (never ran; see reason)"), "{f}");
        assert!(f.contains("user              ann"), "{f}");
        assert!(f.contains("requeues          0\n") && !f.contains("requeued "), "{f}");
        j.requeues = 2;
        j.requeue_notes = vec![
            "Slurm at alpha re-ran it (epoch 1, at 1764600100): its stdout file restarted".into(),
            "Slurm at alpha re-ran it (epoch 1, at 1764600200): \x1b[2Jit went back to pending".into(),
        ];
        let f = job_fields(&j, 1_764_600_300.0, Zone(UtcOffset::UTC));
        assert!(f.contains("requeues          2\n"), "{f}");
        assert!(f.contains("requeued          Slurm at alpha re-ran it (epoch 1, at 1764600100): its stdout"), "{f}");
        assert!(f.contains("requeued          Slurm at alpha re-ran it (epoch 1, at 1764600200):  [2Jit went"), "{f}");

        let args = |extra: &[&str]| match Cli::try_parse_from(["fleetctl", "jobs"].iter().chain(extra)).unwrap().command
        {
            Command::Jobs(a) => a,
            c => panic!("{c:?}"),
        };
        let q = |extra: &[&str]| jobs_query(&args(extra), 1_000_000.0, Zone(UtcOffset::UTC)).map_err(|e| e.to_string());
        assert_eq!(q(&[]).unwrap(), "/v1/jobs?order=desc&limit=51&offset=0");
        assert_eq!(
            q(&["--user", "a b", "--cluster", "alpha", "--origin", "beta", "--origin-job", "7", "--since", "1h", "--state", "FAILED", "--finished", "--limit", "10", "--page", "3"]).unwrap(),
            "/v1/jobs?order=desc&state=failed&origin=beta&target=alpha&user=a%20b&origin_job=7&since=996400&active=false&limit=11&offset=20"
        );
        assert_eq!(q(&["--limit", "0", "--active"]).unwrap(), "/v1/jobs?order=desc&active=true");
        // The largest page asks for no more than the meta-scheduler serves.
        assert_eq!(q(&["--limit", "10000"]).unwrap(), "/v1/jobs?order=desc&limit=10000&offset=0");
        assert!(q(&["--limit", "0", "--page", "2"]).unwrap_err().contains("--page needs a --limit"));
        assert!(q(&["--state", "bogus"]).unwrap_err().contains("--state \"bogus\": unknown state"));
        assert!(q(&["--since", "soon"]).unwrap_err().contains("--since \"soon\""));
    }
}
