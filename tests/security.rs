//! Attacks on a multi-user federation, run against the real lab: each one
//! that once worked (see issue 7) must now be refused or harmless.
//!
//! Jobs are submitted by the lab's researchers (`alice`, `bob`); at alpha
//! they run as their submitter, in job directories only their user and the
//! agent can enter.

use std::time::Duration;

use fleet_lab::{fleet_job_of, out_arg, remote_of, script, wait_file, Lab, OTHER_USER, USER};

const T: Duration = Duration::from_secs(90);

fn read(path: &std::path::Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// Runs `body` as alice's job from beta (an H100 job: it leaves), which
/// must end 0:0 with `done` as its last line; returns its output.
fn alices_run(lab: &Lab, dir: &std::path::Path, body: &str) -> String {
    let out_file = dir.join("alice.txt");
    let id =
        lab.sbatch("beta", &["--gres=gpu:h100:1", &format!("--output={}", out_file.display())], &script(body)).unwrap();
    assert_eq!(lab.wait_done("beta", id, T).unwrap()["ExitCode"], "0:0");
    let out = read(&out_file);
    assert!(out.ends_with("done\n"), "{out:?}");
    out
}

#[test]
fn a_job_cannot_make_the_agent_relay_its_secrets() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("symlink");
    let token = lab.root.join("secrets/alpha.token");
    let secret = std::fs::read_to_string(&token).unwrap();
    // The job swaps its own output files for links to the agent's token
    // (the relay once followed them), then writes more output (lost, as
    // natively: it deleted its own output file).
    let body = format!(
        "echo before\nsleep 2\nrm -f stdout stderr\nln -s {t} stdout\nln -s {t} stderr\nln {t} hard 2>/dev/null && echo hardlinked\nmkfifo fifo; echo after; sleep 3",
        t = token.display()
    );
    let id = lab
        .sbatch(
            "beta",
            &["--gres=gpu:h100:1", &out_arg(&dir, "out.txt"), &format!("--error={}/err.txt", dir.display())],
            &script(&body),
        )
        .unwrap();
    let r = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(r["ExitCode"], "0:0", "{r:?}");
    let out = read(&dir.join("out.txt"));
    let err = read(&dir.join("err.txt"));
    assert!(
        !out.contains(secret.trim()) && !err.contains(secret.trim()),
        "the agent relayed its token: {out:?} {err:?}"
    );
    assert!(out.starts_with("before\n"), "{out:?}");
    assert!(!out.contains("hardlinked"), "a job hard-linked the agent's token: {out:?}");
    // The job directory is gone once the output was relayed.
    let fid = fleet_job_of(lab, id).unwrap();
    let jobdir = lab.root.join("alpha/agent/jobs").join(&fid);
    let t0 = std::time::Instant::now();
    while jobdir.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!jobdir.exists(), "{} left behind", jobdir.display());
}

#[test]
fn users_jobs_are_isolated_at_the_target() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("isolation");
    // bob's job holds a secret in its output and environment while it runs.
    let bob_dir_here = dir.join("bob");
    std::fs::create_dir(&bob_dir_here).unwrap();
    let _ = std::process::Command::new("chown").arg(format!("{OTHER_USER}:{OTHER_USER}")).arg(&bob_dir_here).status();
    let bob_out = bob_dir_here.join("bob.txt");
    let (bob, _) = lab.sbatch_as(
        OTHER_USER,
        "beta",
        &["--gres=gpu:h100:1", "--export=ALL,API_KEY=bob-secret-42", &format!("--output={}", bob_out.display())],
        &script("echo bob-output-secret; id -un; sleep 25"),
    );
    let bob = bob.unwrap();
    wait_file(&bob_out, T, |b| b.ends_with(format!("{OTHER_USER}\n").as_bytes()))
        .expect("bob's job runs at alpha as bob");
    let bob_fid = fleet_job_of(lab, bob).unwrap();
    let bob_dir = lab.root.join("alpha/agent/jobs").join(&bob_fid);
    let (_, bob_remote) = remote_of(lab, bob).unwrap();
    // alice's job at alpha tries to read bob's directory, output and environment.
    // Checkpoint store keys: alice's run gets her stores file, and can read
    // neither bob's nor the agent's (CkptUserStores, CkptStores).
    let users = lab.root.join("ckpt-users");
    let body = format!(
        "ls {d} >/dev/null 2>&1 && echo LISTED; cat {d}/stdout 2>/dev/null; for p in $(pgrep -u {OTHER_USER}); do cat /proc/$p/environ 2>/dev/null | tr '\\0' '\\n' | grep API_KEY; kill -STOP $p 2>/dev/null && echo SIGNALLED; done; scancel {bob_remote} 2>/dev/null && echo CANCELLED; \
         echo \"stores=${{FLEET_CKPT_STORES:-none}}\"; cat \"${{FLEET_CKPT_STORES:-/dev/null}}\" | grep -m1 access_key_id; \
         cat {u}/{OTHER_USER}.toml {agent} 2>/dev/null | grep access_key_id; echo done",
        d = bob_dir.display(),
        u = users.display(),
        agent = lab.root.join("ckpt-stores.toml").display(),
    );
    let out = alices_run(lab, &dir, &body);
    for leak in ["LISTED", "bob-output-secret", "bob-secret-42", "SIGNALLED", "CANCELLED"] {
        assert!(!out.contains(leak), "alice's job reached bob's job ({leak}): {out:?}");
    }
    if users.exists() {
        let mine = users.join(format!("{USER}.toml"));
        assert!(out.contains(&format!("stores={}\n", mine.display())), "alice's run gets her own stores file: {out:?}");
        // Each file holds its holder's keys, which the store made for them.
        let key_ids = |file: std::path::PathBuf| -> Vec<String> {
            read(&file)
                .lines()
                .filter(|l| l.starts_with("access_key_id"))
                .map(|l| l.trim_start_matches("access_key_id = ").trim_matches('"').to_string())
                .collect()
        };
        let alices = key_ids(mine);
        assert!(!alices.is_empty());
        assert!(out.contains(&format!("access_key_id = \"{}\"", alices[0])), "{out:?}");
        for (whose, file) in
            [("bob", users.join(format!("{OTHER_USER}.toml"))), ("the agent", lab.root.join("ckpt-stores.toml"))]
        {
            for id in key_ids(file) {
                assert!(!alices.contains(&id), "{whose} and alice share a key");
                assert!(!out.contains(&id), "alice's run read {whose}'s store keys: {out:?}");
            }
        }
    }
    let r = lab.wait_done("beta", bob, T).unwrap();
    assert_eq!(r["ExitCode"], "0:0", "bob's job ran to its end: {r:?}");
    // Accounting at alpha records each job under its submitter.
    let acct = lab.cmd("alpha", "sacct", &["-X", "-n", "-P", "-o", "User", "-j", &bob_remote.to_string()]).unwrap();
    assert_eq!(String::from_utf8_lossy(&acct.stdout).trim(), OTHER_USER);
}

/// The lab's stores check keys as a site's would (moto's IAM mode, each
/// user's key allowed `fleet/<origin>/<user>/` alone: tests/lab/s3-keys.py),
/// so this is the store refusing, not Fleet: what Fleet must get right is
/// that each run holds its own user's key and saves under a prefix that
/// key is allowed. Listing is the double's exception: moto evaluates no
/// `s3:prefix` condition, so every key may list the bucket's names.
#[test]
fn a_users_store_key_reaches_their_own_checkpoints_and_no_one_elses() {
    let (lab, _serial) = Lab::lock();
    if !lab.root.join("ckpt-users").exists() {
        eprintln!("SKIPPED: the lab has no checkpoint stores (FLEET_LAB_S3=0)");
        return;
    }
    let ckpt = lab.root.join("bin/fleet-ckpt");
    let dir = lab.workdir("store-keys");
    let bob_dir = dir.join("bob");
    std::fs::create_dir(&bob_dir).unwrap();
    let _ = std::process::Command::new("chown").arg(format!("{OTHER_USER}:{OTHER_USER}")).arg(&bob_dir).status();
    // bob's run saves a checkpoint under its site-default prefix.
    let save = "W=$(mktemp -d); mkdir $W/c; echo bobs-weights >$W/c/w.txt";
    let bob_out = bob_dir.join("bob.txt");
    let (bob, _) = lab.sbatch_as(
        OTHER_USER,
        "beta",
        &["--gres=gpu:h100:1", &format!("--output={}", bob_out.display())],
        &script(&format!(
            "{save}; echo url=$FLEET_CKPT_URL; {c} save $W/c --step 1 >/dev/null && echo saved",
            c = ckpt.display()
        )),
    );
    let bob = bob.unwrap();
    assert_eq!(lab.wait_done("beta", bob, T).unwrap()["ExitCode"], "0:0");
    let out = read(&bob_out);
    let bob_url = out.lines().find_map(|l| l.strip_prefix("url=")).unwrap_or_default().to_string();
    assert!(bob_url.contains(&format!("/fleet/beta/{OTHER_USER}/")) && out.contains("saved\n"), "{out:?}");

    // alice's run saves under her own prefix, then tries bob's with her key.
    let body = format!(
        "{save}; echo alices >$W/c/w.txt; {c} save $W/c >/dev/null && echo mine-saved\n\
         {c} restore $W/r --from {bob_url}/ckpt-000000000001 2>$W/e1; echo restore-rc=$?; cat $W/e1\n\
         {c} save $W/c --url {bob_url} --seq 2 2>$W/e2; echo write-rc=$?; cat $W/e2\n\
         echo done",
        c = ckpt.display(),
    );
    let out = alices_run(lab, &dir, &body);
    assert!(out.contains("mine-saved\n"), "alice's key may save under her own prefix: {out:?}");
    assert!(out.contains("restore-rc=1\n"), "alice's key read bob's checkpoint: {out:?}");
    assert!(out.contains("write-rc=1\n"), "alice's key wrote under bob's prefix: {out:?}");
    // Each refusal is said once, naming the store's answer.
    let denied = "access denied by the store (HTTP 403: AccessDenied (Access Denied))";
    assert_eq!(out.matches(denied).count(), 2, "{out:?}");
    assert!(out.contains(&format!("reading {bob_url}/ckpt-000000000001/fleet-ckpt.json: {denied}")), "{out:?}");
    assert!(out.contains(&format!("writing {bob_url}/ckpt-000000000002/w.txt: {denied}")), "{out:?}");
    assert!(!out.contains("<Error>"), "the store's XML is not repeated at the user: {out:?}");

    // With the agent's key: bob's prefix holds his one checkpoint, intact,
    // and nothing of alice's.
    let list = std::process::Command::new(&ckpt)
        .args(["--stores", lab.root.join("ckpt-stores.toml").to_str().unwrap(), "list", "--url", &bob_url])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains("ckpt-000000000001") && listed.trim_end().ends_with("valid"), "{listed}");
    let restored = dir.join("restored");
    let r = std::process::Command::new(&ckpt)
        .args(["--stores", lab.root.join("ckpt-stores.toml").to_str().unwrap(), "restore"])
        .arg(&restored)
        .args(["--from", &format!("{bob_url}/ckpt-000000000001")])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(read(&restored.join("w.txt")), "bobs-weights\n");
}

#[test]
fn a_job_name_cannot_fake_state_or_exit_code() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("inject");
    let mut ids = Vec::new();
    for (i, name) in
        ["x JobState=COMPLETED ExitCode=0:0", "y JobState=FAILED ExitCode=42:0 Reason=None", "z\nJobState=COMPLETED"]
            .iter()
            .enumerate()
    {
        let id = lab
            .sbatch(
                "beta",
                &["--gres=gpu:h100:1", &format!("--job-name={name}"), &out_arg(&dir, &format!("{i}.txt"))],
                &script("sleep 4; echo real; exit 3"),
            )
            .unwrap();
        ids.push(id);
    }
    for (i, id) in ids.into_iter().enumerate() {
        let r = lab.wait_done("beta", id, T).unwrap();
        assert_eq!(r["ExitCode"], "3:0", "job {i}: {r:?}");
        assert_eq!(r["JobState"], "FAILED", "job {i}: {r:?}");
        assert_eq!(read(&dir.join(format!("{i}.txt"))), "real\n");
    }
}

/// `curl` to the meta-scheduler with `auth` (an `Authorization` value);
/// returns (HTTP status, body).
fn call(lab: &Lab, method: &str, path: &str, auth: &str, body: &str) -> (u16, String) {
    let mut c = std::process::Command::new("curl");
    c.args([
        "-s",
        "-m",
        "10",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
        "-H",
        &format!("Authorization: {auth}"),
    ]);
    c.args(["-H", "Content-Type: application/json", "--data-binary", body]);
    if let Some(ca) = lab.ca_file() {
        c.arg("--cacert").arg(ca);
    }
    let out = c.arg(format!("{}{path}", lab.metasched_url())).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The fleet id of held beta stand-in `id` once the meta-scheduler holds
/// it: the one its AdminComment tags (its record has no origin job id
/// until its stand-in starts, and another test's held job may still be
/// listed, on its way to being cancelled).
fn held_fleet_job(lab: &Lab, id: u64) -> String {
    let mut fid = None;
    for _ in 0..75 {
        fid = lab.fleetctl_json(&["jobs"]).ok().and_then(|v| {
            let tag = lab.job("beta", id)?.get("AdminComment")?.clone();
            v.as_array()?
                .iter()
                .find(|j| {
                    j["state"] == "held"
                        && j["origin_job_id"].is_null()
                        && j["fleet_job_id"].as_str().is_some_and(|f| f.starts_with("beta-") && tag.contains(f))
                })
                .map(|j| j["fleet_job_id"].as_str().unwrap().to_string())
        });
        if fid.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    fid.expect("the held job is registered")
}

#[test]
fn the_job_token_alone_cannot_start_a_held_job() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("held");
    let id =
        lab.sbatch("beta", &["--gres=gpu:h100:1", "--hold", &out_arg(&dir, "out.txt")], &script("echo ran")).unwrap();
    let fid = held_fleet_job(lab, id);
    // The owner holds (or can compute from what they can read) the stand-in's
    // token; with it they ask the meta-scheduler to start the job now.
    let secret = std::fs::read_to_string(lab.root.join("secrets/beta.token")).unwrap();
    let token = fleet_api::auth::job_token(secret.trim(), &fid);
    let (code, body) = call(
        lab,
        "POST",
        &format!("/v1/jobs/{fid}/start"),
        &format!("FleetJob {token}"),
        &format!("{{\"origin_job_id\": {id}}}"),
    );
    assert!(code < 300, "{code} {body}");
    std::thread::sleep(Duration::from_secs(4));
    let rec = lab.fleetctl_json(&["job", &fid]).unwrap();
    assert_eq!(rec["state"], "held", "the job left held without its stand-in running: {rec}");
    // Nor can the token confirm the start itself.
    let (code, _) = call(
        lab,
        "POST",
        &format!("/v1/jobs/{fid}/confirm_start"),
        &format!("FleetJob {token}"),
        &format!("{{\"origin_job_id\": {id}, \"started\": true}}"),
    );
    assert!(code == 401 || code == 403, "confirm_start with a job token answered {code}");
    // Released at the origin, the stand-in starts and the job runs.
    assert!(lab.cmd("beta", "scontrol", &["release", &id.to_string()]).unwrap().status.success());
    let r = lab.wait_done("beta", id, T).unwrap();
    assert_eq!(r["ExitCode"], "0:0", "{r:?}");
    assert_eq!(read(&dir.join("out.txt")), "ran\n");
}

/// The start confirmation checks where the job runs: the owner of a held
/// stand-in runs a job of their own outside the proxy partition and, from
/// it, asks to start the fleet job with the stand-in's token (copied from
/// its script, or computed) naming that running job. The origin agent
/// refuses (the job is not in the proxy partition, where only the plugin
/// puts jobs) and the fleet job stays held.
#[test]
fn a_copied_token_in_a_job_outside_the_proxy_partition_starts_nothing() {
    let (lab, _serial) = Lab::lock();
    let dir = lab.workdir("copied-token");
    let id =
        lab.sbatch("beta", &["--gres=gpu:h100:1", "--hold", &out_arg(&dir, "out.txt")], &script("echo ran")).unwrap();
    let fid = held_fleet_job(lab, id);
    let decoy =
        lab.sbatch("beta", &["--fleet=local", "-t", "5", &out_arg(&dir, "decoy.txt")], &script("sleep 300")).unwrap();
    let _cancel = fleet_lab::OnDrop(|| {
        let _ = lab.cmd("beta", "scancel", &[&id.to_string(), &decoy.to_string()]);
    });
    let d = lab.wait_for("beta", decoy, T, |r| r["JobState"] == "RUNNING").unwrap();
    assert_ne!(d["Partition"], "fleet", "{d:?}");
    let secret = std::fs::read_to_string(lab.root.join("secrets/beta.token")).unwrap();
    let token = fleet_api::auth::job_token(secret.trim(), &fid);
    let log = lab.agent_log("beta");
    let before = std::fs::read_to_string(&log).unwrap_or_default().len();
    let (code, body) = call(
        lab,
        "POST",
        &format!("/v1/jobs/{fid}/start"),
        &format!("FleetJob {token}"),
        &format!("{{\"origin_job_id\": {decoy}}}"),
    );
    assert!(code < 300, "{code} {body}");
    // The origin agent was asked, and refused naming the partition (22.05's
    // `squeue --json` ignores `-p`, so the agent sees the job and says where
    // it runs; a squeue that filters leaves it unseen).
    let t0 = std::time::Instant::now();
    let refusals = [
        format!("job {decoy} runs in partition \"gpu\", not in fleet"),
        format!("job {decoy} is not in partition fleet"),
    ];
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let new = text.get(before..).unwrap_or("");
        if new.lines().any(|l| l.contains(&fid) && refusals.iter().any(|r| l.contains(r.as_str()))) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the origin agent did not refuse the start of {fid}");
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(2));
    let rec = lab.fleetctl_json(&["job", &fid]).unwrap();
    assert_eq!(rec["state"], "held", "a job outside the proxy partition started the fleet job: {rec}");
    assert_eq!(lab.job("beta", id).unwrap()["JobState"], "PENDING");
}

#[test]
fn a_user_no_cluster_can_map_is_refused_at_sbatch_and_runs_at_home() {
    let (lab, _serial) = Lab::lock();
    // carol is an ordinary user outside JobUserGroup: alpha (JobUserMap=same)
    // has no identity for her, and its heartbeat says so.
    let dir = lab.workdir("unmapped");
    let _ = std::process::Command::new("chmod").arg("0777").arg(&dir).status();
    let (r, _) = lab.sbatch_as("carol", "beta", &["--gres=gpu:h100:1", &out_arg(&dir, "out.txt")], &script("true"));
    let err = r.expect_err("an h100 job only alpha could run is refused at sbatch");
    assert!(
        err.contains("fleet:") && err.contains("alpha: user carol from beta has no identity there (JobUserMap=same)"),
        "the refusal names the user and the mapping: {err}"
    );
    // Nothing was created for it: no fleet job of carol's.
    let jobs = lab.fleetctl_json(&["jobs", "--user", "carol"]).unwrap();
    assert_eq!(jobs.as_array().map(Vec::len), Some(0), "{jobs}");
    // A job her home can run is hers as natively.
    let (r, _) = lab.sbatch_as(
        "carol",
        "beta",
        &["--gres=gpu:a100:1", &out_arg(&dir, "home.txt")],
        &script("echo home $SLURM_CLUSTER_NAME $(id -un)"),
    );
    let id = r.expect("an a100 job stays at beta");
    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((rec["JobState"].as_str(), rec["Partition"].as_str()), ("COMPLETED", "gpu"), "{rec:?}");
    let out = wait_file(&dir.join("home.txt"), Duration::from_secs(5), |b| !b.is_empty()).unwrap();
    assert_eq!(out, b"home beta carol\n");
}

#[test]
fn a_researcher_known_only_to_the_directory_runs_as_themselves() {
    let (lab, _serial) = Lab::lock();
    // dora exists only in the site directory (NSS extrausers in the lab, as
    // LDAP/sssd at a real site), not in /etc/passwd: slurmctld, slurmd and
    // sudo know her through NSS, and so must both agents — beta's to name
    // the submitter, alpha's to admit her and run her job as her.
    let user = "dora";
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(!passwd.lines().any(|l| l.starts_with("dora:")), "dora must not be a local account");
    let ent = std::process::Command::new("getent").args(["passwd", user]).output().unwrap();
    let uid = String::from_utf8_lossy(&ent.stdout).split(':').nth(2).unwrap_or("").to_string();
    assert!(!uid.is_empty(), "NSS resolves dora: {ent:?}");
    let dir = lab.workdir("directory-user");
    let _ = std::process::Command::new("chmod").arg("0777").arg(&dir).status();
    let (r, _) = lab.sbatch_as(
        user,
        "beta",
        &["--gres=gpu:h100:1", "--fleet-to=alpha", &out_arg(&dir, "out.txt")],
        &script("echo $SLURM_CLUSTER_NAME $(id -un) $(id -u)"),
    );
    let id = r.expect("an h100 job of a directory user is accepted at beta");
    let rec = lab.wait_done("beta", id, T).unwrap();
    assert_eq!((rec["JobState"].as_str(), rec["ExitCode"].as_str()), ("COMPLETED", "0:0"), "{rec:?}");
    let out = wait_file(&dir.join("out.txt"), Duration::from_secs(5), |b| !b.is_empty()).unwrap();
    let out = String::from_utf8_lossy(&out);
    let (cluster, rest) = out.trim().split_once(' ').unwrap_or(("", ""));
    assert_eq!(cluster, "alpha", "the h100 job ran at alpha: {out:?}");
    assert_eq!(rest, format!("{user} {uid}"), "it ran as dora herself there: {out:?}");
    // The fleet job is hers in the meta-scheduler's records.
    let jobs = lab.fleetctl_json(&["jobs", "--user", user]).unwrap();
    assert!(jobs.as_array().is_some_and(|a| !a.is_empty()), "{jobs}");
}

#[test]
fn under_private_data_the_agent_must_be_a_slurm_operator() {
    let (lab, _serial) = Lab::lock();
    // The lab's clusters hide jobs between users (PrivateData=jobs,...), as a
    // multi-user site does; the agent's user is a Slurm operator there.
    let conf = std::fs::read_to_string(lab.slurm_conf("beta")).unwrap();
    assert!(conf.lines().any(|l| l.starts_with("PrivateData=") && l.contains("jobs")), "the lab runs PrivateData");
    let report = lab.agent_check("beta");
    let line = report.lines().find(|l| l.contains("operator role")).unwrap_or_default().to_string();
    assert!(line.starts_with("PASS") && line.contains("AdminLevel=operator"), "{report}");
    // delta enforces QOS limits too: its agent lifts stand-ins' limits (MaxWall).
    let delta = lab.agent_check("delta");
    let line = delta.lines().find(|l| l.contains("operator role")).unwrap_or_default().to_string();
    assert!(line.starts_with("PASS") && line.contains("AccountingStorageEnforce=associations,limits,qos"), "{delta}");
    // The helper each run starts under is where fleet.conf says.
    let helper = report.lines().find(|l| l.contains("ckpt-helper")).unwrap_or_default();
    assert!(helper.starts_with("PASS") && helper.contains("every compute node"), "{report}");
    // The lab's store keys: the agent's file is its own, each user's file
    // (CkptUserStores) that user's; the check says so, and names a user's
    // file once every user can read it.
    let fleet_conf = std::fs::read_to_string(lab.slurm_conf("beta").with_file_name("fleet.conf")).unwrap();
    if fleet_conf.lines().any(|l| l.starts_with("CkptUserStores=")) {
        let line = |r: &str, name: &str| r.lines().find(|l| l.contains(name)).unwrap_or_default().to_string();
        let stores = line(&report, "ckpt-stores");
        assert!(stores.starts_with("PASS") && stores.contains("the agent's alone"), "{report}");
        assert!(line(&report, "ckpt-user-stores").starts_with("PASS"), "{report}");
        let bobs = lab.root.join(format!("ckpt-users/{OTHER_USER}.toml"));
        let _ = std::process::Command::new("chmod").arg("0644").arg(&bobs).status();
        let opened = lab.agent_check("beta");
        let _ = std::process::Command::new("chmod").arg("0640").arg(&bobs).status();
        let users = line(&opened, "ckpt-user-stores");
        assert!(
            users.starts_with("WARN") && users.contains(&format!("{OTHER_USER}'s keys are everyone's")),
            "{opened}"
        );
    }
    // Without the role the check fails and says what to run (the agent's
    // start refuses the same way).
    let sacctmgr = |level: &str| {
        lab.cmd("beta", "sacctmgr", &["-i", "modify", "user", "fleet", "set", &format!("AdminLevel={level}")]).unwrap()
    };
    sacctmgr("None");
    let report = lab.agent_check("beta");
    sacctmgr("Operator");
    let line = report.lines().find(|l| l.contains("operator role")).unwrap_or_default().to_string();
    assert!(line.starts_with("FAIL") && line.contains("hides other users' jobs"), "{report}");
    assert!(report.contains("sacctmgr -i modify user fleet set AdminLevel=Operator"), "{report}");
    // A user sees only their own jobs, as natively, and the federation
    // still works for them: an h100 job of alice's at beta runs at alpha.
    let dir = lab.workdir("private-data");
    let _ = std::process::Command::new("chmod").arg("0777").arg(&dir).status();
    let (bob, _) = lab.sbatch_as(OTHER_USER, "beta", &["--hold", &out_arg(&dir, "bob.txt")], &script("true"));
    let bob = bob.unwrap();
    let (r, _) = lab.sbatch_as(
        "alice",
        "beta",
        &["--gres=gpu:h100:1", &out_arg(&dir, "a.txt")],
        &script("echo $SLURM_CLUSTER_NAME"),
    );
    let alice = r.unwrap();
    let seen = lab.cmd_as("alice", "beta", "squeue", &["-h", "-o", "%i", "-j", &bob.to_string()]).unwrap();
    assert!(String::from_utf8_lossy(&seen.stdout).trim().is_empty(), "alice cannot see bob's job: {seen:?}");
    let rec = lab.wait_done("beta", alice, T).unwrap();
    assert_eq!(rec["ExitCode"], "0:0", "{rec:?}");
    let out = wait_file(&dir.join("a.txt"), Duration::from_secs(5), |b| !b.is_empty()).unwrap();
    assert_ne!(out, b"beta\n", "the h100 job left beta");
    let _ = lab.cmd("beta", "scancel", &[&bob.to_string()]);
}
