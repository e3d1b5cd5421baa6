//! `fleet-metasched --config /etc/fleet/metasched.toml`
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;

/// The Fleet meta-scheduler: tracks clusters and forwarded jobs, places
/// jobs, relays their output. API: see fleet_api::api.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Configuration file (TOML; see conf/metasched.toml).
    #[arg(long, env = "FLEET_METASCHED_CONFIG")]
    config: PathBuf,
    /// Override `listen` from the configuration (e.g. 127.0.0.1:0).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the daemon");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    tracing::info!("shutting down");
}

async fn real_main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut config = fleet_metasched::Config::load(&args.config)?;
    if let Some(l) = args.listen {
        config.listen = l;
    }
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    fleet_metasched::run(listener, config, shutdown_signal()).await
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr)
        .init();
    match real_main().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet-metasched: {e:#}");
            ExitCode::FAILURE
        }
    }
}
