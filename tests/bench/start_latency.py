#!/usr/bin/env python3
"""`make bench-start`: what Fleet adds to a job's start.

For BENCH_PAIRS (20) rounds, one after the other on an idle lab:
  native:    sbatch --gres=gpu:h100:1 at alpha (stays home) -> script runs at alpha
  forwarded: sbatch --gres=gpu:h100:1 at beta (leaves for alpha) -> script runs at alpha
Each script's first command records the wall clock; the latency is that time
minus the time just before sbatch was called. Prints p50/p90/p99/max of both
and of the difference (what Fleet adds: plugin, agent, meta-scheduler,
stand-in start at beta, confirmation, target submission).
Target (issue 7): Fleet adds <= 300 ms at p50 and <= 1 s at p99.
"""

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
R = os.environ.get("FLEET_LAB_DIR", "/tmp/fleet-lab")
PAIRS = int(os.environ.get("BENCH_PAIRS", "20"))
USER = "alice"


def sbatch(cluster, script, out):
    env = dict(os.environ, SLURM_CONF=f"{R}/{cluster}/slurm.conf", HOME=f"/home/{USER}", USER=USER)
    t0 = time.time()
    p = subprocess.run(
        ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", "sbatch", "--parsable", "--gres=gpu:h100:1", f"--output={out}"],
        input=script, capture_output=True, text=True, env=env,
    )
    if p.returncode != 0:
        raise SystemExit(f"sbatch at {cluster}: {p.stderr.strip()}")
    return t0


def wait_stamp(path, timeout=60):
    t_end = time.time() + timeout
    while time.time() < t_end:
        try:
            line = open(path).readline().strip()
            if line:
                return float(line)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise SystemExit(f"no start stamp in {path}")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    if os.environ.get("BENCH_REUSE_LAB", "1") != "1" or subprocess.run([f"{ROOT}/tests/lab/lab.sh", "status"], capture_output=True).returncode != 0:
        subprocess.run([f"{ROOT}/tests/lab/lab.sh", "up"], check=True)
    work = os.path.join(R, "work", f"start-bench-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    subprocess.run(["chown", f"{USER}:{USER}", work], check=True)
    native, fwd = [], []
    for i in range(PAIRS):
        for kind, cluster, acc in (("native", "alpha", native), ("forwarded", "beta", fwd)):
            stamp = os.path.join(work, f"{kind}-{i}.stamp")
            # The first thing the script does: note when it started (at alpha).
            script = f"#!/bin/bash\ndate +%s.%N > {stamp}\n"
            t0 = sbatch(cluster, script, os.path.join(work, f"{kind}-{i}.out"))
            acc.append(wait_stamp(stamp) - t0)
            time.sleep(0.5)
    diff = sorted(f - n for f, n in zip(sorted(fwd), sorted(native)))
    print(f"start latency over {PAIRS} jobs each (s):   p50     p90     p99     max")
    for name, xs in (("native at alpha", native), ("forwarded beta->alpha", fwd), ("Fleet adds (sorted diff)", diff)):
        print(f"  {name:26} {pct(xs, 50):7.3f} {pct(xs, 90):7.3f} {pct(xs, 99):7.3f} {max(xs):7.3f}")
    added50 = pct(fwd, 50) - pct(native, 50)
    added99 = pct(fwd, 99) - pct(native, 99)
    print(f"BENCH start native_p50_s={pct(native, 50):.3f} fwd_p50_s={pct(fwd, 50):.3f} added_p50_ms={added50 * 1000:.0f} added_p99_ms={added99 * 1000:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
