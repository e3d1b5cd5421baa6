//! Compares a fleet file's cloud prices with a price table (the format of
//! gpu-prices.csv) and prints the CSV line each price comes from.
//! `cargo run -p fleet-engine --example check_prices -- conf/fleet-sample.toml /work/shared/data/prices/gpu-prices.csv`

use fleet_engine::{parse_prices, FleetModel};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(fleet), Some(csv)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: check_prices <fleet.toml> <prices.csv>");
        std::process::exit(2);
    };
    let read = |p: &str| {
        std::fs::read_to_string(p).unwrap_or_else(|e| {
            eprintln!("{p}: {e}");
            std::process::exit(2)
        })
    };
    let m = FleetModel::from_toml_str(&read(fleet)).unwrap_or_else(|e| {
        eprintln!("{fleet}: {e}");
        std::process::exit(2)
    });
    let t = parse_prices(&read(csv)).unwrap_or_else(|e| {
        eprintln!("{csv}: {e}");
        std::process::exit(2)
    });
    let mut bad = 0;
    for c in m.clusters.iter().filter(|c| !c.onprem) {
        let region = c.region.split_once(':').map(|x| x.1).unwrap_or(&c.region);
        for p in &c.pools {
            let ty = m.gpu_type_name(p.gpu_type);
            let Some(e) = t.get(&c.provider, region, ty, p.gpus_per_node) else {
                println!("{:<12} {:<5} not in the table", c.name, ty);
                bad += 1;
                continue;
            };
            let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(x), Some(y)) => (x - y).abs() < 1e-9,
                (None, None) => true,
                _ => false,
            };
            let ok = same(p.prices.on_demand, e.on_demand) && same(p.prices.spot, e.spot);
            bad += usize::from(!ok);
            println!(
                "{:<12} {:<5} fleet od={:?} spot={:?} | table od={:?} (line {}) spot={:?} (line {}) {}",
                c.name,
                ty,
                p.prices.on_demand,
                p.prices.spot,
                e.on_demand,
                e.on_demand_line,
                e.spot,
                e.spot_line,
                if ok { "OK" } else { "MISMATCH" }
            );
        }
    }
    std::process::exit(i32::from(bad > 0));
}
