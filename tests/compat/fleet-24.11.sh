#!/usr/bin/env bash
# tests/compat/fleet-24.11.sh — the whole Fleet path on Slurm 24.11: the
# real fleet-agent, fleet-metasched and fleet-proxy between two 24.11
# clusters.
#
# Inside the trixie chroot of slurm-24.11.sh ($FLEET_TRIXIE_DIR, created
# on first use, tests/compat/trixie.sh), under /var/lib/fleet-compat-fed:
#   origin  slurmctld :26810, node o-a100 (2 fake a100, :26811), proxy node
#           o-proxy (:26812, partition fleet);
#   target  slurmctld :26813, node t-h100 (8 fake h100, :26814), proxy node
#           t-proxy (:26815);
#   one munged, fleet-metasched on 127.0.0.1:26816 (plain HTTP, first-fit),
#   one fleet-agent per cluster as user `fleet`, jobs as `alice` (group
#   fleetusers, JobUserMap=same, the sudo rule of a site). Everything runs
#   inside the chroot, so every Slurm command the agent and the stand-in
#   run (sinfo, squeue --json, sacct, sbatch/scancel/scontrol through sudo)
#   is 24.11's. Both clusters load job_submit_fleet.so and spank_fleet.so
#   built against 24.11's headers (target-compat/, as slurm-24.11.sh).
#   The daemons are the workspace's debug build (FLEET_COMPAT_BIN_DIR, default
#   target/debug: `cargo build --workspace`); bookworm-built binaries run
#   under trixie's newer glibc.
#
# Checks, each PASS/FAIL (exit 1 on any FAIL):
#   a  both agents start (their start-up checks pass on 24.11), the
#      meta-scheduler sees both clusters healthy with the inventory the
#      agents read from 24.11's sinfo (target: h100 x 8);
#   b  an a100 job at the origin stays local and completes;
#   c  an h100 job sbatch'd at the origin as alice becomes a stand-in,
#      runs at the target as alice on the h100 node (not re-forwarded),
#      its stdout/stderr come back to the origin's files and its exit code
#      3 is the stand-in's (ExitCode=3:0, FAILED), at both ends;
#   d  scancel of another forwarded job at the origin cancels its target job;
#   f  `scontrol update Gres=` of a held forwarded job's stand-in is refused,
#      and 24.11 (unlike 22.05) shows the user the plugin's reason; the same
#      update of a held native job is applied (the oracle);
#   e  every daemon is still up.
# Everything started here is stopped by pid (and leftover job processes of
# this test's clusters killed); the bind mounts are undone; the chroot stays.
#
# Needs root. Not part of `make test` (make compat runs it after slurm-24.11.sh).
#   FLEET_COMPAT_BIN_DIR       fleet-agent, fleet-metasched, fleet-proxy,
#                              fleetctl, fleet-ckpt (default: built here, debug, into
#                              target/debug; not FLEET_BIN_DIR, which
#                              the Makefile exports for the lab's release
#                              build)
#   FLEET_COMPAT_FED_PORT_BASE first of the 7 ports (default 26810)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROOT=${FLEET_TRIXIE_DIR:-/var/tmp/fleet-trixie}
MIRROR=${FLEET_TRIXIE_MIRROR:-http://deb.debian.org/debian}
TARGET=${FLEET_COMPAT_TARGET_DIR:-$REPO/target-compat}
BIN=${FLEET_COMPAT_BIN_DIR:-$REPO/target/debug}
PB=${FLEET_COMPAT_FED_PORT_BASE:-26810}
MS_PORT=$((PB + 6))
ACCOUNTING=0 DB_SIDE=host
W=/var/lib/fleet-compat-fed      # the test's directory, as seen inside the chroot
HW=$ROOT$W                       # ... and from the host
PLUGDIR=/usr/lib/x86_64-linux-gnu/slurm-wlm
CLUSTERS=(origin target)
JOB_USER=alice JOB_GROUP=fleetusers FLEET_USER=fleet
T0=$(date +%s)
FAILS=0

log() { echo "[compat-fed $(($(date +%s) - T0))s] $*" >&2; }
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
die() { log "ERROR: $*"; exit 2; }
export FLEET_COMPAT_EXTRA_PACKAGES="sudo"
# shellcheck source=tests/compat/trixie.sh
source "$REPO/tests/compat/trixie.sh"

[[ $(id -u) == 0 ]] || die "run as root (debootstrap, chroot, mknod)"
exec 9>>"$ROOT.lock"
flock -n 9 || die "another run holds $ROOT.lock"

# cluster <name> <field>: ctld port, node, node port, proxy node, proxy port, gpu type, gpus, first job id
cluster() {
  local i=0
  [[ $1 == target ]] && i=1
  case $2 in
    ctld) echo $((PB + 3 * i)) ;;
    node) [[ $1 == origin ]] && echo o-a100 || echo t-h100 ;;
    node_port) echo $((PB + 3 * i + 1)) ;;
    proxy) [[ $1 == origin ]] && echo o-proxy || echo t-proxy ;;
    proxy_port) echo $((PB + 3 * i + 2)) ;;
    gpu) [[ $1 == origin ]] && echo a100 || echo h100 ;;
    gpus) [[ $1 == origin ]] && echo 2 || echo 8 ;;
    first_id) [[ $1 == origin ]] && echo 1000 || echo 5000 ;;
  esac
}
# sl <cluster> CMD...: a Slurm command as root at that cluster.
sl() { local c=$1; shift; inroot env SLURM_CONF=$W/$c/slurm.conf "$@"; }
# as_user <user> <cluster> CMD...: the same as an ordinary user, from their home.
# (numeric ids: the host may have users of the same names with other ids)
as_user() {
  local u=$1 c=$2; shift 2
  chroot --userspec="$(inroot id -u "$u"):$(inroot id -g "$u")" --groups="$(inroot id -G "$u" | tr ' ' ,)" "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin LC_ALL=C TZ=UTC HOME=/home/$u USER=$u LOGNAME=$u \
    SLURM_CONF=$W/$c/slurm.conf sh -c 'cd "$HOME" && exec "$@"' sh "$@"
}
# A job's field from `scontrol show job` (our own job names: no hostile text).
job_field() { sl "$1" scontrol show job "$2" 2>/dev/null | tr ' ' '\n' | sed -n "s|^$3=||p" | head -1; }
# wait_state <cluster> <id> <seconds> <state>...: prints the last state seen.
wait_state() {
  local c=$1 id=$2 secs=$3 st i; shift 3
  for ((i = 0; i < secs * 4; i++)); do
    st=$(job_field "$c" "$id" JobState)
    [[ " $* " == *" $st "* ]] && break
    sleep 0.25
  done
  echo "$st"
}
fleetctl() { "$BIN/fleetctl" --url "http://127.0.0.1:$MS_PORT" --token-file "$HW/secrets/admin.token" "$@"; }
# fleet_of <origin id> <field>: the meta-scheduler's record of that forwarded job.
fleet_of() {
  fleetctl --json jobs 2>/dev/null | python3 -c '
import json, sys
for j in json.load(sys.stdin):
    if j.get("origin_job_id") == int(sys.argv[1]):
        print(j.get(sys.argv[2], "")); break' "$1" "$2"
}
alive() { local p; p=$(pid_of "$1" || true); [[ -n $p && $(cat "/proc/$p/comm" 2>/dev/null) == "$2" ]]; }
# Still starting or running (while chroot and env exec, comm is theirs).
starting() { local p; p=$(pid_of "$1" || true); [[ -n $p && -d /proc/$p && $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) != Z ]]; }

# ---------------------------------------------------------------- teardown
# Processes of this test's jobs (slurmstepd, stand-ins, job scripts): inside
# the chroot with one of our clusters' SLURM_CONF in their environment.
kill_job_processes() {
  local p pid
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [[ $(readlink "$p/root" 2>/dev/null) == "$ROOT" ]] || continue
    { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -q "^SLURM_CONF=$W/" || continue
    kill -KILL "$pid" 2>/dev/null && log "killed leftover job process $pid ($(cat "$p/comm" 2>/dev/null))"
  done
  return 0
}
stop_all() {
  local c
  for c in "${CLUSTERS[@]}"; do stop_pid "$HW/$c/run/agent.pid" fleet-agent; done
  stop_pid "$HW/run/metasched.pid" fleet-metasched
  for c in "${CLUSTERS[@]}"; do
    if alive "$HW/$c/run/slurmctld.pid" slurmctld; then
      sl "$c" scancel --user="$JOB_USER" 2>/dev/null || true
      sl "$c" scancel --user=root 2>/dev/null || true
    fi
  done
  for c in "${CLUSTERS[@]}"; do
    stop_pid "$HW/$c/run/slurmd-$(cluster "$c" node).pid" slurmd
    stop_pid "$HW/$c/run/slurmd-$(cluster "$c" proxy).pid" slurmd
    stop_pid "$HW/$c/run/slurmctld.pid" slurmctld
  done
  kill_job_processes
  stop_pid "$HW/munge/munged.pid" munged
}
teardown() {
  set +e
  [[ -d $HW ]] && stop_all
  umount_root
  log "torn down (chroot kept at $ROOT)"
}
trap teardown EXIT

# ---------------------------------------------------------------- the root, users, binaries
if [[ -z ${FLEET_COMPAT_BIN_DIR:-} ]]; then
  log "building fleet-agent fleet-metasched fleet-proxy fleetctl fleet-ckpt (debug) into $REPO/target"
  (cd "$REPO" && nice cargo build -q -p fleet-agent -p fleet-metasched -p fleet-proxy -p fleetctl -p fleet-ckpt) || die "cargo build failed"
fi
for b in fleet-agent fleet-metasched fleet-proxy fleetctl fleet-ckpt; do
  [[ -x $BIN/$b ]] || die "no $BIN/$b: build the workspace first (cargo build --workspace) or set FLEET_COMPAT_BIN_DIR"
done
make_root
SLURM_PKG=$(inroot dpkg-query -W -f '${Version}' slurmctld)
log "Slurm in the chroot: $SLURM_PKG; Fleet binaries from $BIN"
echo "slurm-package $SLURM_PKG"

log "building the plugins against $ROOT/usr/include into $TARGET"
SLURM_INCLUDE_DIR=$ROOT/usr/include CARGO_TARGET_DIR=$TARGET nice cargo build -q --release -p job-submit-fleet -p spank-fleet
[[ -f $TARGET/release/libjob_submit_fleet.so && -f $TARGET/release/libspank_fleet.so ]] || die "plugins not built"

# The users of a site: the agent's own (a system user), and a researcher in
# the group the agent may run jobs as, with the site's sudo rule.
inroot getent group "$JOB_GROUP" >/dev/null || inroot groupadd "$JOB_GROUP"
inroot id "$FLEET_USER" >/dev/null 2>&1 || inroot useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$FLEET_USER"
inroot id "$JOB_USER" >/dev/null 2>&1 || inroot useradd --create-home --shell /bin/bash --user-group -G "$JOB_GROUP" "$JOB_USER"
cat >"$ROOT/etc/sudoers.d/fleet-compat" <<EOF
Defaults:$FLEET_USER !secure_path
$FLEET_USER ALL=(%$JOB_GROUP) NOPASSWD:SETENV: /usr/bin/sbatch, /usr/bin/scancel, /usr/bin/scontrol
EOF
chmod 0440 "$ROOT/etc/sudoers.d/fleet-compat"
inroot visudo -cf /etc/sudoers.d/fleet-compat >/dev/null || die "the sudoers rule does not parse"
FLEET_UID=$(inroot id -u "$FLEET_USER"); FLEET_GID=$(inroot id -g "$FLEET_USER"); ALICE_UID=$(inroot id -u "$JOB_USER"); ALICE_GID=$(inroot id -g "$JOB_USER")

# A fresh test directory every run.
stop_all 2>/dev/null || true
rm -rf "$HW"
mkdir -p "$HW"/{bin,plugins,run,log}
chmod 0755 "$HW" "$HW/bin" "$HW/plugins"
for b in fleet-agent fleet-metasched fleet-proxy fleetctl fleet-ckpt; do install -m 0755 "$BIN/$b" "$HW/bin/$b"; done
install -m 0755 "$TARGET/release/libjob_submit_fleet.so" "$HW/plugins/job_submit_fleet.so"
install -m 0755 "$TARGET/release/libspank_fleet.so" "$HW/plugins/spank_fleet.so"
install -d -o "$FLEET_UID" -g "$FLEET_GID" -m 0700 "$HW/secrets" "$HW/metasched"
for t in origin target admin; do
  (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$HW/secrets/$t.token")
  chown "$FLEET_UID:$FLEET_GID" "$HW/secrets/$t.token"; chmod 0400 "$HW/secrets/$t.token"
done
chown "$FLEET_UID:$FLEET_GID" "$HW/log"

cat >"$HW/metasched.toml" <<EOF
# Generated by tests/compat/fleet-24.11.sh
listen = "127.0.0.1:$MS_PORT"
state_dir = "$W/metasched"
admin_token_file = "$W/secrets/admin.token"
heartbeat_timeout_s = 10
$(for c in "${CLUSTERS[@]}"; do printf '\n[[clusters]]\nname = "%s"\nregion = "compat-%s"\nprovider = "onprem"\ntoken_file = "%s"\n' "$c" "$c" "$W/secrets/$c.token"; done)
EOF

write_cluster() {
  local c=$1 d=$HW/$1 n p gpu k
  n=$(cluster "$c" node); p=$(cluster "$c" proxy); gpu=$(cluster "$c" gpu); k=$(cluster "$c" gpus)
  mkdir -p "$d"/{state,spool,log,run,dev}
  # Sticky, group fleet: the agent creates its socket here.
  chown "root:$FLEET_GID" "$d"; chmod 1775 "$d"
  install -d -o "$FLEET_UID" -g "$FLEET_GID" -m 0755 "$d/agent"
  for ((i = 0; i < k; i++)); do mknod "$d/dev/nvidia$i" c 195 "$i"; done
  cat >"$d/slurm.conf" <<EOF
# Generated by tests/compat/fleet-24.11.sh — cluster $c (paths inside the chroot $ROOT)
ClusterName=$c
SlurmctldHost=localhost
SlurmctldPort=$(cluster "$c" ctld)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$W/$c/state
SlurmdSpoolDir=$W/$c/spool/%n
SlurmctldPidFile=$W/$c/run/slurmctld.pid
SlurmdPidFile=$W/$c/run/slurmd-%n.pid
SlurmctldLogFile=$W/$c/log/slurmctld.log
SlurmdLogFile=$W/$c/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
MpiDefault=none
FirstJobId=$(cluster "$c" first_id)
MinJobAge=3600
KillWait=5
ReturnToService=2
InactiveLimit=0
Waittime=0
PluginDir=$PLUGDIR:$W/plugins
JobSubmitPlugins=fleet
PlugStackConfig=$W/$c/plugstack.conf
NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(cluster "$c" node_port) CPUs=8 RealMemory=8000 Gres=gpu:$gpu:$k State=UNKNOWN
NodeName=$p NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(cluster "$c" proxy_port) CPUs=16 RealMemory=8000 State=UNKNOWN
PartitionName=gpu Nodes=$n Default=YES MaxTime=INFINITE State=UP
PartitionName=fleet Nodes=$p OverSubscribe=FORCE:64 MaxTime=INFINITE State=UP
EOF
  cat >"$d/gres.conf" <<EOF
AutoDetect=off
NodeName=$n Name=gpu Type=$gpu File=$W/$c/dev/nvidia[0-$((k - 1))]
EOF
  echo "CgroupPlugin=disabled" >"$d/cgroup.conf"   # see README: 24.11's slurmd needs it here
  echo "optional $W/plugins/spank_fleet.so" >"$d/plugstack.conf"
  cat >"$d/fleet.conf" <<EOF
# Generated by tests/compat/fleet-24.11.sh — Fleet site config for $c
SiteName=$c
Region=compat-$c
Provider=onprem
MetaSchedulerUrl=http://127.0.0.1:$MS_PORT
AgentSocket=$W/$c/agent.sock
AgentTokenFile=$W/secrets/$c.token
AgentSpoolDir=$W/$c/agent
ProxyPartition=fleet
ProxyPath=$W/bin/fleet-proxy
SubmitTimeoutMs=${FLEET_COMPAT_SUBMIT_TIMEOUT_MS:-1000}
FailOpen=yes
HeartbeatIntervalMs=1000
PollIntervalMs=300
LeaseMs=15000
SlurmBinDir=/usr/bin
JobUserMap=same
JobUserGroup=$JOB_GROUP
MinJobUid=1000
CkptHelper=$W/bin/fleet-ckpt
EOF
  chmod 0644 "$d"/*.conf
}
for c in "${CLUSTERS[@]}"; do write_cluster "$c"; done

# ---------------------------------------------------------------- start
log "starting munged, fleet-metasched, 2 slurmctld, 4 slurmd inside the chroot"
start_munge "$HW/munge" "$W/munge"
# as_fleet_bg <pidfile> <log> CMD...: a daemon as the fleet user, in the background.
as_fleet_bg() {
  local pf=$1 lf=$2; shift 2
  setsid chroot --userspec="$FLEET_UID:$FLEET_GID" --groups="$FLEET_GID" "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin LC_ALL=C TZ=UTC \
    HOME=/ NO_COLOR=1 RUST_LOG="${RUST_LOG:-info}" "$@" </dev/null >>"$lf" 2>&1 9>&- &
  echo $! >"$pf"
}
as_fleet_bg "$HW/run/metasched.pid" "$HW/log/metasched.log" "$W/bin/fleet-metasched" --config "$W/metasched.toml"
for c in "${CLUSTERS[@]}"; do
  sl "$c" /usr/sbin/slurmctld -f "$W/$c/slurm.conf" </dev/null >>"$HW/$c/log/slurmctld.stderr" 2>&1 9>&- \
    || { tail -n 20 "$HW/$c/log/slurmctld.stderr" "$HW/$c/log/slurmctld.log"; die "slurmctld ($c) did not start"; }
done
for c in "${CLUSTERS[@]}"; do
  for ((i = 0; ; i++)); do
    sl "$c" timeout 5 scontrol ping 2>/dev/null | grep -q UP && break
    ((i < 60)) || { tail -n 30 "$HW/$c/log/slurmctld.log"; die "slurmctld ($c) not answering"; }
    sleep 0.5
  done
  for n in "$(cluster "$c" node)" "$(cluster "$c" proxy)"; do
    sl "$c" /usr/sbin/slurmd -f "$W/$c/slurm.conf" -N "$n" </dev/null >>"$HW/$c/log/slurmd-$n.stderr" 2>&1 9>&- \
      || { tail -n 20 "$HW/$c/log/slurmd-$n.stderr" "$HW/$c/log/slurmd-$n.log"; die "slurmd $n ($c) did not start"; }
  done
done
for c in "${CLUSTERS[@]}"; do
  for ((i = 0; ; i++)); do
    st=$(sl "$c" timeout 5 sinfo -h -N -o '%t' 2>/dev/null | sort -u | paste -sd,)
    [[ $st == idle ]] && break
    ((i < 60)) || { echo "node states at $c: $st"; tail -n 30 "$HW/$c/log/slurmctld.log"; die "nodes of $c not idle"; }
    sleep 0.5
  done
done
for ((i = 0; ; i++)); do
  curl -sf -m 2 "http://127.0.0.1:$MS_PORT/health" >/dev/null 2>&1 && break
  ((i < 60)) && starting "$HW/run/metasched.pid" || { tail -n 30 "$HW/log/metasched.log"; die "fleet-metasched not answering"; }
  sleep 0.5
done
T_SLURM=$(($(date +%s) - T0))
log "clusters up: $(for c in "${CLUSTERS[@]}"; do echo -n "$c[$(sl "$c" sinfo -h -N -o '%N:%P:%G' | paste -sd' ')] "; done)"

# ---------------------------------------------------------------- a. agents
for c in "${CLUSTERS[@]}"; do
  as_fleet_bg "$HW/$c/run/agent.pid" "$HW/$c/log/agent.log" env SLURM_CONF="$W/$c/slurm.conf" "$W/bin/fleet-agent" --conf "$W/$c/fleet.conf"
done
ok=1
for c in "${CLUSTERS[@]}"; do
  for ((i = 0; ; i++)); do
    [[ -S $HW/$c/agent.sock && $(stat -c %u "$HW/$c/agent.sock") == "$FLEET_UID" ]] && break
    if ! starting "$HW/$c/run/agent.pid" || ((i >= 120)); then
      fail "a: fleet-agent ($c) did not start on 24.11:"; tail -n 15 "$HW/$c/log/agent.log"; ok=0; break
    fi
    sleep 0.25
  done
done
((ok)) || die "no agents: the other checks cannot run"
# Ready: each agent's published view has both clusters healthy.
T_AGENTS=$(date +%s)
for c in "${CLUSTERS[@]}"; do
  for ((i = 0; ; i++)); do
    (($(grep -o '"healthy":true' "$HW/$c/agent/view.json" 2>/dev/null | wc -l) >= 2)) && break
    if ((i >= 240)); then
      fail "a: the view of agent $c never has both clusters healthy"; tail -n 15 "$HW/$c/log/agent.log" "$HW/log/metasched.log"; ok=0; break
    fi
    sleep 0.25
  done
done
if ((ok)); then
  pass "a: both real agents started on $SLURM_PKG (start-up checks: sudo as $JOB_USER, proxy partition) and see both clusters healthy after $(($(date +%s) - T_AGENTS)) s"
fi
# The inventory the meta-scheduler holds is what the agents read from 24.11's sinfo.
inv=$(fleetctl --json clusters 2>&1 || true)
# "<cluster>:<type>x<total>/<free>,..." per cluster, from GET /v1/clusters.
pools=$(python3 -c '
import json, sys
v = json.loads(sys.argv[1])
print(" ".join("%s:%s" % (c["name"], ",".join("%sx%d" % (g["gpu_type"], g["total"]) for g in c["gpus"]) or "-")
               for c in sorted(v["clusters"], key=lambda c: c["name"])))' "$inv" 2>/dev/null || echo "unreadable: ${inv:0:300}")
if [[ ${pools,,} == "origin:a100x2 target:h100x8" ]]; then
  pass "a: the meta-scheduler's inventory, from the agents' reading of 24.11's sinfo: $pools"
else
  fail "a: the meta-scheduler's inventory is '$pools', expected origin:a100x2 target:h100x8"
fi

# ---------------------------------------------------------------- b. local job stays local
rm -rf "$ROOT/home/$JOB_USER/fed"; mkdir -p "$ROOT/home/$JOB_USER/fed"; chown "$ALICE_UID:$ALICE_GID" "$ROOT/home/$JOB_USER/fed"
FED=/home/$JOB_USER/fed; HFED=$ROOT$FED
if id=$(as_user "$JOB_USER" origin sbatch --parsable --gres=gpu:a100:1 -J local-a100 -o "$FED/b-%j.out" --wrap 'echo local-ok' 2>&1); then
  st=$(wait_state origin "$id" 60 COMPLETED FAILED CANCELLED)
  if [[ $st == COMPLETED && $(cat "$HFED/b-$id.out" 2>/dev/null) == local-ok && $(job_field origin "$id" Partition) == gpu ]]; then
    pass "b: an a100 job at the origin ($id) stayed local: Partition=gpu $st"
  else
    fail "b: a100 job $id: state $st, partition $(job_field origin "$id" Partition), output '$(cat "$HFED/b-$id.out" 2>/dev/null)'"
  fi
else
  fail "b: sbatch --gres=gpu:a100:1 at the origin refused: $id"
fi

# ---------------------------------------------------------------- c. forwarded, output and exit code
cat >"$HFED/c.sh" <<'EOF'
#!/bin/bash
echo "ran on $SLURM_CLUSTER_NAME node $SLURMD_NODENAME as $(id -un) gpus=$CUDA_VISIBLE_DEVICES"
for i in 1 2 3; do echo line $i; sleep 0.3; done
echo to-stderr >&2
exit 3
EOF
chown "$ALICE_UID:$ALICE_GID" "$HFED/c.sh"
T_C=$(date +%s.%N)
if id=$(as_user "$JOB_USER" origin sbatch --parsable --gres=gpu:h100:8 -J fed-exit3 -o "$FED/c.out" -e "$FED/c.err" "$FED/c.sh" 2>&1); then
  T_SUB=$(date +%s.%N)
  problems=()
  [[ $(job_field origin "$id" Partition) == fleet ]] || problems+=("origin partition $(job_field origin "$id" Partition)")
  adm=$(sl origin scontrol show job "$id" | grep -o 'AdminComment=.*' | head -1)
  [[ $adm == *"-> target"* ]] || problems+=("admin comment '$adm'")
  st=$(wait_state origin "$id" 120 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL)
  T_DONE=$(date +%s.%N)
  ec=$(job_field origin "$id" ExitCode)
  [[ $st == FAILED && $ec == 3:0 ]] || problems+=("origin stand-in $st ExitCode=$ec")
  for ((i = 0; i < 20; i++)); do grep -q 'line 3' "$HFED/c.out" 2>/dev/null && break; sleep 0.25; done
  out=$(cat "$HFED/c.out" 2>/dev/null); err=$(cat "$HFED/c.err" 2>/dev/null)
  [[ $out == "ran on target node t-h100 as $JOB_USER gpus="* && $out == *$'line 1\nline 2\nline 3'* ]] || problems+=("output '$out'")
  [[ $err == *to-stderr* ]] || problems+=("stderr '$err'")
  rid=$(fleet_of "$id" remote_job_id); tgt=$(fleet_of "$id" target)
  [[ $tgt == target && $rid =~ ^[0-9]+$ ]] || problems+=("fleetctl: target '$tgt' remote id '$rid'")
  if [[ $rid =~ ^[0-9]+$ ]]; then
    rshow=$(sl target scontrol show job "$rid" 2>&1)
    grep -q "UserId=$JOB_USER(" <<<"$rshow" || problems+=("target job $rid user: $(grep -o 'UserId=[^ ]*' <<<"$rshow")")
    grep -q 'Partition=gpu ' <<<"$rshow" || problems+=("target job $rid re-forwarded? $(grep -o 'Partition=[^ ]*' <<<"$rshow")")
    grep -q 'ExitCode=3:0' <<<"$rshow" || problems+=("target job $rid $(grep -o 'JobState=[^ ]*\|ExitCode=[^ ]*' <<<"$rshow" | paste -sd' ')")
    grep -q 'gres/gpu:h100:8' <<<"$rshow" || problems+=("target job $rid GPUs: $(grep -o 'TresPerNode=[^ ]*' <<<"$rshow")")
  fi
  if ((${#problems[@]} == 0)); then
    pass "c: h100 job $id at the origin ran at the target as job $rid ($JOB_USER, t-h100, $(grep -o 'TresPerNode=[^ ]*' <<<"$rshow")); origin stand-in FAILED ExitCode=3:0; stdout and stderr relayed; sbatch $(printf '%.2f' "$(echo "$T_SUB - $T_C" | bc)") s, sbatch to done $(printf '%.1f' "$(echo "$T_DONE - $T_C" | bc)") s"
  else
    fail "c: forwarded job $id: ${problems[*]}"
    sl origin scontrol show job "$id"; [[ $rid =~ ^[0-9]+$ ]] && sl target scontrol show job "$rid"
    tail -n 20 "$HW/origin/log/agent.log" "$HW/target/log/agent.log"
  fi
else
  fail "c: sbatch --gres=gpu:h100:8 at the origin refused: $id"
fi

# ---------------------------------------------------------------- d. scancel
if id=$(as_user "$JOB_USER" origin sbatch --parsable --gres=gpu:h100:8 -J fed-cancel -o "$FED/d.out" --wrap 'echo started; sleep 300' 2>&1); then
  for ((i = 0; i < 240; i++)); do grep -q started "$HFED/d.out" 2>/dev/null && break; sleep 0.25; done
  rid=$(fleet_of "$id" remote_job_id)
  rst=$([[ $rid =~ ^[0-9]+$ ]] && job_field target "$rid" JobState)
  if [[ $rst == RUNNING ]]; then
    T_X=$(date +%s.%N)
    sl origin scancel "$id"
    rst=$(wait_state target "$rid" 30 CANCELLED COMPLETED FAILED)
    T_Y=$(date +%s.%N)
    ost=$(wait_state origin "$id" 30 CANCELLED COMPLETED FAILED)
    if [[ $rst == CANCELLED && $ost == CANCELLED ]]; then
      pass "d: scancel $id at the origin cancelled target job $rid in $(printf '%.1f' "$(echo "$T_Y - $T_X" | bc)") s (origin $ost, target $rst)"
    else
      fail "d: after scancel $id at the origin: target job $rid $rst, origin $ost"
    fi
  else
    fail "d: forwarded job $id: output '$(cat "$HFED/d.out" 2>/dev/null)', remote '$rid' state '$rst'"
    tail -n 20 "$HW/origin/log/agent.log" "$HW/target/log/agent.log"
  fi
else
  fail "d: sbatch at the origin refused: $id"
fi

# ---------------------------------------------------------------- f. scontrol update of a stand-in
nat=$(as_user "$JOB_USER" origin sbatch --parsable --hold --gres=gpu:a100:1 -J upd-native -o "$FED/f-native.out" --wrap true 2>&1)
fwd=$(as_user "$JOB_USER" origin sbatch --parsable --hold --gres=gpu:h100:8 -J upd-fleet -o "$FED/f-fleet.out" --wrap true 2>&1)
if [[ $nat =~ ^[0-9]+$ && $fwd =~ ^[0-9]+$ ]]; then
  T_F=$(date +%s.%N)
  for ((i = 0; i < 40; i++)); do grep -qx "$fwd" "$HW/origin/agent/stand-ins" 2>/dev/null && break; sleep 0.25; done
  T_L=$(date +%s.%N)
  problems=()
  grep -qx "$fwd" "$HW/origin/agent/stand-ins" 2>/dev/null || problems+=("stand-in $fwd never listed: '$(cat "$HW/origin/agent/stand-ins" 2>&1)'")
  n_out=$(as_user "$JOB_USER" origin scontrol update "JobId=$nat" Gres=gpu:a100:2 2>&1) || problems+=("native update refused: $n_out")
  [[ $(job_field origin "$nat" TresPerNode) == *a100:2* ]] || problems+=("native job not updated: $(job_field origin "$nat" TresPerNode)")
  if f_out=$(as_user "$JOB_USER" origin scontrol update "JobId=$fwd" Gres=gpu:a100:2 2>&1); then
    problems+=("the stand-in's update was accepted")
  fi
  [[ $f_out == *"runs at another cluster through Fleet"* ]] || problems+=("the user was not told why: '$f_out'")
  [[ $(job_field origin "$fwd" Partition) == fleet ]] || problems+=("stand-in moved to $(job_field origin "$fwd" Partition)")
  if ((${#problems[@]} == 0)); then
    pass "f: the stand-in's Gres update was refused, the user told: '$f_out'; the native job's applied; listed $(printf '%.1f' "$(echo "$T_L - $T_F" | bc)") s after sbatch"
  else
    fail "f: ${problems[*]}"
  fi
  sl origin scancel "$nat" "$fwd"
else
  fail "f: sbatch --hold at the origin refused: '$nat' '$fwd'"
fi

# ---------------------------------------------------------------- e. still up
down=()
alive "$HW/run/metasched.pid" fleet-metasched || down+=(fleet-metasched)
for c in "${CLUSTERS[@]}"; do
  alive "$HW/$c/run/agent.pid" fleet-agent || down+=("fleet-agent($c)")
  alive "$HW/$c/run/slurmctld.pid" slurmctld || down+=("slurmctld($c)")
done
if ((${#down[@]} == 0)); then pass "e: the meta-scheduler, both agents and both slurmctld are still up"
else fail "e: died during the checks: ${down[*]}"; fi
errs=$(cat "$HW"/*/log/agent.log | grep -c ' ERROR ' || true)
log "agent log ERROR lines: $errs; WARN lines: $(cat "$HW"/*/log/agent.log | grep -c ' WARN ' || true)"
cat "$HW"/*/log/agent.log | grep ' ERROR \| WARN ' | sed 's/^/  /' | head -20 >&2 || true
log "logs in $HW (origin/log, target/log, log); $FAILS failure(s); cluster start ${T_SLURM}s, total $(($(date +%s) - T0))s"
exit $((FAILS > 0))
