//! The Kubernetes backend: a forwarded Slurm job runs as a `batch/v1` Job.
//!
//! * **Translation** ([`translate`], pure, table-tested): the script and an
//!   entry wrapper in a ConfigMap, the submission environment in a Secret,
//!   GPUs as `nvidia.com/gpu` limits (a MIG profile as
//!   `nvidia.com/mig-<profile>`), the GPU type as required node affinity on
//!   `nvidia.com/gpu.product`, CPUs and memory as requests (memory also as
//!   limit), the time limit as `activeDeadlineSeconds`, `--nodes=N>1` as an
//!   Indexed Job of N pods with a headless Service, Slurm's variables in the
//!   pod environment. Every object carries `app.kubernetes.io/managed-by=fleet`
//!   and `fleet.io/job-id`; ConfigMap, Secret and Service are owned by the
//!   Job, so deleting it (background propagation) removes them all.
//! * **Lifecycle**: the Job is created suspended, its dependents next, then
//!   it is released (or left for Kueue to admit when `KubeQueue` names a
//!   LocalQueue). Jobs and Pods of this agent are *watched* (kube-runtime
//!   reflectors, resourceVersion and bookmarks, re-listing on 410), never
//!   polled; [`native_state`] maps their conditions to Slurm's state names
//!   so that the agent's tracker reports them like any Slurm job.
//! * **Output**: each pod's log is followed into the job directory's
//!   `stdout` file, which the agent's relay reads as for a Slurm job
//!   (whole lines from each pod; stdout and stderr are one stream in
//!   Kubernetes). A terminal state is reported only after every pod's log
//!   has been read to its end.
//!
//! Invariant: the agent touches only objects it created: every call is
//! namespaced, by a name it minted (`fleet-<native id>`), or by the
//! `managed-by=fleet` label selector.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use ::kube::runtime::reflector::{self, Store};
use ::kube::runtime::{watcher, WatchStreamExt};
use anyhow::{anyhow, bail, Context, Result};
use fleet_api::api::{GpuQuota, NodeCapacity};
use fleet_api::placement::Demand;
use fleet_api::{JobRequest, JobState};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod, ResourceQuota, Secret, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;
use parking_lot::Mutex;
use serde_json::json;

use crate::backend::{Backend, Capacity, NativeJob, SignalScope};
use crate::identity::LocalUser;

pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const JOB_ID_LABEL: &str = "fleet.io/job-id";
pub const NATIVE_ID_LABEL: &str = "fleet.io/native-id";
pub const GPU: &str = "nvidia.com/gpu";
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
pub const MIG_PREFIX: &str = "nvidia.com/mig-";
/// Annotation set when a Job's dependents exist and it was released (or
/// handed to Kueue): a Job without it is half-made.
pub const COMPLETE_ANNOTATION: &str = "fleet.io/submitted";
/// The field selector of pods that hold capacity.
const BUSY_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";
/// How long the record of a cancelled Job is kept for `accounting`.
const CANCEL_RECORD_DAYS: u64 = 7;
const SCRIPT_DIR: &str = "/fleet/job";
const WORK_DIR: &str = "/fleet/work";
/// A leased pod's own writable directory (an emptyDir): its lease
/// watchdog's log and note (`FLEET_LEASE_DIR`); /fleet/job is a read-only
/// ConfigMap.
pub const RUN_DIR: &str = "/fleet/run";
/// The job container's termination message file (Kubernetes' default
/// path, named explicitly): the watchdog writes its stop line there, and
/// the kubelet puts it in the pod's status when the container ends.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Where the run's checkpoint Secret is mounted (read-only).
pub const CKPT_DIR: &str = "/fleet/ckpt";
/// Largest stores file or CA bundle put into a checkpoint Secret (a Secret
/// holds at most 1 MiB).
const CKPT_FILE_MAX: u64 = 256 * 1024;

/// The site's Kubernetes settings (fleet.conf `Kube*` keys).
#[derive(Clone, Debug)]
pub struct KubeSettings {
    /// `KubeConfig`: a kubeconfig file; `None`: in-cluster or `$KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// `KubeNamespace`: where the agent's objects live (its RBAC's scope).
    pub namespace: String,
    /// `KubeImage`: the image scripts run in, unless a job's
    /// `#FLEET image=` names another.
    pub image: String,
    /// `KubeQueue`: a Kueue LocalQueue; Jobs are then created suspended
    /// with `kueue.x-k8s.io/queue-name` and Kueue admits them (all pods at once).
    pub queue: Option<String>,
    /// `KubeServiceAccount`: the pods' service account (no token mounted).
    pub service_account: Option<String>,
    /// `KubeAccountNamespaces`: account (lower case) -> the namespace its
    /// jobs run in; other jobs run in `namespace`.
    pub account_namespaces: BTreeMap<String, String>,
    /// `KubeHelperImage`: the image whose `fleet-ckpt` (at `CkptHelper`'s
    /// path) each pod's init container copies into an emptyDir, so that the
    /// job runs under its in-job lease (`None`: pods go without).
    pub helper_image: Option<String>,
}

impl KubeSettings {
    /// The namespace of a job charged to `account`.
    pub fn namespace_for(&self, account: Option<&str>) -> &str {
        account
            .and_then(|a| self.account_namespaces.get(&a.to_ascii_lowercase()))
            .map_or(self.namespace.as_str(), String::as_str)
    }

    /// Those of the admitted `origin:user` pairs `users` whose jobs run in
    /// namespace `ns` (`accounts`: the account a pair's map line names).
    pub fn users_in(&self, users: &[String], accounts: &[(String, String)], ns: &str) -> Vec<String> {
        users
            .iter()
            .filter(|u| {
                let account = accounts.iter().find(|(p, _)| p == *u).map(|(_, a)| a.as_str());
                self.namespace_for(account) == ns
            })
            .cloned()
            .collect()
    }

    /// Every namespace the agent works in (its RBAC's scope): `namespace` first.
    pub fn namespaces(&self) -> Vec<String> {
        let mut out = vec![self.namespace.clone()];
        for ns in self.account_namespaces.values() {
            if !out.contains(ns) {
                out.push(ns.clone());
            }
        }
        out
    }
}

/// What [`translate`] needs besides the request.
#[derive(Clone, Debug)]
pub struct Translate<'a> {
    pub site: &'a str,
    pub fleet_id: &'a str,
    pub native_id: u64,
    pub user: &'a LocalUser,
    pub settings: &'a KubeSettings,
    /// `nvidia.com/gpu.product` values of the nodes, for the GPU type's affinity.
    pub products: &'a [String],
    /// The mapped user's supplementary groups at this site (as `sudo -u`
    /// gives them on the Slurm path): the pods' `supplementalGroups`.
    pub groups: &'a [u32],
    /// What the run checkpoints with (`None`: no checkpoint settings).
    pub ckpt: Option<&'a CkptMount>,
    /// The run's in-job lease (`None`: the pod goes without).
    pub lease: Option<&'a PodLease>,
}

/// Where the in-job lease's helper lands in the pod (an emptyDir).
pub const HELPER_DIR: &str = "/fleet/bin";

/// A pod under its in-job lease (docs/failover.md): an init container of
/// the site's helper image (`KubeHelperImage`) copies its `fleet-ckpt`
/// (`fleet-ckpt install-self`) into an emptyDir at [`HELPER_DIR`], and the
/// job's container runs `fleet-ckpt lease-exec` on the entry script, which
/// renews with the run's checkpoint token (its Secret, mounted read-only:
/// the only place the credential is) and stops the pod's processes once
/// the meta-scheduler stops vouching for the run. The pod shares one PID
/// namespace (`shareProcessNamespace`), so the job's shell is not the
/// namespace's init, which no signal from inside could stop.
#[derive(Clone, Debug, PartialEq)]
pub struct PodLease {
    /// `KubeHelperImage`.
    pub image: String,
    /// `CkptHelper`: the path of `fleet-ckpt` inside that image.
    pub helper: String,
    /// `JobLeaseMs`.
    pub lease: Duration,
}

impl PodLease {
    /// The lease of the runs at this site: a helper image, a lease length,
    /// and a helper path an init container can run. `None` otherwise (with
    /// a warning when only the path is wrong).
    pub fn of(settings: &KubeSettings, k: &crate::ckpt::JobCkpt) -> Option<PodLease> {
        let image = settings.helper_image.clone()?;
        let lease = k.job_lease?;
        let helper = k.helper.display().to_string();
        let ok = k.helper.is_absolute()
            && helper.len() <= 255
            && helper.chars().all(|c| c.is_ascii_graphic() && !matches!(c, '\\' | '"' | '\''));
        if !ok {
            tracing::warn!(helper = %helper, "CkptHelper is not a path an init container can run: pods go without their job lease");
            return None;
        }
        Some(PodLease { image, helper, lease })
    }
}

/// The run's checkpoint settings, mounted from a Secret of its own
/// (`fleet-<native id>-ckpt`, read-only at [`CKPT_DIR`], mode 0440 with the
/// pod's `fsGroup` the user's group): the token is never in the pod spec,
/// in an environment variable, or readable by another user's pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CkptMount {
    /// `MetaSchedulerUrl`, as `FLEET_METASCHED_URL` (empty: no reports).
    pub metasched_url: String,
    /// The run's checkpoint token (`fleet_api::auth::ckpt_token`), as the
    /// file `token` (empty: none).
    pub token: String,
    /// The stores file's contents (endpoints and credentials: the run's
    /// user's own `CkptUserStores`, else `CkptStores`), as `stores.toml`.
    pub stores: Option<Vec<u8>>,
    /// The meta-scheduler's CA bundle (`MetaSchedulerCaFile`), as `ca.pem`.
    pub ca: Option<Vec<u8>>,
}

impl CkptMount {
    /// What a run of fleet job `id` for local user `user` gets from `k`
    /// (files read here, each at most 256 KiB; a missing one is an error
    /// naming it). The user's own stores file (`CkptUserStores`) is read
    /// only as a regular, singly-linked file that user owns, never through
    /// a symlink at its last component: the template may name a place the
    /// user controls (`/home/%u/...`), and the agent must not put a file
    /// of its own, or of another user, into this user's pod. It may be
    /// missing (the run then gets no stores file).
    pub fn of(k: &crate::ckpt::JobCkpt, id: &str, user: &crate::identity::LocalUser) -> Result<Option<CkptMount>> {
        use std::io::Read;
        let limited = |f: std::fs::File, p: &std::path::Path, what: &str| -> Result<Vec<u8>> {
            let mut buf = Vec::new();
            f.take(CKPT_FILE_MAX + 1)
                .read_to_end(&mut buf)
                .with_context(|| format!("reading {what} {}", p.display()))?;
            if buf.len() as u64 > CKPT_FILE_MAX {
                bail!("{what} {} is larger than {CKPT_FILE_MAX} bytes: too large for the run's Secret", p.display());
            }
            Ok(buf)
        };
        let read = |p: &std::path::Path, what: &str| -> Result<Vec<u8>> {
            let f = std::fs::File::open(p).with_context(|| format!("reading {what} {}", p.display()))?;
            limited(f, p, what)
        };
        let stores = match (&k.user_stores, k.stores_of(&user.name)) {
            (_, None) => None,
            (None, Some(p)) => Some(read(&p, "CkptStores")?),
            (Some(_), Some(p)) => match crate::jobdir::open_output(&p, Some(user.uid))? {
                crate::jobdir::Opened::Missing => None,
                crate::jobdir::Opened::Refused(why) => {
                    bail!("CkptUserStores {} of {} is refused: {why}", p.display(), user.name)
                }
                crate::jobdir::Opened::File(f, _) => Some(limited(f, &p, "CkptUserStores")?),
            },
        };
        let reports = !k.cluster_token.is_empty() && !k.metasched_url.is_empty();
        if stores.is_none() && !reports {
            return Ok(None);
        }
        let (token, metasched_url, ca) = if reports {
            let ca = k.ca_file.as_deref().map(|p| read(p, "MetaSchedulerCaFile")).transpose()?;
            (fleet_api::auth::ckpt_token(&k.cluster_token, id), k.metasched_url.clone(), ca)
        } else {
            (String::new(), String::new(), None)
        };
        Ok(Some(CkptMount { metasched_url, token, stores, ca }))
    }
}

/// The objects of one job.
#[derive(Clone, Debug)]
pub struct Objects {
    pub job: Job,
    pub script: ConfigMap,
    pub env: Option<Secret>,
    /// The checkpoint Secret ([`CkptMount`]).
    pub ckpt: Option<Secret>,
    pub service: Option<Service>,
}

pub fn job_name(native_id: u64) -> String {
    format!("fleet-{native_id}")
}

fn native_id_of(name: &str) -> Option<u64> {
    name.strip_prefix("fleet-")?.parse().ok()
}

/// A label value (63 characters of `[A-Za-z0-9_.-]`, alphanumeric at both
/// ends) made from `s`; the exact value goes into an annotation.
pub fn label_value(s: &str) -> String {
    let mut v: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).take(63).collect();
    while v.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        v.pop();
    }
    while v.starts_with(|c: char| !c.is_ascii_alphanumeric()) {
        v.remove(0);
    }
    v
}

/// Fleet's short GPU type from a GPU feature discovery product label:
/// `NVIDIA-H100-80GB-HBM3` → `h100`, `Tesla-V100-SXM2-16GB` → `v100`.
pub fn gpu_type_of_product(product: &str) -> String {
    let mut parts = product.split(['-', '_', ' ']).filter(|p| !p.is_empty()).peekable();
    while let Some(p) = parts.peek() {
        if ["nvidia", "tesla", "geforce", "rtx"].contains(&p.to_ascii_lowercase().as_str()) && parts.clone().count() > 1
        {
            parts.next();
        } else {
            break;
        }
    }
    parts.next().unwrap_or(product).to_ascii_lowercase()
}

/// A MIG profile named as a GPU type (`1g.10gb`, `a100_3g.40gb`,
/// `mig-2g.20gb`) → the profile (`1g.10gb`).
pub fn mig_profile(gpu_type: &str) -> Option<String> {
    let t = gpu_type.to_ascii_lowercase();
    let last = t.rsplit(['_', '-']).next()?;
    let (g, mem) = last.split_once("g.")?;
    let ok = !g.is_empty()
        && g.chars().all(|c| c.is_ascii_digit())
        && mem.strip_suffix("gb").is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()));
    ok.then(|| last.to_string())
}

/// `#FLEET image=<ref>` in the script's leading comment block.
pub fn image_directive(script: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(script);
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with("#!") {
            continue;
        }
        if !l.starts_with('#') {
            break;
        }
        if let Some(rest) = l.strip_prefix("#FLEET") {
            for word in rest.split_whitespace() {
                if let Some(img) = word.strip_prefix("image=") {
                    if fleet_api::options::check_image(img).is_ok() {
                        return Some(img.to_string());
                    }
                }
            }
        }
    }
    None
}

/// A Slurm hostlist of the pods' host names: `fleet-7-[0-3]`.
pub fn hostlist(name: &str, n: u32) -> String {
    match n {
        0 | 1 => format!("{name}-0"),
        n => format!("{name}-[0-{}]", n - 1),
    }
}

/// Environment variable names Kubernetes accepts.
fn env_name_ok(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

/// The wrapper the container runs: per-pod Slurm variables from the
/// completion index, then the user's script in the shared working directory.
const ENTRY: &str = r#"#!/bin/bash
# Fleet: per-pod Slurm variables (the script runs once per node, as under
# `srun --ntasks-per-node=1`), then the batch script.
export SLURM_NODEID="${JOB_COMPLETION_INDEX:-0}"
export SLURM_PROCID="$SLURM_NODEID"
export SLURM_LOCALID=0
export SLURMD_NODENAME="$(hostname 2>/dev/null || echo "$HOSTNAME")"
exec /bin/bash "$(dirname "$0")/script" "$@"
"#;

/// The entry of one job: [`ENTRY`] with the umask and the soft resource
/// limits its sbatch had at home (which slurmstepd would give its tasks),
/// each limit no higher than the container's hard one. Only numbers the
/// agent formats reach the text.
pub fn entry_for(req: &JobRequest) -> String {
    let mut setup = String::new();
    if let Some(m) = crate::slurm::submit_umask(req) {
        setup.push_str(&format!("umask {m:04o}\n"));
    }
    for l in crate::slurm::submit_limits(req) {
        let (flag, unit) = l.ulimit;
        let v = if l.wanted == libc::RLIM_INFINITY { "unlimited".to_string() } else { (l.wanted / unit).to_string() };
        setup.push_str(&format!("ulimit -S -{flag} {v} 2>/dev/null || ulimit -S -{flag} hard 2>/dev/null\n"));
    }
    if setup.is_empty() {
        return ENTRY.to_string();
    }
    let at = ENTRY.rfind("exec ").unwrap_or(ENTRY.len());
    format!("{}# The submitter's umask and soft limits at home.\n{setup}{}", &ENTRY[..at], &ENTRY[at..])
}

fn q(s: impl Into<String>) -> Quantity {
    Quantity(s.into())
}

/// Translate a fleet job into Kubernetes objects (pure).
pub fn translate(t: &Translate, req: &JobRequest) -> Result<Objects> {
    let script = req.script.as_deref().ok_or_else(|| anyhow!("job {} carries no script", t.fleet_id))?;
    let d = Demand::of(req);
    let name = job_name(t.native_id);
    // Only the account the site's identity map gives chooses the namespace
    // (its quota, queue and policies): never the `-A` its user typed.
    let ns = t.settings.namespace_for(t.user.mapped_account.as_deref()).to_string();
    let nodes = d.min_nodes.max(1);
    if nodes > 1024 {
        bail!("{nodes} nodes: more than an Indexed Job of this backend runs (1024)");
    }
    let gpus = req.gpus_per_node();
    let tasks_per_node = match (d.tasks, d.tasks_per_node) {
        (_, Some(t)) => t,
        (Some(t), None) => t.div_ceil(nodes),
        (None, None) => 1,
    };
    let tasks = d.tasks.unwrap_or(tasks_per_node * nodes);
    let cpus = (d.cpus_per_task * tasks_per_node).max(d.cpus_per_gpu * gpus).max(1);
    let mem_mib = if d.mem_per_node > 0 {
        d.mem_per_node
    } else if d.mem_per_cpu > 0 {
        d.mem_per_cpu * u64::from(cpus)
    } else {
        d.mem_per_gpu * u64::from(gpus)
    };
    // `--fleet-image` wins over `#FLEET image=`, which wins over `KubeImage`.
    // The option was checked at submission; checked again here, since the
    // request crossed the network.
    let image = match &req.fleet.image {
        Some(img) => {
            fleet_api::options::check_image(img).map_err(|why| anyhow!("--fleet-image={img:?}: {why}"))?;
            img.clone()
        }
        None => image_directive(script).unwrap_or_else(|| t.settings.image.clone()),
    };

    let mut labels = BTreeMap::from([
        (MANAGED_BY.to_string(), "fleet".to_string()),
        (JOB_ID_LABEL.to_string(), label_value(t.fleet_id)),
        (NATIVE_ID_LABEL.to_string(), t.native_id.to_string()),
    ]);
    if let Some(qn) = &t.settings.queue {
        labels.insert("kueue.x-k8s.io/queue-name".into(), qn.clone());
    }
    let annotations = BTreeMap::from([
        ("fleet.io/job-id".to_string(), t.fleet_id.to_string()),
        ("fleet.io/origin".to_string(), req.origin.clone()),
        ("fleet.io/user".to_string(), t.user.name.clone()),
    ]);
    let meta = |n: &str| ObjectMeta {
        name: Some(n.to_string()),
        namespace: Some(ns.clone()),
        labels: Some(labels.clone()),
        annotations: Some(annotations.clone()),
        ..Default::default()
    };

    // Resources: GPUs as limits (extended resources: request = limit),
    // CPU and memory as requests, memory also as the limit (Slurm's cgroup).
    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::from([("cpu".to_string(), q(cpus.to_string()))]);
    if mem_mib > 0 {
        requests.insert("memory".into(), q(format!("{mem_mib}Mi")));
        limits.insert("memory".into(), q(format!("{mem_mib}Mi")));
    }
    let mig = d.gpu_type.as_deref().and_then(mig_profile);
    if gpus > 0 {
        let res = match &mig {
            Some(p) => format!("{MIG_PREFIX}{p}"),
            None => GPU.to_string(),
        };
        limits.insert(res, q(gpus.to_string()));
    }
    let affinity = match (&d.gpu_type, &mig, gpus) {
        (Some(ty), None, 1..) => {
            let mut values: Vec<String> =
                t.products.iter().filter(|p| gpu_type_of_product(p) == ty.to_ascii_lowercase()).cloned().collect();
            values.sort();
            values.dedup();
            if values.is_empty() {
                // No node has it: the pod stays unschedulable, with the reason.
                values.push(format!("fleet-none-{}", label_value(ty)));
            }
            Some(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": GPU_PRODUCT, "operator": "In", "values": values}]}]}}}))
        }
        _ => None,
    };

    // Slurm's environment, the same for every pod.
    let job_name_s = req.name.clone().unwrap_or_else(|| t.fleet_id.to_string());
    let nodelist = hostlist(&name, nodes);
    let mut env: Vec<(String, String)> = vec![
        ("SLURM_JOB_ID".into(), t.native_id.to_string()),
        ("SLURM_JOBID".into(), t.native_id.to_string()),
        ("SLURM_JOB_NAME".into(), job_name_s),
        ("SLURM_JOB_NUM_NODES".into(), nodes.to_string()),
        ("SLURM_NNODES".into(), nodes.to_string()),
        ("SLURM_NTASKS".into(), tasks.to_string()),
        ("SLURM_NPROCS".into(), tasks.to_string()),
        ("SLURM_NTASKS_PER_NODE".into(), tasks_per_node.to_string()),
        ("SLURM_CPUS_PER_TASK".into(), d.cpus_per_task.to_string()),
        ("SLURM_CPUS_ON_NODE".into(), cpus.to_string()),
        ("SLURM_JOB_NODELIST".into(), nodelist.clone()),
        ("SLURM_NODELIST".into(), nodelist),
        ("SLURM_SUBMIT_DIR".into(), WORK_DIR.into()),
        ("SLURM_SUBMIT_HOST".into(), req.origin.clone()),
        ("SLURM_CLUSTER_NAME".into(), t.site.to_string()),
        ("SLURM_JOB_PARTITION".into(), ns.clone()),
        ("SLURM_JOB_USER".into(), t.user.name.clone()),
        ("SLURM_JOB_UID".into(), t.user.uid.to_string()),
        ("SLURM_JOB_GID".into(), t.user.gid.to_string()),
        ("FLEET_JOB_ID".into(), t.fleet_id.to_string()),
        ("FLEET_ORIGIN".into(), req.origin.clone()),
        ("FLEET_FORWARDED_JOB".into(), t.fleet_id.to_string()),
    ];
    // Where it checkpoints and what it resumes from (docs/checkpoints.md).
    env.extend(fleet_api::sbatch::checkpoint_env(req).into_iter().map(|(k, v)| (k.to_string(), v.to_string())));
    // Where the run's checkpoint token, stores and CA are: files of its
    // checkpoint Secret, named by path (docs/checkpoints.md).
    let ckpt_secret = t.ckpt.map(|m| {
        let mut data = BTreeMap::new();
        if !m.token.is_empty() {
            data.insert("token".to_string(), ByteString(m.token.clone().into_bytes()));
            env.push(("FLEET_METASCHED_URL".into(), m.metasched_url.clone()));
            env.push(("FLEET_CKPT_TOKEN_FILE".into(), format!("{CKPT_DIR}/token")));
        }
        if let Some(s) = &m.stores {
            data.insert("stores.toml".to_string(), ByteString(s.clone()));
            env.push(("FLEET_CKPT_STORES".into(), format!("{CKPT_DIR}/stores.toml")));
        }
        if let Some(ca) = m.ca.as_ref().filter(|_| !m.token.is_empty()) {
            data.insert("ca.pem".to_string(), ByteString(ca.clone()));
            env.push(("FLEET_METASCHED_CA".into(), format!("{CKPT_DIR}/ca.pem")));
        }
        Secret {
            metadata: meta(&format!("{name}-ckpt")),
            data: Some(data),
            type_: Some("Opaque".into()),
            immutable: Some(true),
            ..Default::default()
        }
    });
    if gpus > 0 {
        env.push(("SLURM_GPUS_ON_NODE".into(), gpus.to_string()));
    }
    if mem_mib > 0 {
        env.push(("SLURM_MEM_PER_NODE".into(), mem_mib.to_string()));
    }
    if let Some(a) = t.user.account.as_ref().or(req.account.as_ref()) {
        env.push(("SLURM_JOB_ACCOUNT".into(), a.clone()));
    }
    if nodes > 1 {
        env.push(("MASTER_ADDR".into(), format!("{name}-0.{name}")));
        env.push(("MASTER_PORT".into(), "29500".into()));
    }

    // The submission environment (when --export carries it) in a Secret:
    // the user's variables may hold credentials.
    let secret = crate::slurm::submit_env(req, std::path::Path::new(WORK_DIR))
        .filter(|_| crate::slurm::exports_environment(req))
        .map(|vars| {
            let data: BTreeMap<String, ByteString> = vars
                .into_iter()
                .filter(|(k, _)| env_name_ok(k) && k != "PATH" && k != "HOME")
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect();
            Secret {
                metadata: meta(&format!("{name}-env")),
                data: Some(data),
                type_: Some("Opaque".into()),
                ..Default::default()
            }
        });

    // Under its lease only with a token to renew with (in the run's Secret).
    let lease = t.lease.filter(|_| t.ckpt.is_some_and(|m| !m.token.is_empty()));
    let command = match lease {
        Some(l) => {
            env.push(("FLEET_JOB_SCRIPT".into(), format!("{SCRIPT_DIR}/entry")));
            env.push(("FLEET_EPOCH".into(), req.fleet.epoch.to_string()));
            env.push(("FLEET_JOB_LEASE_MS".into(), l.lease.as_millis().to_string()));
            // The watchdog stops all of the pod's PID namespace but its
            // init: a daemon the job double-forks is the pause's child.
            env.push(("FLEET_LEASE_SCOPE".into(), "pod".into()));
            // Where the watchdog leaves its note for lease-exec (which then
            // reports no end of its own), and its stop line for the pod's status.
            env.push(("FLEET_LEASE_DIR".into(), RUN_DIR.into()));
            env.push(("FLEET_TERMINATION_LOG".into(), TERMINATION_LOG.into()));
            json!([format!("{HELPER_DIR}/fleet-ckpt"), "lease-exec", format!("{SCRIPT_DIR}/entry")])
        }
        None => json!(["/bin/bash", format!("{SCRIPT_DIR}/entry")]),
    };
    // The script's arguments (`sbatch script args...`), which the entry passes on.
    let mut command = command;
    if let Some(c) = command.as_array_mut() {
        c.extend(req.script_args.iter().map(|a| json!(a)));
    }
    let mut container = json!({
        "name": "job",
        "image": image,
        "command": command,
        "workingDir": WORK_DIR,
        "env": env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
        "resources": {"limits": limits, "requests": requests},
        "volumeMounts": [{"name": "script", "mountPath": SCRIPT_DIR, "readOnly": true},
                         {"name": "work", "mountPath": WORK_DIR}],
        "securityContext": restricted_container(),
    });
    if let Some(s) = &secret {
        container["envFrom"] = json!([{"secretRef": {"name": s.metadata.name}}]);
    }
    let mut init_containers: Vec<serde_json::Value> = Vec::new();
    let mut volumes = vec![
        json!({"name": "script", "configMap": {"name": format!("{name}-script"), "defaultMode": 0o555}}),
        json!({"name": "work", "emptyDir": {}}),
    ];
    if let Some(s) = &ckpt_secret {
        // 0440 and the pod's fsGroup: readable by the job's user (and group), by no other user.
        volumes.push(json!({"name": "ckpt", "secret": {"secretName": s.metadata.name, "defaultMode": 0o440}}));
        if let Some(m) = container["volumeMounts"].as_array_mut() {
            m.push(json!({"name": "ckpt", "mountPath": CKPT_DIR, "readOnly": true}));
        }
    }
    if let Some(l) = lease {
        volumes.push(json!({"name": "fleet-bin", "emptyDir": {}}));
        volumes.push(json!({"name": "fleet-run", "emptyDir": {}}));
        if let Some(m) = container["volumeMounts"].as_array_mut() {
            m.push(json!({"name": "fleet-bin", "mountPath": HELPER_DIR, "readOnly": true}));
            m.push(json!({"name": "fleet-run", "mountPath": RUN_DIR}));
        }
        container["terminationMessagePath"] = json!(TERMINATION_LOG);
        container["terminationMessagePolicy"] = json!("File");
        init_containers.push(json!({
            "name": "fleet-lease-helper",
            "image": l.image,
            "command": [l.helper, "install-self", format!("{HELPER_DIR}/fleet-ckpt")],
            "volumeMounts": [{"name": "fleet-bin", "mountPath": HELPER_DIR}],
            "securityContext": restricted_container(),
        }));
    }
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        // The mapped user, as on the Slurm path (sudo -u): uid, primary
        // group, supplementary groups; never root.
        "securityContext": {"runAsUser": t.user.uid, "runAsGroup": t.user.gid, "runAsNonRoot": true,
                            "fsGroup": t.user.gid, "supplementalGroups": t.groups,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": false,
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        "hostname": format!("{name}-0"),
    });
    if !init_containers.is_empty() {
        pod_spec["initContainers"] = json!(init_containers);
        // The job's shell must not be the PID namespace's init: its lease
        // watchdog could not stop it (init ignores signals it has no handler for).
        pod_spec["shareProcessNamespace"] = json!(true);
    }
    if let Some(a) = affinity {
        pod_spec["affinity"] = a;
    }
    if let Some(sa) = &t.settings.service_account {
        pod_spec["serviceAccountName"] = json!(sa);
    }
    let mut job_spec = json!({
        "backoffLimit": 0,
        "parallelism": nodes,
        "completions": nodes,
        "suspend": true,
        "ttlSecondsAfterFinished": 3600,
        // A pod the cluster takes away (evicted by `kubectl drain`, preempted,
        // its node tainted out) fails the Job at once with the pod named in
        // the Failed condition, which outlives the pod: Fleet reads it as
        // the run dying with its node (NODE_FAIL/PREEMPTED), not as the
        // script's failure.
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
        "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec},
    });
    if let Some(min) = req.time_limit_min {
        job_spec["activeDeadlineSeconds"] = json!(u64::from(min) * 60);
    }
    let service = if nodes > 1 {
        job_spec["completionMode"] = json!("Indexed");
        // Pods of an Indexed Job are `<job>-<index>` under the Service's subdomain.
        job_spec["template"]["spec"]["subdomain"] = json!(name);
        if let Some(o) = job_spec["template"]["spec"].as_object_mut() {
            o.remove("hostname");
        }
        // backoffLimit 0: any pod's failure fails the gang (Slurm ends a
        // job when one of its nodes fails).
        Some(Service {
            metadata: meta(&name),
            spec: Some(serde_json::from_value(json!({
                "clusterIP": "None",
                "selector": {NATIVE_ID_LABEL: t.native_id.to_string()},
                "publishNotReadyAddresses": true,
            }))?),
            ..Default::default()
        })
    } else {
        None
    };
    let job = Job { metadata: meta(&name), spec: Some(serde_json::from_value(job_spec)?), ..Default::default() };
    let mut data = BTreeMap::from([("entry".to_string(), entry_for(req))]);
    let mut binary = BTreeMap::new();
    match std::str::from_utf8(script) {
        Ok(s) => {
            data.insert("script".into(), s.to_string());
        }
        Err(_) => {
            binary.insert("script".to_string(), ByteString(script.to_vec()));
        }
    }
    let script_cm = ConfigMap {
        metadata: meta(&format!("{name}-script")),
        data: Some(data),
        binary_data: (!binary.is_empty()).then_some(binary),
        ..Default::default()
    };
    Ok(Objects { job, script: script_cm, env: secret, ckpt: ckpt_secret, service })
}

/// Every container's security context: what Kubernetes' `restricted` Pod
/// Security Standard asks of it (with the pod's non-root user and
/// RuntimeDefault seccomp profile), so that a namespace enforcing it admits
/// the pods.
fn restricted_container() -> serde_json::Value {
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
}

fn owner(job: &Job) -> Result<OwnerReference> {
    Ok(OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: job.metadata.name.clone().unwrap_or_default(),
        uid: job.metadata.uid.clone().context("the API server returned a Job without a uid")?,
        controller: Some(false),
        // Background deletion needs no blocking; asking for it needs
        // `update` on jobs/finalizers where OwnerReferencesPermissionEnforcement runs.
        block_owner_deletion: None,
    })
}

fn has_true(job: &Job, typ: &str) -> Option<(String, String)> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == typ && c.status == "True")
        .map(|c| (c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

/// Why a pod cannot run, if it is stuck: (Slurm-style state, reason, fatal).
fn pod_trouble(p: &Pod) -> Option<(&'static str, String, bool)> {
    let st = p.status.as_ref()?;
    if st.reason.as_deref() == Some("Evicted") {
        return Some(("NODE_FAIL", format!("Evicted: {}", st.message.clone().unwrap_or_default()), true));
    }
    // Taken away by the cluster: evicted (drain, node pressure), deleted by
    // the taint manager, or preempted by the scheduler.
    for c in st.conditions.iter().flatten() {
        if c.type_ == "DisruptionTarget" && c.status == "True" {
            let r = c.reason.clone().unwrap_or_default();
            let state = if r == "PreemptionByScheduler" { "PREEMPTED" } else { "NODE_FAIL" };
            return Some((state, format!("{r}: {}", c.message.clone().unwrap_or_default()), true));
        }
    }
    for cs in st.container_statuses.iter().flatten() {
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let r = w.reason.clone().unwrap_or_default();
            if matches!(r.as_str(), "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull") {
                return Some(("FAILED", format!("{r}: {}", w.message.clone().unwrap_or_default()), true));
            }
            if r == "CreateContainerConfigError" || r == "CreateContainerError" {
                return Some(("PENDING", format!("{r}: {}", w.message.clone().unwrap_or_default()), false));
            }
        }
        if let Some(term) = cs.state.as_ref().and_then(|s| s.terminated.as_ref()) {
            if term.reason.as_deref() == Some("OOMKilled") {
                return Some(("OUT_OF_MEMORY", "OOMKilled".into(), true));
            }
        }
    }
    for c in st.conditions.iter().flatten() {
        if c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable") {
            return Some(("PENDING", format!("Unschedulable: {}", c.message.clone().unwrap_or_default()), false));
        }
    }
    None
}

/// Whether a state `pod_trouble` gives says the pod was taken away by the
/// cluster (`DisruptionTarget`, an eviction): its run died with its node.
fn taken_away_state(raw: &str) -> bool {
    matches!(raw, "NODE_FAIL" | "PREEMPTED")
}

/// Has `job` ended (its Complete or Failed condition) while the pods the
/// watch holds for it have not (or none is there yet)? The Job and Pod
/// watches are separate streams: under load the Job's end can arrive
/// before its pods' ends, and without them the exit code (the pod's), the
/// lease's termination message and the end of the logs would be missed.
fn pods_behind(job: &Job, pods: &[Arc<Pod>]) -> bool {
    let ended = has_true(job, "Complete").is_some() || has_true(job, "Failed").is_some();
    let finished =
        |p: &Arc<Pod>| matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
    ended && (pods.is_empty() || !pods.iter().all(finished))
}

/// What Kubernetes says of one Job and its pods, as the agent's tracker
/// reads a Slurm job (pure). `raw_state` uses Slurm's names so that the
/// origin sees `TIMEOUT`, `OUT_OF_MEMORY`, `NODE_FAIL` as for a Slurm target.
pub fn native_state(job: &Job, pods: &[&Pod]) -> NativeJob {
    native_state_with(job, pods, None)
}

/// [`native_state`], with what the watch saw of the Job's pods before
/// they were gone: `taken_away`, the disruption one of them showed
/// ([`TakenAway`]), which a pod deleted as it ended no longer shows.
pub fn native_state_with(job: &Job, pods: &[&Pod], taken_away: Option<&(&'static str, String)>) -> NativeJob {
    let name = job.metadata.name.clone().unwrap_or_default();
    let native_id = native_id_of(&name).unwrap_or(0);
    let mut nodes: Vec<String> = pods.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
    nodes.sort();
    nodes.dedup();
    // The first failed container's exit code, else the highest.
    let codes: Vec<i32> = pods
        .iter()
        .filter_map(|p| {
            p.status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .first()?
                .state
                .as_ref()?
                .terminated
                .as_ref()
                .map(|t| t.exit_code)
        })
        .collect();
    let exit = codes.iter().copied().find(|c| *c != 0).or(codes.iter().copied().max());
    let mut troubles: Vec<(&str, String, bool)> = pods.iter().filter_map(|p| pod_trouble(p)).collect();
    if let Some((state, why)) = taken_away.filter(|_| troubles.iter().all(|t| !t.2)) {
        troubles.push((state, why.clone(), true));
    }
    let spec = job.spec.as_ref();
    let (raw, reason) = if has_true(job, "Complete").is_some() {
        // Taken away (DisruptionTarget: a drain's eviction, a preemption)
        // while it ran, its script caught the SIGTERM and exited 0 (as a
        // checkpointing job saves and leaves): Kubernetes counts the Job
        // complete, but its work is not done, and Slurm, whatever the
        // exit, requeues a preempted job and fails one on a failed node.
        match troubles.iter().find(|t| t.2 && taken_away_state(t.0)) {
            Some(t) => (t.0, t.1.clone()),
            None => ("COMPLETED", String::new()),
        }
    } else if let Some((r, m)) = has_true(job, "Failed").or_else(|| has_true(job, "FailureTarget")) {
        match (r.as_str(), troubles.iter().find(|t| t.2)) {
            ("DeadlineExceeded", _) => ("TIMEOUT", format!("DeadlineExceeded: {m}")),
            (_, Some(t)) => (t.0, t.1.clone()),
            // Its podFailurePolicy's DisruptionTarget rule: the pod is gone
            // (an evicted pod is deleted), the Job names it.
            ("PodFailurePolicy", None) if m.contains("condition DisruptionTarget") => {
                ("NODE_FAIL", format!("DisruptionTarget: {m}"))
            }
            // A script's own non-zero exit: Slurm's reason for it, which
            // says nothing more than the exit code (the stand-in adds no line).
            _ if exit.is_some_and(|c| c != 0) => ("FAILED", "NonZeroExitCode".to_string()),
            _ => ("FAILED", format!("{r}: {m}")),
        }
    } else if let Some(t) = troubles.iter().find(|t| t.2) {
        (t.0, t.1.clone())
    } else if spec.and_then(|s| s.suspend) == Some(true) {
        let q = job.metadata.labels.as_ref().and_then(|l| l.get("kueue.x-k8s.io/queue-name")).cloned();
        (
            "PENDING",
            match q {
                Some(q) => format!("Suspended: waiting for admission by Kueue (queue {q})"),
                // Without a queue, only between its creation and its release.
                None => String::new(),
            },
        )
    } else if let Some(t) = troubles.first() {
        (t.0, t.1.clone())
    } else if pods.iter().any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")) {
        ("RUNNING", String::new())
    } else if !pods.is_empty() && pods.iter().all(|p| pod_ended(p)) {
        // Its pods ended and the Job controller has not yet marked the Job
        // Complete or Failed (it does so a moment later): ending, as Slurm's
        // COMPLETING, not back to pending. Read as PENDING, the tracker took
        // the run for a re-run (the kube lab's h100 test saw "it went back to
        // pending after it ran" on a plain exit 3).
        ("COMPLETING", String::new())
    } else {
        ("PENDING", String::new())
    };
    let mut j = NativeJob::new(native_id, raw);
    if taken_away_state(raw) {
        // What the run died of, for the report that it died (`track::died`).
        j.description = reason.clone();
    }
    j.reason = reason;
    j.exit_code = match raw {
        "COMPLETED" => Some(0),
        "RUNNING" | "PENDING" | "COMPLETING" => None,
        _ => exit.or(Some(1)),
    };
    if let Some(c) = j.exit_code.filter(|c| *c > 128 && raw != "COMPLETED") {
        // A container killed by a signal exits 128+n (kubelet convention).
        j.signal = Some(c - 128);
    }
    j.node_list = nodes.join(",");
    j.submit_time = job.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
    j.user_id = spec
        .and_then(|s| s.template.spec.as_ref()?.security_context.as_ref()?.run_as_user)
        .and_then(|u| u32::try_from(u).ok());
    j.partition = job.metadata.namespace.clone().unwrap_or_default();
    // Its limit: the deadline it was given (the job's --time), or set since.
    j.time_limit_min = spec
        .and_then(|s| s.active_deadline_seconds)
        .and_then(|d| u64::try_from(d).ok())
        .and_then(|d| u32::try_from(d.div_ceil(60)).ok())
        .filter(|m| *m > 0);
    j
}

/// Per-pod log followers of one job.
#[derive(Default)]
struct Follow {
    /// Pod uid → finished (read to the end of its log).
    pods: HashMap<String, bool>,
}

/// Watch figures: how long after its creation each Job showed up in the watch.
#[derive(Default)]
struct Lag {
    created: HashMap<String, Instant>,
    lags: Vec<Duration>,
}

pub struct KubeBackend {
    pub client: kube::Client,
    pub settings: KubeSettings,
    pub site: String,
    pub spool: PathBuf,
    /// What each run checkpoints with (the Slurm path's settings: token
    /// key, meta-scheduler, stores), mounted from a per-run Secret.
    pub ckpt: crate::ckpt::JobCkpt,
    /// Fleet's Jobs and Pods, one watched store per namespace.
    jobs: Vec<Store<Job>>,
    pods: Vec<Store<Pod>>,
    nodes: Store<Node>,
    /// Every unfinished pod of the cluster (any namespace, a phase field
    /// selector), watched where the agent's RBAC may list pods cluster-wide:
    /// what holds capacity. `None`: only this namespace's Fleet pods count.
    busy: Option<Store<Pod>>,
    /// The ResourceQuotas of each namespace the agent works in, watched
    /// where its RBAC may list them (`gpu_quotas`).
    quotas: Vec<(String, Store<ResourceQuota>)>,
    next_id: AtomicU64,
    /// Jobs deleted by `cancel`: what `accounting` says of them afterwards.
    cancelled: Mutex<HashMap<u64, NativeJob>>,
    follow: Arc<Mutex<HashMap<String, Follow>>>,
    /// The log followers' tasks, stopped with the backend.
    followers: Mutex<Vec<tokio::task::AbortHandle>>,
    lag: Arc<Mutex<Lag>>,
    taken_away: TakenAway,
    /// Per Job uid: when its `FailedCreate` events were last read and what
    /// the newest said (`failed_create`).
    failed_creates: Mutex<HashMap<String, (Instant, Option<String>)>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// How long what a Job's `FailedCreate` events said is reused.
const FAILED_CREATE_TTL: Duration = Duration::from_secs(5);

/// Per Fleet Job (by name), the disruption (`DisruptionTarget`: a drain's
/// eviction, a preemption) a pod of it showed in the watch, as
/// `pod_trouble` reads it: an evicted pod is deleted as it ends, so a
/// script that caught the SIGTERM and exited 0 leaves a `Complete` Job
/// and no pod to say it was taken away. Kept until the Job leaves the
/// watch (at most [`TAKEN_AWAY_MAX`] entries).
#[derive(Clone, Default)]
struct TakenAway(Arc<Mutex<HashMap<String, (&'static str, String)>>>);

const TAKEN_AWAY_MAX: usize = 4096;

impl TakenAway {
    /// Notes what `pod` shows, if it was taken away.
    fn see(&self, pod: &Pod) {
        let Some((state, why, true)) = pod_trouble(pod) else { return };
        if !taken_away_state(state) {
            return;
        }
        let Some(name) = pod.metadata.labels.as_ref().and_then(|l| l.get("batch.kubernetes.io/job-name")) else {
            return;
        };
        let mut m = self.0.lock();
        if m.len() < TAKEN_AWAY_MAX || m.contains_key(name) {
            m.insert(name.clone(), (state, why));
        }
    }

    /// Forgets the Jobs no longer in the watch.
    fn keep_only(&self, live: &std::collections::HashSet<&str>) {
        self.0.lock().retain(|n, _| live.contains(n.as_str()));
    }

    fn of(&self, name: &str) -> Option<(&'static str, String)> {
        self.0.lock().get(name).cloned()
    }
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.followers.lock().iter() {
            t.abort();
        }
    }
}

impl KubeBackend {
    /// Connects (kubeconfig or in-cluster) and starts the watches.
    pub async fn connect(settings: KubeSettings, site: &str, spool: PathBuf) -> Result<KubeBackend> {
        let config = match &settings.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading KubeConfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                    .await
                    .with_context(|| format!("KubeConfig {}", path.display()))?
            }
            None => kube::Config::infer().await.context("no KubeConfig and no in-cluster configuration")?,
        };
        let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
        Self::with_client(client, settings, site, spool).await
    }

    pub async fn with_client(
        client: kube::Client,
        settings: KubeSettings,
        site: &str,
        spool: PathBuf,
    ) -> Result<KubeBackend> {
        let sel = format!("{MANAGED_BY}=fleet");
        // Fail fast, with the API server's words, where the RBAC falls
        // short (the watches would only retry).
        let probe = ListParams::default().limit(1);
        let denied = |what: &str, e: ::kube::Error| anyhow!("the agent may not list {what}: {e}");
        for ns in settings.namespaces() {
            Api::<Job>::namespaced(client.clone(), &ns)
                .list(&probe)
                .await
                .map_err(|e| denied(&format!("Jobs in namespace {ns}"), e))?;
            Api::<Pod>::namespaced(client.clone(), &ns)
                .list(&probe)
                .await
                .map_err(|e| denied(&format!("Pods in namespace {ns}"), e))?;
        }
        Api::<Node>::all(client.clone()).list(&probe).await.map_err(|e| denied("Nodes", e))?;
        let lag: Arc<Mutex<Lag>> = Arc::default();
        let taken_away = TakenAway::default();
        let mut tasks = Vec::new();
        // One watch of Fleet's Jobs and one of its Pods per namespace (the
        // RBAC grants namespaces, not the cluster).
        let (mut jobs, mut pods) = (Vec::new(), Vec::new());
        for ns in settings.namespaces() {
            let (store, w) = reflector::store();
            jobs.push(store);
            let lag2 = lag.clone();
            let stream = reflector::reflector(
                w,
                watcher(Api::<Job>::namespaced(client.clone(), &ns), watcher::Config::default().labels(&sel)),
            )
            .default_backoff()
            .applied_objects();
            tasks.push(tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(ev) = stream.next().await {
                    match ev {
                        Ok(job) => {
                            let mut l = lag2.lock();
                            if let Some(t) = job.metadata.name.as_ref().and_then(|n| l.created.remove(n)) {
                                l.lags.push(t.elapsed());
                            }
                        }
                        Err(e) => tracing::warn!("watching Jobs: {e}"),
                    }
                }
            }));
            let (store, w) = reflector::store();
            pods.push(store);
            let stream = reflector::reflector(
                w,
                watcher(Api::<Pod>::namespaced(client.clone(), &ns), watcher::Config::default().labels(&sel)),
            )
            .default_backoff()
            .touched_objects();
            let seen = taken_away.clone();
            tasks.push(tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(ev) = stream.next().await {
                    match ev {
                        Ok(pod) => seen.see(&pod),
                        Err(e) => tracing::warn!("watching Pods: {e}"),
                    }
                }
            }));
        }
        let (nodes, w) = reflector::store();
        let stream = reflector::reflector(w, watcher(Api::<Node>::all(client.clone()), watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        tasks.push(tokio::spawn(drain(stream, "Nodes")));
        // Other tenants' pods hold capacity too: watch every unfinished pod
        // where the RBAC allows (a finished one leaves the selection, which
        // the watch reports as its deletion).
        let all_pods = Api::<Pod>::all(client.clone());
        let busy = match all_pods.list(&probe).await {
            Ok(_) => {
                let (busy, w) = reflector::store();
                let cfg = watcher::Config::default().fields(BUSY_PODS);
                let stream = reflector::reflector(w, watcher(all_pods, cfg)).default_backoff().touched_objects();
                tasks.push(tokio::spawn(drain(stream, "Pods (all namespaces)")));
                Some(busy)
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::info!(
                    "may not list pods in every namespace: capacity counts Fleet's pods in {} only",
                    settings.namespaces().join(", ")
                );
                None
            }
            Err(e) => return Err(anyhow!("listing pods in every namespace: {e}")),
        };
        // A namespace's ResourceQuotas bound what its jobs may take beside
        // the nodes' free GPUs: published with each heartbeat where the
        // RBAC lets the agent see them.
        let mut quotas = Vec::new();
        for ns in settings.namespaces() {
            let api = Api::<ResourceQuota>::namespaced(client.clone(), &ns);
            match api.list(&probe).await {
                Ok(_) => {
                    let (store, w) = reflector::store();
                    let stream = reflector::reflector(w, watcher(api, watcher::Config::default()))
                        .default_backoff()
                        .touched_objects();
                    tasks.push(tokio::spawn(drain(stream, "ResourceQuotas")));
                    quotas.push((ns, store));
                }
                Err(e) => tracing::info!(
                    "may not list ResourceQuotas in namespace {ns} ({e}): placement cannot see its GPU quota"
                ),
            }
        }
        let b = KubeBackend {
            client,
            settings,
            site: site.to_string(),
            spool,
            ckpt: crate::ckpt::JobCkpt::default(),
            jobs,
            pods,
            nodes,
            busy,
            quotas,
            next_id: AtomicU64::new(0),
            cancelled: Mutex::default(),
            follow: Arc::default(),
            followers: Mutex::default(),
            lag,
            taken_away,
            failed_creates: Mutex::default(),
            tasks,
        };
        let ready = async {
            for s in &b.jobs {
                s.wait_until_ready().await?;
            }
            for s in &b.pods {
                s.wait_until_ready().await?;
            }
            if let Some(busy) = &b.busy {
                busy.wait_until_ready().await?;
            }
            for (_, q) in &b.quotas {
                q.wait_until_ready().await?;
            }
            b.nodes.wait_until_ready().await
        };
        b.forget_old_cancels();
        match tokio::time::timeout(Duration::from_secs(30), ready).await {
            Ok(r) => r.context("the watches stopped before their first list")?,
            Err(_) => bail!(
                "no first list of Jobs, Pods and Nodes in namespace(s) {} within 30 s: check the API server and the agent's RBAC",
                b.settings.namespaces().join(", ")
            ),
        }
        Ok(b)
    }

    /// How long after its creation each Job submitted here appeared in the
    /// watch (drained).
    pub fn watch_lags(&self) -> Vec<Duration> {
        std::mem::take(&mut self.lag.lock().lags)
    }

    fn mint_id(&self) -> u64 {
        // Time-based (ms × 1000), strictly increasing: unique across restarts.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64 * 1000)
            .unwrap_or(0);
        let mut cur = self.next_id.load(Ordering::SeqCst);
        loop {
            let next = now.max(cur + 1);
            match self.next_id.compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return next,
                Err(c) => cur = c,
            }
        }
    }

    /// What the newest `FailedCreate` event on `job` says (the Job
    /// controller's words when the API server refuses it a pod: `exceeded
    /// quota: ...`), read at most every [`FAILED_CREATE_TTL`] per Job.
    async fn failed_create(&self, job: &Job) -> Option<String> {
        let uid = job.metadata.uid.clone()?;
        let ns = job.metadata.namespace.clone()?;
        if let Some((at, why)) = self.failed_creates.lock().get(&uid) {
            if at.elapsed() < FAILED_CREATE_TTL {
                return why.clone();
            }
        }
        let lp = ListParams::default().fields(&format!("involvedObject.uid={uid},reason=FailedCreate"));
        let why = match Api::<Event>::namespaced(self.client.clone(), &ns).list(&lp).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
                .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0.as_second()))
                .and_then(|e| e.message)
                .map(|m| format!("FailedCreate: {}", m.chars().take(400).collect::<String>())),
            Err(e) => {
                tracing::debug!(job = ?job.metadata.name, "reading the Job's FailedCreate events: {e}");
                None
            }
        };
        let mut seen = self.failed_creates.lock();
        if seen.len() >= 4096 {
            seen.retain(|_, (at, _)| at.elapsed() < FAILED_CREATE_TTL);
        }
        seen.insert(uid, (Instant::now(), why.clone()));
        why
    }

    fn all_jobs(&self) -> Vec<Arc<Job>> {
        self.jobs.iter().flat_map(|s| s.state()).collect()
    }

    fn all_pods(&self) -> Vec<Arc<Pod>> {
        self.pods.iter().flat_map(|s| s.state()).collect()
    }

    /// The pods that hold capacity: every unfinished pod of the cluster
    /// where the agent may watch them all, else Fleet's own.
    fn busy_pods(&self) -> Vec<Arc<Pod>> {
        match &self.busy {
            Some(busy) => busy.state(),
            None => self.all_pods(),
        }
    }

    /// Each watched namespace with a GPU quota, as (namespace, hard, used)
    /// ([`namespace_gpu_quota`]).
    fn namespace_quotas(&self) -> Vec<(&str, u64, u64)> {
        let pods = self.busy_pods();
        self.quotas
            .iter()
            .filter_map(|(ns, store)| {
                let (hard, used) = namespace_gpu_quota(&store.state(), &pods, ns)?;
                Some((ns.as_str(), hard, used))
            })
            .collect()
    }

    /// The namespace of Fleet's Job `name`: where the watch saw it, else
    /// where the API server has it (just created, or the watch lags).
    async fn namespace_of(&self, name: &str) -> Result<Option<String>> {
        if let Some(ns) = self
            .all_jobs()
            .iter()
            .find(|j| j.metadata.name.as_deref() == Some(name))
            .and_then(|j| j.metadata.namespace.clone())
        {
            return Ok(Some(ns));
        }
        for ns in self.settings.namespaces() {
            if Api::<Job>::namespaced(self.client.clone(), &ns).get_opt(name).await?.is_some() {
                return Ok(Some(ns));
            }
        }
        Ok(None)
    }

    /// Of `listed` (Fleet's Jobs of fleet job `id` in one namespace), those
    /// an interrupted submission as `uid` since `since` made whole, into
    /// `out`; half-made ones are deleted.
    async fn adoptable_in(
        &self,
        api: &Api<Job>,
        listed: Vec<Job>,
        id: &str,
        uid: u32,
        since: f64,
        out: &mut Vec<NativeJob>,
    ) -> Result<()> {
        for job in listed {
            let ann = job.metadata.annotations.clone().unwrap_or_default();
            if ann.get("fleet.io/job-id").map(String::as_str) != Some(id) {
                continue;
            }
            let nj = native_state(&job, &[]);
            if nj.user_id != Some(uid) || nj.submit_time.is_none_or(|t| (t as f64) < since - 2.0) {
                continue;
            }
            let name = job.metadata.name.clone().unwrap_or_default();
            if ann.get(COMPLETE_ANNOTATION).map(String::as_str) != Some("true") {
                tracing::warn!(%id, job = %name, "deleting a Job an interrupted submission left half-made");
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e).with_context(|| format!("deleting the half-made Job {name}")),
                }
                continue;
            }
            let pods = self.pods_of(&name);
            let refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
            out.push(native_state_with(&job, &refs, self.taken_away.of(&name).as_ref()));
        }
        Ok(())
    }

    fn cancel_dir(&self) -> PathBuf {
        self.spool.join("kube-cancelled")
    }

    /// Records that this agent cancelled (deleted) a Job: the identity the
    /// tracker checks (submit time, owner, nodes), one small file per Job.
    fn write_cancel_record(&self, nj: &NativeJob) -> Result<()> {
        let dir = self.cancel_dir();
        let rec = json!({"submit_time": nj.submit_time, "user_id": nj.user_id, "node_list": nj.node_list,
                         "partition": nj.partition});
        crate::jobdir::private_dir(&dir)
            .and_then(|()| {
                crate::jobdir::replace_private(&dir, &nj.native_id.to_string(), rec.to_string().as_bytes(), None)
            })
            .with_context(|| format!("recording the cancel in {}", dir.display()))
    }

    /// The job as `cancel` left it, from its record (a previous life of the agent).
    fn cancel_record(&self, native_id: u64) -> Option<NativeJob> {
        let path = self.cancel_dir().join(native_id.to_string());
        let text = {
            use std::io::Read;
            let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).ok()?;
            let mut buf = Vec::new();
            f.take(4096).read_to_end(&mut buf).ok()?;
            buf
        };
        let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
        let mut nj = NativeJob::new(native_id, "CANCELLED");
        nj.submit_time = v["submit_time"].as_i64();
        nj.user_id = v["user_id"].as_u64().and_then(|u| u32::try_from(u).ok());
        nj.node_list = v["node_list"].as_str().unwrap_or("").to_string();
        nj.partition = v["partition"].as_str().unwrap_or("").to_string();
        Some(nj)
    }

    /// Drops cancel records older than a week (the tracker has long reported them).
    fn forget_old_cancels(&self) {
        let Ok(rd) = std::fs::read_dir(self.cancel_dir()) else { return };
        let max = Duration::from_secs(CANCEL_RECORD_DAYS * 86400);
        for e in rd.flatten() {
            let old = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
            if old.is_some_and(|a| a > max) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    fn products(&self) -> Vec<String> {
        self.nodes.state().iter().filter_map(|n| n.metadata.labels.as_ref()?.get(GPU_PRODUCT).cloned()).collect()
    }

    /// The pods of `job` as the API server has them now (not the watch).
    async fn list_pods_of(&self, job: &Job) -> Result<Vec<Arc<Pod>>> {
        let name = job.metadata.name.clone().unwrap_or_default();
        let ns = job.metadata.namespace.clone().unwrap_or_else(|| self.settings.namespace.clone());
        let sel = format!("batch.kubernetes.io/job-name={name}");
        let listed = Api::<Pod>::namespaced(self.client.clone(), &ns).list(&ListParams::default().labels(&sel)).await?;
        Ok(listed.items.into_iter().map(Arc::new).collect())
    }

    fn pods_of(&self, name: &str) -> Vec<Arc<Pod>> {
        self.all_pods()
            .into_iter()
            .filter(|p| {
                p.metadata.labels.as_ref().and_then(|l| l.get("batch.kubernetes.io/job-name")).map(String::as_str)
                    == Some(name)
            })
            .collect()
    }

    /// Follows the logs of `pods` (those whose container started) into the
    /// job's stdout file; true when every started pod's log has been read
    /// to its end.
    fn follow_logs(&self, fleet_id: &str, pods: &[Arc<Pod>]) -> bool {
        let mut all_done = true;
        let mut f = self.follow.lock();
        let entry = f.entry(fleet_id.to_string()).or_default();
        for p in pods {
            let started = p.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|ph| ph != "Pending");
            let (Some(uid), Some(name)) = (p.metadata.uid.clone(), p.metadata.name.clone()) else { continue };
            if !started {
                continue;
            }
            match entry.pods.get(&uid) {
                Some(true) => continue,
                Some(false) => {
                    all_done = false;
                    continue;
                }
                None => {}
            }
            all_done = false;
            entry.pods.insert(uid.clone(), false);
            let pod_ns = p.metadata.namespace.clone().unwrap_or_else(|| self.settings.namespace.clone());
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod_ns);
            let out = self.output_paths(fleet_id).stdout;
            let mark = self.job_dir(fleet_id).join(format!(".log-{}", label_value(&uid)));
            let follow = self.follow.clone();
            let id = fleet_id.to_string();
            let task = tokio::spawn(async move {
                follow_to_end(&api, &name, &out, &mark, &id).await;
                if let Some(e) = follow.lock().get_mut(&id) {
                    e.pods.insert(uid, true);
                }
            });
            self.followers.lock().retain(|t| !t.is_finished());
            self.followers.lock().push(task.abort_handle());
        }
        all_done
    }
}

async fn drain<S, T>(stream: S, what: &'static str)
where
    S: futures::Stream<Item = std::result::Result<T, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        if let Err(e) = ev {
            tracing::warn!("watching {what}: {e}");
        }
    }
}

/// Appends one pod's log, whole lines at a time, to `out` until it ends.
///
/// How far into the pod's log the file holds is kept in `mark` (written
/// after each line, in the same poll, so no `.await` separates them): a
/// restarted agent skips that much of the log, which Kubernetes serves from
/// its start again, and the output holds each line once.
/// How the lease watchdog's line on a job's stderr (and in its container's
/// termination message) starts (fleet-ckpt's `lease::STOP_LINE`).
const LEASE_STOP_LINE: &str = "fleet: stopping this run of job ";

/// Why the watchdog stopped the run, from its stop line
/// (`fleet: stopping this run of job ID at this cluster: WHY`).
fn lease_stop_why(line: &[u8]) -> Option<String> {
    let rest = String::from_utf8_lossy(line.strip_prefix(LEASE_STOP_LINE.as_bytes())?).into_owned();
    let (_, why) = rest.split_once(" at this cluster: ")?;
    let why: String = why.lines().next().unwrap_or("").chars().filter(|c| !c.is_control()).take(500).collect();
    (!why.trim().is_empty()).then(|| why.trim().to_string())
}

/// The watchdog's reason from the first of `pods` whose job container
/// ended with its stop line as termination message (pure).
pub fn lease_stop_message(pods: &[&Pod]) -> Option<String> {
    pods.iter()
        .flat_map(|p| p.status.iter().flat_map(|s| s.container_statuses.iter().flatten()))
        .filter_map(|cs| cs.state.as_ref()?.terminated.as_ref()?.message.as_deref())
        .find_map(|m| lease_stop_why(m.as_bytes()))
}

/// Follows one pod's log into `out` until the whole of it is there: a
/// stream can end before the container does (an API server restart, a
/// dropped connection, a kubelet closing an idle stream), so the log is
/// read again from the mark until a read begun after the pod ended has
/// reached its end, or the pod is gone (its log with it).
async fn follow_to_end(api: &Api<Pod>, name: &str, out: &std::path::Path, mark: &std::path::Path, id: &str) {
    let mut warned = false;
    loop {
        let ended = match api.get_opt(name).await {
            Ok(Some(p)) => pod_ended(&p),
            Ok(None) => return,
            Err(e) => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(%id, pod = %name, "reading the pod to follow its log: {e}; trying again");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        match follow_one(api, name, out, mark).await {
            Ok(()) if ended => return,
            Ok(()) => tracing::debug!(%id, pod = %name, "the pod's log stream ended before the pod: reading on"),
            Err(e) => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(%id, pod = %name, "following the pod's log: {e:#}; reading on from where it stopped");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The pod's containers have all ended (its phase says so).
fn pod_ended(p: &Pod) -> bool {
    matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// The most of a pod's log held at once: a longer line (a job's output
/// need not have newlines) is written through in pieces of this size.
const LOG_PIECE: usize = 64 << 10;

/// Reads one piece of `r` into `out`: up to and including the next
/// newline, or `max` bytes of a longer line. 0 at the end.
async fn read_piece<R: futures::AsyncBufRead + Unpin>(
    r: &mut R,
    out: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(out.len());
        }
        let room = &buf[..buf.len().min(max - out.len())];
        let (n, done) = match room.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (room.len(), out.len() + room.len() >= max),
        };
        out.extend_from_slice(&room[..n]);
        r.consume_unpin(n);
        if done {
            return Ok(out.len());
        }
    }
}

async fn follow_one(api: &Api<Pod>, pod: &str, out: &std::path::Path, mark: &std::path::Path) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let open = |p: &std::path::Path, append: bool| {
        std::fs::OpenOptions::new()
            .create(true)
            .read(!append)
            .write(!append)
            .append(append)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(p)
            .with_context(|| format!("opening {}", p.display()))
    };
    let mark_file = open(mark, false)?;
    let mut skip: u64 = {
        let mut buf = [0u8; 20];
        let n = mark_file.read_at(&mut buf, 0).unwrap_or(0);
        std::str::from_utf8(&buf[..n]).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
    };
    let mut pos = skip;
    let lp = LogParams { follow: true, ..Default::default() };
    let mut tries = 0;
    let stream = loop {
        match api.log_stream(pod, &lp).await {
            Ok(s) => break s,
            // The container may not be running yet: retry a while.
            Err(e) if tries < 40 => {
                tries += 1;
                tracing::debug!(pod, "log not available yet: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e).context("reading the log"),
        }
    };
    let mut f = open(out, true)?;
    let mut stream = std::pin::pin!(stream);
    let mut line = Vec::new();
    // Whether the piece read next starts a line (the log is read from its
    // start at every follow, so this is known even past the mark).
    let mut line_start = true;
    loop {
        line.clear();
        let n = read_piece(&mut stream, &mut line, LOG_PIECE).await.context("reading the log")? as u64;
        if n == 0 {
            return Ok(());
        }
        let starts_line = std::mem::replace(&mut line_start, line.ends_with(b"\n"));
        if skip >= n {
            skip -= n;
            continue;
        }
        f.write_all(&line[skip as usize..])?;
        if skip == 0 && starts_line {
            // The in-job lease's watchdog stopped the pod (its one line on
            // the job's stderr): noted for the tracker as on the Slurm
            // path, a claim the meta-scheduler checks against its grants.
            if let Some(why) = lease_stop_why(&line) {
                if let Some(dir) = out.parent() {
                    let _ = crate::jobdir::write_private(
                        &dir.join(crate::ckpt::LEASE_STOPPED_FILE),
                        format!("{why}\n").as_bytes(),
                    );
                }
            }
        }
        skip = 0;
        pos += n;
        mark_file.write_all_at(format!("{pos:<20}").as_bytes(), 0)?;
    }
}

use std::os::unix::fs::OpenOptionsExt as _;

/// Whether [`capacity_of`] counts what pod `p` asks for as taken: bound
/// to a node and not finished.
fn holds_node(p: &Pod) -> Option<&str> {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
    let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref())?;
    (!matches!(phase, "Succeeded" | "Failed")).then_some(node)
}

/// The native ids of Fleet's Jobs whose pods [`capacity_of`] counts as
/// holding node resources (pure).
pub fn holding_of(pods: &[Arc<Pod>]) -> Vec<u64> {
    let mut out: Vec<u64> = pods
        .iter()
        .filter(|p| holds_node(p).is_some())
        .filter_map(|p| p.metadata.labels.as_ref()?.get(NATIVE_ID_LABEL)?.parse().ok())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Capacity from Nodes (allocatable GPUs, the product label, MIG
/// resources) minus what running pods hold (pure).
/// The ResourceQuota key that bounds whole GPUs (extended resources are
/// quota'd by their requests only).
pub const GPU_QUOTA: &str = "requests.nvidia.com/gpu";

/// Whole GPUs `pod` asks for (its containers' requests, else limits: an
/// extended resource's request equals its limit).
fn gpus_of(p: &Pod) -> f64 {
    let qty = |q: &Quantity| -> f64 { parse_quantity(&q.0).unwrap_or(0.0) };
    p.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .filter_map(|c| {
            let r = c.resources.as_ref()?;
            r.requests.as_ref().and_then(|m| m.get(GPU)).or_else(|| r.limits.as_ref().and_then(|m| m.get(GPU))).map(qty)
        })
        .sum()
}

/// The GPU quota of namespace `ns` (the strictest of its ResourceQuotas
/// on [`GPU_QUOTA`]) as (hard, used): used is the larger of what the
/// quotas' status says (the API server's accounting, which lags) and the
/// GPUs the unfinished pods of `ns` among `pods` ask for. `None`: no quota
/// bounds GPUs there.
pub fn namespace_gpu_quota(quotas: &[Arc<ResourceQuota>], pods: &[Arc<Pod>], ns: &str) -> Option<(u64, u64)> {
    let qty = |q: &Quantity| -> f64 { parse_quantity(&q.0).unwrap_or(0.0) };
    let hard = quotas
        .iter()
        .filter_map(|q| q.spec.as_ref()?.hard.as_ref()?.get(GPU_QUOTA).map(qty))
        .fold(None, |m: Option<f64>, h| Some(m.map_or(h, |m| m.min(h))))?;
    let status: f64 =
        quotas.iter().filter_map(|q| q.status.as_ref()?.used.as_ref()?.get(GPU_QUOTA).map(qty)).fold(0.0, f64::max);
    let pods: f64 = pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
        .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")))
        .map(|p| gpus_of(p))
        .sum();
    let whole = |v: f64| if v.is_finite() && v > 0.0 { v.floor() as u64 } else { 0 };
    Some((whole(hard), whole(status.max(pods).ceil())))
}

pub fn capacity_of(nodes: &[Arc<Node>], pods: &[Arc<Pod>]) -> Vec<NodeCapacity> {
    let qty = |q: &Quantity| -> f64 { parse_quantity(&q.0).unwrap_or(0.0) };
    let mut used: HashMap<String, BTreeMap<String, f64>> = HashMap::new();
    for p in pods {
        let Some(node) = holds_node(p) else { continue };
        let u = used.entry(node.to_string()).or_default();
        for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
            let r = c.resources.as_ref();
            let mut mine: BTreeMap<String, f64> = BTreeMap::new();
            for src in [r.and_then(|r| r.limits.as_ref()), r.and_then(|r| r.requests.as_ref())].into_iter().flatten() {
                for (k, v) in src {
                    mine.insert(k.clone(), qty(v));
                }
            }
            for (k, v) in mine {
                *u.entry(k).or_default() += v;
            }
        }
    }
    let mut out = Vec::new();
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let alloc = n.status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default();
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        let u = used.get(&name).cloned().unwrap_or_default();
        // Whole GPUs, else the MIG profile with the most instances.
        let whole = alloc.get(GPU).map(qty).unwrap_or(0.0);
        let (res, gpu_type) = if whole > 0.0 {
            (GPU.to_string(), labels.get(GPU_PRODUCT).map(|p| gpu_type_of_product(p)))
        } else {
            match alloc
                .iter()
                .filter(|(k, v)| k.starts_with(MIG_PREFIX) && qty(v) > 0.0)
                .max_by(|a, b| qty(a.1).total_cmp(&qty(b.1)))
            {
                Some((k, _)) => (k.clone(), Some(k.trim_start_matches(MIG_PREFIX).to_string())),
                None => (GPU.to_string(), None),
            }
        };
        let total = alloc.get(&res).map(qty).unwrap_or(0.0).max(0.0) as u32;
        let free = (f64::from(total) - u.get(&res).copied().unwrap_or(0.0)).max(0.0) as u32;
        let cpus = alloc.get("cpu").map(qty).unwrap_or(0.0) as u32;
        let mem = (alloc.get("memory").map(qty).unwrap_or(0.0) / 1048576.0) as u64;
        let mut features: Vec<String> = labels
            .iter()
            .filter(|(k, _)| k.starts_with("nvidia.com/") || k.starts_with("topology.kubernetes.io/"))
            .map(|(k, v)| format!("{}={v}", k.rsplit('/').next().unwrap_or(k)))
            .collect();
        features.sort();
        let state = match (ready, unschedulable, free < total) {
            (false, _, _) => "down",
            (true, true, _) => "drained",
            (true, false, true) if free == 0 => "allocated",
            (true, false, true) => "mixed",
            _ => "idle",
        };
        out.push(NodeCapacity {
            name,
            partitions: vec!["kubernetes".into()],
            gpu_type: gpu_type.filter(|_| total > 0),
            gpus_total: total,
            gpus_free: free,
            state: state.into(),
            switch: labels.get("topology.kubernetes.io/zone").cloned(),
            cpus,
            memory_mb: mem,
            features: Some(features),
            ..Default::default()
        });
    }
    out
}

/// A Kubernetes quantity in base units.
pub fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(s.len());
    let (num, suf) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let m = match suf {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1048576.0,
        "Gi" => 1073741824.0,
        "Ti" => 1099511627776.0,
        _ => return None,
    };
    Some(n * m)
}

impl Backend for KubeBackend {
    fn scheduler(&self) -> &'static str {
        "kubernetes"
    }

    fn gpu_quotas(&self, users: &[String], accounts: &[(String, String)]) -> Option<Vec<GpuQuota>> {
        if self.quotas.is_empty() {
            return None;
        }
        let out: Vec<GpuQuota> = self
            .namespace_quotas()
            .into_iter()
            .filter_map(|(ns, hard, used)| {
                let users = self.settings.users_in(users, accounts, ns);
                (!users.is_empty()).then(|| GpuQuota { scope: format!("namespace {ns}"), users, hard, used })
            })
            .collect();
        (!out.is_empty()).then_some(out)
    }

    /// Every pod runs under its job lease (a helper image, a lease length,
    /// a meta-scheduler to renew with): its `lease-exec` holds the script
    /// while the first lease answers "wait", as at a Slurm target, so a job
    /// placed early may come here.
    fn start_gate(&self) -> bool {
        PodLease::of(&self.settings, &self.ckpt).is_some()
            && !self.ckpt.cluster_token.is_empty()
            && !self.ckpt.metasched_url.is_empty()
    }

    fn output_owner(&self, _job_uid: Option<u32>) -> Option<u32> {
        // The agent writes the job's output file itself (pod logs).
        Some(crate::own_uid())
    }

    async fn capacity(&self) -> Result<Capacity> {
        // Every pod holds capacity, not only Fleet's: the watched cache of
        // all unfinished pods where the agent's RBAC allows it, else its
        // namespace's (no list per heartbeat).
        let pods = self.busy_pods();
        // Forget the log followers of Jobs Kubernetes no longer has.
        let ids: std::collections::HashSet<String> = self
            .all_jobs()
            .iter()
            .filter_map(|j| j.metadata.annotations.as_ref()?.get("fleet.io/job-id").cloned())
            .collect();
        self.follow.lock().retain(|id, f| ids.contains(id) || f.pods.values().any(|done| !done));
        // The queue: Fleet's unfinished Jobs, running when a pod of theirs runs.
        let live = self.all_pods();
        let (mut pending, mut running) = (0, 0);
        for j in self.all_jobs().iter().filter(|j| has_true(j, "Complete").is_none() && has_true(j, "Failed").is_none())
        {
            let name = j.metadata.name.as_deref().unwrap_or("");
            let runs = live.iter().any(|p| {
                p.metadata.labels.as_ref().and_then(|l| l.get("batch.kubernetes.io/job-name")).map(String::as_str)
                    == Some(name)
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            if runs {
                running += 1;
            } else {
                pending += 1;
            }
        }
        Ok(Capacity { nodes: capacity_of(&self.nodes.state(), &pods), pending, running, holding: holding_of(&pods) })
    }

    async fn submit(&self, id: &str, req: &JobRequest, user: &LocalUser) -> Result<u64> {
        let dir = self.job_dir(id);
        if let Some(parent) = dir.parent() {
            tokio::fs::create_dir_all(parent).await.with_context(|| format!("creating {}", parent.display()))?;
        }
        crate::jobdir::create(&dir, crate::own_uid())?;
        let products = self.products();
        // The user's groups here, as `sudo -u` would give them (identity
        // mapping: `user` is the mapped local user).
        let groups = crate::identity::Accounts::read()?.groups_of(&user.name, user.gid);
        let ckpt = CkptMount::of(&self.ckpt, id, user)?;
        let lease =
            PodLease::of(&self.settings, &self.ckpt).filter(|_| ckpt.as_ref().is_some_and(|m| !m.token.is_empty()));
        if req.fleet.start_gated && lease.is_none() {
            // Placed before its origin confirmed the stand-in runs: without
            // the lease that holds its script, it must not be submitted.
            bail!("job {id} was placed early and must start under its job lease, which this site's pods cannot have (KubeHelperImage, JobLeaseMs, CkptHelper, the meta-scheduler's URL and this cluster's token)");
        }
        if lease.is_some() {
            // What the tracker reads to tell the meta-scheduler the run is under its lease.
            crate::jobdir::write_private(
                &dir.join(crate::ckpt::SCRIPT_FILE),
                req.script.as_deref().unwrap_or_default(),
            )?;
        }
        // translate() puts the objects in the same namespace.
        let ns = &self.settings.namespace_for(user.mapped_account.as_deref()).to_string();
        let mut tries = 0;
        let (native_id, objects, job) = loop {
            let native_id = self.mint_id();
            let t = Translate {
                site: &self.site,
                fleet_id: id,
                native_id,
                user,
                settings: &self.settings,
                products: &products,
                groups: &groups,
                ckpt: ckpt.as_ref(),
                lease: lease.as_ref(),
            };
            let objects = translate(&t, req)?;
            let jobs: Api<Job> = Api::namespaced(self.client.clone(), ns);
            let name = job_name(native_id);
            self.lag.lock().created.insert(name.clone(), Instant::now());
            match jobs.create(&PostParams::default(), &objects.job).await {
                Ok(job) => break (native_id, objects, job),
                Err(kube::Error::Api(s)) if s.code == 409 && tries < 3 => {
                    self.lag.lock().created.remove(&name);
                    tries += 1;
                }
                Err(e) => {
                    self.lag.lock().created.remove(&name);
                    return Err(e).with_context(|| format!("creating Job {name} in namespace {ns}"));
                }
            }
        };
        let name = job_name(native_id);
        let own = owner(&job)?;
        let res = async {
            let mut cm = objects.script.clone();
            cm.metadata.owner_references = Some(vec![own.clone()]);
            Api::<ConfigMap>::namespaced(self.client.clone(), ns)
                .create(&PostParams::default(), &cm)
                .await
                .context("creating the script's ConfigMap")?;
            if let Some(mut s) = objects.env.clone() {
                s.metadata.owner_references = Some(vec![own.clone()]);
                Api::<Secret>::namespaced(self.client.clone(), ns)
                    .create(&PostParams::default(), &s)
                    .await
                    .context("creating the environment's Secret")?;
            }
            if let Some(mut s) = objects.ckpt.clone() {
                s.metadata.owner_references = Some(vec![own.clone()]);
                Api::<Secret>::namespaced(self.client.clone(), ns)
                    .create(&PostParams::default(), &s)
                    .await
                    .context("creating the checkpoint Secret")?;
            }
            if let Some(mut s) = objects.service.clone() {
                s.metadata.owner_references = Some(vec![own.clone()]);
                Api::<Service>::namespaced(self.client.clone(), ns)
                    .create(&PostParams::default(), &s)
                    .await
                    .context("creating the headless Service")?;
            }
            // Released (or left suspended for Kueue), and marked whole: what
            // `find_submitted` adopts after a crash; a Job without the mark
            // is half-made and deleted there.
            let mut patch = json!({"metadata": {"annotations": {COMPLETE_ANNOTATION: "true"}}});
            if self.settings.queue.is_none() {
                patch["spec"] = json!({"suspend": false});
            }
            Api::<Job>::namespaced(self.client.clone(), ns)
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .context("releasing the Job")?;
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = res {
            // Nothing half-made stays behind: the Job owns whatever was created.
            let _ = Api::<Job>::namespaced(self.client.clone(), ns).delete(&name, &DeleteParams::background()).await;
            return Err(e);
        }
        Ok(native_id)
    }

    async fn status(&self, native_ids: &[u64]) -> Result<Vec<NativeJob>> {
        let mut out = Vec::new();
        let jobs = self.all_jobs();
        self.taken_away.keep_only(&jobs.iter().filter_map(|j| j.metadata.name.as_deref()).collect());
        for &nid in native_ids {
            // Deleted by `cancel`: `accounting` reports it, whatever a
            // lagging watch still holds.
            if self.cancelled.lock().contains_key(&nid) || self.cancel_dir().join(nid.to_string()).exists() {
                continue;
            }
            let name = job_name(nid);
            let job = match jobs.iter().find(|j| j.metadata.name.as_deref() == Some(name.as_str())) {
                Some(j) => (**j).clone(),
                // Not in the watch yet (just created) or gone: ask once.
                None => {
                    let Some(ns) = self.namespace_of(&name).await? else { continue };
                    match Api::<Job>::namespaced(self.client.clone(), &ns).get_opt(&name).await? {
                        Some(j) => j,
                        None => continue,
                    }
                }
            };
            let fleet_id =
                job.metadata.annotations.as_ref().and_then(|a| a.get("fleet.io/job-id")).cloned().unwrap_or_default();
            let mut pods = self.pods_of(&name);
            if pods_behind(&job, &pods) {
                // The Job's end came in before its pods' (two watch
                // streams): the exit code, the termination message and the
                // logs are the pods', so read them from the API server.
                match self.list_pods_of(&job).await {
                    Ok(fresh) => pods = fresh,
                    Err(e) => tracing::warn!(job = %name, "listing the pods of an ended Job: {e:#}"),
                }
            }
            let refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
            let mut nj = native_state_with(&job, &refs, self.taken_away.of(&name).as_ref());
            if nj.raw_state == "PENDING"
                && nj.reason.is_empty()
                && pods.is_empty()
                && job.spec.as_ref().and_then(|s| s.suspend) != Some(true)
            {
                // Released and still without a pod: the Job controller may
                // be refused its pods (a ResourceQuota, an admission
                // policy); it says so only in events on the Job.
                if let Some(why) = self.failed_create(&job).await {
                    nj.reason = why;
                }
            }
            if !fleet_id.is_empty() {
                let mut done = self.follow_logs(&fleet_id, &pods);
                if nj.state.is_terminal() {
                    // Its lease watchdog's stop line in a container's
                    // termination message: noted for the tracker as the log
                    // relay notes it (the relay may have missed the line).
                    if let Some(why) = lease_stop_message(&refs) {
                        let note = self.job_dir(&fleet_id).join(crate::ckpt::LEASE_STOPPED_FILE);
                        if !note.exists() {
                            let _ = crate::jobdir::write_private(&note, format!("{why}\n").as_bytes());
                        }
                    }
                    // Report the end only with the whole output in the file.
                    let t0 = Instant::now();
                    while !done && t0.elapsed() < Duration::from_secs(10) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        done = self.follow_logs(&fleet_id, &pods);
                    }
                    let still_running = pods.iter().any(|p| !pod_ended(p));
                    if still_running && has_true(&job, "Complete").is_none() && has_true(&job, "Failed").is_none() {
                        // Fatal for Fleet (image pull, eviction) while
                        // Kubernetes would keep trying: stop it here.
                        let ns = job.metadata.namespace.clone().unwrap_or_else(|| self.settings.namespace.clone());
                        let _ = Api::<Job>::namespaced(self.client.clone(), &ns)
                            .delete(&name, &DeleteParams::background())
                            .await;
                    }
                    // The follow entry stays (its pods marked read): a
                    // repeated status call must not append the logs again.
                    if !done {
                        // Its log is still being read (a long backlog, an
                        // API server away): it ends once the whole output
                        // is in the file, not before with its tail lost.
                        tracing::info!(%fleet_id, job = %name, "ended; still reading its log before reporting the end");
                        let raw_state = "COMPLETING".to_string();
                        out.push(NativeJob {
                            state: JobState::Running,
                            raw_state,
                            exit_code: None,
                            signal: None,
                            ..nj
                        });
                        continue;
                    }
                }
            }
            out.push(nj);
        }
        Ok(out)
    }

    /// The Jobs an interrupted submission of fleet job `id` left: listed
    /// by the fleet id label (the exact id in the annotation), run as `uid`,
    /// created since `since`. A Job created but never marked submitted (the
    /// agent died before its ConfigMap or its release) is deleted rather
    /// than adopted: it could never run.
    async fn find_submitted(&self, id: &str, uid: u32, since: f64) -> Result<Vec<NativeJob>> {
        let sel = format!("{MANAGED_BY}=fleet,{JOB_ID_LABEL}={}", label_value(id));
        let mut out = Vec::new();
        for ns in self.settings.namespaces() {
            let api: Api<Job> = Api::namespaced(self.client.clone(), &ns);
            let listed = api.list(&ListParams::default().labels(&sel)).await.context("listing Fleet's Jobs")?;
            self.adoptable_in(&api, listed.items, id, uid, since, &mut out).await?;
        }
        Ok(out)
    }

    async fn accounting(&self, native_ids: &[u64]) -> Result<Vec<NativeJob>> {
        let c = self.cancelled.lock();
        Ok(native_ids.iter().filter_map(|i| c.get(i).cloned().or_else(|| self.cancel_record(*i))).collect())
    }

    async fn stand_ins(&self, _partition: &str) -> Result<Vec<NativeJob>> {
        // A Kubernetes cluster is a target only: no stand-ins, no origin jobs.
        Ok(Vec::new())
    }

    async fn cancel(&self, native_id: u64, _user: &str) -> Result<()> {
        let name = job_name(native_id);
        let Some(ns) = self.namespace_of(&name).await? else { return Ok(()) };
        let api: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let before = api.get_opt(&name).await?;
        let Some(job) = before else { return Ok(()) };
        if job.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)).map(String::as_str) != Some("fleet") {
            bail!("Job {name} is not managed by Fleet: not deleting it");
        }
        let mut nj = native_state(&job, &[]);
        nj.state = JobState::Cancelled;
        nj.raw_state = "CANCELLED".into();
        nj.exit_code = None;
        // Kept on disk before the delete: an agent restarted after it still
        // reports the job cancelled (Kubernetes forgets a deleted Job).
        self.write_cancel_record(&nj)?;
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                // Not deleted: it runs on, and must be reported as running.
                let _ = std::fs::remove_file(self.cancel_dir().join(native_id.to_string()));
                return Err(e).with_context(|| format!("deleting Job {name}"));
            }
        }
        self.cancelled.lock().insert(native_id, nj);
        Ok(())
    }

    async fn signal(&self, native_id: u64, _user: &str, signal: &str, _scope: SignalScope) -> Result<()> {
        // The API has no way to signal a container's process (only to
        // delete the pod, which is scancel's job).
        bail!("SIG{signal} to Job {}: Kubernetes cannot deliver signals to a job's processes (only scancel, which deletes the Job)", job_name(native_id))
    }

    fn job_dir(&self, id: &str) -> PathBuf {
        self.spool.join("jobs").join(id)
    }
}

/// `fleet-agent --check` at a Kubernetes site: the kubeconfig is private,
/// the API server answers, the agent may list what it watches, and what
/// capacity it sees. `Err((reason, hint))`.
pub async fn check(
    settings: &KubeSettings,
    site: &str,
    spool: PathBuf,
) -> std::result::Result<String, (String, String)> {
    use std::os::unix::fs::MetadataExt;
    if let Some(p) = &settings.kubeconfig {
        let m = std::fs::metadata(p).map_err(|e| (format!("KubeConfig {}: {e}", p.display()), String::new()))?;
        if m.mode() & 0o077 != 0 {
            return Err((
                format!("KubeConfig {} has mode {:o}: it holds the agent's credentials", p.display(), m.mode() & 0o777),
                format!("chmod 0600 {}", p.display()),
            ));
        }
    }
    let rbac = "the agent's ServiceAccount needs get/list/watch/create/patch/delete on jobs, get/list/watch on pods, get on pods/log, create on configmaps, secrets and services, list on events and list/watch on resourcequotas in KubeNamespace and each KubeAccountNamespaces namespace, and get/list/watch on nodes: conf/kubernetes/fleet-agent-rbac.yaml (README: Kubernetes targets)";
    let b = match tokio::time::timeout(Duration::from_secs(40), KubeBackend::connect(settings.clone(), site, spool))
        .await
    {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err((format!("{e:#}"), rbac.into())),
        Err(_) => return Err(("the API server did not answer within 40 s".into(), String::new())),
    };
    let Capacity { nodes, pending, running, .. } =
        b.capacity().await.map_err(|e| (format!("{e:#}"), rbac.to_string()))?;
    let mut types: BTreeMap<String, u32> = BTreeMap::new();
    for n in &nodes {
        if let Some(t) = &n.gpu_type {
            *types.entry(t.clone()).or_default() += n.gpus_total;
        }
    }
    let gpus: Vec<String> = types.iter().map(|(t, n)| format!("{n}×{t}")).collect();
    // The GPU quotas placement will see (or why it sees none).
    let quotas = if b.quotas.len() < settings.namespaces().len() {
        "; ResourceQuotas not readable in every namespace (RBAC list/watch on resourcequotas): placement cannot see those GPU quotas".to_string()
    } else {
        let q: Vec<String> =
            b.namespace_quotas().iter().map(|(ns, hard, used)| format!("{ns} {used}/{hard}")).collect();
        if q.is_empty() {
            "; no GPU quota".to_string()
        } else {
            format!("; GPU quotas {}", q.join(", "))
        }
    };
    Ok(format!(
        "namespace{} {}: {} nodes, GPUs {}; Fleet's Jobs: {running} running, {pending} pending{quotas}; image {}{}",
        if settings.namespaces().len() > 1 { "s" } else { "" },
        settings.namespaces().join(", "),
        nodes.len(),
        if gpus.is_empty() { "none".to_string() } else { gpus.join(", ") },
        settings.image,
        settings.queue.as_ref().map(|q| format!(", Kueue queue {q}")).unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_is_read_in_pieces_of_at_most_the_limit_whatever_its_lines() {
        // One line far longer than the limit, then short lines, then a tail
        // with no newline; the reader's buffer is smaller than the limit.
        let mut log = vec![b'y'; 10 * 4096 + 7];
        log.extend_from_slice(b"\nshort\n\nlast");
        let mut r = futures::io::BufReader::with_capacity(1000, futures::io::Cursor::new(log.clone()));
        let mut pieces = Vec::new();
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
            loop {
                let mut p = Vec::new();
                if read_piece(&mut r, &mut p, 4096).await.unwrap() == 0 {
                    break;
                }
                pieces.push(p);
            }
        });
        assert!(pieces.iter().all(|p| p.len() <= 4096), "{:?}", pieces.iter().map(Vec::len).collect::<Vec<_>>());
        assert_eq!(pieces.concat(), log, "nothing lost or doubled");
        let tail: Vec<&[u8]> = pieces[pieces.len() - 4..].iter().map(Vec::as_slice).collect();
        assert_eq!(tail, [&b"yyyyyyy\n"[..], b"short\n", b"\n", b"last"]);
    }

    /// A container's `env` list as name → value.
    fn env_of(env: &serde_json::Value) -> HashMap<String, String> {
        env.as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e["value"].as_str().unwrap().to_string()))
            .collect()
    }
    use fleet_api::job::{GpuRequest, GpuScope};

    fn user() -> LocalUser {
        LocalUser { name: "alice".into(), uid: 1001, gid: 1001, account: None, mapped_account: None, home: None }
    }

    fn settings() -> KubeSettings {
        KubeSettings {
            kubeconfig: None,
            namespace: "fleet".into(),
            image: "ubuntu:24.04".into(),
            queue: None,
            service_account: None,
            account_namespaces: BTreeMap::new(),
            helper_image: None,
        }
    }

    fn req(gpus: &[(Option<&str>, u32, GpuScope)], nodes: Option<u32>) -> JobRequest {
        JobRequest {
            origin: "beta".into(),
            user_id: 1001,
            name: Some("train".into()),
            min_nodes: nodes,
            gpus: gpus
                .iter()
                .map(|(t, c, s)| GpuRequest { gpu_type: t.map(str::to_string), count: *c, scope: *s })
                .collect(),
            script: Some(b"#!/bin/bash\n#FLEET image=nvcr.io/nvidia/pytorch:24.05-py3\necho hi\n".to_vec()),
            time_limit_min: Some(30),
            cpus_per_task: Some(4),
            mem_per_node_mb: Some(8192),
            env: vec!["FOO=bar".into(), "SLURM_JOB_ID=9".into(), "PATH=/x".into()],
            ..Default::default()
        }
    }

    fn objects(r: &JobRequest, products: &[String]) -> (serde_json::Value, Objects) {
        let (u, s) = (user(), settings());
        let t = Translate {
            site: "gamma",
            fleet_id: "beta-7",
            native_id: 42,
            user: &u,
            settings: &s,
            products,
            groups: &[1001, 2000],
            ckpt: None,
            lease: None,
        };
        let o = translate(&t, r).unwrap();
        (serde_json::to_value(&o.job).unwrap(), o)
    }

    #[test]
    fn a_gpu_job_becomes_a_job_with_limits_affinity_and_slurm_env() {
        let products = vec!["NVIDIA-H100-80GB-HBM3".to_string(), "NVIDIA-A100-SXM4-80GB".to_string()];
        let (j, o) = objects(&req(&[(Some("h100"), 8, GpuScope::Node)], None), &products);
        let spec = &j["spec"];
        assert_eq!(spec["activeDeadlineSeconds"], 1800);
        // Reported as the run's limit (its stand-in's time-limit mails).
        assert_eq!(native_state(&o.job, &[]).time_limit_min, Some(30));
        assert_eq!(spec["backoffLimit"], 0);
        assert_eq!(spec["suspend"], true);
        assert_eq!(spec["parallelism"], 1);
        let pod = &spec["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "nvcr.io/nvidia/pytorch:24.05-py3");
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "8");
        assert_eq!(c["resources"]["requests"]["cpu"], "4");
        assert_eq!(c["resources"]["limits"]["memory"], "8192Mi");
        let terms =
            &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(terms[0]["matchExpressions"][0]["values"], json!(["NVIDIA-H100-80GB-HBM3"]));
        assert_eq!(pod["securityContext"]["runAsUser"], 1001);
        let env = env_of(&c["env"]);
        assert_eq!(env["SLURM_JOB_ID"], "42");
        assert_eq!(env["SLURM_JOB_NAME"], "train");
        assert_eq!(env["SLURM_NTASKS"], "1");
        assert_eq!(env["SLURM_JOB_NUM_NODES"], "1");
        assert_eq!(env["SLURM_NODELIST"], "fleet-42-0");
        assert_eq!(env["SLURM_GPUS_ON_NODE"], "8");
        assert_eq!(env["SLURM_SUBMIT_HOST"], "beta");
        assert!(o.service.is_none());
        // The submission environment in a Secret, without Slurm's own variables or PATH.
        let secret = o.env.unwrap();
        let keys: Vec<&String> = secret.data.as_ref().unwrap().keys().collect();
        assert_eq!(keys, ["FOO"]);
        assert_eq!(c["envFrom"][0]["secretRef"]["name"], "fleet-42-env");
        let labels = o.script.metadata.labels.unwrap();
        assert_eq!(labels[MANAGED_BY], "fleet");
        assert_eq!(labels[JOB_ID_LABEL], "beta-7");
        assert_eq!(
            o.script.data.unwrap()["script"],
            "#!/bin/bash\n#FLEET image=nvcr.io/nvidia/pytorch:24.05-py3\necho hi\n"
        );
    }

    #[test]
    fn the_pod_runs_as_the_mapped_user_never_root() {
        let (j, _) = objects(&req(&[], None), &[]);
        let sc = &j["spec"]["template"]["spec"]["securityContext"];
        assert_eq!(
            (sc["runAsUser"].as_u64(), sc["runAsGroup"].as_u64(), sc["runAsNonRoot"].as_bool()),
            (Some(1001), Some(1001), Some(true))
        );
        assert_eq!(sc["supplementalGroups"], json!([1001, 2000]));
        assert_eq!(sc["fsGroup"], 1001);
        // The `restricted` Pod Security Standard's own checks.
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
        for c in j["spec"]["template"]["spec"]["containers"].as_array().unwrap() {
            assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
            assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        }
        assert_eq!(j["spec"]["template"]["spec"]["automountServiceAccountToken"], false);
    }

    #[test]
    fn the_checkpoint_token_is_a_secret_mounted_read_only_never_in_the_spec() {
        let (u, s) = (user(), settings());
        let token = fleet_api::auth::ckpt_token("gamma-secret", "beta-7");
        let m = CkptMount {
            metasched_url: "https://ms:8443".into(),
            token: token.clone(),
            stores: Some(b"[[store]]\nurl = \"s3://ckpt-lab-central\"\n".to_vec()),
            ca: Some(b"-----BEGIN CERTIFICATE-----\n".to_vec()),
        };
        let mut r = req(&[], None);
        r.fleet.ckpt = Some("s3://ckpt-lab-central/fleet/beta-7".into());
        r.fleet.resume_from = Some("s3://ckpt-lab-central/fleet/beta-7/ckpt-000000000003".into());
        let t = Translate {
            site: "gamma",
            fleet_id: "beta-7",
            native_id: 42,
            user: &u,
            settings: &s,
            products: &[],
            groups: &[],
            ckpt: Some(&m),
            lease: None,
        };
        let o = translate(&t, &r).unwrap();
        let job = serde_json::to_string(&o.job).unwrap();
        assert!(!job.contains(&token), "the token is not in the Job's spec");
        let sec = o.ckpt.expect("a checkpoint Secret");
        assert_eq!(sec.metadata.name.as_deref(), Some("fleet-42-ckpt"));
        assert_eq!(sec.metadata.labels.as_ref().unwrap()[MANAGED_BY], "fleet");
        let data = sec.data.unwrap();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["ca.pem", "stores.toml", "token"]);
        assert_eq!(data["token"].0, token.as_bytes());
        let j = serde_json::to_value(&o.job).unwrap();
        let pod = &j["spec"]["template"]["spec"];
        let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "ckpt").unwrap();
        assert_eq!(
            (vol["secret"]["secretName"].as_str(), vol["secret"]["defaultMode"].as_u64()),
            (Some("fleet-42-ckpt"), Some(0o440))
        );
        let mount =
            pod["containers"][0]["volumeMounts"].as_array().unwrap().iter().find(|v| v["name"] == "ckpt").unwrap();
        assert_eq!((mount["mountPath"].as_str(), mount["readOnly"].as_bool()), (Some(CKPT_DIR), Some(true)));
        let env = env_of(&pod["containers"][0]["env"]);
        assert_eq!(env["FLEET_CKPT_TOKEN_FILE"], "/fleet/ckpt/token");
        assert_eq!(env["FLEET_CKPT_STORES"], "/fleet/ckpt/stores.toml");
        assert_eq!(env["FLEET_METASCHED_CA"], "/fleet/ckpt/ca.pem");
        assert_eq!(env["FLEET_METASCHED_URL"], "https://ms:8443");
        assert_eq!(env["FLEET_CKPT_URL"], "s3://ckpt-lab-central/fleet/beta-7");
        assert_eq!(env["FLEET_RESUME_FROM"], "s3://ckpt-lab-central/fleet/beta-7/ckpt-000000000003");
        // Without checkpoint settings: no Secret, no mount, no variables.
        let (j, o) = objects(&req(&[], None), &[]);
        assert!(o.ckpt.is_none());
        let pod = &j["spec"]["template"]["spec"];
        assert!(pod["volumes"].as_array().unwrap().iter().all(|v| v["name"] != "ckpt"));
        assert!(!j.to_string().contains("FLEET_CKPT_TOKEN_FILE"));
    }

    #[test]
    fn a_pod_runs_under_its_job_lease_with_the_helper_from_an_init_container() {
        let (u, mut s) = (user(), settings());
        let token = fleet_api::auth::ckpt_token("gamma-secret", "beta-7");
        let m = CkptMount { metasched_url: "https://ms:8443".into(), token: token.clone(), stores: None, ca: None };
        let k = crate::ckpt::JobCkpt {
            job_lease: Some(Duration::from_secs(8)),
            helper: "/usr/bin/fleet-ckpt".into(),
            ..Default::default()
        };
        assert_eq!(PodLease::of(&s, &k), None, "no KubeHelperImage: no lease");
        s.helper_image = Some("registry.example.org/fleet/fleet-ckpt:1".into());
        let lease = PodLease::of(&s, &k).expect("a lease");
        assert_eq!(PodLease::of(&s, &crate::ckpt::JobCkpt { job_lease: None, ..k.clone() }), None, "JobLeaseMs=0");
        for bad in ["fleet-ckpt", "/opt/my tools/fleet-ckpt"] {
            assert_eq!(PodLease::of(&s, &crate::ckpt::JobCkpt { helper: bad.into(), ..k.clone() }), None, "{bad}");
        }
        let mut r = req(&[], None);
        r.fleet.epoch = 3;
        let t = Translate {
            site: "gamma",
            fleet_id: "beta-7",
            native_id: 42,
            user: &u,
            settings: &s,
            products: &[],
            groups: &[],
            ckpt: Some(&m),
            lease: Some(&lease),
        };
        let o = translate(&t, &r).unwrap();
        let j = serde_json::to_value(&o.job).unwrap();
        assert!(!j.to_string().contains(&token), "the credential is only in the run's Secret");
        let pod = &j["spec"]["template"]["spec"];
        assert_eq!(pod["shareProcessNamespace"], true, "the job's shell is not PID 1");
        let init = &pod["initContainers"][0];
        assert_eq!(init["image"], "registry.example.org/fleet/fleet-ckpt:1");
        assert_eq!(init["command"], json!(["/usr/bin/fleet-ckpt", "install-self", "/fleet/bin/fleet-ckpt"]));
        assert_eq!(init["volumeMounts"], json!([{"name": "fleet-bin", "mountPath": "/fleet/bin"}]));
        assert!(
            init.get("env").is_none() && init.get("envFrom").is_none(),
            "the helper's copy sees nothing of the job"
        );
        let c = &pod["containers"][0];
        assert_eq!(c["command"], json!(["/fleet/bin/fleet-ckpt", "lease-exec", "/fleet/job/entry"]));
        let mounts = c["volumeMounts"].as_array().unwrap();
        let bin = mounts.iter().find(|v| v["name"] == "fleet-bin").unwrap();
        assert_eq!((bin["mountPath"].as_str(), bin["readOnly"].as_bool()), (Some(HELPER_DIR), Some(true)));
        assert!(pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "fleet-bin" && v["emptyDir"].is_object()));
        let env = env_of(&c["env"]);
        assert_eq!(env["FLEET_JOB_SCRIPT"], "/fleet/job/entry");
        assert_eq!(env["FLEET_EPOCH"], "3");
        assert_eq!(env["FLEET_JOB_LEASE_MS"], "8000");
        assert_eq!(env["FLEET_LEASE_SCOPE"], "pod", "the watchdog stops the whole PID namespace");
        // Its note and log in a writable directory of the pod's own (the
        // script's is a read-only ConfigMap); its stop line in the termination message.
        assert_eq!(
            (env["FLEET_LEASE_DIR"].as_str(), env["FLEET_TERMINATION_LOG"].as_str()),
            (RUN_DIR, TERMINATION_LOG)
        );
        let run = mounts.iter().find(|v| v["name"] == "fleet-run").unwrap();
        assert_eq!((run["mountPath"].as_str(), run.get("readOnly")), (Some(RUN_DIR), None));
        assert!(pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "fleet-run" && v["emptyDir"].is_object()));
        assert_eq!(
            (c["terminationMessagePath"].as_str(), c["terminationMessagePolicy"].as_str()),
            (Some(TERMINATION_LOG), Some("File"))
        );
        assert_eq!(env["FLEET_CKPT_TOKEN_FILE"], "/fleet/ckpt/token");
        // The entry runs the script under bash, as before: lease-exec reads its #! line.
        assert!(ENTRY.starts_with("#!/bin/bash\n"));
        // No token to renew with: no lease, the pod as before.
        let m2 = CkptMount { token: String::new(), ..m.clone() };
        let o = translate(&Translate { ckpt: Some(&m2), ..t.clone() }, &r).unwrap();
        let j = serde_json::to_value(&o.job).unwrap();
        let pod = &j["spec"]["template"]["spec"];
        assert!(pod.get("initContainers").is_none() && pod.get("shareProcessNamespace").is_none());
        assert_eq!(pod["containers"][0]["command"], json!(["/bin/bash", "/fleet/job/entry"]));
        assert!(!j.to_string().contains("FLEET_JOB_LEASE_MS"));
        // The script's arguments follow the entry, which passes them on.
        let with_args = JobRequest { script_args: vec!["--lr".into(), "a b;$(x)".into()], ..r.clone() };
        let o = translate(&Translate { ckpt: Some(&m2), ..t.clone() }, &with_args).unwrap();
        let j = serde_json::to_value(&o.job).unwrap();
        assert_eq!(
            j["spec"]["template"]["spec"]["containers"][0]["command"],
            json!(["/bin/bash", "/fleet/job/entry", "--lr", "a b;$(x)"])
        );
        assert!(ENTRY.contains("\"$@\""));
    }

    #[test]
    fn the_entry_sets_the_submitters_umask_and_soft_limits() {
        let req = |env: &[&str]| JobRequest { env: env.iter().map(|e| e.to_string()).collect(), ..Default::default() };
        assert_eq!(entry_for(&req(&["PATH=/bin"])), ENTRY);
        let e = entry_for(&req(&[
            "SLURM_UMASK=0027",
            "SLURM_RLIMIT_NOFILE=777",
            "SLURM_RLIMIT_STACK=12641280",
            "SLURM_RLIMIT_CORE=18446744073709551615",
            "SLURM_RLIMIT_CPU=$(reboot)",
        ]));
        let setup: Vec<_> = e.lines().filter(|l| l.starts_with("umask") || l.starts_with("ulimit")).collect();
        assert_eq!(
            setup,
            [
                "umask 0027",
                "ulimit -S -n 777 2>/dev/null || ulimit -S -n hard 2>/dev/null",
                "ulimit -S -s 12345 2>/dev/null || ulimit -S -s hard 2>/dev/null",
                "ulimit -S -c unlimited 2>/dev/null || ulimit -S -c hard 2>/dev/null",
            ]
        );
        assert!(e.ends_with("exec /bin/bash \"$(dirname \"$0\")/script\" \"$@\"\n"), "{e}");
        assert!(e.find("ulimit").unwrap() < e.find("exec ").unwrap());
        // It runs, and the script sees what it set.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("entry"), &e).unwrap();
        std::fs::write(tmp.path().join("script"), "echo $(umask) $(ulimit -S -n) $(ulimit -S -s) \"$1\"\n").unwrap();
        let out = std::process::Command::new("/bin/bash").arg(tmp.path().join("entry")).arg("a b").output().unwrap();
        let out = String::from_utf8_lossy(&out.stdout);
        let hard_stack = String::from_utf8_lossy(
            &std::process::Command::new("/bin/bash").args(["-c", "ulimit -H -s"]).output().unwrap().stdout,
        )
        .trim()
        .to_string();
        let stack = if hard_stack == "unlimited" || hard_stack.parse::<u64>().is_ok_and(|h| h >= 12345) {
            "12345".to_string()
        } else {
            hard_stack
        };
        assert_eq!(out.trim(), format!("0027 777 {stack} a b"));
    }

    #[test]
    fn checkpoint_settings_are_read_from_the_agents_files() {
        let tmp = tempfile::tempdir().unwrap();
        let stores = tmp.path().join("stores.toml");
        std::fs::write(&stores, "[[store]]\n").unwrap();
        let k = crate::ckpt::JobCkpt {
            metasched_url: "https://ms".into(),
            ca_file: None,
            cluster_token: "gamma-secret".into(),
            stores: Some(stores.clone()),
            ..Default::default()
        };
        let me = crate::own_uid();
        let alice = crate::identity::LocalUser { name: "alice".into(), uid: me, gid: me, ..Default::default() };
        let m = CkptMount::of(&k, "beta-7", &alice).unwrap().unwrap();
        assert_eq!(m.token, fleet_api::auth::ckpt_token("gamma-secret", "beta-7"));
        assert_eq!(m.stores.as_deref(), Some(&b"[[store]]\n"[..]));
        // No token, no stores: nothing to mount.
        assert_eq!(CkptMount::of(&crate::ckpt::JobCkpt::default(), "beta-7", &alice).unwrap(), None);
        // A stores file that cannot be read, or too large for a Secret, is named.
        let gone = crate::ckpt::JobCkpt { stores: Some(tmp.path().join("nope.toml")), ..k.clone() };
        let e = format!("{:#}", CkptMount::of(&gone, "x", &alice).unwrap_err());
        assert!(e.contains("CkptStores") && e.contains("nope.toml"), "{e}");
        std::fs::write(&stores, vec![b'#'; 300 * 1024]).unwrap();
        let e = format!("{:#}", CkptMount::of(&k, "x", &alice).unwrap_err());
        assert!(e.contains("too large"), "{e}");
    }

    #[test]
    fn a_pod_gets_its_users_own_stores_file_and_nothing_a_user_links_there() {
        let tmp = tempfile::tempdir().unwrap();
        let agents = tmp.path().join("agent-stores.toml");
        std::fs::write(&agents, "agent's keys\n").unwrap();
        let users = tmp.path().join("users");
        std::fs::create_dir(&users).unwrap();
        std::fs::write(users.join("alice.toml"), "alice's keys\n").unwrap();
        let k = crate::ckpt::JobCkpt {
            metasched_url: "https://ms".into(),
            cluster_token: "gamma-secret".into(),
            stores: Some(agents.clone()),
            user_stores: Some(format!("{}/%u.toml", users.display())),
            ..Default::default()
        };
        let me = crate::own_uid();
        let user = |name: &str, uid: u32| crate::identity::LocalUser {
            name: name.into(),
            uid,
            gid: uid,
            ..Default::default()
        };
        let stores = |u: &crate::identity::LocalUser| CkptMount::of(&k, "beta-7", u).map(|m| m.and_then(|m| m.stores));
        assert_eq!(stores(&user("alice", me)).unwrap().as_deref(), Some(&b"alice's keys\n"[..]));
        // Bob has no file: his pod gets none, and never the agent's.
        assert_eq!(stores(&user("bob", me)).unwrap(), None);
        // A file that is not the user's is refused, named.
        let e = format!("{:#}", stores(&user("alice", me + 1)).unwrap_err());
        assert!(e.contains("alice.toml") && e.contains("belongs to uid"), "{e}");
        // A symlink or a hard link to the agent's file is never read.
        std::os::unix::fs::symlink(&agents, users.join("mallory.toml")).unwrap();
        let e = format!("{:#}", stores(&user("mallory", me)).unwrap_err());
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::hard_link(&agents, users.join("eve.toml")).unwrap();
        let e = format!("{:#}", stores(&user("eve", me)).unwrap_err());
        assert!(e.contains("hard links"), "{e}");
    }

    #[test]
    fn multi_node_is_an_indexed_gang_with_a_headless_service() {
        let (j, o) = objects(&req(&[(None, 16, GpuScope::Job)], Some(2)), &[]);
        let spec = &j["spec"];
        assert_eq!(
            (spec["completionMode"].as_str(), spec["parallelism"].as_u64(), spec["completions"].as_u64()),
            (Some("Indexed"), Some(2), Some(2))
        );
        assert_eq!(spec["template"]["spec"]["subdomain"], "fleet-42");
        assert!(spec["template"]["spec"]["hostname"].is_null());
        assert_eq!(spec["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8");
        let svc = serde_json::to_value(o.service.unwrap()).unwrap();
        assert_eq!(svc["spec"]["clusterIP"], "None");
        assert_eq!(svc["metadata"]["name"], "fleet-42");
        let env = &spec["template"]["spec"]["containers"][0]["env"];
        assert!(env
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "SLURM_NODELIST" && e["value"] == "fleet-42-[0-1]"));
        assert!(env
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "MASTER_ADDR" && e["value"] == "fleet-42-0.fleet-42"));
    }

    #[test]
    fn a_mig_profile_is_its_own_resource() {
        let (j, _) = objects(&req(&[(Some("1g.10gb"), 1, GpuScope::Node)], None), &[]);
        let pod = &j["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"], "1");
        assert!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].is_null());
        assert!(pod["affinity"].is_null());
    }

    #[test]
    fn the_image_is_the_option_else_the_directive_else_the_sites() {
        let image = |r: &JobRequest| {
            let (u, s) = (user(), settings());
            let t = Translate {
                site: "gamma",
                fleet_id: "beta-7",
                native_id: 42,
                user: &u,
                settings: &s,
                products: &[],
                groups: &[],
                ckpt: None,
                lease: None,
            };
            translate(&t, r).map(|o| {
                serde_json::to_value(&o.job).unwrap()["spec"]["template"]["spec"]["containers"][0]["image"].clone()
            })
        };
        let mut r = req(&[], None);
        assert_eq!(image(&r).unwrap(), "nvcr.io/nvidia/pytorch:24.05-py3");
        r.fleet.image = Some("ghcr.io/lab/train:v2".into());
        assert_eq!(image(&r).unwrap(), "ghcr.io/lab/train:v2");
        r.script = Some(b"#!/bin/bash\necho\n".to_vec());
        r.fleet.image = None;
        assert_eq!(image(&r).unwrap(), "ubuntu:24.04");
        // A hostile value that reached the agent anyway is refused, named.
        r.fleet.image = Some("x;reboot".into());
        let e = image(&r).unwrap_err().to_string();
        assert!(e.contains("--fleet-image=\"x;reboot\"") && e.contains("';' is not allowed"), "{e}");
    }

    #[test]
    fn a_job_runs_in_its_accounts_namespace() {
        let mut s = settings();
        s.account_namespaces = [("ml".to_string(), "team-ml".to_string())].into();
        assert_eq!(s.namespace_for(Some("ML")), "team-ml");
        assert_eq!(s.namespace_for(Some("cv")), "fleet");
        assert_eq!(s.namespace_for(None), "fleet");
        assert_eq!(s.namespaces(), vec!["fleet", "team-ml"]);
        let ml = LocalUser { account: Some("ml".into()), mapped_account: Some("ml".into()), ..user() };
        let t = Translate {
            site: "gamma",
            fleet_id: "beta-7",
            native_id: 42,
            user: &ml,
            settings: &s,
            products: &[],
            groups: &[],
            ckpt: None,
            lease: None,
        };
        let o = translate(&t, &req(&[], None)).unwrap();
        assert_eq!(o.job.metadata.namespace.as_deref(), Some("team-ml"));
        assert_eq!(o.script.metadata.namespace.as_deref(), Some("team-ml"));
        let env = serde_json::to_value(&o.job).unwrap()["spec"]["template"]["spec"]["containers"][0]["env"].clone();
        assert!(env.as_array().unwrap().iter().any(|e| e["name"] == "SLURM_JOB_PARTITION" && e["value"] == "team-ml"));
        // The job's own -A (text its user typed, the account the job is
        // charged to here where the map names none) never chooses one.
        let r = JobRequest { account: Some("ml".into()), ..req(&[], None) };
        let u = LocalUser { account: Some("ml".into()), ..user() };
        let t = Translate { user: &u, ..t };
        assert_eq!(translate(&t, &r).unwrap().job.metadata.namespace.as_deref(), Some("fleet"));
    }

    #[test]
    fn names_and_directives() {
        for (p, t) in [
            ("NVIDIA-H100-80GB-HBM3", "h100"),
            ("NVIDIA-A100-SXM4-80GB", "a100"),
            ("Tesla-V100-SXM2-16GB", "v100"),
            ("NVIDIA-L40S", "l40s"),
            ("NVIDIA", "nvidia"),
        ] {
            assert_eq!(gpu_type_of_product(p), t, "{p}");
        }
        for (t, m) in [
            ("1g.10gb", Some("1g.10gb")),
            ("a100_3g.40gb", Some("3g.40gb")),
            ("h100", None),
            ("g.gb", None),
            ("1g.xgb", None),
        ] {
            assert_eq!(mig_profile(t).as_deref(), m, "{t}");
        }
        assert_eq!(image_directive(b"#!/bin/sh\n#SBATCH -N1\n#FLEET image=a/b:1\n"), Some("a/b:1".into()));
        assert_eq!(image_directive(b"echo\n#FLEET image=a/b:1\n"), None);
        assert_eq!(image_directive(b"#FLEET image=$(rm -rf /)\n"), None);
        assert_eq!(label_value("beta-7"), "beta-7");
        assert_eq!(label_value("-a/b c-"), "a_b_c");
        assert_eq!(label_value(&"x".repeat(100)).len(), 63);
        assert_eq!(hostlist("fleet-1", 1), "fleet-1-0");
        assert_eq!(hostlist("fleet-1", 4), "fleet-1-[0-3]");
    }

    fn job_with(conds: &[(&str, &str, &str)], suspend: bool) -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": "fleet-42", "namespace": "fleet", "creationTimestamp": "2026-01-01T00:00:10Z"},
            "spec": {"suspend": suspend, "template": {"spec": {"containers": [], "securityContext": {"runAsUser": 1001}}}},
            "status": {"conditions": conds.iter().map(|(t, r, m)| json!({"type": t, "status": "True", "reason": r, "message": m})).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [], "nodeName": "n1"}, "status": status}),
        )
        .unwrap()
    }

    fn term(code: i32, reason: &str) -> serde_json::Value {
        json!({"phase": if code == 0 { "Succeeded" } else { "Failed" },
               "containerStatuses": [{"name": "job", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                                      "state": {"terminated": {"exitCode": code, "reason": reason}}}]})
    }

    fn waiting(reason: &str) -> serde_json::Value {
        json!({"phase": "Pending", "containerStatuses": [{"name": "job", "image": "", "imageID": "", "ready": false, "restartCount": 0,
               "state": {"waiting": {"reason": reason, "message": "m"}}}]})
    }

    #[test]
    fn the_watchdogs_stop_line_in_a_termination_message_is_its_note() {
        let ended = |message: &str| {
            let mut st = term(143, "Error");
            st["containerStatuses"][0]["state"]["terminated"]["message"] = json!(message);
            pod(st)
        };
        let check = |pods: Vec<Pod>, want: Option<&str>| {
            let refs: Vec<&Pod> = pods.iter().collect();
            assert_eq!(lease_stop_message(&refs).as_deref(), want);
        };
        let line = "fleet: stopping this run of job beta-7 at this cluster: its job lease ran out (8000 ms)\n";
        check(vec![ended(line)], Some("its job lease ran out (8000 ms)"));
        check(vec![pod(term(0, "Completed")), ended(line)], Some("its job lease ran out (8000 ms)"));
        // Only the first line, without control characters.
        check(vec![ended("fleet: stopping this run of job b at this cluster: stale\x1b[2J\nmore")], Some("stale[2J"));
        for other in
            ["", "exit 3", "fleet: stopping this run of job b", "fleet: stopping this run of job b at this cluster: "]
        {
            check(vec![ended(other)], None);
        }
        check(vec![pod(term(1, "Error")), pod(waiting("ErrImagePull"))], None);
    }

    #[test]
    fn states_map_to_slurms_names_with_their_reason() {
        let check = |job: Job, pods: Vec<Pod>, raw: &str, exit: Option<i32>, reason: &str| {
            let refs: Vec<&Pod> = pods.iter().collect();
            let n = native_state(&job, &refs);
            assert_eq!((n.raw_state.as_str(), n.exit_code, n.reason.as_str()), (raw, exit, reason));
            assert_eq!((n.native_id, n.user_id, n.submit_time), (42, Some(1001), Some(1767225610)));
        };
        check(
            job_with(&[("Complete", "CompletionsReached", "")], false),
            vec![pod(term(0, "Completed"))],
            "COMPLETED",
            Some(0),
            "",
        );
        check(
            job_with(&[("Failed", "BackoffLimitExceeded", "x")], false),
            vec![pod(term(3, "Error"))],
            "FAILED",
            Some(3),
            "NonZeroExitCode",
        );
        check(
            job_with(&[("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")], false),
            vec![],
            "TIMEOUT",
            Some(1),
            "DeadlineExceeded: Job was active longer than specified deadline",
        );
        check(
            job_with(&[("Failed", "BackoffLimitExceeded", "")], false),
            vec![pod(term(137, "OOMKilled"))],
            "OUT_OF_MEMORY",
            Some(137),
            "OOMKilled",
        );
        check(
            job_with(&[], false),
            vec![pod(
                json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}),
            )],
            "NODE_FAIL",
            Some(1),
            "Evicted: The node was low on resource: memory.",
        );
        // Evicted through the Eviction API (kubectl drain): the pod's
        // DisruptionTarget while the watch still has it, else the Job's
        // podFailurePolicy condition; preempted by the scheduler.
        let mut evicted = term(143, "Error");
        evicted["conditions"] = json!([{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}]);
        let fj = "Pod fleet/fleet-42-x has condition DisruptionTarget matching FailJob rule at index 0";
        check(
            job_with(&[("Failed", "PodFailurePolicy", fj)], false),
            vec![pod(evicted.clone())],
            "NODE_FAIL",
            Some(143),
            "EvictionByEvictionAPI: Eviction API: evicting",
        );
        check(
            job_with(&[("Failed", "PodFailurePolicy", fj)], false),
            vec![],
            "NODE_FAIL",
            Some(1),
            &format!("DisruptionTarget: {fj}"),
        );
        evicted["conditions"][0]["reason"] = json!("PreemptionByScheduler");
        check(
            job_with(&[], false),
            vec![pod(evicted)],
            "PREEMPTED",
            Some(143),
            "PreemptionByScheduler: Eviction API: evicting",
        );
        // Its script caught the eviction's SIGTERM and exited 0: the Job
        // is Complete, the run was still taken away.
        let mut saved = term(0, "Completed");
        saved["conditions"] = json!([{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}]);
        let saved_status = saved.clone();
        check(
            job_with(&[("Complete", "", "")], false),
            vec![pod(saved)],
            "NODE_FAIL",
            Some(0),
            "EvictionByEvictionAPI: Eviction API: evicting",
        );
        check(job_with(&[("Complete", "", "")], false), vec![pod(term(0, "Completed"))], "COMPLETED", Some(0), "");
        // The same once the evicted pod is gone: what the pod watch saw of
        // it before (`TakenAway`) says so.
        let taken = TakenAway::default();
        let mut seen = pod(saved_status.clone());
        seen.metadata.labels = Some([("batch.kubernetes.io/job-name".to_string(), "fleet-42".to_string())].into());
        taken.see(&pod(term(0, "Completed")));
        assert!(taken.of("fleet-42").is_none(), "a pod that was not taken away says nothing");
        taken.see(&seen);
        let remembered = taken.of("fleet-42");
        assert_eq!(remembered, Some(("NODE_FAIL", "EvictionByEvictionAPI: Eviction API: evicting".to_string())));
        let complete = job_with(&[("Complete", "", "")], false);
        let n = native_state_with(&complete, &[], remembered.as_ref());
        assert_eq!(
            (n.raw_state.as_str(), n.description.as_str()),
            ("NODE_FAIL", "EvictionByEvictionAPI: Eviction API: evicting")
        );
        assert_eq!(native_state_with(&complete, &[], None).raw_state, "COMPLETED");
        // Forgotten once its Job leaves the watch.
        taken.keep_only(&["fleet-7"].into_iter().collect());
        assert!(taken.of("fleet-42").is_none());
        let n = native_state(&job_with(&[("Failed", "PodFailurePolicy", fj)], false), &[]);
        assert_eq!(n.description, format!("DisruptionTarget: {fj}"), "what track::died reports");
        check(job_with(&[], false), vec![pod(waiting("ImagePullBackOff"))], "FAILED", Some(1), "ImagePullBackOff: m");
        check(job_with(&[], false), vec![pod(waiting("ErrImagePull"))], "FAILED", Some(1), "ErrImagePull: m");
        check(
            job_with(&[], false),
            vec![pod(
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available"}]}),
            )],
            "PENDING",
            None,
            "Unschedulable: 0/2 nodes are available",
        );
        check(job_with(&[], false), vec![pod(json!({"phase": "Running"}))], "RUNNING", None, "");
        // Its pod ended, the Job not yet marked: ending (Slurm's COMPLETING,
        // a running state), not back to pending; the exit code comes with
        // the Job's end.
        for code in [0, 3] {
            check(job_with(&[], false), vec![pod(term(code, "Error"))], "COMPLETING", None, "");
            let n = native_state(&job_with(&[], false), &[&pod(term(code, "Error"))]);
            assert_eq!(n.state, JobState::Running);
        }
        // One pod ended beside one still waiting (a gang's other index): pending.
        check(job_with(&[], false), vec![pod(term(3, "Error")), pod(json!({"phase": "Pending"}))], "PENDING", None, "");
        check(job_with(&[], true), vec![], "PENDING", None, "");
        check(job_with(&[], false), vec![], "PENDING", None, "");
        let n = native_state(&job_with(&[("Failed", "BackoffLimitExceeded", "")], false), &[&pod(term(137, "Error"))]);
        assert_eq!((n.exit_code, n.signal, n.state), (Some(137), Some(9), JobState::Failed));
    }

    #[test]
    fn capacity_counts_gpus_mig_and_what_pods_hold() {
        let node = |name: &str, labels: serde_json::Value, alloc: serde_json::Value| -> Arc<Node> {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
                "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}))
                .unwrap(),
            )
        };
        let nodes = vec![
            node(
                "h0",
                json!({GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3"}),
                json!({"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"}),
            ),
            node(
                "m0",
                json!({GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB"}),
                json!({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2", "cpu": "32"}),
            ),
            node("c0", json!({}), json!({"cpu": "16"})),
        ];
        let busy: Pod = serde_json::from_value(json!({"metadata": {"name": "x", "labels": {NATIVE_ID_LABEL: "41"}},
            "spec": {"nodeName": "h0", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]},
            "status": {"phase": "Running"}}))
        .unwrap();
        let done: Pod = serde_json::from_value(json!({"metadata": {"name": "y", "labels": {NATIVE_ID_LABEL: "42"}},
            "spec": {"nodeName": "h0", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "5"}}}]},
            "status": {"phase": "Succeeded"}}))
        .unwrap();
        // Fleet's, not bound to a node yet; and someone else's, bound.
        let unbound: Pod = serde_json::from_value(json!({"metadata": {"name": "z", "labels": {NATIVE_ID_LABEL: "43"}},
            "spec": {"containers": []}, "status": {"phase": "Pending"}}))
        .unwrap();
        let other: Pod = serde_json::from_value(json!({"metadata": {"name": "o"}, "spec": {"nodeName": "c0",
            "containers": []}, "status": {"phase": "Running"}}))
        .unwrap();
        let pods = [busy, done, unbound, other].map(Arc::new);
        let c = capacity_of(&nodes, &pods);
        assert_eq!(holding_of(&pods), vec![41], "what capacity_of counts taken, of Fleet's");
        assert_eq!(
            (c[0].gpu_type.as_deref(), c[0].gpus_total, c[0].gpus_free, c[0].state.as_str()),
            (Some("h100"), 8, 5, "mixed")
        );
        assert_eq!((c[0].cpus, c[0].memory_mb), (64, 512 * 1024));
        assert_eq!((c[1].gpu_type.as_deref(), c[1].gpus_total, c[1].gpus_free), (Some("1g.10gb"), 7, 7));
        assert_eq!((c[2].gpu_type.as_deref(), c[2].gpus_total, c[2].state.as_str()), (None, 0, "idle"));
    }

    #[test]
    fn a_namespaces_gpu_quota_is_its_strictest_hard_limit_and_what_its_unfinished_pods_take() {
        let quota = |hard: &str, used: Option<&str>| -> Arc<ResourceQuota> {
            let mut q = json!({"metadata": {"name": "q", "namespace": "ml"}, "spec": {"hard": {GPU_QUOTA: hard, "pods": "50"}}});
            if let Some(u) = used {
                q["status"] = json!({"used": {GPU_QUOTA: u}});
            }
            Arc::new(serde_json::from_value(q).unwrap())
        };
        let pod = |ns: &str, gpus: &str, phase: &str| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": "p", "namespace": ns},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": {GPU: gpus}, "requests": {GPU: gpus}}},
                                            {"name": "side"}]},
                    "status": {"phase": phase}}))
                .unwrap(),
            )
        };
        let pods = [
            pod("ml", "2", "Running"),
            pod("ml", "1", "Pending"),
            pod("ml", "4", "Succeeded"),
            pod("other", "8", "Running"),
        ];
        // Two quotas: the stricter binds; the pods of ml that are not over take 3.
        assert_eq!(namespace_gpu_quota(&[quota("16", None), quota("8", None)], &pods, "ml"), Some((8, 3)));
        // The API server's accounting, when it says more (pods the watch lacks).
        assert_eq!(namespace_gpu_quota(&[quota("8", Some("5"))], &pods, "ml"), Some((8, 5)));
        assert_eq!(namespace_gpu_quota(&[quota("8", Some("1"))], &pods, "ml"), Some((8, 3)));
        // No quota on GPUs: none.
        let cpu_only: Arc<ResourceQuota> = Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"hard": {"cpu": "10"}}})).unwrap(),
        );
        assert_eq!(namespace_gpu_quota(&[cpu_only], &pods, "ml"), None);
        assert_eq!(namespace_gpu_quota(&[], &pods, "ml"), None);
    }

    #[test]
    fn a_quota_binds_the_submitters_whose_jobs_run_in_its_namespace() {
        let mut s = settings();
        s.account_namespaces.insert("vision".into(), "ml".into());
        let users: Vec<String> = ["beta:al", "*:bob", "*:carol"].iter().map(|u| u.to_string()).collect();
        let accounts = [("beta:al".to_string(), "Vision".to_string()), ("*:carol".to_string(), "misc".to_string())];
        assert_eq!(s.users_in(&users, &accounts, "ml"), ["beta:al"]);
        // The others (no account, or one without a namespace) run in KubeNamespace.
        assert_eq!(s.users_in(&users, &accounts, "fleet"), ["*:bob", "*:carol"]);
        assert!(s.users_in(&users, &accounts, "nowhere").is_empty());
    }
}
