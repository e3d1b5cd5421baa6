//! End-to-end tests of the Kubernetes target: jobs submitted with plain
//! `sbatch` at beta (real Slurm, our plugins) that the meta-scheduler places
//! on kube-gamma, the lab's Kubernetes cluster (tests/kube-server, a test
//! double of the API server, with an agent of `Backend=kubernetes`), seen
//! at beta as any forwarded job, and in Kubernetes through the real `kubectl`.
//!
//! Also: pods run as the submitter's mapped user (the lab's kube-server
//! runs as root and setuids each pod's process) in their account's
//! namespace, and the agent's token is forbidden elsewhere; a job that
//! checkpoints at kube-gamma (token from a read-only Secret, the region's
//! own store) resumes at alpha when kube-gamma's agent dies, and the agent,
//! back, deletes the stale Job; a pod whose agent died stops itself by its
//! in-job lease before its job moves (never two running copies).
//!
//! The lab must have kube-gamma (`FLEET_LAB_KUBE=1`, what `make test` and
//! the harness use): without it these tests fail, they do not skip.

use std::time::{Duration, Instant};

use fleet_lab::{copies, fleet_job_of, fleet_record, out_arg, remote_of, script, wait_file, Lab, KUBE, KUBE_NAMESPACE};

const T: Duration = Duration::from_secs(90);

/// `kubectl get job <name> -o json` at kube-gamma, parsed; `None` when the
/// Job does not exist (NotFound).
fn kube_job(lab: &Lab, name: &str) -> Option<serde_json::Value> {
    let (ok, out, err) = lab.kubectl(&["get", "job", name, "-n", KUBE_NAMESPACE, "-o", "json"]);
    if !ok {
        assert!(err.contains("NotFound") || err.contains("not found"), "kubectl get job {name}: {err}");
        return None;
    }
    Some(serde_json::from_str(&out).expect("kubectl -o json"))
}

/// Names of the pods of Job `name` (by the Job controller's label).
fn kube_pods(lab: &Lab, name: &str) -> Vec<String> {
    let sel = format!("batch.kubernetes.io/job-name={name}");
    let (ok, out, err) = lab.kubectl(&["get", "pods", "-n", KUBE_NAMESPACE, "-l", &sel, "-o", "name"]);
    assert!(ok, "kubectl get pods: {err}");
    out.lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// (target, remote id) of a beta job once the target agent reported its native id.
fn placed(lab: &Lab, beta_id: u64) -> (String, u64) {
    let t0 = Instant::now();
    loop {
        if let Some((t, rid)) = remote_of(lab, beta_id).filter(|(_, rid)| *rid != 0) {
            return (t, rid);
        }
        assert!(t0.elapsed() < T, "job {beta_id} never got a remote id");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A job submitted at beta with `args` (which send it to kube-gamma) and
/// placed there: its id at beta, its Job's name at kube-gamma, and a guard
/// that cancels it at beta when the test ends, passed or not.
fn at_kube<'a>(lab: &'a Lab, args: &[&str], body: &str) -> (u64, String, fleet_lab::OnDrop<impl FnMut() + 'a>) {
    let id = lab.sbatch("beta", args, &script(body)).expect("sbatch at beta");
    let cancel = fleet_lab::OnDrop(move || {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    let (target, rid) = placed(lab, id);
    assert_eq!(target, KUBE);
    (id, format!("fleet-{rid}"), cancel)
}

#[test]
fn h100_job_at_beta_runs_on_kube_gamma_with_output_exit_code_and_image() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-roundtrip");
    let body = "echo \"ran in $SLURM_CLUSTER_NAME job $SLURM_JOB_ID nodes=$SLURM_JOB_NUM_NODES gpus=$SLURM_GPUS_ON_NODE fwd=$FLEET_FORWARDED_JOB\"\n\
                for i in 1 2 3; do echo line $i; sleep 0.3; done\necho to-stderr >&2\nexit 3";
    let id = lab
        .sbatch(
            "beta",
            &[
                "--gres=gpu:h100:8",
                "--job-name=kube-rt",
                "--fleet-to=kube-gamma",
                "--fleet-image=ghcr.io/fleet-lab/train:v1",
                &out_arg(&dir, "out.txt"),
            ],
            &script(body),
        )
        .expect("sbatch at beta accepts an h100 job for kube-gamma");

    // At beta: a stand-in in the proxy partition, tagged for kube-gamma.
    let rec = lab.job("beta", id).expect("beta knows the job");
    assert_eq!(rec["Partition"], "fleet", "{rec:?}");
    assert!(rec["AdminComment"].contains(&format!("-> {KUBE}")), "{rec:?}");
    let t0 = Instant::now();
    let squeue = loop {
        let out = lab.cmd("beta", "squeue", &["-h", "-j", &id.to_string(), "-o", "%k"]).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains(&format!("fleet: {KUBE} job")) || t0.elapsed() > Duration::from_secs(30) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(squeue.contains(&format!("fleet: {KUBE} job")), "squeue at beta names kube-gamma: {squeue:?}");

    // In Kubernetes: a Job of the agent's, with the GPUs as limits, the
    // image the job asked for, run as alice.
    let (target, rid) = placed(lab, id);
    assert_eq!(target, KUBE);
    let name = format!("fleet-{rid}");
    let job = kube_job(lab, &name).expect("the Job exists at kube-gamma");
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8", "{job}");
    assert_eq!(pod["containers"][0]["image"], "ghcr.io/fleet-lab/train:v1", "{job}");
    let alice = nix_uid(fleet_lab::USER);
    assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(u64::from(alice)), "{job}");
    assert_eq!(job["metadata"]["labels"]["app.kubernetes.io/managed-by"], "fleet", "{job}");

    // The end at beta is the pod's exit code, as for a native job.
    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(rec["JobState"], "FAILED", "{rec:?}");
    assert_eq!(rec["ExitCode"], "3:0", "the pod's exit code is the stand-in's: {rec:?}");
    let out =
        wait_file(&dir.join("out.txt"), Duration::from_secs(5), |b| String::from_utf8_lossy(b).contains("to-stderr\n"))
            .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.starts_with(&format!("ran in {KUBE} job {rid} nodes=1 gpus=8 fwd=")),
        "the script ran at kube-gamma with Slurm's variables: {out:?}"
    );
    assert!(out.contains("line 1\nline 2\nline 3\n"), "{out:?}");
    assert!(out.contains("to-stderr\n"), "stderr is in the pod's log, hence the output: {out:?}");
    // A plain non-zero exit speaks for itself, as natively: no line of Fleet's.
    assert!(!out.contains("fleet-proxy"), "{out:?}");
    // Kubernetes agrees: the Job failed, and `kubectl logs` has the same lines.
    let job = kube_job(lab, &name).expect("a finished Job stays (ttlSecondsAfterFinished)");
    let failed = job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Failed" && c["status"] == "True");
    assert!(failed, "{job}");
    let (ok, logs, err) = lab.kubectl(&["logs", "-n", KUBE_NAMESPACE, &format!("job/{name}")]);
    assert!(ok && logs.contains("line 3"), "kubectl logs: {logs:?} {err}");

    // Accounting at beta records the outcome like a native job's.
    wait_until("sacct at beta records exit 3", Duration::from_secs(30), || {
        let out = lab.cmd("beta", "sacct", &["-n", "-X", "-P", "-j", &id.to_string(), "-o", "State,ExitCode"]).unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "FAILED|3:0"
    });

    // The meta-scheduler explains the placement: kube-gamma ranked by the
    // cost engine at its on-demand H100 price, the others excluded by --fleet-to.
    let fid = fleet_job_of(lab, id).unwrap();
    let ex = lab.fleetctl_json(&["job", "explain", &fid]).unwrap();
    assert_eq!(ex["placement_target"], KUBE, "{ex}");
    assert_eq!(ex["ranked"][0]["cluster"], KUBE, "{ex}");
    assert_eq!(ex["ranked"][0]["pricing"], "on-demand", "{ex}");
    let price = ex["ranked"][0]["terms"].as_array().unwrap().iter().find(|t| t[0] == "usd_per_gpu_h").cloned();
    assert_eq!(price.and_then(|p| p[1].as_f64()), Some(2.49), "{ex}");
    for c in ["alpha", "beta"] {
        let e = ex["exclusions"].as_array().unwrap().iter().find(|e| e["cluster"] == c).cloned();
        assert!(e.is_some_and(|e| e["reason"].as_str().unwrap().contains("--fleet-to")), "{c}: {ex}");
    }
}

/// The uid of a local user.
/// A pod's log stream that ends before the pod does (an API server
/// restarting, a kubelet dropping an idle stream: the test double cuts
/// every stream after 700 ms) loses nothing: the agent reads on from where
/// it stopped, and beta's job ends only with the whole output.
#[test]
fn a_log_stream_cut_before_its_pod_ends_loses_no_output() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-log-cut");
    let fault = lab.kube_admin_config().parent().unwrap().join("server/work/faults/log-streams-end-after-ms");
    std::fs::create_dir_all(fault.parent().unwrap()).unwrap();
    std::fs::write(&fault, "700").unwrap();
    let _heal = fleet_lab::OnDrop(|| {
        let _ = std::fs::remove_file(&fault);
    });
    let body = "for i in $(seq 1 12); do echo line $i; sleep 0.25; done\necho end";
    let (id, _name, _cancel) =
        at_kube(lab, &["--gres=gpu:h100:1", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")], body);
    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(rec["ExitCode"], "0:0", "{rec:?}");
    let want: String = (1..=12).map(|i| format!("line {i}\n")).collect::<String>() + "end\n";
    let _ = wait_file(&dir.join("out.txt"), Duration::from_secs(5), |b| b.ends_with(b"end\n"));
    assert_eq!(String::from_utf8_lossy(&std::fs::read(dir.join("out.txt")).unwrap_or_default()), want);
}

/// A pod runs with the umask and the soft resource limits its submitter's
/// sbatch had at beta, as a native job's tasks do (slurmstepd applies them
/// under PropagateResourceLimits): before, it had the image's and the
/// runtime's. The lab's kube-server runs pods as processes, so their
/// limits are real.
#[test]
fn a_pod_has_the_submitters_umask_and_soft_limits() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-limits");
    let job = dir.join("job.sh");
    std::fs::write(&job, "#!/bin/sh\necho \"$(umask) $(ulimit -S -n) $(ulimit -S -s)\"\n").unwrap();
    std::fs::set_permissions(&job, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let line = format!(
        "umask 027; ulimit -S -n 777; ulimit -S -s 12345; exec sbatch --parsable --gres=gpu:h100:1 \
         --fleet-to=kube-gamma {} {}",
        out_arg(&dir, "out.txt"),
        job.display()
    );
    let o = lab.cmd_as(fleet_lab::USER, "beta", "sh", &["-c", &line]).unwrap();
    let id: u64 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("sbatch: {}", String::from_utf8_lossy(&o.stderr)));
    let _cancel = fleet_lab::OnDrop(move || {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    assert_eq!(placed(lab, id).0, KUBE);
    assert_eq!(lab.wait_done("beta", id, T).unwrap()["ExitCode"], "0:0");
    let out = wait_file(&dir.join("out.txt"), Duration::from_secs(5), |b| b.ends_with(b"\n")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "0027 777 12345\n");
}

fn nix_uid(user: &str) -> u32 {
    let out = std::process::Command::new("id").args(["-u", user]).output().expect("id -u");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a uid")
}

#[test]
fn scancel_at_beta_deletes_the_job_and_its_pods_within_5_s() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-cancel");
    let id = lab
        .sbatch(
            "beta",
            &["--gres=gpu:h100:8", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")],
            &script("echo started\nsleep 300\necho never"),
        )
        .expect("sbatch");
    let (_, rid) = placed(lab, id);
    let name = format!("fleet-{rid}");
    wait_file(&dir.join("out.txt"), T, |b| b.starts_with(b"started\n")).expect("the pod runs and its output streams");
    assert_eq!(kube_pods(lab, &name).len(), 1, "one pod runs");
    lab.wait_for("beta", id, T, |r| r["JobState"] == "RUNNING").unwrap();

    let t0 = Instant::now();
    let out = lab.cmd_as(fleet_lab::USER, "beta", "scancel", &[&id.to_string()]).unwrap();
    assert!(out.status.success(), "scancel: {}", String::from_utf8_lossy(&out.stderr));
    wait_until("the Job and its pods are deleted", Duration::from_secs(5), || {
        kube_job(lab, &name).is_none() && kube_pods(lab, &name).is_empty()
    });
    let took = t0.elapsed();
    eprintln!("[figure] scancel at beta -> Job {name} and its pods gone at kube-gamma: {took:.2?}");
    // Its ConfigMap and Secret went with it (owned by the Job).
    let (ok, cms, err) = lab.kubectl(&["get", "configmaps,secrets", "-n", KUBE_NAMESPACE, "-o", "name"]);
    assert!(ok, "{err}");
    assert!(!cms.contains(&name), "dependents of {name} left: {cms}");

    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(rec["JobState"], "CANCELLED", "{rec:?}");
    let fid = fleet_job_of(lab, id).unwrap();
    wait_until("the meta-scheduler records the cancel", Duration::from_secs(20), || {
        lab.fleetctl_json(&["job", &fid]).is_ok_and(|j| j["state"] == "cancelled")
    });
    let out = std::fs::read_to_string(dir.join("out.txt")).unwrap();
    assert!(!out.contains("never"), "{out:?}");
}

#[test]
fn placement_keeps_h100_at_alpha_and_sends_mig_slices_to_kube_gamma() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-placement");
    // An H100 job from beta without a pin: alpha (1.49 owned) beats
    // kube-gamma (2.49 on demand), which the engine ranks behind it.
    let h100 = lab
        .sbatch("beta", &["--gres=gpu:h100:8", &out_arg(&dir, "h100.txt")], &script("echo $SLURM_CLUSTER_NAME"))
        .expect("sbatch h100");
    // A MIG slice exists only at kube-gamma: it goes there unpinned, to the MIG node.
    let mig = lab
        .sbatch(
            "beta",
            &["--gres=gpu:1g.10gb:1", &out_arg(&dir, "mig.txt")],
            &script("echo \"$SLURM_CLUSTER_NAME gpus=$SLURM_GPUS_ON_NODE\""),
        )
        .expect("sbatch MIG");
    let (t, _) = placed(lab, h100);
    assert_eq!(t, "alpha");
    let (t, rid) = placed(lab, mig);
    assert_eq!(t, KUBE);
    assert_eq!(lab.wait_done("beta", mig, T).unwrap()["ExitCode"], "0:0");
    let out = wait_file(&dir.join("mig.txt"), Duration::from_secs(5), |b| b.ends_with(b"\n")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out), format!("{KUBE} gpus=1\n"));
    let job = kube_job(lab, &format!("fleet-{rid}")).expect("the MIG Job");
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"], "1",
        "{job}"
    );
    let (ok, nodes, err) = lab.kubectl(&[
        "get",
        "pods",
        "-n",
        KUBE_NAMESPACE,
        "-l",
        &format!("batch.kubernetes.io/job-name=fleet-{rid}"),
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ]);
    assert!(ok, "{err}");
    assert_eq!(nodes.trim(), "gamma-a100-mig");
    lab.wait_done("beta", h100, T).unwrap();

    let ex = lab.fleetctl_json(&["job", "explain", &fleet_job_of(lab, h100).unwrap()]).unwrap();
    let ranked: Vec<&str> = ex["ranked"].as_array().unwrap().iter().map(|r| r["cluster"].as_str().unwrap()).collect();
    let (a, k) = (ranked.iter().position(|c| *c == "alpha"), ranked.iter().position(|c| *c == KUBE));
    assert!(a.is_some() && k.is_some() && a < k, "alpha ranked before kube-gamma: {ex}");
    let ex = lab.fleetctl_json(&["job", "explain", &fleet_job_of(lab, mig).unwrap()]).unwrap();
    assert_eq!(ex["ranked"][0]["cluster"], KUBE, "{ex}");
    assert_eq!(ex["ranked"][0]["pool"], "a100-mig (1G.10GB)", "{ex}");
}

#[test]
fn a_hostile_fleet_image_is_refused_at_sbatch() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    for bad in ["ubuntu;reboot", "--privileged", "Ubuntu:24.04", "a/../b"] {
        let err = lab
            .sbatch("beta", &["--gres=gpu:h100:8", &format!("--fleet-image={bad}")], &script("true"))
            .expect_err("sbatch refuses a bad --fleet-image");
        assert!(err.contains(&format!("--fleet-image={bad}:")), "the error names the option and value: {err:?}");
    }
}

/// Seconds from `sbatch` at beta until the script runs at the target, for
/// `n` jobs (the script prints its start time).
fn start_latencies(lab: &Lab, dir: &std::path::Path, args: &[&str], n: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..n {
        let file = format!("lat-{}-{i}.txt", args.join("").replace(['-', '=', ':', ','], ""));
        let t0 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let mut a = args.to_vec();
        let o = out_arg(dir, &file);
        a.push(&o);
        let id = lab.sbatch("beta", &a, &script("date +%s.%N")).expect("sbatch");
        lab.wait_done("beta", id, T).unwrap();
        let text = wait_file(&dir.join(&file), Duration::from_secs(5), |b| b.ends_with(b"\n")).unwrap();
        let text = String::from_utf8_lossy(&text);
        let started: f64 = text
            .lines()
            .find_map(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no start time in the output: {text:?}"));
        out.push(started - t0);
    }
    out
}

#[test]
fn start_latency_kube_gamma_vs_alpha() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-latency");
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let kube = start_latencies(lab, &dir, &["--gres=gpu:h100:8", "--fleet-to=kube-gamma"], 3);
    let alpha = start_latencies(lab, &dir, &["--gres=gpu:h100:8", "--fleet-to=alpha"], 3);
    eprintln!("[figure] sbatch at beta -> script running: kube-gamma {kube:.2?} s (median {:.2}), alpha {alpha:.2?} s (median {:.2})", median(kube.clone()), median(alpha.clone()));
    for l in kube.iter().chain(&alpha) {
        assert!((0.0..30.0).contains(l), "a forwarded job starts within 30 s: {kube:?} {alpha:?}");
    }
}

/// `kubectl` with the *agent's* kubeconfig (its ServiceAccount's RBAC).
fn kubectl_as_agent(lab: &Lab, args: &[&str]) -> (bool, String, String) {
    let o = std::process::Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", lab.root.join(KUBE).join("agent.kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("kubectl");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The agent's credentials are a ServiceAccount's token (fleet/fleet-agent),
/// its rights RBAC objects the lab created from the project's shipped
/// manifest (conf/kubernetes/fleet-agent-rbac.yaml) plus its RoleBinding in
/// team-vision; the API server double evaluates them as Kubernetes does.
/// `kubectl auth can-i` (SelfSubjectAccessReview) with the agent's
/// kubeconfig says yes to what the agent does and no to anything else, and
/// the calls it says no to are refused (403).
#[test]
fn the_agents_service_account_may_do_what_the_shipped_rbac_grants_and_nothing_else() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    // The RBAC objects are Kubernetes objects, as the manifest has them.
    let manifest = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/kubernetes/fleet-agent-rbac.yaml"),
    )
    .unwrap();
    assert!(manifest.contains("kind: ClusterRole") && manifest.contains("name: fleet-agent-nodes"));
    let (ok, role, err) = lab.kubectl(&["get", "clusterrole", "fleet-agent", "-o", "json"]);
    assert!(ok, "{err}");
    let role: serde_json::Value = serde_json::from_str(&role).unwrap();
    let rules = role["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["resources"] == serde_json::json!(["jobs"]) && r["apiGroups"] == serde_json::json!(["batch"])),
        "{role}"
    );
    for ns in [KUBE_NAMESPACE, "team-vision"] {
        let (ok, b, err) = lab.kubectl(&["get", "rolebinding", "fleet-agent", "-n", ns, "-o", "json"]);
        assert!(ok, "{ns}: {err}");
        let b: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(b["roleRef"]["name"], "fleet-agent", "{b}");
        assert_eq!(b["subjects"][0]["name"], "fleet-agent", "{b}");
    }
    let can = |args: &[&str]| -> bool {
        let mut a = vec!["auth", "can-i"];
        a.extend_from_slice(args);
        let (ok, out, err) = kubectl_as_agent(lab, &a);
        let said = out.trim().to_string();
        assert!(said == "yes" || said.starts_with("no"), "kubectl auth can-i {args:?}: {out:?} {err}");
        assert_eq!(ok, said == "yes", "exit status agrees: {args:?}");
        said == "yes"
    };
    // What the agent does.
    for yes in [
        &["create", "jobs.batch", "-n", "fleet"][..],
        &["watch", "jobs.batch", "-n", "team-vision"],
        &["patch", "jobs.batch", "-n", "fleet"],
        &["delete", "jobs.batch", "-n", "team-vision"],
        &["list", "pods", "-n", "fleet"],
        &["get", "pods", "--subresource=log", "-n", "team-vision"],
        &["create", "secrets", "-n", "fleet"],
        &["create", "configmaps", "-n", "team-vision"],
        &["create", "services", "-n", "fleet"],
        &["list", "nodes"],
        &["watch", "nodes"],
        &["list", "events", "-n", "team-vision"],
    ] {
        assert!(can(yes), "the agent may {yes:?}");
    }
    // What it must not.
    for no in [
        &["create", "jobs.batch", "-n", "team-other"][..],
        &["list", "jobs.batch", "-n", "default"],
        &["get", "secrets", "-n", "fleet"],
        &["list", "secrets", "-n", "kube-system"],
        &["get", "configmaps", "-n", "fleet"],
        &["create", "pods", "-n", "fleet"],
        &["delete", "pods", "-n", "fleet"],
        &["list", "pods", "--all-namespaces"],
        &["delete", "nodes"],
        &["patch", "nodes"],
        &["create", "clusterrolebindings"],
        &["create", "rolebindings", "-n", "fleet"],
        &["create", "serviceaccounts", "-n", "fleet"],
        &["list", "events", "-n", "team-other"],
        &["create", "events", "-n", "fleet"],
    ] {
        assert!(!can(no), "the agent may not {no:?}");
    }
    // And the calls are refused, naming the ServiceAccount.
    let who = "User \"system:serviceaccount:fleet:fleet-agent\"";
    for call in [
        &["get", "secrets", "-n", "kube-system"][..],
        &["get", "secrets", "-n", "fleet"],
        &["get", "pods", "--all-namespaces"],
        &["delete", "node", "gamma-a100-mig"],
        &["get", "jobs", "-n", "team-other"],
    ] {
        let (ok, out, err) = kubectl_as_agent(lab, call);
        assert!(!ok && err.contains("Forbidden") && err.contains(who), "kubectl {call:?}: {out} {err}");
    }
    let (ok, _, err) = lab.kubectl(&["get", "node", "gamma-a100-mig"]);
    assert!(ok, "the node is still there: {err}");
}

#[test]
fn pods_run_as_the_mapped_user_in_their_accounts_namespace_and_the_agent_may_use_no_other() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-identity");
    // Researchers write their output here; each has a private file there.
    let _ = std::process::Command::new("chmod").arg("0777").arg(&dir).status();
    let private = |user: &str| {
        let p = dir.join(format!("{user}-private.txt"));
        std::fs::write(&p, format!("{user}'s secret\n")).unwrap();
        let uid = nix_uid(user);
        std::os::unix::fs::chown(&p, Some(uid), None).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        p
    };
    let (alice_file, bob_file) = (private(fleet_lab::USER), private(fleet_lab::OTHER_USER));
    let body = |other: &std::path::Path| {
        format!(
            "echo \"uid=$(id -u) user=$(id -un) ns=$SLURM_JOB_PARTITION\"\ncat {} 2>/dev/null || echo other-denied\n",
            other.display()
        )
    };
    let t0 = Instant::now();
    let a = lab
        .sbatch(
            "beta",
            &["--gres=gpu:h100:1", "--fleet-to=kube-gamma", &out_arg(&dir, "alice.txt")],
            &script(&body(&bob_file)),
        )
        .expect("alice's job");
    let (b, _) = lab.sbatch_as(
        fleet_lab::OTHER_USER,
        "beta",
        &["--gres=gpu:h100:1", "--fleet-to=kube-gamma", &out_arg(&dir, "bob.txt")],
        &script(&body(&alice_file)),
    );
    let b = b.expect("bob's job");
    let (ta, ra) = placed(lab, a);
    let (tb, rb) = placed(lab, b);
    assert_eq!((ta.as_str(), tb.as_str()), (KUBE, KUBE));
    // Each in its account's namespace (JobUserMap: alice -> lab -> fleet, bob -> vision -> team-vision).
    let ns_of = |rid: u64| {
        let (ok, out, err) = lab.kubectl(&[
            "get",
            "jobs",
            "-A",
            "-l",
            &format!("fleet.io/native-id={rid}"),
            "-o",
            "jsonpath={.items[*].metadata.namespace}",
        ]);
        assert!(ok, "{err}");
        out.trim().to_string()
    };
    assert_eq!(ns_of(ra), "fleet");
    assert_eq!(ns_of(rb), "team-vision");
    for (id, user, file) in [(a, fleet_lab::USER, "alice.txt"), (b, fleet_lab::OTHER_USER, "bob.txt")] {
        let rec = lab.wait_done("beta", id, T).unwrap();
        assert_eq!(rec["ExitCode"], "0:0", "{rec:?}");
        let out = wait_file(&dir.join(file), Duration::from_secs(5), |b| {
            b.ends_with(b"denied\n") || b.ends_with(b"secret\n")
        })
        .unwrap();
        let out = String::from_utf8_lossy(&out).into_owned();
        let ns = if user == fleet_lab::USER { "fleet" } else { "team-vision" };
        assert_eq!(
            out,
            format!("uid={} user={user} ns={ns}\nother-denied\n", nix_uid(user)),
            "the pod's process ran as the mapped user and could not read the other's file"
        );
    }
    eprintln!("[figure] two jobs sbatch at beta -> both done at kube-gamma as their users: {:.2?}", t0.elapsed());

    // The agent's RBAC: its namespaces yes, any other no (a forbidden call is forbidden).
    let (ok, _, err) = kubectl_as_agent(lab, &["get", "jobs", "-n", "team-vision"]);
    assert!(ok, "the agent may list Jobs in team-vision: {err}");
    let (ok, _, err) = kubectl_as_agent(lab, &["get", "jobs", "-n", "team-other"]);
    assert!(!ok && (err.contains("Forbidden") || err.contains("forbidden")), "{err}");
    let (ok, _, err) = kubectl_as_agent(lab, &["delete", "job", "anything", "-n", "team-other"]);
    assert!(!ok && (err.contains("Forbidden") || err.contains("forbidden")), "{err}");

    // A user the map does not name has no identity at kube-gamma: refused at sbatch, the map named.
    let (r, _) = lab.sbatch_as("carol", "beta", &["--gres=gpu:h100:1", "--fleet-to=kube-gamma"], &script("true"));
    let err = r.expect_err("carol has no identity at kube-gamma");
    assert!(err.contains("kube-gamma: user carol from beta has no identity there (JobUserMap="), "{err}");
}

/// The numbers after `word ` at the start of lines.
fn numbers(out: &str, word: &str) -> Vec<u64> {
    out.lines().filter_map(|l| l.strip_prefix(word)?.strip_prefix(' ')?.trim().parse().ok()).collect()
}

/// The health of `cluster` in the meta-scheduler's view.
fn health(lab: &Lab, cluster: &str) -> String {
    let v = lab.fleetctl_json(&["clusters"]).unwrap_or_default();
    let c = v["clusters"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == cluster).cloned());
    c.map(|c| c["health"].as_str().unwrap_or("").to_string()).unwrap_or_default()
}

#[test]
fn a_job_checkpointing_at_kube_gamma_resumes_at_alpha_when_kube_gammas_agent_dies_and_the_stale_job_is_deleted() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    assert!(lab.root.join("ckpt-stores.toml").exists(), "the lab has no checkpoint stores (FLEET_LAB_S3=0?)");
    let _restore = fleet_lab::OnDrop(|| {
        let _ = lab.lab_sh(&["revive"]);
    });
    let dir = lab.workdir("kube-resume");
    let out = dir.join("out.txt");
    let ckpt = lab.root.join("bin/fleet-ckpt");
    const LAST: u64 = 40;
    let body = format!(
        r#"set -u
CK={ckpt}
W=$(mktemp -d)
echo "run at $SLURM_CLUSTER_NAME resume=${{FLEET_RESUME_FROM:-none}} url=${{FLEET_CKPT_URL:-none}}"
step=0
if "$CK" restore "$W/r"; then step=$(cat "$W/r/step.txt"); echo "resumed-at $step"
else rc=$?; [ $rc = 3 ] || {{ echo "restore failed: $rc"; exit 9; }}; fi
while [ $step -lt {LAST} ]; do
  step=$((step + 1)); echo "step $step"; sleep 1
  if [ $((step % 3)) = 0 ]; then
    rm -rf "$W/c"; mkdir "$W/c"; echo $step >"$W/c/step.txt"; head -c 2000000 /dev/urandom >"$W/c/weights.bin"
    "$CK" save "$W/c" --step $step >/dev/null && echo "ckpt $step"
  fi
done
echo end"#,
        ckpt = ckpt.display()
    );
    // alpha is silent while the job is placed, so that kube-gamma (dearer) takes it.
    assert!(lab.lab_sh(&["stop-agent", "alpha"]).unwrap().status.success());
    let t = Instant::now();
    while health(lab, "alpha") == "healthy" {
        assert!(t.elapsed() < Duration::from_secs(30), "alpha never seen silent");
        std::thread::sleep(Duration::from_millis(200));
    }
    let id = lab
        .sbatch(
            "beta",
            &["--gres=gpu:h100:1", "--fleet-to=kube-gamma,alpha", "--open-mode=append", &out_arg(&dir, "out.txt")],
            &script(&body),
        )
        .unwrap();
    let _cancel = fleet_lab::OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    let (target, rid) = placed(lab, id);
    assert_eq!(target, KUBE);
    let stale = format!("fleet-{rid}");
    assert!(lab.lab_sh(&["start-agent", "alpha"]).unwrap().status.success());
    let first = wait_file(&out, T, |b| numbers(&String::from_utf8_lossy(b), "ckpt").iter().any(|&s| s >= 6)).unwrap();
    let first = String::from_utf8_lossy(&first).into_owned();
    let fid = fleet_job_of(lab, id).unwrap();
    assert!(
        first.starts_with(&format!(
            "run at {KUBE} resume=none url=s3://ckpt-lab-central/fleet/beta/{}/{fid}\n",
            fleet_lab::USER
        )),
        "the pod got its region's checkpoint prefix: {first}"
    );
    assert!(!first.contains("warning"), "fleet-ckpt save in the pod could not report: {first}");
    // The pod's saves were reported with the token of its Secret.
    let rows = lab.fleetctl_json(&["job", "checkpoints", &fid]).unwrap();
    let central: Vec<&serde_json::Value> =
        rows.as_array().unwrap().iter().filter(|r| r["region"] == "lab-central" && r["reported_by"] == "job").collect();
    assert!(!central.is_empty(), "checkpoints reported from kube-gamma: {rows}");
    // The token is nowhere in the Job.
    let job = kube_job(lab, &stale).expect("the Job");
    let token_file = job["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "FLEET_CKPT_TOKEN_FILE")
        .map(|e| e["value"].clone());
    assert_eq!(token_file, Some(serde_json::json!("/fleet/ckpt/token")), "{job}");
    assert!(alpha_is(lab, "healthy"), "alpha is back before kube-gamma dies");

    // kube-gamma's agent dies; its pod runs on (the API server is up).
    let t_kill = Instant::now();
    assert!(lab.lab_sh(&["stop-agent", KUBE]).unwrap().status.success());
    let second =
        wait_file(&out, Duration::from_secs(120), |b| String::from_utf8_lossy(b).contains("resumed-at")).unwrap();
    let resumed = t_kill.elapsed();
    let second = String::from_utf8_lossy(&second).into_owned();
    let run2 = &second[second.rfind("run at ").unwrap()..];
    assert!(run2.starts_with("run at alpha resume=s3://ckpt-lab-east/fleet/"), "{run2}");
    let at = numbers(run2, "resumed-at")[0];
    let reported: Vec<u64> = rows.as_array().unwrap().iter().filter_map(|r| r["step"].as_u64()).collect();
    assert!(at >= 6 && at.is_multiple_of(3), "resumed at a checkpoint kube-gamma saved: {at} ({reported:?}): {second}");
    let rec = fleet_record(lab, id).unwrap();
    assert_eq!((rec["target"].as_str(), rec["epoch"].as_u64()), (Some("alpha"), Some(2)), "{rec}");
    // The stale Job still exists at kube-gamma: nobody there could delete it.
    assert!(kube_job(lab, &stale).is_some(), "the Job was deleted with no agent at kube-gamma?");

    // Its pod stopped itself by its in-job lease before the move: the Job
    // has failed (no pod runs). The agent returns: its fencing pass drops
    // the stale run (epoch 1) unreported, deleting the Job if it still ran.
    let ended = |j: &serde_json::Value| {
        j["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Failed" && c["status"] == "True")
    };
    let t_back = Instant::now();
    assert!(lab.lab_sh(&["start-agent", KUBE]).unwrap().status.success());
    wait_until("the stale Job has ended or is deleted", Duration::from_secs(30), || {
        kube_job(lab, &stale).is_none_or(|j| ended(&j))
    });
    let fenced = t_back.elapsed();

    let done = lab.wait_done("beta", id, Duration::from_secs(120)).unwrap();
    assert_eq!(done["ExitCode"], "0:0", "{done:?}");
    let all = String::from_utf8_lossy(&std::fs::read(&out).unwrap()).into_owned();
    let run2 = &all[all.rfind("run at ").unwrap()..];
    assert_eq!(numbers(run2, "step"), ((at + 1)..=LAST).collect::<Vec<_>>(), "counts on from the checkpoint: {all}");
    assert!(all.ends_with("end\n"), "{all}");
    eprintln!(
        "[figure] kube-gamma's agent killed -> resumed at alpha from step {at} after {resumed:.2?} (grace and copy \
         lab-central -> lab-east included); kube-gamma's agent back -> stale Job {stale} ended or deleted {fenced:.2?} later"
    );
}

fn alpha_is(lab: &Lab, want: &str) -> bool {
    let t = Instant::now();
    while health(lab, "alpha") != want {
        if t.elapsed() > Duration::from_secs(30) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    true
}

/// kube-gamma's agent dies while an H100 pod runs there (its API server,
/// and so the pod, live on): the meta-scheduler fails the job over to
/// alpha, and the pod, whose in-job lease the meta-scheduler no longer
/// renews in full, stops itself before that. Both clusters' processes are
/// sampled every 100 ms: never two running copies.
#[test]
fn a_pod_whose_agent_died_stops_itself_while_its_job_moves() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let _restore = fleet_lab::OnDrop(|| {
        let _ = lab.lab_sh(&["revive"]);
    });
    let dir = lab.workdir("kube-lease");
    let out = dir.join("out.txt");
    const STEPS: u32 = 60;
    let body = format!(
        "#FLEET interruptible\nfor i in $(seq 1 {STEPS}); do echo \"step $i at $SLURM_CLUSTER_NAME\"; sleep 1; done\necho end"
    );
    // alpha is silent while the job is placed, so that kube-gamma (dearer) takes it.
    assert!(lab.lab_sh(&["stop-agent", "alpha"]).unwrap().status.success());
    wait_until("alpha seen silent", Duration::from_secs(30), || health(lab, "alpha") != "healthy");
    let id = lab
        .sbatch(
            "beta",
            &["--gres=gpu:h100:1", "--fleet-to=kube-gamma,alpha", "--open-mode=append", &out_arg(&dir, "out.txt")],
            &script(&body),
        )
        .unwrap();
    let _cancel = fleet_lab::OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    let (target, rid) = placed(lab, id);
    assert_eq!(target, KUBE);
    let name = format!("fleet-{rid}");
    assert!(lab.lab_sh(&["start-agent", "alpha"]).unwrap().status.success());
    wait_file(&out, T, |b| String::from_utf8_lossy(b).contains(&format!("step 3 at {KUBE}"))).unwrap();
    let fid = fleet_job_of(lab, id).unwrap();
    // The pod runs under its lease: the helper from an init container, the
    // credential only in the run's Secret.
    let job = kube_job(lab, &name).expect("the Job");
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["initContainers"][0]["name"], "fleet-lease-helper", "{pod}");
    assert_eq!(pod["containers"][0]["command"][1], "lease-exec", "{pod}");
    assert_eq!(pod["shareProcessNamespace"], true, "{pod}");
    let token = fleet_api::auth::ckpt_token(
        std::fs::read_to_string(lab.root.join("secrets/kube-gamma.token")).unwrap().trim(),
        &fid,
    );
    assert!(!job.to_string().contains(&token), "the lease credential is in the Job");
    let (ok, cm, _) = lab.kubectl(&["get", "configmap", &format!("{name}-script"), "-n", KUBE_NAMESPACE, "-o", "json"]);
    assert!(ok && !cm.contains(&token), "the lease credential is in the script's ConfigMap");
    assert!(copies(&fid).contains(KUBE), "the pod's process is seen: {:?}", copies(&fid));
    assert!(alpha_is(lab, "healthy"), "alpha is back before kube-gamma's agent dies");

    let t_kill = Instant::now();
    let sampler = fleet_lab::Sampler::start(Duration::from_millis(100), {
        let fid = fid.clone();
        move || copies(&fid)
    });
    assert!(lab.lab_sh(&["stop-agent", KUBE]).unwrap().status.success());
    // The pod stops itself: its Job fails at kube-gamma with nobody to delete it.
    let mut stopped = None;
    let mut moved = None;
    let t0 = Instant::now();
    while stopped.is_none() || moved.is_none() {
        assert!(t0.elapsed() < Duration::from_secs(90), "stopped {stopped:?} moved {moved:?}");
        if stopped.is_none() && !copies(&fid).contains(KUBE) {
            stopped = Some(t_kill.elapsed());
        }
        let rec = fleet_record(lab, id).unwrap_or_default();
        if moved.is_none() && rec["epoch"].as_u64() == Some(2) {
            moved = Some(t_kill.elapsed());
            assert_eq!(rec["target"].as_str(), Some("alpha"), "{rec}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (stopped, moved) = (stopped.unwrap(), moved.unwrap());
    assert!(stopped < moved, "the pod stopped at {stopped:?}, after the move at {moved:?}");
    wait_file(&out, T, |b| String::from_utf8_lossy(b).contains("step 3 at alpha")).unwrap();
    let samples = sampler.finish();
    let both: Vec<_> = samples.iter().filter(|(_, c)| c.len() > 1).collect();
    assert!(both.is_empty(), "two copies at once: {both:?}");
    assert!(samples.iter().any(|(_, c)| c.contains(KUBE)) && samples.iter().any(|(_, c)| c.contains("alpha")));
    let job = kube_job(lab, &name).expect("the stale Job is still there: its agent is dead");
    let failed = job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Failed" && c["status"] == "True");
    assert!(failed, "the pod stopped itself, so its Job failed: {}", job["status"]);
    let (ok, log, err) = lab.kubectl(&["logs", &kube_pods(lab, &name)[0], "-n", KUBE_NAMESPACE]);
    assert!(ok, "{err}");
    assert!(log.contains(&format!("fleet: stopping this run of job {fid} at this cluster: ")), "{log}");

    // The agent returns: its fencing pass drops the stale run unreported
    // (its Job has ended: Kubernetes collects it after its TTL); the job
    // ends once, at alpha.
    assert!(lab.lab_sh(&["start-agent", KUBE]).unwrap().status.success());
    let done = lab.wait_done("beta", id, Duration::from_secs(150)).unwrap();
    assert_eq!(done["ExitCode"], "0:0", "{done:?}");
    let rec = fleet_record(lab, id).unwrap();
    assert_eq!((rec["target"].as_str(), rec["epoch"].as_u64()), (Some("alpha"), Some(2)), "{rec}");
    let all = String::from_utf8_lossy(&std::fs::read(&out).unwrap()).into_owned();
    assert!(all.ends_with(&format!("step {STEPS} at alpha\nend\n")), "{all}");
    eprintln!(
        "[figure] kube-gamma's agent killed -> its pod stopped itself after {stopped:.2?}, the job moved to alpha after \
         {moved:.2?}; 0 of {} samples saw two copies",
        samples.len()
    );
}

/// The other way: a job checkpointing at alpha (a Slurm cluster) moves *to*
/// kube-gamma when alpha dies (its agent and slurmctld killed, as in
/// tests/failover.rs; only slurmd and the job live on, and its in-job lease
/// stops it). kube-gamma is the only other cluster the job may run at
/// (`--fleet-to=alpha,kube-gamma`): its pod resumes from alpha's last
/// checkpoint, copied from alpha's region's store (lab-east) into
/// kube-gamma's (lab-central) before the Job is created; the output at beta
/// goes on after one line saying so, the exit code is the pod's, and both
/// clusters are sampled every 100 ms: never two running copies.
#[test]
fn a_job_checkpointing_at_alpha_resumes_at_kube_gamma_when_alpha_dies() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    assert!(lab.root.join("ckpt-stores.toml").exists(), "the lab has no checkpoint stores (FLEET_LAB_S3=0?)");
    let _restore = fleet_lab::OnDrop(|| {
        let _ = lab.lab_sh(&["revive"]);
    });
    let dir = lab.workdir("kube-into");
    let out = dir.join("out.txt");
    let ckpt = lab.root.join("bin/fleet-ckpt");
    const LAST: u64 = 36;
    // Each step also leaves a timestamped mark per cluster (written by the
    // copy itself, not relayed).
    let body = format!(
        r#"set -u
CK={ckpt}
W=$(mktemp -d)
echo "run at $SLURM_CLUSTER_NAME resume=${{FLEET_RESUME_FROM:-none}}"
step=0
if "$CK" restore "$W/r"; then step=$(cat "$W/r/step.txt"); echo "resumed-at $step"
else rc=$?; [ $rc = 3 ] || {{ echo "restore failed: $rc"; exit 9; }}; fi
while [ $step -lt {LAST} ]; do
  step=$((step + 1)); echo "step $step"; date +%s.%N >> {dir}/marks-$SLURM_CLUSTER_NAME; sleep 1
  if [ $((step % 3)) = 0 ]; then
    rm -rf "$W/c"; mkdir "$W/c"; echo $step >"$W/c/step.txt"; head -c 1000000 /dev/urandom >"$W/c/weights.bin"
    "$CK" save "$W/c" --step $step >/dev/null && echo "ckpt $step"
  fi
done
echo end
exit 7"#,
        ckpt = ckpt.display(),
        dir = dir.display()
    );
    assert!(alpha_is(lab, "healthy"), "alpha is healthy before the job is placed");
    let id = lab
        .sbatch(
            "beta",
            &["--gres=gpu:h100:1", "--fleet-to=alpha,kube-gamma", "--open-mode=append", &out_arg(&dir, "out.txt")],
            &script(&body),
        )
        .unwrap();
    let _cancel = fleet_lab::OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    let (target, _) = placed(lab, id);
    assert_eq!(target, "alpha", "alpha (owned H100s) is cheaper than kube-gamma (on demand)");
    let fid = fleet_job_of(lab, id).unwrap();
    let first = wait_file(&out, T, |b| numbers(&String::from_utf8_lossy(b), "ckpt").iter().any(|&s| s >= 6)).unwrap();
    let first = String::from_utf8_lossy(&first).into_owned();
    assert!(first.starts_with("run at alpha resume=none\n"), "{first}");
    assert_eq!(copies(&fid), std::collections::BTreeSet::from(["alpha".to_string()]), "the job runs at alpha");

    let sampler = fleet_lab::Sampler::start(Duration::from_millis(100), {
        let fid = fid.clone();
        move || copies(&fid)
    });
    let t_kill = Instant::now();
    assert!(lab.lab_sh(&["stop-agent", "alpha"]).unwrap().status.success());
    assert!(lab.lab_sh(&["stop-ctld", "alpha"]).unwrap().status.success());
    let mut moved = None;
    wait_until("the job is placed again", Duration::from_secs(120), || {
        moved = fleet_record(lab, id).filter(|r| r["epoch"].as_u64() == Some(2));
        moved.is_some()
    });
    let decided = t_kill.elapsed();
    let rec = moved.unwrap();
    assert_eq!(rec["target"], KUBE, "{rec}");
    assert_eq!(rec["migrations"], 1, "{rec}");
    let second =
        wait_file(&out, Duration::from_secs(90), |b| String::from_utf8_lossy(b).contains("resumed-at")).unwrap();
    let resumed = t_kill.elapsed();
    let second = String::from_utf8_lossy(&second).into_owned();
    let run2 = &second[second.rfind("run at ").unwrap()..];
    assert!(
        run2.starts_with(&format!("run at {KUBE} resume=s3://ckpt-lab-central/fleet/beta/{}/{fid}/", fleet_lab::USER)),
        "{run2}"
    );
    let at = numbers(run2, "resumed-at")[0];
    // The newest checkpoint alpha reported before it died, and its copy.
    let rows = lab.fleetctl_json(&["job", "checkpoints", &fid]).unwrap();
    let rows = rows.as_array().unwrap();
    let east_max = rows
        .iter()
        .filter(|r| r["region"] == "lab-east" && r["valid"] != false)
        .filter_map(|r| r["step"].as_u64())
        .max();
    assert_eq!(Some(at), east_max, "resumed from alpha's newest checkpoint: {rows:?}");
    let resume_url = run2.lines().next().unwrap().split("resume=").nth(1).unwrap().trim();
    let copy = rows.iter().find(|r| r["url"] == resume_url).unwrap_or_else(|| panic!("{resume_url} in {rows:?}"));
    assert_eq!(copy["region"], "lab-central", "{copy}");
    let source = rows.iter().find(|r| r["url"] == copy["copied_from"]).unwrap_or_else(|| panic!("{copy}: source"));
    assert_eq!((source["region"].as_str(), source["step"].as_u64()), (Some("lab-east"), Some(at)), "{source}");
    let name = format!("fleet-{}", remote_of(lab, id).filter(|(t, _)| t == KUBE).map(|(_, r)| r).unwrap());
    assert!(kube_job(lab, &name).is_some(), "the Job at kube-gamma");

    let done = lab.wait_done("beta", id, Duration::from_secs(120)).unwrap();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("FAILED", "7:0"), "{done:?}");
    assert_eq!(done["Restarts"], "0", "the stand-in stayed one job: {done:?}");
    let all = String::from_utf8(
        wait_file(&out, Duration::from_secs(15), |b| String::from_utf8_lossy(b).contains("\nend\n")).unwrap(),
    )
    .unwrap();
    // The output: alpha's run as far as it was relayed, one line from
    // Fleet, and kube-gamma's run from the checkpoint to the end.
    let notes: Vec<&str> = all.lines().filter(|l| l.starts_with("fleet: ")).collect();
    assert_eq!(notes.len(), 1, "{all}");
    assert!(
        notes[0].starts_with(&format!("fleet: run 1 of job {fid} at alpha died (alpha has sent no heartbeat"))
            && notes[0].ends_with(&format!(
                "moving it elsewhere, resuming from checkpoint {} ({})",
                source["seq"],
                source["url"].as_str().unwrap()
            )),
        "{all}"
    );
    // The note is written to stderr, the runs' lines to stdout: both go to
    // out.txt, relayed as two streams, so the note lands after alpha's run
    // but not necessarily before the pod's first lines.
    let (run1, rest) = all.split_at(all.find(&format!("run at {KUBE} ")).expect("the pod's run"));
    // alpha's run went on (unrelayed: its agent was dead) until its lease
    // stopped it, saving checkpoints the job reported itself.
    let run1_steps = numbers(run1, "step");
    assert_eq!(run1_steps, (1..=run1_steps.len() as u64).collect::<Vec<_>>(), "{all}");
    assert!(run1_steps.len() >= 6 && at >= 6, "{all}");
    let last1 = all.find(&format!("\nstep {}\n", run1_steps.len())).expect("alpha's last relayed step");
    assert!(all.find(notes[0]).unwrap() > last1, "the note comes after alpha's run: {all}");
    assert_eq!(numbers(rest, "step"), ((at + 1)..=LAST).collect::<Vec<_>>(), "counts on from the checkpoint: {all}");
    assert!(
        all.ends_with("\nend\n") && !all.contains("fleet-proxy"),
        "the pod's end is the stand-in's, and its own non-zero exit adds no line (as natively): {all}"
    );

    // Never two copies: no sample saw both clusters, and alpha's last step
    // mark is older than kube-gamma's first.
    let samples = sampler.finish();
    let both = samples.iter().filter(|(_, c)| c.len() > 1).count();
    assert_eq!(both, 0, "{both} of {} samples saw copies at two clusters", samples.len());
    assert!(samples.iter().any(|(_, c)| c.contains(KUBE)), "the sampler saw the pod");
    let marks = |c: &str| -> Vec<f64> {
        std::fs::read_to_string(dir.join(format!("marks-{c}")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let (alpha_last, kube_first) =
        (marks("alpha").into_iter().fold(f64::MIN, f64::max), marks(KUBE).into_iter().fold(f64::MAX, f64::min));
    assert!(alpha_last < kube_first, "alpha's copy marked a step at {alpha_last} after the pod began at {kube_first}");
    eprintln!(
        "[figure] alpha killed (agent + slurmctld) -> moved to {KUBE} at {decided:.2?}, resumed there from step {at} \
         at {resumed:.2?} (copy lab-east -> lab-central included); {:.2} s between alpha's last step and the pod's \
         first; 0 of {} samples saw two copies",
        kube_first - alpha_last,
        samples.len()
    );
}

fn set_proxy_partition(lab: &Lab, cluster: &str, state: &str) {
    let out = lab.cmd(cluster, "scontrol", &["update", "PartitionName=fleet", &format!("State={state}")]).unwrap();
    assert!(out.status.success(), "scontrol update State={state}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The Job's pod template runs its script under the in-job lease: the
/// helper from an init container, `lease-exec` around the entry, the
/// watchdog's directory a writable emptyDir at /fleet/run, its stop line
/// the container's termination message.
fn assert_leased(job: &serde_json::Value) {
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["initContainers"][0]["name"], "fleet-lease-helper", "{pod}");
    let c = &pod["containers"][0];
    assert_eq!(c["command"][1], "lease-exec", "{pod}");
    assert_eq!(c["terminationMessagePath"], "/dev/termination-log", "{pod}");
    let env =
        |k: &str| c["env"].as_array().into_iter().flatten().find(|e| e["name"] == k).and_then(|e| e["value"].as_str());
    assert_eq!(env("FLEET_LEASE_DIR"), Some("/fleet/run"), "{pod}");
    assert_eq!(env("FLEET_TERMINATION_LOG"), Some("/dev/termination-log"), "{pod}");
    let run = c["volumeMounts"].as_array().into_iter().flatten().find(|m| m["mountPath"] == "/fleet/run").cloned();
    let vol =
        run.and_then(|m| pod["volumes"].as_array().into_iter().flatten().find(|v| v["name"] == m["name"]).cloned());
    assert!(vol.is_some_and(|v| v["emptyDir"].is_object()), "/fleet/run is an emptyDir: {pod}");
}

/// A job placed early at kube-gamma (sbatch time, while its stand-in still
/// waits at beta): its pod starts at once, but `lease-exec` holds the
/// script at its first lease until beta's agent confirms the stand-in
/// runs. Released, the script runs there once; its output and exit code
/// are the stand-in's.
#[test]
fn a_job_placed_early_at_kube_gamma_runs_under_its_lease_once_its_stand_in_runs() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-early");
    let stamp = dir.join("started");
    // beta's proxy partition down: the stand-in cannot start (PartitionDown).
    set_proxy_partition(lab, "beta", "DOWN");
    let _up = fleet_lab::OnDrop(|| set_proxy_partition(lab, "beta", "UP"));
    let body = format!(
        "date +%s.%N > {}\necho \"leased run at $SLURM_CLUSTER_NAME lease_dir=$FLEET_LEASE_DIR\"\n\
         w=no; for i in $(seq 50); do grep -qs watching \"$FLEET_LEASE_DIR/.fleet-lease.log\" && {{ w=yes; break; }}; sleep 0.1; done\n\
         echo \"watchdog log in the lease dir: $w\"\necho to-stderr >&2\nexit 5",
        stamp.display()
    );
    let id = lab
        .sbatch("beta", &["--gres=gpu:h100:1", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")], &script(&body))
        .expect("sbatch at beta");
    let _cancel = fleet_lab::OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    // Known by its fleet id (the stand-in has not started: its record
    // has no origin job id yet).
    let tag = lab.job("beta", id).unwrap()["AdminComment"].clone();
    let fid = fleet_api::wire::parse_admin_tag(&tag).expect("the stand-in is tagged").to_string();
    let fleet_job = || lab.fleetctl_json(&["job", &fid]).unwrap_or_default();
    // Placed early: the Job exists at kube-gamma while the stand-in is pending.
    let t0 = Instant::now();
    let rid = loop {
        let j = fleet_job();
        if let (Some(KUBE), Some(rid)) = (j["target"].as_str(), j["remote_job_id"].as_u64()) {
            assert!(j["reason"].as_str().unwrap_or("").contains("placed early"), "{j}");
            break rid;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "not placed early at kube-gamma: {j}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let name = format!("fleet-{rid}");
    let job = kube_job(lab, &name).expect("the early Job at kube-gamma");
    assert_leased(&job);
    // Its pod runs (lease-exec, waiting for its first lease), the script does not.
    wait_until("the early pod runs", T, || {
        let (ok, out, _) = lab.kubectl(&[
            "get",
            "pods",
            "-n",
            KUBE_NAMESPACE,
            "-l",
            &format!("batch.kubernetes.io/job-name={name}"),
            "-o",
            "jsonpath={.items[*].status.phase}",
        ]);
        ok && out.trim() == "Running"
    });
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(5) {
        assert_eq!(lab.job("beta", id).unwrap()["JobState"], "PENDING");
        assert!(!stamp.exists(), "the script ran before its stand-in started at beta");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Release: the stand-in starts, beta's agent confirms, the script runs.
    let released = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    set_proxy_partition(lab, "beta", "UP");
    let done = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("FAILED", "5:0"), "{done:?}");
    let started: f64 = std::fs::read_to_string(&stamp).unwrap().trim().parse().unwrap();
    assert!(started > released, "the script started at {started}, before its stand-in could ({released})");
    let out = wait_file(&dir.join("out.txt"), Duration::from_secs(10), |b| {
        String::from_utf8_lossy(b).contains("to-stderr\n")
    })
    .unwrap();
    let out = String::from_utf8(out).unwrap();
    // The test server has no mounts: /fleet/run is the pod's emptyDir
    // directory there, and the script sees that path.
    let first = out.lines().next().unwrap_or("");
    assert!(
        first.starts_with(&format!("leased run at {KUBE} lease_dir=/")) && first.ends_with("/volumes/fleet-run"),
        "{out:?}"
    );
    assert!(
        out.contains("\nwatchdog log in the lease dir: yes\n"),
        "the watchdog logs into the pod's emptyDir: {out:?}"
    );
    // Its own exit 5 speaks for itself, as natively: no line of Fleet's.
    assert!(out.ends_with("to-stderr\n") && !out.contains("fleet-proxy"), "{out:?}");
    // The early run is the one that ran: epoch 1, the same Job.
    let rec = fleet_job();
    assert_eq!((rec["epoch"].as_u64(), rec["remote_job_id"].as_u64()), (Some(1), Some(rid)), "{rec}");
    assert_eq!(rec["state"], "failed", "{rec}");
    let job = kube_job(lab, &name).expect("the finished Job stays");
    let term = &job["status"]["conditions"];
    assert!(term.as_array().into_iter().flatten().any(|c| c["type"] == "Failed" && c["status"] == "True"), "{job}");
    eprintln!("[figure] early pod at kube-gamma: script started {:.2} s after beta's release", started - released);
}

/// The pod's lease is not renewed while its run goes on (kube-gamma's
/// agent is stopped, SIGSTOP: the meta-scheduler shortens and then refuses
/// the lease, "the cluster has been silent too long"), so the pod's
/// watchdog stops the script; the agent, continued before the job would
/// move, reads the stop line from the container's termination message and
/// reports the run dead by its lease: the job (not interruptible) ends at
/// beta with the reason in its output.
#[test]
fn a_pod_whose_lease_is_refused_stops_and_its_reason_reaches_beta() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let pid: i32 = std::fs::read_to_string(lab.root.join(format!("{KUBE}/run/agent.pid")))
        .expect("kube-gamma's agent pid file")
        .trim()
        .parse()
        .expect("a pid");
    let signal = |sig: &str| {
        std::process::Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success())
    };
    let _cont = fleet_lab::OnDrop(|| {
        signal("-CONT");
    });
    let dir = lab.workdir("kube-lease-refused");
    let out = dir.join("out.txt");
    let body = "for i in $(seq 1 90); do echo \"step $i at $SLURM_CLUSTER_NAME\"; sleep 1; done\necho end";
    let (id, name, _cancel) =
        at_kube(lab, &["--gres=gpu:h100:1", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")], body);
    assert_leased(&kube_job(lab, &name).expect("the Job"));
    wait_file(&out, T, |b| String::from_utf8_lossy(b).contains(&format!("step 3 at {KUBE}"))).unwrap();
    let fid = fleet_job_of(lab, id).unwrap();
    assert!(copies(&fid).contains(KUBE), "{:?}", copies(&fid));

    let t_stop = Instant::now();
    assert!(signal("-STOP"), "SIGSTOP kube-gamma's agent");
    wait_until("the pod stops itself", Duration::from_secs(40), || !copies(&fid).contains(KUBE));
    let stopped = t_stop.elapsed();
    assert!(signal("-CONT"), "SIGCONT kube-gamma's agent");
    let done = lab.wait_done("beta", id, T).unwrap();
    let all = String::from_utf8_lossy(&std::fs::read(&out).unwrap()).into_owned();
    let rec = fleet_record(lab, id).unwrap();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("FAILED", "1:0"), "{done:?} {rec}");
    assert!(!all.contains("\nend\n"), "the script was stopped: {all}");
    // The watchdog's line, relayed from the pod's log, then the end's
    // reason from the meta-scheduler and the stand-in.
    let stop = format!("fleet: stopping this run of job {fid} at this cluster: its job lease ran out");
    let why =
        format!("its run at {KUBE} died ({KUBE} reports: stopped at {KUBE} by its job lease: its job lease ran out");
    assert!(all.contains(&stop), "{all}");
    let proxy = all.lines().last().unwrap_or("");
    assert!(proxy.starts_with("fleet-proxy: job failed: ") && proxy.contains(&why), "{all}");
    assert!(proxy.contains("not restartable"), "{all}");
    assert_eq!((rec["state"].as_str(), rec["epoch"].as_u64()), (Some("failed"), Some(1)), "{rec}");
    assert!(rec["reason"].as_str().unwrap_or("").contains(&why), "{rec}");
    let (ok, pod, err) = lab.kubectl(&["get", &kube_pods(lab, &name)[0], "-n", KUBE_NAMESPACE, "-o", "json"]);
    assert!(ok, "{err}");
    let pod: serde_json::Value = serde_json::from_str(&pod).unwrap();
    let msg = pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("fleet: stopping this run"), "the termination message: {pod}");
    eprintln!("[figure] kube-gamma's agent stopped -> its pod's lease refused, the pod stopped after {stopped:.2?}");
}

/// `sbatch -N2 --gres=gpu:h100:8` at beta for kube-gamma: an Indexed Job of
/// two completions, both pods started together on kube-gamma's two H100
/// nodes with a headless Service, every rank's output at beta.
#[test]
fn a_two_node_job_at_beta_runs_at_kube_gamma_as_an_indexed_gang() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-gang");
    // Sharded data parallel over 16 GPUs: more than one NVLink domain, so the
    // engine needs the pool's InfiniBand fabric (kube-gamma's H100 pool has
    // one in the lab's model, as the Slurm clusters' do).
    let body = "#FLEET parallelism=fsdp\n\
                echo \"rank $SLURM_PROCID of $SLURM_NTASKS nodes=$SLURM_JOB_NUM_NODES on $HOSTNAME master=$MASTER_ADDR\"";
    let id = lab
        .sbatch(
            "beta",
            &["-N2", "--gres=gpu:h100:8", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")],
            &script(body),
        )
        .expect("sbatch -N2 at beta");
    let (target, rid) = placed(lab, id);
    assert_eq!(target, KUBE);
    let name = format!("fleet-{rid}");
    let job = kube_job(lab, &name).expect("the gang's Job");
    assert_eq!(job["spec"]["completionMode"], "Indexed", "{job}");
    assert_eq!((job["spec"]["completions"].as_u64(), job["spec"]["parallelism"].as_u64()), (Some(2), Some(2)), "{job}");
    let (ok, svc, err) = lab.kubectl(&["get", "service", &name, "-n", KUBE_NAMESPACE, "-o", "json"]);
    assert!(ok, "the gang's headless Service: {err}");
    let svc: serde_json::Value = serde_json::from_str(&svc).unwrap();
    assert_eq!(svc["spec"]["clusterIP"], "None", "{svc}");
    let (ok, nodes, err) = lab.kubectl(&[
        "get",
        "pods",
        "-n",
        KUBE_NAMESPACE,
        "-l",
        &format!("batch.kubernetes.io/job-name={name}"),
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ]);
    assert!(ok, "{err}");
    let mut nodes: Vec<&str> = nodes.split_whitespace().collect();
    nodes.sort();
    assert_eq!(nodes, ["gamma-h100-1", "gamma-h100-2"], "one pod per H100 node");

    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((rec["JobState"].as_str(), rec["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{rec:?}");
    let out =
        wait_file(&dir.join("out.txt"), Duration::from_secs(10), |b| String::from_utf8_lossy(b).lines().count() >= 2)
            .unwrap();
    let out = String::from_utf8(out).unwrap();
    for rank in 0..2 {
        assert!(
            out.contains(&format!("rank {rank} of 2 nodes=2 on {name}-{rank} master={name}-0.{name}")),
            "rank {rank}'s line at beta: {out:?}"
        );
    }
    let ex = lab.fleetctl_json(&["job", "explain", &fleet_job_of(lab, id).unwrap()]).unwrap();
    assert_eq!(ex["ranked"][0]["cluster"], KUBE, "{ex}");
}

/// A job whose image cannot be pulled ends at beta FAILED, with
/// Kubernetes' reason (ErrImagePull / ImagePullBackOff and the image) in
/// the stand-in's output and the meta-scheduler's record; the agent deleted
/// the Job (Kubernetes would retry the pull forever).
#[test]
fn an_image_pull_failure_at_kube_gamma_reaches_beta_with_its_reason() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-pull");
    let id = lab
        .sbatch(
            "beta",
            &[
                "--gres=gpu:h100:1",
                "--fleet-to=kube-gamma",
                "--fleet-image=nonexistent/trainer:1",
                &out_arg(&dir, "out.txt"),
            ],
            &script("echo never"),
        )
        .expect("sbatch");
    let (target, rid) = placed(lab, id);
    assert_eq!(target, KUBE);
    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(rec["JobState"], "FAILED", "{rec:?}");
    let fleet = fleet_record(lab, id).unwrap();
    let reason = fleet["reason"].as_str().unwrap_or("");
    assert!(
        (reason.contains("ErrImagePull") || reason.contains("ImagePullBackOff"))
            && reason.contains("nonexistent/trainer:1"),
        "{fleet}"
    );
    let out = std::fs::read_to_string(dir.join("out.txt")).unwrap_or_default();
    assert!(out.contains("fleet-proxy: job failed: ") && out.contains("nonexistent/trainer:1"), "{out:?}");
    assert!(!out.contains("never"), "{out:?}");
    wait_until("the agent deleted the Job", Duration::from_secs(10), || {
        kube_job(lab, &format!("fleet-{rid}")).is_none()
    });
}

/// kube-gamma's H100 at 0.10 USD/GPU-h (8 GPUs: 0.80 an instance hour).
const CHEAP_KUBE: &str =
    "provider,region,zone,instance_type,gpu_type,gpu_count,vcpus,memory_gib,price_ondemand_usd_hr,price_spot_usd_hr
lab-kube,lab-central,lab-central-1a,kube.h100.8x,H100,8,64,512,0.80,
";
/// kube-gamma's H100 back at the lab model's 2.49 USD/GPU-h.
const LAB_KUBE_PRICE: &str =
    "provider,region,zone,instance_type,gpu_type,gpu_count,vcpus,memory_gib,price_ondemand_usd_hr,price_spot_usd_hr
lab-kube,lab-central,lab-central-1a,kube.h100.8x,H100,8,64,512,19.92,
";

/// A planned migration (rebalancing, docs/failover.md) *to* kube-gamma,
/// like one between Slurm clusters: a checkpointing job runs at alpha; its
/// H100 price drops at kube-gamma (an imported price table); in `auto` mode
/// the job is signalled at alpha, checkpoints, is stopped there and resumes
/// in a pod at kube-gamma from that checkpoint (copied lab-east ->
/// lab-central); the stand-in at beta stays one job and ends with the
/// pod's exit code.
#[test]
fn a_checkpointing_job_moves_from_alpha_to_kube_gamma_when_its_price_drops() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    assert!(lab.root.join("ckpt-stores.toml").exists(), "the lab has no checkpoint stores");
    let import = |csv: &str| {
        let f = lab.workdir("kube-rebalance-prices").join("prices.csv");
        std::fs::write(&f, csv).unwrap();
        lab.fleetctl_json(&["prices", "import", f.to_str().unwrap()]).unwrap();
    };
    let _restore = fleet_lab::OnDrop(|| {
        let _ = lab.fleetctl_json(&["rebalance", "mode", "propose"]);
        import(LAB_KUBE_PRICE);
    });
    assert!(alpha_is(lab, "healthy"), "alpha is healthy before the job is placed");
    let dir = lab.workdir("kube-rebalance");
    let out = dir.join("out.txt");
    const LAST: u64 = 40;
    let body = format!(
        r#"#FLEET estimate=24h
#FLEET ckpt-signal=USR1
set -u
CK={ckpt}
W=$(mktemp -d)
want=0
trap 'want=1' USR1
echo "run at $SLURM_CLUSTER_NAME resume=${{FLEET_RESUME_FROM:-none}}"
step=0
if "$CK" restore "$W/r"; then step=$(cat "$W/r/step.txt"); echo "resumed-at $step"
else rc=$?; [ $rc = 3 ] || {{ echo "restore failed: $rc"; exit 9; }}; fi
while [ $step -lt {LAST} ]; do
  step=$((step + 1)); echo "step $step"; sleep 1
  if [ $((step % 5)) = 0 ] || [ $want = 1 ]; then
    [ $want = 1 ] && echo "signalled $step"
    want=0
    rm -rf "$W/c"; mkdir "$W/c"; echo $step >"$W/c/step.txt"
    "$CK" save "$W/c" --step $step >/dev/null && echo "ckpt $step"
  fi
done
echo end
exit 5"#,
        ckpt = lab.root.join("bin/fleet-ckpt").display()
    );
    let id = lab
        .sbatch(
            "beta",
            &[
                "--gres=gpu:h100:1",
                "--fleet-interruptible",
                "--signal=B:USR1@30",
                "--fleet-to=alpha,kube-gamma",
                "--open-mode=append",
                &out_arg(&dir, "out.txt"),
            ],
            &script(&body),
        )
        .unwrap();
    let _cancel = fleet_lab::OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    let (target, alpha_remote) = placed(lab, id);
    assert_eq!(target, "alpha", "alpha (owned H100s) is cheaper than kube-gamma (on demand)");
    wait_file(&out, T, |b| numbers(&String::from_utf8_lossy(b), "ckpt").contains(&5)).unwrap();
    let fid = fleet_job_of(lab, id).unwrap();
    let v = lab.fleetctl_json(&["rebalance", "mode", "auto"]).unwrap();
    assert_eq!(v["mode"], "auto", "{v}");

    let t_price = Instant::now();
    import(CHEAP_KUBE);
    let moved = wait_file(&out, T, |b| String::from_utf8_lossy(b).contains("resumed-at")).unwrap();
    let to_output = t_price.elapsed();
    let moved = String::from_utf8_lossy(&moved).into_owned();
    let rec = fleet_record(lab, id).unwrap();
    assert_eq!((rec["target"].as_str(), rec["migrations"].as_u64()), (Some(KUBE), Some(1)), "{rec}");
    let a = lab.wait_done("alpha", alpha_remote, T).unwrap();
    assert_eq!(a["JobState"], "CANCELLED", "the run at alpha was stopped: {a:?}");
    let split = moved.rfind("run at ").unwrap();
    let (run1, run2) = moved.split_at(split);
    assert!(run1.starts_with("run at alpha resume=none\n"), "{moved}");
    let signalled = numbers(run1, "signalled");
    assert_eq!(signalled.len(), 1, "one SIGUSR1 at alpha for the move: {moved}");
    let at = numbers(run2, "resumed-at")[0];
    assert_eq!(at, signalled[0], "resumed from the checkpoint the signal asked for: {moved}");
    assert!(
        run2.starts_with(&format!("run at {KUBE} resume=s3://ckpt-lab-central/fleet/beta/{}/{fid}/", fleet_lab::USER)),
        "resumed in a pod from the copy in kube-gamma's region: {run2}"
    );
    let notes: Vec<&str> = moved.lines().filter(|l| l.starts_with("fleet: ")).collect();
    assert_eq!(notes.len(), 1, "{moved}");
    assert!(notes[0].contains(&format!("stopped for a planned move to {KUBE}")), "{}", notes[0]);

    let b = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((b["JobState"].as_str(), b["ExitCode"].as_str()), ("FAILED", "5:0"), "{b:?}");
    let all = String::from_utf8(
        wait_file(&out, Duration::from_secs(15), |b| String::from_utf8_lossy(b).contains("\nend\n")).unwrap(),
    )
    .unwrap();
    let run2 = &all[all.rfind(&format!("run at {KUBE} ")).unwrap()..];
    assert_eq!(numbers(run2, "step"), ((at + 1)..=LAST).collect::<Vec<_>>(), "{all}");
    eprintln!("[figure] planned move alpha -> {KUBE}: price change -> resumed output in the pod after {to_output:.2?}");
}

/// The comment (`squeue -o %k`) of beta's job `id` once it starts with
/// `want` (where the stand-in names its target's reason); fails after `T`.
fn comment_at_beta(lab: &Lab, id: u64, want: &str) -> String {
    let t0 = Instant::now();
    loop {
        let out = lab.cmd("beta", "squeue", &["-h", "-j", &id.to_string(), "-o", "%k"]).unwrap();
        let comment = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if comment.starts_with(want) {
            return comment;
        }
        assert!(
            t0.elapsed() < T,
            "the stand-in's comment at beta does not name the reason {want:?}: {comment:?}; {:?}",
            fleet_record(lab, id)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Another tenant's pods in namespace `default` holding every H100 GPU of
/// kube-gamma, one 8-GPU pod per node (the admin's, which the agent's
/// RBAC cannot list: its capacity counts only its namespaces' pods, so the
/// engine still sees the GPUs free, as it would on a shared cluster).
fn hog_gpus(lab: &Lab, dir: &std::path::Path) -> Vec<String> {
    let mut names = Vec::new();
    for node in ["gamma-h100-1", "gamma-h100-2"] {
        let name = format!("hog-{node}");
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "hog", "image": "ubuntu:24.04", "command": ["sleep", "600"],
                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
        });
        let f = dir.join(format!("{name}.json"));
        std::fs::write(&f, pod.to_string()).unwrap();
        let (ok, _, err) = lab.kubectl(&["create", "--validate=false", "-f", f.to_str().unwrap()]);
        assert!(ok, "kubectl create {name}: {err}");
        names.push(name);
    }
    for n in &names {
        wait_until(&format!("{n} runs"), T, || {
            lab.kubectl(&["get", "pod", n, "-n", "default", "-o", "jsonpath={.status.phase}"]).1 == "Running"
        });
    }
    names
}

/// A job placed at kube-gamma whose pod cannot be scheduled (another
/// tenant holds every H100 there, unseen by the agent): Kubernetes' scheduler
/// leaves the pod Pending with `PodScheduled=False`, reason `Unschedulable`
/// and its message, and that reason reaches beta (the stand-in's comment in
/// `squeue`, the meta-scheduler's record); once the GPUs are free the pod
/// is scheduled and the job ends at beta as it ended there.
#[test]
fn an_unschedulable_pod_at_kube_gamma_shows_its_reason_at_beta_and_runs_once_the_gpus_free() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-unschedulable");
    let hogs = hog_gpus(lab, &dir);
    let free = || {
        for h in &hogs {
            let _ = lab.kubectl(&["delete", "pod", h, "-n", "default", "--wait=false", "--ignore-not-found"]);
        }
    };
    let _free = fleet_lab::OnDrop(free);
    let (id, name, _cancel) = at_kube(
        lab,
        &["--gres=gpu:h100:8", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")],
        "echo ran at $SLURM_CLUSTER_NAME",
    );
    // At kube-gamma: the scheduler's verdict on the pod.
    let mut msg = String::new();
    wait_until("the pod is Unschedulable", T, || {
        let Some(pod) = kube_pods(lab, &name).first().cloned() else { return false };
        let (ok, out, _) = lab.kubectl(&["get", &pod, "-n", KUBE_NAMESPACE, "-o", "json"]);
        let Ok(p) = serde_json::from_str::<serde_json::Value>(&out) else { return false };
        let c =
            p["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "PodScheduled").cloned();
        msg = c.as_ref().and_then(|c| c["message"].as_str()).unwrap_or("").to_string();
        ok && p["status"]["phase"] == "Pending"
            && c.is_some_and(|c| c["status"] == "False" && c["reason"] == "Unschedulable")
    });
    assert!(msg.starts_with("0/3 nodes are available: ") && msg.contains("2 Insufficient nvidia.com/gpu"), "{msg}");
    // At beta: the stand-in's comment and the record carry it.
    let rid = name.strip_prefix("fleet-").unwrap();
    let comment =
        comment_at_beta(lab, id, &format!("fleet: {KUBE} job {rid} pending: Unschedulable: 0/3 nodes are available: "));
    assert!(comment.contains("Insufficient nvidia.com/gpu"), "{comment}");
    let rec = fleet_record(lab, id).unwrap();
    assert_eq!(rec["state"], "pending", "{rec}");
    assert!(rec["reason"].as_str().unwrap_or("").starts_with("Unschedulable: 0/3 nodes are available: "), "{rec}");
    assert_eq!(lab.job("beta", id).unwrap()["JobState"], "RUNNING", "the stand-in waits");

    // The other tenant's pods end: the pod is scheduled and runs.
    let t_free = Instant::now();
    free();
    let done = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{done:?}");
    let out = wait_file(&dir.join("out.txt"), Duration::from_secs(5), |b| b.ends_with(b"\n")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out), format!("ran at {KUBE}\n"));
    eprintln!("[figure] GPUs freed at kube-gamma -> the unschedulable job done at beta: {:.2?}", t_free.elapsed());
}

/// A ResourceQuota `name` of `hard` GPUs (`requests.nvidia.com/gpu`) in
/// the lab's namespace at kube-gamma: what lifts it, and a guard that does
/// when the test ends, whatever happens.
fn gpu_quota<'a>(
    lab: &'a Lab,
    dir: &std::path::Path,
    name: &'a str,
    hard: u32,
) -> (impl Fn() + Copy + 'a, fleet_lab::OnDrop<impl FnMut() + 'a>) {
    let quota = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &quota,
        format!(
            "apiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: {name}\n  namespace: {KUBE_NAMESPACE}\n\
             spec:\n  hard:\n    requests.nvidia.com/gpu: \"{hard}\"\n"
        ),
    )
    .unwrap();
    let (ok, _, err) = lab.kubectl(&["create", "--validate=false", "-f", &quota.display().to_string()]);
    assert!(ok, "{err}");
    let lift = move || {
        let _ = lab.kubectl(&["delete", "resourcequota", name, "-n", KUBE_NAMESPACE, "--ignore-not-found"]);
    };
    (lift, fleet_lab::OnDrop(lift))
}

/// A job whose namespace's ResourceQuota at kube-gamma refuses its pod
/// (a team's GPU quota: the API server forbids the pod and the Job
/// controller says why only in a `FailedCreate` event on the Job) waits at
/// beta with that reason in its stand-in's comment, not silently, and runs
/// once the quota allows it. The test double enforces ResourceQuotas as the
/// API server does for the keys it knows (tests/kube-server).
#[test]
fn a_pod_refused_by_a_resource_quota_shows_why_at_beta_and_runs_once_the_quota_allows() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-quota");
    let (lift, _lift) = gpu_quota(lab, &dir, "gpu-quota", 0);
    let (id, name, _cancel) = at_kube(
        lab,
        &["--gres=gpu:h100:1", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")],
        "echo ran at $SLURM_CLUSTER_NAME",
    );
    // At kube-gamma: no pod, and the Job controller's event says why.
    wait_until("the Job's FailedCreate event", T, || {
        let (ok, out, _) = lab.kubectl(&[
            "get",
            "events",
            "-n",
            KUBE_NAMESPACE,
            "--field-selector",
            &format!("involvedObject.name={name},reason=FailedCreate"),
            "-o",
            "json",
        ]);
        ok && out.contains("exceeded quota: gpu-quota")
    });
    assert!(kube_pods(lab, &name).is_empty(), "the quota let a pod through");
    // At beta: the stand-in's comment and the record name the quota.
    let rid = name.strip_prefix("fleet-").unwrap();
    let comment = comment_at_beta(
        lab,
        id,
        &format!("fleet: {KUBE} job {rid} pending: FailedCreate: Error creating: pods \"{name}-"),
    );
    assert!(comment.contains("exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1"), "{comment}");
    assert_eq!(lab.job("beta", id).unwrap()["JobState"], "RUNNING", "the stand-in waits");
    // The quota is lifted: the Job controller creates the pod and it runs.
    lift();
    let done = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{done:?}");
    let out = wait_file(&dir.join("out.txt"), Duration::from_secs(5), |b| b.ends_with(b"\n")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out), format!("ran at {KUBE}\n"));
}

/// kube-gamma's GPU quota in placement: a ResourceQuota on
/// `requests.nvidia.com/gpu` in namespace fleet (where alice's jobs run,
/// account `lab`; bob's go to team-vision, which has none) reaches the
/// meta-scheduler with the agent's heartbeats as `gpu_quotas`: the hard
/// limit, whom it binds, and the GPUs its pods take (alice's running job's
/// one, none after it ended); deleted, it is gone from the view. What
/// placement does with it (a full quota sends the job where it can start)
/// is tested in fleet-api and fleet-metasched (`within_quotas`).
#[test]
fn a_namespaces_gpu_quota_reaches_placement_with_whom_it_binds_and_what_its_pods_take() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-quota-view");
    let (lift, _lift) = gpu_quota(lab, &dir, "gpu-view", 2);
    let quotas = || {
        let v = lab.fleetctl_json(&["clusters"]).unwrap_or_default();
        let c = v["clusters"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == KUBE).cloned());
        c.map(|c| c["gpu_quotas"].clone()).unwrap_or_default()
    };
    let want = |used: u64| serde_json::json!([{"scope": format!("namespace {KUBE_NAMESPACE}"), "users": ["*:alice"], "hard": 2, "used": used}]);
    wait_until("the quota in the meta-scheduler's view", T, || quotas() == want(0));
    // The agent's own check says what placement sees.
    let report = lab.agent_check(KUBE);
    let line = report.lines().find(|l| l.contains("kubernetes")).unwrap_or_default();
    assert!(line.starts_with("PASS") && line.contains(&format!("GPU quotas {KUBE_NAMESPACE} 0/2")), "{report}");
    // alice's job at kube-gamma takes one GPU of it while it runs.
    let flag = dir.join("go");
    let body = format!("while [ ! -e {} ]; do sleep 0.2; done\necho done", flag.display());
    let (id, _name, _cancel) =
        at_kube(lab, &["--gres=gpu:h100:1", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")], &body);
    wait_until("its pod counted in the quota", T, || quotas() == want(1));
    std::fs::write(&flag, b"").unwrap();
    let done = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(done["JobState"], "COMPLETED", "{done:?}");
    wait_until("the ended pod no longer counted", T, || quotas() == want(0));
    lift();
    wait_until("the quota gone from the view", T, || quotas().is_null());
}

/// A job over its `--mem` at kube-gamma: the pod's memory limit is
/// enforced as the kernel does in a container's cgroup (kube-server's OOM
/// killer: the whole container SIGKILLed, `OOMKilled`, exit code 137), and
/// the job ends `OUT_OF_MEMORY` at beta as a forwarded Slurm job does
/// (the proxy fills its own cgroup, tests/control.rs), with the reason.
/// Unlike Slurm's cgroup, which kills only the process that overran,
/// Kubernetes kills the container: the script does not go on.
#[test]
fn a_pod_over_its_memory_limit_at_kube_gamma_ends_out_of_memory_at_beta() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-oom");
    let body =
        "echo started\npython3 -c 'import time; x = bytearray(300 << 20); time.sleep(60)'\necho survived\nexit 0";
    let (id, name, _cancel) =
        at_kube(lab, &["--gres=gpu:h100:1", "--mem=100M", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")], body);
    let job = kube_job(lab, &name).expect("the Job");
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"], "100Mi", "{job}");
    let t0 = Instant::now();
    let done = lab.wait_done("beta", id, T).unwrap();
    let took = t0.elapsed();
    // At kube-gamma: the container was OOM-killed.
    let (ok, pod, err) = lab.kubectl(&["get", &kube_pods(lab, &name)[0], "-n", KUBE_NAMESPACE, "-o", "json"]);
    assert!(ok, "{err}");
    let pod: serde_json::Value = serde_json::from_str(&pod).unwrap();
    let term = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!((term["reason"].as_str(), term["exitCode"].as_i64()), (Some("OOMKilled"), Some(137)), "{pod}");
    // At beta: OUT_OF_MEMORY, as for a Slurm target.
    assert_eq!(done["JobState"], "OUT_OF_MEMORY", "{done:?}");
    assert_eq!(done["Reason"], "OutOfMemory", "{done:?}");
    let rec = fleet_record(lab, id).unwrap();
    assert!(rec["reason"].as_str().unwrap_or("").starts_with(&format!("OUT_OF_MEMORY at {KUBE}: OOMKilled")), "{rec}");
    let o = lab.cmd("beta", "squeue", &["-h", "-t", "all", "-o", "%T", "-j", &id.to_string()]).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "OUT_OF_MEMORY");
    let out = std::fs::read_to_string(dir.join("out.txt")).unwrap_or_default();
    assert!(out.starts_with("started\n"), "{out:?}");
    assert!(!out.contains("survived"), "the container was killed whole: {out:?}");
    assert!(out.contains(&format!("OUT_OF_MEMORY at {KUBE}: OOMKilled")), "the job's stderr names it: {out:?}");
    eprintln!(
        "[figure] OOM at kube-gamma -> OUT_OF_MEMORY at beta {took:.2?} after placement; ExitCode {}",
        done["ExitCode"]
    );
}

/// `kubectl drain` of the node that runs the pod of kube-gamma Job
/// `name` (only that pod evicted): the pod, the node, what kubectl said
/// (stdout and stderr), and a guard that uncordons the node.
fn drain_node_of<'a>(lab: &'a Lab, name: &str) -> (String, String, String, fleet_lab::OnDrop<impl FnMut() + 'a>) {
    let pod = kube_pods(lab, name)[0].clone();
    let (ok, node, err) = lab.kubectl(&["get", &pod, "-n", KUBE_NAMESPACE, "-o", "jsonpath={.spec.nodeName}"]);
    assert!(ok && node.starts_with("gamma-h100-"), "{node} {err}");
    let node = node.trim().to_string();
    let n = node.clone();
    let uncordon = fleet_lab::OnDrop(move || {
        let _ = lab.kubectl(&["uncordon", &n]);
    });
    let (ok, out, err) = lab.kubectl(&[
        "drain",
        &node,
        "--delete-emptydir-data",
        "--ignore-daemonsets",
        &format!("--pod-selector=batch.kubernetes.io/job-name={name}"),
        "--timeout=60s",
    ]);
    assert!(ok, "kubectl drain: {out} {err}");
    (pod, node, format!("{out}\n{err}"), uncordon)
}

/// `kubectl drain` of the node a job's pod runs on at kube-gamma (the
/// Eviction API, as an admin draining a node for maintenance does): the
/// pod gets `DisruptionTarget` (`EvictionByEvictionAPI`), is stopped and
/// deleted, and the Job fails by its podFailurePolicy. The agent reports
/// the run as died with its node, like `NODE_FAIL` at a Slurm target, with
/// the condition. The job (neither checkpointed nor interruptible) fails at
/// beta with that reason. A drain stops the container with SIGTERM, so the
/// pod's `lease-exec` claims the script's end by signal 15 before the
/// agent's report; the report says the run was `disrupted` (no user
/// signalled it), so that claim is not taken as the job's end: the reason
/// is the node failure, not `signal 15, as its script claimed`.
#[test]
fn a_pod_evicted_by_kubectl_drain_at_kube_gamma_is_a_node_failure_at_beta() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let dir = lab.workdir("kube-evict");
    let out = dir.join("out.txt");
    let (id, name, _cancel) = at_kube(
        lab,
        &["--gres=gpu:h100:8", "--fleet-to=kube-gamma", &out_arg(&dir, "out.txt")],
        "echo started\nfor i in $(seq 120); do sleep 1; done\necho end",
    );
    wait_file(&out, T, |b| b.starts_with(b"started\n")).expect("the pod runs");
    let t0 = Instant::now();
    let (pod, node, drained, _uncordon) = drain_node_of(lab, &name);
    assert!(drained.contains(&format!("{pod} evicted")), "{drained}");
    assert!(drained.contains(&format!("node/{node} drained")), "{drained}");
    assert_cordoned(lab, &node);

    let done = lab.wait_done("beta", id, T).unwrap();
    let took = t0.elapsed();
    assert_eq!(done["JobState"], "FAILED", "{done:?}");
    let rec = fleet_record(lab, id).unwrap();
    let reason = rec["reason"].as_str().unwrap_or("");
    assert_eq!(rec["state"], "failed", "{rec}");
    assert!(reason.contains(&format!("NODE_FAIL at {KUBE}: ")), "{rec}");
    assert!(reason.contains("EvictionByEvictionAPI") || reason.contains("has condition DisruptionTarget"), "{rec}");
    assert!(!reason.contains("as its script claimed"), "the drain's SIGTERM is not the job's own end: {rec}");
    let all = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(all.starts_with("started\n") && !all.contains("\nend\n"), "{all}");
    assert!(all.lines().last().unwrap_or("").starts_with("fleet-proxy: "), "{all}");
    // Kubernetes agrees: the Job failed by its policy (unless the agent,
    // seeing the pod's condition first, deleted it), the pod is gone.
    if let Some(job) = kube_job(lab, &name) {
        let c = job["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Failed").cloned();
        assert!(c.is_some_and(|c| c["reason"] == "PodFailurePolicy"), "{job}");
    }
    assert!(kube_pods(lab, &name).is_empty(), "the evicted pod was deleted");
    eprintln!("[figure] kubectl drain at kube-gamma -> job failed at beta with NODE_FAIL: {took:.2?}");
}

/// An interruptible job at kube-gamma (its output in workdir `dir`,
/// appended) whose first run traps SIGTERM, says so and exits 0 (as a
/// checkpointing job saves and leaves), and whose second run ends at once;
/// returned once the first run has started: its id at beta, its Job's
/// name, its output file and the cancel guard.
fn drainable_at_kube<'a>(
    lab: &'a Lab,
    dir: &str,
) -> (u64, String, std::path::PathBuf, fleet_lab::OnDrop<impl FnMut() + 'a>) {
    let dir = lab.workdir(dir);
    let out = dir.join("out.txt");
    let (id, name, cancel) = at_kube(
        lab,
        &[
            "--gres=gpu:h100:8",
            "--fleet-interruptible",
            "--fleet-to=kube-gamma",
            "--open-mode=append",
            &out_arg(&dir, "out.txt"),
        ],
        "echo \"run $FLEET_EPOCH\"\nif [ \"$FLEET_EPOCH\" = 1 ]; then\n\
         trap 'echo \"saved at SIGTERM\"; exit 0' TERM\n\
         for i in $(seq 120); do sleep 1; done\nfi\necho end",
    );
    wait_file(&out, T, |b| b.starts_with(b"run 1\n")).expect("the first run starts");
    (id, name, out, cancel)
}

/// Waits for a [`drainable_at_kube`] job to end at beta and checks it ran
/// twice at kube-gamma (epoch 2, one move) and completed there once:
/// its output.
fn ran_again_and_completed(lab: &Lab, id: u64, out: &std::path::Path) -> String {
    let done = lab.wait_done("beta", id, T).unwrap();
    let all = String::from_utf8_lossy(
        &wait_file(out, Duration::from_secs(15), |b| String::from_utf8_lossy(b).contains("\nend\n")).unwrap(),
    )
    .into_owned();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{done:?}\n{all}");
    let rec = fleet_record(lab, id).unwrap();
    assert_eq!((rec["state"].as_str(), rec["target"].as_str()), (Some("completed"), Some(KUBE)), "{rec}");
    assert_eq!((rec["epoch"].as_u64(), rec["migrations"].as_u64()), (Some(2), Some(1)), "{rec}");
    let runs: Vec<&str> = all.lines().filter(|l| l.starts_with("run ")).collect();
    assert_eq!(runs, ["run 1", "run 2"], "{all}");
    assert_eq!(all.matches("\nend\n").count(), 1, "{all}");
    all
}

/// A drained node is left cordoned.
fn assert_cordoned(lab: &Lab, node: &str) {
    let (_, cordoned, _) = lab.kubectl(&["get", "node", node, "-o", "jsonpath={.spec.unschedulable}"]);
    assert_eq!(cordoned, "true");
}

/// An interruptible job whose pod `kubectl drain` evicts at kube-gamma
/// runs again, as a Slurm job requeued after a node failure would. Its
/// script catches the drain's SIGTERM and exits 0 (as a checkpointing job
/// saves and leaves), so Kubernetes counts the Job complete and the pod
/// is deleted as it ends; the pod's `lease-exec` claims that exit, noting
/// the kill of the whole pod came first. Neither is the job's end: the
/// agent remembers the pod's `DisruptionTarget` from its watch and reports
/// the run died with its node, and
/// the meta-scheduler places it again (at kube-gamma's other H100 node,
/// the drained one cordoned); the stand-in at beta ends COMPLETED with
/// both runs' output (`--open-mode=append`).
#[test]
fn an_interruptible_job_drained_at_kube_gamma_runs_again_and_completes_at_beta() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let (id, name, out, _cancel) = drainable_at_kube(lab, "kube-drain-rerun");
    let t0 = Instant::now();
    let (_, node, _, _uncordon) = drain_node_of(lab, &name);
    let all = ran_again_and_completed(lab, id, &out);
    let took = t0.elapsed();
    assert!(all.contains("saved at SIGTERM\n"), "the first run's trap ran: {all}");
    // The second pod ran on the node the drain left schedulable.
    assert_cordoned(lab, &node);
    eprintln!("[figure] kubectl drain at kube-gamma -> interruptible job ran again and completed at beta: {took:.2?}");
}

/// The same drain while kube-gamma's agent is down: no watch sees the
/// pod's `DisruptionTarget` (the pod is deleted as its script, which
/// catches the SIGTERM, exits 0), and the agent that comes back finds only
/// a `Complete` Job and reports it completed, as Kubernetes has it. The
/// run's own end claim, kept by the meta-scheduler, says that exit came
/// after the kill of the whole pod, which no user asked for: the run was
/// taken away (`ends::killed_success`), and the job runs again and
/// completes at beta with both runs' output (less what the first printed
/// while its agent was down: its log went with its pod).
#[test]
fn an_interruptible_job_drained_while_its_agent_is_down_runs_again() {
    let (lab, _serial) = Lab::lock();
    lab.require_kube();
    let (id, name, out, _cancel) = drainable_at_kube(lab, "kube-drain-agent-down");
    let down = std::cell::Cell::new(true);
    let _back = fleet_lab::OnDrop(|| {
        if down.get() {
            let _ = lab.lab_sh(&["start-agent", KUBE]);
        }
    });
    assert!(lab.lab_sh(&["stop-agent", KUBE]).unwrap().status.success());
    let (_, node, _, _uncordon) = drain_node_of(lab, &name);
    wait_until("Kubernetes counts the drained Job complete", T, || {
        kube_job(lab, &name).is_some_and(|j| {
            j["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Complete" && c["status"] == "True"))
        })
    });
    assert!(kube_pods(lab, &name).is_empty(), "the evicted pod is deleted");
    let t0 = Instant::now();
    assert!(lab.lab_sh(&["start-agent", KUBE]).unwrap().status.success());
    down.set(false);
    ran_again_and_completed(lab, id, &out);
    let took = t0.elapsed();
    // What the first run printed while its agent was down (the trap's
    // line) went with its pod: no one was there to read its log before
    // the eviction deleted it (a known loss; a Slurm job's file keeps it).
    assert_cordoned(lab, &node);
    eprintln!(
        "[figure] kube-gamma's agent back after a drain it missed -> job ran again and completed at beta: {took:.2?}"
    );
}
