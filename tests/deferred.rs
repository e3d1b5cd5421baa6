//! Deferred stand-ins end to end against the real lab (tests/lab/lab.sh):
//! the stand-in itself carries the forward request (fleet_api::deferred).
//!
//! * beta's agent is down while H100 jobs are submitted at beta (which has
//!   no H100): sbatch accepts them all at once, as deferred stand-ins;
//!   Slurm starts them, their proxies wait, and when the agent is back
//!   each runs at alpha once with its own exit code and output.
//! * a GPU job array `--array=0-5%2` at beta: every element is forwarded
//!   on its own start, runs at alpha once with the SLURM_ARRAY_* variables
//!   of the origin, never more than two at a time, each into its own
//!   `%A_%a` output file with its own exit code.
//! * forged requests on the agent's deferred socket are refused: another
//!   user's stand-in, a stand-in that is not deferred, a job outside the
//!   proxy partition; and users cannot submit into the proxy partition.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fleet_lab::{out_arg, parse_record, script, wait_file, Lab, OnDrop};

const T: Duration = Duration::from_secs(120);

/// Every record `scontrol -o show job <id>` prints (an array: one per element).
fn records(lab: &Lab, cluster: &str, id: u64) -> Vec<fleet_lab::JobRecord> {
    let out = lab.cmd(cluster, "scontrol", &["-o", "show", "job", &id.to_string()]).unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()).map(parse_record).collect()
}

#[test]
fn jobs_submitted_while_the_agent_is_down_are_accepted_and_run_at_the_target_once_it_is_back() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("deferred-agent-down");
    let _restore = OnDrop(|| {
        let _ = lab.lab_sh(&["start-agent", "beta"]);
    });
    assert!(lab.lab_sh(&["stop-agent", "beta"]).unwrap().status.success());
    // Past ViewMaxAgeMs (10 s): the plugin's view of the fleet is stale,
    // and still says that beta cannot run an H100 job at all.
    std::thread::sleep(Duration::from_secs(11));
    let mut ids = Vec::new();
    for i in 0..4u32 {
        let body = format!("echo \"job {i} at $SLURM_CLUSTER_NAME\"\necho \"err {i}\" >&2\nexit {i}");
        let err = format!("--error={}/err{i}.txt", dir.display());
        let (res, took) = lab.sbatch_timed(
            "beta",
            &["--gres=gpu:h100:1", &out_arg(&dir, &format!("out{i}.txt")), &err],
            &script(&body),
        );
        let id = res.expect("sbatch accepts an H100 job at beta while its agent is down");
        assert!(took < Duration::from_secs(2), "sbatch took {took:?}");
        let rec = lab.job("beta", id).unwrap();
        assert_eq!(rec["Partition"], "fleet", "a stand-in: {rec:?}");
        ids.push(id);
    }
    // Slurm starts the stand-ins; their proxies wait for the agent.
    for &id in &ids {
        lab.wait_for("beta", id, T, |r| r["JobState"] == "RUNNING").unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    for &id in &ids {
        assert_eq!(lab.job("beta", id).unwrap()["JobState"], "RUNNING", "still waiting for the agent");
    }
    assert!(lab.lab_sh(&["start-agent", "beta"]).unwrap().status.success());
    for (i, &id) in ids.iter().enumerate() {
        let rec = lab.wait_done("beta", id, T).unwrap();
        assert_eq!(rec["ExitCode"], format!("{i}:0"), "{rec:?}");
        let out = wait_file(&dir.join(format!("out{i}.txt")), Duration::from_secs(10), |b| !b.is_empty()).unwrap();
        assert_eq!(String::from_utf8_lossy(&out), format!("job {i} at alpha\n"));
        let err = std::fs::read_to_string(dir.join(format!("err{i}.txt"))).unwrap();
        assert!(err.ends_with(&format!("err {i}\n")), "{err:?}");
        let (target, _) = fleet_lab::remote_of(lab, id).expect("the fleet knows the job");
        assert_eq!(target, "alpha");
    }
}

#[test]
fn a_gpu_job_array_is_forwarded_element_by_element_with_its_throttle_and_output_pattern() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("deferred-array");
    let trace = dir.join("trace");
    let body = format!(
        "echo \"start $SLURM_ARRAY_TASK_ID $(date +%s.%N)\" >> {t}\n\
         echo \"task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID ($SLURM_ARRAY_TASK_COUNT, $SLURM_ARRAY_TASK_MIN-$SLURM_ARRAY_TASK_MAX) at $SLURM_CLUSTER_NAME\"\n\
         sleep 4\n\
         echo \"end $SLURM_ARRAY_TASK_ID $(date +%s.%N)\" >> {t}\n\
         exit $((SLURM_ARRAY_TASK_ID % 3))",
        t = trace.display()
    );
    let out = format!("--output={}/o_%A_%a.txt", dir.display());
    let id = lab.sbatch("beta", &["--gres=gpu:h100:1", "--array=0-5%2", &out], &script(&body)).unwrap();
    let first = records(lab, "beta", id);
    assert!(first.iter().all(|r| r["Partition"] == "fleet"), "an array of stand-ins: {first:?}");
    // Never more than two stand-ins running at once, as the throttle says.
    let t0 = Instant::now();
    let mut max_running = 0;
    loop {
        let recs = records(lab, "beta", id);
        max_running = max_running.max(recs.iter().filter(|r| r["JobState"] == "RUNNING").count());
        let done = recs.len() == 6 && recs.iter().all(|r| fleet_lab::is_terminal(&r["JobState"]));
        if done {
            let codes: BTreeMap<u32, String> =
                recs.iter().map(|r| (r["ArrayTaskId"].parse().unwrap(), r["ExitCode"].clone())).collect();
            let want: BTreeMap<u32, String> = (0..6).map(|t| (t, format!("{}:0", t % 3))).collect();
            assert_eq!(codes, want, "{recs:?}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(240), "the array did not finish: {recs:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(max_running <= 2, "{max_running} stand-ins ran at once");
    // Each element ran once at alpha, with the origin's array variables.
    for t in 0..6 {
        let f = dir.join(format!("o_{id}_{t}.txt"));
        let text = wait_file(&f, Duration::from_secs(10), |b| !b.is_empty()).unwrap();
        assert_eq!(String::from_utf8_lossy(&text), format!("task {t} of {id} (6, 0-5) at alpha\n"));
    }
    let trace = std::fs::read_to_string(&trace).unwrap();
    let mut events: Vec<(f64, i32)> = Vec::new();
    let mut starts = BTreeMap::new();
    for l in trace.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let at: f64 = w[2].parse().unwrap();
        match w[0] {
            "start" => {
                *starts.entry(w[1].to_string()).or_insert(0) += 1;
                events.push((at, 1));
            }
            _ => events.push((at, -1)),
        }
    }
    assert_eq!(starts.len(), 6, "{trace}");
    assert!(starts.values().all(|&n| n == 1), "each element ran once: {trace}");
    events.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (mut now, mut peak) = (0, 0);
    for (_, d) in events {
        now += d;
        peak = peak.max(now);
    }
    assert!(peak <= 2, "{peak} elements ran at once at the target: {trace}");
}

/// `fleet-proxy --deferred` as `user` outside any job, claiming Slurm job `id`.
fn claim(lab: &Lab, user: &str, id: u64) -> (bool, String) {
    let sock = lab.root.join("beta/agent").join(fleet_api::wire::DEFERRED_SOCKET);
    // A refusal ends the proxy at once; `timeout` only bounds a bug.
    let out = std::process::Command::new("timeout")
        .args(["60", "setpriv", &format!("--reuid={user}"), &format!("--regid={user}"), "--init-groups"])
        .arg(lab.root.join("bin/fleet-proxy"))
        .args(["--deferred", "--agent-socket"])
        .arg(&sock)
        .args(["--url", &lab.metasched_url(), "--report-outage-after-s", "0"])
        .env_clear()
        .env("SLURM_JOB_ID", id.to_string())
        .env("PATH", "/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn forged_deferred_requests_are_refused() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("deferred-forged");
    // bob's stand-in (forwarded the usual way) and alice's own, running.
    let sleep = script("sleep 60");
    let (bobs, _) = lab.sbatch_as("bob", "beta", &["--gres=gpu:h100:1", "--output=/dev/null"], &sleep);
    let bobs = bobs.unwrap();
    let alices = lab.sbatch("beta", &["--gres=gpu:h100:1", &out_arg(&dir, "a.txt")], &sleep).unwrap();
    let local = lab.sbatch("beta", &["--gres=gpu:a100:1", &out_arg(&dir, "l.txt")], &sleep).unwrap();
    let _cancel = OnDrop(|| {
        for id in [bobs, alices, local] {
            let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
        }
    });
    for id in [bobs, alices, local] {
        lab.wait_for("beta", id, T, |r| r["JobState"] == "RUNNING").unwrap();
    }
    let (ok, err) = claim(lab, "alice", bobs);
    assert!(!ok && err.contains(&format!("job {bobs} is not yours")), "{err}");
    let (ok, err) = claim(lab, "alice", alices);
    assert!(!ok && err.contains(&format!("job {alices} is not a deferred stand-in")), "{err}");
    let (ok, err) = claim(lab, "alice", local);
    assert!(!ok && err.contains(&format!("job {local} is not in partition fleet")), "{err}");
    let (ok, err) = claim(lab, "alice", 999_999);
    assert!(!ok && err.contains("is not in partition fleet"), "{err}");
    // Nobody but Fleet puts a job into the proxy partition.
    let refused = lab.sbatch("beta", &["-p", "fleet", &out_arg(&dir, "p.txt")], &script("echo x")).unwrap_err();
    assert!(refused.contains("fleet: partition fleet holds only Fleet's stand-ins"), "{refused}");
    // The claims left the real jobs alone.
    for id in [bobs, alices, local] {
        assert_eq!(lab.job("beta", id).unwrap()["JobState"], "RUNNING");
    }
}
