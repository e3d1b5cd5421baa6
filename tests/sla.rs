//! The provisioning SLA end to end against the real lab (issue 8, docs/
//! failover.md "Provisioning SLA"): the test turns the SLA on (it adds
//! `[sla]` to the lab's metasched.toml and restarts the meta-scheduler),
//! sets alpha's GPU partition DOWN (alpha takes jobs and keeps them
//! PENDING), and submits an H100 job at beta that the engine places at
//! alpha. Past the deadline the meta-scheduler cancels it at alpha first
//! and then places it at delta (the lab's other H100 cluster), where it
//! runs once; the stand-in at beta gets its output and exit code and one
//! stderr note, and alpha is SLA-degraded with the reason. Alpha's and
//! delta's queues are sampled throughout: the job is never live at both.
//! Whatever happens, alpha's partition is UP again and the meta-scheduler
//! runs its original configuration (no `[sla]`) when the test ends.
//!
//! Without `[sla]`, a job waiting at a cluster whose nodes all drain moves
//! too, after the lab's `[health] stranded_s` (20 s): cancelled there
//! first, run once at delta.

use std::time::{Duration, Instant};

use fleet_lab::{fleet_job_of, fleet_record, out_arg, remote_of, script, Lab, OnDrop, Sampler};

/// The lab's provisioning deadline for this test (seconds).
const DEADLINE_S: u64 = 20;
/// alpha recovers this long after its miss (a rerun against the same lab
/// finds it SLA-degraded by the last run's miss until then: the samples
/// are kept in the meta-scheduler's database).
const COOLDOWN_S: u64 = 60;

/// Polls `f` every 200 ms until it returns `Some`, for at most `limit`.
fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The Slurm states of the copies of fleet job `fid` at `cluster` (the
/// jobs its agent submitted in the job's directory, `agent/jobs/<fid>`),
/// as (job id, state).
fn copies_at(lab: &Lab, cluster: &str, fid: &str) -> Vec<(String, String)> {
    let Ok(out) = lab.cmd(cluster, "scontrol", &["-o", "show", "job"]) else { return Vec::new() };
    let tag = format!("WorkDir={}/agent/jobs/{fid} ", lab.root.join(cluster).display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&tag))
        .map(fleet_lab::parse_record)
        .map(|r| (r.get("JobId").cloned().unwrap_or_default(), r.get("JobState").cloned().unwrap_or_default()))
        .collect()
}

/// Samples, every 250 ms, how many live copies of fleet job `fid` alpha
/// and delta each have.
fn live_copies(lab: &'static Lab, fid: &str) -> Sampler<(usize, usize)> {
    let fid = fid.to_string();
    Sampler::start(Duration::from_millis(250), move || {
        let n = |c| copies_at(lab, c, &fid).iter().filter(|(_, s)| live(s)).count();
        (n("alpha"), n("delta"))
    })
}

/// A copy that exists in Slurm and is not over.
fn live(state: &str) -> bool {
    !fleet_lab::is_terminal(state)
}

/// `scontrol update PartitionName=gpu State=<state>` at `cluster`.
fn set_gpu_partition(lab: &Lab, cluster: &str, state: &str) -> bool {
    lab.cmd(cluster, "scontrol", &["update", "PartitionName=gpu", &format!("State={state}")])
        .is_ok_and(|o| o.status.success())
}

/// `scontrol update NodeName=<nodes> State=<state>` at `cluster`.
fn set_nodes(lab: &Lab, cluster: &str, nodes: &str, state: &str) -> bool {
    let mut args = vec!["update".to_string(), format!("NodeName={nodes}"), format!("State={state}")];
    if state == "DRAIN" {
        args.push("Reason=fleet-lab-test".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    lab.cmd(cluster, "scontrol", &args).is_ok_and(|o| o.status.success())
}

/// alpha's GPU partition set DOWN (alpha takes jobs and keeps them
/// PENDING; its heartbeat shows its nodes idle), then an H100 job from
/// beta whose copies mark each start per cluster (written by the copy
/// itself, not relayed), print where they ran and exit `code` after
/// `sleep_s`; stdout and stderr in `dir`. Returns the stand-in's id, the
/// job's id at alpha, its fleet id and a sampler of its live copies at
/// alpha and delta (every 250 ms).
fn pending_at_alpha(
    lab: &'static Lab,
    dir: &std::path::Path,
    sleep_s: u32,
    code: u8,
) -> (u64, u64, String, Sampler<(usize, usize)>) {
    assert!(set_gpu_partition(lab, "alpha", "DOWN"), "cannot set alpha's gpu partition DOWN");
    let body = format!(
        "echo \"ran at $SLURM_CLUSTER_NAME\"\ndate +%s.%N >> {}/marks-$SLURM_CLUSTER_NAME\nsleep {sleep_s}\nexit {code}",
        dir.display()
    );
    let err_arg = format!("--error={}/err.txt", dir.display());
    let id = lab.sbatch("beta", &["--gres=gpu:h100:1", &out_arg(dir, "out.txt"), &err_arg], &script(&body)).unwrap();
    let (target, alpha_job) =
        poll("the job is submitted at alpha", Duration::from_secs(60), || remote_of(lab, id).filter(|(_, r)| *r != 0));
    assert_eq!(target, "alpha", "the engine places an H100 job from beta at alpha");
    let fid = fleet_job_of(lab, id).unwrap();
    let sampler = live_copies(lab, &fid);
    assert_eq!(
        lab.job("alpha", alpha_job).and_then(|r| r.get("JobState").cloned()).as_deref(),
        Some("PENDING"),
        "alpha keeps the job pending (its partition is down)"
    );
    (id, alpha_job, fid, sampler)
}

/// `cluster`'s entry in `fleetctl --json clusters`.
fn cluster_entry(lab: &Lab, cluster: &str) -> serde_json::Value {
    let v = lab.fleetctl_json(&["clusters"]).unwrap_or_default();
    v["clusters"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == cluster).cloned()).unwrap_or_default()
}

fn restart_metasched(lab: &Lab) {
    let stop = lab.lab_sh(&["stop-metasched"]).unwrap();
    assert!(stop.status.success(), "stop-metasched: {}", String::from_utf8_lossy(&stop.stderr));
    let start = lab.lab_sh(&["start-metasched"]).unwrap();
    assert!(start.status.success(), "start-metasched: {}", String::from_utf8_lossy(&start.stderr));
}

#[test]
fn a_job_pending_past_its_provisioning_deadline_is_cancelled_and_runs_once_elsewhere() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("sla");
    let conf = lab.root.join("metasched.toml");
    let original = std::fs::read_to_string(&conf).expect("the lab's metasched.toml");
    assert!(!original.contains("[sla]"), "the lab runs without [sla] by default:\n{original}");
    // Whatever happens: alpha's partition is UP again and the meta-scheduler
    // runs the lab's own configuration (the SLA off) for the next test.
    let _restore = OnDrop(|| {
        let _ = set_gpu_partition(lab, "alpha", "UP");
        let _ = std::fs::write(&conf, &original);
        let _ = lab.lab_sh(&["stop-metasched"]);
        let _ = lab.lab_sh(&["start-metasched"]);
    });
    let sla = format!("\n[sla]\ndeadline_s = {DEADLINE_S}\nwindow = 5\nrecover_runs = 1\ncooldown_s = {COOLDOWN_S}\n");
    std::fs::write(&conf, format!("{original}{sla}")).unwrap();
    restart_metasched(lab);
    assert_eq!(cluster_entry(lab, "alpha")["sla"]["deadline_s"].as_f64(), Some(DEADLINE_S as f64));
    // An earlier run's miss at alpha has cooled down (else the engine
    // would not place the job there).
    poll("alpha is not SLA-degraded", Duration::from_secs(COOLDOWN_S + 15), || {
        (cluster_entry(lab, "alpha")["sla"]["state"] == "ok").then_some(())
    });

    // alpha takes jobs and keeps them pending; the job runs 2 s and exits 3.
    let t0 = Instant::now();
    let (id, alpha_job, fid, sampler) = pending_at_alpha(lab, &dir, 2, 3);
    let submitted = t0.elapsed();

    // Past the deadline: cancelled at alpha first.
    let reason = poll("the SLA miss is decided", Duration::from_secs(DEADLINE_S + 30), || {
        let r = fleet_record(lab, id)?;
        let reason = r["reason"].as_str().unwrap_or("").to_string();
        reason.contains("provisioning deadline").then_some(reason)
    });
    let decided = t0.elapsed();
    assert!(
        decided >= Duration::from_secs(DEADLINE_S) - Duration::from_secs(1),
        "decided {decided:?} after the submission, before the {DEADLINE_S} s deadline: {reason}"
    );
    assert!(reason.contains("not running at alpha "), "{reason}");
    let alpha_state = poll("alpha's copy is cancelled", Duration::from_secs(30), || {
        lab.job("alpha", alpha_job).and_then(|r| r.get("JobState").cloned()).filter(|s| s != "PENDING")
    });
    assert_eq!(alpha_state, "CANCELLED");
    let cancelled = t0.elapsed();

    // Then placed at delta, where it runs.
    let delta_job = poll("the job is placed at delta", Duration::from_secs(60), || {
        remote_of(lab, id).filter(|(t, r)| t == "delta" && *r != 0).map(|(_, r)| r)
    });
    poll("the job runs at delta", Duration::from_secs(60), || dir.join("marks-delta").exists().then_some(()));
    let running_elsewhere = t0.elapsed();
    let done = lab.wait_done("beta", id, Duration::from_secs(90)).unwrap();
    let samples = sampler.finish();

    // The stand-in: delta's output once, its exit code, one note.
    assert_eq!(done["JobState"], "FAILED", "{done:?}");
    assert_eq!(done["ExitCode"], "3:0", "{done:?}");
    let out = std::fs::read_to_string(dir.join("out.txt")).unwrap();
    assert_eq!(out, "ran at delta\n");
    let err = std::fs::read_to_string(dir.join("err.txt")).unwrap();
    let notes: Vec<&str> = err.lines().collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(notes[0].starts_with(&format!("fleet: run 1 of job {fid} was not running at alpha ")), "{err}");
    assert!(
        notes[0].ends_with(&format!(
            "after its assignment (provisioning deadline {DEADLINE_S} s); cancelled there, re-placing it elsewhere"
        )),
        "{err}"
    );

    // It ran once, at delta only; alpha never started it.
    assert!(!dir.join("marks-alpha").exists(), "the job ran at alpha");
    let marks = std::fs::read_to_string(dir.join("marks-delta")).unwrap();
    assert_eq!(marks.lines().count(), 1, "delta started it {} times", marks.lines().count());
    let at_delta = copies_at(lab, "delta", &fid);
    assert_eq!(at_delta.len(), 1, "one copy at delta: {at_delta:?}");
    assert_eq!(at_delta[0].0, delta_job.to_string());
    let at_alpha = copies_at(lab, "alpha", &fid);
    assert!(at_alpha.iter().all(|(_, s)| s == "CANCELLED"), "alpha: {at_alpha:?}");

    // Never two copies: no sample saw the job live at both clusters.
    let both = samples.iter().filter(|(_, (a, d))| *a > 0 && *d > 0).count();
    assert!(samples.len() > 20, "too few samples: {}", samples.len());
    assert_eq!(both, 0, "samples with live copies at alpha and delta: {samples:?}");
    assert!(samples.iter().all(|(_, (a, d))| *a <= 1 && *d <= 1), "{samples:?}");
    // The sampler saw each copy (it does find them).
    assert!(samples.iter().any(|(_, (a, _))| *a == 1), "no sample saw alpha's copy: {samples:?}");
    assert!(samples.iter().any(|(_, (_, d))| *d == 1), "no sample saw delta's copy: {samples:?}");

    // alpha is SLA-degraded, and says why.
    let alpha = cluster_entry(lab, "alpha");
    assert_eq!(alpha["sla"]["state"], "degraded", "{alpha}");
    assert!(alpha["sla"]["missed"].as_u64() >= Some(1), "{alpha}");
    let why = alpha["sla"]["why"].as_str().unwrap_or("");
    assert!(why.contains("missed") && why.contains("degraded until"), "{why}");
    let table = lab.lab_sh(&["fleetctl", "clusters"]).unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table.lines().find(|l| l.starts_with("alpha")).unwrap_or("");
    assert!(row.contains("degraded") && row.contains("sla: missed"), "fleetctl clusters:\n{table}");

    eprintln!(
        "sla figures (deadline {DEADLINE_S} s): submitted at alpha {:.1} s after sbatch, miss decided at {:.1} s, \
         alpha's copy cancelled at {:.1} s, running at delta at {:.1} s ({:.1} s after the decision); \
         {} samples of both queues, {both} with two live copies",
        submitted.as_secs_f64(),
        decided.as_secs_f64(),
        cancelled.as_secs_f64(),
        running_elsewhere.as_secs_f64(),
        (running_elsewhere - decided).as_secs_f64(),
        samples.len(),
    );
}

/// The lab's `[health] stranded_s` (tests/lab/lab.sh).
const STRANDED_S: u64 = 20;

#[test]
fn a_job_waiting_at_a_cluster_whose_nodes_all_drain_is_cancelled_there_and_runs_once_elsewhere() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("stranded");
    let conf = std::fs::read_to_string(lab.root.join("metasched.toml")).expect("the lab's metasched.toml");
    assert!(conf.contains(&format!("stranded_s = {STRANDED_S}\n")) && !conf.contains("[sla]"), "{conf}");
    // Whatever happens, alpha is whole again, and seen so by the
    // meta-scheduler, before the next test places a job.
    let _restore = OnDrop(|| {
        let _ = set_nodes(lab, "alpha", "alpha1,alpha2", "RESUME");
        let _ = set_gpu_partition(lab, "alpha", "UP");
        let _ = lab.wait_gpus_free("alpha", "h100", 16, Duration::from_secs(60));
    });
    lab.wait_gpus_free("alpha", "h100", 16, Duration::from_secs(60)).unwrap();
    let (id, _, fid, sampler) = pending_at_alpha(lab, &dir, 0, 4);

    // Both of alpha's nodes drain (an admin's maintenance, a health check).
    assert!(set_nodes(lab, "alpha", "alpha1,alpha2", "DRAIN"), "cannot drain alpha's nodes");
    let drained = Instant::now();
    let reason = poll("the job is found stranded", Duration::from_secs(STRANDED_S + 30), || {
        let r = fleet_record(lab, id)?;
        let reason = r["reason"].as_str().unwrap_or("").to_string();
        reason.contains("stranded at alpha").then_some(reason)
    });
    let decided = drained.elapsed();
    assert!(decided >= Duration::from_secs(STRANDED_S), "decided {decided:?} after the drain: {reason}");
    assert!(reason.contains("its usable nodes could not run it"), "{reason}");
    let delta_job = poll("the job is placed at delta", Duration::from_secs(90), || {
        remote_of(lab, id).filter(|(t, r)| t == "delta" && *r != 0).map(|(_, r)| r)
    });
    let done = lab.wait_done("beta", id, Duration::from_secs(90)).unwrap();
    let running_elsewhere = drained.elapsed();
    let samples = sampler.finish();

    // The stand-in: delta's output, its exit code, one note on stderr.
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("FAILED", "4:0"), "{done:?}");
    assert_eq!(std::fs::read_to_string(dir.join("out.txt")).unwrap(), "ran at delta\n");
    let err = std::fs::read_to_string(dir.join("err.txt")).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(&format!("fleet: run 1 of job {fid} was stranded at alpha: ")), "{err}");
    assert!(err.ends_with("cancelled there, re-placing it elsewhere\n"), "{err}");
    // Once, at delta; alpha's copy cancelled, never two live copies.
    assert!(!dir.join("marks-alpha").exists(), "the job ran at alpha");
    assert_eq!(std::fs::read_to_string(dir.join("marks-delta")).unwrap().lines().count(), 1);
    let at_delta = copies_at(lab, "delta", &fid);
    assert_eq!(at_delta.iter().map(|(j, _)| j.clone()).collect::<Vec<_>>(), [delta_job.to_string()]);
    let at_alpha = copies_at(lab, "alpha", &fid);
    assert!(!at_alpha.is_empty() && at_alpha.iter().all(|(_, s)| s == "CANCELLED"), "alpha: {at_alpha:?}");
    assert!(samples.len() > 20, "too few samples: {}", samples.len());
    assert!(samples.iter().all(|(_, (a, d))| *a + *d <= 1), "two live copies: {samples:?}");
    assert!(samples.iter().any(|(_, (a, _))| *a == 1), "no sample saw alpha's copy: {samples:?}");
    eprintln!(
        "stranded figures (stranded_s {STRANDED_S}): decided {:.1} s after the drain, ended at delta {:.1} s after it",
        decided.as_secs_f64(),
        running_elsewhere.as_secs_f64()
    );
}

/// A job its target's limits hold for good. delta enforces association
/// limits, and alice's association there gets a 30-minute `MaxWall` for
/// this test: her native job at delta with `--time=60` pends
/// `AssocMaxWallDurationPerJobLimit` and waits for an admin. Her forwarded
/// twin (`--fleet-to=alpha,delta`), placed at delta while alpha's nodes
/// are drained, used to wait
/// there as long. Now, after the lab's `[health] stranded_s`, it stays
/// while no other cluster can run it, saying why, and once alpha's nodes
/// are back it is cancelled at delta first and runs once at alpha, whose
/// limits let it run.
#[test]
fn a_job_a_limit_at_its_target_holds_for_good_is_cancelled_there_and_runs_once_where_it_may() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("held");
    let max_wall = |v: &str| {
        let set = format!("MaxWall={v}");
        let args = ["-i", "modify", "user", "where", "name=alice", "cluster=delta", "set", &set];
        lab.cmd("delta", "sacctmgr", &args).is_ok_and(|o| o.status.success())
    };
    let jobs = std::cell::RefCell::new(Vec::<(&str, u64)>::new());
    let _restore = OnDrop(|| {
        for (c, id) in jobs.borrow().iter() {
            let _ = lab.cmd(c, "scancel", &[&id.to_string()]);
        }
        let _ = max_wall("-1");
        let _ = set_nodes(lab, "alpha", "alpha1,alpha2", "RESUME");
        let _ = lab.wait_gpus_free("alpha", "h100", 16, Duration::from_secs(60));
    });
    lab.wait_gpus_free("alpha", "h100", 16, Duration::from_secs(60)).unwrap();
    assert!(max_wall("00:30:00"), "sacctmgr could not set alice's MaxWall at delta");
    // delta's slurmctld has it from slurmdbd before a job is submitted.
    poll("delta's controller knows the limit", Duration::from_secs(30), || {
        let o = lab.cmd("delta", "scontrol", &["show", "assoc_mgr", "users=alice", "flags=assoc"]).ok()?;
        String::from_utf8_lossy(&o.stdout).contains("MaxWallPJ=30").then_some(())
    });
    let out = |name: &str| out_arg(&dir, name);
    let native = lab
        .sbatch("delta", &["--fleet=local", "--gres=gpu:h100:1", "--time=60", &out("native.txt")], &script("true"))
        .unwrap();
    jobs.borrow_mut().push(("delta", native));
    let held = |r: &fleet_lab::JobRecord| r["Reason"] == "AssocMaxWallDurationPerJobLimit";
    let n = lab.wait_for("delta", native, Duration::from_secs(30), held).unwrap();
    assert_eq!(n["JobState"], "PENDING", "the native oracle: {n:?}");

    // alpha's nodes drained: the job is placed at delta.
    assert!(set_nodes(lab, "alpha", "alpha1,alpha2", "DRAIN"), "cannot drain alpha's nodes");
    poll("the meta-scheduler sees alpha drained", Duration::from_secs(30), || {
        cluster_entry(lab, "alpha")["installed"].as_array().is_some_and(|a| !a.is_empty()).then_some(())
    });
    let body =
        format!("echo \"ran at $SLURM_CLUSTER_NAME\"\ndate +%s.%N >> {}/marks-$SLURM_CLUSTER_NAME", dir.display());
    let err_arg = format!("--error={}/err.txt", dir.display());
    // Two clusters may run it (kube-gamma's H100s would take it too).
    let args = ["--gres=gpu:h100:1", "--time=60", "--fleet-to=alpha,delta", &out("out.txt"), &err_arg];
    let id = lab.sbatch("beta", &args, &script(&body)).unwrap();
    jobs.borrow_mut().push(("beta", id));
    let (target, delta_job) =
        poll("the job is submitted at delta", Duration::from_secs(60), || remote_of(lab, id).filter(|(_, r)| *r != 0));
    assert_eq!(target, "delta", "alpha's nodes are drained");
    let fid = fleet_job_of(lab, id).unwrap();
    let sampler = live_copies(lab, &fid);
    // Slurm at delta holds it as it holds the native job.
    let at_delta = lab.wait_for("delta", delta_job, Duration::from_secs(30), held).unwrap();
    assert_eq!(at_delta["JobState"], "PENDING", "{at_delta:?}");
    let t0 = Instant::now();
    let why = "Slurm at delta keeps it pending (AssocMaxWallDurationPerJobLimit): it asks for more than a per-job \
               limit of its association there";
    // No other cluster can run it now: it stays, saying why.
    let reason = poll("the job is found held for good", Duration::from_secs(STRANDED_S + 40), || {
        let r = fleet_record(lab, id)?;
        let reason = r["reason"].as_str().unwrap_or("").to_string();
        reason.contains("held at delta for good").then_some(reason)
    });
    let decided = t0.elapsed();
    assert!(reason.contains(why), "{reason}");
    assert!(reason.ends_with("no other cluster can run it now, so it stays and waits there"), "{reason}");
    assert_eq!(copies_at(lab, "delta", &fid), [(delta_job.to_string(), "PENDING".to_string())]);
    // alpha's nodes back: cancelled at delta before it runs at alpha.
    assert!(set_nodes(lab, "alpha", "alpha1,alpha2", "RESUME"), "cannot resume alpha's nodes");
    let done = lab.wait_done("beta", id, Duration::from_secs(120)).unwrap();
    let samples = sampler.finish();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{done:?}");
    assert_eq!(remote_of(lab, id).map(|(t, _)| t).as_deref(), Some("alpha"));
    assert_eq!(std::fs::read_to_string(dir.join("out.txt")).unwrap(), "ran at alpha\n");
    let err = std::fs::read_to_string(dir.join("err.txt")).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(&format!("fleet: run 1 of job {fid} was held at delta for good: {why}")), "{err}");
    assert!(!dir.join("marks-delta").exists(), "the job ran at delta");
    assert_eq!(std::fs::read_to_string(dir.join("marks-alpha")).unwrap().lines().count(), 1);
    let at_delta = copies_at(lab, "delta", &fid);
    assert_eq!(at_delta, [(delta_job.to_string(), "CANCELLED".to_string())]);
    assert!(samples.iter().all(|(_, (a, d))| *a + *d <= 1), "two live copies: {samples:?}");
    // The native job still waits for an admin, as Slurm keeps it.
    let n = lab.job("delta", native).unwrap();
    assert_eq!((n["JobState"].as_str(), n["Reason"].as_str()), ("PENDING", "AssocMaxWallDurationPerJobLimit"));
    eprintln!(
        "held figures (stranded_s {STRANDED_S}): found held for good {:.1} s after Slurm at delta showed the limit",
        decided.as_secs_f64()
    );
}
