//! The agent's configuration: `fleet.conf` plus what it needs from the
//! site's own `slurm.conf` (SlurmUser), and its secret token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use slurm_conf::fleet::FleetConf;

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The fleet.conf this was read from (read again on SIGHUP).
    pub source: PathBuf,
    pub site: String,
    pub region: String,
    pub provider: String,
    pub metasched_url: String,
    /// CA bundle for an https meta-scheduler (`MetaSchedulerCaFile`).
    pub metasched_ca_file: Option<PathBuf>,
    /// The agent's bearer token (shared with the meta-scheduler).
    pub token: String,
    pub socket: PathBuf,
    pub spool: PathBuf,
    pub proxy_partition: String,
    pub proxy_path: PathBuf,
    pub heartbeat: Duration,
    pub poll: Duration,
    /// `LeaseMs`: cut off from the meta-scheduler this long, the agent
    /// cancels the fleet jobs it runs (`None`: never).
    pub lease: Option<Duration>,
    /// `JobLeaseMs`: each run's in-job lease (`None`: runs go without).
    pub job_lease: Option<Duration>,
    pub view_max_age: Duration,
    pub max_script_bytes: u64,
    pub slurm_bin: PathBuf,
    /// slurm.conf the Slurm commands use (`SLURM_CONF` of the agent).
    pub slurm_conf: PathBuf,
    /// Uids allowed on the plugin socket: root, SlurmUser, AllowedSubmitUids.
    pub allowed_uids: Vec<u32>,
    /// SlurmUser's uid (root where slurm.conf names none): the one reader
    /// besides the agent of what it publishes for the plugin (the view,
    /// the stand-ins list). `None` where slurm.conf could not be read or
    /// names an unknown user.
    pub slurm_uid: Option<u32>,
    /// slurmctld schedules memory (`SelectTypeParameters` with `MEMORY`):
    /// only then do `--mem*` requests bound where a job fits, and only then
    /// does the agent report node memory for the placement rule.
    pub memory_scheduled: bool,
    pub log_level: String,
    /// `RunAsUser`: the opt-in shared user every forwarded job runs as.
    pub run_as: Option<RunAs>,
    /// Who a forwarded job runs as (`JobUserMap`, `JobUserGroup`, `MinJobUid`).
    pub identity: crate::identity::Policy,
    /// `Backend=kubernetes`: the `Kube*` settings (`None`: Slurm).
    pub kube: Option<crate::kube::KubeSettings>,
    /// `CkptStores`: the checkpoint stores file (the agent's copies; jobs
    /// get it as FLEET_CKPT_STORES unless `CkptUserStores` is set).
    pub ckpt_stores: Option<PathBuf>,
    /// `CkptUserStores`: each run's own stores file, `%u` its user here.
    pub ckpt_user_stores: Option<String>,
    /// `CkptHelper`: the `fleet-ckpt` the agent copies checkpoints with.
    pub ckpt_helper: PathBuf,
}

/// The user jobs forwarded to this cluster run as.
#[derive(Clone, Debug, PartialEq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    /// Primary group: job directories belong to it (mode 2770) so that both
    /// the job and the agent (a member) can write there.
    pub gid: u32,
}

/// (uid, primary gid) of `name` (NSS).
pub fn passwd_ids(name: &str) -> Option<(u32, u32)> {
    crate::identity::Accounts::read().ok()?.user(name)
}

pub fn default_conf_path() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("/etc/slurm"))
        .join("fleet.conf")
}

/// uid of `name` from /etc/passwd (no NSS lookups: the agent must not
/// block on a directory service).
pub fn uid_of(name: &str) -> Option<u32> {
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    passwd_ids(name).map(|(uid, _)| uid)
}

/// What in slurm.conf would break stand-ins on `ProxyPartition`. A stand-in
/// lives as long as its job elsewhere, queue wait included, and carries no
/// time limit of its own, so the partition's limits become its limits.
pub fn proxy_partition_problems(sc: &slurm_conf::slurm::SlurmConf, name: &str) -> Vec<String> {
    use slurm_conf::slurm::TimeLimit;
    let Some(p) = sc.partition(name) else {
        return vec![format!(
            "ProxyPartition={name} is not a partition here: slurmctld will refuse every forwarded job"
        )];
    };
    let mut out = Vec::new();
    let at = format!("partition {name} ({}:{})", p.file, p.line);
    if let Some(TimeLimit::Minutes(m)) = p.max_time {
        out.push(format!("{at} has MaxTime={m}: a stand-in is killed after {m} minutes and its remote job cancelled; set MaxTime=INFINITE"));
    }
    if let Some(TimeLimit::Minutes(m)) = p.default_time {
        out.push(format!("{at} has DefaultTime={m}: stand-ins get a {m}-minute limit and their remote jobs are cancelled then; remove it"));
    }
    if let Some(s) = p.state.as_deref().filter(|s| *s != "UP") {
        out.push(format!("{at} is State={s}: stand-ins will not start, so forwarded jobs never run"));
    }
    // Stand-ins hold a CPU and memory for as long as their remote job runs:
    // on nodes local jobs use, they delay local work (an --exclusive job
    // waits for them, backfill plans around them). They belong on nodes of
    // their own, in this partition only, without GPUs.
    for n in &p.nodes {
        let shared: Vec<&str> =
            sc.partitions.iter().filter(|o| o.name != p.name && o.nodes.contains(n)).map(|o| o.name.as_str()).collect();
        if !shared.is_empty() {
            out.push(format!(
                "{at} shares node {n} with partition(s) {}: stand-ins there hold CPUs and memory that local jobs need; give the proxy partition nodes of its own",
                shared.join(", ")
            ));
        }
        if sc.nodes.iter().any(|d| d.name == *n && !d.gres.is_empty()) {
            out.push(format!(
                "{at} includes node {n}, which has GRES (GPUs): stand-ins never use them; use nodes without GPUs"
            ));
        }
    }
    out
}

/// This host's name (`/proc/sys/kernel/hostname`), for
/// [`proxy_nodes_elsewhere`].
pub fn this_host() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty())
}

/// The nodes of `ProxyPartition` that are not this host (`host`), as
/// slurm.conf names them (`NodeHostname`, by default the node's name):
/// a deferred stand-in's proxy runs there, as the job's user, and asks
/// the agent on its local socket in `AgentSpoolDir`, so from another host
/// it can never reach it (the job waits until cancelled). Deferred
/// stand-ins are the default (`ForwardMode=deferred`) and every forwarded
/// GPU array. `localhost`, loopback addresses, the host's name and its
/// first label count as this host.
pub fn proxy_nodes_elsewhere(sc: &slurm_conf::slurm::SlurmConf, name: &str, host: &str) -> Vec<String> {
    let Some(p) = sc.partition(name) else { return Vec::new() };
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_ascii_lowercase();
    let here =
        |h: &str| h.eq_ignore_ascii_case("localhost") || h.starts_with("127.") || h == "::1" || short(h) == short(host);
    p.nodes
        .iter()
        .filter_map(|n| {
            let hostname = sc.nodes.iter().find(|d| d.name == *n).and_then(|d| d.hostname.clone());
            let h = hostname.as_deref().unwrap_or(n);
            (!here(h)).then(|| {
                format!(
                    "partition {name}'s node {n} (host {h}) is not this host ({host}): deferred stand-ins there \
                     cannot reach the agent's socket and wait until cancelled; run the proxy partition on the agent's host"
                )
            })
        })
        .collect()
}

impl AgentConfig {
    pub fn load(path: &Path) -> Result<Self> {
        let loaded = FleetConf::load(path).with_context(|| format!("reading {}", path.display()))?;
        for w in &loaded.warnings {
            eprintln!("fleet-agent: warning: {w}");
        }
        let c = loaded.conf;
        let url = c.meta_scheduler_url(&path.display().to_string())?.trim_end_matches('/').to_string();
        let token = std::fs::read_to_string(&c.agent_token_file)
            .with_context(|| format!("reading AgentTokenFile {}", c.agent_token_file.display()))?
            .trim()
            .to_string();
        anyhow::ensure!(!token.is_empty(), "AgentTokenFile {} is empty", c.agent_token_file.display());
        let slurm_conf = std::env::var_os("SLURM_CONF")
            .map(PathBuf::from)
            .unwrap_or_else(|| path.parent().unwrap_or(Path::new("/etc/slurm")).join("slurm.conf"));
        let mut allowed = vec![0];
        let kube = (c.backend == slurm_conf::fleet::SchedulerBackend::Kubernetes).then(|| crate::kube::KubeSettings {
            kubeconfig: c.kube_config.clone(),
            namespace: c.kube_namespace.clone(),
            image: c.kube_image.clone(),
            queue: c.kube_queue.clone(),
            service_account: c.kube_service_account.clone(),
            account_namespaces: c.kube_account_namespaces.iter().cloned().collect(),
            helper_image: c.kube_helper_image.clone(),
        });
        // Kubernetes schedules memory requests; a Kubernetes site has no slurm.conf.
        let mut memory_scheduled = kube.is_some();
        let mut slurm_uid = None;
        match slurm_conf::slurm::SlurmConf::load(&slurm_conf) {
            Ok(sc) => {
                memory_scheduled =
                    sc.conf.get("SelectTypeParameters").is_some_and(|v| v.to_ascii_uppercase().contains("MEMORY"));
                let name = sc.conf.slurm_user.as_deref().unwrap_or("root");
                slurm_uid = uid_of(name);
                match slurm_uid {
                    Some(uid) => allowed.push(uid),
                    None => eprintln!(
                        "fleet-agent: warning: {}: SlurmUser={name} is not a known user: the view and the stand-ins \
                         list are published for the agent alone, so the plugin asks the agent about every job and \
                         checks no update of a stand-in",
                        slurm_conf.display()
                    ),
                }
                for w in proxy_partition_problems(&sc.conf, &c.proxy_partition) {
                    eprintln!("fleet-agent: warning: {}: {w}", slurm_conf.display());
                }
                if let Some(host) = this_host() {
                    for w in proxy_nodes_elsewhere(&sc.conf, &c.proxy_partition, &host) {
                        eprintln!("fleet-agent: warning: {}: {w}", slurm_conf.display());
                    }
                }
            }
            Err(_) if kube.is_some() => {}
            Err(e) => eprintln!("fleet-agent: warning: cannot check {}: {e}", slurm_conf.display()),
        }
        for u in &c.allowed_submit_uids {
            let uid = match u {
                slurm_conf::fleet::UserRef::Uid(n) => Some(*n),
                slurm_conf::fleet::UserRef::Name(n) => uid_of(n),
            };
            if let Some(uid) = uid {
                allowed.push(uid);
            }
        }
        let agent_uid = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata("/proc/self").map(|m| m.uid()).context("reading /proc/self")?
        };
        let identity = crate::identity::Policy {
            mapping: crate::identity::mapping_from(c.job_user_map.as_deref(), c.run_as_user.as_deref()),
            group: c.job_user_group.clone(),
            min_uid: c.min_job_uid,
            agent_uid,
        };
        Ok(AgentConfig {
            source: path.to_path_buf(),
            kube,
            memory_scheduled,
            identity,
            site: c.site_name,
            region: c.region,
            provider: c.provider,
            metasched_url: url,
            metasched_ca_file: c.meta_scheduler_ca_file,
            ckpt_stores: c.ckpt_stores,
            ckpt_user_stores: c.ckpt_user_stores,
            ckpt_helper: c.ckpt_helper,
            token,
            socket: c.agent_socket,
            spool: c.agent_spool_dir,
            proxy_partition: c.proxy_partition,
            proxy_path: c.proxy_path,
            heartbeat: Duration::from_millis(c.heartbeat_interval_ms),
            poll: Duration::from_millis(c.poll_interval_ms),
            lease: (c.lease_ms > 0).then(|| Duration::from_millis(c.lease_ms)),
            job_lease: (c.job_lease_ms > 0).then(|| Duration::from_millis(c.job_lease_ms)),
            view_max_age: Duration::from_millis(c.view_max_age_ms),
            max_script_bytes: c.max_script_bytes,
            slurm_bin: c.slurm_bin_dir,
            slurm_conf,
            allowed_uids: allowed,
            slurm_uid,
            log_level: c.log_level.as_str().to_string(),
            run_as: match c.run_as_user {
                Some(name) => {
                    let (uid, gid) =
                        passwd_ids(&name).with_context(|| format!("RunAsUser={name}: no such user in /etc/passwd"))?;
                    Some(RunAs { name, uid, gid })
                }
                None => None,
            },
        })
    }
}

/// A fleet.conf read again (SIGHUP), merged into the running settings.
#[derive(Debug)]
pub struct Reload {
    /// The settings to run with from now on: the new file's live settings,
    /// the running ones for everything that needs a restart.
    pub cfg: AgentConfig,
    /// `Key: old -> new` of each live setting that changed.
    pub applied: Vec<String>,
    /// Keys that changed in the file but take effect only at the next start.
    pub need_restart: Vec<String>,
}

/// Merges `new` (fleet.conf just read) into `running`. Live: who jobs run
/// as (`JobUserMap`, `JobUserGroup`, `MinJobUid`, `RunAsUser`), who may use
/// the socket (`AllowedSubmitUids`), the intervals (`HeartbeatIntervalMs`,
/// `PollIntervalMs`, `ViewMaxAgeMs`), `MaxScriptBytes`, `ProxyPath` (for
/// stand-ins created from now on) and `LogLevel`. Everything else (the
/// site's name and place, the meta-scheduler, its CA and the token, the
/// socket, the spool, the proxy partition, the Slurm binaries and
/// slurm.conf, the backend) is bound at start: its change is reported and
/// left for a restart.
pub fn merge_reload(running: &AgentConfig, new: AgentConfig) -> Reload {
    let mut cfg = running.clone();
    let (mut applied, mut need_restart) = (Vec::new(), Vec::new());
    macro_rules! live {
        ($($field:ident: $key:literal),* $(,)?) => {$(
            if running.$field != new.$field {
                applied.push(format!("{}: {:?} -> {:?}", $key, running.$field, new.$field));
                cfg.$field = new.$field.clone();
            }
        )*};
    }
    macro_rules! restart {
        ($($field:ident: $key:literal),* $(,)?) => {$(
            if running.$field != new.$field {
                need_restart.push($key.to_string());
            }
        )*};
    }
    live!(
        heartbeat: "HeartbeatIntervalMs",
        poll: "PollIntervalMs",
        view_max_age: "ViewMaxAgeMs",
        max_script_bytes: "MaxScriptBytes",
        proxy_path: "ProxyPath",
        log_level: "LogLevel",
        allowed_uids: "AllowedSubmitUids",
    );
    if running.identity != new.identity || running.run_as != new.run_as {
        applied.push(format!(
            "{} JobUserGroup={} MinJobUid={} (was {} JobUserGroup={} MinJobUid={})",
            crate::identity::describe(&new.identity.mapping),
            new.identity.group,
            new.identity.min_uid,
            crate::identity::describe(&running.identity.mapping),
            running.identity.group,
            running.identity.min_uid
        ));
        cfg.identity = new.identity.clone();
        cfg.run_as = new.run_as.clone();
    }
    restart!(
        site: "SiteName",
        region: "Region",
        provider: "Provider",
        metasched_url: "MetaSchedulerUrl",
        metasched_ca_file: "MetaSchedulerCaFile",
        token: "AgentTokenFile (the token)",
        socket: "AgentSocket",
        spool: "AgentSpoolDir",
        proxy_partition: "ProxyPartition",
        slurm_bin: "SlurmBinDir",
        slurm_conf: "SLURM_CONF",
        memory_scheduled: "SelectTypeParameters (slurm.conf)",
    );
    // (KubeSettings holds paths and names only, no secret.)
    if format!("{:?}", running.kube) != format!("{:?}", new.kube) {
        need_restart.push("Backend/Kube*".to_string());
    }
    Reload { cfg, applied, need_restart }
}

#[cfg(test)]
mod tests {
    use slurm_conf::slurm::SlurmConf;

    #[test]
    fn a_reload_applies_live_settings_and_names_those_that_need_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "secret-1\n").unwrap();
        let conf = dir.path().join("fleet.conf");
        let write = |extra: &str| {
            std::fs::write(
                &conf,
                format!(
                    "SiteName=beta\nMetaSchedulerUrl=https://m.example\nAgentTokenFile={}\nAgentSpoolDir={}/spool\n\
                     HeartbeatIntervalMs=1000\n{extra}",
                    token.display(),
                    dir.path().display()
                ),
            )
            .unwrap()
        };
        write("");
        let running = super::AgentConfig::load(&conf).unwrap();
        assert_eq!(running.source, conf);

        write("HeartbeatIntervalMs=5000\nMinJobUid=2000\nJobUserGroup=gpuusers\nLogLevel=debug\nRegion=mars\n");
        std::fs::write(&token, "secret-2\n").unwrap();
        let r = super::merge_reload(&running, super::AgentConfig::load(&conf).unwrap());
        assert_eq!(r.cfg.heartbeat, std::time::Duration::from_secs(5));
        assert_eq!((r.cfg.identity.min_uid, r.cfg.identity.group.as_str()), (2000, "gpuusers"));
        assert_eq!(r.cfg.log_level, "debug");
        assert_eq!(r.cfg.region, running.region, "Region needs a restart");
        assert_eq!(r.cfg.token, "secret-1", "the token needs a restart");
        assert_eq!(r.need_restart, vec!["Region".to_string(), "AgentTokenFile (the token)".to_string()]);
        assert_eq!(r.applied.len(), 3, "{:?}", r.applied);
        assert!(r.applied[0].starts_with("HeartbeatIntervalMs: 1s -> 5s"), "{:?}", r.applied);
        assert!(r.applied.iter().any(|a| a.contains("JobUserGroup=gpuusers MinJobUid=2000")), "{:?}", r.applied);
        assert!(r.applied.iter().chain(&r.need_restart).all(|a| !a.contains("secret")), "no secret is logged");

        // Unchanged: nothing to say.
        let again = super::merge_reload(&r.cfg, r.cfg.clone());
        assert!(again.applied.is_empty() && again.need_restart.is_empty());
    }

    fn problems(conf: &str) -> Vec<String> {
        let sc =
            SlurmConf::parse_str(&format!("ClusterName=beta\nNodeName=b1 CPUs=4\n{conf}"), "slurm.conf").unwrap().conf;
        super::proxy_partition_problems(&sc, "fleet")
    }

    #[test]
    fn proxy_partition_limits_are_reported() {
        assert!(problems("PartitionName=fleet Nodes=b1 MaxTime=INFINITE State=UP").is_empty());
        assert!(problems("PartitionName=fleet Nodes=b1").is_empty());
        let p = problems(
            "NodeName=g1 CPUs=8 Gres=gpu:a100:8\nPartitionName=gpu Nodes=g1,b1\nPartitionName=fleet Nodes=b1,g1",
        );
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("shares node b1 with partition(s) gpu"), "{p:?}");
        assert!(p[2].contains("node g1, which has GRES"), "{p:?}");
        let p = problems("PartitionName=fleet Nodes=b1 MaxTime=60 DefaultTime=30 State=DOWN");
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("partition fleet (slurm.conf:3) has MaxTime=60"), "{p:?}");
        assert!(p[1].contains("DefaultTime=30"));
        assert!(p[2].contains("State=DOWN"));
        assert!(problems("PartitionName=gpu Nodes=b1")[0].contains("ProxyPartition=fleet is not a partition"));
    }

    #[test]
    fn proxy_nodes_must_be_the_agents_host() {
        let elsewhere = |conf: &str| {
            let sc = SlurmConf::parse_str(conf, "slurm.conf").unwrap().conf;
            super::proxy_nodes_elsewhere(&sc, "fleet", "head1.example.org")
        };
        assert!(
            elsewhere("NodeName=p1 NodeHostname=localhost NodeAddr=127.0.0.1\nPartitionName=fleet Nodes=p1").is_empty()
        );
        assert!(elsewhere("NodeName=head1 CPUs=4\nPartitionName=fleet Nodes=head1").is_empty());
        assert!(elsewhere("NodeName=p1 NodeHostname=HEAD1.example.org\nPartitionName=fleet Nodes=p1").is_empty());
        let w = elsewhere("NodeName=login[1-2] CPUs=4\nPartitionName=fleet Nodes=login[1-2]");
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("node login1 (host login1) is not this host (head1.example.org)"), "{w:?}");
        assert!(elsewhere("NodeName=p1\nPartitionName=gpu Nodes=p1").is_empty(), "no proxy partition: reported apart");
    }
}
