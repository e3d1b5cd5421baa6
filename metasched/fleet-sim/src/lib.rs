//! Trace-driven simulator for Fleet placement.
//!
//! A discrete-event replay of a job trace over a fleet: arrivals, per-pool queues with
//! real capacity and gang starts, trace run times, spot preemptions driven by spot
//! availability traces, cluster outages, checkpoints and periodic migrations. Every
//! placement of the engine policies is decided by `fleet-engine` (see
//! [`engine_model`]); baselines (home-only, greedy cheapest-at-submit, random feasible)
//! pick among the same engine's feasible candidates. See `docs/simulator.md`.

pub mod certify;
pub mod cli;
pub mod convert;
pub mod engine_model;
pub mod lp;
pub mod report;
pub mod sim;
pub mod spot;
pub mod trace;
pub mod trace_cli;
pub mod tune;
pub mod walk;
