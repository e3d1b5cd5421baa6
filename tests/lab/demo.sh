#!/usr/bin/env bash
# `make demo`: start the lab, submit `sbatch --gres=gpu:h100:8` at beta (which
# has only A100s), show that it ran at alpha, its output and its exit code;
# then a MIG-slice job that only the Kubernetes cluster kube-gamma can run
# (FLEET_LAB_KUBE=1, the default here; 0 leaves kube-gamma out). The lab is left up.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REPO=$PWD
LAB=$REPO/tests/lab/lab.sh
export FLEET_LAB_DIR=${FLEET_LAB_DIR:-/tmp/fleet-lab}
export FLEET_LAB_KUBE=${FLEET_LAB_KUBE:-1}
R=$FLEET_LAB_DIR
WAIT_S=${FLEET_DEMO_TIMEOUT:-180}

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
# The demo's jobs are a researcher's, as at a real site: the lab user alice
# (root has no identity at the other clusters: JobUserMap=same, MinJobUid).
DEMO_USER=alice
as_user() { setpriv --reuid="$DEMO_USER" --regid="$DEMO_USER" --init-groups env HOME="/home/$DEMO_USER" USER="$DEMO_USER" "$@"; }

say "Starting the lab (three real Slurm clusters, the meta-scheduler, one agent per cluster)"
"$LAB" up

say "The Slurm clusters"
for c in alpha beta delta; do
  echo "-- $c"
  SLURM_CONF=$R/$c/slurm.conf sinfo -o '%P %D %t %N %G'
done

mkdir -p "$R/demo"
chmod 0755 "$R/demo"
cat >"$R/demo/train.sh" <<'SCRIPT'
#!/bin/bash
#SBATCH --job-name=fleet-demo
echo "hello from $(hostname), cluster ${SLURM_CLUSTER_NAME:-?}, job ${SLURM_JOB_ID:-?}"
echo "GPUs visible: ${CUDA_VISIBLE_DEVICES:-none}"
for i in 1 2 3; do echo "training step $i"; sleep 1; done
echo "done"
SCRIPT
chmod 0755 "$R/demo/train.sh"
chown -R "$DEMO_USER:$DEMO_USER" "$R/demo"

export SLURM_CONF=$R/beta/slurm.conf
say "Submitting at beta as $DEMO_USER (no H100 there): sbatch --gres=gpu:h100:8 train.sh"
cd "$R/demo"
echo "$DEMO_USER\$ SLURM_CONF=$SLURM_CONF sbatch --gres=gpu:h100:8 -o $R/demo/out-%j.txt train.sh"
out=$(as_user sbatch --gres=gpu:h100:8 -o "$R/demo/out-%j.txt" train.sh 2>&1) || { echo "$out"; exit 1; }
echo "$out"
id=$(grep -oE '[0-9]+' <<<"$out" | tail -1)

say "At beta, while it runs"
sleep 1
run squeue -j "$id" -o '%i %P %j %T %r %N %k' || true

wait_done() {
  local id=$1 t0 state; t0=$(date +%s)
  while :; do
    state=$(scontrol show job "$id" 2>/dev/null | grep -oE 'JobState=[A-Z_]+' | cut -d= -f2 || true)
    case $state in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) return 0 ;; esac
    if (( $(date +%s) - t0 > WAIT_S )); then
      echo "job $id still $state after ${WAIT_S}s; lab logs:" >&2; TAIL_LINES=15 "$LAB" logs >&2; exit 1
    fi
    sleep 1
  done
}
wait_done "$id"

say "Finished: the job record at beta"
run scontrol show job "$id" | grep -E 'JobId|JobState|ExitCode|Partition|NodeList|AdminComment|Comment|StdOut' || true
say "Accounting at beta (slurmdbd): sacct -j $id"
# slurmctld hands the final record to slurmdbd asynchronously.
for _ in $(seq 1 20); do sacct -X -n -j "$id" -o State | grep -qE 'COMPLETED|FAILED' && break; sleep 0.5; done
run sacct -X -j "$id" -o JobID,JobName,Partition,State,ExitCode,Elapsed || true
say "Where it really ran (meta-scheduler)"
"$LAB" fleetctl jobs || true
fid=$(scontrol show job "$id" 2>/dev/null | grep -oE 'as [A-Za-z0-9_.-]+-[0-9a-f]{12}' | head -1 | cut -d' ' -f2 || true)
if [[ -n $fid ]]; then
  say "Why there: fleetctl job explain $fid"
  "$LAB" fleetctl job explain "$fid" || true
fi
say "At alpha"
SLURM_CONF=$R/alpha/slurm.conf squeue -t all -o '%i %P %j %u %T %N' || true
say "Output file at beta: $R/demo/out-$id.txt"
cat "$R/demo/out-$id.txt" || true
# The demo is also a test (make test runs it): it fails unless the job ran
# at alpha, all its output came back and it ended COMPLETED 0:0 at beta.
demo_check() { # <job id> <cluster>
  local rec; rec=$(scontrol show job "$1" 2>/dev/null || true)
  grep -q "cluster $2, job" "$R/demo/out-$1.txt" && grep -qx done "$R/demo/out-$1.txt" \
    && grep -q 'JobState=COMPLETED' <<<"$rec" && grep -q 'ExitCode=0:0' <<<"$rec" \
    || { echo "demo: job $1 did not run at $2 to completion as expected" >&2; exit 1; }
}
demo_check "$id" alpha

if [[ $FLEET_LAB_KUBE == 1 ]]; then
  say "Submitting at beta a job for one MIG slice (only kube-gamma, a Kubernetes cluster, has them)"
  echo "$DEMO_USER\$ sbatch --gres=gpu:1g.10gb:1 -o $R/demo/out-%j.txt train.sh"
  out=$(as_user sbatch --gres=gpu:1g.10gb:1 -o "$R/demo/out-%j.txt" train.sh 2>&1) || { echo "$out"; exit 1; }
  echo "$out"
  kid=$(grep -oE '[0-9]+' <<<"$out" | tail -1)
  sleep 2
  run squeue -j "$kid" -o '%i %P %j %T %k' || true
  say "At kube-gamma: a batch/v1 Job of the agent's (kubectl, admin kubeconfig)"
  KUBECONFIG=$R/kube-gamma/admin.kubeconfig run kubectl get jobs,pods -n fleet -o wide || true
  wait_done "$kid"
  say "Finished: at beta as any forwarded job, the output streamed back from the pod's log"
  run scontrol show job "$kid" | grep -E 'JobState|ExitCode' || true
  cat "$R/demo/out-$kid.txt" || true
  demo_check "$kid" kube-gamma
fi

cat <<EOF2

== Try more (the lab stays up), as a lab researcher (root's jobs stay home)
  su - $DEMO_USER      # or bob; then:
  export SLURM_CONF=$R/beta/slurm.conf
  cd $R/demo
  sbatch --gres=gpu:a100:4 train.sh                 # beta has A100s: stays home, untouched
  sbatch --fleet-to=alpha --gres=gpu:1 train.sh     # would fit at home; sent to alpha anyway
  sbatch --gres=gpu:h100:8 --fleet=local train.sh   # kept home: Slurm at beta refuses it (no H100)
  sbatch --gres=gpu:h100:512 train.sh               # impossible anywhere: rejected, with the reason
  sbatch --fleet=bogus train.sh                     # bad option value: rejected by the SPANK plugin
  sbatch --gres=gpu:h100:8 --wrap 'sleep 60'; scancel <id>   # cancels the alpha job too
  sbatch --help | grep -A1 fleet                    # the --fleet-* options
  sbatch --fleet-to=kube-gamma --gres=gpu:h100:8 --fleet-image=nvcr.io/nvidia/pytorch:24.05-py3 train.sh
  KUBECONFIG=$R/kube-gamma/admin.kubeconfig kubectl get jobs,pods -n fleet
  squeue; scontrol show job <id>; sacct -j <id>; scancel <id>
  $LAB fleetctl clusters | jobs | job <id>
  $LAB status ; $LAB logs
Tear down:  make lab-down    (or $LAB down)
EOF2
