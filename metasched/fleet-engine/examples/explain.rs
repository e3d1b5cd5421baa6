//! Prints the engine's explanation for one job on a fleet file:
//! `explain <fleet.toml> <home> <gpus> <hours> [policy] [#FLEET directives…]`
//! e.g. `explain conf/fleet-sample.toml alpha 16 6 cost parallelism=tp interruptible`

use fleet_engine::{explain, Directives, FleetModel, FleetState, JobSpec, Policies};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: explain <fleet.toml> <home> <gpus> <hours> [policy] [key=value…]");
        std::process::exit(2);
    }
    let text = std::fs::read_to_string(&a[1]).unwrap_or_else(|e| {
        eprintln!("{}: {e}", a[1]);
        std::process::exit(2)
    });
    let m = FleetModel::from_toml_str(&text).unwrap_or_else(|e| {
        eprintln!("{}: {e}", a[1]);
        std::process::exit(2)
    });
    let script: String = a.iter().skip(6).map(|kv| format!("#FLEET {kv}\n")).collect();
    let (d, errs) = Directives::parse(&script);
    for e in errs {
        eprintln!("directive {e}");
    }
    let mut spec = JobSpec {
        id: "example".into(),
        home: a[2].clone(),
        gpus: a[3].parse().unwrap_or(8),
        duration_s: a[4].parse::<f64>().unwrap_or(1.0) * 3600.0,
        ..JobSpec::default()
    };
    spec.parallelism = d.parallelism.unwrap_or_default();
    spec.interruptible = d.interruptible.unwrap_or(false);
    spec.ckpt_interval_s = d.ckpt_interval_s;
    spec.datasets = d.datasets.clone();
    spec.gpu_types = d.gpu_types.clone();
    spec.max_price = d.max_price;
    spec.region_deny = d.region_deny.clone();
    spec.region_allow = d.region_allow.clone();
    spec.to = d.to.clone();
    let pols = Policies::builtin();
    let policy = pols.get(a.get(5).map(String::as_str).unwrap_or("cost")).cloned().unwrap_or_default();
    print!("{}", explain(&m, &FleetState::idle(&m), &spec, &policy));
}
