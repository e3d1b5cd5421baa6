//! `fleet-ckpt`: save, restore, list, verify and copy checkpoints by
//! Fleet's convention (docs/checkpoints.md). Exit codes: 0 done, 1 error,
//! 2 usage, 3 `restore` found no checkpoint at all (start from scratch).
//!
//! Three more commands, not for people: `lease-exec` (the interpreter the
//! target's agent gives a run, see `fleet_ckpt::lease`), `lease-watch`
//! (the run's watchdog it starts) and `install-self DEST` (a pod's init
//! container copies the helper into the pod with it: no `cp` needed in
//! the helper image).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::{Parser, Subcommand};
use fleet_ckpt::{CkptError, Client, EntryState, Location, SaveOptions, Stores};

#[derive(Parser)]
#[command(name = "fleet-ckpt", version, about = "Save, restore, list, verify and copy Fleet checkpoints")]
struct Cli {
    /// Stores file: per-bucket S3 endpoints and credentials (`[[store]]`
    /// entries, see docs/checkpoints.md). Without it, or for a bucket it
    /// does not name, the AWS_* environment applies.
    #[arg(long, global = true, env = "FLEET_CKPT_STORES")]
    stores: Option<PathBuf>,
    /// Print one JSON object per result instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Upload DIR as the job's next checkpoint: every file, then the manifest.
    Save {
        /// The directory to save (regular files and directories only).
        dir: PathBuf,
        /// The job's checkpoint prefix.
        #[arg(long, env = "FLEET_CKPT_URL")]
        url: String,
        /// Recorded in the manifest.
        #[arg(long, env = "FLEET_JOB_ID", default_value = "local")]
        job_id: String,
        /// Sequence number (default: one more than the highest under the prefix).
        #[arg(long)]
        seq: Option<u64>,
        /// The framework's step or iteration, recorded in the manifest.
        #[arg(long)]
        step: Option<u64>,
        /// Valid checkpoints kept after this one is saved (0: all).
        #[arg(long, env = "FLEET_CKPT_KEEP", default_value_t = 3)]
        keep: usize,
        /// Do not report the checkpoint to the meta-scheduler even when
        /// FLEET_METASCHED_URL and a token (FLEET_CKPT_TOKEN_FILE or
        /// FLEET_JOB_TOKEN) are set.
        #[arg(long)]
        no_report: bool,
    },
    /// Restore into DIR (absent or empty) the newest valid checkpoint, or --from.
    Restore {
        dir: PathBuf,
        /// A checkpoint URL, or a prefix whose newest valid checkpoint to take.
        #[arg(long, env = "FLEET_RESUME_FROM")]
        from: Option<String>,
        /// The job's checkpoint prefix (used when --from is not given).
        #[arg(long, env = "FLEET_CKPT_URL")]
        url: Option<String>,
    },
    /// The checkpoints under the job's prefix, oldest first, each checked cheaply.
    List {
        #[arg(long, env = "FLEET_CKPT_URL")]
        url: String,
    },
    /// Check every file's size and SHA-256 against the manifest.
    Verify {
        /// A checkpoint, or a prefix (its newest valid checkpoint).
        #[arg(env = "FLEET_CKPT_URL")]
        url: String,
    },
    /// Copy a checkpoint (or a prefix's newest valid one) to DST_PREFIX,
    /// checking every digest; prints the bytes moved.
    Copy { src: String, dst_prefix: String },
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match args.get(1).and_then(|a| a.to_str()) {
        Some("lease-exec") => return lease_exec(&args[2..]),
        Some("lease-watch") => return lease_watch(&args[2..]),
        Some("lease-sentinel") => return lease_sentinel(),
        Some("install-self") => return install_self(&args[2..]),
        _ => {}
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleet-ckpt: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fleet-ckpt: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn loc(url: &str) -> Result<Location> {
    Location::parse(url).map_err(|e| anyhow!(e))
}

fn mb_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let stores = match &cli.stores {
        Some(p) => Stores::load(p).map_err(|e| anyhow!(e))?,
        None => Stores::default(),
    };
    let client = Client::new(stores);
    match cli.cmd {
        Cmd::Save { dir, url, job_id, seq, step, keep, no_report } => {
            let prefix = loc(&url)?;
            let s = client.save(&dir, &prefix, &SaveOptions { job_id: job_id.clone(), seq, step, keep }).await?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"url": s.location.url(), "seq": s.manifest.seq, "bytes": s.bytes, "files": s.manifest.files.len(),
                        "seconds": s.secs, "manifest_sha256": s.manifest_sha256,
                        "deleted": s.deleted.iter().map(|l| l.url()).collect::<Vec<_>>()})
                );
            } else {
                println!(
                    "saved {} ({} files, {} bytes, {:.1} s, {:.1} MB/s)",
                    s.location.url(),
                    s.manifest.files.len(),
                    s.bytes,
                    s.secs,
                    mb_s(s.bytes, s.secs)
                );
                for d in &s.deleted {
                    println!("deleted {} (retention: keep {keep})", d.url());
                }
            }
            if !no_report {
                report(&job_id, &s).await;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Restore { dir, from, url } => {
            let src = match (from, url) {
                (Some(f), _) => loc(&f)?,
                (None, Some(u)) => loc(&u)?,
                (None, None) => {
                    return Err(anyhow!(
                        "nothing to restore from: give --from or --url (FLEET_RESUME_FROM, FLEET_CKPT_URL)"
                    ))
                }
            };
            match client.restore(&src, &dir).await {
                Ok(r) => {
                    for s in &r.skipped {
                        eprintln!("fleet-ckpt: skipped {s}");
                    }
                    if cli.json {
                        println!(
                            "{}",
                            serde_json::json!({"url": r.location.url(), "seq": r.manifest.seq, "step": r.manifest.step,
                                "bytes": r.bytes, "seconds": r.secs, "skipped": r.skipped})
                        );
                    } else {
                        println!(
                            "restored {} into {} ({} bytes, {:.1} s, {:.1} MB/s)",
                            r.location.url(),
                            dir.display(),
                            r.bytes,
                            r.secs,
                            mb_s(r.bytes, r.secs)
                        );
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(CkptError::NoValid { prefix, tried }) if tried.is_empty() => {
                    eprintln!("fleet-ckpt: no checkpoint under {prefix}: nothing to restore, start from scratch");
                    Ok(ExitCode::from(3))
                }
                Err(e) => Err(e.into()),
            }
        }
        Cmd::List { url } => {
            for e in client.list(&loc(&url)?).await? {
                let (state, bytes, created, step) = match &e.state {
                    EntryState::Valid { manifest, .. } => {
                        ("valid".to_string(), manifest.total_bytes(), manifest.created_at.clone(), manifest.step)
                    }
                    EntryState::NoManifest => ("incomplete (no manifest)".to_string(), 0, String::new(), None),
                    EntryState::Invalid(why) => (format!("invalid: {why}"), 0, String::new(), None),
                };
                if cli.json {
                    println!(
                        "{}",
                        serde_json::json!({"seq": e.seq, "url": e.location.url(), "valid": e.is_valid(), "state": state,
                            "bytes": bytes, "created_at": created, "step": step})
                    );
                } else {
                    println!("{:>6}  {:<20}  {:>14}  {}  {}", e.seq, created, bytes, e.location.url(), state);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Verify { url } => {
            let target = client.resolve(&loc(&url)?).await?;
            let v = client.verify(&target).await?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"url": v.location.url(), "seq": v.manifest.seq, "bytes": v.bytes, "seconds": v.secs,
                        "manifest_sha256": v.manifest_sha256, "valid": true})
                );
            } else {
                println!("valid {} ({} files, {} bytes)", v.location.url(), v.manifest.files.len(), v.bytes);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Copy { src, dst_prefix } => {
            let c = client.copy(&loc(&src)?, &loc(&dst_prefix)?).await?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"from": c.from.url(), "url": c.location.url(), "seq": c.manifest.seq, "bytes": c.bytes,
                        "seconds": c.secs, "manifest_sha256": c.manifest_sha256})
                );
            } else {
                println!(
                    "copied {} -> {} ({} bytes moved, {:.1} s, {:.1} MB/s)",
                    c.from.url(),
                    c.location.url(),
                    c.bytes,
                    c.secs,
                    mb_s(c.bytes, c.secs)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Report a saved checkpoint to the catalog when the job was given the
/// means: FLEET_METASCHED_URL plus its checkpoint token file
/// (FLEET_CKPT_TOKEN_FILE, at a target) or its job token
/// (FLEET_JOB_TOKEN), optionally FLEET_METASCHED_CA. A failed report is a
/// warning: the checkpoint itself is complete and valid in the store.
async fn report(job_id: &str, s: &fleet_ckpt::ops::Saved) {
    let Ok(url) = std::env::var("FLEET_METASCHED_URL") else { return };
    let auth = match (std::env::var_os("FLEET_CKPT_TOKEN_FILE"), std::env::var("FLEET_JOB_TOKEN")) {
        (Some(path), _) => match fleet_ckpt::read_token_file(std::path::Path::new(&path)) {
            Ok(t) => format!("{} {t}", fleet_api::auth::CKPT_TOKEN_SCHEME),
            Err(e) => {
                eprintln!("fleet-ckpt: warning: not reported to the meta-scheduler: {e:#}");
                return;
            }
        },
        (None, Ok(t)) => format!("{} {}", fleet_api::auth::JOB_TOKEN_SCHEME, t.trim()),
        (None, Err(_)) => return,
    };
    let ca = match std::env::var_os("FLEET_METASCHED_CA") {
        Some(p) => match fleet_api::client::read_ca_bundle(std::path::Path::new(&p)) {
            Ok(pem) => Some(pem),
            Err(e) => {
                eprintln!("fleet-ckpt: warning: not reported to the meta-scheduler: {e}");
                return;
            }
        },
        None => None,
    };
    let body = fleet_api::api::CheckpointReport {
        seq: s.manifest.seq,
        url: s.location.url(),
        bytes: s.bytes,
        manifest_sha256: s.manifest_sha256.clone(),
        step: s.manifest.step,
        valid: true,
        copied_from: None,
        copy_seconds: None,
    };
    if let Err(e) =
        fleet_ckpt::report(&url, ca.as_deref(), &auth, job_id, &body).await.context("reporting the checkpoint")
    {
        eprintln!("fleet-ckpt: warning: {e:#}");
    }
}

// ---- the in-job lease (fleet_ckpt::lease) --------------------------------

/// `fleet-ckpt install-self DEST`: copies this program to DEST (a new
/// file, mode 0555, never through a link): a pod's init container puts the
/// helper where the job's container runs it.
fn install_self(args: &[std::ffi::OsString]) -> ExitCode {
    use std::os::unix::fs::OpenOptionsExt;
    let [dest] = args else {
        eprintln!("fleet-ckpt install-self: usage: install-self DEST");
        return ExitCode::from(2);
    };
    let copy = || -> Result<()> {
        let exe = std::env::current_exe().context("finding fleet-ckpt")?;
        let mut src = std::fs::File::open(&exe).with_context(|| format!("reading {}", exe.display()))?;
        let mut dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dest)
            .with_context(|| format!("creating {}", PathBuf::from(dest).display()))?;
        std::io::copy(&mut src, &mut dst).with_context(|| format!("writing {}", PathBuf::from(dest).display()))?;
        dst.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o555))?;
        dst.sync_all()?;
        Ok(())
    };
    match copy() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet-ckpt install-self: {e:#}");
            ExitCode::FAILURE
        }
    }
}

use fleet_ckpt::lease::{self, LeaseEnv, Verdict, Watch};
use std::time::{Duration, Instant};

fn current_thread() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")
}

/// `fleet-ckpt lease-exec SCRIPT [ARGS...]`: the first line of a run's
/// batch script at a target (SCRIPT is Slurm's copy of it). Obtains the
/// run's first job lease, starts its watchdog, and `exec`s the job's own
/// script (`FLEET_JOB_SCRIPT`) with its own interpreter and ARGS. A run
/// that is stale, or gets no lease within the lease's length, never
/// starts its script (exit 1, one line on the job's stderr).
fn lease_exec(args: &[std::ffi::OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    if args.is_empty() {
        eprintln!("fleet-ckpt lease-exec: usage: lease-exec SCRIPT [ARGS...] (the interpreter line of a run)");
        return ExitCode::from(2);
    }
    let Some(script) = std::env::var_os("FLEET_JOB_SCRIPT").map(PathBuf::from) else {
        eprintln!("fleet: FLEET_JOB_SCRIPT is not set: the job's script is unknown");
        return ExitCode::FAILURE;
    };
    // The soft limits its submitter had at home that sudo could not hand
    // the target's sbatch: the script inherits them from this process.
    for (resource, soft) in lease::home_limits(|k| std::env::var(k).ok()) {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit on this process with a local rlimit.
        unsafe {
            if libc::getrlimit(resource, &mut l) == 0 {
                // RLIM_INFINITY is the largest value: an unlimited hard limit caps nothing.
                l.rlim_cur = soft.min(l.rlim_max);
                libc::setrlimit(resource, &l);
            }
        }
    }
    let head = match std::fs::File::open(&script).and_then(|f| {
        use std::io::Read;
        let mut b = Vec::new();
        f.take(4096).read_to_end(&mut b).map(|_| b)
    }) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("fleet: reading the job's script {}: {e}", script.display());
            return ExitCode::FAILURE;
        }
    };
    let Some((interp, arg)) = lease::shebang(&head) else {
        eprintln!("fleet: the job's script {} does not start with #!", script.display());
        return ExitCode::FAILURE;
    };
    match LeaseEnv::from_vars(|k| std::env::var(k).ok()) {
        Ok(None) => {}
        Ok(Some(env)) => match first_grant(&env) {
            Ok(None) => {}
            Ok(Some((sent, valid))) => {
                let left = valid.saturating_sub(sent.elapsed());
                // A former run's decision of whose end it was (the directory
                // may outlive a run): this run's is yet to be made.
                if let Some(d) = lease::run_dir(|k| std::env::var(k).ok()) {
                    let _ = std::fs::remove_file(d.join(fleet_ckpt::end::END_DECIDED));
                }
                if let Err(e) = start_watchdog(left) {
                    eprintln!("fleet: this run does not start: its lease watchdog did not start: {e:#}");
                    return ExitCode::FAILURE;
                }
                // Leased: stay the batch process, to report the run's end.
                let mut cmd = std::process::Command::new(&interp);
                cmd.args(arg).arg(&script).args(&args[1..]);
                for (name, _) in lease::HOME_LIMITS {
                    cmd.env_remove(name);
                }
                return supervise(&env, cmd, &script);
            }
            Err(why) => {
                eprintln!("fleet: this run does not start: {why}");
                return ExitCode::FAILURE;
            }
        },
        Err(e) => {
            eprintln!("fleet: this run does not start: its job lease: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    let mut cmd = std::process::Command::new(&interp);
    for (name, _) in lease::HOME_LIMITS {
        cmd.env_remove(name);
    }
    let err = cmd.args(arg).arg(&script).args(&args[1..]).exec();
    eprintln!("fleet: cannot run the job's interpreter {interp}: {err}");
    ExitCode::from(126)
}

/// The write end of lease-exec's self-pipe, for its signal handler.
static SIGNAL_PIPE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(std::sync::atomic::Ordering::Relaxed);
    let b = sig as u8;
    // SAFETY: write(2) is async-signal-safe; one byte from a live local;
    // errno is saved and restored around it.
    unsafe {
        let e = *libc::__errno_location();
        libc::write(fd, (&b as *const u8).cast(), 1);
        *libc::__errno_location() = e;
    }
}

fn sig_set(sigs: &[i32]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Runs the job's script (`cmd`) as a child of this process (the batch
/// process), passes on the signals sent to this process alone, reports
/// the script's end to the meta-scheduler (`fleet_ckpt::end`), and exits
/// as the script did.
fn supervise(env: &LeaseEnv, mut cmd: std::process::Command, script: &std::path::Path) -> ExitCode {
    use fleet_api::api::EndCause;
    use fleet_ckpt::end::{self, Route, ScriptEnd};
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    // The watchdog's log and note: the run's writable directory (in a pod,
    // not the script's read-only one).
    let run_dir = lease::run_dir(|k| std::env::var(k).ok())
        .unwrap_or_else(|| script.parent().map(PathBuf::from).unwrap_or_default());
    let log = |msg: &str| {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(run_dir.join(".fleet-lease.log"))
        {
            let _ = writeln!(f, "{:.3} {msg}", fleet_ckpt_now());
        }
    };
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        log("no self-pipe: running the script without reporting its end");
        let err = cmd.exec();
        eprintln!("fleet: cannot run the job's interpreter: {err}");
        return ExitCode::from(126);
    }
    SIGNAL_PIPE.store(fds[1], std::sync::atomic::Ordering::Relaxed);
    // SAFETY: File takes ownership of the read end, which nothing else uses.
    let mut signals = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    for &sig in end::FORWARDED.iter().chain(&[libc::SIGCHLD]) {
        // SAFETY: sigaction(2) with a handler that only writes to a pipe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    // The sentinel: a process of the step blocking the passed-on signals.
    let mut sentinel = std::env::current_exe().ok().and_then(|exe| {
        let mut c = std::process::Command::new(exe);
        c.arg("lease-sentinel")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let set = sig_set(&end::FORWARDED);
        // SAFETY: sigprocmask and prctl are async-signal-safe; nothing else
        // runs between fork and exec.
        unsafe {
            c.pre_exec(move || {
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        c.spawn().map_err(|e| log(&format!("no sentinel ({e}): every signal is passed on"))).ok()
    });
    // Notes for the target agent (read without following links): that
    // the script started, and later how it ended. Slurm may take a launch
    // whose answer it missed for failed, hold the job and kill what ran:
    // the agent then tells a run that never started from one that ran.
    // Each note names the run it is of: the Slurm job, Slurm's restart
    // count (a requeued job runs again under the same id) and the fleet
    // epoch (the directory may outlive a placement), so that the agent
    // never takes a note of an earlier run for this one's.
    let restart = std::env::var("SLURM_RESTART_COUNT").ok().and_then(|v| v.trim().parse::<u32>().ok()).unwrap_or(0);
    let slurm_job = std::env::var("SLURM_JOB_ID")
        .ok()
        .filter(|v| v.parse::<u64>().is_ok())
        .map(|id| format!("job {id} restart {restart} epoch {} at {}", env.epoch, (fleet_ckpt_now() * 1000.0) as u64));
    let note = |name: &str, text: String| {
        if let Err(e) = std::fs::write(run_dir.join(name), text) {
            log(&format!("cannot write {name}: {e}"));
        }
    };
    if let Some(run) = &slurm_job {
        note(".fleet-run-started", format!("started {run}\n"));
        // And one line per start, appended: Slurm may run a job again
        // without counting it (a slurmctld recovered from older state
        // launches it anew) while its agent is not looking.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run_dir.join(".fleet-run-starts"))
            .and_then(|mut f| writeln!(f, "{run}"));
        if let Err(e) = appended {
            log(&format!("cannot write .fleet-run-starts: {e}"));
        }
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleet: cannot run the job's interpreter: {e}");
            return ExitCode::from(126);
        }
    };
    let pid = child.id() as i32;
    let mut pending: Vec<(i32, Instant)> = Vec::new();
    // The signals sent to the whole step while the script ran, and when
    // the sentinel died of a SIGKILL (Slurm's abort of the step).
    let mut drained: Vec<i32> = Vec::new();
    let mut sentinel_killed_at: Option<Instant> = None;
    let ended = loop {
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child, with a local status.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            if let Some(e) = ScriptEnd::from_wait_status(status) {
                break e;
            }
        }
        watch_sentinel(&mut sentinel, &mut sentinel_killed_at);
        let mut pfd = libc::pollfd { fd: fds[0], events: libc::POLLIN, revents: 0 };
        let timeout = if pending.is_empty() { 1000 } else { 10 };
        // SAFETY: poll(2) on one local pollfd.
        unsafe { libc::poll(&mut pfd, 1, timeout) };
        let mut buf = [0u8; 64];
        while let Ok(n) = signals.read(&mut buf) {
            if n == 0 {
                break;
            }
            pending.extend(
                buf[..n].iter().map(|&b| i32::from(b)).filter(|&s| s != libc::SIGCHLD).map(|s| (s, Instant::now())),
            );
        }
        let status_text =
            sentinel.as_ref().and_then(|s| std::fs::read_to_string(format!("/proc/{}/status", s.id())).ok());
        pending.retain(|&(sig, at)| {
            let at_sentinel = status_text.as_deref().and_then(|t| end::pending_in_status(t, sig));
            match end::route(at_sentinel, at.elapsed()) {
                Route::Wait => true,
                Route::Drain => {
                    drained.push(sig);
                    if let Some(stdin) = sentinel.as_mut().and_then(|s| s.stdin.as_mut()) {
                        let _ = stdin.write_all(&[sig as u8]);
                    }
                    false
                }
                Route::Forward => {
                    // SAFETY: kill(2) to our own child (not yet reaped, so its pid is ours).
                    unsafe { libc::kill(pid, sig) };
                    false
                }
            }
        });
    };
    // Whose end it was, decided as soon as the script is reaped: if the
    // watchdog has not decided to stop the run yet, its signals came (if
    // at all) after the script's own end (`end::END_DECIDED`).
    let decided = end::decide(&run_dir, "script");
    // Whether Slurm's kill of the step came first (`end::step_kill`):
    // drained, pending at the sentinel now, or the sentinel killed. Slurm
    // signals one process after another: an exit with no sign of a kill
    // yet is watched a moment longer (`end::END_GRACE`), and a SIGTERM
    // lease-exec was told of but the sentinel not yet as long as it would
    // be while the script ran.
    let reaped = Instant::now();
    let mut buf = [0u8; 64];
    while let Ok(n @ 1..) = signals.read(&mut buf) {
        pending.extend(buf[..n].iter().map(|&b| i32::from(b)).map(|s| (s, Instant::now())));
    }
    let term_told = pending.iter().find(|(s, _)| *s == end::STEP_KILL).map(|&(_, at)| at);
    let after_signal = loop {
        watch_sentinel(&mut sentinel, &mut sentinel_killed_at);
        let status = sentinel.as_ref().and_then(|s| std::fs::read_to_string(format!("/proc/{}/status", s.id())).ok());
        let killed = sentinel_killed_at.is_some_and(|t| reaped.saturating_duration_since(t) <= end::KILL_NEAR);
        let found = end::step_kill(&drained, status.as_deref(), killed);
        let watch = (matches!(ended, ScriptEnd::Exited(_)) && reaped.elapsed() < end::END_GRACE)
            || term_told.is_some_and(|at| at.elapsed() < end::SENTINEL_WAIT);
        if found.is_some() || sentinel.is_none() || !watch {
            break found;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if let Some(mut s) = sentinel.take() {
        drop(s.stdin.take());
        let _ = s.kill();
        let _ = s.wait();
    }
    let how = match (ended, after_signal) {
        (ScriptEnd::Exited(c), None) => format!("exit code {c}"),
        (ScriptEnd::Signalled(s), None) => format!("signal {s}"),
        (ScriptEnd::Exited(c), Some(k)) => format!("exit code {c} after signal {k} to the whole step"),
        (ScriptEnd::Signalled(s), Some(k)) => format!("signal {s} after signal {k} to the whole step"),
    };
    let cause = end::whose(decided, run_dir.join(".fleet-lease-stopped").exists());
    let (whose, within) = match cause {
        Some(EndCause::Lease) => ("its lease watchdog stopped it", Duration::from_secs(1)),
        Some(EndCause::Script) => ("on its own", Duration::from_secs(10)),
        None => ("whose end unknown: no run directory to decide in", Duration::from_secs(10)),
    };
    if cause != Some(EndCause::Lease) {
        if let Some(run) = &slurm_job {
            note(".fleet-run-ended", ended.note(after_signal, run));
        }
    }
    // The watchdog's end is claimed too (once, briefly: the meta-scheduler
    // takes it as no end of the script's own, and the watchdog is killing
    // what is left of the run).
    let sent = current_thread().and_then(|rt| {
        let http = {
            let _g = rt.enter();
            lease::client(env)?
        };
        rt.block_on(end::report(&http, env, &ended.claim(env.epoch, cause, after_signal), within))
    });
    match sent {
        Ok(r) if r.recorded => log(&format!("the script ended ({how}, {whose}): reported")),
        Ok(r) => log(&format!("the script ended ({how}, {whose}): not recorded: {}", r.reason)),
        Err(e) => log(&format!("the script ended ({how}, {whose}): not reported: {e:#}")),
    }
    match ended {
        ScriptEnd::Exited(c) => ExitCode::from(c as u8),
        ScriptEnd::Signalled(s) => {
            // The same end for Slurm: that signal, by default.
            // SAFETY: signal(2), sigprocmask(2) and raise(3) on this process.
            unsafe {
                libc::signal(s, libc::SIG_DFL);
                let set = sig_set(&[s]);
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                libc::raise(s);
            }
            ExitCode::from(128u8.saturating_add(s as u8))
        }
    }
}

/// Reaps the sentinel if it ended, noting when if a SIGKILL ended it
/// (nothing but Slurm's abort of the step sends it one).
fn watch_sentinel(sentinel: &mut Option<std::process::Child>, killed_at: &mut Option<Instant>) {
    use std::os::unix::process::ExitStatusExt;
    if let Some(st) = sentinel.as_mut().and_then(|s| s.try_wait().ok().flatten()) {
        if st.signal() == Some(libc::SIGKILL) {
            *killed_at = Some(Instant::now());
        }
        *sentinel = None;
    }
}

/// `fleet-ckpt lease-sentinel`: lease-exec's sentinel (`fleet_ckpt::end`).
/// Started with the passed-on signals blocked; drains one when lease-exec
/// writes its number on stdin; ends at EOF (or with lease-exec).
fn lease_sentinel() -> ExitCode {
    use std::io::Read;
    let mut b = [0u8; 1];
    let mut stdin = std::io::stdin().lock();
    while let Ok(1) = stdin.read(&mut b) {
        let set = sig_set(&[i32::from(b[0])]);
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: sigtimedwait(2) with local set and timeout, no siginfo wanted.
        unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) };
    }
    ExitCode::SUCCESS
}

/// The run's first grant: `(sent, valid)`, `None` when leases are off, or
/// why the run must not start (stale, or no grant within the lease; a
/// "wait" for the origin's confirmation is no refusal: `lease::FirstLease`).
fn first_grant(env: &LeaseEnv) -> std::result::Result<Option<(Instant, Duration)>, String> {
    use lease::First;
    let rt = current_thread().map_err(|e| format!("{e:#}"))?;
    let http = {
        let _g = rt.enter();
        lease::client(env).map_err(|e| format!("{e:#}"))?
    };
    let mut first = lease::FirstLease::new(env.lease, Instant::now());
    loop {
        let sent = Instant::now();
        let next = match rt.block_on(lease::renew(&http, env, Duration::from_secs(5).min(env.lease))) {
            Ok(r) => first.on_reply(Instant::now(), &r),
            Err(e) => first.on_error(Instant::now(), format!("{e:#}")),
        };
        match next {
            First::Start(valid) => return Ok(Some((sent, valid))),
            First::Off => return Ok(None),
            First::Refuse(why) => return Err(why),
            First::AskAgain(after) => std::thread::sleep(after),
        }
    }
}

/// Starts the watchdog of this process (which is about to become the
/// job's script) detached: through an intermediate that exits at once, so
/// that the watchdog is nobody's child in the job.
fn start_watchdog(left: Duration) -> Result<()> {
    let pid = std::process::id() as i32;
    let (_, start, _) = lease::proc_info(std::path::Path::new("/proc"), pid).context("reading /proc/self")?;
    let exe = std::env::current_exe().context("finding fleet-ckpt")?;
    let status = std::process::Command::new(exe)
        .args(["lease-watch", "--detach", &pid.to_string(), &start.to_string()])
        .arg(left.saturating_sub(Duration::from_millis(200)).as_millis().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("starting the watchdog")?;
    if !status.success() {
        anyhow::bail!("the watchdog's launcher {status}");
    }
    Ok(())
}

/// `fleet-ckpt lease-watch [--detach] PID START VALID_MS`: renews the job
/// lease of the run whose script is PID (started at START, in clock ticks)
/// until PID ends; stops the run when the lease is stale or runs out.
fn lease_watch(args: &[std::ffi::OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let a: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    let (detach, rest) = match a.first() {
        Some(&"--detach") => (true, &a[1..]),
        _ => (false, &a[..]),
    };
    let parsed = match rest {
        [pid, start, valid] => pid.parse::<i32>().ok().zip(start.parse::<u64>().ok()).zip(valid.parse::<u64>().ok()),
        _ => None,
    };
    let Some(((pid, start), valid_ms)) = parsed.filter(|((p, _), _)| *p > 1) else {
        eprintln!("fleet-ckpt lease-watch: usage: lease-watch [--detach] PID START VALID_MS");
        return ExitCode::from(2);
    };
    if detach {
        let Ok(exe) = std::env::current_exe() else { return ExitCode::FAILURE };
        let mut c = std::process::Command::new(exe);
        c.args(["lease-watch", &pid.to_string(), &start.to_string(), &valid_ms.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: setsid(2) is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        return match c.spawn() {
            Ok(_) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    // The job's signals are the job's: `scancel --signal` to every
    // process of the job, a terminal's ^C, must not end the watchdog
    // (it ends by itself within 200 ms of the script's end).
    // (The signals lease-exec passes on to the script, and SIGPIPE.)
    for &sig in fleet_ckpt::end::FORWARDED.iter().chain(&[libc::SIGPIPE]) {
        // SAFETY: signal(2) with SIG_IGN, before any thread of ours exists.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let env = match LeaseEnv::from_vars(|k| std::env::var(k).ok()) {
        Ok(Some(e)) => e,
        _ => return ExitCode::FAILURE,
    };
    let log_path = lease::run_dir(|k| std::env::var(k).ok()).map(|d| d.join(".fleet-lease.log"));
    // The container's termination message (a pod's): where the stop line
    // goes too, for the pod's status.
    let termination = std::env::var_os(lease::TERMINATION_VAR).map(PathBuf::from).filter(|p| p.is_absolute());
    let log = |msg: &str| {
        if let Some(p) = &log_path {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(p) {
                let _ = writeln!(f, "{:.3} {msg}", fleet_ckpt_now());
            }
        }
    };
    let alive = || lease::proc_info(std::path::Path::new("/proc"), pid).is_some_and(|(_, s, _)| s == start);
    let Ok(rt) = current_thread() else { return ExitCode::FAILURE };
    let http = {
        let _g = rt.enter();
        // Without one, no renewal: the run stops when its lease runs out.
        lease::client(&env).map_err(|e| log(&format!("no HTTP client, no renewals: {e:#}"))).ok()
    };
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut w = Watch::new(env.lease, Instant::now(), Duration::from_millis(valid_ms));
    let mut next = Instant::now() + w.next_renewal(Instant::now());
    let mut failing = false;
    // For the stop line: when the meta-scheduler last answered, and what
    // went wrong with the renewals since.
    let mut answered = Instant::now();
    let mut unanswered = 0u32;
    let mut last_err = String::new();
    log(&format!("watching run {} epoch {} (pid {pid}), lease {} ms", env.job_id, env.epoch, env.lease.as_millis()));
    let run_dir = log_path.as_ref().and_then(|p| p.parent());
    let stop = |why: &str| {
        // Decided before any signal (`end::END_DECIDED`): if lease-exec
        // reaped the script first, the script ended on its own, and
        // lease-exec, reporting that end, is left to exit as it did; what
        // else of the run is left stops all the same.
        if run_dir
            .is_some_and(|d| fleet_ckpt::end::decide(d, &format!("lease: {why}")) == fleet_ckpt::end::Decided::Lost)
        {
            log(&format!("not stopping the run ({why}): its script ended first; stopping what is left of it"));
            lease::stop_run(pid, uid, Duration::from_secs(3), true);
            log("stopped what was left");
            return;
        }
        log(&format!("stopping the run: {why}"));
        // For the agent: this run was stopped by its lease, it did not fail.
        if let Some(d) = run_dir {
            if let Err(e) = std::fs::write(d.join(".fleet-lease-stopped"), format!("{why}\n")) {
                log(&format!("cannot leave the note .fleet-lease-stopped: {e}"));
            }
        }
        let line = lease::stop_line(&env.job_id, why);
        if let Some(t) = &termination {
            let _ = std::fs::write(t, format!("{line}\n"));
        }
        // One line on the job's own stderr (relayed if the run still counts).
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(format!("/proc/{pid}/fd/2")) {
            use std::io::Write;
            let _ = writeln!(f, "{line}");
        }
        lease::stop_run(pid, uid, Duration::from_secs(3), false);
        log("stopped");
    };
    loop {
        if !alive() {
            log("the run ended");
            return ExitCode::SUCCESS;
        }
        let now = Instant::now();
        if now >= next {
            let timeout = w.left(now).clamp(Duration::from_millis(500), Duration::from_secs(5));
            let reply = match &http {
                Some(h) => rt.block_on(lease::renew(h, &env, timeout)),
                None => Err(anyhow!("no HTTP client")),
            };
            match reply {
                Ok(r) => {
                    if failing {
                        log(&format!("renewed again after {unanswered} unanswered renewal(s)"));
                        failing = false;
                    }
                    answered = Instant::now();
                    unanswered = 0;
                    match w.on_reply(now, &r) {
                        Verdict::Go => next = now + w.next_renewal(Instant::now()),
                        Verdict::Off => {
                            log("job leases are off: leaving the run alone");
                            return ExitCode::SUCCESS;
                        }
                        Verdict::Stop(why) => {
                            stop(&why);
                            return ExitCode::SUCCESS;
                        }
                    }
                }
                Err(e) => {
                    unanswered = unanswered.saturating_add(1);
                    // The end of the chain says why (refused, timed out, reset).
                    let chain: Vec<char> = format!("{e:#}").chars().filter(|c| !c.is_control()).collect();
                    last_err = chain[chain.len().saturating_sub(120)..].iter().collect();
                    if !failing {
                        log(&format!("renewal failed: {e:#}"));
                        failing = true;
                    }
                    next = now + Duration::from_secs(1).min(w.next_renewal(Instant::now()));
                }
            }
        }
        if let Some(why) = w.expired(Instant::now()) {
            if alive() {
                let since = answered.elapsed().as_secs_f64();
                stop(&if unanswered == 0 {
                    format!("{why}; last answered {since:.1} s ago")
                } else {
                    format!(
                        "{why}; last answered {since:.1} s ago, {unanswered} renewal(s) unanswered since: {last_err}"
                    )
                });
            }
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn fleet_ckpt_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
