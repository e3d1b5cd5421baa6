//! `fleet-sim`: the simulator on its own (same flags as `fleetctl simulate`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match fleet_sim::cli::parse_from(std::env::args()) {
        Ok(a) => a,
        Err(e) => e.exit(), // usage errors exit 2, --help exits 0
    };
    match fleet_sim::cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed stdout (e.g. `| head`) is not an error worth shouting about.
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("fleet-sim: {e:#}");
            ExitCode::from(1)
        }
    }
}
