#![no_main]
//! The notes `lease-exec` leaves in a run's directory (`.fleet-run-started`,
//! `.fleet-run-ended`, `.fleet-run-starts`), which the job's user can
//! write, as the target agent reads them (`ckpt::parse_started`,
//! `ckpt::parse_ended`): never panics; an end is an exit code in 0..=255
//! or a signal in 1..=64, never both; what parses is the run written back.
use fleet_agent::ckpt::{parse_ended, parse_started, NotedRun};
use libfuzzer_sys::fuzz_target;

fn written(r: &NotedRun) -> String {
    let at = if r.at_ms > 0 { format!(" at {}", r.at_ms) } else { String::new() };
    format!("job {} restart {} epoch {}{at}", r.slurm_id, r.restart, r.epoch)
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines().take(64) {
        if let Some(run) = parse_started(line) {
            assert_eq!(parse_started(&format!("started {}", written(&run))), Some(run), "{line:?}");
        }
        if let Some((run, exit, signal)) = parse_ended(line) {
            match (exit, signal) {
                (Some(c), None) => {
                    assert!((0..=255).contains(&c), "{line:?}");
                    assert_eq!(parse_ended(&format!("exit {c} {}", written(&run))), Some((run, exit, signal)));
                }
                (None, Some(s)) => {
                    assert!((1..=64).contains(&s), "{line:?}");
                    assert_eq!(parse_ended(&format!("signal {s} {}", written(&run))), Some((run, exit, signal)));
                }
                _ => panic!("an end is an exit code or a signal: {line:?} -> {exit:?} {signal:?}"),
            }
        }
    }
});
