//! The lab harness: the one place that knows how to bring the local
//! federation (real slurmctld/slurmd per cluster, fleet-metasched, one
//! fleet-agent per cluster) up and down. Integration tests in `tests/` use it.
