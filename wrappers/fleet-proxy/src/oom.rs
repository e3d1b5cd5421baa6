//! Ending the stand-in `OUT_OF_MEMORY` when its remote job ended so.
//!
//! slurmctld sets `OUT_OF_MEMORY` only from its own nodes: slurmstepd
//! counts the OOM kills in the job's memory cgroup (task/cgroup with
//! `ConstrainRAMSpace=yes`) and reports the batch step as out of memory,
//! whatever its script's exit status. So the stand-in, once its remote job
//! ended `OUT_OF_MEMORY` and its output is relayed, runs out of its *own*
//! memory: a child (this binary again, with [`FILL_FLAG`]) fills the
//! stand-in's cgroup until the kernel's OOM killer ends that child. Slurm
//! at home then shows the stand-in `OUT_OF_MEMORY`, `ExitCode=0:125`, in
//! `squeue`, `scontrol show job` and `sacct`, as it shows the native job.
//!
//! Only where the stand-in has a memory limit of at most [`MAX_LIMIT`]
//! (slurmd confines the proxy node's jobs: their limit is Slurm's
//! `MinRAMSpace`, 30 MB by default, since a stand-in asks for 1 MB); the
//! child never asks for more than the limit plus [`OVERSHOOT`]. Where no
//! OOM kill comes (no limit, or a cgroup that may swap), the stand-in ends
//! `FAILED` as before, and its Comment names the remote state.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The child's argument: fill this many bytes, then exit 0.
pub const FILL_FLAG: &str = "--fill-own-memory-cgroup";
/// The largest own limit the proxy fills (a proxy node's jobs get Slurm's
/// MinRAMSpace; a larger limit means memory is not confined for
/// stand-ins, and filling it would take memory from the node).
pub const MAX_LIMIT: u64 = 1 << 30;
/// How far past its limit the child asks.
pub const OVERSHOOT: u64 = 64 << 20;
/// How long the child may take.
const FILL_TIMEOUT: Duration = Duration::from_secs(30);

/// The smallest memory limit over the cgroup path of this process and its
/// ancestors, from `/proc/self/cgroup`'s text: cgroup v1's `memory`
/// hierarchy (`<root>/memory/<path>/memory.limit_in_bytes`) or v2's
/// unified one (`<root>/<path>/memory.max`). `None` without a finite one
/// (v1's "unlimited" is a number near 2^63).
pub fn memory_limit(proc_cgroup: &str, root: &Path) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut consider = |dir: &Path, file: &str| {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else { return };
        if let Ok(n) = text.trim().parse::<u64>() {
            if n < 1 << 62 {
                best = Some(best.map_or(n, |b| b.min(n)));
            }
        }
    };
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (base, file) = if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else {
            continue;
        };
        // The path and each ancestor, never leaving the hierarchy.
        let rel: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != "." && *c != "..").collect();
        for n in (0..=rel.len()).rev() {
            let mut dir = base.clone();
            rel[..n].iter().for_each(|c| dir.push(c));
            consider(&dir, file);
        }
    }
    best
}

/// The child: allocate and touch `bytes`, a MiB at a time, then exit 0 (the
/// OOM killer ends it first where the cgroup's limit is lower).
pub fn fill(bytes: u64) -> u8 {
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut total = 0u64;
    while total < bytes.min(MAX_LIMIT + OVERSHOOT) {
        // Non-zero bytes: every page is really touched.
        held.push(vec![1u8; 1 << 20]);
        total += 1 << 20;
    }
    std::hint::black_box(&held);
    0
}

/// Run out of the stand-in's own memory (see the module doc). `Ok` when
/// the child was killed by the OOM killer (SIGKILL); the reason otherwise.
pub fn out_of_memory_here() -> Result<(), String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let limit = memory_limit(&text, Path::new("/sys/fs/cgroup"))
        .ok_or("this job's memory is not confined (no cgroup memory limit)")?;
    if limit > MAX_LIMIT {
        return Err(format!("this job's memory limit ({limit} bytes) is above {MAX_LIMIT}: not filled"));
    }
    let exe = std::env::current_exe().map_err(|e| format!("finding fleet-proxy: {e}"))?;
    let mut child = Command::new(exe)
        .arg(FILL_FLAG)
        .arg((limit + OVERSHOOT).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the child: {e}"))?;
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() < FILL_TIMEOUT => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the child did not finish in time".into());
            }
            Err(e) => return Err(format!("waiting for the child: {e}")),
        }
    };
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(libc::SIGKILL) => Ok(()),
        _ => Err(format!("no OOM kill within the limit of {limit} bytes (the child ended {status})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_limit_of_the_path_and_its_ancestors() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let put = |rel: &str, file: &str, v: &str| {
            let d = root.join(rel);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), v).unwrap();
        };
        // v1, as slurmd (multiple-slurmd build) lays it out in the lab.
        let v1 = "4:memory:/slurm_betaproxy/uid_0/job_7/step_batch/task_0\n3:cpuset:/\n";
        put("memory", "memory.limit_in_bytes", "9223372036854771712\n");
        put("memory/slurm_betaproxy/uid_0/job_7", "memory.limit_in_bytes", "31457280\n");
        put("memory/slurm_betaproxy/uid_0/job_7/step_batch", "memory.limit_in_bytes", "9223372036854771712\n");
        put("memory/slurm_betaproxy/uid_0/job_7/step_batch/task_0", "memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(memory_limit(v1, root), Some(31_457_280));
        // A tighter step limit wins.
        put("memory/slurm_betaproxy/uid_0/job_7/step_batch", "memory.limit_in_bytes", "20971520");
        assert_eq!(memory_limit(v1, root), Some(20_971_520));
        // v2: memory.max, "max" is none.
        put("sys/job_9", "memory.max", "max\n");
        assert_eq!(memory_limit("0::/sys/job_9\n", root), None);
        put("sys", "memory.max", "1048576\n");
        assert_eq!(memory_limit("0::/sys/job_9\n", root), Some(1_048_576));
        // Nothing confined, garbage, and paths that try to leave the root.
        for text in ["", "garbage", "4:memory:/nowhere\n", "x:y", "4:memory:/../../etc\n"] {
            assert_eq!(memory_limit(text, root), None, "{text:?}");
        }
    }

    #[test]
    fn fill_stops_at_what_it_was_asked() {
        assert_eq!(fill(3 << 20), 0);
    }
}
