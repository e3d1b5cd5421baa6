//! `fleet-agent --check`: every start-up check of the agent, each printed as
//! PASS / WARN / FAIL with the reason and, on trouble, a hint; and the
//! one-agent-per-site lock ([`lock_instance`]).
//!
//! Nothing here prints a secret: the token is only ever sent to the
//! meta-scheduler, never shown.
//!
//! Run the check as the agent's own user (`sudo -u fleet fleet-agent
//! --check`): sudo rules and file modes are judged for whoever runs it.

use std::fs::File;
use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleet_agent::config::{passwd_ids, proxy_partition_problems, AgentConfig};
use fleet_agent::slurm::SlurmBackend;

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Pass(String),
    /// The agent starts, but something is likely wrong (the start logs it too).
    Warn {
        reason: String,
        hint: String,
    },
    /// The agent refuses to start, or forwarded jobs will fail.
    Fail {
        reason: String,
        hint: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub name: &'static str,
    pub outcome: Outcome,
}

fn pass(name: &'static str, reason: impl Into<String>) -> Check {
    Check { name, outcome: Outcome::Pass(reason.into()) }
}

fn fail(name: &'static str, reason: impl Into<String>, hint: impl Into<String>) -> Check {
    Check { name, outcome: Outcome::Fail { reason: reason.into(), hint: hint.into() } }
}

fn warn(name: &'static str, reason: impl Into<String>, hint: impl Into<String>) -> Check {
    Check { name, outcome: Outcome::Warn { reason: reason.into(), hint: hint.into() } }
}

/// `PASS  name  reason`, and for trouble an indented `hint:` line.
pub fn report(checks: &[Check]) -> String {
    let w = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut s = String::new();
    for c in checks {
        let (tag, reason, hint) = match &c.outcome {
            Outcome::Pass(r) => ("PASS", r, None),
            Outcome::Warn { reason, hint } => ("WARN", reason, Some(hint)),
            Outcome::Fail { reason, hint } => ("FAIL", reason, Some(hint)),
        };
        // One line per reason: a command's stderr may span several.
        let reason = reason.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
        s.push_str(&format!("{tag}  {:<w$}  {reason}\n", c.name));
        if let Some(h) = hint.filter(|h| !h.is_empty()) {
            s.push_str(&format!("      {:<w$}  hint: {h}\n", ""));
        }
    }
    let failed = checks.iter().filter(|c| matches!(c.outcome, Outcome::Fail { .. })).count();
    let warned = checks.iter().filter(|c| matches!(c.outcome, Outcome::Warn { .. })).count();
    s.push_str(&format!("{} checks: {failed} failed, {warned} warnings\n", checks.len()));
    s
}

/// Every check, in the order the agent meets them at start. `conf` is the
/// fleet.conf `cfg` was loaded from.
pub async fn run_all(conf: &Path, cfg: &AgentConfig) -> Vec<Check> {
    let me = fleet_agent::own_uid();
    let run_as = probe_job_user(cfg);
    if let Some(k) = &cfg.kube {
        // A Kubernetes site: no sudo rule, proxy partition or slurmctld.
        let mut out = vec![settings(conf, cfg), agent_user(me, cfg, run_as.as_ref())];
        out.extend(token_file(conf, run_as.as_ref()));
        out.push(spool(cfg, me, run_as.as_ref()));
        out.push(match fleet_agent::kube::check(k, &cfg.site, cfg.spool.clone()).await {
            Ok(r) => pass("kubernetes", r),
            Err((r, h)) => fail("kubernetes", r, h),
        });
        out.push(instance(&cfg.spool));
        out.push(ca_file(cfg));
        out.extend(ckpt_stores(cfg));
        out.push(meta_scheduler(cfg).await);
        return out;
    }
    let mut out = vec![settings(conf, cfg), agent_user(me, cfg, run_as.as_ref())];
    out.push(sudo_rule(cfg, run_as.as_ref()).await);
    out.extend(token_file(conf, run_as.as_ref()));
    out.push(proxy_partition(cfg));
    out.push(proxy_nodes(cfg));
    out.push(operator_role(cfg, me).await);
    out.push(libslurm(cfg));
    out.push(spool(cfg, me, run_as.as_ref()));
    let slurm_user = slurm_user(&cfg.slurm_conf);
    out.push(conf_readable(conf, slurm_user.as_ref()));
    out.push(plugin_socket(cfg, slurm_user.as_ref()));
    out.push(instance(&cfg.spool));
    out.push(ca_file(cfg));
    out.push(ckpt_helper(cfg));
    out.extend(ckpt_stores(cfg));
    out.push(meta_scheduler(cfg).await);
    out
}

/// `CkptStores`: without `CkptUserStores` every run gets it, so keys in it
/// are every user's; `CkptUserStores`: each user's file is that user's.
fn ckpt_stores(cfg: &AgentConfig) -> Vec<Check> {
    let mut out = Vec::new();
    let runs_get_it = cfg.ckpt_user_stores.is_none();
    if let Some(path) = cfg.ckpt_stores.as_deref() {
        out.push(match fleet_agent::ckpt::stores_exposure(path, cfg.kube.is_some(), runs_get_it) {
            Some(why) => warn(
                "ckpt-stores",
                why,
                "give each user a key of their own in CkptUserStores (its prefixes alone), keep CkptStores the \
                 agent's (mode 0600), or leave the keys out and let jobs bring their own (docs/checkpoints.md, \
                 \"Who can read checkpoints\")",
            ),
            None if runs_get_it => {
                pass("ckpt-stores", format!("CkptStores={} hands no store key to every user", path.display()))
            }
            None => pass("ckpt-stores", format!("CkptStores={} is the agent's alone", path.display())),
        });
    }
    if let Some(t) = &cfg.ckpt_user_stores {
        let exposed = fleet_agent::ckpt::user_stores_exposure(t);
        out.push(if exposed.is_empty() {
            pass("ckpt-user-stores", format!("CkptUserStores={t}: each run gets its user's file, none another's"))
        } else {
            warn(
                "ckpt-user-stores",
                exposed.iter().map(|(p, why)| format!("{}: {why}", p.display())).collect::<Vec<_>>().join("; "),
                "each file owned by its user, group the agent's, mode 0640 (docs/checkpoints.md, \"Who can read \
                 checkpoints\")",
            )
        });
    }
    out
}

/// `CkptHelper`: each run's first line names it under the in-job lease,
/// and the agent copies checkpoints with it, so it must be at that path
/// here and on every compute node.
fn ckpt_helper(cfg: &AgentConfig) -> Check {
    use std::os::unix::fs::PermissionsExt;
    let h = cfg.ckpt_helper.display();
    let executable =
        std::fs::metadata(&cfg.ckpt_helper).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    match (executable, cfg.job_lease) {
        (true, Some(_)) => pass(
            "ckpt-helper",
            format!("CkptHelper={h}; each forwarded run starts as `{h} lease-exec`: install fleet-ckpt at this path on every compute node too"),
        ),
        (true, None) => pass("ckpt-helper", format!("CkptHelper={h} (checkpoint copies; JobLeaseMs=0: runs go without their in-job lease)")),
        (false, Some(_)) => warn(
            "ckpt-helper",
            format!("CkptHelper={h} is not an executable file here: forwarded runs go without their in-job lease, and checkpoints are not copied between regions"),
            "install the fleet-ckpt package (or `make install`) here and on every compute node, or set CkptHelper= to where it is",
        ),
        (false, None) => warn(
            "ckpt-helper",
            format!("CkptHelper={h} is not an executable file here: checkpoints are not copied between regions"),
            "install the fleet-ckpt package here, or set CkptHelper= to where it is",
        ),
    }
}

/// What the agent will use (no secrets: the token is not shown).
fn settings(conf: &Path, cfg: &AgentConfig) -> Check {
    pass(
        "config",
        format!(
            "{}: SiteName={} MetaSchedulerUrl={} AgentSocket={} AgentSpoolDir={} ProxyPartition={} job users: {} slurm.conf={}",
            conf.display(),
            cfg.site,
            cfg.metasched_url,
            cfg.socket.display(),
            cfg.spool.display(),
            cfg.proxy_partition,
            fleet_agent::identity::describe(&cfg.identity.mapping),
            cfg.slurm_conf.display()
        ),
    )
}

/// A user jobs forwarded here would run as, to check modes and the sudo
/// rule with: the shared `RunAsUser`, or the first member of
/// `JobUserGroup` with a uid of at least `MinJobUid`.
pub fn probe_job_user(cfg: &AgentConfig) -> Option<Who> {
    if let Some(u) = &cfg.run_as {
        return Who::named(&u.name);
    }
    let acc = fleet_agent::identity::Accounts::read().ok()?;
    let name = acc
        .members(&cfg.identity.group)
        .into_iter()
        .find(|m| acc.user(m).is_some_and(|(uid, _)| uid >= cfg.identity.min_uid && uid != cfg.identity.agent_uid))?;
    Who::named(&name)
}

fn agent_user(me: u32, cfg: &AgentConfig, job_user: Option<&Who>) -> Check {
    const NAME: &str = "agent user";
    if me == 0 {
        return fail(
            NAME,
            "running as root: the agent must run as an unprivileged service user, and these checks judge sudo and file modes for whoever runs them",
            "run the agent and this check as its service user: sudo -u fleet fleet-agent --check",
        );
    }
    match job_user {
        Some(u) if u.uid == me => fail(
            NAME,
            format!("the agent runs as job user {} (uid {me}): job code could read its token and journal", u.name),
            "run the agent as its own service user (e.g. fleet), outside JobUserGroup",
        ),
        Some(u) => pass(NAME, format!("uid {me}, distinct from job users (e.g. {} uid {})", u.name, u.uid)),
        None => warn(
            NAME,
            format!(
                "uid {me}; {} has no member with a uid of at least {}: no forwarded job can run here yet",
                cfg.identity.group, cfg.identity.min_uid
            ),
            format!("add the researchers to group {}", cfg.identity.group),
        ),
    }
}

async fn sudo_rule(cfg: &AgentConfig, job_user: Option<&Who>) -> Check {
    const NAME: &str = "sudo rule";
    let Some(u) = job_user else {
        return warn(
            NAME,
            "no job user to check the sudo rule with",
            format!("add a researcher to {}", cfg.identity.group),
        );
    };
    let backend = slurm_backend(cfg);
    let bin = cfg.slurm_bin.display();
    let who = if cfg.run_as.is_some() { u.name.clone() } else { format!("%{}", cfg.identity.group) };
    let hint =
        format!("sudoers: `<agent user> ALL=({who}) NOPASSWD:SETENV: {bin}/sbatch, {bin}/scancel, {bin}/scontrol`");
    // The start's own check (sbatch), then scancel, which the start trusts.
    if let Err(e) = backend.check_sudo(&u.name).await {
        return fail(NAME, format!("{e:#}"), hint);
    }
    let scancel = cfg.slurm_bin.join("scancel");
    let out = tokio::process::Command::new("/usr/bin/sudo")
        .args(["-n", "-E", "-u", &u.name, "--"])
        .arg(&scancel)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output();
    match tokio::time::timeout(Duration::from_secs(10), out).await {
        Ok(Ok(o)) if o.status.success() => {
            pass(NAME, format!("sudo -n lets the agent run {bin}/sbatch and {bin}/scancel as {} ({who})", u.name))
        }
        Ok(Ok(o)) => fail(
            NAME,
            format!("sudo -n -u {} {}: {}", u.name, scancel.display(), String::from_utf8_lossy(&o.stderr).trim()),
            hint,
        ),
        Ok(Err(e)) => fail(NAME, format!("running /usr/bin/sudo: {e}"), "install sudo"),
        Err(_) => fail(NAME, "sudo did not answer within 10 s", hint),
    }
}

/// The token file: readable by the agent, by nobody else.
fn token_file(conf: &Path, run_as: Option<&Who>) -> Option<Check> {
    const NAME: &str = "token file";
    let loaded = slurm_conf::fleet::FleetConf::load(conf).ok()?;
    let path = loaded.conf.agent_token_file;
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) => return Some(fail(NAME, format!("{}: {e}", path.display()), "")),
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o004 != 0 {
        return Some(fail(
            NAME,
            format!("AgentTokenFile {} is world-readable ({})", path.display(), mode_text(&meta)),
            format!("chmod 0600 {} (owned by the agent's user)", path.display()),
        ));
    }
    if let Some(w) = run_as.filter(|w| w.may(&meta, 0o4)) {
        return Some(fail(
            NAME,
            format!("RunAsUser={} can read AgentTokenFile {} ({})", w.name, path.display(), mode_text(&meta)),
            format!("chmod 0600 {} (owned by the agent's user)", path.display()),
        ));
    }
    Some(pass(NAME, format!("{} ({}): not readable by job users", path.display(), mode_text(&meta))))
}

fn proxy_partition(cfg: &AgentConfig) -> Check {
    const NAME: &str = "proxy partition";
    match slurm_conf::slurm::SlurmConf::load(&cfg.slurm_conf) {
        Err(e) => fail(
            NAME,
            format!("cannot read {}: {e}", cfg.slurm_conf.display()),
            "set SLURM_CONF to the cluster's slurm.conf",
        ),
        Ok(sc) => {
            let problems = proxy_partition_problems(&sc.conf, &cfg.proxy_partition);
            if problems.is_empty() {
                pass(
                    NAME,
                    format!(
                        "{}: partition {} holds stand-ins without limits",
                        cfg.slurm_conf.display(),
                        cfg.proxy_partition
                    ),
                )
            } else {
                fail(
                    NAME,
                    problems.join("; "),
                    format!("PartitionName={} ... MaxTime=INFINITE State=UP (no DefaultTime)", cfg.proxy_partition),
                )
            }
        }
    }
}

/// Deferred stand-ins' proxies ask the agent on a local socket: the proxy
/// partition's nodes must be this host (a warning: with `ForwardMode=sync`
/// and the agent up, only forwarded arrays need it).
fn proxy_nodes(cfg: &AgentConfig) -> Check {
    const NAME: &str = "proxy nodes";
    let (Ok(sc), Some(host)) = (slurm_conf::slurm::SlurmConf::load(&cfg.slurm_conf), fleet_agent::config::this_host())
    else {
        return warn(NAME, "cannot read slurm.conf or this host's name", "");
    };
    let elsewhere = fleet_agent::config::proxy_nodes_elsewhere(&sc.conf, &cfg.proxy_partition, &host);
    if elsewhere.is_empty() {
        pass(NAME, format!("partition {}'s nodes are this host ({host})", cfg.proxy_partition))
    } else {
        warn(
            NAME,
            elsewhere.join("; "),
            format!("PartitionName={} Nodes=<a node whose NodeHostname is {host}> (its own node: see the proxy partition check)", cfg.proxy_partition),
        )
    }
}

/// The spool: the agent writes it; RunAsUser must traverse it to reach its
/// job directories (`<spool>/jobs/<id>`), or the first forwarded job dies
/// before its script starts (Slurm's `ExitCode 181:0`, `signal 53`).
fn spool(cfg: &AgentConfig, me: u32, run_as: Option<&Who>) -> Check {
    const NAME: &str = "spool dir";
    let dir = &cfg.spool;
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return warn(
                NAME,
                format!("AgentSpoolDir {} does not exist; the agent creates it with its umask", dir.display()),
                format!(
                    "create it owned by the agent's user, mode 0711: install -d -o fleet -m 0711 {}",
                    dir.display()
                ),
            )
        }
        Err(e) => return fail(NAME, format!("AgentSpoolDir {}: {e}", dir.display()), ""),
    };
    if let Some(me) = Who::from_uid(me) {
        if !me.may(&meta, 0o3) {
            return fail(
                NAME,
                format!(
                    "the agent (uid {}) cannot write AgentSpoolDir {} ({})",
                    me.uid,
                    dir.display(),
                    mode_text(&meta)
                ),
                format!("chown <agent user> {}", dir.display()),
            );
        }
    }
    let Some(w) = run_as else {
        return pass(NAME, format!("{} ({}) is the agent's", dir.display(), mode_text(&meta)));
    };
    match w.blocked_on(&dir.join("jobs")) {
        Some(block) => fail(
            NAME,
            format!("RunAsUser={} cannot traverse {}: forwarded jobs would fail before their script starts (ExitCode 181:0)", w.name, block),
            format!("chmod o+x (or 0711) on that directory; the journal stays private (0600), e.g. chmod 0711 {}", dir.display()),
        ),
        None => pass(NAME, format!("{} ({}): RunAsUser={} can reach its job directories", dir.display(), mode_text(&meta), w.name)),
    }
}

/// The Slurm commands as the checks run them (no checkpoint settings).
fn slurm_backend(cfg: &AgentConfig) -> SlurmBackend {
    SlurmBackend {
        bin: cfg.slurm_bin.clone(),
        slurm_conf: cfg.slurm_conf.clone(),
        spool: cfg.spool.clone(),
        site: cfg.site.clone(),
        ckpt: Default::default(),
        max_time: Default::default(),
    }
}

/// Under `PrivateData=jobs`, or where Slurm enforces QOS and association
/// limits, the agent's user must be a Slurm operator
/// (`SlurmBackend::check_operator_role`).
async fn operator_role(cfg: &AgentConfig, me: u32) -> Check {
    const NAME: &str = "operator role";
    let Some(name) = fleet_agent::identity::name_of_uid(me) else {
        return fail(NAME, format!("uid {me} has no name"), "");
    };
    let backend = slurm_backend(cfg);
    match backend.check_operator_role(&name).await {
        Ok(None) => pass(NAME, "neither PrivateData nor AccountingStorageEnforce needs one"),
        Ok(Some(note)) => pass(NAME, note),
        Err(e) => fail(NAME, format!("{e:#}"), "see README, \"Users\" (PrivateData, AccountingStorageEnforce)"),
    }
}

/// The start check's fast path: libslurm of the release the agent was
/// built for. Without it the agent works, through `squeue --json`, which
/// on 22.05 dumps every job and adds its time to each forwarded job's start.
fn libslurm(cfg: &AgentConfig) -> Check {
    const NAME: &str = "libslurm";
    let exe = std::env::current_exe().unwrap_or_else(|_| "fleet-agent".into());
    match fleet_agent::libslurm::enable(&exe, &cfg.slurm_conf) {
        Ok(what) => pass(NAME, format!("start checks read jobs through {what}")),
        Err(e) => warn(
            NAME,
            format!("start checks fall back to squeue --json: {e}"),
            "install the libslurm of the Slurm release fleet-agent was built for (package libslurm*)",
        ),
    }
}

/// SlurmUser from slurm.conf (Slurm's default: root).
fn slurm_user(slurm_conf: &Path) -> Option<Who> {
    let name = match slurm_conf::slurm::SlurmConf::load(slurm_conf) {
        Ok(sc) => sc.conf.slurm_user.clone().unwrap_or_else(|| "root".into()),
        Err(_) => return None,
    };
    Who::named(&name).or(Some(Who { name, uid: u32::MAX, gids: vec![] }))
}

/// slurmctld (as SlurmUser) must reach the socket and read the published
/// view, or nothing is ever forwarded and the only sign is a rate-limited
/// line in slurmctld.log.
/// job_submit_fleet.so reads fleet.conf inside slurmctld, as SlurmUser.
fn conf_readable(conf: &Path, slurm: Option<&Who>) -> Check {
    const NAME: &str = "fleet.conf";
    let Some(su) = slurm.filter(|su| su.uid != u32::MAX) else {
        return fail(NAME, "SlurmUser unknown (see plugin socket)", "");
    };
    let dir = conf.parent().unwrap_or(Path::new("/"));
    if let Some(block) = su.blocked_on(dir) {
        return fail(NAME, format!("SlurmUser={} cannot reach {}: {block}", su.name, conf.display()), "");
    }
    match std::fs::metadata(conf) {
        Ok(m) if su.may(&m, 0o4) => {
            pass(NAME, format!("SlurmUser={} can read {} ({})", su.name, conf.display(), mode_text(&m)))
        }
        Ok(m) => fail(
            NAME,
            format!(
                "SlurmUser={} cannot read {} ({}): the plugin would leave every job local",
                su.name,
                conf.display(),
                mode_text(&m)
            ),
            format!("chmod 0644 {} (it holds no secret)", conf.display()),
        ),
        Err(e) => fail(NAME, format!("{}: {e}", conf.display()), ""),
    }
}

fn plugin_socket(cfg: &AgentConfig, slurm: Option<&Who>) -> Check {
    const NAME: &str = "plugin socket";
    let Some(su) = slurm else {
        return fail(NAME, format!("cannot read SlurmUser from {}", cfg.slurm_conf.display()), "set SLURM_CONF");
    };
    if su.uid == u32::MAX {
        return fail(NAME, format!("SlurmUser={} is not a known user (NSS)", su.name), "");
    }
    let Some(dir) = cfg.socket.parent() else {
        return fail(NAME, format!("AgentSocket={} has no directory", cfg.socket.display()), "");
    };
    if let Some(block) = su.blocked_on(dir) {
        return fail(
            NAME,
            format!("SlurmUser={} cannot reach {}: {block}", su.name, cfg.socket.display()),
            format!(
                "make {} traversable by {} (e.g. mode 0755, or RuntimeDirectoryMode=0755 in the unit)",
                dir.display(),
                su.name
            ),
        );
    }
    if let Some(block) = su.blocked_on(&cfg.spool) {
        return fail(
            NAME,
            format!("SlurmUser={} cannot read the published view in AgentSpoolDir: {block}", su.name),
            format!("chmod 0711 {}", cfg.spool.display()),
        );
    }
    match std::fs::symlink_metadata(&cfg.socket) {
        Ok(m) if su.may(&m, 0o2) => {
            pass(NAME, format!("SlurmUser={} can connect to {} ({})", su.name, cfg.socket.display(), mode_text(&m)))
        }
        Ok(m) => fail(
            NAME,
            format!("SlurmUser={} cannot write the socket {} ({})", su.name, cfg.socket.display(), mode_text(&m)),
            "the socket's owner, group and mode must let SlurmUser connect",
        ),
        Err(_) => {
            pass(NAME, format!("SlurmUser={} can reach {} (the socket is created at start)", su.name, dir.display()))
        }
    }
}

fn instance(spool: &Path) -> Check {
    const NAME: &str = "one agent";
    match probe_instance(spool) {
        Ok(None) => pass(NAME, format!("no other fleet-agent holds {}", spool.join(LOCK_FILE).display())),
        Ok(Some(pid)) => warn(
            NAME,
            format!("a fleet-agent ({pid}) is running with this AgentSpoolDir; a second one would refuse to start"),
            "stop it first (systemctl stop fleet-agent) if you mean to start another",
        ),
        Err(e) => fail(NAME, format!("{}: {e}", spool.join(LOCK_FILE).display()), ""),
    }
}

fn ca_file(cfg: &AgentConfig) -> Check {
    const NAME: &str = "CA file";
    let https = cfg.metasched_url.starts_with("https://");
    let Some(path) = &cfg.metasched_ca_file else {
        return if https {
            pass(NAME, "no MetaSchedulerCaFile: the system's roots verify the meta-scheduler")
        } else if fleet_agent::cleartext_off_host(&cfg.metasched_url) {
            warn(
                NAME,
                format!("{} is plain HTTP off this host: tokens cross the network in the clear", cfg.metasched_url),
                "give fleet-metasched a certificate ([tls] in metasched.toml) and use an https:// MetaSchedulerUrl",
            )
        } else {
            pass(NAME, "plain HTTP on loopback")
        };
    };
    let pem = match fleet_api::client::read_ca_bundle(path) {
        Ok(p) => p,
        Err(e) => {
            return fail(NAME, e, "MetaSchedulerCaFile must be a PEM bundle of the CA that signed the meta-scheduler")
        }
    };
    let n = match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => certs.len(),
        Ok(_) => return fail(NAME, format!("{}: no certificate", path.display()), ""),
        Err(e) => return fail(NAME, format!("{}: {e}", path.display()), ""),
    };
    match std::fs::metadata(path) {
        // Stand-ins read it as the submitting user, whoever that is.
        Ok(m) if m.permissions().mode() & 0o004 == 0 => fail(
            NAME,
            format!(
                "{} ({}) is not world-readable: stand-ins read it as the job's user",
                path.display(),
                mode_text(&m)
            ),
            format!("chmod 0644 {}", path.display()),
        ),
        _ => pass(NAME, format!("{}: {n} certificate(s), world-readable", path.display())),
    }
}

/// `GET /v1/clusters` with the agent's token: reachable, certificate
/// accepted, token accepted, and this site known to the meta-scheduler.
async fn meta_scheduler(cfg: &AgentConfig) -> Check {
    const NAME: &str = "meta-scheduler";
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(10)).connect_timeout(Duration::from_secs(3));
    if let Some(path) = &cfg.metasched_ca_file {
        let Ok(pem) = fleet_api::client::read_ca_bundle(path) else {
            return fail(NAME, "not tried: the CA file is unusable (see above)", "");
        };
        for c in reqwest::Certificate::from_pem_bundle(&pem).unwrap_or_default() {
            b = b.add_root_certificate(c);
        }
    }
    let http = match b.build() {
        Ok(h) => h,
        Err(e) => return fail(NAME, format!("building the HTTP client: {e}"), ""),
    };
    let url = format!("{}/v1/clusters", cfg.metasched_url);
    let resp = match http.get(&url).bearer_auth(&cfg.token).send().await {
        Ok(r) => r,
        Err(e) => {
            let chain = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(": ");
            return fail(
                NAME,
                format!("GET {url}: {chain}"),
                "is fleet-metasched running and reachable from here (firewall, DNS, certificate SANs naming this host name)?",
            );
        }
    };
    let status = resp.status();
    if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
        return fail(
            NAME,
            format!("GET {url}: HTTP {}: the token was refused", status.as_u16()),
            format!("AgentTokenFile must hold the same token as the token_file of [[clusters]] name = \"{}\" in metasched.toml", cfg.site),
        );
    }
    if !status.is_success() {
        return fail(NAME, format!("GET {url}: HTTP {}", status.as_u16()), "");
    }
    let view: fleet_api::api::FleetView = match resp.json().await {
        Ok(v) => v,
        Err(e) => {
            return fail(
                NAME,
                format!("GET {url}: the reply is not a fleet view: {e}"),
                "is MetaSchedulerUrl fleet-metasched's?",
            )
        }
    };
    if !view.clusters.iter().any(|c| c.name == cfg.site) {
        return fail(
            NAME,
            format!("the meta-scheduler does not know SiteName={}", cfg.site),
            "add it as a [[clusters]] entry of metasched.toml",
        );
    }
    pass(
        NAME,
        format!("{url}: token accepted, {} cluster(s) in the fleet, {} among them", view.clusters.len(), cfg.site),
    )
}

// ---- users, groups, modes ---------------------------------------------

/// A user as file permissions see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Who {
    pub name: String,
    pub uid: u32,
    /// Primary and supplementary groups.
    pub gids: Vec<u32>,
}

impl Who {
    /// Through NSS, as the kernel will see the user's process: the
    /// primary group and every group `initgroups` gives it.
    pub fn named(name: &str) -> Option<Who> {
        let (uid, gid) = passwd_ids(name)?;
        let gids = fleet_agent::nss::group_list(name, gid);
        Some(Who { name: name.to_string(), uid, gids })
    }

    fn from_uid(uid: u32) -> Option<Who> {
        Who::named(&fleet_agent::identity::name_of_uid(uid)?)
    }

    /// May this user do `bits` (0o4 read, 0o2 write, 0o1 execute/traverse)
    /// on a file with this owner, group and mode? Root may do all but
    /// execute a file nobody may execute, which does not matter here.
    pub fn may_mode(&self, mode: u32, owner: u32, group: u32, bits: u32) -> bool {
        if self.uid == 0 {
            return true;
        }
        let granted = if owner == self.uid {
            mode >> 6
        } else if self.gids.contains(&group) {
            mode >> 3
        } else {
            mode
        } & 0o7;
        granted & bits == bits
    }

    fn may(&self, m: &std::fs::Metadata, bits: u32) -> bool {
        self.may_mode(m.mode(), m.uid(), m.gid(), bits)
    }

    /// The first directory on the way to `path` (`path` itself included,
    /// when it is an existing directory) this user cannot traverse, as
    /// `dir (mode owner:group)`. Missing components end the walk: the agent
    /// creates them.
    pub fn blocked_on(&self, path: &Path) -> Option<String> {
        let mut at = PathBuf::from("/");
        let mut comps = vec![at.clone()];
        for c in path.components().skip_while(|c| matches!(c, std::path::Component::RootDir)) {
            at.push(c);
            comps.push(at.clone());
        }
        for dir in comps {
            let Ok(m) = std::fs::metadata(&dir) else {
                return None;
            };
            if !m.is_dir() {
                return None;
            }
            if !self.may(&m, 0o1) {
                return Some(format!("{} ({})", dir.display(), mode_text(&m)));
            }
        }
        None
    }
}

/// `drwx--x--x 990:990`, as `ls -ln` shows it.
fn mode_text(m: &std::fs::Metadata) -> String {
    let mode = m.mode();
    let kind = if m.is_dir() {
        'd'
    } else if m.file_type().is_symlink() {
        'l'
    } else if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) {
        's'
    } else {
        '-'
    };
    let mut s = String::from(kind);
    for shift in [6, 3, 0] {
        let b = (mode >> shift) & 7;
        s.push(if b & 4 != 0 { 'r' } else { '-' });
        s.push(if b & 2 != 0 { 'w' } else { '-' });
        s.push(if b & 1 != 0 { 'x' } else { '-' });
    }
    format!("{s} {}:{}", m.uid(), m.gid())
}

// ---- one agent per site -------------------------------------------------

/// In `AgentSpoolDir`; holds the running agent's pid.
pub const LOCK_FILE: &str = "agent.lock";

/// Held for the agent's life: an exclusive `flock` on
/// `<AgentSpoolDir>/agent.lock`. The kernel drops it when the process ends,
/// however it ends, so a crashed agent never blocks its successor.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
}

/// Take the site's agent lock, or say which agent holds it. Call it before
/// the socket is touched: a second agent must not unlink the first one's.
pub fn lock_instance(spool: &Path) -> anyhow::Result<InstanceLock> {
    use anyhow::Context as _;
    std::fs::create_dir_all(spool).with_context(|| format!("creating AgentSpoolDir {}", spool.display()))?;
    let path = spool.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = read_pid(&mut file)
                .map_or_else(|| "another fleet-agent".to_string(), |p| format!("fleet-agent pid {p}"));
            anyhow::bail!(
                "{holder} already runs with AgentSpoolDir={} (it holds {}): one agent per site; stop it first",
                spool.display(),
                path.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(InstanceLock { _file: file })
}

/// `Some("pid N")` while an agent holds the lock, `None` when none does.
/// Takes nothing: a lock taken for the probe is released at once.
pub fn probe_instance(spool: &Path) -> std::io::Result<Option<String>> {
    let mut file = match File::open(spool.join(LOCK_FILE)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(None),
        Err(std::fs::TryLockError::WouldBlock) => {
            Ok(Some(read_pid(&mut file).map_or("pid unknown".into(), |p| format!("pid {p}"))))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut s = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(uid: u32, gids: &[u32]) -> Who {
        Who { name: "u".into(), uid, gids: gids.to_vec() }
    }

    #[test]
    fn permission_table() {
        // (user, mode, owner, group, bits, expected)
        let cases = [
            (who(1000, &[1000]), 0o700, 1000, 1000, 0o1, true),
            (who(1001, &[1001]), 0o700, 1000, 1000, 0o1, false),
            (who(1001, &[1001, 1000]), 0o710, 1000, 1000, 0o1, true),
            (who(1001, &[1001]), 0o711, 1000, 1000, 0o1, true),
            (who(1001, &[1001]), 0o711, 1000, 1000, 0o4, false),
            // The owner's bits decide for the owner, even when others have more.
            (who(1000, &[1000]), 0o077, 1000, 1000, 0o4, false),
            (who(1001, &[1000]), 0o607, 1000, 1000, 0o4, false),
            (who(1001, &[1001]), 0o755, 1000, 1000, 0o2, false),
            (who(1001, &[1001]), 0o777, 1000, 1000, 0o2 | 0o1, true),
            (who(0, &[0]), 0o000, 1000, 1000, 0o7, true),
        ];
        for (w, mode, owner, group, bits, want) in cases {
            assert_eq!(w.may_mode(mode, owner, group, bits), want, "{w:?} mode {mode:o} {owner}:{group} bits {bits:o}");
        }
    }

    #[test]
    fn traversal_finds_the_blocking_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = tmp.path().join("spool");
        std::fs::create_dir_all(spool.join("jobs")).unwrap();
        let m = std::fs::metadata(tmp.path()).unwrap();
        // A stranger: neither owner nor in the group.
        let stranger = who(m.uid().wrapping_add(4242), &[m.gid().wrapping_add(4242)]);
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o700)).unwrap();
        let got = stranger.blocked_on(&spool.join("jobs")).expect("0700 blocks");
        assert!(got.starts_with(&format!("{} (drwx------ ", spool.display())), "{got}");
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(stranger.blocked_on(&spool.join("jobs")), None);
        // A missing tail is the agent's to create; the walk stops there.
        assert_eq!(stranger.blocked_on(&spool.join("jobs/none/deeper")), None);
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(stranger.blocked_on(&spool.join("jobs")).unwrap().starts_with(&tmp.path().display().to_string()));
        // In the group: 0750 lets it through.
        let member = who(m.uid().wrapping_add(4242), &[m.gid()]);
        assert_eq!(member.blocked_on(&spool.join("jobs")), None);
    }

    #[test]
    fn second_instance_is_refused_until_the_first_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = tmp.path().join("spool");
        assert_eq!(probe_instance(&spool).unwrap(), None, "never ran");
        let first = lock_instance(&spool).unwrap();
        let pid = std::process::id();
        assert_eq!(std::fs::read_to_string(spool.join(LOCK_FILE)).unwrap(), format!("{pid}\n"));
        // flock locks belong to the open file: a second open conflicts even
        // within one process, as a second agent process would.
        let err = lock_instance(&spool).unwrap_err().to_string();
        assert!(err.contains(&format!("fleet-agent pid {pid} already runs with AgentSpoolDir=")), "{err}");
        assert!(err.contains("one agent per site"), "{err}");
        assert_eq!(probe_instance(&spool).unwrap(), Some(format!("pid {pid}")));
        drop(first);
        assert_eq!(probe_instance(&spool).unwrap(), None);
        let again = lock_instance(&spool).expect("free once the first ends");
        drop(again);
    }

    #[test]
    fn report_shows_reasons_and_hints() {
        let r = report(&[
            pass("a", "fine"),
            warn("bb", "meh", "do x"),
            fail("ccc", "broken", "do y"),
            fail("d", "broken\ntoo\n", ""),
        ]);
        let want = [
            "PASS  a    fine",
            "WARN  bb   meh",
            "           hint: do x",
            "FAIL  ccc  broken",
            "           hint: do y",
            "FAIL  d    broken; too",
            "4 checks: 2 failed, 1 warnings",
        ];
        assert_eq!(r.lines().collect::<Vec<_>>(), want, "{r}");
    }
}
