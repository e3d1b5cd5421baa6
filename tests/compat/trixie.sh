# tests/compat/trixie.sh — sourced by slurm-24.11.sh and fleet-24.11.sh:
# the debootstrap'ed Debian trixie root both run Slurm 24.11 in, its bind
# mounts, its own munged, and stopping what they started by pid.
#
# The caller defines log and die, ROOT (the chroot), MIRROR, ACCOUNTING
# (1: slurmdbd + mariadb-server too), DB_SIDE (host|chroot), and calls
# make_root, then start_munge <dir seen from the host> <same dir seen in
# the chroot>; its teardown calls stop_pid for each daemon, and
# umount_root.
#   FLEET_COMPAT_EXTRA_PACKAGES  more packages the caller needs in the root
#                                (installed once; a marker file per set)

inroot() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C TZ=UTC HOME=/root ${SLURM_CONF_IN:+SLURM_CONF=$SLURM_CONF_IN} "$@"; }
apt_in() { inroot env DEBIAN_FRONTEND=noninteractive nice apt-get -q -y "$@"; }

mounted=()
mount_root() {
  local m
  for m in proc sys dev; do
    if ! mountpoint -q "$ROOT/$m"; then
      mount --bind "/$m" "$ROOT/$m"
      mounted+=("$ROOT/$m")
    fi
  done
}
umount_root() {
  local p
  for p in "${mounted[@]}"; do umount "$p" || umount -l "$p"; done
  mounted=()
}

make_root() {
  if [[ ! -e $ROOT/.fleet-debootstrap-done ]]; then
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    log "debootstrap trixie (minbase) into $ROOT"
    mkdir -p "$ROOT"
    nice debootstrap --variant=minbase trixie "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 \
      || { tail -n 20 "$ROOT.debootstrap.log"; die "debootstrap failed"; }
    touch "$ROOT/.fleet-debootstrap-done"
  fi
  printf '#!/bin/sh\n# tests/compat: never start services inside this chroot\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
  chmod 0755 "$ROOT/usr/sbin/policy-rc.d"
  grep -q localhost "$ROOT/etc/hosts" 2>/dev/null || printf '127.0.0.1 localhost\n::1 localhost\n' >>"$ROOT/etc/hosts"
  grep -qw "$(hostname)" "$ROOT/etc/hosts" || echo "127.0.1.1 $(hostname)" >>"$ROOT/etc/hosts"  # munged's origin lookup
  mount_root
  if [[ ! -e $ROOT/.fleet-packages-done ]]; then
    log "apt-get install slurmctld slurmd slurm-client munge libslurm-dev (inside the chroot)"
    apt_in update >"$ROOT.apt.log" 2>&1 || { tail -n 20 "$ROOT.apt.log"; die "apt-get update failed"; }
    apt_in install --no-install-recommends slurmctld slurmd slurm-client munge libslurm-dev >>"$ROOT.apt.log" 2>&1 \
      || { tail -n 20 "$ROOT.apt.log"; die "apt-get install failed"; }
    touch "$ROOT/.fleet-packages-done"
  fi
  if [[ $ACCOUNTING == 1 && ! -e $ROOT/.fleet-accounting-packages-done ]]; then
    log "apt-get install slurmdbd mariadb-server (inside the chroot)"
    apt_in update >>"$ROOT.apt.log" 2>&1 || { tail -n 20 "$ROOT.apt.log"; die "apt-get update failed"; }
    apt_in install --no-install-recommends slurmdbd mariadb-server >>"$ROOT.apt.log" 2>&1 \
      || { tail -n 20 "$ROOT.apt.log"; die "apt-get install slurmdbd mariadb-server failed"; }
    touch "$ROOT/.fleet-accounting-packages-done"
  fi
  local extra=${FLEET_COMPAT_EXTRA_PACKAGES:-}
  if [[ -n $extra && ! -e $ROOT/.fleet-packages-${extra// /+}-done ]]; then
    log "apt-get install $extra (inside the chroot)"
    apt_in update >>"$ROOT.apt.log" 2>&1 || { tail -n 20 "$ROOT.apt.log"; die "apt-get update failed"; }
    # shellcheck disable=SC2086  # a list of package names
    apt_in install --no-install-recommends $extra >>"$ROOT.apt.log" 2>&1 \
      || { tail -n 20 "$ROOT.apt.log"; die "apt-get install $extra failed"; }
    touch "$ROOT/.fleet-packages-${extra// /+}-done"
  fi
  if [[ $ACCOUNTING == 1 && $DB_SIDE == host ]] && ! command -v mariadbd >/dev/null; then
    log "apt-get install mariadb-server (on the host, for the accounting database)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mariadb-server >/dev/null \
      || die "apt-get install mariadb-server failed"
  fi
}

pid_of() { [[ -f $1 ]] && tr -dc '0-9' <"$1"; }
# stop_pid <pidfile> <comm>: TERM the pid if it is still that program, then KILL.
stop_pid() {
  local pid i
  pid=$(pid_of "$1" || true)
  [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm") == "$2" ]] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do [[ -d /proc/$pid ]] || return 0; sleep 0.1; done
  log "$2 (pid $pid) still up 20 s after SIGTERM: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

# start_munge <host dir> <chroot dir>: the chroot's own munged (key and
# socket under the chroot's /etc/munge and /run/munge, never the host's);
# its pid file is <dir>/munged.pid.
start_munge() {
  local hdir=$1 dir=$2 uid gid i
  uid=$(inroot id -u munge); gid=$(inroot id -g munge)
  mkdir -p "$ROOT/run/munge" "$ROOT/etc/munge" "$ROOT/var/lib/munge" "$ROOT/var/log/munge"
  chown "$uid:$gid" "$ROOT/run/munge" "$ROOT/etc/munge" "$ROOT/var/lib/munge" "$ROOT/var/log/munge"
  chmod 0755 "$ROOT/run/munge"; chmod 0700 "$ROOT/etc/munge" "$ROOT/var/lib/munge" "$ROOT/var/log/munge"
  if [[ ! -s $ROOT/etc/munge/munge.key ]]; then
    (umask 077; dd if=/dev/urandom of="$ROOT/etc/munge/munge.key" bs=1024 count=1 status=none)
    chown "$uid:$gid" "$ROOT/etc/munge/munge.key"
  fi
  install -d -o "$uid" -g "$gid" -m 0700 "$hdir"
  chroot --userspec="$uid:$gid" "$ROOT" /usr/sbin/munged --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --force 9>&- \
    || die "munged failed: $(tail -n 5 "$hdir/munged.log" 2>/dev/null)"
  for ((i = 0; i < 50; i++)); do [[ -S $ROOT/run/munge/munge.socket.2 ]] && break; sleep 0.1; done
  inroot sh -c 'munge -n | unmunge >/dev/null' || die "munge does not work inside the chroot"
}
