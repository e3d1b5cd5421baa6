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

With BENCH_TRACE=1 it also prints where a forwarded job's time went: each
step's time after sbatch (p50/p90 over the jobs), read from the lab's logs:
slurmctld and slurmd at both clusters, and the `fleet::start` debug lines of
the meta-scheduler and the agents (start the lab with
RUST_LOG=info,fleet::start=debug FLEET_LOG=info,fleet::start=debug).
"""

import datetime
import glob
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
R = os.environ.get("FLEET_LAB_DIR", "/tmp/fleet-lab")
PAIRS = int(os.environ.get("BENCH_PAIRS", "20"))
# The pause after each job. slurmctld schedules batch jobs at most every
# batch_sched_delay (3 s by default): with a short pause a job's wait is
# set by the previous job's start at that cluster, not by chance (see
# docs/failover.md, "Where the time goes"). BENCH_GAP_S=3.5 lets every
# job find its cluster's scheduler free.
GAP_S = float(os.environ.get("BENCH_GAP_S", "0.5"))
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
    return t0, int(p.stdout.strip().split(";")[0])


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
    if len(sys.argv) == 3 and sys.argv[1] == "--trace":
        # Again, from a run's record (<lab>/work/start-bench-<pid>/submitted.json).
        with open(sys.argv[2]) as f:
            trace([tuple(x) for x in json.load(f)])
        return 0
    if os.environ.get("BENCH_REUSE_LAB", "1") != "1" or subprocess.run([f"{ROOT}/tests/lab/lab.sh", "status"], capture_output=True).returncode != 0:
        subprocess.run([f"{ROOT}/tests/lab/lab.sh", "up"], check=True)
    work = os.path.join(R, "work", f"start-bench-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    subprocess.run(["chown", f"{USER}:{USER}", work], check=True)
    native, fwd = [], []
    submitted = []  # (kind, cluster, Slurm job id, t0, stamp)
    for i in range(PAIRS):
        for kind, cluster, acc in (("native", "alpha", native), ("forwarded", "beta", fwd)):
            stamp = os.path.join(work, f"{kind}-{i}.stamp")
            # The first thing the script does: note when it started (at alpha).
            script = f"#!/bin/bash\ndate +%s.%N > {stamp}\n"
            t0, jid = sbatch(cluster, script, os.path.join(work, f"{kind}-{i}.out"))
            ran = wait_stamp(stamp)
            acc.append(ran - t0)
            submitted.append((kind, cluster, jid, t0, ran))
            time.sleep(GAP_S)
    diff = sorted(f - n for f, n in zip(sorted(fwd), sorted(native)))
    print(f"start latency over {PAIRS} jobs each, {GAP_S} s apart (s):   p50     p90     p99     max")
    for name, xs in (("native at alpha", native), ("forwarded beta->alpha", fwd), ("Fleet adds (sorted diff)", diff)):
        print(f"  {name:26} {pct(xs, 50):7.3f} {pct(xs, 90):7.3f} {pct(xs, 99):7.3f} {max(xs):7.3f}")
    added50 = pct(fwd, 50) - pct(native, 50)
    added99 = pct(fwd, 99) - pct(native, 99)
    print(f"BENCH start native_p50_s={pct(native, 50):.3f} fwd_p50_s={pct(fwd, 50):.3f} added_p50_ms={added50 * 1000:.0f} added_p99_ms={added99 * 1000:.0f}")
    with open(os.path.join(work, "submitted.json"), "w") as f:
        json.dump(submitted, f)
    if os.environ.get("BENCH_TRACE") == "1":
        time.sleep(1.5)  # the last lines reach the logs
        trace(submitted)
    return 0


def slurm_ts(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()


def rust_ts(s):
    return datetime.datetime.strptime(s[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()


def read_lines(pattern):
    for path in sorted(glob.glob(pattern)):
        with open(path, errors="replace") as f:
            yield from f


SLURM_RE = re.compile(r"^\[(\S+)\] (.*)$")
RUST_RE = re.compile(r"^(\S+Z)\s+\w+\s+\S+: (.*)$")


def slurm_events(cluster):
    """{Slurm job id: {"submit"|"alloc"|"launch": first time}} from a cluster's logs."""
    ev = {}
    pats = (
        ("submit", re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+)")),
        ("alloc", re.compile(r"(?:sched: Allocate|Started) JobId=(\d+)")),
        ("launch", re.compile(r"Launching batch job (\d+)")),
    )
    for line in read_lines(f"{R}/{cluster}/log/slurm*.log"):
        m = SLURM_RE.match(line)
        if not m:
            continue
        for name, p in pats:
            k = p.search(m.group(2))
            if k:
                ev.setdefault(int(k.group(1)), {}).setdefault(name, slurm_ts(m.group(1)))
    return ev


def rust_lines(path):
    for line in read_lines(path):
        m = RUST_RE.match(line.strip())
        if m:
            yield rust_ts(m.group(1)), m.group(2)


def trace(submitted):
    """Print each step of a forwarded job's start, as time after sbatch."""
    ev = {c: slurm_events(c) for c in ("alpha", "beta")}
    fleet = {}  # stand-in id -> fleet id
    steps = {}  # fleet id -> {step: time}
    meta = list(rust_lines(f"{R}/log/metasched.log"))
    field = lambda msg, k: (re.search(rf"\b{k}=(\S+)", msg) or [None, None])[1]
    for t, msg in meta:
        job = (field(msg, "job") or "").strip('"')
        if not job:
            continue
        st = steps.setdefault(job, {})
        if msg.startswith("placed early"):
            st.setdefault("meta: placed early", t)
        elif msg.startswith("start requested"):
            st.setdefault("meta: proxy's start request", t)
            fleet[int(field(msg, "stand_in"))] = job
        elif msg.startswith("the origin confirmed"):
            st.setdefault("meta: origin's confirmation", t)
            fleet[int(field(msg, "stand_in"))] = job
        elif msg.startswith("lease answered"):
            held = int(field(msg, "held_ms")) / 1000
            st.setdefault("meta: first lease request", t - held)
            if field(msg, "valid_ms") not in (None, "0"):
                st.setdefault("meta: lease granted", t)
    remote = {}  # fleet id -> alpha's Slurm job id
    for cluster in ("alpha", "beta"):
        for t, msg in rust_lines(f"{R}/{cluster}/log/agent.log"):
            if msg.startswith("work taken"):
                for kind, key in (("submit", "assignment taken"), ("confirm", "start check taken")):
                    for job in re.findall(r'"([^"]+)"', field(msg, kind) or ""):
                        steps.setdefault(job, {}).setdefault(f"{cluster} agent: {key}", t)
            elif msg.startswith("submitted"):
                job = field(msg, "id")
                steps.setdefault(job, {}).setdefault(f"{cluster} agent: sbatch done", t)
                remote[job] = int(field(msg, "slurm_id"))
            elif msg.startswith("start confirmation sent"):
                steps.setdefault(field(msg, "id"), {}).setdefault(f"{cluster} agent: confirmation posted", t)
    rows = {}
    gate_bound = alpha_bound = 0
    for kind, cluster, jid, t0, ran in submitted:
        add = lambda name, t: rows.setdefault((kind, name), []).append(t - t0) if t else None
        for name in ("submit", "alloc", "launch"):
            add(f"{cluster} slurm: {name} {'stand-in' if kind == 'forwarded' else 'job'}", ev[cluster].get(jid, {}).get(name))
        if kind == "forwarded":
            job = fleet.get(jid)
            for name, t in steps.get(job, {}).items():
                add(name, t)
            for name in ("submit", "alloc", "launch"):
                add(f"alpha slurm: {name} early run", ev["alpha"].get(remote.get(job), {}).get(name))
            # Which came last: the origin's confirmation or the run's launch at alpha?
            confirmed = steps.get(job, {}).get("meta: origin's confirmation")
            launched = ev["alpha"].get(remote.get(job), {}).get("launch")
            if confirmed and launched:
                gate_bound += confirmed > launched
                alpha_bound += confirmed <= launched
        add("script runs", ran)
    print(f"\nwhere the time goes (s after sbatch):        n     p50     p90")
    for kind in ("native", "forwarded"):
        named = sorted(((pct(v, 50), n, v) for (k, n), v in rows.items() if k == kind))
        for p50, name, v in named:
            print(f"  {kind[:3]} {name:40} {len(v):3} {p50:7.3f} {pct(v, 90):7.3f}")
    print(f"  forwarded runs launched at alpha before the origin's confirmation (waited at the gate): {gate_bound},"
          f" after it (alpha's Slurm the later one): {alpha_bound}")


if __name__ == "__main__":
    sys.exit(main())
