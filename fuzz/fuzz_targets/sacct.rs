#![no_main]
//! `sacct -X -n -P -D -o JobIDRaw,State,ExitCode,Submit,UID` as the agent
//! reads it (`parse_sacct`, `parse_slurm_time`): never panics; one record
//! at most per line, each from a line of exactly five `|` fields whose
//! first is its id; an exit code or signal only on a finished job.
use fleet_agent::slurm::{parse_sacct, parse_slurm_time};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_slurm_time(&text);
    let jobs = parse_sacct(&text);
    let rows: Vec<&str> = text.lines().filter(|l| l.split('|').count() == 5).collect();
    assert!(jobs.len() <= rows.len(), "{} records from {} five-field rows", jobs.len(), rows.len());
    for j in &jobs {
        assert!(
            rows.iter().any(|r| r.split('|').next().and_then(|id| id.parse::<u64>().ok()) == Some(j.native_id)),
            "record {j:?} from no row"
        );
        assert!(j.exit_code.is_none() || j.state.is_terminal(), "exit code on a live job: {j:?}");
        assert!(j.signal.is_none() || j.state.is_terminal(), "signal on a live job: {j:?}");
        assert_ne!(j.signal, Some(0));
    }
});
