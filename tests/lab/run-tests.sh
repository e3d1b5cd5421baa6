#!/usr/bin/env bash
# `make test`: the style gates, then every test of the workspace against two
# labs run side by side, torn down afterwards (also on failure or interrupt);
# exits with the tests' status.
#
# The lab suites (the fleet-lab package's tests/*.rs) each hold their lab
# exclusively, so one lab runs them one after the other. Two labs (two
# FLEET_LAB_DIRs, ports shifted by FLEET_LAB_PORT_OFFSET) halve that: the
# suites named in FLEET_LAB2_SUITES run against the second lab while the
# others run against the first, and the unit and crate tests run beside both.
# Every test binary is built first (`cargo test --no-run`) and then run
# directly, as cargo would (working directory = its package), since cargo
# itself holds the build lock for as long as it runs tests.
#
# Arguments, if any, replace all of that with one `cargo test --release "$@"`
# against the first lab (e.g. `-p fleet-lab --test federation`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export FLEET_LAB_DIR=${FLEET_LAB_DIR:-/tmp/fleet-lab}
# The lab includes the Kubernetes cluster kube-gamma (tests/kube.rs needs it;
# the harness starts the lab the same way when it finds it down).
export FLEET_LAB_KUBE=${FLEET_LAB_KUBE:-1}
LAB=tests/lab/lab.sh
LAB2_DIR=${FLEET_LAB2_DIR:-$FLEET_LAB_DIR-2}
LAB2_OFFSET=${FLEET_LAB2_PORT_OFFSET:-1000}
# The longest suites go to the second lab, so that both finish together.
LAB2_SUITES=${FLEET_LAB2_SUITES:-control failover rebalance sla}
LOGS=$(mktemp -d /tmp/fleet-test-logs.XXXXXX)
labs=("$FLEET_LAB_DIR")

down() {
  local rc=$? d
  if [[ ${FLEET_KEEP_LAB:-0} == 1 ]]; then
    echo "[test] FLEET_KEEP_LAB=1: leaving the labs up ($LAB down to stop them)" >&2
  else
    for d in "${labs[@]}"; do
      if [[ $d == "$LAB2_DIR" ]]; then
        FLEET_LAB_DIR=$d FLEET_LAB_PORT_OFFSET=$LAB2_OFFSET "$LAB" down || true
      else
        "$LAB" down || true
      fi
    done
  fi
  exit "$rc"
}
trap down EXIT
trap 'exit 130' INT TERM

# Style gates first: they need no lab and fail fast.
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

if (($#)); then
  "$LAB" up
  set +e
  cargo test --release "$@"
  rc=$?
  set -e
  if [[ $rc != 0 ]]; then TAIL_LINES=15 "$LAB" logs >&2 || true; fi
  exit "$rc"
fi

echo "[test] building every test binary" >&2
cargo test --workspace --release --no-run --message-format=json-render-diagnostics >"$LOGS/artifacts.json"
# One line per test binary: <stream> <package dir> <package name> <binary>.
python3 - "$LOGS/artifacts.json" "$LAB2_SUITES" >"$LOGS/plan" <<'EOF'
import json, os, sys
lab2 = set(sys.argv[2].split())
seen = set()
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    exe = m["executable"]
    if exe in seen:
        continue
    seen.add(exe)
    t = m["target"]
    pkg_dir = os.path.dirname(m["manifest_path"])
    pid = m["package_id"]
    # "path+file:///dir#name@0.1.0" (cargo >= 1.77) or "name 0.1.0 (path+file:///dir)"
    # or "path+file:///dir/name#0.1.0" (the name is the directory's)
    frag = pid.split("#")[-1] if "#" in pid else ""
    pkg_name = (frag.split("@")[0] if "@" in frag else os.path.basename(pkg_dir)) if frag else pid.split()[0]
    # The lab suites: integration tests of the root package (fleet-lab).
    is_lab = "test" in t["kind"] and os.path.realpath(pkg_dir) == os.path.realpath(".")
    stream = ("lab2" if t["name"] in lab2 else "lab1") if is_lab else "unit"
    print(stream, pkg_dir, pkg_name, exe)
EOF
grep -q '^lab1 ' "$LOGS/plan" || { echo "[test] no lab suite found among the test binaries" >&2; exit 1; }

# run_stream <stream> [env...]: the stream's binaries one after the other;
# its log in $LOGS/<stream>.log, its failures in $LOGS/<stream>.failed.
run_stream() {
  local s=$1 dir pkg exe rc=0
  shift
  : >"$LOGS/$s.failed"
  while read -r stream dir pkg exe; do
    [[ $stream == "$s" ]] || continue
    echo "[test] ---- $pkg: $(basename "$exe")" >>"$LOGS/$s.log"
    if ! (cd "$dir" && env "$@" CARGO_MANIFEST_DIR="$dir" CARGO_PKG_NAME="$pkg" "$exe" >>"$LOGS/$s.log" 2>&1); then
      echo "$pkg $(basename "$exe")" >>"$LOGS/$s.failed"
      rc=1
    fi
  done <"$LOGS/plan"
  return "$rc"
}

"$LAB" up
if grep -q '^lab2 ' "$LOGS/plan"; then
  labs+=("$LAB2_DIR")
  FLEET_LAB_DIR=$LAB2_DIR FLEET_LAB_PORT_OFFSET=$LAB2_OFFSET "$LAB" up
fi

t0=$SECONDS
run_stream unit &
unit=$!
run_stream lab1 FLEET_LAB_DIR="$FLEET_LAB_DIR" &
lab1=$!
run_stream lab2 FLEET_LAB_DIR="$LAB2_DIR" FLEET_LAB_PORT_OFFSET="$LAB2_OFFSET" &
lab2=$!
rc=0
for p in $unit $lab1 $lab2; do wait "$p" || rc=1; done
echo "[test] test binaries ran in $((SECONDS - t0)) s" >&2
# A test that leaves jobs behind costs the next ones their settling time
# (Lab::settle): name those waits (before the demo brings the first lab up
# afresh).
for d in "${labs[@]}"; do
  if grep -q "still busy" "$d/log/settle.log" 2>/dev/null; then
    echo "[test] tests that found the lab $d still busy after its settling time (an earlier test left jobs behind):" >&2
    grep "still busy" "$d/log/settle.log" >&2
  fi
done

# The README's demo, against the first lab (it brings that lab up afresh
# and checks where its jobs ran and how they ended).
if ! FLEET_DEMO_TIMEOUT=120 tests/lab/demo.sh >"$LOGS/demo.log" 2>&1; then
  rc=1; echo "make demo (tests/lab/demo.sh)" >>"$LOGS/unit.failed"
  tail -n 30 "$LOGS/demo.log" >&2
fi

# Doc tests last (cargo builds them itself).
cargo test --workspace --release --doc >"$LOGS/doc.log" 2>&1 || { rc=1; echo "doc tests" >>"$LOGS/unit.failed"; }

for s in unit lab1 lab2 doc; do
  [[ -f $LOGS/$s.log ]] && cat "$LOGS/$s.log"
done
passed=$(grep -ho '^test result: .*' "$LOGS"/*.log | awk '{p += $4; f += $6} END {print p+0, f+0}')
echo "[test] totals: ${passed% *} passed, ${passed#* } failed (logs in $LOGS)" >&2
if [[ $rc != 0 ]]; then
  echo "[test] FAILED binaries:" >&2
  cat "$LOGS"/*.failed >&2
  echo "[test] tail of the first lab's logs:" >&2
  TAIL_LINES=15 "$LAB" logs >&2 || true
  if [[ ${labs[1]:-} ]]; then
    echo "[test] tail of the second lab's logs:" >&2
    FLEET_LAB_DIR=$LAB2_DIR FLEET_LAB_PORT_OFFSET=$LAB2_OFFSET TAIL_LINES=15 "$LAB" logs >&2 || true
  fi
fi
exit "$rc"
