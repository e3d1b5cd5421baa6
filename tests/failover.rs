//! Failover end to end against the real lab (tests/lab/lab.sh): a job
//! forwarded from beta runs at alpha; alpha dies (its agent and slurmctld
//! stop); the meta-scheduler sees alpha Degraded, waits out its grace
//! period, and places the job again, as a new epoch, on delta (the lab's
//! third cluster, the other one with H100s). The stand-in at beta stays one
//! job whose output file continues (with one note on stderr) and whose exit
//! code is the last run's; when alpha comes back, its agent cancels the
//! stale copy before reporting anything. (While alpha is dark its copy runs
//! on in slurmstepd, where nothing can stop it: it can neither report nor
//! relay, and it is gone within one pass of alpha's return.)
//!
//! The job restarts from scratch (it is `#FLEET interruptible`); resuming
//! from a checkpoint goes through the same path with `FLEET_RESUME_FROM`.

use std::time::{Duration, Instant};

use fleet_lab::{fleet_job_of, fleet_record, out_arg, remote_of, script, wait_file, Lab, OnDrop};

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
    let body = format!(
        "#FLEET interruptible\nfor i in $(seq 1 {STEPS}); do echo \"step $i at $SLURM_CLUSTER_NAME\"; sleep 1; done\nexit 3"
    );
    let err_arg = format!("--error={}/err.txt", dir.display());
    let id = lab.sbatch("beta", &["--gres=gpu:h100:1", &out_arg(&dir, "out.txt"), &err_arg], &script(&body)).unwrap();
    let out = dir.join("out.txt");
    wait_file(&out, Duration::from_secs(90), |b| String::from_utf8_lossy(b).contains("step 3 at alpha")).unwrap();
    let (target, alpha_job) = remote_of(lab, id).expect("the fleet knows the job");
    assert_eq!(target, "alpha");
    let fid = fleet_job_of(lab, id).unwrap();
    assert_eq!(fleet_record(lab, id).unwrap()["epoch"], 1);

    // alpha dies: its agent and its controller (the job's processes live on
    // in slurmstepd at alpha, out of everyone's reach).
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
    // The stand-in at beta is still the one job, running.
    assert_eq!(state_at(lab, "beta", id).as_deref(), Some("RUNNING"));

    // alpha comes back (agent first, then its controller, which recovers the
    // stale copy as RUNNING): the agent cancels it before reporting anything.
    let t_back = Instant::now();
    assert!(lab.lab_sh(&["start-agent", "alpha"]).unwrap().status.success());
    assert!(lab.lab_sh(&["start-ctld", "alpha"]).unwrap().status.success());
    let mut samples = 0;
    let mut both = 0;
    let stale_state = poll("alpha's stale copy is cancelled", Duration::from_secs(60), || {
        let a = state_at(lab, "alpha", alpha_job);
        let d = state_at(lab, "delta", delta_job);
        samples += 1;
        if a.as_deref() == Some("RUNNING") && d.as_deref() == Some("RUNNING") {
            both += 1;
        }
        a.filter(|s| s != "RUNNING")
    });
    let fenced = t_back.elapsed();
    assert!(matches!(stale_state.as_str(), "CANCELLED" | "COMPLETING"), "{stale_state}");
    // While alpha was dark its copy ran on in slurmstepd, unseen and with
    // no one there to stop it; once alpha's controller answers, its agent's
    // next pass cancels it. Two copies do run in that time: the invariant
    // "never two copies" is NOT met when a cluster's agent and controller
    // die together (a watchdog in the job that ends it when its lease runs
    // out is the missing piece; see docs/failover.md). What is asserted is
    // the bound on the stale copy's life after alpha's return.
    assert!(fenced < Duration::from_secs(20), "alpha's stale copy lived {fenced:?} after alpha's return");
    eprintln!("FAILOVER both-running samples after alpha's return: {both} of {samples}");

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
    let err = std::fs::read_to_string(dir.join("err.txt")).unwrap();
    let notes: Vec<&str> = err.lines().collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0].starts_with(&format!("fleet: run 1 of job {fid} at alpha died (alpha has sent no heartbeat")),
        "{err}"
    );
    assert!(notes[0].ends_with("restarting from the start (no valid checkpoint; the job is interruptible)"), "{err}");
    eprintln!(
        "failover figures: degraded seen {:.1} s after the kill, moved (epoch 2 at delta) at {:.1} s, \
         first output at delta at {:.1} s ({:.1} s after the decision); stale copy at alpha gone {:.1} s after \
         alpha's return; {samples} samples of both clusters, {both} with two copies running",
        detected.as_secs_f64(),
        decided.as_secs_f64(),
        running_elsewhere.as_secs_f64(),
        (running_elsewhere - decided).as_secs_f64(),
        fenced.as_secs_f64(),
    );
}
