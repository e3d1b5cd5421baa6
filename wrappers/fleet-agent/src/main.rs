//! `fleet-agent --conf /etc/slurm/fleet.conf`

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
    /// Check the configuration, print what the agent would use, and exit.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let conf = args
        .conf
        .unwrap_or_else(fleet_agent::config::default_conf_path);
    let cfg = match fleet_agent::config::AgentConfig::load(&conf) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleet-agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLEET_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.log_level)),
        )
        .with_writer(std::io::stderr)
        .init();
    if args.check {
        println!("{cfg:#?}");
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
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
