//! `kube-server`: a test double of the Kubernetes API server.
//!
//! No Kubernetes API server can run on the project's machines, so Fleet's
//! Kubernetes backend is tested against this one: the subset of the API
//! the agent and `kubectl get/logs/describe/delete` use, served over HTTP
//! or HTTPS on loopback, with objects as JSON in memory.
//!
//! * discovery (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/batch/v1`);
//! * Nodes (from a TOML or JSON file), Pods (with `/log`, `?follow`),
//!   `batch/v1` Jobs, ConfigMaps, Secrets, Services, Events (the Job
//!   controller's `FailedCreate`), ResourceQuotas (enforced on the Job
//!   controller's pods);
//! * get, list, watch (resourceVersion, bookmarks, 410 Gone once compacted),
//!   create (409 AlreadyExists), replace, delete (cascading by owner
//!   references: Background/Foreground delete dependents, Orphan keeps them);
//!   label and field selectors; `Table` output for `kubectl get`;
//! * bearer tokens: configured ones, each allowed a list of namespaces (and
//!   Nodes or not), and ServiceAccounts' (token Secrets), authorized by
//!   RBAC's Roles, ClusterRoles and their bindings ([`rbac`]); anything
//!   else is 403 Forbidden as a Kubernetes `Status`; SelfSubjectAccessReview
//!   for `kubectl auth can-i`;
//! * the Eviction subresource (`pods/<name>/eviction`, what `kubectl drain`
//!   uses) and cordoned nodes (`spec.unschedulable`, by the admin);
//! * memory limits enforced as the kernel's OOM killer would
//!   ([`kubelet::enforce_memory_limits`]: `OOMKilled`, exit code 137);
//! * a Job controller, scheduler and kubelet ([`kubelet`]) that run a Job's
//!   pods as local processes.

pub mod api;
pub mod kubelet;
pub mod rbac;
pub mod store;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;

use crate::store::{now_s, rfc3339, Kind, Store};

/// A node of the fake cluster.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConf {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Capacity = allocatable: `cpu`, `memory`, `nvidia.com/gpu`, MIG profiles.
    pub capacity: BTreeMap<String, String>,
    /// `key=value:Effect` or `key:Effect`.
    #[serde(default)]
    pub taints: Vec<String>,
}

/// A bearer token and what it may touch.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConf {
    pub token: String,
    pub user: String,
    /// Namespaces this token may use; `*` for all.
    pub namespaces: Vec<String>,
    /// May read Nodes (a ClusterRole in a real cluster).
    #[serde(default)]
    pub nodes: bool,
}

/// The file a lab gives `kube-server --config`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConf {
    /// Namespaces that exist from the start (besides `default`,
    /// `kube-system` and those the tokens name).
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub node: Vec<NodeConf>,
    #[serde(default)]
    pub token: Vec<TokenConf>,
}

impl FileConf {
    /// TOML, or JSON when the name ends in `.json`.
    pub fn load(path: &Path) -> Result<FileConf> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
        } else {
            toml::from_str(&text).with_context(|| format!("{}", path.display()))
        }
    }
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub namespaces: Vec<String>,
    pub nodes: Vec<NodeConf>,
    pub tokens: Vec<TokenConf>,
    /// Where pods' files and logs go.
    pub work_dir: PathBuf,
    pub tls: bool,
    /// How often a quiet watch gets a BOOKMARK.
    pub bookmark_every: Duration,
    /// How late every watch of Pods delivers its events (0: at once): a
    /// client's pod watch lagging behind its Job watch, as a loaded host or
    /// a busy API server makes it (tests of that race).
    pub pod_watch_delay: Duration,
}

impl ServerConfig {
    pub fn new(file: FileConf, work_dir: &Path) -> ServerConfig {
        ServerConfig {
            nodes: file.node,
            tokens: file.token,
            namespaces: file.namespaces,
            work_dir: work_dir.to_path_buf(),
            tls: false,
            bookmark_every: Duration::from_secs(1),
            pod_watch_delay: Duration::ZERO,
        }
    }
}

pub struct State {
    pub store: Mutex<Store>,
    pub changed: tokio::sync::watch::Sender<u64>,
    pub cfg: ServerConfig,
    /// Pod uid -> pid (= process group) of its running container.
    pub procs: Mutex<HashMap<String, i32>>,
    /// Pod uid -> pid of its sandbox's pause (pods sharing a PID namespace).
    pub sandboxes: Mutex<HashMap<String, i32>>,
    /// Pod uid -> the memory limit (bytes) of its running container.
    pub mem_limits: Mutex<HashMap<String, u64>>,
    /// Pods whose container was killed past its memory limit.
    pub oom_killed: Mutex<std::collections::HashSet<String>>,
    pub kick: tokio::sync::Notify,
    pub url: String,
    /// Bumped to end every open watch (after a compaction, as an API
    /// server restart would): clients resume, and get 410 Gone.
    pub resets: tokio::sync::watch::Sender<u64>,
    /// Watches answered 410 Gone so far.
    pub gone: std::sync::atomic::AtomicU64,
    /// Pod lists served (not watches): what a client that should watch
    /// instead costs the server.
    pub pod_lists: std::sync::atomic::AtomicU64,
}

impl State {
    /// Wake watches and the controller.
    pub fn poke(&self) {
        let rv = self.store.lock().rv;
        self.changed.send_replace(rv);
        self.kick.notify_one();
    }
}

/// A running server.
pub struct Handle {
    pub url: String,
    /// The CA to trust (HTTPS only).
    pub ca_pem: Option<String>,
    pub state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Handle {
    /// A kubeconfig (JSON, which kubectl and kube read as YAML) for `token`
    /// with `namespace` as its default.
    pub fn kubeconfig(&self, token: &str, namespace: &str) -> String {
        use base64::Engine as _;
        let mut cluster = json!({"server": self.url});
        if let Some(ca) = &self.ca_pem {
            cluster["certificate-authority-data"] = json!(base64::engine::general_purpose::STANDARD.encode(ca));
        }
        let v = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "fleet-test",
            "clusters": [{"name": "fleet-test", "cluster": cluster}],
            "users": [{"name": "fleet-test", "user": {"token": token}}],
            "contexts": [{"name": "fleet-test", "context": {"cluster": "fleet-test", "user": "fleet-test", "namespace": namespace}}],
        });
        serde_json::to_string_pretty(&v).expect("JSON")
    }

    /// Writes [`Handle::kubeconfig`] to `path`, mode 0600.
    pub fn write_kubeconfig(&self, path: &Path, token: &str, namespace: &str) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
        f.write_all(self.kubeconfig(token, namespace).as_bytes())?;
        Ok(())
    }

    /// Forget every watch event and end the open watches: a client that
    /// resumes from a resourceVersion it had gets 410 Gone and must list again.
    pub fn compact(&self) {
        self.state.store.lock().compact();
        self.state.resets.send_modify(|g| *g += 1);
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<serde_json::Value> {
        self.state.store.lock().get(kind, ns, name).cloned()
    }

    pub fn list(&self, kind: Kind, ns: Option<&str>) -> Vec<serde_json::Value> {
        self.state.store.lock().list(kind, ns).into_iter().cloned().collect()
    }

    /// Container processes still running.
    pub fn running_processes(&self) -> usize {
        self.state.procs.lock().len()
    }

    pub fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let pids: Vec<i32> = self.state.procs.lock().values().copied().collect();
        for pid in pids {
            // SAFETY: kill(2) on process groups this server started.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let pauses: Vec<i32> = self.state.sandboxes.lock().values().copied().collect();
        for pid in pauses {
            // SAFETY: kill(2) on pods' pauses this server started: ends their namespaces.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn node_object(st: &mut Store, n: &NodeConf) -> serde_json::Value {
    let mut labels: serde_json::Map<String, serde_json::Value> =
        n.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    labels.insert("kubernetes.io/hostname".into(), json!(n.name));
    labels.insert("kubernetes.io/os".into(), json!("linux"));
    labels.insert("kubernetes.io/arch".into(), json!("amd64"));
    let taints: Vec<serde_json::Value> = n
        .taints
        .iter()
        .map(|t| {
            let (kv, effect) = t.split_once(':').unwrap_or((t, "NoSchedule"));
            match kv.split_once('=') {
                Some((k, v)) => json!({"key": k, "value": v, "effect": effect}),
                None => json!({"key": kv, "effect": effect}),
            }
        })
        .collect();
    let t = rfc3339(now_s());
    json!({
        "metadata": {"name": n.name, "uid": st.new_uid(), "labels": labels, "creationTimestamp": t},
        "spec": {"taints": taints},
        "status": {
            "capacity": n.capacity, "allocatable": n.capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": t, "lastTransitionTime": t}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": n.name}],
            "nodeInfo": {"kubeletVersion": "v1.33.0-fleet-test", "containerRuntimeVersion": "fake://1", "osImage": "Fleet test double",
                         "kernelVersion": "", "operatingSystem": "linux", "architecture": "amd64", "machineID": "", "systemUUID": "",
                         "bootID": "", "kubeProxyVersion": ""},
        },
    })
}

/// Starts a server on 127.0.0.1 (`port` 0: any).
pub async fn start(mut cfg: ServerConfig, port: u16) -> Result<Handle> {
    std::fs::create_dir_all(&cfg.work_dir).with_context(|| format!("creating {}", cfg.work_dir.display()))?;
    // Containers run elsewhere (their working directory): paths must be absolute.
    cfg.work_dir = std::fs::canonicalize(&cfg.work_dir)?;
    kubelet::check_work_dir(&cfg.work_dir)?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).context("binding 127.0.0.1")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let scheme = if cfg.tls { "https" } else { "http" };
    let url = format!("{scheme}://127.0.0.1:{}", addr.port());
    let mut store = Store::default();
    let mut seen = std::collections::HashSet::new();
    for n in &cfg.nodes {
        anyhow::ensure!(seen.insert(n.name.clone()), "node {} is listed twice", n.name);
        for (k, v) in &n.capacity {
            anyhow::ensure!(store::quantity(v).is_some(), "node {}: {k} = {v:?} is not a quantity", n.name);
        }
        let obj = node_object(&mut store, n);
        store.put(Kind::Node, obj);
    }
    let mut namespaces: std::collections::BTreeSet<&str> = ["default", "kube-system"].into();
    namespaces.extend(cfg.tokens.iter().flat_map(|t| t.namespaces.iter().map(String::as_str)).filter(|n| *n != "*"));
    namespaces.extend(cfg.namespaces.iter().map(String::as_str));
    for ns in namespaces {
        let uid = store.new_uid();
        store.put(Kind::Namespace, json!({"metadata": {"name": ns, "uid": uid, "creationTimestamp": rfc3339(now_s())}, "status": {"phase": "Active"}}));
    }
    let (changed, _) = tokio::sync::watch::channel(store.rv);
    let tls = cfg.tls;
    let state = Arc::new(State {
        store: Mutex::new(store),
        changed,
        cfg,
        procs: Mutex::new(HashMap::new()),
        sandboxes: Mutex::new(HashMap::new()),
        mem_limits: Mutex::new(HashMap::new()),
        oom_killed: Mutex::new(std::collections::HashSet::new()),
        kick: tokio::sync::Notify::new(),
        url: url.clone(),
        resets: tokio::sync::watch::channel(0).0,
        gone: std::sync::atomic::AtomicU64::new(0),
        pod_lists: std::sync::atomic::AtomicU64::new(0),
    });
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = api::router(state.clone());
    let mut ca_pem = None;
    if tls {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "kube-server test CA");
        let ca = ca.self_signed(&ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?
            .signed_by(&key, &ca, &ca_key)?;
        let tls_cfg =
            axum_server::tls_rustls::RustlsConfig::from_pem(leaf.pem().into_bytes(), key.serialize_pem().into_bytes())
                .await?;
        ca_pem = Some(ca.pem());
        let handle = axum_server::Handle::new();
        let h2 = handle.clone();
        tokio::spawn(async move {
            let _ = stop_rx.await;
            h2.shutdown();
        });
        let server = axum_server::from_tcp_rustls(listener, tls_cfg).handle(handle);
        tokio::spawn(async move {
            if let Err(e) = server.serve(app.into_make_service()).await {
                tracing::error!("kube-server: {e}");
            }
        });
    } else {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tokio::spawn(async move {
            let r = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop_rx.await;
                })
                .await;
            if let Err(e) = r {
                tracing::error!("kube-server: {e}");
            }
        });
    }
    // The OOM killer: containers' memory against their limits.
    let weak_oom = Arc::downgrade(&state);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Some(state) = weak_oom.upgrade() else { return };
            if state.mem_limits.lock().is_empty() {
                continue;
            }
            let s = state.clone();
            let _ = tokio::task::spawn_blocking(move || kubelet::enforce_memory_limits(&s)).await;
        }
    });
    // The controller: on every change, and twice a second for deadlines
    // and image-pull back-off.
    let weak = Arc::downgrade(&state);
    tokio::spawn(async move {
        let mut orphans = std::collections::BTreeSet::new();
        let mut last_gc = std::time::Instant::now();
        loop {
            let Some(state) = weak.upgrade() else { return };
            if last_gc.elapsed() >= Duration::from_secs(10) {
                last_gc = std::time::Instant::now();
                let live = kubelet::pod_dirs(&state.store.lock());
                orphans = kubelet::remove_orphans(&state.cfg.work_dir, &live, &orphans);
            }
            let launches = {
                let mut store = state.store.lock();
                let before = store.rv;
                let l = kubelet::reconcile(&mut store, &state.cfg.work_dir);
                (l, store.rv != before, std::mem::take(&mut store.to_kill))
            };
            for uid in launches.2 {
                kubelet::kill(&state, &uid, Duration::from_secs(2));
            }
            for l in launches.0 {
                kubelet::launch(&state, l);
            }
            if launches.1 {
                let rv = state.store.lock().rv;
                state.changed.send_replace(rv);
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), state.kick.notified()).await;
        }
    });
    Ok(Handle { url, ca_pem, state, stop: Some(stop) })
}
