//! `fleet-proxy`: the body of a forwarded job's stand-in at the origin.
//!
//! Slurm starts the stand-in when the origin's own dependencies, holds and
//! begin time allow; the proxy then releases the real job
//! (`POST /v1/jobs/{id}/start` with its Slurm job id; the job stays held
//! until the origin agent confirms in Slurm that this stand-in runs, so
//! the job token alone starts nothing), waits while the meta-scheduler places it
//! and the target cluster runs it, copies the job's stdout/stderr byte for
//! byte to its own stdout/stderr (which Slurm connected to the user's
//! output files), keeps the stand-in's Slurm comment pointing at where the
//! job runs, and finally exits with the remote job's exit code.
//!
//! Exit status:
//! * the remote job's exit code when it completed or failed;
//! * 128+S when the remote job was ended by signal S (a line on stderr says so);
//! * 143 when the stand-in itself was cancelled (SIGTERM, which is what
//!   `scancel` and a time limit send): the proxy asks the meta-scheduler to
//!   cancel the remote job first;
//! * 1 when the job could not be placed anywhere or was lost (the reason
//!   is printed on stderr);
//! * 2 for bad arguments.
//!
//! The proxy never gives up while the meta-scheduler is unreachable: it
//! retries with a capped backoff, and since output is fetched by offset no
//! byte is lost or repeated. Its own stderr is the user's stderr file, so
//! it stays silent about outages shorter than `--report-outage-after-s`
//! (30 s): a meta-scheduler restart leaves the job's output byte for byte
//! what the job wrote. A refused job token (HTTP 401/403) is permanent:
//! the proxy says so and exits 1.
//!
//! Every other signal the stand-in can catch (`USR1`, `USR2`, `HUP`, `INT`,
//! `QUIT`, `ALRM`, `TSTP`, `CONT`, ...: [`FORWARDED`]) is forwarded to the
//! remote job (`POST /v1/jobs/{id}/signal`, delivered by the target's agent
//! with `scancel --signal --full`) and never ends or stops the proxy; see
//! [`forward_signals`] for what reaches the remote job and why.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use fleet_api::api::{JobRecord, SignalRequest, SignalScope, StartRequest, Stream};
use fleet_api::wire::{DeferredReply, DeferredRequest};
use fleet_api::{auth, JobState};

mod mail;
mod oom;

/// Relay a forwarded Fleet job: start it, stream its output, exit with its
/// exit code (128+S if it was killed by signal S, 143 if this stand-in was
/// cancelled, 1 if it could not be placed).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Fleet job id of the forwarded job (not with --deferred).
    #[arg(long, env = "FLEET_JOB_ID", required_unless_present = "deferred")]
    job: Option<String>,
    /// A deferred stand-in: ask the site agent (--agent-socket) to forward
    /// this job first; it reads the job's request from Slurm and answers
    /// with the fleet job id and token. Waits while the agent is down.
    #[arg(long, requires = "agent_socket")]
    deferred: bool,
    /// The agent's socket for deferred stand-ins (`AgentSpoolDir/deferred.sock`).
    #[arg(long)]
    agent_socket: Option<PathBuf>,
    /// Base URL of fleet-metasched, e.g. http://metasched:16900.
    #[arg(long, env = "FLEET_URL")]
    url: String,
    /// Job token (hex HMAC minted by the origin agent).
    #[arg(long, env = "FLEET_JOB_TOKEN", conflicts_with = "token_file")]
    token: Option<String>,
    /// File holding the job token (whitespace trimmed), instead of --token.
    #[arg(long, env = "FLEET_JOB_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// PEM bundle of the CA(s) trusted for an https --url (besides the
    /// system's roots).
    #[arg(long, env = "FLEET_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Poll interval in milliseconds while the job waits or runs.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    poll_ms: u64,
    /// Directory holding `scontrol` (to update the stand-in's comment).
    #[arg(long, env = "FLEET_SLURM_BIN_DIR", default_value = "/usr/bin")]
    slurm_bin_dir: PathBuf,
    /// Mails to send to the job's user (through Slurm's MailProg) when
    /// Slurm would for the job itself, `--mail-type` names: BEGIN when it
    /// starts at its target, TIME_LIMIT_50/80/90 at that share of its run
    /// there of its limit there (as the target reports it; until then
    /// --time-limit-min). The plugin sets it when it took them out of the
    /// stand-in's own mail type (`fleet_api::sbatch::proxy_mail_bits`).
    #[arg(long, value_parser = parse_mail_type)]
    mail_type: Option<u16>,
    /// The job's time limit in minutes (its --time), for TIME_LIMIT_50/80/90
    /// until its target reports the run's limit.
    #[arg(long)]
    time_limit_min: Option<u32>,
    /// Write a line to the job's stderr about a meta-scheduler outage only
    /// once it has lasted this many seconds (and then about its end).
    #[arg(long, env = "FLEET_PROXY_REPORT_OUTAGE_AFTER_S", default_value_t = 30)]
    report_outage_after_s: u64,
}

/// Longest wait between retries while the meta-scheduler is unreachable.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Bytes asked for per output request.
const READ_CHUNK: u64 = 1 << 20;
/// After SIGTERM: how long to retry the cancel, and how long to keep
/// relaying output (Slurm's KillWait is 5 s before SIGKILL).
const CANCEL_RETRY: Duration = Duration::from_millis(2500);
const RELAY_AFTER_CANCEL: Duration = Duration::from_millis(3500);
/// How long a signal's forwarding is retried (meta-scheduler unreachable,
/// or the job not yet submitted at its target) before it is reported.
const SIGNAL_RETRY: Duration = Duration::from_secs(5);

/// Signals forwarded to the remote job, with their names as
/// `scancel --signal` takes them. SIGTERM is not among them: it cancels
/// (see the exit status above); SIGKILL and SIGSTOP cannot be caught.
const FORWARDED: &[(libc::c_int, &str)] = &[
    (libc::SIGUSR1, "USR1"),
    (libc::SIGUSR2, "USR2"),
    (libc::SIGHUP, "HUP"),
    (libc::SIGINT, "INT"),
    (libc::SIGQUIT, "QUIT"),
    (libc::SIGALRM, "ALRM"),
    (libc::SIGCONT, "CONT"),
    (libc::SIGWINCH, "WINCH"),
    (libc::SIGURG, "URG"),
    (libc::SIGTTIN, "TTIN"),
    (libc::SIGTTOU, "TTOU"),
    (libc::SIGXCPU, "XCPU"),
    (libc::SIGXFSZ, "XFSZ"),
    (libc::SIGVTALRM, "VTALRM"),
    (libc::SIGPROF, "PROF"),
    #[cfg(any(target_os = "linux", target_os = "android"))]
    (libc::SIGPWR, "PWR"),
];

/// Caught and not forwarded. Slurm 22.05 suspends a job (`scontrol
/// suspend`) with SIGTSTP and at once SIGSTOP, and the stopped proxy only
/// sees the TSTP after the resume's SIGCONT (observed in the lab): passed
/// on then, it would stop the remote job just after it was continued. The
/// suspension itself reaches the remote job through the origin agent,
/// which sees the stand-in `SUSPENDED` and sends `STOP`; the resume's
/// SIGCONT is forwarded by the proxy.
const SWALLOWED: &[libc::c_int] = &[libc::SIGTSTP];

/// The remote job's Slurm end states that Fleet keeps by name (they are
/// the first word of the record's reason, `TIMEOUT at alpha: ...`).
const REMOTE_ENDS: &[&str] = &["TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"];

/// How the remote job ended when Slurm there named it specially
/// (`TIMEOUT`, `OUT_OF_MEMORY`, ...), from a terminal record.
fn remote_end(r: &JobRecord) -> Option<&'static str> {
    if !r.state.is_terminal() {
        return None;
    }
    let first = r.reason.split([' ', ':']).next()?;
    REMOTE_ENDS.iter().copied().find(|s| *s == first)
}

fn forwarded_name(sig: libc::c_int) -> Option<&'static str> {
    FORWARDED.iter().find(|(s, _)| *s == sig).map(|(_, n)| *n)
}

fn diag(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr().lock(), "fleet-proxy: {msg}");
}

#[derive(Clone)]
struct Api {
    http: reqwest::blocking::Client,
    base: String,
    job: String,
    auth: String,
}

/// Failure of one call: retried by the caller unless it is permanent.
#[derive(Debug)]
enum CallError {
    /// No answer (connection refused, timeout, 5xx).
    Transient(String),
    /// The meta-scheduler answered with a 4xx.
    Status(u16, String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transient(m) => write!(f, "{m}"),
            CallError::Status(s, m) => write!(f, "HTTP {s}: {m}"),
        }
    }
}

impl Api {
    fn send(&self, req: reqwest::blocking::RequestBuilder) -> Result<reqwest::blocking::Response, CallError> {
        let resp = req
            .header("Authorization", &self.auth)
            .send()
            .map_err(|e| CallError::Transient(format!("{}: {e}", self.base)))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().unwrap_or_default();
        let msg = serde_json::from_str::<fleet_api::api::ApiError>(&text).map(|e| e.error).unwrap_or(text);
        if status.is_server_error() {
            Err(CallError::Transient(format!("HTTP {}: {msg}", status.as_u16())))
        } else {
            Err(CallError::Status(status.as_u16(), msg))
        }
    }

    fn record(resp: reqwest::blocking::Response) -> Result<JobRecord, CallError> {
        resp.json().map_err(|e| CallError::Transient(format!("bad job record: {e}")))
    }

    fn start(&self, origin_job_id: u64, restart: u32) -> Result<JobRecord, CallError> {
        let url = format!("{}/v1/jobs/{}/start", self.base, self.job);
        Self::record(self.send(self.http.post(url).json(&StartRequest { origin_job_id, restart }))?)
    }

    fn get(&self) -> Result<JobRecord, CallError> {
        Self::record(self.send(self.http.get(format!("{}/v1/jobs/{}", self.base, self.job)))?)
    }

    fn cancel(&self, timeout: Duration) -> Result<JobRecord, CallError> {
        let url = format!("{}/v1/jobs/{}/cancel", self.base, self.job);
        Self::record(self.send(self.http.post(url).timeout(timeout))?)
    }

    fn signal(&self, signal: &str, scope: SignalScope, timeout: Duration) -> Result<JobRecord, CallError> {
        let url = format!("{}/v1/jobs/{}/signal", self.base, self.job);
        let body = SignalRequest { signal: signal.to_string(), scope };
        Self::record(self.send(self.http.post(url).json(&body).timeout(timeout))?)
    }

    fn output(&self, stream: Stream, offset: u64) -> Result<Vec<u8>, CallError> {
        let url = format!(
            "{}/v1/jobs/{}/output?stream={}&offset={offset}&max={READ_CHUNK}",
            self.base,
            self.job,
            stream.as_str()
        );
        let resp = self.send(self.http.get(url))?;
        resp.bytes().map(|b| b.to_vec()).map_err(|e| CallError::Transient(format!("reading output: {e}")))
    }
}

/// Capped exponential backoff. An outage is reported (once per distinct
/// error, then its end) only when it has lasted `report_after`: the
/// proxy's stderr is the user's, and a short blip is not the user's news.
struct Backoff {
    base: Duration,
    cur: Duration,
    report_after: Duration,
    failing_since: Option<Instant>,
    reported: bool,
    last_msg: String,
}

impl Backoff {
    fn new(base: Duration, report_after: Duration) -> Backoff {
        Backoff { base, cur: base, report_after, failing_since: None, reported: false, last_msg: String::new() }
    }

    /// A call succeeded; returns the line to report, if any.
    fn ok(&mut self, now: Instant) -> Option<String> {
        let since = self.failing_since.take();
        self.cur = self.base;
        self.last_msg.clear();
        let reported = std::mem::take(&mut self.reported);
        since
            .filter(|_| reported)
            .map(|t| format!("meta-scheduler reachable again after {:.1}s", (now - t).as_secs_f64()))
    }

    /// Record a failure; returns how long to wait and the line to report, if any.
    fn fail(&mut self, what: &str, e: &CallError, now: Instant) -> (Duration, Option<String>) {
        let since = *self.failing_since.get_or_insert(now);
        let wait = self.cur;
        self.cur = (self.cur * 2).min(MAX_BACKOFF);
        let msg = format!("{what}: {e}");
        if now - since < self.report_after || msg == self.last_msg {
            return (wait, None);
        }
        self.last_msg = msg;
        self.reported = true;
        (wait, Some(format!("{} (failing for {:.0}s, retrying)", self.last_msg, (now - since).as_secs_f64())))
    }
}

/// Report a successful call to the backoff.
fn succeeded(backoff: &mut Backoff) {
    if let Some(line) = backoff.ok(Instant::now()) {
        diag(line);
    }
}

/// Report a failed call: a refused token ends the proxy, anything else is
/// waited out.
fn failed(backoff: &mut Backoff, what: &str, e: &CallError, term: &AtomicBool) -> anyhow::Result<()> {
    if let CallError::Status(s @ (401 | 403), m) = e {
        bail!("{what}: the meta-scheduler refused this job's token (HTTP {s}: {m})");
    }
    let (wait, line) = backoff.fail(what, e, Instant::now());
    if let Some(line) = line {
        diag(line);
    }
    nap(wait, term);
    Ok(())
}

/// Keeps the stand-in's Slurm comment in step with where the job runs —
/// unless the user gave the job a comment of their own, which stays theirs
/// (Fleet's tag lives in `AdminComment`).
struct Comment {
    scontrol: PathBuf,
    slurm_job_id: Option<String>,
    last: String,
    warned: bool,
    /// The user's own comment is set: never overwrite it.
    users: bool,
}

impl Comment {
    /// Reads the stand-in's comment once (`squeue -o %k`, which prints it
    /// alone) to learn whether the user set one.
    fn new(bin: &std::path::Path, slurm_job_id: Option<String>) -> Comment {
        let users = slurm_job_id.as_deref().is_some_and(|id| {
            Command::new(bin.join("squeue"))
                .args(["-h", "-j", id, "-o", "%k"])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .map(|o| {
                    let c = String::from_utf8_lossy(&o.stdout);
                    let c = c.trim();
                    !(c.is_empty() || c == "(null)" || c.starts_with("fleet: "))
                })
                .unwrap_or(false)
        });
        Comment { scontrol: bin.join("scontrol"), slurm_job_id, last: String::new(), warned: false, users }
    }

    fn update(&mut self, r: &JobRecord) {
        let Some(id) = self.slurm_job_id.clone().filter(|_| !self.users) else { return };
        let text = comment_text(r);
        if text == self.last {
            return;
        }
        self.last = text.clone();
        if let Err(e) = run_with_timeout(
            Command::new(&self.scontrol).arg("update").arg(format!("JobId={id}")).arg(format!("Comment={text}")),
            Duration::from_secs(5),
        ) {
            if !self.warned {
                diag(format_args!("cannot update the job comment with {}: {e:#}", self.scontrol.display()));
                self.warned = true;
            }
        }
    }
}

/// The stand-in's comment for record `r`: where the job is and its state,
/// and while it waits at its target why it waits there (its scheduler's
/// reason: `Resources`, or Kubernetes' `Unschedulable: 0/3 nodes are
/// available: ...`), without control characters, at most 200 characters.
fn comment_text(r: &JobRecord) -> String {
    let mut text = format!(
        "fleet: {} job {} {}",
        r.target.as_deref().unwrap_or("-"),
        r.remote_job_id.map_or("-".to_string(), |i| i.to_string()),
        remote_end(r).unwrap_or(r.state.as_str())
    );
    let why: String = r.reason.chars().filter(|c| !c.is_control()).take(200).collect();
    if r.state == JobState::Pending && !why.trim().is_empty() && why != "None" {
        text.push_str(": ");
        text.push_str(why.trim());
    }
    text
}

fn run_with_timeout(cmd: &mut Command, limit: Duration) -> anyhow::Result<()> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            bail!("exited with {status}");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("timed out after {}s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sleep up to `d`, waking early when a termination signal arrives.
fn nap(d: Duration, term: &AtomicBool) {
    let end = Instant::now() + d;
    while !term.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

/// Output relayed so far.
struct Relay {
    out: u64,
    err: u64,
    write_warned: bool,
}

impl Relay {
    /// Fetch and copy everything available; `Ok(())` when both streams
    /// were read up to what the meta-scheduler holds right now.
    fn pump(&mut self, api: &Api) -> Result<(), CallError> {
        for stream in [Stream::Stdout, Stream::Stderr] {
            loop {
                let offset = match stream {
                    Stream::Stdout => self.out,
                    Stream::Stderr => self.err,
                };
                let bytes = api.output(stream, offset)?;
                if bytes.is_empty() {
                    break;
                }
                let res = match stream {
                    Stream::Stdout => {
                        let mut o = std::io::stdout().lock();
                        o.write_all(&bytes).and_then(|_| o.flush())
                    }
                    Stream::Stderr => {
                        let mut o = std::io::stderr().lock();
                        o.write_all(&bytes).and_then(|_| o.flush())
                    }
                };
                if let Err(e) = res {
                    if !self.write_warned {
                        diag(format_args!("cannot write {}: {e}", stream.as_str()));
                        self.write_warned = true;
                    }
                }
                match stream {
                    Stream::Stdout => self.out += bytes.len() as u64,
                    Stream::Stderr => self.err += bytes.len() as u64,
                }
                if (bytes.len() as u64) < READ_CHUNK {
                    break;
                }
            }
        }
        Ok(())
    }

    fn done(&self, r: &JobRecord) -> bool {
        r.state.is_terminal() && r.output_complete && self.out >= r.stdout_len && self.err >= r.stderr_len
    }
}

/// Whether Slurm requeued the stand-in (`scontrol requeue`, or its own
/// requeue after a node failure): it counts the restart before it sends
/// SIGTERM (observed with 22.05: `Restarts=1` while the job is
/// `COMPLETING`), so a count above ours means this SIGTERM is a requeue.
fn requeued(bin: &std::path::Path, slurm_job_id: Option<&str>, restart: u32) -> bool {
    let Some(id) = slurm_job_id else { return false };
    let out = Command::new(bin.join("squeue"))
        .args(["-h", "-j", id, "-O", "RestartCnt"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    out.ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<u32>().ok()).is_some_and(|n| n > restart)
}

/// The remote job reached its time limit: let Slurm end the stand-in
/// `TIMEOUT` too, as it would a native job, by lowering the stand-in's
/// own limit to what it has run (a user may lower a limit) and waiting
/// for the SIGTERM of slurmctld's next limit pass (every 30 s in 22.05).
/// Then the proxy ends as an untrapped batch shell would, by SIGTERM.
/// Falls back to the usual exit status when the limit cannot be set.
fn time_out_here(bin: &std::path::Path, slurm_job_id: Option<&str>, started: Instant, term: &AtomicBool) {
    let Some(id) = slurm_job_id else { return };
    // Whole minutes only, and never 0 (which means no limit). The stand-in
    // started before the remote job, which ran at least its own limit of
    // one minute or more, so this is at most what Slurm counts.
    let minutes = (started.elapsed().as_secs() / 60).max(1);
    let set = run_with_timeout(
        Command::new(bin.join("scontrol")).arg("update").arg(format!("JobId={id}")).arg(format!("TimeLimit={minutes}")),
        Duration::from_secs(5),
    );
    if let Err(e) = set {
        diag(format_args!("cannot end this job TIMEOUT like its remote job (scontrol update TimeLimit): {e:#}"));
        return;
    }
    nap(Duration::from_secs(150), term);
    if term.load(Ordering::Relaxed) {
        let _ = signal_hook::low_level::emulate_default_handler(libc::SIGTERM);
    }
}

/// The job was cancelled elsewhere (by an admin at its target, with
/// `fleetctl cancel`, or by the origin agent for an orphan): end the
/// stand-in `CANCELLED` too, as Slurm shows a cancelled native job, by
/// cancelling it (a user may cancel their own job) and dying of the
/// SIGTERM Slurm then sends, as an untrapped batch shell would. Falls back
/// to the usual exit status when the cancel fails.
fn cancel_here(bin: &std::path::Path, slurm_job_id: Option<&str>, term: &AtomicBool) {
    let Some(id) = slurm_job_id else { return };
    if let Err(e) = run_with_timeout(Command::new(bin.join("scancel")).arg(id), Duration::from_secs(5)) {
        diag(format_args!("cannot end this job CANCELLED like its remote job (scancel): {e:#}"));
        return;
    }
    nap(Duration::from_secs(30), term);
    if term.load(Ordering::Relaxed) {
        let _ = signal_hook::low_level::emulate_default_handler(libc::SIGTERM);
    }
}

/// The exit status that stands for the finished remote job.
fn exit_status(r: &JobRecord) -> u8 {
    if let Some(s) = r.signal.filter(|s| *s > 0) {
        // Slurm's own ends (OUT_OF_MEMORY is "signal" 125 there) by name.
        match remote_end(r) {
            Some(_) => diag(format_args!("job failed: {} (remote job {})", r.reason, fmt_remote(r))),
            None => diag(format_args!("remote job {} at {} ended by signal {s}", fmt_remote(r), fmt_target(r))),
        }
        return (128 + s).clamp(0, 255) as u8;
    }
    match r.state {
        JobState::Completed | JobState::Failed if r.exit_code.is_some() => {
            let code = r.exit_code.unwrap_or(1);
            // A plain non-zero exit speaks for itself (ExitCode at the
            // origin); other failures (timeout, node failure) are explained.
            if r.state == JobState::Failed && !r.reason.is_empty() && r.reason != "NonZeroExitCode" {
                diag(format_args!("job failed: {}", r.reason));
            }
            if r.state == JobState::Failed && code == 0 {
                return 1;
            }
            code.clamp(0, 255) as u8
        }
        JobState::Completed => 0,
        JobState::Cancelled => {
            diag(format_args!("job was cancelled ({})", r.reason));
            143
        }
        JobState::Lost => {
            diag(format_args!("the target cluster lost track of the job: {}", r.reason));
            1
        }
        _ => {
            diag(format_args!("job failed: {}", r.reason));
            1
        }
    }
}

fn fmt_remote(r: &JobRecord) -> String {
    r.remote_job_id.map_or("-".into(), |i| i.to_string())
}

fn fmt_target(r: &JobRecord) -> String {
    r.target.clone().unwrap_or_else(|| "-".into())
}

fn run(mut args: Args) -> anyhow::Result<u8> {
    let term = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, term.clone()).context("installing signal handlers")?;
    // Installed before the first request: from here on no forwarded signal
    // ends or stops the proxy, even while the client is being built.
    let signals =
        signal_hook::iterator::Signals::new(FORWARDED.iter().map(|(s, _)| *s).chain(SWALLOWED.iter().copied()))
            .context("installing signal handlers")?;
    if args.deferred {
        let socket = args.agent_socket.clone().context("--deferred needs --agent-socket")?;
        let report_after = Duration::from_secs(args.report_outage_after_s);
        match ask_agent(&socket, &term, report_after)? {
            Some((job, token)) => {
                args.job = Some(job);
                args.token = Some(token);
            }
            // Cancelled before the job was forwarded: nothing runs anywhere.
            None => {
                diag("cancelled before the job was forwarded");
                return Ok(143);
            }
        }
    }
    let job = args.job.clone().context("a fleet job id is required (--job, FLEET_JOB_ID)")?;
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => t.trim().to_string(),
        (None, Some(p)) => std::fs::read_to_string(p)
            .with_context(|| format!("reading the job token from {}", p.display()))?
            .trim()
            .to_string(),
        (None, None) => bail!("a job token is required (--token, --token-file, FLEET_JOB_TOKEN)"),
    };
    if token.is_empty() {
        bail!("the job token is empty");
    }
    let started = Instant::now();
    let mut builder =
        reqwest::blocking::Client::builder().connect_timeout(Duration::from_secs(3)).timeout(Duration::from_secs(30));
    if let Some(path) = &args.ca_file {
        let pem = fleet_api::client::read_ca_bundle(path).map_err(anyhow::Error::msg)?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("parsing the CA bundle {}", path.display()))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    let http = builder.build().context("building the HTTP client")?;
    let api = Api {
        http,
        base: args.url.trim_end_matches('/').to_string(),
        job,
        auth: format!("{} {token}", auth::JOB_TOKEN_SCHEME),
    };
    {
        let (api, term) = (api.clone(), term.clone());
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || forward_signals(signals, &api, &term))
            .context("starting the signal forwarder")?;
    }
    let slurm_job_id = std::env::var("SLURM_JOB_ID").ok().and_then(|s| s.trim().parse::<u64>().ok());
    // Above 0 after Slurm requeued the stand-in: the start asks for a rerun.
    let restart = std::env::var("SLURM_RESTART_COUNT").ok().and_then(|s| s.trim().parse::<u32>().ok()).unwrap_or(0);
    // How Slurm commands name this stand-in: an array element as
    // `<array id>_<task>` (its own id would name the whole array when it is
    // the array's last element).
    let job_spec = slurm_job_id.map(|id| {
        let var = |n: &str| std::env::var(n).ok().and_then(|v| v.trim().parse::<u64>().ok());
        match (var("SLURM_ARRAY_JOB_ID"), var("SLURM_ARRAY_TASK_ID")) {
            (Some(a), Some(t)) => format!("{a}_{t}"),
            _ => id.to_string(),
        }
    });
    let mut comment = Comment::new(&args.slurm_bin_dir, job_spec.clone());
    let poll = Duration::from_millis(args.poll_ms);
    let mut backoff = Backoff::new(poll, Duration::from_secs(args.report_outage_after_s));
    let mut relay = Relay { out: 0, err: 0, write_warned: false };

    // Release the job. A 404 means the origin agent has not forwarded it
    // yet (it does so asynchronously): wait for it like for an outage.
    let mut record = loop {
        if term.load(Ordering::Relaxed) {
            return Ok(cancel_and_drain(&api, &mut relay));
        }
        match api.start(slurm_job_id.unwrap_or(0), restart) {
            Ok(r) => {
                succeeded(&mut backoff);
                break r;
            }
            // Permanent (no Slurm job id to check, for one): say why.
            Err(CallError::Status(400, m)) => {
                bail!("starting the job: the meta-scheduler refused it (HTTP 400: {m})")
            }
            Err(e) => failed(&mut backoff, "starting the job", &e, &term)?,
        }
    };
    // A rerun is ours once the meta-scheduler took it (`origin_restart`):
    // until then the record is the earlier run's, whose output and end are
    // not this run's (the origin agent may refuse it at first, before Slurm
    // shows this stand-in running; the job is then as it was).
    let mut rerun_taken = false;
    let mut mailer = mail::Mailer::new(args.mail_type.unwrap_or(0), args.time_limit_min);
    // The stand-in's own limit (its user may lower it), looked at every 30 s
    // while a time-limit mail is to come, as Slurm looks at limits.
    let mut own_limit: (Option<u32>, Option<Instant>) = (None, None);
    let mut mails_on_the_way = Vec::new();
    loop {
        let ours = restart == 0 || record.origin_restart >= restart;
        if ours && restart > 0 && !rerun_taken {
            // A rerun: this run's output begins where the earlier runs' ends;
            // Slurm opened our files per the job's --open-mode, as natively.
            relay.out = record.stdout_base;
            relay.err = record.stderr_base;
            rerun_taken = true;
        }
        comment.update(&record);
        if ours {
            if mailer.waits_on_the_limit() && own_limit.1.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                if let Some(id) = slurm_job_id {
                    let job = mail::stand_in(&args.slurm_bin_dir, id).unwrap_or_default();
                    own_limit = (mail::limit_minutes(&job["time_limit"]), Some(Instant::now()));
                }
            }
            for due in mailer.due(has_started(&record), Instant::now(), record.time_limit_min, own_limit.0) {
                mails_on_the_way.extend(send_mail(&args.slurm_bin_dir, slurm_job_id, due, record.submitted_at));
            }
        }
        if term.load(Ordering::Relaxed) {
            if requeued(&args.slurm_bin_dir, job_spec.as_deref(), restart) {
                diag("the job was requeued: cancelling its remote run; it runs again when this job restarts");
            }
            return Ok(cancel_and_drain(&api, &mut relay));
        }
        let pumped = if ours { relay.pump(&api) } else { Ok(()) };
        match pumped {
            Ok(()) if ours && relay.done(&record) => {
                // A job that ended before it was seen running is mailed
                // BEGIN just now: let that mail go before this job ends.
                join_within(mails_on_the_way, Duration::from_secs(10));
                if remote_end(&record) == Some("TIMEOUT") {
                    time_out_here(&args.slurm_bin_dir, job_spec.as_deref(), started, &term);
                }
                let status = exit_status(&record);
                if record.state == JobState::Cancelled {
                    cancel_here(&args.slurm_bin_dir, job_spec.as_deref(), &term);
                }
                if remote_end(&record) == Some("OUT_OF_MEMORY") {
                    if let Err(e) = oom::out_of_memory_here() {
                        diag(format_args!("cannot end this job OUT_OF_MEMORY like its remote job: {e}"));
                    }
                }
                return Ok(status);
            }
            Ok(()) => {
                succeeded(&mut backoff);
                nap(poll, &term);
            }
            Err(e) => failed(&mut backoff, "fetching output", &e, &term)?,
        }
        match api.get() {
            Ok(r) => {
                succeeded(&mut backoff);
                record = r;
            }
            Err(e) => failed(&mut backoff, "polling the job", &e, &term)?,
        }
        // Still held without a start request: the origin agent refused
        // one (not ours, or before Slurm showed this stand-in running).
        // Ask again; the agent checks again.
        let refused = record.state == JobState::Held || record.origin_restart < restart;
        if refused && record.start_requested_at.is_none() {
            match api.start(slurm_job_id.unwrap_or(0), restart) {
                Ok(r) => {
                    succeeded(&mut backoff);
                    record = r;
                }
                Err(e) => failed(&mut backoff, "starting the job", &e, &term)?,
            }
        }
    }
}

/// Whether the job has started at its target: running, or ended after it
/// ran there (a node list); not one that ended before it started.
fn has_started(r: &JobRecord) -> bool {
    r.state == JobState::Running || (r.state.is_terminal() && !r.node_list.is_empty())
}

/// `--mail-type`'s names as `MAIL_JOB_*` bits.
fn parse_mail_type(names: &str) -> Result<u16, String> {
    let bits = fleet_api::sbatch::mail_type_bits(names);
    if fleet_api::sbatch::mail_type_names(bits).map(|n| n.split(',').count()) != Some(names.split(',').count()) {
        return Err(format!("{names:?}: expected --mail-type names (BEGIN, TIME_LIMIT_50, ...)"));
    }
    Ok(bits)
}

/// One of the proxy's mails (see `mail`), sent beside the relay, which it
/// must not hold up: MailProg may take its time.
fn send_mail(
    bin_dir: &std::path::Path,
    job_id: Option<u64>,
    due: mail::Due,
    submitted_at: f64,
) -> Option<std::thread::JoinHandle<()>> {
    let id = job_id?;
    let bin_dir = bin_dir.to_path_buf();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let spawned = std::thread::Builder::new().name("mail".into()).spawn(move || {
        if let Err(e) = mail::send(&bin_dir, id, due, now, submitted_at as i64) {
            diag(format_args!("the job's mail ({due:?}) was not sent: {e}"));
        }
    });
    spawned.map_err(|e| diag(format_args!("the job's mail ({due:?}) was not sent: {e}"))).ok()
}

/// Waits, at most `wait` in all, for `threads` to end; those still going
/// are left (they end with the process).
fn join_within(threads: Vec<std::thread::JoinHandle<()>>, wait: Duration) {
    let deadline = Instant::now() + wait;
    for t in threads {
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

/// One request on the agent's deferred socket.
fn deferred_round_trip(socket: &std::path::Path, req: &DeferredRequest) -> Result<DeferredReply, String> {
    use std::io::{BufRead, BufReader, Read as _};
    let mut s = std::os::unix::net::UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    // The agent asks Slurm twice (queue, script): seconds at most.
    s.set_read_timeout(Some(Duration::from_secs(40))).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    let line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    s.write_all(format!("{line}\n").as_bytes()).map_err(|e| format!("writing to the agent: {e}"))?;
    let mut reply = Vec::new();
    BufReader::new(s.take(fleet_api::wire::MAX_REPLY_BYTES as u64))
        .read_until(b'\n', &mut reply)
        .map_err(|e| format!("reading the agent's answer: {e}"))?;
    serde_json::from_slice(&reply).map_err(|e| format!("the agent's answer does not parse: {e}"))
}

/// A deferred stand-in: have the site agent forward this job (it reads the
/// request from Slurm), waiting while the agent is down or busy. Returns
/// the fleet job id and token; `None` when cancelled first. A refusal is
/// permanent (exit 1 with the agent's reason).
fn ask_agent(
    socket: &std::path::Path,
    term: &AtomicBool,
    report_after: Duration,
) -> anyhow::Result<Option<(String, String)>> {
    let slurm_job_id = std::env::var("SLURM_JOB_ID")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .context("--deferred runs as a Slurm job: SLURM_JOB_ID is not set")?;
    let env: Vec<String> = std::env::vars()
        .filter(|(k, _)| fleet_api::deferred::ARRAY_VARS.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let req = DeferredRequest { v: fleet_api::wire::WIRE_VERSION, slurm_job_id, env };
    let t0 = Instant::now();
    let mut wait = Duration::from_millis(250);
    let mut said = String::new();
    loop {
        if term.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let why = match deferred_round_trip(socket, &req) {
            Ok(DeferredReply::Forwarded { fleet_job_id, token }) => {
                if !said.is_empty() {
                    diag(format_args!("the site agent forwarded this job as {fleet_job_id}"));
                }
                return Ok(Some((fleet_job_id, token)));
            }
            Ok(DeferredReply::Refused { message }) => bail!("the site agent refused to forward this job: {message}"),
            Ok(DeferredReply::Retry { message }) => message,
            Err(e) => format!("the site agent is not answering ({e})"),
        };
        if t0.elapsed() >= report_after && why != said {
            diag(format_args!("waiting for the site agent to forward this job: {why}; retrying (scancel cancels it)"));
            said = why;
        }
        nap(wait, term);
        wait = (wait * 2).min(MAX_BACKOFF);
    }
}

/// Forward every signal of [`FORWARDED`] the stand-in receives to the
/// remote job, in the order they arrive (one still waiting is not queued
/// twice, as for any Unix process), until the process exits.
///
/// Which `scancel` at the origin reaches the remote job (Slurm 22.05,
/// `scancel(1)`): the stand-in is a batch job whose batch step is this
/// process (`exec fleet-proxy`) and which has no other step.
/// * `scancel --batch --signal=S` and `scancel --full --signal=S` signal the
///   batch step, so they reach the proxy and S is forwarded.
/// * `scancel --signal=S` without either flag signals only the job's steps
///   ("by default, signals other than SIGKILL are not sent to the batch
///   step"); the stand-in has none, so nothing reaches the proxy and
///   nothing is forwarded. `fleetctl job signal <id> S --scope steps`
///   delivers it to the remote job's steps instead.
/// * `scancel` without `--signal` (and a time limit) sends SIGCONT then
///   SIGTERM: the CONT is forwarded (harmless to a running job) and the
///   TERM cancels the remote job.
///
/// Every signal is forwarded with scope `full` (`scancel --full` at the
/// target): the proxy receives the same signal for `-b` and `--full` and
/// cannot tell which was used, and `full` reaches everything either would
/// have reached natively (the batch shell, its children, its steps), so a
/// script that traps the signal sees it whichever form the user chose. The
/// cost: after `-b`, the shell's children and steps receive it too; a
/// child that neither catches nor ignores the signal (for USR1 the default
/// action is to terminate) ends, where natively only the shell would have
/// seen it.
///
/// A forwarding that fails is retried for [`SIGNAL_RETRY`] (an outage, or
/// a job not yet submitted at its target), then reported on the job's
/// stderr, once per signal and reason until a forwarding succeeds again.
/// Nothing is reported once the stand-in is being cancelled.
fn forward_signals(mut signals: signal_hook::iterator::Signals, api: &Api, term: &AtomicBool) {
    let mut reported: Vec<(&'static str, String)> = Vec::new();
    for sig in signals.forever() {
        let Some(name) = forwarded_name(sig) else { continue };
        match forward_signal(api, name, term) {
            Ok(()) => reported.clear(),
            Err(_) if term.load(Ordering::Relaxed) => {}
            Err(why) => {
                if !reported.iter().any(|(n, w)| *n == name && *w == why) {
                    diag(format_args!("SIG{name} was not delivered to the remote job: {why}"));
                    reported.push((name, why));
                }
            }
        }
    }
}

/// One signal to the meta-scheduler: `Ok` once it is queued for the
/// target, the reason otherwise.
fn forward_signal(api: &Api, name: &str, term: &AtomicBool) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        let err = match api.signal(name, SignalScope::Full, Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            // Not running at a target yet (or already over): worth a retry
            // while the job may still be submitted there.
            Err(CallError::Status(409, m)) => format!("HTTP 409: {m}"),
            Err(CallError::Status(s, m)) => return Err(format!("HTTP {s}: {m}")),
            Err(CallError::Transient(m)) => m,
        };
        if t0.elapsed() >= SIGNAL_RETRY || term.load(Ordering::Relaxed) {
            return Err(err);
        }
        nap(Duration::from_millis(250), term);
    }
}

/// The stand-in is being cancelled: cancel the remote job, relay what
/// output arrives before the deadline, exit 143.
fn cancel_and_drain(api: &Api, relay: &mut Relay) -> u8 {
    let t0 = Instant::now();
    diag("cancelled: cancelling the remote job");
    let delivered = loop {
        match api.cancel(Duration::from_secs(1)) {
            Ok(_) => break true,
            Err(CallError::Status(s, m)) => {
                diag(format_args!("cancel refused: HTTP {s}: {m}"));
                break false;
            }
            Err(e) if t0.elapsed() >= CANCEL_RETRY => {
                // The origin agent cancels jobs whose stand-in vanished.
                diag(format_args!("could not cancel the remote job: {e}"));
                break false;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    while delivered && t0.elapsed() < RELAY_AFTER_CANCEL {
        let finished = relay.pump(api).is_ok() && api.get().is_ok_and(|r| relay.done(&r));
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    143
}

fn main() -> ExitCode {
    // The child of oom::out_of_memory_here (not a user's flag).
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, bytes] = argv.as_slice() {
        if flag == oom::FILL_FLAG {
            return ExitCode::from(bytes.parse().map_or(2, oom::fill));
        }
    }
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            diag(format_args!("{e:#}"));
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(state: JobState, exit_code: Option<i32>, signal: Option<i32>) -> JobRecord {
        JobRecord {
            fleet_job_id: "j".into(),
            origin: "beta".into(),
            origin_job_id: None,
            target: Some("alpha".into()),
            remote_job_id: Some(3),
            state,
            exit_code,
            signal,
            cancel_requested: false,
            reason: "r".into(),
            stdout_len: 0,
            stderr_len: 0,
            output_complete: true,
            node_list: String::new(),
            submitted_at: 0.0,
            updated_at: 0.0,
            summary: String::new(),
            start_requested_at: None,
            requeues: 0,
            user: None,
            origin_restart: 0,
            stdout_base: 0,
            stderr_base: 0,
            epoch: 0,
            migrations: 0,
            requeue_notes: Vec::new(),
            time_limit_min: None,
        }
    }

    fn check(r: JobRecord, expected: u8) {
        assert_eq!(exit_status(&r), expected, "{r:?}");
    }

    #[test]
    fn exit_codes() {
        check(rec(JobState::Completed, Some(0), None), 0);
        check(rec(JobState::Completed, None, None), 0);
        check(rec(JobState::Failed, Some(7), None), 7);
        check(rec(JobState::Failed, Some(0), None), 1);
        check(rec(JobState::Failed, None, None), 1);
        check(rec(JobState::Failed, Some(0), Some(9)), 137);
        check(rec(JobState::Cancelled, None, Some(15)), 143);
        check(rec(JobState::Cancelled, None, None), 143);
        check(rec(JobState::Lost, None, None), 1);
        check(rec(JobState::Completed, Some(300), None), 255);
    }

    #[test]
    fn remote_end_states_are_read_from_the_reason() {
        let with = |state, reason: &str| JobRecord { reason: reason.into(), ..rec(state, Some(0), None) };
        assert_eq!(remote_end(&with(JobState::Failed, "TIMEOUT at alpha")), Some("TIMEOUT"));
        assert_eq!(remote_end(&with(JobState::Failed, "OUT_OF_MEMORY at alpha: x")), Some("OUT_OF_MEMORY"));
        // A job waiting at its target says why in the stand-in's comment.
        let mut w = with(JobState::Pending, "Unschedulable: 0/3 nodes are available\n: 2 Insufficient nvidia.com/gpu");
        w.target = Some("kube-gamma".into());
        w.remote_job_id = Some(12);
        assert_eq!(
            comment_text(&w),
            "fleet: kube-gamma job 12 pending: Unschedulable: 0/3 nodes are available: 2 Insufficient nvidia.com/gpu"
        );
        w.reason = "x".repeat(500);
        assert_eq!(comment_text(&w).len(), "fleet: kube-gamma job 12 pending: ".len() + 200);
        w.state = JobState::Running;
        assert_eq!(comment_text(&w), "fleet: kube-gamma job 12 running");
        assert_eq!(
            remote_end(&with(JobState::Failed, "NODE_FAIL at alpha; requeued 1 time(s) at alpha")),
            Some("NODE_FAIL")
        );
        assert_eq!(remote_end(&with(JobState::Failed, "NonZeroExitCode")), None);
        assert_eq!(remote_end(&with(JobState::Failed, "TIMEOUTS")), None);
        assert_eq!(remote_end(&with(JobState::Running, "TIMEOUT at alpha")), None, "only an ended job");
    }

    #[test]
    fn short_outages_are_silent_long_ones_reported_once_with_their_end() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let down = CallError::Transient("connection refused".into());
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        // A 10 s blip: nothing reported, backoff grows and resets.
        assert_eq!(b.fail("polling the job", &down, s(0)), (Duration::from_millis(500), None));
        assert_eq!(b.fail("polling the job", &down, s(1)), (Duration::from_millis(1000), None));
        assert_eq!(b.fail("polling the job", &down, s(10)).1, None);
        assert_eq!(b.ok(s(11)), None);
        assert_eq!(b.fail("polling the job", &down, s(12)).0, Duration::from_millis(500));
        // Lasting 30 s: reported once, then its end.
        for t in [20, 41] {
            assert_eq!(b.fail("polling the job", &down, s(t)).1, None);
        }
        let (wait, line) = b.fail("polling the job", &down, s(42));
        assert_eq!(wait, Duration::from_secs(4), "0.5, 1, 2, 4 s: doubling since the outage began");
        assert_eq!(line.as_deref(), Some("polling the job: connection refused (failing for 30s, retrying)"));
        assert_eq!(b.fail("polling the job", &down, s(50)).1, None, "the same error is said once");
        let other = CallError::Transient("HTTP 503: busy".into());
        assert!(b.fail("polling the job", &other, s(51)).1.unwrap().contains("503"), "a new error is said");
        assert_eq!(b.ok(s(52)).as_deref(), Some("meta-scheduler reachable again after 40.0s"));
        assert_eq!(b.ok(s(53)), None);
        // report_after = 0: every new outage is reported at once.
        let mut b = Backoff::new(Duration::from_millis(500), Duration::ZERO);
        assert!(b.fail("starting the job", &down, s(0)).1.is_some());
        assert!(b.ok(s(1)).is_some());
    }
}
