//! The test double's API semantics over plain HTTP: conflicts, watches
//! (resourceVersion, bookmarks, 410 Gone), RBAC, cascading deletion, the
//! Job controller's deadline and Indexed completions.

use std::time::{Duration, Instant};

use kube_server::store::Kind;
use serde_json::{json, Value};

const CONF: &str = r#"
[[node]]
name = "n0"
capacity = { cpu = "8", memory = "16Gi", "nvidia.com/gpu" = "2" }

[[token]]
token = "t-ns"
user = "agent"
namespaces = ["fleet"]

[[token]]
token = "t-admin"
user = "admin"
namespaces = ["*"]
nodes = true
"#;

struct S {
    h: kube_server::Handle,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn server() -> S {
    let dir = tempfile::tempdir().unwrap();
    // Containers run as their runAsUser (the server runs as root here): they must reach the work dir.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let mut cfg = kube_server::ServerConfig::new(toml::from_str(CONF).unwrap(), dir.path());
    cfg.bookmark_every = Duration::from_millis(200);
    let h = kube_server::start(cfg, 0).await.unwrap();
    S { h, http: reqwest::Client::new(), _dir: dir }
}

impl S {
    async fn call(&self, method: reqwest::Method, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.http.request(method, format!("{}{path}", self.h.url)).bearer_auth(token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let code = resp.status().as_u16();
        (code, resp.json().await.unwrap_or(Value::Null))
    }

    /// The first `n` lines of a watch.
    async fn watch(&self, path: &str, n: usize) -> Vec<Value> {
        let mut resp = self.http.get(format!("{}{path}", self.h.url)).bearer_auth("t-admin").send().await.unwrap();
        let mut buf = Vec::new();
        let mut out = Vec::new();
        let t0 = Instant::now();
        while out.len() < n {
            assert!(t0.elapsed() < Duration::from_secs(10), "watch gave only {out:?}");
            let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await.unwrap() else {
                break;
            };
            buf.extend_from_slice(&chunk);
            while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                out.push(serde_json::from_slice(&line).unwrap());
            }
        }
        out
    }
}

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

fn job(name: &str, script: &str, extra: Value) -> Value {
    let mut j = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["/bin/bash", "-c", script]}]}}}});
    if let (Some(spec), Some(extra)) = (j["spec"].as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    j
}

use reqwest::Method;

#[tokio::test]
async fn create_conflicts_and_rbac() {
    let s = server().await;
    let (code, obj) = s.call(Method::POST, "/api/v1/namespaces/fleet/configmaps", "t-ns", Some(cm("a"))).await;
    assert_eq!(code, 201, "{obj}");
    assert!(obj["metadata"]["uid"].is_string() && obj["metadata"]["resourceVersion"].is_string());
    let (code, st) = s.call(Method::POST, "/api/v1/namespaces/fleet/configmaps", "t-ns", Some(cm("a"))).await;
    assert_eq!(
        (code, st["reason"].as_str(), st["message"].as_str()),
        (409, Some("AlreadyExists"), Some("configmaps \"a\" already exists"))
    );
    // A stale resourceVersion on replace is a 409 Conflict.
    let mut stale = obj.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    let (code, st) = s.call(Method::PUT, "/api/v1/namespaces/fleet/configmaps/a", "t-ns", Some(stale)).await;
    assert_eq!((code, st["reason"].as_str()), (409, Some("Conflict")));
    // Outside its namespaces: 403 in the Status format; no token: 401.
    let (code, st) = s.call(Method::GET, "/apis/batch/v1/namespaces/other/jobs", "t-ns", None).await;
    assert_eq!((code, st["kind"].as_str(), st["reason"].as_str()), (403, Some("Status"), Some("Forbidden")));
    assert_eq!(
        st["message"],
        "jobs.batch is forbidden: User \"agent\" cannot list resource \"jobs\" in API group \"batch\" in the namespace \"other\""
    );
    let (code, _) = s.call(Method::GET, "/api/v1/nodes", "t-ns", None).await;
    assert_eq!(code, 403, "nodes need the token's `nodes` flag");
    let (code, _) = s.call(Method::GET, "/api/v1/pods", "t-ns", None).await;
    assert_eq!(code, 403, "all namespaces need `*`");
    let (code, _) = s.call(Method::GET, "/api/v1/namespaces/fleet/pods", "wrong", None).await;
    assert_eq!(code, 401);
    // Bad input is a clear 4xx, never a crash.
    let (code, st) = s.call(Method::POST, "/api/v1/namespaces/fleet/configmaps", "t-ns", Some(json!([1]))).await;
    assert_eq!((code, st["reason"].as_str()), (400, Some("BadRequest")));
    let (code, st) = s.call(Method::POST, "/api/v1/namespaces/fleet/configmaps", "t-ns", Some(cm("Bad_Name"))).await;
    assert_eq!((code, st["reason"].as_str()), (422, Some("Invalid")));
    let (code, _) = s.call(Method::GET, "/api/v1/namespaces/fleet/pods?labelSelector=a%20b", "t-ns", None).await;
    assert_eq!(code, 400);
    let (code, st) = s.call(Method::GET, "/api/v1/namespaces/fleet/configmaps/nope", "t-ns", None).await;
    assert_eq!((code, st["reason"].as_str()), (404, Some("NotFound")));
}

#[tokio::test]
async fn watches_resume_bookmark_and_expire() {
    let s = server().await;
    let (_, a) = s.call(Method::POST, "/api/v1/namespaces/fleet/configmaps", "t-admin", Some(cm("a"))).await;
    let rv_a = a["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    s.call(Method::POST, "/api/v1/namespaces/fleet/configmaps", "t-admin", Some(cm("b"))).await;
    s.call(Method::DELETE, "/api/v1/namespaces/fleet/configmaps/a", "t-admin", None).await;
    // From a's version: b's creation, a's deletion, then bookmarks.
    let ev = s
        .watch(
            &format!("/api/v1/namespaces/fleet/configmaps?watch=true&resourceVersion={rv_a}&allowWatchBookmarks=true"),
            3,
        )
        .await;
    let kinds: Vec<(&str, &str)> = ev
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["object"]["metadata"]["name"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(kinds, [("ADDED", "b"), ("DELETED", "a"), ("BOOKMARK", "")]);
    let last: u64 = ev[1]["object"]["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    let mark: u64 = ev[2]["object"]["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    assert!(mark >= last);
    // A label selector filters the stream.
    let ev = s.watch("/api/v1/namespaces/fleet/configmaps?watch=1&resourceVersion=0&labelSelector=x%3Dy&allowWatchBookmarks=true", 1).await;
    assert_eq!(ev[0]["type"], "BOOKMARK");
    // Once compacted, an old resourceVersion is 410 Gone (an ERROR event).
    s.h.compact();
    let ev = s.watch(&format!("/api/v1/namespaces/fleet/configmaps?watch=true&resourceVersion={rv_a}"), 1).await;
    assert_eq!((ev[0]["type"].as_str(), ev[0]["object"]["code"].as_u64()), (Some("ERROR"), Some(410)));
    assert_eq!(ev[0]["object"]["reason"], "Expired");
}

async fn until_job(s: &S, name: &str, cond: &str) -> Value {
    let t0 = Instant::now();
    loop {
        if let Some(j) = s.h.get(Kind::Job, "fleet", name) {
            if j["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == cond && c["status"] == "True")
            {
                return j;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{name}: no {cond}: {:?}", s.h.get(Kind::Job, "fleet", name));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_as_processes_with_deadline_and_indexes() {
    let s = server().await;
    // Indexed: each pod gets its JOB_COMPLETION_INDEX.
    let j = job(
        "idx",
        "echo index=$JOB_COMPLETION_INDEX",
        json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2}),
    );
    assert_eq!(s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await.0, 201);
    let done = until_job(&s, "idx", "Complete").await;
    assert_eq!(
        (done["status"]["succeeded"].as_u64(), done["status"]["completedIndexes"].as_str()),
        (Some(2), Some("0,1"))
    );
    let mut logs = Vec::new();
    for p in s.h.list(Kind::Pod, Some("fleet")) {
        let name = p["metadata"]["name"].as_str().unwrap();
        let url = format!("{}/api/v1/namespaces/fleet/pods/{name}/log", s.h.url);
        logs.push(s.http.get(url).bearer_auth("t-ns").send().await.unwrap().text().await.unwrap());
    }
    logs.sort();
    assert_eq!(logs, ["index=0\n", "index=1\n"]);
    // activeDeadlineSeconds: DeadlineExceeded, the process stopped.
    let j = job("slow", "sleep 60", json!({"activeDeadlineSeconds": 1}));
    assert_eq!(s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await.0, 201);
    let failed = until_job(&s, "slow", "Failed").await;
    let c = failed["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Failed").unwrap().clone();
    assert_eq!(c["reason"], "DeadlineExceeded");
    let t0 = Instant::now();
    while s.h.running_processes() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the deadline did not stop the process");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A request no node fits: Unschedulable with the scheduler's message.
    let mut j = job("big", "true", json!({}));
    j["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "4"}});
    s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await;
    let t0 = Instant::now();
    let msg = loop {
        let pods = s.h.list(Kind::Pod, Some("fleet"));
        let p = pods.iter().find(|p| p["metadata"]["labels"]["job-name"] == "big");
        if let Some(c) = p.and_then(|p| p["status"]["conditions"].as_array()).and_then(|c| c.first()) {
            if c["reason"] == "Unschedulable" {
                break c["message"].as_str().unwrap().to_string();
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(msg.starts_with("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_cascades_unless_orphaned() {
    let s = server().await;
    for (name, policy, pods_left) in [("bg", Some("Background"), 0), ("orph", None, 1)] {
        let (_, created) = s
            .call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(job(name, "sleep 30", json!({}))))
            .await;
        let mut c = cm(&format!("{name}-cm"));
        c["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": created["metadata"]["uid"]}]);
        s.call(Method::POST, "/api/v1/namespaces/fleet/configmaps", "t-ns", Some(c)).await;
        let t0 = Instant::now();
        while s.h.running_processes() == 0 {
            assert!(t0.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let body = policy.map(|p| json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": p}));
        let (code, _) =
            s.call(Method::DELETE, &format!("/apis/batch/v1/namespaces/fleet/jobs/{name}"), "t-ns", body).await;
        assert_eq!(code, 200);
        let left = s.h.list(Kind::Pod, Some("fleet")).len();
        assert_eq!(left, pods_left, "{name}: a Job deleted without a policy orphans its pods (the API's default)");
        assert_eq!(s.h.get(Kind::ConfigMap, "fleet", &format!("{name}-cm")).is_some(), pods_left == 1);
        for p in s.h.list(Kind::Pod, Some("fleet")) {
            let n = p["metadata"]["name"].as_str().unwrap().to_string();
            assert!(p["metadata"]["ownerReferences"].as_array().unwrap().is_empty(), "orphans lose their owner");
            s.call(Method::DELETE, &format!("/api/v1/namespaces/fleet/pods/{n}"), "t-ns", None).await;
        }
        let t0 = Instant::now();
        while s.h.running_processes() > 0 {
            assert!(t0.elapsed() < Duration::from_secs(5), "deleting a pod stops its process");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_first_and_share_empty_dirs() {
    let s = server().await;
    let logs = |name: &str| {
        let pods = s.h.list(Kind::Pod, Some("fleet"));
        let p = pods.iter().find(|p| p["metadata"]["labels"]["job-name"] == name)?.clone();
        let pod = p["metadata"]["name"].as_str()?.to_string();
        let url = format!("{}/api/v1/namespaces/fleet/pods/{pod}/log", s.h.url);
        Some((p, url))
    };
    // The init container writes into an emptyDir the main container reads
    // (mounted read-only there), at its own mount path (an argument that is
    // a mount path is rewritten to the pod's copy, as documented).
    let mut j = job("init", "", json!({}));
    let spec = &mut j["spec"]["template"]["spec"];
    spec["volumes"] = json!([{"name": "bin", "emptyDir": {}}]);
    spec["initContainers"] = json!([{"name": "copy", "image": "busybox",
        "command": ["/bin/bash", "-c", "echo from-init > \"$1/hello\"", "sh", "/fleet/bin"],
        "volumeMounts": [{"name": "bin", "mountPath": "/fleet/bin"}]}]);
    spec["containers"][0]["command"] =
        json!(["/bin/bash", "-c", "cat \"$1/hello\"; echo main-ran", "sh", "/shared/tool"]);
    spec["containers"][0]["volumeMounts"] = json!([{"name": "bin", "mountPath": "/shared/tool", "readOnly": true}]);
    assert_eq!(s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await.0, 201);
    until_job(&s, "init", "Complete").await;
    let (_, url) = logs("init").unwrap();
    let out = s.http.get(url).bearer_auth("t-ns").send().await.unwrap().text().await.unwrap();
    assert_eq!(out, "from-init\nmain-ran\n", "the main container's log only, after its init container");
    // A failing init container fails the pod; the main container never runs.
    let mut j = job("badinit", "echo main-ran", json!({}));
    j["spec"]["template"]["spec"]["initContainers"] =
        json!([{"name": "copy", "image": "busybox", "command": ["/bin/bash", "-c", "exit 7"]}]);
    s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await;
    until_job(&s, "badinit", "Failed").await;
    let (p, url) = logs("badinit").unwrap();
    let term = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(term["exitCode"], 7, "{p}");
    assert!(term["message"].as_str().unwrap().contains("init container copy exited with 7"), "{p}");
    let out = s.http.get(url).bearer_auth("t-ns").send().await.unwrap().text().await.unwrap_or_default();
    assert!(!out.contains("main-ran"), "{out}");
    // An init container's image that cannot be pulled: the pod waits on it.
    let mut j = job("noimg", "true", json!({}));
    j["spec"]["template"]["spec"]["initContainers"] =
        json!([{"name": "copy", "image": "nonexistent/helper:1", "command": ["/bin/true"]}]);
    s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await;
    let t0 = Instant::now();
    loop {
        let p = logs("noimg").map(|(p, _)| p).unwrap_or_default();
        let reason = p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"].clone();
        if reason == "ErrImagePull" || reason == "ImagePullBackOff" {
            assert!(p["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
                .as_str()
                .unwrap()
                .contains("nonexistent/helper:1"));
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{p}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `shareProcessNamespace`: the pod's containers run in a PID namespace of
/// their own whose init (PID 1) is the pod's pause, with the pod's own
/// `/proc`; a process the job double-forks is re-parented to the pause,
/// and the pod's end (its container exited) ends it too, as the kubelet's
/// teardown of the sandbox does. The server runs as root here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_sharing_its_pid_namespace_has_a_pause_and_takes_its_daemons_with_it() {
    let s = server().await;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let marks = d.path().join("dmarks");
    let script = format!(
        "echo pid=$$\n( setsid sh -c 'while :; do echo d >> {m}; sleep 0.1; done' & )\nsleep 1\n\
         for p in /proc/[0-9]*; do [ \"$(cat $p/stat 2>/dev/null | cut -d' ' -f4)\" = 1 ] && echo child-of-1=${{p#/proc/}}; done\n\
         echo nspid1=$(grep NSpid /proc/1/status | cut -f2)",
        m = marks.display()
    );
    let mut j = job("shared", &script, json!({}));
    j["spec"]["template"]["spec"]["shareProcessNamespace"] = json!(true);
    assert_eq!(s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await.0, 201);
    until_job(&s, "shared", "Complete").await;
    let pods = s.h.list(Kind::Pod, Some("fleet"));
    let pod = pods[0]["metadata"]["name"].as_str().unwrap();
    let url = format!("{}/api/v1/namespaces/fleet/pods/{pod}/log", s.h.url);
    let out = s.http.get(url).bearer_auth("t-ns").send().await.unwrap().text().await.unwrap();
    // The job's shell is a small PID, not 1; PID 1 is the pause; the
    // daemon (and the watchdog of a leased run would be) its child.
    let pid: u32 = out.lines().find_map(|l| l.strip_prefix("pid=")).and_then(|p| p.parse().ok()).expect(&out);
    assert!((2..10).contains(&pid), "the container's process in the pod's namespace: {out}");
    assert!(out.contains("nspid1=1\n"), "PID 1 of the pod's own /proc is the pause: {out}");
    assert!(out.lines().any(|l| l.starts_with("child-of-1=")), "the daemon is the pause's child: {out}");
    // The pod ended: nothing of it writes any more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n = std::fs::read_to_string(&marks).unwrap().len();
    assert!(n > 0, "the daemon ran");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(std::fs::read_to_string(&marks).unwrap().len(), n, "the daemon outlived its pod");
    assert!(s.h.state.sandboxes.lock().is_empty(), "the sandbox is gone");
}

/// A container's termination message, as the kubelet reports it: the file
/// at its `terminationMessagePath` (default `/dev/termination-log`),
/// writable by the container's user; under `FallbackToLogsOnError` an
/// empty file of a failed container gives its log's tail instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_termination_message_is_in_its_terminated_state() {
    let s = server().await;
    let message_of = |name: &str| {
        let pods = s.h.list(Kind::Pod, Some("fleet"));
        let p = pods.iter().find(|p| p["metadata"]["labels"]["job-name"] == name).cloned().unwrap_or_default();
        p["status"]["containerStatuses"][0]["state"]["terminated"]["message"].clone()
    };
    let cases = [
        // (job, script, path, policy, expected message)
        ("default", "echo 'stopped: why' > \"$1\"; exit 3", None, None, json!("stopped: why\n")),
        ("named", "echo -n done > \"$1\"", Some("/fleet/run/end"), None, json!("done")),
        ("silent", "echo to-log; exit 2", None, None, Value::Null),
        ("fallback", "echo line1; echo line2; exit 2", None, Some("FallbackToLogsOnError"), json!("line1\nline2\n")),
        ("fallback-ok", "echo line1", None, Some("FallbackToLogsOnError"), Value::Null),
    ];
    for (name, script, path, policy, _) in &cases {
        let mut j = job(name, script, json!({}));
        // Runs as a user (the file is the kubelet's, world-writable).
        j["spec"]["template"]["spec"]["securityContext"] = json!({"runAsUser": 1001, "runAsGroup": 1001});
        let c = &mut j["spec"]["template"]["spec"]["containers"][0];
        // The path as an argument (the double rewrites arguments that
        // start with a mount path, documented).
        if let Some(cmd) = c["command"].as_array_mut() {
            cmd.extend([json!("sh"), json!(path.unwrap_or("/dev/termination-log"))]);
        }
        if let Some(p) = path {
            c["terminationMessagePath"] = json!(p);
        }
        if let Some(p) = policy {
            c["terminationMessagePolicy"] = json!(p);
        }
        assert_eq!(s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await.0, 201);
    }
    for (name, script, _, _, want) in cases {
        let cond = if script.contains("exit") { "Failed" } else { "Complete" };
        until_job(&s, name, cond).await;
        assert_eq!(message_of(name), want, "{name}");
    }
}

/// The pod of Job `name` (the first), once `pred` holds for it.
async fn until_pod(s: &S, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        let pods = s.h.list(Kind::Pod, Some("fleet"));
        if let Some(p) = pods.iter().find(|p| p["metadata"]["labels"]["job-name"] == name && pred(p)) {
            return p.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{name}: no pod {what}: {pods:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A container over its memory limit is killed whole, as the kernel's OOM
/// killer does in its cgroup: `OOMKilled`, 137, the script's next line
/// never runs; one under its limit is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_over_its_memory_limit_is_oom_killed() {
    let s = server().await;
    let hog = "echo start; python3 -c 'import time; x = bytearray(200 << 20); time.sleep(30)'; echo after";
    for (name, limit, script) in [("hog", "64Mi", hog), ("small", "64Mi", "echo fine")] {
        let mut j = job(name, script, json!({}));
        j["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": limit}});
        assert_eq!(s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await.0, 201);
    }
    let t0 = Instant::now();
    let p = until_pod(&s, "hog", "ended", |p| p["status"]["phase"] == "Failed").await;
    let term = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!((term["reason"].as_str(), term["exitCode"].as_i64()), (Some("OOMKilled"), Some(137)), "{p}");
    assert!(t0.elapsed() < Duration::from_secs(10), "killed within its sleep: {:?}", t0.elapsed());
    let job = until_job(&s, "hog", "Failed").await;
    assert_eq!(job["status"]["failed"], 1, "{job}");
    let name = p["metadata"]["name"].as_str().unwrap();
    let url = format!("{}/api/v1/namespaces/fleet/pods/{name}/log", s.h.url);
    let log = s.http.get(url).bearer_auth("t-ns").send().await.unwrap().text().await.unwrap();
    assert_eq!(log, "start\n", "the whole container was killed");
    until_job(&s, "small", "Complete").await;
}

/// The Eviction API (what `kubectl drain` posts): the pod gets
/// DisruptionTarget, is stopped and deleted once its Job counted it, and a
/// Job whose podFailurePolicy fails on that condition fails at once with
/// the Job controller's message; without a policy the pod counts against
/// the backoff limit. Only an admin may cordon a node; a cordoned node
/// takes no pod.
/// A Job its backoff limit fails stops its pods still running, which are
/// not marked `DeadlineExceeded` (only the Job's own deadline does that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failed_by_its_backoff_limit_stops_its_other_pods_unmarked() {
    let s = server().await;
    let j = job(
        "bo",
        "if [ \"$JOB_COMPLETION_INDEX\" = 0 ]; then sleep 0.5; exit 1; fi; sleep 60",
        json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0}),
    );
    assert_eq!(s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await.0, 201);
    let failed = until_job(&s, "bo", "Failed").await;
    let c = failed["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Failed").unwrap().clone();
    assert_eq!(c["reason"], "BackoffLimitExceeded", "{failed}");
    let pods: Vec<Value> =
        s.h.list(Kind::Pod, Some("fleet"))
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["job-name"] == "bo")
            .collect();
    let index = |p: &Value| p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"].clone();
    let other = pods.iter().find(|p| index(p) == "1").expect("the index-1 pod is kept");
    assert_eq!(other["status"]["phase"], "Failed", "{other}");
    assert!(other["metadata"]["deletionTimestamp"].is_string(), "{other}");
    assert_ne!(other["status"]["reason"], "DeadlineExceeded", "{other}");
    let t0 = Instant::now();
    while s.h.running_processes() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the failed Job's other pod was not stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_is_disrupted_deleted_and_counted() {
    let s = server().await;
    let policy = json!({"podFailurePolicy": {"rules": [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}});
    for (name, extra) in [("pfp", policy), ("plain", json!({"backoffLimit": 1}))] {
        // The pod ignores SIGTERM, so it stays, being deleted, for its 2 s
        // grace period: long enough to be read after the eviction on a
        // loaded host (a pod that ended on SIGTERM at once could be gone).
        let j = job(name, "trap '' TERM; echo up; sleep 60", extra);
        assert_eq!(s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await.0, 201);
    }
    for name in ["pfp", "plain"] {
        let p = until_pod(&s, name, "running", |p| p["status"]["phase"] == "Running").await;
        let pod = p["metadata"]["name"].as_str().unwrap().to_string();
        // Its shell ignores SIGTERM once it says so (a pod just Running
        // may not have run its `trap` yet on a loaded host).
        let url = format!("{}/api/v1/namespaces/fleet/pods/{pod}/log", s.h.url);
        let t0 = Instant::now();
        while !s.http.get(&url).bearer_auth("t-ns").send().await.unwrap().text().await.unwrap().contains("up\n") {
            assert!(t0.elapsed() < Duration::from_secs(20), "{pod} never said it was up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ev =
            json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": "fleet"}});
        let path = format!("/api/v1/namespaces/fleet/pods/{pod}/eviction");
        // Another pod's name in the body is refused.
        let mut bad = ev.clone();
        bad["metadata"]["name"] = json!("other");
        assert_eq!(s.call(Method::POST, &path, "t-ns", Some(bad)).await.0, 400);
        let (code, st) = s.call(Method::POST, &path, "t-ns", Some(ev)).await;
        assert_eq!((code, st["status"].as_str()), (201, Some("Success")), "{st}");
        let p = s.h.get(Kind::Pod, "fleet", &pod).expect("being deleted");
        assert!(p["metadata"]["deletionTimestamp"].is_string(), "{p}");
        let c: Vec<&Value> =
            p["status"]["conditions"].as_array().unwrap().iter().filter(|c| c["type"] == "DisruptionTarget").collect();
        assert_eq!((c[0]["reason"].as_str(), c[0]["status"].as_str()), (Some("EvictionByEvictionAPI"), Some("True")));
        let t0 = Instant::now();
        while s.h.get(Kind::Pod, "fleet", &pod).is_some() {
            assert!(t0.elapsed() < Duration::from_secs(10), "the evicted pod is not deleted");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if name == "pfp" {
            let j = until_job(&s, name, "Failed").await;
            let f =
                j["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Failed").unwrap().clone();
            assert_eq!(f["reason"], "PodFailurePolicy", "{j}");
            assert_eq!(
                f["message"],
                format!("Pod fleet/{pod} has condition DisruptionTarget matching FailJob rule at index 0"),
                "{j}"
            );
        } else {
            // Counted (1 of backoffLimit 1): a new pod runs.
            let p2 = until_pod(&s, name, "replacing it", |p| p["metadata"]["name"] != json!(pod)).await;
            assert!(s.h.get(Kind::Job, "fleet", name).unwrap()["status"]["failed"] == 1, "{p2}");
        }
    }
    // Cordoning: the namespaced token may not; the admin may, and the node takes no new pod.
    let cordon = json!({"spec": {"unschedulable": true}});
    assert_eq!(s.call(Method::PATCH, "/api/v1/nodes/n0", "t-ns", Some(cordon.clone())).await.0, 403);
    assert_eq!(s.call(Method::PATCH, "/api/v1/nodes/n0", "t-admin", Some(cordon)).await.0, 200);
    let j = job("late", "true", json!({}));
    s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(j)).await;
    let p = until_pod(&s, "late", "unschedulable", |p| p["status"]["conditions"][0]["reason"] == "Unschedulable").await;
    let msg = p["status"]["conditions"][0]["message"].as_str().unwrap();
    assert!(msg.starts_with("0/1 nodes are available: 1 node(s) were unschedulable."), "{msg}");
}

/// A ServiceAccount's token (a token Secret the server fills) is
/// authorized by RBAC objects: what its Role grants in the bound namespace,
/// nothing elsewhere; `SelfSubjectAccessReview` agrees; a token Secret for
/// no ServiceAccount is refused and a deleted ServiceAccount's token no
/// longer authenticates.
#[tokio::test]
async fn service_account_tokens_are_authorized_by_rbac_objects() {
    let s = server().await;
    let sr = &s;
    let admin = move |m: Method, p: &'static str, b: Value| async move { sr.call(m, p, "t-admin", Some(b)).await };
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}});
    assert_eq!(admin(Method::POST, "/api/v1/namespaces/fleet/serviceaccounts", sa).await.0, 201);
    let secret = |sa: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{sa}-token"),
               "annotations": {"kubernetes.io/service-account.name": sa}},
               "type": "kubernetes.io/service-account-token", "data": {"token": "Y2hvc2Vu"}})
    };
    assert_eq!(admin(Method::POST, "/api/v1/namespaces/fleet/secrets", secret("ghost")).await.0, 422);
    let (code, sec) = admin(Method::POST, "/api/v1/namespaces/fleet/secrets", secret("bot")).await;
    assert_eq!(code, 201, "{sec}");
    use base64::Engine as _;
    let tok = String::from_utf8(
        base64::engine::general_purpose::STANDARD.decode(sec["data"]["token"].as_str().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(tok.len(), 64, "a minted token, not the creator's: {tok}");
    // Authenticated, allowed nothing yet.
    assert_eq!(s.call(Method::GET, "/api/v1/namespaces/fleet/configmaps", &tok, None).await.0, 403);
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]});
    assert_eq!(admin(Method::POST, "/apis/rbac.authorization.k8s.io/v1/namespaces/fleet/roles", role).await.0, 201);
    let rb = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "bot"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "fleet"}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"}});
    assert_eq!(
        admin(Method::POST, "/apis/rbac.authorization.k8s.io/v1/namespaces/fleet/rolebindings", rb).await.0,
        201
    );
    assert_eq!(s.call(Method::GET, "/api/v1/namespaces/fleet/configmaps", &tok, None).await.0, 200);
    let (code, st) = s.call(Method::POST, "/api/v1/namespaces/fleet/configmaps", &tok, Some(cm("x"))).await;
    assert_eq!(code, 403, "{st}");
    assert!(st["message"].as_str().unwrap().contains("User \"system:serviceaccount:fleet:bot\" cannot create"), "{st}");
    assert_eq!(s.call(Method::GET, "/api/v1/namespaces/default/configmaps", &tok, None).await.0, 403);
    assert_eq!(s.call(Method::GET, "/api/v1/namespaces/fleet/secrets", &tok, None).await.0, 403);
    let review = |verb: &str, ns: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
               "spec": {"resourceAttributes": {"namespace": ns, "verb": verb, "group": "", "resource": "configmaps"}}})
    };
    for (verb, ns, want) in [("list", "fleet", true), ("delete", "fleet", false), ("list", "default", false)] {
        let (code, r) = s
            .call(Method::POST, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", &tok, Some(review(verb, ns)))
            .await;
        assert_eq!((code, r["status"]["allowed"].as_bool()), (201, Some(want)), "{verb} {ns}: {r}");
    }
    assert_eq!(s.call(Method::DELETE, "/api/v1/namespaces/fleet/serviceaccounts/bot", "t-admin", None).await.0, 200);
    assert_eq!(s.call(Method::GET, "/api/v1/namespaces/fleet/configmaps", &tok, None).await.0, 401);
}

/// A ResourceQuota refuses the Job controller a pod over it: no pod, a
/// `FailedCreate` Warning event on the Job with the API server's message
/// (found by a field selector, as the agent asks), the Job's `active` 0;
/// once the quota is gone the pod is created and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_quota_refuses_pods_over_it_with_a_failed_create_event() {
    let s = server().await;
    let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu"},
                       "spec": {"hard": {"requests.nvidia.com/gpu": "1", "pods": "5"}}});
    let (code, obj) = s.call(Method::POST, "/api/v1/namespaces/fleet/resourcequotas", "t-admin", Some(quota)).await;
    assert_eq!(code, 201, "{obj}");
    let gpu_job = |name: &str, gpus: &str| {
        let mut j = job(name, "sleep 30", json!({}));
        j["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": gpus}});
        j
    };
    // Within the quota: a pod (the request defaults to the limit).
    let (code, _) =
        s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(gpu_job("one", "1"))).await;
    assert_eq!(code, 201);
    let pods_of = |name: &str| {
        s.h.list(Kind::Pod, Some("fleet")).into_iter().filter(|p| p["metadata"]["labels"]["job-name"] == name).count()
    };
    let t0 = Instant::now();
    while pods_of("one") == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no pod for a job within the quota");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Over it: refused, and the Job controller says why.
    let (code, created) =
        s.call(Method::POST, "/apis/batch/v1/namespaces/fleet/jobs", "t-ns", Some(gpu_job("two", "1"))).await;
    assert_eq!(code, 201);
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let path =
        format!("/api/v1/namespaces/fleet/events?fieldSelector=involvedObject.uid%3D{uid}%2Creason%3DFailedCreate");
    let t0 = Instant::now();
    let ev = loop {
        let (code, list) = s.call(Method::GET, &path, "t-admin", None).await;
        assert_eq!(code, 200, "{list}");
        if let Some(e) = list["items"].as_array().and_then(|i| i.first()) {
            break e.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no FailedCreate event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((ev["type"].as_str(), ev["involvedObject"]["name"].as_str()), (Some("Warning"), Some("two")));
    let msg = ev["message"].as_str().unwrap();
    assert!(
        msg.starts_with("Error creating: pods \"two-")
            && msg.ends_with(
                "is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=1"
            ),
        "{msg}"
    );
    assert_eq!(pods_of("two"), 0);
    assert_eq!(s.h.get(Kind::Job, "fleet", "two").unwrap()["status"]["active"], 0);
    // Another Job's events are not selected.
    let (_, other) = s
        .call(Method::GET, "/api/v1/namespaces/fleet/events?fieldSelector=involvedObject.name%3Done", "t-admin", None)
        .await;
    assert_eq!(other["items"].as_array().map(Vec::len), Some(0), "{other}");
    // The quota is removed: the pod is created.
    let (code, _) = s.call(Method::DELETE, "/api/v1/namespaces/fleet/resourcequotas/gpu", "t-admin", None).await;
    assert_eq!(code, 200);
    let t0 = Instant::now();
    while pods_of("two") == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no pod once the quota is gone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
