//! `fleet-trace`: converts GPU job traces to the simulator's generic trace
//! format ([`fleet_sim::trace_cli`]; also `fleetctl trace`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match fleet_sim::trace_cli::parse_from(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match fleet_sim::trace_cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet-trace: {e:#}");
            ExitCode::from(1)
        }
    }
}
