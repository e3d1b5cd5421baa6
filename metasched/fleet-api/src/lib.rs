//! Wire types shared by every Fleet component.
//!
//! Two channels use them:
//! * the plugin ↔ agent Unix socket ([`wire`]): one JSON line each way;
//! * the HTTP/JSON API of `fleet-metasched` ([`api`]), used by agents,
//!   `fleet-proxy` and `fleetctl`.
//!
//! This crate does no I/O, but for [`client::read_ca_bundle`].

pub mod api;
pub mod auth;
pub mod client;
pub mod deferred;
pub mod job;
pub mod options;
pub mod placement;
pub mod sbatch;
pub mod slurm_json;
pub mod wire;

pub use job::*;
