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
