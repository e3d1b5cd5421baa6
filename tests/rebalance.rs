//! Rebalancing carried out, against the real lab (docs/failover.md,
//! "Planned migration"): a job from beta runs at alpha (H100, on-prem
//! 1.49 USD/GPU-h), interruptible, checkpointing every 10 steps with
//! `fleet-ckpt` and on SIGUSR1 (`#FLEET ckpt-signal=USR1`,
//! `--signal=B:USR1`). Then delta's cloud H100 price drops (a price
//! table imported with `fleetctl prices import`, the admin's feed), the
//! rebalancing pass (every 2 s in the lab) proposes alpha → delta, and
//! the move is carried out: the job is signalled, checkpoints, is stopped
//! at alpha and resumes at delta from that checkpoint; the stand-in at
//! beta stays one job, its output continues after a one-line note, and it
//! ends with the job's exit code. In `approve` mode nothing moves until
//! `fleetctl rebalance approve <id>`.

use std::time::{Duration, Instant};

use fleet_lab::{fleet_job_of, fleet_record, out_arg, remote_of, script, wait_file, Lab, OnDrop};

const T: Duration = Duration::from_secs(120);
const LAST_STEP: u64 = 70;

/// delta's H100 at 0.10 USD/GPU-h (8 GPUs: 0.80 an instance hour).
const CHEAP_DELTA: &str =
    "provider,region,zone,instance_type,gpu_type,gpu_count,vcpus,memory_gib,price_ondemand_usd_hr,price_spot_usd_hr
lab-cloud,us-central,us-central-1a,lab.h100.8x,H100,8,96,1024,0.80,
";
/// delta's H100 back at the lab model's 1.60 USD/GPU-h.
const LAB_DELTA: &str =
    "provider,region,zone,instance_type,gpu_type,gpu_count,vcpus,memory_gib,price_ondemand_usd_hr,price_spot_usd_hr
lab-cloud,us-central,us-central-1a,lab.h100.8x,H100,8,96,1024,12.80,
";

fn text(path: &std::path::Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// The numbers after `word ` at the start of lines.
fn numbers(out: &str, word: &str) -> Vec<u64> {
    out.lines().filter_map(|l| l.strip_prefix(word)?.strip_prefix(' ')?.trim().parse().ok()).collect()
}

fn import_prices(lab: &Lab, csv: &str) {
    let f = lab.workdir("rebalance").join("prices.csv");
    std::fs::write(&f, csv).unwrap();
    lab.fleetctl_json(&["prices", "import", f.to_str().unwrap()]).unwrap();
}

fn set_mode(lab: &Lab, mode: &str) {
    let v = lab.fleetctl_json(&["rebalance", "mode", mode]).unwrap();
    assert_eq!(v["mode"], mode, "{v}");
}

fn job_body(lab: &Lab) -> String {
    let ckpt = lab.root.join("bin/fleet-ckpt");
    format!(
        r#"#FLEET estimate=24h
#FLEET ckpt-signal=USR1
set -u
CK={ckpt}
W=$(mktemp -d)
want=0
trap 'want=1' USR1
echo "run resume=${{FLEET_RESUME_FROM:-none}}"
step=0
if "$CK" restore "$W/r"; then
  step=$(cat "$W/r/step.txt"); echo "resumed-at $step"
else
  rc=$?; [ $rc = 3 ] || {{ echo "restore failed: $rc"; exit 9; }}
fi
while [ $step -lt {LAST_STEP} ]; do
  step=$((step + 1)); echo "step $step"; sleep 1
  if [ $((step % 10)) = 0 ] || [ $want = 1 ]; then
    [ $want = 1 ] && echo "signalled $step"
    want=0
    rm -rf "$W/c"; mkdir "$W/c"; echo $step >"$W/c/step.txt"
    "$CK" save "$W/c" --url "$FLEET_CKPT_URL" --step $step >/dev/null && echo "ckpt $step"
  fi
done
echo end
exit 5"#,
        ckpt = ckpt.display()
    )
}

/// The latest pass's proposal for `fleet_id`, waiting up to `t`.
fn proposal(lab: &Lab, fleet_id: &str, t: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let r = lab.fleetctl_json(&["rebalance"]).unwrap();
        if let Some(p) = r["proposals"].as_array().and_then(|ps| ps.iter().find(|p| p["fleet_job_id"] == fleet_id)) {
            return p.clone();
        }
        assert!(t0.elapsed() < t, "no proposal for {fleet_id} within {t:?}: {r}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The move of `fleet_id` in `fleetctl rebalance`, once it runs at its target.
fn move_done(lab: &Lab, fleet_id: &str, t: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let r = lab.fleetctl_json(&["rebalance"]).unwrap();
        let m = r["moves"].as_array().and_then(|ms| ms.iter().find(|m| m["fleet_job_id"] == fleet_id)).cloned();
        if let Some(m) = m.filter(|m| m["phase"] == "running") {
            return m;
        }
        assert!(t0.elapsed() < t, "{fleet_id} is not running at its move's target within {t:?}: {r}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Start the job at beta; wait until it runs at alpha with a checkpoint.
fn start(lab: &'static Lab, name: &str) -> (u64, String, std::path::PathBuf) {
    let dir = lab.workdir(name);
    // alpha (the cheaper H100s) with a GPU free as the meta-scheduler sees
    // it, whatever an earlier test did to its nodes.
    lab.wait_gpus_free("alpha", "h100", 1, T).unwrap();
    let out = dir.join("out.txt");
    let id = lab
        .sbatch(
            "beta",
            &[
                "--gres=gpu:h100:1",
                "--fleet-interruptible",
                "--signal=B:USR1@30",
                "--open-mode=append",
                &out_arg(&dir, "out.txt"),
            ],
            &script(&job_body(lab)),
        )
        .unwrap();
    wait_file(&out, T, |b| numbers(&String::from_utf8_lossy(b), "ckpt").contains(&10)).unwrap();
    let fleet_id = fleet_job_of(lab, id).unwrap();
    assert_eq!(fleet_record(lab, id).unwrap()["target"], "alpha");
    (id, fleet_id, out)
}

#[test]
fn auto_rebalancing_moves_a_checkpointing_job_to_a_cheaper_cluster() {
    let (lab, _serial) = Lab::lock();
    assert!(lab.root.join("ckpt-stores.toml").exists(), "the lab has no checkpoint stores");
    let _restore = OnDrop(|| {
        let _ = lab.fleetctl_json(&["rebalance", "mode", "propose"]);
        import_prices(lab, LAB_DELTA);
    });
    set_mode(lab, "auto");
    let (id, fleet_id, out) = start(lab, "rebalance-auto");
    let _cancel = OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    let (_, alpha_remote) = remote_of(lab, id).unwrap();
    // The price drops at delta: the next pass proposes the move and, in
    // auto mode, carries it out.
    let t_price = Instant::now();
    import_prices(lab, CHEAP_DELTA);
    let moved = wait_file(&out, T, |b| String::from_utf8_lossy(b).contains("resumed-at")).unwrap();
    let to_output = t_price.elapsed();
    let moved = String::from_utf8_lossy(&moved).into_owned();
    let m = move_done(lab, &fleet_id, T);
    assert_eq!((m["from"].as_str(), m["to"].as_str()), (Some("alpha"), Some("delta")), "{m}");
    // The run at alpha was stopped (cancelled there), not left running.
    let a = lab.wait_done("alpha", alpha_remote, T).unwrap();
    assert_eq!(a["JobState"], "CANCELLED", "{a:?}");
    let rec = fleet_record(lab, id).unwrap();
    assert_eq!((rec["target"].as_str(), rec["migrations"].as_u64()), (Some("delta"), Some(1)), "{rec}");

    // The job was signalled and checkpointed for the move; it resumed there.
    let split = moved.rfind("run resume=").unwrap();
    let (run1, run2) = moved.split_at(split);
    let signalled = numbers(run1, "signalled");
    assert_eq!(signalled.len(), 1, "one SIGUSR1 for the move: {moved}");
    let at = numbers(run2, "resumed-at")[0];
    assert_eq!(at, *numbers(run1, "ckpt").iter().max().unwrap(), "resumed from the newest checkpoint: {moved}");
    assert_eq!(at, signalled[0], "the checkpoint the signal asked for: {moved}");
    assert!(
        run2.lines().next().unwrap().contains(&format!("/fleet/beta/{}/{fleet_id}/ckpt-", fleet_lab::USER)),
        "{run2}"
    );
    // One note line between the runs.
    let notes: Vec<&str> = moved.lines().filter(|l| l.starts_with("fleet: ")).collect();
    assert_eq!(notes.len(), 1, "{moved}");
    assert!(notes[0].contains("stopped for a planned move to delta"), "{}", notes[0]);

    // It runs to its end at delta, counting on; the stand-in ends with its exit code.
    let b = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((b["JobState"].as_str(), b["ExitCode"].as_str()), ("FAILED", "5:0"), "{b:?}");
    let all = text(&out);
    let run2 = &all[all.rfind("run resume=").unwrap()..];
    assert_eq!(numbers(run2, "step"), ((at + 1)..=LAST_STEP).collect::<Vec<_>>(), "{all}");
    assert!(all.ends_with("end\n"), "{all}");
    eprintln!(
        "rebalance auto: price change -> resumed output at delta after {to_output:?}; decision -> running at delta \
         {:.2} s; checkpoint wait {:.2} s; resumed at step {at}",
        m["decision_to_running_s"].as_f64().unwrap_or(f64::NAN),
        m["checkpoint_wait_s"].as_f64().unwrap_or(f64::NAN),
    );
}

#[test]
fn approve_mode_waits_for_the_admin() {
    let (lab, _serial) = Lab::lock();
    assert!(lab.root.join("ckpt-stores.toml").exists(), "the lab has no checkpoint stores");
    let _restore = OnDrop(|| {
        let _ = lab.fleetctl_json(&["rebalance", "mode", "propose"]);
        import_prices(lab, LAB_DELTA);
    });
    set_mode(lab, "approve");
    let (id, fleet_id, out) = start(lab, "rebalance-approve");
    let _cancel = OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    import_prices(lab, CHEAP_DELTA);
    let p = proposal(lab, &fleet_id, Duration::from_secs(20));
    assert_eq!((p["from"].as_str(), p["to"].as_str()), (Some("alpha"), Some("delta")), "{p}");
    // Proposed, not carried out: several passes later it still runs at alpha, unsignalled.
    std::thread::sleep(Duration::from_secs(6));
    let rec = fleet_record(lab, id).unwrap();
    assert_eq!((rec["target"].as_str(), rec["state"].as_str()), (Some("alpha"), Some("running")), "{rec}");
    assert!(!text(&out).contains("signalled"), "{}", text(&out));
    // An unknown proposal is refused with its reason.
    let e = lab.fleetctl_json(&["rebalance", "approve", "nope-e1"]).unwrap_err().to_string();
    assert!(e.contains("no proposal \\\"nope-e1\\\"") || e.contains("no proposal \"nope-e1\""), "{e}");
    // Approved: it moves.
    let id_p = p["id"].as_str().unwrap().to_string();
    let r = lab.fleetctl_json(&["rebalance", "approve", &id_p]).unwrap();
    assert_eq!(r["target"], "alpha", "still at alpha until it has checkpointed: {r}");
    let m = move_done(lab, &fleet_id, T);
    assert_eq!(m["to"], "delta", "{m}");
    let moved = wait_file(&out, T, |b| String::from_utf8_lossy(b).contains("resumed-at")).unwrap();
    let moved = String::from_utf8_lossy(&moved).into_owned();
    assert_eq!(numbers(&moved, "signalled").len(), 1, "{moved}");
    // scancel after the move reaches the run at delta.
    let (target, remote) = remote_of(lab, id).unwrap();
    assert_eq!(target, "delta");
    let o = lab.cmd("beta", "scancel", &[&id.to_string()]).unwrap();
    assert!(o.status.success());
    let d = lab.wait_done("delta", remote, T).unwrap();
    assert_eq!(d["JobState"], "CANCELLED", "{d:?}");
    let b = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(b["JobState"], "CANCELLED", "{b:?}");
    eprintln!(
        "rebalance approve: decision -> running at delta {:.2} s; checkpoint wait {:.2} s",
        m["decision_to_running_s"].as_f64().unwrap_or(f64::NAN),
        m["checkpoint_wait_s"].as_f64().unwrap_or(f64::NAN),
    );
}
