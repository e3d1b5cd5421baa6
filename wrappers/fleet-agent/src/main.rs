//! `fleet-agent --conf /etc/slurm/fleet.conf` (add `--check` to check the
//! set-up without starting).

mod checks;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Fleet site agent: one per cluster, beside slurmctld.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// fleet.conf (slurm.conf syntax). Default: beside $SLURM_CONF, else /etc/slurm/fleet.conf.
    #[arg(long, env = "FLEET_CONF")]
    conf: Option<PathBuf>,
    /// Run every start-up check (sudo rule, proxy partition, spool and
    /// socket reachable by the job user and SlurmUser, token file, CA,
    /// meta-scheduler reachable with the token, no other agent running),
    /// print PASS/WARN/FAIL with reasons and hints, and exit: 0 when none
    /// failed, 1 otherwise. Run it as the agent's user. Prints no secret.
    #[arg(long)]
    check: bool,
    /// Parse Slurm output saved in FILE the way the agent reads it and
    /// print one JSON object per job, then exit (no configuration read).
    /// KIND: `squeue-json` (`squeue --json`) or `sacct` (the agent's
    /// `sacct -X -n -P -D -o JobIDRaw,State,ExitCode,Submit,UID`). For
    /// tests/compat, which checks the agent's parsers on other Slurm releases.
    #[arg(long, hide = true, num_args = 2, value_names = ["KIND", "FILE"])]
    parse_slurm_output: Option<Vec<String>>,
    /// Read job ID through libslurm (the start check's fast path) with the
    /// slurm.conf SLURM_CONF and print it as `--parse-slurm-output` does,
    /// then the same job from the full list the deferred pickup reads
    /// (`slurm_load_jobs`), then exit: 3 when the fast path is off (the
    /// reason on stderr).
    #[arg(long, hide = true, num_args = 2, value_names = ["SLURM_CONF", "ID"])]
    load_job: Option<Vec<String>>,
    /// Print job ID's batch script as the deferred pickup reads it through
    /// libslurm (`slurm_job_batch_script`) with the slurm.conf SLURM_CONF,
    /// then exit: 3 when the fast path is off, 1 when the call failed.
    #[arg(long, hide = true, num_args = 2, value_names = ["SLURM_CONF", "ID"])]
    batch_script: Option<Vec<String>>,
    /// Open and initialise libslurm with the slurm.conf SLURM_CONF and
    /// exit: 42 when the fast path works, 3 when it is off (the reason on
    /// stderr); libslurm itself exits 1 on a configuration it rejects.
    /// The agent runs this in a child before it initialises libslurm.
    #[arg(long, hide = true, value_name = "SLURM_CONF")]
    probe_libslurm: Option<std::path::PathBuf>,
}

/// One job as the agent's parsers make it, one JSON object.
fn job_json(j: &fleet_agent::backend::NativeJob) -> serde_json::Value {
    serde_json::json!({
        "id": j.native_id,
        "state": j.state.as_str(),
        "raw_state": j.raw_state,
        "exit_code": j.exit_code,
        "signal": j.signal,
        "submit_time": j.submit_time,
        "user_id": j.user_id,
        "restarts": j.restarts,
        "partition": j.partition,
        "reason": j.reason,
        "admin_comment": j.admin_comment,
        "time_limit_min": j.time_limit_min,
        "array_job_id": j.array_job_id,
        "array_task_id": j.array_task_id,
    })
}

/// libslurm opened with `conf` for job `id`: the id, or the exit code.
fn open_for(conf: &str, id: &str) -> Result<u64, ExitCode> {
    let Ok(id) = id.parse::<u64>() else {
        eprintln!("fleet-agent: {id:?} is not a job id");
        return Err(ExitCode::from(2));
    };
    if let Err(e) = fleet_agent::libslurm::open_here(std::path::Path::new(conf)) {
        eprintln!("fleet-agent: libslurm fast path off: {e}");
        return Err(ExitCode::from(3));
    }
    Ok(id)
}

/// `--load-job SLURM_CONF ID`.
fn load_job(conf: &str, id: &str) -> ExitCode {
    let id = match open_for(conf, id) {
        Ok(id) => id,
        Err(code) => return code,
    };
    let Some(one) = fleet_agent::libslurm::load_job(id) else {
        eprintln!("fleet-agent: slurm_load_job({id}) failed");
        return ExitCode::from(1);
    };
    println!("{}", job_json(&one));
    match fleet_agent::libslurm::load_jobs().map(|all| all.into_iter().find(|j| j.native_id == id)) {
        Some(Some(j)) => {
            println!("{}", job_json(&j));
            ExitCode::SUCCESS
        }
        Some(None) => {
            eprintln!("fleet-agent: slurm_load_jobs does not list job {id}");
            ExitCode::from(1)
        }
        None => {
            eprintln!("fleet-agent: slurm_load_jobs failed");
            ExitCode::from(1)
        }
    }
}

/// `--batch-script SLURM_CONF ID`.
fn batch_script(conf: &str, id: &str) -> ExitCode {
    use std::io::Write;
    let id = match open_for(conf, id) {
        Ok(id) => id,
        Err(code) => return code,
    };
    match fleet_agent::libslurm::batch_script(id) {
        Some(s) if std::io::stdout().write_all(&s).is_ok() => ExitCode::SUCCESS,
        Some(_) => ExitCode::from(1),
        None => {
            eprintln!("fleet-agent: slurm_job_batch_script({id}) failed");
            ExitCode::from(1)
        }
    }
}

/// `--parse-slurm-output KIND FILE`.
fn parse_slurm_output(kind: &str, file: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let jobs = match kind {
        "squeue-json" => fleet_agent::slurm::parse_jobs_json(&bytes)?,
        "sacct" => fleet_agent::slurm::parse_sacct(&String::from_utf8_lossy(&bytes)),
        other => anyhow::bail!("unknown output kind {other:?} (squeue-json or sacct)"),
    };
    for j in jobs {
        println!("{}", job_json(&j));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some([kind, file]) = args.parse_slurm_output.as_deref() {
        return match parse_slurm_output(kind, std::path::Path::new(file)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fleet-agent: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    if let Some(conf) = args.probe_libslurm.as_deref() {
        return match fleet_agent::libslurm::open_here(conf) {
            Ok(_) => ExitCode::from(fleet_agent::libslurm::PROBE_OK),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(3)
            }
        };
    }
    if let Some([conf, id]) = args.batch_script.as_deref() {
        return batch_script(conf, id);
    }
    if let Some([conf, id]) = args.load_job.as_deref() {
        return load_job(conf, id);
    }
    let conf = args.conf.unwrap_or_else(fleet_agent::config::default_conf_path);
    let cfg = match fleet_agent::config::AgentConfig::load(&conf) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleet-agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    // Colour only for a person at a terminal: journald and log files get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let fleet_log = tracing_subscriber::EnvFilter::try_from_env("FLEET_LOG").ok();
    let from_env = fleet_log.is_some();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(fleet_log.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(&cfg.log_level)))
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_filter_reloading();
    // LogLevel follows fleet.conf on SIGHUP, unless FLEET_LOG set the filter.
    if !from_env {
        let handle = subscriber.reload_handle();
        let _ = fleet_agent::LOG_LEVEL_HOOK.set(Box::new(move |level: &str| {
            let _ = handle.reload(tracing_subscriber::EnvFilter::new(level));
        }));
    }
    subscriber.init();
    if args.check {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("fleet-agent: cannot start the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        let results = rt.block_on(checks::run_all(&conf, &cfg));
        print!("{}", checks::report(&results));
        let failed = results.iter().any(|c| matches!(c.outcome, checks::Outcome::Fail { .. }));
        return if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS };
    }
    // One agent per site, decided before the socket is touched; held until exit.
    let _instance = match checks::lock_instance(&cfg.spool) {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!("fleet-agent: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleet-agent: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fleet_agent::run(cfg, fleet_agent::shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("fleet-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
