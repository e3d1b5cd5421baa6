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
//! * with the default `ForwardMode=deferred`, a job that must leave is
//!   forwarded while its stand-in is still PENDING (the agent's pickup
//!   reads it from Slurm), and when the stand-in starts its proxy gets
//!   that same fleet job: one job, run once at the target.
//! * forged requests on the agent's deferred socket are refused: another
//!   user's stand-in, a stand-in that is not deferred, a job outside the
//!   proxy partition; and users cannot submit into the proxy partition.
//!   A user's own pending job carrying a deferred request in its script
//!   is never picked up (it is not in the proxy partition, and its
//!   AdminComment, which the user cannot set, has no tag).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fleet_lab::{fleet_job_of, out_arg, parse_record, script, wait_file, Lab, OnDrop};

const T: Duration = Duration::from_secs(120);

/// Every record `scontrol -o show job <id>` prints (an array: one per element).
fn records(lab: &Lab, cluster: &str, id: u64) -> Vec<fleet_lab::JobRecord> {
    let out = lab.cmd(cluster, "scontrol", &["-o", "show", "job", &id.to_string()]).unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()).map(parse_record).collect()
}

/// The meta-scheduler's records of fleet job `id` and of its array
/// elements (`<id>_<n>`), if any.
fn fleet_jobs(lab: &Lab, id: &str) -> Vec<serde_json::Value> {
    let jobs = lab.fleetctl_json(&["jobs"]).unwrap();
    let elem = format!("{id}_");
    jobs.as_array()
        .unwrap()
        .iter()
        .filter(|j| j["fleet_job_id"].as_str().is_some_and(|f| f == id || f.starts_with(&elem)))
        .cloned()
        .collect()
}

#[test]
fn a_deferred_job_is_forwarded_while_its_stand_in_is_pending_and_its_proxy_gets_that_job() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("deferred-pending");
    // The plugin learns a submitter's name (placement checks it against the
    // clusters' identities) off slurmctld's locks, from a first job that
    // may leave; until then that user's jobs ask the agent. One that stays
    // home teaches it.
    let warm = lab.sbatch("beta", &["--gres=gpu:a100:1", "--hold", "--output=/dev/null"], &script("true")).unwrap();
    let _ = lab.cmd("beta", "scancel", &[&warm.to_string()]);
    std::thread::sleep(Duration::from_millis(500));
    // --hold keeps the stand-in PENDING until it is released. The plugin's
    // watcher resolves the name within its poll, which on a loaded machine
    // may be after the next submission: that one then asks the agent and is
    // forwarded at once (and is cancelled here); a later one is deferred.
    let body = "echo \"ran at $SLURM_CLUSTER_NAME\"";
    let mut attempt = 0;
    let (id, took, rec, admin) = loop {
        attempt += 1;
        let (res, took) =
            lab.sbatch_timed("beta", &["--gres=gpu:h100:1", "--hold", &out_arg(&dir, "o.txt")], &script(body));
        let id = res.unwrap();
        let rec = lab.job("beta", id).unwrap();
        let admin = rec.get("AdminComment").cloned().unwrap_or_default();
        if admin.contains(" deferred ") || attempt == 5 {
            break (id, took, rec, admin);
        }
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
        std::thread::sleep(Duration::from_secs(1));
    };
    let _cancel = OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    assert!(took < Duration::from_secs(2), "sbatch took {took:?}");
    assert_eq!(rec["Partition"], "fleet", "a stand-in: {rec:?}");
    let tag = fleet_api::wire::parse_admin_tag(&admin).expect("Fleet's tag").to_string();
    assert!(admin.contains(" deferred "), "a deferred stand-in, the default ForwardMode, in 5 tries: {admin}");
    // The fleet has the job while Slurm still holds its stand-in pending.
    let t0 = Instant::now();
    while fleet_jobs(lab, &tag).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(20), "{tag} was not forwarded while its stand-in was pending");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(lab.job("beta", id).unwrap()["JobState"], "PENDING", "forwarded before the stand-in started");
    let known = fleet_jobs(lab, &tag);
    assert_eq!((known.len(), known[0]["origin"].as_str()), (1, Some("beta")), "{known:?}");
    // Released: Slurm starts the stand-in, its proxy asks the agent and
    // gets the same fleet job, which runs once at alpha.
    assert!(lab.cmd("beta", "scontrol", &["release", &id.to_string()]).unwrap().status.success());
    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(rec["ExitCode"], "0:0", "{rec:?}");
    let out = wait_file(&dir.join("o.txt"), Duration::from_secs(10), |b| !b.is_empty()).unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "ran at alpha\n");
    assert_eq!(fleet_job_of(lab, id).as_deref(), Some(tag.as_str()), "the stand-in started the job picked up");
    let after = fleet_jobs(lab, &tag);
    assert_eq!(after.len(), 1, "one fleet job: {after:?}");
    assert_eq!(after[0]["state"], "completed", "{after:?}");
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
    // bob's stand-in and alice's own, running; hers forwarded through the
    // agent's round trip (a --fleet* option asks the agent whatever
    // ForwardMode says), so it is not a deferred stand-in.
    let sleep = script("sleep 60");
    let (bobs, _) = lab.sbatch_as("bob", "beta", &["--gres=gpu:h100:1", "--output=/dev/null"], &sleep);
    let bobs = bobs.unwrap();
    // An agent slower than SubmitTimeoutMs (a loaded CI machine) makes any
    // job that must leave a deferred stand-in, rightly: then it is hers to
    // claim, so submit again until one went through the round trip.
    let mut alices = None;
    for _ in 0..5 {
        let id =
            lab.sbatch("beta", &["--gres=gpu:h100:1", "--fleet-to=alpha", &out_arg(&dir, "a.txt")], &sleep).unwrap();
        let admin = lab.job("beta", id).unwrap().get("AdminComment").cloned().unwrap_or_default();
        if !admin.contains(" deferred") {
            alices = Some(id);
            break;
        }
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    }
    let alices = alices.expect("five submissions all missed the agent's round trip");
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
    // alice's own pending job whose script is a deferred stand-in's, with a
    // request of hers: the pickup never reads it (wrong partition, no tag,
    // and she cannot give it one).
    let uid = std::process::Command::new("id").args(["-u", "alice"]).output().unwrap();
    let uid: u32 = String::from_utf8_lossy(&uid.stdout).trim().parse().unwrap();
    let forged_id = "beta-00000000f0f0";
    let payload = fleet_api::deferred::Payload {
        fleet_job_id: forged_id.into(),
        target: "alpha".into(),
        request: fleet_api::JobRequest {
            origin: "beta".into(),
            user_id: uid,
            script: Some(b"#!/bin/sh\necho forged\n".to_vec()),
            ..Default::default()
        },
    };
    let forged = fleet_api::deferred::embed("#!/bin/sh\nexit 0\n", &payload).unwrap();
    let held =
        lab.sbatch("beta", &["--hold", "--gres=gpu:a100:1", &out_arg(&dir, "f.txt")], forged.as_bytes()).unwrap();
    let _cancel_held = OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&held.to_string()]);
    });
    let tagged = lab.cmd_as(
        "alice",
        "beta",
        "scontrol",
        &["update", &format!("JobId={held}"), &format!("AdminComment=fleet:{forged_id} deferred")],
    );
    assert!(!tagged.unwrap().status.success(), "a user cannot tag a job");
    let rec = lab.job("beta", held).unwrap();
    assert_eq!((rec["Partition"].as_str(), rec["JobState"].as_str()), ("gpu", "PENDING"), "{rec:?}");
    // Past a periodic pickup scan (deferred::PICKUP_EVERY, 5 s).
    std::thread::sleep(Duration::from_secs(7));
    assert!(fleet_jobs(lab, forged_id).is_empty(), "the forged request was forwarded");
    // The claims left the real jobs alone.
    for id in [bobs, alices, local] {
        assert_eq!(lab.job("beta", id).unwrap()["JobState"], "RUNNING");
    }
}
