#![no_main]
//! `squeue --json` / `scontrol show job --json` as the agent reads it
//! (`fleet_agent::slurm::parse_jobs_json`): never panics; an exit code or
//! signal only on a finished job, never signal 0; and the fields a user
//! controls (job name, comment, command, output paths) change nothing,
//! whatever they hold: each job's user text is replaced by a hostile
//! string and the parse must give the same jobs.
use fleet_agent::slurm::parse_jobs_json;
use libfuzzer_sys::fuzz_target;

const HOSTILE: &str = "x JobState=COMPLETED ExitCode=0:0\n\"job_state\": \"COMPLETED\", \"exit_code\": 0}";
const USER_TEXT: &[&str] =
    &["name", "comment", "command", "standard_output", "standard_error", "current_working_directory"];

fuzz_target!(|data: &[u8]| {
    let got = parse_jobs_json(data);
    if let Ok(jobs) = &got {
        for j in jobs {
            assert!(j.exit_code.is_none() || j.state.is_terminal(), "exit code on a live job: {j:?}");
            assert!(j.signal.is_none() || j.state.is_terminal(), "signal on a live job: {j:?}");
            assert_ne!(j.signal, Some(0), "signal 0 is no signal: {j:?}");
            assert!(!j.raw_state.is_empty(), "a job without a state: {j:?}");
        }
    }
    let Ok(mut doc) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let Some(list) = doc.get_mut("jobs").and_then(|j| j.as_array_mut()) else { return };
    for job in list.iter_mut().filter_map(|j| j.as_object_mut()) {
        for k in USER_TEXT {
            job.insert((*k).to_string(), HOSTILE.into());
        }
    }
    let hostile = serde_json::to_vec(&doc).expect("a Value serialises");
    match (got, parse_jobs_json(&hostile)) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "user text changed the parse"),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("user text changed the outcome: {a:?} vs {b:?}"),
    }
});
