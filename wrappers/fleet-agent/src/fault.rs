//! Fault injection for the lab's crash tests: `FLEET_AGENT_FAULT=<point>`
//! in the agent's environment makes it exit (as `kill -9` would leave it:
//! no cleanup, no journal write) when it reaches that point. Only whoever
//! starts the agent sets its environment; unset, a point costs one
//! environment lookup.
//!
//! Points: `exit-after-sbatch` (sbatch accepted a job, its id not yet
//! journaled).

pub fn point(name: &str) {
    if std::env::var_os("FLEET_AGENT_FAULT").is_some_and(|v| v == name) {
        eprintln!("fleet-agent: fault point {name} reached (FLEET_AGENT_FAULT): exiting");
        std::process::exit(137);
    }
}
