//! Job control of forwarded jobs against the real lab: what a Slurm user
//! does to their job at home reaches the job where it runs.
//!
//! Signals (Slurm 22.05 `scancel(1)`): the stand-in's batch step is
//! `fleet-proxy` and it has no other step, so `scancel --batch --signal=S`
//! and `scancel --full --signal=S` reach the proxy, which forwards S to the
//! remote job (`scancel --full --signal=S` there); plain
//! `scancel --signal=S` signals steps only and reaches nothing.

use std::time::Duration;

use fleet_lab::{fleet_record, out_arg, remote_of, script, wait_file, Lab};

const T: Duration = Duration::from_secs(90);

#[test]
fn scancel_batch_signal_at_beta_reaches_the_job_at_alpha() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("signal");
    let out = dir.join("out.txt");
    let id = lab
        .sbatch(
            "beta",
            &["--gres=gpu:h100:8", &out_arg(&dir, "out.txt")],
            &script(
                "trap 'echo got-usr1' USR1\n\
                 trap 'echo got-usr2' USR2\n\
                 echo started\n\
                 for i in $(seq 60); do sleep 1; done\n\
                 echo finished\n\
                 exit 7",
            ),
        )
        .unwrap();
    wait_file(&out, T, |b| b.starts_with(b"started\n")).unwrap();
    let rec = fleet_record(lab, id).expect("the job is known to the meta-scheduler");
    // Either H100 cluster (placed at registration, early: whichever had 8
    // free then).
    assert!(matches!(rec["target"].as_str(), Some("alpha" | "delta")), "{rec}");
    assert_eq!(rec["state"], "running", "{rec}");
    let beta_id = id.to_string();

    // Plain `scancel --signal` signals the job's steps only; the stand-in
    // has none (its batch step is the proxy): nothing reaches the job,
    // and nothing is ended.
    let _ = lab.cmd("beta", "scancel", &["--signal=USR1", &beta_id]).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let text = String::from_utf8_lossy(&std::fs::read(&out).unwrap_or_default()).to_string();
    assert!(!text.contains("got-usr1"), "a steps-only signal reached the batch script: {text:?}");
    assert_eq!(lab.job("beta", id).unwrap()["JobState"], "RUNNING");

    // `-b` reaches the batch step, the proxy forwards it, the script's trap runs at alpha.
    let t0 = std::time::Instant::now();
    let o = lab.cmd("beta", "scancel", &["--batch", "--signal=USR1", &beta_id]).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_file(&out, Duration::from_secs(30), |b| String::from_utf8_lossy(b).contains("got-usr1\n")).unwrap();
    eprintln!("scancel -b --signal=USR1 at beta -> trap ran at alpha after {:?}", t0.elapsed());
    // `--full` too.
    let o = lab.cmd("beta", "scancel", &["--full", "--signal=USR2", &beta_id]).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_file(&out, Duration::from_secs(30), |b| String::from_utf8_lossy(b).contains("got-usr2\n")).unwrap();
    assert_eq!(lab.job("beta", id).unwrap()["JobState"], "RUNNING", "a signal is not a cancel");

    // The job carries on and ends with its own exit code.
    let rec = lab.wait_done("beta", id, Duration::from_secs(150)).unwrap();
    assert_eq!(rec["ExitCode"], "7:0", "{rec:?}");
    assert_eq!(rec["JobState"], "FAILED", "{rec:?}");
    let text = String::from_utf8_lossy(&std::fs::read(&out).unwrap()).to_string();
    assert!(text.starts_with("started\n") && text.ends_with("finished\n"), "{text:?}");
    assert_eq!(text.matches("got-usr1").count(), 1, "{text:?}");
    assert_eq!(text.matches("got-usr2").count(), 1, "{text:?}");
}

#[test]
fn a_signal_before_the_job_runs_anywhere_is_refused_by_fleetctl() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("signal-held");
    // Held at beta: the stand-in never starts, so no cluster runs the job.
    let id =
        lab.sbatch("beta", &["--gres=gpu:h100:8", "--hold", &out_arg(&dir, "out.txt")], &script("sleep 30")).unwrap();
    let t0 = std::time::Instant::now();
    let rec = loop {
        if let Some(r) = lab.fleetctl_json(&["jobs"]).ok().and_then(|v| v.as_array().cloned()).and_then(|jobs| {
            let tag = lab.job("beta", id)?.get("AdminComment")?.clone();
            jobs.into_iter().find(|j| j["fleet_job_id"].as_str().is_some_and(|f| tag.contains(f)))
        }) {
            break r;
        }
        assert!(t0.elapsed() < T, "the held job never reached the meta-scheduler");
        std::thread::sleep(Duration::from_millis(250));
    };
    let fid = rec["fleet_job_id"].as_str().unwrap().to_string();
    let err = lab.fleetctl_json(&["job", "signal", &fid, "USR1"]).unwrap_err();
    assert!(format!("{err:#}").contains("held until its stand-in starts"), "{err:#}");
    let o = lab.cmd("beta", "scancel", &[&id.to_string()]).unwrap();
    assert!(o.status.success());
}

/// The native twin of a forwarded job: the same script and options at
/// beta itself (`--fleet=local`, an A100 instead of the H100s that make
/// the other leave), so that Slurm is the oracle.
fn native_args(dir: &std::path::Path, name: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["--fleet=local".to_string(), "--gres=gpu:a100:1".to_string(), out_arg(dir, name)];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn forwarded_args(dir: &std::path::Path, name: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["--gres=gpu:h100:8".to_string(), out_arg(dir, name)];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The local time `secs` from now as Slurm prints it (2026-12-01T21:33:24):
/// such strings compare in time order.
fn local_time_in(secs: u64) -> String {
    let o = std::process::Command::new("date")
        .args([&format!("-d+{secs} seconds"), "+%Y-%m-%dT%H:%M:%S"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

/// Cancels the test's jobs at beta when the test ends, also when it fails:
/// a held stand-in left behind would hold its job forever.
fn cancel_on_drop(lab: &Lab, ids: Vec<u64>) -> fleet_lab::OnDrop<impl FnMut() + '_> {
    fleet_lab::OnDrop(move || {
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let mut args: Vec<&str> = ids.iter().map(|s| s.as_str()).collect();
        args.insert(0, "--quiet");
        let _ = lab.cmd("beta", "scancel", &args);
    })
}

fn text(path: &std::path::Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// `scontrol requeue` of a running job, as its user, at beta: the native
/// job and the stand-in of a forwarded one both go back to pending
/// (`BeginTime`, Slurm's credential window), run again from the start and
/// end with the second run's exit code and `Restarts=1`; the output file
/// holds what Slurm's `--open-mode` leaves: the second run alone
/// (truncate, the default) or both runs (append).
#[test]
fn requeue_reruns_a_forwarded_job_as_slurm_reruns_a_native_one() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("requeue");
    let body = script("echo run-$(date +%s%N)\nfor i in $(seq 20); do sleep 1; done\necho end\nexit 3");
    let mut ids = Vec::new();
    for (name, forwarded, mode) in [
        ("native-trunc", false, None),
        ("native-append", false, Some("--open-mode=append")),
        ("fleet-trunc", true, None),
        ("fleet-append", true, Some("--open-mode=append")),
    ] {
        let extra: Vec<&str> = mode.into_iter().collect();
        let args = if forwarded { forwarded_args(&dir, name, &extra) } else { native_args(&dir, name, &extra) };
        let id = lab.sbatch("beta", &refs(&args), &body).unwrap();
        ids.push((name, forwarded, id));
    }
    let _cancel = cancel_on_drop(lab, ids.iter().map(|i| i.2).collect());
    for (name, _, _) in &ids {
        wait_file(&dir.join(name), T, |b| b.starts_with(b"run-")).unwrap();
    }
    // Slurm defers a requeued batch job past its credential window (about
    // two minutes): eligible no sooner than a minute from now.
    let deferred_past = local_time_in(60);
    for (name, forwarded, id) in &ids {
        if *forwarded {
            assert_eq!(fleet_record(lab, *id).unwrap()["target"], "alpha", "{name}");
        }
        let o = lab.cmd_as(fleet_lab::USER, "beta", "scontrol", &["requeue", &id.to_string()]).unwrap();
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
    }
    // Back to pending, as Slurm does with any requeued batch job.
    for (name, _, id) in &ids {
        let r = lab.wait_for("beta", *id, T, |r| r["JobState"] == "PENDING").unwrap();
        assert_eq!(r["Restarts"], "1", "{name}: {r:?}");
        // Reason=BeginTime until the window ends (a loaded machine may look later).
        assert!(
            r["Reason"] == "BeginTime" || r["EligibleTime"].as_str() >= deferred_past.as_str(),
            "{name}: not deferred as a requeued job: {r:?}"
        );
    }
    // The remote run of each forwarded job was cancelled, not left running.
    for (name, forwarded, id) in &ids {
        if *forwarded {
            let (target, remote) = remote_of(lab, *id).unwrap();
            let r = lab.wait_done(&target, remote, T).unwrap();
            assert_eq!(r["JobState"], "CANCELLED", "{name}: first remote run {r:?}");
        }
    }
    // Slurm restarts them after its credential window (about 2 min); each
    // runs to its end once more.
    let mut done = Vec::new();
    for (name, forwarded, id) in &ids {
        let r = lab.wait_done("beta", *id, Duration::from_secs(300)).unwrap();
        done.push((*name, *forwarded, *id, r));
    }
    for (name, forwarded, id, r) in &done {
        assert_eq!(r["JobState"], "FAILED", "{name}: {r:?}");
        assert_eq!(r["ExitCode"], "3:0", "{name}: {r:?}");
        assert_eq!(r["Restarts"], "1", "{name}: {r:?}");
        let out = text(&dir.join(name));
        let runs = out.matches("run-").count();
        let want = if name.ends_with("append") { 2 } else { 1 };
        assert_eq!(runs, want, "{name}: {out:?}");
        assert!(out.ends_with("end\n"), "{name}: {out:?}");
        if *forwarded {
            let rec = fleet_record(lab, *id).unwrap();
            assert_eq!(rec["requeues"], 1, "{name}: {rec}");
            assert_eq!(rec["origin_restart"], 1, "{name}: {rec}");
            assert_eq!(rec["exit_code"], 3, "{name}: {rec}");
        }
    }
    // Same shape as Slurm's own: the forwarded files look like the native ones.
    for (a, b) in [("native-trunc", "fleet-trunc"), ("native-append", "fleet-append")] {
        let shape = |n: &str| {
            text(&dir.join(n))
                .lines()
                .map(|l| {
                    if l.starts_with("run-") {
                        "run"
                    } else if l == "end" {
                        "end"
                    } else {
                        "other"
                    }
                })
                .filter(|l| *l != "other")
                .collect::<Vec<_>>()
        };
        assert_eq!(shape(a), shape(b), "{a} vs {b}");
    }
}

/// `scontrol suspend` / `resume` of the stand-in (as an operator, as
/// natively): the job at alpha stops while the stand-in is suspended and
/// carries on after the resume, as the native job at beta does. Each tick
/// carries its time, so the pause shows in the output itself (the
/// stand-in's relay is stopped too while suspended, and catches up later).
#[test]
fn suspend_and_resume_of_a_stand_in_stop_and_continue_the_job() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("suspend");
    let body = script("for i in $(seq 100); do echo tick $(date +%s); sleep 0.5; done\necho end");
    let native = lab.sbatch("beta", &refs(&native_args(&dir, "native", &[])), &body).unwrap();
    let fleet = lab.sbatch("beta", &refs(&forwarded_args(&dir, "fleet", &[])), &body).unwrap();
    let _cancel = cancel_on_drop(lab, vec![native, fleet]);
    for n in ["native", "fleet"] {
        wait_file(&dir.join(n), T, |b| String::from_utf8_lossy(b).matches("tick").count() >= 4).unwrap();
    }
    for id in [native, fleet] {
        let o = lab.cmd("beta", "scontrol", &["suspend", &id.to_string()]).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let suspended = Duration::from_secs(16);
    std::thread::sleep(suspended);
    for id in [native, fleet] {
        assert_eq!(lab.job("beta", id).unwrap()["JobState"], "SUSPENDED");
        let o = lab.cmd("beta", "scontrol", &["resume", &id.to_string()]).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let gaps = |n: &str| -> (usize, i64) {
        let t: Vec<i64> = text(&dir.join(n)).lines().filter_map(|l| l.strip_prefix("tick ")?.parse().ok()).collect();
        (t.len(), t.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0))
    };
    for n in ["native", "fleet"] {
        let before = gaps(n).0;
        wait_file(&dir.join(n), Duration::from_secs(30), |b| {
            String::from_utf8_lossy(b).matches("tick").count() > before + 4
        })
        .unwrap_or_else(|e| panic!("{n} did not continue after the resume: {e:#}"));
        let (_, gap) = gaps(n);
        eprintln!("{n}: longest pause between ticks {gap} s (suspended {suspended:?})");
        // Native: the whole suspension. Forwarded: less the origin agent's
        // reconcile interval (5 s) before the STOP reaches alpha.
        assert!((9..=18).contains(&gap), "{n}: longest pause {gap} s: {}", text(&dir.join(n)));
    }
    for id in [native, fleet] {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    }
}

/// `scontrol update TimeLimit=` of a pending stand-in by its user reaches
/// the job at its target, as the same update of a pending native job
/// takes effect (Slurm lets a user lower a pending job's limit, and raise
/// it up to the partition's MaxTime).
#[test]
fn time_limit_updates_of_a_pending_stand_in_reach_the_job() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("limit");
    let body = script("sleep 20");
    let update = |id: u64, limit: &str| {
        let o = lab
            .cmd_as(
                fleet_lab::USER,
                "beta",
                "scontrol",
                &["update", &format!("JobId={id}"), &format!("TimeLimit={limit}")],
            )
            .unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let mut jobs = Vec::new();
    for (limit, n) in [("3", "lower"), ("20", "higher")] {
        let native =
            lab.sbatch("beta", &refs(&native_args(&dir, &format!("n-{n}"), &["--hold", "-t", "10"])), &body).unwrap();
        let fleet = lab
            .sbatch("beta", &refs(&forwarded_args(&dir, &format!("f-{n}"), &["--hold", "-t", "10"])), &body)
            .unwrap();
        let (a, b) = (update(native, limit), update(fleet, limit));
        assert_eq!(a.0, b.0, "TimeLimit={limit}: native {a:?}, stand-in {b:?}");
        jobs.push((native, fleet));
    }
    let _cancel = cancel_on_drop(lab, jobs.iter().flat_map(|j| [j.0, j.1]).collect());
    for (native, fleet) in &jobs {
        for id in [native, fleet] {
            let o = lab.cmd_as(fleet_lab::USER, "beta", "scontrol", &["release", &id.to_string()]).unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    }
    for (native, fleet) in &jobs {
        let want = lab.job("beta", *native).unwrap()["TimeLimit"].clone();
        let t0 = std::time::Instant::now();
        let (target, remote) = loop {
            if let Some((t, r)) = remote_of(lab, *fleet).filter(|(_, r)| *r > 0) {
                break (t, r);
            }
            assert!(t0.elapsed() < T, "job {fleet} never reached its target");
            std::thread::sleep(Duration::from_millis(300));
        };
        let r = lab.job(&target, remote).unwrap();
        assert_eq!(r["TimeLimit"], want, "stand-in {fleet}: remote {r:?}");
    }
    for (native, fleet) in jobs {
        let _ = lab.cmd("beta", "scancel", &[&native.to_string(), &fleet.to_string()]);
    }
}

/// `scontrol update` of a pending job's resources: Slurm applies it to a
/// native job, which runs with them. A forwarded job's stand-in holds
/// placeholders for them (the proxy partition, one CPU, no GPUs): the same
/// update used to move it out of the proxy partition and make it ask for
/// what it can never get there, so it pended for good (`BadConstraints`)
/// and its job never ran, the update never reaching it. Now the update is
/// refused (`Requested operation not supported`, slurmctld's log naming
/// the fields; 22.05 hands job_modify's message to no one) and the job runs
/// as submitted; what Slurm does to the stand-in as to a native job (time
/// limit, name) goes through. An update by job name, and one of a pending
/// array element, are checked the same. The list the plugin checks
/// against, and the fleet view beside it, are readable by SlurmUser and
/// the agent only.
#[test]
fn an_update_of_a_stand_ins_resources_is_refused_and_the_job_runs_as_submitted() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("update-stand-in");
    let body = script("echo \"at $SLURM_CLUSTER_NAME on $SLURM_JOB_NUM_NODES node(s)\"");
    let native = lab.sbatch("beta", &refs(&native_args(&dir, "native", &["--hold"])), &body).unwrap();
    let fleet = lab.sbatch("beta", &refs(&forwarded_args(&dir, "fleet", &["--hold"])), &body).unwrap();
    let array =
        lab.sbatch("beta", &refs(&forwarded_args(&dir, "array-%a", &["--hold", "--array=0-1"])), &body).unwrap();
    let _cancel = cancel_on_drop(lab, vec![native, fleet, array]);
    // The agent lists a stand-in for the plugin once the plugin's datagram
    // woke its scan (about a second; at least every 5 s).
    let list = lab.root.join("beta/agent/stand-ins");
    let t0 = std::time::Instant::now();
    while !text(&list).lines().any(|l| l == fleet.to_string()) || !text(&list).lines().any(|l| l == array.to_string()) {
        assert!(t0.elapsed() < T, "beta's agent never listed stand-ins {fleet} {array}: {:?}", text(&list));
        std::thread::sleep(Duration::from_millis(300));
    }
    eprintln!("stand-ins listed {:.1} s after their submission", t0.elapsed().as_secs_f64());
    // The plugin's watcher reads the list again within its poll (100 ms;
    // longer on a busy machine): an update made before then goes through
    // unchecked (CI once made it a few tens of ms after the list changed).
    std::thread::sleep(Duration::from_secs(1));
    assert!(!text(&list).lines().any(|l| l == native.to_string()), "a native job is no stand-in");
    // The list names every user's forwarded jobs, which PrivateData=jobs
    // hides from other users, and the view the users each cluster admits:
    // only the agent and SlurmUser (the plugin in slurmctld) read them.
    let view = lab.root.join("beta/agent/view.json");
    for path in [&list, &view] {
        for user in [fleet_lab::USER, fleet_lab::OTHER_USER] {
            let o = lab.cmd_as(user, "beta", "cat", &[path.to_str().unwrap()]).unwrap();
            assert!(!o.status.success() && o.stdout.is_empty(), "{user} read {}", path.display());
        }
    }
    let o = lab.cmd_as("slurm", "beta", "cat", &[list.to_str().unwrap()]).unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).lines().any(|l| l == fleet.to_string()),
        "SlurmUser cannot read the list"
    );
    let o = lab.cmd_as("slurm", "beta", "cat", &[view.to_str().unwrap()]).unwrap();
    let v: Option<fleet_api::api::FleetView> = serde_json::from_slice(&o.stdout).ok();
    assert!(v.is_some_and(|v| v.clusters.iter().any(|c| c.name == "beta")), "SlurmUser cannot read the view");
    let update_by = |by: &str, what: &str| {
        let o = lab.cmd_as(fleet_lab::USER, "beta", "scontrol", &["update", by, what]).unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let update = |id: u64, what: &str| update_by(&format!("JobId={id}"), what);
    for what in ["Gres=gpu:a100:2", "NumNodes=2", "Partition=short"] {
        let (n, f) = (update(native, what), update(fleet, what));
        assert!(n.0, "{what}: native {n:?}");
        assert!(!f.0 && f.1.contains("Requested operation not supported"), "{what}: stand-in {f:?}");
    }
    let tag = std::process::id();
    let (native_name, fleet_name) = (format!("upd-native-{tag}"), format!("upd-fleet-{tag}"));
    for (id, name) in [(native, &native_name), (fleet, &fleet_name)] {
        let r = update(id, &format!("Name={name}"));
        assert!(r.0, "Name={name}: {r:?}");
    }
    // An update naming the job by its name (scontrol finds the id) is
    // checked the same.
    let (n, f) = (
        update_by(&format!("JobName={native_name}"), "NumNodes=2"),
        update_by(&format!("JobName={fleet_name}"), "NumNodes=2"),
    );
    assert!(n.0, "by name: native {n:?}");
    assert!(!f.0 && f.1.contains("Requested operation not supported"), "by name: stand-in {f:?}");
    let a = update_by(&format!("JobId={array}_1"), "NumNodes=2");
    assert!(!a.0 && a.1.contains("Requested operation not supported"), "array element: {a:?}");
    let _ = lab.cmd("beta", "scancel", &[&array.to_string()]);
    for what in ["TimeLimit=30", "Name=renamed"] {
        let (n, f) = (update(native, what), update(fleet, what));
        assert!(n.0 && f.0, "{what}: native {n:?}, stand-in {f:?}");
    }
    let log = text(&lab.root.join("beta/log/slurmctld.log"));
    let said = format!(
        "fleet: job {fleet} runs at another cluster through Fleet (this job is its stand-in here): its Partition \
         cannot be changed once it is submitted"
    );
    assert!(log.contains(&said), "slurmctld's log at beta does not say why");
    let r = lab.job("beta", fleet).unwrap();
    let shown = ["Partition", "NumNodes", "TresPerNode", "TimeLimit", "JobName"].map(|k| r.get(k).cloned());
    assert_eq!(
        shown.each_ref().map(|v| v.as_deref()),
        [Some("fleet"), Some("1-1"), None, Some("00:30:00"), Some("renamed")],
        "{r:?}"
    );
    for id in [native, fleet] {
        let o = lab.cmd_as(fleet_lab::USER, "beta", "scontrol", &["release", &id.to_string()]).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let n = lab.wait_done("beta", native, T).unwrap();
    let f = lab.wait_done("beta", fleet, T).unwrap();
    assert_eq!((n["JobState"].as_str(), f["JobState"].as_str()), ("COMPLETED", "COMPLETED"), "{n:?} {f:?}");
    assert_eq!(text(&dir.join("native")), "at beta on 2 node(s)\n", "the native job runs as updated");
    assert_eq!(text(&dir.join("fleet")), "at alpha on 1 node(s)\n", "the forwarded one as submitted");
    let (target, remote) = remote_of(lab, fleet).unwrap();
    assert_eq!(lab.job(&target, remote).unwrap()["TimeLimit"], "00:30:00", "its new limit reached it");
}

/// `scontrol update TimeLimit=` lowering a *running* stand-in's limit (what
/// Slurm lets a user do to a running job): Slurm ends the stand-in at the
/// new limit, `TIMEOUT` as it ends the native job, and the proxy cancels
/// the remote job. The limit counts from the stand-in's start. The job's
/// `--signal=B:USR1@50` warning, which Slurm at home now sends the
/// stand-in, is forwarded: the script's trap runs at alpha as natively.
#[test]
fn a_lower_time_limit_of_a_running_stand_in_ends_the_job_timeout() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("limit-running");
    let body = script("trap 'echo got-usr1' USR1\necho started\nfor i in $(seq 600); do sleep 1; done");
    let opts = ["-t", "10", "--signal=B:USR1@50"];
    let native = lab.sbatch("beta", &refs(&native_args(&dir, "native", &opts)), &body).unwrap();
    let fleet = lab.sbatch("beta", &refs(&forwarded_args(&dir, "fleet", &opts)), &body).unwrap();
    let _cancel = cancel_on_drop(lab, vec![native, fleet]);
    for n in ["native", "fleet"] {
        wait_file(&dir.join(n), T, |b| b.starts_with(b"started\n")).unwrap();
    }
    for id in [native, fleet] {
        let o = lab
            .cmd_as(fleet_lab::USER, "beta", "scontrol", &["update", &format!("JobId={id}"), "TimeLimit=1"])
            .unwrap();
        assert!(o.status.success(), "{id}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let (target, remote) = remote_of(lab, fleet).unwrap();
    for id in [native, fleet] {
        let r = lab.wait_done("beta", id, Duration::from_secs(200)).unwrap();
        assert_eq!(r["JobState"], "TIMEOUT", "{id}: {r:?}");
    }
    let r = lab.wait_done(&target, remote, T).unwrap();
    assert_eq!(r["JobState"], "CANCELLED", "the remote job is cancelled with its stand-in: {r:?}");
    for n in ["native", "fleet"] {
        let out = text(&dir.join(n));
        assert_eq!(out.matches("got-usr1").count(), 1, "{n}: {out:?}");
    }
}

/// A job that runs into its time limit at alpha ends `TIMEOUT` at home,
/// as the same job run natively at beta does (the proxy lowers its own
/// limit to what it ran and lets slurmctld end it).
#[test]
fn a_remote_timeout_shows_as_timeout_at_home() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("timeout");
    let body = script("echo started\nsleep 600");
    let native = lab.sbatch("beta", &refs(&native_args(&dir, "native", &["-t", "1"])), &body).unwrap();
    let fleet = lab.sbatch("beta", &refs(&forwarded_args(&dir, "fleet", &["-t", "1"])), &body).unwrap();
    let _cancel = cancel_on_drop(lab, vec![native, fleet]);
    let n = lab.wait_done("beta", native, Duration::from_secs(200)).unwrap();
    let f = lab.wait_done("beta", fleet, Duration::from_secs(300)).unwrap();
    assert_eq!(n["JobState"], "TIMEOUT", "{n:?}");
    assert_eq!(f["JobState"], "TIMEOUT", "{f:?}");
    assert_eq!(f["ExitCode"], n["ExitCode"], "native {n:?} vs forwarded {f:?}");
    let rec = fleet_record(lab, fleet).unwrap();
    assert!(rec["reason"].as_str().unwrap_or("").starts_with("TIMEOUT at alpha"), "{rec}");
    let (target, remote) = remote_of(lab, fleet).unwrap();
    assert_eq!(lab.job(&target, remote).unwrap()["JobState"], "TIMEOUT");
    // Accounting at home agrees.
    let o = lab.cmd("beta", "sacct", &["-X", "-n", "-P", "-o", "State", "-j", &fleet.to_string()]).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "TIMEOUT");
    assert!(text(&dir.join("fleet")).starts_with("started\n"));
}

/// A job that runs out of its `--mem` at alpha (which confines memory in
/// cgroups, as every lab cluster does: tests/lab/lab.sh `FLEET_LAB_MEMCG`) ends
/// `OUT_OF_MEMORY` there, and at home in `scontrol show job`, `squeue` and
/// `sacct`, with the ExitCode (`0:125`) of the same job run natively at
/// beta: the proxy, after relaying the output, fills its own cgroup until
/// the OOM killer ends its child, so slurmd at home reports the stand-in
/// out of memory (wrappers/fleet-proxy/src/oom.rs).
#[test]
fn a_remote_out_of_memory_shows_as_out_of_memory_at_home() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("oom");
    let body = script("echo started\npython3 -c 'x = bytearray(400 << 20)'\necho survived\nexit 0");
    let opts = ["--mem=100M", "-t", "5"];
    let native = lab.sbatch("beta", &refs(&native_args(&dir, "native", &opts)), &body).unwrap();
    let mut f = forwarded_args(&dir, "fleet", &opts);
    f.push("--fleet-to=alpha".into());
    let fleet = lab.sbatch("beta", &refs(&f), &body).unwrap();
    let _cancel = cancel_on_drop(lab, vec![native, fleet]);
    let n = lab.wait_done("beta", native, T).unwrap();
    let s = lab.wait_done("beta", fleet, Duration::from_secs(150)).unwrap();
    assert_eq!(n["JobState"], "OUT_OF_MEMORY", "the native twin: {n:?}");
    let (target, remote) = remote_of(lab, fleet).unwrap();
    assert_eq!(target, "alpha");
    let r = lab.job(&target, remote).unwrap();
    assert_eq!(r["JobState"], "OUT_OF_MEMORY", "at alpha: {r:?}");
    assert_eq!(s["JobState"], "OUT_OF_MEMORY", "at home: {s:?}");
    assert_eq!(s["ExitCode"], n["ExitCode"], "native {n:?} vs forwarded {s:?}");
    assert_eq!(s["Reason"], "OutOfMemory", "{s:?}");
    assert!(s["Comment"].contains("OUT_OF_MEMORY"), "{s:?}");
    let rec = fleet_record(lab, fleet).unwrap();
    assert!(rec["reason"].as_str().unwrap_or("").starts_with("OUT_OF_MEMORY at alpha"), "{rec}");
    // squeue and accounting at home agree.
    let o = lab.cmd("beta", "squeue", &["-h", "-t", "all", "-o", "%T", "-j", &fleet.to_string()]).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "OUT_OF_MEMORY");
    let t0 = std::time::Instant::now();
    loop {
        let o =
            lab.cmd("beta", "sacct", &["-X", "-n", "-P", "-o", "State,ExitCode", "-j", &fleet.to_string()]).unwrap();
        let got = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if got == format!("OUT_OF_MEMORY|{}", n["ExitCode"]) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "sacct at home: {got:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = text(&dir.join("fleet"));
    assert!(out.starts_with("started\n") && out.contains("survived\n"), "{out:?}");
    assert!(out.contains("OUT_OF_MEMORY at alpha"), "the job's stderr names the remote state: {out:?}");
}

/// An admin at alpha cancels a forwarded job's remote run (`scancel` as
/// root there): the stand-in at home ends `CANCELLED` with the ExitCode of
/// its native twin that root cancels at beta (the proxy, after relaying the
/// output, cancels its own stand-in, which its user may), not `FAILED`.
#[test]
fn a_remote_cancel_by_an_admin_shows_as_cancelled_at_home() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("admin-cancel");
    let body = script("echo started\nfor i in $(seq 300); do sleep 1; done");
    let native = lab.sbatch("beta", &refs(&native_args(&dir, "native", &["-t", "10"])), &body).unwrap();
    let mut f = forwarded_args(&dir, "fleet", &["-t", "10"]);
    f.push("--fleet-to=alpha".into());
    let fleet = lab.sbatch("beta", &refs(&f), &body).unwrap();
    let _cancel = cancel_on_drop(lab, vec![native, fleet]);
    for n in ["native", "fleet"] {
        wait_file(&dir.join(n), T, |b| b.starts_with(b"started\n")).unwrap();
    }
    let (target, remote) = remote_of(lab, fleet).unwrap();
    assert!(lab.cmd(&target, "scancel", &[&remote.to_string()]).unwrap().status.success());
    assert!(lab.cmd("beta", "scancel", &[&native.to_string()]).unwrap().status.success());
    let n = lab.wait_done("beta", native, T).unwrap();
    let s = lab.wait_done("beta", fleet, T).unwrap();
    assert_eq!(lab.job(&target, remote).unwrap()["JobState"], "CANCELLED");
    assert_eq!(n["JobState"], "CANCELLED", "{n:?}");
    assert_eq!(s["JobState"], "CANCELLED", "{s:?}");
    assert_eq!(s["ExitCode"], n["ExitCode"], "native {n:?} vs forwarded {s:?}");
    let rec = fleet_record(lab, fleet).unwrap();
    assert!(rec["reason"].as_str().unwrap_or("").starts_with("CANCELLED at alpha"), "{rec}");
    let o = lab.cmd("beta", "squeue", &["-h", "-t", "all", "-o", "%T", "-j", &fleet.to_string()]).unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "CANCELLED");
}

/// An admin edits fleet.conf and runs `scontrol reconfigure`: the plugin
/// inside slurmctld uses the new file from the next submission on (Slurm
/// 22.05 re-inits job_submit plugins at reconfigure only when
/// `JobSubmitPlugins` changed, so the plugin notices the file itself).
/// Here: `FailOpen=no` and an `AgentSocket` nobody serves, so a job that
/// must ask the agent is refused with Fleet's words; with the file back,
/// the same job is forwarded again.
#[test]
fn a_changed_fleet_conf_is_used_after_scontrol_reconfigure() {
    let (lab, _serial) = Lab::lock();
    let conf = lab.root.join("beta/fleet.conf");
    let original = std::fs::read_to_string(&conf).unwrap();
    let reconfigure = || {
        let o = lab.cmd("beta", "scontrol", &["reconfigure"]).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let _restore = fleet_lab::OnDrop(|| {
        fleet_lab::replace_file(&conf, &original);
        let _ = lab.cmd("beta", "scontrol", &["reconfigure"]);
    });
    let sock = lab.root.join("beta/agent.sock");
    let nobody = lab.root.join("beta/nobody.sock");
    assert!(original.contains("FailOpen=yes") && original.contains(&format!("AgentSocket={}", sock.display())));
    let edited = original
        .replace("FailOpen=yes", "FailOpen=no")
        .replace(&format!("AgentSocket={}", sock.display()), &format!("AgentSocket={}", nobody.display()));
    fleet_lab::replace_file(&conf, &edited);
    reconfigure();
    let body = script("true");
    // --fleet-to makes the plugin ask the agent rather than its cached view.
    // A job the view keeps home is refused (FailOpen=no); one the view sends
    // away would become a deferred stand-in instead, FailOpen or not.
    let err = lab.sbatch("beta", &["--gres=gpu:a100:1", "--fleet-to=beta", "--hold"], &body).unwrap_err();
    assert!(err.contains("fleet: the site agent is unavailable") && err.contains("FailOpen=no"), "{err}");
    let log = std::fs::read_to_string(lab.root.join("beta/log/slurmctld.log")).unwrap();
    assert!(log.contains(&format!("job_submit/fleet: fleet.conf {} changed", conf.display())), "nothing logged");

    fleet_lab::replace_file(&conf, &original);
    reconfigure();
    let id = lab.sbatch("beta", &["--gres=gpu:h100:8", "--fleet-to=alpha", "--hold"], &body).unwrap();
    let _cancel = cancel_on_drop(lab, vec![id]);
    assert_eq!(lab.job("beta", id).unwrap()["Partition"], "fleet", "forwarded again");
    assert!(lab.ctld_alive("beta"));
}

/// `scontrol update TimeLimit=` of a *running* stand-in reaches its remote
/// job as Slurm lets it: lowered by its user, as for the native twin, the
/// remote job gets the twin's new limit; set above the job's own by its
/// user (which Slurm at home allows on the limitless stand-in), the remote
/// job keeps its limit, as the twin does. Raised by root (an operator at
/// home; the owner is refused, natively and for the stand-in alike), the
/// twin, the stand-in and the remote job get the new limit: the target
/// agent sets it as itself, an operator there (README: job control).
#[test]
fn time_limit_updates_of_a_running_stand_in_reach_the_job_lowered_and_raised() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("limit-running-remote");
    let body = script("echo started\nfor i in $(seq 900); do sleep 1; done");
    let native = lab.sbatch("beta", &refs(&native_args(&dir, "native", &["-t", "30"])), &body).unwrap();
    let fleet = lab.sbatch("beta", &refs(&forwarded_args(&dir, "fleet", &["-t", "30"])), &body).unwrap();
    let _cancel = cancel_on_drop(lab, vec![native, fleet]);
    for n in ["native", "fleet"] {
        wait_file(&dir.join(n), T, |b| b.starts_with(b"started\n")).unwrap();
    }
    let (target, remote) = remote_of(lab, fleet).unwrap();
    let limit = |cluster: &str, id: u64| lab.job(cluster, id).unwrap()["TimeLimit"].clone();
    assert_eq!(limit(&target, remote), "00:30:00");
    let update = |user: Option<&str>, id: u64, minutes: &str| {
        let args = ["update".to_string(), format!("JobId={id}"), format!("TimeLimit={minutes}")];
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let o = match user {
            Some(u) => lab.cmd_as(u, "beta", "scontrol", &args),
            None => lab.cmd("beta", "scontrol", &args),
        }
        .unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stderr).trim().to_string())
    };

    // A stand-in has no limit of its own, so Slurm at home lets its owner
    // set any, also one above the job's, which the twin's owner may not:
    // the target's Slurm judges it as the owner's own update and refuses
    // it there too (the target agent, an operator, lends it no rights).
    let (a, b) = (update(Some(fleet_lab::USER), native, "60"), update(Some(fleet_lab::USER), fleet, "60"));
    assert!(!a.0 && b.0, "native {a:?}, stand-in {b:?}");
    // Two of the origin agent's passes (5 s) and the target's work poll.
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        assert_eq!(limit(&target, remote), "00:30:00", "the owner raised the remote job's limit");
        std::thread::sleep(Duration::from_millis(500));
    }

    // Lowered by the owner: everywhere.
    let (a, b) = (update(Some(fleet_lab::USER), native, "20"), update(Some(fleet_lab::USER), fleet, "20"));
    assert!(a.0 && b.0, "native {a:?}, stand-in {b:?}");
    let want = limit("beta", native);
    assert_eq!(want, "00:20:00");
    let t0 = std::time::Instant::now();
    while limit(&target, remote) != want {
        assert!(t0.elapsed() < Duration::from_secs(30), "the remote job still has {}", limit(&target, remote));
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("a lowered TimeLimit reached the remote job after {:?}", t0.elapsed());
    // Raising is refused to the owner, natively and for the stand-in alike.
    let (a, b) = (update(Some(fleet_lab::USER), native, "25"), update(Some(fleet_lab::USER), fleet, "25"));
    assert!(!a.0 && !b.0, "native {a:?}, stand-in {b:?}");

    // Raised by root at home (an operator): at the target too.
    let (a, b) = (update(None, native, "40"), update(None, fleet, "40"));
    assert!(a.0 && b.0, "native {a:?}, stand-in {b:?}");
    assert_eq!((limit("beta", native), limit("beta", fleet)), ("00:40:00".into(), "00:40:00".into()));
    let t0 = std::time::Instant::now();
    while limit(&target, remote) != "00:40:00" {
        assert!(t0.elapsed() < Duration::from_secs(30), "the remote job still has {}", limit(&target, remote));
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("a raised TimeLimit reached the remote job after {:?}", t0.elapsed());

    // An operator at home is none at the target: the agent's rights raise
    // the remote job no further than its partition's MaxTime there.
    let part = lab.job(&target, remote).unwrap()["Partition"].clone();
    let set_max = |v: &str| {
        let args = ["update".to_string(), format!("PartitionName={part}"), format!("MaxTime={v}")];
        lab.cmd(&target, "scontrol", &args.iter().map(|s| s.as_str()).collect::<Vec<_>>()).unwrap().status.success()
    };
    assert!(set_max("45"));
    let _restore = fleet_lab::OnDrop(|| assert!(set_max("INFINITE"), "restoring {part}'s MaxTime at {target}"));
    let b = update(None, fleet, "90");
    assert!(b.0, "{b:?}");
    let t0 = std::time::Instant::now();
    while limit(&target, remote) != "00:45:00" {
        assert!(t0.elapsed() < Duration::from_secs(30), "the remote job has {}", limit(&target, remote));
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!((limit("beta", fleet), limit(&target, remote)), ("01:30:00".into(), "00:45:00".into()));
    assert_eq!(lab.job("beta", fleet).unwrap()["JobState"], "RUNNING");
    assert_eq!(lab.job(&target, remote).unwrap()["JobState"], "RUNNING");
}

/// Seconds from sbatch to RUNNING of a local `--exclusive` job at alpha.
fn exclusive_start(lab: &Lab, dir: &std::path::Path, name: &str) -> Duration {
    let t0 = std::time::Instant::now();
    let id = lab
        .sbatch("alpha", &["--exclusive", "-N1", "--gres=gpu:h100:8", &out_arg(dir, name)], &script("sleep 2"))
        .unwrap();
    let _cancel = fleet_lab::OnDrop(move || {
        let _ = lab.cmd("alpha", "scancel", &[&id.to_string()]);
    });
    let r = lab.wait_for("alpha", id, T, |r| r["JobState"] != "PENDING").unwrap();
    let took = t0.elapsed();
    assert_eq!(r["Partition"], "gpu", "a local job: {r:?}");
    assert!(matches!(r["JobState"].as_str(), "RUNNING" | "COMPLETING" | "COMPLETED"), "{r:?}");
    lab.wait_done("alpha", id, T).unwrap();
    took
}

/// Stand-ins never delay local work (issue 6, finding 4): they run on the
/// proxy partition's own node, so a local `--exclusive` job at alpha starts
/// as fast with 10 stand-ins running there as with none.
#[test]
fn a_local_exclusive_job_starts_as_fast_with_ten_stand_ins_running() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("exclusive");
    let without = exclusive_start(lab, &dir, "x0");
    // Ten jobs from alpha that only beta can run (A100): ten stand-ins at alpha.
    let ids: Vec<u64> = (0..10)
        .map(|i| {
            lab.sbatch("alpha", &["--gres=gpu:a100:1", &out_arg(&dir, &format!("s{i}"))], &script("sleep 240")).unwrap()
        })
        .collect();
    let _cancel = fleet_lab::OnDrop(|| {
        let args: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let _ = lab.cmd("alpha", "scancel", &args);
    });
    for &id in &ids {
        let r = lab.wait_for("alpha", id, T, |r| r["JobState"] == "RUNNING").unwrap();
        assert_eq!((r["Partition"].as_str(), r["NodeList"].as_str()), ("fleet", "alphaproxy"), "{r:?}");
    }
    let with = exclusive_start(lab, &dir, "x1");
    for &id in &ids {
        assert_eq!(lab.job("alpha", id).unwrap()["JobState"], "RUNNING", "the stand-ins ran all along");
    }
    eprintln!("local --exclusive job at alpha started after {without:?} without stand-ins, {with:?} with 10");
    assert!(with <= without + Duration::from_secs(5), "{with:?} with 10 stand-ins, {without:?} without");
}

/// One line of the lab's MailProg log (`$LAB/mail.log`, lab.sh).
#[derive(Debug)]
struct Mail {
    at: u64,
    to: String,
    subject: String,
    env: std::collections::BTreeMap<String, String>,
}

fn mails(lab: &Lab, job_id: u64) -> Vec<Mail> {
    let tag = format!("Job_id={job_id} ");
    text(&lab.root.join("mail.log"))
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let [at, _sender, to, subject, env] = f[..] else { return None };
            let env = env.split('\u{1f}').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into()));
            Some(Mail { at: at.parse().ok()?, to: to.into(), subject: subject.into(), env: env.collect() })
        })
        .filter(|m| m.subject.contains(&tag))
        .collect()
}

/// alpha's H100s held by a job of its own (`sleep secs`, output
/// `blocker.txt` in `dir`), running, until the guard drops or the test
/// cancels it: (its id, the guard). `--fleet=local`: a node still
/// completing an earlier test's job when it is submitted would otherwise
/// have the engine send the blocker itself to delta, leaving alpha free.
fn alpha_blocked<'a>(lab: &'a Lab, dir: &std::path::Path, secs: u32) -> (u64, fleet_lab::OnDrop<impl FnMut() + 'a>) {
    let body = script(&format!("sleep {secs}"));
    let args = ["--fleet=local", "-N2", "--gres=gpu:h100:8", &out_arg(dir, "blocker.txt")];
    let blocker = lab.sbatch("alpha", &args, &body).unwrap();
    let guard = fleet_lab::OnDrop(move || {
        let _ = lab.cmd("alpha", "scancel", &[&blocker.to_string()]);
    });
    lab.wait_for("alpha", blocker, T, |r| r["JobState"] == "RUNNING").unwrap();
    (blocker, guard)
}

/// A native twin at beta (`<name>-native`, output `native.txt`) and a
/// forwarded job (`<name>-fleet`, `fleet.txt`, plus `fleet_only`) with the
/// same `args`: (native id, forwarded id).
fn mail_twins(
    lab: &Lab,
    dir: &std::path::Path,
    name: &str,
    args: &[&str],
    fleet_only: &[&str],
    native_body: &str,
    fleet_body: &str,
) -> (u64, u64) {
    let (n, f) = (format!("{name}-native"), format!("{name}-fleet"));
    let native_opts = native_args(dir, "native.txt", &[args, &["-J", &n]].concat());
    let native = lab.sbatch("beta", &refs(&native_opts), &script(native_body)).unwrap();
    let fleet_opts = forwarded_args(dir, "fleet.txt", &[args, fleet_only, &["-J", &f]].concat());
    let fleet = lab.sbatch("beta", &refs(&fleet_opts), &script(fleet_body)).unwrap();
    (native, fleet)
}

/// A mail's subject with the job's id, name and times blanked, to compare
/// a forwarded job's with its native twin's.
fn shape(m: &Mail, id: u64, name: &str) -> String {
    let s = m.subject.replace(&format!("Job_id={id} "), "Job_id=ID ").replace(&format!("Name={name} "), "Name=NAME ");
    s.chars().map(|c| if c.is_ascii_digit() { '9' } else { c }).collect()
}

/// `--mail-type=BEGIN` without `--mail-user`: Slurm mails the user when the
/// job begins. A forwarded job's stand-in starts at once, while the job may
/// still wait at its target: its BEGIN mail must come when the job starts
/// there, as Slurm's subject and variables, once. Slurm at home is the
/// oracle: the native twin's mails, through the same MailProg.
#[test]
fn the_begin_mail_comes_when_the_job_begins_at_its_target_as_slurm_sends_a_natives() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("mail");
    // alpha's H100s busy with a job of its own until the test lets it go.
    let (blocker, _blocker) = alpha_blocked(lab, &dir, 120);
    let (native, fleet) = mail_twins(
        lab,
        &dir,
        "mail",
        &["--mail-type=BEGIN,END"],
        &["--fleet-to=alpha"],
        "sleep 1",
        "echo ran; sleep 1",
    );
    let _cancel = cancel_on_drop(lab, vec![native, fleet]);
    lab.wait_done("beta", native, T).unwrap();
    lab.wait_for("beta", fleet, T, |r| r["JobState"] == "RUNNING").unwrap();
    // The stand-in runs; the job waits at alpha: no BEGIN mail yet.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(lab.job("beta", fleet).unwrap()["JobState"], "RUNNING");
    let early = mails(lab, fleet);
    assert!(early.is_empty(), "mailed before the job began at alpha: {early:?}");
    let released = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let o = lab.cmd("alpha", "scancel", &[&blocker.to_string()]).unwrap();
    assert!(o.status.success());
    let r = lab.wait_done("beta", fleet, T).unwrap();
    assert_eq!(r["ExitCode"], "0:0", "{r:?}");
    assert_eq!(text(&dir.join("fleet.txt")), "ran\n");
    // Slurm's END mail of the stand-in is sent as the job ends; give MailProg a moment.
    let t0 = std::time::Instant::now();
    while mails(lab, fleet).len() < 2 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(250));
    }
    let (n, f) = (mails(lab, native), mails(lab, fleet));
    let kinds = |v: &[Mail]| {
        v.iter().map(|m| m.env.get("SLURM_JOB_MAIL_TYPE").cloned().unwrap_or_default()).collect::<Vec<_>>()
    };
    assert_eq!(kinds(&n), ["Began", "Ended"], "native: {n:?}");
    assert_eq!(kinds(&f), ["Began", "Ended"], "forwarded: {f:?}");
    let (nb, fb) = (&n[0], &f[0]);
    assert!(fb.at >= released, "BEGIN mailed at {} before the job could start at alpha ({released}): {fb:?}", fb.at);
    // Slurm's subject, to the same user, with the variables Slurm gives MailProg.
    assert_eq!(shape(fb, fleet, "mail-fleet"), shape(nb, native, "mail-native"), "{fb:?} / {nb:?}");
    assert_eq!(fb.to, nb.to);
    // The same variables, and no others (the stand-in's comment, Fleet's
    // where the user gave none, is in every mail Slurm sends for it too).
    let keys = |m: &Mail| m.env.keys().filter(|k| *k != "SLURM_JOB_COMMENT").cloned().collect::<Vec<_>>();
    assert_eq!(keys(fb), keys(nb), "{fb:?} / {nb:?}");
    for k in [
        "SLURM_CLUSTER_NAME",
        "SLURM_JOB_ACCOUNT",
        "SLURM_JOB_GID",
        "SLURM_JOB_GROUP",
        "SLURM_JOB_MAIL_TYPE",
        "SLURM_JOB_RESTART_COUNT",
        "SLURM_JOB_STATE",
        "SLURM_JOB_STDIN",
        "SLURM_JOB_UID",
        "SLURM_JOB_USER",
        "SLURM_JOB_WORK_DIR",
    ] {
        assert_eq!(fb.env.get(k), nb.env.get(k), "{k}: {fb:?} / {nb:?}");
    }
    // Its own: the stand-in's id and name, and its output file at home.
    for (k, v) in [
        ("SLURM_JOB_ID", fleet.to_string()),
        ("SLURM_JOBID", fleet.to_string()),
        ("SLURM_JOB_NAME", "mail-fleet".to_string()),
        ("SLURM_JOB_STDOUT", dir.join("fleet.txt").display().to_string()),
    ] {
        assert_eq!(fb.env.get(k), Some(&v), "{k}: {fb:?}");
    }
    // And what Slurm's own mails of the stand-in say of it (its END mail).
    for k in ["SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_JOB_CPUS_PER_NODE"] {
        assert_eq!(fb.env.get(k), f[1].env.get(k), "{k}: {fb:?} / {:?}", f[1]);
    }
    // The queued time counts the wait at alpha (at least the 6 s above).
    let queued = fb.subject.rsplit(' ').next().unwrap_or_default();
    let secs: u64 = queued.split(':').fold(0, |a, p| a * 60 + p.parse::<u64>().unwrap_or(0));
    assert!(secs >= 6, "queued {queued}: {fb:?}");

    // A job over before its stand-in saw it running still gets its BEGIN
    // mail (Slurm sends one for every job that started), once.
    let quick = lab
        .sbatch(
            "beta",
            &refs(&forwarded_args(&dir, "quick.txt", &["--mail-type=BEGIN", "-J", "quick"])),
            &script("true"),
        )
        .unwrap();
    let _cancel_quick = cancel_on_drop(lab, vec![quick]);
    assert_eq!(lab.wait_done("beta", quick, T).unwrap()["ExitCode"], "0:0");
    let t0 = std::time::Instant::now();
    while mails(lab, quick).is_empty() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(250));
    }
    let q = mails(lab, quick);
    assert_eq!(kinds(&q), ["Began"], "{q:?}");
}

/// `--mail-type=TIME_LIMIT_50` (and _80): Slurm mails when the job has run
/// that share of its limit. A forwarded job's stand-in has no limit of its
/// own (the job's wait at its target must not count), so its proxy sends
/// them, counted from the job's start at its target. Native twin at beta
/// as the oracle (Slurm looks at limits every 30 s, the proxy on time).
#[test]
fn time_limit_mails_come_at_their_share_of_the_run_at_the_target_as_slurm_sends_a_natives() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("mail-limit");
    time_limit_mail_twins(lab, &dir, "tl", &["--time=1"], &[]);
}

/// The same without `--time`: the job's limit is its partition's
/// `DefaultTime` at home (a minute in beta's `short`), for the native twin
/// and for the forwarded job, whose target (alpha, without one) gives it
/// that limit. Slurm mails the native job's shares of it; the forwarded
/// job's come from its proxy, of the limit its target reports (before,
/// none came: the job ran under alpha's unlimited default).
#[test]
fn time_limit_mails_without_time_are_shares_of_the_home_partitions_default_limit_as_slurm_sends_a_natives() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("mail-default-limit");
    time_limit_mail_twins(lab, &dir, "dl", &["--partition=short"], &["--fleet-to=alpha"]);
}

/// Sets `DefaultTime` of alpha's `gpu` partition until the guard drops
/// (back to none: the partition's `MaxTime`, unlimited).
fn alpha_default_time(lab: &Lab, minutes: u32) -> fleet_lab::OnDrop<impl FnMut() + '_> {
    let set = move |value: &str| {
        lab.cmd("alpha", "scontrol", &["update", "PartitionName=gpu", &format!("DefaultTime={value}")])
    };
    let said = set(&minutes.to_string()).map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
    let guard = fleet_lab::OnDrop(move || {
        let _ = set("UNLIMITED");
    });
    let p = lab.cmd("alpha", "scontrol", &["show", "partition", "gpu"]).unwrap();
    let want = format!("DefaultTime={:02}:{:02}:00", minutes / 60, minutes % 60);
    assert!(String::from_utf8_lossy(&p.stdout).contains(&want), "{said:?}");
    guard
}

/// A job without `--time` gets its partition's `DefaultTime`, else its
/// `MaxTime` (slurm.conf at beta: `short` a minute by default, `capped` at
/// most two). A forwarded one takes that limit to its target, as its
/// native twin at home has it; before, it got its target's default instead
/// (alpha's `gpu` has a three-minute `DefaultTime` for this test). From a
/// partition without limits (beta's `gpu`) it still gets its target's
/// default: `UNLIMITED` there could pend for good under a QOS `MaxWall`.
#[test]
fn a_job_without_time_takes_its_home_partitions_limit_to_its_target_as_a_native_job_has_it() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("home-limit");
    let _alpha = alpha_default_time(lab, 3);
    let cases = [(Some("short"), "00:01:00"), (Some("capped"), "00:02:00"), (None, "00:03:00")];
    let mut ids = Vec::new();
    let mut jobs = Vec::new();
    for (i, (part, _)) in cases.iter().enumerate() {
        let part: Vec<String> = part.iter().map(|p| format!("--partition={p}")).collect();
        let native_opts = native_args(&dir, &format!("native-{i}.txt"), &[&refs(&part)[..], &["--hold"]].concat());
        let native = lab.sbatch("beta", &refs(&native_opts), &script("true")).unwrap();
        let out = out_arg(&dir, &format!("fleet-{i}.txt"));
        let fleet_opts = [&refs(&part)[..], &["--gres=gpu:h100:1", "--fleet-to=alpha", &out]].concat();
        let fleet = lab.sbatch("beta", &fleet_opts, &script("sleep 30")).unwrap();
        ids.extend([native, fleet]);
        jobs.push((native, fleet));
    }
    let _cancel = cancel_on_drop(lab, ids);
    for ((native, fleet), (part, want)) in jobs.into_iter().zip(cases) {
        let n = lab.job("beta", native).unwrap();
        let native_want = if part.is_some() { want } else { "UNLIMITED" };
        assert_eq!(n["TimeLimit"], native_want, "native twin in {part:?}: {n:?}");
        let t0 = std::time::Instant::now();
        let (target, remote) = loop {
            match remote_of(lab, fleet) {
                Some((target, remote)) if remote > 0 => break (target, remote),
                _ if t0.elapsed() > T => panic!("{fleet} ({part:?}) not placed: {:?}", lab.job("beta", fleet)),
                _ => std::thread::sleep(Duration::from_millis(500)),
            }
        };
        assert_eq!(target, "alpha");
        let at_alpha = lab.job("alpha", remote).unwrap();
        assert_eq!(at_alpha["TimeLimit"], want, "forwarded from {part:?}: {at_alpha:?}");
    }
}

/// A job whose time limit is above a partition's `MaxTime` pends there for
/// good (`PartitionTimeLimit`, as its native twin at delta shows, whose
/// `gpu` allows a day). So it is not sent to delta: with `--fleet-to=delta`
/// sbatch refuses it naming the limit, while a job within it goes there
/// and runs. Before, the two-day job was forwarded to delta and never ran.
#[test]
fn a_job_is_not_sent_where_its_time_limit_is_above_the_partitions_max_time() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("max-time");
    let native_opts = ["--fleet=local", "--gres=gpu:h100:1", "--time=2-00:00:00", &out_arg(&dir, "native.txt")];
    let native = lab.sbatch("delta", &native_opts, &script("true")).unwrap();
    let _native = fleet_lab::OnDrop(|| {
        let _ = lab.cmd("delta", "scancel", &[&native.to_string()]);
    });
    let n = lab.wait_for("delta", native, T, |r| r["Reason"] == "PartitionTimeLimit");
    assert!(n.is_ok(), "the native twin: {n:?}");
    let to_delta = |time: &str, name: &str| {
        let out = out_arg(&dir, name);
        lab.sbatch("beta", &["--gres=gpu:h100:8", "--fleet-to=delta", time, &out], &script("echo ran"))
    };
    let err = to_delta("--time=2-00:00:00", "long.txt").expect_err("a two-day job sent to delta");
    assert!(
        err.contains("delta: the job's time limit 2-00:00:00 is above the longest allowed there (MaxTime 1-00:00:00)"),
        "{err}"
    );
    let fits = to_delta("--time=60", "fits.txt").unwrap();
    let _cancel = cancel_on_drop(lab, vec![fits]);
    let r = lab.wait_done("beta", fits, T).unwrap();
    assert_eq!((r["JobState"].as_str(), r["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{r:?}");
    assert_eq!(remote_of(lab, fits).map(|r| r.0).as_deref(), Some("delta"));
    assert_eq!(text(&dir.join("fits.txt")), "ran\n");
}

/// A native twin at beta and a forwarded job (plus `fleet_only`), both with
/// `args` and `--mail-type=TIME_LIMIT_50,TIME_LIMIT_80`, each sleeping past
/// a limit of one minute: both end TIMEOUT and the forwarded job gets its
/// two mails as Slurm sends the native's, at 30 s and 48 s of its run at
/// its target.
fn time_limit_mail_twins(lab: &Lab, dir: &std::path::Path, name: &str, args: &[&str], fleet_only: &[&str]) {
    let args = [args, &["--mail-type=TIME_LIMIT_50,TIME_LIMIT_80"]].concat();
    let (native, fleet) = mail_twins(lab, dir, name, &args, fleet_only, "sleep 70", "echo ran; sleep 70");
    let _cancel = cancel_on_drop(lab, vec![native, fleet]);
    for id in [native, fleet] {
        let r = lab.wait_done("beta", id, Duration::from_secs(180)).unwrap();
        assert_eq!(r["JobState"], "TIMEOUT", "{r:?}");
    }
    std::thread::sleep(Duration::from_secs(2));
    let (n, f) = (mails(lab, native), mails(lab, fleet));
    let kind = |m: &Mail| m.env.get("SLURM_JOB_MAIL_TYPE").cloned().unwrap_or_default();
    let (n50, n80) = (n.iter().find(|m| kind(m).contains("50%")), n.iter().find(|m| kind(m).contains("80%")));
    let (f50, f80) = (f.iter().find(|m| kind(m).contains("50%")), f.iter().find(|m| kind(m).contains("80%")));
    let n50 = n50.unwrap_or_else(|| panic!("native 50 %: {n:?}"));
    let (f50, f80) = (f50.unwrap_or_else(|| panic!("forwarded 50 %: {f:?}")), f80.expect("forwarded 80 %"));
    assert_eq!(f.len(), 2, "once each, nothing else asked for: {f:?}");
    let (native_name, fleet_name) = (format!("{name}-native"), format!("{name}-fleet"));
    assert_eq!(shape(f50, fleet, &fleet_name), shape(n50, native, &native_name), "{f50:?} / {n50:?}");
    if let Some(n80) = n80 {
        assert_eq!(shape(f80, fleet, &fleet_name), shape(n80, native, &native_name), "{f80:?} / {n80:?}");
    }
    let keys = |m: &Mail| m.env.keys().filter(|k| *k != "SLURM_JOB_COMMENT").cloned().collect::<Vec<_>>();
    assert_eq!(keys(f50), keys(n50), "{f50:?} / {n50:?}");
    assert_eq!(f50.env.get("SLURM_JOB_MAIL_TYPE").map(String::as_str), Some("Reached 50% of time limit"));
    // Counted from the job's start at its target: 30 s and 48 s of a minute.
    let run = |m: &Mail| {
        m.env
            .get("SLURM_JOB_RUN_TIME")
            .map_or(0, |t| t.split(':').fold(0u64, |a, p| a * 60 + p.parse::<u64>().unwrap_or(0)))
    };
    assert!((30..45).contains(&run(f50)), "{f50:?}");
    assert!((48..60).contains(&run(f80)), "{f80:?}");
    assert!(f80.at >= f50.at + 15, "{f50:?} {f80:?}");
}

/// Where Slurm enforces QOS limits (delta here, as most multi-user sites),
/// a native job is held to its QOS's `MaxWall`: a `--time` above it never
/// runs (it pends, `QOSMaxWallDurationPerJobLimit`), and within it the
/// limit counts from the job's start. A forwarded job's stand-in used to be
/// given that `MaxWall` counted from *its* start: it ended TIMEOUT at home
/// while its job still waited at its target, and a `--time` above `MaxWall`
/// ran at the target all the same. Now the stand-in keeps its job's limit
/// for Slurm to judge, and its agent lifts it once the job is placed.
#[test]
fn a_qos_maxwall_holds_a_forwarded_job_as_a_native_one_and_its_wait_at_the_target_does_not_count() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("maxwall");
    let (blocker, _blocker) = alpha_blocked(lab, &dir, 300);
    let at_delta = |name: &str, extra: &[&str], body: &str| {
        let mut args = vec!["--qos=lab-maxwall".to_string(), out_arg(&dir, &format!("{name}.txt"))];
        args.extend(extra.iter().map(|s| s.to_string()));
        lab.sbatch("delta", &refs(&args), &script(body)).unwrap()
    };
    let native_args = ["--fleet=local", "--gres=gpu:h100:1"];
    let fleet_args = ["--gres=gpu:h100:8", "--fleet-to=alpha"];
    let native = at_delta("native", &[&native_args[..], &["--time=1"]].concat(), "sleep 5");
    let fleet = at_delta("fleet", &[&fleet_args[..], &["--time=1"]].concat(), "echo ran; sleep 5");
    let ids = std::cell::RefCell::new(vec![native, fleet]);
    let _cancel = fleet_lab::OnDrop(|| {
        let ids: Vec<String> = ids.borrow().iter().map(|i| i.to_string()).collect();
        let _ = lab.cmd("delta", "scancel", &refs(&ids));
    });
    assert_eq!(lab.wait_done("delta", native, T).unwrap()["JobState"], "COMPLETED");
    let r = lab.wait_for("delta", fleet, T, |r| r["JobState"] == "RUNNING").unwrap();
    assert_eq!(r["Partition"], "fleet", "{r:?}");
    // Its limit is lifted once its job is placed (a minute from its start
    // it would have ended TIMEOUT, its job still waiting at alpha).
    let lifted = lab.wait_for("delta", fleet, Duration::from_secs(20), |r| r["TimeLimit"] == "UNLIMITED");
    assert!(lifted.is_ok(), "{lifted:?}");
    std::thread::sleep(Duration::from_secs(75));
    let r = lab.job("delta", fleet).unwrap();
    assert_eq!((r["JobState"].as_str(), r["TimeLimit"].as_str()), ("RUNNING", "UNLIMITED"), "{r:?}");
    let (target, remote) = remote_of(lab, fleet).expect("placed");
    assert_eq!(target, "alpha");
    let at_alpha = lab.job("alpha", remote).unwrap();
    assert_eq!(at_alpha["JobState"], "PENDING", "{at_alpha:?}");
    assert_eq!(at_alpha["TimeLimit"], "00:01:00", "the job's own limit, from its start there: {at_alpha:?}");
    let o = lab.cmd("alpha", "scancel", &[&blocker.to_string()]).unwrap();
    assert!(o.status.success());
    let r = lab.wait_done("delta", fleet, T).unwrap();
    assert_eq!((r["JobState"].as_str(), r["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{r:?}");
    assert_eq!(text(&dir.join("fleet.txt")), "ran\n");

    // Above MaxWall: Slurm holds the stand-in as it holds the native twin,
    // and the job runs nowhere.
    let native = at_delta("native-over", &[&native_args[..], &["--time=2"]].concat(), "sleep 5");
    let fleet = at_delta("fleet-over", &[&fleet_args[..], &["--time=2"]].concat(), "echo ran; sleep 5");
    ids.borrow_mut().extend([native, fleet]);
    std::thread::sleep(Duration::from_secs(10));
    let (n, f) = (lab.job("delta", native).unwrap(), lab.job("delta", fleet).unwrap());
    assert_eq!((n["JobState"].as_str(), n["Reason"].as_str()), ("PENDING", "QOSMaxWallDurationPerJobLimit"), "{n:?}");
    assert_eq!((f["JobState"].as_str(), f["Reason"].as_str()), ("PENDING", "QOSMaxWallDurationPerJobLimit"), "{f:?}");
    assert_eq!(text(&dir.join("fleet-over.txt")), "", "it ran");
}
