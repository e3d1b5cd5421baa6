//! The Kubernetes backend against the test API server (`tests/kube-server`),
//! through the real client (kube-rs over HTTPS with a bearer token): submit,
//! watch, output, exit codes, cancel, gangs, MIG, failure reasons, RBAC;
//! and the real `kubectl` against the same server.

use std::path::Path;
use std::time::{Duration, Instant};

use fleet_agent::backend::{Backend, NativeJob};
use fleet_agent::identity::LocalUser;
use fleet_agent::kube::{job_name, KubeBackend, KubeSettings};
use fleet_api::job::{GpuRequest, GpuScope};
use fleet_api::{JobRequest, JobState};
use kube_server::store::Kind;

const NODES: &str = r#"
[[node]]
name = "h100-0"
labels = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3" }
capacity = { cpu = "64", memory = "512Gi", "nvidia.com/gpu" = "8" }
taints = ["nvidia.com/gpu=present:NoSchedule"]

[[node]]
name = "h100-1"
labels = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3" }
capacity = { cpu = "64", memory = "512Gi", "nvidia.com/gpu" = "8" }

[[node]]
name = "a100-mig-0"
labels = { "nvidia.com/gpu.product" = "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy" = "mixed" }
capacity = { cpu = "32", memory = "256Gi", "nvidia.com/mig-1g.10gb" = "7" }

[[token]]
token = "agent-token-7f3a"
user = "system:serviceaccount:fleet:fleet-agent"
namespaces = ["fleet"]
nodes = true

[[token]]
token = "agent-teams-5d1e"
user = "system:serviceaccount:fleet:fleet-agent"
namespaces = ["fleet", "team-ml"]
nodes = true

[[token]]
token = "admin-token-91c2"
user = "admin"
namespaces = ["*"]
nodes = true
"#;

struct Cluster {
    server: kube_server::Handle,
    backend: KubeBackend,
    dir: tempfile::TempDir,
}

async fn cluster_with(queue: Option<&str>) -> Cluster {
    cluster_as(queue, "agent-token-7f3a").await
}

/// A cluster whose agent holds `token` (the admin's may list pods everywhere).
async fn cluster_as(queue: Option<&str>, token: &str) -> Cluster {
    cluster_set(token, |s| s.queue = queue.map(str::to_string)).await
}

/// A cluster whose agent holds `token`, its settings changed by `f`.
async fn cluster_set(token: &str, f: impl FnOnce(&mut KubeSettings)) -> Cluster {
    cluster_server(token, f, |_| {}).await
}

/// As [`cluster_set`], the test server's configuration changed by `server`.
async fn cluster_server(
    token: &str,
    f: impl FnOnce(&mut KubeSettings),
    server: impl FnOnce(&mut kube_server::ServerConfig),
) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    // Containers run as their runAsUser (the server runs as root here): they must reach the work dir.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let file: kube_server::FileConf = toml::from_str(NODES).unwrap();
    let mut cfg = kube_server::ServerConfig::new(file, &dir.path().join("server"));
    cfg.tls = true;
    server(&mut cfg);
    let server = kube_server::start(cfg, 0).await.unwrap();
    let kc = dir.path().join("agent.kubeconfig");
    server.write_kubeconfig(&kc, token, "fleet").unwrap();
    let mut settings = KubeSettings {
        kubeconfig: Some(kc),
        namespace: "fleet".into(),
        image: "ubuntu:24.04".into(),
        queue: None,
        service_account: None,
        account_namespaces: Default::default(),
        helper_image: None,
    };
    f(&mut settings);
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(spool.join("jobs")).unwrap();
    let backend = KubeBackend::connect(settings, "gamma", spool).await.unwrap();
    Cluster { server, backend, dir }
}

async fn cluster() -> Cluster {
    cluster_with(None).await
}

fn user() -> LocalUser {
    LocalUser { name: "alice".into(), uid: 1001, gid: 1001, account: None, mapped_account: None, home: None }
}

fn request(script: &str, gpus: Option<(&str, u32)>, nodes: u32) -> JobRequest {
    JobRequest {
        origin: "beta".into(),
        user_id: 1001,
        name: Some("train".into()),
        min_nodes: Some(nodes),
        gpus: gpus
            .map(|(t, n)| GpuRequest { gpu_type: Some(t.into()), count: n, scope: GpuScope::Node })
            .into_iter()
            .collect(),
        script: Some(script.as_bytes().to_vec()),
        env: vec!["GREETING=hello from beta".into(), "SLURM_JOB_ID=origin-id".into()],
        ..Default::default()
    }
}

/// Polls `status` (as the agent's watch pass does) until `done` holds.
async fn until(c: &Cluster, id: u64, what: &str, done: impl Fn(&NativeJob) -> bool) -> NativeJob {
    let t0 = Instant::now();
    loop {
        let got = c.backend.status(&[id]).await.unwrap();
        if let Some(j) = got.into_iter().find(|j| j.native_id == id) {
            if done(&j) {
                return j;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "{what}: still {j:?}");
        } else {
            assert!(t0.elapsed() < Duration::from_secs(30), "{what}: job {id} not found");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn stdout(c: &Cluster, fleet_id: &str) -> String {
    std::fs::read_to_string(c.backend.output_paths(fleet_id).stdout).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_with_slurms_environment_and_its_exit_code_comes_back() {
    let c = cluster().await;
    let script = "#!/bin/bash\necho \"job $SLURM_JOB_ID tasks=$SLURM_NTASKS nodes=$SLURM_JOB_NUM_NODES procid=$SLURM_PROCID list=$SLURM_NODELIST\"\n\
                  echo \"greeting=$GREETING name=$SLURM_JOB_NAME submit=$SLURM_SUBMIT_HOST gpus=$SLURM_GPUS_ON_NODE pwd=$(basename $PWD)\"\n\
                  sleep 1\necho to-stderr >&2\nexit 3\n";
    let id = c.backend.submit("beta-1", &request(script, Some(("h100", 2)), 1), &user()).await.unwrap();
    let running = until(&c, id, "running", |j| j.state != JobState::Pending).await;
    assert_eq!(running.state, JobState::Running, "{running:?}");
    assert!(running.node_list.starts_with("h100-"), "{running:?}");
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!((end.state, end.raw_state.as_str(), end.exit_code), (JobState::Failed, "FAILED", Some(3)), "{end:?}");
    assert_eq!((end.user_id, end.native_id), (Some(1001), id));
    let out = stdout(&c, "beta-1");
    assert!(
        out.contains(&format!("job {id} tasks=1 nodes=1 procid=0 list={}-0", job_name(id))),
        "SLURM_* variables: {out:?}"
    );
    assert!(out.contains("greeting=hello from beta name=train submit=beta gpus=2 pwd=work"), "{out:?}");
    assert!(out.contains("to-stderr"), "{out:?}");
    // Its objects are labelled and owned by the Job.
    let cm = c.server.get(Kind::ConfigMap, "fleet", &format!("{}-script", job_name(id))).unwrap();
    assert_eq!(cm["metadata"]["labels"]["app.kubernetes.io/managed-by"], "fleet");
    assert_eq!(cm["metadata"]["labels"]["fleet.io/job-id"], "beta-1");
    assert_eq!(cm["metadata"]["ownerReferences"][0]["kind"], "Job");
    let secret = c.server.get(Kind::Secret, "fleet", &format!("{}-env", job_name(id))).unwrap();
    assert!(secret["data"]["GREETING"].is_string() && secret["data"]["SLURM_JOB_ID"].is_null(), "{secret}");

    // A job that succeeds.
    let id = c.backend.submit("beta-2", &request("echo fine\n", None, 1), &user()).await.unwrap();
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!((end.state, end.exit_code), (JobState::Completed, Some(0)), "{end:?}");
    assert_eq!(stdout(&c, "beta-2"), "fine\n");
}

/// The Job watch and the Pod watch are two streams: when the pods' lags
/// (here by 1.5 s, as under load), the Job's Failed condition arrives
/// before its pod's end. The exit code is still the pod's, and the whole
/// output is there when the end is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exit_code_and_output_are_the_pods_when_the_pod_watch_lags() {
    let c = cluster_server("agent-token-7f3a", |_| {}, |cfg| cfg.pod_watch_delay = Duration::from_millis(1500)).await;
    let script = "#!/bin/bash\nfor i in 1 2 3; do echo line $i; done\nsleep 0.5\necho last\nexit 3\n";
    let id = c.backend.submit("beta-1", &request(script, None, 1), &user()).await.unwrap();
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!((end.state, end.raw_state.as_str(), end.exit_code), (JobState::Failed, "FAILED", Some(3)), "{end:?}");
    assert_eq!(stdout(&c, "beta-1"), "line 1\nline 2\nline 3\nlast\n");
    let id = c.backend.submit("beta-2", &request("echo fine\n", None, 1), &user()).await.unwrap();
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!((end.state, end.exit_code), (JobState::Completed, Some(0)), "{end:?}");
    assert_eq!(stdout(&c, "beta-2"), "fine\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_relays_each_line_once() {
    let c = cluster().await;
    let script = "for i in $(seq 1 40); do echo line $i; sleep 0.05; done\n";
    let id = c.backend.submit("beta-20", &request(script, None, 1), &user()).await.unwrap();
    let t0 = Instant::now();
    while stdout(&c, "beta-20").lines().count() < 5 {
        c.backend.status(&[id]).await.unwrap();
        assert!(t0.elapsed() < Duration::from_secs(30), "no output yet");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The agent stops mid-job; another takes over the same spool.
    let Cluster { server, backend, dir } = c;
    let settings = backend.settings.clone();
    let spool = backend.spool.clone();
    drop(backend);
    let backend = KubeBackend::connect(settings, "gamma", spool).await.unwrap();
    let c = Cluster { server, backend, dir };
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!(end.state, JobState::Completed);
    let want: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    assert_eq!(stdout(&c, "beta-20"), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_recovers_from_410_gone() {
    let c = cluster().await;
    let req = request("echo x\n", Some(("b200", 1)), 1);
    c.backend.submit("beta-30", &req, &user()).await.unwrap();
    let t0 = Instant::now();
    while c.backend.watch_lags().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the first Job never reached the watch");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server forgets its history and drops the watches: resuming from
    // the last resourceVersion is 410 Gone, and the watcher must list again.
    c.server.compact();
    let id = c.backend.submit("beta-31", &req, &user()).await.unwrap();
    let t0 = Instant::now();
    while c.backend.watch_lags().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the watch did not recover after 410 Gone");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let j = c.backend.status(&[id]).await.unwrap();
    assert_eq!(j.len(), 1);
    assert!(c.server.state.gone.load(std::sync::atomic::Ordering::Relaxed) >= 1, "no watch was answered 410 Gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_deletes_the_job_and_its_pods_within_5_s() {
    let c = cluster().await;
    let id = c.backend.submit("beta-3", &request("echo started\nsleep 120\n", None, 1), &user()).await.unwrap();
    until(&c, id, "running", |j| j.state == JobState::Running).await;
    // The pod is Running in the API a moment before its process is tracked.
    let t0 = Instant::now();
    while c.server.running_processes() != 1 {
        assert!(t0.elapsed() < Duration::from_secs(5), "{} processes", c.server.running_processes());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t0 = Instant::now();
    c.backend.cancel(id, "alice").await.unwrap();
    let name = job_name(id);
    while c.server.get(Kind::Job, "fleet", &name).is_some()
        || !c.server.list(Kind::Pod, Some("fleet")).is_empty()
        || c.server.running_processes() > 0
    {
        assert!(t0.elapsed() < Duration::from_secs(5), "Job, pods or processes still there after 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Background propagation removed its dependents too.
    assert!(c.server.get(Kind::ConfigMap, "fleet", &format!("{name}-script")).is_none());
    assert!(c.backend.status(&[id]).await.unwrap().is_empty());
    let acct = c.backend.accounting(&[id]).await.unwrap();
    assert_eq!(acct.len(), 1);
    assert_eq!((acct[0].state, acct[0].raw_state.as_str()), (JobState::Cancelled, "CANCELLED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_job_runs_as_an_indexed_gang() {
    let c = cluster().await;
    let script = "echo \"rank $SLURM_PROCID of $SLURM_NTASKS on $HOSTNAME master=$MASTER_ADDR\"\n";
    let id = c.backend.submit("beta-4", &request(script, Some(("h100", 8)), 2), &user()).await.unwrap();
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!((end.state, end.exit_code), (JobState::Completed, Some(0)), "{end:?}");
    assert_eq!(end.node_list, "h100-0,h100-1", "one pod per node");
    let name = job_name(id);
    let out = stdout(&c, "beta-4");
    for rank in 0..2 {
        assert!(out.contains(&format!("rank {rank} of 2 on {name}-{rank} master={name}-0.{name}")), "{out:?}");
    }
    let job = c.server.get(Kind::Job, "fleet", &name).unwrap();
    assert_eq!(job["spec"]["completionMode"], "Indexed");
    let svc = c.server.get(Kind::Service, "fleet", &name).unwrap();
    assert_eq!(svc["spec"]["clusterIP"], "None");

    // A gang that does not fit whole does not start in part: 3 × 8 GPUs on two 8-GPU nodes.
    let id = c.backend.submit("beta-5", &request(script, Some(("h100", 8)), 3), &user()).await.unwrap();
    let j = until(&c, id, "unschedulable", |j| j.reason.starts_with("Unschedulable")).await;
    assert_eq!(j.state, JobState::Pending);
    assert!(c.server.list(Kind::Pod, Some("fleet")).iter().all(|p| p["spec"]["nodeName"].is_null()
        || p["metadata"]["labels"]["batch.kubernetes.io/job-name"] != job_name(id).as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_request_lands_on_the_mig_node() {
    let c = cluster().await;
    let id = c.backend.submit("beta-6", &request("echo mig\n", Some(("1g.10gb", 1)), 1), &user()).await.unwrap();
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!((end.state, end.node_list.as_str()), (JobState::Completed, "a100-mig-0"), "{end:?}");
    let nodes = c.backend.capacity().await.unwrap().nodes;
    let mig = nodes.iter().find(|n| n.name == "a100-mig-0").unwrap();
    assert_eq!((mig.gpu_type.as_deref(), mig.gpus_total), (Some("1g.10gb"), 7));
    let h = nodes.iter().find(|n| n.name == "h100-0").unwrap();
    assert_eq!((h.gpu_type.as_deref(), h.gpus_total, h.gpus_free), (Some("h100"), 8, 8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_subtracts_running_pods() {
    let c = cluster().await;
    let id = c.backend.submit("beta-7", &request("sleep 30\n", Some(("h100", 6)), 1), &user()).await.unwrap();
    let j = until(&c, id, "running", |j| j.state == JobState::Running).await;
    let cap = c.backend.capacity().await.unwrap();
    let n = cap.nodes.iter().find(|n| n.name == j.node_list).unwrap();
    assert_eq!((n.gpus_total, n.gpus_free, n.state.as_str()), (8, 2, "mixed"));
    assert_eq!((cap.pending, cap.running), (0, 1));
    // The run it names as holding them is this job.
    assert_eq!(cap.holding, vec![id]);
    c.backend.cancel(id, "alice").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pull_failures_and_unschedulable_pods_come_back_with_their_reason() {
    let c = cluster().await;
    let script = "#!/bin/bash\n#FLEET image=nonexistent/trainer:1\necho never\n";
    let id = c.backend.submit("beta-8", &request(script, None, 1), &user()).await.unwrap();
    let end = until(&c, id, "image pull", |j| j.state.is_terminal()).await;
    assert_eq!(end.state, JobState::Failed);
    assert!(end.reason.starts_with("ErrImagePull") || end.reason.starts_with("ImagePullBackOff"), "{end:?}");
    assert!(end.reason.contains("nonexistent/trainer:1"), "{end:?}");
    // Kubernetes would retry the pull forever: the backend deleted it.
    let t0 = Instant::now();
    while c.server.get(Kind::Job, "fleet", &job_name(id)).is_some() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let id = c.backend.submit("beta-9", &request("echo x\n", Some(("h100", 16)), 1), &user()).await.unwrap();
    let j = until(&c, id, "unschedulable", |j| !j.reason.is_empty()).await;
    assert_eq!(j.state, JobState::Pending);
    assert!(j.reason.starts_with("Unschedulable: 0/3 nodes are available:"), "{j:?}");
    assert!(j.reason.contains("Insufficient nvidia.com/gpu"), "{j:?}");

    // A GPU type no node has.
    let id = c.backend.submit("beta-10", &request("echo x\n", Some(("b200", 1)), 1), &user()).await.unwrap();
    let j = until(&c, id, "unschedulable", |j| !j.reason.is_empty()).await;
    assert!(j.reason.contains("didn't match Pod's node affinity/selector"), "{j:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_queue_jobs_wait_suspended_for_admission() {
    let c = cluster_with(Some("gpu-queue")).await;
    let id = c.backend.submit("beta-11", &request("echo admitted\n", Some(("h100", 1)), 1), &user()).await.unwrap();
    let job = c.server.get(Kind::Job, "fleet", &job_name(id)).unwrap();
    assert_eq!(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "gpu-queue");
    // The test server's stand-in for Kueue admits it once it fits.
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!(end.state, JobState::Completed);
    let id = c.backend.submit("beta-12", &request("echo x\n", Some(("b200", 1)), 1), &user()).await.unwrap();
    let j = until(&c, id, "suspended", |j| j.reason.starts_with("Suspended")).await;
    assert_eq!(
        (j.state, j.reason.as_str()),
        (JobState::Pending, "Suspended: waiting for admission by Kueue (queue gpu-queue)")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_token_is_forbidden_outside_its_namespace() {
    let c = cluster().await;
    let kc = kube::config::Kubeconfig::read_from(c.dir.path().join("agent.kubeconfig")).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let other: kube::Api<k8s_openapi::api::batch::v1::Job> = kube::Api::namespaced(client.clone(), "kube-system");
    match other.list(&Default::default()).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
            assert!(
                s.message
                    .contains("cannot list resource \"jobs\" in API group \"batch\" in the namespace \"kube-system\""),
                "{}",
                s.message
            );
        }
        other => panic!("expected 403, got {other:?}"),
    }
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::all(client.clone());
    assert!(matches!(secrets.list(&Default::default()).await, Err(kube::Error::Api(s)) if s.code == 403));
    // Its own namespace is fine.
    let mine: kube::Api<k8s_openapi::api::batch::v1::Job> = kube::Api::namespaced(client, "fleet");
    assert!(mine.list(&Default::default()).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_check_reports_capacity_or_what_is_wrong() {
    let c = cluster().await;
    let kc = c.dir.path().join("agent.kubeconfig");
    let settings = |ns: &str, kc: &Path| KubeSettings {
        kubeconfig: Some(kc.to_path_buf()),
        namespace: ns.into(),
        image: "ubuntu:24.04".into(),
        queue: None,
        service_account: None,
        account_namespaces: Default::default(),
        helper_image: None,
    };
    let spool = c.dir.path().join("spool");
    let ok = fleet_agent::kube::check(&settings("fleet", &kc), "gamma", spool.clone()).await.unwrap();
    assert!(ok.starts_with("namespace fleet: 3 nodes, GPUs 7×1g.10gb, 16×h100;"), "{ok}");
    // Another namespace: refused at once, in the API server's words.
    let (why, hint) =
        fleet_agent::kube::check(&settings("kube-system", &kc), "gamma", spool.clone()).await.unwrap_err();
    assert!(why.contains("may not list Jobs in namespace kube-system") && why.contains("forbidden"), "{why}");
    assert!(hint.contains("ServiceAccount"), "{hint}");
    // A kubeconfig others can read.
    let open = c.dir.path().join("open.kubeconfig");
    std::fs::copy(&kc, &open).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let (why, hint) = fleet_agent::kube::check(&settings("fleet", &open), "gamma", spool).await.unwrap_err();
    assert!(why.contains("has mode 644"), "{why}");
    assert_eq!(hint, format!("chmod 0600 {}", open.display()));
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap())
        .args(args)
        .output()
        .expect("kubectl is installed (/usr/bin/kubectl)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_and_deletes_the_agents_jobs() {
    let c = cluster().await;
    let kc = c.dir.path().join("admin.kubeconfig");
    c.server.write_kubeconfig(&kc, "admin-token-91c2", "fleet").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&kc).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let id = c
        .backend
        .submit("beta-13", &request("echo from-the-pod\nexit 3\n", Some(("h100", 1)), 1), &user())
        .await
        .unwrap();
    until(&c, id, "finished", |j| j.state.is_terminal()).await;
    let name = job_name(id);
    let kc2 = kc.clone();
    let (ok, out) = tokio::task::spawn_blocking(move || kubectl(&kc2, &["get", "nodes,jobs,pods"])).await.unwrap();
    assert!(ok, "{out}");
    for want in [
        "node/h100-0",
        "node/a100-mig-0",
        "Ready",
        &format!("job.batch/{name}"),
        "Failed",
        "0/1",
        &format!("pod/{name}-"),
        "Error",
    ] {
        assert!(out.contains(want), "kubectl get: no {want:?} in\n{out}");
    }
    let (kc2, n2) = (kc.clone(), name.clone());
    let (ok, out) = tokio::task::spawn_blocking(move || kubectl(&kc2, &["logs", &format!("job/{n2}")])).await.unwrap();
    assert!(ok && out.contains("from-the-pod"), "kubectl logs:\n{out}");
    let (kc2, n2) = (kc.clone(), name.clone());
    let (ok, out) = tokio::task::spawn_blocking(move || kubectl(&kc2, &["describe", "job", &n2])).await.unwrap();
    assert!(ok, "{out}");
    // Column widths follow the longest key: compare with single spaces.
    let out = out.split_whitespace().collect::<Vec<_>>().join(" ");
    for want in [
        format!("Name: {name}"),
        "Namespace: fleet".to_string(),
        "app.kubernetes.io/managed-by=fleet".to_string(),
        "Pods Statuses: 0 Active (0 Ready) / 0 Succeeded / 1 Failed".to_string(),
        "nvidia.com/gpu: 1".to_string(),
        "Command: /bin/bash /fleet/job/entry".to_string(),
    ] {
        assert!(out.contains(&want), "kubectl describe: no {want:?} in\n{out}");
    }
    let (kc2, n2) = (kc.clone(), name.clone());
    let (ok, out) = tokio::task::spawn_blocking(move || kubectl(&kc2, &["delete", "job", &n2])).await.unwrap();
    assert!(ok && out.contains(&format!("job.batch \"{name}\" deleted")), "kubectl delete:\n{out}");
    assert!(c.server.get(Kind::Job, "fleet", &name).is_none());
    assert!(c.server.list(Kind::Pod, Some("fleet")).is_empty(), "kubectl's default (background) removes the pods");
    // The agent's token cannot see another namespace through kubectl either.
    let akc = c.dir.path().join("agent.kubeconfig");
    let (ok, out) =
        tokio::task::spawn_blocking(move || kubectl(&akc, &["get", "pods", "-n", "kube-system"])).await.unwrap();
    assert!(
        !ok && out
            .contains("forbidden: User \"system:serviceaccount:fleet:fleet-agent\" cannot list resource \"pods\""),
        "{out}"
    );
}

/// Throughput: 1,000 Jobs created through the backend (16 in flight) and
/// seen by its watch. Prints the creation rate and the watch lag; asserts
/// only that every Job was created and seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_1000_jobs_created_and_watched() {
    use futures::StreamExt;
    // A queue whose Jobs cannot be admitted (a GPU type no node has): the
    // figure is the API path, not 1,000 bash processes on this machine.
    let c = cluster_with(Some("bench")).await;
    let req = request("echo x\n", Some(("b200", 1)), 1);
    let n = 1000;
    let t0 = Instant::now();
    let ids: Vec<u64> = futures::stream::iter(0..n)
        .map(|i| {
            let (b, req) = (&c.backend, &req);
            async move { b.submit(&format!("bench-{i}"), req, &user()).await.unwrap() }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let created = t0.elapsed();
    let mut lags = Vec::new();
    while lags.len() < n {
        lags.extend(c.backend.watch_lags());
        assert!(t0.elapsed() < Duration::from_secs(600), "only {} of {n} Jobs seen by the watch", lags.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = t0.elapsed();
    lags.sort();
    let pct = |p: f64| lags[((lags.len() as f64 * p) as usize).min(lags.len() - 1)];
    println!(
        "kube throughput: {n} Jobs created in {:.2} s ({:.0} Jobs/s, 16 in flight); all seen by the watch after {:.2} s; watch lag p50 {:?} p99 {:?} max {:?}",
        created.as_secs_f64(),
        n as f64 / created.as_secs_f64(),
        all.as_secs_f64(),
        pct(0.5),
        pct(0.99),
        lags[lags.len() - 1]
    );
    let mut uniq = ids.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), n);
    assert_eq!(c.server.list(Kind::Job, Some("fleet")).len(), n);
    let st = c.backend.status(&ids[..10]).await.unwrap();
    assert!(st.iter().all(|j| j.state == JobState::Pending && j.reason.starts_with("Suspended")), "{st:?}");
}

fn now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_submitted_adopts_the_whole_job_and_deletes_a_half_made_one() {
    use ::kube::api::{Api, PostParams};
    use fleet_agent::kube::{translate, Translate};
    use k8s_openapi::api::batch::v1::Job;
    let c = cluster().await;
    let since = now_s() - 1.0;
    // A whole submission whose answer the agent never journaled (it died).
    let id = c.backend.submit("beta-40", &request("sleep 5\n", None, 1), &user()).await.unwrap();
    let found = c.backend.find_submitted("beta-40", 1001, since).await.unwrap();
    assert_eq!(found.iter().map(|j| j.native_id).collect::<Vec<_>>(), vec![id], "{found:?}");
    assert_eq!(found[0].user_id, Some(1001));
    // Not as another user, not before `since`.
    assert!(c.backend.find_submitted("beta-40", 1002, since).await.unwrap().is_empty());
    assert!(c.backend.find_submitted("beta-40", 1001, now_s() + 3600.0).await.unwrap().is_empty());
    // Two fleet ids with the same label value: the annotation tells them apart.
    let other = c.backend.submit("beta_41", &request("true\n", None, 1), &user()).await.unwrap();
    assert!(c.backend.find_submitted("beta 41", 1001, since).await.unwrap().is_empty());
    assert_eq!(c.backend.find_submitted("beta_41", 1001, since).await.unwrap()[0].native_id, other);

    // A Job created but never completed (no ConfigMap, never released):
    // deleted, not adopted, so that the retry submits a whole one.
    let u = user();
    let t = Translate {
        site: "gamma",
        fleet_id: "beta-42",
        native_id: 4242,
        user: &u,
        settings: &c.backend.settings,
        products: &[],
        groups: &[],
        ckpt: None,
        lease: None,
    };
    let objects = translate(&t, &request("echo never\n", None, 1)).unwrap();
    Api::<Job>::namespaced(c.backend.client.clone(), "fleet")
        .create(&PostParams::default(), &objects.job)
        .await
        .unwrap();
    assert!(c.server.get(Kind::Job, "fleet", "fleet-4242").is_some());
    assert!(c.backend.find_submitted("beta-42", 1001, since).await.unwrap().is_empty());
    let t0 = Instant::now();
    while c.server.get(Kind::Job, "fleet", "fleet-4242").is_some() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the half-made Job is still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The adopted one runs on as if its answer had been journaled.
    let end = until(&c, id, "finished", |j| j.state.is_terminal()).await;
    assert_eq!(end.state, JobState::Completed, "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_before_an_agent_restart_is_reported_cancelled() {
    let c = cluster().await;
    let id = c.backend.submit("beta-43", &request("echo started\nsleep 120\n", None, 1), &user()).await.unwrap();
    let running = until(&c, id, "running", |j| j.state == JobState::Running).await;
    c.backend.cancel(id, "alice").await.unwrap();
    // The record names the job's owner: the agent's alone.
    {
        use std::os::unix::fs::PermissionsExt;
        let records = c.backend.spool.join("kube-cancelled");
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&records), mode(&records.join(id.to_string()))), (0o700, 0o600));
    }
    // The agent is replaced before its tracker reported the cancel.
    let Cluster { server, backend, dir } = c;
    let (settings, spool) = (backend.settings.clone(), backend.spool.clone());
    drop(backend);
    let backend = KubeBackend::connect(settings, "gamma", spool).await.unwrap();
    let c = Cluster { server, backend, dir };
    let t0 = Instant::now();
    while c.server.get(Kind::Job, "fleet", &job_name(id)).is_some() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the Job was not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Kubernetes no longer has the Job; accounting says what became of it,
    // with the identity the tracker checks (owner, submit time), not `lost`.
    assert!(c.backend.status(&[id]).await.unwrap().is_empty());
    let acct = c.backend.accounting(&[id]).await.unwrap();
    assert_eq!(acct.len(), 1, "{acct:?}");
    let a = &acct[0];
    assert_eq!((a.state, a.raw_state.as_str(), a.exit_code), (JobState::Cancelled, "CANCELLED", None), "{a:?}");
    assert_eq!((a.native_id, a.user_id, a.submit_time), (id, Some(1001), running.submit_time), "{a:?}");
    // A job this agent never cancelled has no such record.
    assert!(c.backend.accounting(&[id + 1]).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_watches_every_namespaces_pods_instead_of_listing_them() {
    use ::kube::api::{Api, PostParams};
    use k8s_openapi::api::core::v1::Pod;
    // An agent whose RBAC may list pods in every namespace.
    let c = cluster_as(None, "admin-token-91c2").await;
    let lists = || c.server.state.pod_lists.load(std::sync::atomic::Ordering::Relaxed);
    let at_start = lists();
    let free = |nodes: &[fleet_api::api::NodeCapacity]| -> u32 {
        nodes.iter().filter(|n| n.gpu_type.as_deref() == Some("h100")).map(|n| n.gpus_free).sum()
    };
    assert_eq!(free(&c.backend.capacity().await.unwrap().nodes), 16);
    // Another tenant's pod, outside Fleet's namespace, holds 3 GPUs for a while.
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "someone-else", "namespace": "research"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox",
            "command": ["/bin/bash", "-c", "sleep 2"], "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(c.backend.client.clone(), "research").create(&PostParams::default(), &pod).await.unwrap();
    let t0 = Instant::now();
    while free(&c.backend.capacity().await.unwrap().nodes) != 13 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the other tenant's pod never counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Once it finished it leaves the watched selection and frees its GPUs.
    while free(&c.backend.capacity().await.unwrap().nodes) != 16 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the finished pod still holds GPUs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        c.server.get(Kind::Pod, "research", "someone-else").unwrap()["status"]["phase"],
        "Succeeded",
        "the pod itself stays, finished"
    );
    // Hundreds of heartbeats later, not one list of pods was made.
    for _ in 0..200 {
        c.backend.capacity().await.unwrap();
    }
    assert_eq!(lists(), at_start, "capacity() lists pods instead of reading the watch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_in_their_accounts_namespace_and_the_agent_may_use_no_other() {
    let c = cluster_set("agent-teams-5d1e", |s| {
        s.account_namespaces = [("ml".to_string(), "team-ml".to_string())].into();
    })
    .await;
    // Charged to account ml (as the identity map says): namespace team-ml.
    let ml = LocalUser { account: Some("ML".into()), mapped_account: Some("ML".into()), ..user() };
    let a =
        c.backend.submit("beta-50", &request("echo in $SLURM_JOB_PARTITION\nsleep 60\n", None, 1), &ml).await.unwrap();
    // Charged to another account: the default namespace.
    let b = c.backend.submit("beta-51", &request("echo in $SLURM_JOB_PARTITION\n", None, 1), &user()).await.unwrap();
    assert!(c.server.get(Kind::Job, "team-ml", &job_name(a)).is_some());
    assert!(c.server.get(Kind::Job, "fleet", &job_name(b)).is_some());
    assert!(c.server.get(Kind::ConfigMap, "team-ml", &format!("{}-script", job_name(a))).is_some());
    until(&c, a, "running", |j| j.state == JobState::Running).await;
    let end = until(&c, b, "finished", |j| j.state.is_terminal()).await;
    assert_eq!(end.state, JobState::Completed);
    assert_eq!(stdout(&c, "beta-51"), "in fleet\n");
    let t0 = Instant::now();
    while !stdout(&c, "beta-50").contains("in team-ml") {
        c.backend.status(&[a]).await.unwrap();
        assert!(t0.elapsed() < Duration::from_secs(10), "no log from team-ml: {:?}", stdout(&c, "beta-50"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let running = c.backend.capacity().await.unwrap().running;
    assert_eq!(running, 1, "the team-ml job counts in the queue");
    // Crash-window adoption and cancel find it in its namespace.
    assert_eq!(c.backend.find_submitted("beta-50", 1001, now_s() - 60.0).await.unwrap()[0].native_id, a);
    c.backend.cancel(a, "alice").await.unwrap();
    let t0 = Instant::now();
    while c.server.get(Kind::Job, "team-ml", &job_name(a)).is_some() {
        assert!(t0.elapsed() < Duration::from_secs(5), "not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its RBAC ends at those namespaces: another is forbidden, and an agent
    // configured for a namespace its token does not cover refuses to start.
    use ::kube::api::{Api, ListParams};
    use k8s_openapi::api::batch::v1::Job;
    let e = Api::<Job>::namespaced(c.backend.client.clone(), "team-cv").list(&ListParams::default()).await.unwrap_err();
    assert!(matches!(&e, ::kube::Error::Api(s) if s.code == 403), "{e}");
    let kc = c.backend.settings.kubeconfig.clone();
    let mut bad = c.backend.settings.clone();
    bad.account_namespaces.insert("cv".into(), "team-cv".into());
    assert_eq!(bad.namespaces(), vec!["fleet", "team-cv", "team-ml"]);
    let err = KubeBackend::connect(bad, "gamma", c.dir.path().join("spool2")).await.err().expect("refused");
    assert!(format!("{err:#}").contains("may not list Jobs in namespace team-cv"), "{err:#} ({kc:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_as_the_mapped_user_and_read_only_their_own_checkpoint_token() {
    use std::os::unix::fs::PermissionsExt;
    let mut c = cluster().await;
    c.backend.ckpt = fleet_agent::ckpt::JobCkpt {
        metasched_url: "https://ms.example:8443".into(),
        ca_file: None,
        cluster_token: "gamma-cluster-token".into(),
        stores: None,
        user_stores: None,
        // Pods run without the in-job lease (no fleet-ckpt in the image).
        job_lease: None,
        helper: Default::default(),
    };
    // A file of bob's, private to him.
    let secret = c.dir.path().join("bobs-notes");
    std::fs::write(&secret, "bob's secret\n").unwrap();
    std::os::unix::fs::chown(&secret, Some(1002), Some(1002)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let script = format!(
        "echo \"uid=$(id -u) gid=$(id -g) groups=$(id -G)\"\n\
         echo \"token=$(cat \"$FLEET_CKPT_TOKEN_FILE\")\"\n\
         echo \"path=$FLEET_CKPT_TOKEN_FILE\"\n\
         (echo x >\"$FLEET_CKPT_TOKEN_FILE\") 2>/dev/null && echo token-written || echo token-read-only\n\
         cat {} 2>/dev/null || echo bob-file-denied\n\
         sleep 3\n",
        secret.display()
    );
    let alice = user();
    let id = c.backend.submit("beta-60", &request(&script, None, 1), &alice).await.unwrap();
    // Nothing secret in the Job: the token is in its own Secret, mounted read-only.
    let job = c.server.get(Kind::Job, "fleet", &job_name(id)).unwrap();
    let token = fleet_api::auth::ckpt_token("gamma-cluster-token", "beta-60");
    assert!(!job.to_string().contains(&token), "the token is in the Job's spec: {job}");
    let sc = &job["spec"]["template"]["spec"]["securityContext"];
    assert_eq!((sc["runAsUser"].as_u64(), sc["runAsNonRoot"].as_bool()), (Some(1001), Some(true)), "{sc}");
    assert!(c.server.get(Kind::Secret, "fleet", &format!("{}-ckpt", job_name(id))).is_some());
    let t0 = Instant::now();
    while !stdout(&c, "beta-60").contains("bob-file-denied") && !stdout(&c, "beta-60").contains("secret") {
        c.backend.status(&[id]).await.unwrap();
        assert!(t0.elapsed() < Duration::from_secs(20), "no output: {:?}", stdout(&c, "beta-60"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = stdout(&c, "beta-60");
    assert!(out.starts_with("uid=1001 gid=1001 groups="), "the pod's process ran as the mapped user: {out}");
    assert!(out.contains(&format!("token={token}\n")), "it reads its checkpoint token: {out}");
    assert!(out.contains("token-read-only\n"), "the token is mounted read-only: {out}");
    assert!(out.contains("bob-file-denied\n") && !out.contains("bob's secret"), "it cannot read bob's file: {out}");

    // Another user's pod (bob, 1002) cannot read alice's token.
    let path = out.lines().find_map(|l| l.strip_prefix("path=")).unwrap().to_string();
    assert!(Path::new(&path).exists(), "{path}");
    let bob = LocalUser { name: "bob".into(), uid: 1002, gid: 1002, account: None, mapped_account: None, home: None };
    let snoop = format!("id -u\ncat {path} 2>/dev/null && echo READ || echo denied\n");
    let b = c.backend.submit("beta-61", &request(&snoop, None, 1), &bob).await.unwrap();
    let end = until(&c, b, "finished", |j| j.state.is_terminal()).await;
    assert_eq!(end.state, JobState::Completed, "{end:?}");
    assert_eq!(stdout(&c, "beta-61"), "1002\ndenied\n");
    until(&c, id, "finished", |j| j.state.is_terminal()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_would_run_as_root_never_starts() {
    let c = cluster().await;
    let root = LocalUser { name: "root".into(), uid: 0, gid: 0, account: None, mapped_account: None, home: None };
    let id = c.backend.submit("beta-62", &request("echo ran-as-root\n", None, 1), &root).await.unwrap();
    let j = until(&c, id, "refused", |j| !j.reason.is_empty()).await;
    assert_eq!(j.state, JobState::Pending, "{j:?}");
    assert!(j.reason.contains("CreateContainerConfigError") && j.reason.contains("non-root"), "{j:?}");
    assert_eq!(stdout(&c, "beta-62"), "");
}

/// Early placement (docs/failover.md, "Start latency"): a Kubernetes
/// target takes a job placed before its origin confirmed the stand-in only
/// when its pods run under their job lease (whose `lease-exec` holds the
/// script while the first lease answers "wait"); otherwise such a job is
/// refused, and nothing of it is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_placed_early_comes_only_where_pods_run_under_their_lease() {
    use fleet_agent::backend::Backend as _;
    let mut c = cluster().await;
    assert!(!c.backend.start_gate(), "no helper image, no lease: no early placement here");
    let mut r = request("echo early\n", None, 1);
    r.fleet.start_gated = true;
    let err = c.backend.submit("beta-70", &r, &user()).await.expect_err("refused");
    assert!(format!("{err:#}").contains("job beta-70 was placed early and must start under its job lease"), "{err:#}");
    assert!(c.server.list(Kind::Job, Some("fleet")).is_empty(), "nothing of it was created");
    // A site whose pods run under their lease: the helper image, a lease,
    // a meta-scheduler and this cluster's token.
    c.backend.settings.helper_image = Some("registry.example.org/fleet/fleet-ckpt:1".into());
    c.backend.ckpt = fleet_agent::ckpt::JobCkpt {
        metasched_url: "https://ms.example:8443".into(),
        ca_file: None,
        cluster_token: "gamma-cluster-token".into(),
        stores: None,
        user_stores: None,
        job_lease: Some(Duration::from_secs(8)),
        helper: "/usr/bin/fleet-ckpt".into(),
    };
    assert!(c.backend.start_gate());
    let offs: [fn(&mut fleet_agent::ckpt::JobCkpt); 3] =
        [|k| k.job_lease = None, |k| k.cluster_token.clear(), |k| k.metasched_url.clear()];
    for off in offs {
        let keep = c.backend.ckpt.clone();
        off(&mut c.backend.ckpt);
        assert!(!c.backend.start_gate(), "{:?}", c.backend.ckpt);
        c.backend.ckpt = keep;
    }
    let id = c.backend.submit("beta-71", &r, &user()).await.unwrap();
    let job = c.server.get(Kind::Job, "fleet", &job_name(id)).unwrap();
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["command"][1], "lease-exec", "its script waits for its first lease: {pod}");
}
