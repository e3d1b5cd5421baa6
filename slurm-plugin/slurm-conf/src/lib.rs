//! Parsers for the slurm.conf grammar, shared by `job_submit_fleet.so`
//! (inside slurmctld) and `fleet-agent`.
//!
//! Layers, lowest first:
//! * [`raw`]: the grammar itself — `Key=Value` pairs per logical line,
//!   comments, `\#`, continuation lines, quotes, `Include` — into
//!   [`raw::Parsed`] entries that carry file:line, plus diagnostics;
//! * [`hostlist`]: `gpu[01-16,20]` expressions, expanded and compressed;
//! * [`tres`]: the TRES strings slurmctld hands job_submit
//!   (`gres:gpu:h100:8`, `gres/gpu=8`) into [`fleet_api::GpuRequest`]s;
//! * typed configs built on `raw`: [`fleet`] (`fleet.conf`), [`slurm`]
//!   (`slurm.conf`), [`gres`] (`gres.conf`), [`topology`] (`topology.conf`).
//!
//! Invariant: nothing here panics on any input, and nothing does I/O
//! except the explicit `load_*` functions (which go through a
//! [`raw::Loader`], so tests need no files).

pub mod diag;
pub mod fleet;
pub mod gres;
pub mod hostlist;
pub mod raw;
pub mod slurm;
pub mod topology;
pub mod tres;
mod value;
pub use value::parse_time_minutes;

pub use diag::{Diagnostic, Error, Loaded, Severity};
pub use fleet::FleetConf;
pub use gres::GresConf;
pub use raw::{Entry, Loader, Parsed};
pub use slurm::SlurmConf;
pub use topology::Topology;
