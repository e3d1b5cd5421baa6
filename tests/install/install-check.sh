#!/usr/bin/env bash
# Install Fleet as an admin would and check what lands where.
#
#   tests/install/install-check.sh [--fast]
#
# Always (--fast, part of `make test`): `make install DESTDIR=<scratch>` with
# PREFIX=/usr and PREFIX=/usr/local, then checks names, modes, the plugins'
# Slurm symbols, the units (systemd-analyze verify when available, and the
# sandboxing each daemon can live with), the sudoers rule (visudo -c), the
# paths the configs name, and that a re-install keeps an edited config.
# Without --fast (`make install-check`): also `make deb` and the contents,
# modes, conffiles, dependencies and maintainer scripts of each .deb.
#
# Uses the binaries of FLEET_BIN_DIR (default target/release: `make build`);
# the packages are built with DEB_PROFILE (default release; `dev` with
# FLEET_BIN_DIR=target/debug checks a debug build quickly).
set -euo pipefail
cd "$(dirname "$0")/../.."
FAST=0
[[ ${1:-} == --fast ]] && FAST=1

BIN=${FLEET_BIN_DIR:-$(pwd)/target/release}
TMP=$(mktemp -d /tmp/fleet-install-check.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
check() { # description, command...
  local what=$1; shift
  if "$@" >"$TMP/out" 2>&1; then ok "$what"; else bad "$what: $(head -c 400 "$TMP/out")"; fi
}
mode_is() { # path mode
  [[ -e $1 ]] || { echo "missing: $1"; return 1; }
  local m; m=$(stat -c %a "$1")
  [[ $m == "$2" ]] || { echo "$1 has mode $m, expected $2"; return 1; }
}
exports() { # lib symbol...
  local lib=$1; shift
  local syms; syms=$(nm -D --defined-only "$lib" | awk '{print $3}')
  for s in "$@"; do grep -qx "$s" <<<"$syms" || { echo "$lib does not export $s"; return 1; }; done
}

# Slurm's own plugins' directory, as the Makefile finds it.
PLUGDIR=$(make -s --no-print-directory --eval 'show-plugin-dir: ; @echo $(SLURM_PLUGIN_DIR)' show-plugin-dir)
if own=$(dpkg -L slurm-wlm-basic-plugins 2>/dev/null | grep -m1 '/job_submit_[a-z_]*\.so$'); then
  check "SLURM_PLUGIN_DIR ($PLUGDIR) is where Slurm's own plugins are" test "$PLUGDIR" = "$(dirname "$own")"
fi

# ---- make install, PREFIX=/usr -------------------------------------------
D=$TMP/root
make -s --no-print-directory install DESTDIR="$D" PREFIX=/usr FLEET_BIN_DIR="$BIN" >"$TMP/install.log" 2>&1 \
  || { cat "$TMP/install.log"; echo "FAIL make install"; exit 1; }
ok "make install DESTDIR=$D PREFIX=/usr"

check "job_submit_fleet.so under Slurm's name, 0644" mode_is "$D$PLUGDIR/job_submit_fleet.so" 644
check "spank_fleet.so under Slurm's name, 0644" mode_is "$D$PLUGDIR/spank_fleet.so" 644
check "no lib*.so names in the plugin dir" bash -c "! ls '$D$PLUGDIR' | grep -q '^lib'"
check "job_submit_fleet.so is the job_submit plugin" exports "$D$PLUGDIR/job_submit_fleet.so" plugin_name plugin_type plugin_version job_submit job_modify
check "spank_fleet.so is the SPANK plugin" exports "$D$PLUGDIR/spank_fleet.so" plugin_name plugin_type plugin_version slurm_spank_init
for f in usr/sbin/fleet-agent usr/sbin/fleet-metasched usr/bin/fleetctl usr/bin/fleet-ckpt usr/libexec/fleet/fleet-proxy; do
  check "/$f, 0755" mode_is "$D/$f" 755
done
check "fleet-agent --version runs" "$D/usr/sbin/fleet-agent" --version
check "fleetctl --version runs" "$D/usr/bin/fleetctl" --version
check "fleet-ckpt --version runs" "$D/usr/bin/fleet-ckpt" --version
check "fleet-ckpt restore without a checkpoint exits 3 (start from scratch)" bash -c "d=\$(mktemp -d); '$D/usr/bin/fleet-ckpt' restore \"\$d/out\" --url \"file://\$d/none\" 2>/dev/null; rc=\$?; rm -rf \"\$d\"; [ \$rc = 3 ]"
for u in fleet-agent fleet-metasched; do
  check "$u.service, 0644" mode_is "$D/usr/lib/systemd/system/$u.service" 644
done
check "/etc/slurm/fleet.conf, 0644" mode_is "$D/etc/slurm/fleet.conf" 644
check "/etc/fleet/metasched.toml, 0644" mode_is "$D/etc/fleet/metasched.toml" 644
check "/etc/sudoers.d/fleet-agent, 0440" mode_is "$D/etc/sudoers.d/fleet-agent" 440
check "/etc/slurm/plugstack.conf.d/fleet.conf, 0644" mode_is "$D/etc/slurm/plugstack.conf.d/fleet.conf" 644
check "examples in /usr/share/doc/fleet/examples" test -f "$D/usr/share/doc/fleet/examples/fleet.conf"

# What the configs and units name exists in the tree.
spank=$(awk '$1 == "optional" {print $2}' "$D/etc/slurm/plugstack.conf.d/fleet.conf")
check "plugstack.conf.d names the installed spank_fleet.so ($spank)" test -f "$D$spank"
proxy=$(sed -n 's/^ProxyPath=//p' "$D/etc/slurm/fleet.conf")
check "fleet.conf's ProxyPath ($proxy) is installed" test -x "$D$proxy"
helper=$(sed -n 's/^CkptHelper=//p' "$D/etc/slurm/fleet.conf")
check "fleet.conf's CkptHelper ($helper) is the installed fleet-ckpt" test -x "$D$helper"
spool=$(sed -n 's/^AgentSpoolDir=//p' "$D/etc/slurm/fleet.conf")
check "fleet.conf's AgentSpoolDir is the unit's StateDirectory" test "$spool" = /var/lib/fleet
sock=$(sed -n 's/^AgentSocket=//p' "$D/etc/slurm/fleet.conf")
check "fleet.conf's AgentSocket is in the unit's RuntimeDirectory" test "$(dirname "$sock")" = /run/fleet
check "metasched.toml's state_dir is the unit's StateDirectory" grep -qx 'state_dir = "/var/lib/fleet-metasched"' "$D/etc/fleet/metasched.toml"
unit() { sed -n "s/^$2=//p" "$D/usr/lib/systemd/system/$1.service" | tail -1; }
for u in fleet-agent fleet-metasched; do
  exe=$(unit $u ExecStart | awk '{print $1}')
  check "$u.service runs the installed $exe" test -x "$D$exe"
  check "$u.service: ProtectSystem=strict" test "$(unit $u ProtectSystem)" = strict
done
check "fleet-agent.service: User=fleet" test "$(unit fleet-agent User)" = fleet
check "fleet-metasched.service: User=fleet-metasched" test "$(unit fleet-metasched User)" = fleet-metasched
check "fleet-agent.service: after slurmctld" grep -q '^After=.*slurmctld.service' "$D/usr/lib/systemd/system/fleet-agent.service"
check "fleet-agent.service: sudo works (no NoNewPrivileges)" test "$(unit fleet-agent NoNewPrivileges)" = no
for k in SystemCallFilter RestrictAddressFamilies PrivateDevices MemoryDenyWriteExecute LockPersonality RestrictSUIDSGID; do
  check "fleet-agent.service: no $k (it implies NoNewPrivileges)" test -z "$(unit fleet-agent $k)"
done
check "fleet-agent.service: spool and socket dirs 0711 (RunAsUser, SlurmUser traverse)" \
  test "$(unit fleet-agent StateDirectoryMode) $(unit fleet-agent RuntimeDirectoryMode)" = "0711 0711"
check "fleet-metasched.service: NoNewPrivileges, state dir 0700" \
  test "$(unit fleet-metasched NoNewPrivileges) $(unit fleet-metasched StateDirectoryMode)" = "yes 0700"
check "units log plain text (NO_COLOR)" grep -q 'NO_COLOR=1' "$D/usr/lib/systemd/system/fleet-agent.service" "$D/usr/lib/systemd/system/fleet-metasched.service"
if command -v systemd-analyze >/dev/null; then
  for u in fleet-agent fleet-metasched; do
    # verify resolves ExecStart on this host: point it into the tree.
    sed "s|^ExecStart=/|ExecStart=$D/|" "$D/usr/lib/systemd/system/$u.service" > "$TMP/$u.service"
    systemd-analyze verify --man=no "$TMP/$u.service" >"$TMP/verify" 2>&1 || true
    check "systemd-analyze verify $u.service: no complaint" bash -c "! grep -v '^\$' '$TMP/verify' | grep -q ."
    [[ -s $TMP/verify ]] && sed 's/^/     /' "$TMP/verify"
  done
else
  echo "skip systemd-analyze verify (not installed)"
fi
if command -v visudo >/dev/null; then
  check "the sudoers rule parses (visudo -c)" visudo -cf "$D/etc/sudoers.d/fleet-agent"
fi
check "the sudoers rule allows sbatch, scancel and scontrol as members of fleetusers, nothing else" \
  grep -qx 'fleet ALL=(%fleetusers) NOPASSWD:SETENV: /usr/bin/sbatch, /usr/bin/scancel, /usr/bin/scontrol' "$D/etc/sudoers.d/fleet-agent"

# ---- a re-install keeps an admin's edits --------------------------------
echo "# edited by the admin" >> "$D/etc/slurm/fleet.conf"
sum=$(md5sum < "$D/etc/slurm/fleet.conf")
make -s --no-print-directory install DESTDIR="$D" PREFIX=/usr FLEET_BIN_DIR="$BIN" >"$TMP/install2.log" 2>&1
check "re-install keeps the edited fleet.conf" test "$(md5sum < "$D/etc/slurm/fleet.conf")" = "$sum"
check "re-install says it kept it" grep -q '/etc/slurm/fleet.conf exists: kept' "$TMP/install2.log"

# ---- PREFIX=/usr/local ----------------------------------------------------
L=$TMP/local
make -s --no-print-directory install DESTDIR="$L" PREFIX=/usr/local FLEET_BIN_DIR="$BIN" >/dev/null 2>&1 \
  || { echo "FAIL make install PREFIX=/usr/local"; exit 1; }
check "PREFIX=/usr/local: units run /usr/local/sbin/*" grep -qx 'ExecStart=/usr/local/sbin/fleet-agent --conf /etc/slurm/fleet.conf' "$L/usr/local/lib/systemd/system/fleet-agent.service"
check "PREFIX=/usr/local: ProxyPath follows" grep -qx 'ProxyPath=/usr/local/libexec/fleet/fleet-proxy' "$L/etc/slurm/fleet.conf"
check "PREFIX=/usr/local: CkptHelper follows (an installed fleet-ckpt)" bash -c "grep -qx 'CkptHelper=/usr/local/bin/fleet-ckpt' '$L/etc/slurm/fleet.conf' && test -x '$L/usr/local/bin/fleet-ckpt'"
check "PREFIX=/usr/local: the plugins still go to Slurm's dir" test -f "$L$PLUGDIR/job_submit_fleet.so"
nobin() {
  ! make -s --no-print-directory install DESTDIR="$TMP/x" FLEET_BIN_DIR="$TMP/nothing" >"$TMP/nobin" 2>&1 \
    && grep -q 'not built in .*libjob_submit_fleet.so' "$TMP/nobin"
}
check "make install without binaries fails, naming what is missing" nobin

# ---- Debian packages -----------------------------------------------------
if ((FAST == 0)); then
  DEBS=$TMP/debs
  make -s --no-print-directory deb DEB_DIR="$DEBS" >"$TMP/deb.log" 2>&1 || { tail -30 "$TMP/deb.log"; echo "FAIL make deb"; exit 1; }
  ok "make deb"
  deb() { ls "$DEBS"/"$1"_*.deb 2>/dev/null | head -1; }
  has() { # deb mode path
    dpkg-deb -c "$1" | awk -v m="$2" -v p="./$3" '$6 == p && $1 ~ m {f=1} END {exit !f}' || { echo "$(basename "$1"): no $3 with mode $2"; return 1; }
  }
  P=$(deb fleet-slurm-plugins); A=$(deb fleet-agent); X=$(deb fleet-proxy); M=$(deb fleet-metasched); K=$(deb fleet-ckpt)
  for d in "$P" "$A" "$X" "$M" "$K"; do [[ -n $d ]] || bad "a .deb is missing in $DEBS: $(ls "$DEBS")"; done
  pd=${PLUGDIR#/}
  check "fleet-slurm-plugins: job_submit_fleet.so" has "$P" '^-rw-r--r--' "$pd/job_submit_fleet.so"
  check "fleet-slurm-plugins: spank_fleet.so" has "$P" '^-rw-r--r--' "$pd/spank_fleet.so"
  check "fleet-slurm-plugins: plugstack.conf.d/fleet.conf" has "$P" '^-rw-r--r--' etc/slurm/plugstack.conf.d/fleet.conf
  check "fleet-slurm-plugins: no lib*.so" bash -c "! dpkg-deb -c '$P' | grep -q '/lib[a-z_]*fleet.so'"
  check "fleet-slurm-plugins: depends on the Slurm it was built for" bash -c "dpkg-deb -f '$P' Depends | grep -q 'slurm-wlm-basic-plugins (>= 22.05)'"
  check "fleet-agent: /usr/sbin/fleet-agent" has "$A" '^-rwxr-xr-x' usr/sbin/fleet-agent
  check "fleet-agent: the unit" has "$A" '^-rw-r--r--' usr/lib/systemd/system/fleet-agent.service
  check "fleet-agent: fleet.conf" has "$A" '^-rw-r--r--' etc/slurm/fleet.conf
  check "fleet-agent: sudoers, 0440" has "$A" '^-r--r-----' etc/sudoers.d/fleet-agent
  check "fleet-agent: conffiles" bash -c "dpkg-deb -I '$A' conffiles | grep -qx /etc/slurm/fleet.conf && dpkg-deb -I '$A' conffiles | grep -qx /etc/sudoers.d/fleet-agent"
  check "fleet-agent: postinst makes the user fleet and the group fleetusers" bash -c "dpkg-deb -I '$A' postinst | grep -q 'adduser --system --group --home /var/lib/fleet ' && dpkg-deb -I '$A' postinst | grep -q 'addgroup --system fleetusers'"
  check "fleet-agent: depends on sudo and adduser" bash -c "dpkg-deb -f '$A' Depends | grep -q sudo && dpkg-deb -f '$A' Depends | grep -q adduser"
  check "fleet-proxy: /usr/libexec/fleet/fleet-proxy" has "$X" '^-rwxr-xr-x' usr/libexec/fleet/fleet-proxy
  check "fleet-metasched: daemon and fleetctl" bash -c "dpkg-deb -c '$M' | grep -q ' ./usr/sbin/fleet-metasched$' && dpkg-deb -c '$M' | grep -q ' ./usr/bin/fleetctl$'"
  check "fleet-ckpt: /usr/bin/fleet-ckpt" has "$K" '^-rwxr-xr-x' usr/bin/fleet-ckpt
  check "fleet-metasched: the unit" has "$M" '^-rw-r--r--' usr/lib/systemd/system/fleet-metasched.service
  check "fleet-metasched: metasched.toml is a conffile" bash -c "dpkg-deb -I '$M' conffiles | grep -qx /etc/fleet/metasched.toml"
  check "fleet-metasched: postinst makes fleet-metasched and the admin token" bash -c "dpkg-deb -I '$M' postinst | grep -q 'adduser --system --group --home /var/lib/fleet-metasched' && dpkg-deb -I '$M' postinst | grep -q admin.token"
  for d in "$A" "$M"; do
    check "$(basename "$d"): postinst is valid sh" bash -c "dpkg-deb -I '$d' postinst | sh -n"
  done
fi

if ((FAILS)); then echo "install-check: $FAILS failed"; exit 1; fi
echo "install-check: all passed"
