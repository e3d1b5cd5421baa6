//! The `fleet-trace` command (also `fleetctl trace`): converts GPU job traces to the simulator's generic trace
//! format (docs/simulator.md, "Generic trace format"): public traces, and a
//! site's own Slurm accounting.
//!
//! ```text
//! fleet-trace philly philly.csv > generic.csv
//! fleet-trace pai pai_job_table.csv pai_task_table.csv > generic.csv
//! fleet-trace pai-sample 2000 1 DIR    # writes DIR/pai_job_table.csv, DIR/pai_task_table.csv
//! fleet-trace openb openb_pod_list_gpuspec33.csv > generic.csv
//! fleet-trace slurm -- -M all -S 2026-11-01 -E 2026-12-01 > history.csv
//! fleet-trace sacct saved-sacct-output.txt > history.csv
//! ```

use crate::convert::{SacctOptions, TeamKey, SACCT_FORMAT};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::collections::BTreeMap;

#[derive(Parser, Debug)]
#[command(name = "fleet-trace", about = "Convert GPU job traces to the simulator's generic trace format (on stdout)")]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Philly's job table (`timestamp,duration,num_gpus,gpu_time,cluster`)
    Philly { file: String },
    /// Alibaba PAI `cluster-trace-gpu-v2020`: its job and task tables
    Pai { job_table: String, task_table: String },
    /// Write a synthetic sample in PAI's layout (not real data) to DIR
    PaiSample { n: usize, seed: u64, dir: String },
    /// Alibaba `cluster-trace-gpu-v2023`: a pod list (`openb_pod_list_*.csv`)
    Openb { pod_list: String },
    /// Print a synthetic pod list in openb's layout (not real data)
    OpenbSample { n: usize, seed: u64 },
    /// This site's Slurm accounting: runs `sacct --allusers --allocations
    /// --parsable2` with the columns it reads (none that a user sets), and
    /// the sacct arguments after `--` (clusters, period: `-M all -S
    /// 2026-11-01 -E 2026-12-01`). Needs `gres/gpu` and `gres/gpu:<type>` in
    /// slurm.conf's AccountingStorageTRES, or accounting holds no GPUs
    Slurm {
        #[command(flatten)]
        opts: SacctArgs,
        /// Arguments for sacct (after `--`)
        #[arg(last = true)]
        sacct_args: Vec<String>,
    },
    /// Saved output of `sacct --allusers --allocations --parsable2
    /// --format=<columns>` (header line kept; times as Unix seconds,
    /// `SLURM_TIME_FORMAT=%s`, or as ISO read in UTC, `TZ=UTC`); `-` reads stdin
    Sacct {
        #[command(flatten)]
        opts: SacctArgs,
        file: String,
    },
}

#[derive(Args, Debug)]
struct SacctArgs {
    /// What names a job's team (the simulator's fleet declares each team's home)
    #[arg(long, value_enum, default_value = "account")]
    team: TeamKey,
    /// Slurm GRES type = the fleet's GPU model (`a100_80g=A100-80GB`);
    /// repeatable. Types not named are written in upper case
    #[arg(long = "gpu-model", value_name = "TYPE=MODEL")]
    gpu_model: Vec<String>,
    /// GPU model of jobs whose accounting names no GPU type (a site that
    /// accounts only `gres/gpu`); without it their run times are read as
    /// the reference GPU's
    #[arg(long, value_name = "MODEL")]
    untyped_gpu: Option<String>,
}

impl SacctArgs {
    fn options(&self) -> Result<SacctOptions> {
        let mut models = BTreeMap::new();
        for m in &self.gpu_model {
            let Some((t, model)) = m.split_once('=').filter(|(t, m)| !t.trim().is_empty() && !m.trim().is_empty())
            else {
                bail!("--gpu-model `{m}`: expected TYPE=MODEL (`a100_80g=A100-80GB`)");
            };
            models.insert(t.trim().to_ascii_lowercase(), model.trim().to_string());
        }
        Ok(SacctOptions {
            team: self.team,
            models,
            untyped_gpu: self.untyped_gpu.as_ref().map(|m| m.to_ascii_uppercase()),
        })
    }
}

/// What a converter wrote and left out, on stderr.
fn report(written: usize, what: &str, left_out: &BTreeMap<&'static str, usize>) {
    let left: usize = left_out.values().sum();
    eprintln!("{written} {what} written; {left} left out");
    for (why, n) in left_out {
        eprintln!("  {n} {why}");
    }
}

/// Parse `fleet-trace`'s arguments (`argv[0]` is the program name).
pub fn parse_from<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(argv)
}

/// Convert as `cli` says, the trace on stdout and the counts on stderr.
pub fn run(cli: Cli) -> Result<()> {
    let open = |p: &str| std::fs::File::open(p).with_context(|| format!("reading {p}"));
    let out = std::io::stdout().lock();
    match cli.cmd {
        Cmd::Philly { file } => {
            let n = crate::convert::philly_to_generic(open(&file)?, &file, out)?;
            eprintln!("{n} jobs written");
        }
        Cmd::Pai { job_table, task_table } => {
            let (n, left) =
                crate::convert::pai_to_generic(open(&job_table)?, &job_table, open(&task_table)?, &task_table, out)?;
            eprintln!("{n} jobs written; {left} left out (not Terminated, no GPU task or no run time)");
        }
        Cmd::PaiSample { n, seed, dir } => {
            let (j, t) = crate::convert::pai_sample(n, seed);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(format!("{dir}/pai_job_table.csv"), j)?;
            std::fs::write(format!("{dir}/pai_task_table.csv"), t)?;
        }
        Cmd::Openb { pod_list } => {
            let (n, left) = crate::convert::openb_to_generic(open(&pod_list)?, &pod_list, out)?;
            report(n, "pods", &left);
        }
        Cmd::OpenbSample { n, seed } => {
            use std::io::Write;
            let mut out = out;
            out.write_all(crate::convert::openb_sample(n, seed).as_bytes())?;
        }
        Cmd::Slurm { opts, sacct_args } => {
            let o = std::process::Command::new("sacct")
                .args(["--allusers", "--allocations", "--parsable2", &format!("--format={SACCT_FORMAT}")])
                .args(&sacct_args)
                // Times as Unix seconds: no time zone to guess.
                .env("SLURM_TIME_FORMAT", "%s")
                .stdin(std::process::Stdio::null())
                .output()
                .context("running sacct")?;
            if !o.status.success() {
                bail!("sacct {}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim());
            }
            let s = crate::convert::sacct_to_generic(&o.stdout[..], "sacct", &opts.options()?, out)?;
            report(s.written, "jobs", &s.left_out);
        }
        Cmd::Sacct { opts, file } => {
            let opts = opts.options()?;
            let s = if file == "-" {
                crate::convert::sacct_to_generic(std::io::stdin().lock(), "stdin", &opts, out)?
            } else {
                crate::convert::sacct_to_generic(open(&file)?, &file, &opts, out)?
            };
            report(s.written, "jobs", &s.left_out);
        }
    }
    Ok(())
}
