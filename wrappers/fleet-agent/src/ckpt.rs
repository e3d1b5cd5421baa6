//! Checkpoints at the target (docs/checkpoints.md): what a run needs to
//! report its checkpoints, and the copy of a checkpoint from another
//! region's store before a resumed run starts.
//!
//! **The checkpoint token.** A run reports checkpoints with a token that
//! only posts checkpoints of its own fleet job, and only while this cluster
//! runs it: `fleet_api::auth::ckpt_token(<this cluster's token>, <job id>)`
//! (the meta-scheduler recomputes it). It is written into the run's private
//! directory (`<spool>/jobs/<id>/.fleet-ckpt-token`: the directory is 0700
//! with an ACL for the job's user alone, the file 0640 with the directory's
//! default ACL), and the job is told its *path* (`FLEET_CKPT_TOKEN_FILE`).
//! Not its value in the environment: the variables of a job travel on
//! sbatch's command line (`--export`, visible in `ps` to every user of
//! this host while sbatch runs), and a job's environment is inherited by
//! everything it starts.
//!
//! **The copy.** When the assignment's checkpoint lies only in another
//! region's store (`resume_copy_to` set), the agent copies it into this
//! region's store with `fleet-ckpt copy` (every digest checked, manifest
//! last) before it submits, reports the copy to the catalog with its
//! bytes and seconds (the cross-region transfer, for egress accounting),
//! and the job's `FLEET_RESUME_FROM` names the copy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The name of the token file in a run's directory.
pub const TOKEN_FILE: &str = ".fleet-ckpt-token";

/// Longest a copy may take before the resume is retried.
pub const COPY_TIMEOUT: Duration = Duration::from_secs(1800);

/// What every run at this cluster gets for its checkpoints.
#[derive(Clone, Debug, Default)]
pub struct JobCkpt {
    /// `MetaSchedulerUrl`, as `FLEET_METASCHED_URL`.
    pub metasched_url: String,
    /// `MetaSchedulerCaFile` (world-readable), as `FLEET_METASCHED_CA`.
    pub ca_file: Option<PathBuf>,
    /// This cluster's token: the key of the runs' checkpoint tokens.
    pub cluster_token: String,
    /// `CkptStores`, as `FLEET_CKPT_STORES`.
    pub stores: Option<PathBuf>,
}

/// Whether `v` travels intact in sbatch's comma-separated `--export`.
fn exportable(v: &str) -> bool {
    !v.is_empty() && v.len() <= 4096 && v.chars().all(|c| c.is_ascii_graphic() && !matches!(c, ',' | '"' | '\'' | '\\'))
}

impl JobCkpt {
    /// Writes the run's checkpoint token into its directory `dir` (made by
    /// `jobdir::create`) and returns the variables that tell the job where
    /// things are (none is secret). Without a cluster token (tests),
    /// no token and no report settings.
    pub fn prepare(&self, id: &str, dir: &Path) -> Result<Vec<(&'static str, String)>> {
        let mut env = Vec::new();
        if let Some(s) = self.stores.as_ref().map(|p| p.display().to_string()).filter(|s| exportable(s)) {
            env.push(("FLEET_CKPT_STORES", s));
        }
        if self.cluster_token.is_empty() || !exportable(&self.metasched_url) {
            return Ok(env);
        }
        let path = dir.join(TOKEN_FILE);
        let shown = path.display().to_string();
        if !exportable(&shown) {
            return Ok(env);
        }
        crate::jobdir::write_private(&path, fleet_api::auth::ckpt_token(&self.cluster_token, id).as_bytes())?;
        env.push(("FLEET_METASCHED_URL", self.metasched_url.clone()));
        env.push(("FLEET_CKPT_TOKEN_FILE", shown));
        if let Some(ca) = self.ca_file.as_ref().map(|p| p.display().to_string()).filter(|s| exportable(s)) {
            env.push(("FLEET_METASCHED_CA", ca));
        }
        Ok(env)
    }
}

/// A copy `fleet-ckpt copy --json` made.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct Copied {
    pub from: String,
    pub url: String,
    pub seq: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub manifest_sha256: String,
}

/// Reads the one JSON line `fleet-ckpt copy --json` prints.
pub fn parse_copied(stdout: &[u8]) -> Result<Copied> {
    let text = std::str::from_utf8(stdout).context("fleet-ckpt copy printed something other than UTF-8")?;
    let line =
        text.lines().rev().find(|l| l.trim_start().starts_with('{')).context("fleet-ckpt copy printed no result")?;
    let c: Copied = serde_json::from_str(line).with_context(|| format!("fleet-ckpt copy printed {line:?}"))?;
    if c.manifest_sha256.len() != 64 || !c.seconds.is_finite() || c.seconds < 0.0 {
        bail!("fleet-ckpt copy printed an implausible result: {line:?}");
    }
    Ok(c)
}

/// Copies checkpoint `src` under `dst_prefix` with `helper` (`fleet-ckpt`),
/// through the stores file `stores` when the site has one. The helper
/// runs as the agent, with a minimal environment plus the agent's `AWS_*`.
pub async fn copy(helper: &Path, stores: Option<&Path>, src: &str, dst_prefix: &str) -> Result<Copied> {
    let mut c = tokio::process::Command::new(helper);
    c.env_clear().env("PATH", "/usr/local/bin:/usr/bin:/bin");
    for (k, v) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("AWS_")) {
            c.env(k, v);
        }
    }
    if let Some(s) = stores {
        c.arg("--stores").arg(s);
    }
    c.args(["--json", "copy", "--", src, dst_prefix]).kill_on_drop(true);
    let out = tokio::time::timeout(COPY_TIMEOUT, c.output())
        .await
        .with_context(|| format!("copying {src}: no answer in {} s", COPY_TIMEOUT.as_secs()))?
        .with_context(|| format!("running {}", helper.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "fleet-ckpt copy {src} {dst_prefix}: {}: {}",
            out.status,
            err.trim().chars().take(500).collect::<String>()
        );
    }
    parse_copied(&out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_results_are_read_strictly() {
        let good = br#"{"from":"s3://w/j/ckpt-000000000002","url":"s3://e/j/ckpt-000000000002","seq":2,"bytes":10,"seconds":0.5,"manifest_sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#;
        let c = parse_copied(good).unwrap();
        assert_eq!((c.seq, c.bytes, c.url.as_str()), (2, 10, "s3://e/j/ckpt-000000000002"));
        for bad in [&b""[..], b"copied x -> y", b"{\"from\":1}", &good[..good.len() - 1], b"\xff\xfe"] {
            assert!(parse_copied(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let short = String::from_utf8_lossy(good).replace(&"a".repeat(64), "ab");
        assert!(parse_copied(short.as_bytes()).is_err());
    }

    #[test]
    fn the_token_file_is_private_and_only_its_path_is_exported() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("job");
        std::fs::create_dir(&dir).unwrap();
        let k = JobCkpt {
            metasched_url: "https://ms:8443".into(),
            ca_file: Some("/etc/fleet/ca.pem".into()),
            cluster_token: "alpha-secret".into(),
            stores: Some("/etc/fleet/ckpt,stores.toml".into()),
        };
        let env = k.prepare("beta-7", &dir).unwrap();
        let token = fleet_api::auth::ckpt_token("alpha-secret", "beta-7");
        let path = dir.join(TOKEN_FILE);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), token);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o007, 0, "nothing for others");
        let want = vec![
            ("FLEET_METASCHED_URL", "https://ms:8443".to_string()),
            ("FLEET_CKPT_TOKEN_FILE", path.display().to_string()),
            ("FLEET_METASCHED_CA", "/etc/fleet/ca.pem".to_string()),
        ];
        assert_eq!(env, want, "a stores path with a comma cannot travel in --export");
        assert!(env.iter().all(|(_, v)| !v.contains(&token)), "the token itself is never exported");
        // A second prepare never overwrites or follows an existing entry.
        assert!(k.prepare("beta-7", &dir).is_err());
        // Without a cluster token: nothing to report with.
        let none = JobCkpt { cluster_token: String::new(), ..k.clone() };
        let d2 = tmp.path().join("j2");
        std::fs::create_dir(&d2).unwrap();
        assert_eq!(none.prepare("x", &d2).unwrap(), vec![]);
        assert!(!d2.join(TOKEN_FILE).exists());
    }
}
