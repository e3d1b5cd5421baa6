//! The plugin's view of `fleet.conf`, read once at `init()`.
//!
//! `fleet.conf` sits beside slurm.conf: the directory of `$SLURM_CONF`
//! (slurmctld's environment), else `/etc/slurm`. `$FLEET_CONF` overrides.

use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Debug)]
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
    pub fn load() -> Result<Self, String> {
        let path = conf_path();
        let loaded = slurm_conf::fleet::FleetConf::load(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for w in &loaded.warnings {
            slurm::log::info(&format!("job_submit/fleet: {w}"));
        }
        Ok(Self::from_conf(&loaded.conf))
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
        }
    }
}
