//! Start latency against the real lab: early placement (docs/failover.md,
//! "Start latency"). A job forwarded at sbatch time is placed and
//! submitted at its target at once, while its stand-in waits for the
//! origin's own scheduling; the run's script starts only once the origin
//! agent has confirmed that Slurm runs the stand-in.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleet_lab::{out_arg, script, Lab, OnDrop};

const T: Duration = Duration::from_secs(90);

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// The meta-scheduler's record of fleet job `fid`.
fn fleet_job(lab: &Lab, fid: &str) -> serde_json::Value {
    lab.fleetctl_json(&["job", fid]).unwrap_or_default()
}

fn set_proxy_partition(lab: &Lab, cluster: &str, state: &str) {
    let out = lab.cmd(cluster, "scontrol", &["update", "PartitionName=fleet", &format!("State={state}")]).unwrap();
    assert!(out.status.success(), "scontrol update State={state}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_job_placed_early_runs_its_script_only_once_its_stand_in_runs_at_the_origin() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("early-start");
    let stamp = dir.join("started");
    // beta's proxy partition down: the stand-in cannot start (PartitionDown).
    set_proxy_partition(lab, "beta", "DOWN");
    let _up = OnDrop(|| set_proxy_partition(lab, "beta", "UP"));
    let body = format!("date +%s.%N > {}\necho early-ran", stamp.display());
    let id = lab
        .sbatch("beta", &["--gres=gpu:h100:8", "--job-name=early", &out_arg(&dir, "out.txt")], &script(&body))
        .expect("sbatch at beta accepts an h100 job");
    let tag = lab.job("beta", id).unwrap()["AdminComment"].clone();
    let fid = fleet_api::wire::parse_admin_tag(&tag).expect("the stand-in is tagged").to_string();

    // Placed at alpha at once, and its run exists there while the stand-in
    // is pending at beta.
    let t0 = Instant::now();
    let remote = loop {
        let j = fleet_job(lab, &fid);
        if let (Some("alpha"), Some(rid)) = (j["target"].as_str(), j["remote_job_id"].as_u64()) {
            break rid;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "not placed early at alpha: {j}");
        std::thread::sleep(Duration::from_millis(200));
    };
    // It is RUNNING at alpha: lease-exec asks for its first lease, and waits.
    lab.wait_for("alpha", remote, Duration::from_secs(30), |r| r["JobState"] == "RUNNING")
        .expect("the early run starts at alpha while the stand-in waits");
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(5) {
        let standin = lab.job("beta", id).unwrap();
        assert_eq!(standin["JobState"], "PENDING", "{standin:?}");
        assert!(!stamp.exists(), "the script ran before its stand-in started at beta");
        let at_alpha = lab.job("alpha", remote).unwrap();
        assert_eq!(at_alpha["JobState"], "RUNNING", "the early run keeps waiting: {at_alpha:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let j = fleet_job(lab, &fid);
    assert!(j["reason"].as_str().unwrap_or("").contains("placed early"), "{j}");

    // Release: the stand-in starts, the origin confirms, the script runs.
    let released = now_s();
    set_proxy_partition(lab, "beta", "UP");
    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((rec["JobState"].as_str(), rec["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{rec:?}");
    let started: f64 = std::fs::read_to_string(&stamp).unwrap().trim().parse().unwrap();
    assert!(started > released, "the script started at {started}, before the stand-in could ({released})");
    let out = std::fs::read_to_string(dir.join("out.txt")).unwrap();
    assert_eq!(out, "early-ran\n", "the output reaches beta as usual");
    // The early run is the one that ran (no second placement).
    let j = fleet_job(lab, &fid);
    assert_eq!((j["epoch"].as_u64(), j["remote_job_id"].as_u64()), (Some(1), Some(remote)), "{j}");
    assert_eq!(j["state"], "completed", "{j}");
}
