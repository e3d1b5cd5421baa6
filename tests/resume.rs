//! A forwarded job resumes from its checkpoint when it runs again, against
//! the real lab (docs/checkpoints.md): a job from beta runs at alpha,
//! counts steps and saves a checkpoint every 3 steps with `fleet-ckpt`
//! (reported to the catalog with its checkpoint token). Its first run
//! keeps its checkpoints in the *west* store (as a job that ran in beta's
//! region would), so when `scontrol requeue` of its stand-in at beta runs
//! it again at alpha (east), alpha's agent copies the newest checkpoint
//! into the east store first and the rerun starts with `FLEET_RESUME_FROM`
//! naming the copy, restores it and counts on from there.

use std::time::{Duration, Instant};

use fleet_lab::{fleet_job_of, fleet_record, out_arg, remote_of, script, wait_file, Lab};

const T: Duration = Duration::from_secs(120);
const LAST_STEP: u64 = 30;

fn text(path: &std::path::Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// The numbers after `word ` at the start of lines.
fn numbers(out: &str, word: &str) -> Vec<u64> {
    out.lines().filter_map(|l| l.strip_prefix(word)?.strip_prefix(' ')?.trim().parse().ok()).collect()
}

#[test]
fn a_requeued_job_resumes_at_its_target_from_a_copied_checkpoint() {
    let (lab, _serial) = Lab::lock();
    assert!(
        lab.root.join("ckpt-stores.toml").exists(),
        "the lab has no checkpoint stores (FLEET_LAB_S3=0 or moto_server missing: see lab.sh up's output)"
    );
    let dir = lab.workdir("resume");
    let out = dir.join("out.txt");
    let ckpt = lab.root.join("bin/fleet-ckpt");
    let body = format!(
        r#"set -u
CK={ckpt}
W=$(mktemp -d)
echo "run resume=${{FLEET_RESUME_FROM:-none}} url=${{FLEET_CKPT_URL:-none}}"
step=0
if "$CK" restore "$W/r"; then
  step=$(cat "$W/r/step.txt"); echo "resumed-at $step"; SAVE=$FLEET_CKPT_URL
else
  rc=$?; [ $rc = 3 ] || {{ echo "restore failed: $rc"; exit 9; }}
  # The first run keeps its checkpoints in the other region's store.
  SAVE=s3://ckpt-lab-west/fleet/beta/{user}/$FLEET_JOB_ID
fi
while [ $step -lt {LAST_STEP} ]; do
  step=$((step + 1)); echo "step $step"; sleep 1
  if [ $((step % 3)) = 0 ]; then
    rm -rf "$W/c"; mkdir "$W/c"; echo $step >"$W/c/step.txt"
    head -c 16000000 /dev/urandom >"$W/c/weights.bin"
    "$CK" save "$W/c" --url "$SAVE" --step $step >/dev/null && echo "ckpt $step"
  fi
done
echo end
exit 5"#,
        ckpt = ckpt.display(),
        user = fleet_lab::USER
    );
    let id = lab
        .sbatch("beta", &["--gres=gpu:h100:1", "--open-mode=append", &out_arg(&dir, "out.txt")], &script(&body))
        .unwrap();
    let _cancel = fleet_lab::OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string()]);
    });
    // The first run: from scratch, at alpha, with its prefix in east's store.
    let first = wait_file(&out, T, |b| numbers(&String::from_utf8_lossy(b), "ckpt").iter().any(|&s| s >= 6)).unwrap();
    let first = String::from_utf8_lossy(&first).into_owned();
    let fleet_id = fleet_job_of(lab, id).unwrap();
    // Site defaults name the origin and the user, so that a store can give
    // each user's key that user's prefixes alone.
    let mine = format!("beta/{}/{fleet_id}", fleet_lab::USER);
    assert!(first.starts_with(&format!("run resume=none url=s3://ckpt-lab-east/fleet/{mine}\n")), "{first}");
    assert!(!first.contains("warning"), "fleet-ckpt save could not report: {first}");
    assert_eq!(fleet_record(lab, id).unwrap()["target"], "alpha");

    // Requeue the stand-in at beta (its owner may): the run at alpha is
    // cancelled, and after Slurm's credential window (about 2 min) the
    // stand-in starts again and so does the job.
    let t_requeue = Instant::now();
    let o = lab.cmd_as(fleet_lab::USER, "beta", "scontrol", &["requeue", &id.to_string()]).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (target, remote) = remote_of(lab, id).unwrap();
    let r = lab.wait_done(&target, remote, T).unwrap();
    assert_eq!(r["JobState"], "CANCELLED", "first run: {r:?}");

    let second = wait_file(&out, Duration::from_secs(300), |b| {
        String::from_utf8_lossy(b).lines().filter(|l| l.starts_with("run ")).count() == 2
            && String::from_utf8_lossy(b).contains("resumed-at")
    })
    .unwrap();
    let resumed_after = t_requeue.elapsed();
    let second = String::from_utf8_lossy(&second).into_owned();
    let run2 = &second[second.rfind("run resume=").unwrap()..];
    // FLEET_RESUME_FROM names the copy in east's store, under the job's prefix there.
    let resume_line = run2.lines().next().unwrap();
    let east = format!("s3://ckpt-lab-east/fleet/{mine}/ckpt-");
    assert!(resume_line.starts_with(&format!("run resume={east}")), "{resume_line}");
    let at = numbers(run2, "resumed-at")[0];
    // The first run's output is all relayed before the second run's.
    let saved = numbers(&second[..second.rfind("run resume=").unwrap()], "ckpt");
    assert!(at >= 6 && saved.contains(&at), "resumed at {at}, the first run saved {saved:?}: {second}");
    assert_eq!(at, *saved.iter().max().unwrap(), "the newest checkpoint the first run reported: {second}");

    // It runs to its end, counting on from the checkpoint, not from 0.
    let b = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((b["JobState"].as_str(), b["ExitCode"].as_str()), ("FAILED", "5:0"), "{b:?}");
    let all = text(&out);
    let run2 = &all[all.rfind("run resume=").unwrap()..];
    let steps2 = numbers(run2, "step");
    assert_eq!(steps2, ((at + 1)..=LAST_STEP).collect::<Vec<_>>(), "{all}");
    assert!(all.ends_with("end\n"), "{all}");
    let steps1 = numbers(&all[..all.rfind("run resume=").unwrap()], "step");
    assert_eq!(steps1[0], 1, "the first run started from scratch: {all}");
    assert!(!all.contains("warning"), "{all}");
    let restored = run2.lines().find(|l| l.starts_with("restored ")).unwrap_or("").to_string();

    // The catalog: the first run's checkpoints (west), the copy (east,
    // with where it came from and how long it took), the rerun's own.
    let rows = lab.fleetctl_json(&["job", "checkpoints", &fleet_id]).unwrap();
    let rows = rows.as_array().unwrap();
    let copy = rows.iter().find(|r| r["copied_from"].is_string()).expect("a copy is recorded");
    assert_eq!(copy["region"], "lab-east", "{copy}");
    assert_eq!(copy["step"].as_u64(), Some(at), "the copy has its source's step: {copy}");
    let from = copy["copied_from"].as_str().unwrap();
    assert!(from.starts_with(&format!("s3://ckpt-lab-west/fleet/{mine}/ckpt-")), "{copy}");
    let src = rows.iter().find(|r| r["url"] == from).unwrap();
    assert_eq!(
        (src["region"].as_str(), src["step"].as_u64(), src["reported_by"].as_str()),
        (Some("lab-west"), Some(at), Some("job"))
    );
    assert_eq!(copy["bytes"], src["bytes"]);
    let secs = copy["copy_seconds"].as_f64().unwrap();
    let bytes = copy["bytes"].as_u64().unwrap();
    assert!(bytes > 16_000_000, "{copy}");
    let east_own = rows
        .iter()
        .filter(|r| r["region"] == "lab-east" && r["reported_by"] == "job" && r["copied_from"].is_null())
        .count();
    assert!(east_own >= 2, "the rerun's own checkpoints: {rows:?}");
    eprintln!(
        "resume: copy of {:.1} MB west -> east in {secs:.2} s ({:.1} MB/s); requeue -> resumed output after {resumed_after:?} \
         (Slurm's requeue window included); resumed at step {at}; {restored}",
        bytes as f64 / 1e6,
        bytes as f64 / 1e6 / secs.max(1e-3)
    );
}
