#!/usr/bin/env bash
# `make test`: bring the lab up, run the whole workspace's tests against it,
# tear the lab down (also on failure or interrupt), exit with the tests' status.
# Arguments, if any, replace `--workspace` (e.g. `-p fleet-lab --test federation`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export FLEET_LAB_DIR=${FLEET_LAB_DIR:-/tmp/fleet-lab}
# The lab includes the Kubernetes cluster kube-gamma (tests/kube.rs needs it;
# the harness starts the lab the same way when it finds it down).
export FLEET_LAB_KUBE=${FLEET_LAB_KUBE:-1}
LAB=tests/lab/lab.sh

down() {
  local rc=$?
  if [[ ${FLEET_KEEP_LAB:-0} == 1 ]]; then
    echo "[test] FLEET_KEEP_LAB=1: leaving the lab up ($LAB down to stop it)" >&2
  else
    "$LAB" down || true
  fi
  exit "$rc"
}
trap down EXIT
trap 'exit 130' INT TERM

# Style gates first: they need no lab and fail fast.
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

"$LAB" up
set +e
if (($#)); then cargo test --release "$@"; else cargo test --workspace --release; fi
rc=$?
set -e
if [[ $rc != 0 ]]; then
  echo "[test] cargo test failed (rc=$rc); tail of the lab logs:" >&2
  TAIL_LINES=15 "$LAB" logs >&2 || true
fi
exit "$rc"
