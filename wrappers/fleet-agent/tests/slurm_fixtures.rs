//! The agent's Slurm parsers on real output of Slurm 22.05 (Debian
//! bookworm) and 24.11 (Debian trixie): `tests/fixtures/slurm-<release>/`
//! holds what the agent's SlurmBackend runs (`squeue --json -a -t all -j
//! <ids>`, `sacct -X -n -P -D -o JobIDRaw,State,ExitCode,Submit,UID -j
//! <ids>`) for jobs in every state its status path meets, captured by
//! `tests/compat/slurm-22.05.sh` and `tests/compat/slurm-24.11.sh`
//! (`FLEET_COMPAT_FIXTURES=<dir>`), and `expected.json`: what each job is,
//! from what was submitted and squeue's own text columns (`%V` submit
//! time through GNU date, `%U` uid), not from these parsers. Both
//! releases' captures hold a job named `x JobState=COMPLETED ExitCode=0:0`
//! (which exits 3) and one whose name holds a newline; neither may change
//! a field.

use std::path::PathBuf;
use std::sync::Once;

use fleet_agent::backend::NativeJob;
use fleet_agent::journal::Run;
use fleet_agent::slurm::{parse_jobs_json, parse_sacct};
use fleet_agent::track::{identify, Seen};

#[derive(Debug, serde::Deserialize)]
struct Expected {
    id: u64,
    kind: String,
    state: String,
    exit_code: Option<i32>,
    user_id: u32,
    submit_time: i64,
    restarts: u32,
}

const KINDS: &[&str] = &["held", "running", "ok", "fail3", "cancelled", "hostile", "newline", "requeued"];

fn dir(release: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("slurm-{release}"))
}

/// sacct prints the controller's local time; the captures ran in UTC.
/// Set once, before any parse, so no thread reads TZ while it changes.
fn utc() {
    static TZ: Once = Once::new();
    TZ.call_once(|| std::env::set_var("TZ", "UTC"));
}

fn expected(release: &str) -> Vec<Expected> {
    let text = std::fs::read_to_string(dir(release).join("expected.json")).unwrap();
    let e: Vec<Expected> = serde_json::from_str(&text).unwrap();
    let kinds: Vec<&str> = e.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, KINDS, "{release}: the capture lacks a kind of job");
    e
}

/// The latest record of `e`'s job (sacct -D lists earlier runs first).
fn check(release: &str, what: &str, jobs: &[NativeJob], e: &Expected) {
    let mine: Vec<&NativeJob> = jobs.iter().filter(|j| j.native_id == e.id).collect();
    let Some(j) = mine.last() else { panic!("{release} {what}: job {} ({}) missing", e.id, e.kind) };
    let at = format!("{release} {what}: job {} ({})", e.id, e.kind);
    assert_eq!(j.state.as_str(), e.state, "{at}: state of {j:?}");
    assert_eq!(j.exit_code, e.exit_code, "{at}: exit code");
    assert_eq!(j.signal, None, "{at}: signal");
    assert_eq!(j.user_id, Some(e.user_id), "{at}: uid");
    assert_eq!(j.submit_time, Some(e.submit_time), "{at}: submit time");
    assert_eq!(j.restarts, e.restarts, "{at}: restarts");
    if e.kind != "requeued" || what == "squeue" {
        assert_eq!(mine.len(), 1, "{at}: listed {} times", mine.len());
    }
}

fn squeue(release: &str) {
    utc();
    let raw = std::fs::read(dir(release).join("squeue.json")).unwrap();
    let jobs = parse_jobs_json(&raw).unwrap();
    for e in expected(release) {
        check(release, "squeue", &jobs, &e);
        // A started job has its start time (what tells a second run from
        // the first); a held one has none (its estimate is not read).
        let j = jobs.iter().rfind(|j| j.native_id == e.id).unwrap();
        match e.kind.as_str() {
            "running" | "ok" => assert!(j.start_time.is_some_and(|t| t >= e.submit_time), "{release}: {j:?}"),
            "held" => assert_eq!(j.start_time, None, "{release}: {j:?}"),
            _ => {}
        }
    }
    // The hostile names really are in the capture, as Slurm stored them.
    let doc: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let names: Vec<&str> = doc["jobs"].as_array().unwrap().iter().filter_map(|j| j["name"].as_str()).collect();
    assert!(names.contains(&"x JobState=COMPLETED ExitCode=0:0"), "{release}: {names:?}");
    assert!(names.iter().any(|n| n.contains('\n')), "{release}: no name with a newline in {names:?}");
}

fn sacct(release: &str) {
    utc();
    let text = std::fs::read_to_string(dir(release).join("sacct.txt")).unwrap();
    let jobs = parse_sacct(&text);
    for e in expected(release) {
        check(release, "sacct", &jobs, &e);
    }
}

/// The agent knows a job by id, owner and submit time. The requeued job
/// has a new submit time in both releases: from the first sight (its
/// first run's row in sacct -D) the agent must still find it in squeue
/// and, once squeue forgets it, in sacct.
fn requeued_job_keeps_its_identity(release: &str) {
    utc();
    let e = expected(release).into_iter().find(|e| e.kind == "requeued").unwrap();
    let rows = parse_sacct(&std::fs::read_to_string(dir(release).join("sacct.txt")).unwrap());
    let first = rows.iter().find(|j| j.native_id == e.id).unwrap();
    assert_eq!(first.raw_state, "REQUEUED", "{release}: the first run's row");
    assert!(first.submit_time < Some(e.submit_time), "{release}: the requeue kept its submit time");
    let run = Run { slurm_id: Some(e.id), uid: Some(e.user_id), submit_time: first.submit_time, ..Default::default() };
    let queue = parse_jobs_json(&std::fs::read(dir(release).join("squeue.json")).unwrap()).unwrap();
    // squeue reports the job's working directory, which names a fleet job;
    // these sacct rows carry none (the older column set): submit time.
    let work_dir = queue.iter().find(|j| j.native_id == e.id).map(|j| j.work_dir.clone()).unwrap();
    assert!(!work_dir.is_empty(), "{release}: squeue --json reports current_working_directory");
    for (what, jobs) in [("squeue", &queue), ("sacct", &rows)] {
        let candidates: Vec<&NativeJob> = jobs.iter().filter(|j| j.native_id == e.id).collect();
        match identify(&run, "compat", &work_dir, &candidates) {
            Seen::Job(j) => assert_eq!((j.submit_time, j.restarts), (Some(e.submit_time), 1), "{release} {what}"),
            Seen::Gone(why) => panic!("{release} {what}: the requeued job was taken for another: {why}"),
        }
    }
}

#[test]
fn squeue_json_of_slurm_22_05() {
    squeue("22.05");
}

#[test]
fn squeue_json_of_slurm_24_11() {
    squeue("24.11");
}

#[test]
fn sacct_of_slurm_22_05() {
    sacct("22.05");
}

#[test]
fn sacct_of_slurm_24_11() {
    sacct("24.11");
}

#[test]
fn requeued_job_keeps_its_identity_in_22_05() {
    requeued_job_keeps_its_identity("22.05");
}

#[test]
fn requeued_job_keeps_its_identity_in_24_11() {
    requeued_job_keeps_its_identity("24.11");
}
