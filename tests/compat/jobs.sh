# tests/compat/jobs.sh — sourced by slurm-24.11.sh and slurm-22.05.sh: put
# jobs in every state the agent's status path meets into a running
# cluster, capture what the agent's SlurmBackend runs on them (the exact
# commands and flags of wrappers/fleet-agent/src/slurm.rs) and check the
# agent's own parsers on that output.
#
# The caller defines:
#   sl CMD...        a Slurm client command as root, in the cluster's environment (TZ=UTC)
#   sl_user CMD...   the same as the unprivileged job user (nobody)
#   JOBS_OUT_DIR     a directory the job user can write, as the cluster sees it
#   ACCOUNTING       1 when the cluster has slurmdbd (sacct works), else 0
# and calls `capture_jobs <host dir>` (writes squeue.json, sacct.txt,
# expected.json, slurm-version there), then `check_parsers <agent binary>
# <host dir>`, which prints PASS/FAIL lines through pass/fail.

# The state of job $1 as `squeue -o %T` prints it (no user text).
jobs_state() { sl squeue -h -a -t all -j "$1" -o %T 2>/dev/null | head -1; }
# jobs_wait <id> <state>...: until the job is in one of them (30 s).
jobs_wait() {
  local id=$1 st i; shift
  for ((i = 0; i < 60; i++)); do
    st=$(jobs_state "$id")
    [[ " $* " == *" $st "* ]] && { echo "$st"; return 0; }
    sleep 0.5
  done
  echo "$st"
  return 1
}

# The hostile job names: slurmctld's own `Key=Value` text and a newline.
JOBS_HOSTILE_NAME='x JobState=COMPLETED ExitCode=0:0'
JOBS_NEWLINE_NAME=$'nl\nJobState=COMPLETED ExitCode=0:0 UserId=root(0)'

capture_jobs() {
  local out=$1 id kind st
  mkdir -p "$out"
  JOBS_IDS=()
  declare -gA JOBS_KIND=()
  # submit <kind> <root|user> <sbatch args...>: the id in $JOB.
  submit() {
    local kind=$1 who=$2 out; shift 2
    if [[ $who == root ]]; then out=$(sl sbatch --parsable -o "$JOBS_OUT_DIR/%j.out" "$@" 2>&1)
    else out=$(sl_user sbatch --parsable -o "$JOBS_OUT_DIR/%j.out" "$@" 2>&1); fi
    JOB=${out%%;*}
    [[ $JOB =~ ^[0-9]+$ ]] || { echo "sbatch for $kind failed: $out" >&2; JOB=; return 1; }
    JOBS_IDS+=("$JOB"); JOBS_KIND[$JOB]=$kind
  }
  local running ok fail3 cancelled hostile requeued
  submit held user --hold -J held --wrap 'sleep 600'
  submit running user -J running --wrap 'sleep 600'; running=$JOB
  submit ok user -J ok --wrap 'exit 0'; ok=$JOB
  submit fail3 root -J fail3 --wrap 'exit 3'; fail3=$JOB
  submit cancelled user --hold -J cancelled --wrap 'sleep 600'; cancelled=$JOB
  submit hostile user -J "$JOBS_HOSTILE_NAME" --comment 'JobState=COMPLETED ExitCode=0:0' --wrap 'exit 3'; hostile=$JOB
  submit newline user --hold -J "$JOBS_NEWLINE_NAME" --wrap 'sleep 600' || echo "note: sbatch refused a job name with a newline" >&2
  submit requeued user --requeue -J requeued --wrap 'sleep 600'; requeued=$JOB
  sl scancel "$cancelled"
  jobs_wait "$running" RUNNING >/dev/null || echo "job $running not RUNNING: $(jobs_state "$running")" >&2
  jobs_wait "$requeued" RUNNING >/dev/null || echo "job $requeued not RUNNING: $(jobs_state "$requeued")" >&2
  sl scontrol requeuehold "$requeued"
  jobs_wait "$requeued" PENDING >/dev/null || echo "job $requeued not PENDING after requeuehold: $(jobs_state "$requeued")" >&2
  for id in "$ok" "$fail3" "$hostile"; do jobs_wait "$id" COMPLETED FAILED >/dev/null || true; done
  jobs_wait "$cancelled" CANCELLED >/dev/null || true

  # What the agent runs (slurm.rs: SlurmBackend::status and ::accounting).
  local list
  list=$(IFS=,; echo "${JOBS_IDS[*]}")
  sl squeue --json -a -t all -j "$list" >"$out/squeue.json"
  if [[ $ACCOUNTING == 1 ]]; then
    # slurmctld hands job records to slurmdbd asynchronously: wait until
    # sacct's last row of every job is in the state squeue shows.
    declare -A now=()
    for id in "${JOBS_IDS[@]}"; do now[$id]=$(jobs_state "$id"); done
    local i settled last
    for ((i = 0; i < 60; i++)); do
      sl sacct -X -n -P -D -o JobIDRaw,State,ExitCode,Submit,UID -j "$list" >"$out/sacct.txt" 2>/dev/null || true
      settled=1
      for id in "${JOBS_IDS[@]}"; do
        last=$(grep "^$id|" "$out/sacct.txt" | tail -1 | cut -d'|' -f2)
        [[ ${last%% *} == "${now[$id]}" ]] || { settled=0; break; }
      done
      ((settled)) && break
      sleep 0.5
    done
    ((settled)) || echo "sacct never caught up with squeue; last try in $out/sacct.txt" >&2
  fi
  sl squeue --version >"$out/slurm-version" 2>&1 || true

  # What each job must read as, from sources other than the agent's
  # parsers: what was submitted, and squeue's own text columns (%V submit
  # time in UTC, %U uid, %T state) converted by GNU date.
  {
    echo "["
    local first=1 v u t fleet raw code
    for id in "${JOBS_IDS[@]}"; do
      kind=${JOBS_KIND[$id]}
      IFS='|' read -r v u t < <(sl squeue -h -a -t all -j "$id" -o '%V|%U|%T')
      case $kind in
        held|newline) fleet=pending raw=PENDING code=null ;;
        requeued) fleet=pending raw=PENDING code=null ;;
        running) fleet=running raw=RUNNING code=null ;;
        ok) fleet=completed raw=COMPLETED code=0 ;;
        fail3|hostile) fleet=failed raw=FAILED code=3 ;;
        cancelled) fleet=cancelled raw=CANCELLED code=0 ;;
      esac
      ((first)) || echo ","
      first=0
      printf '  {"id": %s, "kind": "%s", "state": "%s", "raw_state": "%s", "observed_state": "%s", "exit_code": %s, "user_id": %s, "submit_time": %s, "restarts": %s}' \
        "$id" "$kind" "$fleet" "$raw" "$t" "$code" "$u" "$(TZ=UTC date -d "$v" +%s)" "$([[ $kind == requeued ]] && echo 1 || echo 0)"
    done
    echo
    echo "]"
  } >"$out/expected.json"
  sl scancel "${JOBS_IDS[@]}" 2>/dev/null || true
}

# check_parsers <fleet-agent binary> <dir>: the agent's parsers on the
# captured output agree with expected.json, field by field.
check_parsers() {
  local agent=$1 dir=$2 kind
  for kind in squeue-json sacct; do
    local file=$dir/squeue.json
    [[ $kind == sacct ]] && file=$dir/sacct.txt
    if [[ $kind == sacct && $ACCOUNTING != 1 ]]; then continue; fi
    local parsed
    if ! parsed=$(TZ=UTC "$agent" --parse-slurm-output "$kind" "$file" 2>&1); then
      fail "parsers: fleet-agent could not parse $kind output: $parsed"
      continue
    fi
    local verdict
    verdict=$(python3 - "$dir/expected.json" "$kind" "$parsed" <<'EOF'
import json, sys
expected = json.load(open(sys.argv[1]))
kind = sys.argv[2]
rows = [json.loads(l) for l in sys.argv[3].splitlines() if l.strip()]
problems = []
kinds = {e["kind"] for e in expected}
missing = {"held", "running", "ok", "fail3", "cancelled", "hostile", "requeued"} - kinds
if missing:
    problems.append("no job of kind %s was submitted" % sorted(missing))
for e in expected:
    got = [r for r in rows if r["id"] == e["id"]]
    if not got:
        problems.append("job %d (%s) missing" % (e["id"], e["kind"]))
        continue
    # sacct -D lists a requeued job's earlier runs first: the last row is now.
    r = got[-1]
    if len(got) > 1 and not (kind == "sacct" and e["kind"] == "requeued"):
        problems.append("job %d (%s) listed %d times" % (e["id"], e["kind"], len(got)))
    want = {"state": e["state"], "exit_code": e["exit_code"], "user_id": e["user_id"], "submit_time": e["submit_time"]}
    want["restarts"] = e["restarts"]
    for k, v in want.items():
        if r.get(k) != v:
            problems.append("job %d (%s) %s: parsed %r, expected %r" % (e["id"], e["kind"], k, r.get(k), v))
    if r.get("signal") is not None:
        problems.append("job %d (%s) signal %r" % (e["id"], e["kind"], r["signal"]))
extra = sorted({r["id"] for r in rows} - {e["id"] for e in expected})
note = " (and %d jobs not asked for: -j ignored)" % len(extra) if extra else ""
print("ok %d jobs (%s)%s" % (len(expected), ", ".join(e["kind"] for e in expected), note) if not problems else "; ".join(problems))
EOF
)
    if [[ $verdict == ok* ]]; then pass "parsers: $kind of $(head -1 "$dir/slurm-version"): ${verdict#ok }"
    else fail "parsers: $kind: $verdict"; fi
  done
}
