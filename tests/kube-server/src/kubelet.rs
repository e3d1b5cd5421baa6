//! The cluster's moving parts, in one reconcile pass over the store: the
//! Job controller (pods per Job, Indexed completions, conditions, backoff
//! limit, active deadline), a scheduler (resources and node affinity, all
//! pods of a Job placed together or none), an emulated Kueue admission of
//! suspended Jobs, and a kubelet that runs a pod's container as a local
//! `bash` process.
//!
//! What the double does differently from a real cluster (documented):
//! a container runs on this host, without an image; volumes are copied
//! into a per-pod directory and arguments, environment values and the
//! working directory that start with a mount path are rewritten to that
//! copy; an image named `nonexistent/...` fails to pull. A pod with
//! `shareProcessNamespace` (when the server runs as root) gets a sandbox:
//! a PID namespace whose init is a pause reaping orphans, with its own
//! `/proc`, which its containers join and which ends with its container;
//! other pods' processes share the host's PID namespace. A container's
//! `terminationMessagePath` (default `/dev/termination-log`) is a file of
//! the pod's directory (mode 0666, as the kubelet makes it), rewritten like
//! a mount path; when the container ends its first 4096 bytes are
//! `state.terminated.message` (`FallbackToLogsOnError`: the log's tail, 80
//! lines or 2048 bytes, for a failed container that left it empty).
//!
//! **Users.** A server running as root runs each container as its
//! `securityContext` says (the container's over the pod's): `runAsUser`,
//! `runAsGroup`, `supplementalGroups` and `fsGroup` (setgroups, setgid,
//! setuid in the child before exec); without `runAsUser` as `nobody`
//! (65534), the double's "image user". The pod's directory is 0700 and
//! owned by that user; ConfigMap and Secret volumes are root's, read-only
//! (directory 0555, files in their `defaultMode`, group `fsGroup` when
//! set, as the kubelet does), so a pod reads its own volumes and no other
//! pod's files. `runAsNonRoot` with `runAsUser: 0` fails the container
//! (`CreateContainerConfigError`, the kubelet's words). A server not
//! running as root cannot switch users: its containers run as itself.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::store::{meta_str, now_s, quantity, rfc3339, Kind, Store};
use crate::State;

/// A container to start after the pass (outside the store lock).
pub struct Launch {
    pub ns: String,
    pub pod: String,
    pub uid: String,
    /// The pod's init containers, run in order before `program`; a failed
    /// one fails the pod.
    pub init: Vec<Step>,
    pub program: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub files: Vec<(PathBuf, Vec<u8>, u32)>,
    pub log: PathBuf,
    /// The pod's directory (made 0700 for its user).
    pub root: PathBuf,
    /// Directories the container must be able to write (emptyDir volumes,
    /// the working directory, HOME), owned by its user.
    pub writable: Vec<PathBuf>,
    /// Read-only volume directories (0555).
    pub read_only: Vec<PathBuf>,
    /// Who the container runs as.
    pub ids: Ids,
    /// `shareProcessNamespace`: the pod's containers share one PID
    /// namespace whose init is the pod's pause ([`Sandbox`]; root only).
    pub share_pid_ns: bool,
    /// The container's termination message file (its
    /// `terminationMessagePath`, here), read into its terminated state.
    pub termination: PathBuf,
    /// `terminationMessagePolicy: FallbackToLogsOnError`: an empty message
    /// of a failed container is its log's tail.
    pub fallback_to_logs: bool,
    /// The container's memory limit (bytes), enforced by
    /// [`enforce_memory_limits`].
    pub memory_limit: Option<u64>,
}

/// One container's process: program, environment, working directory.
pub struct Step {
    pub name: String,
    pub program: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// Its `terminationMessagePath` (default `/dev/termination-log`), here:
    /// a file the kubelet makes, world-writable, before the container starts.
    pub termination: PathBuf,
}

/// How container `c` of pod `p` runs here: its mounts (volumes under
/// `root/volumes/<name>`) rewritten into arguments, environment values and
/// working directory; `envFrom`, then `env` with `$(VAR)` expanded.
fn step_of(st: &Store, p: &Value, c: &Value, root: &Path, pod_name: &str) -> Result<Step, String> {
    let ns = meta_str(p, "namespace").to_string();
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let (Some(vname), Some(mpath)) = (m["name"].as_str(), m["mountPath"].as_str()) else { continue };
        if p["spec"]["volumes"].as_array().into_iter().flatten().any(|v| v["name"].as_str() == Some(vname)) {
            mounts.push((mpath.trim_end_matches('/').to_string(), root.join("volumes").join(vname)));
        }
    }
    // The termination message file, bind-mounted at its path by a real
    // kubelet; a file of the pod's directory here, its path rewritten.
    let cname: String =
        c["name"].as_str().unwrap_or("").chars().filter(|ch| ch.is_ascii_alphanumeric() || *ch == '-').collect();
    let termination = root.join(format!("termination-{cname}"));
    let tm_path = c["terminationMessagePath"].as_str().filter(|t| t.starts_with('/')).unwrap_or(TERMINATION_LOG);
    mounts.push((tm_path.to_string(), termination.clone()));
    let rewrite = |s: &str| -> String {
        for (m, dir) in &mounts {
            if s == m || s.starts_with(&format!("{m}/")) {
                return format!("{}{}", dir.display(), &s[m.len()..]);
            }
        }
        s.to_string()
    };
    let hostname = p["spec"]["hostname"].as_str().map(str::to_string).unwrap_or(pod_name.to_string());
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOSTNAME".into(), hostname),
        ("HOME".into(), root.join("home").display().to_string()),
    ];
    for ef in c["envFrom"].as_array().into_iter().flatten() {
        let (kind, r) = if ef["secretRef"].is_object() {
            (Kind::Secret, &ef["secretRef"])
        } else {
            (Kind::ConfigMap, &ef["configMapRef"])
        };
        let n = r["name"].as_str().unwrap_or("");
        match data_of(st, kind, &ns, n) {
            Some(d) => {
                for (k, v) in d {
                    env.push((k, String::from_utf8_lossy(&v).into_owned()));
                }
            }
            None if r["optional"] == json!(true) => {}
            None => return Err(format!("{} \"{n}\" not found", kind.singular())),
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let k = e["name"].as_str().unwrap_or("").to_string();
        let v = if let Some(v) = e["value"].as_str() {
            expand(v, &env)
        } else if let Some(f) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            resolve_field(p, f)
        } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
            let d = data_of(st, Kind::Secret, &ns, r.get("name").and_then(Value::as_str).unwrap_or(""));
            let key = r.get("key").and_then(Value::as_str).unwrap_or("");
            d.and_then(|d| d.get(key).cloned()).map(|v| String::from_utf8_lossy(&v).into_owned()).unwrap_or_default()
        } else {
            String::new()
        };
        env.push((k, v));
    }
    // Paths under a mount, as the container would see them.
    for (k, v) in env.iter_mut() {
        if k != "HOME" && k != "PATH" {
            *v = rewrite(v);
        }
    }
    let mut program: Vec<String> = Vec::new();
    for x in c["command"].as_array().into_iter().flatten().chain(c["args"].as_array().into_iter().flatten()) {
        program.push(rewrite(&expand(x.as_str().unwrap_or(""), &env)));
    }
    if program.is_empty() {
        program.push("/bin/true".into());
    }
    let cwd = match c["workingDir"].as_str() {
        Some(w) => {
            let r = rewrite(w);
            if r == w {
                root.join("rootfs").join(w.trim_start_matches('/'))
            } else {
                PathBuf::from(r)
            }
        }
        None => root.join("rootfs"),
    };
    Ok(Step { name: c["name"].as_str().unwrap_or("").to_string(), program, env, cwd, termination })
}

/// The kubelet's default `terminationMessagePath`.
const TERMINATION_LOG: &str = "/dev/termination-log";
/// The most of a termination message the kubelet keeps (bytes).
const TERMINATION_MAX: u64 = 4096;

/// Container `c`'s termination message, as the kubelet reads it when the
/// container ended with `code`: the file's first 4096 bytes; under
/// `FallbackToLogsOnError`, an empty file and a failure give the last 80
/// lines (at most 2048 bytes) of its log.
fn termination_message(file: &Path, fallback_to_logs: bool, code: i32, log: &Path) -> Option<String> {
    use std::io::Read;
    let mut msg = Vec::new();
    if let Ok(f) = std::fs::File::open(file) {
        let _ = f.take(TERMINATION_MAX).read_to_end(&mut msg);
    }
    if msg.is_empty() && fallback_to_logs && code != 0 {
        let text = std::fs::read(log).unwrap_or_default();
        let tail = &text[text.len().saturating_sub(2048)..];
        let lines: Vec<&[u8]> = tail.split_inclusive(|b| *b == b'\n').collect();
        msg = lines[lines.len().saturating_sub(80)..].concat();
    }
    (!msg.is_empty()).then(|| String::from_utf8_lossy(&msg).into_owned())
}

/// A container's identity, from its `securityContext` and the pod's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (`supplementalGroups`, plus `fsGroup`).
    pub groups: Vec<u32>,
    /// The group of Secret and ConfigMap volume files (`fsGroup`).
    pub fs_group: Option<u32>,
}

/// The double's "image user" when a pod names none.
pub const NOBODY: u32 = 65534;

/// Who a pod's first container runs as, or the kubelet's refusal.
pub fn ids_of(pod: &Value) -> Result<Ids, String> {
    let psc = &pod["spec"]["securityContext"];
    let csc = &pod["spec"]["containers"][0]["securityContext"];
    let pick = |k: &str| csc[k].as_u64().or_else(|| psc[k].as_u64());
    let id = |k: &str| -> Result<Option<u32>, String> {
        pick(k).map(|v| u32::try_from(v).map_err(|_| format!("{k} {v} is out of range"))).transpose()
    };
    let uid = id("runAsUser")?;
    let non_root = csc["runAsNonRoot"].as_bool().or_else(|| psc["runAsNonRoot"].as_bool()) == Some(true);
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let cname = pod["spec"]["containers"][0]["name"].as_str().unwrap_or("");
    if non_root && uid == Some(0) {
        return Err(format!("container's runAsUser breaks non-root policy (pod: \"{name}\", container: {cname})"));
    }
    let uid = uid.unwrap_or(NOBODY);
    let gid = id("runAsGroup")?.unwrap_or(if uid == NOBODY { NOBODY } else { uid });
    let fs_group = psc["fsGroup"]
        .as_u64()
        .map(|v| u32::try_from(v).map_err(|_| format!("fsGroup {v} is out of range")))
        .transpose()?;
    let mut groups = Vec::new();
    for g in psc["supplementalGroups"].as_array().into_iter().flatten() {
        let g =
            g.as_u64().and_then(|g| u32::try_from(g).ok()).ok_or_else(|| format!("supplementalGroups: bad gid {g}"))?;
        groups.push(g);
    }
    groups.extend(fs_group);
    groups.sort_unstable();
    groups.dedup();
    Ok(Ids { uid, gid, groups, fs_group })
}

/// As root, containers run as their own users, who must reach their pod's
/// directory under `work_dir`: every directory above it must let others
/// through (`o+x`). Refused with the directory to fix otherwise.
pub fn check_work_dir(work_dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        return Ok(());
    }
    for d in work_dir.ancestors() {
        let mode = std::fs::metadata(d)?.permissions().mode();
        if mode & 0o001 == 0 {
            anyhow::bail!(
                "{} has mode {:o}: containers run as their runAsUser and could not reach their directories under {}; chmod o+x {}",
                d.display(),
                mode & 0o777,
                work_dir.display(),
                d.display()
            );
        }
    }
    Ok(())
}

/// Whether this server may switch users (runs as root).
fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

fn owner_uid(obj: &Value) -> Option<&str> {
    obj["metadata"]["ownerReferences"].as_array()?.iter().find(|r| r["controller"] == json!(true))?["uid"].as_str()
}

pub fn cond(typ: &str, status: &str, reason: &str, message: &str) -> Value {
    let t = rfc3339(now_s());
    json!({"type": typ, "status": status, "reason": reason, "message": message,
           "lastProbeTime": t, "lastTransitionTime": t})
}

fn job_finished(job: &Value) -> bool {
    job["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
    })
}

fn pod_done(pod: &Value) -> bool {
    matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

/// Requests of a pod's containers (`limits` where no request is given).
pub fn pod_requests(pod: &Value) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        let r = &c["resources"];
        let mut mine: BTreeMap<String, f64> = BTreeMap::new();
        for src in [&r["limits"], &r["requests"]] {
            for (k, v) in src.as_object().into_iter().flatten() {
                if let Some(q) = v.as_str().and_then(quantity).or_else(|| v.as_f64()) {
                    mine.insert(k.clone(), q);
                }
            }
        }
        for (k, v) in mine {
            *out.entry(k).or_default() += v;
        }
    }
    out
}

fn node_allocatable(node: &Value) -> BTreeMap<String, f64> {
    node["status"]["allocatable"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str().and_then(quantity)?)))
        .collect()
}

/// Does `node` satisfy the pod's nodeSelector and required node affinity?
fn affinity_ok(pod: &Value, node: &Value) -> bool {
    let labels = &node["metadata"]["labels"];
    let label = |k: &str| labels[k].as_str().map(str::to_string);
    for (k, v) in pod["spec"]["nodeSelector"].as_object().into_iter().flatten() {
        if label(k).as_deref() != v.as_str() {
            return false;
        }
    }
    let terms =
        &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let Some(terms) = terms.as_array() else { return true };
    terms.iter().any(|t| {
        t["matchExpressions"].as_array().into_iter().flatten().all(|e| {
            let key = e["key"].as_str().unwrap_or("");
            let vals: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let have = label(key);
            match e["operator"].as_str().unwrap_or("") {
                "In" => have.is_some_and(|h| vals.contains(&h.as_str())),
                "NotIn" => have.is_none_or(|h| !vals.contains(&h.as_str())),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
    })
}

/// Does the pod tolerate the node's NoSchedule taints?
fn tolerates(pod: &Value, node: &Value) -> bool {
    node["spec"]["taints"].as_array().into_iter().flatten().filter(|t| t["effect"] == "NoSchedule").all(|t| {
        pod["spec"]["tolerations"].as_array().into_iter().flatten().any(|tol| {
            let key_ok = tol["key"].is_null() || tol["key"] == t["key"];
            let op_ok = tol["operator"] == "Exists" || tol["value"] == t["value"];
            let eff_ok = tol["effect"].is_null() || tol["effect"] == t["effect"];
            key_ok && op_ok && eff_ok
        })
    })
}

/// One pass; returns the containers to start.
pub fn reconcile(st: &mut Store, work_dir: &Path) -> Vec<Launch> {
    let now = now_s();
    admit_suspended(st);
    jobs(st, now);
    remove_evicted(st);
    schedule(st);
    kubelet(st, work_dir, now)
}

/// Emulated Kueue: a suspended Job labelled with a queue is admitted
/// (unsuspended) when all its pods fit at once.
fn admit_suspended(st: &mut Store) {
    let (nodes, mut free) = free_map(st);
    let mut admit = Vec::new();
    let mut failed = Vec::new();
    for j in st.list(Kind::Job, None) {
        if j["spec"]["suspend"] != json!(true)
            || !j["metadata"]["labels"]["kueue.x-k8s.io/queue-name"].is_string()
            || job_finished(j)
        {
            continue;
        }
        // Tried since the last change of capacity: it still does not fit.
        if st.admit_tried.get(meta_str(j, "uid")) == Some(&st.cap_epoch) {
            continue;
        }
        let n = j["spec"]["parallelism"].as_u64().unwrap_or(1) as usize;
        // The pod template has a pod's shape (`spec.containers`, affinity).
        let pods: Vec<&Value> = std::iter::repeat_n(&j["spec"]["template"], n).collect();
        if place(&nodes, &mut free, &pods).is_ok() {
            admit.push((meta_str(j, "namespace").to_string(), meta_str(j, "name").to_string()));
        } else {
            failed.push(meta_str(j, "uid").to_string());
        }
    }
    let epoch = st.cap_epoch;
    for uid in failed {
        st.admit_tried.insert(uid, epoch);
    }
    for (ns, name) in admit {
        if let Some(mut job) = st.get(Kind::Job, &ns, &name).cloned() {
            job["spec"]["suspend"] = json!(false);
            st.put(Kind::Job, job);
        }
    }
}

fn jobs(st: &mut Store, now: i64) {
    let mut by_owner: HashMap<String, Vec<Value>> = HashMap::new();
    for p in st.list(Kind::Pod, None) {
        if let Some(o) = owner_uid(p) {
            by_owner.entry(o.to_string()).or_default().push(p.clone());
        }
    }
    let keys: Vec<(String, String)> = st
        .list(Kind::Job, None)
        .into_iter()
        .filter(|j| !job_finished(j))
        .map(|j| (meta_str(j, "namespace").to_string(), meta_str(j, "name").to_string()))
        .collect();
    for (ns, name) in keys {
        let Some(jref) = st.get(Kind::Job, &ns, &name) else { continue };
        let uid = meta_str(jref, "uid").to_string();
        let pods: Vec<Value> = by_owner.remove(&uid).unwrap_or_default();
        // A suspended Job without pods whose status says so: nothing to do.
        if pods.is_empty() && jref["spec"]["suspend"] == json!(true) && jref["status"]["active"] == json!(0) {
            continue;
        }
        let mut job = jref.clone();
        let succeeded = pods.iter().filter(|p| p["status"]["phase"] == "Succeeded").count();
        // Failed pods, less those the Job's podFailurePolicy ignores, plus
        // those counted and gone; the first FailJob match fails the Job.
        let mut failed = st.counted_failed.get(&uid).map_or(0, |c| c.len());
        let mut fail_job = None;
        for p in pods.iter().filter(|p| p["status"]["phase"] == "Failed") {
            match failure_policy(&job["spec"], p) {
                Some(("Ignore", _)) => {}
                Some(("FailJob", m)) => {
                    failed += 1;
                    fail_job = fail_job.or(Some(m));
                }
                _ => failed += 1,
            }
        }
        let active = pods.iter().filter(|p| !pod_done(p)).count();
        let ready = pods.iter().filter(|p| p["status"]["phase"] == "Running").count();
        let spec = job["spec"].clone();
        let completions = spec["completions"].as_u64().unwrap_or(1) as usize;
        let parallelism = spec["parallelism"].as_u64().unwrap_or(1) as usize;
        let indexed = spec["completionMode"] == "Indexed";
        let backoff = spec["backoffLimit"].as_u64().unwrap_or(6) as usize;
        let suspended = spec["suspend"] == json!(true);
        let old_status = job["status"].clone();
        let mut status = old_status.clone();
        if status["startTime"].is_null() && !suspended {
            status["startTime"] = json!(rfc3339(now));
        }
        status["active"] = json!(active);
        status["ready"] = json!(ready);
        status["succeeded"] = json!(succeeded);
        status["failed"] = json!(failed);
        if indexed {
            let done: Vec<String> = pods
                .iter()
                .filter(|p| p["status"]["phase"] == "Succeeded")
                .filter_map(|p| p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"].as_str())
                .map(str::to_string)
                .collect();
            status["completedIndexes"] = json!(done.join(","));
        }
        let mut conds = status["conditions"].as_array().cloned().unwrap_or_default();
        let mut kill = false;
        // Why the Job failed, for the pods it stops: only its deadline
        // marks them (`DeadlineExceeded`); a backoff or podFailurePolicy
        // failure just stops what still runs.
        let mut kill_reason = None;
        let deadline = spec["activeDeadlineSeconds"].as_i64();
        let started = status["startTime"].as_str().and_then(crate::store::parse_rfc3339);
        if let Some(m) = fail_job {
            conds.push(cond("FailureTarget", "True", "PodFailurePolicy", &m));
            conds.push(cond("Failed", "True", "PodFailurePolicy", &m));
            kill = true;
        } else if failed > backoff {
            conds.push(cond(
                "FailureTarget",
                "True",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ));
            conds.push(cond("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit"));
            kill = true;
        } else if let (Some(d), Some(s)) = (deadline, started) {
            if now >= s + d && succeeded < completions {
                conds.push(cond(
                    "FailureTarget",
                    "True",
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                ));
                conds.push(cond("Failed", "True", "DeadlineExceeded", "Job was active longer than specified deadline"));
                kill = true;
                kill_reason = Some("DeadlineExceeded");
            }
        }
        if !kill && succeeded >= completions {
            conds.push(cond(
                "SuccessCriteriaMet",
                "True",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
            conds.push(cond("Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods"));
            status["completionTime"] = json!(rfc3339(now));
        }
        if kill {
            for p in pods.iter().filter(|p| !pod_done(p)) {
                let mut p = p.clone();
                p["status"]["phase"] = json!("Failed");
                if let Some(r) = kill_reason {
                    p["status"]["reason"] = json!(r);
                }
                p["metadata"]["deletionTimestamp"] = json!(rfc3339(now));
                st.to_kill.push(meta_str(&p, "uid").to_string());
                st.put(Kind::Pod, p);
            }
            status["active"] = json!(0);
            status["ready"] = json!(0);
        }
        status["conditions"] = json!(conds);
        if !suspended && !kill && succeeded < completions {
            // Pods to create: Indexed: every index without a live or
            // succeeded pod; otherwise up to parallelism.
            let mut want: Vec<Option<usize>> = Vec::new();
            if indexed {
                for i in 0..completions {
                    let has = pods.iter().any(|p| {
                        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == json!(i.to_string())
                            && p["status"]["phase"] != "Failed"
                    });
                    if !has && want.len() + active < parallelism {
                        want.push(Some(i));
                    }
                }
            } else {
                let missing = parallelism.min(completions - succeeded).saturating_sub(active);
                want.extend(std::iter::repeat_n(None, missing));
            }
            // Each pod through the namespace's ResourceQuotas, as the API
            // server admits it: a refused one is not created, and the Job
            // controller says why in a FailedCreate event on the Job.
            let mut created = 0;
            for idx in want {
                let pod = new_pod(st, &job, &ns, &name, &uid, idx);
                if let Some(why) = quota_refusal(st, &ns, &pod) {
                    let msg = format!("Error creating: pods \"{}\" is forbidden: {why}", meta_str(&pod, "name"));
                    failed_create(st, &job, &msg, now);
                    break;
                }
                st.put(Kind::Pod, pod);
                created += 1;
            }
            status["active"] = json!(active + created);
        }
        if status != old_status {
            job["status"] = status;
            st.put(Kind::Job, job);
        }
    }
}

/// Why the namespace's ResourceQuotas refuse `pod` (the API server's
/// message), if they do: for each quota's `spec.hard` entry this double
/// knows (`pods`, `count/pods`, `requests.<resource>`, `limits.<resource>`,
/// and `cpu`/`memory` as requests), what the namespace's live pods use
/// plus what this pod asks must not exceed it.
pub fn quota_refusal(st: &Store, ns: &str, pod: &Value) -> Option<String> {
    let asks = |p: &Value, key: &str| -> f64 {
        match key {
            "pods" | "count/pods" => 1.0,
            _ => {
                let (field, res) = match key.split_once('.') {
                    Some((f @ ("requests" | "limits"), r)) => (f, r),
                    _ => ("requests", key),
                };
                let containers = p["spec"]["containers"].as_array().into_iter().flatten();
                containers
                    .map(|c| {
                        let r = &c["resources"];
                        // A request defaults to the limit, as the API server defaults it.
                        let v = if field == "requests" && r["requests"][res].is_null() {
                            &r["limits"][res]
                        } else {
                            &r[field][res]
                        };
                        v.as_str().and_then(quantity).or_else(|| v.as_f64()).unwrap_or(0.0)
                    })
                    .sum()
            }
        }
    };
    let live: Vec<&Value> = st.list(Kind::Pod, Some(ns)).into_iter().filter(|p| !pod_done(p)).collect();
    for q in st.list(Kind::ResourceQuota, Some(ns)) {
        for (key, hard) in q["spec"]["hard"].as_object().into_iter().flatten() {
            let Some(limit) = hard.as_str().and_then(quantity).or_else(|| hard.as_f64()) else { continue };
            let want = asks(pod, key);
            if want == 0.0 {
                continue;
            }
            let used: f64 = live.iter().map(|p| asks(p, key)).sum();
            if used + want > limit {
                return Some(format!(
                    "exceeded quota: {}, requested: {key}={want}, used: {key}={used}, limited: {key}={}",
                    meta_str(q, "name"),
                    hard.as_str().map_or_else(|| hard.to_string(), str::to_string)
                ));
            }
        }
    }
    None
}

/// The Job controller's `FailedCreate` Warning event on `job` (one per
/// Job, its count and time moved on at most every 10 s while it repeats).
fn failed_create(st: &mut Store, job: &Value, msg: &str, now: i64) {
    let (ns, name) = (meta_str(job, "namespace").to_string(), meta_str(job, "name").to_string());
    let ev_name = format!("{name}.failedcreate");
    let t = rfc3339(now);
    let ev = match st.get(Kind::Event, &ns, &ev_name).cloned() {
        Some(mut e) => {
            let last = e["lastTimestamp"].as_str().and_then(crate::store::parse_rfc3339).unwrap_or(0);
            if now - last < 10 && e["message"] == json!(msg) {
                return;
            }
            e["count"] = json!(e["count"].as_u64().unwrap_or(1) + 1);
            e["lastTimestamp"] = json!(t);
            e["message"] = json!(msg);
            e
        }
        None => json!({
            "metadata": {"name": ev_name, "namespace": ns, "uid": st.new_uid(), "creationTimestamp": t},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "namespace": ns, "name": name,
                               "uid": meta_str(job, "uid")},
            "reason": "FailedCreate", "message": msg, "type": "Warning", "count": 1,
            "firstTimestamp": t, "lastTimestamp": t,
            "source": {"component": "job-controller"}, "reportingComponent": "job-controller",
        }),
    };
    st.put(Kind::Event, ev);
}

/// The action of the first rule of a Job's `podFailurePolicy` that failed
/// pod `p` matches (`FailJob`, `Ignore`, `Count`), with the Job
/// controller's message for it; `None` without a match.
pub fn failure_policy(job_spec: &Value, p: &Value) -> Option<(&'static str, String)> {
    let rules = job_spec["podFailurePolicy"]["rules"].as_array()?;
    let pod = format!("{}/{}", meta_str(p, "namespace"), meta_str(p, "name"));
    for (i, r) in rules.iter().enumerate() {
        let action = match r["action"].as_str() {
            Some("FailJob") => "FailJob",
            Some("Ignore") => "Ignore",
            Some("Count") => "Count",
            _ => continue,
        };
        if let Some(codes) = r["onExitCodes"].as_object() {
            let values: Vec<i64> =
                codes.get("values").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_i64).collect();
            let only = codes.get("containerName").and_then(Value::as_str);
            let not_in = codes.get("operator").and_then(Value::as_str) == Some("NotIn");
            for c in p["status"]["containerStatuses"].as_array().into_iter().flatten() {
                let Some(code) = c["state"]["terminated"]["exitCode"].as_i64() else { continue };
                if only.is_some_and(|n| c["name"].as_str() != Some(n)) || code == 0 {
                    continue;
                }
                if values.contains(&code) != not_in {
                    let msg = format!(
                        "Container {} for pod {pod} failed with exit code {code} matching {action} rule at index {i}",
                        c["name"].as_str().unwrap_or("")
                    );
                    return Some((action, msg));
                }
            }
        }
        for want in r["onPodConditions"].as_array().into_iter().flatten() {
            let typ = want["type"].as_str().unwrap_or("");
            let status = want["status"].as_str().unwrap_or("True");
            let has = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == typ && c["status"] == status);
            if has {
                return Some((action, format!("Pod {pod} has condition {typ} matching {action} rule at index {i}")));
            }
        }
    }
    None
}

/// Evicted pods (`DisruptionTarget`, being deleted) that have ended are
/// gone, once counted for their Job (unless its podFailurePolicy ignores
/// them): their graceful deletion completes, as the Job controller's
/// removal of its tracking finalizer lets it.
fn remove_evicted(st: &mut Store) {
    let ended: Vec<Value> = st
        .list(Kind::Pod, None)
        .into_iter()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_string()
                && pod_done(p)
                && p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "DisruptionTarget")
        })
        .cloned()
        .collect();
    for p in ended {
        if let Some(owner) = owner_uid(&p) {
            let job = st
                .list(Kind::Job, Some(meta_str(&p, "namespace")))
                .into_iter()
                .find(|j| meta_str(j, "uid") == owner)
                .cloned();
            let ignored = job.is_some_and(|j| matches!(failure_policy(&j["spec"], &p), Some(("Ignore", _))));
            if !ignored {
                st.counted_failed.entry(owner.to_string()).or_default().insert(meta_str(&p, "uid").to_string());
            }
        }
        st.remove(Kind::Pod, meta_str(&p, "namespace"), meta_str(&p, "name"));
    }
}

fn new_pod(st: &mut Store, job: &Value, ns: &str, name: &str, uid: &str, idx: Option<usize>) -> Value {
    let t = &job["spec"]["template"];
    let mut labels = t["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["batch.kubernetes.io/controller-uid"] = json!(uid);
    labels["batch.kubernetes.io/job-name"] = json!(name);
    labels["controller-uid"] = json!(uid);
    labels["job-name"] = json!(name);
    let mut annotations = t["metadata"]["annotations"].clone();
    if !annotations.is_object() {
        annotations = json!({});
    }
    let mut spec = t["spec"].clone();
    let suffix = {
        st.uid_seq += 1;
        let mut n = st.uid_seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
        let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| {
                let c = alphabet[(n % alphabet.len() as u64) as usize] as char;
                n /= alphabet.len() as u64;
                c
            })
            .collect::<String>()
    };
    let pod_name = match idx {
        Some(i) => {
            annotations["batch.kubernetes.io/job-completion-index"] = json!(i.to_string());
            labels["batch.kubernetes.io/job-completion-index"] = json!(i.to_string());
            if spec["subdomain"].is_string() {
                spec["hostname"] = json!(format!("{name}-{i}"));
            }
            for c in spec["containers"].as_array_mut().into_iter().flatten() {
                let env = c["env"].as_array().cloned().unwrap_or_default();
                let mut env2 = env;
                env2.push(json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}));
                c["env"] = json!(env2);
            }
            format!("{name}-{i}-{suffix}")
        }
        None => format!("{name}-{suffix}"),
    };
    let pod_uid = st.new_uid();
    json!({
        "metadata": {
            "name": pod_name, "namespace": ns, "uid": pod_uid, "labels": labels, "annotations": annotations,
            "creationTimestamp": rfc3339(now_s()),
            "generateName": format!("{name}-"),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    })
}

type Free = HashMap<String, BTreeMap<String, f64>>;

/// The nodes and what each has left (allocatable minus live pods' requests).
fn free_map(st: &Store) -> (Vec<Value>, Free) {
    let nodes: Vec<Value> = st.list(Kind::Node, None).into_iter().cloned().collect();
    let mut free: Free = nodes.iter().map(|n| (meta_str(n, "name").to_string(), node_allocatable(n))).collect();
    for p in st.list(Kind::Pod, None) {
        if let (Some(node), false) = (p["spec"]["nodeName"].as_str(), pod_done(p)) {
            if let Some(f) = free.get_mut(node) {
                for (k, v) in pod_requests(p) {
                    *f.entry(k).or_default() -= v;
                }
            }
        }
    }
    (nodes, free)
}

/// Where each of `pods` goes (all or none; `free` is charged only when all
/// fit), or why one does not fit.
fn place(nodes: &[Value], free_in: &mut Free, pods: &[&Value]) -> Result<Vec<String>, String> {
    let mut free = free_in.clone();
    let mut out = Vec::new();
    for pod in pods {
        let req = pod_requests(pod);
        let mut insufficient: BTreeMap<String, usize> = BTreeMap::new();
        let mut affinity = 0;
        let mut taint = 0;
        let mut cordoned = 0;
        let mut chosen = None;
        for n in nodes {
            let name = meta_str(n, "name").to_string();
            // Cordoned (`kubectl cordon/drain`): the scheduler's NodeUnschedulable.
            if n["spec"]["unschedulable"] == json!(true) {
                cordoned += 1;
                continue;
            }
            if !affinity_ok(pod, n) {
                affinity += 1;
                continue;
            }
            if !tolerates(pod, n) {
                taint += 1;
                continue;
            }
            let f = &free[&name];
            let short: Vec<&String> =
                req.iter().filter(|(k, v)| f.get(*k).copied().unwrap_or(0.0) + 1e-9 < **v).map(|(k, _)| k).collect();
            if short.is_empty() {
                chosen = Some(name);
                break;
            }
            for k in short {
                *insufficient.entry(k.clone()).or_default() += 1;
            }
        }
        match chosen {
            Some(n) => {
                let f = free.get_mut(&n).expect("known node");
                for (k, v) in &req {
                    *f.entry(k.clone()).or_default() -= v;
                }
                out.push(n);
            }
            None => {
                let mut why: Vec<String> = insufficient.iter().map(|(k, c)| format!("{c} Insufficient {k}")).collect();
                if affinity > 0 {
                    why.push(format!("{affinity} node(s) didn't match Pod's node affinity/selector"));
                }
                if taint > 0 {
                    why.push(format!("{taint} node(s) had untolerated taint"));
                }
                if cordoned > 0 {
                    why.push(format!("{cordoned} node(s) were unschedulable"));
                }
                why.sort();
                return Err(format!(
                    "0/{} nodes are available: {}. preemption: 0/{} nodes are available: {} No preemption victims found for incoming pod.",
                    nodes.len(),
                    why.join(", "),
                    nodes.len(),
                    nodes.len()
                ));
            }
        }
    }
    *free_in = free;
    Ok(out)
}

/// Binds pending pods, a Job's pods together or none of them.
fn schedule(st: &mut Store) {
    let pending: Vec<Value> = st
        .list(Kind::Pod, None)
        .into_iter()
        .filter(|p| p["spec"]["nodeName"].as_str().is_none() && !pod_done(p))
        .cloned()
        .collect();
    let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for p in pending {
        let key = owner_uid(&p).map(str::to_string).unwrap_or_else(|| meta_str(&p, "uid").to_string());
        groups.entry(key).or_default().push(p);
    }
    let (nodes, mut free) = free_map(st);
    for (_, pods) in groups {
        let refs: Vec<&Value> = pods.iter().collect();
        match place(&nodes, &mut free, &refs) {
            Ok(nodes) => {
                for (mut p, n) in pods.into_iter().zip(nodes) {
                    p["spec"]["nodeName"] = json!(n);
                    p["status"]["conditions"] = json!([cond("PodScheduled", "True", "", "")]);
                    st.put(Kind::Pod, p);
                }
            }
            Err(msg) => {
                for mut p in pods {
                    let c = cond("PodScheduled", "False", "Unschedulable", &msg);
                    let same = p["status"]["conditions"][0]["message"] == c["message"];
                    if !same {
                        p["status"]["conditions"] = json!([c]);
                        st.put(Kind::Pod, p);
                    }
                }
            }
        }
    }
}

fn resolve_field(pod: &Value, path: &str) -> String {
    if let Some(k) = path.strip_prefix("metadata.annotations['").and_then(|r| r.strip_suffix("']")) {
        return pod["metadata"]["annotations"][k].as_str().unwrap_or("").to_string();
    }
    if let Some(k) = path.strip_prefix("metadata.labels['").and_then(|r| r.strip_suffix("']")) {
        return pod["metadata"]["labels"][k].as_str().unwrap_or("").to_string();
    }
    let mut v = pod;
    for part in path.split('.') {
        v = &v[part];
    }
    v.as_str().unwrap_or("").to_string()
}

fn data_of(st: &Store, kind: Kind, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
    let obj = st.get(kind, ns, name)?;
    let mut out = BTreeMap::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    match kind {
        Kind::Secret => {
            for (k, v) in obj["data"].as_object().into_iter().flatten() {
                out.insert(k.clone(), b64.decode(v.as_str().unwrap_or("")).ok()?);
            }
        }
        _ => {
            for (k, v) in obj["data"].as_object().into_iter().flatten() {
                out.insert(k.clone(), v.as_str().unwrap_or("").as_bytes().to_vec());
            }
            for (k, v) in obj["binaryData"].as_object().into_iter().flatten() {
                out.insert(k.clone(), b64.decode(v.as_str().unwrap_or("")).ok()?);
            }
        }
    }
    Some(out)
}

/// `$(VAR)` references to earlier variables, as the kubelet expands them.
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("$(") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) => {
                let name = &after[..j];
                match env.iter().rev().find(|(k, _)| k == name) {
                    Some((_, v)) => out.push_str(v),
                    None => out.push_str(&rest[i..i + 3 + j]),
                }
                rest = &after[j + 1..];
            }
            None => {
                out.push_str(&rest[i..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

fn set_waiting(st: &mut Store, mut p: Value, reason: &str, message: &str) {
    let name = p["spec"]["containers"][0]["name"].clone();
    let image = p["spec"]["containers"][0]["image"].clone();
    let cs = json!([{"name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0, "started": false,
                     "state": {"waiting": {"reason": reason, "message": message}}}]);
    if p["status"]["containerStatuses"] != cs {
        p["status"]["containerStatuses"] = cs;
        st.put(Kind::Pod, p);
    }
}

/// Starts scheduled pods: image "pull", volumes, environment, process.
fn kubelet(st: &mut Store, work_dir: &Path, now: i64) -> Vec<Launch> {
    let bound: Vec<Value> = st
        .list(Kind::Pod, None)
        .into_iter()
        .filter(|p| p["spec"]["nodeName"].is_string() && p["status"]["phase"] == "Pending")
        .cloned()
        .collect();
    let mut out = Vec::new();
    for mut p in bound {
        let ns = meta_str(&p, "namespace").to_string();
        let name = meta_str(&p, "name").to_string();
        let c = p["spec"]["containers"][0].clone();
        // The first image that cannot be pulled (init containers' too).
        let images: Vec<String> = p["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(std::iter::once(&c))
            .map(|x| x["image"].as_str().unwrap_or("").to_string())
            .collect();
        if let Some(image) = images.iter().find(|i| i.starts_with("nonexistent/") || i.is_empty()) {
            let created =
                p["metadata"]["creationTimestamp"].as_str().and_then(crate::store::parse_rfc3339).unwrap_or(now);
            let (reason, msg) = if now - created >= 1 {
                ("ImagePullBackOff", format!("Back-off pulling image \"{image}\""))
            } else {
                ("ErrImagePull", format!("failed to pull and unpack image \"{image}\": not found"))
            };
            set_waiting(st, p, reason, &msg);
            continue;
        }
        let root = work_dir.join("pods").join(format!("{ns}_{name}"));
        let ids = match ids_of(&p) {
            Ok(ids) => ids,
            Err(msg) => {
                set_waiting(st, p, "CreateContainerConfigError", &msg);
                continue;
            }
        };
        // Volumes: every volume a container mounts, as a local directory
        // (ConfigMap/Secret: the object's keys; emptyDir: shared by the
        // pod's containers, init containers included).
        let mut files = Vec::new();
        let (mut writable, mut read_only) = (Vec::new(), Vec::new());
        let mut missing = None;
        let inits: Vec<Value> = p["spec"]["initContainers"].as_array().cloned().unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        for m in
            inits.iter().chain(std::iter::once(&c)).flat_map(|c| c["volumeMounts"].as_array().into_iter().flatten())
        {
            let Some(vname) = m["name"].as_str() else { continue };
            if !seen.insert(vname.to_string()) {
                continue;
            }
            let Some(vol) =
                p["spec"]["volumes"].as_array().into_iter().flatten().find(|v| v["name"].as_str() == Some(vname))
            else {
                continue;
            };
            let dir = root.join("volumes").join(vname);
            let (kind, obj_name, mode) = if vol["configMap"].is_object() {
                (Kind::ConfigMap, vol["configMap"]["name"].as_str(), vol["configMap"]["defaultMode"].as_u64())
            } else if vol["secret"].is_object() {
                (Kind::Secret, vol["secret"]["secretName"].as_str(), vol["secret"]["defaultMode"].as_u64())
            } else {
                writable.push(dir);
                continue;
            };
            let obj_name = obj_name.unwrap_or("");
            let Some(data) = data_of(st, kind, &ns, obj_name) else {
                missing = Some(format!("{} \"{obj_name}\" not found", kind.singular()));
                break;
            };
            for (k, v) in data {
                files.push((dir.join(k), v, mode.unwrap_or(0o644) as u32));
            }
            read_only.push(dir);
        }
        if let Some(msg) = missing {
            set_waiting(st, p, "CreateContainerConfigError", &msg);
            continue;
        }
        let mut steps = Vec::new();
        let mut failed = None;
        for ct in inits.iter().chain(std::iter::once(&c)) {
            match step_of(st, &p, ct, &root, &name) {
                Ok(s) => steps.push(s),
                Err(msg) => {
                    failed = Some(msg);
                    break;
                }
            }
        }
        if let Some(msg) = failed {
            set_waiting(st, p, "CreateContainerConfigError", &msg);
            continue;
        }
        let Some(Step { program, env, cwd, termination, .. }) = steps.pop() else { continue };
        let fallback_to_logs = c["terminationMessagePolicy"] == "FallbackToLogsOnError";
        let memory_limit = c["resources"]["limits"]["memory"].as_str().and_then(quantity).map(|b| b as u64);
        let t = rfc3339(now);
        p["status"]["phase"] = json!("Running");
        p["status"]["startTime"] = json!(t);
        p["status"]["podIP"] = json!("127.0.0.1");
        p["status"]["hostIP"] = json!("127.0.0.1");
        p["status"]["conditions"] = json!([
            cond("PodScheduled", "True", "", ""),
            cond("Initialized", "True", "", ""),
            cond("ContainersReady", "True", "", ""),
            cond("Ready", "True", "", "")
        ]);
        p["status"]["containerStatuses"] = json!([{"name": c["name"], "image": c["image"], "imageID": format!("{}@sha256:0", c["image"].as_str().unwrap_or("")),
            "containerID": format!("fake://{}", meta_str(&p, "uid")), "ready": true, "restartCount": 0, "started": true,
            "state": {"running": {"startedAt": t}}}]);
        let uid = meta_str(&p, "uid").to_string();
        let share_pid_ns = p["spec"]["shareProcessNamespace"].as_bool() == Some(true);
        st.put(Kind::Pod, p);
        writable.push(cwd.clone());
        writable.push(root.join("home"));
        let log = root.join("container.log");
        writable.extend(steps.iter().map(|s| s.cwd.clone()));
        out.push(Launch {
            ns,
            pod: name.clone(),
            uid,
            init: steps,
            program,
            env,
            cwd,
            files,
            log,
            root,
            writable,
            read_only,
            ids,
            share_pid_ns,
            termination,
            fallback_to_logs,
            memory_limit,
        });
    }
    out
}

/// Starts a container process and records its end in the pod.
pub fn launch(state: &Arc<State>, l: Launch) {
    let state = state.clone();
    if let Some(m) = l.memory_limit {
        state.mem_limits.lock().insert(l.uid.clone(), m);
    }
    tokio::spawn(async move {
        let started = async {
            use std::os::unix::fs::PermissionsExt;
            let switch = is_root();
            let chown = |p: &Path, uid: Option<u32>, gid: Option<u32>| -> std::io::Result<()> {
                if switch {
                    std::os::unix::fs::chown(p, uid, gid)?;
                }
                Ok(())
            };
            // The pod's directory: its user's alone. The path to it is
            // traversable (0711), never listable.
            if let Some(pods) = l.root.parent() {
                std::fs::create_dir_all(pods)?;
                if switch {
                    std::fs::set_permissions(pods, std::fs::Permissions::from_mode(0o711))?;
                }
            }
            std::fs::create_dir_all(&l.root)?;
            std::fs::set_permissions(&l.root, std::fs::Permissions::from_mode(0o700))?;
            chown(&l.root, Some(l.ids.uid), Some(l.ids.gid))?;
            for (path, data, mode) in &l.files {
                if let Some(d) = path.parent() {
                    std::fs::create_dir_all(d)?;
                }
                std::fs::write(path, data)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode & 0o777))?;
                // As the kubelet: root's files, group fsGroup where set.
                chown(path, Some(0), l.ids.fs_group.or(Some(0)))?;
            }
            for d in &l.read_only {
                std::fs::create_dir_all(d)?;
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o555))?;
            }
            for d in &l.writable {
                std::fs::create_dir_all(d)?;
                chown(d, Some(l.ids.uid), Some(l.ids.gid))?;
            }
            // As the kubelet: each container's termination message file,
            // empty, mode 0666 (whoever the container runs as writes it).
            for t in l.init.iter().map(|s| &s.termination).chain(std::iter::once(&l.termination)) {
                std::fs::write(t, b"")?;
                std::fs::set_permissions(t, std::fs::Permissions::from_mode(0o666))?;
            }
            std::io::Result::Ok(switch)
        }
        .await;
        let switch = match started {
            Ok(s) => s,
            Err(e) => {
                finish(&state, &l, 128, Some(format!("starting container: {e}")));
                return;
            }
        };
        // The pod's sandbox, when its containers share a PID namespace
        // (root only: a server that is not cannot make namespaces).
        let sandbox = match (l.share_pid_ns && switch).then(Sandbox::start) {
            None => None,
            Some(Ok(sb)) => {
                state.sandboxes.lock().insert(l.uid.clone(), sb.pause);
                Some(sb)
            }
            Some(Err(e)) => {
                finish(&state, &l, 128, Some(format!("starting the pod's sandbox: {e}")));
                return;
            }
        };
        let ns = sandbox.as_ref().map(|sb| (sb.pid_ns.as_raw_fd(), sb.mnt_ns.as_raw_fd()));
        // Ends the pod's sandbox (and so every process left in its PID
        // namespace: what the job daemonized) once its containers are done.
        let end_sandbox = |sandbox: Option<Sandbox>| {
            if let Some(sb) = sandbox {
                state.sandboxes.lock().remove(&l.uid);
                sb.end();
            }
        };
        // Init containers first, in order, each to its end (its own log);
        // the first that fails fails the pod.
        for (i, step) in l.init.iter().enumerate() {
            let log = l.root.join(format!("init-{i}.log"));
            let code = match command(&step.program, &step.env, &step.cwd, &log, switch, &l.ids, ns) {
                Ok(mut cmd) => match cmd.spawn() {
                    Ok(mut child) => {
                        if let Some(pid) = child.id() {
                            state.procs.lock().insert(l.uid.clone(), pid as i32);
                        }
                        let code = wait_code(&mut child).await;
                        state.procs.lock().remove(&l.uid);
                        code
                    }
                    Err(e) => {
                        end_sandbox(sandbox);
                        finish(&state, &l, 128, Some(format!("starting init container {}: {e}", step.name)));
                        return;
                    }
                },
                Err(e) => {
                    end_sandbox(sandbox);
                    finish(&state, &l, 128, Some(format!("starting init container {}: {e}", step.name)));
                    return;
                }
            };
            if code != 0 {
                end_sandbox(sandbox);
                finish(&state, &l, code, Some(format!("init container {} exited with {code}", step.name)));
                return;
            }
        }
        let started = command(&l.program, &l.env, &l.cwd, &l.log, switch, &l.ids, ns).and_then(|mut c| c.spawn());
        let mut child = match started {
            Ok(c) => c,
            Err(e) => {
                end_sandbox(sandbox);
                finish(&state, &l, 128, Some(format!("starting container: {e}")));
                return;
            }
        };
        if let Some(pid) = child.id() {
            state.procs.lock().insert(l.uid.clone(), pid as i32);
        }
        let code = wait_code(&mut child).await;
        // As the kubelet: a pod whose (only) container ended is torn down,
        // whatever it left running in its namespace.
        end_sandbox(sandbox);
        state.procs.lock().remove(&l.uid);
        finish(&state, &l, code, None);
    });
}

async fn wait_code(child: &mut tokio::process::Child) -> i32 {
    match child.wait().await {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
        }
        Err(_) => 128,
    }
}

/// A container's process, as its user when the server can switch users,
/// in its own process group, output to `log`.
fn command(
    program: &[String],
    env: &[(String, String)],
    cwd: &Path,
    log: &Path,
    switch: bool,
    ids: &Ids,
    ns: Option<(RawFd, RawFd)>,
) -> std::io::Result<tokio::process::Command> {
    let log_path = log;
    let log = std::fs::File::create(log_path)?;
    if switch {
        // The container's own stream: its processes may reopen it
        // (`/proc/<pid>/fd/2`), as they may a real container's stdout pipe.
        std::os::unix::fs::chown(log_path, Some(ids.uid), Some(ids.gid))?;
    }
    let mut cmd = tokio::process::Command::new(&program[0]);
    cmd.args(&program[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(false);
    if let Some((pid_ns, mnt_ns)) = ns {
        let cwd = std::ffi::CString::new(cwd.as_os_str().as_encoded_bytes())
            .map_err(|_| std::io::Error::other("a working directory with a NUL byte"))?;
        // SAFETY: the closure runs in the forked child before exec and
        // calls only async-signal-safe functions (setns, chdir, fork,
        // close, waitpid, signal, kill, _exit) on memory allocated before
        // the fork (`cwd`); it runs before the closure switching users.
        unsafe {
            cmd.pre_exec(move || {
                join_pod_namespaces(pid_ns, mnt_ns, &cwd)?;
                Ok(())
            });
        }
    }
    if switch {
        let ids = ids.clone();
        let groups: Vec<libc::gid_t> = ids.groups.clone();
        // SAFETY: the closure runs in the forked child before exec
        // and calls only async-signal-safe functions (setgroups,
        // setgid, setuid) on memory allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(ids.gid) != 0
                    || libc::setuid(ids.uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    Ok(cmd)
}

/// A pod's sandbox: its PID namespace, whose init (PID 1 there) is the
/// pod's `pause` (a copy of this server that reaps what is re-parented to
/// it and does nothing else), in a mount namespace of its own with its own
/// `/proc`, so that the pod's processes see the pod's PIDs as in a real
/// pod with `shareProcessNamespace`. Killing the pause ends every process
/// of the namespace (the kernel's rule), as the kubelet's teardown of a
/// pod sandbox does.
pub struct Sandbox {
    /// The pause's PID on this host.
    pub pause: i32,
    pid_ns: std::fs::File,
    mnt_ns: std::fs::File,
    /// The process between this server and the pause (waits for it).
    holder: tokio::process::Child,
}

impl Sandbox {
    fn start() -> std::io::Result<Sandbox> {
        let mut cmd = tokio::process::Command::new("/bin/true");
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0).kill_on_drop(true);
        // SAFETY: the closure runs in the forked child before exec and
        // calls only async-signal-safe functions (unshare, fork, mount,
        // close, waitpid, nanosleep, _exit); neither of its processes
        // returns, so nothing else runs after the fork.
        unsafe {
            cmd.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let pid = libc::fork();
                if pid < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                close_from(3);
                if pid > 0 {
                    // The holder: ends with the pause.
                    wait_for(pid);
                    libc::_exit(0);
                }
                // The pause, PID 1 of the new namespace: its own /proc.
                libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                );
                libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                );
                let nap = libc::timespec { tv_sec: 0, tv_nsec: 100_000_000 };
                loop {
                    if libc::waitpid(-1, std::ptr::null_mut(), 0) < 0 {
                        libc::nanosleep(&nap, std::ptr::null_mut());
                    }
                }
            });
        }
        let holder = cmd.spawn()?;
        let h = holder.id().ok_or_else(|| std::io::Error::other("the sandbox's holder is gone"))?;
        // spawn() returned: both processes closed the exec pipe, so the
        // pause exists; its mounts may still be on the way.
        let children = std::fs::read_to_string(format!("/proc/{h}/task/{h}/children"))?;
        let pause: i32 = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| std::io::Error::other("the pod's pause did not start"))?;
        // Wait for its /proc (a second mount at /proc in its namespace).
        let proc_mounts = |pid: &str| -> usize {
            let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
            info.lines().filter(|l| l.split(' ').nth(4) == Some("/proc")).count()
        };
        let (host, t0) = (proc_mounts("self"), std::time::Instant::now());
        while proc_mounts(&pause.to_string()) <= host {
            if t0.elapsed() > std::time::Duration::from_secs(2) {
                return Err(std::io::Error::other("the pod's pause did not mount its /proc"));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(Sandbox {
            pause,
            pid_ns: std::fs::File::open(format!("/proc/{pause}/ns/pid"))?,
            mnt_ns: std::fs::File::open(format!("/proc/{pause}/ns/mnt"))?,
            holder,
        })
    }

    /// Ends the pod's namespace: SIGKILL to its init kills all of it.
    fn end(mut self) {
        // SAFETY: kill(2) on the pause this server started (its holder,
        // waiting for it, keeps the PID from being reused).
        unsafe { libc::kill(self.pause, libc::SIGKILL) };
        let _ = self.holder.start_kill();
    }
}

/// waitpid(2) for `pid`, again when interrupted: its status (0 when it
/// cannot be waited for).
fn wait_for(pid: libc::pid_t) -> libc::c_int {
    let mut st = 0;
    // SAFETY: waitpid(2) writes the status into `st`, a local; reading
    // errno through its thread-local location is async-signal-safe.
    unsafe {
        while libc::waitpid(pid, &mut st, 0) < 0 {
            if *libc::__errno_location() != libc::EINTR {
                return 0;
            }
        }
    }
    st
}

/// Closes every descriptor from `first` on (after a fork: what the child
/// holds of the parent's, the exec-status pipe of std's spawn included).
fn close_from(first: i32) {
    // SAFETY: close_range(2) on descriptors of this process; no memory.
    if unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint) } != 0
    {
        for fd in first..4096 {
            // SAFETY: close(2) of a descriptor number; no memory.
            unsafe { libc::close(fd) };
        }
    }
}

/// In a container's child before exec: enter the pod's namespaces (its
/// mount namespace resets the working directory: back to `cwd`), then fork
/// once more, since only children enter a PID namespace: the child goes on
/// to exec the container's program, as PID n of the pod; this process
/// waits for it and ends as it ended (its exit code, or its signal).
///
/// # Safety
/// Only between fork and exec (it forks and `_exit`s).
unsafe fn join_pod_namespaces(pid_ns: RawFd, mnt_ns: RawFd, cwd: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: the caller runs this between fork and exec; every call is
    // async-signal-safe and touches only `cwd` (allocated before the fork).
    unsafe {
        if libc::setns(mnt_ns, libc::CLONE_NEWNS) != 0
            || libc::setns(pid_ns, libc::CLONE_NEWPID) != 0
            || libc::chdir(cwd.as_ptr()) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        let pid = libc::fork();
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid == 0 {
            return Ok(());
        }
        close_from(3);
        // The signals a pod's processes get reach the child directly (one
        // process group): this one outlives it to tell its end.
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let st = wait_for(pid);
        if libc::WIFSIGNALED(st) {
            let sig = libc::WTERMSIG(st);
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(st))
    }
}

fn finish(state: &Arc<State>, l: &Launch, code: i32, err: Option<String>) {
    state.mem_limits.lock().remove(&l.uid);
    {
        let mut st = state.store.lock();
        let Some(mut p) = st.get(Kind::Pod, &l.ns, &l.pod).cloned() else { return };
        if meta_str(&p, "uid") != l.uid || pod_done(&p) {
            return;
        }
        let t = rfc3339(now_s());
        let started = p["status"]["startTime"].clone();
        // Killed past its memory limit: what the kubelet reports of a
        // container the kernel's OOM killer ended (the whole cgroup, as
        // with memory.oom.group): OOMKilled, 137.
        let oom = state.oom_killed.lock().remove(&l.uid);
        let code = if oom { 137 } else { code };
        let reason = if oom {
            "OOMKilled"
        } else if code == 0 {
            "Completed"
        } else {
            "Error"
        };
        p["status"]["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
        let mut term = json!({"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": t,
                              "containerID": format!("fake://{}", l.uid)});
        if let Some(m) = err.or_else(|| termination_message(&l.termination, l.fallback_to_logs, code, &l.log)) {
            term["message"] = json!(m);
        }
        let c = p["spec"]["containers"][0].clone();
        p["status"]["containerStatuses"] = json!([{"name": c["name"], "image": c["image"], "imageID": "", "ready": false,
            "restartCount": 0, "started": false, "state": {"terminated": term}}]);
        let disruption: Vec<Value> = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["type"] == "DisruptionTarget")
            .cloned()
            .collect();
        let mut conds = vec![
            cond("PodScheduled", "True", "", ""),
            cond("Initialized", "True", "", ""),
            cond("ContainersReady", "False", "PodCompleted", ""),
            cond("Ready", "False", "PodCompleted", ""),
        ];
        conds.extend(disruption);
        p["status"]["conditions"] = json!(conds);
        st.put(Kind::Pod, p);
    }
    state.poke();
}

/// The work directory names (`{ns}_{name}`) of every pod the store holds.
pub fn pod_dirs(st: &Store) -> std::collections::BTreeSet<String> {
    st.list(Kind::Pod, None)
        .into_iter()
        .map(|p| format!("{}_{}", meta_str(p, "namespace"), meta_str(p, "name")))
        .collect()
}

/// A kubelet's volume clean-up: the directory of a pod that is gone from
/// the store is removed once it has been seen orphaned twice (so a
/// deleted pod's process has had its grace period, 2 s, to end).
/// Returns the directories orphaned now, for the next pass.
pub fn remove_orphans(
    work_dir: &Path,
    live: &std::collections::BTreeSet<String>,
    seen_before: &std::collections::BTreeSet<String>,
) -> std::collections::BTreeSet<String> {
    let mut now = std::collections::BTreeSet::new();
    let Ok(dir) = std::fs::read_dir(work_dir.join("pods")) else { return now };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if live.contains(&name) {
            continue;
        }
        if seen_before.contains(&name) {
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                tracing::warn!("kube-server: removing {}: {err}", e.path().display());
            }
        } else {
            now.insert(name);
        }
    }
    now
}

/// The processes of this host: pid -> (parent pid, resident bytes).
fn proc_table() -> HashMap<i32, (i32, u64)> {
    // SAFETY: sysconf(3) has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // After the command's closing parenthesis: state, ppid, ... rss (24th field).
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (Some(ppid), Some(rss)) =
            (f.get(1).and_then(|x| x.parse().ok()), f.get(21).and_then(|x| x.parse::<u64>().ok()))
        else {
            continue;
        };
        out.insert(pid, (ppid, rss * page));
    }
    out
}

/// The kernel's OOM killer for containers, as the double does it: every
/// container with a memory limit whose processes (its process and its
/// descendants, and in a shared PID namespace what its pause adopted) hold
/// more resident memory than the limit is killed, all its processes with
/// SIGKILL (as cgroup v2's `memory.oom.group`, which the kubelet sets, kills
/// a container whole); [`finish`] then reports it `OOMKilled`, exit code
/// 137. Unlike a cgroup it counts resident memory only (no page cache, no
/// kernel memory) and looks every poll (`start`: 100 ms), so a process that
/// allocates and exits between two looks is not seen. The server's own
/// forks (a sandbox's pause, the process that joins a pod's namespaces and
/// waits) share its pages and are not counted.
pub fn enforce_memory_limits(state: &Arc<State>) {
    let limits: Vec<(String, u64)> = state.mem_limits.lock().iter().map(|(k, v)| (k.clone(), *v)).collect();
    if limits.is_empty() {
        return;
    }
    let table = proc_table();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, (ppid, _)) in &table {
        children.entry(*ppid).or_default().push(*pid);
    }
    let own = std::fs::read_link("/proc/self/exe").ok();
    for (uid, limit) in limits {
        let main = state.procs.lock().get(&uid).copied();
        let pause = state.sandboxes.lock().get(&uid).copied();
        let mut members: Vec<i32> = main.into_iter().collect();
        let mut queue: Vec<i32> = main.into_iter().chain(pause).collect();
        while let Some(p) = queue.pop() {
            for c in children.get(&p).into_iter().flatten() {
                if !members.contains(c) {
                    members.push(*c);
                    queue.push(*c);
                }
            }
        }
        let used: u64 = members
            .iter()
            .filter(|p| own.is_none() || std::fs::read_link(format!("/proc/{p}/exe")).ok() != own)
            .filter_map(|p| table.get(p).map(|t| t.1))
            .sum();
        if used <= limit {
            continue;
        }
        if state.oom_killed.lock().insert(uid.clone()) {
            tracing::info!("kube-server: pod {uid}: {used} bytes resident over its limit of {limit}: OOM-killed");
        }
        for p in members {
            // SAFETY: kill(2) on the processes of a container this server
            // started, seen an instant ago (never the pod's pause).
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        if let Some(m) = main {
            // SAFETY: as above, the container's process group.
            unsafe { libc::kill(-m, libc::SIGKILL) };
        }
    }
}

/// Stops a pod's process: SIGTERM to its process group, SIGKILL after `grace`.
pub fn kill(state: &Arc<State>, pod_uid: &str, grace: std::time::Duration) {
    let Some(pid) = state.procs.lock().get(pod_uid).copied() else { return };
    // SAFETY: kill(2) on a process group this server started; no memory is shared.
    unsafe { libc::kill(-pid, libc::SIGTERM) };
    let state = state.clone();
    let uid = pod_uid.to_string();
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        if state.procs.lock().get(&uid) == Some(&pid) {
            // SAFETY: as above; the group still belongs to the pod's process.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_pods_directory_is_removed_on_the_second_pass_and_a_live_one_never() {
        let work = tempfile::tempdir().unwrap();
        let pods = work.path().join("pods");
        for d in ["ns_live", "ns_gone"] {
            std::fs::create_dir_all(pods.join(d).join("volumes/v")).unwrap();
            std::fs::write(pods.join(d).join("volumes/v/f"), b"x").unwrap();
        }
        let outside = work.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        std::os::unix::fs::symlink(&outside, pods.join("ns_gone/volumes/link")).unwrap();
        let live: std::collections::BTreeSet<String> = ["ns_live".to_string()].into();
        let first = remove_orphans(work.path(), &live, &Default::default());
        assert_eq!(first, ["ns_gone".to_string()].into());
        assert!(pods.join("ns_gone/volumes/v/f").exists(), "kept until its grace period has passed");
        let second = remove_orphans(work.path(), &live, &first);
        assert!(second.is_empty());
        assert!(!pods.join("ns_gone").exists());
        assert!(pods.join("ns_live/volumes/v/f").exists());
        assert!(outside.join("keep").exists(), "a link in a pod's volume is not followed");
    }

    #[test]
    fn a_container_runs_as_its_security_contexts_user() {
        let pod = |psc: Value, csc: Value| json!({"metadata": {"name": "p"}, "spec": {"securityContext": psc, "containers": [{"name": "job", "securityContext": csc}]}});
        let check = |p: Value, want: Result<Ids, &str>| match (ids_of(&p), want) {
            (Ok(got), Ok(w)) => assert_eq!(got, w, "{p}"),
            (Err(e), Err(w)) => assert!(e.contains(w), "{e}"),
            (got, w) => panic!("{p}: {got:?}, wanted {w:?}"),
        };
        check(
            pod(
                json!({"runAsUser": 1001, "runAsGroup": 1002, "supplementalGroups": [1001, 3000], "fsGroup": 1002, "runAsNonRoot": true}),
                json!({}),
            ),
            Ok(Ids { uid: 1001, gid: 1002, groups: vec![1001, 1002, 3000], fs_group: Some(1002) }),
        );
        // The container's settings win over the pod's.
        check(
            pod(json!({"runAsUser": 1001}), json!({"runAsUser": 1003, "runAsGroup": 7})),
            Ok(Ids { uid: 1003, gid: 7, groups: vec![], fs_group: None }),
        );
        // Without runAsUser: the double's image user, nobody.
        check(pod(json!({}), json!({})), Ok(Ids { uid: NOBODY, gid: NOBODY, groups: vec![], fs_group: None }));
        check(pod(json!({"runAsUser": 0, "runAsNonRoot": true}), json!({})), Err("breaks non-root policy"));
        check(pod(json!({"runAsNonRoot": true}), json!({"runAsUser": 0})), Err("breaks non-root policy"));
        check(pod(json!({"runAsUser": 1u64 << 40}), json!({})), Err("out of range"));
        check(pod(json!({"runAsUser": 5, "supplementalGroups": ["x"]}), json!({})), Err("bad gid"));
    }

    #[test]
    fn env_expansion() {
        let env = vec![("A".to_string(), "1".to_string())];
        assert_eq!(expand("x$(A)y$(B)$(", &env), "x1y$(B)$(");
    }

    #[test]
    fn affinity_and_requests() {
        let node = json!({"metadata": {"labels": {"nvidia.com/gpu.product": "H100"}}});
        let pod = |op: &str, vals: Value| {
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": op, "values": vals}]}]}}}}})
        };
        assert!(affinity_ok(&pod("In", json!(["A100", "H100"])), &node));
        assert!(!affinity_ok(&pod("In", json!(["A100"])), &node));
        assert!(affinity_ok(&pod("NotIn", json!(["A100"])), &node));
        assert!(!affinity_ok(&pod("DoesNotExist", json!([])), &node));
        let p = json!({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "500m"}}}]}});
        let r = pod_requests(&p);
        assert_eq!((r["nvidia.com/gpu"], r["cpu"]), (2.0, 0.5));
    }
}
