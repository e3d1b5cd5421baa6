//! Fleet's checkpoint convention (docs/checkpoints.md) and the
//! `fleet-ckpt` helper: a checkpoint is a directory of files plus a
//! manifest, `fleet-ckpt.json`, written last, with each file's relative
//! path, size and SHA-256. It is saved to, verified in, restored from and
//! copied between object stores (`object_store`: S3-compatible servers
//! and the local filesystem).

pub mod end;
pub mod lease;
pub mod location;
pub mod manifest;
pub mod ops;

pub use location::{Location, Scheme, StoreEntry, Stores};
pub use manifest::{FileEntry, Manifest, ManifestError, MANIFEST};
pub use ops::{CkptError, Client, Entry, EntryState, SaveOptions};

/// Reads a checkpoint token file (`FLEET_CKPT_TOKEN_FILE`): a regular
/// file of at most 256 bytes, not followed through a symbolic link,
/// holding hex digits (surrounding whitespace ignored).
pub fn read_token_file(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("opening the checkpoint token file {}", path.display()))?;
    if !f.metadata()?.is_file() {
        anyhow::bail!("the checkpoint token file {} is not a regular file", path.display());
    }
    let mut buf = String::new();
    f.take(257).read_to_string(&mut buf).with_context(|| format!("reading {}", path.display()))?;
    let t = buf.trim();
    if buf.len() > 256 || t.is_empty() || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        anyhow::bail!("the checkpoint token file {} does not hold a token", path.display());
    }
    Ok(t.to_string())
}

/// Tell the meta-scheduler's catalog about a checkpoint
/// (`POST {metasched}/v1/jobs/{job}/checkpoints`). `auth` is the whole
/// `Authorization` value (`FleetCkpt <checkpoint token>`, `FleetJob <job
/// token>` or `Bearer <cluster token>`).
pub async fn report(
    metasched: &str,
    ca_pem: Option<&[u8]>,
    auth: &str,
    job_id: &str,
    report: &fleet_api::api::CheckpointReport,
) -> anyhow::Result<fleet_api::api::Checkpoint> {
    use anyhow::Context;
    let mut b = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30));
    if let Some(pem) = ca_pem {
        for c in reqwest::Certificate::from_pem_bundle(pem).context("reading the CA bundle")? {
            b = b.add_root_certificate(c);
        }
    }
    let url = format!("{}/v1/jobs/{job_id}/checkpoints", metasched.trim_end_matches('/'));
    let resp = b
        .build()?
        .post(&url)
        .header(reqwest::header::AUTHORIZATION, auth)
        .json(report)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = resp.status();
    let body = resp.bytes().await.with_context(|| format!("POST {url}: reading the reply"))?;
    if !status.is_success() {
        let msg = serde_json::from_slice::<fleet_api::api::ApiError>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(300).collect());
        anyhow::bail!("POST {url}: {status}: {msg}");
    }
    serde_json::from_slice(&body).with_context(|| format!("POST {url}: the reply is not a checkpoint record"))
}
