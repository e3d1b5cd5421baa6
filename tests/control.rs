//! Job control of forwarded jobs against the real lab: what a Slurm user
//! does to their job at home reaches the job where it runs.
//!
//! Signals (Slurm 22.05 `scancel(1)`): the stand-in's batch step is
//! `fleet-proxy` and it has no other step, so `scancel --batch --signal=S`
//! and `scancel --full --signal=S` reach the proxy, which forwards S to the
//! remote job (`scancel --full --signal=S` there); plain
//! `scancel --signal=S` signals steps only and reaches nothing.

use std::time::Duration;

use fleet_lab::{fleet_record, out_arg, script, wait_file, Lab};

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
    assert_eq!(rec["target"], "alpha", "{rec}");
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
