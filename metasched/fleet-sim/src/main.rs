//! `fleet-sim`: the simulator on its own (same flags as `fleetctl simulate`).

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "fleet-sim",
    version,
    about = "Trace-driven replay of Fleet placement policies and baselines"
)]
struct Cli {
    #[command(flatten)]
    args: fleet_sim::cli::SimulateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match fleet_sim::cli::run(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed stdout (e.g. `| head`) is not an error worth shouting about.
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("fleet-sim: {e:#}");
            ExitCode::from(1)
        }
    }
}
