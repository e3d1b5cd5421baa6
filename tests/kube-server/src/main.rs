//! `kube-server`: the test double of a Kubernetes API server, for the lab.

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;

/// A Kubernetes API server test double: Nodes from a file, Jobs run as local processes.
#[derive(Parser)]
struct Args {
    /// Nodes and tokens (`[[node]]`, `[[token]]`), TOML or `.json`.
    #[arg(long)]
    config: PathBuf,
    /// Port on 127.0.0.1 (0: any; the URL is printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where pods' files and logs go.
    #[arg(long)]
    work_dir: PathBuf,
    /// Serve HTTPS with a CA minted at start (written to `<work-dir>/ca.pem`).
    #[arg(long)]
    tls: bool,
    /// Write a kubeconfig (mode 0600) for each `TOKEN_NAME:NAMESPACE:PATH`.
    #[arg(long = "kubeconfig")]
    kubeconfigs: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let args = Args::parse();
    let file = kube_server::FileConf::load(&args.config)?;
    let mut cfg = kube_server::ServerConfig::new(file, &args.work_dir);
    cfg.tls = args.tls;
    let h = kube_server::start(cfg, args.port).await?;
    if let Some(ca) = &h.ca_pem {
        std::fs::write(args.work_dir.join("ca.pem"), ca)?;
    }
    for k in &args.kubeconfigs {
        let mut parts = k.splitn(3, ':');
        let (Some(user), Some(ns), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            anyhow::bail!("--kubeconfig {k:?}: expected USER:NAMESPACE:PATH");
        };
        let tok = h.state.cfg.tokens.iter().find(|t| t.user == user);
        let Some(tok) = tok else { anyhow::bail!("--kubeconfig {k:?}: no token for user {user}") };
        let _ = std::fs::remove_file(path);
        h.write_kubeconfig(std::path::Path::new(path), &tok.token, ns)?;
    }
    println!("{}", h.url);
    tokio::signal::ctrl_c().await?;
    Ok(())
}
