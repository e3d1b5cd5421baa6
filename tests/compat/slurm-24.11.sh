#!/usr/bin/env bash
# tests/compat/slurm-24.11.sh — do job_submit_fleet.so and spank_fleet.so
# work against Debian trixie's Slurm 24.11?
#
# 1. a debootstrap'ed trixie root (minbase) in $FLEET_TRIXIE_DIR
#    (default /var/tmp/fleet-trixie), created once and reused, with
#    slurmctld slurmd slurm-client munge libslurm-dev installed (a
#    policy-rc.d keeps the packages from starting anything);
# 2. both plugins built on the host, against the chroot's headers, into
#    target-compat/ (never target/);
# 3. a one-node Slurm 24.11 cluster run *inside* the chroot: its own
#    munged (the chroot's /run/munge, not the host's), slurmctld on
#    $CTLD_PORT and slurmd on $SLURMD_PORT, state under the chroot,
#    8 fake a100 GPUs (mknod), JobSubmitPlugins=fleet, plugstack loading
#    spank_fleet.so;
# 4. checks, each printing PASS/FAIL; the exit status is 1 on any FAIL;
#    the last one (4f) runs the agent's Slurm parsers on 24.11's own
#    `squeue --json` and `sacct` output for jobs in every state
#    (tests/compat/jobs.sh; accounting from a MariaDB + slurmdbd inside
#    the chroot, tests/compat/accounting.sh);
# 5. everything started here is stopped by pid and the bind mounts are
#    undone; the chroot stays for the next run.
#
# Needs root. Not part of `make test` (make compat).
#   FLEET_COMPAT_AGENT_BIN   the fleet-agent whose parsers 4f checks
#                            (default: built, release, into target-compat/)
#   FLEET_COMPAT_FIXTURES    copy 4f's captures there (e.g.
#                            wrappers/fleet-agent/tests/fixtures/slurm-24.11)
#   FLEET_COMPAT_ACCOUNTING=0  no slurmdbd (4f then checks squeue only)
#   FLEET_COMPAT_DB=chroot   run MariaDB from the chroot (trixie's 11.8)
#                            instead of the host's (default host: trixie's
#                            slurmdbd 24.11.5 exits at start against 11.8,
#                            see tests/compat/README.md)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROOT=${FLEET_TRIXIE_DIR:-/var/tmp/fleet-trixie}
MIRROR=${FLEET_TRIXIE_MIRROR:-http://deb.debian.org/debian}
TARGET=${FLEET_COMPAT_TARGET_DIR:-$REPO/target-compat}   # never target/: the lab builds there against 22.05
CTLD_PORT=${FLEET_COMPAT_CTLD_PORT:-26817}
SLURMD_PORT=${FLEET_COMPAT_SLURMD_PORT:-26818}
DBD_PORT=${FLEET_COMPAT_DBD_PORT:-26819}
DB_PORT=${FLEET_COMPAT_DB_PORT:-26820}
ACCOUNTING=${FLEET_COMPAT_ACCOUNTING:-1}
DB_SIDE=${FLEET_COMPAT_DB:-host}
W=/var/lib/fleet-compat          # the test's directory, as seen inside the chroot
HW=$ROOT$W                       # ... and from the host
PLUGDIR=/usr/lib/x86_64-linux-gnu/slurm-wlm
NODE=c1
T0=$(date +%s)
FAILS=0
PIDS_OWN=()                      # host-side helper pids (the agent double)

log() { echo "[compat $(($(date +%s) - T0))s] $*" >&2; }
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
die() { log "ERROR: $*"; exit 2; }
SLURM_CONF_IN=$W/slurm.conf     # inroot's SLURM_CONF
# shellcheck source=tests/compat/trixie.sh
source "$REPO/tests/compat/trixie.sh"

[[ $(id -u) == 0 ]] || die "run as root (debootstrap, chroot, mknod)"
# One run per chroot at a time (daemons are started with fd 9 closed).
exec 9>>"$ROOT.lock"
flock -n 9 || die "another run holds $ROOT.lock"

# ---------------------------------------------------------------- 1. the root
# make_root (tests/compat/trixie.sh)

# ---------------------------------------------------------------- teardown
teardown() {
  set +e
  if [[ -d $HW/run ]]; then
    stop_pid "$HW/run/slurmd-$NODE.pid" slurmd
    stop_pid "$HW/run/slurmctld.pid" slurmctld
    stop_pid "$HW/acct/slurmdbd.pid" slurmdbd
    stop_pid "$HW/acct/db/mariadb.pid" mariadbd
    stop_pid "$HW/munge/munged.pid" munged
  fi
  local p
  for p in "${PIDS_OWN[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  umount_root
  log "torn down (chroot kept at $ROOT)"
}
trap teardown EXIT

make_root
SLURM_PKG=$(inroot dpkg-query -W -f '${Version}' slurmctld)
HDR_VER=$(awk '/#define SLURM_VERSION_NUMBER/ {print $3}' "$ROOT/usr/include/slurm/slurm_version.h")
log "Slurm in the chroot: slurmctld $SLURM_PKG, SLURM_VERSION_NUMBER $HDR_VER"
echo "slurm-package $SLURM_PKG"

# ---------------------------------------------------------------- 2. build
AGENT=${FLEET_COMPAT_AGENT_BIN:-$TARGET/release/fleet-agent}
log "building the plugins against $ROOT/usr/include into $TARGET${FLEET_COMPAT_AGENT_BIN:+ (fleet-agent: $AGENT)}"
CRATES=(-p job-submit-fleet -p spank-fleet)
[[ -n ${FLEET_COMPAT_AGENT_BIN:-} ]] || CRATES+=(-p fleet-agent)
SLURM_INCLUDE_DIR=$ROOT/usr/include CARGO_TARGET_DIR=$TARGET nice cargo build -q --release "${CRATES[@]}"
SO_SUBMIT=$TARGET/release/libjob_submit_fleet.so
SO_SPANK=$TARGET/release/libspank_fleet.so
[[ -f $SO_SUBMIT && -f $SO_SPANK ]] || die "plugins not built"

# The u32 at the plugin_version symbol (little-endian), as hex.
plugin_version_of() {
  local addr
  addr=$(nm -D --defined-only "$1" | awk '$3 == "plugin_version" {print $1}')
  [[ -n $addr ]] || return 1
  objdump -s --start-address=0x$addr --stop-address=$((0x$addr + 4)) "$1" \
    | awk '/^ [0-9a-f]+ / {print $2; exit}' \
    | sed -E 's/(..)(..)(..)(..)/0x\4\3\2\1/'
}
PV=$(plugin_version_of "$SO_SUBMIT" || echo none)
if [[ $((PV)) == $((HDR_VER)) ]]; then pass "plugin_version of job_submit_fleet.so is $PV = SLURM_VERSION_NUMBER $HDR_VER"
else fail "plugin_version of job_submit_fleet.so is $PV, headers say $HDR_VER"; fi

# ---------------------------------------------------------------- 3. cluster
# A fresh test directory every run (state, logs, config); the chroot stays.
stop_pid "$HW/run/slurmd-$NODE.pid" slurmd; stop_pid "$HW/run/slurmctld.pid" slurmctld
stop_pid "$HW/acct/slurmdbd.pid" slurmdbd; stop_pid "$HW/acct/db/mariadb.pid" mariadbd; stop_pid "$HW/munge/munged.pid" munged
rm -rf "$HW"
mkdir -p "$HW"/{plugins,state,spool/$NODE,log,run,dev,agent,jobs}
chmod 1777 "$HW/jobs"
install -m 0755 "$SO_SUBMIT" "$HW/plugins/job_submit_fleet.so"
install -m 0755 "$SO_SPANK" "$HW/plugins/spank_fleet.so"
for ((i = 0; i < 8; i++)); do mknod "$HW/dev/nvidia$i" c 195 "$i"; done

cat >"$HW/slurm.conf" <<EOF
# Generated by tests/compat/slurm-24.11.sh (paths are inside the chroot $ROOT)
ClusterName=compat
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool/%n
SlurmctldPidFile=$W/run/slurmctld.pid
SlurmdPidFile=$W/run/slurmd-%n.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd-%n.log
SlurmctldDebug=verbose
SlurmdDebug=debug
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
$(if [[ $ACCOUNTING == 1 ]]; then
  printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\nAccountingStoragePort=%s\n' "$DBD_PORT"
else
  echo AccountingStorageType=accounting_storage/none
fi)
MailProg=/bin/true
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
MpiDefault=none
MinJobAge=3600
KillWait=5
ReturnToService=2
InactiveLimit=0
Waittime=0
PluginDir=$PLUGDIR:$W/plugins
JobSubmitPlugins=fleet
PlugStackConfig=$W/plugstack.conf
NodeName=$NODE NodeHostname=localhost NodeAddr=127.0.0.1 Port=$SLURMD_PORT CPUs=8 RealMemory=8000 Gres=gpu:a100:8 State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=fleet Nodes=$NODE OverSubscribe=FORCE:64 MaxTime=INFINITE State=UP
EOF
cat >"$HW/gres.conf" <<EOF
# fake GPUs: character devices, major 195
AutoDetect=off
NodeName=$NODE Name=gpu Type=a100 File=$W/dev/nvidia[0-7]
EOF
# 24.11's slurmd initialises a cgroup plugin even with proctrack/linuxproc
# and task/none; without this file it exits with "No filesystem mounted on
# /sys/fs/cgroup" / "Unable to initialize cgroup plugin" (the /sys bind
# mount is not recursive). FLEET_COMPAT_NO_CGROUP_CONF=1 shows it. 22.05
# needs no cgroup.conf.
[[ ${FLEET_COMPAT_NO_CGROUP_CONF:-0} == 1 ]] || echo "CgroupPlugin=disabled" >"$HW/cgroup.conf"
echo "optional $W/plugins/spank_fleet.so" >"$HW/plugstack.conf"
cat >"$HW/fleet.conf" <<EOF
SiteName=compat
MetaSchedulerUrl=http://127.0.0.1:9
AgentSocket=$W/agent.sock
AgentTokenFile=$W/agent.token
AgentSpoolDir=$W/agent
ProxyPartition=fleet
ProxyPath=/usr/bin/true
SubmitTimeoutMs=200
FailOpen=yes
EOF

log "starting munged, slurmctld, slurmd inside the chroot"
start_munge "$HW/munge" "$W/munge"

# Accounting (for 4f's sacct): slurmdbd inside the chroot, on a private
# MariaDB on the host (bookworm's 10.11; FLEET_COMPAT_DB=chroot: trixie's).
if [[ $ACCOUNTING == 1 ]]; then
  # shellcheck source=tests/compat/accounting.sh
  source "$REPO/tests/compat/accounting.sh"
  acct_run() { inroot "$@"; }
  acct_log() { log "$@"; }
  acct_die() { die "$@"; }
  if [[ $DB_SIDE == chroot ]]; then
    acct_db_run() { inroot "$@"; }; A_DB_DIR=$W/acct/db
  else
    acct_db_run() { "$@"; }; A_DB_DIR=$HW/acct/db
  fi
  A_DIR=$W/acct A_HDIR=$HW/acct A_DB_PORT=$DB_PORT A_DBD_PORT=$DBD_PORT A_CONF_DIR=$W A_HCONF_DIR=$HW A_AUTHINFO=
  start_accounting
  register_cluster compat root,nobody
fi

inroot /usr/sbin/slurmctld -f $W/slurm.conf </dev/null >"$HW/log/slurmctld.stderr" 2>&1 9>&- \
  || { tail -n 20 "$HW/log/slurmctld.stderr" "$HW/log/slurmctld.log"; die "slurmctld did not start"; }
for ((i = 0; ; i++)); do
  inroot timeout 5 scontrol ping 2>/dev/null | grep -q UP && break
  ((i < 60)) || { tail -n 30 "$HW/log/slurmctld.log"; die "slurmctld not answering"; }
  sleep 0.5
done
inroot /usr/sbin/slurmd -f $W/slurm.conf -N $NODE </dev/null >"$HW/log/slurmd.stderr" 2>&1 9>&- \
  || { tail -n 20 "$HW/log/slurmd.stderr" "$HW/log/slurmd-$NODE.log"; die "slurmd did not start"; }
for ((i = 0; ; i++)); do
  st=$(inroot timeout 5 sinfo -h -N -o '%t' 2>/dev/null | head -1)
  [[ $st == idle ]] && break
  ((i < 60)) || { echo "node state: $st"; tail -n 30 "$HW/log/slurmd-$NODE.log" "$HW/log/slurmctld.log"; die "node not idle"; }
  sleep 0.5
done
log "cluster up: $(inroot sinfo -h -N -o '%N %P %t %G' | paste -sd' ')"

ctld_alive() { local p; p=$(pid_of "$HW/run/slurmctld.pid"); [[ -n $p && $(cat "/proc/$p/comm" 2>/dev/null) == slurmctld ]]; }
job_field() { inroot scontrol show job "$1" | tr ' ' '\n' | sed -n "s|^$2=||p" | head -1; }
wait_state() { # job state... ; prints the final state
  local id=$1 st i; shift
  for ((i = 0; i < 60; i++)); do
    st=$(job_field "$id" JobState)
    [[ " $* " == *" $st "* ]] && break
    sleep 0.5
  done
  echo "$st"
}
CTLD_LOG=$HW/log/slurmctld.log

# ---------------------------------------------------------------- 4a. plugin loaded
sleep 1
if line=$(grep -m1 'job_submit/fleet: site compat' "$CTLD_LOG") && ctld_alive; then
  pass "a: slurmctld $SLURM_PKG loaded job_submit/fleet: ${line#*] }"
else
  fail "a: no init line of job_submit/fleet in slurmctld.log (or slurmctld died)"; grep -i 'fleet\|plugin' "$CTLD_LOG" | tail -5
fi

# ---------------------------------------------------------------- 4b. SPANK options
help=$(inroot sbatch --help 2>&1 || true)
if grep -q -- '--fleet=' <<<"$help" && grep -q -- '--fleet-to' <<<"$help"; then
  pass "b: sbatch --help lists: $(grep -o -- '--fleet[-a-z]*' <<<"$help" | sort -u | paste -sd' ')"
else
  fail "b: sbatch --help lists no --fleet options"; tail -n 5 <<<"$help"
fi
if out=$(inroot sbatch --fleet=bogus --wrap true 2>&1); then
  fail "b: sbatch --fleet=bogus was accepted: $out"
elif grep -q -- '--fleet=bogus' <<<"$out"; then
  pass "b: sbatch --fleet=bogus refused: $(head -1 <<<"$out")"
else
  fail "b: sbatch --fleet=bogus refused without naming the option: $out"
fi

# slurmd and the batch step's slurmstepd load it too (remote context;
# SlurmdDebug=debug logs it). Checked after 4c, once a batch step has run.
check_spank_remote() {
  local d s
  d=$(grep -m1 -E '^\[[^]]*\] debug: +spank: .*Loaded plugin spank_fleet.so' "$HW/log/slurmd-$NODE.log" || true)
  s=$(grep -m1 -E '\[[0-9]+\.batch\] debug: +spank: .*Loaded plugin spank_fleet.so' "$HW/log/slurmd-$NODE.log" || true)
  if [[ -n $d && -n $s ]]; then pass "b: slurmd and slurmstepd load spank_fleet.so: ${s#*] }"
  else fail "b: spank_fleet.so not loaded by slurmd ('$d') or the batch step ('$s')"; fi
}

# ---------------------------------------------------------------- 4c. fail open
if id=$(inroot sbatch --parsable --gres=gpu:a100:1 -o $W/log/c-%j.out --wrap 'echo local-ok' 2>&1); then
  st=$(wait_state "$id" COMPLETED FAILED CANCELLED)
  warn=$(grep -m1 'job_submit/fleet: agent at .* unavailable' "$CTLD_LOG" || true)
  if [[ $st == COMPLETED && $(cat "$HW/log/c-$id.out" 2>/dev/null) == local-ok && -n $warn ]]; then
    pass "c: no agent: job $id ran locally ($st, partition $(job_field "$id" Partition), $(job_field "$id" TresPerNode)); log: ${warn#*] }"
  else
    fail "c: job $id state $st, output '$(cat "$HW/log/c-$id.out" 2>/dev/null)', warning '${warn}'"
  fi
else
  fail "c: sbatch --gres=gpu:a100:1 refused without an agent: $id"
fi

check_spank_remote

# ---------------------------------------------------------------- 4d. FORWARD
# A TEST DOUBLE for fleet-agent, not the agent: the real fleet-agent only
# answers FORWARD with a placement from fleet-metasched (a fleet view,
# heartbeats, tokens), which this test does not run. The double speaks the
# plugin's wire protocol (metasched/fleet-api/src/wire.rs: one JSON line
# in, one JSON line out), logs every request, and answers FORWARD to any
# job asking for h100 GPUs, LOCAL to the rest.
cat >"$HW/agent_double.py" <<'EOF'
import json, os, socket, sys
path, logf = sys.argv[1], sys.argv[2]
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o666)
s.listen(16)
n = 0
while True:
    c, _ = s.accept()
    with c:
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = c.recv(65536)
            if not chunk:
                break
            buf += chunk
        req = json.loads(buf)
        job = req.get("job", {})
        with open(logf, "a") as f:
            f.write(json.dumps({"op": req.get("op"), "gpus": job.get("gpus"), "tres_raw": job.get("tres_raw"),
                                "partition": job.get("partition"), "name": job.get("name")}) + "\n")
        if any((g.get("gpu_type") == "h100") for g in job.get("gpus") or []):
            n += 1
            reply = {"decision": "forward", "fleet_job_id": "fj-compat-%d" % n, "target": "alpha",
                     "proxy_partition": "fleet",
                     "proxy_script": "#!/bin/sh\n# fleet stand-in fj-compat-%d\nexec /usr/bin/true\n" % n,
                     "admin_comment": "gpus=h100x8 from=compat",
                     "comment": "fleet:fj-compat-%d -> alpha" % n}
        else:
            reply = {"decision": "local", "reason": "test double: no h100"}
        c.sendall((json.dumps(reply) + "\n").encode())
EOF
python3 "$HW/agent_double.py" "$HW/agent.sock" "$HW/log/agent-double.jsonl" 2>"$HW/log/agent-double.stderr" 9>&- &
PIDS_OWN+=($!)
for ((i = 0; i < 50; i++)); do [[ -S $HW/agent.sock ]] && break; sleep 0.1; done

if id=$(inroot sbatch --parsable --hold --gres=gpu:h100:8 -J fwd-gres --wrap 'nvidia-smi' 2>&1); then
  show=$(inroot scontrol show job "$id")
  script=$(inroot scontrol write batch_script "$id" - 2>&1)
  want_script=$'#!/bin/sh\n# fleet stand-in fj-compat-1\nexec /usr/bin/true'
  problems=()
  [[ $(job_field "$id" Partition) == fleet ]] || problems+=("partition $(job_field "$id" Partition)")
  grep -q 'gres/gpu' <<<"$show" && problems+=("a GPU request is left: $(grep -o '[A-Za-z]*=[^ ]*gres/gpu[^ ]*' <<<"$show" | paste -sd' ')")
  grep -q 'AdminComment=fleet:fj-compat-1 gpus=h100x8 from=compat' <<<"$show" || problems+=("admin comment: $(grep -o 'AdminComment=.*' <<<"$show")")
  grep -q 'Comment=fleet:fj-compat-1 -> alpha' <<<"$show" || problems+=("comment: $(grep -o ' Comment=.*' <<<"$show")")
  [[ $script == "$want_script" ]] || problems+=("batch script: $(head -3 <<<"$script" | paste -sd'|')")
  if ((${#problems[@]} == 0)); then
    pass "d: --gres=gpu:h100:8 job $id became the stand-in: Partition=fleet, $(grep -o 'ReqTRES=[^ ]*' <<<"$show"), no gres/gpu, $(grep -o 'AdminComment=.*' <<<"$show" | head -1), batch script = the plan's"
  else
    fail "d: stand-in $id: ${problems[*]}"; echo "$show"
  fi
else
  fail "d: sbatch --gres=gpu:h100:8 refused: $id"
fi
for form in --gpus=h100:8 --gpus-per-node=h100:8; do
  if id=$(inroot sbatch --parsable --hold "$form" -J "fwd$form" --wrap 'nvidia-smi' 2>&1); then
    got=$(grep -F "\"name\": \"fwd$form\"" "$HW/log/agent-double.jsonl" | tail -1)
    if python3 -c 'import json,sys; g=json.loads(sys.argv[1])["gpus"]; sys.exit(0 if [(x["gpu_type"],x["count"]) for x in g]==[("h100",8)] else 1)' "$got" 2>/dev/null \
       && [[ $(job_field "$id" Partition) == fleet ]]; then
      pass "d: $form reached the agent as h100 x 8 and was forwarded (job $id): $got"
    else
      fail "d: $form: the double got: ${got:-nothing}; partition $(job_field "$id" Partition)"
    fi
  else
    fail "d: sbatch $form refused: $id"
  fi
done

# 23.11+ sbatch also writes --cpus-per-task into tres_per_task ("cpu=4"):
# the plugin must skip that item, read the GPUs, and the rewrite must
# leave a stand-in slurmctld accepts (cpus_per_task and tres_per_task agree).
if id=$(inroot sbatch --parsable --hold -n 2 --cpus-per-task=4 --gpus-per-task=h100:4 -J fwd-per-task --wrap 'nvidia-smi' 2>&1); then
  got=$(grep -F '"name": "fwd-per-task"' "$HW/log/agent-double.jsonl" | tail -1)
  if python3 -c 'import json,sys; g=json.loads(sys.argv[1])["gpus"]; sys.exit(0 if [(x["gpu_type"],x["count"],x["scope"]) for x in g]==[("h100",4,"task")] else 1)' "$got" 2>/dev/null \
     && [[ $(job_field "$id" Partition) == fleet ]]; then
    pass "d: -n 2 --cpus-per-task=4 --gpus-per-task=h100:4 reached the agent as h100 x 4 per task, stand-in $id accepted (NumCPUs=$(job_field "$id" NumCPUs), CPUs/Task=$(job_field "$id" CPUs/Task)): $got"
  else
    fail "d: --gpus-per-task: the double got: ${got:-nothing}; partition $(job_field "$id" Partition)"
  fi
else
  fail "d: sbatch -n 2 --cpus-per-task=4 --gpus-per-task=h100:4 refused: $id"
fi
# The stand-in must also run: a forwarded job without --hold starts on the
# proxy partition and runs the plan's script (here /usr/bin/true).
if id=$(inroot sbatch --parsable --gres=gpu:h100:8 -J fwd-run -o $W/log/d-%j.out --wrap 'nvidia-smi' 2>&1); then
  st=$(wait_state "$id" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL)
  if [[ $st == COMPLETED && $(job_field "$id" Partition) == fleet ]]; then
    pass "d: an unheld forwarded job ($id) ran as the stand-in: Partition=fleet JobState=$st ExitCode=$(job_field "$id" ExitCode)"
  else
    fail "d: unheld forwarded job $id: state $st, partition $(job_field "$id" Partition), reason $(job_field "$id" Reason)"
  fi
else
  fail "d: sbatch --gres=gpu:h100:8 (no hold) refused: $id"
fi

# ---------------------------------------------------------------- 4e. job_modify
if id=$(inroot sbatch --parsable --hold -t 60 --wrap true 2>&1) \
   && inroot scontrol update JobId="$id" TimeLimit=10 && sleep 0.5 \
   && [[ $(job_field "$id" TimeLimit) == 00:10:00 ]] && ctld_alive; then
  pass "e: scontrol update JobId=$id TimeLimit=10 -> TimeLimit=00:10:00, slurmctld still up"
else
  fail "e: scontrol update TimeLimit on job ${id:-?}: TimeLimit=$(job_field "${id:-0}" TimeLimit 2>/dev/null), slurmctld alive: $(ctld_alive && echo yes || echo no)"
fi

# ---------------------------------------------------------------- 4f. the agent's parsers
# Jobs in every state the agent's status path meets (held, running,
# completed, exit 3, cancelled, a hostile name, a newline in the name,
# requeued), the exact `squeue --json` and `sacct` calls of its
# SlurmBackend, and `fleet-agent --parse-slurm-output` on what they print
# (tests/compat/jobs.sh).
# shellcheck source=tests/compat/jobs.sh
source "$REPO/tests/compat/jobs.sh"
sl() { inroot "$@"; }
sl_user() { chroot --userspec=65534:65534 "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin LC_ALL=C TZ=UTC HOME=/ SLURM_CONF=$W/slurm.conf "$@"; }
JOBS_OUT_DIR=$W/jobs
capture_jobs "$HW/capture"
log "captured: $(wc -c <"$HW/capture/squeue.json") bytes of squeue --json, $( ((ACCOUNTING)) && wc -l <"$HW/capture/sacct.txt" || echo no) sacct rows"
if [[ -x $AGENT ]]; then check_parsers "$AGENT" "$HW/capture"; else fail "f: no fleet-agent at $AGENT"; fi
if [[ -n ${FLEET_COMPAT_FIXTURES:-} ]]; then
  mkdir -p "$FLEET_COMPAT_FIXTURES"
  cp "$HW/capture"/{squeue.json,expected.json,slurm-version} "$FLEET_COMPAT_FIXTURES/"
  ((ACCOUNTING)) && cp "$HW/capture/sacct.txt" "$FLEET_COMPAT_FIXTURES/"
  log "fixtures written to $FLEET_COMPAT_FIXTURES"
fi

# ---------------------------------------------------------------- wrap up
inroot scancel --user=root 2>/dev/null || true
if ctld_alive; then pass "a: slurmctld still up after all checks"; else fail "a: slurmctld died during the checks"; tail -n 20 "$CTLD_LOG"; fi
log "requests the agent double received:"; cat "$HW/log/agent-double.jsonl" >&2 2>/dev/null || true
log "logs in $HW/log; $FAILS failure(s); $(($(date +%s) - T0))s"
exit $((FAILS > 0))
