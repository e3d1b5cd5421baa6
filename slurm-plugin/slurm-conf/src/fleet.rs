//! `fleet.conf`: Fleet's site config, in slurm.conf syntax, beside
//! slurm.conf (usually `/etc/slurm/fleet.conf`).
//!
//! Keys are case-insensitive. Unknown keys and repeated keys are
//! warnings (the last value wins); a bad value is an error naming
//! file:line, the key, the value and what is expected; a missing
//! `SiteName` is an error. See `conf/fleet.conf.example` for every key.

use std::path::{Path, PathBuf};

use crate::diag::{Diagnostic, Error, Loaded};
use crate::raw::{self, Loader, Parsed};
use crate::value::{parse_bool, parse_in_range};

/// Default path of fleet.conf.
pub const DEFAULT_PATH: &str = "/etc/slurm/fleet.conf";

/// File name of the agent's wake-up datagram socket, in `AgentSpoolDir`
/// (beside `fleet_api::wire::DEFERRED_SOCKET`): the plugin sends one
/// datagram (non-blocking, no reply, failure ignored) after it made a
/// deferred stand-in, so that the agent looks for new stand-ins in Slurm
/// now rather than at its next periodic scan. The datagram's content
/// means nothing: what is forwarded is read from Slurm alone.
pub const PICKUP_SOCKET: &str = "pickup.sock";

/// `fleet.conf` in the directory of the given slurm.conf path (the
/// place Fleet looks first); [`DEFAULT_PATH`] when it has no directory.
pub fn path_beside(slurm_conf: &Path) -> PathBuf {
    match slurm_conf.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("fleet.conf"),
        _ => PathBuf::from(DEFAULT_PATH),
    }
}

/// One entry of `AllowedSubmitUids`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserRef {
    Uid(u32),
    Name(String),
}

/// `LogLevel`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// The typed fleet.conf. Field docs give the key and its default.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetConf {
    /// `SiteName` (required): this cluster's name in the fleet.
    pub site_name: String,
    /// `Region` (""): free-form, e.g. `eu-west`.
    pub region: String,
    /// `Provider` ("onprem").
    pub provider: String,
    /// `MetaSchedulerUrl`: required by the agent (see
    /// [`FleetConf::meta_scheduler_url`]), not by the plugin.
    pub meta_scheduler_url: Option<String>,
    /// `MetaSchedulerCaFile` (none: the system's roots): PEM bundle of the
    /// CA(s) that signed the meta-scheduler's certificate (https URLs).
    /// World-readable: stand-ins read it as the job's user.
    pub meta_scheduler_ca_file: Option<PathBuf>,
    /// `AgentSocket` (/run/fleet/agent.sock).
    pub agent_socket: PathBuf,
    /// `AgentTokenFile` (/etc/slurm/fleet-agent.token).
    pub agent_token_file: PathBuf,
    /// `AgentSpoolDir` (/var/lib/fleet: the systemd unit's StateDirectory).
    pub agent_spool_dir: PathBuf,
    /// `ProxyPartition` (fleet).
    pub proxy_partition: String,
    /// `ProxyPath` (/usr/libexec/fleet/fleet-proxy).
    pub proxy_path: PathBuf,
    /// `SubmitTimeoutMs` (50; 1..=5000): the plugin's hard deadline.
    pub submit_timeout_ms: u32,
    /// `FailOpen` (yes): agent trouble ⇒ the job stays local.
    pub fail_open: bool,
    /// `HeartbeatIntervalMs` (1000; 100..=3600000).
    pub heartbeat_interval_ms: u64,
    /// `PollIntervalMs` (500; 10..=3600000).
    pub poll_interval_ms: u64,
    /// `LeaseMs` (30000; 0 or 1000..=86400000): the agent's lease on the
    /// fleet jobs it runs. Cut off from the meta-scheduler for longer, it
    /// cancels them (self-fencing); 0 never does.
    pub lease_ms: u64,
    /// `JobLeaseMs` (30000; 0 or 1000..=3600000): the job lease of each run
    /// this site's agent submits (docs/failover.md): a watchdog inside the
    /// run stops it when the meta-scheduler has not renewed its lease for
    /// this long, or says the run is stale; 0 submits runs without one.
    pub job_lease_ms: u64,
    /// `ViewMaxAgeMs` (10000; 100..=86400000): an older cached fleet
    /// view ⇒ jobs stay local.
    pub view_max_age_ms: u64,
    /// `MaxScriptBytes` (1048576; 1..=1073741824).
    pub max_script_bytes: u64,
    /// `ForwardMode`: `deferred` (default: a job the published view sends
    /// away always becomes a deferred stand-in, without a round trip; the
    /// agent picks it up while it is pending) or `sync` (the plugin asks
    /// the agent, and defers only when the agent does not answer).
    pub forward_mode: ForwardMode,
    /// `AllowedSubmitUids` (empty = root and SlurmUser only): users or
    /// uids allowed on the agent socket besides those.
    pub allowed_submit_uids: Vec<UserRef>,
    /// `RunAsUser` (none): the user jobs forwarded *to* this cluster run as,
    /// distinct from the agent's own user so that job code cannot read the
    /// agent's token, signal it or edit its journal. The agent submits and
    /// cancels through `sudo -u <user>` (sbatch and scancel only). None:
    /// jobs run as the agent's user (the agent warns at start).
    pub run_as_user: Option<String>,
    /// `JobUserMap` (same): who a job forwarded here runs as — `same`: the
    /// user of the submitter's name; a path: a map file of
    /// `origin:user local_user [account]` lines (unlisted users refused).
    pub job_user_map: Option<String>,
    /// `JobUserGroup` (fleetusers): only its members ever run forwarded
    /// jobs here (the agent's sudo rule names the same group).
    pub job_user_group: String,
    /// `MinJobUid` (1000): system accounts below it never run forwarded jobs.
    pub min_job_uid: u32,
    /// `SlurmBinDir` (/usr/bin).
    pub slurm_bin_dir: PathBuf,
    /// `LogLevel` (info): error, warn, info, debug, trace.
    pub log_level: LogLevel,
    /// `Backend` (slurm): the scheduler this agent runs jobs on, `slurm`
    /// or `kubernetes` (then the `Kube*` keys apply).
    pub backend: SchedulerBackend,
    /// `KubeConfig` (none: in-cluster, or `$KUBECONFIG`): the agent's kubeconfig.
    pub kube_config: Option<PathBuf>,
    /// `KubeNamespace` (fleet): where forwarded jobs run (the agent's RBAC scope).
    pub kube_namespace: String,
    /// `KubeImage` (ubuntu:24.04): the image batch scripts run in (a job's
    /// `#FLEET image=` overrides it).
    pub kube_image: String,
    /// `KubeQueue` (none): a Kueue LocalQueue; Jobs are then created
    /// suspended with `kueue.x-k8s.io/queue-name` for Kueue to admit.
    pub kube_queue: Option<String>,
    /// `KubeServiceAccount` (none: the namespace's default): the pods' service account.
    pub kube_service_account: Option<String>,
    /// `KubeAccountNamespaces` (none): `account:namespace[,...]`, the
    /// namespace a job charged to that account runs in (others: `KubeNamespace`).
    /// The agent's RBAC covers these namespaces and `KubeNamespace`, no more.
    pub kube_account_namespaces: Vec<(String, String)>,
    /// `KubeHelperImage` (none: pods run without the in-job lease): an
    /// image holding a statically linked `fleet-ckpt` at `CkptHelper`'s
    /// path. Each pod's init container copies it into an emptyDir, and the
    /// job's container runs its script under `fleet-ckpt lease-exec`
    /// (docs/failover.md, "The in-job lease").
    pub kube_helper_image: Option<String>,
    /// `CkptStores` (none: the `AWS_*` environment): the checkpoint stores
    /// file (docs/checkpoints.md: endpoint and credentials per bucket),
    /// used by the agent to copy a checkpoint into this region before a
    /// resume and, without `CkptUserStores`, passed to every job as
    /// `FLEET_CKPT_STORES` (so a key in it is every user's).
    pub ckpt_stores: Option<PathBuf>,
    /// `CkptUserStores` (e.g. `/etc/fleet/ckpt/%u.toml`): each run's own
    /// stores file, `%u` the user the run runs as here. Set, runs get
    /// their user's file (none where it does not exist) and `CkptStores`
    /// is the agent's alone.
    pub ckpt_user_stores: Option<String>,
    /// `CkptHelper` (/usr/bin/fleet-ckpt): the `fleet-ckpt` binary the agent
    /// copies checkpoints with.
    pub ckpt_helper: PathBuf,
}

/// `ForwardMode=`: how the plugin forwards a job that must leave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForwardMode {
    Sync,
    #[default]
    Deferred,
}

/// `Backend=`: what the agent submits to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulerBackend {
    #[default]
    Slurm,
    Kubernetes,
}

/// A DNS-1123 label (namespace, queue and service account names).
fn dns_label(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.starts_with('-')
        && !v.ends_with('-')
}

/// An image reference as `KubeImage` and `KubeHelperImage` take it.
fn image_ref(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 255
        && !v.starts_with('-')
        && v.chars().all(|c| c.is_ascii_alphanumeric() || "./:-_@".contains(c))
}

impl Default for FleetConf {
    /// Every default, with an empty `site_name`.
    fn default() -> Self {
        FleetConf {
            site_name: String::new(),
            region: String::new(),
            provider: "onprem".into(),
            meta_scheduler_url: None,
            meta_scheduler_ca_file: None,
            agent_socket: "/run/fleet/agent.sock".into(),
            agent_token_file: "/etc/slurm/fleet-agent.token".into(),
            agent_spool_dir: "/var/lib/fleet".into(),
            proxy_partition: "fleet".into(),
            proxy_path: "/usr/libexec/fleet/fleet-proxy".into(),
            submit_timeout_ms: 50,
            fail_open: true,
            heartbeat_interval_ms: 1000,
            poll_interval_ms: 500,
            lease_ms: 30_000,
            job_lease_ms: 30_000,
            view_max_age_ms: 10_000,
            max_script_bytes: 1 << 20,
            forward_mode: ForwardMode::Deferred,
            allowed_submit_uids: Vec::new(),
            run_as_user: None,
            job_user_map: None,
            job_user_group: "fleetusers".into(),
            min_job_uid: 1000,
            slurm_bin_dir: "/usr/bin".into(),
            log_level: LogLevel::Info,
            backend: SchedulerBackend::Slurm,
            kube_config: None,
            kube_namespace: "fleet".into(),
            kube_image: "ubuntu:24.04".into(),
            kube_queue: None,
            kube_service_account: None,
            kube_account_namespaces: Vec::new(),
            kube_helper_image: None,
            ckpt_stores: None,
            ckpt_user_stores: None,
            ckpt_helper: "/usr/bin/fleet-ckpt".into(),
        }
    }
}

/// Every key, as documented.
pub const KEYS: &[&str] = &[
    "SiteName",
    "Region",
    "Provider",
    "MetaSchedulerUrl",
    "MetaSchedulerCaFile",
    "AgentSocket",
    "AgentTokenFile",
    "AgentSpoolDir",
    "ProxyPartition",
    "ProxyPath",
    "SubmitTimeoutMs",
    "FailOpen",
    "HeartbeatIntervalMs",
    "PollIntervalMs",
    "LeaseMs",
    "JobLeaseMs",
    "ViewMaxAgeMs",
    "MaxScriptBytes",
    "ForwardMode",
    "AllowedSubmitUids",
    "RunAsUser",
    "JobUserMap",
    "JobUserGroup",
    "MinJobUid",
    "SlurmBinDir",
    "LogLevel",
    "Backend",
    "KubeConfig",
    "KubeNamespace",
    "KubeImage",
    "KubeQueue",
    "KubeServiceAccount",
    "KubeAccountNamespaces",
    "KubeHelperImage",
    "CkptStores",
    "CkptUserStores",
    "CkptHelper",
];

impl FleetConf {
    /// Parses fleet.conf text (`Include` is not followed).
    pub fn parse_str(text: &str, origin: &str) -> Result<Loaded<FleetConf>, Error> {
        Self::from_parsed(raw::parse_str(text, origin), origin)
    }

    /// Reads and parses a fleet.conf file.
    pub fn load(path: &Path) -> Result<Loaded<FleetConf>, Error> {
        Self::load_with(path, &mut raw::FsLoader)
    }

    /// [`FleetConf::load`] through an injectable loader.
    pub fn load_with(path: &Path, loader: &mut dyn Loader) -> Result<Loaded<FleetConf>, Error> {
        let parsed = raw::load_with(path, loader)?;
        Self::from_parsed(parsed, &path.display().to_string())
    }

    /// The typed config from raw entries; `origin` names the file in the
    /// "SiteName is required" error.
    pub fn from_parsed(parsed: Parsed, origin: &str) -> Result<Loaded<FleetConf>, Error> {
        let mut diags = parsed.diagnostics;
        let mut conf = FleetConf::default();
        let mut seen: Vec<(String, String)> = Vec::new(); // (lowercase key, location)
        let mut site_seen = false;
        for e in &parsed.entries {
            for (k, v) in &e.pairs {
                let lk = k.to_ascii_lowercase();
                let loc = e.location();
                if let Some((_, first)) = seen.iter().find(|(s, _)| *s == lk) {
                    diags.push(Diagnostic::warning(
                        &e.file,
                        e.line,
                        format!("{k} repeated (first at {first}); this value wins"),
                    ));
                } else {
                    seen.push((lk.clone(), loc));
                }
                let bad = |expect: String| Diagnostic::error(&e.file, e.line, format!("{k}={v}: bad value; {expect}"));
                let r: Result<(), Diagnostic> = (|| {
                    match lk.as_str() {
                        "sitename" => {
                            if v.is_empty()
                                || !v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                            {
                                return Err(bad("expected a cluster name (letters, digits, '_', '-', '.')".into()));
                            }
                            conf.site_name = v.clone();
                            site_seen = true;
                        }
                        "region" => conf.region = v.clone(),
                        "provider" => conf.provider = v.clone(),
                        "metaschedulerurl" => {
                            if !(v.starts_with("http://") || v.starts_with("https://")) || v.len() <= "https://".len() {
                                return Err(bad("expected an http:// or https:// URL".into()));
                            }
                            conf.meta_scheduler_url = Some(v.trim_end_matches('/').to_string());
                        }
                        "metaschedulercafile" => conf.meta_scheduler_ca_file = Some(path_value(v).map_err(bad)?),
                        "ckptstores" => conf.ckpt_stores = Some(path_value(v).map_err(bad)?),
                        "ckptuserstores" => conf.ckpt_user_stores = Some(user_path_template(v).map_err(bad)?),
                        "ckpthelper" => conf.ckpt_helper = path_value(v).map_err(bad)?,
                        "agentsocket" => conf.agent_socket = path_value(v).map_err(bad)?,
                        "agenttokenfile" => conf.agent_token_file = path_value(v).map_err(bad)?,
                        "agentspooldir" => conf.agent_spool_dir = path_value(v).map_err(bad)?,
                        "proxypartition" => {
                            if v.is_empty() {
                                return Err(bad("expected a partition name".into()));
                            }
                            conf.proxy_partition = v.clone();
                        }
                        "proxypath" => conf.proxy_path = path_value(v).map_err(bad)?,
                        "submittimeoutms" => {
                            conf.submit_timeout_ms = parse_in_range(v, 1, 5000).map_err(bad)? as u32;
                        }
                        "failopen" => {
                            conf.fail_open =
                                parse_bool(v).ok_or_else(|| bad("expected yes, no, true, false, 1 or 0".into()))?;
                        }
                        "heartbeatintervalms" => {
                            conf.heartbeat_interval_ms = parse_in_range(v, 100, 3_600_000).map_err(bad)?
                        }
                        "pollintervalms" => conf.poll_interval_ms = parse_in_range(v, 10, 3_600_000).map_err(bad)?,
                        "leasems" => {
                            conf.lease_ms = match parse_in_range(v, 0, 86_400_000).map_err(bad)? {
                                n @ 1..=999 => return Err(bad(format!("{n} is below 1000 (0 turns the lease off)"))),
                                n => n,
                            }
                        }
                        "jobleasems" => {
                            conf.job_lease_ms = match parse_in_range(v, 0, 3_600_000).map_err(bad)? {
                                n @ 1..=999 => {
                                    return Err(bad(format!("{n} is below 1000 (0 turns the job lease off)")))
                                }
                                n => n,
                            }
                        }
                        "viewmaxagems" => conf.view_max_age_ms = parse_in_range(v, 100, 86_400_000).map_err(bad)?,
                        "maxscriptbytes" => conf.max_script_bytes = parse_in_range(v, 1, 1 << 30).map_err(bad)?,
                        "forwardmode" => {
                            conf.forward_mode = match v.to_ascii_lowercase().as_str() {
                                "sync" => ForwardMode::Sync,
                                "deferred" => ForwardMode::Deferred,
                                _ => return Err(bad("expected sync or deferred".into())),
                            }
                        }
                        "allowedsubmituids" => conf.allowed_submit_uids = users(v).map_err(bad)?,
                        "runasuser" => {
                            let ok = !v.is_empty()
                                && v != "root"
                                && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                            if !ok {
                                return Err(bad("expected a user name other than root".into()));
                            }
                            conf.run_as_user = Some(v.clone());
                        }
                        "jobusermap" => {
                            if v != "same" && !v.starts_with('/') {
                                return Err(bad("expected `same` or the absolute path of a map file".into()));
                            }
                            conf.job_user_map = Some(v.clone());
                        }
                        "jobusergroup" => {
                            let ok = !v.is_empty()
                                && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                            if !ok {
                                return Err(bad("expected a group name".into()));
                            }
                            conf.job_user_group = v.clone();
                        }
                        "minjobuid" => conf.min_job_uid = parse_in_range(v, 1, u32::MAX as u64).map_err(bad)? as u32,
                        "slurmbindir" => conf.slurm_bin_dir = path_value(v).map_err(bad)?,
                        "backend" => {
                            conf.backend = match v.to_ascii_lowercase().as_str() {
                                "slurm" => SchedulerBackend::Slurm,
                                "kubernetes" => SchedulerBackend::Kubernetes,
                                _ => return Err(bad("expected slurm or kubernetes".into())),
                            }
                        }
                        "kubeconfig" => conf.kube_config = Some(path_value(v).map_err(bad)?),
                        "kubenamespace" => {
                            if !dns_label(v) {
                                return Err(bad("expected a namespace name (a DNS-1123 label)".into()));
                            }
                            conf.kube_namespace = v.clone();
                        }
                        "kubeimage" => {
                            if !image_ref(v) {
                                return Err(bad("expected an image reference".into()));
                            }
                            conf.kube_image = v.clone();
                        }
                        "kubehelperimage" => {
                            if !image_ref(v) {
                                return Err(bad("expected an image reference".into()));
                            }
                            conf.kube_helper_image = Some(v.clone());
                        }
                        "kubequeue" => {
                            if !dns_label(v) {
                                return Err(bad("expected a LocalQueue name (a DNS-1123 label)".into()));
                            }
                            conf.kube_queue = Some(v.clone());
                        }
                        "kubeaccountnamespaces" => {
                            let mut map: Vec<(String, String)> = Vec::new();
                            for pair in v.split(',').map(str::trim) {
                                let Some((acct, ns)) = pair.split_once(':') else {
                                    return Err(bad(format!(
                                        "expected account:namespace[,...], \"{pair}\" has no ':'"
                                    )));
                                };
                                let acct_ok = !acct.is_empty()
                                    && acct.len() <= 64
                                    && acct.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
                                if !acct_ok {
                                    return Err(bad(format!("\"{acct}\" is not an account name")));
                                }
                                if !dns_label(ns) {
                                    return Err(bad(format!("\"{ns}\" is not a namespace name (a DNS-1123 label)")));
                                }
                                if map.iter().any(|(a, _)| a.eq_ignore_ascii_case(acct)) {
                                    return Err(bad(format!("account {acct} is mapped twice")));
                                }
                                map.push((acct.to_ascii_lowercase(), ns.to_string()));
                            }
                            conf.kube_account_namespaces = map;
                        }
                        "kubeserviceaccount" => {
                            if !dns_label(v) {
                                return Err(bad("expected a service account name (a DNS-1123 label)".into()));
                            }
                            conf.kube_service_account = Some(v.clone());
                        }
                        "loglevel" => {
                            conf.log_level = match v.to_ascii_lowercase().as_str() {
                                "error" => LogLevel::Error,
                                "warn" | "warning" => LogLevel::Warn,
                                "info" => LogLevel::Info,
                                "debug" => LogLevel::Debug,
                                "trace" => LogLevel::Trace,
                                _ => return Err(bad("expected error, warn, info, debug or trace".into())),
                            }
                        }
                        _ => {
                            diags.push(Diagnostic::warning(&e.file, e.line, format!("unknown key {k} (ignored)")));
                        }
                    }
                    Ok(())
                })();
                if let Err(d) = r {
                    diags.push(d);
                }
            }
        }
        if !site_seen && !diags.iter().any(|d| d.is_error() && d.message.starts_with("SiteName=")) {
            diags.push(Diagnostic::error(origin, 0, "SiteName is required (the name of this cluster)"));
        }
        if let Some(e) = Error::from_diagnostics(&diags) {
            return Err(e);
        }
        Ok(Loaded { conf, warnings: diags })
    }

    /// `MetaSchedulerUrl`, or an error saying it is required (the agent
    /// calls this; the plugin does not need the URL).
    pub fn meta_scheduler_url(&self, origin: &str) -> Result<&str, Error> {
        self.meta_scheduler_url.as_deref().ok_or_else(|| {
            let d = Diagnostic::error(origin, 0, "MetaSchedulerUrl is required by fleet-agent");
            Error::Invalid { first: d.clone(), all: vec![d] }
        })
    }

    /// True when `uid`/`name` is listed in `AllowedSubmitUids`.
    pub fn submit_allowed(&self, uid: u32, name: Option<&str>) -> bool {
        self.allowed_submit_uids.iter().any(|u| match u {
            UserRef::Uid(x) => *x == uid,
            UserRef::Name(n) => Some(n.as_str()) == name,
        })
    }
}

fn path_value(v: &str) -> Result<PathBuf, String> {
    if v.is_empty() || !v.starts_with('/') {
        return Err("expected an absolute path".into());
    }
    Ok(PathBuf::from(v))
}

/// An absolute path with `%u` (the user's name) in it at least once, and
/// no other `%` sequence.
fn user_path_template(v: &str) -> Result<String, String> {
    path_value(v)?;
    if !v.contains("%u") {
        return Err("expected a path with %u (the user's name), e.g. /etc/fleet/ckpt/%u.toml".into());
    }
    if v.replace("%u", "").contains('%') {
        return Err("only %u (the user's name) may follow a %".into());
    }
    Ok(v.to_string())
}

fn users(v: &str) -> Result<Vec<UserRef>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.bytes().all(|b| b.is_ascii_digit()) {
                s.parse::<u32>().map(UserRef::Uid).map_err(|_| format!("uid \"{s}\" is too large"))
            } else if s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
                Ok(UserRef::Name(s.to_string()))
            } else {
                Err(format!("expected a comma list of uids or user names, \"{s}\" is neither"))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders the result as the changed fields (vs. defaults) plus
    /// warnings, or the error diagnostics.
    fn check(input: &str, expected: Result<(FleetConf, &[&str]), &[&str]>) {
        let got = FleetConf::parse_str(input, "fleet.conf");
        match (got, expected) {
            (Ok(l), Ok((conf, warns))) => {
                assert_eq!(l.conf, conf, "input {input:?}");
                let w: Vec<String> = l.warnings.iter().map(|d| d.to_string()).collect();
                assert_eq!(w, warns, "input {input:?}");
            }
            (Err(e), Err(errs)) => {
                let got: Vec<String> = e.diagnostics().iter().map(|d| d.to_string()).collect();
                assert_eq!(got, errs, "input {input:?}");
            }
            (got, want) => panic!("input {input:?}: got {got:?}, want {want:?}"),
        }
    }

    fn site(name: &str) -> FleetConf {
        FleetConf { site_name: name.into(), ..FleetConf::default() }
    }

    #[test]
    fn fleet_conf_table() {
        check("SiteName=beta", Ok((site("beta"), &[])));
        check(
            "sitename=beta\nMETASCHEDULERURL=http://127.0.0.1:7000/\nSubmitTimeoutMs=5000 FailOpen=no\n\
             AllowedSubmitUids=\"0, 1001,slurm\"\nLogLevel=DEBUG\nRegion=eu\nProvider=aws\n\
             AgentSocket=/tmp/a.sock HeartbeatIntervalMs=100 PollIntervalMs=10 ViewMaxAgeMs=100 MaxScriptBytes=1",
            Ok((
                FleetConf {
                    site_name: "beta".into(),
                    region: "eu".into(),
                    provider: "aws".into(),
                    meta_scheduler_url: Some("http://127.0.0.1:7000".into()),
                    agent_socket: "/tmp/a.sock".into(),
                    submit_timeout_ms: 5000,
                    fail_open: false,
                    heartbeat_interval_ms: 100,
                    poll_interval_ms: 10,
                    view_max_age_ms: 100,
                    max_script_bytes: 1,
                    allowed_submit_uids: vec![UserRef::Uid(0), UserRef::Uid(1001), UserRef::Name("slurm".into())],
                    log_level: LogLevel::Debug,
                    ..FleetConf::default()
                },
                &[],
            )),
        );
        check(
            "SiteName=a\nColour=blue\nSiteName=b",
            Ok((
                site("b"),
                &[
                    "fleet.conf:2: unknown key Colour (ignored)",
                    "fleet.conf:3: SiteName repeated (first at fleet.conf:1); this value wins",
                ],
            )),
        );
        assert_eq!(site("a").forward_mode, ForwardMode::Deferred, "the default");
        check("SiteName=a\nForwardMode=Sync", Ok((FleetConf { forward_mode: ForwardMode::Sync, ..site("a") }, &[])));
        check(
            "SiteName=a\nForwardMode=Deferred",
            Ok((FleetConf { forward_mode: ForwardMode::Deferred, ..site("a") }, &[])),
        );
        check(
            "SiteName=a ForwardMode=later",
            Err(&["fleet.conf:1: ForwardMode=later: bad value; expected sync or deferred"]),
        );
        check("SiteName=a\nLeaseMs=0", Ok((FleetConf { lease_ms: 0, ..site("a") }, &[])));
        check("SiteName=a\nLeaseMs=8000", Ok((FleetConf { lease_ms: 8000, ..site("a") }, &[])));
        check("SiteName=a\nJobLeaseMs=0", Ok((FleetConf { job_lease_ms: 0, ..site("a") }, &[])));
        check("SiteName=a\nJobLeaseMs=8000", Ok((FleetConf { job_lease_ms: 8000, ..site("a") }, &[])));
        check(
            "SiteName=a\nJobLeaseMs=999",
            Err(&["fleet.conf:2: JobLeaseMs=999: bad value; 999 is below 1000 (0 turns the job lease off)"]),
        );
        // Errors name file:line, key, value and what is expected.
        check(
            "SiteName=a\nSubmitTimeoutMs=fast",
            Err(&["fleet.conf:2: SubmitTimeoutMs=fast: bad value; expected a whole number from 1 to 5000"]),
        );
        check(
            "SiteName=a\nSubmitTimeoutMs=0\nSubmitTimeoutMs=5001",
            Err(&[
                "fleet.conf:2: SubmitTimeoutMs=0: bad value; expected a whole number from 1 to 5000",
                "fleet.conf:3: SubmitTimeoutMs=5001: bad value; expected a whole number from 1 to 5000",
            ]),
        );
        check(
            "SiteName=a LeaseMs=500",
            Err(&["fleet.conf:1: LeaseMs=500: bad value; 500 is below 1000 (0 turns the lease off)"]),
        );
        check(
            "SiteName=a FailOpen=maybe",
            Err(&["fleet.conf:1: FailOpen=maybe: bad value; expected yes, no, true, false, 1 or 0"]),
        );
        check(
            "SiteName=a AgentSocket=rel.sock",
            Err(&["fleet.conf:1: AgentSocket=rel.sock: bad value; expected an absolute path"]),
        );
        check(
            "SiteName=a MetaSchedulerUrl=ftp://x",
            Err(&["fleet.conf:1: MetaSchedulerUrl=ftp://x: bad value; expected an http:// or https:// URL"]),
        );
        check(
            "SiteName=a RunAsUser=root",
            Err(&["fleet.conf:1: RunAsUser=root: bad value; expected a user name other than root"]),
        );
        check(
            "SiteName=a LogLevel=loud",
            Err(&["fleet.conf:1: LogLevel=loud: bad value; expected error, warn, info, debug or trace"]),
        );
        check(
            "SiteName=a AllowedSubmitUids=0,a;b",
            Err(&["fleet.conf:1: AllowedSubmitUids=0,a;b: bad value; expected a comma list of uids or user names, \"a;b\" is neither"]),
        );
        check(
            "SiteName=g Backend=Kubernetes KubeConfig=/etc/fleet/kubeconfig KubeNamespace=fleet-jobs\n\
             KubeImage=nvcr.io/nvidia/pytorch:24.05-py3 KubeQueue=gpu-queue KubeServiceAccount=fleet-job",
            Ok((
                FleetConf {
                    site_name: "g".into(),
                    backend: SchedulerBackend::Kubernetes,
                    kube_config: Some("/etc/fleet/kubeconfig".into()),
                    kube_namespace: "fleet-jobs".into(),
                    kube_image: "nvcr.io/nvidia/pytorch:24.05-py3".into(),
                    kube_queue: Some("gpu-queue".into()),
                    kube_service_account: Some("fleet-job".into()),
                    ..FleetConf::default()
                },
                &[],
            )),
        );
        check(
            "SiteName=g KubeAccountNamespaces=ml:team-ml,CV:team-cv",
            Ok((
                FleetConf {
                    site_name: "g".into(),
                    kube_account_namespaces: vec![("ml".into(), "team-ml".into()), ("cv".into(), "team-cv".into())],
                    ..FleetConf::default()
                },
                &[],
            )),
        );
        check(
            "SiteName=a CkptStores=/etc/fleet/ckpt-stores.toml CkptHelper=/opt/fleet/bin/fleet-ckpt",
            Ok((
                FleetConf {
                    site_name: "a".into(),
                    ckpt_stores: Some("/etc/fleet/ckpt-stores.toml".into()),
                    ckpt_helper: "/opt/fleet/bin/fleet-ckpt".into(),
                    ..FleetConf::default()
                },
                &[],
            )),
        );
        check(
            "SiteName=a CkptUserStores=/etc/fleet/ckpt/%u.toml",
            Ok((
                FleetConf {
                    site_name: "a".into(),
                    ckpt_user_stores: Some("/etc/fleet/ckpt/%u.toml".into()),
                    ..FleetConf::default()
                },
                &[],
            )),
        );
        check(
            "SiteName=a CkptUserStores=/etc/fleet/ckpt/stores.toml",
            Err(&["fleet.conf:1: CkptUserStores=/etc/fleet/ckpt/stores.toml: bad value; expected a path with %u (the user's name), e.g. /etc/fleet/ckpt/%u.toml"]),
        );
        check(
            "SiteName=a CkptUserStores=/etc/fleet/%j/%u.toml",
            Err(&["fleet.conf:1: CkptUserStores=/etc/fleet/%j/%u.toml: bad value; only %u (the user's name) may follow a %"]),
        );
        check(
            "SiteName=g KubeAccountNamespaces=ml",
            Err(&["fleet.conf:1: KubeAccountNamespaces=ml: bad value; expected account:namespace[,...], \"ml\" has no ':'"]),
        );
        check(
            "SiteName=g KubeAccountNamespaces=ml:Team_ML",
            Err(&["fleet.conf:1: KubeAccountNamespaces=ml:Team_ML: bad value; \"Team_ML\" is not a namespace name (a DNS-1123 label)"]),
        );
        check(
            "SiteName=g KubeAccountNamespaces=m;l:x",
            Err(&["fleet.conf:1: KubeAccountNamespaces=m;l:x: bad value; \"m;l\" is not an account name"]),
        );
        check(
            "SiteName=g KubeAccountNamespaces=ml:a,ML:b",
            Err(&["fleet.conf:1: KubeAccountNamespaces=ml:a,ML:b: bad value; account ML is mapped twice"]),
        );
        check(
            "SiteName=a Backend=nomad",
            Err(&["fleet.conf:1: Backend=nomad: bad value; expected slurm or kubernetes"]),
        );
        check(
            "SiteName=a KubeNamespace=Fleet_Jobs",
            Err(&["fleet.conf:1: KubeNamespace=Fleet_Jobs: bad value; expected a namespace name (a DNS-1123 label)"]),
        );
        check(
            "SiteName=a KubeImage=a;b",
            Err(&["fleet.conf:1: KubeImage=a;b: bad value; expected an image reference"]),
        );
        check(
            "SiteName=g KubeHelperImage=registry.example.org/fleet/fleet-ckpt:1.4",
            Ok((
                FleetConf { kube_helper_image: Some("registry.example.org/fleet/fleet-ckpt:1.4".into()), ..site("g") },
                &[],
            )),
        );
        check(
            "SiteName=a KubeHelperImage=-x",
            Err(&["fleet.conf:1: KubeHelperImage=-x: bad value; expected an image reference"]),
        );
        check("SiteName=a KubeConfig=kc", Err(&["fleet.conf:1: KubeConfig=kc: bad value; expected an absolute path"]));
        check("Region=eu", Err(&["fleet.conf: SiteName is required (the name of this cluster)"]));
        check("SiteName=a b", Err(&["fleet.conf:1: expected Key=Value, found \"b\""]));
        check(
            "SiteName=",
            Err(&["fleet.conf:1: SiteName=: bad value; expected a cluster name (letters, digits, '_', '-', '.')"]),
        );
    }

    #[test]
    fn meta_scheduler_url_is_required_for_the_agent() {
        let l = FleetConf::parse_str("SiteName=a", "/etc/slurm/fleet.conf").unwrap();
        assert_eq!(
            l.conf.meta_scheduler_url("/etc/slurm/fleet.conf").unwrap_err().to_string(),
            "/etc/slurm/fleet.conf: MetaSchedulerUrl is required by fleet-agent"
        );
        assert!(!l.conf.submit_allowed(0, None));
    }

    #[test]
    fn fleet_conf_sits_beside_slurm_conf() {
        assert_eq!(
            path_beside(Path::new("/tmp/fleet-lab/beta/slurm.conf")),
            PathBuf::from("/tmp/fleet-lab/beta/fleet.conf")
        );
        assert_eq!(path_beside(Path::new("slurm.conf")), PathBuf::from(DEFAULT_PATH));
    }

    #[test]
    fn load_follows_includes_through_a_loader() {
        let mut loader = |p: &Path| -> std::io::Result<Vec<u8>> {
            match p.to_str() {
                Some("/etc/slurm/fleet.conf") => Ok(b"SiteName=beta\nInclude fleet.d/timeouts.conf\n".to_vec()),
                Some("/etc/slurm/fleet.d/timeouts.conf") => Ok(b"SubmitTimeoutMs=abc\n".to_vec()),
                _ => Err(std::io::ErrorKind::NotFound.into()),
            }
        };
        let e = FleetConf::load_with(Path::new("/etc/slurm/fleet.conf"), &mut loader).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/slurm/fleet.d/timeouts.conf:1: SubmitTimeoutMs=abc: bad value; expected a whole number from 1 to 5000"
        );
    }

    #[test]
    fn example_file_parses_without_warnings() {
        let text = include_str!("../../../conf/fleet.conf.example");
        let l = FleetConf::parse_str(text, "fleet.conf.example").unwrap();
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        // Every key appears in the example: set, or (an opt-in such as
        // RunAsUser) as a commented-out `#Key=` line.
        let parsed = raw::parse_str(text, "x");
        for k in KEYS {
            let set = parsed.entries.iter().any(|e| e.get(k).is_some());
            let commented = text.lines().any(|l| l.starts_with(&format!("#{k}=")));
            assert!(set || commented, "{k} missing from the example");
        }
    }
}
