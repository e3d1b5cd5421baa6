//! Fleet's placement engine (pure: no I/O, no panics on any input).
//!
//! * [`model`]: the static fleet (clusters, pools, prices, topology, power,
//!   datasets, network), built from TOML ([`FleetModel::from_toml_str`]).
//! * [`job`]: [`JobSpec`], filled from the plugin's [`fleet_api::JobRequest`]
//!   and `#FLEET` directives.
//! * [`state`]: the dynamic [`FleetState`] (free GPUs, waits, spot, carbon).
//! * [`policy`]: named weights (`cost`, `time`, `green`).
//! * [`engine`]: [`prepare`], [`decide`] (fast path), [`explain`] (ranked
//!   [`Decision`] with breakdowns and exclusion reasons).
//! * [`rebalance`]: [`propose_migrations`] for running interruptible jobs.
//! * [`feeds`]: parsers for price tables, carbon series, egress matrices.
//! * [`spot`]: spot availability series (the simulator's traces, the live
//!   feed) and what they say at a moment.
//!
//! The scoring model and the `#FLEET` directives are documented in
//! `docs/placement.md`.

pub mod engine;
pub mod feeds;
pub mod job;
pub mod model;
pub mod policy;
pub mod rebalance;
pub mod spot;
pub mod state;
pub mod synth;

pub use engine::{
    all_options, decide, evaluate_all, evaluate_cluster, explain, explain_prepared, prepare, Breakdown, Candidate,
    Decision, Excluded, Exclusion, Explanation, Placement, PreparedJob, Pricing,
};
pub use feeds::{parse_carbon, parse_egress, parse_prices, CarbonSeries, EgressMatrix, FeedError, PriceTable};
pub use job::{parse_duration, DirectiveError, Directives, JobSpec, Parallelism};
pub use model::{Cluster, ClusterId, FleetConfig, FleetModel, ModelError, NodePool, PoolId};
pub use policy::{Policies, Policy, PolicyError};
pub use rebalance::{
    propose_migrations, propose_migrations_unpruned, propose_migrations_with, MigrationMargin, MigrationProposal,
    RunningJob,
};
pub use spot::{parse_spot, series_for_region, SpotNow, SpotSeries, SpotSpells};
pub use state::{ClusterState, FleetState, PoolState, SpotWindows};
