//! The break-even duration the model implies: for a job homed on a cluster
//! of the sample fleet (all GPUs free, no data), the shortest expected
//! duration at which the engine sends it elsewhere.
//! `cargo run -p fleet-engine --example break_even [conf/fleet-sample.toml]`

use fleet_engine::{decide, prepare, FleetModel, FleetState, JobSpec, Policies};

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| "conf/fleet-sample.toml".into());
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(2);
        }
    };
    let m = match FleetModel::from_toml_str(&text) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(2);
        }
    };
    let st = FleetState::idle(&m);
    let pols = Policies::builtin();
    println!("Pairs (home → remote, job limited to the two with --fleet-to), 8 GPUs, idle fleet, ckpt 30 min.");
    println!("{:<6} {:<13} {:<13} {:<6} {:<5} {:>12}", "policy", "home", "remote", "type", "spot", "break-even");
    for pname in ["cost", "time", "green"] {
        let Some(policy) = pols.get(pname) else {
            continue;
        };
        let (mut always, mut never) = (0, 0);
        for h in &m.clusters {
            for r in &m.clusters {
                if h.name == r.name {
                    continue;
                }
                for hp in &h.pools {
                    if !r.pools.iter().any(|rp| rp.gpu_type == hp.gpu_type) {
                        continue;
                    }
                    let t = m.gpu_type_name(hp.gpu_type).to_string();
                    for intr in [false, true] {
                        let spec = |hours: f64| JobSpec {
                            gpus: 8,
                            gpu_types: vec![t.clone()],
                            duration_s: hours * 3600.0,
                            interruptible: intr,
                            ckpt_interval_s: Some(1800.0),
                            home: h.name.clone(),
                            to: vec![h.name.clone(), r.name.clone()],
                            ..JobSpec::default()
                        };
                        let away = |hours: f64| {
                            decide(&m, &st, &prepare(&m, &spec(hours)), policy)
                                .is_some_and(|d| m.clusters[d.cluster as usize].name == r.name)
                        };
                        let (lo, hi) = (1.0 / 3600.0, 10000.0);
                        match (away(lo), away(hi)) {
                            (true, _) => always += 1,
                            (false, false) => never += 1,
                            (false, true) => {
                                let (mut a, mut b) = (lo, hi);
                                for _ in 0..80 {
                                    let mid = (a * b).sqrt();
                                    if away(mid) {
                                        b = mid
                                    } else {
                                        a = mid
                                    }
                                }
                                println!(
                                    "{:<6} {:<13} {:<13} {:<6} {:<5} {:>8.1} min",
                                    pname,
                                    h.name,
                                    r.name,
                                    t,
                                    if intr { "yes" } else { "no" },
                                    b * 60.0
                                );
                            }
                        }
                    }
                }
            }
        }
        println!("{pname}: {always} pairs move at any duration (remote cheaper even for 1 s), {never} never move");
    }
}
