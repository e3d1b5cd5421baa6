#![no_main]
//! The placement rule on a request as the plugin sends it and a fleet view
//! as the meta-scheduler sends it (`{"job": JobRequest, "view": FleetView}`):
//! `Demand::of`, `place`, `place_or_wait`, `describe` and the target's
//! sbatch options never panic, and the module's invariant holds: a job
//! the origin can run (as far as the view shows) is never `Impossible`;
//! a `Remote` target is a cluster of the view other than the origin and
//! allowed by `--fleet-to`; every sbatch option is one `--name[=value]`
//! argument.
use fleet_api::api::FleetView;
use fleet_api::placement::{describe, origin_fits, place, place_or_wait, Demand, Placement};
use fleet_api::sbatch::sbatch_options;
use fleet_api::{FleetMode, JobRequest};
use libfuzzer_sys::fuzz_target;

#[derive(serde::Deserialize)]
struct Input {
    job: JobRequest,
    view: FleetView,
}

fuzz_target!(|data: &[u8]| {
    let Ok(Input { job, view }) = serde_json::from_slice::<Input>(data) else { return };
    let _ = Demand::of(&job);
    let _ = describe(&job);
    for o in sbatch_options(&job) {
        let name = o.split('=').next().unwrap_or("");
        assert!(
            name.len() > 2 && name.starts_with("--") && name[2..].bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
            "option {o:?}"
        );
    }
    let allowed = |n: &str| job.fleet.to.is_empty() || job.fleet.to.iter().any(|t| t.eq_ignore_ascii_case(n));
    let home_ok = job.fleet.mode != FleetMode::Remote && allowed(&job.origin) && origin_fits(&view, &job);
    for (p, what) in [(place(&view, &job).0, "place"), (place_or_wait(&view, &job).0, "place_or_wait")] {
        match p {
            Placement::Impossible { reason } => {
                assert!(!home_ok, "{what}: refused a job the origin can run: {reason}")
            }
            Placement::Remote { target, .. } => {
                assert_ne!(target, job.origin, "{what}");
                assert!(view.clusters.iter().any(|c| c.name == target), "{what}: {target} not in the view");
                assert!(allowed(&target), "{what}: {target} not in --fleet-to");
            }
            Placement::Home { .. } => {}
        }
    }
});
