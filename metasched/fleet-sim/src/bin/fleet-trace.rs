//! `fleet-trace`: converts public GPU traces to the simulator's generic trace
//! format (docs/simulator.md, "Generic trace format").
//!
//! ```text
//! fleet-trace philly philly.csv > generic.csv
//! fleet-trace pai pai_job_table.csv pai_task_table.csv > generic.csv
//! fleet-trace pai-sample 2000 1 DIR    # writes DIR/pai_job_table.csv, DIR/pai_task_table.csv
//! ```

use std::process::ExitCode;

use anyhow::{bail, Context, Result};

fn run(args: &[String]) -> Result<()> {
    let open = |p: &str| std::fs::File::open(p).with_context(|| format!("reading {p}"));
    let out = std::io::stdout().lock();
    match args {
        [cmd, input] if cmd == "philly" => {
            let n = fleet_sim::convert::philly_to_generic(open(input)?, input, out)?;
            eprintln!("{n} jobs written");
        }
        [cmd, jobs, tasks] if cmd == "pai" => {
            let (n, left) = fleet_sim::convert::pai_to_generic(open(jobs)?, jobs, open(tasks)?, tasks, out)?;
            eprintln!("{n} jobs written; {left} left out (not Terminated, no GPU task or no run time)");
        }
        [cmd, n, seed, dir] if cmd == "pai-sample" => {
            let (j, t) = fleet_sim::convert::pai_sample(n.parse().context("job count")?, seed.parse().context("seed")?);
            std::fs::create_dir_all(dir)?;
            std::fs::write(format!("{dir}/pai_job_table.csv"), j)?;
            std::fs::write(format!("{dir}/pai_task_table.csv"), t)?;
        }
        _ => bail!("usage: fleet-trace philly FILE | pai JOB_TABLE TASK_TABLE | pai-sample N SEED DIR"),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet-trace: {e:#}");
            ExitCode::from(1)
        }
    }
}
