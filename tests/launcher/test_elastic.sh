#!/usr/bin/env bash
# Checks taiji-run --elastic and --resize against the launcher's own store: the keys it
# writes, a grow asked for through J/elastic/cluster, a shrink's detached rank, a rank lost
# without stopping the job, --min-np, and usage errors. The ranks are shell scripts; the
# test reads and writes store keys with store_tool.py.
# Usage: test_elastic.sh path/to/taiji-run path/to/store_tool.py
set -euo pipefail

RUN=${1:?usage: test_elastic.sh path/to/taiji-run path/to/store_tool.py}
TOOL=${2:?usage: test_elastic.sh path/to/taiji-run path/to/store_tool.py}
unset TAIJI_LISTEN_HOST TAIJI_RANK TAIJI_WORLD_SIZE TAIJI_RENDEZVOUS TAIJI_JOB_ID TAIJI_CLUSTER_VERSION
command -v python3 >/dev/null || { echo "FAIL - python3 is missing" >&2; exit 1; }
TMP=$(mktemp -d)
LAUNCHER=
cleanup() {
  if [ -n "$LAUNCHER" ]; then kill -KILL "$LAUNCHER" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

. "$(dirname "$0")/lib.sh"

# run ARGS...: runs taiji-run (killed after 20 s at most) with stdout and stderr captured.
run() {
  RC=0
  timeout -s KILL 20 "$RUN" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null || RC=$?
}



lines() { [ "$(grep -c "$1" "$TMP/$2" || true)" -ge "$3" ]; }
pid_of() { sed -n "s/^\[$1\] env .* pid \([0-9]*\)$/\1/p" "$TMP/out"; }

# Each rank prints its variables and pid, then waits for the file $TMP/done (all ranks) or
# $TMP/done.<rank> (that rank alone) and exits 0.
RANK='echo "env $TAIJI_RANK $TAIJI_WORLD_SIZE $TAIJI_CLUSTER_VERSION $TAIJI_LOCAL_RANK $TAIJI_LOCAL_SIZE $TAIJI_JOB_ID pid $$"
  while [ ! -e "$0" ] && [ ! -e "$0.$TAIJI_RANK" ]; do sleep 0.1; done'

# start ARGS...: an elastic job in the background with RANK as its ranks; returns once the
# store address is printed and N (the first of ARGS after -np) ranks are up.
start() {
  # The last job's output goes first: the background launcher truncates it only once it runs.
  rm -f "$TMP"/done* "$TMP/out" "$TMP/err"
  touch "$TMP/out" "$TMP/err"
  "$RUN" --timeout 60 "$@" sh -c "$RANK" "$TMP/done" >"$TMP/out" 2>"$TMP/err" </dev/null &
  LAUNCHER=$!
  wait_for 30 lines '^\[[0-9]*\] env' out "$NP" || fail "elastic job: the ranks did not start"
  wait_for 10 lines '^taiji-run: elastic job' err 1 || fail "elastic job: no store address on stderr"
  ADDR=$(sed -n 's/^taiji-run: elastic job [^ ]*, store \([^ ]*\) .*/\1/p' "$TMP/err")
  [ -n "$ADDR" ] || fail "elastic job: no store address on stderr"
}

# --- usage ----------------------------------------------------------------------------
for args in "-np 2 --elastic --min-np 3 true" "-np 4 --elastic --max-np 3 true" \
  "-np 2 --elastic --min-np 0 true" "-np 2 --min-np 1 true" "-np 2 --max-np 4 true" \
  "--hosts 127.0.0.1:2 --self 127.0.0.1 --elastic -np 3 true" \
  "--resize 3 --job-id j" "--resize 3 --store 127.0.0.1:1" "--resize 0 --store 127.0.0.1:1 --job-id j" \
  "--resize x --store 127.0.0.1:1 --job-id j" "--resize -1 --store 127.0.0.1:1 --job-id j" \
  "--resize 2 --store nowhere --job-id j" "--resize 2 --store 127.0.0.1:1 --job-id j true" \
  "--resize 2 --store 127.0.0.1:1 --job-id j -np 2"; do
  # shellcheck disable=SC2086
  run $args
  [ "$RC" = 2 ] || fail "bad usage '$args': exit code $RC, expected 2"
  grep -q '^usage: taiji-run' "$TMP/err" || fail "bad usage '$args': no usage on stderr"
done
run -np 4 --elastic --max-np 3 true
grep -q -- '--min-np <= -np <= --max-np' "$TMP/err" || fail "--max-np < -np: no clear message"
ok "bad elastic and --resize usage exits 2 with the usage on stderr"

t0=$(date +%s)
run --resize 2 --store 127.0.0.1:1 --job-id j --timeout 1
[ "$RC" = 1 ] || fail "--resize to no store: exit code $RC, expected 1"
grep -q 'cannot reach the store at 127.0.0.1:1' "$TMP/err" || fail "--resize to no store: no clear message"
[ $(($(date +%s) - t0)) -le 5 ] || fail "--resize to no store: took more than 5 s"
ok "--resize to a store that does not answer fails within its --timeout"

# --- keys, --resize, grow, above --max-np, a lost rank, a shrink ------------------------
JOB=elastic-test-$$
NP=3
start -np 3 --elastic --max-np 4 --job-id "$JOB"
[ "$(sort "$TMP/out")" = "$(printf '[0] env 0 3 1 0 3 %s pid %s\n[1] env 1 3 1 1 3 %s pid %s\n[2] env 2 3 1 2 3 %s pid %s' \
  "$JOB" "$(pid_of 0)" "$JOB" "$(pid_of 1)" "$JOB" "$(pid_of 2)")" ] || fail "elastic start: unexpected env"
[ "$(store get "$JOB/elastic/limits")" = "1 4" ] || fail "J/elastic/limits is not '1 4'"
[ "$(store get "$JOB/elastic/cluster")" = "1 3" ] || fail "J/elastic/cluster is not '1 3'"
ok "--elastic writes J/elastic/limits and J/elastic/cluster = 1 3; ranks get TAIJI_CLUSTER_VERSION=1"

"$RUN" --resize 4 --store "$ADDR" --job-id "$JOB" >"$TMP/resize" 2>&1 || fail "--resize 4: exit code $?"
[ "$(store get "$JOB/elastic/request")" = 4 ] || fail "--resize 4: J/elastic/request is not 4"
grep -q "asked job $JOB for 4 ranks" "$TMP/resize" || fail "--resize 4: does not say what it did"
RC=0
"$RUN" --resize 5 --store "$ADDR" --job-id "$JOB" >"$TMP/resize" 2>&1 || RC=$?
[ "$RC" = 2 ] || fail "--resize 5 above --max-np 4: exit code $RC, expected 2"
grep -q 'outside job .* limits' "$TMP/resize" || fail "--resize 5: no clear message"
[ "$(store get "$JOB/elastic/request")" = 4 ] || fail "--resize 5: the request changed"
ok "--resize writes J/elastic/request within the limits and refuses a size above --max-np"

store set "$JOB/elastic/cluster" "2 4"
wait_for 20 lines '^\[3\] env' out 1 || fail "grow to 4: no rank 3 started"
grep -q "^\[3\] env 3 4 2 3 4 $JOB pid [0-9]*$" "$TMP/out" || fail "grow to 4: rank 3's env is wrong"
grep -q 'membership version 2 has 4 ranks; starting ranks 3\.\.3' "$TMP/err" || fail "grow to 4: no message"
ok "J/elastic/cluster = 2 4 starts rank 3 with TAIJI_WORLD_SIZE=4 TAIJI_CLUSTER_VERSION=2"

store set "$JOB/elastic/cluster" "3 5"
wait_for 20 lines 'above --max-np 4; not starting ranks 4\.\.4' err 1 || fail "grow to 5: no refusal"
! lines '^\[4\]' out 1 || fail "grow to 5 above --max-np: a rank 4 started"
ok "a membership above --max-np starts nothing and says so"

kill -KILL "$(pid_of 1)"
wait_for 20 lines 'rank 1 killed by signal 9 (Killed); it leaves the job, 3 ranks go on' err 1 ||
  fail "lost rank: no message"
kill -0 "$LAUNCHER" 2>/dev/null || fail "lost rank: the job stopped"
# The survivors 0, 2, 3 are ranks 0..2 now; a shrink to 2 detaches the last of them.
store set "$JOB/elastic/cluster" "4 2"
wait_for 20 lines 'membership version 4 has 2 ranks; detached (exiting by themselves): rank 3' err 1 ||
  fail "shrink to 2: no detach message"
kill -TERM "$(pid_of 3)"
wait_for 20 lines 'rank 3 (detached) killed by signal 15 .*; the job goes on' err 1 ||
  fail "detached rank: its end is not reported"
kill -0 "$LAUNCHER" 2>/dev/null || fail "detached rank: the job stopped"
touch "$TMP/done"
wait_bounded "$LAUNCHER" 20
LAUNCHER=
[ "$RC" = 0 ] || fail "elastic job: exit code $RC, expected 0"
ok "a rank killed by signal 9 and a detached one ending leave the job running; it exits 0"

# --- below --min-np -------------------------------------------------------------------
start -np 3 --elastic --min-np 3 --job-id "$JOB-min"
kill -KILL "$(pid_of 2)"
wait_bounded "$LAUNCHER" 20
LAUNCHER=
[ "$RC" = 137 ] || fail "below --min-np: exit code $RC, expected 137"
grep -q '2 ranks left, below --min-np 3; stopping the job' "$TMP/err" || fail "below --min-np: no message"
ok "losing a rank below --min-np stops the job with the rank's status"

# --- a detached rank that does not exit -----------------------------------------------
NP=2
start -np 2 --elastic --job-id "$JOB-detach"
store set "$JOB-detach/elastic/cluster" "2 1"
wait_for 20 lines 'detached (exiting by themselves): rank 1' err 1 || fail "shrink to 1: no message"
touch "$TMP/done.0"
wait_bounded "$LAUNCHER" 20
LAUNCHER=
[ "$RC" = 0 ] || fail "detached rank left running: exit code $RC, expected 0"
grep -q "the job's ranks have ended; stopping 1 rank detached and still running" "$TMP/err" ||
  fail "detached rank left running: no message"
ok "once the members have exited 0, a detached rank still running is stopped; the job exits 0"

echo "all elastic launcher checks passed"
