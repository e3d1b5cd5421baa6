//! `fleet-ckpt`: save, restore, list, verify and copy checkpoints by
//! Fleet's convention (docs/checkpoints.md). Exit codes: 0 done, 1 error,
//! 2 usage, 3 `restore` found no checkpoint at all (start from scratch).

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
