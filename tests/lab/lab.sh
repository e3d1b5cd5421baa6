#!/usr/bin/env bash
# tests/lab/lab.sh — real Slurm clusters on loopback for Fleet.
#
# Brings up N real Slurm clusters (slurmctld + several slurmd each, one shared
# munged, one slurmdbd on a private MariaDB for accounting) on 127.0.0.1,
# installs the Fleet plugins into them and starts the meta-scheduler and one
# fleet-agent per cluster. Everything the lab creates
# lives under $FLEET_LAB_DIR (default /tmp/fleet-lab); teardown stops only the
# processes the lab started, found through its own pid files.
# With FLEET_LAB_KUBE=1 (what `make test` and the test harness use) the fleet
# also has a Kubernetes cluster, kube-gamma: the test double tests/kube-server
# (built with the workspace) and an agent with Backend=kubernetes (README:
# Kubernetes targets); `KUBECONFIG=$FLEET_LAB_DIR/kube-gamma/admin.kubeconfig kubectl ...`.
#
# Usage: tests/lab/lab.sh <command>
#   deps                 install missing Debian packages (apt-get)
#   up [--no-fleet]      (re)create the lab and wait until it is ready
#   down                 stop everything the lab started
#   status               show processes, sinfo per cluster, metasched health
#   env <cluster>        print `export SLURM_CONF=...` for that cluster
#   stop-agent <c> | start-agent <c>
#   stop-metasched | start-metasched
#   restart-ctld <c>     restart a cluster's slurmctld (after editing slurm.conf)
#   stop-ctld <c> | start-ctld <c>   stop or start a cluster's slurmctld alone (its
#                        slurmds and running jobs stay: a controller outage);
#                        start-ctld returns once the nodes whose slurmd runs
#                        have registered again
#   revive               start whichever lab daemon is not running (after a crash), keeping all state
#   logs                 tail of every log
#   fleetctl <args>      run the lab's fleetctl against the lab's meta-scheduler (admin token)
set -euo pipefail

# --------------------------------------------------------------------------
# The cluster table. One line per cluster:
#   name  slurmctld-port  region  gpu-type  node:slurmd-port[,node:port...]
# Extend the lab by adding a line (ports must be unique).
# --------------------------------------------------------------------------
CLUSTERS=(
  "alpha 16817 lab-east h100 alpha1:16818,alpha2:16819"
  "beta  16827 lab-west a100 beta1:16828,beta2:16829"
  "delta 16837 lab-central h100 delta1:16838,delta2:16839"
)
# delta is the H100 cluster an H100 job moves to when alpha fails: priced
# above alpha in the lab's fleet model (a lab-only entry appended to
# $R/fleet-model.toml; conf/fleet-sample.toml, which the simulator's figures
# use, is left alone), so H100 jobs still go to alpha while it is healthy.
DELTA_MODEL='
# ---- lab only (tests/lab/lab.sh): the third Slurm cluster of the lab
[[clusters]]
name = "delta"
provider = "lab-cloud"
region = "us-central"
scheduler = "slurm"
carbon_zone = "US-MIDW-MISO"
# a cloud cluster, so that an imported price table reprices it (tests/rebalance.rs)
prices = { H100 = { on_demand = 1.60 } }   # above alpha (1.49): alpha stays first for H100
wait_history_s = { H100 = 7200 }
[[clusters.pools]]
name = "h100"
gpu_type = "H100"
gpus_per_node = 8
nodes = 2
nvlink_domain_gpus = 8
ib_fabric = "delta-ndr"
nodes_per_rack = 4
rack_power_cap_w = 40000
cooling = "air"
'
# Failover in the lab: a cluster is Degraded after 3 missed heartbeats (1 s
# each) and its jobs move after a short grace period; agents hold a lease.
LAB_GRACE_S=${FLEET_LAB_GRACE_S:-10}
LAB_LEASE_MS=${FLEET_LAB_LEASE_MS:-15000}
# Each run's in-job lease (fleet.conf JobLeaseMs, metasched [health]
# job_lease_s): 3 s + grace (10 s) >= 8 s + margin 4 s, as the
# meta-scheduler requires. 0 turns it off.
LAB_JOB_LEASE_S=${FLEET_LAB_JOB_LEASE_S:-8}
# metasched [health] stranded_s: how long a fleet job waits at a cluster
# whose usable nodes cannot run it (all drained or down) before it moves.
LAB_STRANDED_S=${FLEET_LAB_STRANDED_S:-20}
# FLEET_LAB_PORT_OFFSET shifts every port above (and the meta-scheduler's), so
# that a second lab (another FLEET_LAB_DIR) can run beside the default one.
PORT_OFFSET=${FLEET_LAB_PORT_OFFSET:-0}
GPUS_PER_NODE=8
NODE_CPUS=32
NODE_MEM=64000
METASCHED_ADDR=127.0.0.1:$((16900 + PORT_OFFSET))
# Accounting: a private MariaDB and one slurmdbd shared by the clusters, so
# that sacct works as at a real site (FLEET_LAB_ACCOUNTING=0 leaves it out).
ACCOUNTING=${FLEET_LAB_ACCOUNTING:-1}
# Memory as at a real site, on the clusters named here: slurmd confines each
# job to its memory in a cgroup (task/cgroup, ConstrainRAMSpace; memory a
# consumable resource, DefMemPerNode for jobs without --mem), so a job over
# its --mem is OOM-killed and ends OUT_OF_MEMORY. Job cgroups are named by
# uid and job id alone: FirstJobId keeps every lab's and cluster's ids apart.
MEMCG_CLUSTERS=${FLEET_LAB_MEMCG-alpha beta delta}
MEMCG_DEF_MEM=1024
memcg() { [[ " $MEMCG_CLUSTERS " == *" $1 "* ]]; }
read -r -a MEMCG_CLUSTER_LIST <<<"$MEMCG_CLUSTERS"
DB_PORT=$((16906 + PORT_OFFSET))
# Placement: the meta-scheduler ranks with the cost engine over the sample
# fleet model (conf/fleet-sample.toml, whose alpha and beta are these
# clusters); FLEET_LAB_POLICY=first-fit uses the first rule alone.
POLICY=${FLEET_LAB_POLICY:-cost}
# TLS: the meta-scheduler serves HTTPS with a certificate from a lab CA
# ($R/ca.pem, which agents, stand-ins and fleetctl trust); FLEET_LAB_TLS=0
# serves plain HTTP.
TLS=${FLEET_LAB_TLS:-1}
if [[ $TLS == 1 ]]; then METASCHED_URL=https://$METASCHED_ADDR; else METASCHED_URL=http://$METASCHED_ADDR; fi
DBD_PORT=$((16907 + PORT_OFFSET))
FLEET_USER=fleet
# slurmctld and slurmdbd run as Debian's default SlurmUser, `slurm` (the
# slurm-wlm packages create it), as at a site: slurmctld must reach the
# agent's socket, fleet.conf, the published view and the plugins as that
# user. FLEET_LAB_SLURM_USER=root runs them as root instead.
SLURM_USER=${FLEET_LAB_SLURM_USER:-slurm}
# Jobs forwarded to a lab cluster run as this user (fleet.conf RunAsUser),
# not as the agent's: job code cannot read the agent's token or journal.
JOB_USER=fleetjob
# Forwarded jobs run as their submitter (fleet.conf JobUserMap=same), who must
# be in this group; the lab's researchers:
JOB_GROUP=fleetusers
LAB_USERS=(alice bob)
# An ordinary user outside JOB_GROUP: no cluster has an identity for her, so
# her jobs run only where she submits them (a test checks the refusal).
LAB_OUTSIDERS=(carol)
# A researcher who exists only in the site's directory, not in /etc/passwd
# (as with LDAP through sssd at a real site). The lab's directory is the
# NSS module extrausers (/var/lib/extrausers); the user is a member of
# JOB_GROUP through /etc/group's member list, as directory users of a local
# group are. slurmctld, slurmd, sudo and the agents see it through NSS only.
LAB_DIRECTORY_USERS=(dora)
LAB_DIRECTORY_UID=23001
READY_TIMEOUT=${FLEET_LAB_TIMEOUT:-90}

DEB_PACKAGES=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge libslurm-dev
              slurmdbd mariadb-server openssl sudo
              libclang-dev clang curl procps util-linux passwd libnss-extrausers)

R=${FLEET_LAB_DIR:-/tmp/fleet-lab}
# One rule file per lab directory: labs of different versions side by side
# (another FLEET_LAB_DIR) must not overwrite each other's rule.
SUDOERS=/etc/sudoers.d/fleet-lab-$(basename "$R" | tr -c 'A-Za-z0-9_\n' _)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN_SRC=${FLEET_BIN_DIR:-$REPO/target/release}
FLEET_BINS=(fleet-agent fleet-proxy fleet-metasched fleetctl fleet-ckpt)
# FLEET_LAB_INSTALLED=<root>: run Fleet as installed under <root> (the
# Debian packages unpacked there, or `make install DESTDIR=<root>
# PREFIX=/usr`): the programs where the packages put them (linked from
# $R/bin) and the plugins loaded by slurmctld, slurmd and sbatch from
# <root>'s copy of Slurm's plugin directory (tests/install/deb-lab.sh).
INSTALLED=${FLEET_LAB_INSTALLED:-}
# Checkpoint stores: one S3-compatible server (moto_server, from PyPI: .ci/run
# installs it in /opt/fleet-s3) per region of the CLUSTERS table, each with
# the bucket ckpt-<region>, the site default store of that region's clusters
# (metasched.toml ckpt_url, fleet.conf CkptStores). FLEET_LAB_S3=0 runs
# without them (said at start); a missing moto_server is an error otherwise.
# The servers check keys as a site's store would (moto's IAM mode,
# tests/lab/s3-keys.py): the agent's key may do anything, each user's only
# touch objects under <ckpt_url>/<origin>/<user>/.
S3=${FLEET_LAB_S3:-1}
S3_PORT_BASE=$((16950 + PORT_OFFSET))
# Kubernetes target (FLEET_LAB_KUBE=1): cluster kube-gamma, a test-double
# API server (tests/kube-server) with two 8xH100 nodes and an A100 node cut
# into seven MIG 1g.10gb instances; its agent runs with Backend=kubernetes.
KUBE=${FLEET_LAB_KUBE:-0}
KUBE_CLUSTER=kube-gamma
KUBE_PORT=$((16930 + PORT_OFFSET))
KUBE_REGION=lab-central
if [[ $KUBE == 1 ]]; then FLEET_BINS+=(kube-server); fi

# ------------------------------------------------------------------ helpers
log()  { printf '[lab] %s\n' "$*" >&2; }
die()  { printf '[lab] ERROR: %s\n' "$*" >&2; exit 1; }
now()  { date +%s; }

# Print the last lines of the given files (those that exist) to stderr.
show_tail() {
  local f
  for f in "$@"; do
    [[ -e $f ]] || continue
    printf '[lab] ---- tail of %s ----\n' "$f" >&2
    tail -n "${TAIL_LINES:-25}" "$f" >&2 || true
  done
}

cluster_field() { # cluster_field <name> <index 1..5>
  local line
  for line in "${CLUSTERS[@]}"; do
    read -r -a f <<<"$line"
    if [[ ${f[0]} == "$1" ]]; then echo "${f[$(($2 - 1))]}"; return 0; fi
  done
  return 1
}
cluster_names() { local l; for l in "${CLUSTERS[@]}"; do read -r -a f <<<"$l"; echo "${f[0]}"; done; }
# Every site of the fleet: the Slurm clusters, and kube-gamma with FLEET_LAB_KUBE=1.
site_names() { cluster_names; if [[ $KUBE == 1 ]]; then echo "$KUBE_CLUSTER"; fi; }
# The region of a site (kube-gamma's is its own).
site_region() { if [[ $1 == "$KUBE_CLUSTER" ]]; then echo "$KUBE_REGION"; else cluster_field "$1" 3; fi; }
site_provider() { if [[ $1 == "$KUBE_CLUSTER" ]]; then echo lab-kube; else echo onprem; fi; }
# A Slurm cluster, or kube-gamma where the lab has it (agent commands).
check_site() { if [[ $KUBE == 1 && $1 == "$KUBE_CLUSTER" ]]; then return 0; fi; check_cluster "$1"; }
# Distinct job-id ranges per cluster (alpha 100000.., beta 200000..) so that a
# job id used at the wrong cluster is obvious.
cluster_first_jobid() { local i=0 l; for l in "${CLUSTERS[@]}"; do i=$((i + 1)); read -r -a f <<<"$l"; [[ ${f[0]} == "$1" ]] && { echo $((i * 100000 + PORT_OFFSET * 10000)); return 0; }; done; return 1; }
# The lab's regions, in table order, once each; region_port <region>: its S3 server's port.
lab_regions() { { local l; for l in "${CLUSTERS[@]}"; do read -r -a f <<<"$l"; echo "${f[2]}"; done; if [[ $KUBE == 1 ]]; then echo "$KUBE_REGION"; fi; } | awk '!seen[$0]++'; }
region_port() { local i=0 r; for r in $(lab_regions); do [[ $r == "$1" ]] && { echo $((S3_PORT_BASE + i)); return 0; }; i=$((i + 1)); done; return 1; }
region_bucket() { echo "ckpt-$1"; }
cluster_nodes() { cluster_field "$1" 5 | tr ',' '\n' | cut -d: -f1; }
# Each cluster's stand-ins run on a node of their own, without GPUs, in the
# proxy partition alone: a stand-in never holds CPUs, memory or GPUs that a
# local job could use (fleet-agent checks this layout at start).
proxy_node()    { echo "${1}proxy"; }
proxy_port()    { echo $(( $(cluster_field "$1" 2) + 3 + PORT_OFFSET )); }
all_nodes()     { cluster_nodes "$1"; proxy_node "$1"; }
node_port()     { cluster_field "$1" 5 | tr ',' '\n' | awk -F: -v n="$2" -v o="$PORT_OFFSET" '$1==n{print $2+o}'; }
check_cluster() { cluster_field "$1" 1 >/dev/null 2>&1 || die "unknown cluster '$1' (known: $(cluster_names | xargs))"; }

slurm_plugin_dir() {
  local d
  for d in "/usr/lib/$(uname -m)-linux-gnu/slurm-wlm" /usr/lib/x86_64-linux-gnu/slurm-wlm /usr/lib/slurm-wlm /usr/lib64/slurm /usr/lib/slurm; do
    [[ -e $d/select_cons_tres.so ]] && { echo "$d"; return 0; }
  done
  die "cannot find Slurm's plugin directory (select_cons_tres.so); run: $0 deps"
}

# Is pid alive and does its command line mention <pattern>?
pid_matches() {
  local pid=$1 pat=$2
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$pat"
}

# stop_pidfile <pidfile> <cmdline pattern> <label>: TERM, wait, KILL.
stop_pidfile() {
  local pf=$1 pat=$2 label=$3 pid i
  [[ -f $pf ]] || return 0
  pid=$(tr -dc '0-9' <"$pf")
  if pid_matches "$pid" "$pat"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do pid_matches "$pid" "$pat" || break; sleep 0.2; done
    if pid_matches "$pid" "$pat"; then
      log "$label (pid $pid) ignored SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
    log "stopped $label (pid $pid)"
  fi
  rm -f "$pf"
}

# Alive and not a zombie (used while a just-started service is still exec'ing,
# when its cmdline can be momentarily empty).
pid_alive() {
  [[ $1 =~ ^[0-9]+$ ]] && kill -0 "$1" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]
}

pid_from() { [[ -f $1 ]] && tr -dc '0-9' <"$1"; }

as_fleet() { setpriv --reuid="$FLEET_USER" --regid="$FLEET_USER" --init-groups "$@"; }

sconf() { echo "$R/$1/slurm.conf"; }
scmd() { local c=$1; shift; SLURM_CONF=$(sconf "$c") "$@"; }

# ------------------------------------------------------------------ deps
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

cmd_deps() {
  local missing=() p
  for p in "${DEB_PACKAGES[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  if ((${#missing[@]} == 0)); then log "all Debian packages present"; else install_debs "${missing[@]}"; fi
  if [[ $S3 == 1 ]] && ! moto_bin >/dev/null; then install_moto; fi
}

# The checkpoint stores' server: moto from PyPI, in a venv of its own
# (Debian's python3 refuses system-wide pip installs), as .ci/run does.
install_moto() {
  [[ $(id -u) == 0 ]] || die "moto_server missing and not root (or run with FLEET_LAB_S3=0)"
  log "installing moto (the lab's S3 checkpoint stores) into /opt/fleet-s3"
  if ! python3 -m venv /opt/fleet-s3 >/dev/null 2>&1; then
    install_debs python3-venv python3-pip
    python3 -m venv /opt/fleet-s3 || die "python3 -m venv /opt/fleet-s3 failed"
  fi
  /opt/fleet-s3/bin/pip install --quiet 'moto[server]' || die "pip install 'moto[server]' failed"
}

install_debs() {
  local missing=("$@")
  [[ $(id -u) == 0 ]] || die "missing packages (${missing[*]}) and not root"
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # Keep apt from starting the distribution's own slurm/munge services where
  # that is possible (policy-rc.d); the lab runs its own.
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; created_policy=1; fi
  apt-get install -y -q --no-install-recommends "${missing[@]}" || { ((created_policy)) && rm -f "$policy"; die "apt-get install failed"; }
  ((created_policy)) && rm -f "$policy"
  return 0
}

# ------------------------------------------------------------------ munge
munge_ok() { command -v munge >/dev/null && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

ensure_munge() {
  if munge_ok; then log "munged already running: reusing it"; return 0; fi
  command -v munged >/dev/null || die "munged not installed; run: $0 deps"
  id munge >/dev/null 2>&1 || die "user 'munge' missing (the munge package creates it)"
  local key=/etc/munge/munge.key
  install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
  install -d -o munge -g munge -m 0755 /run/munge
  if [[ ! -s $key ]]; then
    log "creating munge key $key"
    if command -v mungekey >/dev/null; then mungekey --create --keyfile="$key" --force
    else dd if=/dev/urandom of="$key" bs=1 count=1024 status=none; fi
  fi
  chown munge:munge "$key"; chmod 0400 "$key"
  # A stale socket/lock left by a dead munged makes munged refuse to start.
  if [[ -e /run/munge/munge.socket.2 ]] && ! munge_ok; then
    local oldpid; oldpid=$(pid_from /run/munge/munged.pid || true)
    if [[ -z $oldpid ]] || ! pid_matches "$oldpid" munged; then
      log "removing stale munge socket"
      rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    fi
  fi
  log "starting munged"
  install -d -o munge -g munge -m 0700 "$R/munge"
  setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged \
      --log-file="$R/munge/munged.log" --pid-file=/run/munge/munged.pid >>"$R/log/munged.stderr" 2>&1 9>&- \
      || { show_tail "$R/log/munged.stderr" "$R/munge/munged.log"; die "munged failed to start"; }
  local t0; t0=$(now)
  until munge_ok; do
    (( $(now) - t0 > 15 )) && { show_tail "$R/log/munged.stderr" "$R/munge/munged.log"; die "munged does not answer"; }
    sleep 0.2
  done
  # Remember that the lab started it, so `down` may stop it.
  pid_from /run/munge/munged.pid >"$R/run/munged.pid"
}

# ------------------------------------------------------------------ config
ensure_fleet_user() {
  local u
  for u in "$FLEET_USER" "$JOB_USER" "$SLURM_USER"; do
    id "$u" >/dev/null 2>&1 && continue
    log "creating system user $u"
    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "$u"
  done
  # Researchers: ordinary users (uid >= 1000) in the group whose members the
  # agents may run forwarded jobs as (fleet.conf JobUserGroup). Jobs run at
  # the target as their submitter, exactly as a native job would.
  getent group "$JOB_GROUP" >/dev/null || groupadd "$JOB_GROUP"
  for u in "${LAB_USERS[@]}"; do
    id "$u" >/dev/null 2>&1 || { log "creating user $u"; useradd --create-home --shell /bin/bash --user-group "$u"; }
    id -nG "$u" | tr ' ' '\n' | grep -qx "$JOB_GROUP" || usermod -aG "$JOB_GROUP" "$u"
  done
  for u in "${LAB_OUTSIDERS[@]}"; do
    id "$u" >/dev/null 2>&1 || { log "creating user $u"; useradd --create-home --shell /bin/bash --user-group "$u"; }
  done
  ensure_directory_users
  # What the agent may do as a job's user: sbatch and scancel, as members of
  # JOB_GROUP only (never root, never a system account, never itself).
  # (!secure_path: the job keeps the PATH it was submitted with; umask=0777:
  # sbatch keeps the submitter's umask, which the agent sets.)
  local rule="Defaults:$FLEET_USER !secure_path, umask=0777
$FLEET_USER ALL=(%$JOB_GROUP) NOPASSWD:SETENV: /usr/bin/sbatch, /usr/bin/scancel, /usr/bin/scontrol"
  if [[ $(cat "$SUDOERS" 2>/dev/null) != "$rule" ]]; then
    printf '%s\n' "$rule" >"$SUDOERS.tmp"
    chmod 0440 "$SUDOERS.tmp"
    visudo -cf "$SUDOERS.tmp" >/dev/null || { rm -f "$SUDOERS.tmp"; die "the sudoers rule for $FLEET_USER does not parse"; }
    mv "$SUDOERS.tmp" "$SUDOERS"
  fi
}

# The directory-only researchers (LAB_DIRECTORY_USERS) through NSS's
# extrausers module: nsswitch.conf gains `extrausers` for passwd and group.
ensure_directory_users() {
  local u uid=$LAB_DIRECTORY_UID db=/var/lib/extrausers
  pkg_installed libnss-extrausers || die "libnss-extrausers is not installed (run: tests/lab/lab.sh deps)"
  local db_line
  for db_line in passwd group; do
    if ! grep -Eq "^$db_line:.*\bextrausers\b" /etc/nsswitch.conf; then
      log "nsswitch.conf: $db_line gains extrausers (the lab's directory)"
      sed -i -E "s/^($db_line:.*)$/\1 extrausers/" /etc/nsswitch.conf
    fi
  done
  mkdir -p "$db"
  touch "$db/passwd" "$db/group"
  chmod 0644 "$db/passwd" "$db/group"
  for u in "${LAB_DIRECTORY_USERS[@]}"; do
    if grep -q "^$u:" /etc/passwd; then die "$u must exist only in the directory, but /etc/passwd has it"; fi
    grep -q "^$u:" "$db/group" || echo "$u:x:$uid:" >>"$db/group"
    grep -q "^$u:" "$db/passwd" || echo "$u:x:$uid:$uid:Directory user:/home/$u:/bin/bash" >>"$db/passwd"
    [[ $(getent passwd "$u" | cut -d: -f3) == "$uid" ]] || die "NSS does not resolve the directory user $u (uid $uid)"
    if [[ ! -d /home/$u ]]; then
      mkdir -m 0750 "/home/$u"
      chown "$uid:$uid" "/home/$u"
    fi
    id -nG "$u" | tr ' ' '\n' | grep -qx "$JOB_GROUP" || gpasswd -a "$u" "$JOB_GROUP" >/dev/null
    uid=$((uid + 1))
  done
}

write_cluster_conf() {
  local c=$1 fleet=$2 port region gpu d plugdir n
  port=$(( $(cluster_field "$c" 2) + PORT_OFFSET )); region=$(cluster_field "$c" 3); gpu=$(cluster_field "$c" 4)
  d=$R/$c
  plugdir=$(slurm_plugin_dir)
  mkdir -p "$d"/{state,spool,log,run,dev}
  # slurmctld runs as SlurmUser: its state is its own, and it writes its log
  # and pid file beside slurmd's (root's).
  chown "$SLURM_USER:$SLURM_USER" "$d/state"; chmod 0700 "$d/state"
  chown root:"$SLURM_USER" "$d/log" "$d/run"; chmod 0775 "$d/log" "$d/run"
  # Sticky, group fleet: the agent (user fleet) creates agent.sock here, but
  # cannot remove or rename root's files.
  chown root:"$FLEET_USER" "$d"; chmod 1775 "$d"
  install -d -o "$FLEET_USER" -g "$FLEET_USER" -m 0755 "$d/agent"

  {
    echo "# Generated by tests/lab/lab.sh — cluster $c"
    echo "ClusterName=$c"
    echo "SlurmctldHost=localhost"
    echo "SlurmctldPort=$port"
    echo "SlurmUser=$SLURM_USER"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$d/state"
    echo "SlurmdSpoolDir=$d/spool/%n"
    echo "SlurmctldPidFile=$d/run/slurmctld.pid"
    echo "SlurmdPidFile=$d/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$d/log/slurmctld.log"
    echo "SlurmdLogFile=$d/log/slurmd-%n.log"
    echo "SlurmctldDebug=${FLEET_LAB_CTLD_DEBUG:-info}"
    echo "SlurmdDebug=info"
    echo "SlurmdParameters=config_overrides"
    echo "ProctrackType=proctrack/linuxproc"
    echo "SelectType=select/cons_tres"
    if memcg "$c"; then
      echo "TaskPlugin=task/cgroup"
      echo "SelectTypeParameters=CR_Core_Memory"
      echo "DefMemPerNode=$MEMCG_DEF_MEM"
    else
      echo "TaskPlugin=task/none"
      echo "SelectTypeParameters=CR_Core"
    fi
    echo "GresTypes=gpu"
    if [[ $ACCOUNTING == 1 ]]; then
      echo "AccountingStorageType=accounting_storage/slurmdbd"
      echo "AccountingStorageHost=localhost"
      echo "AccountingStoragePort=$DBD_PORT"
      # A multi-user site's privacy: users see only their own jobs. The
      # agent's user is an operator (register_accounting), the least role
      # that sees every stand-in and forwarded job.
      echo "PrivateData=accounts,jobs,reservations,usage,users"
      # GPUs in accounting, by type, as a GPU site records them (sacct's
      # AllocTRES; `fleet-trace slurm` reads a site's history from it).
      echo "AccountingStorageTRES=gres/gpu,gres/gpu:$gpu"
      # delta enforces QOS and association limits, as most multi-user
      # sites do: a job there is held to its QOS's MaxWall (the lab's QOS
      # lab-maxwall: one minute), and so is a stand-in of a job submitted
      # there (the plugin keeps its job's limit; its agent lifts it once
      # the job is placed: tests/control.rs).
      [[ $c == delta ]] && echo "AccountingStorageEnforce=associations,limits,qos"
    else
      echo "AccountingStorageType=accounting_storage/none"
    fi
    echo "MailProg=$R/bin/mailprog"
    echo "JobCompType=jobcomp/none"
    echo "FirstJobId=$(cluster_first_jobid "$c")"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "SchedulerType=sched/backfill"
    echo "MpiDefault=none"
    echo "MinJobAge=3600"
    echo "MaxJobCount=100000"
    echo "KillWait=5"
    echo "ReturnToService=2"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=60"
    echo "InactiveLimit=0"
    echo "Waittime=0"
    if [[ $fleet == 1 ]]; then
      echo "PluginDir=$(fleet_plugin_dir):$plugdir"
      echo "JobSubmitPlugins=fleet"
      echo "PlugStackConfig=$d/plugstack.conf"
    else
      echo "PluginDir=$plugdir"
      echo "PlugStackConfig=$d/plugstack.conf"
    fi
    for n in $(cluster_nodes "$c"); do
      echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(node_port "$c" "$n") CPUs=$NODE_CPUS RealMemory=$NODE_MEM Gres=gpu:$gpu:$GPUS_PER_NODE State=UNKNOWN"
    done
    echo "NodeName=$(proxy_node "$c") NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(proxy_port "$c") CPUs=64 RealMemory=64000 State=UNKNOWN"
    local all; all=$(cluster_nodes "$c" | paste -sd,)
    # delta's allows a day: a job with a longer limit is not sent there
    # (it would pend for good, PartitionTimeLimit; tests/control.rs).
    local max_time=INFINITE
    [[ $c == delta ]] && max_time=1-00:00:00
    echo "PartitionName=gpu Nodes=$all Default=YES MaxTime=$max_time State=UP"
    # The same nodes with limits of their own, for jobs that name them: what
    # a job without --time gets there (DefaultTime, else MaxTime) at home is
    # what its target must give it (tests/control.rs).
    echo "PartitionName=short Nodes=$all DefaultTime=1 MaxTime=INFINITE State=UP"
    echo "PartitionName=capped Nodes=$all MaxTime=2 State=UP"
    echo "PartitionName=fleet Nodes=$(proxy_node "$c") OverSubscribe=FORCE:64 MaxTime=INFINITE State=UP"
  } >"$d/slurm.conf"

  {
    echo "# Generated by tests/lab/lab.sh — fake GPUs are character devices (major 195)"
    echo "AutoDetect=off"
    for n in $(cluster_nodes "$c"); do
      local i
      for ((i = 0; i < GPUS_PER_NODE; i++)); do
        [[ -e $d/dev/$n-nvidia$i ]] || mknod "$d/dev/$n-nvidia$i" c 195 "$i"
      done
      echo "NodeName=$n Name=gpu Type=$gpu File=$d/dev/$n-nvidia[0-$((GPUS_PER_NODE - 1))]"
    done
  } >"$d/gres.conf"

  if memcg "$c"; then
    # Memory only (no cores, devices or swap): the lab's nodes share one host.
    {
      echo "# Generated by tests/lab/lab.sh"
      echo "CgroupPlugin=autodetect"
      echo "CgroupMountpoint=/sys/fs/cgroup"
      echo "ConstrainRAMSpace=yes"
      echo "ConstrainSwapSpace=no"
      echo "ConstrainCores=no"
      echo "ConstrainDevices=no"
    } >"$d/cgroup.conf"
  else
    rm -f "$d/cgroup.conf"
  fi

  if [[ $fleet == 1 ]]; then
    echo "optional $(fleet_plugin_dir)/spank_fleet.so" >"$d/plugstack.conf"
  else
    echo "# --no-fleet: no SPANK plugins" >"$d/plugstack.conf"
  fi

  cat >"$d/fleet.conf" <<EOF
# Generated by tests/lab/lab.sh — Fleet site config for cluster $c
SiteName=$c
Region=$region
Provider=onprem
MetaSchedulerUrl=$METASCHED_URL
$([[ $TLS == 1 ]] && echo "MetaSchedulerCaFile=$R/ca.pem" || true)
AgentSocket=$d/agent.sock
AgentTokenFile=$R/secrets/$c.token
AgentSpoolDir=$d/agent
ProxyPartition=fleet
ProxyPath=$R/bin/fleet-proxy
SubmitTimeoutMs=50
FailOpen=yes
HeartbeatIntervalMs=1000
PollIntervalMs=300
LeaseMs=$LAB_LEASE_MS
JobLeaseMs=$((LAB_JOB_LEASE_S * 1000))
SlurmBinDir=/usr/bin
JobUserMap=same
JobUserGroup=$JOB_GROUP
MinJobUid=1000
CkptHelper=$R/bin/fleet-ckpt
$([[ $S3 == 1 ]] && printf 'CkptStores=%s\n' "$R/ckpt-stores.toml" || true)
$([[ $S3 == 1 ]] && printf 'CkptUserStores=%s\n' "$R/ckpt-users/%u.toml" || true)
EOF
  chmod 0644 "$d"/*.conf
}

# ------------------------------------------------------------------ checkpoint stores
moto_bin() {
  local m
  for m in /opt/fleet-s3/bin/moto_server "$(command -v moto_server 2>/dev/null || true)"; do
    [[ -n $m && -x $m ]] && { echo "$m"; return 0; }
  done
  return 1
}

# The stores files: each region's bucket at its server. The agent's
# (CkptStores, its copies between regions) is the agent's alone; each
# user's (CkptUserStores, what their runs get as FLEET_CKPT_STORES) is that
# user's, group the agent's (a Kubernetes pod gets its contents), 0640, as
# a site gives each user a key of their own. The keys are those start_s3
# had each server make (run/s3-keys-<region>: WHO KEY_ID SECRET).
stores_text() {
  local who=$1 r w k s
  echo "# Generated by tests/lab/lab.sh — one S3 server (moto) per lab region; $who's keys"
  for r in $(lab_regions); do
    read -r w k s < <(grep "^$who " "$R/run/s3-keys-$r") || die "no key for $who at the $r store"
    echo
    echo "[[store]]"
    echo "url = \"s3://$(region_bucket "$r")\""
    echo "endpoint = \"http://127.0.0.1:$(region_port "$r")\""
    echo "allow_http = true"
    echo "region = \"us-east-1\""
    echo "access_key_id = \"$k\""
    echo "secret_access_key = \"$s\""
  done
}

ckpt_key_holders() { echo agent "$JOB_USER" "${LAB_USERS[@]}" "${LAB_OUTSIDERS[@]}" "${LAB_DIRECTORY_USERS[@]}"; }

write_ckpt_stores() {
  local u
  stores_text agent >"$R/ckpt-stores.toml"
  chown "$FLEET_USER:$FLEET_USER" "$R/ckpt-stores.toml"
  chmod 0600 "$R/ckpt-stores.toml"
  rm -rf "$R/ckpt-users"
  install -d -m 0755 "$R/ckpt-users"
  for u in $(ckpt_key_holders); do
    [[ $u == agent ]] && continue
    stores_text "$u" >"$R/ckpt-users/$u.toml"
    chown "$u:$FLEET_USER" "$R/ckpt-users/$u.toml"
    chmod 0640 "$R/ckpt-users/$u.toml"
  done
}

# The Python beside moto_server (its venv has boto3, a dependency of moto).
moto_python() {
  local m=$1 p
  for p in "$(dirname "$m")/python3" "$(sed -n '1s/^#! *//p' "$m" | cut -d' ' -f1)" python3; do
    [[ -n $p ]] && command -v "$p" >/dev/null && "$p" -c 'import boto3' 2>/dev/null && { echo "$p"; return 0; }
  done
  return 1
}

# Each region's server makes the keys of the agent and of every lab user,
# each user's allowed their own prefixes (s3-keys.py), and from then on
# checks every request's key and policy.
s3_keys() {
  local moto=$1 r port py origins
  py=$(moto_python "$moto") || die "no Python with boto3 beside $moto (moto[server] brings it): the lab's stores cannot make keys"
  origins=$(cluster_names | paste -sd, -)
  for r in $(lab_regions); do
    port=$(region_port "$r")
    (umask 077; "$py" "$REPO/tests/lab/s3-keys.py" "http://127.0.0.1:$port" "$(region_bucket "$r")" fleet "$origins" \
        $(ckpt_key_holders) >"$R/run/s3-keys-$r" 2>>"$R/log/s3-$r.log") \
      || { show_tail "$R/log/s3-$r.log"; die "making the keys of the $r store failed"; }
    curl -sf -m 5 -o /dev/null -X POST -H 'Content-Type: text/plain' --data-binary 0 \
        "http://127.0.0.1:$port/moto-api/reset-auth" \
      || die "turning on the key checks of the $r store failed"
  done
  write_ckpt_stores
}

start_s3() {
  if [[ $S3 != 1 ]]; then log "FLEET_LAB_S3=0: no checkpoint stores (jobs get no FLEET_CKPT_URL)"; return 0; fi
  local moto r port pf t0
  moto=$(moto_bin) || die "moto_server not found (neither /opt/fleet-s3/bin/moto_server nor on PATH): the lab's checkpoint stores need it; install it as .ci/run does (python3 -m venv /opt/fleet-s3 && /opt/fleet-s3/bin/pip install 'moto[server]') or run with FLEET_LAB_S3=0"
  for r in $(lab_regions); do
    port=$(region_port "$r"); pf=$R/run/s3-$r.pid
    log "starting moto_server for region $r on 127.0.0.1:$port"
    setsid "$moto" -H 127.0.0.1 -p "$port" </dev/null >>"$R/log/s3-$r.log" 2>&1 9>&- &
    echo $! >"$pf"
  done
  for r in $(lab_regions); do
    port=$(region_port "$r"); t0=$(now)
    until curl -sf -m 2 -o /dev/null -X PUT "http://127.0.0.1:$port/$(region_bucket "$r")"; do
      pid_alive "$(pid_from "$R/run/s3-$r.pid" || true)" || { show_tail "$R/log/s3-$r.log"; die "moto_server ($r) exited"; }
      (( $(now) - t0 > READY_TIMEOUT )) && { show_tail "$R/log/s3-$r.log"; die "moto_server ($r) not answering"; }
      sleep 0.3
    done
    log "  region $r: s3://$(region_bucket "$r") at http://127.0.0.1:$port"
  done
  s3_keys "$moto"
}

stop_s3() {
  local f r
  for f in "$R"/run/s3-*.pid; do
    [[ -e $f ]] || continue
    r=${f##*/s3-}; r=${r%.pid}
    stop_pidfile "$f" moto_server "moto_server ($r)"
  done
}

# Every cluster's MailProg: one line per mail in $R/mail.log (when, who
# sent it, to whom, the subject, and the SLURM_* variables it got, each
# ended by \037: values hold spaces), for tests to compare what a
# stand-in mails with what Slurm mails for a native job. Stand-ins mail as
# their users, so anyone may append (lab only).
write_mailprog() {
  cat >"$R/bin/mailprog" <<EOF
#!/bin/sh
# Generated by tests/lab/lab.sh: MailProg -s SUBJECT RECIPIENT, logged, not sent.
printf '%s\\t%s\\t%s\\t%s\\t%s\\n' "\$(date +%s)" "\$(id -un)" "\$3" "\$2" "\$(env | grep '^SLURM_' | LC_ALL=C sort | tr '\\n' '\\037')" >>"$R/mail.log"
EOF
  chmod 0755 "$R/bin/mailprog"
  : >"$R/mail.log"
  chmod 0622 "$R/mail.log"
}

write_secrets() {
  install -d -o "$FLEET_USER" -g "$FLEET_USER" -m 0700 "$R/secrets"
  local c
  for c in $(site_names) admin; do
    local f=$R/secrets/$c.token
    [[ -s $f ]] || (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$f")
    chown "$FLEET_USER:$FLEET_USER" "$f"; chmod 0400 "$f"
  done
}

# A lab CA and a server certificate for 127.0.0.1 signed by it (EC P-256).
write_tls() {
  local s=$R/secrets
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -days 30 \
      -subj "/CN=Fleet lab CA" -keyout "$s/ca.key" -out "$R/ca.pem" >>"$R/log/openssl.log" 2>&1 \
    && openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
      -subj "/CN=fleet-metasched" -keyout "$s/metasched.key" -out "$s/metasched.csr" >>"$R/log/openssl.log" 2>&1 \
    && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >"$s/metasched.ext" \
    && openssl x509 -req -in "$s/metasched.csr" -CA "$R/ca.pem" -CAkey "$s/ca.key" -CAcreateserial -days 30 \
      -extfile "$s/metasched.ext" -out "$s/metasched.pem" >>"$R/log/openssl.log" 2>&1 \
    || { show_tail "$R/log/openssl.log"; die "could not create the lab's TLS certificates"; }
  rm -f "$s/ca.key" "$s/metasched.csr" "$s/metasched.ext" "$s/ca.srl"
  chown "$FLEET_USER:$FLEET_USER" "$s/metasched.key" "$s/metasched.pem"; chmod 0400 "$s/metasched.key"
  chmod 0644 "$R/ca.pem"
}

write_metasched_conf() {
  install -d -o "$FLEET_USER" -g "$FLEET_USER" -m 0755 "$R/metasched"
  {
    echo "# Generated by tests/lab/lab.sh"
    echo "listen = \"$METASCHED_ADDR\""
    echo "state_dir = \"$R/metasched\""
    echo "admin_token_file = \"$R/secrets/admin.token\""
    echo "heartbeat_timeout_s = 10"
    echo
    echo "[health]"
    echo "heartbeat_interval_s = 1"
    echo "missed_heartbeats = 3"
    echo "grace_s = $LAB_GRACE_S"
    echo "job_lease_s = $LAB_JOB_LEASE_S"
    echo "job_lease_margin_s = 4"
    echo "stranded_s = $LAB_STRANDED_S"
    local c
    for c in $(site_names); do
      echo
      echo "[[clusters]]"
      echo "name = \"$c\""
      echo "region = \"$(site_region "$c")\""
      echo "provider = \"$(site_provider "$c")\""
      echo "token_file = \"$R/secrets/$c.token\""
      if [[ $S3 == 1 ]]; then
        echo "ckpt_url = \"s3://$(region_bucket "$(site_region "$c")")/fleet\""
      fi
    done
    if [[ $POLICY != first-fit ]]; then
      cp "$REPO/conf/fleet-sample.toml" "$R/fleet-model.toml"
      printf '%s' "$DELTA_MODEL" >>"$R/fleet-model.toml"
      if [[ $KUBE == 1 ]]; then kube_model >>"$R/fleet-model.toml"; fi
      chmod 0644 "$R/fleet-model.toml"
      echo
      echo "[placement]"
      echo "policy = \"$POLICY\""
      echo "fleet_model = \"$R/fleet-model.toml\""
      echo
      echo "[rebalance]"
      echo "rebalance_interval_s = 2"
      echo "margin_usd = 0.5"
      echo "checkpoint_deadline_s = 60"
    fi
    if [[ $TLS == 1 ]]; then
      echo
      echo "[tls]"
      echo "cert_file = \"$R/secrets/metasched.pem\""
      echo "key_file = \"$R/secrets/metasched.key\""
    fi
  } >"$R/metasched.toml"
  chmod 0644 "$R/metasched.toml"
}

# Where the lab's slurmctld and sbatch load job_submit_fleet.so and
# spank_fleet.so from.
fleet_plugin_dir() {
  if [[ -n $INSTALLED ]]; then echo "$INSTALLED$(slurm_plugin_dir)"; else echo "$R/plugins"; fi
}

# installed_bin <name>: the program as the packages install it under INSTALLED.
installed_bin() {
  local d
  for d in usr/sbin usr/bin usr/libexec/fleet usr/local/sbin usr/local/bin usr/local/libexec/fleet; do
    [[ -x $INSTALLED/$d/$1 ]] && { echo "$INSTALLED/$d/$1"; return 0; }
  done
  return 1
}

install_fleet_bins() {
  local b
  if [[ -n $INSTALLED ]]; then
    for b in "${FLEET_BINS[@]}"; do
      ln -sfn "$(installed_bin "$b")" "$R/bin/$b" || die "$b is not installed under $INSTALLED"
    done
    for b in job_submit_fleet.so spank_fleet.so; do
      [[ -f $(fleet_plugin_dir)/$b ]] || die "missing $(fleet_plugin_dir)/$b (FLEET_LAB_INSTALLED=$INSTALLED)"
    done
    return 0
  fi
  for b in "${FLEET_BINS[@]}"; do
    [[ -x $BIN_SRC/$b ]] || die "missing $BIN_SRC/$b — build first (cargo build --release --workspace) or set FLEET_BIN_DIR"
    install -m 0755 "$BIN_SRC/$b" "$R/bin/$b"
  done
  [[ -f $BIN_SRC/libjob_submit_fleet.so ]] || die "missing $BIN_SRC/libjob_submit_fleet.so"
  [[ -f $BIN_SRC/libspank_fleet.so ]] || die "missing $BIN_SRC/libspank_fleet.so"
  install -m 0755 "$BIN_SRC/libjob_submit_fleet.so" "$R/plugins/job_submit_fleet.so"
  install -m 0755 "$BIN_SRC/libspank_fleet.so" "$R/plugins/spank_fleet.so"
}

# ------------------------------------------------------------------ slurm
start_ctld() {
  local c=$1 d=$R/$1
  log "starting slurmctld for $c"
  SLURM_CONF=$d/slurm.conf /usr/sbin/slurmctld -f "$d/slurm.conf" </dev/null >>"$d/log/slurmctld.stderr" 2>&1 9>&- \
    || { show_tail "$d/log/slurmctld.stderr" "$d/log/slurmctld.log"; die "slurmctld ($c) failed to start"; }
}

start_slurmd() {
  local c=$1 n=$2 d=$R/$1
  mkdir -p "$d/spool/$n"
  log "starting slurmd $n ($c)"
  SLURM_CONF=$d/slurm.conf /usr/sbin/slurmd -f "$d/slurm.conf" -N "$n" </dev/null >>"$d/log/slurmd-$n.stderr" 2>&1 9>&- \
    || { show_tail "$d/log/slurmd-$n.stderr" "$d/log/slurmd-$n.log"; die "slurmd $n ($c) failed to start"; }
}

wait_ctld() {
  local c=$1 d=$R/$1 t0; t0=$(now)
  until scmd "$c" scontrol ping 2>/dev/null | grep -q 'UP'; do
    if ! pid_matches "$(pid_from "$d/run/slurmctld.pid" || true)" slurmctld && (( $(now) - t0 > 3 )); then
      show_tail "$d/log/slurmctld.stderr" "$d/log/slurmctld.log"
      die "slurmctld ($c) exited"
    fi
    if (( $(now) - t0 > READY_TIMEOUT )); then
      show_tail "$d/log/slurmctld.stderr" "$d/log/slurmctld.log"
      die "slurmctld ($c) not answering after ${READY_TIMEOUT}s"
    fi
    sleep 0.3
  done
}

wait_nodes_idle() {
  local c=$1 d=$R/$1 t0 states; t0=$(now)
  while :; do
    states=$(scmd "$c" sinfo -h -N -p gpu -o '%N %t' 2>/dev/null | sort -u || true)
    if [[ -n $states ]] && ! grep -qv ' idle$' <<<"$states" \
       && [[ $(wc -l <<<"$states") -eq $(cluster_nodes "$c" | wc -l) ]]; then
      return 0
    fi
    if (( $(now) - t0 > READY_TIMEOUT )); then
      log "node states at $c:"; echo "$states" >&2
      local n logs=("$d/log/slurmctld.log")
      for n in $(all_nodes "$c"); do logs+=("$d/log/slurmd-$n.stderr" "$d/log/slurmd-$n.log"); done
      show_tail "${logs[@]}"
      die "nodes of $c not idle after ${READY_TIMEOUT}s"
    fi
    sleep 0.5
  done
}

# A restarted slurmctld shows every node `unk` until its slurmd registers
# (about 4 s here), and refuses even `--test-only` meanwhile: wait until
# each node whose slurmd is running is known again (a node whose slurmd a
# test stopped stays as it is). Warns, never fails, after READY_TIMEOUT.
wait_nodes_registered() {
  local c=$1 t0 n st pending; t0=$(now)
  while :; do
    pending=()
    for n in $(all_nodes "$c"); do
      pid_matches "$(pid_from "$R/$c/run/slurmd-$n.pid" || true)" slurmd || continue
      st=$(scmd "$c" sinfo -h -n "$n" -N -o '%t' 2>/dev/null | head -1 || true)
      [[ -n $st && $st != unk* && $st != *'*' ]] || pending+=("$n=${st:-?}")
    done
    ((${#pending[@]} == 0)) && return 0
    if (( $(now) - t0 > READY_TIMEOUT )); then
      log "warning: nodes of $c not registered after ${READY_TIMEOUT}s: ${pending[*]}"
      return 0
    fi
    sleep 0.3
  done
}

cmd_restart_ctld() {
  local c=${1:-}; [[ -n $c ]] || die "usage: $0 restart-ctld <cluster>"; check_cluster "$c"
  stop_pidfile "$R/$c/run/slurmctld.pid" slurmctld "slurmctld ($c)"
  start_ctld "$c"
  wait_ctld "$c"
  wait_nodes_idle "$c"
  log "slurmctld ($c) restarted"
}

# Start whatever of the lab's daemons is not running (after a kill -9),
# touching no state: slurmctld recovers its jobs from StateSaveLocation, the
# agents their journals, the meta-scheduler its database.
cmd_revive() {
  pid_matches "$(pid_from "$R/run/metasched.pid" || true)" fleet-metasched || { start_metasched; wait_metasched; }
  local c n
  for c in $(cluster_names); do
    pid_matches "$(pid_from "$R/$c/run/slurmctld.pid" || true)" slurmctld || { start_ctld "$c"; wait_ctld "$c"; }
    for n in $(all_nodes "$c"); do
      pid_matches "$(pid_from "$R/$c/run/slurmd-$n.pid" || true)" slurmd || start_slurmd "$c" "$n"
    done
    wait_nodes_registered "$c"
    pid_matches "$(pid_from "$R/$c/run/agent.pid" || true)" fleet-agent || { start_agent "$c"; wait_agent "$c"; }
  done
  if [[ $KUBE == 1 ]]; then
    # A restarted kube-server starts empty (the test double keeps no state).
    pid_matches "$(pid_from "$R/$KUBE_CLUSTER/run/kube-server.pid" || true)" kube-server || start_kube
    pid_matches "$(pid_from "$R/$KUBE_CLUSTER/run/agent.pid" || true)" fleet-agent \
      || { start_agent "$KUBE_CLUSTER"; wait_agent "$KUBE_CLUSTER"; }
  fi
  log "lab revived"
}

# Cancel every job of a cluster (so slurmstepd/job processes go away before
# the daemons stop), then wait briefly for them to end.
cancel_all_jobs() {
  local c=$1 ids t0
  scmd "$c" scontrol ping 2>/dev/null | grep -q UP || return 0
  ids=$(scmd "$c" squeue -h -o %i -t PD,R,CG,S,CF,RQ 2>/dev/null | xargs || true)
  [[ -n $ids ]] || return 0
  scmd "$c" scancel $ids 2>/dev/null || true
  t0=$(now)
  while [[ -n $(scmd "$c" squeue -h -o %i -t R,CG 2>/dev/null) ]] && (( $(now) - t0 < 15 )); do sleep 0.3; done
}

# slurmstepd processes started by this lab's slurmd (environment names our
# SLURM_CONF); they can outlive slurmd.
stop_lab_stepds() {
  local p
  for p in /proc/[0-9]*; do
    [[ $(cat "$p/comm" 2>/dev/null) == slurmstepd ]] || continue
    { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -q "^SLURM_CONF=$R/" || continue
    kill -KILL "${p#/proc/}" 2>/dev/null && log "killed leftover slurmstepd ${p#/proc/}" || true
  done
}

# Lab daemons whose pid file is gone (e.g. the lab root was wiped under a
# running lab): recognised by their command line naming this lab's files.
# munged is shared and never swept.
stop_orphans() {
  local p pid comm args
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    comm=$(cat "$p/comm" 2>/dev/null) || continue
    case $comm in slurmctld|slurmd|mariadbd|fleet-agent|fleet-metasch*) ;; *) continue ;; esac
    args=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    [[ $args == *" $R/"* || $args == "$R/"* ]] || continue
    log "stopping orphaned lab process $pid ($args)"
    kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 0.5
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    comm=$(cat "$p/comm" 2>/dev/null) || continue
    case $comm in slurmctld|slurmd|mariadbd|fleet-agent|fleet-metasch*) ;; *) continue ;; esac
    args=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    [[ $args == *" $R/"* || $args == "$R/"* ]] && kill -KILL "$pid" 2>/dev/null || true
  done
}

# ------------------------------------------------------------------ accounting
# A private MariaDB (datadir, socket and port under the lab root, owned by the
# mysql user the package creates) and slurmdbd on top of it.
db_sql() { mariadb --no-defaults -S "$R/db/mysqld.sock" -u root -e "$1"; }

start_db() {
  log "starting mariadbd (accounting database)"
  install -d -o mysql -g mysql -m 0750 "$R/db"
  mariadb-install-db --no-defaults --user=mysql --datadir="$R/db/data" \
      --auth-root-authentication-method=socket --skip-test-db >"$R/log/mariadb-install.log" 2>&1 \
    || { show_tail "$R/log/mariadb-install.log"; die "mariadb-install-db failed"; }
  setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$R/db/data" \
      --socket="$R/db/mysqld.sock" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
      --pid-file="$R/db/mariadb.pid" --log-error="$R/db/mariadb.log" \
      --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
      </dev/null >>"$R/log/mariadb.stderr" 2>&1 9>&- &
  echo $! >"$R/run/mariadb.pid"
  local t0; t0=$(now)
  until db_sql 'SELECT 1' >/dev/null 2>&1; do
    if ! pid_alive "$(pid_from "$R/run/mariadb.pid" || true)"; then show_tail "$R/db/mariadb.log" "$R/log/mariadb.stderr"; die "mariadbd exited"; fi
    (( $(now) - t0 > READY_TIMEOUT )) && { show_tail "$R/db/mariadb.log"; die "mariadbd not answering"; }
    sleep 0.2
  done
}

start_dbd() {
  local pass d=$R/dbd
  pass=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
  db_sql "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass'; GRANT ALL ON fleet_lab_acct.* TO 'slurm'@'127.0.0.1';"
  install -d -o "$SLURM_USER" -g "$SLURM_USER" -m 0700 "$d"
  cat >"$d/slurmdbd.conf" <<EOF
# Generated by tests/lab/lab.sh — accounting for every lab cluster
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=$SLURM_USER
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=fleet_lab_acct
LogFile=$R/log/slurmdbd.log
PidFile=$R/run/slurmdbd.pid
DebugLevel=info
EOF
  # slurmdbd refuses a slurmdbd.conf not owned by its SlurmUser, or readable by others.
  chown "$SLURM_USER:$SLURM_USER" "$d/slurmdbd.conf"; chmod 0600 "$d/slurmdbd.conf"
  touch "$R/log/slurmdbd.log"; chown "$SLURM_USER:$SLURM_USER" "$R/log/slurmdbd.log"
  log "starting slurmdbd"
  # slurmdbd reads slurmdbd.conf beside $SLURM_CONF.
  SLURM_CONF=$d/slurm.conf /usr/sbin/slurmdbd </dev/null >>"$R/log/slurmdbd.stderr" 2>&1 9>&- \
    || { show_tail "$R/log/slurmdbd.stderr" "$R/log/slurmdbd.log"; die "slurmdbd failed to start"; }
}

# Register the clusters, one account and the users that submit (root for
# tests and the demo, the fleet user for forwarded jobs), before any
# slurmctld starts.
register_accounting() {
  local c0 t0 clusters; c0=$(cluster_names | sed -n 1p); clusters=$(cluster_names | paste -sd,)
  t0=$(now)
  until scmd "$c0" sacctmgr -i -n list cluster >/dev/null 2>&1; do
    (( $(now) - t0 > READY_TIMEOUT )) && { show_tail "$R/log/slurmdbd.stderr" "$R/log/slurmdbd.log"; die "slurmdbd not answering"; }
    sleep 0.3
  done
  {
    scmd "$c0" sacctmgr -i add cluster $(cluster_names)
    scmd "$c0" sacctmgr -i add account lab Cluster="$clusters" Description=lab Organization=fleet
    scmd "$c0" sacctmgr -i add user root,"$FLEET_USER","$JOB_USER",$(IFS=,; echo "${LAB_USERS[*]},${LAB_OUTSIDERS[*]},${LAB_DIRECTORY_USERS[*]}") Account=lab Cluster="$clusters"
    # A short QOS every lab user may ask for (delta enforces it).
    [[ -n $(scmd "$c0" sacctmgr -n -P show qos lab-maxwall format=Name) ]] \
      || scmd "$c0" sacctmgr -i add qos lab-maxwall MaxWall=00:01:00
    scmd "$c0" sacctmgr -i modify user where name=$(IFS=,; echo "${LAB_USERS[*]}") set QOS+=lab-maxwall || true
    [[ $(scmd "$c0" sacctmgr -n -P show user "$FLEET_USER" format=AdminLevel) == Operator ]] \
      || scmd "$c0" sacctmgr -i modify user "$FLEET_USER" set AdminLevel=Operator
  } >>"$R/log/sacctmgr.log" 2>&1 || { show_tail "$R/log/sacctmgr.log"; die "sacctmgr could not register the clusters"; }
}

stop_accounting() {
  stop_pidfile "$R/run/slurmdbd.pid" slurmdbd slurmdbd
  stop_pidfile "$R/run/mariadb.pid" mariadbd mariadbd
}

# ------------------------------------------------------------------ fleet services
start_metasched() {
  [[ -x $R/bin/fleet-metasched ]] || die "fleet-metasched not installed in $R/bin (lab up without --no-fleet?)"
  local pf=$R/run/metasched.pid
  if pid_matches "$(pid_from "$pf" || true)" fleet-metasched; then log "metasched already running"; return 0; fi
  log "starting fleet-metasched"
  setsid setpriv --reuid="$FLEET_USER" --regid="$FLEET_USER" --init-groups \
    env NO_COLOR=1 RUST_LOG="${RUST_LOG:-info}" "$R/bin/fleet-metasched" --config "$R/metasched.toml" \
    </dev/null >>"$R/log/metasched.log" 2>&1 9>&- &
  echo $! >"$pf"
}

wait_metasched() {
  local t0; t0=$(now)
  until curl -sf -m 2 --cacert "$R/ca.pem" "$METASCHED_URL/health" >/dev/null 2>&1; do
    if ! pid_alive "$(pid_from "$R/run/metasched.pid" || true)"; then
      show_tail "$R/log/metasched.log"; die "fleet-metasched exited"
    fi
    if (( $(now) - t0 > READY_TIMEOUT )); then show_tail "$R/log/metasched.log"; die "metasched /health not answering"; fi
    sleep 0.3
  done
}

start_agent() {
  local c=$1 d=$R/$1 pf=$R/$1/run/agent.pid
  [[ -x $R/bin/fleet-agent ]] || die "fleet-agent not installed in $R/bin (lab up without --no-fleet?)"
  if pid_matches "$(pid_from "$pf" || true)" fleet-agent; then log "agent $c already running"; return 0; fi
  # A socket left behind (a crashed agent, or a test's fake agent owned by
  # root, which the fleet user cannot remove from the sticky directory) would
  # both block the new agent's bind() and fool the readiness check.
  rm -f "$d/agent.sock"
  log "starting fleet-agent for $c"
  setsid setpriv --reuid="$FLEET_USER" --regid="$FLEET_USER" --init-groups \
    env NO_COLOR=1 SLURM_CONF="$d/slurm.conf" RUST_LOG="${RUST_LOG:-info}" ${FLEET_LOG:+FLEET_LOG=$FLEET_LOG} ${FLEET_AGENT_FAULT:+FLEET_AGENT_FAULT=$FLEET_AGENT_FAULT} "$R/bin/fleet-agent" --conf "$d/fleet.conf" \
    </dev/null >>"$d/log/agent.log" 2>&1 9>&- &
  echo $! >"$pf"
}

wait_agent() {
  local c=$1 d=$R/$1 t0; t0=$(now)
  until [[ -S $d/agent.sock ]] && [[ $(stat -c %U "$d/agent.sock" 2>/dev/null) == "$FLEET_USER" ]]; do
    if ! pid_alive "$(pid_from "$d/run/agent.pid" || true)"; then
      show_tail "$d/log/agent.log"; die "fleet-agent ($c) exited"
    fi
    if (( $(now) - t0 > READY_TIMEOUT )); then show_tail "$d/log/agent.log"; die "agent socket $d/agent.sock not present"; fi
    sleep 0.2
  done
}

# Ready for federation: the agent of $1 has published a fleet view in which
# every cluster of the lab is healthy (the plugin and the agent decide from it).
wait_view() {
  local c=$1 f=$R/$1/agent/view.json t0 want got; t0=$(now)
  want=$(site_names | wc -w)
  while :; do
    got=$(grep -o '"healthy":true' "$f" 2>/dev/null | wc -l || true)
    (( got >= want )) && return 0
    if (( $(now) - t0 > READY_TIMEOUT )); then
      show_tail "$R/$c/log/agent.log" "$R/log/metasched.log"; die "agent ($c) has no fleet view with all $want clusters healthy"
    fi
    sleep 0.2
  done
}

cmd_stop_agent() { local c=${1:-}; [[ -n $c ]] || die "usage: $0 stop-agent <cluster>"; check_site "$c"; stop_pidfile "$R/$c/run/agent.pid" fleet-agent "fleet-agent ($c)"; }
cmd_start_agent() { local c=${1:-}; [[ -n $c ]] || die "usage: $0 start-agent <cluster>"; check_site "$c"; start_agent "$c"; wait_agent "$c"; }
cmd_stop_ctld() {
  local c=${1:-}; [[ -n $c ]] || die "usage: $0 stop-ctld <cluster>"; check_cluster "$c"
  stop_pidfile "$R/$c/run/slurmctld.pid" slurmctld "slurmctld ($c)"
}
cmd_start_ctld() {
  local c=${1:-}; [[ -n $c ]] || die "usage: $0 start-ctld <cluster>"; check_cluster "$c"
  start_ctld "$c"; wait_ctld "$c"; wait_nodes_registered "$c"
}
cmd_stop_metasched() { stop_pidfile "$R/run/metasched.pid" fleet-metasched fleet-metasched; }
cmd_start_metasched() { start_metasched; wait_metasched; }

slurm_daemons_running() {
  local p
  for p in /proc/[0-9]*; do
    case $(cat "$p/comm" 2>/dev/null) in
      slurmctld|slurmd|slurmstepd)
        # zombies (state Z) left by the daemons' double fork do not count
        [[ $(awk '{print $3}' "$p/stat" 2>/dev/null) == Z ]] || return 0 ;;
    esac
  done
  return 1
}

# ------------------------------------------------------------------ commands
# ---------------------------------------------------------------- kube-gamma
# The Kubernetes cluster is tests/kube-server (a test double: no API server
# runs here), as root so that it runs each pod's process as the pod's
# runAsUser (the job's mapped user: alice's pods as alice, never as the
# agent); the agent reaches it with a kubeconfig (0600) holding the token of
# ServiceAccount fleet/fleet-agent, whose RBAC is the project's shipped
# least-privilege manifest (conf/kubernetes/fleet-agent-rbac.yaml, created
# by the admin at start) plus its RoleBinding in `team-vision`
# (KubeAccountNamespaces): what Fleet's Jobs need in those two namespaces
# and reading Nodes, nothing else; namespace `team-other` is the admin's alone.
# Identities: a JobUserMap file that charges alice to account `lab`
# (namespace fleet) and bob to `vision` (namespace team-vision).
write_kube_conf() {
  local c=$KUBE_CLUSTER d=$R/$KUBE_CLUSTER s=$R/$KUBE_CLUSTER/server admin
  mkdir -p "$d"/{log,run}
  chown root:"$FLEET_USER" "$d"; chmod 1775 "$d"
  install -d -o "$FLEET_USER" -g "$FLEET_USER" -m 0755 "$d/agent"
  # root's; o+x so that pods (as their users) reach their own directories under work/.
  install -d -o root -g root -m 0711 "$s"
  admin=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
  (umask 077; cat >"$s/cluster.toml" <<EOF
# Generated by tests/lab/lab.sh — the nodes and tokens of $c
namespaces = ["fleet", "team-vision", "team-other"]

[[node]]
name = "gamma-h100-1"
labels = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3", "topology.kubernetes.io/zone" = "gamma-a" }
capacity = { cpu = "$NODE_CPUS", memory = "${NODE_MEM}Mi", "nvidia.com/gpu" = "$GPUS_PER_NODE" }
taints = ["nvidia.com/gpu=present:NoSchedule"]

[[node]]
name = "gamma-h100-2"
labels = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3", "topology.kubernetes.io/zone" = "gamma-a" }
capacity = { cpu = "$NODE_CPUS", memory = "${NODE_MEM}Mi", "nvidia.com/gpu" = "$GPUS_PER_NODE" }
taints = ["nvidia.com/gpu=present:NoSchedule"]

[[node]]
name = "gamma-a100-mig"
labels = { "nvidia.com/gpu.product" = "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy" = "mixed" }
capacity = { cpu = "$NODE_CPUS", memory = "${NODE_MEM}Mi", "nvidia.com/mig-1g.10gb" = "7" }

[[token]]
token = "$admin"
user = "admin"
namespaces = ["*"]
nodes = true
EOF
  )
  chmod 0600 "$s/cluster.toml"
  cat >"$d/usermap" <<EOF
# Generated by tests/lab/lab.sh — who runs jobs at $c, and the account (namespace) charged
*:alice alice lab
*:bob bob vision
EOF
  chmod 0644 "$d/usermap"
  cat >"$d/fleet.conf" <<EOF
# Generated by tests/lab/lab.sh — Fleet site config for the Kubernetes cluster $c
SiteName=$c
Region=$KUBE_REGION
Provider=kubernetes
MetaSchedulerUrl=$METASCHED_URL
$([[ $TLS == 1 ]] && echo "MetaSchedulerCaFile=$R/ca.pem" || true)
AgentSocket=$d/agent.sock
AgentTokenFile=$R/secrets/$c.token
AgentSpoolDir=$d/agent
HeartbeatIntervalMs=1000
PollIntervalMs=300
JobUserMap=$d/usermap
JobUserGroup=$JOB_GROUP
MinJobUid=1000
LeaseMs=$LAB_LEASE_MS
Backend=kubernetes
KubeConfig=$d/agent.kubeconfig
KubeNamespace=fleet
KubeAccountNamespaces=lab:fleet,vision:team-vision
KubeImage=ubuntu:24.04
# The pods' in-job lease: the double runs the init container's command on
# this host (its image is only a name), so CkptHelper is the lab's binary.
KubeHelperImage=fleet-lab/fleet-ckpt:lab
JobLeaseMs=$((LAB_JOB_LEASE_S * 1000))
CkptHelper=$R/bin/fleet-ckpt
$([[ $S3 == 1 ]] && printf 'CkptStores=%s\n' "$R/ckpt-stores.toml" || true)
$([[ $S3 == 1 ]] && printf 'CkptUserStores=%s\n' "$R/ckpt-users/%u.toml" || true)
EOF
  chmod 0644 "$d/fleet.conf"
}

# kube-gamma in the engine's model (appended to the lab's copy of
# conf/fleet-sample.toml, whose clusters stay as they are): a managed
# Kubernetes GPU cloud, on-demand H100 at 2.49 USD/GPU-h, above alpha's
# owned H100 (1.49) and delta's (1.60), so that an H100 job from beta still
# goes to alpha unless it pins kube-gamma (--fleet-to=kube-gamma); its A100
# MIG 1g.10gb slices (a seventh of an A100) exist nowhere else.
kube_model() {
  cat <<EOF

# ---------------------------------------------------------------- lab: $KUBE_CLUSTER
# (appended by tests/lab/lab.sh with FLEET_LAB_KUBE=1)
[gpu_models."1G.10GB"]
relative_throughput = 0.14      # one MIG 1g.10gb slice: 1/7 of an A100
power_w = 57.0                  # 400 W / 7

[[clusters]]
name = "$KUBE_CLUSTER"
provider = "lab-kube"
region = "$KUBE_REGION"
scheduler = "kubernetes"
carbon_zone = "DE-LU"
prices = { H100 = { on_demand = 2.49 }, "1G.10GB" = { on_demand = 0.35 } }
[[clusters.pools]]
name = "h100"
gpu_type = "H100"
gpus_per_node = $GPUS_PER_NODE
nodes = 2
nvlink_domain_gpus = 8
ib_fabric = "$KUBE_CLUSTER-ndr"  # the nodes' RDMA network, as a GPU cloud's
[[clusters.pools]]
name = "a100-mig"
gpu_type = "1G.10GB"
gpus_per_node = 7
nodes = 1
EOF
}

start_kube() {
  local c=$KUBE_CLUSTER d=$R/$KUBE_CLUSTER s=$R/$KUBE_CLUSTER/server pf=$R/$KUBE_CLUSTER/run/kube-server.pid t0
  if pid_matches "$(pid_from "$pf" || true)" kube-server; then log "kube-server already running"; return 0; fi
  log "starting kube-server for $c"
  rm -f "$s/url" "$s/agent.kubeconfig" "$s/admin.kubeconfig"
  setsid env NO_COLOR=1 RUST_LOG="${RUST_LOG:-info}" "$R/bin/kube-server" --config "$s/cluster.toml" --port "$KUBE_PORT" \
      --work-dir "$s/work" --tls --kubeconfig "admin:fleet:$s/admin.kubeconfig" \
    </dev/null >"$s/url" 2>>"$d/log/kube-server.log" 9>&- &
  echo $! >"$pf"
  t0=$(now)
  until [[ -s $s/url && -s $s/admin.kubeconfig ]]; do
    pid_alive "$(pid_from "$pf" || true)" || { show_tail "$d/log/kube-server.log"; die "kube-server ($c) exited"; }
    (( $(now) - t0 > READY_TIMEOUT )) && { show_tail "$d/log/kube-server.log"; die "kube-server ($c) not ready"; }
    sleep 0.2
  done
  # The agent's ServiceAccount and RBAC, as an admin installs them: the
  # shipped manifest, and its binding in the second namespace.
  local k=(env KUBECONFIG="$s/admin.kubeconfig" kubectl) tok cfg admin
  "${k[@]}" create --validate=false -f "$REPO/conf/kubernetes/fleet-agent-rbac.yaml" >>"$d/log/kube-server.log" 2>&1 \
    || { show_tail "$d/log/kube-server.log"; die "kube-server ($c): creating the agent's RBAC failed"; }
  # (A manifest: `kubectl create rolebinding` speaks protobuf, which the double does not.)
  "${k[@]}" create --validate=false -f - >>"$d/log/kube-server.log" 2>&1 <<'EOF' \
    || { show_tail "$d/log/kube-server.log"; die "kube-server ($c): binding the agent in team-vision failed"; }
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: fleet-agent, namespace: team-vision}
subjects: [{kind: ServiceAccount, name: fleet-agent, namespace: fleet}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: fleet-agent}
EOF
  tok=$("${k[@]}" get secret fleet-agent-token -n fleet -o 'jsonpath={.data.token}' | base64 -d)
  [[ $tok =~ ^[0-9a-f]{64}$ ]] || die "kube-server ($c): no token for ServiceAccount fleet/fleet-agent"
  # The admin's kubeconfig with the agent's token instead (no token in argv).
  admin=$(sed -n 's/^token = "\(.*\)"$/\1/p' "$s/cluster.toml" | head -1)
  cfg=$(<"$s/admin.kubeconfig")
  [[ -n $admin && $cfg == *"$admin"* ]] || die "kube-server ($c): cannot derive the agent's kubeconfig"
  (umask 077; printf '%s\n' "${cfg//"$admin"/"$tok"}" >"$s/agent.kubeconfig")
  install -o "$FLEET_USER" -g "$FLEET_USER" -m 0600 "$s/agent.kubeconfig" "$d/agent.kubeconfig"
  install -o root -g root -m 0600 "$s/admin.kubeconfig" "$d/admin.kubeconfig"
  log "  $c: KUBECONFIG=$d/admin.kubeconfig kubectl get nodes,jobs,pods  ($(cat "$s/url"))"
}

# The job cgroups slurmstepd leaves behind (22.05's task/cgroup on cgroup v1
# removes neither its task_<n> cgroups nor, so, the step and job above
# them): the next lab here gives out the same job ids, and a job would
# inherit its namesake's OOM count. Only this lab's ids, only empty cgroups.
clean_job_cgroups() {
  local c n first d id
  for c in "${MEMCG_CLUSTER_LIST[@]}"; do
    first=$(cluster_first_jobid "$c") || continue
    for n in $(all_nodes "$c"); do
      for d in /sys/fs/cgroup/memory/slurm_"$n"/uid_*/job_* /sys/fs/cgroup/slurm_"$n"/uid_*/job_*; do
        [[ -d $d ]] || continue
        id=${d##*/job_}
        [[ $id =~ ^[0-9]+$ ]] && ((id >= first && id < first + 100000)) || continue
        find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
      done
    done
  done
}

cmd_down() {
  [[ -d $R ]] || { log "no lab at $R"; return 0; }
  local c n
  if [[ -d $R/$KUBE_CLUSTER ]]; then
    stop_pidfile "$R/$KUBE_CLUSTER/run/agent.pid" fleet-agent "fleet-agent ($KUBE_CLUSTER)"
    stop_pidfile "$R/$KUBE_CLUSTER/run/kube-server.pid" kube-server "kube-server ($KUBE_CLUSTER)"
  fi
  for c in $(cluster_names); do stop_pidfile "$R/$c/run/agent.pid" fleet-agent "fleet-agent ($c)"; done
  stop_pidfile "$R/run/metasched.pid" fleet-metasched fleet-metasched
  for c in $(cluster_names); do
    [[ -d $R/$c ]] || continue
    cancel_all_jobs "$c"
    stop_pidfile "$R/$c/run/slurmctld.pid" slurmctld "slurmctld ($c)"
    for n in $(all_nodes "$c"); do stop_pidfile "$R/$c/run/slurmd-$n.pid" slurmd "slurmd $n ($c)"; done
  done
  stop_accounting
  stop_s3
  stop_lab_stepds
  stop_orphans
  clean_job_cgroups
  # munged: only if this lab started it.
  # munged is shared: leave it when another lab (or anything else) still runs
  # Slurm daemons that authenticate through it.
  if [[ -f $R/run/munged.pid ]]; then
    if [[ ${FLEET_LAB_KEEP_MUNGE:-0} == 1 ]] || slurm_daemons_running; then
      log "leaving munged running (other Slurm daemons use it)"; rm -f "$R/run/munged.pid"
    else stop_pidfile "$R/run/munged.pid" munged munged; fi
  fi
  log "lab down"
}

cmd_up() {
  local fleet=1 arg
  for arg in "$@"; do
    case $arg in
      --no-fleet) fleet=0 ;;
      *) die "unknown option to up: $arg" ;;
    esac
  done
  [[ $(id -u) == 0 ]] || die "the lab needs root (it runs slurmd and creates device nodes)"
  local t_start; t_start=$(now)
  case $R in /|/tmp|/root|/home|/usr|/etc|/var|"") die "refusing FLEET_LAB_DIR=$R" ;; esac
  if [[ -d $R ]] && [[ -n $(ls -A "$R") ]] && [[ ! -f $R/.fleet-lab ]]; then
    die "$R exists and is not a Fleet lab (no .fleet-lab marker); refusing to wipe it"
  fi
  cmd_deps
  for arg in slurmctld slurmd; do [[ -x /usr/sbin/$arg ]] || die "/usr/sbin/$arg missing"; done
  ensure_fleet_user
  if [[ $fleet == 1 && -n $INSTALLED ]]; then
    local b; for b in "${FLEET_BINS[@]}"; do
      installed_bin "$b" >/dev/null || die "$b is not installed under FLEET_LAB_INSTALLED=$INSTALLED"
    done
  elif [[ $fleet == 1 ]]; then  # fail before tearing anything down
    local b; for b in "${FLEET_BINS[@]}" libjob_submit_fleet.so libspank_fleet.so; do
      [[ -e $BIN_SRC/$b ]] || die "missing $BIN_SRC/$b — run 'cargo build --release --workspace' or set FLEET_BIN_DIR (or use up --no-fleet)"
    done
  fi
  cmd_down
  clean_job_cgroups
  # Keep a munged the previous run started (it is ours) — stop_pidfile above stopped it; fine.
  rm -rf "$R"
  mkdir -p "$R"/{bin,plugins,log,run}
  chmod 0755 "$R" "$R/bin" "$R/plugins"
  touch "$R/.fleet-lab"
  ensure_munge

  local c n
  if [[ $fleet == 1 ]]; then install_fleet_bins; fi
  write_mailprog
  write_secrets
  if [[ $TLS == 1 ]]; then write_tls; fi
  for c in $(cluster_names); do write_cluster_conf "$c" "$fleet"; done
  if [[ $KUBE == 1 && $fleet == 1 ]]; then write_kube_conf; fi
  write_metasched_conf
  if [[ $ACCOUNTING == 1 ]]; then start_db; start_dbd; register_accounting; fi
  start_s3

  if [[ $fleet == 1 ]]; then start_metasched; wait_metasched; fi
  for c in $(cluster_names); do
    start_ctld "$c"
  done
  for c in $(cluster_names); do
    wait_ctld "$c"
    for n in $(all_nodes "$c"); do start_slurmd "$c" "$n"; done
  done
  for c in $(cluster_names); do wait_nodes_idle "$c"; done
  if [[ $fleet == 1 ]]; then
    if [[ $KUBE == 1 ]]; then start_kube; fi
    for c in $(site_names); do start_agent "$c"; done
    for c in $(site_names); do wait_agent "$c"; done
    for c in $(cluster_names); do wait_view "$c"; done
  fi
  echo "fleet=$fleet" >"$R/run/mode"
  log "lab up in $(( $(now) - t_start ))s at $R (fleet=$fleet)"
  for c in $(cluster_names); do log "  $c: export SLURM_CONF=$R/$c/slurm.conf"; done
}

cmd_status() {
  local c n pid
  [[ -d $R ]] || { echo "no lab at $R"; return 1; }
  printf '%-28s %s\n' "process" "state"
  show_proc() { # label pidfile pattern
    pid=$(pid_from "$2" || true)
    if pid_matches "$pid" "$3"; then printf '%-28s running (pid %s)\n' "$1" "$pid"; else printf '%-28s stopped\n' "$1"; fi
  }
  if [[ -f $R/run/munged.pid ]]; then show_proc munged "$R/run/munged.pid" munged
  else printf '%-28s %s\n' munged "$(munge_ok && echo 'running (not started by lab)' || echo stopped)"; fi
  if [[ -f $R/run/slurmdbd.pid ]]; then
    show_proc mariadbd "$R/run/mariadb.pid" mariadbd
    show_proc slurmdbd "$R/run/slurmdbd.pid" slurmdbd
  fi
  [[ -e $R/bin/fleet-metasched ]] && show_proc fleet-metasched "$R/run/metasched.pid" fleet-metasched
  for c in $(cluster_names); do
    show_proc "slurmctld ($c)" "$R/$c/run/slurmctld.pid" slurmctld
    for n in $(all_nodes "$c"); do show_proc "slurmd $n ($c)" "$R/$c/run/slurmd-$n.pid" slurmd; done
    [[ -e $R/bin/fleet-agent ]] && show_proc "fleet-agent ($c)" "$R/$c/run/agent.pid" fleet-agent
  done
  for c in $(cluster_names); do
    echo "== $c (SLURM_CONF=$R/$c/slurm.conf)"
    scmd "$c" sinfo -N -o '%N %P %t %G' 2>&1 || true
  done
  if [[ -e $R/bin/fleet-metasched ]]; then
    echo "== metasched $METASCHED_URL/health: $(curl -sf -m 2 --cacert "$R/ca.pem" "$METASCHED_URL/health" 2>&1 || echo 'not answering')"
  fi
}

cmd_env() {
  local c=${1:-}; [[ -n $c ]] || die "usage: $0 env <cluster>"; check_cluster "$c"
  echo "export SLURM_CONF=$R/$c/slurm.conf"
}

cmd_logs() {
  local f
  while IFS= read -r f; do
    echo "==> $f <=="
    tail -n "${TAIL_LINES:-20}" "$f"
  done < <(find "$R" -name '*.log' -o -name '*.stderr' 2>/dev/null | sort)
}

cmd_fleetctl() {
  [[ -x $R/bin/fleetctl ]] || die "no $R/bin/fleetctl (lab up without --no-fleet?)"
  local ca=()
  [[ $TLS == 1 ]] && ca=(FLEET_CA_FILE="$R/ca.pem")
  env FLEET_URL="$METASCHED_URL" FLEET_TOKEN_FILE="$R/secrets/admin.token" "${ca[@]}" "$R/bin/fleetctl" "$@"
}

# Commands that start/stop things hold an exclusive lock beside the lab root,
# so two concurrent callers (two test runs, a test and a person) serialize
# instead of interleaving their start-ups. Every daemon is started with fd 9
# closed (9>&-) so that none of them inherits the lock.
lab_lock() {
  # (named .lablock: daemons started by an earlier version of this script may
  # still hold the old "<root>.lock" through an inherited fd)
  local lock="${R%/}.lablock"
  exec 9>>"$lock"
  if ! flock -n 9; then
    log "waiting for another lab.sh ($lock)"
    flock -w "${FLEET_LAB_LOCK_TIMEOUT:-600}" 9 || die "another lab.sh still holds $lock"
  fi
}

main() {
  local cmd=${1:-}; shift || true
  case $cmd in
    up|down|deps|stop-agent|start-agent|stop-metasched|start-metasched|restart-ctld|stop-ctld|start-ctld|revive) lab_lock ;;
  esac
  case $cmd in
    deps) cmd_deps ;;
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env "$@" ;;
    stop-agent) cmd_stop_agent "$@" ;;
    start-agent) cmd_start_agent "$@" ;;
    stop-metasched) cmd_stop_metasched ;;
    start-metasched) cmd_start_metasched ;;
    restart-ctld) cmd_restart_ctld "$@" ;;
    stop-ctld) cmd_stop_ctld "$@" ;;
    start-ctld) cmd_start_ctld "$@" ;;
    revive) cmd_revive ;;
    logs) cmd_logs ;;
    fleetctl) cmd_fleetctl "$@" ;;
    ""|-h|--help|help) sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
    *) die "unknown command '$cmd' (try: $0 help)" ;;
  esac
}

main "$@"
