//! Slurm is the oracle: a table of resource requests, each submitted at
//! each lab cluster:
//!
//! * `sbatch --test-only --fleet=local`: can this cluster run it natively
//!   (slurmctld's will-run test; a held job is accepted untested, so
//!   acceptance alone says nothing);
//! * `sbatch --hold --fleet=local`: the native allocation shape;
//! * `sbatch --hold`: the plugin deciding (the default).
//!
//! Wherever the cluster can run a request natively, the plugin's outcome
//! must be the same (accepted, untouched: the same allocation shape in
//! `scontrol show job`) or the job is forwarded to a cluster that can run
//! it natively. Where the cluster cannot, the plugin forwards it to such a
//! cluster or refuses it with a reason (`fleet: ...`), or leaves it to
//! slurmctld, which refuses it itself, when no cluster could run it.
//! Held jobs never run, so the lab stays idle.
//!
//! The lab: alpha has 2 nodes × 8 h100, beta 2 × 8 a100; 32 CPUs and
//! 64000 MB per node; no node features, no licenses.

use std::collections::HashMap;

use fleet_lab::{JobRecord, Lab};

/// sbatch arguments, one request per line.
const REQUESTS: &[&str] = &[
    // Finding 1: multi-node GPU forms.
    "--gpus=h100:16",
    "--gpus=h100:12",
    "--gpus=9",
    "--gpus-per-task=h100:2 -n 8",
    "-n 16 --gpus-per-task=1",
    "--gpus=h100:16 -N 1-2",
    "--gpus=a100:9",
    "--gpus=a100:16",
    "--gpus=h100:8 -N 2",
    // Per node.
    "--gres=gpu:h100:8",
    "--gres=gpu:a100:8",
    "--gres=gpu:8",
    "--gres=gpu:4 -N 2",
    "--gpus-per-node=h100:8 -N 2",
    "--gpus-per-node=a100:2 -N 2",
    "-G 1",
    "-G 2 -n 2",
    "-n 2 --gpus-per-task=a100:4",
    "--gpus=a100:16 -N 2 --ntasks-per-node=2",
    // Impossible anywhere.
    "--gres=gpu:h100:9",
    "--gpus=h100:17",
    "--gpus=h100:16 -N 1",
    "--gpus=h100:16 -N 3",
    "--gpus=24",
    "-N 3 --gres=gpu:1",
    // CPUs and tasks.
    "--gres=gpu:1 -n 64",
    "--gres=gpu:1 -n 65",
    "--gres=gpu:1 -n 8 -c 8",
    "--gres=gpu:1 -c 33",
    "--gres=gpu:1 -N 2 --ntasks-per-node=32",
    "-N 2 --gres=gpu:8 --ntasks-per-node=4 -c 8",
    "--gpus=h100:16 --cpus-per-gpu=4",
    "--gpus=16 --cpus-per-gpu=5",
    // Memory.
    "--gres=gpu:8 --mem=64000",
    "--gres=gpu:8 --mem=64001",
    "--gres=gpu:h100:8 --mem=0",
    "--gres=gpu:1 -n 32 --mem-per-cpu=2000",
    "--gres=gpu:1 -n 32 --mem-per-cpu=4000",
    "--gres=gpu:1 -n 64 --mem-per-cpu=4000",
    "--gpus=16 --mem-per-gpu=8000",
    "--gpus=h100:16 --mem-per-gpu=8001",
    // Exclusive, constraint, licenses, node lists.
    "--gres=gpu:h100:8 --exclusive",
    "--gpus=h100:16 --exclusive",
    "--gres=gpu:a100:2 --exclusive",
    "--gres=gpu:h100:1 -C ib",
    "--gres=gpu:h100:1 -L matlab:1",
    "--gres=gpu:a100:1 -L matlab:1",
    // Settings a target must reproduce (carried, not limiting).
    "--gres=gpu:a100:4 --time=30 --time-min=10",
    "--gres=gpu:h100:2 --signal=B:USR1@90 --comment=hello --mail-type=END",
    "--gres=gpu:h100:2 --export=NONE",
    "--gres=gpu:h100:4 --fleet-interruptible",
    // No GPUs at all.
    "-n 4",
];

const CLUSTERS: &[&str] = &["alpha", "beta"];

/// Every cluster a job may be forwarded to (the lab's third Slurm cluster,
/// delta, has h100s too): where each request runs natively is asked at each.
const TARGETS: &[&str] = &["alpha", "beta", "delta"];

/// The fields of `scontrol show job` that make the allocation shape.
const SHAPE: &[&str] = &[
    "Partition",
    "NumNodes",
    "NumCPUs",
    "NumTasks",
    "CPUs/Task",
    "TRES",
    "TresPerNode",
    "TresPerJob",
    "TresPerTask",
    "MinMemoryNode",
    "MinMemoryCPU",
    "MemPerTres",
    "CpusPerTres",
    "Features",
    "OverSubscribe",
    "Licenses",
];

#[derive(Debug, Clone)]
enum Outcome {
    Accepted(JobRecord),
    Refused(String),
}

fn submit(lab: &Lab, cluster: &str, args: &str, local: bool, ids: &mut Vec<(String, u64)>) -> Outcome {
    let mut a: Vec<&str> = args.split_whitespace().collect();
    a.push("--hold");
    a.push("--output=/dev/null");
    if local {
        a.push("--fleet=local");
    }
    match lab.sbatch(cluster, &a, b"#!/bin/sh\ntrue\n") {
        Ok(id) => {
            ids.push((cluster.to_string(), id));
            let rec = lab.job(cluster, id).unwrap_or_default();
            Outcome::Accepted(rec)
        }
        Err(stderr) => Outcome::Refused(stderr.trim().to_string()),
    }
}

fn shape(r: &JobRecord) -> Vec<(String, String)> {
    SHAPE.iter().map(|k| (k.to_string(), r.get(*k).cloned().unwrap_or_default())).collect()
}

/// The cluster named in a stand-in's admin comment (`... -> alpha ...`).
fn forwarded_to(r: &JobRecord) -> Option<String> {
    let admin = r.get("AdminComment")?;
    // Fleet's tag: `fleet:<fleet_job_id> <summary>` (fleet_api::wire::admin_tag).
    admin.split_whitespace().next()?.strip_prefix("fleet:").filter(|id| !id.is_empty())?;
    let after = admin.split("-> ").nth(1)?;
    Some(after.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).next()?.to_string())
}

/// slurmctld's will-run test at `cluster`, the plugin out of the way.
fn runs_natively(lab: &Lab, cluster: &str, args: &str) -> bool {
    let mut a: Vec<&str> = args.split_whitespace().collect();
    a.extend(["--test-only", "--fleet=local", "--output=/dev/null", "--wrap=true"]);
    lab.cmd(cluster, "sbatch", &a).map(|o| o.status.success()).unwrap_or(false)
}

#[test]
fn slurm_is_the_oracle() {
    let (lab, _serial) = Lab::lock();
    assert!(REQUESTS.len() >= 40, "the table holds {} requests", REQUESTS.len());
    // A cluster whose nodes are not up runs nothing natively: every row
    // would differ for that alone.
    for c in TARGETS {
        let sinfo = lab.cmd(c, "sinfo", &["-h", "-N", "-o", "%N %t"]).map(|o| o.stdout).unwrap_or_default();
        assert!(
            runs_natively(lab, c, "-n 1"),
            "{c} runs not even `-n 1`: the lab is not ready\n{}",
            String::from_utf8_lossy(&sinfo)
        );
    }
    let mut ids = Vec::new();
    // The oracle: where each request runs natively, and its native shape.
    let mut feasible: HashMap<(&str, &str), bool> = HashMap::new();
    let mut native: HashMap<(&str, &str), Outcome> = HashMap::new();
    for c in TARGETS {
        for r in REQUESTS {
            feasible.insert((c, r), runs_natively(lab, c, r));
        }
    }
    for c in CLUSTERS {
        for r in REQUESTS {
            native.insert((c, r), submit(lab, c, r, true, &mut ids));
        }
    }
    let runs_somewhere = |r: &str| CLUSTERS.iter().any(|c| feasible[&(*c, r)]);
    let mut failures = Vec::new();
    let mut counts: HashMap<&str, u32> = HashMap::new();
    for c in CLUSTERS {
        for r in REQUESTS {
            let with = submit(lab, c, r, false, &mut ids);
            let here = feasible[&(*c, *r)];
            let verdict: Result<&str, String> = match &with {
                Outcome::Accepted(rec) if rec.get("Partition").map(String::as_str) == Some("fleet") => {
                    match forwarded_to(rec) {
                        Some(t) if t != *c && feasible.get(&(t.as_str(), *r)) == Some(&true) => Ok("forwarded"),
                        Some(t) => Err(format!("forwarded to {t}, which cannot run it natively")),
                        None => Err(format!("in the proxy partition without a Fleet tag: {rec:?}")),
                    }
                }
                Outcome::Accepted(w) if here => match &native[&(*c, *r)] {
                    Outcome::Accepted(n) if shape(n) == shape(w) => Ok("same as native"),
                    Outcome::Accepted(n) => {
                        Err(format!("shape differs:\n native {:?}\n plugin {:?}", shape(n), shape(w)))
                    }
                    Outcome::Refused(e) => Err(format!("held natively refused ({e}) but accepted with the plugin")),
                },
                Outcome::Accepted(_) if runs_somewhere(r) => {
                    Err("stayed home although only another cluster can run it".into())
                }
                Outcome::Accepted(_) => Ok("left to slurmctld (no cluster can run it)"),
                Outcome::Refused(e) if here => Err(format!("runs natively but refused: {e}")),
                Outcome::Refused(e) if e.contains("fleet: ") => Ok("refused with the reason"),
                Outcome::Refused(e) => match &native[&(*c, *r)] {
                    Outcome::Refused(n) if n == e => Ok("refused by slurmctld as natively"),
                    _ => Err(format!("refused without a reason: {e}")),
                },
            };
            match verdict {
                Ok(kind) => *counts.entry(kind).or_default() += 1,
                Err(e) => failures.push(format!("{c}: sbatch {r}: {e}")),
            }
        }
    }
    for (c, id) in &ids {
        let _ = lab.cmd(c, "scancel", &[&id.to_string()]);
    }
    eprintln!("oracle: {counts:?}");
    assert!(
        failures.is_empty(),
        "{} of {} submissions differ from Slurm:\n{}",
        failures.len(),
        REQUESTS.len() * CLUSTERS.len(),
        failures.join("\n")
    );
    // The table exercises every branch.
    for kind in ["same as native", "forwarded", "refused with the reason"] {
        assert!(counts.get(kind).copied().unwrap_or(0) > 0, "no request was {kind}: {counts:?}");
    }
}
