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
use fleet_api::api::{FleetView, JobRecord};
use fleet_api::JobState;
use serde::Deserialize;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Clusters: region, provider, health, heartbeat age, GPUs free/total per type, queue.
    Clusters,
    /// Forwarded jobs, oldest first.
    Jobs {
        /// Only jobs in this state (held, queued, assigned, pending, running,
        /// completed, failed, cancelled, lost).
        #[arg(long)]
        state: Option<String>,
        /// Only jobs submitted at this cluster.
        #[arg(long)]
        origin: Option<String>,
    },
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
    /// running interruptible jobs: from, to, remaining run, and the engine's
    /// USD figures (stay, move, migration cost, saving). Proposals only: the
    /// meta-scheduler does not move jobs yet. `--json` prints the reply.
    Rebalance,
    /// Replay a job trace over a fleet model with the placement engine (offline; no token needed).
    Simulate(Box<fleet_sim::cli::SimulateArgs>),
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
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Proposal {
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
            for cert in reqwest::Certificate::from_pem_bundle(&pem).with_context(|| format!("parsing the CA bundle {}", path.display()))? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().context("building the HTTP client")?;
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
                if c.healthy { "yes".into() } else { "no".into() },
                // A cluster never heard from has no scheduler name.
                if c.scheduler.is_empty() { "never".into() } else { age(c.heartbeat_age_s) },
                gpus,
                c.queue_pending.to_string(),
                c.queue_running.to_string(),
            ]
        })
        .collect();
    table(&["NAME", "REGION", "PROVIDER", "HEALTHY", "HEARTBEAT", "GPUS(free/total)", "PENDING", "RUNNING"], &rows)
}

fn jobs_table(jobs: &[JobRecord], now: f64) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                j.fleet_job_id.clone(),
                j.origin.clone(),
                j.target.clone().unwrap_or_else(|| "-".into()),
                j.state.to_string(),
                j.remote_job_id.map_or("-".into(), |i| i.to_string()),
                j.exit_code.map_or("-".into(), |c| c.to_string()),
                age(now - j.submitted_at),
                j.summary.clone(),
            ]
        })
        .collect();
    table(&["ID", "ORIGIN", "TARGET", "STATE", "REMOTE", "EXIT", "AGE", "REQUEST"], &rows)
}

fn job_fields(j: &JobRecord) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let fields: Vec<(&str, String)> = vec![
        ("fleet_job_id", j.fleet_job_id.clone()),
        ("state", j.state.to_string()),
        ("origin", j.origin.clone()),
        ("origin_job_id", opt(j.origin_job_id.map(|v| v.to_string()))),
        ("target", opt(j.target.clone())),
        ("remote_job_id", opt(j.remote_job_id.map(|v| v.to_string()))),
        ("exit_code", opt(j.exit_code.map(|v| v.to_string()))),
        ("signal", opt(j.signal.map(|v| v.to_string()))),
        ("cancel_requested", j.cancel_requested.to_string()),
        ("summary", j.summary.clone()),
        ("reason", j.reason.clone()),
        ("node_list", if j.node_list.is_empty() { "-".into() } else { j.node_list.clone() }),
        ("stdout_len", j.stdout_len.to_string()),
        ("stderr_len", j.stderr_len.to_string()),
        ("output_complete", j.output_complete.to_string()),
        ("submitted_at", format!("{:.3} ({} ago)", j.submitted_at, age(now() - j.submitted_at))),
        ("updated_at", format!("{:.3} ({} ago)", j.updated_at, age(now() - j.updated_at))),
    ];
    fields.into_iter().map(|(k, v)| format!("{k:<17} {v}\n")).collect()
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
    if r.proposals.is_empty() {
        return s;
    }
    let rows: Vec<Vec<String>> = r
        .proposals
        .iter()
        .map(|p| {
            vec![
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
    s.push_str(&table(&["JOB", "FROM", "TO", "POOL", "PRICING", "LEFT", "STAY$", "MOVE$", "MIGRATE$", "SAVING$"], &rows));
    s.push_str("proposals only: migrations are not carried out yet\n");
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

fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Simulate(args) = cli.command {
        return fleet_sim::cli::run(*args);
    }
    let client = Client::new(&cli)?;
    match &cli.command {
        Command::Simulate(_) => unreachable!("handled above"),
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
        Command::Rebalance => {
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
        Command::Jobs { state, origin } => {
            let mut q = Vec::new();
            if let Some(s) = state {
                let parsed: JobState = serde_json::from_value(serde_json::Value::String(s.to_ascii_lowercase()))
                    .map_err(|_| anyhow::anyhow!("unknown state {s:?} (held, queued, assigned, pending, running, completed, failed, cancelled, lost)"))?;
                q.push(format!("state={parsed}"));
            }
            if let Some(o) = origin {
                q.push(format!("origin={}", query_escape(o)));
            }
            let path = if q.is_empty() { "/v1/jobs".to_string() } else { format!("/v1/jobs?{}", q.join("&")) };
            let v = client.call(reqwest::Method::GET, &path)?;
            if cli.json {
                return print_json(&v);
            }
            let jobs: Vec<JobRecord> = serde_json::from_value(v).context("decoding the job list")?;
            print(&jobs_table(&jobs, now()))
        }
        Command::Job { id, action } => {
            let (method, path) = match (action, id) {
                (Some(JobAction::Cancel { id }), _) => {
                    (reqwest::Method::POST, format!("/v1/jobs/{}/cancel", query_escape(id)))
                }
                (Some(JobAction::Explain { id }), _) => {
                    (reqwest::Method::GET, format!("/v1/jobs/{}/explain", query_escape(id)))
                }
                (Some(JobAction::Signal { id, signal, scope }), _) => {
                    return job_signal(&client, cli.json, id, signal, scope);
                }
                (None, Some(id)) => (reqwest::Method::GET, format!("/v1/jobs/{}", query_escape(id))),
                (None, None) => bail!("missing job id"),
            };
            let v = client.call(method, &path)?;
            if cli.json {
                return print_json(&v);
            }
            match action {
                Some(JobAction::Signal { .. }) => unreachable!("answered above"),
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
                    print(&job_fields(&r))
                }
            }
        }
    }
}

/// `fleetctl job signal <id> <SIG> [--scope]`.
fn job_signal(client: &Client, json: bool, id: &str, signal: &str, scope: &str) -> anyhow::Result<()> {
    let req = signal_request(signal, scope)?;
    let path = format!("/v1/jobs/{}/signal", query_escape(id));
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
    let cli = Cli::parse(); // usage errors exit 2, --help/--version exit 0
    match run(cli) {
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
    fn parse_table() {
        check(&["clusters"], "Clusters");
        check(&["jobs", "--state", "running"], "Jobs { state: Some(\"running\")");
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
        check(&["rebalance"], "Rebalance");
        check(&["rebalance", "--json"], "Rebalance");
        check(&["rebalance", "x"], "error 2");
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
        let r = Rebalance { reason: Some("off".into()), ..Default::default() };
        assert_eq!(rebalance_text(&r, 0.0), "off\n");
        let r = Rebalance {
            policy: "cost".into(),
            computed_at: Some(100.0),
            considered: 1,
            proposals: vec![Proposal {
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
        assert!(t.starts_with("pass 5s ago, policy cost: 1 running interruptible job(s) considered, 1 proposal(s)\n"), "{t}");
        assert!(t.contains("j1   a     b"), "{t}");
        assert!(t.contains("12.35"), "{t}");
        assert!(t.ends_with("proposals only: migrations are not carried out yet\n"), "{t}");
    }
}
