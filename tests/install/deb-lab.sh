#!/usr/bin/env bash
# `make deb-lab`: the Debian packages, installed, run a federated job.
#
# 1. `make deb` (DEB_PROFILE, default release; `dev` packages the debug
#    build, quick when target/debug is built).
# 2. Each .deb unpacked into one fresh root (`dpkg-deb -x`: the files dpkg
#    would install, without touching this host's /usr, which every lab's
#    slurmctld reads); the plugins must be in that root's copy of Slurm's
#    plugin directory under Slurm's names.
# 3. The packaged systemd units checked with `systemd-analyze verify`
#    (ExecStart pointed into the root), when systemd-analyze exists.
# 4. A lab (tests/lab/lab.sh, FLEET_LAB_INSTALLED=<root>) whose programs are
#    the unpacked ones and whose slurmctld, slurmd and sbatch load
#    job_submit_fleet.so and spank_fleet.so from the root's plugin
#    directory; checked in slurmctld's memory map.
# 5. A GPU job submitted at beta as a researcher, that beta cannot run: it
#    runs at alpha and its output and exit code come back to beta.
#
# The lab lives in FLEET_DEB_LAB_DIR (default /tmp/fleet-lab-deb) with ports
# shifted by FLEET_DEB_LAB_PORT_OFFSET (default 2000), so it runs beside the
# labs of `make test`; it is torn down afterwards (FLEET_KEEP_LAB=1 keeps
# it and the root). Exits non-zero on the first failed check. Not part of
# `make test`: building release packages takes several minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
export FLEET_LAB_DIR=${FLEET_DEB_LAB_DIR:-/tmp/fleet-lab-deb}
export FLEET_LAB_PORT_OFFSET=${FLEET_DEB_LAB_PORT_OFFSET:-2000}
export FLEET_LAB_KUBE=0 FLEET_LAB_S3=0
DEB_PROFILE=${DEB_PROFILE:-release}
LAB=tests/lab/lab.sh
USER_=${FLEET_DEB_LAB_USER:-alice}
T0=$SECONDS

ROOT=$(mktemp -d /tmp/fleet-deb-root.XXXXXX)
# Stand-ins run the unpacked fleet-proxy as the job's user.
chmod 0755 "$ROOT"
WORK=$ROOT.work
mkdir -p "$WORK"
cleanup() {
  local rc=$?
  if [[ ${FLEET_KEEP_LAB:-0} == 1 ]]; then
    echo "[deb-lab] FLEET_KEEP_LAB=1: leaving the lab ($FLEET_LAB_DIR) and $ROOT" >&2
  else
    FLEET_LAB_INSTALLED=$ROOT "$LAB" down >/dev/null 2>&1 || true
    rm -rf "$ROOT" "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ok() { echo "[deb-lab] ok   $*"; }
fail() { echo "[deb-lab] FAIL $*" >&2; exit 1; }

# ---- 1. the packages -----------------------------------------------------
# --fast: quicker compression (xz of debug builds takes minutes); these
# packages are unpacked and thrown away.
make -s --no-print-directory deb DEB_DIR="$WORK/debs" DEB_PROFILE="$DEB_PROFILE" DEB_FLAGS="${DEB_FLAGS---fast}" \
  >"$WORK/deb.log" 2>&1 || { tail -30 "$WORK/deb.log"; fail "make deb"; }
mapfile -t DEBS < <(ls "$WORK"/debs/*.deb)
for p in fleet-slurm-plugins fleet-agent fleet-proxy fleet-metasched fleet-ckpt; do
  ls "$WORK/debs/${p}_"*.deb >/dev/null 2>&1 || fail "make deb built no $p package"
done
ok "make deb (DEB_PROFILE=$DEB_PROFILE): ${#DEBS[@]} packages"

# ---- 2. unpacked into a fresh root ---------------------------------------
for d in "${DEBS[@]}"; do dpkg-deb -x "$d" "$ROOT"; done
PLUGDIR=$(make -s --no-print-directory --eval 'show-plugin-dir: ; @echo $(SLURM_PLUGIN_DIR)' show-plugin-dir)
for f in job_submit_fleet.so spank_fleet.so; do
  [[ -f $ROOT$PLUGDIR/$f ]] || fail "no $PLUGDIR/$f in the packages"
done
ok "plugins under Slurm's names in $PLUGDIR"
spank=$(awk '$1 == "optional" {print $2}' "$ROOT/etc/slurm/plugstack.conf.d/fleet.conf")
[[ $spank == "$PLUGDIR/spank_fleet.so" ]] || fail "plugstack.conf.d names $spank, not $PLUGDIR/spank_fleet.so"
ok "plugstack.conf.d names the packaged spank_fleet.so"

# ---- 3. the systemd units ------------------------------------------------
UNITS=()
for u in fleet-agent fleet-metasched; do
  f=
  for c in "$ROOT/usr/lib/systemd/system/$u.service" "$ROOT/lib/systemd/system/$u.service"; do
    [[ -f $c ]] && { f=$c; break; }
  done
  [[ -n $f ]] || fail "no $u.service in the packages"
  UNITS+=("$f")
  exe=$(sed -n 's/^ExecStart=//p' "$f" | tail -1 | awk '{print $1}')
  [[ -x $ROOT$exe ]] || fail "$u.service runs $exe, which the packages do not install"
done
if command -v systemd-analyze >/dev/null; then
  for f in "${UNITS[@]}"; do
    # verify resolves ExecStart on this host: point it into the root.
    sed "s|^ExecStart=/|ExecStart=$ROOT/|" "$f" >"$WORK/$(basename "$f")"
    systemd-analyze verify --man=no "$WORK/$(basename "$f")" >"$WORK/verify" 2>&1 || true
    if grep -v '^$' "$WORK/verify" | grep -q .; then cat "$WORK/verify" >&2; fail "systemd-analyze verify $(basename "$f")"; fi
  done
  ok "systemd-analyze verify: ${#UNITS[@]} units, no complaint"
else
  echo "[deb-lab] skip systemd-analyze verify (not installed)"
fi

# ---- 4. a lab running the unpacked programs and plugins ------------------
FLEET_LAB_INSTALLED=$ROOT "$LAB" up >"$WORK/lab-up.log" 2>&1 || { tail -30 "$WORK/lab-up.log"; fail "lab up"; }
for b in fleet-agent fleet-proxy fleet-metasched fleetctl fleet-ckpt; do
  t=$(readlink "$FLEET_LAB_DIR/bin/$b")
  [[ $t == "$ROOT"/* ]] || fail "the lab's $b is $t, not the packaged one"
done
pid=$(cat "$FLEET_LAB_DIR/beta/run/slurmctld.pid")
grep -q " $ROOT$PLUGDIR/job_submit_fleet.so\$" "/proc/$pid/maps" \
  || fail "beta's slurmctld (pid $pid) has not loaded $ROOT$PLUGDIR/job_submit_fleet.so"
ok "lab up in $((SECONDS - T0)) s; beta's slurmctld runs the packaged job_submit_fleet.so"

# ---- 5. a federated job --------------------------------------------------
out=$WORK/job
install -d -o "$USER_" -m 0755 "$out"
conf=$FLEET_LAB_DIR/beta/slurm.conf
id=$(printf '#!/bin/bash\necho "ran at $SLURM_CLUSTER_NAME"\nexit 3\n' \
  | SLURM_CONF=$conf setpriv --reuid="$USER_" --regid="$USER_" --init-groups \
    env HOME="/home/$USER_" sbatch --parsable --gres=gpu:h100:1 -t 5 --output="$out/out.txt") \
  || fail "sbatch at beta"
part=$(SLURM_CONF=$conf scontrol -o show job "$id" | grep -o 'Partition=[^ ]*')
[[ $part == Partition=fleet ]] || fail "job $id at beta: $part, expected the stand-in's Partition=fleet"
state=
for _ in $(seq 600); do
  line=$(SLURM_CONF=$conf scontrol -o show job "$id")
  state=$(grep -o 'JobState=[A-Z_]*' <<<"$line" | cut -d= -f2)
  case $state in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) break ;; esac
  sleep 0.5
done
exit_code=$(grep -o 'ExitCode=[0-9:]*' <<<"$line" | cut -d= -f2)
[[ $state == FAILED && $exit_code == 3:0 ]] || fail "job $id ended $state $exit_code, expected FAILED 3:0 (its exit 3)"
text=$(cat "$out/out.txt" 2>/dev/null || true)
[[ $text == "ran at alpha" ]] || fail "job $id's output: '$text', expected 'ran at alpha'"
target=$("$LAB" fleetctl --json jobs 2>/dev/null | python3 -c "
import json, sys
print(next((j.get('target') or '') for j in json.load(sys.stdin) if j.get('origin_job_id') == $id))")
[[ $target == alpha ]] || fail "fleetctl (packaged) says job $id ran at '$target'"
ok "job $id: sbatch at beta -> ran at alpha, output and exit code 3 back at beta"
echo "[deb-lab] passed in $((SECONDS - T0)) s"
