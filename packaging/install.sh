#!/usr/bin/env bash
# `make install`: Fleet's plugins, binaries, systemd units and configs.
#
#   make install [PREFIX=/usr/local] [DESTDIR=] [SLURM_PLUGIN_DIR=...] [SYSCONFDIR=/etc]
#
# Every variable below comes from the Makefile's environment. Configs in
# SYSCONFDIR are installed only where absent (an admin's edits are never
# overwritten); the pristine examples always go to $DOCDIR/examples.
# Users and tokens are not made here (DESTDIR may be a staging tree):
# `make install-users` (root) makes them, as the Debian packages do.
set -euo pipefail

: "${FLEET_BIN_DIR:?}" "${PREFIX:?}" "${SLURM_PLUGIN_DIR:?}"
DESTDIR=${DESTDIR:-}
BINDIR=${BINDIR:-$PREFIX/bin}
SBINDIR=${SBINDIR:-$PREFIX/sbin}
LIBEXECDIR=${LIBEXECDIR:-$PREFIX/libexec}
SYSCONFDIR=${SYSCONFDIR:-/etc}
SYSTEMD_UNIT_DIR=${SYSTEMD_UNIT_DIR:-$PREFIX/lib/systemd/system}
DOCDIR=${DOCDIR:-$PREFIX/share/doc/fleet}
SRC=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "make install: $*" >&2; exit 1; }

missing=()
for f in libjob_submit_fleet.so libspank_fleet.so fleet-agent fleet-proxy fleet-metasched fleetctl fleet-ckpt; do
  [[ -f $FLEET_BIN_DIR/$f ]] || missing+=("$f")
done
((${#missing[@]} == 0)) || die "not built in $FLEET_BIN_DIR: ${missing[*]} (run \`make build\` first, or set FLEET_BIN_DIR)"

# Paths as installed, for the units and configs that name them.
sed_paths=(-e "s|/usr/sbin/fleet-|$SBINDIR/fleet-|g"
           -e "s|/usr/libexec/fleet/|$LIBEXECDIR/fleet/|g"
           -e "s|/usr/bin/fleet-ckpt|$BINDIR/fleet-ckpt|g"
           -e "s|/usr/lib/x86_64-linux-gnu/slurm-wlm/|$SLURM_PLUGIN_DIR/|g"
           -e "s|/etc/slurm/|$SYSCONFDIR/slurm/|g"
           -e "s|/etc/fleet/|$SYSCONFDIR/fleet/|g"
           -e "s|/usr/share/doc/fleet-[a-z]*/|$DOCDIR/|g")

put() { # mode src dest: always (re)installed
  install -D -m "$1" "$2" "$DESTDIR$3"
  echo "  $3"
}
put_sed() { # mode src dest, with the paths above
  local tmp; tmp=$(mktemp); sed "${sed_paths[@]}" "$2" > "$tmp"
  install -D -m "$1" "$tmp" "$DESTDIR$3"; rm -f "$tmp"
  echo "  $3"
}
put_conf() { # mode src dest: only where absent
  if [[ -e $DESTDIR$3 ]]; then
    echo "  $3 exists: kept (the new example is in $DOCDIR/examples)"
  else
    put_sed "$@"
  fi
}

echo "Slurm plugins, under Slurm's names, in $SLURM_PLUGIN_DIR:"
put 0644 "$FLEET_BIN_DIR/libjob_submit_fleet.so" "$SLURM_PLUGIN_DIR/job_submit_fleet.so"
put 0644 "$FLEET_BIN_DIR/libspank_fleet.so" "$SLURM_PLUGIN_DIR/spank_fleet.so"
echo "programs:"
put 0755 "$FLEET_BIN_DIR/fleet-agent" "$SBINDIR/fleet-agent"
put 0755 "$FLEET_BIN_DIR/fleet-metasched" "$SBINDIR/fleet-metasched"
put 0755 "$FLEET_BIN_DIR/fleetctl" "$BINDIR/fleetctl"
put 0755 "$FLEET_BIN_DIR/fleet-ckpt" "$BINDIR/fleet-ckpt"
put 0755 "$FLEET_BIN_DIR/fleet-proxy" "$LIBEXECDIR/fleet/fleet-proxy"
echo "systemd units:"
put_sed 0644 "$SRC/packaging/systemd/fleet-agent.service" "$SYSTEMD_UNIT_DIR/fleet-agent.service"
put_sed 0644 "$SRC/packaging/systemd/fleet-metasched.service" "$SYSTEMD_UNIT_DIR/fleet-metasched.service"
echo "examples:"
put_sed 0644 "$SRC/conf/fleet.conf.example" "$DOCDIR/examples/fleet.conf"
put_sed 0644 "$SRC/conf/metasched.toml" "$DOCDIR/examples/metasched.toml"
put_sed 0644 "$SRC/packaging/etc/sudoers-fleet-agent" "$DOCDIR/examples/sudoers-fleet-agent"
put_sed 0644 "$SRC/packaging/etc/plugstack-fleet.conf" "$DOCDIR/examples/plugstack-fleet.conf"
put 0644 "$SRC/README.md" "$DOCDIR/README.md"
echo "configs (never overwritten):"
put_conf 0644 "$SRC/conf/fleet.conf.example" "$SYSCONFDIR/slurm/fleet.conf"
put_conf 0644 "$SRC/packaging/etc/plugstack-fleet.conf" "$SYSCONFDIR/slurm/plugstack.conf.d/fleet.conf"
put_conf 0440 "$SRC/packaging/etc/sudoers-fleet-agent" "$SYSCONFDIR/sudoers.d/fleet-agent"
put_conf 0644 "$SRC/conf/metasched.toml" "$SYSCONFDIR/fleet/metasched.toml"
if [[ -z $DESTDIR ]]; then
  cat <<MSG
Next (see README "For admins"): \`make install-users\` (user fleet, group fleetusers,
fleet-metasched and the tokens), edit $SYSCONFDIR/slurm/fleet.conf and slurm.conf,
\`systemctl daemon-reload\`, \`sudo -u fleet fleet-agent --check\`, then
\`systemctl enable --now fleet-metasched\` / \`fleet-agent\`.
MSG
fi
