//! End-to-end tests of the Kubernetes target: jobs submitted with plain
//! `sbatch` at beta (real Slurm, our plugins) that the meta-scheduler places
//! on kube-gamma, the lab's Kubernetes cluster (tests/kube-server, a test
//! double of the API server, with an agent of `Backend=kubernetes`), seen
//! at beta as any forwarded job, and in Kubernetes through the real `kubectl`.
//!
//! The lab must have kube-gamma (`FLEET_LAB_KUBE=1`, what `make test` and
//! the harness use): without it these tests fail, they do not skip.

use std::time::{Duration, Instant};

use fleet_lab::{fleet_job_of, out_arg, remote_of, script, wait_file, Lab, KUBE, KUBE_NAMESPACE};

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
