//! Failover end to end against the real lab (tests/lab/lab.sh): a job
//! forwarded from beta runs at alpha; alpha dies (its agent and slurmctld
//! stop); the meta-scheduler sees alpha Degraded, waits out its grace
//! period, and places the job again, as a new epoch, on delta (the lab's
//! third cluster, the other one with H100s). The stand-in at beta stays one
//! job whose output file continues (with one note on stderr) and whose exit
//! code is the last run's. While alpha is dark (agent and slurmctld dead,
//! slurmd alive) its copy stops itself once its in-job lease is no longer
//! renewed, before the job moves: the test samples the job's processes at
//! both clusters (by the job's environment, under /proc: the lab's
//! clusters share this host) and the step marks each copy writes, and
//! asserts that two copies never ran at the same time.
//!
//! The job restarts from scratch (it is `#FLEET interruptible`); resuming
//! from a checkpoint goes through the same path with `FLEET_RESUME_FROM`.
//!
//! The second test has alpha's slurmctld forget two running jobs (it
//! restarts from a copy of its state saved before them): one's script ends
//! by itself later and its exit code is the job's; the other is killed as
//! an orphan, dies with its controller and runs again at delta.

use std::time::{Duration, Instant};

use std::collections::BTreeSet;

use fleet_lab::{copies, fleet_job_of, fleet_record, out_arg, remote_of, script, wait_file, Lab, OnDrop, Sampler};

/// Steps the job counts, one a second.
const STEPS: u32 = 45;

fn state_at(lab: &Lab, cluster: &str, id: u64) -> Option<String> {
    lab.job(cluster, id).and_then(|r| r.get("JobState").cloned())
}

/// alpha's health in the meta-scheduler's view.
fn health(lab: &Lab, cluster: &str) -> String {
    let v = lab.fleetctl_json(&["clusters"]).unwrap_or_default();
    let c = v["clusters"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == cluster).cloned());
    c.map(|c| c["health"].as_str().unwrap_or("").to_string()).unwrap_or_default()
}

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

#[test]
fn a_job_at_a_dead_cluster_runs_again_elsewhere_once_and_its_stale_copy_is_cancelled() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("failover");
    // Whatever happens, alpha is whole again for the next test.
    let _restore = OnDrop(|| {
        let _ = lab.lab_sh(&["revive"]);
    });
    // Each step also leaves a timestamped mark per cluster in the work dir
    // (written by the copy itself, not relayed).
    let body = format!(
        "#FLEET interruptible\nfor i in $(seq 1 {STEPS}); do echo \"step $i at $SLURM_CLUSTER_NAME\"; \
         date +%s.%N >> {}/marks-$SLURM_CLUSTER_NAME; sleep 1; done\nexit 3",
        dir.display()
    );
    let err_arg = format!("--error={}/err.txt", dir.display());
    let id = lab.sbatch("beta", &["--gres=gpu:h100:1", &out_arg(&dir, "out.txt"), &err_arg], &script(&body)).unwrap();
    let out = dir.join("out.txt");
    wait_file(&out, Duration::from_secs(90), |b| String::from_utf8_lossy(b).contains("step 3 at alpha")).unwrap();
    let (target, alpha_job) = remote_of(lab, id).expect("the fleet knows the job");
    assert_eq!(target, "alpha");
    let fid = fleet_job_of(lab, id).unwrap();
    assert_eq!(fleet_record(lab, id).unwrap()["epoch"], 1);

    // alpha dies: its agent and its controller (only slurmd and the job's
    // own processes live on at alpha: its in-job lease stops it).
    assert_eq!(copies(&fid), BTreeSet::from(["alpha".to_string()]), "the job's processes are seen at alpha");
    let sampler = Sampler::start(Duration::from_millis(100), {
        let fid = fid.clone();
        move || copies(&fid)
    });
    let t_kill = Instant::now();
    assert!(lab.lab_sh(&["stop-agent", "alpha"]).unwrap().status.success());
    assert!(lab.lab_sh(&["stop-ctld", "alpha"]).unwrap().status.success());
    poll("alpha counts as degraded", Duration::from_secs(30), || (health(lab, "alpha") == "degraded").then_some(()));
    let detected = t_kill.elapsed();
    let rec = poll("the job is placed again", Duration::from_secs(90), || {
        fleet_record(lab, id).filter(|r| r["epoch"].as_u64() == Some(2))
    });
    let decided = t_kill.elapsed();
    assert_eq!(rec["target"], "delta", "{rec}");
    assert_eq!(rec["migrations"], 1, "{rec}");
    assert!(
        rec["reason"].as_str().unwrap().starts_with("moved off alpha (epoch 1): alpha has sent no heartbeat"),
        "{rec}"
    );
    wait_file(&out, Duration::from_secs(60), |b| String::from_utf8_lossy(b).contains("step 1 at delta")).unwrap();
    let running_elsewhere = t_kill.elapsed();
    let (_, delta_job) =
        poll("delta's Slurm id", Duration::from_secs(10), || remote_of(lab, id).filter(|(t, _)| t == "delta"));
    // The stand-in at beta is still the one job, running; so is delta's copy.
    assert_eq!(state_at(lab, "beta", id).as_deref(), Some("RUNNING"));
    assert_eq!(state_at(lab, "delta", delta_job).as_deref(), Some("RUNNING"));

    // alpha's copy stopped itself before delta's started.
    poll("delta's copy is seen", Duration::from_secs(10), || {
        let s = sampler.snapshot();
        s.iter().any(|(_, c)| c.contains("delta")).then_some(())
    });
    let alpha_gone = {
        let s = sampler.snapshot();
        s.iter().filter(|(_, c)| c.contains("alpha")).map(|(t, _)| *t).max().unwrap_or_default()
    };

    // alpha comes back (agent first, then its controller, which finds its
    // copy gone or recovers it as RUNNING): nothing of it runs again.
    let t_back = Instant::now();
    assert!(lab.lab_sh(&["start-agent", "alpha"]).unwrap().status.success());
    assert!(lab.lab_sh(&["start-ctld", "alpha"]).unwrap().status.success());
    let stale_state = poll("alpha's stale copy is over in Slurm", Duration::from_secs(60), || {
        state_at(lab, "alpha", alpha_job).filter(|s| s != "RUNNING")
    });
    let fenced = t_back.elapsed();
    assert!(
        matches!(stale_state.as_str(), "CANCELLED" | "COMPLETING" | "FAILED" | "COMPLETED" | "NODE_FAIL"),
        "{stale_state}"
    );
    assert!(fenced < Duration::from_secs(20), "alpha's stale copy lived {fenced:?} after alpha's return");

    // The end: the last run's exit code, one output that continues.
    let done = lab.wait_done("beta", id, Duration::from_secs(120)).unwrap();
    assert_eq!(done["ExitCode"], "3:0", "{done:?}");
    assert_eq!(done["Restarts"], "0", "the stand-in stayed one job: {done:?}");
    let text = String::from_utf8(
        wait_file(&out, Duration::from_secs(15), |b| {
            String::from_utf8_lossy(b).contains(&format!("step {STEPS} at delta\n"))
        })
        .unwrap(),
    )
    .unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let first_delta = lines.iter().position(|l| l.ends_with(" at delta")).unwrap();
    let (before, after) = lines.split_at(first_delta);
    let alpha_steps: Vec<String> = (1..=before.len()).map(|i| format!("step {i} at alpha")).collect();
    assert_eq!(before, alpha_steps.as_slice(), "alpha's run, as far as it was relayed:\n{text}");
    assert!(before.len() >= 3, "{text}");
    let delta_steps: Vec<String> = (1..=STEPS).map(|i| format!("step {i} at delta")).collect();
    assert_eq!(after, delta_steps.as_slice(), "delta's run in full, nothing of alpha's after it:\n{text}");
    // Never two copies: no sample saw both clusters, and alpha's last step
    // mark is older than delta's first.
    let samples = sampler.finish();
    let both = samples.iter().filter(|(_, c)| c.len() > 1).count();
    assert_eq!(both, 0, "{both} of {} samples saw copies at two clusters", samples.len());
    assert!(samples.iter().any(|(_, c)| c.contains("delta")), "the sampler saw delta's copy");
    let marks = |c: &str| -> Vec<f64> {
        std::fs::read_to_string(dir.join(format!("marks-{c}")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let (alpha_marks, delta_marks) = (marks("alpha"), marks("delta"));
    let alpha_last = alpha_marks.iter().cloned().fold(f64::MIN, f64::max);
    let delta_first = delta_marks.iter().cloned().fold(f64::MAX, f64::min);
    assert!(alpha_marks.len() >= 3 && delta_marks.len() == STEPS as usize, "{alpha_marks:?} {delta_marks:?}");
    assert!(
        alpha_last < delta_first,
        "alpha's copy marked a step at {alpha_last} after delta's copy began at {delta_first}"
    );
    let err = std::fs::read_to_string(dir.join("err.txt")).unwrap();
    let notes: Vec<&str> = err.lines().collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0].starts_with(&format!("fleet: run 1 of job {fid} at alpha died (alpha has sent no heartbeat")),
        "{err}"
    );
    assert!(notes[0].ends_with("restarting from the start (no valid checkpoint; the job is interruptible)"), "{err}");
    eprintln!(
        "failover figures: degraded seen {:.1} s after the kill, alpha's copy stopped itself by {:.1} s, moved \
         (epoch 2 at delta) at {:.1} s, first output at delta at {:.1} s ({:.1} s after the decision), {:.1} s \
         between alpha's last step mark and delta's first; alpha's job over in Slurm {:.1} s after its return; \
         {} samples of both clusters, {both} with two copies running",
        detected.as_secs_f64(),
        alpha_gone.as_secs_f64(),
        decided.as_secs_f64(),
        running_elsewhere.as_secs_f64(),
        (running_elsewhere - decided).as_secs_f64(),
        delta_first - alpha_last,
        fenced.as_secs_f64(),
        samples.len(),
    );
}

/// Stops the slurmd of `node` at `cluster` (its running steps live on, as
/// with a slurmd crash).
fn stop_slurmd(lab: &Lab, cluster: &str, node: &str) {
    let pid = std::fs::read_to_string(lab.root.join(cluster).join(format!("run/slurmd-{node}.pid"))).unwrap();
    let pid = pid.trim();
    assert!(std::process::Command::new("kill").arg(pid).status().unwrap().success());
    poll(&format!("slurmd {node} stops"), Duration::from_secs(15), || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });
}

/// Stops slurmctld of `cluster`, puts a copy of the state directory `from`
/// at `to` (whatever was there goes) and starts it again: with `to` its
/// state directory, it recovers from `from` (a controller that lost
/// everything it took on since `from` was saved: the state it recovers
/// after a crash that came before its next save).
fn copy_state_while_ctld_stopped(lab: &Lab, cluster: &str, from: &std::path::Path, to: &std::path::Path) {
    assert!(lab.lab_sh(&["stop-ctld", cluster]).unwrap().status.success());
    let _ = std::fs::remove_dir_all(to);
    assert!(std::process::Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap().success());
    assert!(lab.lab_sh(&["start-ctld", cluster]).unwrap().status.success());
}

/// slurmctld forgets two running jobs (it restarts from a state saved
/// before it took them; slurmdbd keeps them RUNNING). One's slurmd is
/// down, so its script runs on and ends by itself: its own exit code is
/// the job's, at beta, once it ends, however long after the controller
/// forgot it (within the agent's 90 s grace). The other's slurmd kills it
/// as an orphan when it registers: it died with its controller, and, being
/// interruptible, runs again elsewhere and ends there.
#[test]
fn jobs_their_controller_forgot_end_as_their_scripts_did_or_run_again() {
    let (lab, _serial) = Lab::lock();
    let state = lab.root.join("alpha").join("state");
    let snapshot = lab.root.join("alpha").join("state.before-forgotten");
    let _restore = OnDrop(|| {
        let _ = lab.lab_sh(&["revive"]);
        let _ = std::fs::remove_dir_all(&snapshot);
    });
    let dir = lab.workdir("forgotten");
    // alpha's state before the jobs (slurmctld saves it as it stops).
    copy_state_while_ctld_stopped(lab, "alpha", &state, &snapshot);
    // b goes where the meta-scheduler sees 8 H100s free: alpha, once its
    // agent's heartbeats show it back with both nodes.
    lab.wait_gpus_free("alpha", "h100", 16, Duration::from_secs(30)).unwrap();

    // Each fills one of alpha's two nodes.
    let flag = dir.join("go");
    let a_body = format!("echo started; while [ ! -e {} ]; do sleep 0.2; done; echo done; exit 7", flag.display());
    let a = lab
        .sbatch("beta", &["--fleet-to=alpha", "--gres=gpu:h100:8", &out_arg(&dir, "a.txt")], &script(&a_body))
        .unwrap();
    let b_body = "#FLEET interruptible\necho \"run at $SLURM_CLUSTER_NAME\"\n\
                  if [ \"$SLURM_CLUSTER_NAME\" = alpha ]; then sleep 600; fi\nexit 5";
    let b = lab
        .sbatch(
            "beta",
            &["--gres=gpu:h100:8", &out_arg(&dir, "b.txt"), &format!("--error={}/b.err", dir.display())],
            &script(&format!("{b_body}\n")),
        )
        .unwrap();
    let (a_out, b_out) = (dir.join("a.txt"), dir.join("b.txt"));
    wait_file(&a_out, Duration::from_secs(90), |t| t.starts_with(b"started\n")).unwrap();
    wait_file(&b_out, Duration::from_secs(90), |t| t.starts_with(b"run at alpha\n")).unwrap();
    let (ta, a_job) = remote_of(lab, a).unwrap();
    let (tb, b_job) = remote_of(lab, b).unwrap();
    assert_eq!((ta.as_str(), tb.as_str()), ("alpha", "alpha"), "both run at alpha");
    let a_node = lab.job("alpha", a_job).unwrap()["NodeList"].clone();
    let b_node = lab.job("alpha", b_job).unwrap()["NodeList"].clone();
    assert_ne!(a_node, b_node);
    let a_fid = fleet_job_of(lab, a).unwrap();

    stop_slurmd(lab, "alpha", &a_node);
    copy_state_while_ctld_stopped(lab, "alpha", &snapshot, &state);
    assert!(lab.job("alpha", a_job).is_none_or(|r| r.get("WorkDir") != Some(&dir.display().to_string())));
    // The agent notices and waits for a's script; b's is killed as an orphan.
    let log = lab.agent_log("alpha");
    poll("alpha's agent waits for the forgotten job's end", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().any(|l| l.contains(&a_fid) && l.contains("noted no end")).then_some(())
    });
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(state_at(lab, "beta", a).as_deref(), Some("RUNNING"), "not reported while its script may run");
    std::fs::write(&flag, b"").unwrap();
    let done = lab.wait_done("beta", a, Duration::from_secs(60)).unwrap();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("FAILED", "7:0"), "{done:?}");
    // Its output, then fleet-proxy's line on how it ended (stderr, in the same file).
    let text = std::fs::read_to_string(&a_out).unwrap();
    assert!(
        text.starts_with("started\ndone\nfleet-proxy: job failed: its script ended at alpha (exit code 7); then Slurm at alpha no longer knows job"),
        "{text}"
    );
    let rec = fleet_record(lab, a).unwrap();
    assert!(rec["reason"].as_str().unwrap().contains("no longer knows"), "{rec}");

    // b: died with its controller, placed again (interruptible), ran at delta.
    let done = lab.wait_done("beta", b, Duration::from_secs(180)).unwrap();
    assert_eq!((done["JobState"].as_str(), done["ExitCode"].as_str()), ("FAILED", "5:0"), "{done:?}");
    let text = std::fs::read_to_string(&b_out).unwrap();
    let rec = fleet_record(lab, b).unwrap();
    let b_fid = rec["fleet_job_id"].as_str().unwrap_or_default().to_string();
    assert_eq!(text, "run at alpha\nrun at delta\n", "{text:?}\n{rec}\n{}", lab.trail(&b_fid));
    assert_eq!(rec["target"], "delta", "{rec}");
    let err = std::fs::read_to_string(dir.join("b.err")).unwrap();
    assert!(err.contains("no longer knows job") && err.contains("died"), "{err}");
    eprintln!("forgotten: a ended {:?}; b's note: {}", rec["reason"], err.trim());
}
