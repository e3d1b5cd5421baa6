//! The plugin's view of `fleet.conf`, read at `init()` and again whenever
//! the file changes.
//!
//! `fleet.conf` sits beside slurm.conf: the directory of `$SLURM_CONF`
//! (slurmctld's environment), else `/etc/slurm`. `$FLEET_CONF` overrides.
//!
//! Slurm 22.05 re-inits job_submit plugins at `scontrol reconfigure` only
//! when `JobSubmitPlugins` itself changed (`job_submit_plugin_reconfig`),
//! so a plugin that read fleet.conf in `init()` alone would keep the old
//! file until slurmctld restarts. [`LiveConfig`] instead looks at the
//! file's identity (inode, size, mtime: one `stat`, about a microsecond)
//! on every submission, as job_submit/lua does with its script, and reads
//! it again when it changed. The next submission after an edit uses it,
//! with or without `scontrol reconfigure`; Slurm releases that re-init
//! plugins at reconfigure (23.11 on: slurmctld restarts itself) read it at
//! `init()` as before. A changed file that does not load is logged once
//! and the last good settings are kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    pub site: String,
    pub socket: PathBuf,
    pub timeout: Duration,
    pub fail_open: bool,
    pub max_script_bytes: u64,
    /// The fleet view the agent publishes (`AgentSpoolDir/view.json`).
    pub view_path: PathBuf,
    pub view_max_age: Duration,
    /// `ProxyPartition`: only stand-ins may be in it.
    pub proxy_partition: String,
    /// `ForwardMode=deferred` (the default): a job that must leave always
    /// becomes a deferred stand-in, without asking the agent.
    pub always_defer: bool,
    /// What a deferred stand-in's script runs: `ProxyPath`, the agent's
    /// deferred socket (`AgentSpoolDir/deferred.sock`), `MetaSchedulerUrl`
    /// (none: nothing is deferred), `MetaSchedulerCaFile`, `SlurmBinDir`.
    pub proxy_path: PathBuf,
    pub deferred_socket: PathBuf,
    /// The agent's wake-up socket (`AgentSpoolDir/pickup.sock`): one
    /// datagram per deferred stand-in, never waited on.
    pub pickup_socket: PathBuf,
    pub metasched_url: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub slurm_bin: PathBuf,
}

/// Where fleet.conf is looked for.
pub fn conf_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLEET_CONF") {
        return PathBuf::from(p);
    }
    let dir = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("/etc/slurm"));
    dir.join("fleet.conf")
}

impl PluginConfig {
    /// Reads `path`: the settings and the file's warnings.
    pub fn load_from(path: &Path) -> Result<(Self, Vec<String>), String> {
        let loaded = slurm_conf::fleet::FleetConf::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((Self::from_conf(&loaded.conf), loaded.warnings.iter().map(|w| w.to_string()).collect()))
    }

    /// One line for slurmctld's log.
    pub fn describe(&self) -> String {
        format!(
            "site {} agent {} deadline {} ms fail-open {} forward {}",
            self.site,
            self.socket.display(),
            self.timeout.as_millis(),
            self.fail_open,
            if self.always_defer { "deferred" } else { "sync (deferred when the agent does not answer)" }
        )
    }

    pub fn from_conf(c: &slurm_conf::fleet::FleetConf) -> Self {
        PluginConfig {
            site: c.site_name.clone(),
            socket: c.agent_socket.clone(),
            timeout: Duration::from_millis(c.submit_timeout_ms.into()),
            fail_open: c.fail_open,
            max_script_bytes: c.max_script_bytes,
            view_path: c.agent_spool_dir.join("view.json"),
            view_max_age: Duration::from_millis(c.view_max_age_ms),
            proxy_partition: c.proxy_partition.clone(),
            always_defer: c.forward_mode == slurm_conf::fleet::ForwardMode::Deferred,
            proxy_path: c.proxy_path.clone(),
            deferred_socket: c.agent_spool_dir.join(fleet_api::wire::DEFERRED_SOCKET),
            pickup_socket: c.agent_spool_dir.join(slurm_conf::fleet::PICKUP_SOCKET),
            metasched_url: c.meta_scheduler_url.clone(),
            ca_file: c.meta_scheduler_ca_file.clone(),
            slurm_bin: c.slurm_bin_dir.clone(),
        }
    }

    pub fn for_tests(site: &str) -> Self {
        PluginConfig {
            site: site.into(),
            socket: PathBuf::from("/nonexistent/agent.sock"),
            timeout: Duration::from_millis(50),
            fail_open: true,
            max_script_bytes: 1 << 20,
            view_path: PathBuf::from("/nonexistent/view.json"),
            view_max_age: Duration::from_secs(10),
            proxy_partition: "fleet".into(),
            always_defer: false,
            proxy_path: PathBuf::from("/usr/libexec/fleet/fleet-proxy"),
            deferred_socket: PathBuf::from("/var/spool/fleet/deferred.sock"),
            pickup_socket: PathBuf::from("/nonexistent/pickup.sock"),
            metasched_url: Some("https://meta.example:16900".into()),
            ca_file: None,
            slurm_bin: PathBuf::from("/usr/bin"),
        }
    }
}

/// fleet.conf's identity: a rewrite in place changes mtime or size, a
/// replacement by rename the inode.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp { ino: m.ino(), len: m.len(), mtime: m.modified().ok() })
}

/// fleet.conf as last read, read again when the file changes.
pub struct LiveConfig {
    path: PathBuf,
    // std Mutex: held for a stat() at most, never across the agent round trip.
    inner: Mutex<Live>,
}

struct Live {
    cfg: Arc<PluginConfig>,
    stamp: Option<Stamp>,
    /// The stamp of a changed file that did not load, `Some(None)` for a
    /// file gone (said once each).
    failed: Option<Option<Stamp>>,
}

/// What a look at fleet.conf found, for slurmctld's log.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Read again; the lines to log (the new settings, the file's warnings).
    Reloaded(Vec<String>),
    /// Changed but unusable: the error (once per change); the old settings stay.
    Failed(String),
}

impl LiveConfig {
    /// Reads `path` (an error when it does not load: the plugin then fails
    /// to init, as before).
    pub fn load(path: &Path) -> Result<(Self, Vec<String>), String> {
        let st = stamp(path);
        let (cfg, warnings) = PluginConfig::load_from(path)?;
        let live = Live { cfg: Arc::new(cfg), stamp: st, failed: None };
        Ok((LiveConfig { path: path.to_path_buf(), inner: Mutex::new(live) }, warnings))
    }

    /// The settings for this submission, read again first when the file
    /// changed since the last look.
    pub fn get(&self) -> (Arc<PluginConfig>, Option<Change>) {
        // A panic under the lock elsewhere (none is known) leaves the
        // settings as they were: keep serving them.
        let mut live = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let st = stamp(&self.path);
        if st == live.stamp || live.failed.as_ref() == Some(&st) {
            return (live.cfg.clone(), None);
        }
        match PluginConfig::load_from(&self.path) {
            Ok((cfg, mut lines)) => {
                lines.insert(0, format!("fleet.conf {} changed: {}", self.path.display(), cfg.describe()));
                live.cfg = Arc::new(cfg);
                live.stamp = st;
                live.failed = None;
                (live.cfg.clone(), Some(Change::Reloaded(lines)))
            }
            Err(e) => {
                live.failed = Some(st);
                (live.cfg.clone(), Some(Change::Failed(format!("{e}; keeping the settings read before"))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(site: &str, timeout_ms: u32) -> String {
        format!(
            "SiteName={site}\nMetaSchedulerUrl=https://m.example:8443\nAgentTokenFile=/etc/slurm/t\nSubmitTimeoutMs={timeout_ms}\n"
        )
    }

    #[test]
    fn a_changed_fleet_conf_is_read_again_and_a_broken_one_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.conf");
        std::fs::write(&path, conf("beta", 50)).unwrap();
        let (live, _) = LiveConfig::load(&path).unwrap();
        let (c, change) = live.get();
        assert_eq!((c.site.as_str(), c.timeout, change), ("beta", Duration::from_millis(50), None));

        std::fs::write(&path, conf("beta", 75)).unwrap();
        let (c, change) = live.get();
        assert_eq!(c.timeout, Duration::from_millis(75));
        assert!(matches!(&change, Some(Change::Reloaded(l)) if l[0].contains("deadline 75 ms")), "{change:?}");
        // Unchanged: no new line.
        assert_eq!(live.get().1, None);

        // A half-written file: said once, the last good settings kept.
        std::fs::write(&path, "SiteName=beta\nSubmitTimeoutMs=fast\n").unwrap();
        let (c, change) = live.get();
        assert_eq!(c.timeout, Duration::from_millis(75));
        assert!(matches!(&change, Some(Change::Failed(e)) if e.contains("fleet.conf")), "{change:?}");
        assert_eq!(live.get(), (c.clone(), None));
        // Gone (an editor's rename in flight): the last good settings.
        std::fs::remove_file(&path).unwrap();
        let (c, change) = live.get();
        assert_eq!(c.timeout, Duration::from_millis(75));
        assert!(matches!(&change, Some(Change::Failed(e)) if e.contains("fleet.conf")), "{change:?}");
        assert_eq!(live.get().1, None, "said once");

        // Written whole again, replaced by rename.
        let tmp = dir.path().join("fleet.conf.new");
        std::fs::write(&tmp, conf("beta", 20)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let (c, change) = live.get();
        assert_eq!(c.timeout, Duration::from_millis(20));
        assert!(matches!(change, Some(Change::Reloaded(_))));
    }
}
