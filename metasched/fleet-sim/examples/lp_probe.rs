//! Solves the LP bounds of a case without replaying it (for measuring the LP):
//! `lp_probe HORIZON_H [COMPLETION_H|-] [KG_CAP|-] [CARBON_USD_BUDGET|-] -- <fleet-sim flags>`.
use std::time::Instant;

use fleet_sim::engine_model::EngineModel;

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    let sep = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    let mine = &argv[1..sep];
    let args = fleet_sim::cli::parse_from(
        std::iter::once("fleet-sim".to_string()).chain(argv[(sep + 1).min(argv.len())..].iter().cloned()),
    )?;
    let horizon_h: f64 = mine.first().map(|s| s.parse()).transpose()?.unwrap_or(0.0);
    let num = |i: usize| mine.get(i).filter(|s| *s != "-").map(|s| s.parse::<f64>()).transpose();
    let (compl, kg, budget) = (num(1)?, num(2)?, num(3)?);
    let loaded = fleet_sim::cli::load(&args)?;
    let mut model = EngineModel::new(&loaded.setup, loaded.trace.epoch_unix as f64)?;
    let jobs = fleet_sim::cli::sim_jobs(&loaded.trace, &mut model, &args)?;
    model.assign_spot_traces(&loaded.spot);
    let h = horizon_h * 3600.0;
    let t = Instant::now();
    let b =
        fleet_sim::lp::lp_bound(&mut model, &jobs, &loaded.spot, h, args.lp_max_vars).map_err(anyhow::Error::msg)?;
    println!(
        "lp {:.3} USD slot {:.1} h groups {} vars {} rows {} ({:.1} s, {})",
        b.usd,
        b.slot_hours,
        b.groups,
        b.variables,
        b.constraints,
        t.elapsed().as_secs_f64(),
        b.solver
    );
    if compl.is_some() || kg.is_some() {
        let t = Instant::now();
        let caps = fleet_sim::lp::Caps { mean_completion_h: compl, kg_co2: kg };
        let c = fleet_sim::lp::capped_bound(&mut model, &jobs, &loaded.spot, h, args.lp_max_vars, caps)
            .map_err(anyhow::Error::msg)?;
        println!("{} vars {} ({:.1} s)", c.describe(), c.variables, t.elapsed().as_secs_f64());
    }
    if let Some(u) = budget {
        let t = Instant::now();
        let c = fleet_sim::lp::carbon_bound(&mut model, &jobs, &loaded.spot, h, args.lp_max_vars, u)
            .map_err(anyhow::Error::msg)?;
        println!("carbon LP {:.1} kg at {:.0} USD ({:.1} s)", c.kg_co2, c.usd, t.elapsed().as_secs_f64());
    }
    Ok(())
}
