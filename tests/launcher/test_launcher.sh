#!/usr/bin/env bash
# Checks taiji-run's process handling: environment, output tagging, failure propagation,
# signals, timeouts and usage errors. Usage: test_launcher.sh path/to/taiji-run
set -euo pipefail

RUN=${1:?usage: test_launcher.sh path/to/taiji-run}
# The launcher respects some of these when set; the checks expect its own defaults.
unset TAIJI_LISTEN_HOST TAIJI_RANK TAIJI_WORLD_SIZE TAIJI_RENDEZVOUS TAIJI_JOB_ID
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

. "$(dirname "$0")/lib.sh"
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# run ARGS...: runs taiji-run (killed after 20 s at most) with stdout and stderr captured
# in $TMP/out and $TMP/err; sets RC and ELAPSED_MS.
run() {
  local t0
  t0=$(now_ms)
  RC=0
  timeout -s KILL 20 "$RUN" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null || RC=$?
  ELAPSED_MS=$(($(now_ms) - t0))
}


# --- output and environment ---------------------------------------------------------
run -np 3 sh -c 'echo hi $TAIJI_RANK/$TAIJI_WORLD_SIZE'
[ "$RC" = 0 ] || fail "-np 3 echo: exit code $RC"
[ "$(sort "$TMP/out")" = "$(printf '[0] hi 0/3\n[1] hi 1/3\n[2] hi 2/3')" ] ||
  fail "-np 3 echo: unexpected output"
ok "-np 3 prints one tagged line per rank"

run -np 3 --no-tag sh -c 'echo "$TAIJI_RENDEZVOUS"'
[ "$RC" = 0 ] || fail "rendezvous env: exit code $RC"
[ "$(wc -l <"$TMP/out")" = 3 ] || fail "rendezvous env: expected 3 lines"
[ "$(sort -u "$TMP/out" | wc -l)" = 1 ] || fail "rendezvous env: differs across ranks"
grep -Eq '^127\.0\.0\.1:[1-9][0-9]*$' "$TMP/out" || fail "rendezvous env: not 127.0.0.1:<port>"
ok "TAIJI_RENDEZVOUS is set and identical across ranks (--no-tag output untagged)"

run -np 2 --job-id my-job sh -c \
  'echo $TAIJI_LOCAL_RANK $TAIJI_LOCAL_SIZE $TAIJI_RENDEZVOUS_HOST $TAIJI_JOB_ID $TAIJI_LISTEN_HOST'
[ "$RC" = 0 ] || fail "env: exit code $RC"
[ "$(sort "$TMP/out")" = "$(printf '[0] 0 2 0 my-job 127.0.0.1\n[1] 1 2 0 my-job 127.0.0.1')" ] ||
  fail "env: unexpected TAIJI_* values"
ok "local rank/size, rendezvous-host, job id and listen host are set"

TAIJI_LISTEN_HOST=10.1.2.3 run -np 1 --no-tag sh -c 'echo $TAIJI_LISTEN_HOST'
[ "$RC" = 0 ] && [ "$(cat "$TMP/out")" = 10.1.2.3 ] || fail "explicit TAIJI_LISTEN_HOST not kept"
ok "an explicit TAIJI_LISTEN_HOST is kept"

run -np 1 sh -c 'printf "first\nno newline"; printf "oops" >&2'
[ "$RC" = 0 ] || fail "partial line: exit code $RC"
[ "$(cat "$TMP/out")" = "$(printf '[0] first\n[0] no newline')" ] ||
  fail "partial line: stdout not as expected"
[ "$(cat "$TMP/err")" = "[0] oops" ] || fail "partial line: stderr not as expected"
ok "a final line without newline is printed with its prefix (stdout and stderr apart)"

# --- failures -------------------------------------------------------------------------
run -np 3 sh -c 'if [ "$TAIJI_RANK" = 2 ]; then exit 3; fi; exec sleep 60'
[ "$RC" = 3 ] || fail "failing rank: exit code $RC, expected 3"
[ "$ELAPSED_MS" -lt 10000 ] || fail "failing rank: took ${ELAPSED_MS} ms"
grep -q 'rank 2 exited with code 3; stopping the other 2 ranks' "$TMP/err" ||
  fail "failing rank: no clear message"
ok "a rank exiting 3 stops its sleeping siblings (${ELAPSED_MS} ms) and exit code is 3"

run -np 2 sh -c 'if [ "$TAIJI_RANK" = 1 ]; then kill -9 $$; fi; exec sleep 60'
[ "$RC" = 137 ] || fail "killed rank: exit code $RC, expected 137"
[ "$ELAPSED_MS" -lt 10000 ] || fail "killed rank: took ${ELAPSED_MS} ms"
grep -q 'rank 1 killed by signal 9' "$TMP/err" || fail "killed rank: no clear message"
ok "a rank killed by signal 9 makes taiji-run exit 137"

# gone_within SECONDS REGEX: true once no process's full command line matches REGEX.
gone_within() {
  local tenths=$(($1 * 10)) i
  command -v pgrep >/dev/null || fail "pgrep is missing (package procps)"
  for ((i = 0; i < tenths; i++)); do
    pgrep -f "$2" >/dev/null || return 0
    sleep 0.1
  done
  pkill -KILL -f "$2" || true
  return 1
}

# A rank that is a shell waiting on a child of its own: stopping the rank stops the child.
# Rank 0 fails once rank 1's child is up.
rm -f "$TMP/child-up"
run -np 2 sh -c 'if [ "$TAIJI_RANK" = 0 ]; then
    while [ ! -e "$0" ]; do sleep 0.05; done; exit 3
  fi; sleep 987.654 & touch "$0"; wait' "$TMP/child-up"
[ "$RC" = 3 ] || fail "grandchild: exit code $RC, expected 3"
gone_within 5 '^sleep 987\.654$' || fail "grandchild: a rank's child outlived the stopped job"
ok "stopping a rank stops the processes it started"

run -np 1 sh -c 'sleep 876.5 >/dev/null 2>&1 & echo started'
[ "$RC" = 0 ] || fail "leftover: exit code $RC"
gone_within 5 '^sleep 876\.5$' || fail "leftover: a rank's background process outlived the job"
ok "what a rank leaves running when it exits is killed at the end of the job"

run -np 2 --timeout 1 sleep 30
[ "$RC" = 124 ] || fail "--timeout: exit code $RC, expected 124"
[ "$ELAPSED_MS" -lt 10000 ] || fail "--timeout: took ${ELAPSED_MS} ms"
grep -q 'timeout' "$TMP/err" || fail "--timeout: no clear message"
ok "--timeout 1 on sleep 30 exits 124 (${ELAPSED_MS} ms)"

run -np 1 --timeout 1 sh -c 'trap "" TERM; while :; do sleep 0.1; done'
[ "$RC" = 124 ] || fail "SIGTERM-proof rank: exit code $RC, expected 124"
[ "$ELAPSED_MS" -lt 10000 ] || fail "SIGTERM-proof rank: took ${ELAPSED_MS} ms"
ok "a rank ignoring SIGTERM is killed after the grace period (${ELAPSED_MS} ms)"

run -np 2 taiji-no-such-program-here
[ "$RC" = 127 ] || fail "missing program: exit code $RC, expected 127"
ok "a missing program exits 127"

# The store serves half the descriptor limit at once: taiji-run raises its own soft limit
# to the hard one, and the ranks start with the limit it was given.
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -gt 256 ]; then
  RC=0
  (ulimit -Sn 256 && timeout -s KILL 20 "$RUN" -np 2 --no-tag sh -c \
    'echo "$(ulimit -Sn) $(awk "/open files/{print \$4}" /proc/$PPID/limits)"') >"$TMP/out" 2>"$TMP/err" </dev/null || RC=$?
  [ "$RC" = 0 ] || fail "descriptor limit: exit code $RC"
  [ "$(sort -u "$TMP/out")" = "256 $hard" ] || fail "descriptor limit: ranks/launcher had $(sort -u "$TMP/out" | tr '\n' ' '), expected 256 $hard"
  ok "taiji-run raises its descriptor limit to the hard one; the ranks keep the one it was given"
fi

# --- signals --------------------------------------------------------------------------
# start_bg ARGS...: starts taiji-run in the background (PID in $LAUNCHER) with ranks that
# print their pid and sleep; returns once both ranks are up.
start_bg() {
  "$RUN" -np 2 --no-tag "$@" sh -c 'echo $$; exec sleep 30' >"$TMP/out" 2>"$TMP/err" </dev/null &
  LAUNCHER=$!
  for ((i = 0; i < 600; i++)); do  # up to 60 s on a loaded machine
    [ "$(wc -l <"$TMP/out")" -ge 2 ] && return 0
    sleep 0.1
  done
  fail "background job: ranks did not start"
}

# ranks_gone SECONDS: true once every pid listed in $TMP/out has exited.
ranks_gone() {
  local tenths=$(($1 * 10)) i pid alive
  for ((i = 0; i < tenths; i++)); do
    alive=0
    while read -r pid; do
      if kill -0 "$pid" 2>/dev/null; then alive=1; fi
    done <"$TMP/out"
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  return 1
}

start_bg
kill -INT "$LAUNCHER"
wait_bounded "$LAUNCHER" 10
[ "$RC" = 130 ] || fail "SIGINT: exit code $RC, expected 130"
ranks_gone 5 || fail "SIGINT: rank processes still alive"
ok "SIGINT to taiji-run stops the sleeping ranks and exits 130"

start_bg
kill -TERM "$LAUNCHER"
wait_bounded "$LAUNCHER" 10
[ "$RC" = 143 ] || fail "SIGTERM: exit code $RC, expected 143"
ranks_gone 5 || fail "SIGTERM: rank processes still alive"
ok "SIGTERM to taiji-run stops the ranks and exits 143"

start_bg
kill -QUIT "$LAUNCHER"
wait_bounded "$LAUNCHER" 10
[ "$RC" = 131 ] || fail "SIGQUIT: exit code $RC, expected 131"
ranks_gone 5 || fail "SIGQUIT: rank processes still alive"
# Not merely killed by it (the ranks would die with it, but not what they started).
grep -q 'received SIGQUIT; forwarding' "$TMP/err" || fail "SIGQUIT: not handled"
ok "SIGQUIT to taiji-run stops the ranks and exits 131"

# SIGUSR1 is the ranks' to handle: here each says so and exits 3, which ends the job.
"$RUN" -np 2 --no-tag sh -c 'trap "echo usr1; exit 3" USR1; echo $$ >>"$0"; sleep 30 & wait' "$TMP/pids" \
  >"$TMP/out" 2>"$TMP/err" </dev/null &
LAUNCHER=$!
for ((i = 0; i < 600; i++)); do
  [ -f "$TMP/pids" ] && [ "$(wc -l <"$TMP/pids")" -ge 2 ] && break
  sleep 0.1
done
kill -USR1 "$LAUNCHER"
wait_bounded "$LAUNCHER" 10
[ "$RC" = 3 ] || fail "SIGUSR1: exit code $RC, expected 3 (the ranks' own)"
[ "$(grep -c '^usr1$' "$TMP/out")" -ge 1 ] || fail "SIGUSR1: no rank saw it"
grep -q 'received SIGUSR1; forwarding' "$TMP/err" || fail "SIGUSR1: not reported"
ok "SIGUSR1 to taiji-run reaches the ranks, which decide"

start_bg
kill -KILL "$LAUNCHER"
wait_bounded "$LAUNCHER" 10
ranks_gone 5 || fail "SIGKILL: rank processes outlived taiji-run"
ok "ranks die with taiji-run when it is killed by SIGKILL"

# --- usage ----------------------------------------------------------------------------
for args in "" "-np" "-np 0 true" "-np x true" "--bogus -np 1 true" "-np 2" \
  "--hosts 127.0.0.1:1 true" "--hosts 127.0.0.1:1 --self 10.0.0.1 true" \
  "--hosts 127.0.0.1:x --self 127.0.0.1 true" "-np 5 --hosts a:1,b:1 --self a true" \
  "-np 1 --timeout 0 true" "-np 1 --self a true"; do
  # shellcheck disable=SC2086
  run $args
  [ "$RC" = 2 ] || fail "bad usage '$args': exit code $RC, expected 2"
  grep -q '^usage: taiji-run' "$TMP/err" || fail "bad usage '$args': no usage on stderr"
done
ok "bad usage exits 2 with the usage on stderr"

run --help
[ "$RC" = 0 ] || fail "--help: exit code $RC"
grep -q -- '--self' "$TMP/out" || fail "--help: no usage on stdout"
ok "--help prints the usage and exits 0"

# --- multi-host -----------------------------------------------------------------------
fields='echo $TAIJI_RANK $TAIJI_WORLD_SIZE $TAIJI_LOCAL_RANK $TAIJI_LOCAL_SIZE $TAIJI_RENDEZVOUS $TAIJI_LISTEN_HOST'
for attempt in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 30000))
  run --hosts 127.0.0.1:2,127.0.0.2:1 --self 127.0.0.1 --port "$port" --timeout 15 sh -c "$fields"
  grep -q 'cannot serve the rendezvous' "$TMP/err" || break  # port taken: try another
done
[ "$RC" = 0 ] || fail "multi-host first host: exit code $RC"
expected="[0] 0 3 0 2 127.0.0.1:$port 127.0.0.1
[1] 1 3 1 2 127.0.0.1:$port 127.0.0.1"
[ "$(sort "$TMP/out")" = "$expected" ] || fail "multi-host first host: unexpected env"
ok "--hosts 127.0.0.1:2,127.0.0.2:1 --self 127.0.0.1 runs ranks 0,1 of 3"

run --hosts 127.0.0.1:2,127.0.0.2:1 --self 127.0.0.2 --port "$port" -np 3 --timeout 15 \
  sh -c "$fields"
[ "$RC" = 0 ] || fail "multi-host second host: exit code $RC"
[ "$(cat "$TMP/out")" = "[2] 2 3 0 1 127.0.0.1:$port 127.0.0.2" ] ||
  fail "multi-host second host: unexpected env"
ok "--self 127.0.0.2 runs rank 2 of 3 pointing at the first host's rendezvous"

echo "all launcher checks passed"
